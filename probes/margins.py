"""Decision margins (paper Eq. 1 and variants), as pure functions of engine outputs.

Every margin returns a :class:`MarginResult` stating its ``variant``, the decision ``format``,
whether a ``collision`` occurred, and a ``note``. A collision never yields a silent 0: when the
wrong and control sets share a first token, the first-token variants return ``nan`` with
``collision=True``; the divergence and sequence variants resolve such cases.

Scores. Eq. 1 compares logits at the decision row:
``m = max_{y∈Y_wrong} ℓ(y) − max_{y∈Y_ctrl} ℓ(y)``. In the *native* format abstention is not a
token at the decision row: it means not opening the tool call at the open row. When an abstain
candidate takes part, every candidate is therefore scored as a log-probability of its path:

- tool ``y``: ``log P(forced prefix | open row) + log P(y | decision row)``, where the forced
  prefix is ``input_ids[open_index+1 : decision_index+1]`` (``<tool_call>`` ... up to the name);
- abstain: ``log(1 − P(input_ids[open_index+1] | open row))``.

Without an abstain candidate (or in the *prompted* format, where every candidate anchors at the
decision row) the scores are the raw logits at the decision row, i.e. Eq. 1 verbatim; the
log-prob form would give the same value, because the forced-prefix term and the softmax
normaliser are common to all tools and cancel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from probes.dataset import ABSTAIN

ROLES = ("correct", "wrong", "abstain", "other")  # "other": the rest of the catalog (broad margin only)


class NonFiniteLogitsError(ValueError):
    """Logits contained NaN or inf, so no margin is meaningful."""


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


@dataclass(frozen=True)
class MarginResult:
    variant: str
    format: str
    value: float
    collision: bool
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def candidates_from_record(record: Mapping[str, Any]) -> list[CandidateInfo]:
    """Candidates of a prompt record, keyed by their index in ``record["candidates"]``."""
    return [
        CandidateInfo(str(i), c["role"], str(c["action"]), int(c["anchor_index"]), tuple(int(t) for t in c["token_ids"]))
        for i, c in enumerate(record["candidates"])
    ]


def check_finite(t: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise NonFiniteLogitsError(f"{what}: {bad} non-finite values (NaN/inf); check the dtype (try float32) and the weights")


def entropy(logits: torch.Tensor) -> float:
    """Next-token entropy (nats) of one logit vector."""
    check_finite(logits, "entropy logits")
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(-(logp.exp() * logp).sum())


# --------------------------------------------------------------------------------------------


def _split(cands: Sequence[CandidateInfo]) -> tuple[list[CandidateInfo], list[CandidateInfo], list[CandidateInfo]]:
    """(wrong, correct tools, abstention); abstention is a control whether or not it is the correct
    action, and is scored as abstention (at the open row in the native format)."""
    is_abstain = [c.role == "abstain" or (c.role == "correct" and c.action == ABSTAIN) for c in cands]
    wrong = [c for c in cands if c.role == "wrong"]
    correct = [c for c, a in zip(cands, is_abstain) if c.role == "correct" and not a]
    abstain = [c for c, a in zip(cands, is_abstain) if a]
    if not wrong:
        raise ValueError("no wrong-tool candidates to score")
    if not correct and not abstain:
        raise ValueError("no control candidates (correct tool or abstention) to score")
    return wrong, correct, abstain


def _logits(row_logits: Mapping[int, torch.Tensor], row: int) -> torch.Tensor:
    if row not in row_logits:
        raise KeyError(f"no logits recorded at row {row}")
    t = row_logits[row].float()
    check_finite(t, f"logits at row {row}")
    return t


class _NativePaths:
    """Log-probabilities of the native tool path and of abstaining (see module docstring)."""

    def __init__(self, row_logits: Mapping[int, torch.Tensor], input_ids: Sequence[int], open_index: int, decision_index: int) -> None:
        if not open_index < decision_index:
            raise ValueError(f"open_index {open_index} must precede decision_index {decision_index}")
        lp_open = torch.log_softmax(_logits(row_logits, open_index), -1)[input_ids[open_index + 1]]
        self.forced_prefix = float(
            sum(torch.log_softmax(_logits(row_logits, r), -1)[input_ids[r + 1]] for r in range(open_index, decision_index))
        )
        self.open = float(lp_open)
        # log(1 - p) computed stably from log p
        self.abstain = float(torch.log(-torch.expm1(lp_open))) if self.open < 0 else -math.inf


def _first_token_margin(
    variant: str,
    wrong_tokens: dict[int, str],
    correct: Sequence[CandidateInfo],
    abstain: Sequence[CandidateInfo],
    row_logits: Mapping[int, torch.Tensor],
    input_ids: Sequence[int],
    fmt: str,
    decision_index: int,
    open_index: int | None,
) -> MarginResult:
    native_abstain = fmt == "native" and bool(abstain)
    ctrl_tokens = {c.token_ids[0]: c.action for c in correct}
    if not native_abstain:
        ctrl_tokens.update({c.token_ids[0]: c.action for c in abstain})
    for c in [*correct, *([] if native_abstain else abstain)]:
        if c.anchor_index != decision_index:
            raise ValueError(f"candidate {c.action!r} anchors at {c.anchor_index}, not the decision row {decision_index}")
    shared = sorted(set(wrong_tokens) & set(ctrl_tokens))
    if shared:
        pairs = ", ".join(f"{t}: {wrong_tokens[t]!r} vs {ctrl_tokens[t]!r}" for t in shared)
        return MarginResult(
            variant, fmt, math.nan, True,
            f"first-token collision ({pairs}): wrong and control share a first token; use the divergence variant",
        )
    dec = _logits(row_logits, decision_index)
    if native_abstain:
        if open_index is None:
            raise ValueError("native format with an abstain candidate needs open_index")
        paths = _NativePaths(row_logits, input_ids, open_index, decision_index)
        lp = torch.log_softmax(dec, -1)
        w = max(paths.forced_prefix + float(lp[t]) for t in wrong_tokens)
        ctrl = [paths.forced_prefix + float(lp[t]) for t in ctrl_tokens] + [paths.abstain]
        return MarginResult(variant, fmt, w - max(ctrl), False, "log-prob scores: tool path vs not opening a tool call")
    w = max(float(dec[t]) for t in wrong_tokens)
    c = max(float(dec[t]) for t in ctrl_tokens)
    return MarginResult(variant, fmt, w - c, False, "logits at the decision row")


def wrong_tool_margin(
    row_logits: Mapping[int, torch.Tensor],
    input_ids: Sequence[int],
    candidates: Sequence[CandidateInfo],
    fmt: str,
    decision_index: int,
    open_index: int | None = None,
) -> MarginResult:
    """Eq. 1: max over first tokens of wrong tools − max over first tokens of correct tool + abstention."""
    wrong, correct, abstain = _split(candidates)
    for c in wrong:
        if c.anchor_index != decision_index:
            raise ValueError(f"wrong candidate {c.action!r} anchors at {c.anchor_index}, not the decision row {decision_index}")
    return _first_token_margin(
        "wrong_tool", {c.token_ids[0]: c.action for c in wrong}, correct, abstain,
        row_logits, input_ids, fmt, decision_index, open_index,
    )


def tool_vs_control_margin(
    row_logits: Mapping[int, torch.Tensor],
    input_ids: Sequence[int],
    candidates: Sequence[CandidateInfo],
    fmt: str,
    decision_index: int,
    open_index: int | None = None,
    extra_tool_first_tokens: Sequence[int] = (),
) -> MarginResult:
    """Broader margin: max over the first tokens of *every* tool except the correct one (the wrong
    candidates, the record's ``other`` catalog candidates and ``extra_tool_first_tokens``) − max
    over control (correct tool + abstention). With no further tools it equals Eq. 1."""
    wrong, correct, abstain = _split(candidates)
    tokens = {c.token_ids[0]: c.action for c in wrong}
    for c in candidates:
        if c.role == "other" and c.anchor_index == decision_index:
            tokens.setdefault(c.token_ids[0], c.action)
    for t in extra_tool_first_tokens:
        tokens.setdefault(int(t), f"<catalog tool token {int(t)}>")
    return _first_token_margin(
        "tool_vs_control", tokens, correct, abstain, row_logits, input_ids, fmt, decision_index, open_index
    )


def _shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    s = 0
    while s < min(len(a), len(b)) and a[s] == b[s]:
        s += 1
    return s


def _sequence_sets(candidates: Sequence[CandidateInfo], fmt: str) -> tuple[list[CandidateInfo], list[CandidateInfo], bool]:
    """(wrong, token-sequence controls, native abstention?) for the multi-token variants: a native
    abstention is no token sequence (it is scored at the open row), so it leaves the controls."""
    wrong, correct, abstain = _split(candidates)
    native_abstain = fmt == "native" and bool(abstain)
    return wrong, [*correct, *([] if native_abstain else abstain)], native_abstain


def divergence_margin(
    row_logits: Mapping[int, torch.Tensor],
    input_ids: Sequence[int],
    candidates: Sequence[CandidateInfo],
    fmt: str,
    decision_index: int,
    token_logprobs: Mapping[str, torch.Tensor],
    open_index: int | None = None,
) -> MarginResult:
    """Divergence-token margin: force the shared token prefix, compare at the first differing token.

    For a wrong candidate w and a control c sharing ``s`` leading tokens,
    ``d(w, c) = log P(w_s | prefix, w_<s) − log P(c_s | prefix, c_<s)``: both terms sit at the same
    row (identical context), so this is their logit difference there. The set margin is
    ``max_w min_c d(w, c)``, which equals Eq. 1 when no first tokens are shared (since
    ``max_w ℓ_w − max_c ℓ_c = max_w min_c (ℓ_w − ℓ_c)``). A native abstain candidate diverges from
    every tool at the open row: ``d(w, abstain) = log P(open) − log(1 − P(open))``.
    ``token_logprobs[key]``: per-token log-probs of each candidate (``ProbeSession.run``).
    Identical or prefix-nested token sequences cannot diverge: nan with ``collision=True``.
    """
    wrong, controls, native_abstain = _sequence_sets(candidates, fmt)
    paths = None
    if native_abstain:
        if open_index is None:
            raise ValueError("native format with an abstain candidate needs open_index")
        paths = _NativePaths(row_logits, input_ids, open_index, decision_index)
    depths: set[int] = set()
    best = -math.inf
    for w in wrong:
        lw = token_logprobs[w.key]
        check_finite(lw, f"token log-probs of {w.action!r}")
        diffs: list[float] = []
        for c in controls:
            if c.anchor_index != w.anchor_index:
                raise ValueError(f"candidates {w.action!r} and {c.action!r} anchor at different rows")
            s = _shared_prefix(w.token_ids, c.token_ids)
            if s == min(len(w.token_ids), len(c.token_ids)):
                return MarginResult(
                    "divergence", fmt, math.nan, True,
                    f"{w.action!r} and {c.action!r} never diverge (one token sequence is a prefix of the other)",
                )
            lc = token_logprobs[c.key]
            check_finite(lc, f"token log-probs of {c.action!r}")
            diffs.append(float(lw[s] - lc[s]))
            depths.add(s)
        if paths is not None:
            diffs.append(paths.open - paths.abstain)
        best = max(best, min(diffs))
    note = f"divergence at token depth(s) {sorted(depths)}" + ("; abstain compared at the open row" if paths else "")
    return MarginResult("divergence", fmt, best, False, note)


def sequence_logprob_margin(
    row_logits: Mapping[int, torch.Tensor],
    input_ids: Sequence[int],
    candidates: Sequence[CandidateInfo],
    fmt: str,
    decision_index: int,
    token_logprobs: Mapping[str, torch.Tensor],
    open_index: int | None = None,
) -> MarginResult:
    """Full-sequence margin: max_w log P(w) − max_c log P(c) over whole candidate token sequences
    (native abstention: log(1 − P(open)), tools then include the forced-prefix log-prob)."""
    wrong, controls, native_abstain = _sequence_sets(candidates, fmt)
    for w in wrong:
        for c in controls:
            if w.token_ids == c.token_ids and w.anchor_index == c.anchor_index:
                return MarginResult(
                    "sequence_logprob", fmt, math.nan, True, f"{w.action!r} and {c.action!r} have identical token sequences"
                )

    def score(c: CandidateInfo) -> float:
        t = token_logprobs[c.key]
        check_finite(t, f"token log-probs of {c.action!r}")
        return float(t.sum())

    offset, ctrl_extra = 0.0, []
    if native_abstain:
        if open_index is None:
            raise ValueError("native format with an abstain candidate needs open_index")
        paths = _NativePaths(row_logits, input_ids, open_index, decision_index)
        offset, ctrl_extra = paths.forced_prefix, [paths.abstain]
    w = max(offset + score(c) for c in wrong)
    ctrl = max([offset + score(c) for c in controls] + ctrl_extra)
    return MarginResult("sequence_logprob", fmt, w - ctrl, False, "sum of candidate token log-probs")
