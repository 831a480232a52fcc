"""``sweep`` (Fig. 2): the retrieval trap.

Wrong-tool margin against retrieval depth k = 0..K for Base, Proc. Skill, App. Skill and BASM
(plus the equal-length controls with ``--controls``), per bucket; mean with a 95% bootstrap CI
over task groups. The headline is Eq. 1 restricted to the tools (``--margin-variant tool_choice``):
wrong tools vs the correct tool where their names diverge. Items whose correct action is
abstention have no correct tool; they are counted (``n_nan``) and left out of the mean, and their
abstention decision is in the rows (``call_logodds``). At k = 0 every configuration renders the same prompt, so
their margins must coincide; the run checks the prompts (token ids) and the margins and reports
the largest spread.

The paper's claims are differences, so they are estimated as differences on the same items:
the **trap** m_Proc(k) − m_Base(k) and the **suppression** m_BASM(k) − m_Proc(k), per item, then
the mean over task groups with a 95% bootstrap CI (``sweep_differences.csv``, the right-hand
panel of Fig. 2) and, on T_wrong at every k ≥ 1, a one-sided sign-flip test over task groups
(:meth:`Sweep.claims`; Holm over the family).

Every table is also written split by whether the item's defining skill is among the k skills of
its depth (``sweep_shown.csv``, ``sweep_differences_shown.csv``: ``shown`` = all / shown / not
shown, the paper's setting being "shown"; k = 0 shows none), and the claims are repeated on the
shown items (family "sweep (defining skill shown)").
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path


import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probes.analyses import register
from probes.prompts.builder import SWEEP_K_MAX
from probes.analyses.base import Analysis, Comparison, ReportSection
from probes.analyses.jobs import Job, cached_scorer, run_jobs
from probes.analyses.option_system import k_max_option, option
from probes.analyses.run_context import RunContext, provenance
from probes.data.configs import CONFIGS, CONTROL_CONFIGS, PAPER_CONFIGS, PRIMING_CONFIGS
from probes.reporting import plots
from probes.reporting.markdown import cell, markdown_table
from probes.reporting.results import load_results
from probes.scoring.claims import Claim, effect_claim
from probes.scoring.stats import SHOWN_FLAG, by_shown, paired_differences, summarise

NAME = "sweep"
FIGURE = "fig02_retrieval_trap"
# name -> (a, b, the claimed sign of a − b on T_wrong)
CONTRASTS = {"trap": ("proc", "base", "greater"), "suppression": ("basm", "proc", "less")}
SHOWN_FAMILY = f"{NAME} (defining skill shown)"


@dataclass
class SweepSummary:
    table: pd.DataFrame  # bucket, config, k, value, low, high, n, n_items, n_nan
    k0_prompts_identical: bool
    k0_max_spread: float  # largest |margin difference| between configurations at k = 0 (logits)
    note: str
    variant: str
    n_abstain_items: int = 0  # items without a correct tool (no tool-choice margin)
    differences: pd.DataFrame | None = None  # bucket, contrast, k, value, low, high, n, n_items, n_nan, note
    per_item: pd.DataFrame | None = None  # bucket, item_id, task_group, k, tempting_shown, contrast, delta
    shown: pd.DataFrame | None = None  # shown (all | shown | not shown), then the columns of table
    differences_shown: pd.DataFrame | None = None  # shown, then the columns of differences


def shown_rows(differences_shown: pd.DataFrame) -> pd.DataFrame:
    """The split differences at k ≥ 1 (nothing is shown at k = 0), shown and not shown."""
    d = differences_shown
    return d[(d["k"] >= 1) & (d["shown"] != "all")][["shown", "bucket", "contrast", "k", "value", "low", "high", "n", "n_items", "note"]]


@register("sweep", order=10)
@dataclass(kw_only=True)
class Sweep(Analysis):
    """Fig. 2: wrong-tool margin against retrieval depth k = 0..K per memory configuration."""

    k_max: int | None = k_max_option(SWEEP_K_MAX)
    buckets: tuple[str, ...] | None = option(("T_wrong",), "keep only these buckets (Fig. 2 is T_wrong)", flag="--bucket",
                                             repeat=True, choices=("T_ok", "T_wrong", "T_repair"), group="items")
    configs: tuple[str, ...] = option(PAPER_CONFIGS, f"comma-separated memory configurations (default: {','.join(PAPER_CONFIGS)})",
                                      names=tuple(CONFIGS), minimum=1)
    controls: bool = option(False, f"add the equal-length controls ({', '.join(CONTROL_CONFIGS)})", type=bool)
    priming: bool = option(False, f"add the lexical-priming controls ({', '.join(PRIMING_CONFIGS)}): tool names in the boundary "
                           "fields anonymised, or only the names kept", type=bool)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        configs = list(dict.fromkeys([*self.configs, *(CONTROL_CONFIGS if self.controls else ()),
                                      *(PRIMING_CONFIGS if self.priming else ())]))
        jobs = [Job(item, config, k, ctx.fmt, ("baseline",))
                for item in ctx.items for k in range(ctx.options.k_max + 1) for config in configs]
        store = ctx.store(configs=configs)
        run_jobs(ctx, store, jobs, cached_scorer(ctx, lambda record, job: (), margins=("margin",)))
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> SweepSummary:
        seed = ctx.options.seed
        table = summarise(rows, ["bucket", "config", "k"], seed=seed)
        # the flag is the same for every configuration of an item at one depth, so it pairs like k
        per_item = paired_differences(rows, {name: (a, b) for name, (a, b, _) in CONTRASTS.items()},
                                      pair=["bucket", "item_id", "task_group", "k", SHOWN_FLAG])
        differences = summarise(per_item, ["bucket", "contrast", "k"], "delta", seed=seed)
        shown = summarise(by_shown(rows), ["shown", "bucket", "config", "k"], seed=seed)
        differences_shown = summarise(by_shown(per_item), ["shown", "bucket", "contrast", "k"], "delta", seed=seed)
        n_abstain = int(rows.loc[rows["correct_is_abstain"].astype(bool), "item_id"].nunique())
        k0 = rows[rows["k"] == 0]
        identical = bool((k0.groupby("item_id")["prompt_digest"].nunique() <= 1).all())
        spread = k0.groupby("item_id")["margin"].agg(lambda s: float(np.nanmax(s) - np.nanmin(s)) if s.notna().any() else 0.0)
        return SweepSummary(table, identical, float(spread.max()) if len(spread) else float("nan"), provenance(ctx), ctx.variant,
                            n_abstain, differences, per_item, shown, differences_shown)

    def tables(self, summary: SweepSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.table, f"{NAME}_differences": summary.differences, f"{NAME}_shown": summary.shown,
                f"{NAME}_differences_shown": summary.differences_shown}

    def claims(self, summary: SweepSummary) -> list[Claim]:
        """On T_wrong at every k ≥ 1: the trap (Proc. Skill above Base) and the suppression (BASM below
        Proc. Skill), per item, over task groups; family "sweep" on every item, and family
        "sweep (defining skill shown)" on the items whose defining skill is among the k shown."""
        per = summary.per_item
        if per is None or not len(per):
            return []
        out = []
        wrong = per[(per["bucket"] == "T_wrong") & (per["k"] >= 1)]
        for family, subset, which in ((NAME, wrong, ""), (SHOWN_FAMILY, wrong[wrong[SHOWN_FLAG].astype(bool)], " whose defining skill is shown")):
            for (contrast, k), sub in subset.groupby(["contrast", "k"], sort=True):
                a, b, alternative = CONTRASTS[contrast]
                sub = sub[np.isfinite(sub["delta"].to_numpy(float))]
                words = "above" if alternative == "greater" else "below"
                out.append(effect_claim(family, f"{contrast} k={k}", f"on the T_wrong items{which} at k = {k} the {plots.label(a)} margin "
                                        f"is {words} {plots.label(b)} (paired by item)", sub["delta"], sub["task_group"],
                                        alternative=alternative, seed=self.seed))
        return out

    def figures(self, summary: SweepSummary, out_dir: Path) -> list[Path]:
        plots.style()
        k0 = "identical prompts" if summary.k0_prompts_identical else "PROMPTS DIFFER"
        note = (f"{summary.note}\nmean ± 95% bootstrap CI over task groups · "
                f"k = 0: {k0} across configurations, max margin spread {summary.k0_max_spread:.2g} logits · "
                f"{summary.n_abstain_items} item{'' if summary.n_abstain_items == 1 else 's'} whose correct action is abstention "
                "left out (no correct tool)")
        return plots.save_figure(fig02_retrieval_trap(summary.table, note, summary.variant, differences=summary.differences),
                                 out_dir, FIGURE)

    def section(self, ctx: RunContext, summary: SweepSummary, figures: list[Path]) -> ReportSection:
        t = summary.table
        pivot = t.pivot_table(index=["bucket", "config"], columns="k", values="value", sort=False).reset_index()
        pivot.columns = [str(c) if not isinstance(c, int) else f"k={c}" for c in pivot.columns]
        body = (f"{plots.MARGIN_LABELS[ctx.variant]} by bucket, configuration and k; mean of task-group means, "
                f"95% CIs over task groups in `{NAME}_summary.csv`. {summary.n_abstain_items} items whose correct action is "
                f"abstention are left out (no correct tool).\n\n{markdown_table(pivot)}\n\n"
                f"k = 0 check: prompts identical across configurations: **{summary.k0_prompts_identical}**; "
                f"largest margin spread between configurations at k = 0: {summary.k0_max_spread:.3g} logits.\n\n"
                f"The claims are differences on the same items (trap = Proc. Skill − Base, suppression = BASM − Proc. Skill), "
                f"mean over task groups with 95% CIs (`{NAME}_differences.csv`):\n\n"
                f"{markdown_table(summary.differences[['bucket', 'contrast', 'k', 'value', 'low', 'high', 'n', 'n_items', 'note']])}\n\n"
                f"The same differences on the items whose defining skill is among the k shown (the paper's setting) and on the "
                f"others (`{NAME}_differences_shown.csv`; margins per configuration in `{NAME}_shown.csv`):\n\n"
                f"{markdown_table(shown_rows(summary.differences_shown))}")
        comparisons = [
            Comparison("Fig. 2: margin at k = 0, T_wrong (configs coincide)", cell(t, bucket="T_wrong", config="base", k=0), PAPER_FIG2["k0"]),
            Comparison("Fig. 2: Proc. Skill at k = 2, T_wrong", cell(t, bucket="T_wrong", config="proc", k=2), PAPER_FIG2["proc_k2"]),
            Comparison("Fig. 2: BASM at k = 2, T_wrong", cell(t, bucket="T_wrong", config="basm", k=2), PAPER_FIG2["basm_k2"]),
            *(Comparison(f"Fig. 2: {plots.label(config)} at k = 2, T_wrong, defining skill shown",
                         cell(summary.shown, shown="shown", bucket="T_wrong", config=config, k=2), PAPER_FIG2[f"{config}_k2"],
                         note="the paper's setting: the tempting skill is among the k shown")
              for config in ("proc", "basm")),
        ]
        return ReportSection(NAME, "Fig. 2 — retrieval trap (`sweep`)", figures, body, comparisons, summary)

    def print_summary(self, summary: SweepSummary) -> None:
        pivot = summary.table.pivot_table(index=["bucket", "config"], columns="k", values="value", sort=False)
        print(pivot.round(2).to_string())
        print(f"k = 0 coincidence: prompts identical across configurations: {summary.k0_prompts_identical}; "
              f"max margin spread {summary.k0_max_spread:.3g} logits")
        print(f"margin: {plots.MARGIN_LABELS[summary.variant]}; {summary.n_abstain_items} items whose correct action is abstention "
              "are left out of it (their call log-odds are in the rows)")
        if summary.differences is not None and len(summary.differences):
            print("paired differences (mean over task groups [95% CI]):\n"
                  + summary.differences.drop(columns=["n_nan"]).round(3).to_string(index=False))
            print("the same, split by whether the defining skill is among the k shown:\n"
                  + shown_rows(summary.differences_shown).round(3).to_string(index=False))

    def status(self, summary: SweepSummary) -> int:
        return 0 if summary.k0_prompts_identical else 1


# The BASM paper's numbers that the report sets next to ours (Qwen3-8B, logits): Fig. 2, the T_wrong
# wrong-tool margin against k (k = 0: every configuration coincides).
PAPER_FIG2 = {"k0": 7.31, "proc_k2": 10.71, "basm_k2": 2.26}


# --- Fig. 2, drawn by Sweep.figures
CONTRAST_LABELS = {"trap": "trap: Proc. Skill − Base", "suppression": "suppression: BASM − Proc. Skill"}
CONTRAST_COLORS = {"trap": plots.CONFIG_COLORS["proc"], "suppression": plots.CONFIG_COLORS["basm"]}


def fig02_retrieval_trap(table: pd.DataFrame, note: str, variant: str, *,
                         differences: pd.DataFrame | None = None) -> plt.Figure:
    """Wrong-tool margin vs k per configuration, one panel per bucket (T_wrong first), and with
    ``differences`` a last panel of the paired differences on T_wrong (the claims: trap and
    suppression per item, mean over task groups with CIs).

    table: bucket, config, k, value, low, high, n; differences: bucket, contrast, k, value, low, high, n, n_items.
    """
    buckets = plots.ordered(table["bucket"], ("T_wrong", "T_ok", "T_repair"))
    diff = differences[differences["bucket"] == "T_wrong"] if differences is not None else pd.DataFrame()
    n_panels = len(buckets) + (1 if len(diff) else 0)
    fig, axes = plt.subplots(1, n_panels, figsize=(4.2 * n_panels + 0.6, 3.8), squeeze=False)
    for ax, bucket in zip(axes[0], buckets):
        sub = table[table["bucket"] == bucket]
        for config in plots.ordered(sub["config"], plots.CONFIG_ORDER):
            line = sub[sub["config"] == config].sort_values("k")
            ax.plot(line["k"], line["value"], marker="o", color=plots.color(config), label=plots.label(config))
            ax.fill_between(line["k"], *plots.ci_band(line), color=plots.color(config), alpha=0.15, lw=0)
            plots.mark_no_ci(ax, line["k"], line, plots.color(config))
        plots.note_no_ci(ax, sub)
        n_items = int(sub["n_items"].max()) if "n_items" in sub and len(sub) else 0
        ax.set_title(f"{plots.bucket_label(bucket)}  (n = {int(sub['n'].max()) if len(sub) else 0} task groups, {n_items} items)")
        ax.set_xlabel("retrieval depth k")
        ax.set_xticks(sorted(set(sub["k"])))
        ax.axhline(0.0, color="0.3", lw=0.8)
    axes[0][0].set_ylabel("\n".join(textwrap.wrap(plots.MARGIN_LABELS[variant], 26)))  # no longer than the axis: no band under it
    plots.legend_outside(axes[0][len(buckets) - 1])
    if len(diff):
        ax = axes[0][-1]
        for contrast in plots.ordered(diff["contrast"], tuple(CONTRAST_LABELS)):
            line = diff[diff["contrast"] == contrast].sort_values("k")
            ax.plot(line["k"], line["value"], marker="o", color=CONTRAST_COLORS[contrast], label=CONTRAST_LABELS[contrast])
            ax.fill_between(line["k"], *plots.ci_band(line), color=CONTRAST_COLORS[contrast], alpha=0.15, lw=0)
            plots.mark_no_ci(ax, line["k"], line, CONTRAST_COLORS[contrast])
        plots.note_no_ci(ax, diff)
        ax.axhline(0.0, color="0.3", lw=0.8)
        ax.set_xticks(sorted(set(diff["k"])))
        ax.set_xlabel("retrieval depth k")
        ax.set_ylabel("paired difference (logits)")
        ax.set_title(f"{plots.bucket_label('T_wrong')}: the claims, paired by item\n(n = {int(diff['n'].max())} task groups, "
                     f"{int(diff['n_items'].max())} items)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize=8)
    fig.suptitle("Retrieval trap: wrong-tool margin vs retrieval depth")
    plots.footnote(fig, note)
    return fig
