"""The results store (probes.reporting.results): one writer per output, append-only resume through kills and
full disks, strict JSON, rows named when damaged or foreign, nothing written through links or over files
that are not ours."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from probes.cli.main import main
from probes.reporting.results import ResultsCorrupt, load_results
from runs import ROOT, fails, rows_file, sweep


pytestmark = pytest.mark.usefixtures("private_cache")  # a weight-hash memo of its own per test


def cli(argv: list[str], **kwargs) -> subprocess.Popen:
    """``basm-probes argv`` in a child process (for kills, write limits and concurrent writers)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "probes.cli.main", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def keys(path: Path) -> list[str]:
    return [json.loads(line)["key"] for line in path.read_text().splitlines()[1:]]


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


def test_the_header_is_shared_by_derived_frames_not_copied(tmp_path: Path) -> None:
    from probes.reporting.results import ResultsStore

    path = tmp_path / "r.jsonl"
    ResultsStore(path, "x", {"items": list(range(1000))}).append([{"key": str(i), "g": i % 3, "m": float(i)} for i in range(30)])
    frame = load_results(path)
    header = frame.attrs["meta"]
    assert header["config"]["items"][-1] == 999 and header["analysis"] == "x"
    derived = [frame["m"], frame[frame["g"] == 1], frame.astype({"m": "float32"}), frame.iloc[3], *(part for _, part in frame.groupby("g"))]
    # pandas deep-copies attrs on every operation; the header must be the one object, not a copy per operation
    assert all(d.attrs["meta"] is header for d in derived)


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


def test_an_empty_shard_of_a_killed_rank_does_not_block_resume(tmp_path: Path) -> None:
    from probes.reporting.results import ResultsStore, shard_path

    path = tmp_path / "r.jsonl"
    ResultsStore(path, "x", {}).append([{"key": "a", "v": 1}])
    shard_path(path, 1, 2).write_bytes(b"")  # a rank killed before its header
    assert ResultsStore(path, "x", {}).done == {"a"}
    assert not shard_path(path, 1, 2).exists()
