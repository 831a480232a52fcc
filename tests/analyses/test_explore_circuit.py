"""explore.html's circuit view: the circuit graphs of a results folder (and graphs handed to the page builder) are
embedded as checked, and in a real headless Chromium the graph is drawn (a node per component, an edge per
(head, span) coloured by its span and as wide as its |score|, the circuit's edges apart), and a click on a head
shades the prompt tokens by that head's deciding-row attention, with no console error. No model runs: the page
holds only circuit graphs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import circuit_tables as C
from probes.analyses import explore as E
from probes.analyses.run_context import AnalysisError, model_label
from probes.core.files import OutputRoot
from probes.reporting import circuit_graph as G
from probes.reporting.layout import analysis_folder
from tests.runs import open_page

MODEL = "tiny-qwen3"
HOSTILE = " </script><!--<script>"


@pytest.fixture(scope="module")
def circuit_page(tmp_path_factory):
    """A results folder holding one graph file (basm) and a page built from it plus a second graph handed as a dict (proc)."""
    out = tmp_path_factory.mktemp("explore_circuit")
    folder = OutputRoot(out).child(analysis_folder(model_label(MODEL), "circuit"))
    edges, nodes, prompt, meta = C.tables()
    basm = G.circuit_graph(edges, nodes, prompt, meta)
    path = G.write_circuit_graph(folder, G.graph_file("basm", "knockout"), basm)
    hostile = {**prompt, "tokens": [*prompt["tokens"][:-3], HOSTILE, *prompt["tokens"][-2:]]}  # a token that would end the data script
    proc = G.circuit_graph(edges, nodes, hostile, {**meta, "config": "proc", "faithfulness": None})
    found = page_data(E.write_explore(E.ExploreOptions(out=out, model=MODEL)))  # the folder's graph files
    given = E.write_explore(E.ExploreOptions(out=out, model=MODEL), circuit_graphs=[path, proc])  # rewrites the page
    return {"found": found, "page": given, "graphs": [basm, proc]}


def page_data(page) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page.read_text(), re.S).group(1))


def unquantised(view: dict) -> dict:
    """A graph as the page stores it, its attention decoded (a weight within half a uint16 step)."""
    n = len(view["prompt"]["tokens"])
    weights = E.dequantise(view["attention"], view["scale"], "uint16", (len(view["attention_heads"]), n))
    graph = {k: v for k, v in view.items() if k not in ("scale", "attention_heads")}
    return {**graph, "attention": dict(zip(view["attention_heads"], weights))}


def test_the_page_embeds_the_folders_graphs_or_the_given_ones(circuit_page):
    basm, proc = circuit_page["graphs"]
    data = page_data(circuit_page["page"])
    assert data["records"] == [] and data["analyses"] == []
    for views, graphs in ((circuit_page["found"]["circuits"], [basm]), (data["circuits"], [basm, proc])):
        assert len(views) == len(graphs)
        for view, graph in zip(views, graphs):
            stored = unquantised(view)
            assert {k: v for k, v in stored.items() if k != "attention"} == {k: v for k, v in graph.items() if k != "attention"}
            assert stored["attention"].keys() == graph["attention"].keys()
            for head, weights in graph["attention"].items():
                np.testing.assert_allclose(stored["attention"][head], weights, atol=0.5 / 65535 + 1e-12, rtol=0)


def test_a_broken_graph_file_in_the_folder_is_refused_naming_it(circuit_page, tmp_path):
    graph = json.loads(json.dumps(circuit_page["graphs"][0]))
    graph["edges"][0]["target"] = "L9H9"
    folder = OutputRoot(tmp_path).child(analysis_folder(model_label(MODEL), "circuit"))
    folder.write("circuit_graph_basm_bad.json", json.dumps(graph))
    with pytest.raises(G.GraphError, match=r"circuit_graph_basm_bad\.json: graph\.edges\[0\]: target 'L9H9'"):
        E.write_explore(E.ExploreOptions(out=tmp_path, model=MODEL))
    with pytest.raises(AnalysisError, match=r"no results of any analysis with per-record rows and no circuit_graph_\*\.json"):
        E.write_explore(E.ExploreOptions(out=tmp_path / "empty", model=MODEL))
    graph = circuit_page["graphs"][0]
    with pytest.raises(AnalysisError, match=r"the page without records \(its figures and 10 circuit graphs\) takes 0\.1\d+ MB, over max_mb = 0\.1"):
        E.write_explore(E.ExploreOptions(out=tmp_path, model=MODEL, max_mb=0.1), circuit_graphs=[graph] * 10)


def _alphas(page) -> np.ndarray:
    """The shading of the circuit view's tokens (the background's alpha)."""
    colours = page.eval_on_selector_all("#circuit-tokens .tok", "els => els.map(e => getComputedStyle(e).backgroundColor)")
    return np.array([float(re.findall(r"[\d.]+", c)[3]) if c.startswith("rgba") else 1.0 for c in colours])


def test_the_circuit_view_in_a_headless_browser(circuit_page, browser):
    basm, proc = circuit_page["graphs"]
    context, page, errors = open_page(browser, circuit_page["page"], timeout_ms=5000)
    assert page.is_visible("#view-circuit") and not page.is_visible("#view-prompt")  # no records: the circuit view opens

    # a node per component, an edge per (head, span); every edge from its span's node, in its span's colour
    assert page.locator("#circuit-svg g.node[data-id]").count() == len(basm["nodes"])
    assert page.locator("#circuit-svg g.head-node").count() == C.LAYERS * C.HEADS
    assert page.locator("#circuit-svg g.span-node").count() == len(C.SPANS)
    drawn = page.eval_on_selector_all("#circuit-svg path.edge", """els => els.map(e => ({source: e.dataset.source, target: e.dataset.target,
        rank: Number(e.dataset.rank), stroke: e.getAttribute("stroke"), width: Number(e.getAttribute("stroke-width")),
        circuit: e.classList.contains("in-circuit"), opacity: Number(e.getAttribute("stroke-opacity"))}))""")
    assert sorted((d["source"], d["target"]) for d in drawn) == sorted((e["source"], e["target"]) for e in basm["edges"])
    by_span = {}
    for d in drawn:
        by_span.setdefault(d["source"], set()).add(d["stroke"])
    assert all(len(c) == 1 for c in by_span.values()) and len({c.pop() for c in by_span.values()}) == len(C.SPANS)
    legend = page.eval_on_selector_all("#circuit-legend span[data-span]", "els => els.map(e => e.textContent)")
    assert legend == list(C.SPANS)
    score = {e["rank"]: abs(e["score"]) for e in basm["edges"]}
    widths = np.array([d["width"] for d in sorted(drawn, key=lambda d: d["rank"])])
    np.testing.assert_allclose(widths, [0.5 + 5 * score[r] / score[1] for r in sorted(score)], atol=0.006)  # width ∝ |score|
    assert {d["rank"] for d in drawn if d["circuit"]} == set(range(1, basm["meta"]["circuit_size"] + 1))
    assert all(d["opacity"] > 0.5 for d in drawn if d["circuit"]) and all(d["opacity"] < 0.5 for d in drawn if not d["circuit"])

    # the first circuit edge's head is shown first; clicking another head shades the tokens by its attention
    first = basm["edges"][0]["target"]
    assert page.get_attribute("#circuit-tokens", "data-head") == first
    np.testing.assert_allclose(page.eval_on_selector_all("#circuit-tokens .tok", "els => els.map(e => Number(e.dataset.w))"),
                               basm["attention"][first], atol=0.5 / 65535 + 1e-6)  # stored as uint16
    other = "L1H0" if first != "L1H0" else "L0H1"
    before = _alphas(page)
    page.click(f"#circuit-svg g.node[data-id='{other}']")
    assert page.get_attribute("#circuit-tokens", "data-head") == other
    assert page.get_attribute(f"#circuit-svg g.node[data-id='{other}']", "class").endswith("selected")
    weights = np.array(page.eval_on_selector_all("#circuit-tokens .tok", "els => els.map(e => Number(e.dataset.w))"))
    np.testing.assert_allclose(weights, basm["attention"][other], atol=0.5 / 65535 + 1e-6)
    after = _alphas(page)
    assert not np.allclose(before, after)
    top = max(basm["attention"][other][1:])
    np.testing.assert_allclose(after, np.minimum(1, np.array(basm["attention"][other]) / top), atol=1 / 255 + 1e-3)  # scaled to the largest after token 0 (the browser keeps alpha in 8 bits)
    title = page.get_attribute("#circuit-tokens .tok[data-i='3']", "title")
    assert json.dumps(C.TOKENS[3]) in title and "(boundary)" in title and f"from {other}" in title
    assert page.locator("#circuit-head-edges tr").count() == 1 + len(C.SPANS)  # its input edges, one per span

    # an MLP has no attention: the shading stays; the circuit-only switch and the second graph
    page.click("#circuit-svg g.node[data-id='L0MLP']")
    assert "not a head" in page.inner_text("#circuit-head-title") and np.allclose(_alphas(page), after)
    page.check("#circuit-only")
    assert page.locator("#circuit-svg path.edge").count() == basm["meta"]["circuit_size"]
    page.select_option("#circuit-select", "1")
    assert "proc" in page.inner_text("#circuit-info") and "faithfulness —" in page.inner_text("#circuit-info")
    assert HOSTILE.strip() in page.inner_text("#circuit-tokens") and page.locator("script").count() == 2  # drawn as text
    page.click("button.tab[data-view=prompt]")
    assert "No prompt records" in page.inner_text("#tokens")
    assert not errors, errors
    context.close()
