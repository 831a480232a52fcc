"""``suppression`` (Figs. 3b and 5): T_wrong margins for Proc. Skill, the equal-length padding
controls and BASM at one retrieval depth.

Two measures per configuration, mean with a 95% bootstrap CI over task groups: the wrong-tool
margin (Eq. 1 restricted to the tools by default) and the broader tool-vs-control margin (every
catalog tool other than the correct one against the correct tool). Both panels and every
configuration use the same items: those where both measures are defined under every
configuration (items whose correct action is abstention have no correct tool); the items left
out are counted (``n_dropped``).

The claim is a difference on the same items: BASM's margin below Proc. Skill's and below each
padding control's, per item, mean over task groups with a 95% CI (``suppression_differences.csv``,
the right-hand panel of Fig. 5) and a one-sided sign-flip test over task groups
(:meth:`Suppression.claims`; Holm over the family).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probes.analyses import register
from probes.analyses.base import Analysis, Comparison, ReportSection
from probes.analyses.jobs import Job, cached_scorer, run_jobs
from probes.analyses.option_system import depth_option, option
from probes.analyses.run_context import RunContext, provenance
from probes.data.configs import CONFIGS, PRIMING_CONFIGS
from probes.reporting import plots
from probes.reporting.markdown import cell, markdown_table
from probes.reporting.results import load_results
from probes.scoring.claims import Claim, effect_claim
from probes.scoring.stats import paired_differences, summarise

NAME = "suppression"
FIGURE = "fig05_suppression"
DEFAULT_CONFIGS = ("proc", "pad-filler", "pad-procedure", "basm")
MEASURES = ("margin", "broad_margin")
CONTRASTS = {"BASM − Proc. Skill": ("basm", "proc"), "BASM − pad-filler": ("basm", "pad-filler"),
             "BASM − pad-procedure": ("basm", "pad-procedure")}


@dataclass
class SuppressionSummary:
    table: pd.DataFrame  # measure, config, value, low, high, n, n_items, n_nan
    note: str
    differences: pd.DataFrame | None = None  # measure, contrast, value, low, high, n, n_items, n_nan, note
    per_item: pd.DataFrame | None = None  # measure, item_id, task_group, contrast, delta


def paired_items(rows: pd.DataFrame, measures=MEASURES) -> pd.Series:
    """Per item: whether every measure is finite under every configuration."""
    finite = np.isfinite(rows[list(measures)].to_numpy(float)).all(axis=1)
    return pd.Series(finite, index=rows.index).groupby(rows["item_id"]).all()


@register("suppression", order=30)
@dataclass(kw_only=True)
class Suppression(Analysis):
    """Fig. 5: T_wrong wrong-tool and tool-vs-control margins for Proc. Skill, padding controls and BASM."""

    buckets: tuple[str, ...] | None = option(("T_wrong",), "keep only these buckets (Fig. 5 is T_wrong)", flag="--bucket",
                                             repeat=True, choices=("T_ok", "T_wrong", "T_repair"), group="items")
    configs: tuple[str, ...] = option(DEFAULT_CONFIGS, f"configurations (default: {','.join(DEFAULT_CONFIGS)})", names=tuple(CONFIGS), minimum=1)
    k: int | None = depth_option()
    priming: bool = option(False, f"add the lexical-priming controls ({', '.join(PRIMING_CONFIGS)})", type=bool)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        k = ctx.options.depth
        configs = list(dict.fromkeys([*self.configs, *(PRIMING_CONFIGS if self.priming else ())]))
        jobs = [Job(item, config, k, ctx.fmt, ("baseline",)) for item in ctx.items for config in configs]
        store = ctx.store(configs=configs, k=k)
        run_jobs(ctx, store, jobs, cached_scorer(ctx, lambda record, job: (), margins=MEASURES))
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> SuppressionSummary:
        seed = ctx.options.seed
        rows = rows[rows["bucket"] == "T_wrong"]
        keep = paired_items(rows)
        dropped = int((~keep).sum())
        rows = rows[rows["item_id"].map(keep)]
        table = pd.concat([summarise(rows, ["config"], measure, seed=seed).assign(measure=measure, n_dropped=dropped) for measure in MEASURES])
        per_item = pd.concat([paired_differences(rows, CONTRASTS, pair=["item_id", "task_group"], value=measure).assign(measure=measure)
                              for measure in MEASURES], ignore_index=True)
        differences = summarise(per_item, ["measure", "contrast"], "delta", seed=seed)
        note = f"{provenance(ctx)}\nT_wrong items only · mean ± 95% bootstrap CI over task groups"
        return SuppressionSummary(table[["measure", *[c for c in table.columns if c != "measure"]]], note, differences, per_item)

    def tables(self, summary: SuppressionSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.table, f"{NAME}_differences": summary.differences}

    def claims(self, summary: SuppressionSummary) -> list[Claim]:
        """BASM's T_wrong margins below Proc. Skill's and each padding control's, per item; family "suppression"."""
        per = summary.per_item
        out = []
        for (measure, contrast), sub in ([] if per is None else per.groupby(["measure", "contrast"], sort=False)):
            a, b = CONTRASTS[contrast]
            out.append(effect_claim(NAME, f"{contrast} ({measure})", f"on T_wrong the BASM {plots.MEASURE_LABELS[measure]} is below "
                                    f"{plots.label(b)}'s (paired by item)", sub["delta"], sub["task_group"], alternative="less",
                                    seed=self.seed))
        return out

    def figures(self, summary: SuppressionSummary, out_dir: Path) -> list[Path]:
        plots.style()
        return plots.save_figure(fig05_suppression(summary.table, summary.note, differences=summary.differences), out_dir, FIGURE)

    def section(self, ctx: RunContext, summary: SuppressionSummary, figures: list[Path]) -> ReportSection:
        t = summary.table
        body = (f"T_wrong margins (logits; `margin` is {ctx.variant}, Eq. 1 restricted to the tools by default); CIs over task groups; "
                f"every cell on the same items ({int(t['n_dropped'].iloc[0]) if len(t) else 0} items without a defined margin left out, "
                f"e.g. abstention as the correct action).\n\n{markdown_table(t)}\n\n"
                f"The claim is a difference on the same items (`{NAME}_differences.csv`):\n\n"
                f"{markdown_table(summary.differences[['measure', 'contrast', 'value', 'low', 'high', 'n', 'n_items', 'note']])}")
        comparisons = [Comparison(f"Fig. 5: wrong-tool margin, {plots.label(c)}", cell(t, measure="margin", config=c), p)
                       for c, p in PAPER_FIG5_MARGIN.items()]
        comparisons += [Comparison(f"Fig. 5: tool-vs-control margin, {plots.label(c)}", cell(t, measure="broad_margin", config=c), p)
                        for c, p in PAPER_FIG5_BROAD.items()]
        return ReportSection(NAME, "Figs. 3b/5 — wrong-tool suppression (`suppression`)", figures, body, comparisons, summary)


# The BASM paper's numbers that the report sets next to ours (Qwen3-8B, logits): Fig. 5, the T_wrong
# margins per configuration at k = 2.
PAPER_FIG5_MARGIN = {"proc": 10.71, "pad-filler": 6.60, "pad-procedure": 5.14, "basm": 2.26}
PAPER_FIG5_BROAD = {"proc": 14.24, "basm": 5.20}


# --- Fig. 5, drawn by Suppression.figures (its margin bars also draw Fig. 3b in probes.analyses.report)
def margin_bars(ax: plt.Axes, table: pd.DataFrame, column: str, ylabel: str) -> None:
    """One bar per configuration (T_wrong), with CI. table: config, measure, value, low, high, n."""
    sub = table[table["measure"] == column]
    configs = plots.ordered(sub["config"], ("proc", "pad-filler", "pad-procedure", "basm"))
    sub = sub.assign(group="all")
    plots.grouped_bars(ax, sub, ["all"], configs, group_col="group", series_col="config", group_label=lambda g: "")
    ax.set_xticks([])
    ax.set_ylabel(ylabel)


def fig05_suppression(table: pd.DataFrame, note: str, *, differences: pd.DataFrame | None = None) -> plt.Figure:
    """T_wrong margins per configuration (two panels) and, with ``differences``, the paired
    differences BASM − each other configuration (the claims) per measure.

    table: config, measure, value, low, high, n; differences: measure, contrast, value, low, high, n, n_items.
    """
    with_diff = differences is not None and len(differences)
    fig, axes = plt.subplots(1, 3 if with_diff else 2, figsize=(14.5 if with_diff else 9.5, 3.9), squeeze=False)
    axes = axes[0]
    margin_bars(axes[0], table, "margin", "wrong-tool margin (logits)")
    margin_bars(axes[1], table, "broad_margin", "tool-vs-control margin (logits)")
    n = int(table["n"].max()) if len(table) else 0
    items = int(table["n_items"].max()) if "n_items" in table and len(table) else 0
    axes[0].set_title(f"{plots.bucket_label('T_wrong')}: wrong-tool margin")
    axes[1].set_title(f"{plots.bucket_label('T_wrong')}: tool-vs-control margin")
    plots.legend_outside(axes[1])
    if with_diff:
        contrasts = list(dict.fromkeys(differences["contrast"]))
        palette = dict(zip(contrasts, (plots.CONFIG_COLORS["proc"], plots.CONFIG_COLORS["pad-filler"], plots.CONFIG_COLORS["pad-procedure"])))
        plots.grouped_bars(axes[2], differences, plots.ordered(differences["measure"], ("margin", "broad_margin")), contrasts,
                           group_col="measure", series_col="contrast", series_label=lambda c: c, series_color=lambda c: palette.get(c, "0.5"),
                           group_label=lambda m: plots.SHORT_MEASURE_LABELS[m])
        axes[2].set_ylabel("paired difference (logits)")
        axes[2].set_title("the claims, paired by item")
        axes[2].legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=8)
    fig.suptitle(f"Boundary fields suppress the wrong tool beyond equal-length controls (n = {n} task groups, {items} items)")
    plots.footnote(fig, note)
    return fig
