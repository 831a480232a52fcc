"""``paired`` (Fig. 12): the equal-token paired status of BASM vs procedure padding, strict and lenient.

It reuses the greedy generations of :mod:`probes.analyses.calls` (a matching ``calls.jsonl`` in the
same results folder) and generates only what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probes.analyses import register
from probes.analyses.base import Analysis, RunContext, option
from probes.analyses.calls import (
    MAX_NEW_TOKENS,
    PAIRED_NAME,
    PAIRED_STATUSES,
    PairedSummary,
    collect_paired,
    paired_claims,
    paired_figure,
    paired_section,
    summarise_paired,
)
from probes.scoring.claims import Claim


@register("paired", order=80)
@dataclass(kw_only=True)
class Paired(Analysis):
    """Fig. 12: paired outcome status of BASM vs procedure padding, strict and lenient (reuses the calls results)."""

    k_max: int | None = option(4, "largest retrieval depth K", type=int, minimum=0, group="probe")
    max_new_tokens: int = option(MAX_NEW_TOKENS, "greedy generation budget", type=int, minimum=1, group="generation")
    calls: str | Path | None = option(None, "calls results file to reuse (default: OUT/<model>/calls.jsonl when it matches this run)",
                                      type=Path)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        return collect_paired(ctx)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> PairedSummary:
        return summarise_paired(ctx, rows)

    def tables(self, summary: PairedSummary) -> dict[str, pd.DataFrame]:
        return {f"{PAIRED_NAME}_summary": summary.table}

    def figures(self, summary: PairedSummary, out_dir: Path) -> list[Path]:
        return paired_figure(summary, out_dir)

    def section(self, ctx: RunContext, summary: PairedSummary, figures: list[Path]) -> Any:
        return paired_section(ctx, summary, figures)

    def claims(self, summary: PairedSummary) -> list[Claim]:
        return paired_claims(summary)

    def print_summary(self, summary: PairedSummary) -> None:
        print(summary.how)
        print(summary.table[["mode", "format", "k", "bucket", "n", *PAIRED_STATUSES, "solve_difference", "p_value"]].to_string(index=False))
