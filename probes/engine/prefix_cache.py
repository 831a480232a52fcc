"""Shared-prefix key/value reuse across prompts for :class:`probes.engine.session.EngineSession`.

The prompts of one item under different configurations and depths share a long token prefix (the
system turn with the tool catalog, then the first skills of the memory block). ``EngineSession.run``
computes the keys and values of ``input_ids[:p]`` (``p`` = the first query row) in one fast-path
forward and branches every condition from them; rows before ``p`` are never recorded and never
knocked out (a knockout edits query rows only), so their keys and values depend on the tokens
alone. This module keeps them per token prefix: a new prompt starts from the longest cached prefix
it shares and computes only the rest.

Bit for bit: a prefix is always computed in the same blocks, ``[0, B), [B, 2B), ...`` and a last
partial block ending at the prefix (:data:`PREFIX_BLOCK` = B tokens), each one forward over the
keys and values of the blocks before it, whether they come from the cache or not. A block of an
earlier prompt is reused only where it is one of the new prefix's own blocks (:func:`reusable`), so
the numbers of a row never depend on what the cache held: a run resumed with a cold cache, or run
with the cache off, equals an uninterrupted one exactly (a matrix product's last bits depend on how
many rows it multiplies at once).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

# layer index -> (key, value), each [1, kv_head, n_tokens, d_head] after RoPE, on the layer's device
LayerKV = dict[int, tuple[torch.Tensor, torch.Tensor]]

PREFIX_BLOCK = 128  # tokens per prefix block: small enough to reuse most of a shared prefix, large enough for efficient forwards


def blocks(start: int, end: int, block: int = PREFIX_BLOCK) -> list[tuple[int, int]]:
    """The blocks ``[a, b)`` that compute positions ``start..end-1`` of a prefix ending at ``end``
    (``start`` a block boundary): full blocks, then the partial one ending at ``end``."""
    if start < end and start % block:
        raise ValueError(f"a prefix block starts at a multiple of {block}, not at {start}")
    return [(a, min(a + block, end)) for a in range(start, end, block)]


@dataclass
class PrefixReuseCounter:
    """Prompt tokens of ``EngineSession.run`` calls: reused from the cache vs run through the model.

    ``tokens_computed`` counts each prompt position once (prefix extension plus the branch rows
    from the first query row on), not once per condition or candidate branch element.
    """

    prompts: int = 0
    tokens_reused: int = 0
    tokens_computed: int = 0

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


def reusable(segments: Sequence[Segment], shared: int, n: int, block: int = PREFIX_BLOCK) -> tuple[Segment, ...]:
    """The leading ``segments`` (blocks of a cached prefix sharing its first ``shared`` tokens with a
    prefix of ``n`` tokens) that are blocks of that prefix too: full blocks inside the shared part,
    and a last partial block only when the two prefixes are the same."""
    used = []
    for segment in segments:
        end = segment.start + segment.length
        if end > shared or (segment.length != block and end != n):
            break
        used.append(segment)
    return tuple(used)


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

    def longest(self, ids: Sequence[int], block: int = PREFIX_BLOCK) -> tuple[int, tuple[Segment, ...]]:
        """(m, segments): the cached blocks that are blocks of the prefix ``ids`` itself (:func:`reusable`),
        covering ``ids[:m]``; (0, ()) when none is."""
        query = np.asarray(ids, dtype=np.int64)
        best, best_key, best_segments = 0, None, ()
        for key, (tokens, segments) in self._entries.items():
            used = reusable(segments, common_prefix_length(tokens, query), len(query), block)
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
