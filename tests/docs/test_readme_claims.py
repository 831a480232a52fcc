"""Every estimate README.md and the model card state with a CI is a claim of the committed ``docs/claims.csv``
(``python docs/claims.py`` collects it from a report's ``claims.csv`` and the organism's ``validation.json``), at
the precision shown, and a claim that does not hold is not worded as holding.

What counts as a stated estimate: a number, an optional ``%`` and unit word (``logits``, ``nats``), then its CI
in brackets, e.g. ``+1.00 [+0.77, +1.24]``, ``−0.014 [−0.024, −0.004]`` (unicode minus or ``-``),
``−0.24 logits [−0.38, −0.09]``, ``24.6% [17.5, 32.5]`` (a % is read as a share × 100). Numbers without a
bracketed CI (timings, counts, p-values) are not matched. It matches a row when the row's estimate, low and high,
printed at the decimals shown, are the numbers shown.

Descriptive numbers with a CI that are not claims (a per-condition table, a plain-HF cross-check) go between
``<!-- descriptive -->`` and ``<!-- /descriptive -->`` (HTML comments, invisible when rendered;
``probes.reporting.markdown.descriptive`` writes them); nothing between them is matched, and an unclosed or
nested marker is an error.

Wording: when the matching rows' verdict is not "holds" (or "holds: equivalent ..."), the sentence stating the
number (or its table row, list item) must carry the verdict's leading words: "not detected", "detectable",
"exploratory", "untestable", "not shown", "not tested", "not after correction".
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from probes.scoring.claims import claims_table, effect_claim
from runs import load_script

ROOT = Path(__file__).resolve().parents[2]


def collector():
    return load_script("claims_doc", ROOT / "docs" / "claims.py")


@pytest.fixture(scope="module")
def doc():
    return collector()


REGENERATE = "the runs listed in docs/claims.py's docstring, then python docs/claims.py with their claims tables"


def committed(doc) -> pd.DataFrame:
    """docs/claims.csv (a missing table fails the test that reads it, naming the command that writes it)."""
    if not doc.TABLE.is_file():
        pytest.fail(f"docs/claims.csv is missing; generate it: {REGENERATE}")
    return pd.read_csv(doc.TABLE)


def test_every_estimate_the_readme_and_the_model_card_state_is_a_claim_worded_as_its_verdict(doc) -> None:
    problems = doc.check(committed(doc))
    assert not problems, (f"estimates not backed by docs/claims.csv, or worded as holding (regenerate the table: {REGENERATE}; "
                          "then state what it says):\n" + "\n".join(problems))


def test_the_committed_table_holds_the_committed_validation(doc) -> None:
    """docs/claims.csv is current with validation.json (the report's rows cannot be rerun here)."""
    fresh, table = doc.validation_claims(), committed(doc)
    mine = table[table["source"] == fresh["source"].iloc[0]].reset_index(drop=True)
    assert len(mine) == len(fresh), f"docs/claims.csv is stale against validation.json: {REGENERATE}"
    pd.testing.assert_frame_equal(mine[["name", "verdict"]], fresh[["name", "verdict"]])
    for column in ("estimate", "low", "high", "p_holm"):
        assert mine[column].to_numpy(float) == pytest.approx(fresh[column].to_numpy(float), abs=1e-9, nan_ok=True), column


# ---------------------------------------------------------------------------------------------- the checker itself
GROUPS = [f"g{i}" for i in range(8)]


@pytest.fixture(scope="module")
def table(doc) -> pd.DataFrame:
    """A holding claim (+1.00 [+0.77, +1.24] at two decimals) and one not detected."""
    claims = [effect_claim("f", "holds", "s", [0.77, 0.8, 0.9, 1.0, 1.0, 1.1, 1.15, 1.24], GROUPS),
              effect_claim("f", "weak", "s", [-0.3, 0.2, -0.1, 0.25, 0.0, 0.1, -0.2, 0.15], GROUPS)]
    return claims_table(claims).assign(source="test")


def shown(row: pd.Series, digits: int = 2) -> str:
    return f"{row['estimate']:+.{digits}f} [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}]".replace("-", "−")


def test_a_stated_claim_matches_at_the_precision_shown(doc, table) -> None:
    row = table.iloc[0]
    for digits in (1, 2, 3):
        text = f"The trap holds ({shown(row, digits)}); the rest."
        assert not doc.unmatched(doc.stated_estimates(text, "t"), table), digits
    off = f"The trap holds ({row['estimate'] + 0.01:+.2f} [{row['low']:+.2f}, {row['high']:+.2f}])."
    assert doc.unmatched(doc.stated_estimates(off, "t"), table)  # one hundredth off is not the claim


def test_a_planted_readme_number_is_caught(doc, table) -> None:
    row = table.iloc[0]
    readme = (ROOT / "README.md").read_text(encoding="utf-8") + f"\nThe trap holds: {shown(row)}.\n"
    assert len(doc.matches(doc.stated_estimates(readme, "README.md")[-1], table)) == 1  # the claim it states
    planted = readme + "The planted effect holds: +9.87 [+9.01, +9.99] logits.\n"
    found = doc.unmatched(doc.stated_estimates(planted, "README.md"), table)
    assert [str(s) for s in found if s.estimate == "+9.87"] == [f"README.md:{planted.count(chr(10))}: +9.87 [+9.01, +9.99]"]
    for form in ("−0.24 logits [−0.38, −0.09]", "24.6% [17.5, 32.5]", "-0.014 [-0.024, -0.004]", "0.80 [0.73, 0.86]"):
        assert len(doc.stated_estimates(f"x {form} y", "t")) == 1, form
    assert not doc.stated_estimates("46 s wall, 1,140 tests, p = 0.09, ±0.25, [0.2]", "t")  # no CI: not an estimate


def test_a_claim_that_does_not_hold_worded_as_holding_is_caught(doc, table) -> None:
    weak = table.iloc[1]
    assert weak["verdict"].startswith("not detected")
    worded_as_holding = f"B beats the control ({shown(weak)})."
    problems = doc.misworded(doc.stated_estimates(worded_as_holding, "t"), table)
    assert len(problems) == 1 and "not detected" in problems[0]
    said = f"**Not detected**: B against the control, {shown(weak)}, p = {weak['p']:.2f}."
    assert not doc.misworded(doc.stated_estimates(said, "t"), table)
    assert not doc.misworded(doc.stated_estimates(f"It holds ({shown(table.iloc[0])}).", "t"), table)
    wrapped = f"B against the control, {shown(weak)}: not\n  detected, p = {weak['p']:.2f}."  # the phrase wraps over a line
    assert not doc.misworded(doc.stated_estimates(wrapped, "t"), table)


def test_descriptive_numbers_are_skipped_and_a_broken_marker_is_an_error(doc, table) -> None:
    from probes.reporting.markdown import descriptive

    text = "Intro.\n\n" + descriptive("| cell | +5.00 [+4.00, +6.00] |") + "\n\nAfter: +7.00 [+6.00, +8.00].\n"
    assert [s.estimate for s in doc.stated_estimates(text, "t")] == ["+7.00"]
    for broken in ("<!-- descriptive --> +5.00 [+4.00, +6.00]", "+5.00 [+4.00, +6.00] <!-- /descriptive -->",
                   "<!-- descriptive --> <!-- descriptive --> <!-- /descriptive -->"):
        with pytest.raises(ValueError, match="descriptive"):
            doc.stated_estimates(broken, "t")


def test_the_collector_refuses_what_is_not_a_claims_table(doc, tmp_path: Path) -> None:
    with pytest.raises(doc.ClaimsSourceError, match="no claims.csv there; run `basm-probes report"):
        doc.report_claims(tmp_path)
    (tmp_path / "claims.csv").write_text("family,name\nf,a\n")
    with pytest.raises(doc.ClaimsSourceError, match="given twice"):
        doc.collect([tmp_path, tmp_path / "claims.csv"])
    with pytest.raises(doc.ClaimsSourceError, match="lacks the columns"):
        doc.report_claims(tmp_path)


def test_the_collector_writes_every_source_and_the_validation(doc, table, tmp_path: Path) -> None:
    table.drop(columns="source").to_csv(tmp_path / "claims.csv", index=False)
    validation = tmp_path / "validation.json"
    validation.write_text(json.dumps({"claims": json.loads(table.drop(columns="source").to_json(orient="records"))}))
    out = doc.collect([tmp_path], validation)
    assert list(out.columns) == doc.TABLE_COLUMNS and len(out) == 2 * len(table)
    assert out["source"].tolist() == [str(tmp_path)] * len(table) + [str(validation)] * len(table)
    target = tmp_path / "docs" / "claims.csv"
    doc.write(out, target)
    assert len(pd.read_csv(target)) == len(out)
