"""``looking``'s statistics (probes.scoring.looking_stats): η over a window's heads by hand; the 2 × 2 counts; the
within-group permutation p reaches 1/(n + 1) on a perfectly separating table, is about uniform under a planted null
and cannot go below 1/arrangements (a design where no task group holds both labels is untestable); the bootstrap
draws are cluster_bootstrap's; the logistic coefficient has the planted sign and perfect separation is refused; the
gap quartiles are those of the reference gaps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from probes.scoring.claims import claims_table
from probes.scoring.looking_stats import (difference_by_label, difference_claim, gap_edges, gap_quartile, group_draws, label_contrast,
                                          logit_fit, pooled_mean, ratio_draws, percentile_interval, two_by_two, window_eta,
                                          within_group_permutation)
from probes.scoring.score import EPSILON
from probes.scoring.stats import cluster_bootstrap, permuted_labels


def _design(n_groups: int = 8, per_group: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Task groups of ``per_group`` items, half of each group labelled True."""
    groups = np.repeat([f"g{i}" for i in range(n_groups)], per_group)
    labels = np.tile(np.arange(per_group) < per_group // 2, n_groups)
    return groups, np.random.default_rng(seed).permuted(labels.reshape(n_groups, per_group), axis=1).ravel()


def test_window_eta_is_the_ratio_of_the_windows_mean_alphas() -> None:
    b = np.arange(12, dtype=float).reshape(3, 4) / 100
    p = np.full((3, 4), 0.02)
    assert window_eta(b.tolist(), p.tolist(), [1, 2]) == pytest.approx(b[1:].mean() / (0.02 + EPSILON))
    assert window_eta(b.tolist(), p.tolist(), range(3)) == pytest.approx(b.mean() / (p.mean() + EPSILON))
    assert window_eta(b.tolist(), (p * 0).tolist(), [0]) == pytest.approx(b[0].mean() / EPSILON)  # ε keeps P = 0 finite


def test_two_by_two_counts_and_shares() -> None:
    looks = np.array([1, 1, 1, 0, 0, 0, 1, 0], bool)
    right = np.array([1, 1, 0, 0, 1, 0, 1, 0], bool)
    groups = np.array(["a", "a", "b", "b", "c", "c", "d", "d"])
    table = two_by_two(looks, right, groups).set_index(["looks", "right"])
    assert table.loc[(True, True), "count"] == 3 and table.loc[(True, False), "count"] == 1
    assert table.loc[(False, True), "count"] == 1 and table.loc[(False, False), "count"] == 3
    assert table["share"].sum() == pytest.approx(1.0) and (table["low"] <= table["share"]).all() and (table["share"] <= table["high"]).all()


def test_the_draws_are_cluster_bootstraps() -> None:
    """The pooled mean's and the difference's CIs equal cluster_bootstrap of the same statistic with the same seed."""
    groups, labels = _design(n_groups=6, per_group=5)
    values = np.random.default_rng(3).normal(size=len(groups))
    _, low, high = pooled_mean(values, groups, seed=4)
    assert (low, high) == pytest.approx(cluster_bootstrap(lambda idx: values[idx].mean(), groups, seed=4))
    found = label_contrast(labels, values, groups, permutations=99, seed=4)
    expected = cluster_bootstrap(lambda idx: difference_by_label(labels[idx], values[idx]), groups, seed=4)
    assert (found["low"], found["high"]) == pytest.approx(expected)
    draws = group_draws(["a"] * 4)
    assert draws is None and math.isnan(pooled_mean(values[:4], ["a"] * 4)[1])  # one group: no CI, never a zero-width one
    two = group_draws(["a", "b"], resamples=50)
    assert np.isnan(ratio_draws([1.0, 0.0], [1.0, 0.0], two)).any() and np.isfinite(percentile_interval(ratio_draws([1, 0], [1, 1], two))).all()


def test_a_perfectly_separating_table_reaches_the_floor() -> None:
    groups, looks = _design()
    result = within_group_permutation(looks.astype(float), looks, groups, permutations=999, seed=1)
    assert result.difference == 1.0
    assert result.p == pytest.approx(1 / 1000) and result.p_floor == pytest.approx(1 / 1000)
    contrast = label_contrast(looks, looks.astype(float), groups, permutations=999, seed=1)
    assert contrast["p"] == result.p and contrast["with"] == 1.0 and contrast["without"] == 0.0


def test_the_p_is_about_uniform_under_a_planted_null() -> None:
    """Labels independent of the values: with continuous values the p is uniform (KS); with a binary outcome (right)
    the statistic has ties, so the p is discrete and may only be conservative: P(p ≤ α) ≤ α within sampling error."""
    groups, _ = _design(n_groups=6, per_group=8)
    index = permuted_labels(np.arange(len(groups)), groups, 199, seed=2)
    rng = np.random.default_rng(5)
    continuous, binary = [], []
    for _ in range(400):
        looks = rng.random(len(groups)) < 0.5
        continuous.append(within_group_permutation(rng.normal(size=len(groups)), looks, groups, permutations=199, index=index).p)
        right = rng.random(len(groups)) < 0.6
        binary.append(within_group_permutation(right.astype(float), looks, groups, permutations=199, index=index).p)
    continuous, binary = np.asarray(continuous), np.asarray(binary)
    assert scipy_stats.kstest(continuous, "uniform").pvalue > 0.01
    for alpha in (0.05, 0.1, 0.25, 0.5):
        assert np.mean(binary <= alpha) <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / 400)
    assert np.mean(binary <= 0.5) >= 0.35  # conservative through ties, not degenerate


def test_no_group_holding_both_labels_leaves_nothing_to_permute() -> None:
    """Planted: every task group looks or does not as a whole. The permutation cannot move (p = 1), the floor is 1 and
    the claim built from it is untestable, not 'not detected'."""
    groups = np.repeat(["a", "b", "c", "d"], 3)
    looks = np.repeat([True, False, True, False], 3)
    right = looks.copy()
    contrast = label_contrast(looks, right.astype(float), groups, permutations=99)
    assert contrast["difference"] == 1.0 and contrast["p"] == 1.0 and contrast["p_floor"] == 1.0 and contrast["n_groups_both"] == 0
    table = claims_table([difference_claim("looking", "planted", "planted", contrast)])
    assert table["verdict"].iloc[0].startswith("untestable at α = 0.05")
    one_mixed = np.repeat([True, False, True, False], 3)
    one_mixed[0] = False  # group a: C(3, 2) = 3 arrangements
    assert label_contrast(one_mixed, right.astype(float), groups, permutations=99)["p_floor"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_logistic_coefficient_has_the_planted_sign(sign: float) -> None:
    rng = np.random.default_rng(7)
    groups = np.repeat([f"g{i}" for i in range(30)], 12)
    looks = rng.random(len(groups)) < 0.5
    baseline = rng.normal(size=len(groups))
    right = rng.random(len(groups)) < 1 / (1 + np.exp(-(sign * 2.0 * looks - sign * 1.0 - 0.8 * baseline)))
    fit = logit_fit(right, looks, baseline, groups)
    assert fit["status"] == "fitted" and np.sign(fit["coef"]) == sign
    assert (fit["low"] > 0) if sign > 0 else (fit["high"] < 0)
    assert fit["baseline_coef"] < 0 and fit["n_groups"] == 30


def test_the_logistic_model_refuses_what_it_cannot_fit() -> None:
    groups = np.repeat(["a", "b", "c", "d"], 4)
    looks = np.tile([True, False], 8)
    baseline = np.linspace(-1, 1, 16)
    assert logit_fit(looks, looks, baseline, groups)["status"].startswith("not identified: perfect separation")
    assert logit_fit(np.ones(16), looks, baseline, groups)["status"] == "not fitted: every item has the same outcome"
    assert logit_fit(looks, np.ones(16), baseline, groups)["status"] == "not fitted: the predictor is constant"
    assert logit_fit(looks, looks, baseline, np.repeat(["a", "b"], 8))["status"].startswith("not fitted: 2 task group(s)")
    assert math.isnan(logit_fit(looks, looks, baseline, groups)["coef"])


def test_gap_quartiles_are_those_of_the_reference() -> None:
    reference = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    edges = gap_edges(reference)
    assert list(gap_quartile(reference, edges)) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert list(gap_quartile([edges[0], 100.0, -1.0], edges)) == [1, 4, 1]  # on an edge: the lower quartile
    with pytest.raises(ValueError, match="no finite top-two gap"):
        gap_edges([math.nan])
