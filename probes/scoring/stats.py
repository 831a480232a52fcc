"""Statistics used by every analysis: cluster bootstrap CIs, paired permutation tests and the
robust aggregates of attention ratios.

Items of one task group share a template and differ only in fillers, so they are not independent:
CIs resample task groups (the mean of group means), never individual items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95% CI and the number of independent units behind it."""

    value: float
    low: float
    high: float
    n_units: int

    def __str__(self) -> str:
        return f"{self.value:+.3f} [{self.low:+.3f}, {self.high:+.3f}] (n={self.n_units})"


def group_means(values: Sequence[float], groups: Sequence[str] | None) -> np.ndarray:
    """Per-group means (groups in first-seen order), or the values themselves without groups."""
    values = np.asarray(values, dtype=float)
    if groups is None:
        return values
    groups = np.asarray(groups)
    if len(groups) != len(values):
        raise ValueError(f"{len(values)} values but {len(groups)} group labels")
    order = list(dict.fromkeys(groups.tolist()))
    return np.array([values[groups == group].mean() for group in order])


def bootstrap_mean(
    values: Sequence[float],
    groups: Sequence[str] | None = None,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> Estimate:
    """Mean with a percentile bootstrap CI over task groups (or items when ``groups`` is None);
    one unit has no CI (low = high = NaN)."""
    units = group_means(values, groups)
    units = units[np.isfinite(units)]
    if len(units) == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    if len(units) == 1:  # nothing to resample: no CI, never a zero-width one
        return Estimate(float(units[0]), float("nan"), float("nan"), 1)
    if np.all(units == units[0]):  # every unit agrees: the resampling distribution is that value
        return Estimate(float(units[0]), float(units[0]), float(units[0]), len(units))
    result = scipy_stats.bootstrap(
        (units,), np.mean, n_resamples=resamples, confidence_level=confidence,
        method="percentile", random_state=np.random.default_rng(seed),
    )
    return Estimate(float(units.mean()), float(result.confidence_interval.low), float(result.confidence_interval.high), len(units))


def paired_permutation_test(
    a: Sequence[float],
    b: Sequence[float],
    groups: Sequence[str] | None = None,
    *,
    alternative: str = "greater",
    resamples: int = 10000,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float]:
    """Sign-flip permutation test of mean(a - b) over task groups. Returns (mean difference, p)."""
    differences = group_means(np.asarray(a, dtype=float) - np.asarray(b, dtype=float), groups)
    differences = differences[np.isfinite(differences)]
    result = scipy_stats.permutation_test(
        (differences,), np.mean, permutation_type="samples", alternative=alternative,
        n_resamples=resamples, random_state=np.random.default_rng(seed),
    )
    return float(differences.mean()), float(result.pvalue)


def ratio_of_means(boundary: Sequence[float], procedure: Sequence[float], epsilon: float) -> float:
    """η aggregated robustly: mean α_B over mean α_P (+ε). Never the mean of per-head ratios,
    which heads with near-zero procedure attention blow up by orders of magnitude."""
    return float(np.mean(boundary) / (np.mean(procedure) + epsilon))


def median_log2_ratio(boundary: Sequence[float], procedure: Sequence[float], epsilon: float) -> float:
    """Median over heads of log2((α_B + ε) / (α_P + ε))."""
    boundary, procedure = np.asarray(boundary, dtype=float), np.asarray(procedure, dtype=float)
    return float(np.median(np.log2((boundary + epsilon) / (procedure + epsilon))))
