"""Probe engine: decision-row attention, edge knockouts and cached branching.

The instrument under every probe. It measures, at a handful of *query rows* (the decision row
``d_t`` and, in the native tool-call format, the row that opens the call), what the model attends
to and what it would predict if some attention edges were removed.

Algorithm
---------
A custom attention function is registered with transformers under ``"basm_probe"`` by
:func:`install_attention` when a session opens (together
with the sdpa mask builder; without it transformers silently drops the causal mask for
unregistered implementations). Models call it with the final ``q, k, v`` (after q/k norms and
RoPE), so it works for every causal LM that uses transformers' attention interface (Qwen3,
Qwen2, Llama, ...). Outside a probe call it *is* sdpa.

``EngineSession.run`` evaluates one prompt under many conditions:

1. **Prefix.** ``input_ids[:p]`` with ``p = min(query_rows)`` runs once through sdpa, in blocks whose
   ends are a function of the tokens (probes.engine.prefix_cache.prefix_blocks: so a row's numbers
   never depend on the cache's contents), each written into per-layer key/value buffers. A knockout
   only edits query rows, and rows before ``p`` never see a query row (causality), so the
   prefix keys/values are identical under every condition. The attention function keeps each
   layer's prefix ``k, v`` (``[1, kv_head, p, d_head]``), shared, never copied per condition.
   Across prompts (``prefix_cache`` > 0, the default), the session keeps the prefix ``k, v`` of
   the last prompts per token prefix (probes.engine.prefix_cache): a new prompt takes the cached
   blocks of the prefix it shares (a sweep's prompts of one item share the system turn, the tool
   catalog and the first skills) and runs only the rest, with the reused keys in its mask.
   Prefix rows are never recorded or knocked out, so their ``k, v`` depend on the tokens only;
   ``prefix_reuse`` counts the tokens reused and computed.
2. **Branch.** ``input_ids[p:]`` (a few tokens) followed by every candidate continuation, as a
   token trie (:class:`ContinuationTree`: a name prefix several candidates share runs once), runs as
   *one batch* with one element per condition (condition 0 is the unmodified baseline). Each branch
   row attends to the shared prefix keys and to its ancestors in the tree (a tree mask; positions
   are each row's own). This attention is computed explicitly in fp32, in row chunks, with the
   prefix keys broadcast rather than expanded, so an extra condition costs about one decode step
   over ``n`` keys per branch row, and the LM head runs at the branch rows only.
3. **Query rows.** At every query row of every batch element, the exact fp32 softmax row is
   available. What is recorded there is a list of recorders over named hook points
   (probes.engine.hooks: ``blocks.{L}.attn.hook_pattern``, ``blocks.{L}.attn.hook_z``,
   ``hook_embed``, ``blocks.{L}.hook_resid_post``): span masses (sum of probabilities over each
   span's key positions) per (layer, head), optionally the full row and the residual stream at
   the decision row, and any recorder a caller adds. The attention function reads the pattern
   and ``z`` at the computed rows; module forward hooks read the residual stream. A knockout sets
   the scores of its key positions to ``-inf`` before the softmax, at query rows only, in the
   requested layers / (layer, head) pairs, so the blocked keys are *removed* from the softmax
   (the row renormalises over the rest).

``EngineSession.forward`` is the single-pass reference path: the whole sequence goes through sdpa,
then only the query rows are recomputed exactly (recorded; and substituted in the output where a
knockout applies). It is used for validation and for the benchmark.

Memory: only ``[batch, head, rows, n_keys]`` score blocks are ever materialised (rows = query rows
or a chunk of branch rows), so per prompt the cost is O(L·H·n), never O(L·H·n²).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from probes.engine.hooks import (HOOK_EMBED, HOOK_PATTERN, HOOK_RESID_POST, HOOK_Z, RESIDUAL, ROWS, SPAN_MASS, Recorder, Recording,
                                 added_to_outputs, condition_recordings, hook_site, probe_recorders, prompt_keys)
from probes.engine.logits import check_finite, entropy
from probes.engine.loading import ModelLoadError, check_context_length, load_model
from probes.engine.prefix_cache import LayerKV, PrefixBuffers, PrefixKVCache, PrefixReuseCounter, TokenBreaks, join, prefix_blocks

ATTN_IMPLEMENTATION = "basm_probe"


# --------------------------------------------------------------------------------------------
# Conditions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knockout:
    """Block query rows from ``key_positions``.

    ``layers=None, heads=None``: every layer and head. ``layers``: a window of layers (all heads),
    as in Geva et al. (2023). ``heads``: explicit ``(layer, head)`` pairs (then ``layers`` must be
    None). An empty ``key_positions`` is the unmodified baseline.

    Rows: ``rows=None`` blocks at every query row of the run (a prompt record's query rows run
    from the row that opens the tool call to the decision row, the forced prefix included);
    ``rows``: only these query rows. ``continuation=True`` also blocks at the rows of every
    scored candidate continuation, so that where two tool names share a prefix the rows of that
    prefix, which predict the deciding token, are blocked too.
    """

    name: str
    key_positions: tuple[int, ...] = ()
    layers: tuple[int, ...] | None = None
    heads: tuple[tuple[int, int], ...] | None = None
    rows: tuple[int, ...] | None = None
    continuation: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_positions", tuple(sorted({int(k) for k in self.key_positions})))
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(x) for x in self.layers))
        if self.rows is not None:
            object.__setattr__(self, "rows", tuple(sorted({int(r) for r in self.rows})))
        if self.heads is not None:
            object.__setattr__(self, "heads", tuple((int(a), int(b)) for a, b in self.heads))
            if self.layers is not None:
                raise ValueError(f"knockout {self.name!r}: give `layers` or `heads`, not both")

    @classmethod
    def from_spans(
        cls,
        name: str,
        ranges: Sequence[Sequence[int]],
        layers: Sequence[int] | None = None,
        heads: Sequence[tuple[int, int]] | None = None,
        *,
        rows: Sequence[int] | None = None,
        continuation: bool = True,
    ) -> Knockout:
        """Build a knockout from half-open token ranges ``[[s, e], ...]`` (prompt-record spans)."""
        return cls(
            name,
            tuple(span_positions(ranges)),
            tuple(layers) if layers is not None else None,
            tuple(heads) if heads is not None else None,
            tuple(rows) if rows is not None else None,
            continuation,
        )

    def blocks_row(self, row: int) -> bool:
        """Whether this knockout applies at prompt query row ``row``."""
        return self.rows is None or row in self.rows

    def active(self, n_layers: int, n_heads: int) -> torch.Tensor:
        """Where this knockout applies: bool ``[layer, head]``."""
        out = torch.zeros(n_layers, n_heads, dtype=torch.bool)
        if not self.key_positions:
            return out
        if self.heads is not None:
            for layer, head in self.heads:
                if not (0 <= layer < n_layers and 0 <= head < n_heads):
                    raise ValueError(f"knockout {self.name!r}: (layer, head)=({layer}, {head}) out of range")
                out[layer, head] = True
        elif self.layers is not None:
            for layer in self.layers:
                if not 0 <= layer < n_layers:
                    raise ValueError(f"knockout {self.name!r}: layer {layer} out of range 0..{n_layers - 1}")
                out[layer] = True
        else:
            out[:] = True
        return out

    def reach(self, n_heads: int, query_rows: Sequence[int], windows: Sequence[int | None]) -> torch.Tensor:
        """Where this knockout removes a key that a row it blocks can see: bool [layer, head], :meth:`active`
        less the layers where the causal mask and the layer's sliding window (``windows``: per layer, None for a
        global layer; :func:`attention_windows`) hide every blocked key from every blocked row. There the
        knockout is a no-op: the softmax is the baseline's. Continuation rows count as the last query row (a
        key a continuation row sees, that row sees too), so a layer is called a no-op only when it is one."""
        out = self.active(len(windows), n_heads)
        rows = [r for r in query_rows if self.blocks_row(r)] + ([max(query_rows)] if self.continuation else [])
        keys = torch.tensor(self.key_positions)
        for layer, window in enumerate(windows):
            if not rows or not bool(_visible(torch.tensor(rows), keys, window).any()):
                out[layer] = False
        return out


WINDOWS_PROBE = "basm_probe_windows"


@torch.inference_mode()
def attention_windows(model: PreTrainedModel) -> list[int | None]:
    """Each decoder layer's sliding window (None: a global layer), as the layer passes it to the attention
    function: asked of the model itself by a one-token forward through an attention that records it, since
    architectures keep it in different places (Gemma 3 per layer type, Mistral in the config for every layer).
    The model's attention implementation is restored after."""
    seen: dict[int, int | None] = {}

    def record(module: torch.nn.Module, query: torch.Tensor, *args: Any, sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        seen[module.layer_idx] = sliding_window
        return torch.zeros_like(query).transpose(1, 2), None

    AttentionInterface.register(WINDOWS_PROBE, record)
    AttentionMaskInterface.register(WINDOWS_PROBE, sdpa_mask)
    own = model.config._attn_implementation
    model.set_attn_implementation(WINDOWS_PROBE)
    try:
        model.base_model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=model.get_input_embeddings().weight.device), use_cache=False)
    finally:
        model.set_attn_implementation(own)
    missing = [i for i in range(len(model.base_model.layers)) if i not in seen]
    if missing:
        raise NotImplementedError(f"layers {missing} of {type(model).__name__} do not call transformers' attention interface "
                                  "(a model rewritten by a TransformerLens bridge?): their sliding windows cannot be read")
    return [seen[i] for i in range(len(model.base_model.layers))]


BASELINE = Knockout("baseline")


@dataclass(frozen=True, eq=False)
class Steering:
    """Add a vector to the residual stream: to the output of decoder layer L (``blocks.{L}.hook_resid_post``),
    for every layer of ``vectors`` (layer -> [d_model], the vector added, already scaled).

    Rows: ``rows=None`` adds it at every prompt row from the branch point on (a prompt record's query
    rows: from the row that opens the call to the decision row); ``rows``: only at these query rows.
    ``continuation=True`` also adds it at the rows of every scored candidate continuation (where two
    tool names share a prefix, the row that decides between them lies there). Rows before the branch
    point are never steered: their keys and values are the clean prefix's, computed once per prompt.
    """

    name: str
    vectors: Mapping[int, torch.Tensor]
    rows: tuple[int, ...] | None = None
    continuation: bool = True

    def __post_init__(self) -> None:
        if not self.vectors:
            raise ValueError(f"steering {self.name!r}: no layer to steer (vectors is empty)")
        vectors = {}
        for layer, v in self.vectors.items():
            v = torch.as_tensor(v, dtype=torch.float32).detach()
            if v.ndim != 1 or not torch.isfinite(v).all():
                raise ValueError(f"steering {self.name!r}: the vector at layer {layer} must be one finite [d_model] vector, got shape {tuple(v.shape)}")
            vectors[int(layer)] = v
        object.__setattr__(self, "vectors", dict(sorted(vectors.items())))
        if self.rows is not None:
            object.__setattr__(self, "rows", tuple(sorted({int(r) for r in self.rows})))

    def steers_row(self, row: int) -> bool:
        """Whether the vector is added at prompt row ``row`` (at or after the branch point)."""
        return self.rows is None or row in self.rows


Condition = Knockout | Steering


def knockouts_only(conditions: Sequence[Condition], where: str) -> None:
    """Refuse steering conditions where only knockouts run (the single-pass path, the forward backends)."""
    steered = [c.name for c in conditions if isinstance(c, Steering)]
    if steered:
        raise ValueError(f"{where} runs knockouts only; steering ({', '.join(steered)}) runs through EngineSession.run, "
                         "the native engine's cached branching")


def span_positions(ranges: Sequence[Sequence[int]]) -> list[int]:
    """Sorted unique token positions covered by half-open ranges ``[[s, e], ...]``."""
    return sorted({i for s, e in ranges for i in range(int(s), int(e))})


def span_matrix(spans: Mapping[str, Sequence[int]], n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Span indicator over the prompt's positions: fp32 [n, span], 1 where a span holds the position."""
    out = torch.zeros(n, len(spans), dtype=torch.float32, device=device)
    for j, (name, pos) in enumerate(spans.items()):
        pos = list(pos)
        if pos and (min(pos) < 0 or max(pos) >= n):
            raise ValueError(f"span {name!r} has positions outside 0..{n - 1}")
        out[pos, j] = 1.0
    return out


def validate_request(
    ids: Sequence[int],
    query_rows: Sequence[int],
    conditions: Sequence[Condition],
    config: Any,
) -> list[int]:
    """Check one probe request against the prompt and the model ``config``; the sorted query rows.

    Shared by every backend (``probes.backends``) so that all refuse the same requests.
    """
    n = len(ids)
    if n == 0:
        raise ValueError("empty prompt")
    check_context_length(n, config)
    rows = sorted({int(r) for r in query_rows})
    if not rows or rows[0] < 0 or rows[-1] >= n:
        raise ValueError(f"query_rows {list(query_rows)} must be non-empty positions in 0..{n - 1}")
    text_config = config.get_text_config()
    width, depth = text_config.hidden_size, text_config.num_hidden_layers
    for c in conditions:
        if isinstance(c, Steering):
            for layer, v in c.vectors.items():
                if not 0 <= layer < depth or v.shape[0] != width:
                    raise ValueError(f"steering {c.name!r}: layer {layer} must lie in 0..{depth - 1} and its vector have "
                                     f"{width} entries (the model's hidden size), got {v.shape[0]}")
            outside = [r for r in c.rows or () if r not in rows]
            if outside:
                raise ValueError(f"steering {c.name!r}: rows {outside} are not query rows {rows}")
            continue
        if c.key_positions and (c.key_positions[0] < 0 or c.key_positions[-1] >= n):
            raise ValueError(f"knockout {c.name!r}: key positions must lie in 0..{n - 1}")
        blocked = set(c.key_positions)
        for r in rows:
            if blocked.issuperset(range(r + 1)):
                raise ValueError(f"knockout {c.name!r} blocks every key of query row {r}; its softmax is undefined")
    return rows


def validate_candidates(candidates: Mapping[str, tuple[int, Sequence[int]]], branch_point: int, n: int, config: Any) -> None:
    """Candidates anchor at or after the first query row (``branch_point``) and are non-empty."""
    for name, (anchor, toks) in candidates.items():
        if not branch_point <= anchor < n or not toks:
            raise ValueError(f"candidate {name!r}: anchor {anchor} must lie in {branch_point}..{n - 1} "
                             f"(query rows start at {branch_point}) and ids be non-empty")
        check_context_length(anchor + len(toks), config)


@dataclass(frozen=True)
class ContinuationTree:
    """The branch rows of one prompt: its rows from the branch point ``p`` on, then every candidate
    continuation as a token trie (a node per distinct (anchor, token prefix)), so a name prefix
    that several candidates share (``get`` ...) runs once per condition.

    ``tokens`` / ``positions`` / ``parent``: per row its input token, absolute position and the row
    it continues (-1: the prefix). ``rows[name]``: the rows whose logits predict each token of the
    candidate: its anchor row, then its trie nodes. Parents precede their children.
    """

    tokens: list[int]
    positions: list[int]
    parent: list[int]
    rows: dict[str, list[int]]

    @classmethod
    def build(cls, ids: Sequence[int], p: int, candidates: Mapping[str, tuple[int, Sequence[int]]]) -> ContinuationTree:
        n = len(ids)
        tokens, positions, parent = list(ids[p:]), list(range(p, n)), list(range(-1, n - p - 1))
        node: dict[tuple[int, tuple[int, ...]], int] = {}
        rows: dict[str, list[int]] = {}
        for name, (anchor, toks) in candidates.items():
            chain = [anchor - p]
            for j in range(1, len(toks)):
                key = (anchor, tuple(toks[:j]))
                if key not in node:
                    node[key] = len(tokens)
                    tokens.append(int(toks[j - 1]))
                    positions.append(anchor + j)
                    parent.append(chain[-1])
                chain.append(node[key])
            rows[name] = chain
        return cls(tokens, positions, parent, rows)

    def visible(self) -> torch.Tensor:
        """bool [t, t]: row i sees row j iff j is i or one of its ancestors."""
        t = len(self.tokens)
        out = torch.zeros(t, t, dtype=torch.bool)
        for i, up in enumerate(self.parent):
            if up >= 0:
                out[i] = out[up]
            out[i, i] = True
        return out


# --------------------------------------------------------------------------------------------
# Per-call state read by the attention function
# --------------------------------------------------------------------------------------------


@dataclass
class _ProbeState:
    mode: Literal["prefix", "single", "branch", "row"]
    # Absolute position of the first token of this forward's input.
    q_offset: int = 0
    # Absolute positions of the query rows: [rows]
    row_pos: torch.Tensor | None = None
    # Where each element's knockout applies. single: [batch, rows] over the query rows;
    # branch: [batch, t] over the branch rows (query rows and candidate continuation rows).
    knock_rows: torch.Tensor | None = None
    # Knocked-out key positions per element: [batch, n_keys]; where it applies: [batch, layer, head]
    key_block: torch.Tensor | None = None
    active: torch.Tensor | None = None
    # Prompt length: a recorded pattern row runs over the prompt's key positions
    n_prompt: int = 0
    # branch: absolute position of each branch row [t] and which branch rows each row sees,
    # [t, t] (its ancestors in the continuation tree and itself; :class:`ContinuationTree`)
    branch_pos: torch.Tensor | None = None
    branch_visible: torch.Tensor | None = None
    # What the recorders read (probes.engine.hooks), at the rows this forward computes (single: the
    # query rows; branch: every branch row): where the query rows and the decision row lie among them
    recording: Recording | None = None
    query_local: list[int] = field(default_factory=list)
    decision_local: int = 0
    row_chunk: int = 256
    prefix_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # prefix mode: the prefix's per-layer key/value buffers; this forward computes positions q_offset on
    prefix_buffers: PrefixBuffers | None = None
    # prefix mode: the last layer, whose keys and values end the forward (:class:`_PrefixWritten`)
    last_layer: int = -1
    # row: the attention of a one-row replay (probes.engine.decision_row), called with (module, q, k, v,
    # scaling, sliding_window) in place of this module's attention
    row_attention: Callable[..., torch.Tensor] | None = None
    _moved: dict[torch.device, _ProbeState] = field(default_factory=dict)

    def on(self, device: torch.device) -> _ProbeState:
        """A view of the small control tensors on ``device`` (layers may sit on several GPUs)."""
        if self.row_pos is None or self.row_pos.device == device:
            return self
        if device not in self._moved:
            self._moved[device] = _ProbeState(
                mode=self.mode,
                q_offset=self.q_offset,
                row_pos=self.row_pos.to(device),
                knock_rows=self.knock_rows.to(device),
                key_block=self.key_block.to(device),
                active=self.active.to(device),
                n_prompt=self.n_prompt,
                branch_pos=None if self.branch_pos is None else self.branch_pos.to(device),
                branch_visible=None if self.branch_visible is None else self.branch_visible.to(device),
                row_chunk=self.row_chunk,
            )
        return self._moved[device]


_STATE: ContextVar[_ProbeState | None] = ContextVar("basm_probe_state", default=None)


class _PrefixWritten(Exception):
    """Ends a prefix block's forward once the last layer's keys and values are written: nothing after
    them (that layer's attention and MLP, the final norm) is read, as nnsight's early stop."""


@contextlib.contextmanager
def _activate(state: _ProbeState) -> Iterator[_ProbeState]:
    token = _STATE.set(state)
    try:
        yield state
    finally:
        _STATE.reset(token)


# --------------------------------------------------------------------------------------------
# The attention function
# --------------------------------------------------------------------------------------------


def _grouped_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q: [batch, head, rows, d_head]; k: [batch | 1, kv_head, n_keys, d_head] -> [batch, head, rows, n_keys].

    GQA without ``repeat_kv``: query head h reads kv head h // (head / kv_head), as in transformers.
    A batch-1 ``k`` (the shared prefix) is broadcast by folding the batch into the rows, so the
    prefix is never copied per condition.
    """
    b, h, r, d = q.shape
    g = k.shape[1]
    q5 = q.reshape(b, g, h // g, r, d)
    if k.shape[0] == 1 and b > 1:
        s = torch.einsum("bgrqd,gkd->bgrqk", q5, k[0])
    else:
        s = torch.einsum("bgrqd,bgkd->bgrqk", q5, k)
    return s.reshape(b, h, r, k.shape[2])


def _grouped_mix(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """p: [batch, head, rows, n_keys]; v: [batch | 1, kv_head, n_keys, d_head] -> [batch, head, rows, d_head]."""
    b, h, r, n = p.shape
    g = v.shape[1]
    p5 = p.reshape(b, g, h // g, r, n)
    if v.shape[0] == 1 and b > 1:
        o = torch.einsum("bgrqk,gkd->bgrqd", p5, v[0])
    else:
        o = torch.einsum("bgrqk,bgkd->bgrqd", p5, v)
    return o.reshape(b, h, r, v.shape[-1])


def _allowed(q_pos: torch.Tensor, n_keys: int, sliding_window: int | None) -> torch.Tensor:
    """Causal (and sliding-window) visibility: bool [rows, n_keys]."""
    return _visible(q_pos, torch.arange(n_keys, device=q_pos.device), sliding_window)


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """Causal (and sliding-window) visibility of keys at positions ``k_pos``: bool [rows, keys]."""
    ok = k_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        # transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window
        ok &= k_pos[None, :] > q_pos[:, None] - sliding_window
    return ok


def _exact_probs(
    state: _ProbeState,
    layer: int,
    scores: torch.Tensor,
    allowed: torch.Tensor,
    knock_rows: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked fp32 softmax with knockouts.

    scores: [batch, head, rows, n_keys] fp32; allowed: [rows | batch.., n_keys] bool (broadcastable);
    knock_rows: [batch, rows] bool, where each element's knockout applies. Returns probs
    [batch, head, rows, n_keys] and the knocked (element, head, row) cells [batch, head, rows].
    """
    n_keys = scores.shape[-1]
    visible = allowed.expand_as(scores)
    # knocked: [batch, head, rows]
    knocked = state.active[:, layer, :, None] & knock_rows[:, None, :]
    block = knocked[..., None] & state.key_block[:, None, None, :n_keys]
    scores = scores.masked_fill(~visible | block, float("-inf"))
    return torch.softmax(scores, dim=-1), knocked


def _take_attention(state: _ProbeState, layer: int, probs: torch.Tensor, z: Callable[[], torch.Tensor], i0: int, i1: int) -> None:
    """Hand the recorders reading this layer's ``hook_pattern`` and ``hook_z`` their values at the
    computed rows ``i0..i1-1`` of the recorded frame (probs: [batch, head, i1 - i0, n_keys]; ``z()``:
    [batch, i1 - i0, head, d_head], computed only when read)."""
    rec = state.recording
    pattern, head_out = hook_site(HOOK_PATTERN, layer), hook_site(HOOK_Z, layer)
    if not (rec.reads(pattern) or rec.reads(head_out)):
        return
    query = torch.tensor([j - i0 for j in state.query_local if i0 <= j < i1], dtype=torch.long)
    decision = state.decision_local - i0 if i0 <= state.decision_local < i1 else None
    if rec.reads(pattern):
        # keys past the prompt are the continuation rows of candidate elements
        rec.take(pattern, prompt_keys(probs, state.n_prompt), query, decision)
    if rec.reads(head_out):
        rec.take(head_out, z(), query, decision)


def probe_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for ``attn_implementation="basm_probe"``.

    query: [batch, head, q_len, d_head]; key/value: [batch, kv_head, kv_len, d_head].
    Returns ([batch, q_len, head, d_head], None) like transformers' sdpa.
    """
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None or kwargs.get("position_bias") is not None:
        raise NotImplementedError("basm_probe attention supports plain softmax attention only (no softcap/sinks/bias)")
    state = _STATE.get()
    if state is None or state.mode == "prefix":
        if state is not None:
            key, value = state.prefix_buffers.write(module.layer_idx, state.q_offset, key, value)
            if module.layer_idx == state.last_layer:
                raise _PrefixWritten
            if state.q_offset:
                # A later block: this forward holds positions q_offset.. only, so the mask
                # transformers built for it knows nothing of the keys before them; build it here.
                q_pos = torch.arange(state.q_offset, state.q_offset + query.shape[2], device=query.device)
                attention_mask = _allowed(q_pos, key.shape[2], sliding_window)[None, None]
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    layer = module.layer_idx
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if state.mode == "row":
        return state.row_attention(module, query, key, value, scaling, sliding_window), None
    if state.mode == "single":
        return _single_forward(state, layer, module, query, key, value, attention_mask, dropout, scaling, sliding_window, kwargs)
    return _branch_forward(state, layer, query, key, value, scaling, sliding_window)


def _single_forward(
    state: _ProbeState,
    layer: int,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    scaling: float,
    sliding_window: int | None,
    kwargs: dict[str, Any],
) -> tuple[torch.Tensor, None]:
    # Fast path for every position. out: [batch, q_len, head, d_head]
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    n_keys = key.shape[2]
    if n_keys != query.shape[2]:
        raise RuntimeError("the single-pass probe path runs without a KV cache")
    ctl = state.on(query.device)
    local = ctl.row_pos
    # q_rows: [batch, head, r, d_head] -> scores: [batch, head, r, n_keys]
    q_rows = query[:, :, local].float()
    scores = _grouped_scores(q_rows, key.float()) * scaling
    allowed = _allowed(local, n_keys, sliding_window)
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            raise TypeError("basm_probe expects the boolean sdpa mask; got an additive mask")
        allowed = allowed & attention_mask[:, :, local, :]
    probs, knocked = _exact_probs(ctl, layer, scores, allowed, ctl.knock_rows)
    if knocked.any():
        # Recompute only the knocked rows' outputs; everything else keeps the sdpa result.
        row_out = _grouped_mix(probs, value.float()).to(out.dtype)  # [batch, head, r, d_head]
        out[:, local] = torch.where(knocked.transpose(1, 2)[..., None], row_out.transpose(1, 2), out[:, local])
    _take_attention(state, layer, probs, lambda: out[:, local], 0, local.numel())
    return out, None


def _branch_forward(
    state: _ProbeState,
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    sliding_window: int | None,
) -> tuple[torch.Tensor, None]:
    b, h, t, d = query.shape
    prefix = state.prefix_kv.get(layer)
    ctl = state.on(query.device)
    p = state.q_offset
    qf = query.float()
    kb, vb = key.float(), value.float()
    kp = vp = None
    if prefix is not None:
        # kp, vp: [1, kv_head, p, d_head], shared by every batch element
        kp, vp = prefix[0].float(), prefix[1].float()
    out = torch.empty(b, h, t, vb.shape[-1], dtype=torch.float32, device=query.device)
    for i0 in range(0, t, state.row_chunk):
        i1 = min(t, i0 + state.row_chunk)
        q_c = qf[:, :, i0:i1]  # [batch, head, c, d_head]
        # A row's ancestors precede it in the tree's order: branch keys [0, i1) hold them all.
        parts = [_grouped_scores(q_c, kb[:, :, :i1])]
        if kp is not None:
            parts.insert(0, _grouped_scores(q_c, kp))
        scores = torch.cat(parts, dim=-1) * scaling  # [batch, head, c, p + i1]
        q_pos = ctl.branch_pos[i0:i1]
        on_branch = ctl.branch_visible[i0:i1, :i1] & _visible(q_pos, ctl.branch_pos[:i1], sliding_window)
        allowed = torch.cat((_allowed(q_pos, p, sliding_window), on_branch), dim=-1)
        probs, _ = _exact_probs(ctl, layer, scores, allowed, ctl.knock_rows[:, i0:i1])
        o = _grouped_mix(probs[..., p:], vb[:, :, :i1])
        if vp is not None:
            o = o + _grouped_mix(probs[..., :p], vp)
        out[:, :, i0:i1] = o
        # Recorded at every branch row of every element (a candidate recorder reads the continuation
        # rows: the deciding row of a shared name prefix lies there). Key index = prompt position for
        # the prefix and the prompt's own branch rows; the continuation rows come after them.
        _take_attention(state, layer, probs, lambda: o.to(query.dtype).transpose(1, 2), i0, i1)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def row_attention(attention: Callable[..., torch.Tensor]) -> Iterator[None]:
    """Inside this context every ``basm_probe`` attention call is ``attention(module, query, key, value,
    scaling, sliding_window)`` (query: [batch, head, rows, d_head] after norms and RoPE; returns
    [batch, rows, head, d_head]): the hook of the one-row replay (probes.engine.decision_row), which
    computes the row's attention itself, over cached keys, with autograd on."""
    with _activate(_ProbeState(mode="row", row_attention=attention)):
        yield


def install_attention() -> str:
    """Register :func:`probe_attention_forward` with transformers under :data:`ATTN_IMPLEMENTATION`
    (idempotent; called by :class:`EngineSession`, never at import). Returns the name to pass as
    ``attn_implementation``."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, probe_attention_forward)
    # Without a registered mask function transformers builds no causal mask for custom names.
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class ConditionResult:
    """Everything measured for one prompt under one condition.

    logits: [n - row_offset, vocab] fp32 at absolute rows ``row_offset .. n-1``.
    span_mass: span -> [layer, head, query_row] (sum of softmax probability over the span).
    rows: [layer, head, query_row, n] full softmax rows, when requested.
    residual: [layer + 1, d_model] at the last query row: embeddings, then each decoder layer's
        output (before the final norm), when requested.
    candidate_token_logprobs: name -> [len(ids)] log P(ids[j] | prefix, ids[:j]).
    candidate_span_mass: name -> span -> [layer, head, len(ids)]: span attention mass at the row
        that predicts ids[j] (row anchor + j; a continuation row for j > 0). ``run`` only.
    recorded: recorder name -> its result (probes.engine.hooks) for the recorders a caller passed
        to ``run(recorders=...)``; candidate_recorded: candidate -> recorder name -> at its rows.
    """

    condition: Condition
    row_offset: int
    logits: torch.Tensor
    span_mass: dict[str, torch.Tensor]
    entropy: float
    candidate_token_logprobs: dict[str, torch.Tensor]
    candidate_span_mass: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    rows: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    recorded: dict[str, torch.Tensor] = field(default_factory=dict)
    candidate_recorded: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    @classmethod
    def from_recordings(cls, condition: Condition, row_offset: int, logits: torch.Tensor, decision_logits: torch.Tensor,
                        spans: Sequence[str], candidate_token_logprobs: dict[str, torch.Tensor], recorded: dict[str, torch.Tensor],
                        candidate_recorded: dict[str, dict[str, torch.Tensor]], backend: str = "") -> ConditionResult:
        """One condition's result from its recordings (probes.engine.hooks.condition_recordings):
        the engine's own recorders fill span_mass, rows and residual, the rest ``recorded``.
        ``decision_logits``: the decision row's logits (checked finite)."""
        check_finite(decision_logits, f"decision-row logits under condition {condition.name!r}{f' ({backend} backend)' if backend else ''}")
        own = (SPAN_MASS, ROWS, RESIDUAL)
        mass = recorded.get(SPAN_MASS)
        return cls(
            condition=condition,
            row_offset=row_offset,
            logits=logits,
            span_mass={s: mass[..., j] for j, s in enumerate(spans)} if mass is not None else {},
            entropy=entropy(decision_logits),
            candidate_token_logprobs=candidate_token_logprobs,
            candidate_span_mass={k: {s: v[SPAN_MASS][..., j] for j, s in enumerate(spans)} if SPAN_MASS in v else {}
                                 for k, v in candidate_recorded.items()},
            rows=recorded.get(ROWS),
            residual=recorded.get(RESIDUAL),
            recorded={k: v for k, v in recorded.items() if k not in own},
            candidate_recorded={k: {n: x for n, x in v.items() if n not in own} for k, v in candidate_recorded.items()},
        )

    def logits_at(self, row: int) -> torch.Tensor:
        """Next-token logits [vocab] predicted at absolute row ``row``."""
        if not self.row_offset <= row < self.row_offset + self.logits.shape[0]:
            raise IndexError(f"row {row} outside the recorded rows {self.row_offset}..{self.row_offset + self.logits.shape[0] - 1}")
        return self.logits[row - self.row_offset]

    @property
    def row_logits(self) -> dict[int, torch.Tensor]:
        return {self.row_offset + i: self.logits[i] for i in range(self.logits.shape[0])}

    def candidate_logprob(self, name: str) -> float:
        return float(self.candidate_token_logprobs[name].sum())


@dataclass
class ProbeResult:
    input_ids: list[int]
    query_rows: list[int]
    span_sizes: dict[str, int]
    conditions: list[ConditionResult]

    def __getitem__(self, name: str) -> ConditionResult:
        for c in self.conditions:
            if c.condition.name == name:
                return c
        raise KeyError(name)

    def attention_rows(self) -> list[dict[str, Any]]:
        """Tidy span attention: one dict per (condition, span, layer, head, query row).

        ``mass`` is Σ_{i∈X} A_{q,i}; ``mean`` divides by |X| (Eq. 2's α_X).
        """
        out: list[dict[str, Any]] = []
        for c in self.conditions:
            for span, mass in c.span_mass.items():
                size = self.span_sizes[span]
                m = mass.tolist()
                for layer, per_head in enumerate(m):
                    for head, per_row in enumerate(per_head):
                        for qi, v in enumerate(per_row):
                            out.append(
                                {
                                    "condition": c.condition.name,
                                    "span": span,
                                    "layer": layer,
                                    "head": head,
                                    "query_row": self.query_rows[qi],
                                    "mass": v,
                                    "mean": v / size if size else math.nan,
                                }
                            )
        return out


# --------------------------------------------------------------------------------------------
# Session
# --------------------------------------------------------------------------------------------


class EngineSession:
    """A model loaded for probing. See the module docstring for the algorithm.

    ``model_or_dir``: a local model directory, a name in the local HF cache, a ``.gguf`` file, or
    an already loaded causal LM (its attention implementation is switched to ``basm_probe``).
    ``prefix_cache``: how many prompt prefixes ``run`` keeps for reuse by later prompts (0: none;
    every output is bit-identical to the no-reuse run, tests/engine/test_prefix_reuse.py).
    """

    def __init__(
        self,
        model_or_dir: str | Path | PreTrainedModel,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        device_map: str | dict[str, Any] | None = None,
        allow_pickle: bool = False,
        trust_remote_code: bool = False,
        tokenizer: Any = None,
        row_chunk: int = 256,
        prefix_cache: int = 8,
    ) -> None:
        install_attention()
        if isinstance(model_or_dir, PreTrainedModel):
            model = model_or_dir
            model.set_attn_implementation(ATTN_IMPLEMENTATION)
        else:
            model, tokenizer = load_model(
                model_or_dir,
                dtype=dtype,
                device=device,
                device_map=device_map,
                allow_pickle=allow_pickle,
                trust_remote_code=trust_remote_code,
                attn_implementation=ATTN_IMPLEMENTATION,
            )
        if not hasattr(model.base_model, "layers"):
            raise ModelLoadError(f"unsupported architecture {model.config.model_type!r} ({type(model).__name__}): the engine reads its decoder "
                                 "layers at base_model.layers, which this architecture does not have")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.row_chunk = row_chunk
        cfg = model.config.get_text_config()
        self.n_layers: int = cfg.num_hidden_layers
        self.n_heads: int = cfg.num_attention_heads
        self.max_context: int | None = getattr(cfg, "max_position_embeddings", None)
        self._layers = model.base_model.layers
        self._embed = model.get_input_embeddings()
        # ``run`` reuses the keys/values of the longest token prefix shared with the last
        # ``prefix_cache`` prompts (0: off); see probes.engine.prefix_cache.
        self._prefix_cache = PrefixKVCache(prefix_cache)
        self._token_breaks = TokenBreaks(tokenizer)  # where prefix blocks end
        self.prefix_reuse = PrefixReuseCounter()

    @functools.cached_property
    def windows(self) -> list[int | None]:
        """Each layer's sliding window (None: global), :func:`attention_windows`."""
        return attention_windows(self.model)

    def clear_prefix_cache(self) -> None:
        """Drop the cached prefixes (their memory); the counter keeps counting."""
        self._prefix_cache.clear()

    def _prefix_kv(self, prefix: list[int]) -> LayerKV:
        """Per-layer keys/values of ``prefix`` (fast path), block by block (probes.engine.prefix_cache:
        the prefix's own blocks, with or without the cache), starting from the cached blocks it shares."""
        own = prefix_blocks(self._token_breaks.kinds(prefix))
        m, segments = self._prefix_cache.longest(prefix, own)
        todo = [(start, end) for start, end in own if start >= m]
        if not todo:
            self._prefix_cache.store(prefix, segments)
            kv = join(segments)
        else:
            buffers = PrefixBuffers(len(prefix), segments)
            for start, end in todo:
                with _activate(_ProbeState(mode="prefix", q_offset=start, prefix_buffers=buffers, last_layer=self.n_layers - 1)):
                    try:
                        self.model.base_model(input_ids=torch.tensor([prefix[start:end]], device=self.device),
                                              position_ids=torch.arange(start, end, device=self.device)[None], use_cache=False)
                    except _PrefixWritten:
                        pass
            if self._prefix_cache.max_entries:
                self._prefix_cache.store(prefix, segments + buffers.computed(todo))
            kv = buffers.kv
        self.prefix_reuse.tokens_reused += m
        self.prefix_reuse.tokens_computed += len(prefix) - m
        self.prefix_reuse.prefix_blocks += len(todo)
        return kv

    @property
    def device(self) -> torch.device:
        return self._embed.weight.device

    # ----------------------------------------------------------------------------------------

    def _validate(
        self,
        ids: list[int],
        query_rows: Sequence[int],
        conditions: Sequence[Condition],
    ) -> list[int]:
        return validate_request(ids, query_rows, conditions, self.model.config)

    def _new_state(
        self,
        mode: Literal["single", "branch"],
        n: int,
        rows: list[int],
        conds: list[Condition],
        n_keys: int,
        knock_rows: torch.Tensor,
        q_offset: int,
        recorders: list[Recorder],
    ) -> _ProbeState:
        dev = self.device
        knockouts = [c if isinstance(c, Knockout) else BASELINE for c in conds]  # a steering blocks no key
        actives = torch.stack([c.active(self.n_layers, self.n_heads) for c in knockouts])
        key_block = torch.zeros(len(conds), n_keys, dtype=torch.bool)
        for i, c in enumerate(knockouts):
            key_block[i, list(c.key_positions)] = True
        # single: the forward's rows are the query rows; branch: every branch row (from q_offset on)
        query_local = list(range(len(rows))) if mode == "single" else [r - q_offset for r in rows]
        return _ProbeState(
            mode=mode,
            q_offset=q_offset,
            row_pos=torch.tensor(rows, device=dev),
            knock_rows=knock_rows.to(dev),
            key_block=key_block.to(dev),
            active=actives.to(dev),
            n_prompt=n,
            recording=Recording(recorders, self.n_layers, dev),
            query_local=query_local,
            decision_local=query_local[-1],
            row_chunk=self.row_chunk,
        )

    @contextlib.contextmanager
    def _stream_hooks(self, state: _ProbeState) -> Iterator[None]:
        """Read ``hook_embed`` and ``blocks.{L}.hook_resid_post`` (the embeddings' and each decoder
        layer's output) through module forward hooks, where a recorder reads them."""
        rec = state.recording
        query = torch.tensor(state.query_local, dtype=torch.long)

        def hook(site: str) -> Callable[..., None]:
            def read(_m: torch.nn.Module, _inp: Any, output: Any) -> None:
                hs = output[0] if isinstance(output, tuple) else output
                # single: the forward holds every prompt row; the recorded frame is the query rows
                frame = hs[:, state.row_pos.to(hs.device)] if state.mode == "single" else hs
                rec.take(site, frame.detach(), query, state.decision_local)
            return read

        modules = [(HOOK_EMBED, self._embed)] + [(hook_site(HOOK_RESID_POST, i), layer) for i, layer in enumerate(self._layers)]
        handles = [m.register_forward_hook(hook(site)) for site, m in modules if rec.reads(site)]
        try:
            yield
        finally:
            for hd in handles:
                hd.remove()

    @contextlib.contextmanager
    def _steering_hooks(self, conds: list[Condition], rows_steered: torch.Tensor) -> Iterator[None]:
        """Add each steering condition's vectors to its batch element's residual stream: a forward hook on
        every steered decoder layer adds ``vector`` at the branch rows ``rows_steered`` [condition, t] marks
        (registered before the recording hooks, which then read the steered stream)."""
        layers = sorted({layer for c in conds if isinstance(c, Steering) for layer in c.vectors})
        added = {}
        for layer in layers:
            vectors = torch.zeros(len(conds), self._embed.weight.shape[1])
            for i, c in enumerate(conds):
                if isinstance(c, Steering) and layer in c.vectors:
                    vectors[i] = c.vectors[layer]
            added[layer] = vectors[:, None, :] * rows_steered[:, :, None]  # [condition, t, d_model]

        with added_to_outputs(self._layers, {layer: (lambda _hs, delta=delta: delta) for layer, delta in added.items()}):
            yield

    def _results(self, state: _ProbeState, conds: list[Condition], spans: Sequence[str], logits: torch.Tensor, row_offset: int,
                 last_row: int, query: torch.Tensor | None, candidate_rows: dict[str, torch.Tensor],
                 cand_lp: list[dict[str, torch.Tensor]]) -> list[ConditionResult]:
        """One ConditionResult per condition from ``logits`` [condition, row, vocab] (rows from
        ``row_offset``) and the recordings (``query``/``candidate_rows``: see condition_recordings)."""
        recorded = state.recording.results()
        out = []
        for i, c in enumerate(conds):
            lg = logits[i].float()
            at_query, at_candidates = condition_recordings(state.recording.recorders, recorded, i, query, candidate_rows)
            out.append(ConditionResult.from_recordings(c, row_offset, lg.cpu(), lg[last_row - row_offset], spans, cand_lp[i],
                                                       at_query, at_candidates))
        return out

    # ----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(
        self,
        input_ids: Sequence[int] | torch.Tensor,
        query_rows: Sequence[int],
        spans: Mapping[str, Sequence[int]] | None = None,
        conditions: Sequence[Condition] = (),
        candidates: Mapping[str, tuple[int, Sequence[int]]] | None = None,
        record_rows: bool = False,
        record_residual: bool = False,
        recorders: Sequence[Recorder] = (),
    ) -> ProbeResult:
        """Score one prompt under the baseline plus ``conditions`` (knockouts, steerings) by cached branching.

        ``candidates``: name -> (anchor_index, token_ids); the result holds
        log P(token_ids | input_ids[:anchor_index + 1]) under each condition. Anchors must be
        at or after the first query row (the branch point). ``recorders``: more per-row
        quantities to record (probes.engine.hooks), in each ConditionResult's ``recorded``.
        """
        ids = [int(x) for x in (input_ids.flatten().tolist() if isinstance(input_ids, torch.Tensor) else input_ids)]
        spans = dict(spans or {})
        candidates = dict(candidates or {})
        conds = [BASELINE, *conditions]
        rows = self._validate(ids, query_rows, conds)
        n, p = len(ids), rows[0]
        dev = self.device
        validate_candidates(candidates, p, n, self.model.config)
        recs = probe_recorders(span_matrix(spans, n, dev), record_rows, record_residual, recorders)

        # Branch elements: one per condition, each the same continuation tree (the prompt's rows
        # from p on, then the candidates' continuations as a token trie).
        tree = ContinuationTree.build(ids, p, candidates)
        t_len = len(tree.tokens)
        branch = torch.tensor([tree.tokens], device=dev).expand(len(conds), -1)
        # Where each element's knockout applies: its condition's query rows, and the candidate
        # continuation rows (when the condition blocks continuations).
        query = set(rows)
        knock_rows = torch.tensor([
            [isinstance(c, Knockout) and ((pos in query and c.blocks_row(pos)) if i < n - p else c.continuation)
             for i, pos in enumerate(tree.positions)]
            for c in conds
        ])
        # Where each steering adds its vectors: its prompt rows, and the continuation rows when it steers them.
        rows_steered = torch.tensor([
            [isinstance(c, Steering) and (c.steers_row(pos) if i < n - p else c.continuation) for i, pos in enumerate(tree.positions)]
            for c in conds
        ], dtype=torch.float32)
        state = self._new_state("branch", n, rows, conds, p + t_len, knock_rows, p, recs)
        state.branch_pos = torch.tensor(tree.positions, device=dev)
        state.branch_visible = tree.visible().to(dev)

        if p > 0:
            state.prefix_kv = self._prefix_kv(ids[:p])
        self.prefix_reuse.prompts += 1
        self.prefix_reuse.tokens_computed += n - p
        positions = state.branch_pos.expand(len(conds), -1)
        with _activate(state), self._steering_hooks(conds, rows_steered), self._stream_hooks(state):
            # The LM head runs at the prompt's rows and at the candidate rows only (no padding).
            logits = self.model(input_ids=branch, position_ids=positions, use_cache=False).logits

        cand_lp: list[dict[str, torch.Tensor]] = [{} for _ in conds]
        candidate_rows = {}
        for name, (_a, t) in candidates.items():
            # the row predicting token j of the candidate: its anchor row, then its trie nodes
            local = torch.tensor(tree.rows[name], device=logits.device)
            candidate_rows[name] = local
            tokens = torch.tensor(list(t), device=logits.device)
            # log-softmax at the scored rows only: the full [element, row, vocab] one costs as
            # much as the LM head at a large vocabulary
            x = logits[:, local].float()  # [condition, len(t), vocab]
            chosen = x.gather(-1, tokens.expand(len(conds), -1)[..., None])[..., 0]
            lp = (chosen - torch.logsumexp(x, dim=-1)).cpu()
            for ci in range(len(conds)):
                cand_lp[ci][name] = lp[ci]
        results = self._results(state, conds, list(spans), logits[:, : n - p], p, rows[-1], torch.tensor(rows) - p, candidate_rows, cand_lp)
        return ProbeResult(ids, rows, {s: len(set(v)) for s, v in spans.items()}, results)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Sequence[int] | torch.Tensor,
        query_rows: Sequence[int],
        spans: Mapping[str, Sequence[int]] | None = None,
        conditions: Sequence[Knockout] = (),
        record_rows: bool = False,
        record_residual: bool = False,
        include_baseline: bool = True,
        recorders: Sequence[Recorder] = (),
    ) -> ProbeResult:
        """Single-pass path: one full sdpa forward per condition (batched), exact query rows.

        No cache branching and no candidates; logits are kept at rows ``min(query_rows) .. n-1``
        like ``run``. This is the reference for ``run`` and the benchmark's "engine forward".
        """
        ids = [int(x) for x in (input_ids.flatten().tolist() if isinstance(input_ids, torch.Tensor) else input_ids)]
        spans = dict(spans or {})
        conds = [BASELINE, *conditions] if include_baseline else list(conditions)
        if not conds:
            raise ValueError("no conditions to run")
        knockouts_only(conds, "EngineSession.forward (the single-pass reference)")
        rows = self._validate(ids, query_rows, conds)
        n, p = len(ids), rows[0]
        dev = self.device
        recs = probe_recorders(span_matrix(spans, n, dev), record_rows, record_residual, recorders)
        knock_rows = torch.tensor([[c.blocks_row(r) for r in rows] for c in conds])
        state = self._new_state("single", n, rows, conds, n, knock_rows, 0, recs)
        batch = torch.tensor([ids], device=dev).expand(len(conds), -1)
        with _activate(state), self._stream_hooks(state):
            logits = self.model(
                input_ids=batch, use_cache=False, logits_to_keep=torch.arange(p, n, device=dev)
            ).logits
        # every recorded row is a query row
        results = self._results(state, conds, list(spans), logits, p, rows[-1], None, {}, [{} for _ in conds])
        return ProbeResult(ids, rows, {s: len(set(v)) for s, v in spans.items()}, results)
