"""Margins on hand-built logits (no model): Eq. 1, collisions, native abstention, variants."""

from __future__ import annotations

import math

import pytest
import torch

from probes.dataset import ABSTAIN
from probes.margins import (
    CandidateInfo,
    NonFiniteLogitsError,
    divergence_margin,
    entropy,
    sequence_logprob_margin,
    tool_vs_control_margin,
    wrong_tool_margin,
)

V = 10
D = 5  # decision row
O = 3  # open row (native)


def _cand(key: str, role: str, toks: tuple[int, ...], anchor: int = D) -> CandidateInfo:
    return CandidateInfo(key, role, f"tool_{key}", anchor, toks)


def _rows(seed: int = 0) -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {r: torch.randn(V, generator=g) * 3 for r in range(O, D + 1)}


IDS = [0, 1, 2, 3, 7, 8]  # input_ids[O + 1 : D + 1] = [7, 8] is the forced prefix


def test_eq1_is_max_wrong_minus_max_control():
    rows = _rows()
    dec = rows[D]
    cands = [_cand("w1", "wrong", (1,)), _cand("w2", "wrong", (2,)), _cand("c", "correct", (3,))]
    m = wrong_tool_margin(rows, IDS, cands, "prompted", D)
    assert m.value == pytest.approx(float(torch.max(dec[1], dec[2]) - dec[3]))
    assert (m.variant, m.format, m.collision) == ("wrong_tool", "prompted", False)
    # Prompted abstention is a token at the decision row and joins the control set.
    cands.append(_cand("a", "abstain", (4,)))
    m = wrong_tool_margin(rows, IDS, cands, "prompted", D)
    assert m.value == pytest.approx(float(torch.max(dec[1], dec[2]) - torch.max(dec[3], dec[4])))


def test_first_token_collision_is_flagged_not_zero():
    rows = _rows()
    cands = [_cand("w", "wrong", (1, 5)), _cand("c", "correct", (1, 6))]
    for fn in (wrong_tool_margin, tool_vs_control_margin):
        m = fn(rows, IDS, cands, "native", D)
        assert m.collision and math.isnan(m.value) and "collision" in m.note
    lp = {"w": torch.tensor([-1.0, -0.5]), "c": torch.tensor([-1.0, -2.0])}
    d = divergence_margin(rows, IDS, cands, "native", D, lp)
    assert not d.collision and d.value == pytest.approx(1.5)
    s = sequence_logprob_margin(rows, IDS, cands, "native", D, lp)
    assert not s.collision and s.value == pytest.approx(1.5)


def test_native_abstention_uses_path_logprobs():
    rows = _rows(1)
    cands = [_cand("w", "wrong", (1,)), _cand("c", "correct", (2,)), _cand("a", "abstain", (9,), anchor=O)]
    m = wrong_tool_margin(rows, IDS, cands, "native", D, open_index=O)
    lp = {r: torch.log_softmax(x, -1) for r, x in rows.items()}
    forced = float(lp[O][7] + lp[O + 1][8])
    abstain = math.log(1 - math.exp(float(lp[O][7])))
    want = forced + float(lp[D][1]) - max(forced + float(lp[D][2]), abstain)
    assert m.value == pytest.approx(want, abs=1e-6)
    assert "not opening" in m.note


def test_native_abstention_as_the_correct_action_is_scored_as_abstention():
    """When abstaining is the correct action (the needed tool is not in the catalog), the record
    gives the abstain candidate the role "correct"; every variant scores it at the open row."""
    rows = _rows(2)
    lp = {r: torch.log_softmax(x, -1) for r, x in rows.items()}
    forced = float(lp[O][7] + lp[O + 1][8])
    abstain = math.log(1 - math.exp(float(lp[O][7])))
    cands = [_cand("w", "wrong", (1,)), CandidateInfo("a", "correct", ABSTAIN, O, (9,))]
    want = forced + float(lp[D][1]) - abstain
    assert wrong_tool_margin(rows, IDS, cands, "native", D, open_index=O).value == pytest.approx(want, abs=1e-6)
    # the divergence variant compares tool and abstention where they diverge: at the open row
    token_logprobs = {"w": lp[D][1:2], "a": lp[O][9:10]}
    got = divergence_margin(rows, IDS, cands, "native", D, token_logprobs, open_index=O).value
    assert got == pytest.approx(float(lp[O][7]) - abstain, abs=1e-6)


def test_without_abstain_native_reduces_to_logit_difference():
    rows = _rows(2)
    cands = [_cand("w", "wrong", (1,)), _cand("c", "correct", (2,))]
    m = wrong_tool_margin(rows, IDS, cands, "native", D, open_index=O)
    assert m.value == pytest.approx(float(rows[D][1] - rows[D][2]), abs=1e-6)
    # ... which is what the log-prob path form gives too (forced prefix and normaliser cancel).
    lp = torch.log_softmax(rows[D], -1)
    assert m.value == pytest.approx(float(lp[1] - lp[2]), abs=1e-5)


def test_tool_vs_control_includes_catalog_tools():
    rows = _rows(3)
    dec = rows[D]
    cands = [_cand("w", "wrong", (1,)), _cand("c", "correct", (2,))]
    m = tool_vs_control_margin(rows, IDS, cands, "prompted", D, extra_tool_first_tokens=[6, 7])
    assert m.value == pytest.approx(float(dec[[1, 6, 7]].max() - dec[2]))
    clash = tool_vs_control_margin(rows, IDS, cands, "prompted", D, extra_tool_first_tokens=[2])
    assert clash.collision and math.isnan(clash.value)


def test_divergence_reduces_to_eq1_without_shared_tokens():
    rows = _rows(4)
    lp = torch.log_softmax(rows[D], -1)
    cands = [_cand("w1", "wrong", (1, 3)), _cand("w2", "wrong", (2,)), _cand("c1", "correct", (4,)), _cand("c2", "correct", (5, 1))]
    tl = {c.key: torch.tensor([float(lp[c.token_ids[0]]), -0.3][: len(c.token_ids)]) for c in cands}
    d = divergence_margin(rows, IDS, cands, "prompted", D, tl)
    e = wrong_tool_margin(rows, IDS, cands, "prompted", D)
    assert d.value == pytest.approx(e.value, abs=1e-6)


def test_nested_or_identical_names_collide_in_every_variant():
    rows = _rows(5)
    cands = [_cand("w", "wrong", (1, 2)), _cand("c", "correct", (1, 2))]
    tl = {"w": torch.tensor([-1.0, -1.0]), "c": torch.tensor([-1.0, -1.0])}
    for fn in (divergence_margin, sequence_logprob_margin):
        m = fn(rows, IDS, cands, "prompted", D, tl)
        assert m.collision and math.isnan(m.value)


def test_non_finite_logits_raise():
    rows = _rows(6)
    rows[D] = rows[D].clone()
    rows[D][0] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match="row 5"):
        wrong_tool_margin(rows, IDS, [_cand("w", "wrong", (1,)), _cand("c", "correct", (2,))], "prompted", D)
    with pytest.raises(NonFiniteLogitsError):
        entropy(torch.tensor([0.0, float("inf")]))


def test_entropy():
    assert entropy(torch.zeros(8)) == pytest.approx(math.log(8))
    assert entropy(torch.tensor([100.0, 0.0, 0.0])) == pytest.approx(0.0, abs=1e-6)


def test_missing_roles_raise():
    rows = _rows()
    with pytest.raises(ValueError, match="no wrong"):
        wrong_tool_margin(rows, IDS, [_cand("c", "correct", (1,))], "prompted", D)
    with pytest.raises(ValueError, match="role"):
        _cand("x", "distractor", (1,))


def test_other_catalog_tools_enter_only_the_broad_margin():
    """An "other" catalog tool with a higher logit raises tool-vs-control but not Eq. 1."""
    rows = _rows()
    cands = [_cand("w", "wrong", (3,)), _cand("c", "correct", (4,)), _cand("o", "other", (7,))]
    narrow = wrong_tool_margin(rows, IDS, cands, "prompted", D)
    broad = tool_vs_control_margin(rows, IDS, cands, "prompted", D)
    logits = rows[D]
    assert narrow.value == pytest.approx(float(logits[3] - logits[4]), abs=1e-6)
    assert broad.value == pytest.approx(float(max(logits[3], logits[7]) - logits[4]), abs=1e-6)
