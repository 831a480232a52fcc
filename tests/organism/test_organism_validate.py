"""The committed organism: the probes recover every planted effect on held-out items, and the default
``--model`` is the organism (that retraining from the script reproduces the committed run is in
test_organism_train.py, so that ``pytest -n 2 --dist loadfile`` runs the two long checks side by side).

Each claim is a mean over eval task groups with a 95% cluster-bootstrap CI and a one-sided
sign-flip permutation test (``probes.organism.validate``), Holm-adjusted over the validation's
claims; a claim holds iff the CI lies above 0 and the adjusted p < 0.05. The statistic is printed
(``pytest -s`` shows it). Claims that do not hold are strict expected failures, as measured.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from probes.organism import ORGANISM_DIR
from probes.analyses.ratios import UNIT as ETA_UNIT
from probes.organism.validate import ALPHA, CONTROL, validate
from probes.scoring.claims import holds
from probes.reporting.layout import figures_folder, rows_path

pytestmark = pytest.mark.skipif(not (ORGANISM_DIR / "model.safetensors").is_file(), reason="organism weights not present")

CLAIMS = ("trap", "suppression", "knockout>0", "knockout>random", "knockout>count-matched", "knockout>mass-matched",
          "knockout equal-mass", "knockout>procedure", CONTROL, "eta", "heads", "circuit planted heads", "steer flips")
# Claims the probes do not recover, as measured (strict: a claim that starts to hold fails here until this is updated).
NOT_RECOVERED = {"circuit planted heads": "both planted verdict heads' edges from B are in the 10-edge BASM circuit chosen on train "
                                          "(p = 0.0099, hypergeometric), but that is the smallest p a 10-edge circuit among 96 edges "
                                          "allows, and ×11 (the Holm family) it cannot reach α: untestable in this family (issue #43)",
                 "steer flips": "the applicability direction added after the last layer at α = 0.5 flips no more held-out Proc. Skill "
                                "T_wrong choices than random directions: −0.007 [−0.021, 0.000] share, p = 1 (issue #44)",
                 "heads": "floor chosen on the train split (issue #32): the top-2 heads beat matched random heads by "
                          "+0.107 [-0.034, +0.247], p = 0.092",
                 "knockout>mass-matched": "not testable on the organism: its neutral pool holds 8% of B's deciding-row attention "
                                          "at the median, so no control draw matches B's mass (0 of 63 records)",
                 "knockout>count-matched": "below the smallest effect of interest δ = 0.25: +0.163 [+0.078, +0.246] (issue #42)",
                 "knockout equal-mass": "at the pool's mass (8% of B's) B's positions move the margin +0.018 [+0.004, +0.031] more "
                                        "than the pool's: detectable, below δ = 0.25 (issue #42)"}
@pytest.fixture(scope="module")
def summary() -> dict:
    return json.loads((ORGANISM_DIR / "training_summary.json").read_text())


@pytest.fixture(scope="module")
def validation(tmp_path_factory, summary):
    torch.set_num_threads(1)
    return validate(ORGANISM_DIR, tmp_path_factory.mktemp("validate"), embedder=summary["train_config"]["embedder"])


@pytest.mark.slow  # the whole eval split through five analyses (~90 s on one core)
@pytest.mark.parametrize("name", [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=NOT_RECOVERED[c])) if c in NOT_RECOVERED
                                  else c for c in CLAIMS])
def test_planted_effect_is_recovered_on_heldout_items(validation, name):
    claim = validation.table.set_index("name").loc[name]
    print(f"\n{name}: {claim['estimate']:+.3f} [{claim['low']:+.3f}, {claim['high']:+.3f}] (n = {claim['n']}), "
          f"p = {claim['p']:.4g}, Holm p = {claim['p_holm']:.4g}: {claim['verdict']}")
    assert claim["n"] >= 10, "too few task groups for a CI"
    assert (claim["unit"] == ETA_UNIT) == (name == "eta")  # η's shift is in log2 η, never called logits
    if claim["kind"] == "absence":  # the control's own shift: equivalent to 0 within ±sesoi (TOST)
        assert holds(claim["verdict"]) and -claim["sesoi"] < claim["low"] <= claim["high"] < claim["sesoi"]
        return
    assert claim["low"] > 0, f"95% CI [{claim['low']}, {claim['high']}] does not exclude 0"
    assert claim["p_holm"] < ALPHA, f"Holm-adjusted permutation p = {claim['p_holm']}"
    assert claim["verdict"] == "holds"


@pytest.mark.slow
def test_committed_validation_matches_a_fresh_run(validation):
    """validation.json next to the weights is what the probes measure now (same data, same seed): every
    claim's estimate and verdict, so the card and README cannot keep a claim that no longer holds."""
    committed = {c["name"]: c for c in json.loads((ORGANISM_DIR / "validation.json").read_text())["claims"]}
    table = validation.table
    assert set(table["name"]) == set(committed) == set(CLAIMS)
    for claim in table.itertuples():
        expected = committed[claim.name]["estimate"]
        if expected is None:  # strict JSON stores an untestable claim's NaN estimate as null
            assert math.isnan(claim.estimate), claim.name
        else:
            assert claim.estimate == pytest.approx(expected, abs=1e-4), claim.name
        assert claim.verdict == committed[claim.name]["verdict"], claim.name
        assert claim.unit == committed[claim.name]["unit"], claim.name


def test_sweep_without_model_runs_on_the_bundled_organism(tmp_path):
    from probes.cli.main import main
    from probes.reporting.results import load_results

    assert main(["sweep", "--limit", "2", "--k-max", "1", "--configs", "proc,basm", "--out", str(tmp_path)]) == 0
    out = tmp_path / "basm-organism"  # results are laid out by model: OUT/<model label>/
    rows = load_results(rows_path(out, "sweep"))
    assert rows.attrs["meta"]["config"]["model"] == str(ORGANISM_DIR)
    assert set(rows["bucket"]) == {"T_wrong"} and len(rows) == 2 * 2 * 2
    assert (figures_folder(out) / "fig02_retrieval_trap.png").stat().st_size > 10_000
