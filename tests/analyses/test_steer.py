"""``steer`` on the bundled organism: directions never see a held-out task group (asserted from the stored rows and
headers); the applicability and probe directions equal hand computations from the cached train residuals; the
unembedding direction is γ ⊙ (W_U[correct] − W_U[wrong]) at the deciding tokens; every steered row's vector has
the stated norm α · s_L; random draws are seeded, unit and distinct; refusals."""

from __future__ import annotations

import numpy as np
import pytest

from probes.analyses.heads import split_groups
from probes.analyses.linear import FEATURES, FeatureCache
from probes.analyses.run_context import AnalysisError
from probes.analyses.steer import Directions, Steer, estimate_directions, unembedding_direction
from probes.data.dataset import load_dataset
from probes.facade import ProbeSession
from probes.reporting.results import load_results
from probes.scoring.margins import candidates_from_record, shared_prefix
from probes.reporting.layout import analysis_folder, figures_folder, rows_path, table_path

SMALL = {"limit": 4, "layers": ["1", "2"], "alphas": ["0.5"], "rows_modes": ["decision", "call"], "random_draws": 2,
         "configs": ["basm"], "k": 2, "generate": "none"}


@pytest.fixture(scope="module")
def run(organism: ProbeSession, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("steer")
    return Steer(out=out, **SMALL).run(organism, verbose=False)


def test_directions_never_use_held_out_task_groups(run) -> None:
    train = load_results(rows_path(run.out_dir, "steer", "steer_train"))
    steered = load_results(rows_path(run.out_dir, "steer"))
    header = steered.attrs["meta"]["config"]
    train_groups, heldout_groups = set(header["train_groups"]), set(header["heldout_groups"])
    assert train_groups and heldout_groups and not train_groups & heldout_groups
    assert set(train["task_group"]) <= train_groups
    assert set(steered["task_group"]) <= heldout_groups
    assert (train_groups, heldout_groups) == split_groups(set(train["task_group"]) | set(steered["task_group"]))


def test_directions_equal_hand_computations(run, organism: ProbeSession) -> None:
    train = load_results(rows_path(run.out_dir, "steer", "steer_train"))
    cache = FeatureCache(analysis_folder(run.out_dir, "linear") / FEATURES)
    stack = np.stack([cache.load(key) for key in train["feature_key"]])
    found = estimate_directions(train, stack, seed=0)
    x = stack[:, 1:].astype(np.float64)
    basm, wrong = (train["config"] == "basm").to_numpy(), (train["bucket"] == "T_wrong").to_numpy()
    for layer in range(x.shape[1]):
        d = x[basm & wrong, layer].mean(0) - x[basm & ~wrong, layer].mean(0)
        assert np.allclose(found.vectors["applicability"][layer], d / np.linalg.norm(d), atol=1e-6)
        proc = x[(train["config"] == "proc").to_numpy() & wrong, layer].mean(0)
        d = x[basm & wrong, layer].mean(0) - proc
        assert np.allclose(found.vectors["config_difference"][layer], d / np.linalg.norm(d), atol=1e-6)
        # the probe direction separates the train classes: T_wrong projects higher
        projection = x[basm, layer] @ found.vectors["probe"][layer]
        assert projection[wrong[basm]].mean() > projection[~wrong[basm]].mean()
    assert np.allclose(found.scale, np.linalg.norm(x[basm], axis=-1).mean(0), rtol=1e-6)


def test_unembedding_direction_is_the_readout_difference(organism: ProbeSession) -> None:
    ds = load_dataset(organism.default_dataset)
    item = next(i for i in ds.items if i.id == "retail-wrong-0013")
    record = organism.prompt(item, config="basm", k=2)
    cands = candidates_from_record(record)
    c = next(x for x in cands if x.role == "correct")
    w = next(x for x in cands if x.role == "wrong")
    s = shared_prefix(c.token_ids, w.token_ids)
    model = organism.model
    gamma = model.model.norm.weight.detach().double()
    e = model.lm_head.weight.detach().double()
    expected = (gamma * (e[c.token_ids[s]] - e[w.token_ids[s]])).numpy()
    assert np.allclose(unembedding_direction(organism, record), expected / np.linalg.norm(expected), atol=1e-9)


def test_every_steered_vector_has_the_stated_norm(run) -> None:
    rows = run.rows[run.rows["direction"] != ""]
    assert set(rows["direction"]) == {"applicability", "config_difference", "probe", "unembedding", "shuffled", "random"}
    for r in rows.itertuples():
        assert r.steering_layers == [r.layer]
        assert abs(r.steering_norms[0] - abs(r.alpha) * r.scale) <= 1e-4 * r.scale
        assert r.steering_rows == ("every query row" if r.rows_mode == "call" else r.steering_rows) and r.steering_continuation
    # per record: the clean row, then every cell once (layers × rows modes × α × (4 directions + shuffled + 2 draws))
    assert (run.rows.groupby("record_id").size() == 1 + 2 * 2 * 1 * 7).all()
    clean = run.rows[run.rows["condition"] == "baseline"].set_index("record_id")
    assert (clean["kl_clean"] == 0).all()
    assert np.allclose(run.rows["clean_margin"], clean.loc[run.rows["record_id"], "margin"].to_numpy(), equal_nan=True)


def test_random_draws_are_seeded_unit_and_distinct() -> None:
    directions = Directions({"applicability": np.ones((3, 16))}, np.ones(3), ("g",), {}, seed=5)
    a, b = directions.random(1, 0), directions.random(1, 0)
    assert np.array_equal(a, b) and abs(np.linalg.norm(a) - 1) < 1e-12
    assert not np.allclose(a, directions.random(1, 1)) and not np.allclose(a, directions.random(2, 0))
    assert not np.allclose(a, Directions({"applicability": np.ones((3, 16))}, np.ones(3), ("g",), {}, seed=6).random(1, 0))


def test_summary_tables_and_claims(run) -> None:
    dose = run.tables["steer_dose"]
    assert set(dose["alpha"]) == {0.5} and set(dose["layer"]) == {1, 2}
    band = run.tables["steer_random"]
    assert len(band) and (band["n_draws"] == 2).all()
    claims = run.tables["steer_claims"]
    assert any("applicability vs random, T_wrong margin" in n for n in claims["name"])
    assert any("T_ok correct calls kept" in n for n in claims["name"])
    assert run.figures and run.figures[0].name.startswith("fig23_steer")


@pytest.mark.parametrize("given, message", [
    ({"alphas": ["0"]}, "--alpha 0 is the clean run"),
    ({"alphas": ["half"]}, "is not a number"),
    ({"layers": ["7"]}, "runs past the model's 3 layers"),
    ({"layers": ["2"], "window": 2}, "runs past the model's 3 layers"),
    ({"buckets": ["T_wrong"]}, "select tool-correct items of both buckets"),
    ({"random_draws": 1}, "need at least 2 draws"),
])
def test_bad_options_are_refused(organism: ProbeSession, tmp_path, given, message) -> None:
    options = {**SMALL, **given, "out": tmp_path}
    with pytest.raises(AnalysisError, match=message):
        Steer(**options).run(organism, verbose=False)


def test_generated_calls_are_parsed_and_checked_against_the_ranking(organism: ProbeSession, tmp_path) -> None:
    """--generate headline: the clean and every non-random direction's call-row run at α = 0.5 write their call, read by
    the call parser; the clean written call is calls' own generation of the record; the table reports the agreement."""
    from probes.analyses.calls import generate_call

    ids = ["retail-ok-0004", "retail-wrong-0004", "retail-ok-0001", "retail-wrong-0001"]
    run = Steer(out=tmp_path, item_ids=ids, limit=None, split="all", layers=["2"], alphas=["0.5"], rows_modes=["call"], random_draws=2,
                configs=["basm"], k=2, directions=["applicability"], generate="headline", figure=False).run(organism, verbose=False)
    rows = run.rows
    made = rows[rows["generated_outcome"].notna()]
    assert set(made["direction"]) == {"", "applicability", "shuffled"}
    assert rows.loc[rows["direction"] == "random", "generated_outcome"].isna().all()
    for r in made[made["direction"] == ""].itertuples():
        record = organism.prompt(next(i for i in load_dataset(organism.default_dataset).items if i.id == r.item_id), config="basm", k=2)
        assert r.generated_outcome == generate_call(organism, record)["lenient_outcome"]
    table = run.tables["steer_generation"]
    assert {"generated_correct", "agreement"} <= set(table) and len(table) == 3 * rows["bucket"].nunique()
    assert "no claims" in " ".join(run.summary.messages)  # the claims read decision rows, which this run did not steer


# two task groups with tool-correct T_ok and T_wrong items: one gives the directions, the other is steered
GROUPS = ["retail-ok-0004", "retail-wrong-0004", "retail-ok-0001", "retail-wrong-0001", "retail-wrong-0005", "retail-ok-0005"]


@pytest.mark.slow
def test_steer_runs_on_a_tiny_random_qwen3_through_the_cli(tiny_qwen3_dir, tmp_path) -> None:
    """The CLI end to end on random weights under the real Qwen3 tokenizer (names share first tokens: the decision rows
    include the candidates' rows), with written calls."""
    from probes.cli.main import main

    argv = ["steer", "--model", str(tiny_qwen3_dir), "--out", str(tmp_path), "--dataset", "basm_probe", "--embedder", "lexical",
            "--relevance", "lexical", "--split", "all", "--k", "1", "--alpha", "0.5", "--alpha", "-0.5", "--random-draws", "2",
            "--configs", "basm", *sum((["--item", i] for i in GROUPS), [])]
    assert main(argv) == 0
    out = next(tmp_path.iterdir())
    rows = load_results(rows_path(out, "steer"))
    assert np.isfinite(rows["kl_clean"]).all() and rows["generated_outcome"].notna().any()
    assert table_path(out, "steer", "steer_claims").is_file() and (figures_folder(out) / "fig23_steer.png").is_file()


@pytest.mark.slow
def test_steer_on_smollm2(smollm2_dir, tmp_path) -> None:
    """A real pretrained model (SmolLM2-135M-Instruct, 30 layers), two layers steered, decision rows."""
    result = Steer(model=smollm2_dir, item_ids=GROUPS, out=tmp_path, k=1, layers=["10", "20"], alphas=["0.5"], rows_modes=["decision"],
                   random_draws=2, configs=["basm"], embedder="lexical", relevance="lexical", split="all", dataset="basm_probe",
                   generate="none").run(verbose=False)
    dose = result.tables["steer_dose"]
    assert set(dose["layer"]) == {10, 20} and np.isfinite(dose["kl"]).all()
    assert result.tables["steer_claims"]["family"].str.startswith("steer").all()
