"""The repair analysis (probes.analyses.repair): the checker and repair resume, and contrasts and claims
pair conditions by item."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest



def _options(model: Path, out: Path) -> dict:
    return {"model": model, "limit": 1, "dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "out": out}


def test_checker_and_repair_resume(tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import probes.analyses.calls as calls
    import probes.analyses.repair as repair

    first = calls.Calls(**_options(tiny_qwen3_dir, tmp_path), buckets=["T_wrong"], k_max=1, configs=("basm",), checker=True,
                        figure=False).run(verbose=False)
    checked = first.summary.checker.rows
    assert len(checked) == 2 and set(checked["lenient_verdict"].dropna()) <= {"pass", "block", "undecided"}
    hinted = repair.Repair(**_options(tiny_qwen3_dir, tmp_path), k=1, figure=False).run(verbose=False)
    rows = hinted.summary.rows
    assert sorted(rows["condition"]) == sorted(repair.CONDITIONS)
    hint, control = rows.set_index("condition").loc["hint"], rows.set_index("condition").loc["control"]
    if hint["measured"]:
        assert hint["n_prompt_tokens"] == control["n_prompt_tokens"]  # the control note is of equal length

    def refuse(*args, **kwargs):
        raise AssertionError("a finished row was recomputed")

    monkeypatch.setattr(calls, "checker_rows", refuse)
    monkeypatch.setattr(repair, "condition_row", refuse)
    again = calls.Calls(**_options(tiny_qwen3_dir, tmp_path), buckets=["T_wrong"], k_max=1, configs=("basm",), checker=True,
                        figure=False).run(verbose=False)
    pd.testing.assert_frame_equal(again.summary.checker.rows, checked)
    again_repair = repair.Repair(**_options(tiny_qwen3_dir, tmp_path), k=1, figure=False).run(verbose=False)
    pd.testing.assert_frame_equal(again_repair.summary.rows, rows)


def test_repair_contrasts_and_claims_pair_conditions_by_item() -> None:
    """h_t minus each other condition per item, then the mean of task-group means, against a hand computation;
    an unmeasured row never enters a difference."""
    from probes.analyses.repair import Repair, RepairSummary, repair_contrasts

    margins = {  # item -> (task group, {condition: margin})
        "a": ("g1", {"no_hint": 1.0, "retrieval": 0.5, "hint": -1.0, "control": 0.0}),
        "b": ("g1", {"no_hint": 2.0, "retrieval": 1.0, "hint": 0.0, "control": 2.0}),
        "c": ("g2", {"no_hint": 0.0, "retrieval": 0.0, "hint": -3.0, "control": -1.0}),
    }
    rows = pd.DataFrame([{"item_id": item, "task_group": group, "condition": cond, "margin": m, "repair_success": float(m < 0),
                          "measured": True} for item, (group, conds) in margins.items() for cond, m in conds.items()]
                        + [{"item_id": "d", "task_group": "g2", "condition": "hint", "margin": -9.0, "repair_success": 1.0, "measured": False}])
    table = repair_contrasts(rows, seed=0).set_index(["contrast", "measure"])
    # hint − control: g1 mean of (−1, −2) = −1.5, g2: −2; mean of group means −1.75
    assert table.loc[("hint − control", "margin"), "value"] == pytest.approx(-1.75)
    assert table.loc[("hint − no_hint", "margin"), "value"] == pytest.approx(((-2 - 2) / 2 - 3) / 2)
    assert table.loc[("hint − retrieval", "repair_success"), "value"] == pytest.approx(((1 + 0) / 2 + 1) / 2)
    assert (table["n_items"] == 3).all() and (table["n"] == 2).all()
    claims = Repair().claims(RepairSummary(rows, pd.DataFrame(), "", repair_contrasts(rows), 0))
    margin = next(c for c in claims if c.name == "hint_margin_vs_control")
    assert margin.estimate == pytest.approx(-1.75) and margin.alternative == "less"
