"""explore.html's steer view (issue #44 item 6): for a steered record, the clean run's top action and margins next to
the headline cell (applicability at steer.HEADLINE_ALPHA, decision rows) and the best and the worst random draw at the
same layer and α, read from the steer rows (no recomputation); in a real headless Chromium the table shows them, with
no console error. One small steer run on the organism (one layer, 3 random draws, BASM, figures off)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import torch

from probes.analyses import explore as E
from probes.analyses import steer
from probes.analyses.run_context import AnalysisError, model_label
from probes.reporting.layout import rows_path
from probes.analyses.steer import Steer
from probes.facade import ProbeSession
from probes.organism import ORGANISM_DIR
from probes.reporting.results import load_results
from tests.runs import open_page

ALPHAS = (str(steer.HEADLINE_ALPHA), str(-steer.HEADLINE_ALPHA))
KINDS = ["clean", "headline", "best random", "worst random"]


@pytest.fixture(scope="module")
def steered(tmp_path_factory):
    """The organism steered at layer 1 (2 items per bucket: one train and one held-out task group) and its page."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("explore_steer")
    session = ProbeSession(ORGANISM_DIR)
    Steer(out=out, limit=2, layers=("1",), alphas=ALPHAS, random_draws=3, rows_modes=("decision",), directions=("applicability",),
          configs=("basm",), k=2, embedder="lexical", figure=False).run(session, verbose=False)
    page = E.write_explore(E.ExploreOptions(out=out, model=str(ORGANISM_DIR)), session)
    rows = load_results(rows_path(out / model_label(str(ORGANISM_DIR)), "steer"))
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page.read_text(), re.S).group(1))
    return {"page": page, "rows": rows, "data": data}


def test_the_view_lists_the_rows_clean_headline_and_the_extreme_random_draws(steered):
    rows, records = steered["rows"], steered["data"]["records"]
    assert records and {r["id"] for r in records} == set(rows["record_id"])  # every held-out record is shown, each steered
    for record in records:
        mine = rows[rows["record_id"] == record["id"]]
        clean = mine[mine["condition"] == "baseline"].iloc[0]
        at = mine[(mine["alpha"] == steer.HEADLINE_ALPHA) & (mine["rows_mode"] == "decision")]
        draws = at[at["direction"] == "random"]
        expected = [clean, at[at["direction"] == "applicability"].iloc[0], draws.loc[draws["margin"].idxmin()],
                    draws.loc[draws["margin"].idxmax()]]
        view = record["steer"]["rows"]
        assert [v["kind"] for v in view] == KINDS and [v["condition"] for v in view] == [r["condition"] for r in expected]
        for v, r in zip(view, expected):
            assert (v["top_action"], v["top_role"]) == (r["top_action"], r["top_role"])
            assert v["margin"] == pytest.approx(r["margin"]) and v["delta"] == pytest.approx(r["margin"] - clean["margin"])
            assert v["kl_clean"] == pytest.approx(r["kl_clean"]) and v["margin_path"] == pytest.approx(r["margin_path"])
        assert view[0]["delta"] == 0 and view[0]["kl_clean"] == 0 and view[1]["layers"] == "L1"
        assert "(3 draws)" in record["steer"]["note"]


def test_unsteered_other_alphas_and_damaged_rows(steered):
    rows = steered["rows"]
    record_id = rows["record_id"].iloc[0]
    assert E.steer_view(rows, "retail-wrong-9999|basm|k2|native") is None  # not steered: no view
    other = rows[(rows["record_id"] == record_id) & (rows["alpha"] != steer.HEADLINE_ALPHA)]  # only α = −0.5 and the clean run
    view = E.steer_view(other, record_id)
    assert [v["kind"] for v in view["rows"]] == ["clean"] and "at no condition with α = 0.5" in view["note"]
    twice = pd.concat([rows, rows[(rows["record_id"] == record_id) & (rows["condition"] == "baseline")]])
    with pytest.raises(AnalysisError, match=rf"steer rows of {re.escape(record_id)}: 2 clean \(baseline\) rows, expected 1.*--overwrite"):
        E.steer_view(twice, record_id)


def test_the_steer_table_in_a_headless_browser(steered, browser):
    context, page, errors = open_page(browser, steered["page"], timeout_ms=5000)
    for i, record in enumerate(steered["data"]["records"]):
        page.select_option("#record-select", str(i))
        view = record["steer"]["rows"]
        cells = page.eval_on_selector_all("#steer tr[data-kind]", "trs => trs.map(tr => [tr.dataset.kind, tr.dataset.flipped, "
                                                                  "...[...tr.cells].map(c => c.textContent)])")
        assert [c[0] for c in cells] == KINDS
        for c, v in zip(cells, view):
            assert c[2:7] == [v["kind"], v["layers"], v["top_action"], v["top_role"], f"{v['margin']:.3f}"]
            assert c[1] == str(v["top_action"] != view[0]["top_action"]).lower()
        assert page.text_content("#steer-note") == record["steer"]["note"]
    assert errors == []
    context.close()
