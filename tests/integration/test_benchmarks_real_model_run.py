"""benchmarks/real_model.py end to end on the real model, its smallest piece: the model assembled from
the installed parts, the unit forward measured, and ``knockout`` (neutral pool, every control) on one
T_wrong item of the files domain; the summary states the spans, the claims and the controls. 3 min 25 s on one core at load ≈ 4 (measured;
the GGUF conversion, 2 min 43 s, once per machine, is cached by content hash)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from probes.reporting.results import load_results
from runs import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_model():
    try:
        yield load_script("benchmarks_real_model", BENCHMARKS / "real_model.py")
    finally:
        del sys.modules["benchmarks_real_model"]


def test_smallest_real_model_run(real_model, tmp_path):
    try:
        real_model.part_files()
    except real_model.ModelPartsError as error:
        pytest.skip(f"the real model's parts are not installed: {error}")
    assert real_model.main(["--out", str(tmp_path / "runs"), "--models", str(tmp_path / "models"),
                            "--steps", "knockout-neutral", "--limit", "1"]) == 0
    summary = (tmp_path / "runs" / "summary.md").read_text()
    assert " 0 mismatches" in summary  # the prompts' spans round-trip through the real Qwen2 tokenizer
    assert "exit 0" in summary and "knockout_claims.csv" in summary and "knockout_controls.csv" in summary
    rows = load_results(tmp_path / "runs" / "knockout-neutral" / Path(real_model.MODEL_FILE).stem / "knockout.jsonl")
    baseline = rows[rows["condition"] == "baseline"]
    assert len(baseline) == 2 and np.isfinite(baseline["margin"]).all()  # basm and proc: tool_choice margins are finite
