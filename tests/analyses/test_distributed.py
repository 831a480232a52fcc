"""Data-parallel runs under ``torchrun`` (two CPU processes, gloo): the merged results file holds the
rows of a one-process run; a killed rank resumes without losing, repeating or recomputing rows;
shard files left behind are merged (or refused) when the results file is opened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import probes
from probes.analyses.sweep import Sweep
from probes.reporting.layout import rows_path, table_path
from probes.reporting.results import ResultsConfigMismatch, ResultsCorrupt, ResultsStore, load_results, shard_path, shard_paths

torch.set_num_threads(1)

ROOT = Path(probes.__file__).resolve().parent.parent
OPTIONS = {"limit": 1, "buckets": ["T_wrong", "T_ok"], "k_max": 2, "dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical",
           "figure": False}
FLAGS = ["--limit", "1", "--bucket", "T_wrong", "--bucket", "T_ok", "--k-max", "2", "--dataset", "basm_probe", "--embedder", "lexical",
         "--relevance", "lexical", "--no-figure"]
TIMES: dict[str, float] = {}


def torchrun(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--monitor_interval", "0.2", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def by_key(path: Path) -> pd.DataFrame:
    return load_results(path).set_index("key").sort_index()


def assert_same_rows(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.index) == list(want.index)
    assert set(got.columns) == set(want.columns)
    numeric = [c for c in want.columns if pd.api.types.is_float_dtype(want[c])]
    assert numeric  # the margins, at least
    pd.testing.assert_frame_equal(got[numeric], want[numeric], check_exact=False, rtol=0, atol=1e-5)
    other = [c for c in want.columns if c not in numeric]
    assert got[other].astype(str).equals(want[other].astype(str))


@pytest.fixture(scope="module")
def one_process(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    start = time.perf_counter()
    result = Sweep(model=tiny_qwen3_dir, out=tmp_path_factory.mktemp("one"), **OPTIONS).run(verbose=False)
    TIMES["one process (in pytest, model loaded)"] = time.perf_counter() - start
    rows = by_key(rows_path(result.out_dir, "sweep"))
    assert len(rows) == 2 * 3 * 4  # items × k × configurations, one baseline row each
    return rows


@pytest.mark.subprocess
def test_two_process_sweep_has_the_rows_of_one_process(tiny_qwen3_dir: Path, one_process: pd.DataFrame, tmp_path: Path) -> None:
    start = time.perf_counter()
    run = torchrun("-m", "probes.cli", "sweep", "--model", str(tiny_qwen3_dir), *FLAGS, "--out", str(tmp_path))
    TIMES["two processes (torchrun, CLI, from start-up)"] = time.perf_counter() - start
    assert run.returncode == 0, run.stderr[-3000:]
    assert "sweep [rank 0/2]" in run.stderr and "sweep [rank 1/2]" in run.stderr  # both ranks scored
    out = tmp_path / tiny_qwen3_dir.name
    assert_same_rows(by_key(rows_path(out, "sweep")), one_process)
    assert table_path(out, "sweep", "sweep_summary").is_file() and shard_paths(rows_path(out, "sweep")) == []
    print("sweep wall times (s):", {k: round(v, 1) for k, v in TIMES.items()})


# Rank 1 dies after DIE_AFTER jobs on the first launch; every rank logs the keys it scores. The
# script starts the process group itself, as a user's script may (the CLI test covers the other way).
DRIVER = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path

    import torch
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    from probes.analyses.sweep import Sweep
    from probes.reporting.results import ResultsStore

    model, out, die_after = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ["RANK"])
    scored, real_append = [], ResultsStore.append

    def append(self, rows):
        rows = list(rows)
        if ".rank" in self.path.name:  # a rank's own rows (one job per call); merges write the results file
            if rank == 1 and len(scored) == die_after:
                raise RuntimeError("rank 1 killed")
            scored.extend(row["key"] for row in rows)
        real_append(self, rows)

    ResultsStore.append = append
    Sweep(model=model, out=out, **json.loads(sys.argv[4])).run(verbose=False)
    (out / f"scored.rank{rank}.json").write_text(json.dumps(scored))
""")


@pytest.mark.subprocess
def test_killed_rank_resumes_without_loss_or_repeats(tiny_qwen3_dir: Path, one_process: pd.DataFrame, tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = tmp_path / "out"
    results = rows_path(out / tiny_qwen3_dir.name, "sweep")

    killed = torchrun(str(driver), str(tiny_qwen3_dir), str(out), "3", json.dumps(OPTIONS))
    assert killed.returncode != 0 and "rank 1 killed" in killed.stderr
    shards = shard_paths(results)
    assert "sweep.rank1-of-2.jsonl" in [p.name for p in shards] and {p.name for p in shards} <= {"sweep.rank0-of-2.jsonl", "sweep.rank1-of-2.jsonl"}
    written = {p.name: set(load_results(p).get("key", [])) for p in shards}
    assert len(written["sweep.rank1-of-2.jsonl"]) == 3  # its three jobs, then the kill
    before = set().union(*written.values())
    assert before and len(load_results(results)) == 0  # nothing merged yet

    resumed = torchrun(str(driver), str(tiny_qwen3_dir), str(out), "-1", json.dumps(OPTIONS))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "merged" in resumed.stderr and "unfinished parallel run" in resumed.stderr
    scored = [json.loads((out / f"scored.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert not set(scored[0]) & set(scored[1])  # disjoint shards (of the items left: one rank may have none)
    again = [key for keys in scored for key in keys]
    assert len(again) == len(set(again)) and not set(again) & before  # nothing written before was scored again
    assert set(again) | before == set(one_process.index)  # and nothing was lost
    assert_same_rows(by_key(results), one_process)  # each key once (a repeat fails to load), values as one process
    assert shard_paths(results) == []


# ------------------------------------------------------------------------- shard files, no model
CONFIG = {"model": "m", "k_max": 2}


def rows(*keys: str, value: float = 1.0) -> list[dict]:
    return [{"key": key, "margin": value} for key in keys]


def shard(results: Path, rank: int, world_size: int, keys: list[str], config: dict = CONFIG, value: float = 1.0) -> None:
    store = ResultsStore(shard_path(results, rank, world_size), "sweep", config)
    store.append(rows(*keys, value=value))
    store.close()  # as a finished rank hands its shard over


def test_leftover_shards_are_merged_on_open_whatever_the_world_size(tmp_path: Path) -> None:
    results = tmp_path / "sweep.jsonl"
    ResultsStore(results, "sweep", CONFIG).append(rows("a"))
    shard(results, 0, 3, ["b", "a"])  # "a": merged before the kill, shard not yet deleted
    shard(results, 2, 3, ["c"])
    shard(results, 1, 2, ["d"])  # a killed run with another world size
    store = ResultsStore(results, "sweep", CONFIG)  # the one-process rerun
    assert store.done == {"a", "b", "c", "d"}
    assert list(load_results(results)["key"]) == ["a", "d", "b", "c"]  # by world size, then rank
    assert shard_paths(results) == []


def test_merge_orders_by_jobs_and_refuses_conflicts(tmp_path: Path) -> None:
    results = tmp_path / "sweep.jsonl"
    store = ResultsStore(results, "sweep", CONFIG)
    shard(results, 0, 2, ["x", "z"])
    shard(results, 1, 2, ["y"])
    assert store.merge(shard_paths(results), order=["z", "y", "x"]) == 3
    assert list(load_results(results)["key"]) == ["z", "y", "x"]

    shard(results, 0, 2, ["y"], value=2.0)  # the same key with another value
    with pytest.raises(ResultsCorrupt, match="'y' has values different"):
        ResultsStore(tmp_path / "sweep.jsonl", "sweep", CONFIG)
    shard_path(results, 0, 2).unlink()
    shard(results, 0, 2, ["w"], config={**CONFIG, "k_max": 3})
    with pytest.raises(ResultsConfigMismatch, match=r"sweep.rank0-of-2.jsonl \(a shard of sweep.jsonl\).*k_max"):
        ResultsStore(results, "sweep", CONFIG)
    ResultsStore(results, "sweep", CONFIG, overwrite=True)  # discards the results and the shards
    assert shard_paths(results) == [] and len(load_results(results)) == 0
