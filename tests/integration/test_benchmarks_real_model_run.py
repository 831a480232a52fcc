"""benchmarks/real_model.py end to end on the real model, its smallest pieces: the model assembled from
the installed parts, the unit forward measured, and ``knockout`` (neutral pool, every control) on one
T_wrong item of the files domain; the summary states the spans, the claims and the controls. 3 min 25 s on one core at load ≈ 4 (measured;
the GGUF conversion, 2 min 43 s, once per machine, is cached by content hash).

The ``steer`` step at ``--limit 2`` (one T_wrong and one T_ok item in each of the files domain's first two task groups;
sorted by name, delete_vs_archive.g01 trains and link_vs_share.g00 is held out): every held-out prompt (BASM and Proc.
Skill) is steered at every condition of the step, the margins are finite and the summary states the step's claims.
7 prompts: 10 min 56 s on one core at load ≈ 3–4 (measured)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from probes.reporting.results import load_results
from probes.reporting.layout import rows_path
from runs import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_model():
    try:
        yield load_script("benchmarks_real_model", BENCHMARKS / "real_model.py")
    finally:
        del sys.modules["benchmarks_real_model"]


@pytest.fixture
def installed(real_model):
    """The benchmark script, once the real model's parts are installed (else the test is skipped, saying why)."""
    try:
        real_model.part_files()
    except real_model.ModelPartsError as error:
        pytest.skip(f"the real model's parts are not installed: {error}")
    return real_model


def test_smallest_real_model_run(installed, tmp_path):
    real_model = installed
    assert real_model.main(["--out", str(tmp_path / "runs"), "--models", str(tmp_path / "models"),
                            "--steps", "knockout-neutral", "--limit", "1"]) == 0
    summary = (tmp_path / "runs" / "summary.md").read_text()
    assert " 0 mismatches" in summary  # the prompts' spans round-trip through the real Qwen2 tokenizer
    assert "exit 0" in summary and "knockout_claims.csv" in summary and "knockout_controls.csv" in summary
    rows = load_results(rows_path(tmp_path / "runs" / "knockout-neutral" / Path(real_model.MODEL_FILE).stem, "knockout"))
    baseline = rows[rows["condition"] == "baseline"]
    assert len(baseline) == 2 and np.isfinite(baseline["margin"]).all()  # basm and proc: tool_choice margins are finite


def test_smallest_real_model_steer_run(installed, tmp_path):
    real_model = installed
    assert real_model.main(["--out", str(tmp_path / "runs"), "--models", str(tmp_path / "models"), "--steps", "steer", "--limit", "2"]) == 0
    summary = (tmp_path / "runs" / "summary.md").read_text()
    assert "exit 0" in summary and "steer_claims.csv" in summary and "steer_dose.csv" in summary
    rows = load_results(rows_path(tmp_path / "runs" / "steer" / Path(real_model.MODEL_FILE).stem, "steer"))
    assert set(rows["task_group"]) == {"files.link_vs_share.g00"}  # held out; delete_vs_archive.g01 gave the directions
    assert sorted(rows.loc[rows["condition"] == "baseline", "config"]) == ["basm", "basm", "proc", "proc"]
    conditions = 3 * (4 + 1 + 4)  # α grid × (4 directions, shuffled, 4 random draws), layer 18, decision rows
    assert len(rows) == 4 * (1 + conditions)
    assert set(rows["layer"]) == {-1, 18} and np.isfinite(rows["margin"]).all() and (rows["kl_clean"] >= 0).all()
