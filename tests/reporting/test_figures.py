"""Shared figure conventions (probes.reporting.plots): a figure whose data has one task group draws no
interval and says so."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from probes.reporting import plots


def _whiskers(errorbar) -> int:
    """Error bars drawn (non-empty, finite segments) by an ErrorbarContainer."""
    return sum(seg.size > 0 and bool(np.isfinite(seg).all()) for seg in errorbar.lines[2][0].get_segments())


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_bar_plots_draw_no_bar_and_say_no_ci() -> None:
    frame = pd.DataFrame({"bucket": ["T_wrong", "T_wrong"], "config": ["proc", "basm"], "value": [1.0, 0.5],
                          "low": [0.5, math.nan], "high": [1.5, math.nan], "n": [3, 1]})
    fig, ax = plots.plt.subplots()
    plots.grouped_bars(ax, frame, ["T_wrong"], ["proc", "basm"], group_col="bucket", series_col="config")
    caps = [_whiskers(c.errorbar) for c in ax.containers if hasattr(c, "errorbar")]
    assert caps == [1, 0]  # proc: one whisker; basm (1 group): none, not a zero-width one
    assert any("no CI (1 group)" in t for t in _texts(fig))
    # a zero-width interval from one group (as older results files hold) draws no whisker either
    zero = frame.assign(low=[0.5, 0.5], high=[1.5, 0.5])
    assert np.isnan(plots.ci_errors(zero)[:, 1]).all() and np.isfinite(plots.ci_errors(zero)[:, 0]).all()
    plots.plt.close("all")


def test_line_and_error_bar_figures_say_no_ci() -> None:
    from probes.analyses.calls import fig11_call_rates
    from probes.analyses.heads import fig09_candidate_heads
    from probes.analyses.knockout import fig06_knockout_controls
    from probes.analyses.sweep import fig02_retrieval_trap
    from probes.scoring.score import DEFAULT_VARIANT

    sweep = pd.DataFrame({"bucket": "T_wrong", "config": "basm", "k": [0, 1], "value": [1.0, 2.0],
                          "low": [math.nan] * 2, "high": [math.nan] * 2, "n": [1, 1]})
    assert "no CI (1 group)" in _texts(fig02_retrieval_trap(sweep, "note", DEFAULT_VARIANT))
    rates = pd.DataFrame({"mode": "lenient", "format": "native", "config": "basm", "k": [0, 1], "bucket": "T_wrong", "rate": "wrong_call",
                          "value": [0.5, 0.25], "low": [0.5, 0.0], "high": [0.5, 0.5], "n": [3, 6], "n_groups": [1, 2], "count": 1})
    fig = fig11_call_rates(rates, "note")
    assert "hollow markers: no CI (1 group)" in _texts(fig)
    band = fig.axes[0].collections[0]  # the CI band covers k = 1 (2 groups) only
    assert {float(x) for path in band.get_paths() for x, _ in path.vertices} == {1.0}
    windows = pd.DataFrame({"window": ["0-1"], "value": [0.3], "low": [0.3], "high": [0.3], "n": [1]})
    recovery = pd.DataFrame({"measure": ["margin"], "value": [0.5], "low": [math.nan], "high": [math.nan], "n": [1]})
    deltas = pd.DataFrame({"bucket": "T_wrong", "knockout": ["boundary"], "measure": ["margin"], "value": [0.2],
                           "low": [math.nan], "high": [math.nan], "n": [1]})
    texts = _texts(fig06_knockout_controls(deltas, recovery, windows, "note"))
    assert sum("no CI (1 group)" in t for t in texts) == 3  # knockout bar, recovery line, window bar
    causal = pd.DataFrame({"selection": ["top-2", "random-2"], "value": [0.1, 0.2], "low": [math.nan] * 2,
                           "high": [math.nan] * 2, "n": [1, 1], "n_items": [1, 1], "b_mass": [0.2, 0.2], "n_abstain_excluded": [0, 0]})
    ranking = pd.DataFrame({"layer": [0], "head": [0], "shift": [1.0], "ranked": [True], "floor": [0.05], "n_ok": [1], "n_wrong": [1],
                            "n_abstain": [0], "n_groups": [1]})
    fig = fig09_candidate_heads(ranking, causal, 1, "note", floor="0.05, given a priori", match_tolerance=2.0)
    assert _texts(fig).count("no CI (1 group)") == 2
    plots.plt.close("all")
