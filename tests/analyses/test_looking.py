"""``looking`` on the organism: the 2 × 2 counts (clean and B knocked out) equal a hand count from the rows, η is
recomputed from the rows' per-head alphas, the claims are in their families, the gap quartiles are taken on the
Proc. Skill gap (a planted BASM gap cannot move them); refusals (no BASM or Proc. Skill configuration, no
tool-correct T_wrong item, no T_wrong record showing B)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probes.analyses.looking import ALL_LAYERS, CLEAN, EXPLORATORY_FAMILY, FAMILY, KNOCKED, LookingAnalysis, gap_table, knockout_of
from probes.analyses.run_context import AnalysisError
from probes.facade import ProbeSession
from probes.scoring.score import EPSILON
from probes.reporting.layout import figures_folder, rows_path, table_path

# tool-correct T_wrong items of three task groups (two each) and two T_ok references
ITEMS = ["retail-wrong-0001", "retail-wrong-0002", "retail-wrong-0013", "retail-wrong-0014", "retail-wrong-0025", "retail-wrong-0026",
         "retail-ok-0001", "retail-ok-0013"]
SMALL = {"k": 2, "layer_window": 2, "permutations": 199, "embedder": "lexical", "split": "all", "figure": False}
WINDOWS = {ALL_LAYERS: range(3), "L0-1": range(2), "L2-2": range(2, 3)}  # the organism's 3 layers in windows of 2


@pytest.fixture(scope="module")
def run(organism: ProbeSession, tmp_path_factory: pytest.TempPathFactory):
    return LookingAnalysis(item_ids=ITEMS, out=tmp_path_factory.mktemp("looking"), **SMALL).run(organism, verbose=False)


def _hand_records(rows: pd.DataFrame) -> pd.DataFrame:
    """η, looks, right (clean and knocked) per BASM record and window, from the rows alone."""
    basm = rows[rows["config"] == "basm"]
    clean = basm[basm["condition"] == "baseline"]
    out = []
    for r in clean.itertuples():
        b, p = np.asarray(r.alpha_boundary_heads), np.asarray(r.alpha_procedure_heads)
        for window, layers in WINDOWS.items():
            eta = b[list(layers)].mean() / (p[list(layers)].mean() + EPSILON)
            knocked = basm[(basm["item_id"] == r.item_id) & (basm["condition"] == knockout_of(window))]["margin"].item()
            out.append({"bucket": r.bucket, "window": window, "item_id": r.item_id, "eta": eta, "looks": eta > 1.0, "right": r.margin < 0,
                        "right_knocked": knocked < 0, "pooled_eta": r.alpha_boundary / (r.alpha_procedure + EPSILON)})
    return pd.DataFrame(out)


def test_the_two_by_two_is_a_hand_count_from_the_rows(run) -> None:
    hand = _hand_records(run.rows)
    everything = hand[hand["window"] == ALL_LAYERS]
    np.testing.assert_allclose(everything["eta"], everything["pooled_eta"], rtol=1e-6)  # every head's mean: the row's own (float32) alphas
    assert hand.groupby(["bucket", "window"]).size().min() == 2 and set(hand["bucket"]) == {"T_wrong", "T_ok"}
    table = run.tables["looking_table"]
    for (bucket, window), sub in hand.groupby(["bucket", "window"]):
        for condition, right in ((CLEAN, "right"), (KNOCKED, "right_knocked")):
            cells = table[(table["bucket"] == bucket) & (table["window"] == window) & (table["condition"] == condition)]
            counted = sub.groupby(["looks", right]).size()
            for c in cells.itertuples():
                assert c.count == counted.get((c.looks, c.right), 0), (bucket, window, condition, c.looks, c.right)
                assert c.share == pytest.approx(c.count / len(sub))
    rates = run.tables["looking_windows"].set_index(["bucket", "window", "condition"])
    for (bucket, window), sub in hand.groupby(["bucket", "window"]):
        r = rates.loc[(bucket, window, CLEAN)]
        assert r["n_looks"] == sub["looks"].sum() and r["n_not"] == (~sub["looks"]).sum()
        if sub["looks"].any():
            assert r["right_looks"] == pytest.approx(sub.loc[sub["looks"], "right"].mean())


def test_the_claims_and_the_logit_table(run) -> None:
    claims = run.tables["looking_claims"]
    headline = claims[claims["family"] == FAMILY]
    assert list(headline["name"]) == ["looks and picks right: T_wrong, BASM, all"] and not headline["exploratory"].any()
    exploratory = claims[claims["family"] == EXPLORATORY_FAMILY]
    assert exploratory["exploratory"].all() and len(exploratory) == len(WINDOWS) - 1 + 1  # the windows and the gap contrast
    assert (claims["unit"].isin(["probability", "error rate"])).all() and claims["p_floor"].notna().all()
    logit = run.tables["looking_logit"]
    assert set(logit["predictor"]) == {"looks", "log2_eta"} and logit["status"].str.len().gt(0).all()


def test_the_gap_quartiles_are_procs(run) -> None:
    rows = run.rows[run.rows["condition"] == "baseline"]
    proc = rows[rows["config"] == "proc"].set_index("item_id")
    gap = run.tables["looking_gap"]
    for bucket, sub in proc.groupby("bucket"):
        quartiles = gap[(gap["bucket"] == bucket) & gap["quartile"].str.fullmatch(r"Q\d")]
        assert quartiles["n_items"].sum() == len(sub)
        assert set(quartiles["gap_min"].dropna()) <= set(sub["top_gap"]) and set(quartiles["gap_max"].dropna()) <= set(sub["top_gap"])
    # planted: BASM's gaps in the opposite order leave the quartiles (taken on Proc. Skill's) unchanged
    frame = pd.DataFrame({"item_id": [f"i{j}" for j in range(8)], "task_group": [f"g{j % 4}" for j in range(8)], "bucket": "T_wrong",
                          "top_gap_proc": np.arange(8.0), "top_gap_basm": np.arange(8.0)[::-1], "tool_error_proc": [1, 1, 1, 0, 0, 0, 0, 0],
                          "tool_error_basm": [0, 0, 1, 0, 0, 0, 0, 0]})
    table, contrasts = gap_table(frame, permutations=99, seed=0)
    by = table.set_index("quartile")
    assert list(by.loc[["Q1", "Q2", "Q3", "Q4"], "gap_min"]) == [0.0, 2.0, 4.0, 6.0]
    assert by.loc["Q1", "change"] == -1.0 and by.loc["Q4", "change"] == 0.0 and contrasts["T_wrong"]["difference"] == -1.0


@pytest.mark.parametrize(("options", "message"), [
    ({"configs": ["proc"]}, "--configs proc lacks basm: looking needs basm"),
    ({"configs": ["basm"]}, "--configs basm lacks proc"),
    ({"item_ids": ["retail-wrong-0004", "retail-ok-0001"]}, "no tool-correct T_wrong item selected"),  # 0004: abstention is correct
    ({"gamma": 1.0}, r"no T_wrong BASM record with a boundary span .*1 BASM record\(s\) without a boundary span"),  # the closed gate shows no B
])
def test_refusals(organism: ProbeSession, tmp_path: Path, options: dict, message: str) -> None:
    given = {"item_ids": ITEMS[:1], **SMALL, **options}
    with pytest.raises(AnalysisError, match=message):
        LookingAnalysis(out=tmp_path, **given).run(organism, verbose=False)


@pytest.mark.slow
def test_looking_runs_on_a_tiny_random_qwen3_through_the_cli(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    """The CLI end to end on random weights under the real Qwen3 tokenizer (2 layers: windows L0-0, L1-1)."""
    from probes.cli.main import main
    from probes.reporting.results import load_results

    argv = ["looking", "--model", str(tiny_qwen3_dir), "--out", str(tmp_path), "--dataset", "basm_probe", "--embedder", "lexical",
            "--relevance", "lexical", "--split", "all", "--k", "1", "--layer-window", "1", "--permutations", "99",
            *sum((["--item", i] for i in ITEMS), [])]
    assert main(argv) == 0
    out = next(tmp_path.iterdir())
    rows = load_results(rows_path(out, "looking"))
    basm = rows[rows["config"] == "basm"]
    assert set(basm["condition"]) == {"baseline", "boundary", "boundary@L0-0", "boundary@L1-1"}
    assert rows.loc[rows["condition"] == "baseline", "top_gap"].ge(0).all()
    assert table_path(out, "looking", "looking_table").is_file() and table_path(out, "looking", "looking_claims").is_file() and (figures_folder(out) / "fig22_looking.png").is_file()


@pytest.mark.slow
def test_looking_on_smollm2(smollm2_dir: Path, tmp_path: Path) -> None:
    """A real pretrained model (SmolLM2-135M-Instruct, 30 layers): two T_wrong items of one task group and a T_ok one."""
    result = LookingAnalysis(model=smollm2_dir, item_ids=["retail-wrong-0001", "retail-wrong-0002", "retail-ok-0001"], out=tmp_path,
                             k=1, layer_window=10, permutations=99, embedder="lexical", relevance="lexical", split="all", dataset="basm_probe").run(verbose=False)
    windows = result.tables["looking_windows"]
    assert set(windows["window"]) == {"all", "L0-9", "L10-19", "L20-29"} and set(windows["bucket"]) == {"T_wrong", "T_ok"}
    assert result.tables["looking_claims"]["family"].str.startswith("looking").all()
