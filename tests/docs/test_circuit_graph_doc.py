"""docs/circuit_graph.md documents the circuit graph file as the shipped schema states it: its field table is what
``python docs/circuit_graph.py`` writes from the schema today (a changed schema is caught), and its reading examples
run on a file the package wrote."""

from __future__ import annotations

import copy
import re

import pytest

import circuit_tables as C
from runs import ROOT, load_script

from probes.core.files import OutputRoot
from probes.reporting import circuit_graph as G

DOC = load_script("circuit_graph_doc", ROOT / "docs" / "circuit_graph.py")


def test_the_field_table_is_the_schema() -> None:
    text = DOC.DOC.read_text(encoding="utf-8")
    assert DOC.current(text) == text, "docs/circuit_graph.md is out of date: run python docs/circuit_graph.py"
    for path in ("meta.circuit_size", "prompt.spans.<name>[]", "nodes[].patch_direct", "edges[].atp_disagrees", "attention.<id>[]"):
        assert f"| `{path}` |" in text, path


def test_a_changed_schema_is_caught() -> None:
    text = DOC.DOC.read_text(encoding="utf-8")
    schema = G.schema()
    for edit in (lambda s: s["properties"]["edges"]["items"]["properties"].pop("atp_gd"),
                 lambda s: s["properties"]["nodes"]["items"]["properties"]["dla"].update(type=["number", "null"]),
                 lambda s: s["properties"]["meta"]["required"].remove("bucket"),
                 lambda s: s["properties"]["prompt"]["properties"]["tokens"].update(description="Tokens.")):
        changed = copy.deepcopy(schema)
        edit(changed)
        assert DOC.current(text, changed) != text
    changed = copy.deepcopy(schema)
    changed["properties"]["edges"]["items"]["properties"]["rank"]["exclusiveMaximum"] = 10
    with pytest.raises(ValueError, match=r"edges\[\]\.rank: keywords \['exclusiveMaximum'\] are not documented"):
        DOC.block(changed)
    del changed["properties"]["edges"]["items"]["properties"]["rank"]["exclusiveMaximum"]
    del changed["properties"]["edges"]["items"]["properties"]["rank"]["description"]
    with pytest.raises(ValueError, match=r"edges\[\]\.rank: the schema gives no description"):
        DOC.block(changed)


def test_the_reading_examples_run(tmp_path, monkeypatch, capsys) -> None:
    graph = G.circuit_graph(*C.tables())
    G.write_circuit_graph(OutputRoot(tmp_path), G.graph_file("basm", "knockout"), graph)
    blocks = re.findall(r"```python\n(.*?)```", DOC.DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 2 and all("circuit_graph_basm_knockout.json" in b for b in blocks)
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "docs/circuit_graph.md", "exec"), {})
    out = capsys.readouterr().out
    top = graph["edges"][0]
    assert f'{top["target"]} reads {top["source"]}: eap_ig {top["score"]:+.3f}' in out and f'{top["target"]} attends most to' in out
