"""``heads``: ranking only over heads that read B ∪ P, split-half selection (rank on one half of
the task groups, knock out on the other), random heads matched on span mass, and the span-mass
sensitivity table; on hand-made rankings and through the CLI on a tiny random Qwen3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probes.analyses.base import AnalysisError, open_context
from probes.analyses.heads import (
    MATCH_POOL,
    SENSITIVITY_FLOORS,
    Heads,
    compute,
    matched_random_sets,
    ranking,
    split_groups,
    top_heads,
)
from probes.reporting.results import load_results
from probes.scoring.score import EPSILON

torch.set_num_threads(1)

# Two items (T_ok, T_wrong) in each of four task groups: two groups per half.
ITEMS = ["retail-ok-0001", "retail-wrong-0001", "retail-ok-0004", "retail-wrong-0004",
         "retail-ok-0007", "retail-wrong-0007", "retail-ok-0010", "retail-wrong-0010"]
FAST = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "split": "all", "dtype": "float32"}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def attention_rows(alpha: dict[str, tuple[list, list]], copies: int = 2) -> pd.DataFrame:
    sizes = {"boundary_size": 100, "procedure_size": 50}
    return pd.DataFrame([{"bucket": bucket, **sizes, "alpha_boundary_heads": b, "alpha_procedure_heads": p}
                         for bucket, (b, p) in alpha.items() for _ in range(copies)])


# ---------------------------------------------------------------------------- ranking
def test_head_ranking_leaves_out_heads_that_read_neither_span() -> None:
    """Ranking on hand-made per-head α: a head with almost no attention on B ∪ P has a huge
    ε-driven shift but is not ranked; the others are ordered by the shift of the bucket-averaged
    log ratio, and span_mass is the smaller bucket mean of α_B·|B| + α_P·|P| (recomputed here)."""
    # [layer, head] per-token α for a 1-layer, 3-head model: (0,0) shifts toward B, (0,1) is flat, (0,2) reads neither span
    alpha = {"T_ok": ([[0.002, 0.004, 1e-9]], [[0.008, 0.008, 1e-5]]), "T_wrong": ([[0.006, 0.004, 1e-5]], [[0.004, 0.008, 1e-9]])}
    rows = attention_rows(alpha)
    rank = ranking(rows, min_span_mass=0.05)
    assert [(r.layer, r.head, r.ranked) for r in rank.itertuples()] == [(0, 0, True), (0, 1, True), (0, 2, False)]
    log2 = lambda bucket, h: np.log2((alpha[bucket][0][0][h] + EPSILON) / (alpha[bucket][1][0][h] + EPSILON))  # noqa: E731
    for r in rank.itertuples():
        assert abs(r.shift - (log2("T_wrong", r.head) - log2("T_ok", r.head))) <= 1e-9
        mass = min(alpha[b][0][0][r.head] * 100 + alpha[b][1][0][r.head] * 50 for b in alpha)
        assert abs(r.span_mass - mass) <= 1e-12
    assert rank.iloc[2]["shift"] > rank.iloc[0]["shift"] > 0  # the unranked head's ε shift is the largest
    assert bool(ranking(rows, min_span_mass=0.0)["ranked"].all())
    assert top_heads(rank, 3) == [(0, 0), (0, 1)]  # the top set holds ranked heads only


def test_ranking_raises_on_empty_or_mismatched_rows() -> None:
    alpha = {"T_ok": ([[0.002, 0.004]], [[0.008, 0.008]]), "T_wrong": ([[0.006, 0.004]], [[0.004, 0.008]])}
    rows = attention_rows(alpha)
    with pytest.raises(AnalysisError, match="no T_ok or T_wrong rows"):
        ranking(rows.iloc[:0])
    with pytest.raises(AnalysisError, match="no T_ok rows"):
        ranking(rows[rows["bucket"] == "T_wrong"])
    with pytest.raises(AnalysisError, match="no T_wrong rows"):  # T_wrong rows that show no boundary span do not count
        ranking(rows.assign(boundary_size=np.where(rows["bucket"] == "T_wrong", 0, 100)))
    wider = attention_rows({"T_ok": ([[0.002, 0.004, 0.001]], [[0.008, 0.008, 0.001]]), "T_wrong": alpha["T_wrong"]})
    with pytest.raises(AnalysisError, match="differ"):
        ranking(wider)


# ---------------------------------------------------------------------------- split and matched random heads
def test_split_groups_is_deterministic_and_disjoint() -> None:
    groups = ["d", "b", "a", "c", "b", "e"]
    rank, test = split_groups(groups)
    assert (rank, test) == ({"a", "c", "e"}, {"b", "d"})
    assert split_groups(reversed(groups)) == (rank, test)


def synthetic_ranking(n_layers: int = 16, n_heads: int = 16, seed: int = 1) -> pd.DataFrame:
    """Span masses log-uniform over [1e-4, 1]; the shift peaks at heads of mass ≈ 0.4, so the top
    heads read the spans far more than a typical head (an unmatched draw would not be comparable)."""
    rng = np.random.default_rng(seed)
    n = n_layers * n_heads
    mass = np.exp(rng.permutation(np.linspace(np.log(1e-4), 0.0, n)))
    layers, heads = np.divmod(np.arange(n), n_heads)
    shift = -((np.log(mass) - np.log(0.4)) ** 2) + rng.normal(0, 0.05, n)
    table = pd.DataFrame({"layer": layers, "head": heads, "span_mass": mass, "shift": shift, "ranked": mass >= 0.05})
    return table.sort_values(["ranked", "shift"], ascending=[False, False]).reset_index(drop=True)


def test_matched_random_heads_read_the_spans_as_much_as_the_top_heads() -> None:
    rank = synthetic_ranking()
    mass = rank.set_index(["layer", "head"])["span_mass"]
    top = top_heads(rank, 4)
    top_mass = np.mean([mass[h] for h in top])
    assert top_mass > 3 * rank["span_mass"].mean()  # the matching has something to correct
    sets, pool = matched_random_sets(rank, top, draws=5, seed=0)
    assert pool == MATCH_POOL * len(top) and len(sets) == 5
    for heads in sets:
        assert len(set(heads)) == len(top) and not set(heads) & set(top)
        assert abs(np.log(np.mean([mass[h] for h in heads]) / top_mass)) < np.log(1.5)
        # each random head lies within the pool of nearest non-top heads of some top head
        others = mass.drop(top)
        for h in heads:
            assert any(h in (np.log(others) - np.log(mass[t])).abs().nsmallest(pool + len(top)).index for t in top)
    assert len({tuple(s) for s in sets}) > 1  # random, not a fixed nearest-neighbour set
    assert matched_random_sets(rank, top, draws=5, seed=0) == (sets, pool)  # seeded: the same for every record


def test_matched_random_heads_with_few_candidates() -> None:
    rank = synthetic_ranking(n_layers=2, n_heads=3)
    top = [(int(r.layer), int(r.head)) for r in rank.head(2).itertuples()]
    sets, pool = matched_random_sets(rank, top, draws=3, seed=0)
    assert pool == 4 and all(len(s) == 2 for s in sets)  # 4 candidates = MATCH_POOL·N: the full pool
    top = [(int(r.layer), int(r.head)) for r in rank.head(3).itertuples()]
    assert matched_random_sets(rank, top, draws=3, seed=0)[1] == 3  # fewer than 2N: the pool width says so
    with pytest.raises(AnalysisError, match="lower --top-n"):
        matched_random_sets(rank, [(int(r.layer), int(r.head)) for r in rank.head(4).itertuples()], draws=1, seed=0)


# ---------------------------------------------------------------------------- through the CLI
def heads_analysis(tmp_path: Path, **extra) -> Heads:
    return Heads(**{"item_ids": ITEMS, "k": 1, "top_n": 2, "random_draws": 2, "out": tmp_path, **FAST, **extra})


def test_heads_tiny_ranks_and_tests_on_disjoint_halves(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    analysis = heads_analysis(tmp_path, model=tiny_qwen3_dir, min_span_mass=0.07)
    result = analysis.run()
    assert result.status == 0
    out = result.out_dir
    assert out == tmp_path / tiny_qwen3_dir.name
    for name in ("fig08_head_heatmap", "fig09_candidate_heads"):
        for suffix in (".png", ".pdf"):
            assert (out / "figures" / f"{name}{suffix}").stat().st_size > 5000
    attention = load_results(out / "heads.jsonl")
    assert np.array(attention["alpha_boundary_heads"].iloc[0]).shape == (2, 4) and set(attention["item_id"]) == set(ITEMS)
    # Resumes from the rows written above (nothing is rescored): the summary holds the halves.
    summary = compute(open_context(analysis))
    rows = summary.rows
    rank_items = set(rows.loc[rows["half"] == "rank", "item_id"])
    rank_groups = set(rows.loc[rows["half"] == "rank", "task_group"])
    assert len(rank_groups) == 2 and rows.groupby("task_group")["half"].nunique().eq(1).all()

    causal = load_results(out / "heads_causal.jsonl")
    assert set(causal["bucket"]) == {"T_wrong"} and set(causal["item_id"]).isdisjoint(rank_items)
    assert set(causal["task_group"]).isdisjoint(rank_groups) and len(set(causal["task_group"])) == 2
    assert set(summary.causal_rows["half"]) == {"test"}
    # the ranking is the ranking half's, not all items'
    pd.testing.assert_frame_equal(summary.ranking, ranking(rows[rows["half"] == "rank"], 0.07))
    assert not np.allclose(ranking(rows, 0.0).sort_values(["layer", "head"])["shift"],
                           ranking(rows[rows["half"] == "rank"], 0.0).sort_values(["layer", "head"])["shift"])

    # one condition per distinct head set, as recorded in the results header
    config = causal.attrs["meta"]["config"]
    sets = {name: sorted(map(tuple, heads)) for name, heads in config["head_sets"].items()}
    assert set(causal["condition"]) == {"baseline", *sets} and len(set(map(tuple, sets.values()))) == len(sets)
    assert sorted(config["test_groups"]) == sorted(set(causal["task_group"]))

    table = pd.read_csv(out / "heads_causal_summary.csv")
    assert list(table["selection"]) == ["top-2", "random-2 #0", "random-2 #1", "random-2", "top-2 − random-2"]
    assert table.loc[:3, "span_mass"].notna().all()

    # Independent: top − pooled random from the raw rows (records of one item each), mean over task groups.
    chosen = {name.split("|", 1)[1]: cond for name, cond in config["selections"].items() if name.startswith("0.07|")}
    margin = causal.set_index(["item_id", "condition"])["margin"].unstack()
    per_item = margin[chosen["top-2"]] - margin[[chosen["random-2 #0"], chosen["random-2 #1"]]].mean(axis=1)
    groups = causal.drop_duplicates("item_id").set_index("item_id")["task_group"]
    expected = per_item.groupby(groups).mean().mean()
    assert abs(table.iloc[-1]["value"] - expected) <= 1e-9

    sensitivity = pd.read_csv(out / "heads_sensitivity.csv")
    floors = sorted({*SENSITIVITY_FLOORS, 0.07})
    assert list(sensitivity["floor"]) == floors and len(sensitivity) == len(floors)
    assert list(sensitivity.loc[sensitivity["chosen"], "floor"]) == [0.07]
    assert abs(sensitivity.loc[sensitivity["chosen"], "value"].iloc[0] - expected) <= 1e-9
    assert sensitivity["n_ranked"].is_monotonic_decreasing and sensitivity.loc[0, "n_ranked"] == 8
    full = sensitivity[sensitivity["top"].fillna("").str.count("L") == 2]
    assert full["value"].notna().all() and (full["n"] == 2).all() and len(full) >= 1


def test_heads_tiny_without_a_test_half_says_so(tiny_qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One task group: ranking only; the causal check is reported as not run, never silently empty."""
    result = Heads(model=tiny_qwen3_dir, item_ids=["retail-ok-0001", "retail-wrong-0001"], k=1, top_n=2, out=tmp_path,
                   figure=False, **FAST).run()
    assert result.status == 0 and result.figures == []
    assert "causal check not run: no T_wrong item in the test half" in capsys.readouterr().out
    assert not (result.out_dir / "heads_causal.jsonl").exists()
    sensitivity = pd.read_csv(result.out_dir / "heads_sensitivity.csv")
    assert len(sensitivity) == len(SENSITIVITY_FLOORS) and sensitivity["value"].isna().all()


def test_organism_heads_claim_uses_the_split_and_matched_heads(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    from probes.organism.validate import context_for, heads_claim

    ctx = context_for(heads_analysis(tmp_path, model=tiny_qwen3_dir), None)
    claim, rank = heads_claim(ctx, 2, 2, 0)
    causal = load_results(ctx.out_dir / "heads_causal.jsonl")
    _, test_groups = split_groups(it.task_group for it in ctx.items)
    assert set(causal["task_group"]) == test_groups and claim.n_records == causal["item_id"].nunique() == 2
    assert set(causal.attrs["meta"]["config"]["selections"]) == {"top-2", "random-2 #0", "random-2 #1"}
    assert bool(rank["ranked"].iloc[0]) and np.isfinite(claim.estimate.value)
