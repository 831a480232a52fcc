"""What the analyses' figures share: the look (:func:`style`), :func:`save_figure` (PNG and PDF),
CI error bars and the "no CI" notes, :func:`grouped_bars`, and the paper's names and colours of
buckets, configurations, conditions and margins.

Each figure lives with the analysis that draws it (``figNN_*`` beside its ``figures`` method in
:mod:`probes.analyses`), so adding an analysis with a figure touches one module; only what several
analyses use is here. Names follow the paper: buckets T_ok / T_wrong / T_repair (mathtext
subscripts), configuration labels from :mod:`probes.data.configs`, margins in logits, error bars =
95% bootstrap CIs over task groups.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from probes.core.files import OutputRoot
from probes.data.configs import CONFIGS, config_label
from probes.scoring.stats import MIN_CI_GROUPS, no_ci_note

BUCKET_LABELS: dict[str, str] = {
    "T_ok": r"$T_{\mathrm{ok}}$",
    "T_wrong": r"$T_{\mathrm{wrong}}$",
    "T_repair": r"$T_{\mathrm{repair}}$",
}

# One colour per configuration, stable across figures (colour-blind safe palette).
PALETTE = sns.color_palette("colorblind", 10)
CONFIG_COLORS: dict[str, tuple[float, float, float]] = {
    "base": (0.45, 0.45, 0.45),
    "proc": PALETTE[3],
    "app": PALETTE[1],
    "basm": PALETTE[0],
    "basm-no-avoid": PALETTE[9],
    "basm-no-recovery": PALETTE[4],
    "pad-filler": PALETTE[7],
    "pad-procedure": PALETTE[5],
}
CONDITION_COLORS: dict[str, tuple[float, float, float]] = {
    "boundary": PALETTE[0],
    "count_boundary": PALETTE[9],
    "random": (0.55, 0.55, 0.55),
    "count_pool": (0.7, 0.7, 0.7),
    "mass_matched": PALETTE[8],
    "mass_boundary": PALETTE[6],
    "random_anywhere": (0.85, 0.85, 0.85),
    "procedure": PALETTE[3],
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
    root = OutputRoot(out_dir)
    layout(fig)
    # Fixed metadata: identical inputs give identical files.
    paths = [root.write_figure(f"{name}.png", fig, bbox_inches="tight", metadata={"Software": None}),
             root.write_figure(f"{name}.pdf", fig, bbox_inches="tight", metadata={"CreationDate": None})]
    plt.close(fig)
    return paths


FOOTNOTE = "footnote"  # the gid of a figure's caption text, placed by layout()


def layout(fig: plt.Figure) -> None:
    """Lay a figure out for saving: tight layout over the axes, and the caption (:func:`footnote`) wrapped to the
    figure's width in a band added under them, so no text leaves the canvas and none is left floating."""
    notes = [t for t in fig.texts if t.get_gid() == FOOTNOTE]
    if not notes:
        fig.tight_layout()
        return
    renderer = fig.canvas.get_renderer()
    width, height = fig.get_size_inches()
    pad = 0.08  # inches between the band and the canvas edge
    for note in notes:
        note.set_text(wrapped(note, 0.98 * fig.bbox.width, renderer))
    band = sum(note.get_window_extent(renderer).height for note in notes) / fig.dpi + pad
    fig.set_size_inches(width, height + band)
    y = pad / 2
    for note in reversed(notes):  # stacked upwards from the bottom edge, the first on top
        note.set_position((0.01, y / (height + band)))
        y += note.get_window_extent(renderer).height / fig.dpi
    for _ in range(2):  # twice: a legend anchored below its axes moves with the axes the first pass resized
        fig.tight_layout(rect=(0, band / (height + band), 1, 1))


def wrapped(text: plt.Text, width: float, renderer) -> str:
    """``text``'s lines wrapped (at spaces) to fit ``width`` pixels as the renderer measures them."""
    lines = text.get_text().split("\n")
    chars = max(len(line) for line in lines)
    while True:
        out = "\n".join(part for line in lines for part in (textwrap.wrap(line, chars, break_on_hyphens=False) or [""]))
        probe = plt.Text(text=out, fontproperties=text.get_fontproperties(), figure=text.figure)
        if probe.get_window_extent(renderer).width <= width or chars <= 20:
            return out
        chars = int(chars * min(0.97, width / probe.get_window_extent(renderer).width))


def footnote(fig: plt.Figure, text: str) -> None:
    """The caption: small provenance lines under the axes (model, margin variant, n, aggregate...), wrapped and
    placed by :func:`layout` when the figure is saved."""
    fig.text(0.01, 0.0, text, ha="left", va="bottom", fontsize=7.5, color="0.35", gid=FOOTNOTE)


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
        errors = ci_errors(sub)
        ax.bar(pos, sub["value"].fillna(0.0), width * 0.92, yerr=errors, capsize=3,
               color=series_color(s), label=series_label(s), error_kw={"elinewidth": 1})
        # a label sits beyond its whisker's cap (above a positive bar, below a negative one), never on it
        ends = sub["value"].to_numpy(dtype=float) + np.where(sub["value"].to_numpy(dtype=float) >= 0, errors[1], -errors[0])
        for p, v, end, ok, n in zip(pos, sub["value"].to_numpy(dtype=float), ends, has_ci(sub), ci_groups(sub)):
            if not np.isfinite(v):
                continue
            text = "\n".join(([number(v)] if annotate else []) + ([] if ok or not per_bar else [no_ci_label(n)]))
            if text:
                ax.annotate(text, (p, end if np.isfinite(end) else v), xytext=(0, 3 if v >= 0 else -3), textcoords="offset points",
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


def ordered(values, preferred: Sequence[str]) -> list[str]:
    """The distinct ``values``, those in ``preferred`` first and in its order, then the rest as they come."""
    values = list(dict.fromkeys(values))
    return [v for v in preferred if v in values] + [v for v in values if v not in preferred]


BUCKET_ORDER = ("T_wrong", "T_ok", "T_repair")  # the claims' bucket first
CONFIG_ORDER = tuple(CONFIGS)

SHORT_MEASURE_LABELS = {"margin": "wrong-tool\n(Eq. 1, tools)", "broad_margin": "tool-vs-\ncontrol", "correct_margin": "correct-\ntool",
                        "call_logodds": "call\nlog-odds"}
MEASURE_LABELS = {"margin": "wrong-tool margin (Eq. 1 on the tools)", "broad_margin": "tool-vs-control margin",
                  "correct_margin": "correct-tool margin", "call_logodds": "call log-odds (abstention)"}

# calls (Fig. 11) and paired (Fig. 12) draw the two scoring modes alike
CALL_MODE_STYLE: dict[str, tuple[str, str]] = {"lenient": ("-", "o"), "strict": ("--", "s")}  # line style, marker


def call_mode_text(formats: Sequence[str], *, lines: bool) -> str:
    """What strict and lenient mean for the decision formats shown (``lines``: with Fig. 11's line styles)."""
    from probes.scoring.toolcalls import mode_description

    styles = {"lenient": " (solid, circles)", "strict": " (dashed, squares)"} if lines else {"lenient": "", "strict": ""}
    return " · ".join([*(f"{mode}{styles[mode]}: {mode_description(mode, formats)}" for mode in ("lenient", "strict")),
                       "abstention: no call of any syntax (same in both)"])


def n_text(frame: pd.DataFrame, what: str) -> str:
    """n per bucket of the plotted cells: '6 items (6 task groups)', a range where cells differ."""
    def span(column: pd.Series) -> str:
        values = sorted(set(column.astype(int)))
        return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"

    return "; ".join(f"{bucket if bucket != 'all' else 'all buckets'} {span(sub['n'])} {what} ({span(sub['n_groups'])} task groups)"
                     for bucket in ordered(frame["bucket"], ("T_wrong", "T_ok", "T_repair", "all"))
                     for sub in [frame[frame["bucket"] == bucket]])


