"""The backend seam: what every probe backend computes, and the forward-per-condition runner.

A *backend* is any object with the engine's ``run`` signature (:class:`Backend`)::

    run(input_ids, query_rows, spans=None, conditions=(), candidates=None,
        record_rows=False, record_residual=False, recorders=()) -> ProbeResult

returning the same :class:`~probes.engine.session.ProbeResult` as ``EngineSession.run`` (the ``native``
backend): per condition (the unmodified baseline is condition 0) the fp32 logits at rows
``min(query_rows) .. n-1``, span attention mass per (layer, head, query row), candidate token
log-probabilities with their span masses, optionally the full query rows and the residual stream
at the decision row, and what any further ``recorders`` record (probes.engine.hooks: a per-row
quantity over named hook points). ``probes.scoring.score.score_record`` only calls ``run``, so it
scores a record unchanged on any backend.

:class:`ForwardBackend` implements ``run`` for backends that can only *edit one forward*
(nnsight, TransformerLens): no cached branching. It runs

- one forward of the whole prompt per condition (logits, the hook points the recorders read, and
  the log-probability of every single-token candidate), and
- one forward of ``input_ids[:anchor + 1] + ids[:-1]`` per (condition, multi-token candidate):
  the candidate's tokens are appended and their log-probabilities read at its rows.

A knockout edits the softmax output at the knocked (layer, head, query row) cells: the blocked
keys' probabilities are set to 0 and the row is renormalised, which is the softmax with those
scores at ``-inf`` (the native engine's definition). Rows, keys and continuation rows follow
``Knockout`` exactly as the native engine applies them (see ``EngineSession.run``).
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from probes.engine.hooks import HOOK_PATTERN, Recorder, Recording, condition_recordings, hook_point, probe_recorders, prompt_keys
from probes.engine.session import (BASELINE, ConditionResult, Knockout, ProbeResult, attention_windows, knockouts_only, span_matrix, validate_candidates,
                                   validate_request)


@runtime_checkable
class Backend(Protocol):
    """What a probe needs from a backend (``EngineSession`` is one)."""

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
        recorders: Sequence[Recorder] = (),
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

    logits: [len(read_rows), vocab] fp32 at ``read_rows``; hooks: concrete hook name (probes.engine.hooks,
    e.g. ``blocks.0.attn.hook_pattern``) -> its value at ``read_rows`` (batch axis 1, that hook point's
    layout; a pattern over this forward's own key positions), for the hooks asked for.
    """

    logits: torch.Tensor
    hooks: dict[str, torch.Tensor]


class ForwardBackend(abc.ABC):
    """``run`` by one edited forward per condition and per (condition, multi-token candidate).

    Subclasses set ``name``, ``n_layers``, ``n_heads``, ``tokenizer``, ``model`` (the HF model),
    ``config`` (its config) and implement :meth:`forward_edited`: reading the hook points is all a
    backend implements; the recorders (probes.engine.hooks) are applied here.
    """

    name: str
    n_layers: int
    n_heads: int
    tokenizer: Any
    model: Any
    config: Any

    @functools.cached_property
    def windows(self) -> list[int | None]:
        """Each layer's sliding window (None: global), read from the HF model (:func:`attention_windows`)."""
        return attention_windows(self.model)

    @abc.abstractmethod
    def forward_edited(self, ids: list[int], edit: RowEdit, read_rows: Sequence[int], hooks: Collection[str] = ()) -> Forward:
        """One forward of ``ids`` under ``edit``, reading ``hooks`` (concrete names) at ``read_rows``
        (see :class:`Forward`)."""

    def _read(self, recording: Recording, ids: list[int], edit: RowEdit, read_rows: list[int], n_prompt: int, prompt_end: int,
              query: torch.Tensor | None, decision: int | None) -> torch.Tensor:
        """One edited forward whose hooks go to ``recording`` (``query``/``decision``: where those rows lie
        among ``read_rows``); its logits. Its positions from ``prompt_end`` on hold a candidate's
        continuation, not the prompt: a pattern keeps the keys before it, over ``n_prompt`` positions."""
        fw = self.forward_edited(ids, edit, read_rows, recording.sites())
        for site in recording.sites():
            value = fw.hooks[site]
            if hook_point(site)[0] == HOOK_PATTERN:
                value = prompt_keys(value[..., :prompt_end], n_prompt)
            recording.take(site, value, query, decision)
        return fw.logits

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
        recorders: Sequence[Recorder] = (),
    ) -> ProbeResult:
        """Same contract as ``EngineSession.run`` (see the module docstring for how it is computed)."""
        ids = [int(x) for x in (input_ids.flatten().tolist() if isinstance(input_ids, torch.Tensor) else input_ids)]
        spans = dict(spans or {})
        candidates = {k: (int(a), [int(t) for t in toks]) for k, (a, toks) in (candidates or {}).items()}
        conds = [BASELINE, *conditions]
        knockouts_only(conds, f"the {self.name} backend")
        rows = validate_request(ids, query_rows, conds, self.config)
        n, p = len(ids), rows[0]
        validate_candidates(candidates, p, n, self.config)
        recs = probe_recorders(span_matrix(spans, n), record_rows, record_residual, recorders)
        at_candidates = [r for r in recs if r.candidates]
        query = set(rows)
        local = torch.tensor([r - p for r in rows])
        # Every row from the branch point is read: single-token candidates anchor anywhere there.
        read = list(range(p, n))
        results = []
        for c in conds:
            active = c.active(self.n_layers, self.n_heads)
            edit = RowEdit(tuple(r for r in rows if c.blocks_row(r)), c.key_positions, active)
            recording = Recording(recs, self.n_layers)
            logits = self._read(recording, ids, edit, read, n, n, local, rows[-1] - p)
            recorded = recording.results()
            logp = torch.log_softmax(logits, dim=-1)
            cand_lp: dict[str, torch.Tensor] = {}
            single = {name: torch.tensor([a - p]) for name, (a, toks) in candidates.items() if len(toks) == 1}
            at_query, cand_rec = condition_recordings(recs, recorded, 0, local, single)
            for name, (a, toks) in candidates.items():
                if len(toks) == 1:
                    cand_lp[name] = logp[a - p, toks[0]].reshape(1)
                    continue
                seq = ids[: a + 1] + toks[:-1]
                # As the native branch: query rows up to the anchor, continuation rows after it;
                # positions after the anchor hold the continuation, never blocked, in no span.
                knocked = tuple(pos for pos in range(p, len(seq))
                                if ((pos in query and c.blocks_row(pos)) if pos <= a else c.continuation))
                cand_edit = RowEdit(knocked, tuple(k for k in c.key_positions if k <= a), active)
                cand_recording = Recording(at_candidates, self.n_layers)
                cand_logits = self._read(cand_recording, seq, cand_edit, list(range(a, a + len(toks))), n, a + 1, None, None)
                cand_lp[name] = torch.log_softmax(cand_logits, dim=-1)[torch.arange(len(toks)), torch.tensor(toks)]
                cand_rec[name] = condition_recordings(at_candidates, cand_recording.results(), 0, None, {})[0]
            results.append(ConditionResult.from_recordings(c, p, logits, logits[rows[-1] - p], list(spans), cand_lp, at_query,
                                                           {name: cand_rec[name] for name in candidates}, self.name))
        return ProbeResult(ids, rows, {s: len(set(v)) for s, v in spans.items()}, results)
