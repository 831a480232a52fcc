"""Fig. 23 of the ``steer`` analysis: dose-response of the wrong-tool margin, the correct-choice rate and the
KL from the clean run against α, per layer (window), with the random directions' band.

Input: the tables of :mod:`probes.scoring.steer_stats` (:func:`~probes.scoring.steer_stats.dose_response`
and :func:`~probes.scoring.steer_stats.random_band`). One block of three panel rows per configuration ×
bucket (Δ margin, correct-choice rate, KL), one column per (first layer, window); one colour per
direction, solid lines for steering at the decision row, dashed for every row of the call; error bars
= 95% CIs over task groups (hollow markers: no CI); shaded: the middle 95% of the random draws.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from probes.reporting.plots import BUCKET_ORDER, CONFIG_ORDER, PALETTE, bucket_label, ci_errors, footnote, mark_no_ci, ordered, style
from probes.scoring.steer_stats import span_label

DIRECTION_ORDER = ("applicability", "config_difference", "probe", "unembedding", "shuffled")
DIRECTION_COLORS: dict[str, tuple[float, float, float]] = {
    "applicability": PALETTE[0], "config_difference": PALETTE[1], "probe": PALETTE[2], "unembedding": PALETTE[4],
    "shuffled": PALETTE[5],  # not grey: grey is the random band
}
ROWS_MODE_STYLE: dict[str, tuple[str, str]] = {"decision": ("-", "o"), "call": ("--", "s")}  # line style, marker
BAND_SHADE: dict[str, float] = {"decision": 0.28, "call": 0.12}  # opacity of the random band per rows mode
# measure shown in a panel row → (axis label, relative panel height)
PANELS: dict[str, tuple[str, float]] = {
    "delta_margin": ("Δ wrong-tool margin\n(logits)", 1.0),
    "correct_rate": ("correct-choice\nrate", 0.8),
    "kl": ("KL(clean‖steered)\n(nats)", 0.55),
}
DOSE_COLUMNS = ("config", "bucket", "direction", "layer", "window", "rows_mode", "alpha", "n_groups",
                *(f"{m}{s}" for m in PANELS for s in ("", "_low", "_high")))
BAND_COLUMNS = ("config", "bucket", "layer", "window", "rows_mode", "alpha", *(f"{m}_{s}" for m in PANELS for s in ("low", "high")))
COLUMN_WIDTH = 2.9  # inches per layer column: the panel titles fit above it
BLOCK_HEIGHT = 4.4  # inches per configuration × bucket block of three panel rows


def _check(table: pd.DataFrame, columns: tuple[str, ...], name: str, source: str) -> None:
    missing = [c for c in columns if c not in table]
    if missing:
        raise ValueError(f"fig23_steer: the {name} table lacks {missing}; pass the table of probes.scoring.steer_stats.{source}")
    if table.empty:
        raise ValueError(f"fig23_steer: the {name} table is empty; nothing to draw")
    for column, known in (("rows_mode", ROWS_MODE_STYLE), ("direction", DIRECTION_COLORS)):
        unknown = sorted(set(table[column]) - set(known)) if column in table else []
        if unknown:
            raise ValueError(f"fig23_steer: the {name} table's {column} holds {unknown}; the figure draws {list(known)} "
                             f"(add a style for a new one in probes.reporting.steer_figure)")


def _measure(frame: pd.DataFrame, measure: str) -> pd.DataFrame:
    """The plots helpers' columns (value, low, high, n_groups) for one measure of the dose table."""
    return pd.DataFrame({"value": frame[measure].to_numpy(float), "low": frame[f"{measure}_low"].to_numpy(float),
                         "high": frame[f"{measure}_high"].to_numpy(float), "n_groups": frame["n_groups"].to_numpy(float)})


def fig23_steer(dose: pd.DataFrame, band: pd.DataFrame, note: str) -> plt.Figure:
    """Δ margin, correct-choice rate and KL vs α per direction, the random band shaded; see the module."""
    _check(dose, DOSE_COLUMNS, "dose-response", "dose_response")
    _check(band, BAND_COLUMNS, "random band", "random_band")
    style()
    blocks = [(c, b) for c in ordered(dose["config"], CONFIG_ORDER) for b in ordered(dose["bucket"], BUCKET_ORDER)
              if ((dose["config"] == c) & (dose["bucket"] == b)).any()]
    spans = sorted(set(zip(dose["layer"].astype(int), dose["window"].astype(int))))
    directions = ordered(dose["direction"], DIRECTION_ORDER)
    modes = ordered(dose["rows_mode"], tuple(ROWS_MODE_STYLE))
    alphas = sorted(set(dose["alpha"].astype(float)))
    fig = plt.figure(figsize=(1.2 + COLUMN_WIDTH * len(spans) + 1.8, 0.5 + BLOCK_HEIGHT * len(blocks)))
    heights = [h for _ in blocks for _, h in PANELS.values()]
    grid = fig.add_gridspec(len(heights), len(spans) + 1, height_ratios=heights, width_ratios=[1.0] * len(spans) + [0.55])
    for b, (config, bucket) in enumerate(blocks):
        for j, (layer, window) in enumerate(spans):
            for p, (measure, (ylabel, _)) in enumerate(PANELS.items()):
                ax = fig.add_subplot(grid[b * len(PANELS) + p, j])
                at = (dose["config"] == config) & (dose["bucket"] == bucket) & (dose["layer"] == layer) & (dose["window"] == window)
                in_band = (band["config"] == config) & (band["bucket"] == bucket) & (band["layer"] == layer) & (band["window"] == window)
                for mode in modes:
                    shade = band[in_band & (band["rows_mode"] == mode)].sort_values("alpha")
                    ax.fill_between(shade["alpha"].to_numpy(float), shade[f"{measure}_low"].to_numpy(float),
                                    shade[f"{measure}_high"].to_numpy(float), color="0.5", alpha=BAND_SHADE[mode], linewidth=0)
                    for direction in directions:
                        sub = dose[at & (dose["rows_mode"] == mode) & (dose["direction"] == direction)].sort_values("alpha")
                        if sub.empty:
                            continue
                        values, x = _measure(sub, measure), sub["alpha"].to_numpy(float)
                        line, marker = ROWS_MODE_STYLE[mode]
                        rgb = DIRECTION_COLORS[direction]
                        ax.errorbar(x, values["value"], yerr=ci_errors(values), color=rgb, linestyle=line, marker=marker,
                                    ms=3.5, lw=1.3, capsize=2, elinewidth=0.8)
                        mark_no_ci(ax, x, values, rgb)
                ax.axvline(0.0, color="0.6", lw=0.6)
                if measure == "delta_margin":
                    ax.axhline(0.0, color="0.3", lw=0.8)
                    ax.set_title(f"{config} {bucket_label(bucket)} · {span_label(layer, window)}", fontsize=9.5)
                if measure == "correct_rate":
                    ax.set_ylim(-0.05, 1.05)
                ax.set_xticks(alphas, [f"{a:g}" for a in alphas])
                if measure == "kl":
                    ax.set_xlabel("α (× residual norm)", fontsize=8)
                ax.tick_params(labelsize=7.5)
                if j == 0:
                    ax.set_ylabel(ylabel, fontsize=8)
    legend_ax = fig.add_subplot(grid[:len(PANELS), -1])
    legend_ax.axis("off")
    handles = [Line2D([], [], color=DIRECTION_COLORS[d], lw=1.5, label=d.replace("_", " ")) for d in directions]
    handles += [Line2D([], [], color="0.3", linestyle=ROWS_MODE_STYLE[m][0], marker=ROWS_MODE_STYLE[m][1],
                       ms=3.5, label=f"{m} rows") for m in modes]
    handles += [Patch(color="0.5", alpha=BAND_SHADE[m], label=f"random, {m} rows\n(95% of draws)") for m in modes]
    legend_ax.legend(handles=handles, loc="upper left", fontsize=7.5, title="direction", title_fontsize=8)
    footnote(fig, note)
    return fig
