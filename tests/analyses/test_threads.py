"""Torch's thread count of a run (issue 42 item 10, issue 45 item 1): the ``threads`` option of every analysis
(API, flags, TOML) is checked, ``auto`` follows its stated rule, the count actually used is in the results
header and report.md, a resume on another count is refused (the same count resumes), the API gives the
caller's count back, and the ranks of a parallel run compute on, and record, one count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import probes
import probes.analyses.run_context as run_context
from probes.analyses import ANALYSES, REPORT, options_of
from probes.analyses.option_system import OptionError, option_fields
from probes.analyses.parallel import World
from probes.analyses.sweep import Sweep
from probes.cli.main import main
from probes.data.dataset import V1_DATASET_DIR
from probes.engine import threads
from probes.reporting.results import ResultsConfigMismatch, load_results
from probes.reporting.layout import rows_path
from runs import fails, rows_file, sweep

ROOT = Path(probes.__file__).resolve().parent.parent
NO_MODEL = "/nonexistent/model"  # the option is checked before the model is looked at
TINY = {"embedder": "lexical", "relevance": "lexical", "split": "all", "limit": 1, "k_max": 1, "buckets": ["T_wrong"],
        "configs": ["base", "basm"], "figure": False}


def header_threads(path: Path) -> int:
    return load_results(path).attrs["meta"]["config"]["threads"]


# ---------------------------------------------------------------------------- the option
def test_every_analysis_and_report_has_the_one_threads_option() -> None:
    for name in [*ANALYSES, REPORT]:
        (f,) = [f for f in option_fields(options_of(name)) if f.name == "threads"]
        assert f.default == "auto" and f.metadata["words"] == ("auto",) and f.metadata["minimum"] == 1, name


@pytest.mark.parametrize(("bad", "message"), [
    (0, "must be ≥ 1 or auto, got 0"), (-2, "must be ≥ 1 or auto, got -2"), (1.5, "must be an integer or auto, got 1.5"),
    (True, "must be an integer or auto, got True"), ("two", "must be an integer or auto, got 'two'"),
    ("", "must be an integer or auto, got ''"), (None, "must not be None (default: 'auto')"),
])
def test_a_thread_count_below_one_or_not_a_count_is_refused_before_loading(bad, message: str) -> None:
    with pytest.raises(OptionError) as error:
        probes.run("sweep", model=NO_MODEL, threads=bad)
    assert f"sweep: option 'threads' (--threads) {message}" in str(error.value)


def test_the_flag_takes_a_count_or_auto_and_refuses_other_words(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert "must be ≥ 1 or auto, got 0" in fails(["sweep", "--model", NO_MODEL, "--threads", "0"], capsys, code=2)
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--model", NO_MODEL, "--threads", "two"])
    assert exit_.value.code == 2 and "argument --threads: invalid integer or auto value: 'two'" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "value"), [("threads = 3\n", 3), ('threads = "auto"\n', "auto")])
def test_the_options_file_sets_threads(text: str, value, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def stop(analysis, session=None):
        seen.append(analysis.threads)
        raise KeyboardInterrupt

    monkeypatch.setattr("probes.analyses.base.open_context", stop)
    (tmp_path / "run.toml").write_text(text)
    assert main(["sweep", "--options-file", str(tmp_path / "run.toml")]) == 130
    assert seen == [value]


# ---------------------------------------------------------------------------- the auto rule
def test_auto_is_one_thread_below_the_measured_size_else_the_cores_over_the_ranks_within_torchs_count(monkeypatch) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 6)  # OMP_NUM_THREADS=6, or the caller's count
    assert threads.auto_threads(threads.ONE_THREAD_BELOW - 1) == 1
    assert threads.auto_threads(threads.ONE_THREAD_BELOW) == 6  # torch's own count caps the 8 cores
    assert threads.auto_threads(threads.ONE_THREAD_BELOW, ranks_on_node=3) == 2
    assert threads.auto_threads(threads.ONE_THREAD_BELOW, ranks_on_node=16) == 1
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 1)  # OMP_NUM_THREADS=1: one thread at any size
    assert threads.auto_threads(10 * threads.ONE_THREAD_BELOW) == 1
    assert f"under {threads.ONE_THREAD_BELOW:,} parameters" in threads.AUTO_RULE


class TwoRanks(World):
    """A world of two ranks whose other rank resolved ``other`` threads (the reduction, without processes)."""

    def __init__(self, other: int) -> None:
        super().__init__(rank=0, size=2)
        object.__setattr__(self, "other", other)

    def smallest(self, n: int) -> int:
        return min(n, self.other)


def test_the_ranks_compute_on_the_smallest_of_their_counts(organism_session) -> None:
    assert run_context.run_threads(3, organism_session, TwoRanks(other=2)) == 2
    assert run_context.run_threads("auto", organism_session, TwoRanks(other=4)) == 1  # the organism: under the measured size
    assert run_context.run_threads(2, organism_session, World()) == 2


@pytest.fixture(scope="module")
def organism_session():
    from probes.organism import ORGANISM_DIR

    return probes.ProbeSession(ORGANISM_DIR)


# ---------------------------------------------------------------------------- the header, the resume, the caller's count
def test_the_count_used_is_in_the_header_and_the_callers_count_is_given_back(model: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    during = []
    collect = Sweep.collect

    def spy(self, ctx):
        during.append((torch.get_num_threads(), ctx.threads))
        return collect(self, ctx)

    monkeypatch.setattr(Sweep, "collect", spy)
    torch.set_num_threads(2)
    result = probes.run("sweep", model=model, out=tmp_path, threads=1, **TINY)
    assert during == [(1, 1)]  # the model ran on the option's count ...
    assert torch.get_num_threads() == 2  # ... and the caller has its own back
    assert header_threads(rows_path(result.out_dir, "sweep")) == 1
    probes.run("sweep", model=model, out=tmp_path / "auto", **TINY)  # auto: the tiny model is under the measured size
    assert during[-1] == (1, 1) and torch.get_num_threads() == 2
    assert header_threads(rows_path(tmp_path / "auto" / "model", "sweep")) == 1


def test_a_resume_on_another_count_is_refused_and_the_same_count_resumes(model: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    assert main(sweep(model, tmp_path, "--threads", "2")) == 0
    path = rows_file(tmp_path)
    finished = path.read_bytes()
    lines = finished.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))  # a killed run: its last row is missing
    err = fails(sweep(model, tmp_path), capsys)  # auto: 1 thread for the tiny model
    assert "changed: config.threads (2 → 1)" in err
    assert "They were computed on 2 torch threads and this run uses 1" in err
    assert "Rerun with --threads 2 (threads=2) to resume them on their count" in err and "--overwrite" in err
    assert path.read_bytes() == b"".join(lines[:-1])  # refused before a row was written
    with pytest.raises(ResultsConfigMismatch, match="computed on 2 torch threads and this run uses 1"):
        probes.run("sweep", model=model, out=tmp_path, threads=1, dataset=str(V1_DATASET_DIR), **TINY)
    assert main(sweep(model, tmp_path, "--threads", "2")) == 0  # the same count resumes: the missing row only
    assert header_threads(path) == 2 and len(path.read_bytes().splitlines()) == len(lines)
    assert main(sweep(model, tmp_path, "--threads", "1", "--overwrite")) == 0  # or every row recomputed on the new count
    assert header_threads(path) == 1


def test_the_report_states_the_count_and_gives_the_callers_back(model: Path, tmp_path: Path) -> None:
    torch.set_num_threads(2)
    result = probes.run("report", model=model, out=tmp_path, analyses=["sweep"], threads=1, explore=False,
                        **{k: v for k, v in TINY.items() if k != "configs"})
    assert torch.get_num_threads() == 2
    text = (result.out_dir / "report.md").read_text()
    assert "1 torch thread (threads 1)" in text
    assert header_threads(rows_path(result.out_dir, "sweep")) == 1


def test_explore_recomputes_on_the_runs_recorded_count_and_gives_the_callers_back(model: Path, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import probes.analyses.explore as explore

    assert main(sweep(model, tmp_path, "--threads", "2")) == 0
    seen = []
    open_context = explore.open_context

    def spy(analysis, session=None):
        ctx = open_context(analysis, session)
        seen.append((analysis.threads, ctx.threads, torch.get_num_threads()))
        return ctx

    monkeypatch.setattr(explore, "open_context", spy)
    torch.set_num_threads(1)
    explore.explore(out=tmp_path, model=model)
    assert seen == [(2, 2, 2)]  # the run's 2, not auto's 1 for the tiny model
    assert torch.get_num_threads() == 1


# ---------------------------------------------------------------------------- a parallel run
DRIVER = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path

    import torch
    import probes.analyses.run_context as run_context
    from probes.analyses.sweep import Sweep

    rank = int(os.environ["RANK"])
    # auto resolves differently on the two ranks (as on nodes of different sizes): 2 on rank 0, 3 on rank 1
    run_context.auto_threads = lambda parameters, ranks_on_node: 2 + rank
    seen = []
    collect = Sweep.collect

    def spy(self, ctx):
        seen.append(torch.get_num_threads())
        return collect(self, ctx)

    Sweep.collect = spy
    out = Path(sys.argv[2])
    Sweep(model=Path(sys.argv[1]), out=out, **json.loads(sys.argv[3])).run(verbose=False)
    (out / f"threads.rank{rank}.json").write_text(json.dumps(seen))
""")


@pytest.mark.subprocess
@pytest.mark.slow  # a real 2-rank torchrun (23 s); the rule itself is test_the_ranks_compute_on_the_smallest_of_their_counts
def test_the_ranks_of_a_parallel_run_compute_on_and_record_one_count(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = tmp_path / "out"
    options = {**TINY, "dataset": "basm_probe", "buckets": ["T_wrong", "T_ok"]}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--monitor_interval",
                          "0.2", str(driver), str(tiny_qwen3_dir), str(out), json.dumps(options)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [json.loads((out / f"threads.rank{rank}.json").read_text()) for rank in (0, 1)] == [[2], [2]]
    assert header_threads(rows_path(out / tiny_qwen3_dir.name, "sweep")) == 2
