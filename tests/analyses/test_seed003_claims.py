"""attribution's planted check and curate's and mask-eval's findings are claims (issue 42, item 8): the held-out T_wrong margin contrast is
confirmatory (its family's Holm correction is not diluted by the strata), every other bucket, the wrong-choice
rate and mask-eval's "needed skill dropped" check are exploratory and never hold, and each outcome's δ is the
seed's smallest acted-on effect (0.10 pass rate; 2·logit(0.55) logits of margin)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probes.analyses import jobs
from probes.analyses.curate import CONTRAST, Curate, CurationSummary
from probes.analyses.development_attribution import DELTA_COLUMNS, SESOI, held_out_claims
from probes.analyses.mask_eval import NEEDED, MaskEval
from probes.scoring import curation_rules as cur
from probes.scoring.claims import claims_table, holds
from probes.reporting.layout import table_path

GROUPS = [f"g{i}" for i in range(10)]


def deltas(shift: dict[tuple[str, str], float], contrast: str = CONTRAST) -> pd.DataFrame:
    """Per-item paired differences, two items per task group, each (outcome, bucket) moved by ``shift``."""
    rows = []
    for (outcome, bucket), value in shift.items():
        for g, group in enumerate(GROUPS):
            for item in range(2):
                noise = 0.02 * np.sin(3 * g + item)
                rows.append({"item_id": f"{bucket}-{g}-{item}", "task_group": group, "bucket": bucket, "contrast": contrast,
                             "delta": value + noise, "outcome": outcome})
    return pd.DataFrame(rows, columns=DELTA_COLUMNS)


def test_only_the_t_wrong_margin_is_confirmatory_and_each_outcome_has_the_seed_delta() -> None:
    frame = deltas({("margin", "T_wrong"): -1.0, ("margin", "T_ok"): -1.0, ("wrong_choice", "T_wrong"): -0.5})
    table = claims_table(held_out_claims(frame, "curate", {CONTRAST: "the curated library"})).set_index("name")
    confirmatory = table.loc[f"{CONTRAST} margin T_wrong"]
    assert confirmatory["family"] == "curate" and not confirmatory["exploratory"] and confirmatory["family_size"] == 1
    assert confirmatory["verdict"] == "holds" and confirmatory["sesoi"] == pytest.approx(cur.TAU_RETIRE) == pytest.approx(0.401, abs=1e-3)
    assert confirmatory["statement"] == "on held-out T_wrong items the curated library lowers the wrong-tool margin"
    strata = table.drop(index=f"{CONTRAST} margin T_wrong")
    assert set(strata["family"]) == {"curate-strata"} and strata["exploratory"].all()
    # the same effect in a stratum is significant but never holds
    assert all(v.startswith("exploratory: significant") and not holds(v) for v in strata["verdict"]), strata["verdict"].tolist()
    assert table.loc[f"{CONTRAST} wrong_choice T_wrong", ["sesoi", "unit"]].tolist() == [SESOI["wrong_choice"][0], "share"] == [0.10, "share"]


@pytest.mark.parametrize("shift, verdict", [(-0.03, "detectable, below the smallest effect of interest"), (+0.5, "not detected")])
def test_a_held_out_change_below_delta_or_the_wrong_way_does_not_hold(shift: float, verdict: str) -> None:
    # mask-eval on the organism moved T_wrong margins by hundredths of a logit: detectable at most, not a finding
    table = claims_table(held_out_claims(deltas({("margin", "T_wrong"): shift}), "curate", {CONTRAST: "the curated library"}))
    assert table["verdict"].iloc[0].startswith(verdict)


def test_abstention_items_without_a_margin_are_left_out_of_the_claim() -> None:
    frame = deltas({("margin", "T_wrong"): -1.0})
    frame.loc[frame.index[:4], "delta"] = np.nan  # g0 and g1: abstention items, no tool-choice margin
    claim = held_out_claims(frame, "curate", {CONTRAST: "x"})[0]
    assert claim.n == len(GROUPS) - 2 and claim.note == f"{2 * len(GROUPS) - 4} items" and np.isfinite(claim.estimate)


def test_curate_claims_read_the_summary_deltas() -> None:
    summary = CurationSummary(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), deltas({("margin", "T_wrong"): -1.0}), None, {}, "")
    claims = Curate.claims(None, summary)
    assert [(c.family, c.name, c.alternative) for c in claims] == [("curate", f"{CONTRAST} margin T_wrong", "less")]
    empty = CurationSummary(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(columns=DELTA_COLUMNS), None, {}, "")
    assert Curate.claims(None, empty) == []  # no held-out items: no claim, never an empty one


def test_mask_eval_writes_its_claims_with_the_three_controls(tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted harmful skill (+1 on every item's margin where shown) is what the mask drops."""
    def score(session, record, conditions=(), **_):
        margin = 1.0 * ("retail.cancel_order" in [entry.skill_id for entry in record.skills]) - 0.5
        return [{"condition": "baseline", "margin": margin, "call_logodds": -margin, "correct_is_abstain": False}]

    monkeypatch.setattr(jobs, "score_record", score)
    result = MaskEval(model=tiny_qwen3_dir, out=tmp_path, min_skills=1, domains=["retail"], buckets=["T_ok", "T_wrong"], limit=8, k_max=9,
                      masks=40, figure=False, dataset="basm_probe", embedder="lexical", relevance="lexical").run(verbose=False)
    table = result.tables["mask-eval_claims"]
    assert table_path(result.out_dir, "mask-eval", "mask-eval_claims").is_file()
    confirmatory = table[table["family"] == "mask-eval"]
    assert sorted(confirmatory["name"]) == sorted(f"{c} margin T_wrong" for c in ("mask − full", "mask − reverse", "mask − random"))
    assert not confirmatory["exploratory"].any() and (confirmatory["family_size"] == 3).all()
    assert table.loc[table["family"] == "mask-eval-strata", "exploratory"].all()
    # each claim's estimate is the mean over task groups of the items' paired differences
    items = result.summary.items.pivot_table(index=["item_id", "task_group", "bucket"], columns="policy", values="margin").reset_index()
    wrong = items[items["bucket"] == "T_wrong"]
    row = confirmatory.set_index("name").loc["mask − full margin T_wrong"]
    assert row["estimate"] == pytest.approx((wrong["mask"] - wrong["full"]).groupby(wrong["task_group"]).mean().mean(), abs=1e-12)
    assert NEEDED not in set(confirmatory["name"].str.rsplit(" ", n=2).str[0])


@pytest.mark.parametrize("c, verdict", [(1.0, "holds"), (0.14, "detectable, below the smallest effect of interest")])
def test_attribution_states_its_planted_check_as_a_claim_per_pool(c: float, verdict: str) -> None:
    from probes.analyses.attribution import Attribution, AttributionSummary

    rows = [{"pool": pool, "outcome": outcome, "bucket": bucket, "tempting": tempting, "task_group": group, "item_id": f"{group}-{bucket}",
             "c": (c + 0.02 * np.sin(g)) if (tempting and bucket == "T_wrong" and outcome == "margin") else -5.0}
            for pool in ("topk", "library") for outcome in ("margin", "correct_choice") for bucket in ("T_ok", "T_wrong")
            for tempting in (True, False) for g, group in enumerate(GROUPS)]
    summary = AttributionSummary(pd.DataFrame(rows), *([None] * 4), 12, 0.4, "")
    table = claims_table(Attribution.claims(None, summary)).set_index("name")
    assert list(table.index) == ["tempting skill C>0 (topk)", "tempting skill C>0 (library)"]
    assert (table["family"] == "attribution").all() and table["sesoi"].to_numpy() == pytest.approx([cur.TAU_RETIRE] * 2)
    assert table["estimate"].to_numpy() == pytest.approx(c, abs=0.02)  # the other cells (−5) are not the planted check
    assert all(v.startswith(verdict) for v in table["verdict"]), table["verdict"].tolist()
