"""The attribution analysis (seed 003 §2.1; its estimators: scoring/test_skill_masking.py): a planted two-skill case through the whole analysis (a stub scorer whose margin is a known
function of the skills a prompt shows), and resume without rescoring on a tiny random Qwen3."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probes.analyses import jobs, run_context
from probes.analyses.attribution import Attribution
from probes.data.dataset import load_dataset, resolve_dataset
from probes.data.retrieval import tools_in_text
from probes.reporting.results import ResultsConfigMismatch, load_results
from probes.reporting.layout import figures_folder, rows_path


FAST = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "split": "all"}
CHEAP_STATS = {"resamples": 200, "permutations": 20, "subsamples": 2, "simulations": 20}


# ---------------------------------------------------------------------------- through the analysis
SPLIT, HELPER = "retail.lookup_order", "retail.cancel_order"  # planted: a heterogeneous and a uniformly helpful skill


def planted_scorer(calls: list[str]):
    """A stub of the record scorer: margin = Σ over shown skills of their planted effect on the item
    (SPLIT: +2 on the T_ok items, −2 on the T_wrong ones; HELPER: +1 everywhere)."""
    def score(session, record, conditions=(), **_):
        calls.append(record.record_id)
        shown = {entry.skill_id for entry in record.skills}
        margin = (2.0 if record.bucket == "T_ok" else -2.0) * (SPLIT in shown) + 1.0 * (HELPER in shown)
        return [{"condition": "baseline", "margin": margin, "call_logodds": -margin, "correct_is_abstain": False}]
    return score


def test_planted_split_skill_is_heterogeneous_and_the_helper_uniform(tiny_qwen3_dir: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(jobs, "score_record", planted_scorer(calls))
    result = Attribution(model=tiny_qwen3_dir, out=tmp_path, domains=["retail"], buckets=["T_ok", "T_wrong"], limit=3, k_max=9,
                         masks=40, pools=["library"], figure=False, **CHEAP_STATS, **FAST).run(verbose=False)
    assert result.rows.groupby("bucket")["item_id"].nunique().to_dict() == {"T_ok": 3, "T_wrong": 3}
    # every included skill is shown (k = the library's size), so the margin is the planted sum
    stats = result.summary.skills.query("outcome == 'margin'").set_index("skill")
    split, helper = stats.loc[SPLIT], stats.loc[HELPER]
    assert abs(split["c_bar"]) < 0.6 and split["h_range"] > 3.2 and split["h_iqr"] > 3.2
    assert 0.6 < helper["c_bar"] < 1.4 and helper["h_range"] < 1.6 and helper["h_iqr"] < split["h_iqr"] / 3
    # the analysis's C against a hand computation from its own rows
    cells = result.summary.cells.query("outcome == 'margin'")
    masks = result.rows.attrs["meta"]["config"]["masks"]
    for cell in cells.itertuples():
        rows = result.rows[result.rows["item_id"] == cell.item_id].set_index("mask")["margin"]
        plus = [rows[m] for m in range(40) if cell.skill in masks[m]]
        minus = [rows[m] for m in range(40) if cell.skill not in masks[m]]
        assert cell.c == pytest.approx(np.mean(plus) - np.mean(minus), abs=1e-12)
    # the measured noise: the median over items of the margin's s.d. across masks
    sds = result.rows.groupby("item_id")["margin"].std(ddof=1)
    noise = result.summary.noise.set_index("outcome").loc["margin", "sigma"]
    assert noise == pytest.approx(float(np.median(sds)), abs=1e-12)
    # the planted check: C of each T_wrong item's tempting skill
    items = {item.id: item for item in load_dataset(resolve_dataset("basm_probe")).items}
    tempting = [cell.c for cell in cells.itertuples() if items[cell.item_id].bucket == "T_wrong"
                and cell.skill == items[cell.item_id].tempting_skill]
    got = result.summary.tempting.set_index("outcome").loc["margin"]
    assert got["n"] == len(tempting) > 0 and got["mean"] == pytest.approx(np.mean(tempting), abs=1e-12)


def test_masked_library_is_the_retrieval_rerun(tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library pool shows the top k of Eq. 8's ranking recomputed on the masked library; the topk
    pool shows the survivors of the full library's top k, in rank order."""
    monkeypatch.setattr(jobs, "score_record", planted_scorer([]))
    analysis = Attribution(model=tiny_qwen3_dir, out=tmp_path, item_ids=["retail-wrong-0001"], k_max=3, masks=6, figure=False,
                           **CHEAP_STATS, **FAST)
    result = analysis.run(verbose=False)
    ctx = run_context.open_context(analysis)
    item = ctx.items[0]
    masks = result.rows.attrs["meta"]["config"]["masks"]
    for row in result.rows.itertuples():
        library = [s for s in ctx.dataset.library_for(item) if s.id in masks[row.mask]]
        ranked = ctx.builder.retriever.rank(item.state_text, tools_in_text(item.state_text, ctx.dataset.catalog_for(item).names), library)
        top = [entry.skill.id for entry in ctx.builder.retrieve(item)[:3]]
        want = [e.skill.id for e in ranked[:3]] if row.pool == "library" else [s for s in top if s in masks[row.mask]]
        assert list(row.shown) == want and row.k == len(want)


def test_resume_scores_no_mask_twice(tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real run on the tiny model; rerun: nothing scored; a run killed mid-way (rows cut off):
    only the missing masks are scored and the rows come out the same; other masks refuse to resume."""
    options = dict(model=tiny_qwen3_dir, out=tmp_path, item_ids=["retail-wrong-0001"], k_max=2, masks=4, **CHEAP_STATS, **FAST)
    first = Attribution(**options).run(verbose=False)
    assert len(first.rows) == 8 and first.rows["margin"].notna().all()
    assert (figures_folder(tmp_path / tiny_qwen3_dir.name) / "fig13_attribution_matrix.png").is_file()
    calls: list[str] = []
    monkeypatch.setattr(jobs, "score_record", planted_scorer(calls))
    Attribution(**options, figure=False).run(verbose=False)
    assert calls == []
    path = rows_path(tmp_path / tiny_qwen3_dir.name, "attribution")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-3]))  # the last three rows lost
    monkeypatch.undo()
    counted: list[str] = []
    real = jobs.score_record
    monkeypatch.setattr(jobs, "score_record", lambda *a, **k: counted.append(a[1].record_id) or real(*a, **k))
    again = Attribution(**options, figure=False).run(verbose=False)
    lost = {json.loads(line)["key"] for line in lines[-3:]}
    assert 0 < len(counted) <= 3 and {f"{r}|" for r in counted} <= {key.rsplit("|", 1)[0] + "|" for key in lost}
    keep = ["key", "margin", "call_logodds"]
    pd.testing.assert_frame_equal(again.rows[keep].sort_values("key").reset_index(drop=True),
                                  first.rows[keep].sort_values("key").reset_index(drop=True), rtol=0, atol=0)
    with pytest.raises(ResultsConfigMismatch):
        Attribution(**{**options, "masks": 5}, figure=False).run(verbose=False)
    assert len(load_results(path)) == 8
