"""The cluster bootstrap over blocks of resamples (probes.scoring.stats.cluster_bootstrap_blocks) and its
vectorised statistics (bootstrap_ratio, the forks' precision at a budget, the circuit's faithfulness
ratio, the shortcuts' balanced accuracy) give bit for bit what the former loop gave: one rng draw per
resample, the drawn groups' rows concatenated, the statistic of each resample alone. That loop is
written out here as the reference."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from probes.scoring import circuit_stats, shortcuts, stats
from probes.scoring import fork_estimators as est


def reference_bootstrap(statistic: Callable[[np.ndarray], float], groups, *, resamples: int, seed: int) -> tuple[float, float]:
    """The former cluster_bootstrap: one resample at a time."""
    groups = np.asarray(groups)
    members = [np.flatnonzero(groups == g) for g in dict.fromkeys(groups.tolist())]
    if len(members) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    values = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(resamples):
            value = statistic(np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))]))
            if np.isfinite(value):
                values.append(value)
    if not values:
        return math.nan, math.nan
    alpha = (1 - 0.95) / 2  # 0.025000000000000022, as the bootstrap computes it
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha))


def same(a, b) -> bool:
    """Equal bit for bit, NaN equal to NaN."""
    return np.array_equal(np.asarray(a, float), np.asarray(b, float), equal_nan=True)


def unequal_groups(rng: np.random.Generator, n_groups: int) -> np.ndarray:
    """Task-group labels of unequal sizes (1 to 6 items), shuffled: resamples differ in their number of rows."""
    groups = np.repeat([f"g{i}" for i in range(n_groups)], rng.integers(1, 7, n_groups))
    return rng.permutation(groups)


@pytest.mark.parametrize("n_groups", [1, 2, 3, 7, 60, 501])
def test_drawn_groups_are_one_draw_per_resample(n_groups: int) -> None:
    rng = np.random.default_rng(5)
    loop = np.stack([rng.integers(0, n_groups, n_groups) for _ in range(300)])
    assert np.array_equal(stats.drawn_groups(n_groups, resamples=300, seed=5), loop)


@pytest.mark.parametrize("n_groups", [2, 13, 80])
def test_drawn_counts_are_the_former_bincount_per_resample(n_groups: int) -> None:
    """The multiplicities that looking_stats.group_draws and the AUC draws took, one bincount per resample."""
    rng = np.random.default_rng(2)
    loop = np.stack([np.bincount(rng.integers(0, n_groups, n_groups), minlength=n_groups) for _ in range(300)]).astype(float)
    assert np.array_equal(stats.drawn_counts(n_groups, resamples=300, seed=2), loop)


def test_resample_blocks_hold_each_resample_s_rows_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of one length, split at BLOCK_ROWS rows: every resample appears once, with its drawn groups'
    rows concatenated in draw order."""
    monkeypatch.setattr(stats, "BLOCK_ROWS", 50)
    groups = unequal_groups(np.random.default_rng(0), 9)
    members = [np.flatnonzero(groups == g) for g in dict.fromkeys(groups.tolist())]
    drawn = stats.drawn_groups(len(members), resamples=400, seed=1)
    seen = np.zeros(400, int)
    for which, block in stats.resample_blocks(members, drawn):
        assert block.size <= 50 or len(which) == 1
        for r, rows in zip(which, block):
            assert np.array_equal(rows, np.concatenate([members[g] for g in drawn[r]]))
        seen[which] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize("seed", [0, 3])
def test_per_resample_bootstrap_is_the_former_loop(seed: int) -> None:
    """A statistic that does not vectorise (a median with NaN items, a one-resample-at-a-time statistic)."""
    rng = np.random.default_rng(seed)
    groups = unequal_groups(rng, 12)
    values = rng.normal(size=len(groups))
    values[rng.random(len(groups)) < 0.1] = np.nan
    statistic = lambda idx: float(np.nanmedian(values[idx]) / np.nanstd(values[idx]))  # noqa: E731
    assert same(stats.cluster_bootstrap(statistic, groups, resamples=500, seed=seed), reference_bootstrap(statistic, groups, resamples=500, seed=seed))
    assert same(stats.cluster_bootstrap(statistic, ["a"] * 5, resamples=50), (math.nan, math.nan))
    assert same(stats.cluster_bootstrap(lambda idx: math.nan, groups, resamples=50), (math.nan, math.nan))


def reference_bootstrap_ratio(num, den, groups, *, epsilon, resamples, seed):
    num, den, groups = np.asarray(num, float), np.asarray(den, float), np.asarray(groups)
    ok = np.isfinite(num) & np.isfinite(den)
    num, den, groups = num[ok], den[ok], groups[ok]
    labels = list(dict.fromkeys(groups.tolist()))
    if not labels:
        return math.nan, math.nan, math.nan, 0
    g_num = np.array([num[groups == g].mean() for g in labels])
    g_den = np.array([den[groups == g].mean() for g in labels])
    low, high = reference_bootstrap(lambda idx: g_num[idx].mean() / (g_den[idx].mean() + epsilon), labels, resamples=resamples, seed=seed)
    return float(g_num.mean() / (g_den.mean() + epsilon)), low, high, len(labels)


@pytest.mark.parametrize("n_groups, epsilon", [(1, 0.0), (2, 1e-6), (40, 1e-6), (150, 0.0)])
def test_bootstrap_ratio_is_the_former_loop(n_groups: int, epsilon: float) -> None:
    """η-like ratios of α (with NaN rows, a zero denominator group) over 1 to 150 task groups."""
    rng = np.random.default_rng(n_groups)
    groups = unequal_groups(rng, n_groups)
    num, den = rng.beta(0.5, 3, len(groups)), rng.beta(0.5, 3, len(groups))
    num[::7] = np.nan
    den[groups == groups[0]] = 0.0
    with np.errstate(divide="ignore"):  # one group with a zero denominator: η = inf
        new = stats.bootstrap_ratio(num, den, groups, epsilon=epsilon, resamples=700, seed=2)
        assert same(new, reference_bootstrap_ratio(num, den, groups, epsilon=epsilon, resamples=700, seed=2))
    assert same(stats.bootstrap_ratio([np.nan], [1.0], ["a"]), (math.nan, math.nan, math.nan, 0))


def reference_budget_curve(labels, scores, groups, *, budgets, resamples, permutations, seed):
    """The former budget_curve's CI and null columns: one resample and one random order at a time."""
    def order_of(s, rng):
        shuffled = rng.permutation(len(s))
        return shuffled[np.argsort(-s[shuffled], kind="stable")]

    def precision(lab, order, fraction):
        return float(lab[order[: est.budget_size(fraction, len(lab))]].mean())

    rng = np.random.default_rng([seed, 3])
    order_of(scores, rng)
    random_orders = [rng.permutation(len(labels)) for _ in range(permutations)]
    out = []
    for fraction in budgets:
        low, high = reference_bootstrap(lambda idx: precision(labels[idx], order_of(scores[idx], np.random.default_rng([seed, 4])), fraction),
                                        groups, resamples=resamples, seed=seed)
        null = np.array([precision(labels, o, fraction) for o in random_orders])
        out.append([low, high, float(np.quantile(null, 0.025)), float(np.quantile(null, 0.975))])
    return np.array(out)


@pytest.mark.parametrize("n_groups", [1, 2, 9, 30])
def test_budget_curve_is_the_former_loop(n_groups: int) -> None:
    """Entropy-like scores with ties (rounded) and one NaN, disagreements at 20%, unequal task groups."""
    rng = np.random.default_rng(n_groups)
    groups = unequal_groups(rng, n_groups)
    labels = rng.random(len(groups)) < 0.2
    scores = np.round(rng.gamma(2.0, size=len(groups)), 1)
    scores[0] = np.nan
    curve = est.budget_curve(labels, scores, groups, resamples=400, permutations=300, seed=1)
    reference = reference_budget_curve(labels, scores, groups, budgets=est.BUDGETS, resamples=400, permutations=300, seed=1)
    assert same(curve[["low", "high", "random_low", "random_high"]].to_numpy(), reference)


def test_faithfulness_ratio_ci_is_the_former_loop() -> None:
    """mean(recovered) / mean(gap) with resamples whose gap falls below MIN_GAP left out and counted."""
    rng = np.random.default_rng(4)
    groups = unequal_groups(rng, 8)
    gap = rng.normal(0.35, 0.5, len(groups))
    recovered = gap * rng.uniform(0, 1, len(groups))
    skipped = 0

    def ratio(rows: np.ndarray) -> float:
        nonlocal skipped
        if abs(gap[rows].mean()) < circuit_stats.MIN_GAP:
            skipped += 1
            return math.nan
        return recovered[rows].mean() / gap[rows].mean()

    reference = reference_bootstrap(ratio, groups, resamples=800, seed=0)
    low, high, n_skipped = circuit_stats._ratio_ci(recovered, gap, groups, resamples=800, seed=0)
    assert same((low, high), reference) and n_skipped == skipped > 0


def reference_balanced_accuracy(correct: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean([correct[y == c].mean() for c in (0, 1)])) if len(set(y.tolist())) == 2 else float("nan")


def test_balanced_accuracy_is_the_former_one_per_resample() -> None:
    """Rare T_wrong items (resamples without any: NaN, left out) and a rule right on 70% of the items."""
    rng = np.random.default_rng(6)
    groups = unequal_groups(rng, 15)
    y = (rng.random(len(groups)) < 0.1).astype(int)
    correct = (rng.random(len(groups)) < 0.7).astype(float)
    new = stats.cluster_bootstrap_blocks(lambda block: shortcuts.balanced_accuracy(correct[block], y[block]), groups, resamples=600, seed=0)
    assert same(new, reference_bootstrap(lambda idx: reference_balanced_accuracy(correct[idx], y[idx]), groups, resamples=600, seed=0))
    assert shortcuts.balanced_accuracy(correct, y) == reference_balanced_accuracy(correct, y)
    assert math.isnan(shortcuts.balanced_accuracy(correct, np.zeros(len(y), int)))


def test_auc_draws_are_the_former_counts() -> None:
    """group_bootstrap_auc_draws counts the groups of drawn_groups as the former bincount per resample did."""
    rng = np.random.default_rng(8)
    groups = unequal_groups(rng, 10)
    y = rng.random(len(groups)) < 0.4
    scores = np.round(rng.normal(size=len(groups)), 1)
    order = list(dict.fromkeys(groups.tolist()))
    draw = np.random.default_rng(3)
    counts = np.array([np.bincount(draw.integers(0, len(order), len(order)), minlength=len(order)) for _ in range(300)], dtype=float)
    index = np.array([order.index(g) for g in groups])
    expected = []
    for c in counts:
        rows = np.repeat(np.arange(len(groups)), c[index].astype(int))
        if y[rows].any() and not y[rows].all():
            expected.append(stats.auc(y[rows], scores[rows]))
    values, skipped = stats.group_bootstrap_auc_draws(y, scores, groups, resamples=300, seed=3)
    assert skipped == 300 - len(expected)
    assert np.allclose(values, expected, rtol=0, atol=1e-12)
