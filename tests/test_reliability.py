"""Runs never lie about their results: each test reproduces one failure of a real run (changed
weights or data under a half-finished output, concurrent writers, kills and full disks mid-write,
corrupt lines, bad options and datasets) and checks that nothing is lost, duplicated or mixed."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from probes.cli.main import main
from probes.data.dataset import V1_DATASET_DIR
from probes.reporting.results import ResultsCorrupt, load_results

torch.set_num_threads(1)
FAST = ["--embedder", "lexical", "--relevance", "lexical", "--split", "all", "--limit", "1", "--k-max", "1", "--bucket", "T_wrong", "--configs", "base,basm", "--no-figure"]


@pytest.fixture(autouse=True)
def _hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASM_PROBES_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def model(tiny_qwen3_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny model, free to be edited."""
    return Path(shutil.copytree(tiny_qwen3_dir, tmp_path / "model"))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return Path(shutil.copytree(V1_DATASET_DIR, tmp_path / "dataset"))


def fails(argv: list[str], capsys: pytest.CaptureFixture, code: int = 1) -> str:
    """Run the CLI, expect exit ``code`` and a short message without a traceback; return stderr."""
    capsys.readouterr()
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: " in err
    return err


def sweep(model: Path, out: Path, *extra: str, dataset: Path = V1_DATASET_DIR) -> list[str]:
    return ["sweep", "--model", str(model), "--dataset", str(dataset), "--out", str(out), *FAST, *extra]


def rows_file(out: Path) -> Path:
    """The sweep's results file: rows live under OUT/<model label>/, and the ``model`` fixture's folder is named ``model``."""
    return out / "model" / "sweep.jsonl"


# ---------------------------------------------------------------------------- 1. fingerprinted resume
def test_changed_weights_stop_a_resume(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    weights = load_file(model / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1.0
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    assert re.search(r"fingerprint\.weights.*--overwrite", fails(sweep(model, out), capsys))
    before = rows_file(out).read_bytes()
    assert main(sweep(model, out, "--overwrite")) == 0
    assert rows_file(out).read_bytes() != before


def test_edited_items_stop_a_resume(model: Path, dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out, dataset=dataset)) == 0
    (item_id,) = set(load_results(rows_file(out))["item_id"])
    items = dataset / "items.jsonl"
    lines = [json.loads(line) for line in items.read_text().splitlines()]
    for raw in lines:
        if raw["id"] == item_id:
            raw["user"] += " Please hurry."
    items.write_text("".join(json.dumps(raw) + "\n" for raw in lines))
    assert "fingerprint.dataset" in fails(sweep(model, out, dataset=dataset), capsys)


def test_linear_residuals_are_keyed_by_the_weights() -> None:
    from probes.analyses.linear import feature_key
    from probes.prompts.record import PromptRecord

    record = PromptRecord(record_id="i|base|k0|native", item_id="i", bucket="T_ok", split="eval", domain="d", task_group="g", config="base",
                          k=0, format="native", tokenizer="t", text="abc", input_ids=[1, 2, 3], n_tokens=3, decision_index=2, open_index=None,
                          query_rows=[2], spans={}, spans_kind={"boundary": "boundary"}, skills=[], candidates=[], collision=False,
                          correct_action="x", wrong_tools=[], tempting_skill="s", tempting_rank=None, tempting_shown_rank=None,
                          retrieval={"mode": "ranked"})
    assert feature_key(record, "weightsA|float32") != feature_key(record, "weightsB|float32")


def test_weight_hash_is_memoised_by_size_and_mtime(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import probes.engine.loading

    first = probes.engine.loading.model_fingerprint(model)
    reads = []
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: reads.append(self.name) or real_open(self, *a, **k))
    assert probes.engine.loading.model_fingerprint(model) == first
    assert "model.safetensors" not in reads


# ---------------------------------------------------------------------------- helpers for subprocess runs
ROOT = Path(__file__).resolve().parent.parent


def cli(argv: list[str], **kwargs) -> subprocess.Popen:
    """``basm-probes argv`` in a child process (for kills, write limits and concurrent writers)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "probes.cli.main", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def keys(path: Path) -> list[str]:
    return [json.loads(line)["key"] for line in path.read_text().splitlines()[1:]]


# ---------------------------------------------------------------------------- 2. one writer per output
@pytest.mark.subprocess
def test_concurrent_runs_never_duplicate_rows(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = sweep(model, out, "--limit", "2")
    runs = [cli(argv), cli(argv)]
    results = [(run.wait(timeout=600), run.stderr.read()) for run in runs]
    assert any(rc == 0 for rc, _ in results)
    for rc, err in results:
        assert rc == 0 or "being written by another basm-probes run" in err, err[-2000:]
    written = keys(rows_file(out))
    assert len(written) == len(set(written)) == 2 * 2 * 2  # items × k × configs


@pytest.mark.subprocess
def test_a_held_lock_stops_a_second_writer(model: Path, tmp_path: Path) -> None:
    from probes.reporting.results import ResultsStore

    path = rows_file(tmp_path / "out")
    ResultsStore(path, "sweep", {"held": True})  # this process now writes the file
    run = cli(sweep(model, tmp_path / "out"))
    assert run.wait(timeout=600) != 0
    err = run.stderr.read()
    assert "being written by another basm-probes run" in err and "Traceback" not in err
    assert load_results(path).attrs["meta"]["config"] == {"held": True}


def test_a_file_with_a_repeated_key_is_refused(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    path = rows_file(out)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[2]]) + "\n")  # what two unlocked writers produced
    assert re.search(r"sweep\.jsonl:6: key .* already written on line 3", fails(sweep(model, out), capsys))


# ---------------------------------------------------------------------------- 3. append-only resume
def _limit_writes(size: int):
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk: writes fail with EFBIG, the process goes on
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


@pytest.mark.subprocess
def test_a_full_disk_never_shortens_a_finished_file(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    path = rows_file(out)
    before = path.read_bytes()
    run = cli(sweep(model, out), preexec_fn=_limit_writes(len(before) // 2))  # a rewrite would be cut in half
    run.wait(timeout=600)
    assert path.read_bytes() == before


@pytest.mark.subprocess
def test_a_write_limit_mid_file_then_resume_gives_the_full_table(model: Path, tmp_path: Path) -> None:
    assert main(sweep(model, tmp_path / "full")) == 0
    full = load_results(rows_file(tmp_path / "full")).sort_values("key").reset_index(drop=True)
    header = rows_file(tmp_path / "full").read_text().split("\n")[0]
    out = tmp_path / "out"
    run = cli(sweep(model, out), preexec_fn=_limit_writes(len(header) + 3000))  # header, a row or so, a torn line
    assert run.wait(timeout=600) != 0
    assert 0 < len(keys_lenient(rows_file(out))) < len(full)
    assert main(sweep(model, out)) == 0
    resumed = load_results(rows_file(out)).sort_values("key").reset_index(drop=True)
    pd.testing.assert_frame_equal(resumed.drop(columns="prompt_digest"), full.drop(columns="prompt_digest"))


def keys_lenient(path: Path) -> list[str]:
    """Keys of the complete lines (a torn last line left out)."""
    return [json.loads(line)["key"] for line in path.read_text().split("\n")[1:-1]]


@pytest.mark.subprocess
def test_a_killed_run_resumes_to_the_same_table(model: Path, tmp_path: Path) -> None:
    assert main(sweep(model, tmp_path / "full", "--limit", "3")) == 0
    full = load_results(rows_file(tmp_path / "full")).sort_values("key").reset_index(drop=True)
    out = tmp_path / "out"
    path = rows_file(out)
    run = cli(sweep(model, out, "--limit", "3"))
    deadline = time.monotonic() + 300
    while run.poll() is None and time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= 3:
            run.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    run.wait(timeout=60)
    assert main(sweep(model, out, "--limit", "3")) == 0
    resumed = load_results(path).sort_values("key").reset_index(drop=True)
    assert resumed["key"].is_unique
    pd.testing.assert_frame_equal(resumed.drop(columns="prompt_digest"), full.drop(columns="prompt_digest"))


def test_a_corrupt_middle_line_is_named_not_dropped(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    path = rows_file(out)
    lines = path.read_text().splitlines()
    lines[2] = lines[2][: len(lines[2]) // 2]
    path.write_text("\n".join(lines) + "\n")
    damaged = path.read_bytes()
    assert "sweep.jsonl:3: not a results row" in fails(sweep(model, out), capsys)
    with pytest.raises(ResultsCorrupt, match=r"sweep\.jsonl:3"):
        load_results(path)
    assert path.read_bytes() == damaged  # every later row is still there


def test_a_finished_read_only_file_is_read_back(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    path = rows_file(out)
    before = path.read_bytes()
    real_open = Path.open

    def read_only(self, mode="r", *args, **kwargs):  # chmod 444 does not stop root: refuse writes here
        if self == path and set(mode) & set("wa+"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", read_only)
    assert main(sweep(model, out)) == 0
    assert path.read_bytes() == before


# ---------------------------------------------------------------------------- 7. strict JSON
def test_results_are_strict_json_and_nan_reads_back(tmp_path: Path) -> None:
    import math

    import numpy as np

    from probes.reporting.results import ResultsStore

    path = tmp_path / "r.jsonl"
    store = ResultsStore(path, "x", {})
    store.append([{"key": "a", "m": math.nan, "n": np.float32(np.inf), "heads": [[1.0, -math.inf]], "ok": 2.5}])

    def strict(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    rows = [json.loads(line, parse_constant=strict) for line in path.read_text().splitlines()]
    assert rows[1]["m"] is None and rows[1]["_nonfinite"]["m"] == "nan"
    frame = load_results(path)
    assert math.isnan(frame["m"][0]) and frame["n"][0] == math.inf and frame["heads"][0] == [[1.0, -math.inf]]
    assert "_nonfinite" not in frame.columns and frame["ok"][0] == 2.5


# ---------------------------------------------------------------------------- 4. build writes atomically
def test_a_failing_build_leaves_the_previous_records_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    cli_main = importlib.import_module("probes.analyses.dataset_tools")  # the module of build's worker function

    out = tmp_path / "records.jsonl"
    argv = ["build", "--limit", "2", "--k-max", "1", "--config", "basm", "--workers", "1", "--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical", "--out", str(out)]
    assert main(argv) == 0
    before = out.read_bytes()
    real = cli_main._build_item
    calls = []

    def failing(item):
        calls.append(item)
        if len(calls) == 3:
            raise RuntimeError("killed mid-build")
        return real(item)

    monkeypatch.setattr(cli_main, "_build_item", failing)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        main(argv)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl"]  # no temporary file left behind


# ---------------------------------------------------------------------------- 5, 6, 8: the error catalogue
def _catalogue():
    import importlib.util

    spec = importlib.util.spec_from_file_location("error_catalogue", ROOT / "docs" / "error_catalogue.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


CATALOGUE = _catalogue()


@pytest.mark.parametrize("case", CATALOGUE.CASES, ids=lambda case: case.name)
def test_every_bad_input_gives_its_code_and_message(case) -> None:
    code, message = CATALOGUE.run_case(case)
    assert (code, "Traceback" in message) == (case.code, False), message
    assert case.expect in message and message.count("error: ") == 1


def test_the_catalogue_in_docs_lists_every_case_with_its_code() -> None:
    rows = [line.split(" | ") for line in CATALOGUE.TABLE.read_text().splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [(row[0].lstrip("| "), int(row[2])) for row in rows] == [(c.name, c.code) for c in CATALOGUE.CASES]


def test_the_catalogue_has_no_silent_case() -> None:
    assert all(case.code != 0 for case in CATALOGUE.CASES)
    assert f"Silent cases (exit 0 with a wrong or destroyed result): 0 of {len(CATALOGUE.CASES)}." in CATALOGUE.TABLE.read_text()


def test_bad_options_leave_previous_results_untouched(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    before = rows_file(out).read_bytes()
    fails(sweep(model, out, "--k-max", "-1", "--overwrite"), capsys, code=2)
    assert rows_file(out).read_bytes() == before


class _Stop(Exception):
    pass


def _stop_at_session(monkeypatch: pytest.MonkeyPatch) -> dict:
    import probes.analyses.run_context

    seen = {}

    def stop(args, model):
        seen.update(k_max=args.k_max, seed=args.seed)
        raise _Stop

    monkeypatch.setattr(probes.analyses.run_context, "open_session", stop)
    return seen


def test_explicit_flags_beat_the_toml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _stop_at_session(monkeypatch)
    (tmp_path / "run.toml").write_text("k_max = 1\nseed = 3\n")
    with pytest.raises(_Stop):  # --k-max 4 is sweep's default, and still explicit
        main(["sweep", "--options-file", str(tmp_path / "run.toml"), "--k-max", "4", "--model", "m", "--out", str(tmp_path)])
    assert seen == {"k_max": 4, "seed": 3}


def test_prompted_format_on_the_organism_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    _stop_at_session(monkeypatch)
    with pytest.raises(_Stop):
        main(["sweep", "--format", "prompted", "--out", str(tmp_path), *FAST])
    assert "warning: the bundled organism was trained on the native format only" in capsys.readouterr().err


def test_ctrl_c_says_how_to_resume_and_debug_shows_the_traceback(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    import probes.analyses.jobs

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(probes.analyses.jobs, "score_record", interrupt)
    capsys.readouterr()
    assert main(sweep(model, tmp_path / "out")) == 130
    err = capsys.readouterr().err
    assert "rerun the same command to resume" in err and "Traceback" not in err
    with pytest.raises(KeyboardInterrupt):
        main([*sweep(model, tmp_path / "out"), "--debug"])
    with pytest.raises(ResultsCorrupt):
        rows_file(tmp_path / "out").write_text("not json\n")
        main([*sweep(model, tmp_path / "out"), "--debug"])


# ---------------------------------------------------------------------------- 9. nothing outside --out, nothing not ours
def test_a_symlinked_results_file_is_never_written_through(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\nlines\n")
    out = tmp_path / "out"
    rows_file(out).parent.mkdir(parents=True)
    rows_file(out).symlink_to(victim)
    assert "is a symbolic link" in fails(sweep(model, out), capsys)
    assert "not even with --overwrite" in fails(sweep(model, out, "--overwrite"), capsys)
    assert victim.read_text() == "precious\nlines\n" and rows_file(out).is_symlink()
    rows_file(out).unlink()
    rows_file(out).symlink_to(tmp_path / "absent.jsonl")  # a dangling link: its target is never created
    fails(sweep(model, out), capsys)
    assert not (tmp_path / "absent.jsonl").exists()


def test_a_file_that_is_not_ours_is_replaced_only_with_overwrite(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    rows_file(out).parent.mkdir(parents=True)
    rows_file(out).write_text("my notes, no newline")
    assert "is not a basm-probes results file" in fails(sweep(model, out), capsys)
    assert rows_file(out).read_text() == "my notes, no newline"
    assert main(sweep(model, out, "--overwrite")) == 0
    assert len(load_results(rows_file(out))) == 4


def test_a_torn_header_of_our_own_restarts(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rows_file(out).parent.mkdir(parents=True)
    rows_file(out).write_text('{"_meta": {"analysis": "sw')  # a run killed while writing line 1
    assert main(sweep(model, out)) == 0
    assert len(load_results(rows_file(out))) == 4


def test_a_results_folder_linked_out_of_out_is_refused(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "elsewhere").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "model").symlink_to(tmp_path / "elsewhere")
    assert "is a symbolic link out of --out" in fails(sweep(model, out), capsys)
    assert not any((tmp_path / "elsewhere").iterdir())
    linked_out = tmp_path / "linked-out"  # --out itself may be a link
    linked_out.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert main(sweep(model, linked_out)) == 0
    assert rows_file(tmp_path / "elsewhere").is_file()


BAD_ROWS = {
    "only a key": '{"key": "bogus|key"}',
    "bare NaN": "NaN",
    "NaN token in a row": '{"key": "x|y", "margin": NaN}',
    "list as key": '{"key": ["a"], "margin": 1.0}',
    "nonfinite path": '{"key": "x|y", "margin": null, "_nonfinite": {"nope": "nan"}}',
    "nonfinite value": '{"key": "x|y", "margin": null, "_nonfinite": {"margin": "big"}}',
    "nonfinite not an object": '{"key": "x|y", "margin": null, "_nonfinite": ["margin"]}',
    "key against its fields": '{"key": "r|base", "record_id": "r", "condition": "knocked"}',
}


@pytest.mark.parametrize("line", BAD_ROWS.values(), ids=BAD_ROWS.keys())
def test_a_damaged_row_that_parses_is_named_never_kept(line: str, tmp_path: Path) -> None:
    from probes.reporting.results import ResultsStore

    path = tmp_path / "r.jsonl"
    ResultsStore(path, "x", {}).append([{"key": "r|c", "record_id": "r", "condition": "c", "margin": 1.0}])
    path.write_text(path.read_text() + line + "\n")
    damaged = path.read_bytes()
    with pytest.raises(ResultsCorrupt, match=r"r\.jsonl:3: not a results row"):
        ResultsStore(path, "x", {})
    with pytest.raises(ResultsCorrupt, match=r"r\.jsonl:3"):
        load_results(path)
    assert path.read_bytes() == damaged


def test_a_foreign_row_among_keyed_rows_is_named(tmp_path: Path) -> None:
    from probes.reporting.results import ResultsStore

    path = tmp_path / "r.jsonl"
    rows = [{"key": f"r{i}|c", "record_id": f"r{i}", "condition": "c", "margin": 1.0} for i in range(3)]
    ResultsStore(path, "x", {}).append(rows[:1] + [{"key": "bogus|key", "margin": 2.0}] + rows[1:])
    with pytest.raises(ResultsCorrupt, match=r"r\.jsonl:3: not a results row of this file \(the other rows carry record_id, condition\)"):
        load_results(path)


def test_resume_of_a_sweep_with_a_bogus_row_is_refused(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    with rows_file(out).open("a") as handle:
        handle.write('{"key": "bogus|key"}\n')
    assert "sweep.jsonl:6: not a results row" in fails(sweep(model, out), capsys)


def test_an_empty_shard_of_a_killed_rank_does_not_block_resume(tmp_path: Path) -> None:
    from probes.reporting.results import ResultsStore, shard_path

    path = tmp_path / "r.jsonl"
    ResultsStore(path, "x", {}).append([{"key": "a", "v": 1}])
    shard_path(path, 1, 2).write_bytes(b"")  # a rank killed before its header
    assert ResultsStore(path, "x", {}).done == {"a"}
    assert not shard_path(path, 1, 2).exists()


# ---------------------------------------------------------------------------- 10. content fingerprints
def _edit_in_place_keep_mtime(path: Path) -> None:
    before = path.stat()
    CATALOGUE.edit_tensor_keep_mtime(path)
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


def test_a_tensor_changed_in_place_with_its_mtime_restored_stops_a_resume(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    before = rows_file(out).read_bytes()
    _edit_in_place_keep_mtime(model / "model.safetensors")
    assert re.search(r"fingerprint\.weights.*--overwrite", fails(sweep(model, out), capsys))
    assert rows_file(out).read_bytes() == before


def test_the_hash_memo_checks_sampled_content_as_well(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import probes.engine.loading as loading

    first = loading.model_fingerprint(model)
    weights = model / "model.safetensors"
    memo = json.loads(loading.hash_cache_path().read_text())
    _edit_in_place_keep_mtime(weights)
    st = weights.stat()
    # even were the ctime restored too (it cannot be, without root), the sampled blocks differ: the memo misses
    monkeypatch.setattr(loading, "_memo_key", lambda path, stat_, sampled: (
        f"{path.resolve()}|{st.st_dev}:{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|FIXED|{sampled[:32]}"))
    assert loading.model_fingerprint(model)["weights"] != first["weights"]
    assert len(json.loads(loading.hash_cache_path().read_text())) > len(memo)


def test_a_memoised_fingerprint_reads_samples_only(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    import probes.engine.loading as loading

    first = loading.model_fingerprint(model)
    hashed = []
    real = hashlib.sha256

    class Counting:
        def __init__(self, data: bytes = b"") -> None:
            self.h = real(data)
            hashed.append(len(data))

        def update(self, data: bytes) -> None:
            hashed.append(len(data))
            self.h.update(data)

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    monkeypatch.setattr(loading.hashlib, "sha256", Counting)
    assert loading.model_fingerprint(model) == first
    size = (model / "model.safetensors").stat().st_size
    assert size > 4 * loading.SAMPLE_BLOCKS * loading.SAMPLE_BLOCK_SIZE  # else sampling is the whole file
    assert sum(hashed) < size / 4


def test_the_hash_memo_lives_outside_the_model_folder(model: Path) -> None:
    import probes.engine.loading as loading

    before = sorted(p.name for p in model.iterdir())
    loading.model_fingerprint(model)
    assert sorted(p.name for p in model.iterdir()) == before
    assert loading.hash_cache_path().is_file() and model not in loading.hash_cache_path().parents


# ---------------------------------------------------------------------------- 11. outputs of dataset commands
def test_bfcl_import_never_destroys_an_existing_dataset(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("bfcl_eval", reason="needs the BFCL data: pip install --no-deps bfcl-eval")
    from probes.data.bfcl import folder

    before = {p.relative_to(dataset): p.read_bytes() for p in dataset.rglob("*") if p.is_file()}
    argv = ["bfcl-import", "--out", str(dataset), "--max-probe-entries", "2"]
    assert "is not a previous BFCL import" in fails(argv, capsys, code=2)
    assert {p.relative_to(dataset): p.read_bytes() for p in dataset.rglob("*") if p.is_file()} == before

    out = tmp_path / "bfcl"
    assert main(["bfcl-import", "--out", str(out), "--max-probe-entries", "2", "--no-card"]) == 0
    (out / "CARD.md").write_text("a stale card\n")
    (out / "NOTES.md").write_text("notes written later\n")
    imported = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def killed(*args, **kwargs):
        raise RuntimeError("killed mid-import")

    monkeypatch.setattr(folder, "render_readme", killed)  # inside the write, its last file: nothing of the new import may land
    with pytest.raises(RuntimeError, match="killed mid-import"):
        main(["bfcl-import", "--out", str(out), "--max-probe-entries", "3", "--no-card"])
    monkeypatch.undo()
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == imported
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bfcl.")]  # no staging folder left

    assert main(["bfcl-import", "--out", str(out), "--max-probe-entries", "3", "--no-card"]) == 0  # over a previous import: allowed
    assert (out / "NOTES.md").read_text() == "notes written later\n"  # and what the import does not write is kept
    assert not (out / "CARD.md").exists()  # a card of the previous items is not left stale

    assert main([*argv, "--overwrite", "--no-card"]) == 0
    assert not (dataset / "generate.py").exists() and (dataset / "skill_sources.json").is_file()


def _limit_writes_and_fake_card(size: int, dataset: Path) -> list[str]:
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size}, {size})); "
            "import probes.reporting.cards as cards; cards.dataset_card = lambda *a, **k: '# card\\n' + 'measured line\\n' * 2000; "
            f"from probes.cli.main import main; sys.exit(main(['card', {str(dataset)!r}, '--tokenizer', 'none']))")
    return [sys.executable, "-c", code]


@pytest.mark.subprocess
def test_a_full_disk_never_truncates_a_card(dataset: Path) -> None:
    card = dataset / "CARD.md"
    before = card.read_bytes()
    assert len(before) > 4096
    stale = dataset / f".CARD.{2 ** 22 + 12345}.tmp.md"  # left by a killed writer (a pid above pid_max: dead)
    stale.write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(_limit_writes_and_fake_card(4096, dataset), env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert f"error: File too large: {card}" in run.stderr
    assert card.read_bytes() == before
    assert sorted(p.name for p in dataset.iterdir() if p.name.startswith(".")) == []  # neither the stale nor its own temporary


def test_a_killed_builds_empty_temporary_is_cleaned_up(tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    stale = tmp_path / f".rec.{2 ** 22 + 12345}.tmp.jsonl"
    stale.write_bytes(b"")
    argv = ["build", "--limit", "1", "--k-max", "0", "--config", "basm", "--workers", "1", "--dataset", "basm_probe",
            "--embedder", "lexical", "--relevance", "lexical", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["rec.jsonl"]


def test_model_files_that_are_not_what_they_say_raise_model_load_errors(tmp_path: Path, tiny_qwen3_dir: Path) -> None:
    from probes.engine.loading import ModelLoadError, load_model

    fake = tmp_path / "fake.gguf"
    for data, match in ((b"GGUF" + (3).to_bytes(4, "little"), "struct.error"),
                        (b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little") * 2 + b"\xff" * 50, "damaged or not a GGUF"),
                        (b"\x00" * 64, "GGUF magic")):
        fake.write_bytes(data)
        with pytest.raises(ModelLoadError, match=match) as raised:
            load_model(fake)
        assert str(fake) in str(raised.value)
    pickled = Path(shutil.copytree(tiny_qwen3_dir, tmp_path / "pickled"))
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04\x95 not a pickle of tensors")
    with pytest.raises(ModelLoadError, match=r"pickle weights in .*pickled \(pytorch_model\.bin\): UnpicklingError"):
        load_model(pickled, allow_pickle=True)


def test_a_latin1_byte_in_the_items_names_file_and_line(dataset: Path) -> None:
    from probes.data.dataset import DatasetError, load_dataset

    items = dataset / "items.jsonl"
    lines = items.read_bytes().split(b"\n")
    lines[4] = lines[4].replace(b'"user": "', b'"user": "caf\xe9 ', 1)
    items.write_bytes(b"\n".join(lines))
    with pytest.raises(DatasetError, match=r"items\.jsonl:5: not UTF-8 text \(byte 0xe9"):
        load_dataset(dataset)


@pytest.mark.parametrize("wrong_tools, message", [([], "field 'wrong_tools' is empty"),
                                                  (["get_order_details"], "holds the correct tool 'get_order_details'"),
                                                  (["get_stock_info", "get_stock_info"], "lists ['get_stock_info'] more than once")])
def test_items_that_cannot_be_scored_fail_validation(dataset: Path, wrong_tools: list[str], message: str) -> None:
    from probes.data.dataset import DatasetError, load_dataset

    items = dataset / "items.jsonl"
    lines = items.read_text().splitlines()
    first = json.loads(lines[0])
    assert first["correct_action"]["tool"] == "get_order_details"
    first["wrong_tools"] = wrong_tools
    items.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(DatasetError, match=re.escape("items.jsonl:1 (item retail-ok-0001): ") + ".*" + re.escape(message)):
        load_dataset(dataset)
