"""Fig. 23 (probes.reporting.steer_figure) drawn from the tables of probes.scoring.steer_stats on synthetic
steer rows: one and three layer columns, both rows modes, titles that never overlap, and the refusals."""

from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from probes.analyses.steer import fig23_steer
from probes.scoring.steer_stats import dose_response, random_band


def steer_rows(layers, configs, *, modes=("decision", "call")) -> pd.DataFrame:
    """Three task groups of one T_wrong and one T_ok record per configuration; the applicability direction lowers
    the margin by 2α, the shuffled one and two random draws move it by noise."""
    rng = np.random.default_rng(0)
    rows = []
    for config, (bucket, clean), g in itertools.product(configs, (("T_wrong", 1.0), ("T_ok", -1.0)), range(3)):
        record = dict(record_id=f"{config}-{bucket}-{g}", task_group=f"{bucket}-{g}", family=f"f{g % 2}", config=config, bucket=bucket,
                      clean_margin=clean, clean_top_role="wrong" if clean > 0 else "correct")
        for layer, mode, alpha in itertools.product(layers, modes, (-1.0, 0.5, 1.0)):
            for direction, draw in (("applicability", -1), ("shuffled", -1), ("random", 0), ("random", 1)):
                margin = clean + (-2 * alpha if direction == "applicability" else 0.0) + rng.normal(0, 0.1)
                rows.append(dict(record, condition=f"{direction}{draw}", direction=direction, draw=draw, layer=layer, window=1,
                                 rows_mode=mode, alpha=alpha, margin=margin, kl_clean=abs(alpha) * 0.3,
                                 top_role="correct" if margin < 0 else "wrong"))
    return pd.DataFrame(rows)


def overlapping_titles(fig: plt.Figure) -> list[tuple[str, str]]:
    """Pairs of axes titles whose drawn boxes intersect, after the layout save_figure applies."""
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    boxes = [(ax.get_title(), ax.title.get_window_extent(renderer)) for ax in fig.axes if ax.get_title()]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)]


@pytest.mark.parametrize(("layers", "configs"), [((4,), ("proc", "basm")), ((2, 4, 6), ("basm",))])
def test_the_figure_draws_every_layer_with_titles_that_do_not_overlap(layers, configs):
    rows = steer_rows(layers, configs)
    fig = fig23_steer(dose_response(rows), random_band(rows), "synthetic rows")
    try:
        titled = [ax for ax in fig.axes if ax.get_title()]
        assert len(titled) == len(configs) * 2 * len(layers)  # configuration × bucket blocks × layer columns
        assert {ax.get_title() for ax in titled} >= {f"basm $T_{{\\mathrm{{wrong}}}}$ · L{layer}" for layer in layers}
        assert overlapping_titles(fig) == []
    finally:
        plt.close(fig)


def test_the_overlap_check_catches_cramped_titles():
    fig, axes = plt.subplots(1, 3, figsize=(3, 2))
    for ax in axes:
        ax.set_title("a title far too long for its narrow panel")
    try:
        assert overlapping_titles(fig)
    finally:
        plt.close(fig)


def test_tables_the_figure_cannot_draw_are_refused():
    rows = steer_rows((4,), ("basm",), modes=("decision",))
    dose, band = dose_response(rows), random_band(rows)
    with pytest.raises(ValueError, match=r"dose-response table lacks \['kl'.*steer_stats.dose_response"):
        fig23_steer(dose.drop(columns="kl"), band, "")
    with pytest.raises(ValueError, match="random band table is empty"):
        fig23_steer(dose, band.iloc[:0], "")
    with pytest.raises(ValueError, match=r"rows_mode holds \['every'\]"):
        fig23_steer(dose.assign(rows_mode="every"), band, "")
    with pytest.raises(ValueError, match=r"direction holds \['sideways'\]"):
        fig23_steer(dose.assign(direction="sideways"), band, "")
