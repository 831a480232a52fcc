"""``paired`` (Fig. 12): the equal-token paired status of BASM vs procedure padding, strict and lenient.

BASM against procedure padding (``pad-procedure``, the equal-token control) on the same items and
depths, in both modes of :mod:`probes.analyses.calls`: both solved / only BASM / only padding / both
failed. It reuses the greedy generations of a calls results file holding both configurations (a
matching ``calls.jsonl`` in the same results folder, or ``calls=PATH``) and generates only what is
missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probes.analyses import register
from probes.prompts.builder import SWEEP_K_MAX
from probes.analyses.base import Analysis, Comparison, ReportSection
from probes.analyses.option_system import k_max_option, option
from probes.analyses.run_context import RunContext
from probes.analyses.calls import (
    CLAIM_FAMILY,
    MAX_NEW_TOKENS,
    calls_config,
    deepest_k,
    generate_rows,
    mode_note,
    provenance_without_margin,
    value_at,
)
from probes.analyses.calls import NAME as CALLS
from probes.analyses.parallel import on_rank_zero, open_store
from probes.prompts.record import record_id
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.layout import rows_path
from probes.reporting.results import ResultsStore, canonical, load_results, read_meta
from probes.scoring.claims import Claim, effect_claim
from probes.scoring.stats import DEFAULT_SEED, paired_permutation_test
from probes.scoring.toolcalls import MODES, mode_description

NAME = "paired"
FIGURE = "fig12_paired_status"
PAIRED_STATUSES: tuple[str, ...] = ("both_solved", "only_basm", "only_padding", "both_failed")
PAIRED_CONFIGS: tuple[str, str] = ("basm", "pad-procedure")


def paired_status(basm_solved: bool, padding_solved: bool) -> str:
    if basm_solved and padding_solved:
        return "both_solved"
    if basm_solved:
        return "only_basm"
    if padding_solved:
        return "only_padding"
    return "both_failed"


def pair_rows(rows: pd.DataFrame, configs: tuple[str, str] = PAIRED_CONFIGS) -> list[dict[str, Any]]:
    """One paired row per (item, k, format) present under both configurations: per configuration its
    reply's call (``syntax``, ``template_format``, ``known_tool``) and per mode its outcome and
    whether it solved the item; per mode the paired status."""
    keys = ["item_id", "k", "format"]
    sides = {_short(config): rows[rows["config"] == config].set_index(keys) for config in configs}
    (first, a), (second, b) = sides.items()
    out = []
    for key in sorted(set(a.index) & set(b.index)):
        ra, rb = a.loc[key], b.loc[key]
        item_id, k, fmt = key
        row = {"key": f"{item_id}|k{k}|{fmt}", "item_id": item_id, "k": int(k), "format": fmt,
               "bucket": ra["bucket"], "domain": ra["domain"], "task_group": ra["task_group"],
               "correct_action": ra["correct_action"], "identical_prompt": int(k) == 0,
               **{field: ra[field] for field in ("retrieval_mode", "tempting_rank", "tempting_shown_rank", "tempting_shown")}}
        for short, r in ((first, ra), (second, rb)):
            row.update({f"{short}_{field}": r[field] for field in ("syntax", "template_format", "known_tool")})
            for mode in MODES:
                row[f"{short}_{mode}_outcome"] = r[f"{mode}_outcome"]
                row[f"{short}_{mode}_solved"] = bool(r[f"{mode}_solved"])
        for mode in MODES:
            row[f"{mode}_status"] = paired_status(row[f"{first}_{mode}_solved"], row[f"{second}_{mode}_solved"])
        out.append(row)
    return out


def _short(config: str) -> str:
    return {"basm": "basm", "pad-procedure": "padding"}.get(config, config.replace("-", "_"))


def paired_summary(paired: pd.DataFrame, *, resamples: int = 10000, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Per mode × format × k × bucket (and bucket "all"): status counts and shares, plus the paired
    difference in solve rate (BASM − padding, mean of task-group means) with a two-sided sign-flip
    permutation p over task groups."""
    out = []
    frames = pd.concat([paired, paired.assign(bucket="all")])
    for (fmt, k, bucket), frame in frames.groupby(["format", "k", "bucket"], sort=True):
        for mode in MODES:
            counts = frame[f"{mode}_status"].value_counts()
            row = {"mode": mode, "format": fmt, "k": int(k), "bucket": bucket, "n": len(frame),
                   "n_groups": frame["task_group"].nunique()}
            for status in PAIRED_STATUSES:
                row[status] = int(counts.get(status, 0))
                row[f"{status}_share"] = row[status] / len(frame)
            a = frame[f"basm_{mode}_solved"].astype(float).to_numpy()
            b = frame[f"padding_{mode}_solved"].astype(float).to_numpy()
            if row["only_basm"] + row["only_padding"] and row["n_groups"] > 1:
                diff, p = paired_permutation_test(a, b, frame["task_group"].tolist(), alternative="two-sided", resamples=resamples, seed=seed)
            else:  # no discordant pair (the difference is 0) or one task group: nothing to test
                diff, p = float(np.mean(a - b)), float("nan")
            row.update(solve_difference=diff, p_value=p)
            out.append(row)
    return pd.DataFrame(out)


def _reusable_calls(path: Path, expected: Mapping[str, Any]) -> pd.DataFrame | None:
    """Rows (of the wanted configs) of an existing calls file written with the same settings."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    meta = read_meta(path)
    theirs = dict(meta.get("config", {}))
    mine = canonical(dict(expected))
    if meta.get("analysis") != CALLS or not set(mine["configs"]) & set(theirs.get("configs", [])):
        return None
    theirs.pop("configs", None)
    mine.pop("configs", None)
    if theirs != mine:
        return None
    rows = load_results(path)
    return rows[rows["config"].isin(expected["configs"])] if len(rows) else None


def paired_calls(ctx: RunContext) -> tuple[pd.DataFrame, str]:
    """Calls of BASM and procedure padding on the run's items and k: reused from a matching calls
    file where present, generated (resumably, into OUT/<model>/paired/paired_calls.jsonl) only where missing."""
    configs = list(PAIRED_CONFIGS)
    expected = calls_config(ctx, configs)
    source = ctx.options.calls or rows_path(ctx.out_dir, CALLS)
    reused = _reusable_calls(Path(source), expected)
    wanted = {f"{record_id(item.id, config, k, ctx.fmt)}|greedy" for item in ctx.items
              for k in range(ctx.options.k_max + 1) for config in configs}
    have = set(reused["key"]) & wanted if reused is not None else set()
    frames = [reused[reused["key"].isin(wanted)]] if have else []
    missing = wanted - have
    if missing:
        store = open_store(ctx.rows_path("paired_calls"), CALLS, expected, overwrite=ctx.options.overwrite)
        ran = generate_rows(ctx, store, configs, only_keys=missing)
        generated = load_results(store.path)
        if len(generated):
            frames.append(generated[generated["key"].isin(missing)])
    how = (f"reused {len(have)} generations from {Path(source).name}" if have else "no reusable calls file") + (
        f"; {len(missing)} from paired_calls.jsonl ({ran} generated in this run)" if missing else "")
    return pd.concat(frames, ignore_index=True), how


@dataclass
class PairedSummary:
    paired: pd.DataFrame  # one row per (item, k): the status of BASM vs procedure padding in each mode
    table: pd.DataFrame  # counts, solve difference and p per mode, format, k and bucket
    how: str  # where the generations came from
    note: str
    seed: int = DEFAULT_SEED


@register("paired", order=80)
@dataclass(kw_only=True)
class Paired(Analysis):
    """Fig. 12: paired outcome status of BASM vs procedure padding, strict and lenient (reuses the calls results)."""

    k_max: int | None = k_max_option(SWEEP_K_MAX)
    max_new_tokens: int = option(MAX_NEW_TOKENS, "greedy generation budget", type=int, minimum=1, group="generation")
    calls: str | Path | None = option(None, "calls results file to reuse (default: OUT/<model>/calls/calls.jsonl when it matches this run)",
                                      type=Path)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        """Paired rows (``paired.jsonl``) from the calls of BASM and procedure padding; ``attrs["how"]``
        says where the calls came from."""
        calls, how = paired_calls(ctx)
        path = ctx.rows_path(NAME)

        def write() -> None:  # derived from the calls every rank holds: rank 0 alone writes it
            store = ResultsStore(path, NAME, calls_config(ctx, PAIRED_CONFIGS), overwrite=ctx.options.overwrite)
            store.append([row for row in pair_rows(calls) if row["key"] not in store])

        on_rank_zero(write)
        paired = load_results(path)
        paired.attrs["how"] = how
        return paired

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> PairedSummary:
        how = rows.attrs.get("how", "")
        note = (f"{provenance_without_margin(ctx)} · greedy calls ({how})\nsolved = the action is the item's "
                f"correct action · Δ = solve rate BASM − procedure padding (mean of task-group means), p: two-sided sign-flip "
                f"permutation test over task groups · k = 0 omitted (both configurations render the identical memory-free prompt)")
        seed = ctx.options.seed
        return PairedSummary(rows, paired_summary(rows, seed=seed), how, note, seed)

    def tables(self, summary: PairedSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.table}

    def figures(self, summary: PairedSummary, out_dir: Path) -> list[Path]:
        plots.style()
        return plots.save_figure(fig12_paired_status(summary.table, summary.note), out_dir, FIGURE)

    def section(self, ctx: RunContext, summary: PairedSummary, figures: list[Path]) -> ReportSection:
        table, how = summary.table, summary.how
        shown = table[table["k"] > 0][["mode", "k", "bucket", "n", *PAIRED_STATUSES, "solve_difference", "p_value"]]
        body = (f"BASM vs procedure padding (equal token count) on the same items and k; solved = the action is the item's correct "
                f"action; {mode_note(ctx.fmt)} ({how}).\n\n{markdown_table(shown)}")
        k_max = int(table["k"].max())
        comparisons = [Comparison(f"Fig. 12: {mode} solve rate BASM − padding, all buckets (k = {k_max}; paper: BASM ≈ padding on BFCL, "
                                  f"slightly ahead on AppWorld)",
                                  value_at(table.rename(columns={"solve_difference": "value"}), bucket="all", k=k_max, mode=mode), None, "rate")
                       for mode in MODES]
        return ReportSection(NAME, "Fig. 12 — equal-token paired status (`paired`)", figures, body, comparisons, summary)

    def claims(self, summary: PairedSummary) -> list[Claim]:
        """Fig. 12's claim in each mode: at the deepest k, over all buckets, BASM solves more items than
        procedure padding (per-item differences of solved, task groups as units)."""
        paired = summary.paired
        k = deepest_k(paired)
        if not k:  # k = 0 renders identical prompts: nothing to compare
            return []
        deepest = paired[paired["k"] == k]
        return [effect_claim(
            CLAIM_FAMILY, f"{mode}_paired_basm_above_padding_k{k}",
            f"at k = {k}, over all buckets, BASM solves more items than procedure padding ({mode}; paired by item)",
            deepest[f"basm_{mode}_solved"].astype(float) - deepest[f"padding_{mode}_solved"].astype(float), deepest["task_group"],
            alternative="greater", unit="rate", seed=summary.seed,
            note=f"{len(deepest)} items; {mode}: {mode_description(mode, sorted(set(deepest['format'])))}") for mode in MODES]

    def print_summary(self, summary: PairedSummary) -> None:
        print(summary.how)
        print(summary.table[["mode", "format", "k", "bucket", "n", *PAIRED_STATUSES, "solve_difference", "p_value"]].to_string(index=False))


# --- Fig. 12, drawn by Paired.figures
PAIRED_STATUS_STYLE: dict[str, tuple[str, tuple[float, float, float]]] = {
    "both_solved": ("both solved", (0.55, 0.78, 0.55)),
    "only_basm": ("only BASM", plots.CONFIG_COLORS["basm"]),
    "only_padding": ("only procedure padding", plots.CONFIG_COLORS["pad-procedure"]),
    "both_failed": ("both failed", (0.78, 0.78, 0.78)),
}


def fig12_paired_status(summary: pd.DataFrame, note: str) -> plt.Figure:
    """Paired outcome shares of BASM vs procedure padding: one panel per bucket (and all items),
    one horizontal stacked bar per k ≥ 1 and mode (lenient, strict), counts in the segments, Δ solve
    rate and p at the right.

    summary: mode, format, k, bucket, n, n_groups, both_solved, only_basm, only_padding, both_failed
    (+ _share), solve_difference, p_value.
    """
    data = summary[summary["k"] > 0] if (summary["k"] > 0).any() else summary
    panels = plots.ordered(data["bucket"], ("T_wrong", "T_ok", "T_repair", "all"))
    ks = sorted(int(k) for k in data["k"].unique())
    modes = [m for m in plots.CALL_MODE_STYLE if m in set(data["mode"])]
    bars = [(k, m) for k in ks for m in modes]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.6, 0.42 * len(bars) * len(panels) + 1.0 * len(panels) + 0.4),
                             sharex=True, squeeze=False)
    for ax, bucket in zip(axes[:, 0], panels):
        sub = data[data["bucket"] == bucket].set_index(["k", "mode"]).reindex(bars)
        y = np.arange(len(bars))
        left = np.zeros(len(bars))
        for status, (name, col) in PAIRED_STATUS_STYLE.items():
            share = sub[f"{status}_share"].fillna(0.0).to_numpy()
            ax.barh(y, share, left=left, color=col, label=name, height=0.7, edgecolor="white", lw=0.6)
            for yi, (s, lft, count) in enumerate(zip(share, left, sub[status].fillna(0).astype(int))):
                if s >= 0.06:
                    ax.text(lft + s / 2, yi, str(count), ha="center", va="center", fontsize=7.5)
            left += share
        for yi, row in zip(y, sub.itertuples()):
            if np.isfinite(row.n):
                p = "n/a" if not np.isfinite(row.p_value) else f"{row.p_value:.2g}"
                ax.text(1.01, yi, f"Δ = {row.solve_difference:+.2f}, p = {p}  (n = {int(row.n)})", va="center", fontsize=7.5,
                        transform=ax.get_yaxis_transform())
        ax.set_yticks(y, [f"k = {k} · {m}" for k, m in bars])
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_title(plots.bucket_label(bucket) if bucket != "all" else "all buckets", loc="left", fontsize=10)
    axes[-1][0].set_xlabel("share of paired items (counts in segments)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.suptitle("Equal-token control: BASM vs procedure padding, paired outcome status (strict and lenient)")
    axes[-1][0].legend(handles, names, ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3))  # in the layout
    caption = (f"plotted: paired status per k = {', '.join(map(str, ks))} in modes {', '.join(modes)} · n per bar: "
               f"{plots.n_text(data, 'paired items')}\n{plots.call_mode_text(sorted(set(data['format'])), lines=False)}")
    plots.footnote(fig, f"{note}\n{caption}")
    return fig
