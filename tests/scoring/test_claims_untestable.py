"""A claim whose design cannot test it (``Claim.untestable``) says so in its verdict, keeps its estimate
and p, and leaves its family's Holm correction: the other claims are adjusted as if it were absent."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from probes.scoring.claims import claims_table, effect_claim


def test_an_untestable_claim_says_why_and_leaves_the_correction():
    groups = [f"g{i}" for i in range(8)]
    strong = effect_claim("fam", "a", "a > 0", np.linspace(1.0, 2.0, 8), groups)
    other = effect_claim("fam", "b", "b > 0", np.linspace(1.0, 2.0, 8), groups)
    both = claims_table([strong, other]).set_index("name")
    assert both.loc["a", "family_size"] == 2 and both.loc["a", "p_holm"] == 2 * strong.p

    table = claims_table([strong, replace(other, untestable="three possible reference sets")]).set_index("name")
    assert table.loc["b", "verdict"] == "untestable: three possible reference sets"
    assert math.isnan(table.loc["b", "p_holm"]) and table.loc["b", "p"] == other.p and table.loc["b", "estimate"] == other.estimate
    assert table.loc["a", "family_size"] == 1 and table.loc["a", "p_holm"] == strong.p and table.loc["a", "verdict"] == "holds"
