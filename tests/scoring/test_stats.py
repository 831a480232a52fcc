"""The one cluster bootstrap (probes.scoring.stats.bootstrap_mean): resampling unit and no zero-width CIs;
no CI from one task group."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from probes.reporting import plots
from probes.scoring.stats import bootstrap_mean, bootstrap_ratio, no_ci_note, summarise


def test_one_group_has_no_ci_not_a_zero_width_one():
    est = bootstrap_mean([1.0, 2.0, 3.0], ["g", "g", "g"])
    assert est.value == 2.0 and est.n_units == 1 and math.isnan(est.low) and math.isnan(est.high)


def test_groups_not_items_are_resampled():
    """Twenty items in two groups: the CI spans the two group means, whatever the item count."""
    values = np.r_[np.zeros(10), np.ones(10)]
    est = bootstrap_mean(values, ["a"] * 10 + ["b"] * 10, seed=1)
    assert est.n_units == 2 and est.value == 0.5
    assert est.low == 0.0 and est.high == 1.0  # an item-level bootstrap would give about [0.28, 0.72]


def test_agreeing_groups_give_their_common_value():
    est = bootstrap_mean([0.5, 0.5, 0.5], ["a", "b", "c"])
    assert (est.value, est.low, est.high, est.n_units) == (0.5, 0.5, 0.5, 3)


def test_paired_differences_pair_records_and_never_cross_items_with_other_groups():
    """Per-record differences of two configurations, paired by item (by hand); items of other task
    groups are never crossed in (the claim over them then has one unit per task group)."""
    from probes.scoring.claims import effect_claim
    from probes.scoring.stats import paired_differences

    rows = pd.DataFrame([{"item_id": f"i{g}{j}", "task_group": f"g{g}", "config": config, "margin": value}
                         for g in range(3) for j in range(2)
                         for config, value in (("proc", 2.0 + g + j), ("basm", 0.5 * g - j))])
    rows.loc[(rows["item_id"] == "i21") & (rows["config"] == "basm"), "margin"] = np.nan  # an undefined margin
    out = paired_differences(rows, {"supp": ("basm", "proc")}, pair=["item_id", "task_group"])
    assert len(out) == 6 and out["delta"].isna().sum() == 1
    want = {f"i{g}{j}": (0.5 * g - j) - (2.0 + g + j) for g in range(3) for j in range(2)}
    for r in out.dropna().itertuples():
        assert r.delta == pytest.approx(want[r.item_id], abs=1e-12)
    claim = effect_claim("f", "c", "s", out["delta"].dropna(), out.dropna()["task_group"], alternative="less")
    assert claim.n == 3 and claim.estimate == pytest.approx(np.mean([np.mean([want["i00"], want["i01"]]),
                                                                     np.mean([want["i10"], want["i11"]]), want["i20"]]), abs=1e-12)


def _rows(groups: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"cell": "a", "task_group": groups, "margin": np.arange(len(groups), dtype=float)})


def test_summarise_gives_no_ci_for_one_group() -> None:
    one = summarise(_rows(["g1", "g1", "g1"]), ["cell"]).iloc[0]
    assert one["n"] == 1 and one["value"] == 1.0
    assert math.isnan(one["low"]) and math.isnan(one["high"]) and one["note"] == "no CI (1 group)"
    two = summarise(_rows(["g1", "g1", "g2", "g2"]), ["cell"]).iloc[0]
    assert two["n"] == 2 and two["low"] < two["high"] and two["note"] == ""
    assert no_ci_note(1) == plots.no_ci_label(1) == "no CI (1 group)"


def test_bootstrap_ratio_gives_no_ci_for_one_group() -> None:
    value, low, high, n = bootstrap_ratio([1.0, 2.0], [1.0, 1.0], ["g", "g"])
    assert n == 1 and value == 1.5 and math.isnan(low) and math.isnan(high)
