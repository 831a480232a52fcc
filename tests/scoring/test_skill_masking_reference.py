"""The fast skill-masking sums and permutations (probes.scoring.skill_masking) against the direct
einsum / take-along-axis code they replaced: bit-identical counts, sums, scores and p-values, signed
zeros included, on attribution-sized designs with NaN outcomes, one skill, one mask side, no items."""

from __future__ import annotations

import numpy as np
import pytest

from probes.scoring import skill_masking as est


def einsum_groups(outcomes, included, weights):
    """The old ``_groups``: three-operand einsums over masks."""
    valid = np.isfinite(outcomes)
    o = np.where(valid, outcomes, 0.0)
    w = np.ones(outcomes.shape[:2]) if weights is None else weights
    out = []
    for side in (included.astype(float), (~included).astype(float)):
        out += [np.einsum("bk,kji,bki->bji", w, side, valid.astype(float)), np.einsum("bk,kji,bki->bji", w, side, o),
                np.einsum("bk,kji,bki->bji", w, side, o * o)]
    return out


def einsum_scores(outcomes, included, defined, weights=None):
    single = outcomes.ndim == 2
    n_plus, s_plus, _, n_minus, s_minus, _ = einsum_groups(outcomes[None] if single else outcomes, included, weights)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = s_plus / n_plus - s_minus / n_minus
    c = np.where((n_plus > 0) & (n_minus > 0) & defined[None], c, np.nan)
    return c[0] if single else c


def take_along_pvalues(outcomes, included, defined, n_permutations, rng):
    """The old ``permutation_pvalues``: argsort over the mask axis, take_along_axis."""
    c = einsum_scores(outcomes, included, defined)
    order = np.argsort(rng.random((n_permutations, *outcomes.shape)), axis=1)
    shuffled = np.take_along_axis(np.broadcast_to(outcomes, order.shape), order, axis=1)
    perm = einsum_scores(shuffled, included, defined)
    extreme = (np.abs(perm) >= np.abs(c)[None] - 1e-12) | ~np.isfinite(perm)
    return np.where(np.isfinite(c), (1 + extreme.sum(axis=0)) / (1 + n_permutations), np.nan)


def same_bits(a, b) -> bool:
    """Equal as floats, NaN where NaN, and the same sign of every zero."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b))


def design(k: int, j: int, i: int, seed: int):
    """Margins at the run's scale (a few logits), ~10% NaN (abstentions), signed zeros, a skill outside some pools."""
    rng = np.random.default_rng(seed)
    masks = rng.random((k, j)) < 0.4
    defined = rng.random((j, i)) < 0.8
    outcomes = rng.normal(0.0, 3.0, (k, i))
    outcomes[rng.random((k, i)) < 0.1] = np.nan
    outcomes[rng.random((k, i)) < 0.05] = -0.0
    outcomes[rng.random((k, i)) < 0.05] = 0.0
    return outcomes, masks[:, :, None] & defined[None], defined


DESIGNS = [(12, 9, 14, 0), (12, 1, 5, 1), (2, 3, 4, 2), (30, 1, 200, 3), (12, 4, 0, 4)]


@pytest.mark.parametrize("k, j, i, seed", DESIGNS)
def test_sums_scores_and_variances_are_the_einsums_bit_for_bit(k, j, i, seed) -> None:
    outcomes, included, defined = design(k, j, i, seed)
    weights = est.bootstrap_weights(k, 40, np.random.default_rng(seed))
    batched = np.broadcast_to(outcomes, (40, *outcomes.shape))
    for got, want in zip(est._groups(batched, included, weights, squares=True), einsum_groups(batched, included, weights)):
        assert same_bits(got, want)
    assert same_bits(est.causal_scores(outcomes, included, defined), einsum_scores(outcomes, included, defined))
    assert same_bits(est.causal_scores(batched, included, defined, weights), einsum_scores(batched, included, defined, weights))
    n_plus, s_plus, ss_plus, n_minus, s_minus, ss_minus = (a[0] for a in einsum_groups(outcomes[None], included, None))
    var = est.cell_variances(outcomes, included, defined)
    with np.errstate(invalid="ignore", divide="ignore"):
        var_plus = (ss_plus - s_plus**2 / n_plus) / (n_plus - 1)
        var_minus = (ss_minus - s_minus**2 / n_minus) / (n_minus - 1)
        empirical = np.where((n_plus > 1) & (n_minus > 1), np.maximum(var_plus, 0) / n_plus + np.maximum(var_minus, 0) / n_minus, np.nan)
    assert same_bits(var["var_empirical"], empirical[var["j"], var["i"]])


def test_an_all_nan_item_and_all_negative_zero_sums() -> None:
    """No valid mask: counts 0 and C NaN; outcomes all −0.0: the sums start from +0.0 as the einsum's did."""
    outcomes, included, defined = design(12, 3, 4, 5)
    outcomes[:, 0] = np.nan
    outcomes[:, 1] = -0.0
    for got, want in zip(est._groups(outcomes[None], included, None, squares=True), einsum_groups(outcomes[None], included, None)):
        assert same_bits(got, want)
    assert np.isnan(est.causal_scores(outcomes, included, defined)[:, 0]).all()


@pytest.mark.parametrize("k, j, i, seed", DESIGNS)
def test_permutation_pvalues_are_the_take_along_axis_ones(k, j, i, seed) -> None:
    outcomes, included, defined = design(k, j, i, seed)
    fast, slow = np.random.default_rng(seed), np.random.default_rng(seed)
    assert same_bits(est.permutation_pvalues(outcomes, included, defined, 60, fast), take_along_pvalues(outcomes, included, defined, 60, slow))
    assert fast.random() == slow.random()  # the same draws consumed


def test_simulated_power_cells_are_the_old_test() -> None:
    """simulated_power's one-skill design (inclusion ``[K, 1, S]``, ties of a binary outcome)."""
    rng = np.random.default_rng(6)
    x = rng.random((300, 12)) < 0.4
    o = (rng.random((300, 12)) < 0.5 + 0.6 * (x - 0.5)).astype(float)
    args = (o.T, x.T[:, None, :], np.ones((1, 300), bool), 50)
    assert same_bits(est.permutation_pvalues(*args, np.random.default_rng(7)), take_along_pvalues(*args, np.random.default_rng(7)))
