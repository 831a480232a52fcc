"""The ``ratios`` group-paired shifts, strata, length control, claims and Fig. 4 caption, on
hand-made rows checked against independent hand computations (numpy by hand, no model)."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from probes.analyses import ratios
from probes.organism.validate import eta_claim
from probes.scoring.claims import claims_table

EPS = 1e-6  # Eq. 2's ε, as probes.scoring.score.EPSILON


def record(config: str, bucket: str, group: str, item: str, log2_eta: float, *, b: int = 100, p: int = 50,
           abstain: bool = False, depth: int = 0) -> dict:
    """One results row whose layer/head-mean α gives log2 η = ``log2_eta`` (one layer, one head)."""
    a_p = 0.01
    a_b = (a_p + EPS) * 2.0 ** log2_eta - EPS
    return {"config": config, "bucket": bucket, "task_group": group, "item_id": item, "alpha_boundary": a_b, "alpha_procedure": a_p,
            "alpha_boundary_heads": [[a_b]], "alpha_procedure_heads": [[a_p]], "boundary_size": b, "procedure_size": p,
            "correct_is_abstain": abstain, "deciding_depth": depth}


def hand_log2(frame: pd.DataFrame) -> np.ndarray:
    return np.log2((frame["alpha_boundary"].to_numpy() + EPS) / (frame["alpha_procedure"].to_numpy() + EPS))


def exact_sign_flip_p(d: np.ndarray) -> float:
    """One-sided p of mean(d) > 0 over all 2^G sign patterns (the observed one included)."""
    null = np.array([np.mean(np.array(signs) * d) for signs in itertools.product((1, -1), repeat=len(d))])
    return float(np.mean(null >= d.mean() - 1e-12))


def cell(shifts: pd.DataFrame, **where) -> pd.Series:
    mask = np.ones(len(shifts), bool)
    for k, v in where.items():
        mask &= (shifts[k] == v).to_numpy()
    (index,) = np.flatnonzero(mask)
    return shifts.iloc[index]


def test_paired_shift_matches_hand_computation() -> None:
    rng = np.random.default_rng(1)
    rows = []
    for g in range(6):  # unbalanced: 1-3 items per bucket
        for bucket in ("T_ok", "T_wrong"):
            for i in range(int(rng.integers(1, 4))):
                rows.append(record("basm", bucket, f"g{g}", f"{bucket}-{g}-{i}", float(rng.normal(g * 0.1, 1))))
    rows.append(record("basm", "T_ok", "only-ok", "o", 5.0))  # no T_wrong: not a pair
    rows.append(record("basm", "T_wrong", "only-wrong", "w", -5.0))
    rows = pd.DataFrame(rows)
    shifts, _, _, _ = ratios.shift_tables(rows, "deciding", 2, seed=0, resamples=20)
    got = cell(shifts, target="T_wrong", config="basm", stratum="pooled")

    log2 = hand_log2(rows)
    d, n_target, n_reference = [], 0, 0
    for g in [f"g{i}" for i in range(6)]:
        wrong = log2[(rows["task_group"] == g) & (rows["bucket"] == "T_wrong")]
        ok = log2[(rows["task_group"] == g) & (rows["bucket"] == "T_ok")]
        d.append(wrong.mean() - ok.mean())
        n_target, n_reference = n_target + len(wrong), n_reference + len(ok)
    d = np.array(d)
    assert got["value"] == pytest.approx(d.mean(), abs=1e-12)
    assert (got["n"], got["n_target"], got["n_reference"]) == (6, n_target, n_reference)
    assert got["p"] == pytest.approx(exact_sign_flip_p(d), abs=1e-12)  # 2^6 ≤ the resamples: the test is exact
    assert got["p_floor"] == 2.0 ** -6
    assert got["low"] <= got["value"] <= got["high"]


def strata_rows() -> pd.DataFrame:
    """5 groups; T_ok: two items read at the decision row; T_wrong: two tool-correct items and one
    abstention-correct item at the decision row; only g0 also has one later-name-row item per bucket."""
    rng = np.random.default_rng(2)
    rows = []
    for g in range(5):
        for i in range(2):
            rows.append(record("basm", "T_ok", f"g{g}", f"ok-{g}-{i}", float(rng.normal())))
            rows.append(record("basm", "T_wrong", f"g{g}", f"wrong-{g}-{i}", float(rng.normal())))
        rows.append(record("basm", "T_wrong", f"g{g}", f"abstain-{g}", float(rng.normal(1)), abstain=True))
    rows.append(record("basm", "T_ok", "g0", "ok-later", 0.3, depth=1))
    rows.append(record("basm", "T_wrong", "g0", "wrong-later", 1.7, depth=2))
    return pd.DataFrame(rows)


def test_strata_match_hand_computation_and_one_group_has_no_ci() -> None:
    rows = strata_rows()
    shifts, _, _, _ = ratios.shift_tables(rows, "deciding", 2, seed=0, resamples=20)
    log2 = pd.Series(hand_log2(rows), index=rows.index)
    wrong, ok = rows["bucket"] == "T_wrong", rows["bucket"] == "T_ok"
    abstain, later = rows["correct_is_abstain"], rows["deciding_depth"] > 0
    expected = {  # stratum: (target records, reference records)
        "pooled": (wrong, ok), "tool-correct": (wrong & ~abstain, ok), "abstention-correct": (wrong & abstain, ok),
        "decision row": (wrong & ~later, ok & ~later), "later name row": (wrong & later, ok & later),
        "tool-correct · decision row": (wrong & ~abstain & ~later, ok & ~later), "tool-correct · later row": (wrong & ~abstain & later, ok & later),
    }
    for stratum, (target, reference) in expected.items():
        groups = sorted(set(rows.loc[target, "task_group"]) & set(rows.loc[reference, "task_group"]))
        d = [log2[target & (rows["task_group"] == g)].mean() - log2[reference & (rows["task_group"] == g)].mean() for g in groups]
        got = cell(shifts, target="T_wrong", stratum=stratum)
        assert got["value"] == pytest.approx(np.mean(d), abs=1e-12), stratum
        assert got["n"] == len(groups), stratum
    later_cell = cell(shifts, target="T_wrong", stratum="later name row")
    assert later_cell["n"] == 1 and np.isnan(later_cell["low"]) and np.isnan(later_cell["high"]) and np.isnan(later_cell["p"])
    assert later_cell["note"] == "no CI (1 group)"
    assert cell(shifts, target="T_wrong", stratum="tool-correct · later row")["same_records_as"] == "later name row"
    assert cell(shifts, target="T_wrong", stratum="tool-correct")["same_records_as"] == ""
    headline = shifts[shifts["headline"]]
    assert list(headline["stratum"]) == ["tool-correct · decision row"] and list(headline["target"]) == ["T_wrong"]


def length_rows(seed: int, *, bucket_effect: float, slope_b: float, slope_p: float, noise: float, groups: int = 8,
                wrong_b_factor: float = 1.0) -> pd.DataFrame:
    """Per group 2-3 items per bucket; log2 η = group effect + bucket_effect·[T_wrong] + slope_b·log2|B|
    + slope_p·log2|P| + noise; T_wrong's |B| is ``wrong_b_factor`` times T_ok's."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        base = rng.normal(0, 1)
        for bucket in ("T_ok", "T_wrong"):
            for i in range(int(rng.integers(2, 4))):
                b = int(round(150 * (wrong_b_factor if bucket == "T_wrong" else 1.0) * rng.uniform(0.7, 1.4)))
                p = int(rng.integers(40, 90))
                y = base + bucket_effect * (bucket == "T_wrong") + slope_b * np.log2(b) + slope_p * np.log2(p) + rng.normal(0, noise)
                rows.append(record("basm", bucket, f"g{g}", f"{bucket}-{g}-{i}", float(y), b=b, p=p))
    return pd.DataFrame(rows)


def test_length_regression_matches_hand_weighted_least_squares() -> None:
    rows = length_rows(3, bucket_effect=0.3, slope_b=-0.8, slope_p=0.2, noise=0.3)
    fit = ratios.length_adjusted(ratios.eta_records(rows), "T_wrong", resamples=200, seed=0)

    # by hand: X = [T_wrong, log2|B|, log2|P|, group indicators], W = 1/n(group, bucket), β = (XᵀWX)⁻¹XᵀWy
    y = hand_log2(rows)
    dummies = pd.get_dummies(rows["task_group"]).to_numpy(float)
    X = np.column_stack([(rows["bucket"] == "T_wrong").to_numpy(float), np.log2(rows["boundary_size"]), np.log2(rows["procedure_size"]), dummies])
    W = 1.0 / rows.groupby(["task_group", "bucket"])["item_id"].transform("size").to_numpy(float)
    XtW = X.T * W
    beta = np.linalg.solve(XtW @ X, XtW @ y)
    assert fit["adjusted"] == pytest.approx(beta[0], abs=1e-9)
    assert fit["slope_boundary"] == pytest.approx(beta[1], abs=1e-9)
    assert fit["slope_procedure"] == pytest.approx(beta[2], abs=1e-9)
    assert fit["low"] < fit["adjusted"] < fit["high"]

    # cluster-robust (CR1) one-sided p by hand, t with G − 1 df
    e = y - X @ beta
    bread = np.linalg.inv(XtW @ X)
    groups = rows["task_group"].to_numpy()
    meat = sum(np.outer(s, s) for s in ((X[groups == g].T * W[groups == g]) @ e[groups == g] for g in sorted(set(groups))))
    n, k, G = len(y), X.shape[1], len(set(groups))
    V = G / (G - 1) * (n - 1) / (n - k) * bread @ meat @ bread
    assert fit["p"] == pytest.approx(scipy_stats.t.sf(beta[0] / np.sqrt(V[0, 0]), G - 1), abs=1e-9)

    # without the length terms, the weights make the bucket coefficient the group-paired shift exactly
    X0 = np.column_stack([X[:, 0], dummies])
    beta0 = np.linalg.solve((X0.T * W) @ X0, (X0.T * W) @ y)
    paired = [y[(groups == g) & (rows["bucket"] == "T_wrong")].mean() - y[(groups == g) & (rows["bucket"] == "T_ok")].mean()
              for g in sorted(set(groups))]
    assert beta0[0] == pytest.approx(np.mean(paired), abs=1e-12)
    assert fit["unadjusted"] == pytest.approx(np.mean(paired), abs=1e-12)
    # the lengths next to it: group-paired difference of log2|B|, mean |B| per bucket
    log2_b = np.log2(rows["boundary_size"].to_numpy(float))
    d_b = [log2_b[(groups == g) & (rows["bucket"] == "T_wrong")].mean() - log2_b[(groups == g) & (rows["bucket"] == "T_ok")].mean()
           for g in sorted(set(groups))]
    assert fit["d_log2_boundary"] == pytest.approx(np.mean(d_b), abs=1e-12)
    assert fit["boundary_target"] == pytest.approx(rows.loc[rows["bucket"] == "T_wrong", "boundary_size"].mean(), abs=1e-9)


def test_length_regression_says_when_it_cannot_give_an_interval() -> None:
    # one item per bucket in 3 groups: 3 within-group differences, 3 parameters: an exact fit
    exact = pd.DataFrame([record("basm", bucket, f"g{g}", f"{bucket}-{g}", float(g + (bucket == "T_wrong") * g / 3), b=100 + 17 * g + 5 * (bucket == "T_ok"),
                                 p=40 + 3 * g * (bucket == "T_ok")) for g in range(3) for bucket in ("T_ok", "T_wrong")])
    fit = ratios.length_adjusted(ratios.eta_records(exact), "T_wrong", resamples=50)
    assert np.isfinite(fit["adjusted"]) and np.isnan(fit["low"]) and np.isnan(fit["high"]) and np.isnan(fit["p"])
    assert fit["note"].startswith("no CI, no p: the model fits the records exactly")
    summary = ratios.summarise_rows(exact, k=2, resamples=50)
    assert not any(c.name.startswith("length-adjusted") for c in summary.claims)
    # |B| and |P| constant within each group: their slopes are not identified next to the group effects
    flat = pd.DataFrame([record("basm", bucket, f"g{g}", f"{bucket}-{g}-{i}", float(i + g), b=100 + 10 * g, p=50 + g * g)
                         for g in range(4) for bucket in ("T_ok", "T_wrong") for i in range(2)])
    fit = ratios.length_adjusted(ratios.eta_records(flat), "T_wrong", resamples=50)
    assert np.isnan(fit["adjusted"]) and fit["note"].startswith("not identified")
    assert fit["unadjusted"] == pytest.approx(0.0, abs=1e-12)


def test_planted_length_confound_is_removed_by_the_regression() -> None:
    # no bucket effect; η falls with |B| (slope −1, as a fixed attention mass spread over B would) and T_wrong's B is half as long
    rows = length_rows(4, bucket_effect=0.0, slope_b=-1.0, slope_p=0.0, noise=0.05, groups=10, wrong_b_factor=0.5)
    summary = ratios.summarise_rows(rows, row="deciding", k=2, resamples=300)
    shift = cell(summary.shifts, row="deciding", target="T_wrong", stratum="pooled")
    fit = summary.length.set_index(["row", "target", "stratum"]).loc[("deciding", "T_wrong", "pooled")]
    assert shift["low"] > 0.5  # the unadjusted shift is the confound: about +1
    assert fit["low"] < 0 < fit["high"] and abs(fit["adjusted"]) < 0.1
    assert fit["slope_boundary"] == pytest.approx(-1.0, abs=0.1)
    assert fit["d_log2_boundary"] < -0.7


def test_planted_abstention_items_alone_create_the_pooled_shift() -> None:
    """Tool-correct T_wrong items have exactly T_ok's group means (±0.05 by group, summing to 0);
    one abstention-correct item per group sits 1.0 higher: the pooled shift is 1/3, the headline 0."""
    rows = []
    for g in range(8):
        base, d = float(g) * 0.4, 0.05 * (-1) ** g
        for i, jitter in enumerate((-0.1, 0.1)):
            rows.append(record("basm", "T_ok", f"g{g}", f"ok-{g}-{i}", base + jitter))
            rows.append(record("basm", "T_wrong", f"g{g}", f"wrong-{g}-{i}", base + d + jitter))
        rows.append(record("basm", "T_wrong", f"g{g}", f"abstain-{g}", base + 1.0, abstain=True, b=60))
    rows = pd.DataFrame(rows)
    summary = ratios.summarise_rows(rows, row="deciding", k=2, resamples=100)
    shifts = summary.shifts[summary.shifts["row"] == "deciding"]
    pooled, headline = cell(shifts, stratum="pooled"), cell(shifts, stratum="tool-correct · decision row")
    assert headline["value"] == pytest.approx(0.0, abs=1e-12) and headline["low"] < 0 < headline["high"]
    assert pooled["value"] == pytest.approx(1 / 3, abs=1e-12) and pooled["low"] > 0
    table = claims_table(summary.claims).set_index("name")
    assert table.loc["shift T_wrong · BASM · tool-correct · decision row", "verdict"] != "holds"
    assert table.loc["shift T_wrong · BASM · tool-correct · decision row", "family"] == "ratios"
    assert table.loc["shift T_wrong · BASM · pooled", "verdict"] == "exploratory: significant after Holm, not a confirmatory claim"
    assert table.loc["shift T_wrong · BASM · pooled", "family"] == "ratios-strata"
    # the pooled η (ratio of means) mixes the populations too: every item above the tool-correct ones
    by_answer = summary.eta_by_answer.set_index(["row", "population"]).loc["deciding"]
    assert by_answer.loc["abstention-correct", "eta"] > by_answer.loc["every item", "eta"] > by_answer.loc["tool-correct", "eta"]


def controls_rows() -> pd.DataFrame:
    rng = np.random.default_rng(5)
    rows = []
    for config, effect in (("basm", 0.8), ("pad-filler", 0.1), ("pad-procedure", 0.3)):
        for g in range(6):
            base = g * 0.2
            for bucket, shift in (("T_ok", 0.0), ("T_wrong", effect), ("T_repair", effect / 2)):
                for i in range(2):
                    rows.append(record(config, bucket, f"g{g}", f"{bucket}-{g}-{i}", base + shift + float(rng.normal(0, 0.2)),
                                       b=int(rng.integers(80, 160)), p=int(rng.integers(40, 80))))
    return pd.DataFrame(rows)


def test_control_contrasts_claims_and_eta_claim() -> None:
    rows = controls_rows()
    summary = ratios.summarise_rows(rows, row="deciding", k=2, resamples=50)
    log2 = pd.Series(hand_log2(rows), index=rows.index)

    def hand_shift(config: str, g: str) -> float:
        at = (rows["config"] == config) & (rows["task_group"] == g)
        return log2[at & (rows["bucket"] == "T_wrong")].mean() - log2[at & (rows["bucket"] == "T_ok")].mean()

    groups = [f"g{g}" for g in range(6)]
    for control in ("pad-filler", "pad-procedure"):
        got = cell(summary.controls, row="deciding", target="T_wrong", control=control)
        assert got["value"] == pytest.approx(np.mean([hand_shift("basm", g) - hand_shift(control, g) for g in groups]), abs=1e-12)
    table = claims_table(summary.claims)  # names are unique within a family, or this raises
    primary = set(table.loc[table["family"] == "ratios", "name"])
    assert primary == {"shift T_wrong · BASM · tool-correct · decision row", "shift T_repair · BASM · tool-correct · decision row",
                       "shift T_wrong · BASM > Irrelevant padding · tool-correct · decision row",
                       "shift T_wrong · BASM > Procedure padding · tool-correct · decision row"}
    strata = table[table["family"] == "ratios-strata"]
    assert "length-adjusted shift T_wrong · BASM · tool-correct · decision row" in set(strata["name"])
    assert not strata["name"].str.contains("Irrelevant|Procedure padding").any()  # claims are BASM's
    assert ratios.Ratios().claims(summary) == summary.claims
    # the organism validation's η claim is the headline cell
    headline = cell(summary.shifts, headline=True)
    claim = eta_claim(rows[rows["bucket"].isin(["T_ok", "T_wrong"])], seed=0)
    assert claim.estimate == pytest.approx(headline["value"], abs=1e-12)
    assert (claim.low, claim.high) == pytest.approx((headline["low"], headline["high"]), abs=1e-12)


def test_fig04_caption_states_counts_strata_and_headline_from_the_data() -> None:
    rows = pd.concat([controls_rows(), strata_rows().assign(config="basm", task_group=lambda f: "s" + f["task_group"])])
    summary = ratios.summarise_rows(rows, "NOTE", row="deciding", k=2, resamples=20)
    shifts = summary.shifts[summary.shifts["row"] == "deciding"]
    fig = ratios.fig04_boundary_attention(summary.eta[summary.eta["row"] == "deciding"], shifts, "NOTE")
    text = "\n".join(t.get_text() for t in fig.texts)
    h = cell(shifts, headline=True)
    assert f"{int(h['n'])} task groups, {int(h['n_target'])} T_wrong / {int(h['n_reference'])} T_ok items" in text
    assert f"= {h['value']:+.3f} [{h['low']:+.3f}, {h['high']:+.3f}]" in text and "headline:" in text
    # the later-name-row stratum exists only under BASM (one group): drawn without a CI, its count under the bar
    axis = fig.axes[2]
    ticks = [t.get_text() for t in axis.get_xticklabels()]
    later = next(t for t in ticks if t.startswith("later name row"))
    assert "1 groups" in later or "0–1 groups" in later
    assert any(t.get_text() == "no CI (1 group)" for t in axis.texts)
    assert "★ tool-correct" in ticks[0]
    assert "tool-correct · later row = later name row" in text.split("not drawn again, the same records as another stratum:")[1]
    assert not any(t.startswith("tool-correct ·\nlater row") for t in ticks)
    n_eta = sorted(set(summary.eta.loc[summary.eta["row"] == "deciding", "n"]))
    assert f"{n_eta[0]}–{n_eta[-1]} task groups" in text or f"{n_eta[0]} task groups" in text
    plt.close(fig)
