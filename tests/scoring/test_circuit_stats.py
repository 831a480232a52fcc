"""The circuit's statistics (probes.scoring.circuit_stats) on planted arrays: faithfulness and its curve,
MIB's integrated faithfulness, layer-matched random circuits, Shi et al.'s sufficiency / partial
necessity / minimality, AtP-vs-exact agreement, the organism's planted-edge recovery and the
held-out split."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from probes.scoring import circuit_stats as cs
from probes.scoring.claims import claims_table, holds

G, PER_GROUP, R = 8, 3, 40  # 8 task groups: the sign-flip floor 1/256 leaves room for Holm


def groups_of(n_groups: int = G, per_group: int = PER_GROUP) -> np.ndarray:
    return np.repeat([f"g{i}" for i in range(n_groups)], per_group)


def pair(rng: np.random.Generator, n: int = G * PER_GROUP, gap: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """(m_empty, m_full): the full model's metric ``gap`` logits above the empty circuit's."""
    m_empty = rng.normal(0.0, 0.1, n)
    return m_empty, m_empty + gap + rng.normal(0.0, 0.1, n)


def verdict_of(*claims) -> list[str]:
    return claims_table(list(claims))["verdict"].tolist()


# ---------------------------------------------------------------------------- faithfulness
def test_faithfulness_is_a_ratio_of_item_means():
    m_empty, m_full = np.array([0.0, 1.0, 0.0]), np.array([2.0, 3.0, 4.0])
    m_circuit = np.array([1.0, 2.0, 3.0])
    assert cs.faithfulness(m_circuit, m_empty, m_full) == pytest.approx(5 / 8)  # (1 + 1 + 3) / (2 + 2 + 4)
    assert np.mean((m_circuit - m_empty) / (m_full - m_empty)) != pytest.approx(5 / 8)  # not a mean of ratios
    assert cs.faithfulness_undefined(m_empty, m_full) == ""


def test_a_pair_that_does_not_move_the_metric_has_no_faithfulness_and_says_why():
    m_empty = np.array([1.0, 2.0])
    m_full = m_empty + 0.1  # below the floor: the ablation moves nothing
    assert math.isnan(cs.faithfulness(m_full, m_empty, m_full))
    assert "nothing to explain" in cs.faithfulness_undefined(m_empty, m_full)


def test_faithfulness_refuses_items_that_do_not_match():
    with pytest.raises(ValueError, match="m_circuit has 2 items"):
        cs.faithfulness([1.0, 2.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="non-finite"):
        cs.faithfulness([1.0, np.nan], [0.0, 0.0], [1.0, 1.0])


def curve_inputs(rng: np.random.Generator, n_groups: int) -> tuple:
    groups = groups_of(n_groups)
    m_empty, m_full = pair(rng, len(groups))
    sizes = np.array([0, 5, 10, 20])
    share = np.array([0.0, 0.5, 0.8, 1.0])
    m_circuit = m_empty[:, None] + share[None, :] * (m_full - m_empty)[:, None] + rng.normal(0, 0.2, (len(groups), 4))
    return sizes, m_circuit, m_empty, m_full, groups


def test_curve_gives_group_bootstrap_cis_that_are_not_zero_width():
    sizes, m_circuit, m_empty, m_full, groups = curve_inputs(np.random.default_rng(0), G)
    curve = cs.faithfulness_curve(sizes, 20, m_circuit, m_empty, m_full, groups, resamples=400)
    assert curve["fraction"].tolist() == [0.0, 0.25, 0.5, 1.0]
    middle = curve.iloc[1:3]
    assert (middle["low"] < middle["faithfulness"]).all() and (middle["faithfulness"] < middle["high"]).all()
    assert (curve["n_groups"] == G).all() and (curve["note"] == "").all()
    assert curve["faithfulness"].iloc[1] == pytest.approx(cs.faithfulness(m_circuit[:, 1], m_empty, m_full))


def test_curve_with_one_task_group_has_no_ci_and_says_so():
    sizes, m_circuit, m_empty, m_full, groups = curve_inputs(np.random.default_rng(1), 1)
    curve = cs.faithfulness_curve(sizes, 20, m_circuit, m_empty, m_full, groups, resamples=100)
    assert curve["low"].isna().all() and curve["high"].isna().all()
    assert (curve["note"] == "no CI (1 group)").all() and curve["faithfulness"].notna().all()


def test_curve_refuses_its_ci_when_resamples_often_lose_the_gap():
    """Planted: the groups' gaps cancel (+2 and −2), so many resamples have no faithfulness."""
    groups = groups_of(4, 1)
    m_empty = np.zeros(4)
    m_full = np.array([2.0, -2.0, 2.0, 2.0])
    m_circuit = np.stack([m_empty, m_full], axis=1)
    curve = cs.faithfulness_curve([0, 10], 10, m_circuit, m_empty, m_full, groups, resamples=400)
    assert curve["low"].isna().all() and curve["note"].str.startswith("no CI: ").all()


def test_curve_refuses_sizes_that_do_not_increase():
    sizes, m_circuit, m_empty, m_full, groups = curve_inputs(np.random.default_rng(2), 2)
    with pytest.raises(ValueError, match="increase strictly"):
        cs.faithfulness_curve(sizes[::-1], 20, m_circuit, m_empty, m_full, groups)
    with pytest.raises(ValueError, match="n_edges_total = 10"):
        cs.faithfulness_curve(sizes, 10, m_circuit, m_empty, m_full, groups)


def test_integrated_faithfulness_of_the_diagonal_is_one_half():
    fractions = np.array([0.0, 0.001, 0.01, 0.1, 0.5, 1.0])
    assert cs.integrated_faithfulness(fractions, fractions) == pytest.approx(0.5)
    assert cs.integrated_faithfulness([0.0, 0.5, 1.0], [0.0, 1.0, 1.0]) == pytest.approx(0.75)


@pytest.mark.parametrize("fractions", [[0.1, 0.5, 1.0], [0.0, 0.5, 0.9], [0.0, 0.6, 0.5, 1.0]])
def test_integrated_faithfulness_refuses_a_grid_off_zero_to_one(fractions):
    with pytest.raises(ValueError, match="from 0 .* to 1"):
        cs.integrated_faithfulness(fractions, np.zeros(len(fractions)))


def test_integrated_faithfulness_is_nan_when_undefined_everywhere_and_refused_with_holes():
    assert math.isnan(cs.integrated_faithfulness([0.0, 1.0], [np.nan, np.nan]))
    with pytest.raises(ValueError, match=r"undefined at fractions \[0.5\]"):
        cs.integrated_faithfulness([0.0, 0.5, 1.0], [0.0, np.nan, 1.0])


def test_smallest_faithful_size_is_the_first_size_reaching_the_threshold():
    sizes = [0, 5, 10, 20, 40]
    assert cs.smallest_faithful_size(sizes, [0.0, 0.5, 0.85, 0.7, 1.0]) == (10, "")
    assert cs.smallest_faithful_size(sizes, [0.0, 0.5, 0.85, 0.7, 1.0], threshold=0.9) == (40, "")
    size, reason = cs.smallest_faithful_size(sizes, [0.0, 0.1, 0.2, 0.3, 0.4])
    assert size is None and "no size on the grid reaches faithfulness 0.8" in reason
    size, reason = cs.smallest_faithful_size(sizes, [np.nan] * 5)
    assert size is None and "undefined" in reason
    with pytest.raises(ValueError, match=r"undefined at sizes \[10\] only"):
        cs.smallest_faithful_size(sizes, [0.0, 0.5, np.nan, 0.9, 1.0])


def test_random_rank_p_counts_ties_against_the_circuit():
    assert cs.random_rank_p(0.9, [0.1, 0.2, 0.3]) == 1 / 4  # the floor 1/(1 + R)
    assert cs.random_rank_p(0.5, [0.5, 0.6, 0.1]) == 3 / 4
    with pytest.raises(ValueError, match="finite F"):
        cs.random_rank_p(math.nan, [0.1])


# ---------------------------------------------------------------------------- random circuits
EDGE_LAYERS = np.repeat(np.arange(4), 6)  # 4 layers of 6 edges


def test_layer_matched_circuits_keep_layer_counts_and_never_draw_a_circuit_edge():
    circuit = np.array([0, 1, 7, 20])  # layers 0, 0, 1, 3
    draws = cs.layer_matched_circuits(EDGE_LAYERS, circuit, draws=50, rng=np.random.default_rng(0))
    assert draws.shape == (50, 4)
    assert (EDGE_LAYERS[draws] == EDGE_LAYERS[circuit][None, :]).all()
    assert not np.isin(draws, circuit).any()
    assert all(len(set(row)) == 4 for row in draws.tolist())
    assert len({tuple(sorted(row)) for row in draws.tolist()}) == 50  # C(4,2)·5·5 = 150 possible: distinct
    assert cs.possible_matched_sets(EDGE_LAYERS, circuit) == math.comb(4, 2) * 5 * 5


def test_layer_matched_circuits_repeat_only_when_the_pool_forces_it():
    circuit = np.array([0, 1, 2, 3, 4])  # 5 of layer 0's 6 edges: one free edge, one possible set
    assert cs.possible_matched_sets(EDGE_LAYERS, circuit) == 0  # C(1, 5): no set exists
    circuit = np.array([0, 1, 2])  # 3 free edges, C(3, 3) = 1 possible set
    assert cs.possible_matched_sets(EDGE_LAYERS, circuit) == 1
    draws = cs.layer_matched_circuits(EDGE_LAYERS, circuit, draws=5, rng=np.random.default_rng(0))
    assert {tuple(sorted(row)) for row in draws.tolist()} == {(3, 4, 5)}


def test_layer_matched_circuits_refuse_a_layer_with_too_few_free_edges():
    with pytest.raises(ValueError, match="layer 0: the circuit holds 5 edges but only 1 edges"):
        cs.layer_matched_circuits(EDGE_LAYERS, np.array([0, 1, 2, 3, 4, 8]), draws=3, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="lists an edge twice"):
        cs.layer_matched_circuits(EDGE_LAYERS, np.array([1, 1]), draws=3, rng=np.random.default_rng(0))


# ---------------------------------------------------------------------------- Shi et al.'s tests
def sufficiency_inputs(rng: np.random.Generator, kept: float, gap: float = 2.0) -> tuple:
    """A circuit keeping ``kept`` logits more than random circuits (which keep 0.3 of the gap's sign)."""
    groups = groups_of()
    m_empty, m_full = pair(rng, len(groups), gap)
    direction = np.sign(gap)
    m_random = m_empty[:, None] + direction * 0.3 + rng.normal(0, 0.2, (len(groups), R))
    m_circuit = m_empty + direction * (0.3 + kept) + rng.normal(0, 0.05, len(groups))
    return m_circuit, m_random, m_empty, m_full, groups


def test_a_planted_sufficient_circuit_holds_and_a_random_one_does_not():
    rng = np.random.default_rng(3)
    planted = cs.sufficiency_claim(*sufficiency_inputs(rng, kept=1.5), name="planted")
    m_circuit, m_random, m_empty, m_full, groups = sufficiency_inputs(rng, kept=0.0)
    random_circuit = cs.sufficiency_claim(m_random[:, 0], m_random[:, 1:], m_empty, m_full, groups, name="random")
    verdicts = verdict_of(planted, random_circuit)
    assert verdicts[0] == "holds" and not holds(verdicts[1])
    assert "rank p = " in planted.note and planted.sesoi == cs.CIRCUIT_SESOI


def test_sufficiency_is_oriented_toward_the_full_model():
    """The full model below the empty circuit (a negative gap): a sufficient circuit still holds."""
    claim = cs.sufficiency_claim(*sufficiency_inputs(np.random.default_rng(4), kept=1.5, gap=-2.0))
    assert claim.estimate > 1 and verdict_of(claim) == ["holds"]


def test_sufficiency_below_the_smallest_effect_of_interest_does_not_hold():
    claim = cs.sufficiency_claim(*sufficiency_inputs(np.random.default_rng(5), kept=0.1))
    verdict = verdict_of(claim)[0]
    assert 0 < claim.estimate < cs.CIRCUIT_SESOI and not holds(verdict) and verdict.startswith("detectable")


def test_sufficiency_of_a_pair_that_does_not_move_the_metric_is_untestable():
    m_circuit, m_random, m_empty, _, groups = sufficiency_inputs(np.random.default_rng(6), kept=1.5)
    claim = cs.sufficiency_claim(m_circuit, m_random, m_empty, m_empty + 0.05, groups)
    assert verdict_of(claim)[0].startswith("untestable: no faithfulness")


def test_partial_necessity_holds_for_a_planted_necessary_circuit_only():
    rng = np.random.default_rng(7)
    groups = groups_of()
    m_empty, m_full = pair(rng, len(groups))
    without_random = m_full[:, None] - 0.2 + rng.normal(0, 0.2, (len(groups), R))  # random removals barely move it
    without_circuit = m_empty + 0.3 + rng.normal(0, 0.05, len(groups))  # removing C lands near the empty circuit
    necessary = cs.partial_necessity_claim(m_full, without_circuit, without_random, m_empty, groups, name="planted")
    unnecessary = cs.partial_necessity_claim(m_full, without_random[:, 0], without_random[:, 1:], m_empty, groups, name="random")
    verdicts = verdict_of(necessary, unnecessary)
    assert necessary.estimate > 1 and verdicts[0] == "holds" and not holds(verdicts[1])


def test_minimality_fails_a_planted_idle_edge_and_its_claim_never_holds():
    rng = np.random.default_rng(8)
    f_circuit = 0.9
    f_with_random = f_circuit + rng.normal(0.0, 0.01, 100)  # adding a random edge changes F by ~0.01
    f_without_edge = np.array([0.5, 0.6, f_circuit - 0.001])  # the third edge is idle
    table, claim = cs.minimality_table([10, 11, 12], f_circuit, f_without_edge, f_with_random)
    assert table["passes"].tolist() == [True, True, False]
    assert table["p"].iloc[2] < 1e-6 and table["p"].iloc[0] == 1.0  # Shi et al.'s per-edge binomial test
    assert claim.estimate == pytest.approx(1 / 3) and claim.exploratory
    verdict = verdict_of(claim)[0]
    assert verdict.startswith("exploratory:") and not holds(verdict)


def test_the_circuit_sesoi_is_the_knockout_familys():
    from probes.analyses.knockout import DEFAULT_SESOI

    assert cs.CIRCUIT_SESOI == DEFAULT_SESOI


# ---------------------------------------------------------------------------- agreement with exact patching
def test_agreement_flags_a_planted_disagreement_and_uses_scipys_correlations():
    rng = np.random.default_rng(9)
    exact = rng.normal(0, 1, 30)
    estimate = exact + rng.normal(0, 0.01, 30)
    estimate[7] = exact[7] + 2.0  # planted: AtP off by 2 logits on edge 7
    summary, disagrees = cs.estimate_agreement(estimate, exact)
    assert np.flatnonzero(disagrees).tolist() == [7] and summary["n_disagree"] == 1
    assert summary["max_error_edge"] == 7 and summary["max_abs_error"] == pytest.approx(2.0, abs=0.05)
    assert summary["spearman"] == scipy_stats.spearmanr(estimate, exact).statistic
    assert summary["pearson"] == scipy_stats.pearsonr(estimate, exact).statistic


def test_agreement_tolerance_scales_with_the_exact_effect():
    _, disagrees = cs.estimate_agreement([1.4, 10.0 + 2.6, 0.05], [1.0, 10.0, 0.0])
    assert disagrees.tolist() == [True, False, False]  # 0.4 > 0.1 + 0.25; 2.6 ≤ 0.1 + 2.5; 0.05 ≤ 0.1


def test_agreement_with_a_constant_side_has_no_correlation_and_says_so():
    summary, _ = cs.estimate_agreement([0.0, 0.0, 0.0], [0.1, 0.2, 0.3])
    assert math.isnan(summary["spearman"]) and "estimate constant" in summary["note"]


# ---------------------------------------------------------------------------- the planted edges
def test_planted_recovery_ranks_among_b_edges_and_its_p_is_the_hypergeometric_tail():
    n = 20
    scores = np.linspace(1.0, 0.05, n)
    scores[3] = -5.0  # a planted edge with the largest |score|
    scores[5] = scores[4]  # a planted edge tied with edge 4: it takes the worse rank
    from_boundary = np.zeros(n, bool)
    from_boundary[[1, 3, 4, 5, 9]] = True
    planted = np.zeros(n, bool)
    planted[[3, 5]] = True
    circuit = np.zeros(n, bool)
    circuit[[0, 1, 2, 3, 6]] = True  # holds one planted edge of two
    found = cs.planted_recovery(scores, from_boundary, planted, circuit)
    assert found["ranks"] == {3: 1, 5: 4}  # |scores| on B: 3 > 1 > 4 = 5 > 9
    k, K, N = 1, 2, 5
    by_hand = sum(math.comb(K, j) * math.comb(n - K, N - j) for j in range(k, K + 1)) / math.comb(n, N)
    assert found["p"] == pytest.approx(by_hand, rel=1e-12)
    assert found["p_floor"] == pytest.approx(math.comb(n - 2, 3) / math.comb(n, 5), rel=1e-12)


def test_planted_claim_holds_when_the_circuit_holds_the_planted_edges_and_not_otherwise():
    n = 60
    from_boundary = np.zeros(n, bool)
    from_boundary[:12] = True
    planted = np.zeros(n, bool)
    planted[[2, 5, 7]] = True
    scores = np.where(planted, 3.0, 0.1)
    found = np.zeros(n, bool)
    found[[2, 5, 7, 30, 31]] = True
    missed = np.zeros(n, bool)
    missed[[30, 31, 32, 33, 34]] = True
    verdicts = verdict_of(cs.planted_claim(scores, from_boundary, planted, found, name="found"),
                          cs.planted_claim(scores, from_boundary, planted, missed, name="missed"))
    assert verdicts[0] == "holds" and verdicts[1].startswith("not detected")


def test_planted_recovery_refuses_a_planted_edge_that_does_not_read_b():
    mask = np.array([True, False, False])
    with pytest.raises(ValueError, match=r"planted edges \[1\] do not read B"):
        cs.planted_recovery([1.0, 2.0, 3.0], mask, np.array([False, True, False]), mask)


# ---------------------------------------------------------------------------- the selection split
def test_held_out_check_refuses_a_selection_that_saw_a_held_out_group():
    cs.held_out_check({"a", "b"}, {"c"}, ["a", "b", "a"])
    with pytest.raises(ValueError, match=r"held-out task groups \['c'\]"):
        cs.held_out_check({"a", "b"}, {"c"}, ["a", "c"])
    with pytest.raises(ValueError, match=r"\['b'\] are both train and held-out"):
        cs.held_out_check({"a", "b"}, {"b", "c"}, ["a"])
    with pytest.raises(ValueError, match=r"task groups \['z'\], in neither split"):
        cs.held_out_check({"a"}, {"c"}, ["a", "z"])


# ---------------------------------------------------------------------------- every refusal, on a planted bad input
ONE = np.ones(4)
B_ONLY = np.array([True, True, False, False])


@pytest.mark.parametrize(("call", "message"), [
    (lambda: cs.faithfulness_curve([0, 2], 2, np.ones((4, 3)), 0 * ONE, ONE, groups_of(2, 2)), "3 sizes per item, sizes lists 2"),
    (lambda: cs.faithfulness_curve([0, 2], 2, np.ones((4, 2)), 0 * ONE, ONE, ["a"] * 3), "3 task-group labels for 4 items"),
    (lambda: cs.faithfulness_curve([0.0, 2.0], 2, np.ones((4, 2)), 0 * ONE, ONE, groups_of(2, 2)), "integers"),
    (lambda: cs.smallest_faithful_size([0, 5, 5], [0.0, 0.5, 1.0]), "increase strictly"),
    (lambda: cs.layer_matched_circuits(EDGE_LAYERS, np.array([0]), draws=0, rng=np.random.default_rng(0)), "draws must be ≥ 1"),
    (lambda: cs.possible_matched_sets(EDGE_LAYERS, np.array([24])), "outside 0..23"),
    (lambda: cs.possible_matched_sets(EDGE_LAYERS.astype(float), np.array([0])), "1-D integer array"),
    (lambda: cs.sufficiency_claim(ONE, np.ones((4, 0)), 0 * ONE, ONE, groups_of(2, 2)), "m_random holds no random circuit"),
    (lambda: cs.minimality_table([1, 2], math.nan, [0.1, 0.2], [0.0]), "f_circuit is not finite"),
    (lambda: cs.minimality_table([1, 2], 0.9, [0.1], [0.0]), "one F"),
    (lambda: cs.minimality_table([1], 0.9, [0.1], [0.0], quantile=1.0), r"quantile must lie in \(0, 1\)"),
    (lambda: cs.estimate_agreement([1.0], [1.0]), "≥ 2 edges"),
    (lambda: cs.planted_recovery(ONE, B_ONLY, np.zeros(4, bool), B_ONLY), "no planted edge"),
    (lambda: cs.planted_recovery(ONE, B_ONLY.astype(int), B_ONLY, B_ONLY), "from_boundary must be a boolean array"),
])
def test_bad_input_is_refused_with_a_message_naming_it(call, message):
    with pytest.raises(ValueError, match=message):
        call()
