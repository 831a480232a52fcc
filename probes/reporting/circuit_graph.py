"""The circuit as a graph file: nodes, span-labelled edges with their scores, the prompt and its attention, as schema-checked JSON.

The circuit analysis hands :func:`circuit_graph` its tables for one configuration and counterfactual
pair (the edge table, the node table, one example prompt with every head's deciding-row attention,
and what the run was); :func:`write_circuit_graph` checks the graph and writes it
(``circuit_graph_<config>_<pair>.json``, :func:`graph_file`) through the run's
:class:`~probes.core.files.OutputRoot`. The explore page draws it; any other viewer reads it with
:func:`read_circuit_graph` or with a JSON Schema validator of its own.

The format is the JSON Schema shipped beside this module (``schemas/circuit_graph.schema.json``,
:data:`SCHEMA_FILE`), documented field by field in ``docs/circuit_graph.md`` (generated from the
schema by ``docs/circuit_graph.py``). The file is strict JSON: a number that is not finite is
written as null, and the schema says which fields may hold null. What the schema cannot say (an edge's
target is a head node, its span a span of the prompt, the attention has one weight per token, the
ranks are 1 … number of edges, the spans are disjoint) :func:`check_graph` checks after it.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pandas as pd

from probes.core.files import OutputRoot

SCHEMA_VERSION = 1
SCHEMA_FILE = importlib.resources.files("probes.reporting") / "schemas" / "circuit_graph.schema.json"
GRAPH_GLOB = "circuit_graph_*.json"  # what the explore page picks up in a results folder
EDGE_COLUMNS = ("config", "pair", "layer", "head", "span", "score", "atp", "atp_star", "atp_gd", "eap_ig", "exact", "rank",
                "in_circuit", "atp_disagrees")
NODE_COLUMNS = ("config", "pair", "kind", "layer", "head", "dla", "dla_low", "dla_high", "ablate_total", "patch_total",
                "patch_direct", "disagree")
EDGE_SCORES = ("score", "atp", "atp_star", "atp_gd", "eap_ig", "exact")
NODE_VALUES = ("dla", "dla_low", "dla_high", "ablate_total", "patch_total", "patch_direct")
KIND_ORDER = {"embed": 0, "head": 1, "mlp": 2}  # within a layer: its heads, then its MLP
ATTENTION_KEY = re.compile(r"(\d+)\.(\d+)")  # the analysis keys a head's attention "layer.head"


class GraphError(ValueError):
    """A circuit graph (or the tables it is built from) that breaks the format; the message names
    the field and what to fix."""


@functools.cache
def schema() -> dict[str, Any]:
    """The JSON Schema of a circuit graph file."""
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def graph_file(config: str, pair: str) -> str:
    """The file name of the graph of ``config`` and ``pair``."""
    name = f"circuit_graph_{config}_{pair}.json"
    if "/" in name or "\\" in name:
        raise GraphError(f"configuration {config!r} / pair {pair!r}: a graph's file name cannot hold a path separator")
    return name


def node_id(kind: str, layer: int, head: int) -> str:
    """``embed``, ``L<layer>H<head>`` or ``L<layer>MLP`` (the explore page names heads the same way)."""
    return {"embed": "embed", "head": f"L{layer}H{head}", "mlp": f"L{layer}MLP"}[kind]


def _number(value: Any) -> float | None:
    """A float, or None for a number that is not finite or not given (strict JSON); anything else as
    it is, for the schema to refuse by name."""
    if value is None or isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    value = float(value)
    return value if math.isfinite(value) else None


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value JSON writes (meta is often filled from a table's cells)."""
    return value.item() if isinstance(value, np.generic) else value


def _typed(frame: pd.DataFrame, what: str, integers: Sequence[str], booleans: Sequence[str]) -> None:
    for col in integers:
        if not pd.api.types.is_integer_dtype(frame[col]):
            raise GraphError(f"{what} column {col!r} has dtype {frame[col].dtype}, not integers: give every row an integer "
                             "(a missing value makes the column float)")
    for col in booleans:
        if not pd.api.types.is_bool_dtype(frame[col]):
            raise GraphError(f"{what} column {col!r} has dtype {frame[col].dtype}, not bool: give every row True or False")


def _rows_of(frame: pd.DataFrame, what: str, columns: Sequence[str], meta: Mapping[str, Any]) -> pd.DataFrame:
    """``frame``'s rows of meta's configuration and pair, after checking its columns."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise GraphError(f"{what} table lacks the columns {missing} (it needs {list(columns)})")
    mine = frame[(frame["config"] == meta["config"]) & (frame["pair"] == meta["pair"])]
    if mine.empty:
        found = sorted({(str(c), str(p)) for c, p in zip(frame["config"], frame["pair"])})
        raise GraphError(f"{what} table has no row of config {meta['config']!r}, pair {meta['pair']!r} (meta's); it holds {found}")
    return mine


def circuit_graph(edges: pd.DataFrame, nodes: pd.DataFrame, prompt: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The graph of one configuration and counterfactual pair (``meta["config"]``, ``meta["pair"]``;
    rows of the tables with another configuration or pair are left out), checked (:func:`check_graph`).

    ``edges``: one row per (layer, head, span) with :data:`EDGE_COLUMNS`; ``nodes``: one row per
    component with :data:`NODE_COLUMNS` (``kind`` embed / head / mlp; layer −1 for the embedding, head
    −1 unless a head); ``prompt``: ``tokens`` (display text per token, up to and including the
    deciding row), ``spans`` (name → [[start, end), ...], every edge's span among them),
    ``deciding_row`` and ``attention`` ({"layer.head": weights over the tokens}, every head);
    ``meta``: the schema's ``meta`` fields. Numbers that are not finite become null."""
    for key in ("config", "pair"):
        if key not in meta:
            raise GraphError(f"meta lacks {key!r}: the graph is of one configuration and one counterfactual pair")
    if missing := [k for k in ("tokens", "spans", "deciding_row", "attention") if k not in prompt]:
        raise GraphError(f"prompt lacks {missing}: give its tokens, spans, deciding_row and every head's attention")
    edge_rows = _rows_of(edges, "edge", EDGE_COLUMNS, meta)
    node_rows = _rows_of(nodes, "node", NODE_COLUMNS, meta)
    _typed(edge_rows, "edge", ("layer", "head", "rank"), ("in_circuit", "atp_disagrees"))
    _typed(node_rows, "node", ("layer", "head"), ())
    if (bad := [v for v in node_rows["disagree"] if not isinstance(v, str)]):
        raise GraphError(f"node column 'disagree' holds {bad[0]!r}: give a string per node, \"\" where DLA and the exact effects agree")
    graph_nodes = sorted(
        ({"id": node_id(r.kind, int(r.layer), int(r.head)), "kind": r.kind, "layer": int(r.layer), "head": int(r.head),
          **{k: _number(getattr(r, k)) for k in NODE_VALUES}, "disagree": str(r.disagree)} for r in node_rows.itertuples()),
        key=lambda n: (n["layer"], KIND_ORDER[n["kind"]], n["head"]))
    graph_edges = sorted(
        ({"source": str(r.span), "target": node_id("head", int(r.layer), int(r.head)), "layer": int(r.layer), "head": int(r.head),
          "span": str(r.span), **{k: _number(getattr(r, k)) for k in EDGE_SCORES}, "rank": int(r.rank),
          "in_circuit": bool(r.in_circuit), "atp_disagrees": bool(r.atp_disagrees)} for r in edge_rows.itertuples()),
        key=lambda e: e["rank"])
    attention = {}
    for key, weights in prompt["attention"].items():
        if not (m := ATTENTION_KEY.fullmatch(str(key))):
            raise GraphError(f"prompt attention key {key!r}: key each head's weights by 'layer.head' (e.g. '3.5')")
        attention[node_id("head", int(m[1]), int(m[2]))] = [_number(w) for w in weights]
    graph = {
        "schema_version": SCHEMA_VERSION,
        "meta": {k: _number(v) if k == "faithfulness" else _plain(v) for k, v in meta.items()},
        "prompt": {"tokens": [str(t) for t in prompt["tokens"]], "spans": {str(k): [[int(x) for x in r] for r in v] for k, v in prompt["spans"].items()},
                   "deciding_row": int(prompt["deciding_row"])},
        "nodes": graph_nodes, "edges": graph_edges, "attention": attention,
    }
    return check_graph(graph)


def _non_finite(value: Any, where: str) -> str | None:
    """The JSON path of the first number in ``value`` that is not finite, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, item in items:
        if isinstance(item, float):  # inline: a graph holds ~10^5–10^6 attention weights
            if not math.isfinite(item):
                return f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}"
        elif isinstance(item, Mapping | list | tuple) and (found := _non_finite(item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}")):
            return found
    return None


WEIGHT_KEYWORDS = {"description", "type", "minimum", "maximum"}  # what _weight_extremes relies on the weight schema holding


def _weight_extremes(attention: Any) -> tuple[Any, dict[str, list[int]]]:
    """``attention`` with each head's weights cut to the ones the per-weight schema (a number within
    [minimum, maximum]) can fail on: the first that is not a number, else the smallest and the largest
    (every weight between them passes what they pass), and for each head the original index of each
    kept weight. Validating ~10^6 weights one by one takes jsonschema seconds per graph."""
    if not isinstance(attention, Mapping):
        return attention, {}
    cut, kept = {}, {}
    for head, weights in attention.items():
        if not isinstance(weights, list):
            cut[head] = weights
            continue
        odd = next((i for i, w in enumerate(weights) if isinstance(w, bool) or not isinstance(w, int | float)), None)
        kept[head] = [odd] if odd is not None else [] if not weights else [min(range(len(weights)), key=weights.__getitem__),
                                                                             max(range(len(weights)), key=weights.__getitem__)]
        cut[head] = [weights[i] for i in kept[head]]
    return cut, kept


def check_graph(graph: Mapping[str, Any]) -> dict[str, Any]:
    """``graph`` if it is a valid circuit graph (strict JSON, the schema, and the cross-references the
    schema cannot state; module docstring), else :class:`GraphError` naming the first fault."""
    if where := _non_finite(graph, "graph"):
        raise GraphError(f"{where} is not a finite number: a circuit graph is strict JSON (write null, which the schema "
                         "allows only where a field's type includes null; circuit_graph() converts)")
    attention, kept = _weight_extremes(graph.get("attention") if isinstance(graph, Mapping) else None)
    cut = {**graph, "attention": attention} if kept else graph
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema()).iter_errors(cut))
    if error is not None:
        path = list(error.absolute_path)
        if len(path) == 3 and path[0] == "attention" and path[1] in kept:  # a kept weight: its index in the full list
            path[2] = kept[path[1]][path[2]]
        where = "graph" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
        raise GraphError(f"{where}: {error.message} (the circuit graph schema, {SCHEMA_FILE.name}; docs/circuit_graph.md)")
    prompt, meta = graph["prompt"], graph["meta"]
    n = len(prompt["tokens"])
    if prompt["deciding_row"] != n - 1:
        raise GraphError(f"graph.prompt.deciding_row is {prompt['deciding_row']} but the prompt has {n} tokens: give the tokens up to "
                         "and including the deciding row (its keys), so the deciding row is the last")
    owner: dict[int, str] = {}
    for name, ranges in prompt["spans"].items():
        for start, end in ranges:
            if not 0 <= start < end <= n:
                raise GraphError(f"graph.prompt.spans.{name}: range [{start}, {end}) is not within the {n} tokens (0 ≤ start < end ≤ {n})")
            for pos in range(start, end):
                if (other := owner.setdefault(pos, name)) != name:
                    raise GraphError(f"graph.prompt.spans: {name!r} and {other!r} both hold token {pos}: source spans are disjoint")
    ids = [node["id"] for node in graph["nodes"]]
    if len(set(ids)) != len(ids):
        raise GraphError(f"graph.nodes: ids {sorted({i for i in ids if ids.count(i) > 1})} appear more than once")
    for i, node in enumerate(graph["nodes"]):
        if node["id"] != node_id(node["kind"], node["layer"], node["head"]) or (node["kind"] == "embed") != (node["layer"] == -1):
            raise GraphError(f"graph.nodes[{i}]: id {node['id']!r} does not name its kind {node['kind']!r}, layer {node['layer']}, head "
                             f"{node['head']} (embed at layer −1; L<layer>H<head>; L<layer>MLP with head −1)")
    heads = {node["id"] for node in graph["nodes"] if node["kind"] == "head"}
    seen: set[tuple[str, str]] = set()
    for i, edge in enumerate(graph["edges"]):
        if edge["target"] not in heads or edge["target"] != node_id("head", edge["layer"], edge["head"]):
            raise GraphError(f"graph.edges[{i}]: target {edge['target']!r} is not the head node of layer {edge['layer']}, head {edge['head']}")
        if edge["source"] != edge["span"] or edge["span"] not in prompt["spans"]:
            raise GraphError(f"graph.edges[{i}]: source {edge['source']!r} / span {edge['span']!r} must be one name, a span of "
                             f"graph.prompt.spans {sorted(prompt['spans'])}")
        if (key := (edge["target"], edge["span"])) in seen:
            raise GraphError(f"graph.edges[{i}]: the edge {key} appears twice")
        seen.add(key)
    ranks = sorted(edge["rank"] for edge in graph["edges"])
    if ranks != list(range(1, len(ranks) + 1)):
        raise GraphError(f"graph.edges: the ranks are not 1 … {len(ranks)} (each once): rank the edges by |score|, 1 the largest")
    if (size := sum(edge["in_circuit"] for edge in graph["edges"])) != meta["circuit_size"]:
        raise GraphError(f"graph.meta.circuit_size is {meta['circuit_size']} but {size} edges are in_circuit")
    if set(graph["attention"]) != heads:
        raise GraphError(f"graph.attention: give every head node's weights and only theirs (missing "
                         f"{sorted(heads - set(graph['attention']))[:5]}, not heads {sorted(set(graph['attention']) - heads)[:5]})")
    for key, weights in graph["attention"].items():
        if len(weights) != n:
            raise GraphError(f"graph.attention.{key}: {len(weights)} weights for {n} tokens: one weight per token of graph.prompt.tokens")
    return dict(graph)


def write_circuit_graph(output: OutputRoot, name: str, graph: Mapping[str, Any]) -> Path:
    """``graph``, checked (:func:`check_graph`), written as ``name`` (a ``.json`` file; :func:`graph_file`)
    under ``output``; returns its path."""
    if not name.endswith(".json"):
        raise GraphError(f"{name}: a circuit graph is written as a .json file (graph_file(config, pair) names it)")
    check_graph(graph)
    return output.write(name, json.dumps(graph, allow_nan=False, ensure_ascii=False, separators=(",", ":")) + "\n")


def read_circuit_graph(path: str | Path) -> dict[str, Any]:
    """A circuit graph file, checked (:func:`check_graph`); a fault names the file."""
    path = Path(path)
    try:
        return check_graph(json.loads(path.read_text(encoding="utf-8")))
    except json.JSONDecodeError as error:
        raise GraphError(f"{path}: not a JSON file ({error})") from error
    except GraphError as error:
        raise GraphError(f"{path}: {error}") from error


__all__ = ["GRAPH_GLOB", "GraphError", "check_graph", "circuit_graph", "graph_file", "read_circuit_graph", "schema", "write_circuit_graph"]
