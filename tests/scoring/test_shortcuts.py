"""Shortcut baselines: every statistic against an independent hand computation on a tiny
synthetic dataset, plus a pin of the v1 figures (values measured by this module, not tuned)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from probes.data.dataset import V1_DATASET_DIR, Item, load_dataset
from probes.data.schema import Skill
from probes.scoring import shortcuts
from probes.scoring.shortcuts import best_shortcut, content_words, lemma, overlap_rule, shortcut_table

TOOLS = [
    {"name": name, "description": f"Tool {name}.", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": [], "additionalProperties": False}}
    for name in ("ship_parcel", "hold_parcel", "track_parcel")
]


def _skill(sid: str, tool: str, goal: str, procedure: list[str], recovery: list[str]) -> dict:
    return {"id": sid, "goal": goal, "procedure": procedure, "tools": [tool],
            "applicability": ["The parcel is packed and labelled."],
            "risk_cues": ["The recipient is travelling abroad."],
            "avoidance_rules": ["Do not ship while the recipient is away; call hold_parcel."],
            "recovery_notes": recovery}


SKILLS = [
    # tempting skill: goal + procedure = 5 + 4 + 4 = 13 words
    _skill("toy.ship", "ship_parcel", "Send a packed parcel out.", ["Read the parcel number.", "Call ship_parcel with it."], ["If ship_parcel fails with ADDRESS_INVALID, call track_parcel."]),
    # others: 3 + 2 + 2 = 7 and 3 + 2 = 5 words
    _skill("toy.hold", "hold_parcel", "Hold a parcel.", ["Call hold_parcel.", "Confirm it."], []),
    _skill("toy.track", "track_parcel", "Track a parcel.", ["Call track_parcel."], []),
]

# (group, bucket, user): lengths in words are given by the texts; groups g0..g3
REQUESTS = [
    ("g0", "T_ok", "Ship my parcel today."),                                             # 4 words
    ("g0", "T_wrong", "Ship my parcel, the recipient is travelling abroad."),            # 8
    ("g1", "T_ok", "Please ship the packed parcel that is labelled now."),               # 9
    ("g1", "T_wrong", "Ship it but not yet."),                                          # 5
    ("g2", "T_ok", "Send parcel out."),                                                 # 3
    ("g2", "T_wrong", "Send the parcel; the recipient went abroad, I think, not home."),  # 11
    ("g3", "T_ok", "Ship the packed box without delay."),                               # 6
    ("g3", "T_wrong", "Ship the box to my sister."),                                    # 6
]
REPAIRS = [("g0", "ADDRESS_INVALID"), ("g1", "ADDRESS_INVALID"), ("g2", "TIMEOUT"), ("g3", "ADDRESS_INVALID")]


@pytest.fixture(scope="module")
def toy_dataset(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("toy_dataset")
    (root / "domains").mkdir()
    (root / "domains" / "toy.json").write_text(json.dumps({"domain": "toy", "description": "Toy parcels.", "tools": TOOLS, "skills": SKILLS}))
    lines = []
    for i, (group, bucket, user) in enumerate(REQUESTS):
        lines.append({"id": f"toy-{i}", "bucket": bucket, "split": "eval", "domain": "toy", "task_group": group, "catalog_domains": ["toy"],
                      "unavailable_tools": [], "user": user, "history": [], "correct_action": {"kind": "call", "tool": "ship_parcel" if bucket == "T_ok" else "hold_parcel"},
                      "wrong_tools": ["hold_parcel" if bucket == "T_ok" else "ship_parcel"], "tempting_skill": "toy.ship", "state_cues": []})
    for i, (group, code) in enumerate(REPAIRS):
        history = [{"role": "assistant", "tool_call": {"name": "ship_parcel", "arguments": {}}}, {"role": "tool", "name": "ship_parcel", "content": json.dumps({"error": code})}]
        lines.append({"id": f"toy-r{i}", "bucket": "T_repair", "split": "eval", "domain": "toy", "task_group": group, "catalog_domains": ["toy"],
                      "unavailable_tools": [], "user": "Ship my parcel.", "history": history, "correct_action": {"kind": "call", "tool": "track_parcel"},
                      "wrong_tools": ["ship_parcel"], "tempting_skill": "toy.ship", "state_cues": [code]})
    (root / "items.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return load_dataset(root)


@pytest.fixture(scope="module")
def toy_table(toy_dataset):
    return shortcut_table(toy_dataset, splits=("eval",), folds=2, resamples=200)


def _value(table: pd.DataFrame, shortcut: str, statistic: str, compared: str = shortcuts.COMPARED) -> float:
    row = table[(table.shortcut == shortcut) & (table.statistic == statistic) & (table.compared == compared)]
    assert len(row) == 1, (shortcut, statistic, compared)
    return float(row.value.iloc[0])


def test_lemma_and_content_words():
    assert [lemma(w) for w in ("deliveries", "shipped", "arrived", "arrive", "arriving", "boxes", "called", "status", "create_return_request")] == \
        ["delivery", "ship", "arriv", "arriv", "arriv", "box", "call", "status", "create_return_request"]
    assert content_words("The customer's parcel BK-20417 hasn't arrived; call create_return_request.") == \
        {"customer", "parcel", "bk", "arriv", "call", "create_return_request"}


def test_overlap_rule_on_handmade_items():
    skill = Skill(id="s", goal="g", procedure=("p",), tools=(), applicability=("The parcel is packed.",),
                  risk_cues=("The recipient is abroad.",), avoidance_rules=("Do not ship when away.",), recovery_notes=())
    def item(user: str) -> Item:
        return Item("i", "T_ok", "eval", "d", "g", ("d",), (), user, (), "t", None, (), "s", ())
    # shared with risk+avoidance vs applicability, counted by hand:
    assert overlap_rule(item("Ship it, the recipient is abroad."), skill) == "T_wrong"   # {ship, recipient, abroad} vs {}
    assert overlap_rule(item("The packed parcel, ship it."), skill) == "T_ok"            # {ship} vs {pack, parcel}
    assert overlap_rule(item("Parcel for the recipient."), skill) == "T_ok"              # {recipient} vs {parcel}: tie -> T_ok
    assert overlap_rule(item("Hello there."), skill) == "T_ok"                           # {} vs {}


def test_length_auc_matches_sklearn_and_pair_share(toy_dataset, toy_table):
    pair = [item for item in toy_dataset.items if item.bucket in ("T_ok", "T_wrong")]
    y = [item.bucket == "T_wrong" for item in pair]
    lengths = [len(item.user.split()) for item in pair]
    assert lengths == [4, 8, 9, 5, 3, 11, 6, 6]
    assert _value(toy_table, "request_length_words", "auc") == pytest.approx(roc_auc_score(y, lengths), abs=1e-12)
    # pairs: g0 wrong longer (1), g1 shorter (0), g2 longer (1), g3 tie (1/2) -> 2.5/4
    assert _value(toy_table, "request_length_words", "share_groups_wrong_longer") == pytest.approx(0.625, abs=1e-12)


def test_closed_form_auc_bootstrap_equals_the_generic_cluster_bootstrap():
    from probes.scoring.stats import auc, cluster_bootstrap, group_bootstrap_auc

    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 60)
    scores = np.round(rng.normal(size=60) + y, 1)  # rounding makes ties
    groups = [f"g{i % 9}" for i in range(60)]
    for seed in (0, 5):
        ours = group_bootstrap_auc(y, scores, groups, resamples=300, seed=seed)
        reference = cluster_bootstrap(lambda idx: auc(y[idx], scores[idx]), groups, resamples=300, seed=seed)
        assert ours == pytest.approx(reference, abs=1e-12)


def test_overlap_accuracy_risk_sharing_negation(toy_table):
    # overlap rule per item (risk+avoid words {recipient, travell, abroad, ship, whil, away, call, hold_parcel}
    # vs applicability {parcel, pack, labell}): g0 ok {ship}v{parcel} -> ok ✓; g0 wrong {ship,recipient,travell,abroad}v{parcel} -> wrong ✓;
    # g1 ok {ship}v{pack,parcel,labell} -> ok ✓; g1 wrong {ship}v{} -> wrong ✓; g2 ok {}v{parcel} -> ok ✓;
    # g2 wrong {recipient,abroad}v{parcel} -> wrong ✓; g3 ok {ship}v{pack} tie -> ok ✓; g3 wrong {ship}v{} -> wrong ✓
    assert _value(toy_table, "overlap_rule", "accuracy") == pytest.approx(1.0)
    # risk cue words {recipient, travell, abroad}: T_ok none; T_wrong g0, g2 -> 2/4 (group means = item values here)
    assert _value(toy_table, "shares_risk_word", "rate", "T_ok") == pytest.approx(0.0)
    assert _value(toy_table, "shares_risk_word", "rate", "T_wrong") == pytest.approx(0.5)
    # negators: T_ok "without" (g3) -> 1/4; T_wrong "not" (g1, g2) -> 2/4; contrast: T_wrong "but" (g1) -> 1/4
    assert _value(toy_table, "negation", "rate", "T_ok") == pytest.approx(0.25)
    assert _value(toy_table, "negation", "rate", "T_wrong") == pytest.approx(0.5)
    assert _value(toy_table, "contrast", "rate", "T_wrong") == pytest.approx(0.25)
    assert _value(toy_table, "contrast", "rate", "T_ok") == pytest.approx(0.0)


def test_repair_copy_and_skill_length(toy_table):
    assert _value(toy_table, "repair_code_copy", "rate", "T_repair") == pytest.approx(3 / 4)
    assert _value(toy_table, "tempting_skill_length", "ratio", "tempting vs other skills") == pytest.approx(13 / ((7 + 5) / 2), abs=1e-12)


def test_bag_of_words_separates_a_marker_word_and_not_identical_texts(toy_dataset):
    items = [item for item in toy_dataset.items if item.bucket in ("T_ok", "T_wrong")]
    marked = [Item(**{**item.__dict__, "user": ("zebra " if item.bucket == "T_wrong" else "lion ") + "ship it"}) for item in items]
    y, scores = shortcuts.bag_of_words(marked, folds=2)
    assert np.isfinite(scores).all() and roc_auc_score(y, scores) == 1.0
    same = [Item(**{**item.__dict__, "user": "ship it"}) for item in items]
    y, scores = shortcuts.bag_of_words(same, folds=2)
    assert roc_auc_score(y, scores) == 0.5


def test_best_shortcut_mirrors_auc_and_ignores_non_request_rows():
    rows = [("request_length_words", "auc", 0.2, 0.1, 0.3), ("bag_of_words", "auc", 0.7, 0.6, 0.8),
            ("overlap_rule", "accuracy", 0.6, 0.5, 0.7), ("bag_of_words", "accuracy", 0.55, 0.5, 0.6),
            ("repair_code_copy", "accuracy", 1.0, 1.0, 1.0)]
    table = pd.DataFrame([{"shortcut": s, "split": "eval", "compared": shortcuts.COMPARED, "statistic": st, "value": v, "low": lo, "high": hi,
                           "n_items": 40, "n_groups": 8} for s, st, v, lo, hi in rows])
    best = best_shortcut(table)
    assert best["auc"] == {"shortcut": "request_length_words", "value": pytest.approx(0.8), "low": pytest.approx(0.7), "high": pytest.approx(0.9),
                           "n_items": 40, "n_groups": 8}
    assert best["accuracy"]["shortcut"] == "overlap_rule" and best["accuracy"]["value"] == 0.6
    fitted = pd.concat([table, pd.DataFrame([{"shortcut": "bag_of_words_by_skill", "split": "eval", "compared": shortcuts.COMPARED,
                                              "statistic": "auc_fit_on_train", "value": 0.85, "low": 0.8, "high": 0.9,
                                              "n_items": 40, "n_groups": 8}])])
    assert best_shortcut(fitted)["auc"]["shortcut"] == "bag_of_words_by_skill (fit on train)"


@pytest.fixture(scope="module")
def v1_eval_table(v1_dataset):
    """The shortcut table of v1's eval split (50 resamples), shared by the tests that read it."""
    assert v1_dataset.root.resolve() == V1_DATASET_DIR.resolve()
    return shortcut_table(v1_dataset, splits=("eval",), resamples=50)


def test_v1_pin(v1_eval_table):
    """The v1 figures this module measures (reviewer: overlap 68.5%, length AUC 0.77-0.79)."""
    table = v1_eval_table
    assert _value(table, "overlap_rule", "accuracy") == pytest.approx(113 / 168, abs=1e-12)
    assert _value(table, "overlap_rule", "accuracy") == pytest.approx(0.68, abs=0.03)
    assert _value(table, "request_length_words", "auc") == pytest.approx(0.7928, abs=1e-4)
    assert _value(table, "request_length_words", "auc") == pytest.approx(0.77, abs=0.03)
    assert _value(table, "repair_code_copy", "rate", "T_repair") == 1.0
    assert _value(table, "tempting_skill_length", "ratio", "tempting vs other skills") == pytest.approx(1.893, abs=1e-3)


def test_balanced_accuracy_is_sklearns_and_its_twin_row(v1_eval_table):
    """balanced_accuracy == scikit-learn's balanced_accuracy_score on an imbalanced sample, and every
    accuracy row of a table has a balanced_accuracy twin on the same items."""
    from sklearn.metrics import balanced_accuracy_score

    rng = np.random.default_rng(1)
    y = (rng.random(200) < 0.1).astype(int)
    predicted = np.where(rng.random(200) < 0.8, y, 1 - y)
    assert shortcuts.balanced_accuracy((predicted == y).astype(float), y) == pytest.approx(balanced_accuracy_score(y, predicted), abs=1e-12)
    table = v1_eval_table
    accuracy = table[table.statistic == "accuracy"].set_index("shortcut")
    balanced = table[table.statistic == "balanced_accuracy"].set_index("shortcut")
    assert sorted(accuracy.index) == sorted(balanced.index) and (accuracy.n_items == balanced.n_items).all()
    # v1 eval holds 84 T_ok and 84 T_wrong: the two coincide there
    assert np.allclose(accuracy.value, balanced.loc[accuracy.index, "value"], atol=1e-12)


def test_rows_say_when_a_ci_has_no_width_by_construction(toy_dataset, toy_table):
    """A rule with one answer for every item, or a rate whose every unit is the same, gets a note
    saying its CI has no width by construction; a rule that separates items gets none."""
    note = toy_table.set_index(["shortcut", "statistic", "compared"])["note"]
    assert "every item gives 0" in note["shares_risk_word", "rate", "T_ok"]            # no T_ok request shares a risk word
    assert "by construction" not in note["shares_risk_word", "rate", "T_wrong"]        # 2 of 4 do
    assert "chance by construction" not in note["overlap_rule", "accuracy", shortcuts.COMPARED]
    silent = type(toy_dataset)(toy_dataset.root, toy_dataset.domains,
                               tuple(Item(**{**item.__dict__, "user": "Hello there."}) for item in toy_dataset.items))
    table = shortcut_table(silent, splits=("eval",), folds=2, resamples=50).set_index(["shortcut", "statistic", "compared"])
    for statistic in ("accuracy", "balanced_accuracy"):
        row = table.loc["overlap_rule", statistic, shortcuts.COMPARED]
        assert row["value"] == 0.5 and "answers T_ok for all 8 items" in row["note"], statistic
    assert "every task group gives 0.5" in table.loc["request_length_words", "share_groups_wrong_longer", shortcuts.COMPARED]["note"]
    # a rule that is right on exactly half of every task group (not constant): the generic note
    hidden = tuple(Item(**{**item.__dict__, "unavailable_tools": ("track_parcel",) if item.task_group in ("g0", "g1") else ()})
                   for item in toy_dataset.items)
    table = shortcut_table(type(toy_dataset)(toy_dataset.root, toy_dataset.domains, hidden), splits=("eval",), folds=2, resamples=50)
    row = table.set_index(["shortcut", "statistic", "compared"]).loc["catalog_hides_tool", "balanced_accuracy", shortcuts.COMPARED]
    assert row["low"] == row["high"] == 0.5 and "every resample of the task groups gives 0.500" in row["note"]


def test_catalog_rules_by_hand(toy_dataset):
    """The two catalog rules on hand-made catalogs: g0's and g2's T_wrong items hide the correct
    tool (an abstain item), g1's T_wrong hides the tempting tool, g3's T_ok hides track_parcel."""
    hidden = {("g0", "T_wrong"): ("hold_parcel",), ("g2", "T_wrong"): ("hold_parcel",), ("g1", "T_wrong"): ("ship_parcel",), ("g3", "T_ok"): ("track_parcel",)}
    items = tuple(Item(**{**item.__dict__, "unavailable_tools": hidden.get((item.task_group, item.bucket), ())}) for item in toy_dataset.items)
    table = shortcut_table(type(toy_dataset)(toy_dataset.root, toy_dataset.domains, items), splits=("eval",), folds=2, resamples=50)
    # catalog_hides_tool fires on 3 of 4 T_wrong and 1 of 4 T_ok: (3 + 3) / 8 right
    assert _value(table, "catalog_hides_tool", "accuracy") == pytest.approx(6 / 8, abs=1e-12)
    assert _value(table, "catalog_hides_tool", "auc") == pytest.approx((3 / 4 + 3 / 4) / 2, abs=1e-12)
    # tempting_tool_hidden (ship_parcel not shown) fires on g1's T_wrong only: (1 + 4) / 8
    assert _value(table, "tempting_tool_hidden", "accuracy") == pytest.approx(5 / 8, abs=1e-12)
    assert _value(table, "tempting_tool_hidden", "balanced_accuracy") == pytest.approx((1 / 4 + 1) / 2, abs=1e-12)
    pair = [item for item in items if item.bucket in ("T_ok", "T_wrong")]
    y = [item.bucket == "T_wrong" for item in pair]
    assert _value(table, "tempting_tool_hidden", "auc") == pytest.approx(roc_auc_score(y, [item.task_group == "g1" and item.bucket == "T_wrong" for item in pair]), abs=1e-12)


def test_bag_of_words_by_skill_sees_a_word_skill_interaction(toy_dataset):
    """A label that is word XOR tempting skill: single words carry nothing (each occurs equally in
    both buckets), the skill-crossed features separate it out of fold."""
    base = next(item for item in toy_dataset.items if item.bucket == "T_ok")
    items = []
    for g in range(16):
        skill = ("toy.ship", "toy.hold")[g % 2]
        for bucket in ("T_ok", "T_wrong"):
            word = "zebra" if (bucket == "T_wrong") == (skill == "toy.ship") else "lion"
            items.append(Item(**{**base.__dict__, "id": f"x{g}{bucket}", "bucket": bucket, "task_group": f"g{g}", "tempting_skill": skill,
                                 "user": f"{word} parcel {g}"}))
    y, plain = shortcuts.bag_of_words(items, folds=4)
    assert roc_auc_score(y, plain) <= 0.6
    y, crossed = shortcuts.bag_of_words(items, folds=4, by_skill=True)
    assert np.isfinite(crossed).all() and roc_auc_score(y, crossed) == 1.0
    # crossed with another skill per item (the rank-1 retrieved one): the given skill is what counts
    same = {item.id: item.tempting_skill for item in items}
    assert np.array_equal(shortcuts.bag_of_words(items, folds=4, by_skill=True, skills=same)[1], crossed)
    y, blind = shortcuts.bag_of_words(items, folds=4, by_skill=True, skills={item.id: "toy.ship" for item in items})
    assert roc_auc_score(y, blind) <= 0.6  # one skill for every item: back to single words
    assert shortcuts.skill_word_features("toy.ship", "Zebra parcels") == ["parcel", "zebra", "toy.ship|parcel", "toy.ship|zebra", "toy.ship|"]


def test_held_out_bag_of_words_fits_on_train_only(toy_dataset):
    """Fit on one set of task groups, scored on others: a marker word learnt in train separates the
    test items; a test-only marker (unseen in train) carries nothing."""
    items = [item for item in toy_dataset.items if item.bucket in ("T_ok", "T_wrong")]
    def marked(item: Item, yes: str, no: str) -> Item:
        return Item(**{**item.__dict__, "user": (yes if item.bucket == "T_wrong" else no) + " ship it"})
    train = [marked(item, "zebra", "lion") for item in items if item.task_group in ("g0", "g1")]
    test = [marked(item, "zebra", "lion") for item in items if item.task_group in ("g2", "g3")]
    y, scores = shortcuts.held_out_bag_of_words(train, test)
    assert roc_auc_score(y, scores) == 1.0
    y, scores = shortcuts.held_out_bag_of_words(train, [marked(item, "tiger", "puma") for item in items if item.task_group in ("g2", "g3")])
    assert roc_auc_score(y, scores) == 0.5


def test_linear_probe_bar_reads_the_runs_split_kind(v2_dataset):
    """The bar drawn on the linear-probe figure is the best no-model AUC on the run's split and
    split kind (v2's scenario split: words × tempting skill out of fold, 0.76)."""
    from types import SimpleNamespace

    from probes.analyses.linear import best_shortcut_auc

    v2 = v2_dataset
    for kind, name in (("template", "eval"), ("scenario", "scenario:eval")):
        items = v2.select(split="eval", split_kind=kind)
        bar = best_shortcut_auc(SimpleNamespace(dataset=v2, items=items,
                                                options=SimpleNamespace(split="eval", split_kind=kind, fold_groups="task_group", resamples=20, seed=0)))
        assert bar == best_shortcut(shortcut_table(v2, splits=("eval",), split_kind=kind, resamples=20), split=name)["auc"]
        if kind == "scenario":
            assert bar["shortcut"] == "bag_of_words_by_skill" and bar["value"] == pytest.approx(0.76, abs=0.01)
    # a run on a few items is held to a bar read on exactly those items (not the whole split)
    few = [item for bucket in ("T_ok", "T_wrong") for item in v2.select(split="eval", buckets=[bucket])[:: 6]]
    bar = best_shortcut_auc(SimpleNamespace(dataset=v2, items=few, options=SimpleNamespace(split="eval", split_kind="template", fold_groups="task_group", resamples=20, seed=0)))
    assert bar["n_items"] == len(few) < len(v2.select(split="eval"))


def test_scenario_folds_never_split_a_scenario(v2_dataset, v1_dataset, monkeypatch):
    """``fold_groups="scenario"``: no scenario is in both the training and the test part of any fold the
    bag-of-words classifier is fit on (folds recorded at the call), every item is scored once, and the
    rows say which folds they used; a dataset whose items have no ``scenario`` is an error saying so."""
    from probes.data.dataset import fold_groups

    items = [item for item in v2_dataset.select(split="eval", split_kind="scenario") if item.bucket in shortcuts.PAIR]
    seen = []
    real = shortcuts.grouped_folds
    monkeypatch.setattr(shortcuts, "grouped_folds", lambda y, groups, *a: seen.append(list(groups)) or real(y, groups, *a))
    y, scores = shortcuts.bag_of_words(items, folds=5, by_skill=True, fold_groups="scenario")
    (groups,) = seen
    assert groups == [item.scenario for item in items] and np.isfinite(scores).all()
    assert roc_auc_score(y, scores) == pytest.approx(0.5, abs=0.03)  # v2 README: the words × skill cue does not cross scenarios
    folds = real(y, groups, 5, 0)
    assert len(folds) == 5 and sorted(np.concatenate([test for _, test in folds]).tolist()) == list(range(len(items)))
    for train, test in folds:
        assert not {items[i].scenario for i in train} & {items[i].scenario for i in test}
        assert not {items[i].task_group for i in train} & {items[i].task_group for i in test}
    monkeypatch.undo()
    few = [item.id for item in items if item.scenario in sorted({i.scenario for i in items})[:4]]  # a small table is enough for the notes
    table = shortcut_table(v2_dataset, splits=("eval",), split_kind="scenario", fold_groups="scenario", resamples=20, item_ids=few)
    note = table[(table.shortcut == "bag_of_words_by_skill") & (table.statistic == "accuracy")].note.iloc[0]
    assert "scenario-disjoint folds" in note
    with pytest.raises(ValueError, match="scenario-disjoint folds need the item field 'scenario'"):
        shortcut_table(v1_dataset, splits=("eval",), fold_groups="scenario", resamples=20)
    with pytest.raises(ValueError, match="fold groups must be one of"):
        fold_groups(items, "domain")
