"""The median per-head log2 ratio's CI (probes.analyses.ratios._median_ci), evaluated on blocks of
resamples, gives bit for bit what the former loop gave: one rng draw per resample, the drawn groups'
items concatenated, median_log2 of each resample alone (both written out here as the reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from probes.analyses import ratios
from probes.scoring import stats


def reference_median_log2(alpha_b: np.ndarray, alpha_p: np.ndarray, epsilon: float = ratios.EPSILON) -> float:
    return float(np.median(np.log2((alpha_b.mean(0) + epsilon) / (alpha_p.mean(0) + epsilon))))


def reference_median_ci(alpha_b, alpha_p, groups, *, resamples: int, seed: int) -> tuple[float, float]:
    members = [np.flatnonzero(groups == g) for g in dict.fromkeys(groups.tolist())]
    if len(members) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        idx = np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])
        value = reference_median_log2(alpha_b[idx], alpha_p[idx])
        if np.isfinite(value):
            values.append(value)
    if not values:
        return math.nan, math.nan
    alpha = (1 - 0.95) / 2
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha))


@pytest.mark.parametrize("n_groups, layers, heads, block_rows", [(1, 3, 4, 2**14), (4, 3, 4, 2**14), (9, 24, 14, 2**14), (9, 24, 14, 37)])
def test_median_ci_is_the_former_loop(n_groups: int, layers: int, heads: int, block_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """α of 1 to 4 items per task group ([item, layer, head], skewed, a head at zero everywhere, one item
    NaN: the resamples drawing it have no median and are left out), blocks whole or split."""
    monkeypatch.setattr(stats, "BLOCK_ROWS", block_rows)
    rng = np.random.default_rng(n_groups + layers)
    groups = rng.permutation(np.repeat([f"g{i}" for i in range(n_groups)], rng.integers(1, 5, n_groups)))
    alpha_b = rng.beta(0.3, 4, (len(groups), layers, heads))
    alpha_p = rng.beta(0.5, 3, (len(groups), layers, heads))
    alpha_b[:, 0, 0] = alpha_p[:, 0, 0] = 0.0
    if n_groups > 4:
        alpha_p[0, 1, 1] = np.nan
    new = ratios._median_ci(alpha_b, alpha_p, groups, seed=1, resamples=300)
    assert np.array_equal(new, reference_median_ci(alpha_b, alpha_p, groups, resamples=300, seed=1), equal_nan=True)
    assert np.array_equal(ratios.median_log2(alpha_b, alpha_p), reference_median_log2(alpha_b, alpha_p), equal_nan=True)
