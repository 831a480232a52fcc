"""Holm's step-down adjustment (probes.scoring.claims.holm) against statsmodels' ``multipletests``."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from probes.scoring.claims import holm


@pytest.mark.parametrize("seed", range(6))
def test_holm_equals_statsmodels_with_ties_nans_and_ones(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 40))
    p = rng.choice([rng.uniform(0, 1), 1.0, 0.0, 0.25], size=m) if seed % 2 else rng.uniform(0, 0.3, size=m)
    p[rng.random(m) < 0.2] = np.nan
    finite = np.isfinite(p)
    expected = np.full(m, np.nan)
    if finite.any():
        expected[finite] = multipletests(p[finite], method="holm")[1]
    np.testing.assert_allclose(holm(p), expected, rtol=0, atol=1e-15, equal_nan=True)


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.02, 0.04 -> 3 * 0.01, max(0.03, 2 * 0.02), max(0.04, 0.04); NaN not counted
    np.testing.assert_allclose(holm([0.04, np.nan, 0.01, 0.02]), [0.04, np.nan, 0.03, 0.04], atol=1e-15, equal_nan=True)
    assert holm([]).shape == (0,)
