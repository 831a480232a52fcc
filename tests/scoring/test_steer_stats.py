"""The steer analysis's statistics (probes.scoring.steer_stats) on synthetic rows with planted effects: the
dose-response and its flip rates, the random-direction band, the per-family table and its sign consistency,
the claims against random directions and the T_ok control, and the refusals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from probes.scoring import steer_stats as ss
from probes.scoring.claims import claims_table, holds

G = 8  # task groups per bucket: the sign-flip floor 1/256 leaves room for Holm
FAMILIES = ("link-vs-share", "delete-vs-archive")


def role(margin: float) -> str:
    return "correct" if margin < 0 else "wrong"


def make_rows(shift, *, seed: int = 0, alphas=(-0.5, 0.5), layers=(4,), windows=(1,), rows_modes=("decision",),
              directions=("applicability", "shuffled"), n_draws: int = 5, per_group: int = 2, configs=("basm",)) -> pd.DataFrame:
    """Baseline and steered rows of T_wrong (clean margin +1: the wrong tool) and T_ok (clean −1) records,
    task groups split between two families; ``shift(direction, bucket, family, alpha)`` is the planted Δm
    (noise N(0, 0.1)); random directions move the margin by N(0, 0.1); the greedy role follows the margin."""
    rng = np.random.default_rng(seed)
    rows = []
    for config in configs:
        for bucket, clean in (("T_wrong", 1.0), ("T_ok", -1.0)):
            for g in range(G):
                family = FAMILIES[g % 2]
                for i in range(per_group):
                    record = dict(record_id=f"{config}-{bucket}-g{g}-{i}", item_id=f"{bucket}-g{g}-{i}", bucket=bucket, domain="d",
                                  task_group=f"{bucket}-g{g}", config=config, k=1, family=family)
                    clean_margin = clean + rng.normal(0, 0.1)
                    base = dict(record, condition="baseline", direction="", draw=-1, layer=-1, window=0, rows_mode="", alpha=0.0,
                                scale=0.0, margin=clean_margin, margin_tool_choice=clean_margin, margin_path=2 * clean_margin,
                                kl_clean=0.0, top_role=role(clean_margin), clean_margin=clean_margin, clean_top_role=role(clean_margin))
                    rows.append(base)
                    for layer in layers:
                        for window in windows:
                            for mode in rows_modes:
                                for alpha in alphas:
                                    conditions = [(d, -1, shift(d, bucket, family, alpha)) for d in directions]
                                    conditions += [("random", r, 0.0) for r in range(n_draws)]
                                    for direction, draw, planted in conditions:
                                        delta = planted + rng.normal(0, 0.1)
                                        margin = clean_margin + delta
                                        rows.append(dict(base, condition=f"{direction}{draw if draw >= 0 else ''}@{layer}", direction=direction,
                                                         draw=draw, layer=layer, window=window, rows_mode=mode, alpha=alpha, scale=10.0,
                                                         margin=margin, margin_tool_choice=margin, margin_path=2 * margin,
                                                         kl_clean=abs(delta), top_role=role(margin)))
    return pd.DataFrame(rows)


def lowers_t_wrong(direction, bucket, family, alpha):
    """The applicability direction lowers the T_wrong margin by 2 per unit α·2 (−2 at α = 0.5); nothing else moves."""
    return -4.0 * alpha if direction == "applicability" and bucket == "T_wrong" else 0.0


def claims_of(rows, **options):
    options = {"headline_alpha": 0.5, "headline_direction": "applicability", "sesoi": 0.25, "ok_sesoi": 0.1, "seed": 0, **options}
    return claims_table(ss.steer_claims(rows, **options)).set_index("name")


@pytest.fixture(scope="module")
def planted() -> pd.DataFrame:
    return make_rows(lowers_t_wrong)


@pytest.fixture(scope="module")
def planted_claims(planted) -> pd.DataFrame:
    return claims_of(planted)


# ---------------------------------------------------------------------------- claims
def test_a_planted_direction_beats_random_directions_and_a_null_one_does_not(planted_claims):
    table = planted_claims
    head = table.loc["basm L4: applicability vs random, T_wrong margin"]
    assert head["family"] == ss.STEER_FAMILY and holds(head["verdict"])
    assert head["estimate"] == pytest.approx(-2.0, abs=0.1)
    control = table.loc["basm L4: shuffled vs random, T_wrong margin"]
    assert control["family"] == ss.EXPLORATORY_FAMILY and control["verdict"].startswith("exploratory: not detected")
    assert "shuffled bucket labels" in control["note"]


def test_the_headline_claim_is_not_detected_when_nothing_is_planted():
    table = claims_of(make_rows(lambda *_: 0.0, seed=1, directions=("applicability",)))
    assert table.loc["basm L4: applicability vs random, T_wrong margin", "verdict"].startswith("not detected")


def test_t_ok_absence_holds_when_nothing_changes_and_fails_when_half_the_calls_break(planted_claims):
    name = "basm L4: applicability, T_ok correct calls kept"
    kept = planted_claims.loc[name]
    assert kept["unit"] == "share" and kept["estimate"] == 0.0 and holds(kept["verdict"])
    assert "TOST" in kept["statement"]
    broken = make_rows(lowers_t_wrong, directions=("applicability",))
    half = (broken["bucket"] == "T_ok") & (broken["direction"] == "applicability") & broken["record_id"].str.endswith("-0")
    broken.loc[half, "top_role"] = "wrong"  # one of the two records of every group now calls the wrong tool
    verdict = claims_of(broken).loc[name]
    assert verdict["estimate"] == pytest.approx(-0.5) and verdict["verdict"].startswith("not shown")


def test_the_flip_claim_detects_a_direction_that_flips_t_wrong_and_not_a_null_one(planted):
    flips = ss.flip_claim(planted, config="basm", layer=4, direction="applicability", alpha=0.5, family="organism steer")
    null = ss.flip_claim(planted, config="basm", layer=4, direction="shuffled", alpha=0.5, family="organism steer")
    table = claims_table([flips, null]).set_index("name")
    assert table.loc["basm L4: applicability flips T_wrong vs random", "estimate"] == 1.0
    assert holds(table.loc["basm L4: applicability flips T_wrong vs random", "verdict"])
    assert table.loc["basm L4: shuffled flips T_wrong vs random", "verdict"].startswith("not detected")


# ---------------------------------------------------------------------------- tables
def test_flip_rates_equal_a_hand_count():
    # one cell, two task groups of two records; clean roles and steered roles chosen by hand
    clean = ["wrong", "wrong", "correct", "abstain"]
    top = ["correct", "wrong", "wrong", "correct"]
    rows = pd.DataFrame([dict(record_id=f"r{i}", item_id=f"r{i}", bucket="T_wrong", domain="d", task_group=f"g{i // 2}", config="basm",
                              k=1, family="f", condition="applicability@4", direction="applicability", draw=-1, layer=4, window=1,
                              rows_mode="decision", alpha=0.5, scale=1.0, margin=0.0, clean_margin=1.0, kl_clean=0.1 * i,
                              top_role=t, clean_top_role=c) for i, (c, t) in enumerate(zip(clean, top))])
    dose = ss.dose_response(rows).iloc[0]
    assert dose["n_clean_wrong"] == 2 and dose["wrong_to_correct"] == 0.5  # g0: r0 flipped, r1 not
    assert dose["n_clean_correct"] == 1 and dose["correct_to_wrong"] == 1.0  # g1: r2
    assert dose["n_clean_not_abstain"] == 3 and dose["to_abstain"] == 0.0
    assert dose["correct_rate"] == pytest.approx(np.mean([1 / 2, 1 / 2]))  # r0 in g0, r3 in g1
    assert dose["note"] == "zero width: every task group has this value"
    assert dose["delta_margin"] == -1.0 and dose["kl"] == pytest.approx(np.mean([0.05, 0.25]))
    assert dose["n_records"] == 4 and dose["n_groups"] == 2


def test_dose_response_recovers_the_planted_slope_and_each_variants_delta(planted):
    dose = ss.dose_response(planted).set_index(["bucket", "direction", "alpha"])
    assert set(dose.index.get_level_values("direction")) == {"applicability", "shuffled"}  # random draws: the band
    wrong = dose.loc[("T_wrong", "applicability", 0.5)]
    assert wrong["delta_margin"] == pytest.approx(-2.0, abs=0.1) and wrong["delta_margin_high"] < -1.8
    assert wrong["delta_tool_choice"] == pytest.approx(wrong["delta_margin"])
    assert wrong["delta_path"] == pytest.approx(2 * wrong["delta_margin"])  # from the baseline rows' own path margins
    assert wrong["wrong_to_correct"] == 1.0 and wrong["n_clean_wrong"] == G * 2
    assert dose.loc[("T_wrong", "applicability", -0.5), "delta_margin"] == pytest.approx(2.0, abs=0.1)


def test_the_band_percentiles_equal_numpy_on_the_draws(planted):
    band = ss.random_band(planted)
    cell = band[(band["bucket"] == "T_wrong") & (band["alpha"] == 0.5)].iloc[0]
    assert cell["n_draws"] == 5
    steered = ss.steered_rows(planted)
    draws = steered[(steered["direction"] == "random") & (steered["bucket"] == "T_wrong") & (steered["alpha"] == 0.5)]
    per_draw = draws.groupby(["draw", "task_group"])["delta_margin"].mean().groupby("draw").mean().to_numpy()
    assert cell["delta_margin_low"] == pytest.approx(np.percentile(per_draw, 2.5))
    assert cell["delta_margin_high"] == pytest.approx(np.percentile(per_draw, 97.5))
    assert cell["delta_margin_mean"] == pytest.approx(per_draw.mean())


def test_sign_consistency_finds_the_family_pushed_toward_the_wrong_tool():
    def one_family_opposite(direction, bucket, family, alpha):  # the real-model example
        if direction != "applicability" or bucket != "T_wrong":
            return 0.0
        return -2.6 if family == "link-vs-share" else +1.0

    rows = make_rows(one_family_opposite, alphas=(0.25,))
    dose = ss.dose_response(rows)
    consistency = ss.sign_consistency(dose, ss.family_table(rows)).set_index(["bucket", "direction"])
    cell = consistency.loc[("T_wrong", "applicability")]
    assert cell["delta_margin"] == pytest.approx(-0.8, abs=0.1)  # the pooled mean says "lowers"
    assert cell["n_families"] == 2 and cell["share_same_sign"] == 0.5 and cell["n_opposite"] == 1
    assert cell["opposite_families"].startswith("delete-vs-archive +1.0")


# ---------------------------------------------------------------------------- refusals
def test_bad_rows_are_refused_with_the_fix(planted):
    with pytest.raises(ValueError, match=r"lack the columns \['top_role'\].*actions=True"):
        ss.dose_response(planted.drop(columns="top_role"))
    with pytest.raises(ValueError, match=r"top_role holds \['nan'\]"):
        ss.dose_response(planted.assign(top_role=np.nan))
    with pytest.raises(ValueError, match="alpha must be finite"):
        ss.dose_response(planted.assign(alpha=np.where(planted["condition"] == "baseline", 0.0, np.inf)))
    with pytest.raises(ValueError, match="repeat a"):
        ss.dose_response(pd.concat([planted, planted.tail(1)]))
    with pytest.raises(ValueError, match="no draw number"):
        ss.random_band(planted.assign(draw=-1))
    with pytest.raises(ValueError, match="no baseline row"):
        ss.dose_response(planted[planted["condition"] != "baseline"])
    with pytest.raises(ValueError, match="more than one baseline row"):
        ss.dose_response(pd.concat([planted, planted[planted["condition"] == "baseline"].head(1)]))
    with pytest.raises(ValueError, match="no steered row of a non-random direction"):
        ss.dose_response(planted[planted["direction"].isin(["", "random"])])
    with pytest.raises(ValueError, match="no random-direction rows"):
        ss.random_band(planted[planted["direction"] != "random"])


def test_a_band_of_one_draw_is_refused_naming_the_cell():
    rows = make_rows(lowers_t_wrong, n_draws=1)
    with pytest.raises(ValueError, match=r"cell config='basm', bucket='T_wrong', layer=4, window=1, rows_mode='decision', alpha=-0.5 has 1"):
        ss.random_band(rows)
    with pytest.raises(ValueError, match="fewer than 2 random draws"):
        ss.steer_claims(rows, headline_alpha=0.5, headline_direction="applicability", sesoi=0.25, ok_sesoi=0.1)


def test_claims_refuse_a_headline_off_the_grid_or_the_wrong_sign(planted):
    with pytest.raises(ValueError, match="headline_alpha must be > 0"):
        claims_of(planted, headline_alpha=-0.5)
    with pytest.raises(ValueError, match=r"grid holds α ∈ \[-0.5, 0.5\]"):
        claims_of(planted, headline_alpha=0.25)
    with pytest.raises(ValueError, match="'probe' is not among the steered directions"):
        claims_of(planted, headline_direction="probe")
    with pytest.raises(ValueError, match="no T_ok rows"):
        claims_of(planted[planted["bucket"] == "T_wrong"])
    with pytest.raises(ValueError, match="no T_wrong rows at headline_alpha 0.5"):
        claims_of(planted[planted["bucket"] == "T_ok"])
    with pytest.raises(ValueError, match="no T_wrong rows of direction 'probe'"):
        ss.flip_claim(planted, config="basm", layer=4, direction="probe", alpha=0.5, family="f")
