"""``looking``: is attending to the boundary the same as using it, and where do errors sit by the closeness of the top two tools?

Rows: per tool-correct item (T_wrong; T_ok for reference; items whose correct action is abstention have no
tool margin and are excluded, counted) one BASM record and one Proc. Skill record at depth k, each scored in
one engine call (:func:`probes.scoring.score.score_record`, per-head α): BASM's clean run, B knocked out in
every layer (``boundary``) and in each window of ``--layer-window`` consecutive layers (``boundary@La-b``;
rows blocked by ``--knockout-rows``, as ``knockout`` blocks them); and one more engine call per record, the
prompt prefix cached, that ranks every catalog tool by its whole name path's log-probability from the
decision row (:func:`probes.analyses.calls.ranked_actions`, abstention left out).

1. **Looking vs picking** (BASM): per record and layer window (and every layer pooled, ``all``), η =
   ᾱ_B / (ᾱ_P + ε) at the deciding row, ᾱ the mean of Eq. 2's α over the window's heads; the record
   *looks* when η > ``--eta-threshold`` (default 1, fixed before any run: more attention per token to B
   than to P). It picks *right* when the headline tool-choice margin is < 0. Reported: the 2 × 2 table
   (counts, pooled shares with 95% CIs over task groups), P(right | looks), P(right | not looks) and their
   difference (CIs over task groups; one-sided p from permuting ``looks`` within task groups,
   ``--permutations``, floor max(1/(permutations + 1), 1/arrangements): it tests the association inside task
   groups, whose items share a template; one carried by whole groups shows in the CI only); the same with B knocked out in
   that window (looks from the clean run, right under the knockout). Whether attention to B predicts the
   choice beyond a baseline: a logistic model right ~ looks (and, separately, log2 η) + the same item's
   Proc. Skill margin (what the model does without the boundary fields), task-group cluster-robust SEs.
2. **Closeness of the top two tools**: per record (Proc. Skill and BASM), the gap between the two best
   tools' name-path log-probabilities; an error is a top tool other than the correct one. Quartiles of
   the gap measured under Proc. Skill (fixed a priori), the same item in the same quartile under both;
   per quartile the error rate under each and BASM's change (CIs over task groups), and the difference of
   changes, lowest minus highest quartile (is BASM's change largest where the top two tools are closest?).

Claims: family ``looking``, the T_wrong difference P(right | looks) − P(right | not looks) pooled over
layers (one-sided, within-group permutation p); family ``looking (exploratory)``, the per-window
differences and the quartile contrast (apart, so they do not dilute the headline's Holm correction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probes.analyses import register
from probes.analyses.base import Analysis, ReportSection
from probes.analyses.calls import ranked_actions
from probes.analyses.jobs import Job, cached_scorer, run_jobs
from probes.analyses.knockout import KNOCKOUT_ROWS, blocked_rows, layer_windows
from probes.analyses.option_system import depth_option, option
from probes.analyses.run_context import AnalysisError, RunContext, provenance
from probes.data.dataset import ABSTAIN, Item
from probes.engine.session import Knockout
from probes.prompts.record import PromptRecord
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring.claims import Claim
from probes.scoring.looking_stats import (LOOKS_THRESHOLD, PERMUTATIONS, QUARTILES, difference_claim, gap_edges, gap_quartile, group_draws,
                                          label_contrast, logit_fit, pooled_mean, two_by_two, window_eta)
from probes.scoring.score import EPSILON
from probes.scoring.stats import permuted_labels

NAME = "looking"
FIGURE = "fig22_looking"
FAMILY = "looking"
EXPLORATORY_FAMILY = "looking (exploratory)"
CONFIGS = ("proc", "basm")  # BASM shows B (looks, knockouts); Proc. Skill is the logit's baseline and the gap's reference
HEADLINE_BUCKET = "T_wrong"
ALL_LAYERS = "all"
CLEAN, KNOCKED = "clean", "B knocked out"
DEFAULT_LAYER_WINDOW = 4
PREDICTORS = ("looks", "log2_eta")


def window_name(layers: Sequence[int]) -> str:
    return f"L{layers[0]}-{layers[-1]}"


def knockout_of(window: str) -> str:
    """The condition that knocks B out in ``window`` (``all``: every layer), named as ``knockout`` names it."""
    return "boundary" if window == ALL_LAYERS else f"boundary@{window}"


def tool_correct(items: Sequence[Item]) -> tuple[list[Item], list[str]]:
    """The items with a correct tool (a tool-choice margin exists) and the ids of the abstention-correct ones."""
    return [i for i in items if i.correct_action != ABSTAIN], [i.id for i in items if i.correct_action == ABSTAIN]


def looking_scorer(ctx: RunContext, windows: Sequence[Sequence[int]]) -> Any:
    """BASM: the clean run and B knocked out in every layer and per window (per-head α); both configurations:
    the top two tools by name-path log-probability on the clean row."""
    a = ctx.options

    def conditions(record: PromptRecord, job: Job) -> list[Knockout]:
        if job.config != "basm":
            return []
        rows, blocks = blocked_rows(record, a.knockout_rows), record.spans.get("boundary", [])
        return [Knockout.from_spans("boundary", blocks, **rows),
                *(Knockout.from_spans(knockout_of(window_name(w)), blocks, layers=w, **rows) for w in windows)]

    # Proc. Skill shows no B: its rows need no per-head α (they would be NaN)
    score = {"basm": cached_scorer(ctx, conditions, per_head=True), "proc": cached_scorer(ctx, conditions)}

    def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
        rows = score[job.config](record, job)
        tools = [(action, logprob) for action, logprob in ranked_actions(ctx.session, record) if action != ABSTAIN]
        (top, top_logprob), (second, second_logprob) = tools[0], tools[1]
        for row in rows:
            if row["condition"] == "baseline":
                row.update(top_tool=top, second_tool=second, top_gap=top_logprob - second_logprob,
                           tool_error=top != job.item.correct_action, n_tools=len(tools))
        return rows

    return scorer


# ----------------------------------------------------------------------------- per-record frames
def proper_windows(n_layers: int, width: int) -> list[tuple[int, ...]]:
    """The windows of ``width`` consecutive layers (:func:`probes.analyses.knockout.layer_windows`), less one that
    holds every layer (it is ``all``: the same η and the same knockout)."""
    return [w for w in layer_windows(n_layers, width) if len(w) < n_layers]


def window_layers(n_layers: int, width: int) -> dict[str, range]:
    """The windows by name: ``all`` (every layer) and each of :func:`proper_windows`."""
    return {ALL_LAYERS: range(n_layers), **{window_name(w): range(w[0], w[-1] + 1) for w in proper_windows(n_layers, width)}}


def looking_records(rows: pd.DataFrame, windows: dict[str, range], threshold: float) -> tuple[pd.DataFrame, list[str]]:
    """One row per (BASM record, window of :func:`window_layers`): η, looks, the clean margin and right, the margin and right with B
    knocked out there, and the item's Proc. Skill margin (the baseline). Records without B or a margin are
    left out, each reason counted in the returned messages."""
    basm = rows[rows["config"] == "basm"]
    clean = basm[basm["condition"] == "baseline"].set_index("item_id")
    proc = rows[(rows["config"] == "proc") & (rows["condition"] == "baseline")].set_index("item_id")["margin"]
    knocked = basm.pivot_table(index="item_id", columns="condition", values="margin", aggfunc="first", dropna=False)
    messages = []
    no_b = clean["boundary_size"] == 0
    if no_b.any():
        messages.append(f"{int(no_b.sum())} BASM record(s) without a boundary span (no B to look at): left out")
    no_margin = ~np.isfinite(clean["margin"].astype(float)) & ~no_b
    if no_margin.any():
        messages.append(f"{int(no_margin.sum())} BASM record(s) without a tool-choice margin (names that never diverge): left out")
    clean = clean[~no_b & ~no_margin]
    out = []
    for window, layers in windows.items():
        for item_id, r in clean.iterrows():
            eta = window_eta(r["alpha_boundary_heads"], r["alpha_procedure_heads"], layers)
            margin_knocked = float(knocked.loc[item_id, knockout_of(window)])
            out.append({"item_id": item_id, "task_group": r["task_group"], "bucket": r["bucket"], "window": window, "eta": eta,
                        "log2_eta": math.log2(eta) if eta > 0 else -math.inf, "looks": eta > threshold, "margin": float(r["margin"]),
                        "right": float(r["margin"]) < 0, "margin_knocked": margin_knocked, "right_knocked": margin_knocked < 0,
                        "proc_margin": float(proc[item_id])})
    order = {bucket: i for i, bucket in enumerate(plots.BUCKET_ORDER)}  # the claims' bucket first; windows and items keep their order
    columns = ["item_id", "task_group", "bucket", "window", "eta", "log2_eta", "looks", "margin", "right", "margin_knocked", "right_knocked",
               "proc_margin"]
    return pd.DataFrame(out, columns=columns).sort_values("bucket", key=lambda b: b.map(order), kind="stable", ignore_index=True), messages


def gap_records(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per item with both clean records: the top-two gap and the error under each configuration."""
    clean = rows[rows["condition"] == "baseline"]
    wide = clean.pivot_table(index=["item_id", "task_group", "bucket"], columns="config", values=["top_gap", "tool_error"],
                             aggfunc="first")
    wide.columns = [f"{value}_{config}" for value, config in wide.columns]
    return wide.reset_index().dropna(subset=[f"{v}_{c}" for v in ("top_gap", "tool_error") for c in CONFIGS])


# ----------------------------------------------------------------------------- tables
def looking_tables(records: pd.DataFrame, *, permutations: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The 2 × 2 tables and the conditional rates per bucket × window × condition (clean; B knocked out in
    the window). The permutations of the item index within task groups and the bootstrap draws of the task
    groups are drawn once per bucket and shared by its windows and conditions (the same items)."""
    cells, rates = [], []
    for bucket, sub in records.groupby("bucket", sort=False):
        first = sub[sub["window"] == sub["window"].iloc[0]]
        index = permuted_labels(np.arange(len(first)), first["task_group"].to_numpy(), permutations, seed)
        draws = group_draws(first["task_group"].to_numpy(), seed=seed)
        for window, w in sub.groupby("window", sort=False):
            if not np.array_equal(w["item_id"].to_numpy(), first["item_id"].to_numpy()):  # the shared draws index these items
                raise AnalysisError(f"looking: window {window} holds other items than window {sub['window'].iloc[0]}")
            groups, looks = w["task_group"].to_numpy(), w["looks"].to_numpy(bool)
            for condition, right in ((CLEAN, w["right"].to_numpy(bool)), (KNOCKED, w["right_knocked"].to_numpy(bool))):
                key = {"bucket": bucket, "window": window, "condition": condition}
                cells.append(two_by_two(looks, right, groups, draws=draws).assign(**key))
                c = label_contrast(looks, right, groups, permutations=permutations, index=index, draws=draws)
                rates.append({**key, "right_looks": c["with"], "right_looks_low": c["with_low"], "right_looks_high": c["with_high"],
                              "right_not": c["without"], "right_not_low": c["without_low"], "right_not_high": c["without_high"],
                              "difference": c["difference"], "low": c["low"], "high": c["high"], "p": c["p"], "p_floor": c["p_floor"],
                              "n_looks": c["n_with"], "n_not": c["n_without"], "n_items": c["n_items"], "n_groups": c["n_groups"],
                              "n_groups_both": c["n_groups_both"]})
    table = pd.concat(cells, ignore_index=True) if cells else pd.DataFrame()
    order = ["bucket", "window", "condition", "looks", "right", "count", "share", "low", "high", "n_items", "n_groups"]
    return (table[order] if len(table) else table), pd.DataFrame(rates)


def logit_table(records: pd.DataFrame) -> pd.DataFrame:
    """right ~ predictor + Proc. Skill margin per bucket × window × predictor (looks; log2 η), clean runs."""
    out = []
    for (bucket, window), w in records.groupby(["bucket", "window"], sort=False):
        for predictor in PREDICTORS:
            fit = logit_fit(w["right"].to_numpy(float), w[predictor].to_numpy(float), w["proc_margin"].to_numpy(float),
                            w["task_group"].to_numpy())
            out.append({"bucket": bucket, "window": window, "predictor": predictor, **fit})
    return pd.DataFrame(out)


def gap_table(gaps: pd.DataFrame, *, permutations: int, seed: int) -> tuple[pd.DataFrame, dict[str, dict[str, float]]]:
    """Per bucket and quartile of the Proc. Skill gap: the gap range, the error rate under each configuration
    and BASM's change (pooled over items, CIs over task groups); per bucket the contrast of BASM's change,
    lowest minus highest quartile (one-sided, below 0: BASM lowers errors most where the top two are closest)."""
    out, contrasts = [], {}
    for bucket, sub in gaps.groupby("bucket", sort=False):
        edges = gap_edges(sub["top_gap_proc"])
        sub = sub.assign(quartile=gap_quartile(sub["top_gap_proc"], edges),
                         change=sub["tool_error_basm"].astype(float) - sub["tool_error_proc"].astype(float))
        for q in QUARTILES:
            part = sub[sub["quartile"] == q]
            entry = {"bucket": bucket, "quartile": f"Q{q}", "gap_min": part["top_gap_proc"].min(), "gap_max": part["top_gap_proc"].max(),
                     "n_items": len(part), "n_groups": part["task_group"].nunique()}
            groups = part["task_group"].to_numpy()
            for name, column in (("error_proc", "tool_error_proc"), ("error_basm", "tool_error_basm"), ("change", "change")):
                entry[name], entry[f"{name}_low"], entry[f"{name}_high"] = pooled_mean(part[column].to_numpy(float), groups, seed=seed)
            out.append(entry)
        ends = sub[sub["quartile"].isin([QUARTILES[0], QUARTILES[-1]])]
        c = label_contrast(ends["quartile"].to_numpy() == QUARTILES[0], ends["change"].to_numpy(float), ends["task_group"].to_numpy(),
                           alternative="less", permutations=permutations, seed=seed)
        contrasts[bucket] = c
        out.append({"bucket": bucket, "quartile": "Q1 − Q4", "n_items": c["n_items"], "n_groups": c["n_groups"], "change": c["difference"],
                    "change_low": c["low"], "change_high": c["high"], "p": c["p"], "p_floor": c["p_floor"]})
    return pd.DataFrame(out), contrasts


@dataclass
class LookingSummary:
    """Everything the tables, figure, report and claims read."""

    table: pd.DataFrame  # looking_table: the 2 × 2 cells
    windows: pd.DataFrame  # looking_windows: conditional rates and their difference
    logit: pd.DataFrame
    gap: pd.DataFrame
    records: pd.DataFrame
    claims: list[Claim]
    messages: list[str]
    note: str
    threshold: float


def looking_claims(rates: pd.DataFrame, contrasts: dict[str, dict[str, float]], threshold: float) -> list[Claim]:
    """The headline (T_wrong, every layer, clean) in ``looking``; the per-window differences and the gap
    quartile contrast in ``looking (exploratory)``."""
    claims = []
    clean = rates[(rates["bucket"] == HEADLINE_BUCKET) & (rates["condition"] == CLEAN)]
    for r in clean.to_dict("records"):
        headline = r["window"] == ALL_LAYERS
        claims.append(difference_claim(
            FAMILY if headline else EXPLORATORY_FAMILY, f"looks and picks right: {HEADLINE_BUCKET}, BASM, {r['window']}",
            f"on {HEADLINE_BUCKET} items under BASM the correct tool is picked more often when the deciding row attends more per token "
            f"to B than to P (η > {threshold:g}, layers {r['window']}) than when it does not",
            r, exploratory=not headline,
            note=f"{r['n_looks']} looking, {r['n_not']} not; {r['n_groups_both']} task groups hold both"))
    if HEADLINE_BUCKET in contrasts:
        c = contrasts[HEADLINE_BUCKET]
        claims.append(difference_claim(
            EXPLORATORY_FAMILY, f"BASM changes errors most where the top two tools are closest: {HEADLINE_BUCKET}",
            f"on {HEADLINE_BUCKET} items BASM's change in the tool error rate (vs Proc. Skill) is lower in the smallest-gap quartile "
            "than in the largest (quartiles of the Proc. Skill gap)", c, alternative="less", exploratory=True, unit="error rate",
            note=f"{c['n_with']} items in Q1, {c['n_without']} in Q4"))
    return claims


def looking_note(ctx: RunContext) -> str:
    a = ctx.options
    return (f"{provenance(ctx)}\nBASM vs Proc. Skill at k = {a.depth} · η = mean α_B / (mean α_P + ε) over a window's heads at the "
            f"deciding row, ε = {EPSILON:g}; looks: η > {a.eta_threshold:g} (fixed a priori) · right: tool-choice margin < 0 · "
            f"B knockout rows: {a.knockout_rows} · windows of {a.layer_window} layers · shares and rates pooled over items, 95% CIs "
            f"over task groups · p: {a.permutations} permutations of looks within task groups")


def section_markdown(summary: LookingSummary) -> str:
    w = summary.windows
    lines = [f"Looking: η = mean α_B / (mean α_P + ε) over a layer window's heads at the deciding row > {summary.threshold:g} (fixed "
             "before the run); right: the tool-choice margin < 0. With B knocked out, looks is the clean run's and right the knocked "
             "run's. p: one-sided, `looks` permuted within task groups; its floor is max(1/(permutations + 1), 1/arrangements).", ""]
    lines += [f"- {m}" for m in summary.messages]
    if len(w):
        cols = ["bucket", "window", "condition", "right_looks", "right_not", "difference", "low", "high", "p", "p_floor", "n_looks", "n_not",
                "n_groups", "n_groups_both"]
        lines += ["", "**P(right | looks) − P(right | not looks)** (pooled over items; CI over task groups):", "", markdown_table(w[cols])]
    t = summary.table
    if len(t):
        pooled = t[t["window"] == ALL_LAYERS]
        lines += ["", "**2 × 2, every layer pooled** (counts; shares of the items with 95% CIs over task groups):", "",
                  markdown_table(pooled.drop(columns=["window"]))]
    if len(summary.logit):
        lines += ["", "**Logistic model** right ~ predictor + Proc. Skill margin (cluster-robust SEs over task groups, t with G − 1 df; "
                  "`coef`: log-odds per unit of the predictor):", "", markdown_table(summary.logit)]
    if len(summary.gap):
        lines += ["", "**Closeness of the top two tools** (quartiles of the Proc. Skill gap between the two best tools' name-path "
                  "log-probabilities; error: the top tool is not the correct one; `change`: BASM − Proc. Skill):", "",
                  markdown_table(summary.gap)]
    return "\n".join(lines)


@register("looking", order=25)
@dataclass(kw_only=True)
class LookingAnalysis(Analysis):
    """Looking versus picking: does attending to B (η > 1 at the deciding row) go with picking the correct tool, also with B knocked out; and error rates by the closeness of the top two tools."""

    min_depth: ClassVar[int] = 1

    buckets: tuple[str, ...] | None = option(("T_wrong", "T_ok"), "keep only these buckets (T_wrong is the claims' bucket; T_ok the "
                                             "reference)", flag="--bucket", repeat=True, choices=("T_ok", "T_wrong", "T_repair"),
                                             group="items")
    k: int | None = depth_option()
    configs: tuple[str, ...] = option(CONFIGS, "comma-separated memory configurations: basm (looks, knockouts) and proc (the logit's "
                                      "baseline and the gap quartiles), both needed", names=CONFIGS, minimum=1)
    eta_threshold: float = option(LOOKS_THRESHOLD, "a record looks at B when η = mean α_B / (mean α_P + ε) exceeds this (fixed before "
                                  "the run)", type=float, minimum=0.0, exclusive=True, why="η > 0 holds wherever B gets any attention",
                                  group="looking")
    layer_window: int = option(DEFAULT_LAYER_WINDOW, "layers per window (η and the B knockout per window)", type=int, minimum=1,
                               group="looking")
    knockout_rows: str = option("path", "rows blocked by the B knockout, as in knockout: path (open row to decision row and the "
                                "candidate name rows) or endpoints", choices=KNOCKOUT_ROWS, group="looking")
    permutations: int = option(PERMUTATIONS, "within-group permutations of looks per test (p floor 1/(N + 1))", type=int, minimum=1,
                               group="looking")

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        a = ctx.options
        if missing := [c for c in CONFIGS if c not in a.configs]:
            raise AnalysisError(f"looking: --configs {','.join(a.configs)} lacks {', '.join(missing)}: looking needs basm (B shown: η and "
                                f"the B knockouts) and proc (the logit's baseline and the gap quartiles); use --configs proc,basm")
        items, _ = tool_correct(ctx.items)
        if not any(i.bucket == HEADLINE_BUCKET for i in items):
            raise AnalysisError(f"looking: no tool-correct {HEADLINE_BUCKET} item selected (looking vs picking is read on {HEADLINE_BUCKET} "
                                f"items whose correct action is a tool); add --bucket {HEADLINE_BUCKET} or --item ids of such items")
        windows = proper_windows(ctx.session.n_layers, a.layer_window)
        jobs = [Job(item, config, a.depth, ctx.fmt, ("baseline", "boundary", *(knockout_of(window_name(w)) for w in windows))
                    if config == "basm" else ("baseline",)) for item in items for config in CONFIGS]
        store = ctx.store(k=a.depth, layer_windows=[list(w) for w in windows], knockout_rows=a.knockout_rows,
                          tool_ranking="whole name-path log-probability from the decision row, abstention left out")
        run_jobs(ctx, store, jobs, looking_scorer(ctx, windows))
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> LookingSummary:
        a = ctx.options
        _, abstain = tool_correct(ctx.items)
        windows = window_layers(ctx.session.n_layers, a.layer_window)
        messages = [f"{len(abstain)} selected item(s) whose correct action is abstention: no tool margin, excluded"] if abstain else []
        records, left_out = looking_records(rows, windows, a.eta_threshold)
        messages += left_out
        if not len(records) or HEADLINE_BUCKET not in set(records["bucket"]):
            raise AnalysisError(f"looking: no {HEADLINE_BUCKET} BASM record with a boundary span and a tool-choice margin is left "
                                f"({'; '.join(left_out) or 'none scored'}); select more {HEADLINE_BUCKET} items (--item, --limit) or a "
                                f"depth k ≥ 1 at which the boundary fields are shown (--k, --gamma)")
        table, rates = looking_tables(records, permutations=a.permutations, seed=a.seed)
        gap, contrasts = gap_table(gap_records(rows), permutations=a.permutations, seed=a.seed)
        return LookingSummary(table, rates, logit_table(records), gap, records, looking_claims(rates, contrasts, a.eta_threshold),
                              messages, looking_note(ctx), a.eta_threshold)

    def tables(self, summary: LookingSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_table": summary.table, f"{NAME}_windows": summary.windows, f"{NAME}_logit": summary.logit, f"{NAME}_gap": summary.gap}

    def claims(self, summary: LookingSummary) -> list[Claim]:
        return list(summary.claims)

    def figures(self, summary: LookingSummary, out_dir: Path) -> list[Path]:
        plots.style()
        return plots.save_figure(fig22_looking(summary), out_dir, FIGURE)

    def section(self, ctx: RunContext, summary: LookingSummary, figures: list[Path]) -> ReportSection:
        return ReportSection(NAME, "Looking versus picking (`looking`)", figures, section_markdown(summary), [], summary, list(summary.claims))

    def print_summary(self, summary: LookingSummary) -> None:
        for message in summary.messages:
            print(message)
        for r in summary.windows.itertuples():
            print(f"{r.bucket} {r.window} ({r.condition}): P(right | looks) {r.right_looks:.2f} (n {r.n_looks}), P(right | not) "
                  f"{r.right_not:.2f} (n {r.n_not}), difference {r.difference:+.2f} [{r.low:+.2f}, {r.high:+.2f}], p {r.p:.3g} "
                  f"(floor {r.p_floor:.3g}; {r.n_groups} task groups)")
        for r in summary.logit[summary.logit["status"] == "fitted"].itertuples():
            print(f"logit {r.bucket} {r.window}: right ~ {r.predictor} + Proc. Skill margin: {r.coef:+.2f} [{r.low:+.2f}, {r.high:+.2f}], "
                  f"p {r.p:.3g}")
        for r in summary.gap.itertuples():
            print(f"gap {r.bucket} {r.quartile}: BASM − Proc. Skill error change {r.change:+.2f} [{r.change_low:+.2f}, {r.change_high:+.2f}] "
                  f"(n {r.n_items})")


# --- Figure 22, drawn by LookingAnalysis.figures (it shapes no row)
def _cells_panel(ax: plt.Axes, cells: pd.DataFrame, title: str) -> None:
    """The 2 × 2 as a heat table: shares coloured, each cell's count, share and CI written in it."""
    grid = np.full((2, 2), np.nan)
    for r in cells.itertuples():
        i, j = int(not r.looks), int(not r.right)
        grid[i, j] = r.share
        ci = f"[{r.low:.2f}, {r.high:.2f}]" if np.isfinite(r.low) else "(no CI)"
        ax.text(j, i, f"{r.count}\n{r.share:.2f}\n{ci}", ha="center", va="center", fontsize=8)
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks([0, 1], ["right", "wrong"])
    ax.set_yticks([0, 1], ["looks", "does not"])
    ax.grid(False)
    ax.set_title(title, fontsize=9)


def fig22_looking(summary: LookingSummary) -> plt.Figure:
    """T_wrong: the 2 × 2 (every layer) clean and with B knocked out; per window the difference
    P(right | looks) − P(right | not looks), clean and knocked; the error rate by Proc. Skill gap quartile."""
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8), gridspec_kw={"width_ratios": [1, 1, 1.6, 1.6]})
    t = summary.table[(summary.table["bucket"] == HEADLINE_BUCKET) & (summary.table["window"] == ALL_LAYERS)]
    for ax, condition in zip(axes[:2], (CLEAN, KNOCKED)):
        _cells_panel(ax, t[t["condition"] == condition], f"{HEADLINE_BUCKET}, every layer:\n{condition}")  # within the square
    ax = axes[2]
    w = summary.windows[summary.windows["bucket"] == HEADLINE_BUCKET]
    for shift, (condition, sub) in zip((-0.12, 0.12), w.groupby("condition", sort=False)):
        x = np.arange(len(sub)) + shift
        frame = sub.rename(columns={"difference": "value"})
        ax.errorbar(x, frame["value"], yerr=plots.ci_errors(frame), fmt="o", capsize=3, label=condition)
        plots.annotate_no_ci(ax, x, frame)
        ax.set_xticks(np.arange(len(sub)), sub["window"], rotation=45, ha="right")
    ax.axhline(0, color="0.6", linewidth=0.8)
    ax.set(ylabel="P(right | looks) − P(right | not)", title="per layer window")
    ax.legend(fontsize=7)
    ax = axes[3]
    g = summary.gap[(summary.gap["bucket"] == HEADLINE_BUCKET) & summary.gap["quartile"].str.fullmatch(r"Q\d")]
    for shift, config in zip((-0.12, 0.12), CONFIGS):
        x = np.arange(len(g)) + shift
        frame = g.rename(columns={f"error_{config}": "value", f"error_{config}_low": "low", f"error_{config}_high": "high"})
        ax.errorbar(x, frame["value"], yerr=plots.ci_errors(frame), fmt="o", capsize=3, color=plots.color(config), label=config)
    ax.set_xticks(np.arange(len(g)), g["quartile"])
    ax.set(xlabel="quartile of the Proc. Skill top-two gap\n(Q1: closest)", ylabel="tool error rate", ylim=(-0.05, 1.05),
           title="errors by closeness of the top two tools")
    ax.legend(fontsize=7)
    plots.footnote(fig, summary.note)
    return fig
