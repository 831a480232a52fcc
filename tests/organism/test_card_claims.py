"""The organism's validation and model card state what they measure under its own name (issue 42, item 9): η's
shift is in log2 η, not logits; the neutral pool's own shift is a tested claim of the validation; the card's
held-out table names its margin (the path margin with abstention, not Eq. 1) and takes the knockout control's
numbers from the validation, never from the plain-HF check's outdated control; every estimate the card states
outside its descriptive tables is a claim of the validation."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probes.analyses import knockout as knockout_mod
from probes.analyses import ratios as ratios_mod
from probes.organism import ORGANISM_DIR, card, validate
from runs import load_script
from probes.reporting.markdown import DESCRIPTIVE_CLOSE, DESCRIPTIVE_OPEN
from probes.scoring.claims import claims_table, holds

ROOT = Path(__file__).resolve().parents[2]
GROUPS = [f"g{i}" for i in range(10)]


def test_the_eta_claim_is_in_log2_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    shifts = pd.DataFrame({"difference": np.linspace(0.2, 0.6, len(GROUPS)), "n_target": 2, "n_reference": 2},
                          index=pd.Index(GROUPS, name="task_group"))
    monkeypatch.setattr(ratios_mod, "eta_records", lambda rows: rows)
    monkeypatch.setattr(ratios_mod, "paired_differences", lambda records, target: shifts)
    claim = validate.eta_claim(pd.DataFrame({"config": ["basm"], "bucket": ["T_wrong"], "abstain": [False], "later_row": [False]}), 0)
    assert claim.unit == ratios_mod.UNIT == "log2 η"
    assert claim.estimate == pytest.approx(shifts["difference"].mean())


def knockout_deltas(control: np.ndarray) -> pd.DataFrame:
    """Per-record Δm of basm T_wrong records, one record per task group: boundary +0.7, the neutral pool ``control``."""
    frames = [pd.DataFrame({"record_id": [f"r{i}" for i in range(len(GROUPS))], "config": "basm", "item_id": [f"i{i}" for i in range(len(GROUPS))],
                            "bucket": "T_wrong", "task_group": GROUPS, "knockout": name, "measure": "margin", "delta": values})
              for name, values in (("boundary", np.full(len(GROUPS), 0.7)), ("random", control))]
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("shift, neutral", [(-0.014, True), (-0.37, False)])
def test_the_neutral_control_is_tested_not_assumed(shift: float, neutral: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    control = shift + 0.005 * np.sin(np.arange(len(GROUPS)))
    monkeypatch.setattr(knockout_mod, "deltas_per_record", lambda rows: (knockout_deltas(control), None, None, 0))
    claim = validate.control_claim(pd.DataFrame(), 0)
    assert (claim.name, claim.kind, claim.sesoi, claim.family) == (validate.CONTROL, "absence", knockout_mod.DEFAULT_SESOI, validate.FAMILY)
    assert claim.estimate == pytest.approx(control.mean())
    verdict = claims_table([claim])["verdict"].iloc[0]
    assert holds(verdict) == neutral, verdict  # a control that moves the margin by −0.37 is not called neutral


@pytest.fixture(scope="module")
def committed() -> tuple[dict, dict, dict]:
    read = lambda name: json.loads((ORGANISM_DIR / name).read_text())  # noqa: E731
    return read("training_summary.json"), read("heldout_check.json"), read("validation.json")


def with_control(validation: dict, estimate: float, low: float, high: float) -> dict:
    out = copy.deepcopy(validation)
    out["claims"] = [c for c in out["claims"] if c["name"] != validate.CONTROL]
    out["claims"].append({**out["claims"][0], "name": validate.CONTROL, "kind": "absence", "statement": "the pool is neutral",
                          "estimate": estimate, "low": low, "high": high, "sesoi": 0.25, "verdict": "holds: equivalent to 0 within ±0.25",
                          "holds": True, "note": "63 records"})
    return out


def claims_doc():
    return load_script("claims_doc_card", ROOT / "docs" / "claims.py")


def test_the_card_names_its_margin_and_reads_the_control_from_the_validation(committed, tmp_path: Path) -> None:
    summary, heldout, validation = committed
    validation = with_control(validation, -0.0143, -0.0241, -0.0042)
    card.write_card(tmp_path, summary, heldout, validation)
    text = (tmp_path / "README.md").read_text()
    assert "path margin with abstention (mean [95% CI])" in text and "margin Eq. 1" not in text
    assert "It is not Eq. 1" in text
    # the control is the validation's claim: its numbers and verdict, and no row of the plain-HF check's old control
    assert "neutral pool moves the margin by -0.014 [-0.024, -0.004] over" in text and "holds: equivalent to 0 within ±0.25" in text
    assert "| random |" not in text and "-0.37" not in text
    # every estimate outside the descriptive tables is a claim of the validation the card was written from
    doc = claims_doc()
    table = pd.DataFrame(validation["claims"]).astype({c: float for c in ("estimate", "low", "high")})
    stated = doc.stated_estimates(text, "card")
    assert stated and not doc.unmatched(stated, table) and not doc.misworded(stated, table)
    held = text[text.index(DESCRIPTIVE_OPEN): text.index(DESCRIPTIVE_CLOSE)]
    assert "| boundary |" in held and "path margin with abstention" in held


def test_a_card_from_a_validation_without_the_control_claim_is_refused(committed, tmp_path: Path) -> None:
    summary, heldout, validation = committed
    stale = copy.deepcopy(validation)
    stale["claims"] = [c for c in stale["claims"] if c["name"] != validate.CONTROL]
    with pytest.raises(ValueError, match="no 'knockout control neutral' claim"):
        card.write_card(tmp_path, summary, heldout, stale)
    assert not (tmp_path / "README.md").exists()
