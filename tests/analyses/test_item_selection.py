"""Item selection (probes.analyses.run_context.select_items): every analysis selects its items with the
resolved options through the spread limit; held-out scenarios whole; QUICK's four task groups per bucket."""

from __future__ import annotations

from collections import Counter

import pytest

import probes.analyses.run_context as run_context
from probes.analyses import ANALYSES
from probes.analyses.option_system import OptionError, QUICK
from probes.analyses.run_context import select_items
from probes.cli.main import main
from probes.data.dataset import BUCKETS
from option_helpers import CLASSES, Captured


@pytest.fixture(scope="module")
def dataset(v1_dataset):
    return v1_dataset


def test_the_pipeline_selects_items_with_the_resolved_options(monkeypatch) -> None:
    seen = []

    def select(dataset, options):
        seen.append(options)
        raise Captured

    monkeypatch.setattr(run_context, "select_items", select)
    with pytest.raises(Captured):
        main(["sweep", "--quick", "--items", "T_ok:retail:3", "--k-max", "3"])
    (options,) = seen
    assert (options.buckets, options.domains, options.limit, options.k_max, options.quick) == (("T_ok",), ("retail",), 3, 2, True)


def test_every_analysis_selects_items_through_the_spread_limit(dataset) -> None:
    for name in ANALYSES:
        items = select_items(dataset, CLASSES[name](limit=2).resolved())
        per_bucket = Counter(i.bucket for i in items)
        assert per_bucket, name
        for bucket in per_bucket:
            assert per_bucket[bucket] == 2, (name, bucket)
            assert len({i.task_group for i in items if i.bucket == bucket}) == 2, (name, bucket)


def test_split_kind_selects_whole_held_out_scenarios(dataset, v2_dataset) -> None:
    """``split_kind="scenario"`` reads ``split_scenario``: v2's eval scenarios, none of their pairs in
    train; a dataset without that field is a precise option error."""
    v2 = v2_dataset
    items = select_items(v2, CLASSES["sweep"](dataset="basm_probe_v2", split_kind="scenario", buckets=["T_wrong"]).resolved())
    assert len(items) == sum(i.bucket == "T_wrong" and i.split_scenario == "eval" for i in v2.items) == 126
    eval_pairs = {i.task_group.rsplit(".", 1)[0] for i in items}
    assert not eval_pairs & {i.task_group.rsplit(".", 1)[0] for i in v2.items if i.split_scenario == "train"}
    assert {i.split for i in items} == {"train", "eval"}  # the template split cuts across it
    with pytest.raises(OptionError, match="split_scenario"):
        select_items(dataset, CLASSES["sweep"](split_kind="scenario").resolved())


def test_quick_keeps_four_task_groups_per_bucket(dataset) -> None:
    assert QUICK["limit"] >= 4
    for name in ("sweep", "report"):
        options = CLASSES[name](quick=True, buckets=["T_ok", "T_wrong", "T_repair"]).resolved()
        items = select_items(dataset, options)
        for bucket in BUCKETS:
            groups = {i.task_group for i in items if i.bucket == bucket}
            assert len(groups) >= 4, (name, bucket, groups)
