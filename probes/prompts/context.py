"""Which items' prompts fit a model's context, and which are skipped with the reason (never
dropped silently: analyses record and print the skipped ones, see the ``too_long`` option)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from probes.data.dataset import Item
from probes.prompts.builder import PromptBuilder
from probes.prompts.record import PromptRecord


@dataclass(frozen=True)
class SkippedItem:
    item_id: str
    reason: str


@dataclass(frozen=True)
class ContextPartition:
    """Items that fit a model's context and those that do not (with the measured length or error)."""

    kept: tuple[Item, ...]
    skipped: tuple[SkippedItem, ...]
    max_tokens: int


def partition_by_context(
    builder: PromptBuilder, items: Iterable[Item], *, max_tokens: int, k: int, configs: Sequence[str] = ("proc", "app", "basm"), fmt: str = "native"
) -> ContextPartition:
    """Split ``items`` into those whose longest prompt fits ``max_tokens`` and those skipped.

    ``builder`` is a :class:`probes.prompts.builder.PromptBuilder` (it carries the tokenizer and the
    retriever that decides which skills a prompt holds). Each item's prompt is built for every
    configuration in ``configs`` at depth ``k``; its length is the maximum, plus the longest
    scored candidate continuation (the engine scores candidates after the prompt). An item whose
    prompt cannot be built is skipped with the builder's error as the reason.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    kept: list[Item] = []
    skipped: list[SkippedItem] = []
    for item in items:
        try:
            records = [builder.build(item, config, k, fmt) for config in configs]
        except ValueError as error:
            skipped.append(SkippedItem(item.id, f"prompt cannot be built: {error}"))
            continue
        length = max(_needed_length(record) for record in records)
        if length > max_tokens:
            skipped.append(SkippedItem(item.id, f"{length} tokens > {max_tokens} (k={k}, {fmt})"))
        else:
            kept.append(item)
    return ContextPartition(tuple(kept), tuple(skipped), max_tokens)


def _needed_length(record: PromptRecord) -> int:
    """The lengths the engine checks against the context (``ProbeSession.run``): the prompt and,
    per candidate, its anchor index + its token count."""
    extents = [candidate.anchor_index + len(candidate.token_ids) for candidate in record.candidates]
    return max([record.n_tokens, *extents])
