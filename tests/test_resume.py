"""An interrupted ``sweep`` resumes: no recomputation of finished prompts, no duplicate rows, and
the final table equals that of an uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

import probes.analyses.base
from probes.cli.main import main
from probes.reporting.results import ResultsStore, load_results

torch.set_num_threads(1)


class Interrupted(Exception):
    pass


def _args(model: Path, out: Path) -> list[str]:
    return ["sweep", "--model", str(model), "--limit", "1", "--bucket", "T_wrong", "--bucket", "T_ok", "--k-max", "2",
            "--embedder", "lexical", "--out", str(out)]


def _table(path: Path) -> pd.DataFrame:
    return load_results(path).sort_values("key").reset_index(drop=True)


def test_killed_sweep_resumes_to_the_same_table(tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    assert main(_args(tiny_qwen3_dir, tmp_path / "full")) == 0
    full = _table(tmp_path / "full" / "sweep.jsonl")
    assert len(full) == 2 * 3 * 4  # items × k × configs, one baseline row each

    # Kill after 7 prompts have been written, then tear the file's last line as a kill mid-write would.
    calls = {"append": 0, "score": 0}
    real_append, real_score = ResultsStore.append, probes.analyses.base.score_record

    def dying_append(self, rows):
        if calls["append"] == 7:
            raise Interrupted
        calls["append"] += 1
        real_append(self, rows)

    monkeypatch.setattr(ResultsStore, "append", dying_append)
    with pytest.raises(Interrupted):
        main(_args(tiny_qwen3_dir, tmp_path / "resumed"))
    path = tmp_path / "resumed" / "sweep.jsonl"
    with path.open("a") as handle:
        handle.write('{"key": "torn')
    partial = load_results_lenient(path)
    assert 0 < len(partial) < len(full)

    monkeypatch.setattr(ResultsStore, "append", real_append)

    def counting_score(*args, **kwargs):
        calls["score"] += 1
        return real_score(*args, **kwargs)

    monkeypatch.setattr(probes.analyses.base, "score_record", counting_score)
    assert main(_args(tiny_qwen3_dir, tmp_path / "resumed")) == 0
    resumed = _table(path)
    assert resumed["key"].is_unique
    pd.testing.assert_frame_equal(resumed, full)
    # Only unfinished prompts were scored (at most one engine call per missing row; identical
    # prompts in a row, e.g. k = 0 across configs, share one call).
    assert 0 < calls["score"] <= len(full) - len(partial)

    # A third run finds everything done and scores nothing.
    calls["score"] = 0
    assert main(_args(tiny_qwen3_dir, tmp_path / "resumed")) == 0
    assert calls["score"] == 0
    pd.testing.assert_frame_equal(_table(path), full)


def load_results_lenient(path: Path) -> pd.DataFrame:
    """Rows of a results file with a torn last line (what a reader sees right after a kill)."""
    lines = path.read_text().splitlines()[1:]
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return pd.DataFrame(rows)


def test_resume_with_other_options_refuses(tiny_qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = _args(tiny_qwen3_dir, tmp_path) + ["--configs", "base,basm"]
    args[args.index("--k-max") + 1] = "0"
    assert main(args) == 0
    assert main([*args, "--margin-variant", "path"]) == 1
    assert "changed: config.margin_variant" in capsys.readouterr().err
    assert main([*args, "--margin-variant", "path", "--overwrite"]) == 0
    assert load_results(tmp_path / "sweep.jsonl").attrs["meta"]["config"]["margin_variant"] == "path"
