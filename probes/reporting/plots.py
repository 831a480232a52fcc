"""Figures of the probe analyses, one function per paper figure (Figs. 2–12).

Shared style helpers come first; every figure function takes the tidy summary tables of its
analysis module and returns a matplotlib ``Figure``. :func:`save_figure` writes PNG and PDF.
Names follow the paper: buckets T_ok / T_wrong / T_repair (mathtext subscripts), configuration
labels from :mod:`probes.data.configs`, margins in logits, error bars = 95% bootstrap CIs over task
groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from probes.core.files import atomic_path
from probes.data.configs import CONFIGS, config_label
from probes.scoring.selectivity import SELECTIVITY, selectivity_table
from probes.scoring.stats import MIN_CI_GROUPS, no_ci_note

BUCKET_LABELS: dict[str, str] = {
    "T_ok": r"$T_{\mathrm{ok}}$",
    "T_wrong": r"$T_{\mathrm{wrong}}$",
    "T_repair": r"$T_{\mathrm{repair}}$",
}

# One colour per configuration, stable across figures (colour-blind safe palette).
_PALETTE = sns.color_palette("colorblind", 10)
CONFIG_COLORS: dict[str, tuple[float, float, float]] = {
    "base": (0.45, 0.45, 0.45),
    "proc": _PALETTE[3],
    "app": _PALETTE[1],
    "basm": _PALETTE[0],
    "basm-no-avoid": _PALETTE[9],
    "basm-no-recovery": _PALETTE[4],
    "pad-filler": _PALETTE[7],
    "pad-procedure": _PALETTE[5],
}
CONDITION_COLORS: dict[str, tuple[float, float, float]] = {
    "boundary": _PALETTE[0],
    "count_boundary": _PALETTE[9],
    "random": (0.55, 0.55, 0.55),
    "count_pool": (0.7, 0.7, 0.7),
    "mass_matched": _PALETTE[8],
    "random_anywhere": (0.85, 0.85, 0.85),
    "procedure": _PALETTE[3],
}

MARGIN_LABELS: dict[str, str] = {  # the headline `margin` of each --margin-variant
    "tool_choice": "wrong-tool margin, Eq. 1 restricted to the tools (logits)",
    "eq1": "wrong-tool margin, Eq. 1 verbatim (abstention in Y_ctrl; logits)",
    "first_token": "wrong-tool margin, Eq. 1 at the first name token (logits)",
    "path": "wrong-tool path log-prob margin (abstention included)",
}


def bucket_label(bucket: str) -> str:
    return BUCKET_LABELS.get(bucket, bucket)


def label(config: str) -> str:
    """Paper label of a configuration (falls back to the name for unknown ones)."""
    return config_label(config) if config in CONFIGS else config


def color(config: str) -> tuple[float, float, float]:
    return CONFIG_COLORS.get(config, (0.2, 0.2, 0.2))


def style() -> None:
    """The common look: white grid, readable sizes, tight layout."""
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.15)
    plt.rcParams.update({
        "figure.dpi": 110,
        "savefig.dpi": 160,
        "axes.titleweight": "bold",
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
        "pdf.fonttype": 42,  # editable text in the PDFs
    })


def save_figure(fig: plt.Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name.png`` and ``name.pdf`` into ``out_dir``; closes the figure."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.tight_layout()
    for path in paths:
        # Fixed metadata: identical inputs give identical files.
        with atomic_path(path) as tmp:
            fig.savefig(tmp, bbox_inches="tight", metadata={"CreationDate": None} if path.suffix == ".pdf" else {"Software": None})
    plt.close(fig)
    return paths


def footnote(fig: plt.Figure, text: str, y: float = -0.01) -> None:
    """Small provenance lines under the axes (model, margin variant, n, aggregate...)."""
    fig.text(0.01, y, text, ha="left", va="top", fontsize=7.5, color="0.35", wrap=True)


def no_ci_label(n_groups: float) -> str:
    """What a cell without a CI shows instead of an error bar: :func:`probes.scoring.stats.no_ci_note`
    where too few task groups are the reason, else ``no CI``."""
    return no_ci_note(int(n_groups) if np.isfinite(n_groups) else 0) or "no CI"


def ci_groups(frame: pd.DataFrame) -> np.ndarray:
    """Task groups behind each row's CI: ``n_groups`` where present (``n`` then counts items), else ``n``."""
    column = "n_groups" if "n_groups" in frame else "n" if "n" in frame else None
    if column is None:
        return np.full(len(frame), np.inf)
    return pd.to_numeric(frame[column], errors="coerce").fillna(0).to_numpy(dtype=float)


def has_ci(frame: pd.DataFrame, low: str = "low", high: str = "high") -> np.ndarray:
    """Rows with a real CI: at least two task groups and finite bounds."""
    lo = pd.to_numeric(frame[low], errors="coerce").to_numpy(dtype=float)
    hi = pd.to_numeric(frame[high], errors="coerce").to_numpy(dtype=float)
    return (ci_groups(frame) >= MIN_CI_GROUPS) & np.isfinite(lo) & np.isfinite(hi)


def ci_errors(frame: pd.DataFrame, value: str = "value", low: str = "low", high: str = "high") -> np.ndarray:
    """Asymmetric error bars ``[2, n]`` from point estimates and CI bounds; NaN (no bar drawn,
    not a zero-width one) where a row has no CI (:func:`has_ci`)."""
    lo = (frame[value] - frame[low]).to_numpy(dtype=float)
    hi = (frame[high] - frame[value]).to_numpy(dtype=float)
    errors = np.vstack([lo, hi]).clip(min=0.0)
    errors[:, ~has_ci(frame, low, high)] = np.nan
    return errors


def ci_band(frame: pd.DataFrame, low: str = "low", high: str = "high") -> tuple[np.ndarray, np.ndarray]:
    """CI bounds for ``fill_between``, NaN (a gap in the band) where a row has no CI."""
    ok = has_ci(frame, low, high)
    return (np.where(ok, frame[low].to_numpy(dtype=float), np.nan), np.where(ok, frame[high].to_numpy(dtype=float), np.nan))


def annotate_no_ci(ax: plt.Axes, x: Sequence[float], frame: pd.DataFrame, value: str = "value") -> None:
    """Write "no CI (1 group)" next to each point/bar of ``frame`` that has no CI."""
    for xi, v, ok, n in zip(x, frame[value].to_numpy(dtype=float), has_ci(frame), ci_groups(frame)):
        if not ok and np.isfinite(v):
            ax.annotate(no_ci_label(n), (xi, v), xytext=(0, 3 if v >= 0 else -10), textcoords="offset points",
                        ha="center", fontsize=6.5, color="0.35")


def mark_no_ci(ax: plt.Axes, x: Sequence[float], frame: pd.DataFrame, rgb, value: str = "value") -> None:
    """Hollow markers on the points of a line that have no CI (see :func:`note_no_ci`)."""
    missing = ~has_ci(frame)
    if missing.any():
        ax.scatter(np.asarray(x, dtype=float)[missing], frame[value].to_numpy(dtype=float)[missing], s=22,
                   facecolors="white", edgecolors=[rgb], linewidths=1.2, zorder=5)


def note_no_ci(ax: plt.Axes, frame: pd.DataFrame, value: str = "value") -> None:
    """One line in a line panel saying which points have no CI (fewer than two task groups)."""
    finite = np.isfinite(frame[value].to_numpy(dtype=float)) if len(frame) else np.zeros(0, bool)
    missing = ~has_ci(frame) & finite
    if not missing.any():
        return
    counts = sorted(set(ci_groups(frame)[missing].tolist()))
    text = no_ci_label(counts[0]) if len(counts) == 1 else f"no CI (< {MIN_CI_GROUPS} groups)"
    if missing.sum() < finite.sum():
        text = f"hollow markers: {text}"
    ax.text(0.02, 0.98, text, transform=ax.transAxes, ha="left", va="top", fontsize=7, color="0.35")


def grouped_bars(
    ax: plt.Axes,
    frame: pd.DataFrame,
    groups: Sequence[str],
    series: Sequence[str],
    *,
    group_col: str,
    series_col: str,
    series_label=label,
    series_color=color,
    group_label=bucket_label,
    annotate: bool = True,
) -> None:
    """Bars of ``frame.value`` with CI whiskers: x = ``groups``, one bar per ``series`` in each.

    ``frame`` has columns group_col, series_col, value, low, high, n (task groups). A bar with
    fewer than two task groups gets no whisker and the label "no CI (1 group)" (one note for the
    panel when no bar has a CI).
    """
    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    shown = frame[frame[series_col].isin(list(series)) & frame[group_col].isin(list(groups))]
    finite = np.isfinite(shown["value"].to_numpy(dtype=float))
    per_bar = bool(has_ci(shown)[finite].any())  # else: one panel note instead of a label per bar
    if not per_bar:
        note_no_ci(ax, shown)
    for j, s in enumerate(series):
        sub = frame[frame[series_col] == s].set_index(group_col).reindex(list(groups))
        pos = x - 0.4 + width * (j + 0.5)
        ax.bar(pos, sub["value"].fillna(0.0), width * 0.92, yerr=ci_errors(sub), capsize=3,
               color=series_color(s), label=series_label(s), error_kw={"elinewidth": 1})
        for p, v, ok, n in zip(pos, sub["value"].to_numpy(dtype=float), has_ci(sub), ci_groups(sub)):
            if not np.isfinite(v):
                continue
            text = "\n".join(([number(v)] if annotate else []) + ([] if ok or not per_bar else [no_ci_label(n)]))
            if text:
                ax.annotate(text, (p, v), xytext=(0, 3 if v >= 0 else -10), textcoords="offset points",
                            ha="center", va="bottom" if v >= 0 else "top", fontsize=7)
    ax.set_xticks(x, [group_label(g) for g in groups])
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.margins(y=0.12)


def number(v: float) -> str:
    """Bar label: two decimals, or two significant digits for small values (never "-0.00")."""
    return f"{v:.2f}" if abs(v) >= 0.1 or v == 0 else f"{v:.2g}"


def legend_outside(ax: plt.Axes) -> None:
    """Legend to the right of the axes, never over the bars."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


# --- Figures 2–9 (probe analyses: sweep, ratios, suppression, knockout, heads)
def _ordered(values, preferred: Sequence[str]) -> list[str]:
    values = list(dict.fromkeys(values))
    return [v for v in preferred if v in values] + [v for v in values if v not in preferred]


BUCKET_ORDER = ("T_ok", "T_wrong", "T_repair")
CONFIG_ORDER = tuple(CONFIGS)


CONTRAST_LABELS = {"trap": "trap: Proc. Skill − Base", "suppression": "suppression: BASM − Proc. Skill"}
CONTRAST_COLORS = {"trap": CONFIG_COLORS["proc"], "suppression": CONFIG_COLORS["basm"]}


def fig02_retrieval_trap(table: pd.DataFrame, note: str, variant: str = "tool_choice", *,
                         differences: pd.DataFrame | None = None) -> plt.Figure:
    """Wrong-tool margin vs k per configuration, one panel per bucket (T_wrong first), and with
    ``differences`` a last panel of the paired differences on T_wrong (the claims: trap and
    suppression per item, mean over task groups with CIs).

    table: bucket, config, k, value, low, high, n; differences: bucket, contrast, k, value, low, high, n, n_items.
    """
    buckets = _ordered(table["bucket"], ("T_wrong", "T_ok", "T_repair"))
    diff = differences[differences["bucket"] == "T_wrong"] if differences is not None else pd.DataFrame()
    n_panels = len(buckets) + (1 if len(diff) else 0)
    fig, axes = plt.subplots(1, n_panels, figsize=(4.2 * n_panels + 0.6, 3.8), squeeze=False)
    for ax, bucket in zip(axes[0], buckets):
        sub = table[table["bucket"] == bucket]
        for config in _ordered(sub["config"], CONFIG_ORDER):
            line = sub[sub["config"] == config].sort_values("k")
            ax.plot(line["k"], line["value"], marker="o", color=color(config), label=label(config))
            ax.fill_between(line["k"], *ci_band(line), color=color(config), alpha=0.15, lw=0)
            mark_no_ci(ax, line["k"], line, color(config))
        note_no_ci(ax, sub)
        n_items = int(sub["n_items"].max()) if "n_items" in sub and len(sub) else 0
        ax.set_title(f"{bucket_label(bucket)}  (n = {int(sub['n'].max()) if len(sub) else 0} task groups, {n_items} items)")
        ax.set_xlabel("retrieval depth k")
        ax.set_xticks(sorted(set(sub["k"])))
        ax.axhline(0.0, color="0.3", lw=0.8)
    axes[0][0].set_ylabel(MARGIN_LABELS[variant].replace(", ", "\n", 1))
    legend_outside(axes[0][len(buckets) - 1])
    if len(diff):
        ax = axes[0][-1]
        for contrast in _ordered(diff["contrast"], tuple(CONTRAST_LABELS)):
            line = diff[diff["contrast"] == contrast].sort_values("k")
            ax.plot(line["k"], line["value"], marker="o", color=CONTRAST_COLORS[contrast], label=CONTRAST_LABELS[contrast])
            ax.fill_between(line["k"], *ci_band(line), color=CONTRAST_COLORS[contrast], alpha=0.15, lw=0)
            mark_no_ci(ax, line["k"], line, CONTRAST_COLORS[contrast])
        note_no_ci(ax, diff)
        ax.axhline(0.0, color="0.3", lw=0.8)
        ax.set_xticks(sorted(set(diff["k"])))
        ax.set_xlabel("retrieval depth k")
        ax.set_ylabel("paired difference (logits)")
        ax.set_title(f"{bucket_label('T_wrong')}: the claims, paired by item\n(n = {int(diff['n'].max())} task groups, "
                     f"{int(diff['n_items'].max())} items)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize=8)
    fig.suptitle("Retrieval trap: wrong-tool margin vs retrieval depth", y=1.02)
    footnote(fig, note, y=-0.16 if len(diff) else -0.01)
    return fig


def _eta_panels(axes: Sequence[plt.Axes], eta: pd.DataFrame) -> None:
    """η (ratio of mean span attentions) and the median per-head log2 ratio, bucket × config.

    eta: bucket, config, eta, eta_low, eta_high, log2_median, log2_low, log2_high, n.
    """
    buckets = _ordered(eta["bucket"], BUCKET_ORDER)
    configs = _ordered(eta["config"], CONFIG_ORDER)
    panels = (("eta", "η = mean α_B / (mean α_P + ε)"), ("log2", "median over heads of log2(α_B / α_P)"))
    for ax, (col, ylabel) in zip(axes, panels):
        value = "eta" if col == "eta" else "log2_median"
        frame = eta.rename(columns={value: "value", f"{col}_low": "low", f"{col}_high": "high"})
        grouped_bars(ax, frame, buckets, configs, group_col="bucket", series_col="config")
        ax.set_ylabel(ylabel)
    axes[0].axhline(1.0, color="0.5", lw=0.8, ls="--")


def shift_headline(shifts: pd.DataFrame) -> str:
    """The headline estimate in words, from the row of a ratios shifts table marked ``headline``
    ("" when the table has none)."""
    h = shifts[shifts["headline"].astype(bool)]
    if h.empty:
        return ""
    r = h.iloc[0]
    what = f"{label(r['config'])}, {r['target']} − T_ok shift of log2 η, {r['stratum']}, {r['row']} row"
    if not r["n"]:
        return f"headline: {what}: no task group has records of both buckets"
    ci = f" [{r['low']:+.3f}, {r['high']:+.3f}]" if has_ci(h.iloc[:1])[0] else f" ({no_ci_label(r['n'])})"
    p = f", one-sided sign-flip p = {r['p']:.3g}" if np.isfinite(r["p"]) else ""
    return f"headline: {what} = {r['value']:+.3f}{ci}{p}; {int(r['n'])} task groups, {int(r['n_target'])} {r['target']} / {int(r['n_reference'])} T_ok items"


def fig04_boundary_attention(eta: pd.DataFrame, shifts: pd.DataFrame, controls: pd.DataFrame, note: str) -> plt.Figure:
    """(a, b) η and the median per-head log2 ratio per bucket (descriptive, every record pooled);
    (c, d) group-paired shifts of per-record log2 η from T_ok to each target bucket, per stratum
    (x) and configuration (bars). The caption's counts, strata and headline come from these tables.

    eta: bucket, config, eta, eta_low, eta_high, log2_median, log2_low, log2_high, n, n_items.
    shifts: target, config, stratum, value, low, high, n (task groups), n_target, n_reference, same_records_as, row, headline.
    controls: target, control, stratum, value, low, high, n.
    """
    targets = _ordered(shifts["target"], ("T_wrong", "T_repair"))
    fig, axes = plt.subplots(2, max(2, len(targets)), figsize=(13, 8.6), squeeze=False)
    _eta_panels(axes[0], eta)
    legend_outside(axes[0][1])
    axes[0][0].set_title("(a) boundary / procedure attention η (pooled, descriptive)")
    axes[0][1].set_title("(b) per-head log-ratio (pooled, descriptive)")
    empty: list[str] = []
    repeated: list[str] = []
    for ax, target in zip(axes[1], targets):
        sub = shifts[shifts["target"] == target]
        present = sub.groupby("stratum", sort=False)["n"].max()
        # a stratum whose records are another's under every configuration that has any is the same bar: named, not drawn again
        same = sub[sub["n"] > 0].groupby("stratum", sort=False)["same_records_as"].agg(lambda v: v.iloc[0] if v.nunique() == 1 else "")
        strata = [s for s in present.index if present[s] > 0 and not same[s]]
        empty += [f"{s} ({bucket_label(target)})" for s in present.index if present[s] == 0]
        repeated += [f"{s} = {same[s]} ({bucket_label(target)})" for s in present.index if present[s] > 0 and same[s]]
        headline = set(sub.loc[sub["headline"].astype(bool), "stratum"])
        ticks = {s: ("★ " if s in headline else "") + s.replace(" · ", " ·\n") + "\n" + _n_range(sub.loc[sub["stratum"] == s, "n"]) + " groups\n"
                 + _n_range(sub.loc[sub["stratum"] == s, "n_target"]) + " / " + _n_range(sub.loc[sub["stratum"] == s, "n_reference"]) + " items"
                 for s in strata}
        grouped_bars(ax, sub, strata, _ordered(sub["config"], CONFIG_ORDER), group_col="stratum", series_col="config",
                     group_label=lambda s: ticks[s], annotate=False)
        ax.tick_params(axis="x", labelsize=7)
        for tick, s in zip(ax.get_xticklabels(), strata):
            tick.set_fontweight("bold" if s in headline else "normal")
        ax.set_ylabel(f"Δ log2 η: {bucket_label(target)} − {bucket_label('T_ok')}\n(group-paired, mean over task groups)")
        ax.set_title(f"({'cd'[targets.index(target)]}) {bucket_label('T_ok')} → {bucket_label(target)} shift by stratum")
    for ax in axes[1][len(targets):]:
        ax.axis("off")
    if targets:
        legend_outside(axes[1][len(targets) - 1])
    lines = ["(c, d): per record log2 η = log2((ᾱ_B + ε) / (ᾱ_P + ε)); per task group, mean over its target items − mean over its "
             "T_ok items; bars: mean over the groups with both buckets, whiskers: 95% bootstrap CI over task groups; under each stratum: "
             "task groups and target / T_ok items per bar (a range where configurations differ).",
             "strata: pooled = every record; tool- / abstention-correct = the target items whose correct action is a tool call / "
             "abstention (vs every T_ok item of the group); decision / later name row = records of both buckets read at the decision "
             "row / at a later row of the correct name; ★ = the headline stratum."]
    if empty:
        lines.append("not shown, no task group with records of both buckets: " + ", ".join(empty) + ".")
    if repeated:
        lines.append("not drawn again, the same records as another stratum: " + ", ".join(repeated) + ".")
    headline = shift_headline(shifts)
    if headline:
        lines.append(headline + ".")
    for r, ok in zip(controls.itertuples(), has_ci(controls)):
        ci = f"[{r.low:+.3f}, {r.high:+.3f}]" if ok else f"({no_ci_label(r.n)})"
        lines.append(f"{label('basm')} shift − {label(r.control)} shift ({bucket_label(r.target)}, {r.stratum}): {r.value:+.3f} {ci}, "
                     f"{int(r.n)} task groups.")
    if len(eta):
        lines.append(f"(a, b): every record with non-empty B and P, tool- and abstention-correct pooled: {_n_range(eta['n'])} task groups, "
                     f"{_n_range(eta['n_items'])} items per bar.")
    rows = sorted(set(eta["row"]) | set(shifts["row"]))
    fig.suptitle(f"{'/'.join(rows).capitalize()}-row attention to boundary vs procedure spans, and its shift between buckets", y=1.01)
    footnote(fig, "\n".join([*lines, note]))
    return fig


def _n_range(values: pd.Series) -> str:
    """"12", or "10–12" where the rows of a caption's cell differ."""
    values = sorted(set(int(v) for v in values))
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


def _margin_bars(ax: plt.Axes, table: pd.DataFrame, column: str, ylabel: str) -> None:
    """One bar per configuration (T_wrong), with CI. table: config, measure, value, low, high, n."""
    sub = table[table["measure"] == column]
    configs = _ordered(sub["config"], ("proc", "pad-filler", "pad-procedure", "basm"))
    sub = sub.assign(group="all")
    grouped_bars(ax, sub, ["all"], configs, group_col="group", series_col="config", group_label=lambda g: "")
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
    _margin_bars(axes[0], table, "margin", "wrong-tool margin (logits)")
    _margin_bars(axes[1], table, "broad_margin", "tool-vs-control margin (logits)")
    n = int(table["n"].max()) if len(table) else 0
    items = int(table["n_items"].max()) if "n_items" in table and len(table) else 0
    axes[0].set_title(f"{bucket_label('T_wrong')}: wrong-tool margin")
    axes[1].set_title(f"{bucket_label('T_wrong')}: tool-vs-control margin")
    legend_outside(axes[1])
    if with_diff:
        contrasts = list(dict.fromkeys(differences["contrast"]))
        palette = dict(zip(contrasts, (CONFIG_COLORS["proc"], CONFIG_COLORS["pad-filler"], CONFIG_COLORS["pad-procedure"])))
        grouped_bars(axes[2], differences, _ordered(differences["measure"], ("margin", "broad_margin")), contrasts,
                     group_col="measure", series_col="contrast", series_label=lambda c: c, series_color=lambda c: palette.get(c, "0.5"),
                     group_label=lambda m: SHORT_MEASURE_LABELS[m])
        axes[2].set_ylabel("paired difference (logits)")
        axes[2].set_title("the claims, paired by item")
        axes[2].legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=8)
    fig.suptitle(f"Boundary fields suppress the wrong tool beyond equal-length controls (n = {n} task groups, {items} items)", y=1.02)
    footnote(fig, note, y=-0.12 if with_diff else -0.01)
    return fig


KNOCKOUT_LABELS = {"boundary": "boundary span B", "random": "|B| pool positions", "count_boundary": "n positions of B (count-matched)",
                   "count_pool": "n pool positions (count-matched)", "mass_matched": "pool positions, B's attention mass (mass-matched)",
                   "random_anywhere": "|B| positions anywhere", "procedure": "procedure span P"}
SHORT_MEASURE_LABELS = {"margin": "wrong-tool\n(Eq. 1, tools)", "broad_margin": "tool-vs-\ncontrol", "correct_margin": "correct-\ntool",
                        "call_logodds": "call\nlog-odds"}
MEASURE_LABELS = {"margin": "wrong-tool margin (Eq. 1 on the tools)", "broad_margin": "tool-vs-control margin",
                  "correct_margin": "correct-tool margin", "call_logodds": "call log-odds (abstention)"}


def _knockout_panel(ax: plt.Axes, deltas: pd.DataFrame, recovery: pd.DataFrame | None, labels: dict[str, str] | None = None) -> None:
    """Δm per knockout (boundary, the controls, procedure) for the wrong-tool and broad margins on T_wrong.

    deltas: bucket, knockout, measure, value, low, high, n; ``labels``: knockout -> legend label
    (default :data:`KNOCKOUT_LABELS`; the knockout analysis marks which controls are neutral).
    """
    labels = labels or KNOCKOUT_LABELS
    sub = deltas[(deltas["bucket"] == "T_wrong") & deltas["knockout"].isin(KNOCKOUT_LABELS) & deltas["measure"].isin(("margin", "broad_margin"))]
    measures = _ordered(sub["measure"], ("margin", "broad_margin"))
    knockouts = _ordered(sub["knockout"], tuple(KNOCKOUT_LABELS))
    grouped_bars(ax, sub, measures, knockouts, group_col="measure", series_col="knockout",
                 series_label=lambda k: labels[k], series_color=lambda k: CONDITION_COLORS[k],
                 group_label=lambda m: SHORT_MEASURE_LABELS[m], annotate=len(knockouts) <= 4)
    ax.set_ylabel("Δm = m_knockout − m_BASM (logits)")
    if recovery is not None and len(recovery):
        text = "\n".join(f"{MEASURE_LABELS[r.measure]}: {100 * r.value:.1f}% [{100 * r.low:.0f}, {100 * r.high:.0f}] of the Proc.–BASM gap recovered"
                         if ok else f"{MEASURE_LABELS[r.measure]}: {100 * r.value:.1f}% of the Proc.–BASM gap recovered ({no_ci_label(n)})"
                         for r, ok, n in zip(recovery.itertuples(), has_ci(recovery), ci_groups(recovery)))
        ax.text(0.5, -0.16, text, transform=ax.transAxes, ha="center", va="top", fontsize=8)


def _window_panel(ax: plt.Axes, windows: pd.DataFrame) -> None:
    """Δ wrong-tool margin per layer window of the boundary knockout. windows: window, value, low, high, n."""
    x = np.arange(len(windows))
    ax.bar(x, windows["value"], color=CONDITION_COLORS["boundary"], yerr=ci_errors(windows), capsize=3)
    annotate_no_ci(ax, x, windows)
    ax.set_xticks(x, windows["window"], rotation=45, ha="right")
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.set_xlabel("boundary knockout in layers")
    ax.set_ylabel("Δ wrong-tool margin (logits)")
    ax.set_title("layer windows")


def _dose_panel(ax: plt.Axes, points: pd.DataFrame, slopes: pd.DataFrame) -> None:
    """Δm against the deciding-row attention mass removed: one point per record and draw, coloured by
    family (B's positions, the control pool's), with each family's slope through the origin and its CI.

    points: family ("B" | "pool"), knockout, mass, delta; slopes: family, slope, low, high, n.
    """
    family_color = {"B": CONDITION_COLORS["boundary"], "pool": CONDITION_COLORS["random"]}
    top = float(np.nanmax(points["mass"])) if len(points) and np.isfinite(points["mass"]).any() else 1.0
    for family, sub in points.groupby("family", sort=True):
        ax.scatter(sub["mass"], sub["delta"], s=9, alpha=0.45, color=family_color[family], edgecolors="none")
        fit = slopes[slopes["family"] == family]
        if len(fit):
            r = fit.iloc[0]
            ci = f" [{r.low:+.2f}, {r.high:+.2f}]" if np.isfinite(r.low) else f" ({no_ci_label(r.n)})"
            name = "B's positions" if family == "B" else "control pool"
            ax.plot([0, top], [0, r.slope * top], color=family_color[family], lw=1.6,
                    label=f"{name}: {r.slope:+.2f}{ci} logits per unit mass ({int(r.n_points)} points)")
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.set_xlabel("deciding-row attention mass removed")
    ax.set_ylabel("Δ wrong-tool margin (logits)")
    ax.set_title("dose–response")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=7)


def fig06_knockout_controls(deltas: pd.DataFrame, recovery: pd.DataFrame, windows: pd.DataFrame | None, note: str, *,
                            labels: dict[str, str] | None = None, dose: pd.DataFrame | None = None,
                            slopes: pd.DataFrame | None = None) -> plt.Figure:
    """Δm bars per knockout (legend and the gap recovered in a column of their own), the dose–response
    panel (with ``dose`` points) and the layer windows (with ``windows`` rows)."""
    panels = ["bars", "legend"] + (["dose"] if dose is not None and len(dose) else []) + (["windows"] if windows is not None and len(windows) else [])
    widths = {"bars": 5.0, "legend": 3.6, "dose": 5.0, "windows": 4.0}
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths[p] for p in panels) + 1, 4.4),
                             gridspec_kw={"width_ratios": [widths[p] for p in panels]}, squeeze=False)
    axes = dict(zip(panels, axes[0]))
    _knockout_panel(axes["bars"], deltas, None, labels)
    axes["bars"].set_title(f"{bucket_label('T_wrong')}: same-prompt knockout")
    handles, names = axes["bars"].get_legend_handles_labels()
    axes["legend"].axis("off")
    axes["legend"].legend(handles, names, loc="upper left", fontsize=7.5, frameon=False)
    if recovery is not None and len(recovery):
        text = "\n".join(f"{MEASURE_LABELS[r.measure]}:\n  {100 * r.value:.1f}% [{100 * r.low:.0f}, {100 * r.high:.0f}] of the Proc.–BASM gap recovered"
                         if ok else f"{MEASURE_LABELS[r.measure]}:\n  {100 * r.value:.1f}% of the Proc.–BASM gap recovered ({no_ci_label(n)})"
                         for r, ok, n in zip(recovery.itertuples(), has_ci(recovery), ci_groups(recovery)))
        axes["legend"].text(0.0, 0.0, text, transform=axes["legend"].transAxes, ha="left", va="bottom", fontsize=7.5)
    if "dose" in axes:
        _dose_panel(axes["dose"], dose, slopes if slopes is not None else pd.DataFrame(columns=["family"]))
    if "windows" in axes:
        _window_panel(axes["windows"], windows)
    fig.suptitle("Removing deciding-row → boundary attention, against controls of the same count and the same attention mass", y=1.02)
    fig.tight_layout()
    footnote(fig, note)
    return fig


def _selectivity_panel(ax: plt.Axes, deltas: pd.DataFrame, labels: dict[str, str] | None = None) -> None:
    labels = labels or KNOCKOUT_LABELS
    table = selectivity_table(deltas, KNOCKOUT_LABELS)
    cells = [c for _, _, c in SELECTIVITY if c in set(table["cell"])]
    knockouts = _ordered(table["knockout"], tuple(KNOCKOUT_LABELS))
    grouped_bars(ax, table, cells, knockouts, group_col="cell", series_col="knockout", annotate=len(knockouts) <= 4,
                 series_label=lambda k: labels[k], series_color=lambda k: CONDITION_COLORS[k], group_label=lambda c: c)
    ax.set_ylabel("Δ margin after knockout (logits)")


def fig07_knockout_selectivity(deltas: pd.DataFrame, note: str, *, labels: dict[str, str] | None = None) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(8.5, 4.0))
    _selectivity_panel(ax, deltas, labels)
    ax.set_title("Selectivity of the boundary knockout")
    legend_outside(ax)
    footnote(fig, note)
    return fig


def legend_below(ax: plt.Axes) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=7.5)


def fig03_mechanism(eta: pd.DataFrame, suppression: pd.DataFrame, deltas: pd.DataFrame, recovery: pd.DataFrame, note: str, *,
                    labels: dict[str, str] | None = None) -> plt.Figure:
    """The four panels of Fig. 3: η per bucket, T_wrong margins, knockout controls, selectivity."""
    fig, axes = plt.subplots(2, 2, figsize=(14, 10.5), gridspec_kw={"hspace": 0.6, "wspace": 0.3})
    (eta_ax, margin_ax), (knockout_ax, selectivity_ax) = axes
    _eta_panels([eta_ax], eta)
    eta_ax.set_title("(a) boundary attention η")
    legend_below(eta_ax)
    _margin_bars(margin_ax, suppression, "margin", "wrong-tool margin (logits)")
    margin_ax.set_title(f"(b) {bucket_label('T_wrong')} wrong-tool margin")
    legend_below(margin_ax)
    _knockout_panel(knockout_ax, deltas, None, labels)
    wrong = recovery[recovery["measure"] == "margin"] if len(recovery) else recovery
    share = f": {100 * float(wrong['value'].iloc[0]):.1f}% of gap recovered" if len(wrong) else ""
    knockout_ax.set_title(f"(c) boundary knockout vs controls{share}")
    _selectivity_panel(selectivity_ax, deltas, labels)
    selectivity_ax.set_title("(d) knockout selectivity")
    # (c) and (d) draw the same knockouts: one legend under both
    handles, names = knockout_ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.05), ncol=2, fontsize=8, frameon=False)
    fig.suptitle("Boundary fields suppress wrong-tool preference through state-conditioned attention", y=0.95)
    footnote(fig, note, y=-0.06)
    return fig


def fig08_head_heatmap(log2_ratio: np.ndarray, note: str, title: str) -> plt.Figure:
    """log2_ratio: [layer, head] log2((α_B + ε) / (α_P + ε)), diverging colours centred at 0."""
    n_layers, n_heads = log2_ratio.shape
    fig, ax = plt.subplots(figsize=(max(4.5, 0.35 * n_heads + 2.5), max(3.2, 0.28 * n_layers + 1.5)))
    lim = float(np.nanmax(np.abs(log2_ratio))) if np.isfinite(log2_ratio).any() else 1.0
    sns.heatmap(log2_ratio, ax=ax, cmap="RdBu_r", center=0.0, vmin=-lim, vmax=lim,
                cbar_kws={"label": "log2(boundary / procedure attention)"})
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    footnote(fig, note)
    return fig


def fig09_candidate_heads(ranking: pd.DataFrame, causal: pd.DataFrame | None, top: int, note: str, *, floor: str,
                          match_tolerance: float) -> plt.Figure:
    """ranking: layer, head, shift (log2 ratio T_wrong − T_ok), ranked (reads B ∪ P enough to be ranked),
    floor, n_ok, n_wrong, n_abstain, n_groups (the items it is computed on); ranked heads first by
    descending shift; only those are shown.
    causal: selection (top-N / random-N), value, low, high, n, n_items, b_mass, n_abstain_excluded
    (Δ wrong-tool margin).
    floor: how the floor was set, as the caption says it ("0.05, chosen on the train split").
    match_tolerance: the random sets are called "matched" only when their mean B mass lies within
    this factor of the top set's, computed from ``causal``'s b_mass (the plotted rows)."""
    has_causal = causal is not None and len(causal) > 0
    fig, axes = plt.subplots(1, 2 if has_causal else 1, figsize=(11 if has_causal else 6.5, 4.0), squeeze=False,
                             gridspec_kw={"width_ratios": [2, 1]} if has_causal else None)
    ax = axes[0][0]
    ranked = ranking[ranking["ranked"].astype(bool)]
    shown = ranked.head(max(top, 12))
    highlighted = min(top, len(shown))
    colors = [CONDITION_COLORS["boundary"] if i < highlighted else (0.7, 0.7, 0.7) for i in range(len(shown))]
    ax.bar(np.arange(len(shown)), shown["shift"], color=colors)
    ax.set_xticks(np.arange(len(shown)), [f"L{r.layer}H{r.head}" for r in shown.itertuples()], rotation=60, ha="right", fontsize=8)
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.set_ylabel(f"Δ log2(α_B / α_P): {bucket_label('T_wrong')} − {bucket_label('T_ok')}")
    ax.set_title(f"heads ranked by the {bucket_label('T_ok')} → {bucket_label('T_wrong')} shift (top {highlighted} highlighted)")
    first = ranking.iloc[0]

    def groups(n: float) -> str:
        return f"{int(n)} task group{'' if int(n) == 1 else 's'}"

    lines = [f"left: ranking half, {groups(first['n_groups'])}: {int(first['n_ok'])} T_ok + {int(first['n_wrong'])} tool-correct "
             f"T_wrong items ({int(first['n_abstain'])} abstention-correct T_wrong items not ranked on); {len(ranked)} of {len(ranking)} heads "
             f"reach B ∪ P mass ≥ {float(first['floor']):g} in both buckets (floor {floor}); the first {len(shown)} shown"]
    if has_causal:
        ax2 = axes[0][1]
        x = np.arange(len(causal))
        ax2.bar(x, causal["value"], yerr=ci_errors(causal), capsize=3,
                color=[CONDITION_COLORS["boundary"] if s.startswith("top") else CONDITION_COLORS["random"] for s in causal["selection"]])
        annotate_no_ci(ax2, x, causal)
        ax2.set_xticks(x, causal["selection"])
        ax2.axhline(0.0, color="0.3", lw=0.8)
        ax2.set_ylabel("Δ wrong-tool margin (logits)")
        ax2.set_title("boundary knockout in these heads")
        tops, randoms = causal[causal["selection"].str.startswith("top")], causal[causal["selection"].str.startswith("random")]
        top_mass, random_mass = float(tops["b_mass"].iloc[0]), float(randoms["b_mass"].mean())
        ratio = random_mass / top_mass if top_mass > 0 else float("nan")
        matched = bool(np.isfinite(ratio) and 1 / match_tolerance <= ratio <= match_tolerance)
        excluded = int(causal["n_abstain_excluded"].iloc[0])
        lines.append(f"right: test half, {groups(causal['n'].max())}, {int(causal['n_items'].max())} tool-correct T_wrong items "
                     f"({excluded} abstention-correct excluded); random: sets of floor-passing non-top heads, pooled per record, "
                     + (f"matched on B mass (mean {random_mass:.3g} vs top {top_mass:.3g})" if matched else
                        f"NOT matched on B mass (mean {random_mass:.3g} vs top {top_mass:.3g}, outside ×{match_tolerance:g})"))
    footnote(fig, "\n".join([*lines, note]))
    return fig


# --- Figures 10–12 (linear probe control, recall-depth call rates, equal-token paired status)
def fig10_linear_probe(table: pd.DataFrame, note: str, shortcut: dict | None = None) -> plt.Figure:
    """AUC of the task-disjoint applicability probe per layer, one line per configuration (band:
    95% CI over task groups), one panel per retrieval depth k; grey: shuffled-label baseline;
    dotted: the best surface shortcut's AUC (``shortcut``: ``{"shortcut", "value", "low", "high"}``).

    table: config, k, layer, auc, low, high, null_mean, null_low, null_high, n, n_groups, note.
    """
    ks = sorted(int(k) for k in table["k"].unique())
    shown = [k for k in ks if k > 0] or ks  # k = 0 is the same prompt for every configuration
    fig, axes = plt.subplots(1, len(shown), figsize=(max(7.0, 3.9 * len(shown)), 3.9), sharey=True, squeeze=False)
    for ax, k in zip(axes[0], shown):
        sub = table[table["k"] == k]
        null = sub.groupby("layer")[["null_mean", "null_low", "null_high"]].mean().reset_index()
        if null["null_mean"].notna().any():
            ax.fill_between(null["layer"], null["null_low"], null["null_high"], color="0.6", alpha=0.25, lw=0,
                            label="shuffled labels (95% range)")
            ax.plot(null["layer"], null["null_mean"], color="0.45", lw=1, ls="--")
        for config in _ordered(sub["config"], CONFIG_ORDER):
            line = sub[sub["config"] == config].sort_values("layer")
            ax.plot(line["layer"], line["auc"], marker="o", ms=3, color=color(config), label=label(config))
            ax.fill_between(line["layer"], line["low"], line["high"], color=color(config), alpha=0.15, lw=0)
        ax.axhline(0.5, color="0.3", lw=0.8)
        if shortcut is not None:
            ax.axhline(shortcut["value"], color="firebrick", lw=1, ls=":",
                       label=f"best shortcut ({shortcut['shortcut']}; {shortcut.get('n_items', '?')} items, the probe's)")
        n_items = int(sub["n"].max()) if len(sub) else 0
        n_groups = int(sub["n_groups"].max()) if len(sub) else 0
        ax.set_title(f"k = {k}  ({n_items} items, {n_groups} task group{'s' if n_groups != 1 else ''})")
        ax.set_xlabel("layer (0 = embeddings)")
        layers = sorted(int(x) for x in sub["layer"].unique())
        step = max(1, len(layers) // 8)
        ax.set_xticks(layers[::step])
        ax.set_ylim(0.0, 1.02)
        if sub["auc"].isna().all():
            reason = sub["note"].dropna().iloc[0] if sub["note"].notna().any() else "no AUC"
            ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes, fontsize=8, color="0.3", wrap=True)
    axes[0][0].set_ylabel(f"probe AUC, {bucket_label('T_ok')} vs {bucket_label('T_wrong')}")
    axes[0][-1].legend(loc="lower right", fontsize=7.5)
    fig.suptitle("Residual-stream probe control: task-disjoint linear probes for applicability", y=1.03)
    footnote(fig, note)
    return fig


CALL_RATE_LABELS: dict[str, str] = {
    "wrong_call": "wrong-call rate",
    "correct_call": "correct-call rate",
    "abstained": "abstention rate",
    "unknown_tool": "unknown-tool rate",
    "parse_failure": "parse-failure rate",
    "off_template_call": "off-template call rate",
}
CALL_RATES_ALWAYS = ("wrong_call", "correct_call", "abstained")  # the rest are drawn where some cell is non-zero
CALL_MODE_STYLE: dict[str, tuple[str, str]] = {"lenient": ("-", "o"), "strict": ("--", "s")}  # line style, marker


def call_mode_text(formats: Sequence[str], *, lines: bool) -> str:
    """What strict and lenient mean for the decision formats shown (``lines``: with Fig. 11's line styles)."""
    from probes.scoring.toolcalls import mode_description

    styles = {"lenient": " (solid, circles)", "strict": " (dashed, squares)"} if lines else {"lenient": "", "strict": ""}
    return " · ".join([*(f"{mode}{styles[mode]}: {mode_description(mode, formats)}" for mode in ("lenient", "strict")),
                       "abstention: no call of any syntax (same in both)"])


def _n_text(frame: pd.DataFrame, what: str) -> str:
    """n per bucket of the plotted cells: '6 items (6 task groups)', a range where cells differ."""
    def span(column: pd.Series) -> str:
        values = sorted(set(column.astype(int)))
        return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"

    return "; ".join(f"{bucket if bucket != 'all' else 'all buckets'} {span(sub['n'])} {what} ({span(sub['n_groups'])} task groups)"
                     for bucket in _ordered(frame["bucket"], ("T_wrong", "T_ok", "T_repair", "all"))
                     for sub in [frame[frame["bucket"] == bucket]])


def fig11_call_rates(rates: pd.DataFrame, note: str) -> plt.Figure:
    """Greedy call rates vs retrieval depth: rows = rates (wrong call, correct call, abstention, and
    unknown tool / parse failure / off-template call where any is non-zero), columns = buckets
    (T_wrong first); one colour per configuration, solid = lenient, dashed = strict, 95% CI bars.

    rates: mode, format, config, k, bucket, rate, value, low, high, n, n_groups, count.
    """
    buckets = _ordered(rates["bucket"], ("T_wrong", "T_ok", "T_repair"))
    present = set(rates["rate"])
    nonzero = set(rates.loc[rates["value"].fillna(0) > 0, "rate"])
    kinds = [r for r in CALL_RATE_LABELS if r in present and (r in CALL_RATES_ALWAYS or r in nonzero)]
    configs = _ordered(rates["config"], CONFIG_ORDER)
    modes = [m for m in CALL_MODE_STYLE if m in set(rates["mode"])]
    plotted = rates[rates["rate"].isin(kinds)]
    fig, axes = plt.subplots(len(kinds), len(buckets), figsize=(4.0 * len(buckets), 2.6 * len(kinds) + 0.6),
                             sharex=True, sharey="row", squeeze=False)
    series = [(c, m) for c in configs for m in modes]
    offsets = {s: (i - (len(series) - 1) / 2) * 0.035 for i, s in enumerate(series)}  # dodge overlapping bars
    for row, kind in enumerate(kinds):
        for col, bucket in enumerate(buckets):
            ax = axes[row][col]
            sub = plotted[(plotted["rate"] == kind) & (plotted["bucket"] == bucket)]
            for config, mode in series:
                line = sub[(sub["config"] == config) & (sub["mode"] == mode)].sort_values("k")
                if not len(line):
                    continue
                ls, marker = CALL_MODE_STYLE[mode]
                x = line["k"] + offsets[(config, mode)]
                ax.errorbar(x, line["value"], yerr=ci_errors(line), marker=marker, ms=3.5, capsize=2.0, ls=ls,
                            color=color(config), lw=1.3, elinewidth=0.8)
                mark_no_ci(ax, x, line, color(config))
            note_no_ci(ax, sub)
            ax.set_ylim(-0.04, 1.04)
            ax.set_xticks(sorted(int(k) for k in rates["k"].unique()))
            if row == 0:
                n_items = int(sub["n"].max()) if len(sub) else 0
                n_groups = int(sub["n_groups"].max()) if len(sub) else 0
                ax.set_title(f"{bucket_label(bucket)}  ({n_items} items, {n_groups} task group{'s' if n_groups != 1 else ''})")
            if row == len(kinds) - 1:
                ax.set_xlabel("retrieval depth k")
            if col == 0:
                ax.set_ylabel(CALL_RATE_LABELS[kind])
    handles = [plt.Line2D([], [], color=color(c), lw=2, label=label(c)) for c in configs]
    handles += [plt.Line2D([], [], color="0.3", ls=CALL_MODE_STYLE[m][0], marker=CALL_MODE_STYLE[m][1], ms=4, label=m) for m in modes]
    axes[0][-1].legend(handles=handles, loc="best", fontsize=7.5)
    fig.suptitle("Realized greedy calls against retrieval depth, strict and lenient", y=1.01)
    ks = sorted(int(k) for k in plotted["k"].unique())
    caption = (f"plotted: {', '.join(CALL_RATE_LABELS[k] for k in kinds)} · modes: {', '.join(modes)} · configurations: "
               f"{', '.join(label(c) for c in configs)} · k = {', '.join(map(str, ks))} · n per point: {_n_text(plotted, 'items')}\n"
               f"{call_mode_text(sorted(set(plotted['format'])), lines=True)}")
    footnote(fig, f"{note}\n{caption}")
    return fig


PAIRED_STATUS_STYLE: dict[str, tuple[str, tuple[float, float, float]]] = {
    "both_solved": ("both solved", (0.55, 0.78, 0.55)),
    "only_basm": ("only BASM", CONFIG_COLORS["basm"]),
    "only_padding": ("only procedure padding", CONFIG_COLORS["pad-procedure"]),
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
    panels = _ordered(data["bucket"], ("T_wrong", "T_ok", "T_repair", "all"))
    ks = sorted(int(k) for k in data["k"].unique())
    modes = [m for m in CALL_MODE_STYLE if m in set(data["mode"])]
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
        ax.set_title(bucket_label(bucket) if bucket != "all" else "all buckets", loc="left", fontsize=10)
    axes[-1][0].set_xlabel("share of paired items (counts in segments)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.suptitle("Equal-token control: BASM vs procedure padding, paired outcome status (strict and lenient)", y=1.04)
    fig.legend(handles, names, ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 0.985))
    caption = (f"plotted: paired status per k = {', '.join(map(str, ks))} in modes {', '.join(modes)} · n per bar: "
               f"{_n_text(data, 'paired items')}\n{call_mode_text(sorted(set(data['format'])), lines=False)}")
    footnote(fig, f"{note}\n{caption}")
    return fig


BUCKET_ORDER = ("T_wrong", "T_ok", "T_repair")


def fig13_attribution_matrix(cells: pd.DataFrame, pool: str, note: str) -> plt.Figure:
    """The attribution matrix C (seed Eq. 1) of the margin: one panel per domain, skills × items
    (items grouped by bucket), diverging colours on one symmetric scale; a dot marks each item's
    tempting skill.

    cells: pool, outcome, domain, skill, item_id, bucket, tempting, c.
    """
    data = cells[(cells["pool"] == pool) & (cells["outcome"] == "margin")]
    domains = sorted(data["domain"].unique())
    finite = data["c"].abs().dropna()
    vmax = float(np.quantile(finite, 0.98)) if len(finite) else 1.0
    n_cols = min(4, len(domains)) or 1
    n_rows = math.ceil(len(domains) / n_cols) or 1
    fig, grid_axes = plt.subplots(n_rows, n_cols + 1, figsize=(4.2 * n_cols + 0.6, 3.4 * n_rows + 0.6), squeeze=False,
                                  gridspec_kw={"width_ratios": [*[1] * n_cols, 0.06]})
    axes, bar_axes = grid_axes[:, :-1], grid_axes[:, -1]
    image = None
    for ax, domain in zip(axes.flat, domains):
        sub = data[data["domain"] == domain]
        items = (sub.drop_duplicates("item_id").assign(order=lambda f: f["bucket"].map({b: i for i, b in enumerate(BUCKET_ORDER)}))
                 .sort_values(["order", "item_id"])["item_id"].tolist())
        skills = sorted(sub["skill"].unique())
        grid = sub.pivot_table(index="skill", columns="item_id", values="c", aggfunc="first", dropna=False).reindex(index=skills, columns=items)
        image = ax.imshow(grid.to_numpy(float), cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", interpolation="nearest")
        marks = sub[sub["tempting"]]
        ax.scatter([items.index(i) for i in marks["item_id"]], [skills.index(s) for s in marks["skill"]], s=6, c="k", marker="o", lw=0)
        buckets = sub.drop_duplicates("item_id").set_index("item_id").loc[items, "bucket"].tolist()
        edges = [i for i in range(1, len(buckets)) if buckets[i] != buckets[i - 1]]
        for edge in edges:
            ax.axvline(edge - 0.5, color="k", lw=0.8)
        starts = [0, *edges]
        ax.set_xticks([(a + b) / 2 - 0.5 for a, b in zip(starts, [*edges, len(items)])], [bucket_label(buckets[s]) for s in starts], fontsize=8)
        ax.set_yticks(range(len(skills)), skills, fontsize=6)
        ax.set_title(f"{domain} ({len(skills)} skills, {len(items)} items)", fontsize=9)
        ax.grid(False)
    for ax in list(axes.flat)[len(domains):]:
        ax.set_visible(False)
    for ax in bar_axes[1:]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, cax=bar_axes[0], label="C[j, i]: margin with − without skill (logits)")
    fig.suptitle(f"Attribution matrix C of the wrong-tool margin ({pool} pool); dot: the item's tempting skill", y=1.0)
    footnote(fig, note)
    return fig


def fig14_attribution_statistics(skills: pd.DataFrame, cells: pd.DataFrame, power: pd.DataFrame, note: str) -> plt.Figure:
    """Three panels: C̄ against H per skill (range filled, IQR open; margin, each pool), the cells'
    bootstrap sign stability, and the power of the per-cell permutation test against K.

    skills: pool, outcome, skill, c_bar, h_range, h_iqr; cells: pool, outcome, sign_stability;
    power: source, outcome, pool, K, power.
    """
    fig, axes = plt.subplots(1, 3, figsize=(15.5, 4.2))
    pools = sorted(skills["pool"].unique())
    colors = dict(zip(pools, sns.color_palette("colorblind", len(pools))))
    ax = axes[0]
    for pool in pools:
        sub = skills[(skills["pool"] == pool) & (skills["outcome"] == "margin")]
        ax.scatter(sub["c_bar"], sub["h_range"], s=14, color=colors[pool], label=f"{pool}: H = range")
        ax.scatter(sub["c_bar"], sub["h_iqr"], s=14, facecolors="none", edgecolors=colors[pool], label=f"{pool}: H = IQR")
    ax.axvline(0.0, color="0.3", lw=0.8)
    ax.set_xlabel("C̄(j): mean over items (logits)")
    ax.set_ylabel("H(j): heterogeneity over items (logits)")
    ax.set_title("C̄ against H per skill (margin)")
    ax.legend(fontsize=7)
    ax = axes[1]
    bins = np.linspace(0, 1, 21)
    for pool in pools:
        values = cells[(cells["pool"] == pool) & (cells["outcome"] == "margin")]["sign_stability"].dropna()
        ax.hist(values, bins=bins, histtype="step", lw=1.4, color=colors[pool], label=f"{pool} (n = {len(values)} cells)")
    ax.set_xlabel("share of mask resamples keeping the sign of C")
    ax.set_ylabel("cells")
    ax.set_title("Bootstrap sign stability (margin)")
    ax.legend(fontsize=7)
    ax = axes[2]
    for (source, outcome, pool), sub in power.groupby(["source", "outcome", "pool"], sort=False):
        sub = sub.sort_values("K")
        simulated = source == "simulated"
        ax.plot(sub["K"], sub["power"], marker="o" if simulated else "s", ls="-" if simulated else "--", ms=4,
                label=f"{source}: {outcome}{f' · {pool}' if pool else ''}")
    ax.axhline(0.8, color="0.5", lw=0.6, ls=":")
    ax.set_xlabel("masks K")
    ax.set_ylabel("share of per-cell tests rejecting")
    ax.set_ylim(0, 1.02)
    ax.set_title("Power of the per-cell permutation test")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("Skill attribution: row statistics, stability and power", y=1.02)
    footnote(fig, note)
    return fig


REGIME_COLORS = {"heterogeneous": "#d95f02", "beneficial": "#1b9e77", "negligible": "#7570b3", "harmful": "#e7298a", "unmeasured": "0.6"}


def fig15_curation_regimes(skills: pd.DataFrame, decisions: pd.DataFrame, heterogeneity: str, tau_split: float, tau_retire: float,
                           note: str) -> plt.Figure:
    """C̄ against H per skill (benefit scale, logits), coloured by regime, with the thresholds τ_split and
    ±τ_retire; an outline marks each skill whose split, retirement or merge passed the gate.

    skills: skill, c_bar, regime and the column ``heterogeneity`` (h_range or h_iqr) the regimes were decided on;
    decisions: step, skill, accepted."""
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    h = heterogeneity
    measured = skills.dropna(subset=["c_bar", h])
    for regime, sub in measured.groupby("regime", sort=False):
        ax.scatter(sub["c_bar"], sub[h], s=22, color=REGIME_COLORS.get(regime, "0.3"), label=f"{regime} ({len(sub)})")
    changed = set(decisions.loc[decisions["accepted"].astype(bool), "skill"])
    hit = measured[measured["skill"].isin(changed)]
    ax.scatter(hit["c_bar"], hit[h], s=80, facecolors="none", edgecolors="k", lw=1.0, label=f"changed, gate passed ({len(hit)})")
    ax.axhline(tau_split, color="0.3", lw=0.8, ls="--")
    for x in (-tau_retire, tau_retire):
        ax.axvline(x, color="0.5", lw=0.8, ls=":")
    ax.set_xlabel("C̄(j): mean benefit over development items (−C of the margin, logits)")
    ax.set_ylabel(f"H(j) ({'interquartile range' if h == 'h_iqr' else 'range'} over items, logits)")
    ax.set_title(f"Curation regimes (dashed: τ_split = {tau_split:.2f}; dotted: ±τ_retire = {tau_retire:.2f})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    footnote(fig, note)
    return fig


def fig16_masking_policies(policies: pd.DataFrame, note: str) -> plt.Figure:
    """Held-out items: the mean wrong-tool margin and the wrong-choice rate per policy (full library,
    per-item mask, reverse mask, random mask) and bucket, with 95% CIs over task groups.

    policies: outcome, bucket, policy, value, low, high."""
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.2))
    order = [p for p in ("full", "mask", "reverse", "random") if p in set(policies["policy"])]
    colors = dict(zip(order, sns.color_palette("colorblind", len(order))))
    for ax, (outcome, title) in zip(axes, (("margin", "mean wrong-tool margin (logits)"), ("wrong_choice", "wrong two-way choice rate"))):
        sub = policies[policies["outcome"] == outcome]
        buckets = [b for b in BUCKET_ORDER if b in set(sub["bucket"])]
        width = 0.8 / len(order)
        for p, policy in enumerate(order):
            cells = sub[sub["policy"] == policy].set_index("bucket").reindex(buckets)
            x = np.arange(len(buckets)) + (p - (len(order) - 1) / 2) * width
            value = cells["value"].to_numpy(float)
            err = np.vstack([value - cells["low"].to_numpy(float), cells["high"].to_numpy(float) - value])
            ax.bar(x, value, width, color=colors[policy], label=policy)
            ax.errorbar(x, value, yerr=np.nan_to_num(err), fmt="none", ecolor="k", lw=0.8, capsize=2)
        ax.set_xticks(np.arange(len(buckets)), [bucket_label(b) for b in buckets])
        ax.axhline(0.0, color="0.3", lw=0.8)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle("Per-item skill masking on held-out task groups", y=1.02)
    footnote(fig, note)
    return fig


FORK_PATH_COLORS: dict[str, tuple[float, float, float]] = {"skip": (0.55, 0.55, 0.55), "invoke": _PALETTE[2]}
FORK_SCORE_LABELS: dict[str, str] = {"entropy": "skip entropy (vocabulary)", "entropy_tools": "skip entropy (shown tools)"}


def fig17_forks_entropy(paired: pd.DataFrame, note: str) -> plt.Figure:
    """Seed 002 Fig. 3 on our forks: the entropy at the decision on the skip path (before the fork)
    and on the invoke path (after it), per k, one column per configuration; top row over the
    vocabulary, bottom row over the shown tools. Bars: mean of task-group means, whiskers 95% CIs.

    paired: config, k, quantity, skip, skip_low, skip_high, invoke, invoke_low, invoke_high, n.
    """
    quantities = [("entropy", "entropy over the vocabulary (nats)"), ("entropy_tools", "entropy over the shown tools (nats)")]
    configs = _ordered(paired["config"].unique(), CONFIG_ORDER)
    fig, axes = plt.subplots(len(quantities), len(configs), figsize=(4.6 * len(configs), 6.4), squeeze=False)
    for row, (quantity, ylabel) in enumerate(quantities):
        for col, config in enumerate(configs):
            sub = paired[(paired["quantity"] == quantity) & (paired["config"] == config)]
            long = pd.concat([pd.DataFrame({"k": sub["k"].astype(str), "path": path, "value": sub[path], "low": sub[f"{path}_low"],
                                            "high": sub[f"{path}_high"], "n": sub["n"]}) for path in ("skip", "invoke")])
            ks = [str(k) for k in sorted(sub["k"].unique())]
            # the paired difference invoke − skip (the claim) under each k: its mean and CI over task groups
            deltas = {str(r.k): f"k = {r.k}\nΔ {r.difference:+.2f}" + (f" [{r.low:+.2f}, {r.high:+.2f}]" if np.isfinite(r.low) else "")
                      for r in sub.itertuples()}
            ax = axes[row, col]
            grouped_bars(ax, long, ks, ["skip", "invoke"], group_col="k", series_col="path", series_label=lambda p: f"{p} path",
                         series_color=FORK_PATH_COLORS.get, group_label=deltas.get)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{label(config)}" if row == 0 else "")
            if row == 0 and col == len(configs) - 1:
                legend_outside(ax)
    fig.suptitle("Decision entropy before (skip) and after (invoke) the skill fork", y=1.01)
    footnote(fig, note)
    return fig


def fig18_forks_ranking(budget: pd.DataFrame, auroc: pd.DataFrame, k: int, label_name: str, note: str) -> plt.Figure:
    """Seed 002 Appendix E on our forks, at depth ``k``: the share of forked decision points where
    invoke and skip disagree (label ``label_name``) when the points are forked in order of the skip
    path's entropy, against the budget (fraction of points forked); the random ranking (expected
    precision = prevalence, grey band: 2.5–97.5% of random orders) and the all-points baseline
    (every point forked, the square at budget 1). One panel per configuration; AUROC in the titles.

    budget: config, k, score, label, budget, precision, low, high, random_precision, random_low,
    random_high, all_points_precision, n, n_positive, n_groups; auroc: config, k, score, label, auroc, low, high, p_permutation.
    """
    sub = budget[(budget["k"] == k) & (budget["label"] == label_name)]
    configs = _ordered(sub["config"].unique(), CONFIG_ORDER)
    fig, axes = plt.subplots(1, max(1, len(configs)), figsize=(6.0 * max(1, len(configs)), 4.4), squeeze=False)
    fig.subplots_adjust(wspace=0.32)
    colors = dict(zip(FORK_SCORE_LABELS, sns.color_palette("colorblind", 6)[3:5]))
    for ax, config in zip(axes[0], configs):
        cell = sub[sub["config"] == config]
        first = cell[cell["score"] == "entropy"].sort_values("budget")
        if len(first):
            ax.fill_between(first["budget"], first["random_low"], first["random_high"], facecolor="none", edgecolor="0.55", hatch="///",
                            lw=0.6, label="random ranking (95% of orders)")
            ax.plot(first["budget"], first["random_precision"], color="0.45", ls="--", lw=1, label="random ranking (expected)")
            ax.scatter([1.0], [first["all_points_precision"].iloc[-1]], marker="s", s=40, color="0.2", zorder=6, label="all points")
        titles = []
        for score, text in FORK_SCORE_LABELS.items():
            curve = cell[cell["score"] == score].sort_values("budget")
            if not len(curve):
                continue
            headline = score == "entropy"  # its 95% CI over task groups as a band; the other ranking as a line only
            if headline:
                lo, hi = ci_band(curve)
                ax.fill_between(curve["budget"], lo, hi, color=colors[score], alpha=0.15, lw=0, label=f"{text}: 95% CI")
            ax.plot(curve["budget"], curve["precision"], marker="o" if headline else "^", ms=3.5, ls="-" if headline else ":",
                    color=colors[score], label=f"ranked by {text}")
            a = auroc[(auroc["config"] == config) & (auroc["k"] == k) & (auroc["score"] == score) & (auroc["label"] == label_name)]
            if len(a):
                r = a.iloc[0]
                titles.append(f"AUROC ({text.split('(')[1][:-1]}) {r['auroc']:.2f} [{r['low']:.2f}, {r['high']:.2f}], "
                              f"random p = {r['p_permutation']:.2g}")
        n = int(first["n"].iloc[0]) if len(first) else 0
        positives = int(first["n_positive"].iloc[0]) if len(first) else 0
        ax.set_title(f"{label(config)}, k = {k}: {positives} of {n} forks disagree\n" + "\n".join(titles), fontsize=8.5)
        ax.set_xlabel("budget: fraction of decision points forked")
        ax.set_ylabel("precision: share of forked points that disagree")
        ax.set_xlim(0, 1.04)
        ax.set_ylim(-0.02, 1.02)
    legend_outside(axes[0][-1])
    fig.suptitle(f"Entropy-guided forking: finding the points where invoke and skip disagree ({label_name})", y=1.04)
    footnote(fig, note)
    return fig


CHECKER_RATE_LABELS: dict[str, str] = {"wrong_call": "wrong call", "correct_call": "correct call",
                                       "correct_runnable": "correct runnable call", "abstained": "abstention",
                                       "blocked": "blocked"}


def fig19_checker_outcomes(rates: pd.DataFrame, note: str) -> plt.Figure:
    """Call outcomes without and with the boundary checker G (Eq. 11), lenient mode, at the deepest
    k: one panel per bucket, bar groups per rate, one bar pair per configuration (light: without G,
    dark: with G), 95% CI bars over task groups.

    rates: mode, checker, format, config, k, bucket, rate, value, low, high, n, n_groups, count.
    """
    data = rates[(rates["mode"] == "lenient") & (rates["k"] == rates["k"].max())]
    buckets = _ordered(data["bucket"], ("T_wrong", "T_ok", "T_repair"))
    configs = _ordered(data["config"], CONFIG_ORDER)
    kinds = [r for r in CHECKER_RATE_LABELS if r in set(data["rate"])]
    fig, axes = plt.subplots(1, len(buckets), figsize=(4.4 * len(buckets), 3.4), sharey=True, squeeze=False)
    width = 0.8 / (2 * len(configs))
    for col, bucket in enumerate(buckets):
        ax = axes[0][col]
        sub = data[data["bucket"] == bucket]
        for i, config in enumerate(configs):
            for j, checker in enumerate(("without", "with")):
                bars = sub[(sub["config"] == config) & (sub["checker"] == checker)].set_index("rate").reindex(kinds)
                x = np.arange(len(kinds)) - 0.4 + width * (2 * i + j + 0.5)
                rgb = color(config)
                ax.bar(x, bars["value"].fillna(0), width, color=rgb, alpha=0.45 if checker == "without" else 1.0,
                       yerr=ci_errors(bars.reset_index()), capsize=1.5, error_kw={"elinewidth": 0.7})
        ax.set_xticks(np.arange(len(kinds)), [CHECKER_RATE_LABELS[k] for k in kinds])
        ax.set_ylim(0, 1.04)
        n_items = int(sub["n"].max()) if len(sub) else 0
        ax.set_title(f"{bucket_label(bucket)}  ({n_items} items, {int(sub['n_groups'].max()) if len(sub) else 0} groups)")
    axes[0][0].set_ylabel("rate (lenient)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color(c), label=label(c)) for c in configs]
    handles += [plt.Rectangle((0, 0), 1, 1, color="0.4", alpha=a, label=f"{w} G") for w, a in (("without", 0.45), ("with", 1.0))]
    axes[0][-1].legend(handles=handles, loc="best", fontsize=7.5)
    fig.suptitle(f"Greedy call outcomes without and with the boundary checker G (Eq. 11), k = {int(data['k'].max())}", y=1.02)
    footnote(fig, f"{note}\nn per bar: {_n_text(data, 'items')}")
    return fig


REPAIR_CONDITION_LABELS: dict[str, str] = {"no_hint": "no hint", "retrieval": "full re-retrieval", "hint": "h_t (Eq. 12)",
                                           "control": "control hint"}


def fig20_repair_success(rates: pd.DataFrame, note: str) -> plt.Figure:
    """Repair success per condition (no hint, full re-retrieval, h_t, equal-length control hint): one
    panel per measure (greedy repair success; Eq. 1 / chosen margin toward the wrong tool), one bar per
    condition and dataset bucket, 95% CI bars over task groups.

    rates: measure, condition, bucket, value, low, high, n, n_groups.
    """
    measures = [m for m in ("repair_success", "margin") if m in set(rates["measure"])]
    conditions = [c for c in REPAIR_CONDITION_LABELS if c in set(rates["condition"])]
    fig, axes = plt.subplots(1, len(measures), figsize=(4.6 * len(measures), 3.4), squeeze=False)
    palette = sns.color_palette("colorblind", len(conditions))
    for col, measure in enumerate(measures):
        ax = axes[0][col]
        sub = rates[rates["measure"] == measure].set_index("condition").reindex(conditions)
        ax.bar(np.arange(len(conditions)), sub["value"].fillna(0), 0.7, color=palette, yerr=ci_errors(sub.reset_index()), capsize=2.5)
        ax.set_xticks(np.arange(len(conditions)), [REPAIR_CONDITION_LABELS[c] for c in conditions], rotation=15)
        ax.set_ylabel({"repair_success": "greedy repair success", "margin": "margin (wrong − repair tool)"}[measure])
        if measure == "repair_success":
            ax.set_ylim(0, 1.04)
        else:
            ax.axhline(0, color="0.3", lw=0.8)
        ax.set_title(f"n = {int(sub['n'].max()) if sub['n'].notna().any() else 0} decisions, "
                     f"{int(sub['n_groups'].max()) if sub['n_groups'].notna().any() else 0} task groups")
    fig.suptitle("Next decision after a failed call: repair success per condition (Eq. 12)", y=1.02)
    footnote(fig, note)
    return fig
