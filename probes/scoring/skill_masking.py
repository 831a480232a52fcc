"""Randomized skill-masking attribution (seed 003 §2.1): the estimators, on arrays.

K masks include each skill of a library independently with probability f. With ``outcomes[k, i]``
the outcome of item i under mask k and ``included[k, j, i]`` whether skill j was in the pool that
item i saw under mask k (``defined[j, i]``: whether skill j is in item i's pool at all),

- C[j, i] = mean_{k ∈ M⁺_j} o_k(i) − mean_{k ∈ M⁻_j} o_k(i)  (the seed's difference in means, its Eq. 1);
- Var C[j, i] ≤ ¼ (1/|M⁺_j| + 1/|M⁻_j|) for a binary outcome (its Eq. 2), next to the empirical
  (Welch) variance s⁺²/|M⁺| + s⁻²/|M⁻| of any outcome;
- C̄(j) = mean_i C[j, i] (its Eq. 3) and H(j) = max_i C[j, i] − min_i C[j, i] (its Eq. 4), with the
  interquartile range over items as the robust heterogeneity (see :func:`row_statistics`);
- sign stability: the share of mask bootstrap resamples (the seed's 1,000) whose C keeps its sign;
- power: a per-cell two-sided permutation test of C at level α, by simulation and by resampling the
  masks of a run, and (:func:`cell_power`) its t approximation at a cell's own |M⁺| and |M⁻|, for
  any effect size (e.g. the effects a run observed).

Every function takes a leading batch axis where resampling needs one; masks with a NaN outcome
(a margin that is undefined for an item) count in neither group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

N_BOOTSTRAP = 1000  # the seed's mask resamples (§K.2)
PERMUTATION_BLOCK = 2**18  # outcomes shuffled at a time by permutation_pvalues (2 MB of floats: cache-sized)


def draw_masks(n_masks: int, n_skills: int, inclusion: float, rng: np.random.Generator) -> np.ndarray:
    """``[n_masks, n_skills]`` Bernoulli(``inclusion``) inclusion indicators (the seed's m_k)."""
    if not 0.0 < inclusion < 1.0:
        raise ValueError(f"inclusion probability f must be in (0, 1), got {inclusion}")
    if n_masks < 2:
        raise ValueError(f"attribution needs at least 2 masks, got {n_masks}")
    return rng.random((n_masks, n_skills)) < inclusion


def _groups(outcomes: np.ndarray, included: np.ndarray, weights: np.ndarray | None, *, squares: bool = False) -> tuple[np.ndarray, ...]:
    """Weighted counts and sums (and, with ``squares``, sums of squares) of the outcomes with / without
    each skill: outcomes ``[B, K, I]``, included ``[K, J, I]``, weights ``[B, K]`` → each ``[B, J, I]``,
    in the order n⁺, s⁺, [ss⁺,] n⁻, s⁻[, ss⁻].

    Accumulated one mask at a time from zero: the additions of a three-operand einsum over masks in the
    same order (the same sums, bit for bit), on ``[B, J, I]`` buffers instead of ``[B, K, I]`` float
    copies of the outcomes (allocating those was two thirds of the power table's time)."""
    n_sums = 3 if squares else 2
    plus = [np.zeros((outcomes.shape[0], *included.shape[1:])) for _ in range(n_sums)]
    minus = [np.zeros_like(total) for total in plus]
    for k in range(outcomes.shape[1]):
        valid = np.isfinite(outcomes[:, k, None, :])
        o = np.where(valid, outcomes[:, k, None, :], 0.0)
        terms = [valid.astype(float), o, o * o][:n_sums]
        if weights is not None:
            terms = [weights[:, k, None, None] * term for term in terms]  # times a 0/1 inclusion below: the same products
        for sums, side in ((plus, included[k]), (minus, ~included[k])):
            for total, term in zip(sums, terms):
                total += side * term
    return (*plus, *minus)


def causal_scores(outcomes: np.ndarray, included: np.ndarray, defined: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """C[j, i] (seed Eq. 1); NaN where skill j is not in item i's pool or one group is empty.

    outcomes ``[K, I]`` or batched ``[B, K, I]``; included ``[K, J, I]`` bool; defined ``[J, I]``
    bool; weights ``[B, K]`` (mask multiplicities of a bootstrap resample). Returns ``[J, I]``
    or ``[B, J, I]``."""
    single = outcomes.ndim == 2
    o = outcomes[None] if single else outcomes
    n_plus, s_plus, n_minus, s_minus = _groups(o, included, weights)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = s_plus / n_plus - s_minus / n_minus
    c = np.where((n_plus > 0) & (n_minus > 0) & defined[None], c, np.nan)
    return c[0] if single else c


def cell_variances(outcomes: np.ndarray, included: np.ndarray, defined: np.ndarray) -> pd.DataFrame:
    """Per cell (skill j, item i): |M⁺|, |M⁻|, the seed's binary bound ¼(1/|M⁺| + 1/|M⁻|) (its Eq. 2)
    and the empirical variance of the difference in means, s⁺²/|M⁺| + s⁻²/|M⁻| (sample variances,
    NaN with fewer than two masks on a side). Long table, columns j, i, n_plus, n_minus, var_bound, var_empirical."""
    n_plus, s_plus, ss_plus, n_minus, s_minus, ss_minus = (a[0] for a in _groups(outcomes[None], included, None, squares=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        var_plus = (ss_plus - s_plus**2 / n_plus) / (n_plus - 1)
        var_minus = (ss_minus - s_minus**2 / n_minus) / (n_minus - 1)
        empirical = np.where((n_plus > 1) & (n_minus > 1), np.maximum(var_plus, 0) / n_plus + np.maximum(var_minus, 0) / n_minus, np.nan)
        bound = np.where((n_plus > 0) & (n_minus > 0), 0.25 * (1 / n_plus + 1 / n_minus), np.nan)
    j, i = np.nonzero(defined)
    return pd.DataFrame({"j": j, "i": i, "n_plus": n_plus[j, i].astype(int), "n_minus": n_minus[j, i].astype(int),
                         "var_bound": bound[j, i], "var_empirical": empirical[j, i]})


def row_statistics(cells: pd.DataFrame, by: Sequence[str], value: str = "c") -> pd.DataFrame:
    """Per skill (a row of C; the groups of ``by`` in the long table ``cells``, undefined cells
    dropped): ``c_bar`` (seed Eq. 3), ``h_range`` (Eq. 4) and ``h_iqr``, the interquartile range
    over items, and ``n_items``. The range is the extreme of the row, so it grows with the number
    of items and with the per-cell noise even when the skill's effect is the same everywhere (for n
    items of pure noise of s.d. σ its expectation is about 2σ·√(2 ln n)); the IQR ignores the quarter
    of cells at either end, so one or two noisy cells do not make a skill look heterogeneous, and its
    expectation under pure noise (≈ 1.35σ) does not grow with n."""
    grouped = cells[np.isfinite(cells[value].to_numpy(float))].groupby(list(by), sort=False)[value]
    return pd.DataFrame({"c_bar": grouped.mean(), "h_range": grouped.max() - grouped.min(),
                         "h_iqr": grouped.quantile(0.75) - grouped.quantile(0.25), "n_items": grouped.size()}).reset_index()


def bootstrap_weights(n_masks: int, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``[n_resamples, n_masks]`` multiplicities of masks drawn with replacement."""
    return rng.multinomial(n_masks, np.full(n_masks, 1.0 / n_masks), size=n_resamples).astype(float)


def sign_agreement(estimate: np.ndarray, resamples: np.ndarray) -> np.ndarray:
    """The share of ``resamples`` (leading axis) whose value has the sign of ``estimate``: the
    sign stability of a cell or of a row mean under the mask bootstrap. A resample where the value
    is undefined (every drawn mask on one side) counts as unstable; a zero or undefined estimate
    has no sign (NaN)."""
    agree = (np.sign(resamples) == np.sign(estimate)[None]).mean(axis=0)
    return np.where(np.isfinite(estimate) & (estimate != 0), agree, np.nan)


def permutation_pvalues(outcomes: np.ndarray, included: np.ndarray, defined: np.ndarray, n_permutations: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Two-sided permutation p-values of every cell ``[J, I]``: the masks' outcomes of each item are
    shuffled across masks (exchangeable when skill j has no effect on item i),
    p = (1 + #{|C_perm| ≥ |C|}) / (1 + n_permutations); NaN where C is undefined."""
    c = causal_scores(outcomes, included, defined)
    n_extreme = np.zeros(c.shape, dtype=int)
    # the permutations a few at a time: the same draws as one [P, K, I] draw, in cache-sized blocks instead of arrays
    # of up to 80 MB per K (a simulated power table at K = 4…50: 3.9 s → 1.3 s of CPU)
    block = max(1, PERMUTATION_BLOCK // max(1, outcomes.size))
    for start in range(0, n_permutations, block):
        order = np.argsort(rng.random((min(block, n_permutations - start), *outcomes.shape)), axis=1)  # a permutation of masks per item
        perm = causal_scores(np.take_along_axis(np.broadcast_to(outcomes, order.shape), order, axis=1), included, defined)
        n_extreme += ((np.abs(perm) >= np.abs(c)[None] - 1e-12) | ~np.isfinite(perm)).sum(axis=0)  # an undefined shuffle is no evidence
    return np.where(np.isfinite(c), (1 + n_extreme) / (1 + n_permutations), np.nan)


def cell_power(effect: float, sigma: float, n_plus: Sequence[int], n_minus: Sequence[int], *, alpha: float) -> np.ndarray:
    """Per cell, the power of a two-sided two-sample t test at level ``alpha`` (statsmodels'
    ``TTestIndPower``) to detect a difference ``effect`` between its ``n_plus`` masks with the skill
    and ``n_minus`` without, at outcome s.d. ``sigma``: the t approximation of the per-cell
    permutation test. NaN where a side holds fewer than two masks or the effect or s.d. is not usable."""
    from statsmodels.stats.power import TTestIndPower

    n_plus, n_minus = np.asarray(n_plus, dtype=float), np.asarray(n_minus, dtype=float)
    power = np.full(len(n_plus), np.nan)
    if not (np.isfinite(effect) and np.isfinite(sigma) and sigma > 0):
        return power
    for i, (plus, minus) in enumerate(zip(n_plus, n_minus)):
        if plus >= 2 and minus >= 2:
            power[i] = TTestIndPower().power(effect_size=abs(effect) / sigma, nobs1=plus, ratio=minus / plus, alpha=alpha,
                                             alternative="two-sided")
    return power


def simulated_power(n_masks: Sequence[int], inclusion: float, effect: float, *, outcome: str, noise: float = 0.0,
                    base_rate: float = 0.5, n_simulations: int = 1000, n_permutations: int = 200, alpha: float = 0.05,
                    rng: np.random.Generator) -> pd.DataFrame:
    """Power of the per-cell permutation test to detect a true effect ``effect`` of one skill, per
    number of masks K. ``outcome="binary"``: o ~ Bernoulli(base_rate ± effect/2) as the skill is
    in or out (the seed's Table 9 reads as rates 0.5 ± 0.30, ``effect`` 0.60); ``"gaussian"``: o = effect·1[in]
    + N(0, noise²) (a margin at its measured noise). Columns: K, power, n_simulations."""
    if outcome not in ("binary", "gaussian"):
        raise ValueError(f"outcome must be 'binary' or 'gaussian', got {outcome!r}")
    rows = []
    for k in n_masks:
        x = rng.random((n_simulations, k)) < inclusion
        if outcome == "binary":
            p = base_rate + effect * (x - 0.5)
            if (p < 0).any() or (p > 1).any():
                raise ValueError(f"base rate {base_rate} ± effect/2 {effect / 2} leaves [0, 1]")
            o = (rng.random((n_simulations, k)) < p).astype(float)
        else:
            o = effect * x + rng.normal(0.0, noise, (n_simulations, k))
        # each simulation is one item of a one-skill design: outcomes [K, S], its own inclusion column
        pvalues = permutation_pvalues(o.T, x.T[:, None, :], np.ones((1, n_simulations), bool), n_permutations, rng)[0]
        rows.append({"K": int(k), "power": float(np.mean(np.nan_to_num(pvalues, nan=1.0) <= alpha)), "n_simulations": n_simulations})
    return pd.DataFrame(rows)


def subsampled_detection(outcomes: np.ndarray, included: np.ndarray, defined: np.ndarray, n_masks: Sequence[int], *,
                         n_subsamples: int, n_permutations: int, alpha: float, rng: np.random.Generator) -> pd.DataFrame:
    """The share of testable cells (C defined on all the run's masks) whose permutation test rejects
    at level ``alpha`` when only K of the masks are kept (drawn without replacement, ``n_subsamples``
    times; once at K = all); a cell undefined on a subsample counts as not rejected.
    Columns: K, detected (share of cell tests: n_rejected / n_tests), n_cells, n_subsamples, n_rejected, n_tests."""
    total = outcomes.shape[0]
    testable = np.isfinite(causal_scores(outcomes, included, defined))
    rows = []
    for k in n_masks:
        if k > total:
            raise ValueError(f"cannot keep {k} of {total} masks")
        draws = 1 if k == total else n_subsamples
        hits, tests = 0, 0
        for _ in range(draws):
            keep = np.sort(rng.choice(total, size=k, replace=False))
            p = permutation_pvalues(outcomes[keep], included[keep], defined, n_permutations, rng)
            hits += int((np.nan_to_num(p[testable], nan=1.0) <= alpha).sum())
            tests += int(testable.sum())
        rows.append({"K": int(k), "detected": hits / tests if tests else np.nan, "n_cells": int(testable.sum()), "n_subsamples": draws,
                     "n_rejected": hits, "n_tests": tests})
    return pd.DataFrame(rows)
