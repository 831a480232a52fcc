"""Curation rules (probes.scoring.curation_rules) against hand computations: thresholds, neighbour weights
and prediction, the masking rule's protection and fallback, regimes and the gate, merge clusters, and the
chat variants kept only when ψ accepts both."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from probes.core.chat import Reply
from probes.data.dataset import load_dataset
from probes.scoring import curation_rules as cur

SPLIT = "retail.lookup_order"  # the skill the chat variants are written for


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
