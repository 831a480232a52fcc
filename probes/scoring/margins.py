"""Decision margins (paper Eq. 1 and the quantities reported beside it), as pure functions of
engine outputs.

Every function returns a :class:`MarginResult` stating its ``variant``, the decision ``format``,
whether an unresolvable ``collision`` occurred, a ``note`` and, for the pairwise quantities, the
``pairs`` it compared with the token depth of each comparison. Nothing is ever a silent 0: an
undefined quantity is ``nan`` with the reason in ``note``.

The quantities
--------------
Eq. 1 compares next-token logits: ``m = max_{y∈Y_wrong} ℓ(y) − max_{y∈Y_ctrl} ℓ(y)``, where
Y_ctrl holds the first tokens of the correct function *and the abstention tokens*.

``eq1`` (:func:`eq1_margin`)
    Eq. 1 verbatim: at the decision row, the first tokens of the wrong tools against the first
    tokens of the correct tool and of the abstention answer. Defined only where abstention and the
    tool names are predicted at one row, the ``prompted`` format; in the native format abstention
    is not opening ``<tool_call>`` at an earlier row, so ``nan`` with that reason. Items whose
    correct action is abstention keep a value (Y_ctrl is then the abstention token alone); where a
    wrong tool shares its first token with a Y_ctrl token, ``nan`` with ``collision=True``.
``tool_choice`` (the default headline, :func:`tool_choice_margin`)
    **Eq. 1 restricted to the tools**: wrong tools against the correct tool, abstention left out
    of Y_ctrl. Each (wrong, correct) pair is compared at the row that predicts their first
    differing token: the decision row when their first tokens differ, else the row after their
    shared name prefix (Qwen3 names often share ``get``). Both tokens are predicted from the same
    context there, so the difference of their log-probabilities is their logit difference.
    ``m = max_w min_c (ℓ_w − ℓ_c)``. Items whose correct action is abstention have no correct tool:
    ``nan`` with that reason (they are reported through ``call_logodds``), so on item sets with
    abstention items this is *not* the paper's quantity: compare with the paper through ``eq1``.
``first_token`` (:func:`first_token_margin`)
    Eq. 1 restricted to the tools, strictly at the decision row (first name tokens); ``nan`` with
    ``collision=True`` where a wrong and the correct tool share their first token.
``broad`` (:func:`broad_margin`)
    ``tool_choice`` with every catalog tool other than the correct one in the wrong set (the
    paper's tool-vs-control margin).
``correct`` (:func:`correct_margin`)
    The correct tool against the *other* tools that are neither wrong nor correct (and, in the
    prompted format, against the abstention answer, a token at the decision row), pairwise at
    their divergence rows. It never involves a wrong tool, so it is not a mirror of the wrong-tool
    margin (Fig. 7's correct-tool panels).
``call_logodds`` (:func:`call_logodds`)
    The abstention decision, a separate quantity. Native: ``log P(open) − log(1 − P(open))`` at
    the open row (the first token of the forced prefix, ``<tool_call>``). Prompted: the log-odds
    of the first tokens of the tool names against the first token of the abstention answer at the
    decision row.
``path`` (:func:`path_margin`)
    Whole-path log-probabilities: wrong tool paths against the correct tool path and abstention.
    Native: a tool path is ``log P(forced prefix | open row) + Σ log P(name tokens)``, abstention
    is ``log(1 − P(open))``, so this mixes the tool choice with the willingness to open a call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from probes.data.dataset import ABSTAIN
from probes.engine.logits import check_finite
from probes.prompts.record import PromptRecord

ROLES = ("correct", "wrong", "abstain", "other")  # "other": the rest of the catalog


@dataclass(frozen=True)
class CandidateInfo:
    """One scored continuation: ``token_ids`` continue ``input_ids[:anchor_index + 1]``."""

    key: str
    role: str
    action: str
    anchor_index: int
    token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"candidate {self.action!r}: role {self.role!r} is not one of {ROLES}")

    @property
    def is_abstention(self) -> bool:
        return self.role == "abstain" or self.action == ABSTAIN


@dataclass(frozen=True)
class MarginResult:
    """``pairs``: (wrong-side action, control action, token depth of their comparison) for every
    pair a pairwise quantity compared; depth 0 is the anchor row (the decision row for tools)."""

    variant: str
    format: str
    value: float
    collision: bool
    note: str = ""
    pairs: tuple[tuple[str, str, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def candidates_from_record(record: PromptRecord) -> list[CandidateInfo]:
    """Candidates of a prompt record, keyed by their index in ``record.candidates``."""
    return [
        CandidateInfo(str(i), c.role, str(c.action), int(c.anchor_index), tuple(int(t) for t in c.token_ids))
        for i, c in enumerate(record.candidates)
    ]


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens two candidates share."""
    s = 0
    while s < min(len(a), len(b)) and a[s] == b[s]:
        s += 1
    return s


def _logits(row_logits: Mapping[int, torch.Tensor], row: int) -> torch.Tensor:
    if row not in row_logits:
        raise KeyError(f"no logits recorded at row {row}")
    t = row_logits[row].float()
    check_finite(t, f"logits at row {row}")
    return t


def _tools(candidates: Sequence[CandidateInfo], role: str) -> list[CandidateInfo]:
    return [c for c in candidates if c.role == role and not c.is_abstention]


def _correct_tool(candidates: Sequence[CandidateInfo]) -> CandidateInfo | None:
    correct = _tools(candidates, "correct")
    if len(correct) > 1:
        raise ValueError(f"more than one correct tool: {[c.action for c in correct]}")
    return correct[0] if correct else None


def _nan(variant: str, fmt: str, note: str, collision: bool = False) -> MarginResult:
    return MarginResult(variant, fmt, math.nan, collision, note)


# -------------------------------------------------------------------------------- pairwise
def pairwise_margin(
    variant: str,
    fmt: str,
    lead: Sequence[CandidateInfo],
    controls: Sequence[CandidateInfo],
    token_logprobs: Mapping[str, torch.Tensor],
) -> MarginResult:
    """``max_{a∈lead} min_{c∈controls} d(a, c)``, ``d(a, c) = log P(a_s | ctx) − log P(c_s | ctx)``
    at their first differing token ``s`` (one row, one context: a logit difference).

    ``token_logprobs[key]``: per-token log-probs of each candidate (``ProbeSession.run``).
    Candidates whose token sequences never diverge (one is a prefix of the other) cannot be
    compared: ``nan`` with ``collision=True``.
    """
    if not lead or not controls:
        raise ValueError(f"{variant}: needs candidates on both sides")
    best, pairs, best_pairs = -math.inf, [], ()
    for a in lead:
        la = token_logprobs[a.key]
        check_finite(la, f"token log-probs of {a.action!r}")
        worst, worst_pair = math.inf, None
        for c in controls:
            if c.anchor_index != a.anchor_index:
                raise ValueError(f"{variant}: {a.action!r} and {c.action!r} anchor at different rows")
            s = shared_prefix(a.token_ids, c.token_ids)
            if s == min(len(a.token_ids), len(c.token_ids)):
                return _nan(variant, fmt, f"{a.action!r} and {c.action!r} never diverge (one token sequence is a prefix of the other)", True)
            lc = token_logprobs[c.key]
            check_finite(lc, f"token log-probs of {c.action!r}")
            d = float(la[s] - lc[s])
            pairs.append((a.action, c.action, s))
            if d < worst:
                worst, worst_pair = d, (a.action, c.action, s)
        if worst > best:
            best, best_pairs = worst, worst_pair
    depths = sorted({p[2] for p in pairs})
    shifted = [p for p in pairs if p[2] > 0]
    note = "first tokens differ: compared at the decision row" if not shifted else (
        f"shared name prefix: {len(shifted)} of {len(pairs)} pair(s) compared at token depth(s) {[d for d in depths if d]}")
    note += f"; binding pair {best_pairs[0]!r} vs {best_pairs[1]!r} at depth {best_pairs[2]}"
    return MarginResult(variant, fmt, best, False, note, tuple(pairs))


def tool_choice_margin(candidates: Sequence[CandidateInfo], token_logprobs: Mapping[str, torch.Tensor], fmt: str) -> MarginResult:
    """Eq. 1 restricted to the tools (module docstring): wrong tools vs the correct tool, pairwise where names diverge."""
    wrong, correct = _tools(candidates, "wrong"), _correct_tool(candidates)
    if not wrong:
        raise ValueError("no wrong-tool candidates to score")
    if correct is None:
        return _nan("tool_choice", fmt, "correct action is abstention: no correct tool (reported through call_logodds)")
    return pairwise_margin("tool_choice", fmt, wrong, [correct], token_logprobs)


def broad_margin(candidates: Sequence[CandidateInfo], token_logprobs: Mapping[str, torch.Tensor], fmt: str) -> MarginResult:
    """Every catalog tool other than the correct one vs the correct tool, pairwise."""
    lead = [*_tools(candidates, "wrong"), *_tools(candidates, "other")]
    correct = _correct_tool(candidates)
    if correct is None:
        return _nan("broad", fmt, "correct action is abstention: no correct tool (reported through call_logodds)")
    return pairwise_margin("broad", fmt, lead, [correct], token_logprobs)


def correct_margin(candidates: Sequence[CandidateInfo], token_logprobs: Mapping[str, torch.Tensor], fmt: str) -> MarginResult:
    """The correct tool vs the other non-wrong tools (+ the abstention answer in ``prompted``)."""
    correct = _correct_tool(candidates)
    if correct is None:
        return _nan("correct", fmt, "correct action is abstention: no correct tool")
    controls = _tools(candidates, "other")
    if fmt == "prompted":
        controls += [c for c in candidates if c.is_abstention]
    if not controls:
        return _nan("correct", fmt, "no tool other than the correct and the wrong ones to compare with")
    return pairwise_margin("correct", fmt, [correct], controls, token_logprobs)


# -------------------------------------------------------------------------------- single row
def eq1_margin(row_logits: Mapping[int, torch.Tensor], candidates: Sequence[CandidateInfo], fmt: str, decision_index: int) -> MarginResult:
    """Eq. 1 verbatim (module docstring): max first-token logit of the wrong tools − max over the
    first tokens of the correct tool and the abstention answer, at the decision row (prompted only)."""
    if fmt != "prompted":
        return _nan("eq1", fmt, "native format: abstention (not opening a call) is decided at the open row, not where the tool "
                    "name is predicted; verbatim Eq. 1 needs --format prompted")
    wrong, correct = _tools(candidates, "wrong"), _correct_tool(candidates)
    abstain = [c for c in candidates if c.is_abstention]
    if not wrong:
        raise ValueError("no wrong-tool candidates to score")
    controls = [c for c in (correct, *abstain) if c is not None]
    if not controls:
        raise ValueError("no correct tool and no abstention answer to score")
    for c in [*wrong, *controls]:
        if c.anchor_index != decision_index:
            raise ValueError(f"candidate {c.action!r} anchors at {c.anchor_index}, not the decision row {decision_index}")
    control_tokens = {c.token_ids[0] for c in controls}
    shared = [w.action for w in wrong if w.token_ids[0] in control_tokens]
    if shared:
        return _nan("eq1", fmt, f"first-token collision: {shared} share a first token with the correct tool or the abstention answer", True)
    dec = _logits(row_logits, decision_index)
    value = max(float(dec[w.token_ids[0]]) for w in wrong) - max(float(dec[t]) for t in control_tokens)
    return MarginResult("eq1", fmt, value, False, "first-token logits at the decision row; Y_ctrl: "
                        + ", ".join(repr(c.action) for c in controls), tuple((w.action, c.action, 0) for w in wrong for c in controls))


def first_token_margin(
    row_logits: Mapping[int, torch.Tensor], candidates: Sequence[CandidateInfo], fmt: str, decision_index: int
) -> MarginResult:
    """Eq. 1 restricted to the tools, strictly at the decision row: max first-token logit of the
    wrong tools − that of the correct tool; ``nan`` with ``collision=True`` when they share a first token."""
    wrong, correct = _tools(candidates, "wrong"), _correct_tool(candidates)
    if not wrong:
        raise ValueError("no wrong-tool candidates to score")
    if correct is None:
        return _nan("first_token", fmt, "correct action is abstention: no correct tool (reported through call_logodds)")
    for c in [*wrong, correct]:
        if c.anchor_index != decision_index:
            raise ValueError(f"candidate {c.action!r} anchors at {c.anchor_index}, not the decision row {decision_index}")
    shared = [w.action for w in wrong if w.token_ids[0] == correct.token_ids[0]]
    if shared:
        return _nan("first_token", fmt, f"first-token collision: {shared} and {correct.action!r} share token {correct.token_ids[0]}", True)
    dec = _logits(row_logits, decision_index)
    value = max(float(dec[w.token_ids[0]]) for w in wrong) - float(dec[correct.token_ids[0]])
    return MarginResult("first_token", fmt, value, False, "logits at the decision row",
                        tuple((w.action, correct.action, 0) for w in wrong))


def _open_logprob(row_logits: Mapping[int, torch.Tensor], input_ids: Sequence[int], open_index: int) -> float:
    return float(torch.log_softmax(_logits(row_logits, open_index), -1)[input_ids[open_index + 1]])


def _log1mexp(lp: float) -> float:
    """log(1 − exp(lp)) for lp ≤ 0, stably."""
    return float(torch.log(-torch.expm1(torch.tensor(lp, dtype=torch.float64)))) if lp < 0 else -math.inf


def call_logodds(
    row_logits: Mapping[int, torch.Tensor],
    input_ids: Sequence[int],
    candidates: Sequence[CandidateInfo],
    fmt: str,
    decision_index: int,
    open_index: int | None = None,
) -> MarginResult:
    """The abstention decision: log-odds of calling a tool rather than abstaining (module docstring)."""
    if fmt == "native":
        if open_index is None:
            raise ValueError("the native format needs open_index")
        lp = _open_logprob(row_logits, input_ids, open_index)
        return MarginResult("call_logodds", fmt, lp - _log1mexp(lp), False, "log P(open) − log(1 − P(open)) at the open row")
    tool_tokens = sorted({c.token_ids[0] for c in candidates if not c.is_abstention})
    abstain_tokens = {c.token_ids[0] for c in candidates if c.is_abstention}
    if len(abstain_tokens) != 1:
        return _nan("call_logodds", fmt, "no (single) abstention answer among the candidates")
    (a,) = abstain_tokens
    if a in tool_tokens:
        return _nan("call_logodds", fmt, f"the abstention answer shares its first token {a} with a tool name", True)
    lp = torch.log_softmax(_logits(row_logits, decision_index), -1)
    value = float(torch.logsumexp(lp[tool_tokens], 0) - lp[a])
    return MarginResult("call_logodds", fmt, value, False, "first tokens of the tool names vs the abstention answer at the decision row")


def _forced_prefix_logprob(row_logits: Mapping[int, torch.Tensor], input_ids: Sequence[int], fmt: str, decision_index: int,
                           open_index: int | None) -> float:
    """log P(forced call prefix) from the open row to the decision row (native); 0 for prompted."""
    if fmt != "native":
        return 0.0
    if open_index is None:
        raise ValueError("the native format needs open_index")
    if not open_index < decision_index:
        raise ValueError(f"open_index {open_index} must precede decision_index {decision_index}")
    return sum(float(torch.log_softmax(_logits(row_logits, r), -1)[input_ids[r + 1]]) for r in range(open_index, decision_index))


def _path_logprob(row_logits: Mapping[int, torch.Tensor], input_ids: Sequence[int], fmt: str, open_index: int | None,
                  token_logprobs: Mapping[str, torch.Tensor], offset: float, c: CandidateInfo) -> float:
    """One candidate's whole-path log-probability: native abstention is ``log(1 − P(open))``; any other
    candidate is ``offset`` (the forced prefix, :func:`_forced_prefix_logprob`) plus its tokens' log-probs."""
    if fmt == "native" and c.is_abstention:
        return _log1mexp(_open_logprob(row_logits, input_ids, open_index))
    t = token_logprobs[c.key]
    check_finite(t, f"token log-probs of {c.action!r}")
    return offset + float(t.sum())


def candidate_path_logprobs(
    row_logits: Mapping[int, torch.Tensor],
    input_ids: Sequence[int],
    candidates: Sequence[CandidateInfo],
    fmt: str,
    decision_index: int,
    token_logprobs: Mapping[str, torch.Tensor],
    open_index: int | None = None,
) -> dict[str, float]:
    """Each candidate action's whole-path log-probability, as :func:`path_margin` scores them
    (native: tools include opening the call, abstention is ``log(1 − P(open))``)."""
    offset = _forced_prefix_logprob(row_logits, input_ids, fmt, decision_index, open_index)
    return {c.action: _path_logprob(row_logits, input_ids, fmt, open_index, token_logprobs, offset, c) for c in candidates}


def path_margin(
    row_logits: Mapping[int, torch.Tensor],
    input_ids: Sequence[int],
    candidates: Sequence[CandidateInfo],
    fmt: str,
    decision_index: int,
    token_logprobs: Mapping[str, torch.Tensor],
    open_index: int | None = None,
) -> MarginResult:
    """Whole-path log-probabilities: max over wrong tool paths − max over the correct tool path and
    abstention (native abstention: ``log(1 − P(open))``; tools then include the forced prefix)."""
    wrong = _tools(candidates, "wrong")
    if not wrong:
        raise ValueError("no wrong-tool candidates to score")
    correct = _correct_tool(candidates)
    abstain = [c for c in candidates if c.is_abstention]

    offset = _forced_prefix_logprob(row_logits, input_ids, fmt, decision_index, open_index)

    def path(c: CandidateInfo) -> float:
        return _path_logprob(row_logits, input_ids, fmt, open_index, token_logprobs, offset, c)

    controls = [path(c) for c in abstain]
    if correct is not None:
        if any(w.token_ids == correct.token_ids for w in wrong):
            return _nan("path", fmt, f"a wrong tool and {correct.action!r} have identical token sequences", True)
        controls.append(path(correct))
    if not controls:
        raise ValueError("no control candidates (correct tool or abstention) to score")
    value = max(path(w) for w in wrong) - max(controls)
    return MarginResult("path", fmt, value, False, "sum of path log-probs" + (" (tool paths include opening the call)" if fmt == "native" else ""))
