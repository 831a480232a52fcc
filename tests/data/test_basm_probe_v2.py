"""basm_probe_v2: its self-check passes (lexical disjointness, Qwen3 token length match, negation and
contrast balance, counterbalancing, skill lengths, splits, committed files = generator output), the
issue's shortcut targets hold, and the scenario-held-out split is selectable."""

from __future__ import annotations

from collections import Counter, defaultdict

import hashlib
import importlib.util
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from probes.data.dataset import ABSTAIN
from probes.scoring.shortcuts import hidden_place_rows, shortcut_table

V2_DIR = Path(__file__).resolve().parents[2] / "datasets" / "basm_probe_v2"


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
    without the optional fields split_scenario, scenario, category, match_id and audit), recomputed here."""
    v1 = v1_dataset
    items = v1.items[:30]
    fields = [{k: v for k, v in asdict(item).items() if k not in ("split_scenario", "scenario", "category", "match_id", "audit")} for item in items]
    h = hashlib.sha256(json.dumps(fields, sort_keys=True, default=list).encode())
    for name in sorted({name for item in items for name in item.catalog_domains}):
        h.update(f"{name}\0{v1.domains[name].digest}\n".encode())
    assert v1.content_digest(items) == h.hexdigest()[:16]


def _places(v2, items):
    """(T_wrong?, place of the gap in canonical catalog order) of the items that hide a tool, by hand."""
    out = []
    for item in items:
        if item.unavailable_tools and item.bucket in ("T_ok", "T_wrong"):
            full = [tool.name for name in item.catalog_domains for tool in v2.domains[name].catalog.tools]
            (hidden,) = item.unavailable_tools
            out.append((item.bucket == "T_wrong", full.index(hidden)))
    return out


def _mann_whitney(pairs) -> tuple[float, float]:
    """AUC of place for T_wrong vs T_ok by counting pairs, and its standard deviation under H0 (same
    distribution, no ties): sqrt((n1 + n0 + 1) / (12 n1 n0))."""
    wrong = [p for w, p in pairs if w]
    ok = [p for w, p in pairs if not w]
    value = sum((a > b) + 0.5 * (a == b) for a in wrong for b in ok) / (len(wrong) * len(ok))
    return value, ((len(wrong) + len(ok) + 1) / (12 * len(wrong) * len(ok))) ** 0.5


SELECTIONS = [("eval", "template"), ("train", "template"), ("eval", "scenario"), ("train", "scenario"), (None, "template")]


def test_gap_places_of_abstain_and_decoy_items_are_one_distribution(v2):
    """Issue #27 item 5: the abstain items' hidden tools and their T_ok twins' decoys sit at places of one
    distribution. The generator makes them one multiset in every split × split_scenario cell; every split
    the card reports keeps the place AUC within 2.576 H0 standard deviations of 0.5 (a two-sided 1%
    tolerance from the sample sizes alone), and the card's row is the pair count recomputed here. The
    construction before the fix (decoys uniform over the non-pair tools) fails the same tolerance."""
    cells = defaultdict(lambda: ([], []))
    for item in v2.items:
        for wrong, place in _places(v2, [item]):
            cells[item.split, item.split_scenario][0 if wrong else 1].append(place)
    assert cells and all(sorted(hidden) == sorted(decoy) and hidden for hidden, decoy in cells.values())
    for split, kind in SELECTIONS:
        pairs = _places(v2, v2.select(split=split, split_kind=kind))
        value, sd = _mann_whitney(pairs)
        assert abs(value - 0.5) <= 2.576 * sd, (split, kind, value)
        chosen = [item for item in v2.select(split=split, split_kind=kind) if item.bucket in ("T_ok", "T_wrong")]
        (row,) = hidden_place_rows(chosen, v2, "x", resamples=20, seed=0)
        assert row["value"] == pytest.approx(value, abs=1e-12) and row["n_items"] == len(pairs) and row["low"] <= 0.5 <= row["high"]
    # the construction before the fix, on the 90 audited candidates: each hides its correct tool, its twin a
    # decoy uniform over its catalog's tools of neither pair tool (exact expectation of the AUC)
    candidates = [item for item in v2.items if item.audit and item.bucket == "T_wrong"]
    hidden, uniform = [], []
    for item in candidates:
        full = [tool.name for name in item.catalog_domains for tool in v2.domains[name].catalog.tools]
        correct = item.unavailable_tools[0] if item.correct_action == ABSTAIN else item.correct_action
        hidden.append(full.index(correct))
        uniform.append([i for i, name in enumerate(full) if name not in (correct, *item.wrong_tools)])
    old = sum(sum((a > b) + 0.5 * (a == b) for b in places) / len(places) for a in hidden for places in uniform) / len(hidden) ** 2
    _, sd = _mann_whitney([(True, p) for p in hidden] + [(False, 0)] * len(hidden))
    assert abs(old - 0.5) > 2.576 * sd, old


def test_abstain_label_audit(v2):
    """Issue #27 item 2, v2: every abstain candidate (every 4th T_wrong item) carries one v2-abstain audit
    entry; the kept ones abstain with their correct tool hidden, the relabelled ones call it with it shown,
    the verdict is the one content_pairs.ABSTAIN_AUDIT gives its direction (named by the tempting tool), and
    the two items the issue names are fixed with a reason."""
    spec = importlib.util.spec_from_file_location("basm_probe_v2_content", V2_DIR / "content_pairs.py")
    content = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(content)
    audited = [item for item in v2.items if any(e["rule"].startswith("v2-abstain") for e in item.audit or ())]
    assert len(audited) == sum(item.bucket == "T_wrong" for item in v2.items) // 4
    actions = Counter()
    for item in audited:
        (entry,) = item.audit
        kept, reason = content.ABSTAIN_AUDIT[item.scenario, item.wrong_tools[0]]
        actions[entry["action"]] += 1
        assert reason in entry["reason"] and entry["action"] == ("kept" if kept else "relabelled")
        shown = v2.catalog_for(item).names
        if kept:
            assert item.correct_action == ABSTAIN and item.unavailable_tools and item.unavailable_tools[0] not in shown
            assert item.wrong_tools[0] in shown  # the tempting tool the rule judged is what remains
        else:
            assert item.correct_action in shown and not item.unavailable_tools
    assert {item.id for item in v2.items if item.correct_action == ABSTAIN} == {i.id for i in audited if i.audit[0]["action"] == "kept"}
    assert actions == Counter(kept=66, relabelled=24)
    wrong = next(item for item in v2.items if item.id == "travel-wrong-0002")
    assert wrong.correct_action == "check_flight_status" and "get_booking_details" in wrong.audit[0]["reason"]
    assert "check_flight_status" in v2.catalog_for(wrong).names
    repair = [item for item in v2.items if item.bucket == "T_repair" and item.scenario == "transfer_vs_schedule"]
    assert len(repair) == 9 and all(item.audit and item.audit[0]["rule"].startswith("v2-repair") for item in repair)
    for item in repair:  # no repair request demands the money before the date the repair schedules it for
        date = item.correct_arguments["date"]
        assert not any(phrase in item.user for phrase in ("this afternoon", "too late", "has to land today", f"not on {date}", f"ahead of {date}"))
    assert "this afternoon" not in next(item for item in v2.items if item.id == "banking-repair-0015").user
