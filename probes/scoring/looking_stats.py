"""Statistics of ``looking`` (looking versus picking; the closeness of the top two tools).

- **η per layer window** (:func:`window_eta`): ᾱ_B / (ᾱ_P + ε) at the deciding row, ᾱ the mean of Eq. 2's α
  over the window's heads (ε = :data:`probes.scoring.score.EPSILON`); a record *looks* at B when η exceeds
  a threshold fixed before the run (:data:`LOOKS_THRESHOLD`).
- **2 × 2 tables** (:func:`two_by_two`): counts and pooled shares of (looks, right), each share with a 95%
  percentile CI from resampling task groups: the draws of :func:`probes.scoring.stats.cluster_bootstrap`,
  taken as group multiplicities so that every pooled ratio is evaluated on all draws at once (:func:`group_draws`).
- **Conditional rates** (:func:`label_contrast`): P(right | looks), P(right | not looks) and their
  difference, pooled over items, CIs over task groups; the difference's one-sided p from permuting the
  ``looks`` labels within task groups (:func:`within_group_permutation`: a 2-group comparison, so a
  sign flip of per-item values is not its test). Its floor is the larger of 1/(permutations + 1) and
  1 / (the number of distinct within-group arrangements of the labels): a task group whose items all
  look (or all do not) cannot move, and with none that holds both the test cannot reject at all.
- **Logistic model** (:func:`logit_fit`): right ~ predictor + baseline (statsmodels ``Logit``) with
  task-group cluster-robust SEs and t with G − 1 df; perfect separation is reported, never fitted over.
- **Gap quartiles** (:func:`gap_quartile`): quartile edges of the top-two gap measured under one
  configuration (``proc``), applied to the items of both.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy.special import gammaln
from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationWarning

from probes.scoring.claims import Claim
from probes.scoring.score import EPSILON
from probes.scoring.stats import DEFAULT_RESAMPLES, MIN_CI_GROUPS, drawn_counts, percentile_interval, permuted_labels

LOOKS_THRESHOLD = 1.0  # η > 1: more attention per token to B than to P; fixed before any run
PERMUTATIONS = 9999  # within-group permutations of a looks test: floor 1e-4 where the arrangements allow it
CELLS = ((True, True), (True, False), (False, True), (False, False))  # (looks, right)
QUARTILES = (1, 2, 3, 4)


def window_eta(alpha_boundary_heads: Sequence, alpha_procedure_heads: Sequence, layers: Sequence[int]) -> float:
    """η over the heads of ``layers``: mean α_B / (mean α_P + ε), from a row's ``alpha_*_heads`` ([layer][head])."""
    b = np.asarray(alpha_boundary_heads, dtype=float)[list(layers)]
    p = np.asarray(alpha_procedure_heads, dtype=float)[list(layers)]
    return float(b.mean() / (p.mean() + EPSILON))


def group_draws(groups: Sequence[str], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """(each item's task-group index, [resamples, G] multiplicities of the groups drawn with replacement): the
    draws of :func:`probes.scoring.stats.cluster_bootstrap` with the same seed (groups in first-seen order),
    as counts (:func:`probes.scoring.stats.drawn_counts`), so that every pooled ratio of sums over items is
    evaluated on all of them at once (:func:`ratio_draws`). None with fewer than two groups (no CI)."""
    index, labels = pd.factorize(np.asarray(groups))
    if len(labels) < MIN_CI_GROUPS:
        return None
    return index, drawn_counts(len(labels), resamples=resamples, seed=seed)


def ratio_draws(numerator: np.ndarray, denominator: np.ndarray, draws: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Σ numerator / Σ denominator over the items of each resample of :func:`group_draws` (NaN where the
    denominator is 0: a resample without the items the ratio is taken over)."""
    index, counts = draws
    size = counts.shape[1]
    num = np.bincount(index, weights=np.asarray(numerator, float), minlength=size)
    den = np.bincount(index, weights=np.asarray(denominator, float), minlength=size)
    with np.errstate(divide="ignore", invalid="ignore"):
        return counts @ num / (counts @ den)


Draws = tuple[np.ndarray, np.ndarray] | None  # group_draws of the items at hand, drawn once and shared by their statistics


def pooled_mean(values: np.ndarray, groups: Sequence[str], *, seed: int = 0, draws: Draws = None) -> tuple[float, float, float]:
    """The mean of ``values`` pooled over items (a share, for an indicator) with a 95% percentile CI from
    resampling task groups (``draws``: :func:`group_draws` of ``groups``, drawn here unless given)."""
    values = np.asarray(values, float)
    value = float(values.mean()) if len(values) else math.nan
    draws = draws if draws is not None else group_draws(groups, seed=seed)
    if draws is None:
        return value, math.nan, math.nan
    return value, *percentile_interval(ratio_draws(values, np.ones(len(values)), draws))


def two_by_two(looks: np.ndarray, right: np.ndarray, groups: Sequence[str], *, seed: int = 0, draws: Draws = None) -> pd.DataFrame:
    """One row per cell (looks, right): count, pooled share of the items, its 95% CI over task groups."""
    looks, right, groups = np.asarray(looks, bool), np.asarray(right, bool), np.asarray(groups)
    n_groups = len(set(groups.tolist()))
    draws = draws if draws is not None else group_draws(groups, seed=seed)
    out = []
    for cell_looks, cell_right in CELLS:
        inside = (looks == cell_looks) & (right == cell_right)
        share, low, high = pooled_mean(inside, groups, draws=draws)
        out.append({"looks": cell_looks, "right": cell_right, "count": int(inside.sum()), "share": share, "low": low, "high": high,
                    "n_items": len(looks), "n_groups": n_groups})
    return pd.DataFrame(out)


def difference_by_label(labels: np.ndarray, values: np.ndarray) -> float:
    """mean(values | label) − mean(values | not label) over the items (NaN when a side is empty)."""
    labels, values = np.asarray(labels, bool), np.asarray(values, float)
    if labels.all() or not labels.any():
        return math.nan
    return float(values[labels].mean() - values[~labels].mean())


@dataclass(frozen=True)
class PermutationResult:
    """A within-group permutation test of a difference between the items labelled True and False."""

    difference: float
    p: float
    p_floor: float  # the smallest p this design and number of permutations can give
    permutations: int
    log10_arrangements: float  # distinct within-group arrangements of the labels (log10)


def log10_arrangements(labels: np.ndarray, groups: np.ndarray) -> float:
    """log10 of the number of distinct arrangements of binary ``labels`` within task groups: Π_g C(n_g, k_g)."""
    labels, groups = np.asarray(labels, bool), np.asarray(groups)
    total = 0.0
    for g in dict.fromkeys(groups.tolist()):
        n, k = int((groups == g).sum()), int(labels[groups == g].sum())
        total += gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)
    return float(total / math.log(10))


def within_group_permutation(values: np.ndarray, labels: np.ndarray, groups: Sequence[str], *, permutations: int = PERMUTATIONS,
                             seed: int = 0, alternative: str = "greater", index: np.ndarray | None = None) -> PermutationResult:
    """One-sided test of mean(values | label) − mean(values | not label), ``labels`` permuted within task
    groups (:func:`probes.scoring.stats.permuted_labels` of the item index, drawn once: ``index``, shape
    [permutations, n], may be passed in so that tests on the same items share it). p = (1 + #{permuted ≥
    observed}) / (permutations + 1) (≤ for ``alternative="less"``); a permutation within groups keeps each
    side's size, so no permuted difference is undefined where the observed one is defined."""
    values, labels, groups = np.asarray(values, float), np.asarray(labels, bool), np.asarray(groups)
    observed = difference_by_label(labels, values)
    arrangements = log10_arrangements(labels, groups)
    floor = max(1 / (permutations + 1), 10.0 ** -arrangements)
    if not math.isfinite(observed):
        return PermutationResult(observed, math.nan, floor, permutations, arrangements)
    if index is None:
        index = permuted_labels(np.arange(len(values)), groups, permutations, seed)
    shuffled = labels[index]
    diffs = shuffled @ values / labels.sum() - (~shuffled) @ values / (~labels).sum()
    tol = 1e-12  # float sums in another order: an arrangement equal to the observed one must count as reaching it
    hits = diffs >= observed - tol if alternative == "greater" else diffs <= observed + tol
    p = (1 + int(hits.sum())) / (permutations + 1)
    return PermutationResult(observed, p, floor, permutations, arrangements)


def label_contrast(labels: np.ndarray, values: np.ndarray, groups: Sequence[str], *, alternative: str = "greater",
                   permutations: int = PERMUTATIONS, seed: int = 0, index: np.ndarray | None = None, draws: Draws = None) -> dict[str, float]:
    """mean(values | label) (``with``), mean(values | not label) (``without``) and their difference, pooled
    over items, each with a 95% CI over task groups (resamples where a side is empty are skipped); the
    difference's one-sided within-group permutation p in ``alternative`` and its floor
    (:func:`within_group_permutation`; ``index`` and ``draws``: the permutations and the bootstrap draws of
    these items, drawn here unless given). With ``labels`` = looks and ``values`` = right: P(right | looks),
    P(right | not looks) and their difference."""
    labels, values, groups = np.asarray(labels, bool), np.asarray(values, float), np.asarray(groups)
    out: dict[str, float] = {"n_items": len(labels), "n_with": int(labels.sum()), "n_without": int((~labels).sum()),
                             "n_groups": len(set(groups.tolist())),
                             "n_groups_both": sum(len(set(labels[groups == g].tolist())) == 2 for g in set(groups.tolist()))}
    draws = draws if draws is not None else group_draws(groups, seed=seed)
    resampled = {}
    for name, side in (("with", labels), ("without", ~labels)):
        out[name] = float(values[side].mean()) if side.any() else math.nan
        resampled[name] = ratio_draws(values * side, side, draws) if draws is not None else np.full(0, math.nan)
        out[f"{name}_low"], out[f"{name}_high"] = percentile_interval(resampled[name])
    test = within_group_permutation(values, labels, groups, permutations=permutations, seed=seed, alternative=alternative, index=index)
    out["difference"] = test.difference
    out["low"], out["high"] = percentile_interval(resampled["with"] - resampled["without"])
    out.update(p=test.p, p_floor=test.p_floor, permutations=test.permutations)
    return out


def difference_claim(family: str, name: str, statement: str, contrast: dict[str, float], *, alternative: str = "greater",
                     exploratory: bool = False, unit: str = "probability", note: str = "") -> Claim:
    """The claim "the difference is above (below) 0" from a :func:`label_contrast` dict: the within-group permutation p and its floor, the task-group CI; no smallest effect of interest
    (a shifted null has no within-group permutation test)."""
    return Claim(family, name, statement, contrast["difference"], contrast["low"], contrast["high"], int(contrast["n_groups"]),
                 contrast["p"], "effect", alternative, contrast["p_floor"], unit=unit, note=note, exploratory=exploratory)


def logit_fit(right: np.ndarray, predictor: np.ndarray, baseline: np.ndarray, groups: Sequence[str]) -> dict[str, float | str]:
    """right ~ 1 + predictor + baseline (statsmodels Logit), SEs clustered by task group, t with G − 1 df.
    ``status`` says why nothing was fitted (too few groups, one outcome, a constant predictor, perfect
    separation, no convergence); the estimates are NaN then."""
    right, predictor, baseline, groups = (np.asarray(right, float), np.asarray(predictor, float), np.asarray(baseline, float),
                                          np.asarray(groups))
    ok = np.isfinite(right) & np.isfinite(predictor) & np.isfinite(baseline)
    right, predictor, baseline, groups = right[ok], predictor[ok], baseline[ok], groups[ok]
    n_groups = len(set(groups.tolist()))
    out: dict[str, float | str] = {"coef": math.nan, "se": math.nan, "low": math.nan, "high": math.nan, "p": math.nan,
                                   "baseline_coef": math.nan, "n_items": int(ok.sum()), "n_groups": n_groups}
    if n_groups < MIN_CI_GROUPS + 1:
        return {**out, "status": f"not fitted: {n_groups} task group(s); cluster-robust SEs need ≥ {MIN_CI_GROUPS + 1}"}
    if len(set(right.tolist())) < 2:
        return {**out, "status": "not fitted: every item has the same outcome"}
    for label, column in (("predictor", predictor), ("baseline", baseline)):
        if np.ptp(column) == 0:
            return {**out, "status": f"not fitted: the {label} is constant"}
    X = sm.add_constant(np.column_stack([predictor, baseline]), has_constant="add")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerfectSeparationWarning)
        warnings.simplefilter("error", ConvergenceWarning)
        try:
            fit = sm.Logit(right, X).fit(disp=0, cov_type="cluster", cov_kwds={"groups": pd.factorize(groups)[0]}, use_t=True)
        except PerfectSeparationWarning:
            return {**out, "status": "not identified: perfect separation (the outcome is predicted exactly)"}
        except (ConvergenceWarning, np.linalg.LinAlgError) as error:
            return {**out, "status": f"not fitted: {type(error).__name__}"}
    low, high = fit.conf_int()[1]
    return {**out, "coef": float(fit.params[1]), "se": float(fit.bse[1]), "low": float(low), "high": float(high),
            "p": float(fit.pvalues[1]), "baseline_coef": float(fit.params[2]), "status": "fitted"}


def gap_edges(reference_gap: Sequence[float]) -> np.ndarray:
    """The quartile edges (25th, 50th, 75th percentiles) of the reference configuration's top-two gaps."""
    gap = np.asarray(reference_gap, float)
    gap = gap[np.isfinite(gap)]
    if not len(gap):
        raise ValueError("no finite top-two gap to take quartiles of")
    return np.quantile(gap, [0.25, 0.5, 0.75])


def gap_quartile(gap: Sequence[float], edges: np.ndarray) -> np.ndarray:
    """Quartile 1..4 of each gap under ``edges`` (:func:`gap_edges`); a gap on an edge falls in the lower quartile."""
    return np.searchsorted(np.asarray(edges, float), np.asarray(gap, float), side="left") + 1
