"""Estimators of the invoke/skip forks (seed 002, SelSkill §4.2 and Appendix E), as pure functions.

``candidate_entropy``      entropy of the choice among the shown tools: their whole-name
                           probabilities renormalised over the candidates.
``ranked_order``           the order in which a ranking by a score (highest first) forks the decision
                           points; ties are broken by a seeded random permutation, never by input order.
``precision_at_budget``    forking the top ``ceil(f·n)`` points by a score: the share of them where
                           invoke and skip disagree (precision) and the share of all disagreements
                           they find (recall).
``ranking_auroc``          AUROC of the score for the disagreements (scikit-learn), its 95% CI over
                           task groups (refused when it would rest on one group) and a permutation
                           null that keeps every task group's count of disagreements.
``budget_curve``           precision at every budget against the random ranking (its expectation, the
                           prevalence, and its permutation band) and the all-points baseline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score

from probes.engine.logits import check_finite
from probes.scoring.stats import DEFAULT_SEED, auc_interval, cluster_bootstrap_blocks, permuted_labels

BUDGETS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # fractions of the decision points forked


def candidate_entropy(name_logprobs: Sequence[float]) -> float:
    """Entropy (nats) of q_i ∝ exp(log P(name_i)), the candidates' whole-name probabilities
    renormalised over the candidates (the tool choice without the rest of the vocabulary)."""
    lp = torch.tensor([float(v) for v in name_logprobs], dtype=torch.float64)
    if lp.numel() == 0:
        raise ValueError("candidate entropy of no candidates")
    check_finite(lp, "candidate name log-probs")
    q = torch.log_softmax(lp, dim=0)
    return float(-(q.exp() * q).sum())


def ranked_order(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices by descending score along the last axis (every row of a [resamples, n] block with the
    same tie order); tied scores in a seeded random order."""
    scores = np.asarray(scores, dtype=float)
    shuffled = rng.permutation(scores.shape[-1])
    return shuffled[np.argsort(-scores[..., shuffled], axis=-1, kind="stable")]


def budget_size(fraction: float, n: int) -> int:
    """Decision points forked at a budget: ``ceil(fraction · n)``, at least one."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"a budget is a fraction in (0, 1], got {fraction}")
    return max(1, math.ceil(fraction * n - 1e-9))


def forked_labels(labels: np.ndarray, order: np.ndarray, fraction: float) -> np.ndarray:
    """The labels of the first ``budget_size(fraction, n)`` points of ``order``, along the last axis."""
    return np.take_along_axis(labels, order[..., : budget_size(fraction, labels.shape[-1])], axis=-1)


def precision_at_budget(labels: np.ndarray, order: np.ndarray, fraction: float) -> tuple[float, float]:
    """(precision, recall) of forking the first ``budget_size(fraction, n)`` points of ``order``;
    recall is NaN when no point is positive."""
    labels = np.asarray(labels, dtype=bool)
    top = forked_labels(labels, order, fraction)
    positives = int(labels.sum())
    return float(top.mean()), float(top.sum() / positives) if positives else math.nan


def within_group_arrangements(labels: np.ndarray, groups: Sequence[str]) -> int:
    """Distinct labellings reachable by permuting ``labels`` within task groups: Π_g C(n_g, positives_g)."""
    labels, groups = np.asarray(labels, dtype=bool), np.asarray(groups)
    return math.prod(math.comb(int((groups == g).sum()), int(labels[groups == g].sum())) for g in dict.fromkeys(groups.tolist()))


def ranking_auroc(labels: np.ndarray, scores: np.ndarray, groups: Sequence[str], *, resamples: int, permutations: int,
                  seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """AUROC of ``scores`` for ``labels`` (scikit-learn's ``roc_auc_score``) with a 95% CI over task
    groups and a permutation p.

    **Null: labels permuted within task groups** (every group keeps its forks and its count of
    disagreements). Shuffling across groups would call a score that only tells task groups apart
    (groups with more disagreements also having higher entropy) a ranking of the disagreements; the
    within-group null keeps that group composition, so the p measures how the score orders the
    disagreements beyond it. ``permutations`` labellings (:func:`probes.scoring.stats.permuted_labels`):
    their mean AUROC and 2.5/97.5% quantiles, and the one-sided p = (1 + #null ≥ observed) /
    (1 + permutations). ``p_floor``: the smallest p reachable, max(1 / (1 + permutations),
    1 / arrangements) with arrangements = Π_g C(n_g, positives_g) (one fork per group: 1, untestable).

    **CI** (:func:`probes.scoring.stats.auc_interval`): percentiles of the AUROC over resamples of
    task groups; ``n_skipped`` counts the resamples that held one class only (no AUROC, left out);
    no CI (NaN, the reason in ``ci_note``) when fewer than 2 task groups hold a disagreement (or a
    non-disagreement) or when a resample holds one class only with probability above 10%
    (exact: :func:`probes.scoring.stats.one_class_probability`).

    One class only: every value NaN."""
    labels = np.asarray(labels, dtype=bool)
    scores = np.asarray(scores, dtype=float)
    groups = np.asarray(groups)
    out = {"auroc": math.nan, "low": math.nan, "high": math.nan, "n_skipped": 0, "ci_note": "", "null_mean": math.nan,
           "null_low": math.nan, "null_high": math.nan, "p_permutation": math.nan, "p_floor": math.nan, "n": len(labels),
           "n_positive": int(labels.sum()), "n_groups": len(set(groups.tolist())),
           "n_groups_positive": len(set(groups[labels].tolist()))}
    if len(labels) == 0 or labels.all() or not labels.any():
        return {**out, "ci_note": "no AUROC: one class only"}
    if not np.isfinite(scores).all():
        raise ValueError("ranking scores must be finite")
    observed = float(roc_auc_score(labels, scores))
    interval = auc_interval(labels, scores, groups, resamples=resamples, seed=seed)
    ranks = rankdata(scores)  # the null moves the labels, not the scores: rank once, sum the positives' ranks per labelling
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    null = (permuted_labels(labels, groups, permutations, seed) @ ranks - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    out.update(auroc=observed, low=interval.low, high=interval.high, n_skipped=interval.n_skipped, ci_note=interval.refused,
               null_mean=float(null.mean()), null_low=float(np.quantile(null, 0.025)), null_high=float(np.quantile(null, 0.975)),
               p_permutation=float((1 + (null >= observed - 1e-12).sum()) / (1 + permutations)),
               p_floor=max(1 / (1 + permutations), 1 / within_group_arrangements(labels, groups)))
    return out


def budget_curve(labels: np.ndarray, scores: np.ndarray, groups: Sequence[str], *, budgets: Sequence[float] = BUDGETS,
                 resamples: int, permutations: int, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Per budget: forked points, precision and recall of the ranking by ``scores`` with a 95% CI of the
    precision over task groups (the budget re-applied to each resample's points), the random ranking's
    expected precision (the prevalence) with its 2.5–97.5% band over ``permutations`` random orders,
    and the all-points baseline (fork every point: precision = prevalence, recall 1, at budget 1)."""
    labels = np.asarray(labels, dtype=bool)
    scores = np.asarray(scores, dtype=float)
    groups = np.asarray(groups)
    rng = np.random.default_rng([seed, 3])
    order = ranked_order(scores, rng)
    random_orders = np.array([rng.permutation(len(labels)) for _ in range(permutations)], dtype=int).reshape(permutations, len(labels))
    prevalence = float(labels.mean()) if len(labels) else math.nan
    rows = []
    for fraction in budgets:
        precision, recall = precision_at_budget(labels, order, fraction)

        def resampled(block: np.ndarray, fraction: float = fraction) -> np.ndarray:
            # every resample of a block at once (ties: the permutation of its length, seed [seed, 4]): report
            # --quick's budget CIs 9.9 s -> 0.16 s (py-spy) against one resample at a time
            return forked_labels(labels[block], ranked_order(scores[block], np.random.default_rng([seed, 4])), fraction).mean(axis=1)

        low, high = cluster_bootstrap_blocks(resampled, groups, resamples=resamples, seed=seed)
        null = forked_labels(np.broadcast_to(labels, random_orders.shape), random_orders, fraction).mean(axis=1)
        rows.append({"budget": fraction, "n_forked": budget_size(fraction, len(labels)), "precision": precision, "low": low, "high": high,
                     "recall": recall, "random_precision": prevalence, "random_low": float(np.quantile(null, 0.025)),
                     "random_high": float(np.quantile(null, 0.975)), "all_points_precision": prevalence,
                     "n": len(labels), "n_positive": int(labels.sum()), "n_groups": len(set(groups.tolist()))})
    return pd.DataFrame(rows)
