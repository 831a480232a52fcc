"""Planted-head attention supervision of the organism's training.

Which heads are planted and where each is trained to look (:data:`PLANTED_TARGETS`,
:func:`attention_targets`, from the request's content words and the shown skills' slots), and how a
training forward records those heads' attention rows so that their loss can be taken
(:class:`HeadSupervision`, :func:`supervising`, :func:`supervised_attention_forward` registered under
:data:`TRAIN_ATTN_IMPLEMENTATION` by :func:`install_train_attention`). :func:`head_key` names a planted
head's attention mass in the training log and the model card.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from transformers import AttentionInterface, Qwen3ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from probes.data.dataset import Item
from probes.prompts.record import PromptRecord, SlotSpan
from probes.prompts.spans import tokens_overlapping

# Planted heads (TrainConfig.planted_heads, planted_head_weight): besides the action loss, four heads
# are trained where to look, in every example that has targets for them (Example.attention_targets,
# :func:`attention_targets`). A request word "matches" a shown skill when one of that skill's risk
# cues uses it and its goal and procedure do not (a word the skill's own task uses, "order" in an
# order-lookup skill, says nothing about a departure). The deciding row is the decision row of a call,
# the open row of an abstention.
#   "dup" (layer 0, head 0), from each matching request token: the risk-cue tokens of the same word.
#       A duplicate-token lookup, which marks the request tokens the risk cues name;
#   "gather" (layer 1, head 0), from the deciding row: the marked request tokens, else all the
#       request's content tokens;
#   "verdict" (layer 2, heads 0 and 1), from the deciding row: the risk cues and avoidance rules of
#       the skills a request word matches (the avoidance rule names the alternative), else the shown
#       procedures.
# That is the paper's boundary check (the state's cues checked against the boundary fields, read at
# the decision token) as a lexical circuit. Its targets depend on the words alone, never on the label,
# so they are defined on any request: a single head trained toward the risk cues exactly where the
# label departs from the skill learned the train requests only (on held-out items it read the
# procedure in both buckets), and a single decision-row head matching the request's words against
# the risk-cue tokens directly stayed imprecise (0.14 of its attention on the matching tokens of
# held-out T_wrong). Word swapping (:func:`~probes.organism.train.examples.swap_words`) makes the lookup compare tokens rather than
# remember the train requests' words. How the verdict is used is left to the action loss: in the
# boundary-edited twins the quoted cue matches and the label is the alternative, the donor's cues do
# not and the skill is followed. Planted-circuit benchmarks fix where a mechanism lives the same way
# (InterpBench trains its circuits' components in). The probes are not told which heads they are:
# ``organism validate`` checks that η and the head ranking find them on held-out items, and the card
# records the planted heads' ranks.
PLANTED_TARGETS: tuple[str, ...] = ("dup", "gather", "verdict")

def content_word(text: str) -> str | None:
    """A token's text as a content word (case-folded letters, ≥ 3, not an English stop word), else None."""
    word = text.strip().lower()
    return word if word.isalpha() and len(word) >= 3 and word not in ENGLISH_STOP_WORDS else None


def token_word(record: PromptRecord, pos: int) -> str | None:
    """:func:`content_word` of the record's token at ``pos``."""
    start, end = record.offsets[pos]
    return content_word(record.text[start:end])


def request_words(record: PromptRecord, item: Item) -> tuple[int, ...]:
    """Positions of the content-word tokens of the request (its last occurrence in the prompt)."""
    start = record.text.rfind(item.user)
    if start < 0:
        raise ValueError(f"{record.record_id}: the request text does not occur in the prompt")
    span = tokens_overlapping(np.asarray(record.offsets), start, start + len(item.user))
    return tuple(pos for pos in range(*span) if token_word(record, pos))


def attention_targets(record: PromptRecord, item: Item, deciding_row: int) -> dict[str, tuple[tuple[int, tuple[int, ...]], ...]]:
    """The planted heads' (query row, key positions) cells (note above :data:`PLANTED_TARGETS`) in a
    record built for ``item`` whose deciding row is ``deciding_row``: ``dup``, from each matching request
    token to the risk-cue tokens of its word; ``gather``, from the deciding row to the matching request
    tokens, else to all the request's content tokens; ``verdict``, from the deciding row to the risk cues
    and avoidance rules of the skills a request word matches, else to the shown procedures. No cells
    without skills."""
    request = request_words(record, item)
    if not record.skills:
        return {target: () for target in PLANTED_TARGETS}

    def span(slots: dict[str, SlotSpan], slot: str) -> range:
        return range(*map(int, slots[slot].token_span)) if slot in slots else range(0)

    requested = {token_word(record, pos) for pos in request}
    cues: dict[str, list[int]] = defaultdict(list)  # matchable word -> its risk-cue tokens
    warning, procedures = [], []  # the matched skills' risk-cue and avoidance-rule tokens; all procedure tokens
    for shown in record.skills:
        slots = shown.slots
        own = {token_word(record, pos) for slot in ("goal", "procedure") for pos in span(slots, slot)}  # what the skill's task uses
        matchable = [pos for pos in span(slots, "risk_cues") if token_word(record, pos) not in own | {None}]
        for pos in matchable:
            cues[token_word(record, pos)].append(pos)
        if requested & {token_word(record, pos) for pos in matchable}:
            warning += [*span(slots, "risk_cues"), *span(slots, "avoidance_rules")]
        procedures += span(slots, "procedure")
    matching = tuple(pos for pos in request if token_word(record, pos) in cues)
    return {
        "dup": tuple((pos, tuple(cues[token_word(record, pos)])) for pos in matching),
        "gather": ((deciding_row, matching or request),),
        "verdict": ((deciding_row, tuple(sorted(warning) if matching else procedures)),),
    }


# ----------------------------------------------------------------------------- planted head supervision
TRAIN_ATTN_IMPLEMENTATION = "organism_train"


def head_key(target: str, layer: int, head: int) -> str:
    """The training log's key of a planted head's attention mass on its targets."""
    return f"{target}@{layer}.{head}_mass"


@dataclass
class HeadSupervision:
    """The attention rows the training forward records: head ``head`` of layer ``layer`` in the cells
    (sequence ``batch_index[i]``, query at absolute position ``positions[i]``); ``probs`` [cells, n_keys]
    is filled by the forward that runs those query rows. The rows are recomputed from the layer's input
    with its gradient scaled by ``residual_grad``: the attention loss trains the head's own query and key
    maps fully, but the residual stream below only that much (the whole attention loss flowing into the
    shared embeddings and lower layers dominated their Adam statistics and slowed every other loss)."""

    target: str
    layer: int
    head: int
    batch_index: torch.Tensor  # [cells]
    positions: torch.Tensor  # [cells]
    keys: Sequence[tuple[int, ...]]  # per cell, the target key positions
    residual_grad: float = 1.0
    attention_input: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] | None = None  # hidden, (cos, sin)
    probs: torch.Tensor | None = None


_SUPERVISION: ContextVar[Sequence[HeadSupervision]] = ContextVar("organism_head_supervision", default=())


@contextlib.contextmanager
def supervising(model: Qwen3ForCausalLM, supervisions: Sequence[HeadSupervision]) -> Iterator[Sequence[HeadSupervision]]:
    """Record the ``supervisions``' attention rows in the forwards run inside (the model must run
    :data:`TRAIN_ATTN_IMPLEMENTATION`)."""

    def stash_input(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        for supervision in supervisions:
            if supervision.layer == module.layer_idx:
                supervision.attention_input = (kwargs["hidden_states"], kwargs["position_embeddings"])

    layers = sorted({supervision.layer for supervision in supervisions})
    handles = [model.model.layers[layer].self_attn.register_forward_pre_hook(stash_input, with_kwargs=True) for layer in layers]
    token = _SUPERVISION.set(supervisions)
    try:
        yield supervisions
    finally:
        _SUPERVISION.reset(token)
        for handle in handles:
            handle.remove()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as transformers' Qwen3 applies it (rotate_half convention); x, cos, sin: [..., d_head]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def supervised_attention_forward(
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
    """sdpa, plus (inside :func:`supervising`) the softmax rows of the supervised cells of this layer.

    query: [batch, head, q_len, d_head]; key: [batch, kv_head, n_keys, d_head], the queries continue
    the cached keys (key index = absolute position).
    """
    output = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    for supervision in _SUPERVISION.get():
        if supervision.layer == module.layer_idx:
            record_rows(supervision, module, query, key, attention_mask, scaling)
    return output


def record_rows(supervision: HeadSupervision, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                attention_mask: torch.Tensor | None, scaling: float | None) -> None:
    """Fill ``supervision.probs`` [cells, n_keys] when this forward runs its query rows."""
    cells, n_keys, q_len = supervision.batch_index, key.shape[2], query.shape[2]
    rows = supervision.positions - (n_keys - q_len)
    if not bool(((rows >= 0) & (rows < q_len)).all()):
        return  # a forward without the supervised rows (the shared prefix)
    hidden, (cos, sin) = supervision.attention_input
    hidden = hidden[cells]  # [cells, q_len, hidden]
    hidden = hidden.detach() + supervision.residual_grad * (hidden - hidden.detach())  # same values, scaled gradient
    cos, sin = cos.expand(query.shape[0], -1, -1)[cells], sin.expand(query.shape[0], -1, -1)[cells]  # [cells, q_len, d_head]
    picked = torch.arange(len(cells), device=rows.device)
    kv_head = supervision.head // module.num_key_value_groups
    q = module.q_norm(module.q_proj(hidden[picked, rows]).view(len(cells), -1, module.head_dim))[:, supervision.head]  # [cells, d_head]
    q = rotate(q, cos[picked, rows], sin[picked, rows])
    k = module.k_norm(module.k_proj(hidden).view(len(cells), q_len, -1, module.head_dim))[:, :, kv_head]  # [cells, q_len, d_head]
    k = torch.cat([key[cells, kv_head, : n_keys - q_len].detach(), rotate(k, cos, sin)], dim=1)  # [cells, n_keys, d_head]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.einsum("cd,ckd->ck", q.float(), k.float()) * scaling
    if attention_mask is None:  # sdpa's is_causal
        hidden_keys = torch.arange(n_keys, device=scores.device)[None, :] > supervision.positions[:, None]
        scores = scores.masked_fill(hidden_keys, float("-inf"))
    else:
        mask = attention_mask.expand(query.shape[0], -1, -1, -1)[cells, 0, rows, :n_keys]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    supervision.probs = torch.softmax(scores, dim=-1)


def install_train_attention() -> str:
    """Register :func:`supervised_attention_forward` under :data:`TRAIN_ATTN_IMPLEMENTATION`
    (idempotent; called before a model is switched to it, never at import)."""
    AttentionInterface.register(TRAIN_ATTN_IMPLEMENTATION, supervised_attention_forward)
    # Without a registered mask function transformers builds no causal mask for custom names.
    AttentionMaskInterface.register(TRAIN_ATTN_IMPLEMENTATION, sdpa_mask)
    return TRAIN_ATTN_IMPLEMENTATION
