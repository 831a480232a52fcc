"""The one cluster bootstrap (probes.scoring.stats.bootstrap_mean): resampling unit and no zero-width CIs."""

from __future__ import annotations

import math

import numpy as np

from probes.scoring.stats import bootstrap_mean


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
