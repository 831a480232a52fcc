"""``sweep``, ``knockout`` and ``linear`` end to end on the imported BFCL decision points (``dataset="bfcl"``),
on the bundled organism and on SmolLM2-135M-Instruct, with long prompts skipped and counted, never dropped.

Each run's rows are checked against the BFCL items they came from: the margin is NaN exactly where
BFCL's ground truth is to make no call, and a scored record's prompt is the builder's record for
that item (so the analysis saw the multi-turn BFCL conversation, not an authored item).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from probes.analyses.knockout import KnockoutAnalysis
from probes.analyses.linear import Linear
from probes.analyses.sweep import Sweep
from probes.data.dataset import ABSTAIN, bundled_dataset
from probes.facade import ProbeSession
from probes.organism import ORGANISM_DIR

BFCL = {"dataset": "bfcl", "too_long": "skip", "figure": False}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


# SmolLM2 reads every BFCL prompt at full length (2.4k-9k tokens): its run takes the shortest items
# (basm k = 1 under its tokenizer), two task groups holding both buckets, so the folds are task-disjoint.
SHORT_PAIR = ["bfcl-miss_func-105-t0s0-ok", "bfcl-miss_func-127-t0-wrong"]
SHORT_SIX = [*SHORT_PAIR, "bfcl-base-127-t0s0-ok", "bfcl-miss_func-105-t1-wrong", "bfcl-miss_func-115-t0s0-ok", "bfcl-miss_func-115-t1-wrong"]


def run_three(session: ProbeSession, model: Path, out: Path, *, short: bool = False, **extra) -> dict:
    common = {"model": model, "out": out, **BFCL, **extra}
    pair = {"item_ids": SHORT_PAIR} if short else {"limit": 1}
    six = {"item_ids": SHORT_SIX} if short else {"limit": 4}
    return {
        "sweep": Sweep(k_max=1, buckets=["T_wrong", "T_ok"], configs=["proc", "basm"], **pair, **common).run(session, verbose=False),
        "knockout": KnockoutAnalysis(k=1, random_draws=1, **pair, **common).run(session, verbose=False),
        "linear": Linear(k_max=0, configs=["basm"], permutations=19, resamples=50, folds=2, **six, **common).run(session, verbose=False),
    }


def check_runs(results: dict, session: ProbeSession, dataset) -> None:
    by_id = {item.id: item for item in dataset.items}
    for name, result in results.items():
        assert result.status == 0, name
        assert Path(result.options.dataset) == bundled_dataset("bfcl"), name
        rows = result.rows
        assert len(rows) and rows["key"].is_unique and set(rows["item_id"]) <= set(by_id), name
        meta = rows.attrs["meta"]["config"]
        assert Path(meta["dataset"]) == bundled_dataset("bfcl")
        if "margin" in rows:
            abstain = rows["item_id"].map(lambda i: by_id[i].correct_action == ABSTAIN)
            assert (rows["margin"].isna() == abstain).all(), name
    # a scored prompt is the BFCL item's record: its earlier turns are in the prompt the model read
    knock = results["knockout"].rows
    row = knock[(knock["condition"] == "baseline") & (knock["config"] == "basm")].iloc[0]
    record = session.prompt(row["item_id"], config="basm", k=1, dataset="bfcl", embedder=results["knockout"].options.embedder,
                            relevance=results["knockout"].options.relevance)
    assert record.record_id == row["record_id"] and record.n_tokens == row["n_tokens"]
    item = by_id[row["item_id"]]
    assert item.user[:40] in record.text
    for turn in item.context:
        if turn.get("role") == "user":
            assert turn["content"][:40] in record.text
    auc = results["linear"].tables["linear_summary"]
    assert np.isfinite(auc["auc"]).any()


def test_bfcl_sweep_knockout_linear_on_the_organism(tmp_path: Path, bfcl_dataset) -> None:
    session = ProbeSession(ORGANISM_DIR)
    results = run_three(session, ORGANISM_DIR, tmp_path, embedder="lexical")
    # the organism keeps its study defaults except the dataset: lexical gate, as it was trained
    assert all(r.options.relevance == "lexical" for r in results.values())
    check_runs(results, session, bfcl_dataset)


@pytest.mark.slow
def test_bfcl_sweep_knockout_linear_on_smollm2(smollm2_dir: Path, tmp_path: Path, bfcl_dataset) -> None:
    session = ProbeSession(smollm2_dir)
    results = run_three(session, smollm2_dir, tmp_path, short=True, embedder="minilm")
    assert all(r.options.relevance == "semantic" for r in results.values())  # a non-organism model's gate
    check_runs(results, session, bfcl_dataset)
