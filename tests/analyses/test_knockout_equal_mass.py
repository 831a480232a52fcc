"""The knockout's dose comparison at equal mass, its merged identical controls and its headline caveat,
on rows planted through the analysis's own draws (:func:`probes.analyses.knockout.record_knockouts`
on records whose spans are laid out by hand, the margin shift of each knockout computed from what
it removes):

- the convex-response counter-example of issue 42: every position set moves the margin by the same
  Δm = 30 · mass², so B is not special. The former slope comparison (per task group, B's slope
  through the origin minus the pool's) claims it; the equal-mass comparison does not;
- a pool smaller than |B| (every organism record): ``random``, ``count_pool`` and ``mass_matched``
  knock out the whole pool: one control, one claim, the merge stated, Fig. 6's title built from the
  draws; a pool larger than |B| keeps three;
- a pool whose own knockout moves the margin: the report says "B > pool" mixes two effects; a
  neutral one: it does not.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from probes.analyses import knockout as K
from probes.scoring.claims import claims_table, effect_claim

N_TOKENS, CALL = 200, 190
B = [[20, 45], [50, 75]]  # 50 positions
P = [[80, 100]]


def _record(rid: str, memory: list[int]) -> SimpleNamespace:
    """What the draws read of a prompt record: its spans, length and first query row."""
    return SimpleNamespace(record_id=rid, n_tokens=N_TOKENS, query_rows=[CALL],
                           spans={"memory": [memory], "boundary": B, "procedure": P})


def _weights(rng: np.random.Generator, memory: list[int], b_mass: float, pool_mass: float) -> np.ndarray:
    """Deciding-row attention over the tokens: B holds ``b_mass`` (unequal positions), the pool
    (the memory block outside B and P) ``pool_mass``, every other token a little."""
    w = np.full(N_TOKENS, 0.0004)
    b = [p for s, e in B for p in range(s, e)]
    pool = [p for p in range(*memory) if p not in b and not any(s <= p < e for s, e in P)]
    w[b] = rng.uniform(0.2, 1.8, len(b))
    w[b] *= b_mass / w[b].sum()
    w[pool] = rng.uniform(0.5, 1.5, len(pool))
    w[pool] *= pool_mass / w[pool].sum()
    return w


def planted_rows(*, memory: list[int], b_mass: float = 0.21, pool_mass: float = 0.036, convex: float = 0.0,
                 effect: dict[str, float] | None = None, groups: int = 10, per_group: int = 2, draws: int = 2,
                 noise: float = 0.003, seed: int = 0) -> pd.DataFrame:
    """Knockout rows as the scorer writes them. A knockout's shift is ``convex`` · mass² plus, per
    position it removes, ``effect`` of its region ("B", "pool", else 0) / the region's size, plus noise."""
    rng = np.random.default_rng(seed)
    options = SimpleNamespace(random_pool="memory", random_draws=draws, controls=K.CONTROLS, seed=0, mass_tolerance=0.1,
                              knockout_rows="path")
    effect = effect or {}
    rows = []
    for g in range(groups):
        for r in range(per_group):
            rid = f"item-{g}-{r}|basm|k2|native"
            record = _record(rid, memory)
            w = _weights(rng, memory, b_mass * rng.uniform(0.8, 1.2), pool_mass * rng.uniform(0.8, 1.2))
            knockouts, state = K.record_knockouts(record, w[None, None, :], options, (), [])
            in_b = np.zeros(N_TOKENS, dtype=bool)
            in_b[[p for s, e in B for p in range(s, e)]] = True
            pool = np.zeros(N_TOKENS, dtype=bool)
            pool[range(*memory)] = True
            pool[in_b] = False
            pool[[p for s, e in P for p in range(s, e)]] = False
            m0 = rng.normal(1.0, 0.5)
            base = {"record_id": rid, "item_id": rid.split("|")[0], "config": "basm", "bucket": "T_wrong", "task_group": f"g{g}",
                    "tempting_shown": True, "boundary_size": int(in_b.sum()), "correct_is_abstain": False,
                    "boundary_mass": state.boundary_mass, "control_pool_size": state.pool_size, "control_pool_mass": state.pool_mass}
            rows.append({**base, "condition": "baseline", "margin": m0, "broad_margin": m0, "correct_margin": 0.0, "call_logodds": 0.0,
                         "knockout_mass": 0.0, "knockout_digest": ""})
            for k in knockouts:
                positions = list(k.key_positions)
                mass = float(w[positions].sum())
                shift = convex * mass ** 2 + rng.normal(0, noise)
                shift += effect.get("B", 0.0) * in_b[positions].sum() / in_b.sum() + effect.get("pool", 0.0) * pool[positions].sum() / pool.sum()
                rows.append({**base, "condition": k.name, "margin": m0 + shift, "broad_margin": m0 + shift,
                             "correct_margin": rng.normal(0, noise), "call_logodds": 0.0, "knockout_mass": mass,
                             "knockout_digest": K.knockout_digest(k), **state.info.get(k.name, {})})
    return pd.DataFrame(rows)


SMALL_POOL = [15, 105]  # the memory block: the pool outside B and P is 20 positions (< |B| = 50)
MEDIUM_POOL = [5, 110]  # 35 positions (< |B|)
LARGE_POOL = [0, 160]  # 90 positions (> |B|)


def _old_dose_claim(points: pd.DataFrame):
    """The comparison this version replaces: per task group, the least-squares slope through the
    origin of Δm on mass of B's knockouts (boundary, count_boundary) minus the pool's (random,
    count_pool, mass_matched), tested over task groups."""
    def slope(sub: pd.DataFrame) -> float:
        return float((sub["mass"] * sub["delta"]).sum() / (sub["mass"] ** 2).sum())

    sub = points[(points["bucket"] == "T_wrong") & (points["measure"] == "margin")]
    diff = {g: slope(s[s["knockout"].isin(["boundary", "count_boundary"])]) - slope(s[s["knockout"].isin(["random", "count_pool", "mass_matched"])])
            for g, s in sub.groupby("task_group")}
    return effect_claim("old", "dose", "per unit of attention", list(diff.values()), None)


@pytest.fixture(scope="module")
def convex():
    """The counter-example: Δm = 30 · mass² for every knockout; the pool (20 positions, 0.036 of the
    deciding row's attention) is smaller than |B| (50 positions, 0.21)."""
    return K.summarise_rows(planted_rows(memory=SMALL_POOL, convex=30.0), sesoi=0.25)


def test_convex_response_fools_the_slopes_but_not_the_equal_mass_comparison(convex):
    summary = convex
    # the slopes through the origin: B's knockouts remove ~0.21, the pool's ≤ 0.04, and Δm is convex
    old = claims_table([_old_dose_claim(summary.points)]).iloc[0]
    print(f"\nold slope difference {old['estimate']:+.2f} [{old['low']:+.2f}, {old['high']:+.2f}], p = {old['p']:.2g}: {old['verdict']}")
    assert old["verdict"] == "holds" and old["estimate"] > 1
    table = claims_table(summary.claims).set_index("name")
    equal = table.loc["equal-mass"]
    row = summary.comparisons.set_index("comparison").loc["equal-mass"]
    print(f"equal mass {equal['estimate']:+.3f} [{equal['low']:+.3f}, {equal['high']:+.3f}] on {row['n_records']} of "
          f"{row['records']} records (mass ratio {row['mass_ratio']:.2f}): {equal['verdict']}")
    assert not equal["verdict"].startswith("holds") and abs(equal["estimate"]) < 0.05
    assert row["n_records"] >= 0.5 * row["records"] and abs(row["mass_ratio"] - 1) < 0.1  # matched, at equal mass: not vacuous
    # no slope, no "per unit" claim is left
    assert not [n for n in table.index if "dose" in n] and not table["statement"].str.contains("per unit").any()
    eq = summary.equal_mass.set_index(["config", "bucket", "measure"]).loc[("basm", "T_wrong", "margin")]
    assert eq["n_records"] == row["n_records"] and eq["coverage"] == pytest.approx(row["coverage"])


def test_b_side_match_leaves_when_b_holds_less_mass_than_the_pool_draw():
    """A pool holding 1.8× B's mass (as on a real 0.5B model): no B subset reaches it, so no record
    enters the B-side comparison (counted, not tested), and the pool-side mass match does."""
    summary = K.summarise_rows(planted_rows(memory=MEDIUM_POOL, b_mass=0.1, pool_mass=0.18, groups=6), sesoi=0.25)
    comparisons = summary.comparisons.set_index("comparison")
    assert comparisons.loc["equal-mass", "n_records"] == 0
    assert claims_table(summary.claims).set_index("name").loc["equal-mass", "verdict"].startswith("not tested")
    assert comparisons.loc["mass-matched", "n_records"] > 0
    assert summary.controls.set_index("control").loc["random", "pool_mass_ratio"] == pytest.approx(1.8, rel=0.25)


def test_identical_controls_are_merged_into_one_claim(convex):
    small = convex
    assert small.merged == {"count_pool": "random", "mass_matched": "random"}
    absence = [c for c in small.claims if c.family == "knockout" and c.kind == "absence"]
    pool_claims = [c for c in absence if c.name.removesuffix(" neutral") in K.POOL_FAMILY]
    assert [c.name for c in pool_claims] == ["random neutral"]  # one claim, not three
    assert "identical to count_pool, mass_matched" in pool_claims[0].statement
    assert "the whole pool where it holds fewer: on every draw" in pool_claims[0].statement
    assert set(K.basm_deltas(small)["knockout"]).isdisjoint(small.merged)  # reported once
    title = K.knockout_figure_title(small)
    assert "same count and the same attention mass" not in title and "whole pool" in title and "identical" in title
    assert "`count_pool` = `random`" in K.headline_text(small)
    # no mass-matched draw matched (the whole pool holds less than B): the comparison says so, untested
    assert small.comparisons.set_index("comparison").loc["mass-matched", "n_records"] == 0
    # a pool larger than |B|: three different knockouts, three claims
    large = K.summarise_rows(planted_rows(memory=LARGE_POOL, pool_mass=0.6, groups=6), sesoi=0.25)
    # n = min(|B|, |pool|) = |B|: the count-matched B side is all of B; B holds less than the pool draw: so is the B-side match
    assert large.merged == {"count_boundary": "boundary", "mass_boundary": "boundary"}
    names = {c.name for c in large.claims if c.family == "knockout" and c.kind == "absence"}
    assert {"random neutral", "count_pool neutral", "mass_matched neutral"} <= names


def test_a_pool_that_moves_the_margin_is_said_to_mix_two_effects():
    moving = K.summarise_rows(planted_rows(memory=SMALL_POOL, effect={"B": 1.0, "pool": -0.5}), sesoi=0.25)
    assert "mixes two effects" in moving.mixing and "-0.50" in moving.mixing.replace("−", "-")
    assert "mixes two effects" in K.headline_text(moving) and "mixes two effects" in K.caption(moving)
    headline = next(c for c in moving.claims if c.name == K.HEADLINE)
    assert "mixes two effects" in headline.note and "chosen before the run" in headline.statement
    neutral = K.summarise_rows(planted_rows(memory=SMALL_POOL, effect={"B": 1.0}, noise=0.002), sesoi=0.25)
    assert claims_table(neutral.claims).set_index("name").loc["random neutral", "verdict"].startswith("holds")
    assert neutral.mixing == "" and "mixes" not in K.headline_text(neutral)


def test_every_knockout_claim_states_the_one_delta(convex):
    knockout = [c for c in convex.claims if c.family == "knockout"]
    assert {c.sesoi for c in knockout} == {0.25} and {c.unit for c in knockout} == {"logits"}
    table = claims_table(knockout).set_index("name")
    # B removes 0.21 of the attention: 30 · 0.21² ≈ 1.3 logits, far above δ; the count-matched pair ≈ 0.1: below it
    assert table.loc["boundary", "verdict"] == "holds"
    assert table.loc["count-matched", "verdict"].startswith("detectable, below the smallest effect of interest")
