"""explore.html on hostile text: an item id, a tool name and an output path holding ``<!--<script>``, and a
request holding a right-to-left override and zero-width characters. The page's data script holds no
``<`` (so nothing in it ends or re-opens the element), every text is drawn literally, hidden code points
as marks, and the page opened in a real headless Chromium renders with no console error."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import probes
from probes.analyses.explore import explore
from probes.data.dataset import V1_DATASET_DIR, DatasetError
from tests.runs import open_page

HOSTILE = "<!--<script>"
ITEM = f"retail-wrong-0001{HOSTILE}"
TOOL = f"get_order_details{HOSTILE}"  # the item's wrong tool
REQUEST = "Can you look up the \u202estatus\u202c of the Vela\u200b yoga\u2060 mat?\ufeff I haven't ordered it yet."
RUN = {"embedder": "lexical", "relevance": "lexical", "split": "all", "k_max": 1, "configs": ["basm"], "figure": False}


def hostile_dataset(tmp: Path) -> Path:
    """basm_probe with its first T_wrong item renamed to ITEM, holding REQUEST, and get_order_details renamed to TOOL everywhere."""
    root = tmp / "data"
    shutil.copytree(V1_DATASET_DIR, root)
    for path in [root / "items.jsonl", *(root / "domains").glob("*.json")]:
        path.write_text(path.read_text().replace('"get_order_details"', json.dumps(TOOL)))
    path = root / "items.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    (row,) = [r for r in rows if r["id"] == "retail-wrong-0001"]
    row.update(id=ITEM, user=REQUEST)
    assert row["wrong_tools"] == [TOOL]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def data_script(page: Path) -> str:
    return re.search(r'<script type="application/json" id="data">(.*?)</script>', page.read_text(), re.S).group(1)


def shown_record(data: dict) -> int:
    """The index of the hostile item's record at k = 1 (a skill shown)."""
    return next(i for i, r in enumerate(data["records"]) if r["item"] == ITEM and r["k"] == 1)


@pytest.fixture(scope="module")
def hostile_page(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3_dir: Path):
    """A sweep of the hostile item on a tiny random Qwen3 and its explore page, written under an --out path holding HOSTILE."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("explore_hostile")
    out = tmp / f"out{HOSTILE}"
    session = probes.ProbeSession(tiny_qwen3_dir)
    probes.run("sweep", session, dataset=hostile_dataset(tmp), item_ids=[ITEM], model=tiny_qwen3_dir, out=out, **RUN)
    page = explore(session, out=out, model=tiny_qwen3_dir)
    return page, json.loads(data_script(page)), out


def test_hostile_text_is_stored_literally_and_hidden_code_points_as_marks(hostile_page):
    page, data, out = hostile_page
    assert not re.search("[<>&]", data_script(page))  # nothing in the data can end or re-open its element
    assert str(out) in data["out_dir"]
    rec = data["records"][shown_record(data)]
    assert rec["id"].startswith(ITEM + "|") and TOOL in rec["wrong"] and any(c["action"] == TOOL for c in rec["candidates"])
    text = "".join(rec["tokens"])
    assert "⟨U+202E⟩status⟨U+202C⟩ of the Vela⟨U+200B⟩ yoga⟨U+2060⟩ mat?⟨U+FEFF⟩" in text and TOOL in text
    assert not re.search("[\u202a-\u202e\u200b-\u200f\u2060\ufeff\u2066-\u2069]", page.read_text())
    # the header's path is escaped HTML, not markup
    assert "out&lt;!--&lt;script&gt;" in page.read_text() and f"out{HOSTILE}" not in page.read_text().split('id="data"')[0]


# ----------------------------------------------------------------------------- in a real browser
def test_the_page_renders_hostile_ids_paths_and_tool_names_in_a_browser(hostile_page, browser):
    page_path, data, out = hostile_page
    context, page, errors = open_page(browser, page_path, timeout_ms=5000)
    # a data script swallowed by "<!--<script" leaves the page empty: no record to choose
    assert page.locator("#record-select option").count() == len(data["records"])
    index = shown_record(data)
    page.select_option("#record-select", str(index))
    rec = data["records"][index]
    assert page.get_attribute("#tokens", "data-record") == rec["id"]
    shown = page.inner_text("#tokens")
    assert "⟨U+202E⟩status⟨U+202C⟩" in shown and "Vela⟨U+200B⟩ yoga⟨U+2060⟩ mat?⟨U+FEFF⟩" in shown and TOOL in shown
    assert ITEM in page.inner_text("#record-info") and TOOL in page.inner_text("#candidates")
    assert ITEM in page.inner_text("#record-select") and f"out{HOSTILE}" in page.inner_text("header")
    assert page.locator("script").count() == 2  # no element opened by the data
    assert page.evaluate("() => DATA.records.length") == len(data["records"])
    assert not errors, errors
    context.close()


def test_explore_after_a_sweep_on_an_item_id_with_the_separator_names_the_item(tmp_path, tiny_qwen3_dir):
    """A sweep's results whose dataset item id was then edited to hold "|" (which joins a record id's parts):
    explore refuses the dataset, naming the item, where it split the record id into too many parts."""
    root = tmp_path / "data"
    shutil.copytree(V1_DATASET_DIR, root)
    session = probes.ProbeSession(tiny_qwen3_dir)
    probes.run("sweep", session, dataset=root, item_ids=["retail-wrong-0001"], model=tiny_qwen3_dir, out=tmp_path / "out", **RUN)
    items = root / "items.jsonl"
    items.write_text(items.read_text().replace('"id": "retail-wrong-0001"', '"id": "retail|wrong-0001"'))
    with pytest.raises(DatasetError, match=r"items.jsonl:\d+: item id 'retail\|wrong-0001' holds '\|', which joins the parts of a record id"):
        explore(session, out=tmp_path / "out", model=tiny_qwen3_dir)
