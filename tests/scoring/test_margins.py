"""Margins on hand-built logits (no model): Eq. 1 restricted to the tools and verbatim, collisions, abstention,
the correct-tool and broad margins, the call log-odds and the path margin."""

from __future__ import annotations

import math

import pytest
import torch

from probes.data.dataset import ABSTAIN
from probes.engine.logits import NonFiniteLogitsError, entropy
from probes.scoring.margins import (
    CandidateInfo,
    broad_margin,
    call_logodds,
    correct_margin,
    eq1_margin,
    first_token_margin,
    path_margin,
    tool_choice_margin,
)

V = 10
D = 5  # decision row
O = 3  # open row (native)
IDS = [0, 1, 2, 3, 7, 8]  # input_ids[O + 1 : D + 1] = [7, 8] is the forced prefix


def _cand(key: str, role: str, toks: tuple[int, ...], anchor: int = D) -> CandidateInfo:
    return CandidateInfo(key, role, f"tool_{key}", anchor, toks)


def _rows(seed: int = 0) -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {r: torch.randn(V, generator=g) * 3 for r in range(O, D + 1)}


def _first_token_logprobs(rows: dict[int, torch.Tensor], cands: list[CandidateInfo]) -> dict[str, torch.Tensor]:
    """Single-token candidates: log P(token | its anchor row)."""
    return {c.key: torch.log_softmax(rows[c.anchor_index], -1)[list(c.token_ids)] for c in cands}


def test_tool_choice_is_eq1_on_raw_logits_with_abstention_present():
    rows = _rows()
    dec = rows[D]
    cands = [_cand("w1", "wrong", (1,)), _cand("w2", "wrong", (2,)), _cand("c", "correct", (3,)), _cand("a", "abstain", (9,), anchor=O)]
    lp = _first_token_logprobs(rows, cands)
    want = float(torch.max(dec[1], dec[2]) - dec[3])  # abstention is not a tool: not in Eq. 1's tool choice
    for m in (tool_choice_margin(cands, lp, "native"), first_token_margin(rows, cands, "native", D)):
        assert m.value == pytest.approx(want, abs=1e-5) and not m.collision
    assert tool_choice_margin(cands, lp, "native").pairs == (("tool_w1", "tool_c", 0), ("tool_w2", "tool_c", 0))


def test_eq1_verbatim_puts_abstention_in_y_ctrl_in_the_prompted_format_only():
    """Eq. 1 as the paper writes it: max over the wrong tools' first-token logits minus the max over
    the correct tool's and the abstention answer's, at the decision row (hand-computed from the raw
    logits); items whose correct action is abstention keep a value; native: NaN with the reason."""
    rows = _rows(1)
    dec = rows[D]
    cands = [_cand("w1", "wrong", (1,)), _cand("w2", "wrong", (2, 4)), _cand("c", "correct", (3,)), _cand("a", "abstain", (9,))]
    want = float(torch.max(dec[1], dec[2]) - torch.max(dec[3], dec[9]))
    m = eq1_margin(rows, cands, "prompted", D)
    assert m.value == pytest.approx(want, abs=1e-6) and not m.collision
    # the abstention logit decides it when it is the larger control
    rows[D][9] = rows[D][3] + 5.0
    assert eq1_margin(rows, cands, "prompted", D).value == pytest.approx(float(torch.max(dec[1], dec[2]) - dec[9]), abs=1e-6)
    # abstention as the correct action: Y_ctrl is the abstention answer alone (tool_choice is NaN there)
    abstain_item = [c for c in cands if c.role != "correct"]
    assert eq1_margin(rows, abstain_item, "prompted", D).value == pytest.approx(float(torch.max(dec[1], dec[2]) - dec[9]), abs=1e-6)
    # a wrong first token shared with a Y_ctrl token: flagged, never a silent number
    assert eq1_margin(rows, [_cand("w", "wrong", (9, 1)), *cands[2:]], "prompted", D).collision
    native = eq1_margin(rows, cands, "native", D)
    assert math.isnan(native.value) and "prompted" in native.note


def test_shared_first_token_is_compared_where_the_names_diverge():
    rows = _rows()
    cands = [_cand("w", "wrong", (1, 5)), _cand("c", "correct", (1, 6))]
    # log-probs at the row after the shared token: the difference there is a logit difference
    after = torch.randn(V)
    lp = {"w": torch.tensor([-1.0, float(torch.log_softmax(after, -1)[5])]), "c": torch.tensor([-1.0, float(torch.log_softmax(after, -1)[6])])}
    m = tool_choice_margin(cands, lp, "native")
    assert not m.collision and m.value == pytest.approx(float(after[5] - after[6]), abs=1e-5)
    assert m.pairs == (("tool_w", "tool_c", 1),) and "depth" in m.note
    strict = first_token_margin(rows, cands, "native", D)
    assert strict.collision and math.isnan(strict.value) and "collision" in strict.note  # flagged, never a silent 0


def test_several_wrong_tools_each_pair_at_its_own_row():
    cands = [_cand("w1", "wrong", (1, 5)), _cand("w2", "wrong", (2,)), _cand("c", "correct", (1, 6))]
    lp = {"w1": torch.tensor([-1.0, -0.2]), "w2": torch.tensor([-3.0]), "c": torch.tensor([-1.0, -2.0])}
    m = tool_choice_margin(cands, lp, "native")
    assert m.value == pytest.approx(max(-0.2 - -2.0, -3.0 - -1.0))
    assert set(m.pairs) == {("tool_w1", "tool_c", 1), ("tool_w2", "tool_c", 0)}


def test_names_that_never_diverge_are_flagged():
    cands = [_cand("w", "wrong", (1, 5)), _cand("c", "correct", (1, 5, 6))]
    m = tool_choice_margin(cands, {"w": torch.zeros(2), "c": torch.zeros(3)}, "native")
    assert m.collision and math.isnan(m.value) and "never diverge" in m.note


def test_abstention_as_the_correct_action_has_no_tool_choice_margin():
    rows = _rows(2)
    cands = [_cand("w", "wrong", (1,)), CandidateInfo("a", "correct", ABSTAIN, O, (9,))]
    lp = _first_token_logprobs(rows, cands)
    for m in (tool_choice_margin(cands, lp, "native"), first_token_margin(rows, cands, "native", D),
              broad_margin(cands, lp, "native"), correct_margin(cands, lp, "native")):
        assert math.isnan(m.value) and not m.collision and "abstention" in m.note
    # ... it is reported through the abstention decision and the path margin instead.
    lp_open = float(torch.log_softmax(rows[O], -1)[IDS[O + 1]])
    assert call_logodds(rows, IDS, cands, "native", D, O).value == pytest.approx(lp_open - math.log(1 - math.exp(lp_open)), abs=1e-6)
    assert math.isfinite(path_margin(rows, IDS, cands, "native", D, lp, O).value)


def test_path_margin_native_uses_path_logprobs():
    rows = _rows(1)
    cands = [_cand("w", "wrong", (1,)), _cand("c", "correct", (2,)), _cand("a", "abstain", (9,), anchor=O)]
    lp = {r: torch.log_softmax(x, -1) for r, x in rows.items()}
    forced = float(lp[O][7] + lp[O + 1][8])
    abstain = math.log(1 - math.exp(float(lp[O][7])))
    want = forced + float(lp[D][1]) - max(forced + float(lp[D][2]), abstain)
    m = path_margin(rows, IDS, cands, "native", D, _first_token_logprobs(rows, cands), O)
    assert m.value == pytest.approx(want, abs=1e-6) and "opening the call" in m.note


def test_prompted_call_logodds_and_abstention_answer():
    rows = _rows(5)
    cands = [_cand("w", "wrong", (1,)), _cand("c", "correct", (2,)), _cand("o", "other", (3,)), _cand("a", "abstain", (4,))]
    lp = torch.log_softmax(rows[D], -1)
    got = call_logodds(rows, IDS, cands, "prompted", D).value
    assert got == pytest.approx(float(torch.logsumexp(lp[[1, 2, 3]], 0) - lp[4]), abs=1e-6)
    # the prompted abstention answer is a token at the decision row: a control of the correct-tool margin
    m = correct_margin(cands, _first_token_logprobs(rows, cands), "prompted")
    assert m.value == pytest.approx(float(rows[D][2] - torch.max(rows[D][3], rows[D][4])), abs=1e-5)


def test_broad_margin_includes_catalog_tools():
    rows = _rows(3)
    dec = rows[D]
    cands = [_cand("w", "wrong", (1,)), _cand("c", "correct", (2,)), _cand("o1", "other", (6,)), _cand("o2", "other", (7,))]
    m = broad_margin(cands, _first_token_logprobs(rows, cands), "prompted")
    assert m.value == pytest.approx(float(dec[[1, 6, 7]].max() - dec[2]), abs=1e-5)


def test_selectivity_panels_are_not_mechanically_linked():
    """Fig. 7's wrong-tool and correct-tool quantities: moving the wrong tool leaves the correct-tool
    margin alone, and moving another tool leaves the wrong-tool margin alone."""
    cands = [_cand("w", "wrong", (1,)), _cand("c", "correct", (2,)), _cand("o", "other", (3,)), _cand("a", "abstain", (9,), anchor=O)]
    lp = {"w": torch.tensor([-2.0]), "c": torch.tensor([-1.0]), "o": torch.tensor([-3.0]), "a": torch.tensor([-0.5])}
    base_w, base_c = tool_choice_margin(cands, lp, "native").value, correct_margin(cands, lp, "native").value
    moved_w = {**lp, "w": torch.tensor([0.5])}
    assert tool_choice_margin(cands, moved_w, "native").value == pytest.approx(base_w + 2.5)
    assert correct_margin(cands, moved_w, "native").value == pytest.approx(base_c)
    moved_o = {**lp, "o": torch.tensor([-0.2])}
    assert correct_margin(cands, moved_o, "native").value == pytest.approx(base_c - 2.8)
    assert tool_choice_margin(cands, moved_o, "native").value == pytest.approx(base_w)
    assert base_c != pytest.approx(-base_w)  # not a mirror image


def test_nan_logits_raise():
    rows = _rows()
    rows[D][0] = float("nan")
    with pytest.raises(NonFiniteLogitsError):
        first_token_margin(rows, [_cand("w", "wrong", (1,)), _cand("c", "correct", (2,))], "native", D)
    with pytest.raises(NonFiniteLogitsError):
        entropy(rows[D])


def test_wrong_anchor_is_an_error():
    rows = _rows()
    with pytest.raises(ValueError, match="anchors"):
        first_token_margin(rows, [_cand("w", "wrong", (1,), anchor=D - 1), _cand("c", "correct", (2,))], "native", D)
    with pytest.raises(ValueError, match="different rows"):
        tool_choice_margin([_cand("w", "wrong", (1,), anchor=D - 1), _cand("c", "correct", (2,))],
                           {"w": torch.zeros(1), "c": torch.zeros(1)}, "native")
