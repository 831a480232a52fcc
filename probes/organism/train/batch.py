"""One training batch of the organism: its forward pass and its loss.

The sequences of a batch share their system prompt: :func:`shared_prefix_hidden` runs the common
prefix once and continues it for every sequence (also used by :mod:`probes.organism.heldout`).
Isolation (:func:`isolation_mask`, :func:`relay_rows`) hides the tool-naming skill slots and the tool
list from the relay rows of the flagged examples. :func:`batch_loss` is the action loss, the auxiliary
next-token loss and the planted heads' attention loss.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import torch
from transformers import Qwen3ForCausalLM

from probes.organism.train.examples import Example
from probes.organism.train.supervision import TRAIN_ATTN_IMPLEMENTATION, HeadSupervision, head_key, supervising

def relay_rows(ex: Example, n: int) -> torch.Tensor:
    """[n] bool: the rows that isolation stops from reading the isolated blocks: every row
    before the open row and the forced-prefix rows between the open and the decision row, except
    the isolated tokens themselves. The query rows (open, decision) and the action keep reading them."""
    rows = torch.arange(n)
    relay = (rows < ex.key_rows[0]) | ((rows > ex.key_rows[0]) & (rows < ex.key_rows[-1]))
    for start, end in ex.isolated_blocks:
        relay[start:end] = False
    return relay


def isolation_mask(batch: Sequence[Example], isolate: Sequence[bool], prefix: int, width: int) -> torch.Tensor | None:
    """Additive 4D mask [batch, 1, width, prefix + width] for the suffix rows: causal, and for the
    examples flagged in ``isolate`` the relay rows (:func:`relay_rows`) cannot attend to the isolated
    blocks, nor any row up to the decision row to the tool list (``Example.tool_list``). ``None``
    when no example is isolated (plain causal attention)."""
    if not any(isolate):
        return None
    total = prefix + width
    keys = torch.arange(total)
    rows = keys[prefix:]  # the suffix rows' positions
    allowed = (keys.unsqueeze(0) <= rows.unsqueeze(1)).expand(len(batch), width, total).clone()
    for b, (ex, flag) in enumerate(zip(batch, isolate)):
        if not flag:
            continue
        hidden = torch.zeros(total, dtype=torch.bool)
        for start, end in ex.isolated_blocks:
            if start < prefix:
                raise RuntimeError(f"{ex.record_id}: isolated span starts inside the shared prefix")
            hidden[start:end] = True
        relay = relay_rows(ex, total)[prefix:]
        allowed[b] &= ~(relay.unsqueeze(1) & hidden.unsqueeze(0))
        if ex.tool_list is not None:
            tool_list = (keys >= ex.tool_list[0]) & (keys < ex.tool_list[1])
            upto_decision = rows <= ex.key_rows[-1]
            allowed[b] &= ~(upto_decision.unsqueeze(1) & tool_list.unsqueeze(0))
    mask = torch.zeros(allowed.shape, dtype=torch.float32)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask.unsqueeze(1)


def max_shared_prefix(batch: Sequence[Example], isolate: Sequence[bool]) -> int:
    """Longest prefix a batch may share: up to the first target row, and never into an isolated
    example's isolated span (the shared prefix runs with plain causal attention)."""
    return min([ex.target_from for ex in batch] + [min(start for start, _ in ex.isolated_blocks) for ex, flag in zip(batch, isolate) if flag])


def shared_prefix_hidden(
    model: Qwen3ForCausalLM,
    sequences: Sequence[Sequence[int]],
    max_prefix: int,
    *,
    prefix_grad: bool = True,
    suffix_mask: Callable[[int, int], torch.Tensor | None] | None = None,
) -> tuple[torch.Tensor, int]:
    """Final hidden states of a batch whose sequences share a token prefix.

    The common prefix (≤ ``max_prefix``) runs once; its KV cache is broadcast over the batch and
    the right-padded suffixes continue it. Causal attention makes right padding invisible to the
    real rows. Returns ([batch, max_suffix_len, hidden], prefix length). With ``prefix_grad`` false
    the prefix runs without autograd (its KV are exact for the current weights, but get no gradient).
    ``suffix_mask(prefix, width)`` may return an additive 4D mask for the suffix rows over all keys.
    """
    first = sequences[0]
    prefix = min(max_prefix, min(len(s) for s in sequences) - 1)
    for seq in sequences[1:]:
        limit = prefix
        prefix = 0
        while prefix < limit and seq[prefix] == first[prefix]:
            prefix += 1
    batch = len(sequences)
    width = max(len(s) for s in sequences) - prefix
    pad = model.config.pad_token_id or 0
    device = model.device
    suffix = torch.full((batch, width), pad, dtype=torch.long)
    for row, seq in enumerate(sequences):
        suffix[row, : len(seq) - prefix] = torch.tensor(seq[prefix:], dtype=torch.long)
    suffix = suffix.to(device)
    positions = torch.arange(prefix, prefix + width, device=device).unsqueeze(0).expand(batch, -1)
    mask = suffix_mask(prefix, width) if suffix_mask is not None else None
    mask = mask.to(device) if mask is not None else None
    if prefix == 0:
        return model.model(input_ids=suffix, position_ids=positions, attention_mask=mask, use_cache=False).last_hidden_state, 0
    with torch.set_grad_enabled(prefix_grad and torch.is_grad_enabled()):
        cache = model.model(input_ids=torch.tensor([first[:prefix]], device=device), use_cache=True).past_key_values
    for layer in cache.layers:
        layer.keys = layer.keys.expand(batch, -1, -1, -1)
        layer.values = layer.values.expand(batch, -1, -1, -1)
    hidden = model.model(input_ids=suffix, position_ids=positions, cache=cache, attention_mask=mask, use_cache=False).last_hidden_state
    return hidden, prefix


def batch_loss(
    model: Qwen3ForCausalLM,
    batch: Sequence[Example],
    key_weight: float,
    prefix_grad: bool = True,
    *,
    aux_weight: float = 0.0,
    aux_rows: int = 0,
    rng: random.Random | None = None,
    priority_targets: frozenset[int] = frozenset(),
    isolate: Sequence[bool] | None = None,
    planted_heads: Sequence[tuple[str, int, int]] = (),
    planted_head_weight: float = 0.0,
    planted_head_residual_grad: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted cross-entropy on the action tokens (key rows × ``key_weight``), plus ``aux_weight`` ×
    the mean next-token loss on rows of the prompt text after the shared prefix (memory block,
    request, history: a stand-in for pretraining): every row whose next token is in
    ``priority_targets`` (the tool names), plus a deterministic sample of the others, ``aux_rows`` in all;
    plus ``planted_head_weight`` × each planted head's attention loss: −log of its attention mass on its
    targets, mean over its cells (query rows, :func:`~probes.organism.train.supervision.attention_targets`).
    ``isolate``: per example, whether boundary isolation (:func:`isolation_mask`) applies.
    The model must run :data:`TRAIN_ATTN_IMPLEMENTATION` when ``planted_head_weight`` > 0."""
    flags = list(isolate) if isolate is not None else [False] * len(batch)
    supervisions = []
    for target, layer, head in planted_heads if planted_head_weight > 0 else ():
        cells = [(b, row, keys) for b, ex in enumerate(batch) for row, keys in ex.attention_targets.get(target, ()) if keys]
        if cells:
            supervisions.append(HeadSupervision(target, layer, head, torch.tensor([b for b, _, _ in cells], device=model.device),
                                                torch.tensor([row for _, row, _ in cells], device=model.device),
                                                [keys for *_, keys in cells], planted_head_residual_grad))
    with supervising(model, supervisions):
        hidden, prefix = shared_prefix_hidden(
            model, [ex.input_ids for ex in batch], max_shared_prefix(batch, flags), prefix_grad=prefix_grad,
            suffix_mask=lambda prefix, width: isolation_mask(batch, flags, prefix, width),
        )
    rows, cols, targets, weights, kinds = [], [], [], [], []  # kind: 0 action, 1 open row, 2 name row, 3 aux
    for b, ex in enumerate(batch):
        for pos in range(ex.target_from, ex.target_until):
            rows.append(b)
            cols.append(pos - prefix)
            targets.append(ex.input_ids[pos + 1])
            is_key = pos in ex.key_rows
            weights.append(key_weight if is_key else 1.0)
            kinds.append(0 if not is_key else (1 if pos == ex.target_from else 2))
        if aux_weight > 0 and aux_rows > 0:
            ids = ex.input_ids
            first = [p for p in range(prefix, ex.target_from) if ids[p + 1] in priority_targets]
            others = [p for p in range(prefix, ex.target_from) if ids[p + 1] not in priority_targets]
            room = max(0, aux_rows - len(first))
            chosen = sorted(first + (rng.sample(others, min(room, len(others))) if rng else others[:room]))
            for pos in chosen:
                rows.append(b)
                cols.append(pos - prefix)
                targets.append(ex.input_ids[pos + 1])
                weights.append(0.0)
                kinds.append(3)
    device = hidden.device
    row_index = torch.tensor(rows, device=device)  # [n_rows] each row's sequence in the batch
    logits = model.lm_head(hidden[row_index, torch.tensor(cols, device=device)]).float()
    target = torch.tensor(targets, device=device)
    weight = torch.tensor(weights, device=device)
    kind = torch.tensor(kinds, device=device)
    losses = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    action = kind < 3
    loss = (losses[action] * weight[action]).sum() / weight[action].sum()
    stats: dict[str, float] = {"action_loss": loss.item()}
    if (kind == 3).any():
        aux = losses[kind == 3].mean()
        stats["aux_loss"] = aux.item()
        loss = loss + aux_weight * aux
    stats.update({head_key(*planted): math.nan for planted in planted_heads})
    for supervision in supervisions:
        if supervision.probs is None:
            raise RuntimeError(f"layer {supervision.layer} recorded no attention: the model does not run {TRAIN_ATTN_IMPLEMENTATION!r}")
        on_target = torch.zeros_like(supervision.probs, dtype=torch.bool)
        for cell, keys in enumerate(supervision.keys):
            on_target[cell, list(keys)] = True
        mass = (supervision.probs * on_target).sum(-1)  # [cells]
        stats[head_key(supervision.target, supervision.layer, supervision.head)] = mass.mean().item()
        loss = loss + planted_head_weight * -torch.log(mass + 1e-6).mean()
    with torch.no_grad():
        key = (kind == 1) | (kind == 2)
        edited_names = (kind == 2) & torch.tensor([ex.edit is not None for ex in batch], device=device)[row_index]  # edited twins' name rows
        correct = logits.argmax(-1) == target
        stats.update({
            "loss": loss.item(), "key_loss": losses[key].mean().item(),
            "open_acc": correct[kind == 1].float().mean().item(),
            "name_acc": correct[kind == 2].float().mean().item() if (kind == 2).any() else float("nan"),
            "edited_name_acc": correct[edited_names].float().mean().item() if edited_names.any() else float("nan"),
        })
    return loss, stats
