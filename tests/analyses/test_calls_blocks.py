"""calls.pooled_ratio (Σ hits / Σ totals with a CI over task groups), evaluated on blocks of resamples,
gives bit for bit what the former loop gave: one rng draw per resample, the drawn groups' rows
concatenated, the ratio of each resample alone (written out here as the reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from probes.analyses import calls


def reference_pooled_ratio(hits, totals, groups, *, resamples: int, seed: int):
    hits, totals, groups = np.asarray(hits, float), np.asarray(totals, float), np.asarray(groups)
    if totals.sum() == 0:
        return math.nan, math.nan, math.nan, 0
    members = [np.flatnonzero(groups == g) for g in dict.fromkeys(groups.tolist())]
    if len(members) < 2:
        return float(hits.sum() / totals.sum()), math.nan, math.nan, 0
    rng = np.random.default_rng(seed)
    values, used = [], 0
    for _ in range(resamples):
        idx = np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])
        total = totals[idx].sum()
        used += bool(total)
        if total and np.isfinite(hits[idx].sum() / total):
            values.append(hits[idx].sum() / total)
    alpha = (1 - 0.95) / 2
    return float(hits.sum() / totals.sum()), float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha)), used


@pytest.mark.parametrize("n_groups, share", [(1, 0.3), (6, 0.05), (25, 0.3)])
def test_pooled_ratio_is_the_former_loop(n_groups: int, share: float) -> None:
    """Rare totals (resamples without any: undefined, left out and not counted as used), unequal groups."""
    rng = np.random.default_rng(n_groups)
    groups = rng.permutation(np.repeat([f"g{i}" for i in range(n_groups)], rng.integers(1, 6, n_groups)))
    totals = rng.random(len(groups)) < share
    totals[0] = True
    hits = totals & (rng.random(len(groups)) < 0.6)
    new = calls.pooled_ratio(hits, totals, groups, resamples=500, seed=1)
    assert np.array_equal(new, reference_pooled_ratio(hits, totals, groups, resamples=500, seed=1), equal_nan=True)
    assert new[3] < 500 or n_groups != 6
