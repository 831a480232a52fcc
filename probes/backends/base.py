"""The backend seam: what every probe backend computes, and the forward-per-condition runner.

A *backend* is any object with the engine's ``run`` signature (:class:`Backend`)::

    run(input_ids, query_rows, spans=None, conditions=(), candidates=None,
        record_rows=False, record_residual=False) -> ProbeResult

returning the same :class:`~probes.engine.session.ProbeResult` as ``ProbeSession.run`` (the ``native``
backend): per condition (the unmodified baseline is condition 0) the fp32 logits at rows
``min(query_rows) .. n-1``, span attention mass per (layer, head, query row), candidate token
log-probabilities with their span masses, optionally the full query rows and the residual stream
at the decision row. ``probes.scoring.score.score_record`` only calls ``run``, so it scores a record
unchanged on any backend.

:class:`ForwardBackend` implements ``run`` for backends that can only *edit one forward*
(nnsight, TransformerLens): no cached branching. It runs

- one forward of the whole prompt per condition (logits, query-row attention, residual, and
  the log-probability of every single-token candidate), and
- one forward of ``input_ids[:anchor + 1] + ids[:-1]`` per (condition, multi-token candidate):
  the candidate's tokens are appended and their log-probabilities read at its rows.

A knockout edits the softmax output at the knocked (layer, head, query row) cells: the blocked
keys' probabilities are set to 0 and the row is renormalised, which is the softmax with those
scores at ``-inf`` (the native engine's definition). Rows, keys and continuation rows follow
``Knockout`` exactly as the native engine applies them (see ``ProbeSession.run``).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from probes.engine.logits import check_finite, entropy
from probes.engine.session import BASELINE, ConditionResult, Knockout, ProbeResult, validate_candidates, validate_request


@runtime_checkable
class Backend(Protocol):
    """What a probe needs from a backend (``ProbeSession`` is one)."""

    n_layers: int
    n_heads: int
    tokenizer: Any
    model: Any  # the HF model: the analysis runner reads ``model.name_or_path``; the calls analysis generates with it

    def run(
        self,
        input_ids: Sequence[int] | torch.Tensor,
        query_rows: Sequence[int],
        spans: Mapping[str, Sequence[int]] | None = None,
        conditions: Sequence[Knockout] = (),
        candidates: Mapping[str, tuple[int, Sequence[int]]] | None = None,
        record_rows: bool = False,
        record_residual: bool = False,
    ) -> ProbeResult: ...


@dataclass(frozen=True)
class RowEdit:
    """One forward's knockout: at absolute query ``rows``, in the ``active`` [layer, head] cells,
    the ``keys`` leave the softmax."""

    rows: tuple[int, ...]
    keys: tuple[int, ...]
    active: torch.Tensor

    def applies(self, layer: int) -> bool:
        return bool(self.rows) and bool(self.keys) and bool(self.active[layer].any())


def knock_pattern(pattern: torch.Tensor, layer: int, edit: RowEdit) -> torch.Tensor:
    """``pattern`` [batch, head, q, k] with the knocked cells' blocked keys zeroed and those rows
    renormalised (in fp32); a new tensor, or ``pattern`` itself where nothing applies."""
    if not edit.applies(layer):
        return pattern
    heads = edit.active[layer].nonzero().flatten().to(pattern.device)
    rows = torch.tensor(edit.rows, device=pattern.device)
    keys = torch.tensor(edit.keys, device=pattern.device)
    out = pattern.clone()
    sub = out[:, heads[:, None], rows[None, :]].float()  # [batch, knocked heads, rows, k]
    sub[..., keys] = 0.0
    out[:, heads[:, None], rows[None, :]] = (sub / sub.sum(-1, keepdim=True)).to(pattern.dtype)
    return out


@dataclass
class Forward:
    """What one edited forward hands back.

    logits: [len(read_rows), vocab] fp32 at ``read_rows``; probs: [layer, head, len(read_rows), n]
    fp32, the (edited) softmax rows there; residual: [layer + 1, d_model] at ``residual_row`` (embeddings, then
    every decoder layer's output), or None.
    """

    logits: torch.Tensor
    probs: torch.Tensor
    residual: torch.Tensor | None


class ForwardBackend(abc.ABC):
    """``run`` by one edited forward per condition and per (condition, multi-token candidate).

    Subclasses set ``name``, ``n_layers``, ``n_heads``, ``tokenizer``, ``model`` (the HF model),
    ``config`` (its config) and implement :meth:`forward_edited`.
    """

    name: str
    n_layers: int
    n_heads: int
    tokenizer: Any
    model: Any
    config: Any

    @abc.abstractmethod
    def forward_edited(self, ids: list[int], edit: RowEdit, read_rows: Sequence[int], residual_row: int | None) -> Forward:
        """One forward of ``ids`` under ``edit`` (see :class:`Forward`)."""

    @torch.inference_mode()
    def run(
        self,
        input_ids: Sequence[int] | torch.Tensor,
        query_rows: Sequence[int],
        spans: Mapping[str, Sequence[int]] | None = None,
        conditions: Sequence[Knockout] = (),
        candidates: Mapping[str, tuple[int, Sequence[int]]] | None = None,
        record_rows: bool = False,
        record_residual: bool = False,
    ) -> ProbeResult:
        """Same contract as ``ProbeSession.run`` (see the module docstring for how it is computed)."""
        ids = [int(x) for x in (input_ids.flatten().tolist() if isinstance(input_ids, torch.Tensor) else input_ids)]
        spans = dict(spans or {})
        candidates = {k: (int(a), [int(t) for t in toks]) for k, (a, toks) in (candidates or {}).items()}
        conds = [BASELINE, *conditions]
        rows = validate_request(ids, query_rows, conds, self.config)
        n, p = len(ids), rows[0]
        validate_candidates(candidates, p, n, self.config)
        span_matrix = torch.zeros(n, len(spans))
        for j, (name, pos) in enumerate(spans.items()):
            pos = list(pos)
            if pos and (min(pos) < 0 or max(pos) >= n):
                raise ValueError(f"span {name!r} has positions outside 0..{n - 1}")
            span_matrix[pos, j] = 1.0
        names = list(spans)
        query = set(rows)
        # Every row from the branch point is read: single-token candidates anchor anywhere there.
        read = list(range(p, n))
        results = []
        for c in conds:
            active = c.active(self.n_layers, self.n_heads)
            edit = RowEdit(tuple(r for r in rows if c.blocks_row(r)), c.key_positions, active)
            fw = self.forward_edited(ids, edit, read, rows[-1] if record_residual else None)
            mass = fw.probs @ span_matrix  # [layer, head, n - p, span]
            logp = torch.log_softmax(fw.logits, dim=-1)
            cand_lp: dict[str, torch.Tensor] = {}
            cand_mass: dict[str, dict[str, torch.Tensor]] = {}
            for name, (a, toks) in candidates.items():
                if len(toks) == 1:
                    cand_lp[name] = logp[a - p, toks[0]].reshape(1)
                    cand_mass[name] = {s: mass[:, :, a - p : a - p + 1, j] for j, s in enumerate(names)}
                    continue
                seq = ids[: a + 1] + toks[:-1]
                # As the native branch: query rows up to the anchor, continuation rows after it;
                # positions after the anchor hold the continuation, never blocked, in no span.
                knocked = tuple(pos for pos in range(p, len(seq))
                                if ((pos in query and c.blocks_row(pos)) if pos <= a else c.continuation))
                cand_edit = RowEdit(knocked, tuple(k for k in c.key_positions if k <= a), active)
                cand_rows = list(range(a, a + len(toks)))
                cf = self.forward_edited(seq, cand_edit, cand_rows, None)
                cand_lp[name] = torch.log_softmax(cf.logits, dim=-1)[torch.arange(len(toks)), torch.tensor(toks)]
                cm = cf.probs[..., : a + 1] @ span_matrix[: a + 1]  # [layer, head, len(toks), span]
                cand_mass[name] = {s: cm[..., j] for j, s in enumerate(names)}
            local = [r - p for r in rows]
            dec = fw.logits[rows[-1] - p]
            check_finite(dec, f"decision-row logits under condition {c.name!r} ({self.name} backend)")
            results.append(ConditionResult(
                condition=c,
                row_offset=p,
                logits=fw.logits,
                span_mass={s: mass[:, :, local, j] for j, s in enumerate(names)},
                entropy=entropy(dec),
                candidate_token_logprobs=cand_lp,
                candidate_span_mass=cand_mass,
                rows=fw.probs[:, :, local] if record_rows else None,
                residual=fw.residual,
            ))
        return ProbeResult(ids, rows, {s: len(set(v)) for s, v in spans.items()}, results)
