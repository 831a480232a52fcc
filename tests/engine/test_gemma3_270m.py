"""Sliding-window parity on the real Gemma 3 270M (slow tier; issue #46 item 2): 18 layers, local layers with a
512-token window, on a prompt longer than the window, against the eager forward with explicit per-layer 4D masks
(tests/reference.py). Margins (logit differences at the query rows) and span attention within 1e-5 in float32;
attention outside a local layer's window exactly 0; a knockout outside the window on the local layers a no-op."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.engine.session import BASELINE, EngineSession, Knockout
from reference import knockout_masks, masked_eager_forward

pytestmark = pytest.mark.slow

N = 700
QUERY_ROWS = [660, 680, 699]
FAR, NEAR = list(range(40, 120)), list(range(600, 640))  # outside / inside the 512-token window of every query row
SPANS = {"far": FAR, "near": NEAR}
PAIR = (236761, 236764)  # two common tokens: the margin is their logit difference
TOL = 1e-5


def test_gemma3_270m_matches_per_layer_masks_past_the_window(gemma3_270m_dir):
    session = EngineSession(gemma3_270m_dir)
    eager = AutoModelForCausalLM.from_pretrained(gemma3_270m_dir, attn_implementation="eager").eval()
    windows = session.windows
    local = tuple(i for i, w in enumerate(windows) if w is not None)
    assert windows.count(None) == 3 and set(windows) == {512, None}  # 5 local : 1 global
    ids = torch.randint(1000, 200000, (N,), generator=torch.Generator().manual_seed(0)).tolist()
    conditions = [Knockout("near", NEAR), Knockout("far_local", FAR, layers=local), Knockout("far", FAR)]
    result = session.run(ids, QUERY_ROWS, SPANS, conditions, record_rows=True)
    worst = {"margin": 0.0, "span": 0.0}
    for knockout in [BASELINE, *conditions]:
        active = knockout.active(session.n_layers, session.n_heads)
        logits, probs = masked_eager_forward(eager, ids, knockout_masks(N, active, knockout.key_positions, QUERY_ROWS, windows))
        got = result[knockout.name]
        margin = lambda lg: lg[..., PAIR[0]] - lg[..., PAIR[1]]  # noqa: E731
        worst["margin"] = max(worst["margin"], float((margin(got.logits[[r - QUERY_ROWS[0] for r in QUERY_ROWS]]) - margin(logits[QUERY_ROWS])).abs().max()))
        at_rows = probs[:, :, QUERY_ROWS]
        for span, positions in SPANS.items():
            worst["span"] = max(worst["span"], float((got.span_mass[span] - at_rows[..., positions].sum(-1)).abs().max()))
        for layer in local:
            for i, row in enumerate(QUERY_ROWS):
                assert torch.all(got.rows[layer, :, i, : row - 512 + 1] == 0)
    print(f"\ngemma-3-270m, {N} tokens: max |Δ margin| {worst['margin']:.1e}, max |Δ span mass| {worst['span']:.1e}")
    assert worst["margin"] <= TOL and worst["span"] <= TOL
    assert torch.equal(result["far_local"].logits, result["baseline"].logits)
    assert not result.conditions[0].span_mass["far"][list(local)].any()
    assert not conditions[1].reach(session.n_heads, QUERY_ROWS, windows).any()
