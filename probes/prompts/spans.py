"""Token spans of a prompt: character ranges mapped to tokens, and the round-trip check of a
record's slot spans (decode(tokens) against the slot text)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from probes.prompts.record import PromptRecord
    from transformers import PreTrainedTokenizerBase


def tokens_overlapping(offsets: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """Half-open token range of the tokens whose character offsets overlap [start, end).

    ``offsets`` is [n_tokens, 2] (start, end) in increasing order."""
    lo = int(np.searchsorted(offsets[:, 1], start, side="right"))
    hi = int(np.searchsorted(offsets[:, 0], end, side="left"))
    return lo, max(lo, hi)


@dataclass
class SpanReport:
    """Round-trip check of every slot span: decode(tokens) vs the slot text."""

    exact: int = 0
    whitespace_edges: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.exact + self.whitespace_edges + len(self.mismatches)

    def summary(self) -> str:
        return (
            f"{self.total} spans: {self.exact} exact, {self.whitespace_edges} differ only by whitespace "
            f"merged at the span edges, {len(self.mismatches)} mismatches"
        )


def check_spans(record: PromptRecord, tokenizer: PreTrainedTokenizerBase, report: SpanReport) -> SpanReport:
    """Decode every slot's token span and compare it with the slot text."""
    ids = record.input_ids
    for skill in record.skills:
        for slot, span in skill.slots.items():
            lo, hi = span.token_span
            decoded = tokenizer.decode(ids[lo:hi])
            if decoded == span.text:
                report.exact += 1
            elif decoded.strip() == span.text.strip() and decoded.strip():
                report.whitespace_edges += 1
            else:
                report.mismatches.append(f"{record.record_id} rank {skill.rank} {slot}: {decoded!r} != {span.text!r}")
    return report
