"""benchmarks/real_shape.py --tiny, the attribution row alone: the ``attribution`` analysis' job list
scored by its own scorer (prefix reuse, identical prompts once) against as many independent
``score_record`` calls without reuse gives the same margin for every job."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PER_PROMPT_ROWS = ("sweep", "baseline, every margin", "ratios / heads map", "knockout (12)", "knockout (12), prefix warm",
                   "knockout (default)", "heads causal", "linear", "sweep item, reuse", "sweep item, no reuse")


@pytest.fixture(scope="module")
def real_shape():
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("benchmarks_real_shape", BENCHMARKS / "real_shape.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_attribution_run_against_independent_calls(real_shape, tmp_path):
    from probes.analyses.attribution import Attribution

    out = tmp_path / "real_shape.json"
    report = real_shape.main(["--tiny", "--skip", *PER_PROMPT_ROWS, "--backends", "--attribution-items", "1", "--masks", "3",
                              "--pools", "library", "--json", str(out)])
    assert json.loads(out.read_text())["attribution"] == report["attribution"]
    a = report["attribution"]
    assert report["rows"] == {} and report["sweep_item"] == {} and report["layers"] == 4
    assert (a["jobs"], a["items"], a["masks"], a["pools"], a["config"]) == (3, 1, 3, ["library"], Attribution.config)
    assert 1 <= a["distinct_prompts"] <= a["jobs"] and 1000 < a["tokens"][0] <= a["tokens"][1] <= a["tokens"][2]  # real Qwen3 prompts
    assert len(a["unit_s"]) == 3 and min(a["unit_s"]) > 0
    for side in ("run", "calls"):
        assert a[side]["time_s"] > 0 and a[side]["forwards"] == pytest.approx(a[side]["time_s"] / (sum(a["unit_s"]) / 3), rel=1e-12)
    assert a["ratio"] == a["run"]["forwards"] / a["calls"]["forwards"]
    assert 0 < a["prefix_reuse"]["fraction_reused"] < 1  # the masked prompts share the system turn and catalog
    assert a["max_abs_margin_diff"] == 0.0  # fixed prefix blocks: reuse is bit-identical
