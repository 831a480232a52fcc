"""explore.html: what the page stores is checked against independent computations (the engine's
single-pass reference path, the recorded rows, numpy on the heads rows), then the page is opened in
a real headless Chromium from disk with the network off and read back from its DOM."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import probes
from probes.analyses import explore as E
from probes.analyses.run_context import AnalysisError
from probes.data.schema import BOUNDARY_SLOTS
from probes.engine.session import Knockout, span_positions
from probes.prompts.record import PromptRecord
from probes.reporting.finished import load
from probes.scoring.score import EPSILON
from tests.runs import open_page

RUN = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "split": "all"}


@pytest.fixture(scope="module")
def explored(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3_dir: Path):
    """A tiny run (sweep, knockout, heads on a 2-layer random Qwen3) and its page; the records rebuilt
    by the sweep's and the knockout's recorded options."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("explore")
    session = probes.ProbeSession(tiny_qwen3_dir)
    common = {**RUN, "model": tiny_qwen3_dir, "out": out}
    probes.run("sweep", session, limit=1, k_max=1, **common)  # Fig. 2 drawn: the run view embeds it
    probes.run("knockout", session, limit=1, k=1, random_draws=2, controls=["neutral"], figure=False, **common)  # draw 1: no attention stored
    probes.run("heads", session, limit=2, k=1, floor_from="given", causal=False, figure=False, **common)
    probes.run("suppression", session, limit=1, k=1, figure=False, **common)  # an analysis without a view of its own: its rows listed
    page = probes.explore(session, out=out, model=tiny_qwen3_dir)
    options = E.ExploreOptions(out=out, model=tiny_qwen3_dir)
    contexts = {name: E.run_context(load(page.parent, name), options, tiny_qwen3_dir, session) for name in ("sweep", "suppression", "knockout", "heads")}
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page.read_text(), re.S).group(1))
    items = {item.id: item for ctx in contexts.values() for item in ctx.items}

    def rebuild(rec: dict) -> PromptRecord:
        return contexts[rec["analysis"]].builder.build(items[rec["item"]], rec["config"], rec["k"], rec["format"])

    # the browser opens a copy: test_page_is_self_contained_and_capped rewrites the page in place
    copy = tmp_path_factory.mktemp("explore_page") / E.PAGE
    shutil.copyfile(page, copy)
    return {"page": copy, "dir": page.parent, "data": data, "session": session, "rebuild": rebuild, "out": out}


def weights(rec: dict) -> np.ndarray:
    return E.dequantise(rec["attention"], rec["scale"], "uint16", tuple(rec["shape"]))


def reference_row(session, record, rec: dict) -> tuple[np.ndarray, np.ndarray]:
    """The deciding row's attention [layer, head, n] and logits from the single-pass reference path
    (one sdpa forward, exact query rows), not the cached branching the page used."""
    correct = record.candidate("correct")
    ids = list(record.input_ids) + (list(correct.token_ids[: rec["deciding_depth"]]) if rec["deciding_depth"] else [])
    result = session.forward(ids, [rec["deciding_row"]], record_rows=True).conditions[0]
    return result.rows[:, :, 0, : record.n_tokens].numpy(), result.logits_at(rec["deciding_row"]).numpy()


def test_page_matches_independent_computations(explored):
    data, session = explored["data"], explored["session"]
    assert data["records"] and data["left_out"] == 0 and data["analyses"] == ["sweep", "suppression", "knockout", "heads"]
    sweep = load(explored["dir"], "sweep").rows.set_index(["record_id", "condition"])
    checked = 0
    for rec in data["records"]:
        record = explored["rebuild"](rec)
        assert "".join(rec["tokens"]) == record.text and len(rec["tokens"]) == record.n_tokens
        attention, logits = reference_row(session, record, rec)
        # uint16 quantisation: half a step, plus fp32 noise between the two engine paths
        np.testing.assert_allclose(weights(rec), attention, atol=0.5 / 65535 + 1e-5, rtol=0)
        for cand in rec["candidates"]:
            ref = next(c for c in record.candidates if (c.role, c.action) == (cand["role"], cand["action"]))
            if cand["token"] is not None:
                assert cand["token"] == ref.token_ids[rec["deciding_depth"]]
                assert abs(cand["logit"] - logits[cand["token"]]) < 1e-4
        # the recorded tool-choice margin (Eq. 1 over the tools, read where the names diverge: with one wrong
        # tool, the deciding row) from the page's logits at that row
        if (rec["id"], "baseline") not in sweep.index:
            continue
        row = sweep.loc[(rec["id"], "baseline")]
        by_role = pd.DataFrame(rec["candidates"])
        if np.isfinite(row["margin_tool_choice"]) and (by_role["role"] == "wrong").sum() == 1:
            wrong, correct = (by_role.loc[by_role["role"] == r, "logit"].iloc[0] for r in ("wrong", "correct"))
            assert abs((wrong - correct) - row["margin_tool_choice"]) < 1e-4
            assert rec["margins"]["margin"] == pytest.approx(row["margin_tool_choice"], abs=1e-12) and rec["margin_variant"] == "tool_choice"
            checked += 1
    assert checked, "no record with a first-token margin to check"


def test_knockouts_reproduce_their_delta(explored):
    """The positions the page draws as blocked, knocked out again by ProbeSession.score, give the Δm
    the page shows (and the knockout rows hold)."""
    knocked = [r for r in explored["data"]["records"] if r["knockouts"]]
    assert knocked
    rec = knocked[0]
    record = explored["rebuild"](rec)
    shown = {k["name"]: k for k in rec["knockouts"]}
    assert set(span_positions(record.spans["boundary"])) == set(shown["boundary"]["positions"])
    names = [n for n in shown if n in ("boundary", "procedure") or n.startswith("random_")]
    rows = explored["session"].score(record, knockouts=[Knockout(n, tuple(shown[n]["positions"])) for n in names]).set_index("condition")
    for name in names:
        delta = rows.loc[name, "margin"] - rows.loc["baseline", "margin"]
        if np.isfinite(delta):
            assert abs(delta - shown[name]["delta"]) < 1e-4, name


def test_heads_grid_is_the_log2_ratio_of_mean_alphas(explored):
    rows = load(explored["dir"], "heads").rows
    used = rows[(rows["bucket"] == "T_wrong") & (rows["boundary_size"] > 0) & (rows["procedure_size"] > 0)]
    b, p = (np.array(used[f"alpha_{s}_heads"].tolist()).mean(0) for s in ("boundary", "procedure"))
    np.testing.assert_allclose(np.array(explored["data"]["heads_view"]["log2"], dtype=float), np.log2((b + EPSILON) / (p + EPSILON)),
                               atol=1e-9)
    assert explored["data"]["heads_view"]["log2_n"] == used["item_id"].nunique()


def test_page_is_self_contained_and_capped(explored, capsys):
    page = explored["page"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page) and "<link" not in page and "@import" not in page
    assert explored["data"]["figures"] and explored["data"]["figures"][0]["uri"].startswith("data:image/png;base64,")
    # a cap that holds one record: the rest are left out, and both the page and the console say so
    records = explored["data"]["records"]
    size = [len(json.dumps(r, separators=(",", ":")).encode()) for r in records]
    around = explored["page"].stat().st_size - sum(size)  # the page around the records
    cap = around + size[0] + 2000
    assert cap < around + size[0] + min(size[1:])  # no room for a second record
    small = probes.explore(explored["session"], out=explored["out"], model=explored["data"]["model"], max_mb=cap / 1e6)
    assert "left out" in capsys.readouterr().out and small.stat().st_size <= cap
    data = json.loads(re.search(r'id="data">(.*?)</script>', small.read_text(), re.S).group(1))
    assert [r["id"] for r in data["records"]] == [records[0]["id"]] and data["left_out"] == data["records_total"] - 1
    # uint8 storage: within half a step of the weights
    w = weights(records[0])
    np.testing.assert_allclose(E.dequantise(*E.quantise(w, "uint8"), "uint8", w.shape), w, atol=0.5 / 255 + 1e-12, rtol=0)
    with pytest.raises(AnalysisError, match="no results"):
        probes.explore(explored["session"], out=explored["out"] / "empty", model=explored["data"]["model"])


# ----------------------------------------------------------------------------- in a real browser
def dom_weights(page) -> np.ndarray:
    return np.array(page.eval_on_selector_all("#tokens .tok", "els => els.map(e => Number(e.dataset.w))"))


def dom_positions(page, selector: str) -> set[int]:
    return set(page.eval_on_selector_all(f"#tokens .tok{selector}", "els => els.map(e => Number(e.dataset.i))"))


def test_in_a_headless_browser(explored, browser, tmp_path_factory):
    shots = tmp_path_factory.mktemp("explore_screenshots")
    context, page, errors = open_page(browser, explored["page"])
    data = explored["data"]

    # spans, slots and query rows sit on exactly the record's tokens
    for index in range(min(3, len(data["records"]))):
        page.select_option("#record-select", str(index))
        rec = data["records"][index]
        record = explored["rebuild"](rec)
        assert page.get_attribute("#tokens", "data-record") == record.record_id
        for name in ("procedure", "boundary"):
            assert dom_positions(page, f".sp-{name}") == set(span_positions(record.spans.get(name, []))), name
        for slot in BOUNDARY_SLOTS:
            assert dom_positions(page, f".slot-{slot}") == set(span_positions(record.spans.get(slot, []))), slot
        assert dom_positions(page, ".query") == {q for q in record.query_rows if q < record.n_tokens}
        # the head selector shades by that head's recorded values; the means are over the raw rows
        raw = reference_row(explored["session"], record, rec)[0]
        stored = weights(rec)
        for choice, pick in (("mean", lambda a: a.mean((0, 1))), ("L1", lambda a: a[1].mean(0)), ("L1H2", lambda a: a[1, 2]),
                             ("L0H3", lambda a: a[0, 3])):
            page.select_option("#head-select", choice)
            assert page.get_attribute("#tokens", "data-head") == choice
            np.testing.assert_allclose(dom_weights(page), pick(raw), atol=1e-3, rtol=0)  # the rows, after quantisation
            np.testing.assert_allclose(dom_weights(page), pick(stored), atol=1e-6, rtol=0)  # what the page stores, as drawn
    page.screenshot(path=str(shots / "prompt.png"))

    # heads view: hover shows value and n; clicking a head switches the prompt view to it
    page.click("button.tab[data-view=heads]")
    page.screenshot(path=str(shots / "heads.png"))
    cell = "#grid-log2 td.cell[data-layer='0'][data-head='1']"
    page.hover(cell)
    value = data["heads_view"]["log2"][0][1]
    assert f"{value:.4f}" in page.inner_text("#hover-info") and f"n = {data['heads_view']['log2_n']}" in page.inner_text("#hover-info")
    shown = page.get_attribute("#tokens", "data-record")
    page.click(cell)
    assert page.is_visible("#view-prompt") and not page.is_visible("#view-heads")
    assert page.input_value("#head-select") == "L0H1" and page.get_attribute("#tokens", "data-head") == "L0H1"
    rec = next(r for r in data["records"] if r["id"] == shown)
    np.testing.assert_allclose(dom_weights(page), weights(rec)[0, 1], atol=1e-5, rtol=0)

    # run view: a Fig. 6 cell lists its records; an item opens its prompt with that knockout's positions drawn
    page.click("button.tab[data-view=run]")
    page.screenshot(path=str(shots / "run.png"), full_page=True)
    page.click("#fig6 td.clickable[data-row='boundary'][data-col='T_wrong']")
    link = page.locator("#item-list a").first
    record_id = link.get_attribute("data-record")
    link.click()
    assert page.get_attribute("#tokens", "data-record") == record_id and page.input_value("#knockout-select") == "boundary"
    rec = next(r for r in data["records"] if r["id"] == record_id)
    assert dom_positions(page, ".blocked") == set(next(k for k in rec["knockouts"] if k["name"] == "boundary")["positions"])
    # and a Fig. 2 cell: configuration and k → items → the prompt view of that record
    page.click("button.tab[data-view=run]")
    page.click("#fig2 td.clickable[data-row='basm'][data-col='1']")
    link = page.locator("#item-list a").first
    record_id = link.get_attribute("data-record")
    assert record_id.split("|")[1:3] == ["basm", "k1"]
    link.click()
    assert page.get_attribute("#tokens", "data-record") == record_id and page.is_visible("#view-prompt")
    assert not errors, errors
    for name in ("prompt", "heads", "run"):
        assert (shots / f"{name}.png").stat().st_size > 10_000
    print(f"screenshots: {shots}")
    context.close()


def test_chromium_is_found_on_the_path_or_by_playwright_and_else_the_reason_names_how_to_get_one(monkeypatch, tmp_path):
    found = tmp_path / "bin" / "chromium-browser"  # Ubuntu's name, in a folder of the PATH
    found.parent.mkdir()
    found.write_text("#!/bin/sh\n")
    found.chmod(0o755)
    monkeypatch.setenv("PATH", str(found.parent))
    assert E.system_chromium() == str(found)
    monkeypatch.setattr(E, "playwright_chromium", lambda: None)
    assert E.browser_missing() == ""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert E.system_chromium() is None
    reason = E.browser_missing()
    assert "chromium, chromium-browser, google-chrome" in reason and "python -m playwright install chromium" in reason
    with pytest.raises(AnalysisError, match="playwright install chromium"):
        E.screenshot_views(tmp_path / E.PAGE, tmp_path)
    monkeypatch.setattr(E, "playwright_chromium", lambda: "/opt/ms-playwright/chromium/chrome")  # Playwright's own
    assert E.browser_missing() == ""


def test_the_command_line_flags_are_the_options():
    from probes.cli.main import build_parser
    from probes.cli.flags import options_from_args

    args = build_parser("explore").parse_args(["explore", "--out", "r", "--records", "3", "--precision", "uint8", "--max-mb", "5"])
    options = E.ExploreOptions(**options_from_args(args, E.ExploreOptions))
    assert (str(options.out), options.records, options.precision, options.max_mb, options.screenshots) == ("r", 3, "uint8", 5.0, None)
    with pytest.raises(probes.analyses.option_system.OptionError, match="precision"):
        E.ExploreOptions(precision="float8")


# ----------------------------------------------------------------------------- issue 45: the explorer a CircuitsVis user expects
def test_candidates_are_sorted_with_probabilities_and_flags(explored):
    reordered = 0  # records whose candidates the sort moved (the record lists the correct one first)
    for rec in explored["data"]["records"]:
        record = explored["rebuild"](rec)
        reordered += [c["action"] for c in rec["candidates"]] != [c.action for c in record.candidates]
        _, logits = reference_row(explored["session"], record, rec)
        cands = rec["candidates"]
        scored = [c["logit"] for c in cands if c["logit"] is not None]
        assert scored == sorted(scored, reverse=True) and all(c["logit"] is None for c in cands[len(scored):])
        assert [c["chosen"] for c in cands] == [i == 0 for i in range(len(cands))]
        assert [c["correct"] for c in cands] == [c["role"] == "correct" for c in cands]
        log_z = np.log(np.exp(logits.astype(np.float64) - logits.max()).sum()) + logits.max()
        for c in cands[: len(scored)]:
            assert c["prob"] == pytest.approx(np.exp(logits[c["token"]] - log_z), rel=1e-4)
    assert reordered


def test_each_knockout_shows_its_candidates_and_attention_after_it(explored):
    """The candidates after a knockout give the wrong-tool margin the knockout rows recorded for it; the stored
    attention after the boundary knockout is the single-pass reference's under the same knockout."""
    rows = load(explored["dir"], "knockout").rows.set_index(["record_id", "condition"])
    rec = next(r for r in explored["data"]["records"] if r["knockouts"])
    record = explored["rebuild"](rec)
    assert {k["control"] for k in rec["knockouts"]} >= {"boundary", "random", "procedure"}
    assert all(not k["name"].startswith(("random_", "bsub_", "psub_", "mass_")) or k["control"] != k["name"] for k in rec["knockouts"])
    checked = 0
    for k in rec["knockouts"]:
        assert (k["attention"] is not None) == (k["draw"] <= 0), k["name"]  # named knockouts and draw 0 of each control
        by_role = pd.DataFrame(k["candidates"])
        recorded = rows.loc[(rec["id"], k["name"]), "margin_tool_choice"]
        if np.isfinite(recorded) and (by_role["role"] == "wrong").sum() == 1:
            wrong, correct = (by_role.loc[by_role["role"] == r, "logit"].iloc[0] for r in ("wrong", "correct"))
            assert abs((wrong - correct) - recorded) < 1e-4, k["name"]
            checked += 1
    assert checked
    boundary = next(k for k in rec["knockouts"] if k["name"] == "boundary")
    knockout = Knockout("boundary", tuple(boundary["positions"]))
    # the rows the knockout analysis blocks (--knockout-rows path): the tool call's, through the deciding row inside the correct name
    correct = record.candidate("correct")
    ids = list(record.input_ids) + list(correct.token_ids[: rec["deciding_depth"]])
    rows_blocked = sorted(set(record.query_rows) | set(range(record.decision_index, rec["deciding_row"] + 1)))
    result = explored["session"].forward(ids, rows_blocked, conditions=[knockout], record_rows=True)
    reference = result.conditions[1].rows[:, :, -1, : record.n_tokens].numpy()
    after = E.dequantise(boundary["attention"], rec["scale"], "uint16", tuple(rec["shape"]))
    np.testing.assert_allclose(after, reference, atol=0.5 / 65535 + 1e-5, rtol=0)
    assert np.abs(after - weights(rec)).max() > 1e-3  # the knockout moved it


def test_the_pattern_is_the_attention_of_the_prompts_last_rows(explored):
    data = explored["data"]
    with_pattern = [r for r in data["records"] if r["pattern"]]
    assert [r["id"] for r in with_pattern] == [r["id"] for r in data["records"][: E.DEFAULT_PATTERN_RECORDS]]
    rec = with_pattern[0]
    record = explored["rebuild"](rec)
    rows = rec["pattern"]["rows"]
    assert rows == list(range(record.n_tokens - E.DEFAULT_PATTERN_ROWS, record.n_tokens))
    L, H, n = rec["shape"]
    stored = E.dequantise(rec["pattern"]["attention"], rec["scale"], "uint16", (L, H, len(rows), n))
    reference = explored["session"].forward(list(record.input_ids), rows, record_rows=True).conditions[0].rows[..., :n].numpy()
    np.testing.assert_allclose(stored, reference, atol=0.5 / 65535 + 1e-5, rtol=0)


def test_the_rows_of_an_analysis_without_a_view_are_listed_with_the_record(explored):
    suppression = load(explored["dir"], "suppression").rows
    rec = next(r for r in explored["data"]["records"] if "suppression" in r["analyses"])
    table = rec["analyses"]["suppression"]
    mine = suppression[suppression["record_id"] == rec["id"]]
    assert len(table["rows"]) == len(mine) and table["left_out"] == 0 and not set(E.IDENTITY) & set(table["columns"])
    listed = dict(zip(table["columns"], table["rows"][0]))
    assert listed["condition"] == mine["condition"].iloc[0] and listed["margin"] == pytest.approx(mine["margin"].iloc[0], abs=1e-12)
    assert set(suppression["record_id"]) <= {r["id"] for r in explored["data"]["records"]}


def in_view(page, selector: str, box: str) -> bool:
    """Whether ``selector``'s element lies inside ``box``'s visible area and the window's."""
    return page.evaluate("""([sel, box]) => { const e = document.querySelector(sel).getBoundingClientRect();
        const b = document.querySelector(box).getBoundingClientRect();
        return e.top >= b.top && e.bottom <= b.bottom && e.top >= 0 && e.bottom <= window.innerHeight; }""", [selector, box])


def dom_candidates(page, table: str = "#candidates") -> list[dict]:
    return page.eval_on_selector_all(f"{table} tr[data-action]", """els => els.map(e => ({action: e.dataset.action, role: e.dataset.role,
        logit: e.dataset.logit === "" ? null : Number(e.dataset.logit), chosen: e.classList.contains("chosen"),
        correct: e.classList.contains("correct"), flags: e.lastChild.textContent}))""")


def test_the_explorer_opens_at_the_decision_with_legends_knockouts_search_compare_and_a_shareable_address(explored, browser, tmp_path):
    data = explored["data"]
    context, page, errors = open_page(browser, explored["page"])
    first = data["records"][0]
    assert page.get_attribute("#tokens", "data-record") == first["id"] and first["knockouts"]  # a knocked record first
    # opens at the deciding row, and the overview strip holds the whole prompt with its spans
    assert in_view(page, "#tokens .tok.deciding", "#tokens")
    assert page.is_visible("#overview")
    # a colour legend with numbers, the normalisation stated; token text in the tooltips
    top = float(page.get_attribute("#colour-legend", "data-top"))
    assert top > 0 and "normalised per view" in page.inner_text("#colour-legend")
    assert re.search(r"\d\.\d", page.inner_text("#colour-legend .scale-ticks"))
    i = first["query_rows"][0]
    assert page.get_attribute(f"#tokens .tok[data-i='{i}']", "title").startswith(f"token {i} {json.dumps(first['tokens'][i])}: attention ")
    # jump to B, then back to the deciding row
    page.click("#jump button[data-jump=boundary]")
    assert in_view(page, f"#tokens .tok[data-i='{first['spans']['boundary'][0][0]}']", "#tokens")
    page.click("#jump button[data-jump=deciding]")
    assert in_view(page, "#tokens .tok.deciding", "#tokens")
    # candidates sorted, the chosen (first) and the correct one flagged
    shown = dom_candidates(page)
    assert [c["action"] for c in shown] == [c["action"] for c in first["candidates"]]
    assert shown[0]["chosen"] and "chosen" in shown[0]["flags"] and sum(c["chosen"] for c in shown) == 1
    assert [c["correct"] for c in shown] == [c["role"] == "correct" for c in shown] and any("correct" in c["flags"] for c in shown)
    # the picker names the knockouts as the tables do; a knockout changes the candidates and the shading
    groups = page.eval_on_selector_all("#knockout-select optgroup", "els => els.map(e => e.label)")
    assert groups[0] == "boundary" and "random" in groups and not any(g.startswith(("random_", "bsub_")) for g in groups)
    before = dom_weights(page)
    page.select_option("#knockout-select", "boundary")
    boundary = next(k for k in first["knockouts"] if k["name"] == "boundary")
    after = E.dequantise(boundary["attention"], first["scale"], "uint16", tuple(first["shape"])).mean((0, 1))
    np.testing.assert_allclose(dom_weights(page), after, atol=1e-6, rtol=0)
    assert np.abs(dom_weights(page) - before).max() > 1e-4
    assert [c["logit"] for c in dom_candidates(page)] == pytest.approx([c["logit"] for c in boundary["candidates"]], abs=1e-9)
    assert dom_positions(page, ".blocked") == set(boundary["positions"])
    # the view state in the address: a fresh page opened at it shows the same view
    page.select_option("#head-select", "L1H2")
    address = page.url
    assert "knockout=boundary" in address and "head=L1H2" in address
    again = context.new_page()
    again.goto(address)
    assert (again.get_attribute("#tokens", "data-record"), again.input_value("#head-select"), again.input_value("#knockout-select")) == \
        (first["id"], "L1H2", "boundary")
    np.testing.assert_allclose(dom_weights(again), dom_weights(page), atol=0, rtol=0)
    page.select_option("#record-select", "1")
    page.select_option("#scale-select", "max")
    again.goto(page.url)  # another record and colour scale: a shared address reopens them
    assert (again.get_attribute("#tokens", "data-record"), again.input_value("#scale-select")) == (data["records"][1]["id"], "max")
    assert again.get_attribute("#colour-legend", "data-top") == page.get_attribute("#colour-legend", "data-top")
    again.close()
    # search: an item's id finds its record
    other = next(r for r in data["records"] if r["item"] != first["item"])
    page.fill("#record-search", other["item"])
    assert page.get_attribute("#tokens", "data-record").split("|")[0] == other["item"]
    assert f"of {len(data['records'])} records" in page.inner_text("#search-count")
    page.fill("#record-search", "")
    # Proc. Skill and BASM of the same item side by side, each at its deciding row
    page.select_option("#record-select", "0")
    page.click("button.tab[data-view=compare]")
    ids = [page.get_attribute(f"#pane-{c} .pane-tokens", "data-record") for c in ("proc", "basm")]
    assert [i.split("|")[:3] for i in ids] == [[first["item"], c, f"k{first['k']}"] for c in ("proc", "basm")]
    assert in_view(page, "#pane-basm .pane-tokens .tok.deciding", "#pane-basm .pane-tokens")
    assert "view=compare" in page.url
    # the token × token pattern of a chosen head
    page.click("button.tab[data-view=pattern]")
    page.select_option("#pattern-head", "L0H1")
    assert page.get_attribute("#pattern-canvas", "data-head") == "L0H1" and float(page.get_attribute("#pattern-canvas", "data-top")) > 0
    # the heads grids have their legends
    page.click("button.tab[data-view=heads]")
    assert float(page.get_attribute("#legend-log2", "data-top")) > 0 and page.is_visible("#legend-shift .scale-bar")
    # at 900 px the side panel wraps under the prompt: the candidates table is not cut
    page.set_viewport_size({"width": 900, "height": 900})
    page.click("button.tab[data-view=prompt]")
    box = page.locator("#candidates").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 900
    assert not errors, errors
    context.close()
    if folder := os.environ.get("BASM_PROBES_SCREENSHOTS"):  # the screenshots of docs/explore: BASM_PROBES_SCREENSHOTS=docs/explore
        print("screenshots:", E.screenshot_views(explored["page"], Path(folder), browser=browser))
