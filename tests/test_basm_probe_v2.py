"""basm_probe_v2: its self-check passes (lexical disjointness, Qwen3 token length match, negation and
contrast balance, counterbalancing, skill lengths, splits, committed files = generator output), the
issue's shortcut targets hold, and the scenario-held-out split is selectable."""

from __future__ import annotations

from collections import Counter

import hashlib
import importlib.util
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from probes.scoring.shortcuts import shortcut_table

V2_DIR = Path(__file__).resolve().parent.parent / "datasets" / "basm_probe_v2"


@pytest.fixture(scope="module")
def v2(v2_dataset):
    assert v2_dataset.root.resolve() == V2_DIR.resolve()
    return v2_dataset


def test_check_script_finds_no_problem():
    spec = importlib.util.spec_from_file_location("basm_probe_v2_check", V2_DIR / "check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.problems(V2_DIR) == []


def test_shortcut_targets_hold(v2):
    """Issue #18 bar: overlap rule at chance (≤ 55% on eval), request length AUC ≤ 0.6 (either
    direction) between T_ok and T_wrong, on both the template and the scenario split."""
    for kind in ("template", "scenario"):
        table = shortcut_table(v2, splits=("eval",), split_kind=kind, resamples=20).set_index(["shortcut", "statistic"])
        for rule in ("overlap_rule", "overlap_rule_retrieval_words"):
            assert table.loc[(rule, "accuracy"), "value"] <= 0.55, (kind, rule)
        length_auc = table.loc[("request_length_words", "auc"), "value"]
        assert 0.4 <= length_auc <= 0.6, kind
        assert table.loc[("repair_code_copy", "rate"), "value"] == 0.0


def test_the_shortcuts_v2_keeps_are_what_its_readme_says(v2):
    """README "Known limitations" (measured, not tuned): a hidden tool marks no bucket (the T_ok item
    drawn with an abstain item's fillers hides a decoy of neither pair tool), and request words
    crossed with the tempting skill, fit on the train templates, carry to the eval templates but
    not to unseen scenarios."""
    for item in v2.items:
        if item.bucket == "T_ok" and item.unavailable_tools:
            assert item.correct_action not in item.unavailable_tools and not set(item.wrong_tools) & set(item.unavailable_tools)
    for split in ("train", "eval"):
        hidden = Counter((item.bucket, bool(item.unavailable_tools)) for item in v2.select(split=split))
        assert hidden["T_ok", True] == hidden["T_wrong", True] > 0, split
    template = shortcut_table(v2, splits=("eval",), resamples=20).set_index(["shortcut", "statistic"])["value"]
    scenario = shortcut_table(v2, splits=("eval",), split_kind="scenario", resamples=20).set_index(["shortcut", "statistic"])["value"]
    assert template["catalog_hides_tool", "accuracy"] == scenario["catalog_hides_tool", "accuracy"] == 0.5
    assert template["bag_of_words", "auc_fit_on_train"] == pytest.approx(0.5, abs=0.03)
    assert template["bag_of_words_by_skill", "auc_fit_on_train"] == pytest.approx(0.69, abs=0.01)
    assert template["bag_of_words_by_skill", "auc"] == pytest.approx(0.5, abs=0.03)      # one template per pair in eval
    assert scenario["bag_of_words_by_skill", "auc_fit_on_train"] == pytest.approx(0.5, abs=0.03)
    assert scenario["bag_of_words_by_skill", "auc"] == pytest.approx(0.76, abs=0.01)     # three templates per eval pair


def test_scenario_split_selects_whole_pairs(v2):
    held_out = v2.select(split="eval", split_kind="scenario")
    assert held_out and all(item.split_scenario == "eval" for item in held_out)
    pairs = {item.task_group.split(".")[1] for item in held_out}
    trained = {item.task_group.split(".")[1] for item in v2.select(split="train", split_kind="scenario")}
    assert pairs and not pairs & trained
    # the template split is unchanged by the new option
    assert v2.select(split="eval") == v2.select(split="eval", split_kind="template") == tuple(i for i in v2.items if i.split == "eval")


def test_scenario_split_needs_the_field_and_a_known_kind(v1_dataset):
    v1 = v1_dataset
    with pytest.raises(ValueError, match="split_scenario"):
        v1.select(split="eval", split_kind="scenario")
    with pytest.raises(ValueError, match="split_kind"):
        v1.select(split_kind="domain")


def test_v1_digest_is_unchanged_by_the_optional_field(v1_dataset):
    """Results fingerprints of v1 must not move: its digest equals the pre-v2 formula (asdict
    without split_scenario), recomputed here."""
    v1 = v1_dataset
    items = v1.items[:30]
    fields = [{k: v for k, v in asdict(item).items() if k != "split_scenario"} for item in items]
    h = hashlib.sha256(json.dumps(fields, sort_keys=True, default=list).encode())
    for name in sorted({name for item in items for name in item.catalog_domains}):
        h.update(f"{name}\0{v1.domains[name].digest}\n".encode())
    assert v1.content_digest(items) == h.hexdigest()[:16]
