"""``heads``' random reference: the size of the random-head pool is in the causal table, the floor
table and the claim's note; a pool that admits fewer distinct N-head sets than a rank test needs to
reach p < α makes the claim "untestable" (said, and out of the Holm correction), never "not
detected"; a large enough pool gives the ordinary verdict, with the power against the family's δ."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from probes.analyses.heads import (MATCH_POOL, MIN_RANDOM_SETS, SESOI, FloorChoice, Heads, HeadsSummary, causal_table, differences,
                                   floor_table, matched_random_sets, possible_sets, random_candidates, ranking, record_margins, select_heads,
                                   top_heads)
from probes.analyses.knockout import DEFAULT_SESOI
from probes.scoring.claims import claims_table


def pool_rows(passing: int, heads: int = 16) -> pd.DataFrame:
    """Attention rows of one layer of ``heads`` heads, two items per bucket: heads 0, 1, 2 shift most
    from T_ok to T_wrong (in that order), and only the first ``passing`` heads read B ∪ P above a 0.05 floor."""
    ok_b = [5e-4 if h < passing else 1e-6 for h in range(heads)]
    wrong_b = [(4e-3, 3.5e-3, 3e-3)[h] if h < 3 else 1e-3 - 1e-5 * h if h < passing else 1e-6 for h in range(heads)]
    p = [5e-4 if h < passing else 1e-6 for h in range(heads)]
    alpha = {"T_ok": (ok_b, p), "T_wrong": (wrong_b, p)}
    return pd.DataFrame([{"bucket": bucket, "boundary_size": 100, "procedure_size": 50, "alpha_boundary_heads": [b],
                          "alpha_procedure_heads": [pp], "correct_is_abstain": False, "item_id": f"{bucket}-{i}", "task_group": f"g{i}"}
                         for bucket, (b, pp) in alpha.items() for i in range(2)])


def summary_for(passing: int, top_gain: float, seed: int = 0, top: int = 2) -> HeadsSummary:
    """A heads summary whose top-``top`` knockout raises each record's margin by ``top_gain`` more than
    the random sets' (plus a little noise), over 8 test task groups."""
    sel = select_heads(pool_rows(passing), min_span_mass=0.05, top=top, draws=5, seed=0)
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(8):
        base = {"record_id": f"r{r}", "task_group": f"t{r}", "boundary_size": 100}
        rows.append({**base, "selection": "baseline", "margin": 0.0})
        for name in sel.sets:
            rows.append({**base, "selection": name, "margin": (top_gain if name.startswith("top") else 0.0) + 0.1 * rng.normal()})
    rows = pd.DataFrame(rows)
    causal = causal_table(rows, sel, excluded=0)
    diffs = differences(record_margins(rows, list(sel.sets))[0], sel)
    floor = FloorChoice(0.05, "given", pd.DataFrame(), "floor 0.05 given a priori")
    return HeadsSummary(np.zeros((1, 16)), sel.ranking, causal, pd.DataFrame(), floor, sel, diffs, rows, rows, top, 0, "", [])


def test_the_family_delta_is_the_knockout_one_and_the_pool_rule_is_the_rank_floor():
    assert SESOI == DEFAULT_SESOI
    assert 1 / (MIN_RANDOM_SETS + 1) < 0.05 <= 1 / MIN_RANDOM_SETS  # the fewest random sets a rank test needs below α


def test_a_small_random_pool_is_reported_and_makes_the_claim_untestable():
    """5 heads pass the floor, the top 2 are taken: 3 heads remain, 3 possible pairs (the organism's case)."""
    summary = summary_for(passing=5, top_gain=1.0)
    sel = summary.selection
    assert sel.top == [(0, 0), (0, 1)] and sel.random_pool == 3 and sel.possible_sets == math.comb(3, 2) == 3  # width 4 ≥ 3: every pair
    assert sel.distinct_sets <= 3 and len(sel.random_names) == 5
    assert (summary.causal["random_pool"] == 3).all() and (summary.causal["random_sets_possible"] == 3).all()
    floors = floor_table([sel], None, top=2, excluded=0).iloc[0]
    assert floors["random_pool"] == 3 and floors["random_sets_possible"] == 3

    [claim] = Heads().claims(summary)
    assert "random-head pool of 3 heads (3 possible 2-head sets)" in claim.note
    assert claim.untestable.startswith("the random-head pool holds 3 heads") and str(MIN_RANDOM_SETS) in claim.untestable
    row = claims_table([claim]).iloc[0]
    # a strong, consistent effect, yet no verdict on it: the reference is three named pairs, not random heads
    assert claim.estimate > 0.5 and claim.p < 0.05
    assert row["verdict"].startswith("untestable: the random-head pool holds 3 heads") and "not detected" not in row["verdict"]
    assert np.isnan(row["p_holm"]) and row["family_size"] == 0  # no test, so not in the Holm correction


@pytest.mark.parametrize("passing, top", [(6, 2), (12, 2), (12, 3)])
def test_possible_sets_are_the_sets_the_matched_draw_reaches(passing, top):
    """The count the rule reads equals the distinct sets of many seeded draws (each of the ≤ width^N
    paths of the draw has probability width^-N, so 4,000 draws ≫ 6³ reach every one), capped at the rule's need."""
    rank = ranking(pool_rows(passing), 0.05)
    best = top_heads(rank, top)
    drawn = {tuple(s) for s in matched_random_sets(rank, best, draws=4000, seed=1)[0]}
    assert possible_sets(rank, best, cap=10**6) == len(drawn)
    assert possible_sets(rank, best) == min(len(drawn), MIN_RANDOM_SETS)
    if top == 2:  # each random head among the MATCH_POOL·2 = 4 nearest: at most 4 × 4 pairs, whatever the pool
        assert len(drawn) <= (MATCH_POOL * 2) ** 2 < MIN_RANDOM_SETS and len(random_candidates(rank, best)) == passing - 2


@pytest.mark.parametrize("passing, top, testable", [(5, 2, False), (16, 2, False), (6, 3, False), (16, 3, True)])
def test_the_rule_turns_on_the_sets_the_draw_can_give(passing, top, testable):
    summary = summary_for(passing=passing, top_gain=1.0, top=top)
    assert (summary.selection.possible_sets >= MIN_RANDOM_SETS) == testable
    verdict = claims_table(Heads().claims(summary))["verdict"].iloc[0]
    assert verdict.startswith("untestable") != testable
    if testable:
        assert verdict == "holds"  # 1.0 logits per record over 8 task groups: above δ = 0.25 by the minimum-effect test


def test_not_detected_reports_power_against_the_family_delta():
    summary = summary_for(passing=16, top_gain=0.0, seed=1, top=3)
    [claim] = Heads().claims(summary)
    row = claims_table([claim]).iloc[0]
    assert claim.sesoi == SESOI and np.isfinite(claim.power)
    assert row["verdict"].startswith("not detected") and f"against ±{SESOI:g}" in row["verdict"]
