"""``suppression`` (Figs. 3b and 5): T_wrong margins for Proc. Skill, the equal-length padding
controls and BASM at one retrieval depth.

Two measures per configuration, mean with a 95% bootstrap CI over task groups: the wrong-tool
margin (Eq. 1 on the tool choice by default) and the broader tool-vs-control margin (every
catalog tool other than the correct one against the correct tool). Both panels and every
configuration use the same items: those where both measures are defined under every
configuration (items whose correct action is abstention have no correct tool); the items left
out are counted (``n_dropped``).
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
from probes.reporting.results import load_results, write_csv

NAME = "suppression"
FIGURE = "fig05_suppression"
DEFAULT_CONFIGS = ("proc", "pad-filler", "pad-procedure", "basm")
MEASURES = ("margin", "broad_margin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, k_max=2, buckets=("T_wrong",))
    parser.add_argument("--configs", type=configs_arg, default=list(DEFAULT_CONFIGS),
                        help=f"configurations (default: {','.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--k", type=int, help="retrieval depth (default: --k-max)")


@dataclass
class SuppressionSummary:
    table: pd.DataFrame  # measure, config, value, low, high, n, n_items, n_nan
    note: str


def collect(analysis: Analysis) -> pd.DataFrame:
    a = analysis.args
    k = a.k if a.k is not None else a.k_max
    jobs = [Job(item, config, k, analysis.fmt, ("baseline",)) for item in analysis.items for config in a.configs]
    store = analysis.store(configs=a.configs, k=k)
    run_jobs(analysis, store, jobs, cached_scorer(analysis, lambda record, job: (), margins=MEASURES))
    return load_results(store.path)


def paired_items(rows: pd.DataFrame, measures=MEASURES) -> pd.Series:
    """Per item: whether every measure is finite under every configuration."""
    finite = np.isfinite(rows[list(measures)].to_numpy(float)).all(axis=1)
    return pd.Series(finite, index=rows.index).groupby(rows["item_id"]).all()


def summarise_rows(rows: pd.DataFrame, note: str = "", seed: int = 0) -> SuppressionSummary:
    rows = rows[rows["bucket"] == "T_wrong"]
    keep = paired_items(rows)
    dropped = int((~keep).sum())
    rows = rows[rows["item_id"].map(keep)]
    table = pd.concat([summarise(rows, ["config"], measure, seed=seed).assign(measure=measure, n_dropped=dropped) for measure in MEASURES])
    return SuppressionSummary(table[["measure", *[c for c in table.columns if c != "measure"]]], note)


def figure(summary: SuppressionSummary, out_dir: Path) -> list[Path]:
    plots.style()
    return plots.save_figure(plots.fig05_suppression(summary.table, summary.note), out_dir, FIGURE)


def write_tables(summary: SuppressionSummary, out_dir: Path) -> None:
    """The summary tables of this analysis, next to its results file."""
    write_csv(summary.table, out_dir / f"{NAME}_summary.csv")


def run(args: argparse.Namespace) -> int:
    analysis = open_analysis(args, NAME)
    note = f"{provenance(analysis)}\nT_wrong items only · mean ± 95% bootstrap CI over task groups"
    summary = summarise_rows(collect(analysis), note, analysis.args.seed)
    write_tables(summary, analysis.out_dir)
    print(summary.table.round(3).to_string(index=False))
    if analysis.args.figure:
        print("figure:", ", ".join(map(str, figure(summary, analysis.out_dir / "figures"))))
    return 0


def report_section(analysis: Analysis, figures_dir: Path) -> ReportSection:
    note = f"{provenance(analysis)}\nT_wrong items only · mean ± 95% bootstrap CI over task groups"
    summary = summarise_rows(collect(analysis), note, analysis.args.seed)
    paths = figure(summary, figures_dir)
    write_tables(summary, analysis.out_dir)
    t = summary.table
    body = (f"T_wrong margins (logits; `margin` is {analysis.variant}, Eq. 1 on the tool choice by default); CIs over task groups; "
            f"every cell on the same items ({int(t['n_dropped'].iloc[0]) if len(t) else 0} items without a defined margin left out, "
            f"e.g. abstention as the correct action).\n\n{markdown_table(t)}")
    comparisons = [Comparison(f"Fig. 5: wrong-tool margin, {plots.label(c)}", cell(t, measure="margin", config=c), p)
                   for c, p in (("proc", 10.71), ("pad-filler", 6.60), ("pad-procedure", 5.14), ("basm", 2.26))]
    comparisons += [Comparison(f"Fig. 5: tool-vs-control margin, {plots.label(c)}", cell(t, measure="broad_margin", config=c), p)
                    for c, p in (("proc", 14.24), ("basm", 5.20))]
    return ReportSection(NAME, "Figs. 3b/5 — wrong-tool suppression (`suppression`)", paths, body, comparisons, summary)
