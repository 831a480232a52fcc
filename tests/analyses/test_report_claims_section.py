"""report.md's claims section (probes.analyses.report.claims_markdown): it shows the minimum-effect p, the family
size, δ and the exploratory flag, and its headline counts only confirmatory claims that hold: an exploratory row
that is significant after Holm is listed apart, never counted as holding."""

from __future__ import annotations

from probes.analyses.report import CLAIM_COLUMNS, claims_headline, claims_markdown
from probes.scoring.claims import absence_claim, claims_table, effect_claim

GROUPS = [f"g{i}" for i in range(8)]
BIG = [1.0 + 0.1 * i for i in range(8)]


def table():
    return claims_table([
        effect_claim("f", "big", "a large effect", BIG, GROUPS, sesoi=0.25),
        effect_claim("f", "small", "an effect below δ", [0.1 + 0.01 * i for i in range(8)], GROUPS, sesoi=0.25),
        absence_claim("f", "control", "a neutral control", [0.01 * (-1) ** i for i in range(8)], GROUPS, sesoi=0.25),
        effect_claim("strata", "stratum", "the same large effect in a stratum", BIG, GROUPS, exploratory=True),
        effect_claim("tiny", "floor", "a family of 2 task groups", [1.0, 1.2], ["a", "b"]),
    ])


def test_the_headline_counts_confirmatory_claims_that_hold_and_never_an_exploratory_one() -> None:
    claims = table()
    assert claims.set_index("name").loc["stratum", "verdict"].startswith("exploratory: significant")
    assert claims_headline(claims) == ("**2 of 4 confirmatory claims hold** (1 untestable with this run's task groups). "
                                       "1 exploratory rows are listed apart from that count (1 significant after Holm, none a finding).")


def test_the_table_shows_delta_the_minimum_effect_p_the_family_size_and_marks_exploratory_rows() -> None:
    text = claims_markdown(table())
    header = text.split("\n")[2]
    assert header == "| " + " | ".join(CLAIM_COLUMNS) + " |"
    assert {"sesoi", "p_min_holm", "family_size", "exploratory"} <= set(CLAIM_COLUMNS)
    stratum = next(line for line in text.split("\n") if line.startswith("| strata | stratum |"))
    assert "| exploratory | exploratory: significant after Holm" in stratum
    small = next(line for line in text.split("\n") if line.startswith("| f | small |"))
    assert "detectable, below the smallest effect of interest ±0.25" in small
