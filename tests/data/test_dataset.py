"""The dataset (probes.data.dataset): ``select``'s spread limit over task groups, and items that cannot be
read or scored are refused naming the file, the line and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from probes.data.dataset import BUCKETS, spread_limit, load_dataset


def test_limit_spreads_over_task_groups(v1_dataset) -> None:
    eval_items = v1_dataset.select(split="eval")
    chosen = v1_dataset.select(split="eval", limit_per_bucket=5, spread=True)
    for bucket in BUCKETS:
        mine = [i for i in chosen if i.bucket == bucket]
        assert len(mine) == 5 and len({i.task_group for i in mine}) == 5, bucket
        # one item per group first: the first item of each of the first five groups (file order)
        pool = [i for i in eval_items if i.bucket == bucket]
        firsts = [i for n, i in enumerate(pool) if i.task_group not in {j.task_group for j in pool[:n]}]
        assert mine == firsts[:5]
    order = {item.id: n for n, item in enumerate(v1_dataset.items)}
    assert [order[i.id] for i in chosen] == sorted(order[i.id] for i in chosen)  # file order kept


def test_limit_cycles_through_groups_when_larger_than_groups() -> None:
    items = [SimpleNamespace(id=f"{g}{n}", bucket="T_ok", task_group=g) for g in "ab" for n in range(3)]
    assert [i.id for i in spread_limit(items, 3)] == ["a0", "a1", "b0"]
    assert [i.id for i in spread_limit(items, 10)] == [i.id for i in items]


@pytest.mark.usefixtures("private_cache")
def test_a_latin1_byte_in_the_items_names_file_and_line(dataset: Path) -> None:
    from probes.data.dataset import DatasetError, load_dataset

    items = dataset / "items.jsonl"
    lines = items.read_bytes().split(b"\n")
    lines[4] = lines[4].replace(b'"user": "', b'"user": "caf\xe9 ', 1)
    items.write_bytes(b"\n".join(lines))
    with pytest.raises(DatasetError, match=r"items\.jsonl:5: not UTF-8 text \(byte 0xe9"):
        load_dataset(dataset)


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("wrong_tools, message", [([], "field 'wrong_tools' is empty"),
                                                  (["get_order_details"], "holds the correct tool 'get_order_details'"),
                                                  (["get_stock_info", "get_stock_info"], "lists ['get_stock_info'] more than once")])
def test_items_that_cannot_be_scored_fail_validation(dataset: Path, wrong_tools: list[str], message: str) -> None:
    from probes.data.dataset import DatasetError, load_dataset

    items = dataset / "items.jsonl"
    lines = items.read_text().splitlines()
    first = json.loads(lines[0])
    assert first["correct_action"]["tool"] == "get_order_details"
    first["wrong_tools"] = wrong_tools
    items.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(DatasetError, match=re.escape("items.jsonl:1 (item retail-ok-0001): ") + ".*" + re.escape(message)):
        load_dataset(dataset)


def test_spread_limit_takes_several_task_groups():
    items = load_dataset("basm_probe").select(split="eval", buckets=["T_ok", "T_wrong"])
    chosen = spread_limit(items, 2)
    assert [item.bucket for item in chosen].count("T_ok") == 2 and [item.bucket for item in chosen].count("T_wrong") == 2
    assert len({item.task_group for item in chosen if item.bucket == "T_ok"}) == 2
