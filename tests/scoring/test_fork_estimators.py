"""Fork estimators (probes.scoring.fork_estimators) by hand: entropies, AUROC and precision at a budget,
ties broken at random."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probes.engine.logits import entropy
from probes.scoring import fork_estimators as est
from probes.scoring.stats import auc


def test_entropies_by_hand() -> None:
    """Logits (0, 0, ln 2): p = (¼, ¼, ½), H = 1.5 ln 2; three names with log-probs ln(1/8), ln(1/8), ln(1/4):
    renormalised (¼, ¼, ½), the same entropy."""
    assert entropy(torch.tensor([0.0, 0.0, math.log(2.0)])) == pytest.approx(1.5 * math.log(2.0), abs=1e-6)
    assert est.candidate_entropy([math.log(1 / 8), math.log(1 / 8), math.log(1 / 4)]) == pytest.approx(1.5 * math.log(2.0), abs=1e-12)
    assert est.candidate_entropy([-3.0]) == 0.0
    with pytest.raises(ValueError, match="non-finite"):
        est.candidate_entropy([0.0, float("nan")])


def test_auroc_and_precision_at_budget_by_hand() -> None:
    """Five points, two disagreements, scores 0.9 > 0.8 > 0.7 > 0.2 > 0.1 with the disagreements at 0.9
    and 0.7: 5 of the 6 (positive, negative) pairs are ordered right (AUROC 5/6). Forking the top
    1, 2, 3, 5 points finds 1/1, 1/2, 2/3, 2/5 disagreements (recall ½, ½, 1, 1)."""
    labels = np.array([True, False, True, False, False])
    scores = np.array([0.9, 0.8, 0.7, 0.2, 0.1])
    groups = ["a", "b", "c", "d", "e"]
    result = est.ranking_auroc(labels, scores, groups, resamples=200, permutations=500, seed=0)
    assert result["auroc"] == pytest.approx(5 / 6) and auc(labels, scores) == pytest.approx(5 / 6)
    assert result["low"] <= 5 / 6 <= result["high"] and result["n_positive"] == 2 and result["n_groups"] == 5
    # one fork per task group: permuting labels within groups moves none, so the null is the observed AUROC
    assert result["null_low"] == result["null_high"] == pytest.approx(5 / 6) and result["p_permutation"] == result["p_floor"] == 1.0
    # in one task group the within-group null is the pooled one: of the 10 equally likely placements of the
    # two positives among the ranks, two reach AUROC ≥ 5/6 (5/6 and 1); one group allows no CI
    pooled = est.ranking_auroc(labels, scores, ["a"] * 5, resamples=200, permutations=500, seed=0)
    assert pooled["p_permutation"] == pytest.approx(0.2, abs=0.06) and pooled["p_floor"] == pytest.approx(0.1)
    assert abs(pooled["null_mean"] - 0.5) < 0.05 and pooled["ci_note"].startswith("no CI: 1 task group holds a positive")
    curve = est.budget_curve(labels, scores, groups, budgets=(0.2, 0.4, 0.6, 1.0), resamples=100, permutations=200, seed=0)
    assert curve["n_forked"].tolist() == [1, 2, 3, 5]
    np.testing.assert_allclose(curve["precision"], [1.0, 0.5, 2 / 3, 0.4])
    np.testing.assert_allclose(curve["recall"], [0.5, 0.5, 1.0, 1.0])
    assert (curve["random_precision"] == 0.4).all() and (curve["all_points_precision"] == 0.4).all()
    assert curve["random_low"].iloc[-1] == curve["random_high"].iloc[-1] == 0.4  # every order forks everything at budget 1
    one_class = est.ranking_auroc(np.zeros(3, bool), np.arange(3.0), ["a", "b", "c"], resamples=10, permutations=10)
    assert math.isnan(one_class["auroc"]) and one_class["n"] == 3


def test_ties_are_broken_at_random_not_by_input_order() -> None:
    scores = np.array([1.0, 1.0, 1.0, 1.0, 0.0])
    firsts = {int(est.ranked_order(scores, np.random.default_rng(seed))[0]) for seed in range(30)}
    assert firsts == {0, 1, 2, 3}
    assert est.ranked_order(scores, np.random.default_rng(0))[-1] == 4
