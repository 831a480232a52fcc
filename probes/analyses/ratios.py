"""``ratios`` (Figs. 3a and 4): boundary vs procedure attention at the decision token.

For every record, Eq. 2's length-normalised span attention α_X^{(l,h)} = (1/|X|) Σ_{i∈X} A_{q,i}
is measured for the boundary span B and the procedure span P, per (layer, head), at the
*deciding row* q (the row that predicts the first token where the correct tool's name parts from
a wrong one: the decision row d_t, or a row of their shared name prefix such as after ``get``)
and, in the native format, at the row that opens the tool call (a second, named row; the
``row`` column of the summary). ``--attention-row`` picks the row of the figure. In the
equal-length controls B is the control text that occupies the boundary positions.

Per-head ratios η^{(l,h)} = α_B / (α_P + ε) explode by orders of magnitude on heads whose
procedure attention is near zero, so they are never averaged. Two robust aggregates are reported:

- **η (ratio of means)**: mean α_B / (mean α_P + ε), means over items, layers and heads;
  95% CI by resampling task groups jointly for numerator and denominator;
- **median per-head log2 ratio**: α averaged over items per (layer, head), then the median over
  heads of log2((α_B + ε) / (α_P + ε)); 95% CI by resampling task groups.

ε = :data:`probes.analyses.base.EPSILON` (1e-6), stated in every output.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from probes.reporting import plots
from probes.analyses import paper
from probes.analyses.base import Analysis, Comparison, Job, ReportSection, RunContext, cached_scorer, option, provenance, run_jobs
from probes.reporting.markdown import cell, markdown_table
from probes.scoring.score import ATTENTION_ROWS, EPSILON
from probes.scoring.stats import bootstrap_ratio, cluster_bootstrap
from probes.data.configs import CONFIGS, CONTROL_CONFIGS
from probes.reporting.results import load_results

NAME = "ratios"
FIGURE = "fig04_boundary_attention"
DEFAULT_CONFIGS = ("basm", *CONTROL_CONFIGS)


@dataclass
class RatiosSummary:
    eta: pd.DataFrame  # row, bucket, config, eta, eta_low, eta_high, log2_median, log2_low, log2_high, n, n_items
    heads: pd.DataFrame  # row, bucket, config, layer, head, alpha_boundary, alpha_procedure, log2_ratio
    note: str


def depth(options: Any) -> int:
    return options.k if options.k is not None else options.k_max


def collect(analysis: RunContext) -> pd.DataFrame:
    a = analysis.options
    k = depth(a)
    jobs = [Job(item, config, k, analysis.fmt, ("baseline",)) for item in analysis.items for config in a.configs]
    store = analysis.store(configs=a.configs, k=k)
    scorer = cached_scorer(analysis, lambda record, job: (), per_head=True, margins=())
    run_jobs(analysis, store, jobs, scorer)
    return load_results(store.path)


def head_alphas(rows: pd.DataFrame, span: str, row: str = "deciding") -> np.ndarray:
    """[item, layer, head] α of ``span`` at ``row`` from the per-head row columns."""
    return np.array(rows[alpha_column(span, row, heads=True)].tolist(), dtype=float)


def alpha_column(span: str, row: str = "deciding", *, heads: bool = False) -> str:
    """The results column of α_span at the deciding row or the open row."""
    if row not in ATTENTION_ROWS:
        raise ValueError(f"attention row must be one of {ATTENTION_ROWS}, got {row!r}")
    return f"alpha_{span}{'_open' if row == 'open' else ''}{'_heads' if heads else ''}"


def median_log2(alpha_b: np.ndarray, alpha_p: np.ndarray, epsilon: float = EPSILON) -> float:
    """alpha_*: [item, layer, head] -> median over heads of log2 of the item-averaged ratio."""
    return float(np.median(np.log2((alpha_b.mean(0) + epsilon) / (alpha_p.mean(0) + epsilon))))


def _median_ci(alpha_b: np.ndarray, alpha_p: np.ndarray, groups: np.ndarray, seed: int, resamples: int = 1000) -> tuple[float, float]:
    return cluster_bootstrap(lambda idx: median_log2(alpha_b[idx], alpha_p[idx]), groups, resamples=resamples, seed=seed)


def summarise_rows(rows: pd.DataFrame, note: str = "", seed: int = 0) -> RatiosSummary:
    rows = rows[(rows["boundary_size"] > 0) & (rows["procedure_size"] > 0)]
    eta, heads = [], []
    attention_rows = [r for r in ATTENTION_ROWS if alpha_column("boundary", r) in rows.columns]
    for row in attention_rows:
        for (bucket, config), sub in rows.groupby(["bucket", "config"], sort=False):
            if not sub[alpha_column("boundary", row)].notna().any():
                continue
            groups = sub["task_group"].to_numpy()
            value, low, high, n = bootstrap_ratio(sub[alpha_column("boundary", row)], sub[alpha_column("procedure", row)], groups,
                                                  epsilon=EPSILON, seed=seed)
            a_b, a_p = head_alphas(sub, "boundary", row), head_alphas(sub, "procedure", row)
            l_low, l_high = _median_ci(a_b, a_p, groups, seed)
            eta.append({"row": row, "bucket": bucket, "config": config, "eta": value, "eta_low": low, "eta_high": high,
                        "log2_median": median_log2(a_b, a_p), "log2_low": l_low, "log2_high": l_high, "n": n, "n_items": len(sub)})
            mean_b, mean_p = a_b.mean(0), a_p.mean(0)
            for layer in range(mean_b.shape[0]):
                for head in range(mean_b.shape[1]):
                    heads.append({"row": row, "bucket": bucket, "config": config, "layer": layer, "head": head,
                                  "alpha_boundary": mean_b[layer, head], "alpha_procedure": mean_p[layer, head],
                                  "log2_ratio": float(np.log2((mean_b[layer, head] + EPSILON) / (mean_p[layer, head] + EPSILON)))})
    return RatiosSummary(pd.DataFrame(eta), pd.DataFrame(heads), note)


def aggregate_note(options: Any) -> str:
    return (f"query row: {options.attention_row} · k = {depth(options)} · η = ratio of mean span attentions (not a mean of per-head ratios), "
            f"ε = {EPSILON:g} · right: median over (layer, head) of log2 of item-averaged α · 95% CIs resample task groups")


def figure(summary: RatiosSummary, out_dir: Path, row: str = "deciding") -> list[Path]:
    plots.style()
    return plots.save_figure(plots.fig04_boundary_attention(summary.eta[summary.eta["row"] == row], summary.note), out_dir, FIGURE)


def section(analysis: RunContext, summary: RatiosSummary, paths: list[Path]) -> ReportSection:
    note = aggregate_note(analysis.options)
    e = summary.eta
    table = e[["row", "bucket", "config", "eta", "eta_low", "eta_high", "log2_median", "n", "n_items"]]
    body = f"{note}.\n\n{markdown_table(table)}"
    comparisons = [Comparison(f"Fig. 3a: η at the deciding row, BASM, {b}", cell(e, "eta", row="deciding", bucket=b, config="basm"), p, "ratio")
                   for b, p in paper.FIG3A_ETA.items()]
    return ReportSection(NAME, "Figs. 3a/4 — boundary vs procedure attention (`ratios`)", paths, body, comparisons, summary)


@dataclass(kw_only=True)
class Ratios(Analysis):
    """Figs. 3a/4: length-normalised boundary/procedure attention ratio η per bucket and configuration."""

    name: ClassVar[str] = NAME
    help: ClassVar[str] = "Figs. 3a/4: length-normalised boundary/procedure attention ratio η per bucket and configuration."

    configs: tuple[str, ...] = option(DEFAULT_CONFIGS, f"configurations with a boundary (or control) span (default: {','.join(DEFAULT_CONFIGS)})",
                                      names=tuple(CONFIGS))
    k: int | None = option(None, "retrieval depth (default: k_max)", type=int, minimum=0, group="probe")
    attention_row: str = option("deciding", "query row of the figure: the deciding row (the decision row, or the row after a shared "
                                "name prefix) or the native row that opens the tool call; the summary has both", choices=ATTENTION_ROWS)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        return collect(ctx)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> RatiosSummary:
        return summarise_rows(rows, f"{provenance(ctx)}\n{aggregate_note(ctx.options)}", ctx.options.seed)

    def tables(self, summary: RatiosSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.eta, f"{NAME}_heads": summary.heads}

    def figures(self, summary: RatiosSummary, out_dir: Path) -> list[Path]:
        return figure(summary, out_dir, self.attention_row)

    def section(self, ctx: RunContext, summary: RatiosSummary, figures: list[Path]) -> ReportSection:
        return section(ctx, summary, figures)

    def print_summary(self, summary: RatiosSummary) -> None:
        print(summary.eta.round(3).to_string(index=False))
        print(aggregate_note(self))
