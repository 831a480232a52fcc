"""Issue 41: ``card --tokenizer none`` over a torn ``llm_extraction.jsonl`` line, an id without a ``.``
or an unknown domain raised a traceback after 35 s of statistics. The record is read and checked
first: a dataset error naming the file, the line and the id, before any statistic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from probes.cli.main import main
from probes.data.dataset import V1_DATASET_DIR, DatasetError, load_dataset
from probes.data.extract_llm import read_record
from probes.reporting import cards

GOOD = {"id": "retail.get_order_details", "model": "chat", "max_new_tokens": 8, "reply": "{}", "truncated": False}


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    shutil.copytree(V1_DATASET_DIR, tmp_path / "data")
    return tmp_path / "data"


@pytest.mark.parametrize(("line", "message"), [
    (json.dumps(GOOD)[:25], "llm_extraction.jsonl:2: not a JSON line (JSONDecodeError); a torn or edited line"),
    ("[" * 200_000, "llm_extraction.jsonl:2: not a JSON line (RecursionError)"),
    ("42", "llm_extraction.jsonl:2: a recorded reply must be a JSON object, got int"),
    (json.dumps({**GOOD, "id": "get_order_details"}), "llm_extraction.jsonl:2: id 'get_order_details' is not DOMAIN.TOOL"),
    (json.dumps({**GOOD, "id": "atlantis.get_order_details"}), "llm_extraction.jsonl:2: id 'atlantis.get_order_details': unknown domain 'atlantis'; "
                                                              "the dataset's domains: "),
    (json.dumps({**GOOD, "id": "retail.launch_rocket"}), "id 'retail.launch_rocket': domain 'retail' has no tool 'launch_rocket'"),
    (json.dumps({**GOOD, "truncated": "no"}), "llm_extraction.jsonl:2: a recorded reply needs the fields 'truncated' (bool)"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "reply"}), "needs the fields 'reply' (str)"),
    (json.dumps({**GOOD, "max_new_tokens": True}), "needs the fields 'max_new_tokens' (int)"),
])
def test_card_checks_the_recorded_run_before_any_statistic(dataset: Path, line: str, message: str, monkeypatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    (dataset / "llm_extraction.jsonl").write_text(json.dumps(GOOD) + "\n" + line + "\n")
    card = (dataset / "CARD.md").read_bytes()

    def too_late(*args, **kwargs):
        raise AssertionError("a statistic ran before the record was checked")

    monkeypatch.setattr(cards, "shortcut_table", too_late)
    assert main(["card", str(dataset), "--tokenizer", "none"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert (dataset / "CARD.md").read_bytes() == card  # the previous card untouched


def test_a_well_formed_record_is_read_whole(dataset: Path) -> None:
    path = dataset / "llm_extraction.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({**GOOD, "truncated": True}) + "\n")
    catalogs = {name: domain.catalog for name, domain in load_dataset(dataset).domains.items()}
    assert read_record(path, catalogs) == [GOOD, {**GOOD, "truncated": True}]
    path.write_bytes(b'{"id": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match="llm_extraction.jsonl: not UTF-8 text"):
        read_record(path, catalogs)
