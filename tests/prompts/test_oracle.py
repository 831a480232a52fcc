"""Retrieval that shows the skill a bucket is defined by (issue 27, item 3): the oracle order
(``--retrieval oracle --oracle-rank R``), the per-row "defining skill shown" flag checked by hand
against the Eq. 8 ranking, and the all / shown / not shown split of the sweep and knockout summaries."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import probes
from probes.analyses.option_system import OptionError
from probes.analyses.knockout import KnockoutAnalysis, summarise_rows
from probes.data.retrieval import Retriever, ScoredSkill, make_embedder, oracle_order
from probes.data.schema import Skill
from probes.prompts.builder import make_builder
from probes.prompts.record import PromptRecord
from probes.prompts.spans import SpanReport, check_spans
from probes.scoring.stats import by_shown, summarise

V1 = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "split": "all"}


def _skill(name: str) -> ScoredSkill:
    return ScoredSkill(Skill(name, "g", ("p",), (), (), ("r",), ("a",), ()), 0.0, 0.0, 0.0, 0.0)


def test_oracle_order_moves_only_the_defining_skill() -> None:
    ranked = [_skill(name) for name in "abcd"]
    ids = lambda order: "".join(entry.skill.id for entry in order)  # noqa: E731
    assert [ids(oracle_order(ranked, "c", r)) for r in (1, 2, 3, 4, 5)] == ["cabd", "acbd", "abcd", "abdc", "abdc"]
    assert ids(oracle_order(ranked, "a", 3)) == "bcad"
    with pytest.raises(ValueError, match="'z' is not among the 4 skills"):
        oracle_order(ranked, "z", 1)
    with pytest.raises(ValueError, match="oracle rank must be >= 1"):
        oracle_order(ranked, "a", 0)


@pytest.fixture(scope="module")
def ranked_retriever(v1_dataset) -> Retriever:
    return Retriever(make_embedder("lexical"))


def _items_off_first(dataset, retriever: Retriever, n: int) -> list:
    """T_wrong / T_ok items whose defining skill Eq. 8 does not rank first (the oracle moves it), and one it does."""
    off, first = [], []
    for item in dataset.select(buckets=["T_wrong", "T_ok"]):
        rank = [entry.skill.id for entry in retriever.retrieve(item, dataset)].index(item.tempting_skill) + 1
        (first if rank == 1 else off).append(item)
        if len(off) >= n and first:
            return off[:n] + first[:1]
    raise AssertionError("the dataset no longer has items on both sides; pick another set")


def test_oracle_places_the_defining_skill_at_rank_r_and_spans_round_trip(qwen3_tokenizer, v1_dataset, ranked_retriever) -> None:
    items = _items_off_first(v1_dataset, ranked_retriever, 1)
    report = SpanReport()
    for rank, depths in ((1, (2,)), (2, (1, 2, 3))):  # k < R, k = R, k > R
        builder = make_builder(qwen3_tokenizer, v1_dataset, embedder=ranked_retriever, retrieval="oracle", oracle_rank=rank)
        for item in items:
            # by hand: the Eq. 8 ranking, the defining skill taken out and put back at rank R
            ranked = [entry.skill.id for entry in ranked_retriever.retrieve(item, v1_dataset)]
            others = [skill for skill in ranked if skill != item.tempting_skill]
            for k in depths:
                record = builder.build(item, "basm", k)
                shown = [skill.skill_id for skill in record.skills]
                if k >= rank:
                    assert shown[rank - 1] == item.tempting_skill and record.tempting_shown_rank == rank
                    assert shown[: rank - 1] + shown[rank:] == others[: k - 1]
                else:  # k < R: the first k of the oracle order, which do not hold it
                    assert shown == others[:k] and record.tempting_shown_rank is None and not record.tempting_shown
                assert record.tempting_rank == ranked.index(item.tempting_skill) + 1  # Eq. 8's own rank, whatever the mode
                assert record.retrieval["mode"] == record.retrieval_mode == f"oracle@{rank}"
                assert builder.build(item, "base", k).tempting_shown_rank == record.tempting_shown_rank  # Base pairs with it
                assert PromptRecord.from_json(record.to_json()).to_json() == record.to_json()
                for skill in record.skills:
                    for slot in skill.slots.values():
                        assert record.text[slot.char_span[0]: slot.char_span[1]] == slot.text
                check_spans(record, qwen3_tokenizer, report)
    assert not report.mismatches and report.exact + report.whitespace_edges > 0


def test_shown_flag_matches_a_hand_check_of_the_ranking(qwen3_tokenizer, bfcl_dataset) -> None:
    """Ranked retrieval on BFCL (where the defining skill is often not first): the record's flag and
    rank against the top k of the Eq. 8 ranking, computed separately."""
    retriever = Retriever(make_embedder("lexical"))
    builder = make_builder(qwen3_tokenizer, bfcl_dataset, embedder=retriever)
    hand = Retriever(make_embedder("lexical"))  # its own cache: nothing shared with the builder's
    items = bfcl_dataset.select(buckets=["T_ok", "T_wrong"], limit_per_bucket=6, spread=True)
    seen = set()
    for item in items:
        ranked = [entry.skill.id for entry in hand.retrieve(item, bfcl_dataset)]
        for k in (0, 1, 2):
            record = builder.build(item, "proc", k)
            top = ranked[:k]
            expected = top.index(item.tempting_skill) + 1 if item.tempting_skill in top else None
            assert (record.tempting_shown_rank, record.tempting_shown) == (expected, expected is not None), (item.id, k)
            assert record.retrieval_mode == "ranked" and [s.skill_id for s in record.skills] == top
            seen.add(record.tempting_shown)
    assert seen == {True, False}  # both sides of the split occur


def _group_mean(frame: pd.DataFrame, value: str) -> float:
    finite = frame[np.isfinite(frame[value].astype(float))]
    return float(finite.groupby("task_group")[value].mean().mean())


def test_sweep_oracle_run_records_the_mode_and_its_split_adds_up(tiny_qwen3_dir: Path, tmp_path: Path, v1_dataset) -> None:
    session = probes.ProbeSession(tiny_qwen3_dir)
    with pytest.raises(OptionError, match="oracle_rank .* exceeds the run's retrieval depth 1"):
        probes.run("sweep", session, retrieval="oracle", oracle_rank=2, k_max=1, out=tmp_path, **V1)
    result = probes.run("sweep", session, retrieval="oracle", oracle_rank=2, k_max=2, limit=2, configs=["base", "proc"],
                        figure=False, out=tmp_path, **V1)
    rows, meta = result.rows, result.rows.attrs["meta"]["config"]
    assert meta["builder"]["retrieval"] == "oracle@2" and meta["options"]["retrieval"] == "oracle" and meta["options"]["oracle_rank"] == 2
    assert (rows["retrieval_mode"] == "oracle@2").all()
    # the oracle puts the defining skill at rank 2: shown from k = 2 on, never before
    assert rows.groupby("k")["tempting_shown"].agg(set).to_dict() == {0: {False}, 1: {False}, 2: {True}}
    assert (rows.loc[rows["k"] == 2, "tempting_shown_rank"] == 2).all()
    table = result.summary.shown.set_index(["shown", "bucket", "config", "k"])
    for (bucket, config, k), cell in table.loc["all"].iterrows():
        parts = {group: table.loc[(group, bucket, config, k)] for group in ("shown", "not shown") if (group, bucket, config, k) in table.index}
        assert cell["n_items"] == sum(part["n_items"] for part in parts.values())
        assert cell["n_nan"] == sum(part["n_nan"] for part in parts.values())
        chosen = rows[(rows["bucket"] == bucket) & (rows["config"] == config) & (rows["k"] == k)]
        assert cell["value"] == pytest.approx(_group_mean(chosen, "margin"), abs=1e-9)
        for group, part in parts.items():
            sub = chosen[chosen["tempting_shown"] == (group == "shown")]
            assert part["value"] == pytest.approx(_group_mean(sub, "margin"), abs=1e-9)
    diff = result.summary.differences_shown.set_index(["shown", "bucket", "contrast", "k"])
    trap = diff.loc[("shown", "T_wrong", "trap", 2)]
    wide = rows[(rows["bucket"] == "T_wrong") & (rows["k"] == 2)].pivot_table(index=["item_id", "task_group"], columns="config",
                                                                            values="margin").reset_index()
    assert trap["value"] == pytest.approx(_group_mean(wide.assign(delta=wide["proc"] - wide["base"]), "delta"), abs=1e-9)
    assert {"sweep_shown", "sweep_differences_shown"} <= set(result.tables)
    assert any(c.family == "sweep (defining skill shown)" for c in result.analysis.claims(result.summary))
    section = result.analysis.section(SimpleNamespace(variant="tool_choice"), result.summary, [])
    shown_proc = next(c for c in section.comparisons if c.quantity == "Fig. 2: Proc. Skill at k = 2, T_wrong, defining skill shown")
    assert shown_proc.ours == pytest.approx(table.loc[("shown", "T_wrong", "proc", 2), "value"], abs=1e-12)
    assert "`sweep_differences_shown.csv`" in section.markdown
    # the notebook facade takes the same option
    item = _items_off_first(v1_dataset, Retriever(make_embedder("lexical")), 1)[0]
    record = session.prompt(item.id, dataset="basm_probe", embedder="lexical", relevance="lexical", k=2, retrieval="oracle", oracle_rank=1)
    assert record.skills[0].skill_id == item.tempting_skill and record.tempting_shown_rank == 1 and record.tempting_rank > 1


def _knockout_rows(seed: int = 0) -> pd.DataFrame:
    """Knockout rows of 8 task groups × 2 records, the first record of each group with its defining skill shown."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(8):
        for r in range(2):
            item = f"i{g}{r}"
            common = {"item_id": item, "bucket": "T_wrong", "task_group": f"g{g}", "tempting_shown": r == 0, "boundary_size": 4,
                      "correct_is_abstain": False, "correct_margin": 0.0, "call_logodds": 0.0}
            proc = rng.normal(2.0, 0.3)
            rows.append({**common, "record_id": f"{item}|proc|k2|native", "config": "proc", "condition": "baseline", "margin": proc,
                         "broad_margin": proc})
            base = rng.normal(1.0, 0.3)
            for condition, shift in (("baseline", 0.0), ("boundary", 0.8 if r == 0 else 0.1), ("random_0", rng.normal(0, 0.05)),
                                     ("procedure", 0.2)):
                rows.append({**common, "record_id": f"{item}|basm|k2|native", "config": "basm", "condition": condition,
                             "margin": base + shift, "broad_margin": base + shift, "knockout_mass": 0.1,
                             "knockout_digest": condition})  # what each knockout blocks: four different sets
    return pd.DataFrame(rows)


def test_knockout_split_adds_up_and_matches_a_direct_computation() -> None:
    rows = _knockout_rows()
    summary = summarise_rows(rows)
    table = summary.shown.set_index(["shown", "config", "bucket", "knockout", "measure"])
    for key, cell in table.loc["all"].iterrows():
        assert cell["n_items"] == table.loc[("shown", *key), "n_items"] + table.loc[("not shown", *key), "n_items"]
    basm = rows[rows["config"] == "basm"].pivot_table(index=["item_id", "task_group", "tempting_shown"], columns="condition",
                                                      values="margin").reset_index()
    delta = basm.assign(delta=basm["boundary"] - basm["baseline"])
    for group, sub in (("all", delta), ("shown", delta[delta["tempting_shown"]]), ("not shown", delta[~delta["tempting_shown"]])):
        cell = table.loc[(group, "basm", "T_wrong", "boundary", "margin")]
        assert cell["value"] == pytest.approx(_group_mean(sub, "delta"), abs=1e-9) and cell["n_items"] == len(sub)
    recovery = summary.recovery_shown.set_index(["shown", "measure"])
    proc = rows[rows["config"] == "proc"].set_index("item_id")["margin"]
    shown = delta[delta["tempting_shown"]].set_index("item_id")
    gap = proc[shown.index] - shown["baseline"]
    assert recovery.loc[("shown", "margin"), "value"] == pytest.approx(shown["delta"].mean() / gap.mean(), abs=1e-9)
    assert recovery.loc[("all", "margin"), "value"] == pytest.approx(summary.recovery.set_index("measure").loc["margin", "value"], abs=1e-12)
    assert {c.name for c in summary.claims if c.family == "knockout (defining skill shown)"} == {"boundary", "boundary>neutral"}
    ctx = SimpleNamespace(variant="tool_choice", options=SimpleNamespace(knockout_rows="path", priming=False))
    section = KnockoutAnalysis().section(ctx, summary, [])
    shown_delta = next(c for c in section.comparisons if c.quantity.startswith("Fig. 6: Δm wrong-tool") and "shown" in c.quantity)
    assert shown_delta.ours == pytest.approx(table.loc[("shown", "basm", "T_wrong", "boundary", "margin"), "value"], abs=1e-12)
    assert "`knockout_gap_recovery_shown.csv`" in section.markdown


def test_rows_without_the_flag_are_refused() -> None:
    with pytest.raises(ValueError, match="lack the 'tempting_shown' column"):
        by_shown(pd.DataFrame({"margin": [1.0]}))
    with pytest.raises(ValueError, match="must be true or false"):
        by_shown(pd.DataFrame({"margin": [1.0, 2.0], "tempting_shown": [True, np.nan], "task_group": ["a", "b"]}))
    assert summarise(by_shown(pd.DataFrame({"margin": [1.0, 3.0], "tempting_shown": [True, False], "task_group": ["a", "b"]})),
                     ["shown"])["n_items"].tolist() == [2, 1, 1]
