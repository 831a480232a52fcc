"""fig23_steer's per-panel split (probes.analyses.steer._by_panel) against the per-panel boolean masks it
replaced: the same rows in the same order for every panel and line, missing ones absent, ties of α kept."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from probes.analyses.steer import _by_panel

LINE = ("config", "bucket", "layer", "window", "rows_mode", "direction")


def dose_table(seed: int = 0) -> pd.DataFrame:
    """A dose table's keys at report --quick's shape, shuffled, with a line missing, a one-row line, a tie of α and NaN values."""
    rng = np.random.default_rng(seed)
    grid = itertools.product(["proc", "bare"], ["T_wrong", "T_ok"], [8, 14], [1, 3], ["decision", "call"], ["applicability", "probe"],
                             [-4.0, -1.0, 1.0, 4.0])
    table = pd.DataFrame(list(grid), columns=[*LINE, "alpha"])
    table = table[~((table["config"] == "bare") & (table["direction"] == "probe") & (table["layer"] == 14))]  # a line never steered
    table = table[~((table["config"] == "proc") & (table["window"] == 3) & (table["direction"] == "probe") & (table["alpha"] != 1.0))]
    table = pd.concat([table, table.iloc[[5]]])  # a repeated α in one line
    table["delta_margin"] = rng.normal(size=len(table))
    table.loc[table.index[::7], "delta_margin"] = np.nan
    return table.sample(frac=1.0, random_state=seed)


def test_panels_are_the_masked_and_sorted_rows() -> None:
    dose = dose_table()
    band = dose[dose["direction"] == "applicability"].drop(columns="direction")
    for table, keys in ((dose, LINE), (band, LINE[:-1])):
        panels = _by_panel(table, keys)
        n_found = 0
        for key in itertools.product(*(sorted(set(table[k])) for k in keys)):
            mask = np.logical_and.reduce([table[k] == v for k, v in zip(keys, key)])
            masked = table[mask].sort_values("alpha")
            if masked.empty:
                assert key not in panels
                continue
            pd.testing.assert_frame_equal(panels[key], masked)
            n_found += 1
        assert n_found == len(panels) and n_found > 1
