"""``sweep`` (Fig. 2): the retrieval trap.

Wrong-tool margin against retrieval depth k = 0..K for Base, Proc. Skill, App. Skill and BASM
(plus the equal-length controls with ``--controls``), per bucket; mean with a 95% bootstrap CI
over task groups. The headline is Eq. 1 on the tool choice (``--margin-variant tool_choice``):
wrong tools vs the correct tool where their names diverge. Items whose correct action is
abstention have no correct tool; they are counted (``n_nan``) and left out of the mean, and their
abstention decision is in the rows (``call_logodds``). At k = 0 every configuration renders the same prompt, so
their margins must coincide; the run checks the prompts (token ids) and the margins and reports
the largest spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from probes.analyses import paper
from probes.analyses.base import Analysis, Comparison, Job, ReportSection, RunContext, cached_scorer, option, provenance, run_jobs
from probes.data.configs import CONFIGS, CONTROL_CONFIGS, PAPER_CONFIGS, PRIMING_CONFIGS
from probes.reporting import plots
from probes.reporting.markdown import cell, markdown_table
from probes.reporting.results import load_results
from probes.scoring.stats import summarise

NAME = "sweep"
FIGURE = "fig02_retrieval_trap"


@dataclass
class SweepSummary:
    table: pd.DataFrame  # bucket, config, k, value, low, high, n, n_items, n_nan
    k0_prompts_identical: bool
    k0_max_spread: float  # largest |margin difference| between configurations at k = 0 (logits)
    note: str
    variant: str = "tool_choice"
    n_abstain_items: int = 0  # items without a correct tool (no tool-choice margin)


def configs_of(options: Any) -> list[str]:
    return list(dict.fromkeys([*options.configs, *(CONTROL_CONFIGS if options.controls else ()),
                               *(PRIMING_CONFIGS if options.priming else ())]))


def collect(analysis: RunContext) -> pd.DataFrame:
    configs = configs_of(analysis.options)
    jobs = [Job(item, config, k, analysis.fmt, ("baseline",))
            for item in analysis.items for k in range(analysis.options.k_max + 1) for config in configs]
    store = analysis.store(configs=configs)
    run_jobs(analysis, store, jobs, cached_scorer(analysis, lambda record, job: (), margins=("margin",)))
    return load_results(store.path)


def summarise_rows(rows: pd.DataFrame, note: str = "", variant: str = "tool_choice") -> SweepSummary:
    table = summarise(rows, ["bucket", "config", "k"])
    n_abstain = int(rows.loc[rows["correct_is_abstain"].astype(bool), "item_id"].nunique())
    k0 = rows[rows["k"] == 0]
    identical = bool((k0.groupby("item_id")["prompt_digest"].nunique() <= 1).all())
    spread = k0.groupby("item_id")["margin"].agg(lambda s: float(np.nanmax(s) - np.nanmin(s)) if s.notna().any() else 0.0)
    return SweepSummary(table, identical, float(spread.max()) if len(spread) else float("nan"), note, variant, n_abstain)


def figure(summary: SweepSummary, out_dir: Path) -> list[Path]:
    plots.style()
    k0 = "identical prompts" if summary.k0_prompts_identical else "PROMPTS DIFFER"
    note = (f"{summary.note}\nmean ± 95% bootstrap CI over task groups · "
            f"k = 0: {k0} across configurations, max margin spread {summary.k0_max_spread:.2g} logits · "
            f"{summary.n_abstain_items} items whose correct action is abstention left out (no correct tool)")
    return plots.save_figure(plots.fig02_retrieval_trap(summary.table, note, summary.variant), out_dir, FIGURE)


def print_summary(summary: SweepSummary) -> None:
    pivot = summary.table.pivot_table(index=["bucket", "config"], columns="k", values="value", sort=False)
    print(pivot.round(2).to_string())
    print(f"k = 0 coincidence: prompts identical across configurations: {summary.k0_prompts_identical}; "
          f"max margin spread {summary.k0_max_spread:.3g} logits")
    print(f"margin: {plots.MARGIN_LABELS[summary.variant]}; {summary.n_abstain_items} items whose correct action is abstention "
          "are left out of it (their call log-odds are in the rows)")


def section(analysis: RunContext, summary: SweepSummary, paths: list[Path]) -> ReportSection:
    t = summary.table
    pivot = t.pivot_table(index=["bucket", "config"], columns="k", values="value", sort=False).reset_index()
    pivot.columns = [str(c) if not isinstance(c, int) else f"k={c}" for c in pivot.columns]
    body = (f"{plots.MARGIN_LABELS[analysis.variant]} by bucket, configuration and k; mean of task-group means, "
            f"95% CIs over task groups in `{NAME}_summary.csv`. {summary.n_abstain_items} items whose correct action is "
            f"abstention are left out (no correct tool).\n\n{markdown_table(pivot)}\n\n"
            f"k = 0 check: prompts identical across configurations: **{summary.k0_prompts_identical}**; "
            f"largest margin spread between configurations at k = 0: {summary.k0_max_spread:.3g} logits.")
    comparisons = [
        Comparison("Fig. 2: margin at k = 0, T_wrong (configs coincide)", cell(t, bucket="T_wrong", config="base", k=0), paper.FIG2["k0"]),
        Comparison("Fig. 2: Proc. Skill at k = 2, T_wrong", cell(t, bucket="T_wrong", config="proc", k=2), paper.FIG2["proc_k2"]),
        Comparison("Fig. 2: BASM at k = 2, T_wrong", cell(t, bucket="T_wrong", config="basm", k=2), paper.FIG2["basm_k2"]),
    ]
    return ReportSection(NAME, "Fig. 2 — retrieval trap (`sweep`)", paths, body, comparisons, summary)


@dataclass(kw_only=True)
class Sweep(Analysis):
    """Fig. 2: wrong-tool margin against retrieval depth k = 0..K per memory configuration."""

    name: ClassVar[str] = NAME
    help: ClassVar[str] = "Fig. 2: wrong-tool margin against retrieval depth k per memory configuration."

    k_max: int | None = option(4, "largest retrieval depth K", type=int, minimum=0, group="probe")
    buckets: tuple[str, ...] | None = option(("T_wrong",), "keep only these buckets (Fig. 2 is T_wrong)", flag="--bucket",
                                             repeat=True, choices=("T_ok", "T_wrong", "T_repair"), group="items")
    configs: tuple[str, ...] = option(PAPER_CONFIGS, f"comma-separated memory configurations (default: {','.join(PAPER_CONFIGS)})",
                                      names=tuple(CONFIGS))
    controls: bool = option(False, f"add the equal-length controls ({', '.join(CONTROL_CONFIGS)})", type=bool)
    priming: bool = option(False, f"add the lexical-priming controls ({', '.join(PRIMING_CONFIGS)}): tool names in the boundary "
                           "fields anonymised, or only the names kept", type=bool)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        return collect(ctx)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> SweepSummary:
        return summarise_rows(rows, provenance(ctx), ctx.variant)

    def tables(self, summary: SweepSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.table}

    def figures(self, summary: SweepSummary, out_dir: Path) -> list[Path]:
        return figure(summary, out_dir)

    def section(self, ctx: RunContext, summary: SweepSummary, figures: list[Path]) -> ReportSection:
        return section(ctx, summary, figures)

    def print_summary(self, summary: SweepSummary) -> None:
        print_summary(summary)

    def status(self, summary: SweepSummary) -> int:
        return 0 if summary.k0_prompts_identical else 1
