"""An interrupted ``sweep`` resumes: no recomputation of finished prompts, no duplicate rows, and
the final table equals that of an uninterrupted run; changed weights, edited items or a bogus row
stop a resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

import probes.analyses.jobs
from probes.analyses.sweep import Sweep
from probes.cli.main import main
from probes.reporting.results import ResultsConfigMismatch, load_results
from probes.reporting.layout import rows_path
from interrupt import killed_after_appends
from runs import edit_in_place_keep_mtime, fails, rows_file, sweep


torch.set_num_threads(1)


def _sweep(model: Path, out: Path, **options) -> Sweep:
    return Sweep(**{"model": model, "limit": 1, "buckets": ["T_wrong", "T_ok"], "k_max": 2, "dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "out": out,
                    **options})


def _args(model: Path, out: Path) -> list[str]:
    return ["sweep", "--model", str(model), "--limit", "1", "--bucket", "T_wrong", "--bucket", "T_ok", "--k-max", "2",
            "--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical", "--out", str(out)]


def _table(path: Path) -> pd.DataFrame:
    return load_results(path).sort_values("key").reset_index(drop=True)


def test_killed_sweep_resumes_to_the_same_table(tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    result = _sweep(tiny_qwen3_dir, tmp_path / "full").run()
    assert result.status == 0 and result.out_dir == tmp_path / "full" / tiny_qwen3_dir.name
    full = _table(rows_path(result.out_dir, "sweep"))
    assert len(full) == 2 * 3 * 4  # items × k × configs, one baseline row each

    # Kill after 7 prompts have been written, then tear the file's last line as a kill mid-write would.
    calls = {"score": 0}
    real_score = probes.analyses.jobs.score_record
    with killed_after_appends(7):
        _sweep(tiny_qwen3_dir, tmp_path / "resumed").run()
    path = rows_path(tmp_path / "resumed" / tiny_qwen3_dir.name, "sweep")
    with path.open("a") as handle:
        handle.write('{"key": "torn')
    partial = load_results_lenient(path)
    assert 0 < len(partial) < len(full)

    def counting_score(*args, **kwargs):
        calls["score"] += 1
        return real_score(*args, **kwargs)

    monkeypatch.setattr(probes.analyses.jobs, "score_record", counting_score)
    assert _sweep(tiny_qwen3_dir, tmp_path / "resumed").run().status == 0
    resumed = _table(path)
    assert resumed["key"].is_unique
    pd.testing.assert_frame_equal(resumed, full, check_exact=True)  # bit for bit: the prefix cache starts cold on resume
    # Only unfinished prompts were scored (at most one engine call per missing row; identical
    # prompts in a row, e.g. k = 0 across configs, share one call).
    assert 0 < calls["score"] <= len(full) - len(partial)

    # A third run finds everything done and scores nothing.
    calls["score"] = 0
    assert main(_args(tiny_qwen3_dir, tmp_path / "resumed")) == 0  # the CLI resumes the same results
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
    options = {"k_max": 0, "configs": ["base", "basm"]}
    assert _sweep(tiny_qwen3_dir, tmp_path, **options).run().status == 0
    with pytest.raises(ResultsConfigMismatch, match="changed: config.margin_variant"):
        _sweep(tiny_qwen3_dir, tmp_path, margin_variant="path", **options).run()
    # the CLI refuses the same way: exit status 1 and the change named
    args = _args(tiny_qwen3_dir, tmp_path) + ["--configs", "base,basm"]
    args[args.index("--k-max") + 1] = "0"
    assert main([*args, "--margin-variant", "path"]) == 1
    assert "changed: config.margin_variant" in capsys.readouterr().err
    result = _sweep(tiny_qwen3_dir, tmp_path, margin_variant="path", overwrite=True, **options).run()
    assert result.status == 0
    assert load_results(rows_path(result.out_dir, "sweep")).attrs["meta"]["config"]["margin_variant"] == "path"


@pytest.mark.usefixtures("private_cache")
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


@pytest.mark.usefixtures("private_cache")
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


@pytest.mark.usefixtures("private_cache")
def test_resume_of_a_sweep_with_a_bogus_row_is_refused(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    with rows_file(out).open("a") as handle:
        handle.write('{"key": "bogus|key"}\n')
    assert "sweep.jsonl:6: not a results row" in fails(sweep(model, out), capsys)


@pytest.mark.usefixtures("private_cache")
def test_a_tensor_changed_in_place_with_its_mtime_restored_stops_a_resume(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    before = rows_file(out).read_bytes()
    edit_in_place_keep_mtime(model / "model.safetensors")
    assert re.search(r"fingerprint\.weights.*--overwrite", fails(sweep(model, out), capsys))
    assert rows_file(out).read_bytes() == before
