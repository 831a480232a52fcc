"""benchmarks/real_shape.py --tiny, the circuit rows alone (issue #43 item 6): the deciding rows of the
T_wrong basm prompt and of the same item's proc prompt, AtP + AtP* over every (layer, head, span) edge,
GradDrop, EAP-IG, exact patching of every edge and DLA + node effects, each in forwards of the clean
prompt, built as the circuit analysis builds them (its source spans, its binding pair); the headline is
the sum of the first three; a row holds O(layers · heads · spans) messages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from runs import load_script

from probes.analyses.circuit import SPAN_ORDER
from probes.engine.decision_row import OTHER

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
OTHER_ROWS = ("sweep", "baseline, every margin", "ratios / heads map", "knockout (12)", "knockout (12), prefix warm",
              "knockout (default)", "heads causal", "linear", "sweep item, reuse", "sweep item, no reuse", "attribution")
PIECES = ("clean row", "counterfactual row", "AtP + AtP*", "AtP + AtP* + GradDrop", "AtP + AtP* + EAP-IG (2)",
          "exact patching (every edge)", "DLA + node effects")


@pytest.fixture(scope="module")
def real_shape():
    torch.set_num_threads(1)
    return load_script("benchmarks_real_shape", BENCHMARKS / "real_shape.py")


def test_tiny_circuit_rows(real_shape, tmp_path):
    out = tmp_path / "real_shape.json"
    report = real_shape.main(["--tiny", "--skip", *OTHER_ROWS, "--backends", "--ig-steps", "2", "--json", str(out)])
    c = report["circuit"]
    assert json.loads(out.read_text())["circuit"] == c and report["rows"] == {} and report["attribution"] is None
    assert (c["record_id"], c["counterfactual"]) == ("retail-wrong-0001|basm|k2|native", "retail-wrong-0001|proc|k2|native")
    assert c["spans"] == [*SPAN_ORDER, OTHER]  # the analysis' own source spans
    assert (c["layers"], c["heads"], c["edges"], c["ig_steps"]) == (4, 4, 4 * 4 * 8, 2)
    assert tuple(c["pieces"]) == PIECES
    for piece in c["pieces"].values():
        assert piece["time_s"] > 0 and piece["forwards"] == pytest.approx(piece["time_s"] / piece["unit_s"], rel=1e-12)
        assert piece["cpu_s"] > 0 and piece["cpu_forwards"] == pytest.approx(piece["cpu_s"] / piece["unit_cpu_s"], rel=1e-12)
    assert c["circuit_atp"] == pytest.approx(sum(c["pieces"][n]["forwards"] for n in PIECES[:3]), rel=1e-12)
    assert c["circuit_atp_cpu"] == pytest.approx(sum(c["pieces"][n]["cpu_forwards"] for n in PIECES[:3]), rel=1e-12)
    assert 0 < c["counterfactual_prefix_reused"] < c["tokens"][1]  # the proc prompt shares the system turn, catalogue, first fields
    # held per row: messages (λ [L, H, S], ū [L, H, S, dh], z [L, H, dh], MLP [L, D], fp32) and the prefix K/V
    L, H, S, dh, D, kv = 4, 4, 8, 16, 64, 2
    assert c["messages_bytes"] == 4 * (L * H * S * (1 + dh) + L * H * dh + L * D)
    assert c["prefix_kv_bytes"] == 4 * 2 * L * kv * dh * c["tokens"][0]  # keys before the deciding row: the prompt and one shared name token, less the row
    assert math.isfinite(c["atp_star_vs_exact_spearman"]) and c["max_abs_exact"] > 0
