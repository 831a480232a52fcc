"""What an import wrote and everything it left out, with reasons (:class:`ImportReport`): printed by
``basm-probes bfcl-import`` and stated in the dataset's README."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.data.bfcl.audit import DroppedItem
from probes.data.bfcl.items import SkippedPoint
from probes.data.dataset import BUCKETS
from probes.data.extract_llm import Extraction

@dataclass
class ImportReport:
    """What :func:`~probes.data.bfcl.import_bfcl` wrote and everything it left out, with reasons."""

    out: Path
    categories: tuple[str, ...]
    skill_indices: list[int]
    probe_indices: list[int]
    items: Counter  # (category, bucket) → count
    skipped: list[SkippedPoint]
    candidates: dict[str, int]  # domain → candidate skills
    kept: dict[str, list[str]]  # domain → kept skill ids
    rejected: dict[str, list[str]]  # skill id → ψ's problems
    unanchored: list[str]  # tools with boundary evidence but no successful use (no candidate)
    invalid_arguments: list[str]  # item ids whose correct arguments violate the tool schema
    skill_fraction: float  # the import's settings, as given
    seed: int
    max_probe_entries: int | None
    source_files: str  # the category files read, comma-separated
    data_version: str  # content hash of the BFCL files
    tools: dict[str, int]  # domain → tools
    sizes: dict[str, int] = field(default_factory=dict)  # file → bytes
    extractor: str = "deterministic"
    extraction: Extraction | None = None  # the LLM extractor's kept skills, rejections and replies
    llm_settings: dict[str, Any] = field(default_factory=dict)  # model, max_new_tokens, batch_size, retries
    audited: list[dict[str, Any]] = field(default_factory=list)  # item rows the label audit kept or relabelled
    dropped: list[DroppedItem] = field(default_factory=list)  # T_wrong items the label audit removed
    pairs: int = 0  # matched T_wrong/T_ok pairs
    unmatched: list[SkippedPoint] = field(default_factory=list)  # T_wrong items with no matched T_ok

    def skipped_counts(self) -> Counter:
        return Counter(point.reason for point in self.skipped)

    def summary(self) -> str:
        lines = [f"{sum(self.items.values())} items written to {self.out}"]
        for category in self.categories:
            lines.append(f"  {category}: " + ", ".join(f"{b} {self.items[(category, b)]}" for b in BUCKETS))
        lines.append(f"skills: {sum(len(v) for v in self.kept.values())} kept of {sum(self.candidates.values())} candidates "
                     f"({len(self.rejected)} {'rejected by ψ' if self.extraction is None else 'discarded'}); {len(self.unanchored)} tools with evidence but no successful use")
        if self.extraction is not None:
            lines.append(self.extraction.summary())
        for reason, count in sorted(self.skipped_counts().items()):
            lines.append(f"  skipped {count}: {reason}")
        actions = Counter(row["audit"][0]["action"] for row in self.audited)
        lines.append(f"label audit: {actions['kept']} kept, {actions['relabelled']} relabelled, {len(self.dropped)} dropped; "
                     f"matched pairs: {self.pairs}, T_wrong unmatched: {len(self.unmatched)}")
        return "\n".join(lines)


def counts_by_category(items: Iterable[Mapping[str, Any]]) -> Counter:
    """(category, bucket) counts of raw item rows (their ``source.entry`` names the category)."""
    return Counter((row["source"]["entry"].rsplit("_", 1)[0].removeprefix("multi_turn_"), row["bucket"]) for row in items)
