"""Statistics used by every analysis: cluster bootstrap CIs, paired permutation tests, summaries
per cell and the robust aggregates of attention ratios.

Items of one task group share a template and differ only in fillers, so they are not independent:
CIs resample task groups (the mean of group means), never individual items.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats
from scipy.stats import rankdata
from sklearn.model_selection import StratifiedGroupKFold

DEFAULT_RESAMPLES = 2000
PERMUTATION_RESAMPLES = 10000  # sign flips of a permutation test: exact enumeration up to 13 task groups
DEFAULT_SEED = 0
MIN_CI_GROUPS = 2  # a bootstrap over fewer task groups has zero width: no CI is reported
BLOCK_ROWS = 2**14  # rows of the resamples evaluated at once: bounds a block's memory ([rows, 24, 14] α: 44 MB)


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


def drawn_groups(n_groups: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> np.ndarray:
    """[resamples, n_groups]: the groups (indices) each resample of a cluster bootstrap draws with
    replacement. One draw of the whole array gives the numbers of one draw per resample (the same
    stream, tested) in 1/25 of the time (0.7 ms instead of 18 ms for 2,000 × 60)."""
    return np.random.default_rng(seed).integers(0, n_groups, (resamples, n_groups))


def drawn_counts(n_groups: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> np.ndarray:
    """[resamples, n_groups] multiplicities (float) of the groups of :func:`drawn_groups`: for statistics
    that are sums over the drawn groups, evaluated on all resamples at once as a matrix product."""
    flat = np.arange(resamples)[:, None] * n_groups + drawn_groups(n_groups, resamples=resamples, seed=seed)
    return np.bincount(flat.ravel(), minlength=resamples * n_groups).reshape(resamples, n_groups).astype(float)


def percentile_interval(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The percentile CI of the finite resampled values (NaN, NaN without any)."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return math.nan, math.nan
    alpha = (1 - confidence) / 2
    return float(np.quantile(finite, alpha)), float(np.quantile(finite, 1 - alpha))


def resample_blocks(members: Sequence[np.ndarray], drawn: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The rows of every resample (the rows of its ``drawn`` groups, ``members[g]`` each, concatenated)
    in blocks of resamples with as many rows: (which resamples, [those resamples, rows] row indices).
    A reduction along axis 1 of a block gives each resample what the same reduction of its rows alone
    gives (the same summation order), so statistics vectorise over a block."""
    sizes = np.array([len(m) for m in members])
    grouped = np.concatenate(members)
    starts = np.cumsum(sizes) - sizes
    lengths = sizes[drawn].sum(axis=1)
    for length in np.unique(lengths):
        same = np.flatnonzero(lengths == length)
        per_block = max(1, BLOCK_ROWS // length)
        for which in (same[start:start + per_block] for start in range(0, len(same), per_block)):
            segment_sizes, segment_starts = sizes[drawn[which]].ravel(), starts[drawn[which]].ravel()
            offsets = np.repeat(segment_starts - (np.cumsum(segment_sizes) - segment_sizes), segment_sizes)
            yield which, grouped[offsets + np.arange(len(offsets))].reshape(len(which), length)


def cluster_bootstrap_blocks(
    statistic: Callable[[np.ndarray], np.ndarray],
    groups: Sequence[str],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile CI of a statistic over resamples that draw task groups with replacement (groups in
    first-seen order, :func:`drawn_groups`), each resample being the row indices of its drawn groups,
    concatenated. ``statistic`` takes a block of resamples with as many rows ([resamples, rows],
    :func:`resample_blocks`) and returns one value per resample: vectorised statistics (means, ratios
    of means, medians over heads) are evaluated on all resamples at once. For statistics that are not
    a mean of group means; :func:`bootstrap_mean` is the special case of a mean. Non-finite resamples
    are skipped; fewer than two groups give no CI: (NaN, NaN), never a zero-width one."""
    groups = np.asarray(groups)
    members = [np.flatnonzero(groups == g) for g in dict.fromkeys(groups.tolist())]
    if len(members) < MIN_CI_GROUPS:
        return math.nan, math.nan
    values = np.empty(resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        for which, rows in resample_blocks(members, drawn_groups(len(members), resamples=resamples, seed=seed)):
            values[which] = statistic(rows)
    return percentile_interval(values, confidence)


def cluster_bootstrap(
    statistic: Callable[[np.ndarray], float],
    groups: Sequence[str],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """:func:`cluster_bootstrap_blocks` of a statistic that takes one resample's rows at a time: for
    statistics that do not vectorise over resamples (a model refitted on each resample)."""
    return cluster_bootstrap_blocks(lambda block: np.array([statistic(rows) for rows in block], dtype=float), groups,
                                    resamples=resamples, seed=seed, confidence=confidence)


def bootstrap_ratio(
    numerator: Sequence[float],
    denominator: Sequence[float],
    groups: Sequence[str],
    *,
    epsilon: float = 0.0,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float, float, int]:
    """mean(numerator) / (mean(denominator) + ε) over task-group means, with a percentile CI from
    resampling task groups *jointly* for numerator and denominator (:func:`cluster_bootstrap_blocks`).
    Returns (value, low, high, n groups); low = high = NaN with fewer than two groups."""
    num, den, groups = np.asarray(numerator, float), np.asarray(denominator, float), np.asarray(groups)
    ok = np.isfinite(num) & np.isfinite(den)
    num, den, groups = num[ok], den[ok], groups[ok]
    labels = list(dict.fromkeys(groups.tolist()))
    if not labels:
        return math.nan, math.nan, math.nan, 0
    g_num, g_den = group_means(num, groups), group_means(den, groups)
    value = float(g_num.mean() / (g_den.mean() + epsilon))
    # all resamples at once: report --quick 2.1 s -> 0.04 s (py-spy) against one resample at a time
    low, high = cluster_bootstrap_blocks(lambda rows: g_num[rows].mean(axis=1) / (g_den[rows].mean(axis=1) + epsilon), labels,
                                         resamples=resamples, seed=seed)
    return value, low, high, len(labels)


def paired_permutation_test(
    a: Sequence[float],
    b: Sequence[float],
    groups: Sequence[str] | None = None,
    *,
    alternative: str = "greater",
    resamples: int = PERMUTATION_RESAMPLES,
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


def no_ci_note(n_groups: int) -> str:
    """The note of a cell too small for a CI (``""`` when it has one)."""
    n_groups = int(n_groups)
    return "" if n_groups >= MIN_CI_GROUPS else f"no CI ({n_groups} group{'' if n_groups == 1 else 's'})"


def ci_text(value: float, low: float, high: float, n_groups: int, fmt: str = "+.3f") -> str:
    """``value [low, high]``, or ``value (no CI (1 group))`` for a cell without a CI."""
    note = no_ci_note(n_groups)
    if note or not (np.isfinite(low) and np.isfinite(high)):
        return f"{value:{fmt}} ({note or 'no CI'})"
    return f"{value:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def summarise(rows: pd.DataFrame, by: Sequence[str], value: str = "margin", *, seed: int = 0) -> pd.DataFrame:
    """Mean of ``value`` per ``by`` cell with a 95% bootstrap CI over task groups.

    Columns: *by, value, low, high, n (task groups), n_items (finite rows), n_nan (undefined
    rows, e.g. margins under first-token collisions; excluded), note. A cell with fewer than two
    task groups has no CI: low = high = NaN and note "no CI (1 group)" (never a zero-width CI by
    accident); a CI of zero width (every group has the same value, e.g. identical k = 0 prompts)
    says so in its note.
    """
    # cells by position, in numpy: a pandas sub-frame per cell cost 10 ms, and steer has thousands of cells
    codes = rows.groupby(list(by), sort=False, dropna=False).ngroup().to_numpy()
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(codes.max() + 2 if len(codes) else 1))
    keys = rows[list(by)].iloc[order[bounds[:-1]]].itertuples(index=False, name=None)
    values, groups = rows[value].astype(float).to_numpy(), rows["task_group"].to_numpy()
    out = []
    for cell, key in enumerate(keys):
        members = order[bounds[cell]:bounds[cell + 1]]
        finite = members[np.isfinite(values[members])]
        est = bootstrap_mean(values[finite], groups[finite], seed=seed)
        note = no_ci_note(est.n_units) or ("zero width: every task group has this value" if est.low == est.high else "")
        out.append({**dict(zip(by, key)), "value": est.value, "low": est.low, "high": est.high, "n": est.n_units,
                    "n_items": len(finite), "n_nan": len(members) - len(finite), "note": note})
    return pd.DataFrame(out, columns=[*by, "value", "low", "high", "n", "n_items", "n_nan", "note"])


SHOWN_GROUPS: tuple[str, ...] = ("all", "shown", "not shown")
SHOWN_FLAG = "tempting_shown"  # the row column: the item's defining skill is among the k skills of its depth


def by_shown(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a ``shown`` column, split three ways (:data:`SHOWN_GROUPS`): every row (``all``),
    the rows whose defining skill is among the k skills of their depth (``shown``: the paper's
    setting) and the others (``not shown``); the last two partition the first. Feed it to
    :func:`summarise` with ``shown`` first in ``by``."""
    if SHOWN_FLAG not in rows:
        raise ValueError(f"rows lack the {SHOWN_FLAG!r} column (written by every analysis since retrieval records it); rerun the analysis")
    flag = rows[SHOWN_FLAG]
    if not flag.isin([True, False]).all():
        raise ValueError(f"{SHOWN_FLAG!r} must be true or false in every row, got {sorted(set(map(repr, flag)) - {'True', 'False'})}")
    shown = flag.astype(bool)
    return pd.concat([rows.assign(shown=group) for group, rows in
                      (("all", rows), ("shown", rows[shown]), ("not shown", rows[~shown]))], ignore_index=True)


def paired_differences(rows: pd.DataFrame, contrasts: dict[str, tuple[str, str]], *, pair: Sequence[str], side: str = "config",
                       value: str = "margin") -> pd.DataFrame:
    """Per-record differences ``value[a] − value[b]`` for each named contrast ``(a, b)`` of the
    ``side`` column (e.g. configurations), the two rows paired on the ``pair`` columns (which must
    include ``item_id`` and ``task_group``). Returns the ``pair`` columns, ``contrast`` and ``delta``
    (NaN where either side is undefined, e.g. an abstention item's tool margin); feed it to
    :func:`summarise` with ``value="delta"`` for task-group CIs of the differences."""
    # groupby + unstack, not pivot_table(dropna=False), which would cross every level of ``pair``
    wide = rows.groupby([*pair, side], sort=False)[value].first().unstack(side)
    out = []
    for name, (a, b) in contrasts.items():
        if a in wide and b in wide:
            out.append(wide.index.to_frame(index=False).assign(contrast=name, delta=(wide[a] - wide[b]).to_numpy(float)))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=[*pair, "contrast", "delta"])


def auc(y: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the Mann–Whitney rank formula (ties count one half; equals
    ``sklearn.metrics.roc_auc_score``, checked in the tests, without its per-call overhead, which
    dominates thousands of bootstrap resamples). NaN scores are dropped; one class: NaN."""
    ok = np.isfinite(scores)
    y, scores = np.asarray(y)[ok].astype(bool), np.asarray(scores, dtype=float)[ok]
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def group_bootstrap_auc_draws(y: np.ndarray, scores: np.ndarray, groups: Sequence[str], *, resamples: int, seed: int = 0) -> tuple[np.ndarray, int]:
    """The pooled AUC (positive class y = 1) of every resample of task groups drawn with replacement
    that holds both classes, and the number of resamples skipped because they held one class only:
    the same draws as :func:`cluster_bootstrap` of :func:`auc` (checked in the tests), computed in
    closed form instead of re-ranking every resample. With ``W[i, j]`` = Σ over positives of group i
    and negatives of group j of 1[s⁺ > s⁻] + ½·1[s⁺ = s⁻], a resample with group multiplicities c has
    AUC = cᵀWc / ((c·n⁺)(c·n⁻)). Fewer than two groups: no draws, none skipped."""
    y = np.asarray(y).astype(bool)
    scores = np.asarray(scores, dtype=float)
    groups = np.asarray(groups)
    order = list(dict.fromkeys(groups.tolist()))
    if len(order) < MIN_CI_GROUPS:
        return np.empty(0), 0
    index = np.array([order.index(g) for g in groups])
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    wins = (scores[pos][:, None] > scores[neg][None, :]) + 0.5 * (scores[pos][:, None] == scores[neg][None, :])
    W = np.zeros((len(order), len(order)))
    np.add.at(W, (index[pos][:, None], index[neg][None, :]), wins)
    n_pos, n_neg = np.bincount(index[pos], minlength=len(order)), np.bincount(index[neg], minlength=len(order))
    counts = drawn_counts(len(order), resamples=resamples, seed=seed)
    denominator = (counts @ n_pos) * (counts @ n_neg)
    valid = denominator > 0
    values = np.einsum("ri,ij,rj->r", counts[valid], W, counts[valid]) / denominator[valid]
    return values, int((~valid).sum())


def group_bootstrap_auc(y: np.ndarray, scores: np.ndarray, groups: Sequence[str], *, resamples: int, seed: int = 0, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile CI of the pooled AUC when task groups are resampled with replacement
    (:func:`group_bootstrap_auc_draws`); resamples without both classes are left out, uncounted
    (:func:`auc_interval` counts them and refuses a CI resting on too few)."""
    values, _ = group_bootstrap_auc_draws(y, scores, groups, resamples=resamples, seed=seed)
    if not len(values):
        return float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha))


MIN_CLASS_GROUPS = 2  # each class in at least this many task groups, or every resample's AUC rests on one group's items
MAX_SKIPPED_SHARE = 0.10  # a resample lacking a class more often than this: the percentiles describe a conditional, not the data


@dataclass(frozen=True)
class AucInterval:
    """A 95% CI of a pooled AUC over task groups, with the resamples it left out and, when no CI
    is given (low = high = NaN), why."""

    low: float
    high: float
    n_skipped: int  # resamples holding one class only (no AUC), left out of the percentiles
    refused: str  # "" when a CI is given


def one_class_probability(y: np.ndarray, groups: Sequence[str]) -> float:
    """Probability that a resample of the G task groups (G draws with replacement) holds one class
    only: ((G − G⁺)/G)^G + ((G − G⁻)/G)^G, with G⁺ (G⁻) the groups holding a positive (negative);
    every group holds some class, so no resample lacks both."""
    y, groups = np.asarray(y).astype(bool), np.asarray(groups)
    n = len(set(groups.tolist()))
    return sum(((n - len(set(groups[mask].tolist()))) / n) ** n for mask in (y, ~y)) if n else math.nan


def auc_interval(y: np.ndarray, scores: np.ndarray, groups: Sequence[str], *, resamples: int, seed: int = 0,
                 confidence: float = 0.95) -> AucInterval:
    """The percentile CI of :func:`group_bootstrap_auc` with the count of resamples it skipped,
    refused (NaN, with the reason) when fewer than :data:`MIN_CLASS_GROUPS` task groups hold a
    positive or a negative (every resample's positives would come from one group: a [0.73, 1.0] CI
    from one disagreement), or when a resample holds one class only with probability above
    :data:`MAX_SKIPPED_SHARE` (:func:`one_class_probability`: exact, so the rule does not depend on
    the draws)."""
    y, groups = np.asarray(y).astype(bool), np.asarray(groups)
    holding = {name: len(set(groups[mask].tolist())) for name, mask in (("a positive", y), ("a negative", ~y))}
    values, skipped = group_bootstrap_auc_draws(y, scores, groups, resamples=resamples, seed=seed)
    short = [f"{n} task group{'' if n == 1 else 's'} hold{'s' if n == 1 else ''} {name}" for name, n in holding.items() if n < MIN_CLASS_GROUPS]
    if short:
        return AucInterval(math.nan, math.nan, skipped, f"no CI: {' and '.join(short)} (each class needs ≥ {MIN_CLASS_GROUPS})")
    if (share := one_class_probability(y, groups)) > MAX_SKIPPED_SHARE:
        return AucInterval(math.nan, math.nan, skipped, f"no CI: a resample of the task groups holds one class only with probability "
                                                         f"{share:.4f} (> {MAX_SKIPPED_SHARE:g}; {skipped} of {resamples} skipped)")
    alpha = (1 - confidence) / 2
    return AucInterval(float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha)), skipped, "")


def permute_within_groups(y: np.ndarray, groups: Sequence[str], rng: np.random.Generator) -> np.ndarray:
    """Labels shuffled inside each task group (group composition preserved)."""
    y = np.asarray(y).copy()
    groups = np.asarray(groups)
    for g in dict.fromkeys(groups.tolist()):
        index = np.flatnonzero(groups == g)
        y[index] = y[rng.permutation(index)]
    return y


def permuted_labels(y: np.ndarray, groups: Sequence[str], n: int, seed: int = 0) -> np.ndarray:
    """``[n, len(y)]`` label permutations within task groups, drawn once (a probe shares them across its layers)."""
    rng = np.random.default_rng([seed, 1])
    return np.stack([permute_within_groups(y, groups, rng) for _ in range(n)])


MIN_FOLDS = 2  # one fold would leave no training data: every out-of-fold score would be missing


def grouped_folds(y: np.ndarray, groups: Sequence[str], n_splits: int = 5, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Task-disjoint stratified folds (train, test) index arrays.

    ``n_splits`` is lowered to the number of task groups holding each class, and further while a
    split leaves a training fold with one class (groups holding both classes can do that), so
    that every training fold contains both. No such split: no folds (empty list). The folds depend
    on ``y`` only through each group's class counts, so labels permuted within groups get the
    same folds.
    """
    if n_splits < MIN_FOLDS:
        raise ValueError(f"n_splits must be ≥ {MIN_FOLDS} (one fold leaves no training data), got {n_splits}")
    y = np.asarray(y)
    groups = np.asarray(groups)
    per_class = min(len(set(groups[y == c])) for c in (0, 1)) if len(set(y.tolist())) == 2 else 0
    for splits in range(min(n_splits, per_class, len(set(groups.tolist()))), 1, -1):
        splitter = StratifiedGroupKFold(n_splits=splits, shuffle=True, random_state=seed)
        folds = [(train, test) for train, test in splitter.split(np.zeros(len(y)), y, groups)]
        if all(len(set(y[train].tolist())) == 2 for train, _ in folds):
            return folds
    return []
