"""The circuit graph file: a graph built from the circuit analysis's tables is valid against the shipped JSON Schema
(checked here by jsonschema directly, as another viewer would), survives the write and read back unchanged as strict
JSON, and every way to break it (a missing field, a NaN where a number must be finite, a broken cross-reference)
is refused with a message naming the field."""

from __future__ import annotations

import copy
import fnmatch
import json
import math
import tomllib
from collections.abc import Callable
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import circuit_tables as C
from probes.core.files import OutputRoot
from probes.reporting import circuit_graph as G

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def graph() -> dict:
    return G.circuit_graph(*C.tables())


def test_a_built_graph_is_valid_and_reads_back_unchanged(graph, tmp_path):
    jsonschema.Draft202012Validator(json.loads(G.SCHEMA_FILE.read_text())).validate(graph)  # the schema alone, as a viewer reads it
    edges, nodes, prompt, meta = C.tables()
    mine = edges[edges["config"] == "basm"]  # the other configuration's rows are left out
    assert len(graph["edges"]) == len(mine) == C.LAYERS * C.HEADS * len(C.SPANS)
    assert [e["rank"] for e in graph["edges"]] == list(range(1, len(mine) + 1))
    assert [n["id"] for n in graph["nodes"]] == ["embed", "L0H0", "L0H1", "L0MLP", "L1H0", "L1H1", "L1MLP"]
    top = mine.loc[mine["rank"] == 1].iloc[0]
    first = graph["edges"][0]
    assert (first["target"], first["source"], first["score"], first["exact"]) == (f"L{top['layer']}H{top['head']}", top["span"], top["score"], top["exact"])
    assert sum(e["exact"] is None for e in graph["edges"]) == (mine["exact"].isna()).sum() > 0  # NaN: not run → null
    assert graph["nodes"][1]["dla_low"] is None and graph["attention"]["L1H0"][3] == 1.0
    assert graph["prompt"]["tokens"] == C.TOKENS and graph["prompt"]["spans"] == C.SPANS and graph["meta"] == meta

    path = G.write_circuit_graph(OutputRoot(tmp_path), G.graph_file("basm", "knockout"), graph)
    assert path == tmp_path / "circuit_graph_basm_knockout.json" and path.match(G.GRAPH_GLOB)
    text = path.read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert G.read_circuit_graph(path) == graph


def test_the_schema_ships_as_package_data():
    """pyproject's package-data names the schema (a wheel holds only what it names)."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["probes.reporting"]
    relative = Path(str(G.SCHEMA_FILE)).relative_to(ROOT / "probes" / "reporting").as_posix()
    assert any(fnmatch.fnmatch(relative, p) for p in patterns), (relative, patterns)
    jsonschema.Draft202012Validator.check_schema(G.schema())


def test_the_weights_schema_is_what_their_extremes_check_relies_on():
    """A weight's schema of only a type and bounds: then the smallest and largest weights pass it iff all do."""
    assert set(G.schema()["properties"]["attention"]["additionalProperties"]["items"]) == G.WEIGHT_KEYWORDS


def _drop(key: str) -> Callable[[dict], None]:
    def edit(g: dict) -> None:
        del g["edges"][0][key]
    return edit


def _set(path: tuple, value) -> Callable[[dict], None]:
    def edit(g: dict) -> None:
        target = g
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


BROKEN = {  # a planted fault → what the refusal says
    "missing edge field": (_drop("atp"), r"graph\.edges\[0\]: 'atp' is a required property"),
    "missing top-level field": (lambda g: g.pop("attention"), r"graph: 'attention' is a required property"),
    "NaN in the graph": (_set(("edges", 1, "atp_star"), math.nan), r"graph\.edges\[1\]\.atp_star is not a finite number"),
    "null where a number must be finite": (_set(("nodes", 0, "dla"), None), r"graph\.nodes\[0\]\.dla: None is not of type 'number'"),
    "an unknown field": (_set(("edges", 0, "colour"), "red"), r"graph\.edges\[0\]: Additional properties are not allowed \('colour'"),
    "a newer version": (_set(("schema_version",), 2), r"graph\.schema_version: 1 was expected"),
    # the weights are validated by their extremes (_weight_extremes); the refusal names the weight's own index
    "attention above 1": (_set(("attention", "L0H0", 4), 1.5), r"graph\.attention\.L0H0\[4\]: 1\.5 is greater than the maximum of 1"),
    "attention below 0": (_set(("attention", "L1H1", 9), -0.25), r"graph\.attention\.L1H1\[9\]: -0\.25 is less than the minimum of 0"),
    "attention not a number": (_set(("attention", "L0H1", 7), "0.5"), r"graph\.attention\.L0H1\[7\]: '0\.5' is not of type 'number'"),
    "attention a boolean": (_set(("attention", "L0H1", 2), True), r"graph\.attention\.L0H1\[2\]: True is not of type 'number'"),
    "attention not a list": (_set(("attention", "L0H1"), 0.5), r"graph\.attention\.L0H1: 0\.5 is not of type 'array'"),
    "an edge from no span": (_set(("edges", 0, "source"), "tools"), r"graph\.edges\[0\]: source 'tools' / span"),
    "an edge into no head": (_set(("edges", 0, "target"), "L7H0"), r"graph\.edges\[0\]: target 'L7H0' is not the head node"),
    "attention of the wrong length": (lambda g: g["attention"]["L0H1"].pop(), r"graph\.attention\.L0H1: 11 weights for 12 tokens"),
    "a head without attention": (lambda g: g["attention"].pop("L1H1"), r"graph\.attention: give every head node's weights.*L1H1"),
    "a repeated rank": (_set(("edges", 1, "rank"), 1), r"graph\.edges: the ranks are not 1 … 20"),
    "a circuit of another size": (_set(("meta", "circuit_size"), 4), r"graph\.meta\.circuit_size is 4 but 5 edges are in_circuit"),
    "overlapping spans": (_set(("prompt", "spans", "request"), [[7, 10]]), r"'request' and 'procedure' both hold token 7"),
    "a span past the tokens": (_set(("prompt", "spans", "other"), [[10, 13]]), r"graph\.prompt\.spans\.other: range \[10, 13\)"),
    "a deciding row before the last token": (_set(("prompt", "deciding_row"), 10), r"deciding_row is 10 but the prompt has 12 tokens"),
    "a node id of another kind": (_set(("nodes", 3, "id"), "L0H5"), r"graph\.nodes\[3\]: id 'L0H5' does not name its kind 'mlp'"),
}


@pytest.mark.parametrize("fault", list(BROKEN))
def test_a_broken_graph_is_refused_naming_the_field(graph, tmp_path, fault):
    edit, message = BROKEN[fault]
    broken = copy.deepcopy(graph)
    edit(broken)
    with pytest.raises(G.GraphError, match=message):
        G.check_graph(broken)
    with pytest.raises(G.GraphError, match=message):  # and nothing is written
        G.write_circuit_graph(OutputRoot(tmp_path), "g.json", broken)
    assert not (tmp_path / "g.json").exists()
    if fault != "NaN in the graph":  # a file holding the fault: the reader names the file too
        (tmp_path / "bad.json").write_text(json.dumps(broken))
        with pytest.raises(G.GraphError, match=rf"bad\.json: .*{message}"):
            G.read_circuit_graph(tmp_path / "bad.json")


def test_bad_tables_are_refused_naming_the_column():
    edges, nodes, prompt, meta = C.tables()
    edges.loc[edges.index[0], "atp"] = np.nan  # a score that must be finite: null, which the schema refuses
    with pytest.raises(G.GraphError, match=r"graph\.edges\[\d+\]\.atp: None is not of type 'number'"):
        G.circuit_graph(edges, nodes, prompt, meta)
    edges, nodes, prompt, meta = C.tables()
    with pytest.raises(G.GraphError, match=r"edge table lacks the columns \['eap_ig'\]"):
        G.circuit_graph(edges.drop(columns="eap_ig"), nodes, prompt, meta)
    with pytest.raises(G.GraphError, match=r"edge table has no row of config 'basm', pair 'wrong_ok'"):
        G.circuit_graph(edges, nodes, prompt, {**meta, "pair": "wrong_ok"})
    with pytest.raises(G.GraphError, match=r"edge column 'rank' has dtype float64, not integers"):
        G.circuit_graph(edges.assign(rank=edges["rank"].astype(float)), nodes, prompt, meta)
    with pytest.raises(G.GraphError, match=r"edge column 'in_circuit' has dtype object, not bool"):
        G.circuit_graph(edges.assign(in_circuit=edges["in_circuit"].astype(object).where(edges.index > 0, None)), nodes, prompt, meta)
    with pytest.raises(G.GraphError, match=r"node column 'disagree' holds nan"):
        G.circuit_graph(edges, nodes.assign(disagree=nodes["disagree"].where(nodes.index > 0, np.nan)), prompt, meta)
    with pytest.raises(G.GraphError, match=r"prompt attention key 'L0H0': key each head's weights by 'layer.head'"):
        G.circuit_graph(edges, nodes, {**prompt, "attention": {"L0H0": [0.0] * 12}}, meta)
    with pytest.raises(G.GraphError, match=r"prompt lacks \['attention'\]"):
        G.circuit_graph(edges, nodes, {k: v for k, v in prompt.items() if k != "attention"}, meta)
    meta = {**meta, "circuit_size": np.int64(5), "faithfulness": np.float64(np.nan)}  # a table's cells: written as JSON's
    built = G.circuit_graph(edges, nodes, prompt, meta)
    assert built["meta"]["circuit_size"] == 5 and type(built["meta"]["circuit_size"]) is int and built["meta"]["faithfulness"] is None


def test_a_graph_file_is_a_json_file_named_without_a_path(graph, tmp_path):
    with pytest.raises(G.GraphError, match=r"g\.txt: a circuit graph is written as a \.json file"):
        G.write_circuit_graph(OutputRoot(tmp_path), "g.txt", graph)
    with pytest.raises(G.GraphError, match="cannot hold a path separator"):
        G.graph_file("basm", "../x")
    (tmp_path / "nan.json").write_text(json.dumps(graph).replace('"exact": null', '"exact": NaN', 1))
    with pytest.raises(G.GraphError, match=r"nan\.json: graph\.edges\[\d+\]\.exact is not a finite number"):
        G.read_circuit_graph(tmp_path / "nan.json")
