"""Repair is judged against both baselines (issue 42, item 7): "h_t works" needs h_t to beat the
equal-length control note and the no-hint prompt, the control note is tested for being inert (TOST),
and the summary words which comparisons hold."""

from __future__ import annotations

import numpy as np
import pandas as pd

from probes.analyses.knockout import DEFAULT_SESOI
from probes.analyses.repair import INERT_CLAIM, NAME, SESOI, repair_claims, repair_statements
from probes.scoring.claims import claims_table


def _rows(no_hint: float, control: float, hint: float, *, success: dict[str, float], groups: int = 8) -> pd.DataFrame:
    """Two items per task group; each condition's margin is its planted value plus a small per-item
    jitter, so every difference varies a little across groups."""
    rng = np.random.default_rng(0)
    rows = []
    for g in range(groups):
        for i in range(2):
            for condition, margin in (("no_hint", no_hint), ("control", control), ("hint", hint), ("retrieval", no_hint)):
                rows.append({"item_id": f"g{g}-{i}", "task_group": f"g{g}", "condition": condition, "measured": True,
                             "margin": margin + rng.normal(0, 0.02), "repair_success": success[condition if condition != "retrieval" else "no_hint"]
                             if (g + i) % 2 == 0 else 0.0})
    return pd.DataFrame(rows)


def test_a_control_note_that_pushes_away_is_named_and_h_t_does_not_work() -> None:
    """The quick run's pattern: the control note moves the margin +0.75 toward the failed tool, h_t sits
    +0.16 above no hint. h_t beats the control (−0.59) but not the no-hint prompt: 'h_t works' does not
    hold, and the summary says the control note itself moves the margin."""
    rows = _rows(1.0, 1.75, 1.16, success={"no_hint": 1.0, "control": 0.0, "hint": 1.0})
    table = claims_table(repair_claims(rows, seed=0)).set_index("name")
    assert set(table["family"]) == {NAME}
    assert table.loc["hint_margin_vs_control", "verdict"] == "holds"
    assert table.loc["hint_margin_vs_control", "estimate"] < -0.5
    assert table.loc["hint_margin_vs_no_hint", "verdict"].startswith("not detected")
    assert table.loc[INERT_CLAIM, "kind"] == "absence" and table.loc[INERT_CLAIM, "verdict"].startswith("not shown")
    assert table.loc[INERT_CLAIM, "estimate"] > 0.7
    (margin, success) = repair_statements(table.reset_index())
    assert "h_t works" not in margin.replace("'h_t works' does not hold", "")
    assert margin.startswith("margin: h_t beats the equal-length control note but is not shown to beat the no-hint prompt")
    assert "the control note itself moves the margin toward the failed tool: control − no hint +0.7" in margin
    assert success.startswith("repair success: h_t beats the equal-length control note but is not shown to beat the no-hint prompt")


def test_h_t_works_only_when_it_beats_both_and_an_inert_control_is_said_to_be() -> None:
    rows = _rows(1.0, 1.0, 0.0, success={"no_hint": 0.0, "control": 0.0, "hint": 1.0})
    table = claims_table(repair_claims(rows, seed=0)).set_index("name")
    assert table.loc[["hint_margin_vs_control", "hint_margin_vs_no_hint", INERT_CLAIM], "verdict"].tolist() == [
        "holds", "holds", f"holds: equivalent to 0 within ±{SESOI:g}"]
    margin, _ = repair_statements(table.reset_index())
    assert margin.startswith("margin: h_t works: it beats both the control note and the no-hint prompt; the control note is inert")
    # δ is knockout's, stated for the same margin; an effect below it is not "works"
    assert SESOI == DEFAULT_SESOI and (table.loc[table["unit"] == "logits", "sesoi"] == SESOI).all()
    small = claims_table(repair_claims(_rows(1.0, 1.0, 0.9, success={"no_hint": 0.0, "control": 0.0, "hint": 1.0}), seed=0))
    small_margin, _ = repair_statements(small)
    assert small_margin.startswith("margin: h_t is not shown to beat the equal-length control note")
    assert "detectable, below the smallest effect of interest" in small_margin and "'h_t works' does not hold" in small_margin
