"""Shared-prefix key/value reuse across prompts for :class:`probes.engine.session.EngineSession`.

The prompts of one item under different configurations and depths share a long token prefix (the
system turn with the tool catalog, then the first skills of the memory block). ``EngineSession.run``
computes the keys and values of ``input_ids[:p]`` (``p`` = the first query row) in fast-path
forwards and branches every condition from them; rows before ``p`` are never recorded and never
knocked out (a knockout edits query rows only), so their keys and values depend on the tokens
alone. This module keeps them per token prefix: a new prompt starts from the longest cached prefix
it shares and computes only the rest.

Bit for bit: a prefix is always computed in the same blocks, each one forward over the keys and
values of the blocks before it, whether they come from the cache or not. Where a block ends is a
function of the prefix's own tokens up to that point (:func:`prefix_blocks`, content-defined: before
a blank line or a chat turn's marker once the block holds :data:`BREAK_BLOCK` tokens, before a line
break once it holds :data:`LINE_BLOCK`, at :data:`MAX_BLOCK` tokens whatever they are; the last block
ends at the prefix). A block of an earlier prompt is reused only where it is one of the new prefix's
own blocks (:func:`reusable`), so the numbers of a row never depend on what the cache held: a run
resumed with a cold cache, or run with the cache off, equals an uninterrupted one exactly (a matrix
product's last bits depend on how many rows it multiplies at once). Content-defined ends put block
ends where the prompts of an item part (between skills, between turns), so prompts that diverge
inside the memory block share whole blocks up to a few tokens before the divergence.

A block's keys and values are written into per-layer buffers of the whole prefix
(:class:`PrefixBuffers`), and the block attends over a view of the positions before its end: no
concatenation per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

# layer index -> (key, value), each [1, kv_head, n_tokens, d_head] after RoPE, on the layer's device
LayerKV = dict[int, tuple[torch.Tensor, torch.Tensor]]

# Where blocks end (measured on the real-size sweep item, benchmarks/README.md: fewer prefix tokens
# computed against more, smaller blocks, each of which reads every weight once).
BREAK_BLOCK = 48    # a block ends before a blank line or a special token (a chat turn's marker) once it holds this many tokens,
LINE_BLOCK = 512    # before any other line break once it holds this many,
MAX_BLOCK = 1024    # and at this many whatever the tokens are (text without line breaks still shares blocks)

PLAIN, LINE_BREAK, BREAK = 0, 1, 2  # token kinds (:class:`TokenBreaks`)


class TokenBreaks:
    """Which tokens of a prompt break a line (their text holds a newline) and which open a blank line
    (their text holds two, or a newline follows a token ending in one) or are the tokenizer's special
    tokens (a chat turn's markers): read from ``tokenizer`` one distinct id at a time, as prompts show
    them (decoding a whole 150k vocabulary would take seconds), and kept. Without a tokenizer (a
    session opened on a loaded model without one) no token breaks a line and blocks end every
    :data:`MAX_BLOCK` tokens."""

    # per token id, what its text holds (bits): decided once per id, so a prompt's kinds are array lookups
    _DOUBLE, _STARTS, _ENDS, _NEWLINE = 1, 2, 4, 8

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._bits = np.zeros(0, dtype=np.uint8)
        self._known = np.zeros(0, dtype=bool)
        self._special = frozenset(getattr(tokenizer, "all_special_ids", ()))

    def _bits_of(self, ids: np.ndarray) -> np.ndarray:
        if len(ids) and ids.max() >= len(self._bits):
            grow = int(ids.max()) + 1 - len(self._bits)
            self._bits = np.concatenate([self._bits, np.zeros(grow, np.uint8)])
            self._known = np.concatenate([self._known, np.zeros(grow, bool)])
        new = np.unique(ids[~self._known[ids]])
        for token, text in zip(new.tolist(), self.tokenizer.batch_decode([[i] for i in new.tolist()])):
            self._bits[token] = ((self._DOUBLE if "\n\n" in text or token in self._special else 0) | (self._STARTS if text.startswith("\n") else 0)
                                 | (self._ENDS if text.endswith("\n") else 0) | (self._NEWLINE if "\n" in text else 0))
        self._known[new] = True
        return self._bits[ids]

    def kinds(self, ids: Sequence[int]) -> np.ndarray:
        """Per position of ``ids``: :data:`PLAIN`, :data:`LINE_BREAK` or :data:`BREAK`; position ``i``
        depends on ``ids[i-1]`` and ``ids[i]`` only."""
        if self.tokenizer is None or not len(ids):
            return np.full(len(ids), PLAIN, dtype=np.int8)
        bits = self._bits_of(np.asarray(ids, dtype=np.int64))
        after_newline = np.concatenate([[False], (bits[:-1] & self._ENDS) > 0])
        opens_blank = ((bits & self._DOUBLE) > 0) | (((bits & self._STARTS) > 0) & after_newline)
        return np.where(opens_blank, BREAK, np.where((bits & self._NEWLINE) > 0, LINE_BREAK, PLAIN)).astype(np.int8)


def prefix_blocks(kinds: np.ndarray) -> list[tuple[int, int]]:
    """The blocks ``[a, b)`` that compute a prefix whose tokens have these ``kinds`` (:meth:`TokenBreaks.kinds`).
    A block ends at ``b`` when ``b`` is a :data:`BREAK` and the block holds at least :data:`BREAK_BLOCK`
    tokens, a :data:`LINE_BREAK` and it holds :data:`LINE_BLOCK`, or it holds :data:`MAX_BLOCK`; the
    last block ends at the prefix's end. An end depends on the tokens up to it only, so a prefix's
    blocks are the blocks of any longer prefix that end inside it, then its own last one."""
    out, start, n = [], 0, len(kinds)
    for b in (np.flatnonzero(kinds[1:] != PLAIN) + 1).tolist():  # only where a break can end a block, and at MAX_BLOCK
        while start + MAX_BLOCK < b:
            out.append((start, start + MAX_BLOCK))
            start += MAX_BLOCK
        held = b - start
        if held >= MAX_BLOCK or (kinds[b] == BREAK and held >= BREAK_BLOCK) or (kinds[b] == LINE_BREAK and held >= LINE_BLOCK):
            out.append((start, b))
            start = b
    while start + MAX_BLOCK < n:
        out.append((start, start + MAX_BLOCK))
        start += MAX_BLOCK
    if n:
        out.append((start, n))
    return out


@dataclass
class PrefixReuseCounter:
    """Prompt tokens of ``EngineSession.run`` calls: reused from the cache vs run through the model.

    ``tokens_computed`` counts each prompt position once (prefix extension plus the branch rows
    from the first query row on), not once per condition or candidate branch element;
    ``prefix_blocks`` counts the prefix blocks computed (a forward each, which reads every weight once).
    """

    prompts: int = 0
    tokens_reused: int = 0
    tokens_computed: int = 0
    prefix_blocks: int = 0

    @property
    def fraction_reused(self) -> float:
        total = self.tokens_reused + self.tokens_computed
        return self.tokens_reused / total if total else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "fraction_reused": self.fraction_reused}

    def __str__(self) -> str:
        return (f"prefix reuse: {self.tokens_reused} of {self.tokens_reused + self.tokens_computed} prompt tokens "
                f"({self.fraction_reused:.1%}) reused over {self.prompts} prompts")


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differs = np.flatnonzero(a[:n] != b[:n])
    return int(differs[0]) if len(differs) else n


@dataclass(frozen=True)
class Segment:
    """Keys and values of the token positions ``[start, start + length)`` of a prefix."""

    start: int
    kv: LayerKV

    @property
    def length(self) -> int:
        return next(iter(self.kv.values()))[0].shape[2] if self.kv else 0


def join(segments: Sequence[Segment]) -> LayerKV:
    """One [1, kv_head, n, d_head] key and value tensor per layer from consecutive segments."""
    if len(segments) == 1:
        return dict(segments[0].kv)
    return {layer: (torch.cat([s.kv[layer][0] for s in segments], dim=2), torch.cat([s.kv[layer][1] for s in segments], dim=2))
            for layer in segments[0].kv}


def reusable(segments: Sequence[Segment], shared: int, own: Sequence[tuple[int, int]]) -> tuple[Segment, ...]:
    """The leading ``segments`` (blocks of a cached prefix sharing its first ``shared`` tokens with a
    new prefix) that are blocks of the new prefix too: among its ``own`` blocks (:func:`prefix_blocks`)
    and inside the shared part (the whole of a last partial block only when the prefixes are the same)."""
    own_set, used = set(own), []
    for segment in segments:
        end = segment.start + segment.length
        if end > shared or (segment.start, end) not in own_set:
            break
        used.append(segment)
    return tuple(used)


class PrefixBuffers:
    """Per-layer key/value buffers ``[1, kv_head, n, d_head]`` of one prefix of ``n`` tokens, filled
    block by block: :meth:`write` puts a block's keys and values at their positions and returns views
    of positions ``[0, end)`` for the block to attend over, so no block concatenates the keys before
    it. A layer's buffer is allocated at its first block (on the layer's device, in its dtype) with the
    ``reused`` segments copied in."""

    def __init__(self, n: int, reused: Sequence[Segment]) -> None:
        self.n, self.reused = n, tuple(reused)
        self.kv: LayerKV = {}

    def write(self, layer: int, start: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer not in self.kv:
            self.kv[layer] = tuple(torch.empty(*t.shape[:2], self.n, t.shape[3], dtype=t.dtype, device=t.device) for t in (key, value))
            for segment in self.reused:
                for buffer, cached in zip(self.kv[layer], segment.kv[layer]):
                    buffer[:, :, segment.start: segment.start + segment.length] = cached
        end = start + key.shape[2]
        k, v = self.kv[layer]
        k[:, :, start:end] = key
        v[:, :, start:end] = value
        return k[:, :, :end], v[:, :, :end]

    def computed(self, blocks: Sequence[tuple[int, int]]) -> tuple[Segment, ...]:
        """The computed ``blocks`` as cache segments: views of one copy of the computed positions per
        layer, so the cache keeps each prefix's own tokens only (the reused ones stay in the earlier
        entries' tensors)."""
        if not blocks:
            return ()
        first = blocks[0][0]
        copies = {layer: (k[:, :, first:].clone(), v[:, :, first:].clone()) for layer, (k, v) in self.kv.items()}
        return tuple(Segment(a, {layer: (k[:, :, a - first: b - first], v[:, :, a - first: b - first]) for layer, (k, v) in copies.items()})
                     for a, b in blocks)


class PrefixKVCache:
    """A least-recently-used store of (token prefix -> keys and values of its positions).

    An entry is a chain of segments: the part reused from an earlier entry (views of that entry's
    tensors) and the part computed for it, so prefixes shared by several entries are held once.
    ``max_entries`` bounds how many prefixes are kept; memory is about the distinct tokens among
    them (the system turn once, then each entry's own suffix), at 2 · layers · kv_heads · d_head
    values per token (Qwen3-8B in bf16: 144 KiB per token). ``max_entries = 0`` disables reuse.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 0:
            raise ValueError(f"prefix cache size must be >= 0, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[np.ndarray, tuple[Segment, ...]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, ids: Sequence[int], own: Sequence[tuple[int, int]]) -> tuple[int, tuple[Segment, ...]]:
        """(m, segments): the cached blocks that are blocks of the prefix ``ids`` itself (its ``own``
        blocks, :func:`prefix_blocks`; :func:`reusable`), covering ``ids[:m]``; (0, ()) when none is."""
        query = np.asarray(ids, dtype=np.int64)
        best, best_key, best_segments = 0, None, ()
        for key, (tokens, segments) in self._entries.items():
            used = reusable(segments, common_prefix_length(tokens, query), own)
            m = used[-1].start + used[-1].length if used else 0
            if m > best:
                best, best_key, best_segments = m, key, used
        if best_key is not None:
            self._entries.move_to_end(best_key)
        return best, best_segments

    def store(self, ids: Sequence[int], segments: Sequence[Segment]) -> None:
        if self.max_entries == 0 or not len(ids):
            return
        if sum(s.length for s in segments) != len(ids) or any(a.start + a.length != b.start for a, b in zip(segments, segments[1:])):
            raise ValueError("the segments must cover the prefix's positions in order")
        tokens = np.asarray(ids, dtype=np.int64)
        key = tokens.tobytes()
        self._entries[key] = (tokens, tuple(segments))
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def held_tokens(self) -> int:
        """Token positions whose keys/values the cache keeps alive (shared storage counted once)."""
        storages: dict[int, int] = {}
        for _tokens, segments in self._entries.values():
            for segment in segments:
                key = next(iter(segment.kv.values()))[0]
                storages[key.untyped_storage().data_ptr()] = key.untyped_storage().nbytes() // (key.element_size() * key.shape[1] * key.shape[3])
        return sum(storages.values())

    def clear(self) -> None:
        self._entries.clear()
