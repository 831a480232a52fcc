"""The deciding-row replay (probes.engine.decision_row) against independent computations.

Bar: the replay's metric equals the logit difference of an eager HF forward (≤ 1e-5, fp32); DLA parts
sum to it (≤ 1e-4 relative) and the per-head parts equal a hand computation from the engine's own
``hook_z`` recording, ``o_proj`` and the final norm; patching an edge to a knockout equals an eager
forward with an explicit 4D additive mask removing that span from that head at that row; patching every
edge to a counterfactual row reproduces that row's metric; AtP* is exact where the downstream is linear
(a one-layer attention-only model with an identity readout), AtP is exact there for value-only
patches and off where saturation is planted; EAP-IG's scores sum to the total effect; the prefix
cache changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from probes.engine.decision_row import OTHER, DecisionRow
from probes.engine.hooks import HOOK_Z, Recorder
from probes.engine.session import EngineSession
from tests.reference import knockout_masks, masked_eager_forward

TOL = 1e-5
N = 60
SPANS = {"boundary": range(10, 22), "procedure": range(25, 38), "request": range(45, 52)}
WRONG, CORRECT = 17, 33


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return torch.randint(5, 290, (N,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.fixture(scope="module")
def session(qwen3_dir: Path) -> EngineSession:
    return EngineSession(qwen3_dir)


@pytest.fixture(scope="module")
def eager(qwen3_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(qwen3_dir, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def row(session: EngineSession, ids: list[int]) -> DecisionRow:
    return DecisionRow(session, ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)


def eager_metric(eager: torch.nn.Module, ids: list[int], active: torch.Tensor | None = None, keys=()) -> float:
    n = len(ids)
    active = torch.zeros(eager.config.num_hidden_layers, eager.config.num_attention_heads, dtype=torch.bool) if active is None else active
    logits, _ = masked_eager_forward(eager, ids, knockout_masks(n, active, list(keys), [n - 1]))
    return float(logits[-1, WRONG] - logits[-1, CORRECT])


def test_spans_partition_the_keys(row: DecisionRow) -> None:
    assert row.spans == ("boundary", "procedure", "request", OTHER)
    assert row.span_of.shape == (N,) and (row.span_of[10:22] == 0).all() and row.span_of[0] == 3 and row.span_of[-1] == 3


def test_metric_equals_eager_logit_difference(row: DecisionRow, eager: torch.nn.Module, ids: list[int]) -> None:
    assert abs(row.metric - eager_metric(eager, ids)) <= TOL


def test_dla_sums_to_metric_and_heads_match_hand_computation(row: DecisionRow, session: EngineSession, ids: list[int]) -> None:
    parts = row.components()
    assert abs(parts.total - row.metric) <= 1e-4 * max(1.0, abs(row.metric))
    # hand computation: the engine's own hook_z recording at the last row, o_proj, final RMSNorm at that row
    z_rec = Recorder("z", (HOOK_Z,), lambda z: z, rows="decision")
    res = session.run(ids, [N - 1], recorders=[z_rec], record_residual=True)
    z = res.conditions[0].recorded["z"].clone()  # [layer, head, d_head]
    x = res.conditions[0].residual[-1].clone()
    model = session.model
    torch.set_grad_enabled(False)
    norm = model.model.norm
    scale = torch.rsqrt(x.pow(2).mean() + norm.variance_epsilon)
    w = model.lm_head.weight
    direction = scale * norm.weight * (w[WRONG] - w[CORRECT])
    for layer in range(session.n_layers):
        o = model.model.layers[layer].self_attn.o_proj.weight.reshape(-1, session.n_heads, z.shape[-1])
        hand = torch.einsum("dhk,hk,d->h", o, z[layer], direction).detach().numpy()
        np.testing.assert_allclose(parts.heads[layer], hand, atol=1e-4)
    torch.set_grad_enabled(True)


@pytest.mark.parametrize("cell", [(0, 1), (1, 2)])
def test_edge_patch_to_knockout_equals_masked_eager(row: DecisionRow, eager: torch.nn.Module, ids: list[int], cell) -> None:
    ko = row.knocked_out("boundary")
    exact = row.exact_edges(ko, [(*cell, 0)])[0]
    active = torch.zeros(row.n_layers, row.n_heads, dtype=torch.bool)
    active[cell] = True
    assert abs(row.metric + exact - eager_metric(eager, ids, active, SPANS["boundary"])) <= TOL
    # every B edge patched = B knocked out everywhere at that row = patching every edge to the knockout run
    every_b = torch.zeros(1, row.n_layers, row.n_heads, len(row.spans), dtype=torch.bool)
    every_b[..., 0] = True
    full = eager_metric(eager, ids, torch.ones(row.n_layers, row.n_heads, dtype=torch.bool), SPANS["boundary"])
    assert abs(row.patched_metrics(ko, every_b)[0] - full) <= TOL
    assert abs(row.patched_metrics(ko, torch.ones_like(every_b))[0] - full) <= TOL


def test_counterfactual_row_reproduced_when_every_edge_is_patched(session: EngineSession, row: DecisionRow, ids: list[int]) -> None:
    # a prompt of the same length ending in the same token: its deciding row has this row's token and position, so
    # taking every one of its messages makes this row that row
    other_ids = ids[:5] + torch.randint(5, 290, (N - 8,), generator=torch.Generator().manual_seed(9)).tolist() + ids[-3:]
    other = DecisionRow(session, other_ids, spans={"boundary": range(8, 15), "request": range(30, 40)},
                        wrong_token=WRONG, correct_token=CORRECT)
    target = other.messages.aligned(row.spans)
    assert torch.isinf(target.log_mass[:, :, 1]).all()  # P absent in the counterfactual: read by nobody
    every = torch.ones(1, row.n_layers, row.n_heads, len(row.spans), dtype=torch.bool)
    assert abs(row.patched_metrics(target, every)[0] - other.metric) <= TOL
    assert abs(other.metric - row.metric) > 100 * TOL  # the two rows differ: the patch, not the prompt, made them equal


def test_prefix_cache_changes_nothing(qwen3_dir: Path) -> None:
    ids = torch.randint(5, 290, (200,), generator=torch.Generator().manual_seed(6)).tolist()
    blank_line = AutoTokenizer.from_pretrained(qwen3_dir).encode("\n\n")
    ids[100: 100 + len(blank_line)] = blank_line  # a prefix block ends before it (probes.engine.prefix_cache)
    a = DecisionRow(EngineSession(qwen3_dir, prefix_cache=0), ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)
    warm = EngineSession(qwen3_dir)
    warm.run(ids[:150] + [7, 8, 9], [152])  # a cached prefix the row reuses
    b = DecisionRow(warm, ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)
    assert warm.prefix_reuse.tokens_reused > 0
    assert a.metric == b.metric and torch.equal(a.messages.log_mass, b.messages.log_mass)


def test_eap_ig_scores_sum_to_total_effect() -> None:
    # on the organism (the tiny random model's widened scores saturate so hard that the mass-linear path
    # concentrates its change within 1e-4 of α = 1: there the quadrature needs far more steps, and the
    # analysis reports the completeness per item rather than assuming it)
    from probes.organism import ORGANISM_DIR

    ids = torch.randint(5, 3000, (120,), generator=torch.Generator().manual_seed(0)).tolist()
    row = DecisionRow(EngineSession(ORGANISM_DIR), ids, spans={"boundary": range(20, 40), "procedure": range(50, 70)},
                      wrong_token=WRONG, correct_token=CORRECT)
    ko = row.knocked_out("boundary")
    scores = row.edge_scores(ko, ig_steps=32)
    total = row.patched_metrics(ko, torch.ones(1, row.n_layers, row.n_heads, len(row.spans), dtype=torch.bool))[0] - row.metric
    assert abs(scores["eap_ig"].sum() - total) <= 0.02 * abs(total) + 1e-4
    # GradDrop leaves the last layer's edges at |AtP*| and is unsigned
    np.testing.assert_allclose(scores["atp_gd"][-1], np.abs(scores["atp_star"][-1]), atol=1e-6)
    assert (scores["atp_gd"] >= 0).all()


# ----------------------------------------------------------------------------- a model where AtP* is exact
class _Readout(torch.nn.Module):
    """An identity "final norm" (so the readout is linear), with the epsilon attribute of an RMSNorm."""

    variance_epsilon = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.fixture(scope="module")
def linear_row(organism_tokenizer) -> DecisionRow:
    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=300, hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "mlp" in name:
                p.zero_()  # attention only
            elif "q_proj" in name or "k_proj" in name:
                p.mul_(8.0)
    model.model.norm = _Readout()
    ids = torch.randint(5, 290, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    return DecisionRow(EngineSession(model), ids, spans={"boundary": range(5, 15), "procedure": range(18, 30)},
                       wrong_token=WRONG, correct_token=CORRECT)


def _every_edge(row: DecisionRow) -> list[tuple[int, int, int]]:
    return [(0, h, s) for h in range(row.n_heads) for s in range(len(row.spans))]


def test_atp_exact_on_value_only_patches_in_a_linear_readout(linear_row: DecisionRow) -> None:
    m = linear_row.messages
    target = replace(m, value=m.value + torch.randn(m.value.shape, generator=torch.Generator().manual_seed(5)))
    scores = linear_row.edge_scores(target, ig_steps=4)
    exact = linear_row.exact_edges(target, _every_edge(linear_row)).reshape(scores["atp"].shape)
    np.testing.assert_allclose(scores["atp"], exact, atol=1e-5)
    np.testing.assert_allclose(scores["atp_star"], exact, atol=1e-5)


def test_atp_star_corrects_planted_saturation(linear_row: DecisionRow) -> None:
    m = linear_row.messages
    # saturation planted: B's log-mass raised by 8 nats in every head (the softmax over spans saturates)
    lm = m.log_mass.clone()
    lm[:, :, 0] += 8.0
    target = replace(m, log_mass=lm, value=torch.flip(m.value, dims=[2]))
    scores = linear_row.edge_scores(target, ig_steps=4)
    exact = linear_row.exact_edges(target, _every_edge(linear_row)).reshape(scores["atp"].shape)
    np.testing.assert_allclose(scores["atp_star"], exact, atol=1e-5)  # exact: the readout after z is linear
    err_atp = np.abs(scores["atp"] - exact)[..., 0].max()
    assert err_atp > 100 * np.abs(scores["atp_star"] - exact)[..., 0].max() + 0.1


def test_refusals(session: EngineSession, ids: list[int], row: DecisionRow) -> None:
    with pytest.raises(ValueError, match="overlaps span 'boundary'"):
        DecisionRow(session, ids, spans={"boundary": range(10, 20), "procedure": range(15, 25)}, wrong_token=WRONG, correct_token=CORRECT)
    with pytest.raises(ValueError, match="same token"):
        DecisionRow(session, ids, spans=SPANS, wrong_token=WRONG, correct_token=WRONG)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        DecisionRow(session, ids, spans=SPANS, wrong_token=10**7, correct_token=CORRECT)
    with pytest.raises(ValueError, match="not one of this row's source spans"):
        row.knocked_out("catalog")
    # a residual stream that is not the sum of its parts (a block output rescaled, as a post-norm would) is refused
    handle = session.model.model.layers[0].register_forward_hook(lambda _m, _i, out: out * 1.5 if isinstance(out, torch.Tensor) else (out[0] * 1.5, *out[1:]))
    try:
        with pytest.raises(ValueError, match="not the embedding plus per-head and MLP outputs"):
            row.components()
    finally:
        handle.remove()
    assert math.isfinite(row.components().total)
