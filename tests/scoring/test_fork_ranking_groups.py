"""The forks ranking's statistics respect task groups (issue 42, item 6): the AUROC's permutation null
permutes labels within task groups, the group bootstrap counts the resamples it skips and refuses a CI
that would rest on one group, and the AUROCs and entropy directions are rows of the claims table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from probes.analyses.forks import (ENTROPY_EXPLORATORY_FAMILY, ENTROPY_FAMILY, HEADLINE_LABEL, RANKING_EXPLORATORY_FAMILY, RANKING_FAMILY, Forks, ForksSummary,
                                   ranking_tables, with_outcomes)
from probes.scoring import fork_estimators as est
from probes.scoring.claims import claims_table
from probes.scoring.stats import MAX_SKIPPED_SHARE, auc, auc_interval, group_bootstrap_auc, one_class_probability


def _confounded(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Six task groups of 12 forks: three with 8 disagreements and high entropy, three with 2 and low
    entropy; inside every group the entropy is drawn independently of the label."""
    labels, scores, groups = [], [], []
    for g in range(6):
        high = g < 3
        labels += [True] * (8 if high else 2) + [False] * (4 if high else 10)
        scores += list(rng.normal(2.0 if high else 0.0, 0.5, 12))
        groups += [f"g{g}"] * 12
    return np.array(labels), np.array(scores), np.array(groups)


def test_a_between_group_confound_is_not_a_ranking() -> None:
    """The pooled AUROC is high only because disagreement-rich groups have higher entropy: a shuffle across
    groups (the old null) calls it significant, the within-group null does not."""
    labels, scores, groups = _confounded(np.random.default_rng(7))
    result = est.ranking_auroc(labels, scores, groups, resamples=500, permutations=2000, seed=0)
    assert result["auroc"] > 0.75
    rng = np.random.default_rng(0)
    across = np.array([auc(labels, rng.permutation(scores)) for _ in range(2000)])
    p_across = (1 + (across >= result["auroc"]).sum()) / 2001
    assert p_across < 0.001
    assert result["p_permutation"] > 0.1  # the within-group null reproduces the confound's AUROC
    assert result["null_low"] > 0.6  # and centres on it, not on 0.5
    # a real within-group ranking is found by the same null
    signal = scores + 1.5 * labels
    planted = est.ranking_auroc(labels, signal - np.array([2.0 if g in ("g0", "g1", "g2") else 0.0 for g in groups]), groups,
                                resamples=500, permutations=2000, seed=0)
    assert planted["p_permutation"] < 0.001 and planted["low"] > 0.5


def test_one_fork_per_group_cannot_be_tested() -> None:
    """With one fork per task group no within-group permutation moves a label: the null is the observed
    AUROC, p = 1 and the floor (one arrangement) says so."""
    labels = np.array([True, False, True, False, False])
    result = est.ranking_auroc(labels, np.array([0.9, 0.8, 0.7, 0.2, 0.1]), list("abcde"), resamples=200, permutations=100)
    assert result["p_permutation"] == 1.0 and result["p_floor"] == 1.0
    assert result["null_low"] == result["null_high"] == pytest.approx(5 / 6)
    assert est.within_group_arrangements(np.array([1, 0, 0, 1, 1], bool), list("aaabb")) == 3 * 1


def test_skipped_resamples_counted_by_hand() -> None:
    """Three task groups: g0 holds the only disagreement (and one non-disagreement), g1 and g2 none. A
    resample lacks a disagreement exactly when it draws no g0; replaying the bootstrap's draws (three
    group indices per resample, groups in first-seen order) counts them, about (2/3)³ = 8/27."""
    labels = np.array([True, False, False, False, False])
    scores = np.array([0.9, 0.1, 0.5, 0.3, 0.8])
    groups = np.array(["g0", "g0", "g1", "g2", "g2"])
    resamples, seed = 3000, 4
    rng = np.random.default_rng(seed)
    by_hand = 0
    for _ in range(resamples):
        drawn = rng.integers(0, 3, 3)
        by_hand += int(not (drawn == 0).any())
    interval = auc_interval(labels, scores, groups, resamples=resamples, seed=seed)
    assert interval.n_skipped == by_hand and abs(by_hand / resamples - 8 / 27) < 0.03
    # one group holds the disagreement: no CI, and the reason says so (the old interval gave one)
    assert math.isnan(interval.low) and math.isnan(interval.high)
    assert interval.refused == "no CI: 1 task group holds a positive (each class needs ≥ 2)"
    assert np.isfinite(group_bootstrap_auc(labels, scores, groups, resamples=resamples, seed=seed)).all()
    result = est.ranking_auroc(labels, scores, groups, resamples=resamples, permutations=50, seed=seed)
    assert result["n_skipped"] == by_hand and result["ci_note"] == interval.refused and math.isnan(result["low"])


def test_a_ci_resting_on_too_few_valid_resamples_is_refused() -> None:
    """Two of 30 task groups hold the disagreements: a resample draws neither with probability
    (28/30)^30 ≈ 0.126, above the 10% allowed, so no CI (and about that share is skipped); with 6 of 30
    groups ((24/30)^30 ≈ 0.001) the CI is given."""
    groups = np.repeat([f"g{i}" for i in range(30)], 2)
    scores = np.random.default_rng(0).normal(size=60)
    rare = np.isin(groups, ["g0", "g1"]) & (np.arange(60) % 2 == 0)
    assert one_class_probability(rare, groups) == pytest.approx((28 / 30) ** 30)
    interval = auc_interval(rare, scores, groups, resamples=2000, seed=0)
    assert math.isnan(interval.low) and abs(interval.n_skipped / 2000 - (28 / 30) ** 30) < 0.03
    assert interval.refused == (f"no CI: a resample of the task groups holds one class only with probability 0.1262 "
                                f"(> {MAX_SKIPPED_SHARE:g}; {interval.n_skipped} of 2000 skipped)")
    common = np.isin(groups, [f"g{i}" for i in range(6)]) & (np.arange(60) % 2 == 0)
    given = auc_interval(common, scores, groups, resamples=2000, seed=0)
    assert given.refused == "" and given.low <= auc(common, scores) <= given.high and given.n_skipped < 0.01 * 2000


def _fork_rows(rng: np.random.Generator) -> pd.DataFrame:
    """Forks of two configurations at k = 1: eight task groups of six forks (sign flips over 8 groups reach
    p = 1/256, enough for Holm over the 4 entropy claims); within every group the skip
    path's entropy is higher where the greedy call differs (an invoke path that calls the other tool)."""
    rows = []
    for config in ("proc", "basm"):
        for g in range(8):
            for i in range(6):
                differs = i < 3
                entropy = rng.normal(1.0 + differs, 0.2)
                row = {"config": config, "k": 1, "task_group": f"g{g}", "item_id": f"g{g}-{i}",
                       "skip_entropy": entropy, "invoke_entropy": entropy + 0.3 + rng.normal(0, 0.05),
                       "skip_entropy_tools": entropy / 2, "invoke_entropy_tools": entropy / 2 + rng.normal(0, 0.05),
                       "skip_margin": 1.0, "invoke_margin": -1.0 if differs else 1.0, "skip_call_logodds": 2.0, "invoke_call_logodds": 2.0}
                for mode in ("strict", "lenient"):
                    row.update({f"skip_{mode}_action": "a", f"invoke_{mode}_action": "b" if differs else "a",
                                f"skip_{mode}_solved": False, f"invoke_{mode}_solved": differs})
                rows.append(row)
    return pd.DataFrame(rows)


def test_aurocs_and_entropy_directions_are_claims() -> None:
    rows = with_outcomes(_fork_rows(np.random.default_rng(3)))
    auroc, budget = ranking_tables(rows, resamples=300, permutations=500, seed=0)
    summary = ForksSummary(rows, pd.DataFrame(), pd.DataFrame(), auroc, budget, "", 1, 0)
    table = claims_table(Forks().claims(summary)).set_index("name")
    assert set(table["family"]) == {ENTROPY_FAMILY, ENTROPY_EXPLORATORY_FAMILY, RANKING_FAMILY, RANKING_EXPLORATORY_FAMILY}
    headline = table.loc[f"AUROC entropy → {HEADLINE_LABEL}, basm k=1"]
    assert headline["family"] == RANKING_FAMILY and headline["null"] == 0.5 and headline["unit"] == "AUC"
    assert headline["estimate"] > 0.9 and headline["verdict"] == "holds" and headline["family_size"] == 2
    assert "null: labels permuted within task groups" in headline["note"] and "resamples held one class only" in headline["note"]
    exploratory = table[table["family"] == RANKING_EXPLORATORY_FAMILY]
    assert exploratory["exploratory"].all() and not exploratory["verdict"].str.startswith("holds").any()
    assert table.loc["entropy invoke above skip, proc k=1", "family"] == ENTROPY_FAMILY
    assert table.loc["entropy invoke above skip, proc k=1", "verdict"] == "holds"
    below = table.loc["entropy invoke below skip, proc k=1"]
    assert below["family"] == ENTROPY_EXPLORATORY_FAMILY and below["alternative"] == "less" and below["verdict"].startswith("exploratory: not")
    # call_sign never differs (equal call log-odds): one class, no AUROC, not tested
    assert table.loc["AUROC entropy → call_sign, proc k=1", "verdict"].startswith("not tested")
