"""``circuit``: the deciding-row metric equals the scorer's tool-choice margin; exact verification equals the
suite's own knockout where both define the same intervention; the circuit is selected on train task groups
only (asserted from the rows and the recorded headers); a planted head reading B leads the edges from B; on
the bundled organism the planted verdict heads' B edges lead the ranking; refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from probes.analyses.circuit import SPAN_ORDER, CircuitAnalysis, binding_row, rank_edges, source_spans
from probes.analyses.heads import split_groups
from probes.analyses.run_context import AnalysisError
from probes.data.dataset import load_dataset
from probes.engine.decision_row import DecisionRow
from probes.engine.session import EngineSession, Knockout
from probes.facade import ProbeSession
from probes.reporting.results import load_results
from probes.scoring.score import score_record
from probes.reporting.layout import rows_path, table_path

# tool-correct T_wrong items of four task groups (two train, two held-out), each group with T_ok partners
ITEMS = ["retail-wrong-0001", "retail-wrong-0002", "retail-wrong-0013", "retail-wrong-0014", "retail-wrong-0025",
         "retail-wrong-0026", "messaging-wrong-0001", "messaging-wrong-0002"]
SMALL = {"ig_steps": 4, "exact_top": 4, "exact_random": 4, "random_circuits": 4, "k": 2}


@pytest.fixture(scope="module")
def run(organism: ProbeSession, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("circuit")
    return CircuitAnalysis(item_ids=ITEMS, configs=["basm"], out=out, **SMALL).run(organism, verbose=False)


def test_metric_is_the_tool_choice_margin(organism: ProbeSession) -> None:
    ds = load_dataset(organism.default_dataset)
    item = next(i for i in ds.items if i.id == "retail-wrong-0013")
    record = organism.prompt(item, config="basm", k=2)
    row, d = binding_row(organism, record, item, ds.catalog_for(item).names)
    margin = score_record(organism, record)[0]["margin_tool_choice"]
    assert abs(row.metric - margin) <= 1e-4
    spans = source_spans(record, item, ds.catalog_for(item).names, row.row)
    assert tuple(spans) == SPAN_ORDER and all(spans[name] for name in ("boundary", "procedure", "request", "catalog", "call_prefix"))
    flat = [p for positions in spans.values() for p in positions]
    assert len(flat) == len(set(flat))  # disjoint


def test_exact_verification_equals_the_scorers_knockout(organism: ProbeSession) -> None:
    """A B knockout in one head at the decision row (first tokens differ: the deciding row is the decision row) through
    score_record equals the exact patch of that (head, B) edge to the knockout counterfactual."""
    ds = load_dataset(organism.default_dataset)
    item = next(i for i in ds.items if i.id == "retail-wrong-0013")
    record = organism.prompt(item, config="basm", k=2)
    row, d = binding_row(organism, record, item, ds.catalog_for(item).names)
    assert d.depth == 0
    target = row.knocked_out("boundary")
    b = row.spans.index("boundary")
    for layer, head in ((2, 0), (1, 2)):
        knock = Knockout.from_spans("b", record.spans["boundary"], heads=[(layer, head)], rows=[record.decision_index], continuation=False)
        base, knocked = score_record(organism, record, [knock])
        exact = row.exact_edges(target, [(layer, head, b)])[0]
        assert abs((knocked["margin_tool_choice"] - base["margin_tool_choice"]) - exact) <= 1e-4


def test_selection_never_sees_held_out_groups(run) -> None:
    rows = run.rows
    train, heldout = split_groups(rows["task_group"])
    assert train and heldout and not train & heldout
    assert set(rows.loc[rows["half"] == "train", "task_group"]) <= train
    out = run.out_dir
    header = json.loads(rows_path(out, "circuit", "circuit_heldout").read_text().splitlines()[0])
    config = header["_meta"]["config"]
    circuits = {(c["config"], c["pair"]): c for c in config["circuits"]}
    for (cfg, pair), c in circuits.items():
        scored = rows[(rows["config"] == cfg) & (rows["pair"] == pair) & (rows["skipped"].fillna("") == "")]
        ranking, _ = rank_edges(scored[scored["half"] == "train"], "eap_ig")
        assert list(ranking) == c["ranking"]  # recomputed from train rows alone
        changed = scored.copy()
        changed.loc[changed["half"] == "heldout", "eap_ig"] = changed.loc[changed["half"] == "heldout", "eap_ig"].map(
            lambda v: (-np.asarray(v) * 100).tolist())  # held-out rows cannot move the ranking
        assert list(rank_edges(changed[changed["half"] == "train"], "eap_ig")[0]) == c["ranking"]
    assert set(load_results(rows_path(out, "circuit", "circuit_train"))["task_group"]) <= train
    assert set(load_results(rows_path(out, "circuit", "circuit_heldout"))["task_group"]) <= heldout


def test_organism_planted_heads_are_recovered_and_their_ranks_reported(run) -> None:
    """The organism's planted verdict heads read B from the deciding row: with B knocked out as the corruption both of
    their edges from B are in the circuit chosen on train; the ranks reported are those of the edge table."""
    planted = run.tables["circuit_planted"]
    edges = run.tables["circuit_edges"]
    for r in planted.itertuples():
        sub = edges[(edges["config"] == r.config) & (edges["pair"] == r.pair) & (edges["span"] == "boundary")]
        by_b = sub.assign(b_rank=sub["rank"].rank(method="max").astype(int)).set_index(["layer", "head"])["b_rank"]
        assert sorted(int(x) for x in r.ranks_among_B_edges.split(", ")) == sorted(int(by_b[(2, h)]) for h in (0, 1))
    knockout = planted[planted["pair"] == "knockout"].iloc[0]
    assert knockout["in_circuit"] == 2 and knockout["p"] < 0.05
    assert set(run.tables) >= {"circuit_edges", "circuit_nodes", "circuit_faithfulness", "circuit_agreement", "circuit_claims"}
    assert {"circuit", "organism circuit"} <= set(run.tables["circuit_claims"]["family"])
    assert {"embed", "head", "mlp"} == set(run.tables["circuit_nodes"]["kind"])


def test_a_planted_head_reading_b_is_ranked_first() -> None:
    """A tiny random Qwen3 in which one head's output is amplified: patching its edge from B moves the
    metric most, and every estimator ranks that edge first among the edges from B."""
    torch.manual_seed(2)
    cfg = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    model = Qwen3ForCausalLM(cfg).eval()
    planted = (1, 3)
    with torch.no_grad():
        o = model.model.layers[planted[0]].self_attn.o_proj.weight
        o[:, planted[1] * 16:(planted[1] + 1) * 16] *= 40.0
    ids = torch.randint(5, 290, (80,), generator=torch.Generator().manual_seed(1)).tolist()
    row = DecisionRow(EngineSession(model), ids, spans={"boundary": range(10, 30), "procedure": range(35, 55)}, wrong_token=11,
                      correct_token=12)
    scores = row.edge_scores(row.knocked_out("boundary"), ig_steps=8)
    b = row.spans.index("boundary")
    for name, s in scores.items():
        from_b = np.abs(s[:, :, b])
        assert np.unravel_index(np.argmax(from_b), from_b.shape) == planted, name
    frame = pd.DataFrame({"eap_ig": [scores["eap_ig"].tolist()]})
    ranking, _ = rank_edges(frame, "eap_ig")
    first_b = next(e for e in ranking if e % len(row.spans) == b)
    assert divmod(first_b // len(row.spans), row.n_heads) == planted


def test_refusals(organism: ProbeSession, tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="no tool-correct T_wrong item"):
        CircuitAnalysis(item_ids=["travel-wrong-0001"], configs=["basm"], out=tmp_path, **SMALL).run(organism, verbose=False)


def test_circuit_runs_on_a_tiny_random_qwen3_through_the_cli(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    """The CLI end to end on random weights under the real Qwen3 tokenizer: rows, tables and the graph files."""
    from probes.cli.main import main

    argv = ["circuit", "--model", str(tiny_qwen3_dir), "--out", str(tmp_path), "--dataset", "basm_probe", "--embedder", "lexical",
            "--relevance", "lexical", "--split", "all", "--configs", "basm", "--pairs", "knockout", "--k", "1",
            "--ig-steps", "2", "--exact-top", "2", "--exact-random", "2", "--random-circuits", "2", *sum((["--item", i] for i in ITEMS[:4]), [])]
    assert main(argv) == 0
    out = next(tmp_path.iterdir())
    rows = load_results(rows_path(out, "circuit"))
    assert set(rows["condition"]) == {"dla", "knockout"} and rows["metric"].notna().all()
    assert table_path(out, "circuit", "circuit_nodes").is_file() and table_path(out, "circuit", "circuit_edges").is_file()


@pytest.mark.parametrize("backend", ["nnsight", "transformerlens"])
def test_dla_through_a_backend_equals_the_native_replay(run, backend: str, tmp_path: Path) -> None:
    """``--backend``: DLA at the binding pair's deciding row and the exact B-knockout effect per head through the
    backend's own forward, equal to the native replay's (fp32; 1e-4 on DLA parts, 1e-5 on the metric)."""
    native = run.rows[(run.rows["condition"] == "dla")].set_index("record_id")
    through = CircuitAnalysis(item_ids=ITEMS[4:6], configs=["basm"], out=tmp_path, backend=backend, **SMALL).run(verbose=False)
    rows = through.rows.set_index("record_id")
    assert set(rows["condition"]) == {"dla"} and len(rows) == 2
    for record_id, row in rows.iterrows():
        ref = native.loc[record_id]
        assert abs(row["metric"] - ref["metric"]) <= 1e-5
        np.testing.assert_allclose(np.asarray(row["dla_heads"]), np.asarray(ref["dla_heads"]), atol=1e-4)
        np.testing.assert_allclose(np.asarray(row["dla_mlps"]), np.asarray(ref["dla_mlps"]), atol=1e-4)
    nodes = through.tables["circuit_nodes"]
    assert nodes.loc[nodes["kind"] == "head", "boundary_knockout_exact"].notna().all()
