"""``heads``: ranking only over heads that read B ∪ P and only on tool-correct items (abstention-correct
T_wrong items are their own bucket), split-half selection (rank on one half of the task groups,
knock out on the other), random heads drawn only among floor-passing heads and matched on B mass,
the span-mass floor chosen on the train split, Fig. 9's caption from its data, the claim; on
hand-made rows and rankings, through the CLI on a tiny random Qwen3, and on the bundled organism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probes.analyses.run_context import AnalysisError, open_context
from probes.analyses.heads import (
    MATCH_POOL,
    MATCH_TOLERANCE,
    SENSITIVITY_FLOORS,
    Heads,
    matched_random_sets,
    ranking,
    select_heads,
    split_groups,
    top_heads,
)
from probes.data.dataset import ABSTAIN, load_dataset, resolve_dataset
from probes.organism import ORGANISM_DIR
from probes.reporting.results import load_results
from probes.scoring.score import EPSILON
from probes.reporting.layout import figures_folder, rows_path, table_path

torch.set_num_threads(1)

# Two items (T_ok, T_wrong) in each of four task groups: two groups per half.
ITEMS = ["retail-ok-0001", "retail-wrong-0001", "retail-ok-0004", "retail-wrong-0004",
         "retail-ok-0007", "retail-wrong-0007", "retail-ok-0010", "retail-wrong-0010"]
FAST = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "split": "all", "dtype": "float32"}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def attention_rows(alpha: dict[str, tuple[list, list]], copies: int = 2, abstain: bool = False, bucket_as: str | None = None) -> pd.DataFrame:
    """Hand-made attention rows: per bucket of ``alpha``, ``copies`` items of one task group each."""
    sizes = {"boundary_size": 100, "procedure_size": 50}
    return pd.DataFrame([{"bucket": bucket_as or bucket, **sizes, "alpha_boundary_heads": b, "alpha_procedure_heads": p,
                          "correct_is_abstain": abstain, "item_id": f"{bucket}-{abstain}-{i}", "task_group": f"g{i}"}
                         for bucket, (b, p) in alpha.items() for i in range(copies)])


# ---------------------------------------------------------------------------- ranking
def test_head_ranking_leaves_out_heads_that_read_neither_span() -> None:
    """Ranking on hand-made per-head α: a head with almost no attention on B ∪ P has a huge
    ε-driven shift but is not ranked; the others are ordered by the shift of the bucket-averaged
    log ratio; span_mass is the smaller bucket mean of α_B·|B| + α_P·|P| and b_mass the T_wrong
    mean of α_B·|B| (recomputed here)."""
    # [layer, head] per-token α for a 1-layer, 3-head model: (0,0) shifts toward B, (0,1) is flat, (0,2) reads neither span
    alpha = {"T_ok": ([[0.002, 0.004, 1e-9]], [[0.008, 0.008, 1e-5]]), "T_wrong": ([[0.006, 0.004, 1e-5]], [[0.004, 0.008, 1e-9]])}
    rows = attention_rows(alpha)
    rank = ranking(rows, min_span_mass=0.05)
    assert [(r.layer, r.head, r.ranked) for r in rank.itertuples()] == [(0, 0, True), (0, 1, True), (0, 2, False)]
    log2 = lambda bucket, h: np.log2((alpha[bucket][0][0][h] + EPSILON) / (alpha[bucket][1][0][h] + EPSILON))  # noqa: E731
    for r in rank.itertuples():
        assert abs(r.shift - (log2("T_wrong", r.head) - log2("T_ok", r.head))) <= 1e-9
        mass = min(alpha[b][0][0][r.head] * 100 + alpha[b][1][0][r.head] * 50 for b in alpha)
        assert abs(r.span_mass - mass) <= 1e-12 and abs(r.b_mass - alpha["T_wrong"][0][0][r.head] * 100) <= 1e-12
    assert rank.iloc[2]["shift"] > rank.iloc[0]["shift"] > 0  # the unranked head's ε shift is the largest
    assert bool(ranking(rows, min_span_mass=0.0)["ranked"].all())
    assert top_heads(rank, 3) == [(0, 0), (0, 1)]  # the top set holds ranked heads only
    assert (rank["n_ok"] == 2).all() and (rank["n_wrong"] == 2).all() and (rank["n_abstain"] == 0).all()
    assert rank["log2_wrong_abstain"].isna().all() and (rank["floor"] == 0.05).all()


def test_ranking_excludes_abstention_correct_items() -> None:
    """Abstention-correct T_wrong rows are their own bucket: their log2 ratio per head is shown and
    counted, but the shift, the span masses and the order come from T_ok and tool-correct T_wrong
    rows only. Counted as tool-correct, the same rows would reverse the order (so the check bites)."""
    alpha = {"T_ok": ([[0.004, 0.004]], [[0.004, 0.004]]), "T_wrong": ([[0.006, 0.004]], [[0.004, 0.004]])}
    aside = {"T_wrong": ([[0.0001, 0.02]], [[0.008, 0.001]])}  # pulls head 1 far up, head 0 far down
    tool = attention_rows(alpha)
    rows = pd.concat([tool, attention_rows(aside, copies=3, abstain=True)], ignore_index=True)
    rank, clean = ranking(rows, 0.05), ranking(tool, 0.05)
    pd.testing.assert_frame_equal(rank.drop(columns=["log2_wrong_abstain", "n_abstain"]), clean.drop(columns=["log2_wrong_abstain", "n_abstain"]))
    assert [(r.layer, r.head) for r in rank.itertuples()] == [(0, 0), (0, 1)]
    assert (rank["n_abstain"] == 3).all() and (rank["n_wrong"] == 2).all()
    for r in rank.itertuples():
        expected = np.log2((aside["T_wrong"][0][0][r.head] + EPSILON) / (aside["T_wrong"][1][0][r.head] + EPSILON))
        assert abs(r.log2_wrong_abstain - expected) <= 1e-9
    mixed = ranking(rows.assign(correct_is_abstain=False), 0.05)
    assert [(r.layer, r.head) for r in mixed.itertuples()] == [(0, 1), (0, 0)]
    with pytest.raises(AnalysisError, match="no T_wrong rows with both spans and a correct tool"):
        ranking(pd.concat([attention_rows({"T_ok": alpha["T_ok"]}), attention_rows(aside, abstain=True)]))
    with pytest.raises(AnalysisError, match="correct_is_abstain"):
        ranking(tool.drop(columns="correct_is_abstain"))


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


def hand_ranking() -> pd.DataFrame:
    """1 layer, 11 heads. Top: h0 (B mass 0.4), h1 (0.3). Below the floor but nearest in B mass: h2
    (0.4), h3 (0.3). Floor-passing: h4..h10; h7 (B mass 0.05) has the top heads' B ∪ P mass, so a
    B ∪ P match would draw it; h8 (0.01) is far from both top heads."""
    b = [0.4, 0.3, 0.4, 0.3, 0.5, 0.25, 0.1, 0.05, 0.01, 0.6, 0.2]
    span = [0.6, 0.5, 0.01, 0.01, 2.0, 2.0, 2.0, 0.55, 2.0, 2.0, 2.0]
    shift = [2.0, 1.5, 5.0, 4.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    table = pd.DataFrame({"layer": 0, "head": range(11), "shift": shift, "span_mass": span, "b_mass": b,
                          "ranked": [s >= 0.05 for s in span]})
    return table.sort_values(["ranked", "shift"], ascending=[False, False]).reset_index(drop=True)


def test_random_heads_are_drawn_among_floor_passing_heads_matched_on_b_mass() -> None:
    rank = hand_ranking()
    top = top_heads(rank, 2)
    assert top == [(0, 0), (0, 1)]
    b = rank.set_index(["layer", "head"])["b_mass"]
    candidates = [(0, h) for h in (4, 5, 6, 7, 8, 9, 10)]  # ranked, not top: never h2/h3, though nearest in B mass
    # each random head comes from the MATCH_POOL·N nearest in log B mass of the candidates still free in its set
    reach = {t: set(sorted(candidates, key=lambda c: abs(np.log(b[c]) - np.log(b[t])))[:MATCH_POOL * 2 + 1]) for t in top}
    assert reach[(0, 0)] == reach[(0, 1)] == {(0, 4), (0, 5), (0, 6), (0, 9), (0, 10)}  # computed here, by B mass alone
    sets, pool = matched_random_sets(rank, top, draws=60, seed=0)
    assert pool == MATCH_POOL * 2
    drawn = {h for s in sets for h in s}
    assert drawn <= reach[(0, 0)] | reach[(0, 1)] and len(drawn) > 2  # random, within reach
    assert not drawn & {(0, 2), (0, 3), (0, 7), (0, 8)}  # no sub-floor head, no head matched only on B ∪ P
    assert all(len(set(s)) == 2 and not set(s) & set(top) for s in sets)
    assert matched_random_sets(rank, top, draws=60, seed=0) == (sets, pool)  # seeded: the same for every record


def test_too_few_floor_passing_heads_give_no_random_sets() -> None:
    """Heads 0 and 1 pass the floor, head 2 does not: with top-2 there is no floor-passing head left,
    and the check says so instead of drawing head 2; with top-1 the one random head is head 1."""
    alpha = {"T_ok": ([[0.002, 0.004, 1e-5]], [[0.008, 0.008, 1e-5]]), "T_wrong": ([[0.006, 0.004, 1e-4]], [[0.004, 0.008, 1e-5]])}
    rows = attention_rows(alpha)
    none = select_heads(rows, min_span_mass=0.05, top=2, draws=3, seed=0)
    assert none.sets == {} and none.top == [] and "never drawn" in none.note and none.match is None
    one = select_heads(rows, min_span_mass=0.05, top=1, draws=3, seed=0)
    assert one.sets == {"top-1": [(0, 0)], **{f"random-1 #{i}": [(0, 1)] for i in range(3)}}
    with pytest.raises(AnalysisError, match="floor-passing non-top heads"):
        matched_random_sets(ranking(rows, 0.05), [(0, 0), (0, 1)], draws=1, seed=0)


def test_fig09_caption_says_matched_only_when_the_plotted_match_holds() -> None:
    import matplotlib.pyplot as plt

    from probes.analyses.heads import fig09_candidate_heads

    rank = ranking(attention_rows({"T_ok": ([[0.002, 0.004, 0.003]], [[0.008, 0.008, 0.008]]),
                                   "T_wrong": ([[0.006, 0.004, 0.003]], [[0.004, 0.008, 0.008]])}), 0.05)
    def caption(random_mass: float) -> str:
        causal = pd.DataFrame({"selection": ["top-2", "random-2"], "value": [0.3, 0.1], "low": [0.1, 0.0], "high": [0.5, 0.2],
                               "n": [7, 7], "n_items": [15, 15], "b_mass": [0.4, random_mass], "n_abstain_excluded": [4, 4]})
        fig = fig09_candidate_heads(rank, causal, 2, "note", floor="0.05, chosen on the train split", match_tolerance=MATCH_TOLERANCE)
        text = "\n".join(t.get_text() for t in fig.texts)
        plt.close(fig)
        return text
    held, weak = caption(0.3), caption(0.1)
    assert "matched on B mass (mean 0.3 vs top 0.4)" in held and "NOT matched" not in held
    assert "NOT matched on B mass (mean 0.1 vs top 0.4" in weak
    for text in (held, weak):
        assert "2 task groups: 2 T_ok + 2 tool-correct T_wrong items (0 abstention-correct" in text
        assert "test half, 7 task groups, 15 tool-correct T_wrong items (4 abstention-correct excluded)" in text
        assert "3 of 3 heads reach B ∪ P mass ≥ 0.05" in text and "floor 0.05, chosen on the train split" in text


# ---------------------------------------------------------------------------- through the CLI
def heads_analysis(tmp_path: Path, **extra) -> Heads:
    return Heads(**{"item_ids": ITEMS, "k": 1, "top_n": 2, "random_draws": 2, "out": tmp_path, **FAST, **extra})


def test_heads_tiny_ranks_and_tests_on_disjoint_halves(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    """A floor given a priori (--floor-from given): ranked on one half, tested on the other's
    tool-correct T_wrong items; no train rows are written."""
    analysis = heads_analysis(tmp_path, model=tiny_qwen3_dir, min_span_mass=0.07, floor_from="given")
    result = analysis.run()
    assert result.status == 0
    out = result.out_dir
    assert out == tmp_path / tiny_qwen3_dir.name
    for name in ("fig08_head_heatmap", "fig09_candidate_heads"):
        for suffix in (".png", ".pdf"):
            assert (figures_folder(out) / f"{name}{suffix}").stat().st_size > 5000
    assert not rows_path(out, "heads", "heads_floor").exists() and "given a priori" in result.summary.messages[0]
    attention = load_results(rows_path(out, "heads"))
    assert np.array(attention["alpha_boundary_heads"].iloc[0]).shape == (2, 4) and set(attention["item_id"]) == set(ITEMS)
    # Resumes from the rows written above (nothing is rescored): the summary holds the halves.
    ctx = open_context(analysis)
    summary = analysis.summarise(ctx, analysis.collect(ctx))
    rows = summary.rows
    rank_items = set(rows.loc[rows["half"] == "rank", "item_id"])
    rank_groups = set(rows.loc[rows["half"] == "rank", "task_group"])
    assert len(rank_groups) == 2 and rows.groupby("task_group")["half"].nunique().eq(1).all()

    causal = load_results(rows_path(out, "heads", "heads_causal"))
    assert set(causal["bucket"]) == {"T_wrong"} and set(causal["item_id"]).isdisjoint(rank_items)
    assert set(causal["task_group"]).isdisjoint(rank_groups) and len(set(causal["task_group"])) == 2
    assert set(summary.causal_rows["half"]) == {"test"}
    # the ranking is the ranking half's, not all items'
    pd.testing.assert_frame_equal(summary.ranking, ranking(rows[rows["half"] == "rank"], 0.07))
    assert not np.allclose(ranking(rows, 0.0).sort_values(["layer", "head"])["shift"],
                           ranking(rows[rows["half"] == "rank"], 0.0).sort_values(["layer", "head"])["shift"])

    # one condition per distinct head set, as recorded in the results header, with the floor and its source
    config = causal.attrs["meta"]["config"]
    sets = {name: sorted(map(tuple, heads)) for name, heads in config["head_sets"].items()}
    assert set(causal["condition"]) == {"baseline", *sets} and len(set(map(tuple, sets.values()))) == len(sets)
    assert sorted(config["test_groups"]) == sorted(set(causal["task_group"]))
    assert (config["floor"], config["floor_from"], config["excluded_abstain"]) == (0.07, "given", [])

    table = pd.read_csv(table_path(out, "heads", "heads_causal_summary"))
    assert list(table["selection"]) == ["top-2", "random-2 #0", "random-2 #1", "random-2", "top-2 − random-2"]
    assert table.loc[:3, "b_mass"].notna().all()

    # Independent: top − pooled random from the raw rows (records of one item each), mean over task groups.
    chosen = {name.split("|", 1)[1]: cond for name, cond in config["selections"].items() if name.startswith("0.07|")}
    margin = causal.set_index(["item_id", "condition"])["margin"].unstack()
    per_item = margin[chosen["top-2"]] - margin[[chosen["random-2 #0"], chosen["random-2 #1"]]].mean(axis=1)
    groups = causal.drop_duplicates("item_id").set_index("item_id")["task_group"]
    expected = per_item.groupby(groups).mean().mean()
    assert abs(table.iloc[-1]["value"] - expected) <= 1e-9
    claims = pd.read_csv(table_path(out, "heads", "heads_claims"))
    assert list(claims["family"]) == ["heads"] and abs(claims["estimate"].iloc[0] - expected) <= 1e-9
    assert "given a priori" in claims["statement"].iloc[0]

    sensitivity = pd.read_csv(table_path(out, "heads", "heads_sensitivity"))
    floors = sorted({*SENSITIVITY_FLOORS, 0.07})
    assert list(sensitivity["floor"]) == floors and len(sensitivity) == len(floors)
    assert list(sensitivity.loc[sensitivity["chosen"], "floor"]) == [0.07]
    assert abs(sensitivity.loc[sensitivity["chosen"], "value"].iloc[0] - expected) <= 1e-9
    assert sensitivity["n_ranked"].is_monotonic_decreasing and sensitivity.loc[0, "n_ranked"] == 8
    full = sensitivity[sensitivity["n_top"] == 2]
    assert full["value"].notna().all() and (full["n"] == 2).all() and len(full) >= 1


def test_heads_tiny_without_a_test_half_says_so(tiny_qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One task group: ranking only; the causal check (and the floor's choice on train, which has one
    task group here too) is reported as not run, never silently empty."""
    result = Heads(model=tiny_qwen3_dir, item_ids=["retail-ok-0001", "retail-wrong-0001"], k=1, top_n=2, out=tmp_path,
                   figure=False, **FAST).run()
    assert result.status == 0 and result.figures == []
    printed = capsys.readouterr().out
    assert "causal check not run: no tool-correct T_wrong item in the test half" in printed
    assert "floor not chosen on the train split" in printed and "shown at --min-span-mass 0.05, untested" in printed
    assert not rows_path(result.out_dir, "heads", "heads_causal").exists()
    sensitivity = pd.read_csv(table_path(result.out_dir, "heads", "heads_sensitivity"))
    assert len(sensitivity) == len(SENSITIVITY_FLOORS) and sensitivity["value"].isna().all() and not sensitivity["chosen"].any()
    assert result.summary.differences is None and not table_path(result.out_dir, "heads", "heads_claims").exists()


# ---------------------------------------------------------------------------- the organism: the floor is chosen on train
ORGANISM_RUN = {"limit": 4, "floor_limit": 12, "k": 1, "top_n": 2, "random_draws": 2, "embedder": "lexical", "figure": False}


@pytest.fixture(scope="module")
def organism_run(tmp_path_factory: pytest.TempPathFactory):
    if not (ORGANISM_DIR / "model.safetensors").is_file():
        pytest.skip("organism weights not present")
    torch.set_num_threads(1)
    return Heads(model=ORGANISM_DIR, out=tmp_path_factory.mktemp("heads_organism"), **ORGANISM_RUN).run(verbose=False)


def independent_choice(attention: pd.DataFrame, causal: pd.DataFrame, floors: list[float], top: int) -> tuple[float | None, dict]:
    """The floor rule recomputed from the train rows alone: per floor the top heads (numpy on the
    per-head α of T_ok and tool-correct T_wrong rows), the random sets named in the knockout header,
    their B-mass match and Δ = Δm(top) − Δm(random) (mean over task groups); then the eligible floor
    with a holding match first, the largest Δ, ties → the higher floor."""
    used = attention[~attention["correct_is_abstain"].astype(bool) & (attention["boundary_size"] > 0) & (attention["procedure_size"] > 0)]

    def per_head(bucket: str) -> dict[str, np.ndarray]:
        sub = used[used["bucket"] == bucket]
        a = {span: np.array(sub[f"alpha_{span}_heads"].tolist()) for span in ("boundary", "procedure")}
        size = {span: sub[f"{span}_size"].to_numpy(float)[:, None, None] for span in ("boundary", "procedure")}
        return {"log2": np.log2((a["boundary"].mean(0) + EPSILON) / (a["procedure"].mean(0) + EPSILON)),
                "mass": (a["boundary"] * size["boundary"] + a["procedure"] * size["procedure"]).mean(0),
                "b": (a["boundary"] * size["boundary"]).mean(0)}

    ok, wrong = per_head("T_ok"), per_head("T_wrong")
    shift, span, b = wrong["log2"] - ok["log2"], np.minimum(ok["mass"], wrong["mass"]), wrong["b"]
    config = causal.attrs["meta"]["config"]
    margin = causal.set_index(["item_id", "condition"])["margin"].unstack()
    group = causal.drop_duplicates("item_id").set_index("item_id")["task_group"]
    rows = {}
    for floor in floors:
        ranked = [(l, h) for l, h in np.ndindex(shift.shape) if span[l, h] >= floor]
        best = sorted(ranked, key=lambda x: (-shift[x], x))[:top]
        names = {n.split("|", 1)[1]: c for n, c in config["selections"].items() if n.startswith(f"{floor!r}|")}
        randoms = [names[n] for n in names if n.startswith("random")]
        random_sets = [[tuple(h) for h in config["head_sets"][c]] for c in randoms]
        assert all(h in ranked and h not in best for s in random_sets for h in s)  # floor-passing, non-top
        entry = {"top": best, "value": np.nan, "match": None}
        if randoms:
            assert sorted(config["head_sets"][names[f"top-{len(best)}"]]) == sorted(map(list, best))
            ratio = np.mean([np.mean([b[h] for h in s]) for s in random_sets]) / np.mean([b[h] for h in best])
            per_item = margin[names[f"top-{len(best)}"]] - margin[randoms].mean(axis=1)
            entry.update(value=per_item.dropna().groupby(group).mean().mean(), match=bool(1 / MATCH_TOLERANCE <= ratio <= MATCH_TOLERANCE))
        rows[floor] = entry
    eligible = [f for f, e in rows.items() if len(e["top"]) == top and e["match"] is not None and np.isfinite(e["value"])]
    chosen = max(eligible, key=lambda f: (rows[f]["match"], rows[f]["value"], f)) if eligible else None
    return chosen, rows


def test_organism_heads_floor_is_chosen_on_train_only(organism_run) -> None:
    """Every item of the floor-selection rows is a train item outside the run's task groups (none
    is eval); the chosen floor is the rule applied to those rows, recomputed here; the run's ranking
    and knockouts use it unchanged; abstention-correct items are excluded and listed."""
    result, summary = organism_run, organism_run.summary
    out = result.out_dir
    dataset = load_dataset(resolve_dataset("basm_probe"))
    split = {item.id: item.split for item in dataset.items}
    attention, causal = load_results(rows_path(out, "heads", "heads_floor")), load_results(rows_path(out, "heads", "heads_floor_causal"))
    run_items = load_results(rows_path(out, "heads"))
    train_ids = set(attention["item_id"]) | set(causal["item_id"])
    assert train_ids and {split[i] for i in train_ids} == {"train"} and {split[i] for i in run_items["item_id"]} == {"eval"}
    assert set(attention["task_group"]).isdisjoint(causal["task_group"])  # the train halves
    assert (set(attention["task_group"]) | set(causal["task_group"])).isdisjoint(run_items["task_group"])
    assert attention.attrs["meta"]["config"]["items"]["split"] == "train"
    assert not causal["correct_is_abstain"].any() and causal.attrs["meta"]["config"]["excluded_abstain"]

    floors = sorted({*SENSITIVITY_FLOORS, Heads.min_span_mass})
    chosen, recomputed = independent_choice(attention, causal, floors, ORGANISM_RUN["top_n"])
    table = summary.floor.table.set_index("floor")
    assert chosen is not None and summary.floor.floor == chosen and summary.floor.source == "train"
    assert list(table.index[table["chosen"]]) == [chosen] and bool(table.loc[chosen, "eligible"])
    for floor, entry in recomputed.items():
        assert table.loc[floor, "top"] == " ".join(f"L{l}H{h}" for l, h in entry["top"])
        assert np.isclose(table.loc[floor, "value"], entry["value"], equal_nan=True), floor
    # not the floor a rule on Δ alone would give, and not the a-priori one: the rule matters here
    assert len({e["value"] for e in recomputed.values()}) > 2

    # the run applies that floor unchanged: ranking, knockout header, sensitivity marking, claim wording
    assert (summary.ranking["floor"] == chosen).all()
    eval_causal = load_results(rows_path(out, "heads", "heads_causal"))
    assert eval_causal.attrs["meta"]["config"]["floor"] == chosen and eval_causal.attrs["meta"]["config"]["floor_from"] == "train"
    assert list(summary.sensitivity.loc[summary.sensitivity["chosen"], "floor"]) == [chosen]
    items = {item.id: item for item in dataset.items}
    excluded = eval_causal.attrs["meta"]["config"]["excluded_abstain"]
    assert all(items[i].correct_action == ABSTAIN and items[i].bucket == "T_wrong" for i in excluded)
    assert all(items[i].correct_action != ABSTAIN for i in eval_causal["item_id"])
    assert int(summary.causal["n_abstain_excluded"].iloc[0]) == len(excluded)
    assert table_path(out, "heads", "heads_floor_selection").is_file() and f"floor {chosen:g} chosen on the train split" in summary.messages[0]


def test_organism_heads_claim_and_planted_heads(organism_run) -> None:
    summary = organism_run.summary
    [claim] = Heads().claims(summary)
    last = summary.causal.iloc[-1]
    assert claim.family == "heads" and claim.name == "top-2>random-2" and claim.estimate == pytest.approx(last["value"], abs=1e-12)
    assert claim.n == last["n"] and "chosen on the train split" in claim.statement
    assert ("matched on B mass" in claim.statement) == bool(summary.selection.match)
    # planted heads, from the organism's training configuration, counted here
    cfg = json.loads((ORGANISM_DIR / "training_summary.json").read_text())["train_config"]
    planted = {(layer, head) for _, layer, head in cfg["planted_heads"]}
    hits = len(planted & set(summary.selection.top))
    ranked = [(r.layer, r.head) for r in summary.ranking[summary.ranking["ranked"]].itertuples()]
    [line] = [m for m in summary.messages if m.startswith("planted heads")]
    assert f"{hits} of the top-2 heads are planted" in line
    for target, layer, head in cfg["planted_heads"]:
        place = f"ranked #{ranked.index((layer, head)) + 1} of {len(ranked)}" if (layer, head) in ranked else "not ranked"
        assert f"{target} L{layer}H{head} {place}" in line


def test_organism_heads_claim_uses_the_analysis_selection(organism_run) -> None:
    """``organism validate``'s heads claim is the analysis's own result (floor from train, same sets)."""
    from probes.organism.validate import context_for, heads_claim

    ctx = context_for(Heads(model=ORGANISM_DIR, out=organism_run.out_dir.parent, **ORGANISM_RUN), None)
    claim, rank = heads_claim(ctx, ORGANISM_RUN["top_n"], ORGANISM_RUN["random_draws"], 0)  # resumes from the rows above
    diffs = organism_run.summary.differences
    assert claim.note == ctx.options.claims(organism_run.summary)[0].note and claim.estimate == pytest.approx(diffs.groupby("task_group")["value"].mean().mean())
    pd.testing.assert_frame_equal(rank, organism_run.summary.ranking)
    assert "chosen on the train split" in claim.statement
