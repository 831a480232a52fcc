"""Every view writes dataset text through probes.core.text.visible: ``basm-probes show`` on the terminal (and
prints rich markup in the text literally), the report's markdown tables, the CLI's error messages, and the
explore page's data (whose script JSON can neither end nor re-open its element)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from probes.analyses import dataset_tools
from probes.analyses.explore import script_json, shown
from probes.cli.main import main
from probes.data.dataset import V1_DATASET_DIR
from probes.reporting.markdown import markdown_table

HIDDEN = "\u202e\u200b\u2066\x1b"
MARKS = "⟨U+202E⟩⟨U+200B⟩⟨U+2066⟩⟨U+001B⟩"


def dataset_with_first_item(tmp: Path, **change: object) -> Path:
    root = tmp / "data"
    shutil.copytree(V1_DATASET_DIR, root)
    path = root / "items.jsonl"
    lines = path.read_text().splitlines()
    raw = json.loads(lines[0])
    raw.update(change)
    path.write_text("\n".join([json.dumps(raw), *lines[1:]]) + "\n")
    return root


def test_show_prints_hidden_code_points_as_marks_and_markup_as_text(tmp_path, capsys):
    request = f"Where is order 7?{HIDDEN}[2J [bold red]urgent[/bold red] :warning:"
    root = dataset_with_first_item(tmp_path, user=request)
    dataset_tools.show(item="retail-ok-0001", dataset=root, embedder="lexical", relevance="lexical", k=1)
    out = capsys.readouterr().out
    assert f"Where is order 7?{MARKS}[2J" in out and "[bold red]urgent[/bold red]" in out and ":warning:" in out
    assert not any(c in out for c in HIDDEN)


def test_the_report_tables_show_hidden_code_points_as_marks():
    table = markdown_table(pd.DataFrame({"item\u200b": [f"retail{HIDDEN}-1|x"], "value": [0.5]}))
    assert table.splitlines()[0] == "| item⟨U+200B⟩ | value |"
    assert table.splitlines()[2] == f"| retail{MARKS}-1\\|x | 0.500 |"


def test_a_cli_error_quoting_an_item_shows_its_hidden_code_points_as_marks(tmp_path, capsys):
    root = dataset_with_first_item(tmp_path, id=f"retail-ok-0001{HIDDEN}", tempting_skill="retail.nope")
    code = main(["sweep", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "out"), "--dataset", str(root), "--embedder",
                 "lexical", "--relevance", "lexical", "--split", "all", "--limit", "1", "--k-max", "1"])
    err = capsys.readouterr().err
    assert code == 1 and f"(item retail-ok-0001{MARKS}): tempting skill 'retail.nope'" in err
    assert not any(c in err for c in HIDDEN)


def test_the_page_data_is_shown_and_its_script_json_cannot_leave_its_element():
    data = {"out_dir": "/r/<!--<script>/</script>&amp;", f"key{HIDDEN}": [f"id{HIDDEN}", {"tool": "a\u2028b\u2029c"}], "n": 1.5}
    page = shown(data)
    assert page == {"out_dir": "/r/<!--<script>/</script>&amp;", f"key{MARKS}": [f"id{MARKS}", {"tool": "a⟨U+2028⟩b⟨U+2029⟩c"}], "n": 1.5}
    text = script_json(data)
    assert not any(c in text for c in "<>&\u2028\u2029") and json.loads(text) == data
