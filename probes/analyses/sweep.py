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

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from probes.reporting import plots
from probes.analyses.base import (
    Analysis,
    Comparison,
    Job,
    ReportSection,
    add_common_arguments,
    cached_scorer,
    cell,
    configs_arg,
    markdown_table,
    open_analysis,
    provenance,
    run_jobs,
    summarise,
)
from probes.data.configs import CONTROL_CONFIGS, PAPER_CONFIGS
from probes.reporting.results import load_results, write_csv

NAME = "sweep"
FIGURE = "fig02_retrieval_trap"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, k_max=4, buckets=("T_wrong",))  # Fig. 2 is T_wrong; --bucket adds others
    parser.add_argument("--configs", type=configs_arg, default=list(PAPER_CONFIGS),
                        help=f"comma-separated memory configurations (default: {','.join(PAPER_CONFIGS)})")
    parser.add_argument("--controls", action="store_true", help=f"add the equal-length controls ({', '.join(CONTROL_CONFIGS)})")


@dataclass
class SweepSummary:
    table: pd.DataFrame  # bucket, config, k, value, low, high, n, n_items, n_nan
    k0_prompts_identical: bool
    k0_max_spread: float  # largest |margin difference| between configurations at k = 0 (logits)
    note: str
    variant: str = "tool_choice"
    n_abstain_items: int = 0  # items without a correct tool (no tool-choice margin)


def configs_of(args: argparse.Namespace) -> list[str]:
    return list(dict.fromkeys([*args.configs, *(CONTROL_CONFIGS if args.controls else ())]))


def collect(analysis: Analysis) -> pd.DataFrame:
    configs = configs_of(analysis.args)
    jobs = [Job(item, config, k, analysis.fmt, ("baseline",))
            for item in analysis.items for k in range(analysis.args.k_max + 1) for config in configs]
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


def write_tables(summary: SweepSummary, out_dir: Path) -> None:
    """The summary tables of this analysis, next to its results file."""
    write_csv(summary.table, out_dir / f"{NAME}_summary.csv")


def run(args: argparse.Namespace) -> int:
    analysis = open_analysis(args, NAME)
    rows = collect(analysis)
    summary = summarise_rows(rows, provenance(analysis), analysis.variant)
    write_tables(summary, analysis.out_dir)
    print_summary(summary)
    if analysis.args.figure:
        print("figure:", ", ".join(map(str, figure(summary, analysis.out_dir / "figures"))))
    return 0 if summary.k0_prompts_identical else 1


def report_section(analysis: Analysis, figures_dir: Path) -> ReportSection:
    summary = summarise_rows(collect(analysis), provenance(analysis), analysis.variant)
    paths = figure(summary, figures_dir)
    write_tables(summary, analysis.out_dir)
    t = summary.table
    pivot = t.pivot_table(index=["bucket", "config"], columns="k", values="value", sort=False).reset_index()
    pivot.columns = [str(c) if not isinstance(c, int) else f"k={c}" for c in pivot.columns]
    body = (f"{plots.MARGIN_LABELS[analysis.variant]} by bucket, configuration and k; mean of task-group means, "
            f"95% CIs over task groups in `{NAME}_summary.csv`. {summary.n_abstain_items} items whose correct action is "
            f"abstention are left out (no correct tool).\n\n{markdown_table(pivot)}\n\n"
            f"k = 0 check: prompts identical across configurations: **{summary.k0_prompts_identical}**; "
            f"largest margin spread between configurations at k = 0: {summary.k0_max_spread:.3g} logits.")
    comparisons = [
        Comparison("Fig. 2: margin at k = 0, T_wrong (configs coincide)", cell(t, bucket="T_wrong", config="base", k=0), 7.31),
        Comparison("Fig. 2: Proc. Skill at k = 2, T_wrong", cell(t, bucket="T_wrong", config="proc", k=2), 10.71),
        Comparison("Fig. 2: BASM at k = 2, T_wrong", cell(t, bucket="T_wrong", config="basm", k=2), 2.26),
    ]
    return ReportSection(NAME, "Fig. 2 — retrieval trap (`sweep`)", paths, body, comparisons, summary)
