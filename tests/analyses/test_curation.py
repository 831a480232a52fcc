"""Curation and per-item masking (seed 003 §2.2–2.3): the masking weights and prediction against hand
computations, the masking rule's protection and fallback, the development gate rejecting a planted
split that lowers the development score (a stub scorer whose margin is a known function of the skills a
prompt shows), the curated dataset loading back, and mask-eval resuming without rescoring."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probes.analyses import curate, jobs
from probes.analyses.curate import Curate
from probes.analyses.mask_eval import MaskEval
from probes.core.chat import Reply
from probes.data.dataset import load_dataset
from probes.scoring import curation_rules as cur

FAST = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical"}
SPLIT, HARMFUL = "retail.lookup_order", "retail.cancel_order"


# ---------------------------------------------------------------------------- estimators
def test_thresholds_are_the_seeds_rates_in_logits() -> None:
    assert cur.TAU_SPLIT == pytest.approx(2 * math.log(0.7 / 0.3), abs=1e-12)
    assert cur.TAU_RETIRE == pytest.approx(2 * math.log(0.55 / 0.45), abs=1e-12)
    with pytest.raises(ValueError, match="rate difference"):
        cur.rate_difference_in_logits(1.0)


def test_neighbour_weights_and_prediction_by_hand() -> None:
    """Three development items in 2-D, k = 2, τ = 0.5; skill 1 unseen by the nearest item."""
    dev = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    test = np.array([0.8, 0.6])
    w = cur.neighbour_weights(dev, test, k=2, temperature=0.5)
    # cosines 0.8, 0.96, 0.6: the nearest two are items 1 and 0; softmax(0.96/0.5, 0.8/0.5)
    e1, e0 = math.exp(0.96 / 0.5), math.exp(0.8 / 0.5)
    np.testing.assert_allclose(w, [e0 / (e0 + e1), e1 / (e0 + e1), 0.0], atol=1e-15)
    benefit = np.array([[1.0, -2.0, 7.0], [3.0, np.nan, 7.0], [np.nan, np.nan, 5.0]])
    c_hat, mass = cur.predicted_effects(benefit, w)
    assert c_hat[0] == pytest.approx(w[0] * 1.0 + w[1] * -2.0, abs=1e-12)
    assert c_hat[1] == pytest.approx(3.0, abs=1e-12) and mass[1] == pytest.approx(w[0], abs=1e-15)  # renormalised over item 0
    assert np.isnan(c_hat[2]) and mass[2] == 0.0  # only a non-neighbour saw it: no evidence


def test_mask_never_drops_a_protected_skill_and_falls_back() -> None:
    skills = ["tpl-pagination", "a", "b", "c", "d"]
    c_hat = np.array([-9.0, -1.0, -0.5, np.nan, 2.0])
    mask = cur.risk_minimising_mask(skills, c_hat, 0.4, cur.PROTECTED_PREFIXES, min_skills=2)
    assert mask.dropped == ("a", "b") and mask.kept == ("tpl-pagination", "c", "d") and not mask.fallback
    assert cur.risk_minimising_mask(skills, c_hat, 0.6, cur.PROTECTED_PREFIXES, 2).dropped == ("a",)
    fallback = cur.risk_minimising_mask(skills, c_hat, 0.4, cur.PROTECTED_PREFIXES, min_skills=4)
    assert fallback.kept == tuple(skills) and fallback.dropped == () and fallback.fallback
    assert cur.reverse_drop(skills, c_hat, 2, cur.PROTECTED_PREFIXES).dropped == ("d", "b")  # highest Ĉ; NaN never chosen
    drawn = cur.random_drop(skills, 3, cur.PROTECTED_PREFIXES, np.random.default_rng(0)).dropped
    assert len(drawn) == 3 and "tpl-pagination" not in drawn


def test_regimes_and_gate() -> None:
    c_bar = pd.Series([0.0, 1.0, 0.1, -1.0, np.nan])
    h = pd.Series([3.0, 0.5, 0.5, 0.5, np.nan])
    assert cur.regimes(c_bar, h, 1.7, 0.4).tolist() == ["heterogeneous", "beneficial", "negligible", "harmful", "unmeasured"]
    before = pd.Series([-1.0, 0.5, -2.0])
    assert cur.gate(before, before).accepted
    lower_mean_but_flipped = cur.gate(before, pd.Series([0.1, -3.0, -2.0]))  # mean −1.63 < −0.83, but item 0 now wrong: 2 → 2
    assert lower_mean_but_flipped.accepted and lower_mean_but_flipped.correct_after == 2
    worse = cur.gate(before, pd.Series([0.1, 0.5, -4.0]))
    assert not worse.accepted and "correct choices 2 → 1" in worse.reason


def test_merge_clusters_are_connected_components() -> None:
    vectors = np.array([[1.0, 0.0], [0.999, 0.0447], [0.0, 1.0], [0.0447, 0.999]])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    assert cur.merge_clusters(["a", "b", "c", "d"], vectors, 0.99) == [["a", "b"], ["c", "d"]]
    assert cur.merge_clusters(["a", "b", "c", "d"], vectors, 0.9999) == []


# ---------------------------------------------------------------------------- through the analyses
def planted_scorer(calls: list[str], variant_effect: float):
    """Margin = Σ of planted effects of the shown skills: SPLIT +2 on T_ok, −2 on T_wrong and T_repair
    (heterogeneous); HARMFUL +1 everywhere; each split variant ``variant_effect``."""
    def score(session, record, conditions=(), **_):
        calls.append(record.record_id)
        shown = [entry.skill_id for entry in record.skills]
        margin = ((2.0 if record.bucket == "T_ok" else -2.0) * (SPLIT in shown) + 1.0 * (HARMFUL in shown)
                  + variant_effect * sum(s.endswith((".scoped", ".guarded")) for s in shown))
        return [{"condition": "baseline", "margin": margin, "call_logodds": -margin, "correct_is_abstain": False}]
    return score


OPTIONS = dict(domains=["retail"], buckets=["T_ok", "T_wrong"], limit=8, k_max=9, masks=40, figure=False, **FAST)


@pytest.mark.parametrize("variant_effect", [5.0, -5.0])
def test_gate_rejects_a_split_that_lowers_the_development_score(variant_effect: float, tiny_qwen3_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "score_record", planted_scorer([], variant_effect))
    # a rewriting chat model whose reply ψ refuses: the deterministic variants are used, and the choice recorded
    refusing = type("Refusing", (), {"label": "stub-chat", "__call__": lambda self, messages: Reply("no JSON here")})()
    monkeypatch.setattr(curate, "chat_generator", lambda model, device: refusing)
    result = Curate(model=tiny_qwen3_dir, out=tmp_path, rewriter="stub-chat", **OPTIONS).run(verbose=False)
    fallback = result.summary.decisions.query("step == 'split' and action == 'deterministic variants instead'")
    assert fallback["skill"].tolist() == [SPLIT] and fallback["reason"].iloc[0].startswith("stub-chat's variants: not JSON")
    skills = result.summary.skills.set_index("skill")
    assert skills.loc[SPLIT, "regime"] == "heterogeneous" and skills.loc[HARMFUL, "regime"] == "harmful"
    split = result.summary.decisions.query("step == 'split' and skill == @SPLIT and action != 'deterministic variants instead'").iloc[0]
    # the gate compares the development items (those the masks were scored on), and only them
    assert split["n_items"] == result.rows.loc[result.rows["condition"].str.startswith("library:m"), "item_id"].nunique() > 0
    dataset = load_dataset(result.summary.library_dir)
    ids = set(dataset.skills)
    if variant_effect > 0:  # the variants raise every development margin they are shown in: worse, rejected
        assert not split["accepted"] and split["margin_after"] > split["margin_before"] and "worse" in split["reason"]
        assert SPLIT in ids and not any(s.startswith(SPLIT + ".") for s in ids)
    else:
        assert split["accepted"] and split["margin_after"] <= split["margin_before"]
        assert SPLIT not in ids and f"{SPLIT}.scoped" in ids
        assert all(item.tempting_skill != SPLIT for item in dataset.items)
        scoped = dataset.skills[f"{SPLIT}.scoped"]
        assert scoped.applicability[-1].startswith("The request mentions ")
    assert HARMFUL in ids  # harmful (not negligible): the seed retires only |C̄| < τ_retire
    readme = (result.summary.library_dir / "README.md").read_text()
    assert "development gate" in readme and len(pd.read_csv(result.summary.library_dir / "decisions.csv")) == len(result.summary.decisions)


def test_mask_eval_drops_the_harmful_skill_on_held_out_items_and_resumes(tiny_qwen3_dir: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(jobs, "score_record", planted_scorer(calls, 0.0))
    options = dict(model=tiny_qwen3_dir, out=tmp_path, min_skills=1, **OPTIONS)
    result = MaskEval(**options).run(verbose=False)
    items = result.summary.items
    mask = items[items["policy"] == "mask"]
    assert len(mask) > 0 and all(HARMFUL in dropped for dropped in mask["dropped"])  # +1 on every development item
    sizes = items.pivot_table(index="item_id", columns="policy", values="n_dropped")
    assert (sizes["reverse"] <= sizes["mask"]).all() and (sizes["random"] == sizes["mask"]).all() and (sizes["full"] == 0).all()
    # a policy's mean: the mean over task groups of the items' margins, by hand
    cell = result.summary.policies.query("outcome == 'margin' and bucket == 'T_wrong' and policy == 'mask'").iloc[0]
    wrong = mask[mask["bucket"] == "T_wrong"]
    assert cell["value"] == pytest.approx(wrong.groupby("task_group")["margin"].mean().mean(), abs=1e-12)
    # resume: nothing scored again; a run killed mid-way rescored only its lost rows, never a finished mask
    calls.clear()
    MaskEval(**options).run(verbose=False)
    assert calls == []
    path = tmp_path / tiny_qwen3_dir.name / "mask-eval.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:100]))  # killed during the masks: 99 rows kept, the other masks and every policy row lost
    again = MaskEval(**options).run(verbose=False)
    lost = [json.loads(line)["key"] for line in lines[100:]]
    assert any("|library:m" in key for key in lost) and any("|shown:" in key for key in lost)
    assert 0 < len(calls) <= len(lost) and set(calls) <= {key.rsplit("|", 1)[0] for key in lost}  # no finished row scored again
    assert path.read_text().splitlines(keepends=True)[:100] == lines[:100]
    pd.testing.assert_frame_equal(again.summary.policies, result.summary.policies)
    # protecting the harmful skill's prefix keeps it; a min_skills above the library falls back everywhere
    protected = MaskEval(**options, protected=["retail.cancel"]).run(verbose=False).summary.items
    assert not any(HARMFUL in dropped for dropped in protected["dropped"])
    fallback = MaskEval(**{**options, "min_skills": 50}).run(verbose=False).summary.items
    assert fallback.query("policy == 'mask'")["fallback"].all() and (fallback["n_dropped"] == 0).all()


def test_chat_variants_are_kept_only_when_psi_accepts_both() -> None:
    """A stub chat model: a valid pair is kept as written; an invented tool, a wrong id or a non-JSON
    reply is refused with its reason (curate then uses the deterministic variants, recorded)."""
    dataset = load_dataset("basm_probe")
    skill = dataset.skills[SPLIT]
    catalog = dataset.domains["retail"].catalog
    helped = [i for i in dataset.items if i.tempting_skill == SPLIT and i.bucket == "T_ok"][:2]
    hurt = [i for i in dataset.items if i.tempting_skill == SPLIT and i.bucket == "T_wrong"][:2]
    scoped = {**skill.to_json(), "id": f"{SPLIT}.scoped", "applicability": [*skill.applicability, "The customer already placed the order."]}
    guarded = {**skill.to_json(), "id": f"{SPLIT}.guarded", "risk_cues": [*skill.risk_cues, "The customer asks about stock."]}
    asked: list = []

    def stub(text: str):
        return lambda messages: asked.append(messages) or Reply(text)

    kept = cur.chat_variants(stub("```json\n" + json.dumps({"scoped": scoped, "guarded": guarded}) + "\n```"), skill, helped, hurt, catalog)
    assert [v.id for v in kept] == [f"{SPLIT}.scoped", f"{SPLIT}.guarded"] and kept[0].applicability[-1] == scoped["applicability"][-1]
    assert helped[0].user in asked[0][1]["content"] and hurt[0].user in asked[0][1]["content"]
    invented = {**guarded, "tools": ["get_order_details", "teleport_parcel"]}
    assert "does not exist in the tool catalog" in cur.chat_variants(stub(json.dumps({"scoped": scoped, "guarded": invented})),
                                                                     skill, helped, hurt, catalog)
    renamed = {**scoped, "id": "retail.other"}
    assert "id must be" in cur.chat_variants(stub(json.dumps({"scoped": renamed, "guarded": guarded})), skill, helped, hurt, catalog)
    assert cur.chat_variants(stub("Sure! Here are the variants."), skill, helped, hurt, catalog).startswith("not JSON")
