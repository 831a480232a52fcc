"""The verdicts a claim can earn (probes.scoring.claims): the minimum-effect test against the
family's δ, one δ per family, exploratory claims that never hold, and "untestable" judged on the
Holm-adjusted floor. Each rule is shown on data where the old wording would have overstated."""

from __future__ import annotations

import numpy as np
import pytest

from probes.scoring.claims import absence_claim, claims_table, effect_claim

GROUPS = [f"g{i}" for i in range(12)]  # 12 groups: exact sign-flip enumeration, floor 1/4096


def _values(mean: float, spread: float = 0.02) -> np.ndarray:
    return mean + spread * np.linspace(-1, 1, len(GROUPS))


def test_an_effect_detected_but_inside_delta_does_not_hold():
    # +0.10 ± 0.02 in every group: detectable (p = 1/4096) but far below δ = 0.25
    claim = effect_claim("f", "small", "small", _values(0.10), GROUPS, sesoi=0.25)
    assert claim.p == pytest.approx(2.0 ** -12)
    assert claim.p_min_effect > 0.99  # every group is below δ: the minimum-effect test cannot reject
    row = claims_table([claim]).iloc[0]
    assert row["verdict"].startswith("detectable, below the smallest effect of interest ±0.25")
    # the same values with no δ stated: the old wording
    assert claims_table([effect_claim("f", "small", "small", _values(0.10), GROUPS)]).iloc[0]["verdict"] == "holds"


def test_an_effect_above_delta_holds_and_the_minimum_effect_p_is_the_shifted_test():
    claim = effect_claim("f", "big", "big", _values(0.60), GROUPS, sesoi=0.25)
    shifted = effect_claim("f", "big", "big", _values(0.60) - 0.25, GROUPS)
    assert claim.p_min_effect == pytest.approx(shifted.p)
    assert claims_table([claim]).iloc[0]["verdict"] == "holds"


def test_a_less_claim_tests_beyond_minus_delta():
    claim = effect_claim("f", "down", "down", _values(-0.60), GROUPS, alternative="less", sesoi=0.25)
    assert claims_table([claim]).iloc[0]["verdict"] == "holds"
    small = effect_claim("f", "down", "down", _values(-0.10), GROUPS, alternative="less", sesoi=0.25)
    assert claims_table([small]).iloc[0]["verdict"].startswith("detectable, below")


def test_a_straddling_ci_is_detectable_but_not_shown_above_delta():
    values = np.array([0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5])
    row = claims_table([effect_claim("f", "mid", "mid", values, GROUPS, sesoi=0.25)]).iloc[0]
    assert row["verdict"].startswith("detectable; not shown above the smallest effect of interest ±0.25")


def test_one_delta_per_family_and_unit():
    a = effect_claim("f", "a", "a", _values(0.6), GROUPS, sesoi=0.25)
    b = effect_claim("f", "b", "b", _values(0.6), GROUPS, sesoi=0.5)
    with pytest.raises(ValueError, match="one δ per family"):
        claims_table([a, b])
    other_unit = effect_claim("f", "c", "c", _values(0.6), GROUPS, sesoi=0.5, unit="log2")
    claims_table([a, other_unit])  # another unit may state its own δ
    claims_table([a, effect_claim("g", "b", "b", _values(0.6), GROUPS, sesoi=0.5)])  # another family too
    with pytest.raises(ValueError, match="sesoi must be > 0"):
        effect_claim("f", "z", "z", _values(0.6), GROUPS, sesoi=0.0)


def test_exploratory_claims_never_hold():
    claims = [effect_claim("x", "e", "e", _values(0.6), GROUPS, sesoi=0.25, exploratory=True),
              absence_claim("x", "a", "a", _values(0.0), GROUPS, sesoi=0.25, exploratory=True)]
    table = claims_table(claims).set_index("name")
    assert table.loc["e", "verdict"] == "exploratory: significant after Holm, not a confirmatory claim"
    assert table.loc["a", "verdict"].startswith("exploratory: holds: equivalent")  # the absence wording, marked
    assert not any(v.startswith("holds") for v in table["verdict"])
    assert table["exploratory"].tolist() == [True, True]


def test_untestable_is_judged_on_the_holm_adjusted_floor():
    # 5 groups: floor 1/32 = 0.031 < α alone, but Holm over 9 claims makes it 0.28: no outcome can hold
    groups = GROUPS[:5]
    strong = [effect_claim("f", f"c{i}", "c", np.full(5, 1.0) + np.arange(5) * 0.01, groups) for i in range(9)]
    table = claims_table(strong)
    assert table["p"].tolist() == pytest.approx([1 / 32] * 9)
    assert all(v.startswith("untestable at α = 0.05: 5 task groups allow p ≥ 0.0312, 0.281 after Holm over 9") for v in table["verdict"])
    assert claims_table(strong[:1]).iloc[0]["verdict"] == "holds"  # alone, the same claim can and does hold
