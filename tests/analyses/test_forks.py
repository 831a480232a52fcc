"""Invoke/skip forks (seed 002): each path's numbers against plain HF forwards and hand computations,
the shared prefix reused bit for bit, and resume (the estimators: scoring/test_fork_estimators.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.analyses import forks as forks_mod
from probes.analyses.forks import Forks, path_row
from probes.engine.generate import stop_token_ids
from probes.engine.prefix_cache import TokenBreaks, prefix_blocks
from probes.facade import ProbeSession
from probes.reporting.results import ResultsConfigMismatch, load_results
from probes.scoring.margins import candidates_from_record, shared_prefix
from probes.reporting.layout import figures_folder, rows_path
from interrupt import killed_after_appends


torch.set_num_threads(1)


FAST = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "split": "all"}
ITEM = "retail-wrong-0001"
CHEAP = {"resamples": 50, "permutations": 50, "max_new_tokens": 3}
NUMBERS = ("entropy", "entropy_open", "entropy_tools", "margin", "call_logodds")


# ---------------------------------------------------------------------------- the paths against plain forwards
def by_hand(model: torch.nn.Module, record) -> dict[str, float]:
    """One path's numbers from plain HF forwards (eager attention, whole sequences): the decision and
    open rows' entropy from the raw logits, every tool name's log-probability from a forward over
    the prompt and the name, Eq. 1's tool-choice margin pair by pair where the names diverge, the
    renormalised tool entropy and the native call log-odds."""
    ids = list(record.input_ids)
    first = record.open_index  # the LM head at the rows read only (the whole prompt still runs through the model)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), logits_to_keep=len(ids) - first).logits[0].double()

    def h(row: int) -> float:
        p = torch.softmax(logits[row - first], -1)
        return float(-(p * torch.log(p)).sum())

    tools = [c for c in candidates_from_record(record) if not c.is_abstention]
    token_lp = {}
    for c in tools:
        seq = ids[: c.anchor_index + 1] + list(c.token_ids)
        with torch.no_grad():  # the rows anchor .. anchor + len − 1 predict the name's tokens
            out = torch.log_softmax(model(torch.tensor([seq]), logits_to_keep=len(c.token_ids) + 1).logits[0].double(), -1)
        token_lp[c.key] = [float(out[j, t]) for j, t in enumerate(c.token_ids)]
    correct = next(c for c in tools if c.role == "correct")
    margin = max(token_lp[w.key][s] - token_lp[correct.key][s]
                 for w in tools if w.role == "wrong" for s in [shared_prefix(w.token_ids, correct.token_ids)])
    names = torch.tensor([sum(token_lp[c.key]) for c in tools], dtype=torch.float64)
    q = torch.softmax(names, 0)
    p_open = float(torch.softmax(logits[0], -1)[ids[record.open_index + 1]])
    return {"entropy": h(record.decision_index), "entropy_open": h(record.open_index), "entropy_tools": float(-(q * torch.log(q)).sum()),
            "margin": margin, "call_logodds": math.log(p_open / (1 - p_open))}


def test_paths_share_the_prefix_bit_for_bit_and_match_plain_forwards(tiny_qwen3_dir: Path) -> None:
    session = ProbeSession(tiny_qwen3_dir, dtype="float32")
    cold = ProbeSession(tiny_qwen3_dir, dtype="float32", prefix_cache=0)
    skip = session.prompt(ITEM, config="proc", k=0, **{k: FAST[k] for k in ("dataset", "embedder", "relevance")})
    invoke = session.prompt(ITEM, config="proc", k=2, **{k: FAST[k] for k in ("dataset", "embedder", "relevance")})
    shared = shared_prefix(skip.input_ids, invoke.input_ids)
    # the blocks both prompts have inside their shared part (probes.engine.prefix_cache)
    breaks = TokenBreaks(session.tokenizer)
    common = set(prefix_blocks(breaks.kinds(skip.input_ids))) & set(prefix_blocks(breaks.kinds(invoke.input_ids)))
    shared_blocks = max(b for a, b in common if b <= shared)
    assert shared_blocks > 0 and skip.input_ids != invoke.input_ids
    stops = stop_token_ids(session.model, session.tokenizer)
    skip_row = path_row(session, skip, stops, 2)
    reused = session.prefix_reuse.tokens_reused
    invoke_row = path_row(session, invoke, stops, 2)
    # the invoke path starts from the skip path's cached blocks of their shared prefix
    assert session.prefix_reuse.tokens_reused - reused == shared_blocks
    plain = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32, attn_implementation="eager").eval()
    for record, row in ((skip, skip_row), (invoke, invoke_row)):
        # bit for bit: the reused prefix changes nothing against a session without a prefix cache
        alone = path_row(cold, record, stops, 2)
        assert {name: alone[name] for name in NUMBERS} == {name: row[name] for name in NUMBERS}
        assert alone["generation"] == row["generation"]
        expected = by_hand(plain, record)
        for name in NUMBERS:
            assert row[name] == pytest.approx(expected[name], abs=1e-5), name
        assert row["n_tools"] == len([c for c in record.candidates if c.role != "abstain"])


# ---------------------------------------------------------------------------- the analysis and resume
def _forks(model: Path, out: Path, **options) -> Forks:
    return Forks(**{"model": model, "out": out, "item_ids": [ITEM, "retail-ok-0001"], "k_max": 2, **CHEAP, **FAST, **options})


def _table(path: Path) -> pd.DataFrame:
    return load_results(path).sort_values("key").reset_index(drop=True)


def test_killed_forks_resume_to_the_same_table(tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _forks(tiny_qwen3_dir, tmp_path / "full", figure=False).run(verbose=False)
    full = _table(rows_path(result.out_dir, "forks"))
    assert len(full) == 2 * 2 * 2  # items × configurations × k = 1..2, one row per fork
    assert set(full["skip_record_id"]) == {f"{ITEM}|proc|k0|native", "retail-ok-0001|proc|k0|native",
                                          f"{ITEM}|basm|k0|native", "retail-ok-0001|basm|k0|native"}
    assert set(result.tables) >= {"forks_summary", "forks_shares", "forks_entropy", "forks_auroc", "forks_budget", "forks_claims"}

    calls = {"paths": 0}
    real_path = forks_mod.path_row
    with killed_after_appends(3):
        _forks(tiny_qwen3_dir, tmp_path / "resumed", figure=False).run(verbose=False)

    def counting_path(*args, **kwargs):
        calls["paths"] += 1
        return real_path(*args, **kwargs)

    monkeypatch.setattr(forks_mod, "path_row", counting_path)
    again = _forks(tiny_qwen3_dir, tmp_path / "resumed", resamples=60).run(verbose=False)  # a statistics option: rows reused
    # 5 forks were left: the second item's 4 (its skip path once, 4 invoke paths) and the first item's last (skip + invoke)
    assert calls["paths"] == 5 + 2
    resumed = _table(rows_path(again.out_dir, "forks"))
    assert resumed["key"].is_unique
    numbers = [c for c in full.columns if c.startswith(("skip_", "invoke_"))]
    pd.testing.assert_frame_equal(resumed[["key", *numbers]], full[["key", *numbers]])
    assert (figures_folder(again.out_dir) / "fig17_forks_entropy.png").is_file() and (figures_folder(again.out_dir) / "fig18_forks_ranking.png").is_file()
    with pytest.raises(ResultsConfigMismatch):
        _forks(tiny_qwen3_dir, tmp_path / "resumed", max_new_tokens=4, figure=False).run(verbose=False)


def test_a_configuration_without_skills_is_refused() -> None:
    with pytest.raises(ValueError, match="base"):
        Forks(configs=["base"])
