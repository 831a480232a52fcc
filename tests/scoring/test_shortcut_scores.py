"""``shortcut_scores`` gives every no-model rule's per-item scores (the paired side of ``linear``'s
probe − shortcut claim), and each reproduces the AUC row ``shortcut_table`` writes for that rule on
the same items: one definition of a rule, read two ways."""

from __future__ import annotations

import numpy as np
import pytest

from probes.scoring.shortcuts import COMPARED, PAIR, SHORTCUT_RULES, shortcut_scores, shortcut_table
from probes.scoring.stats import auc


def test_every_rule_scores_reproduce_the_table_auc(v1_dataset):
    table = shortcut_table(v1_dataset, splits=("eval",), resamples=20)
    rows = table[table["shortcut"].isin(SHORTCUT_RULES) & (table["compared"] == COMPARED) & table["statistic"].isin(["auc", "auc_fit_on_train"])]
    pair = [item for item in v1_dataset.select(split="eval") if item.bucket in PAIR]
    scores = shortcut_scores(v1_dataset, pair, split="eval")
    y_wrong = np.array([item.bucket == "T_wrong" for item in pair], dtype=int)
    names = {f"{r.shortcut} (fit on train)" if r.statistic == "auc_fit_on_train" else r.shortcut: r.value for r in rows.itertuples()}
    assert set(names) == set(scores) and any(name.endswith("(fit on train)") for name in names)
    for name, value in names.items():
        assert len(scores[name]) == len(pair)
        assert auc(y_wrong, scores[name]) == pytest.approx(value, abs=1e-12), name


def test_no_fit_on_train_scores_outside_the_eval_split(v1_dataset):
    pair = [item for item in v1_dataset.select(split=None) if item.bucket in PAIR][:40]
    assert not any(name.endswith("(fit on train)") for name in shortcut_scores(v1_dataset, pair, split=None))
