"""Patching in heads with very large attention scores (a real model's sink heads: Qwen2.5-Coder-1.5B's layer 15
head 7 reads λ ≈ 390–490 at the deciding row). Patching every span of a head to a target equals setting that
head's output to the target's (a node patch): exactly so in arithmetic, and here to 1e-6. Before the fix the
mix ``m + a·(m_t − m)`` cancelled the target's masses (1e-16 of the row's) to 0, and a reference taken from a
span patched away underflowed the kept spans: with scores scaled ×10 the edge patch was off by 0.03, with ×30
the knockout itself was NaN (the circuit analysis stopped with "non-finite metric" on the real model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.engine.decision_row import DecisionRow
from probes.engine.session import EngineSession

SPANS = {"boundary": range(10, 22), "procedure": range(25, 38)}


@pytest.mark.parametrize("scale", [1, 10, 30])
def test_patching_every_span_of_a_head_equals_its_node_patch(qwen3_dir: Path, scale: int) -> None:
    model = AutoModelForCausalLM.from_pretrained(qwen3_dir).eval()
    with torch.no_grad():
        model.model.layers[1].self_attn.q_norm.weight.mul_(scale)  # layer 1's scores × scale
    ids = torch.randint(5, 290, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    row = DecisionRow(EngineSession(model), ids, spans=SPANS, wrong_token=17, correct_token=33)
    assert row.messages.log_mass[1].max() > 20 * scale
    target = row.knocked_out("boundary")
    L, H, S = row.n_layers, row.n_heads, len(row.spans)
    every_span = torch.zeros(L * H, L, H, S, dtype=torch.bool)
    for i in range(L * H):
        every_span[i, i // H, i % H] = True
    edges = (row.patched_metrics(target, every_span) - row.metric).reshape(L, H)
    nodes = row.node_effects(target)["head_patch"]
    assert np.isfinite(edges).all() and np.abs(edges - nodes).max() <= 1e-6
    assert np.abs(nodes).max() > 1e-3  # the heads' patches move the metric: the comparison is not of zeros
