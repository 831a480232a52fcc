"""``linear``'s claims beyond "readable": the probe against the best surface shortcut (paired by task
group, Bonferroni over layers, minimum-effect test against δ) recomputed by hand on planted AUCs,
and the "no vector" equivalence claim, which holds on planted null features and fails as soon as
one layer carries the label."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from threadpoolctl import threadpool_limits

from probes.analyses.linear import (AUC_SESOI, NAME, NO_VECTOR_FAMILY, SHORTCUT_FAMILY, ProbeSettings, best_layers, group_aucs, group_table,
                                    probe_claims, probe_layers)
from probes.scoring.claims import claims_table


@pytest.fixture(autouse=True)
def _one_blas_thread():
    with threadpool_limits(1):
        yield


def _exact_p(values: np.ndarray) -> float:
    """One-sided sign-flip p of mean(values) > 0, every flip enumerated."""
    observed = values.mean()
    flips = [np.mean(values * signs) for signs in itertools.product((1, -1), repeat=len(values))]
    return float(np.mean(np.array(flips) >= observed - 1e-12))


def _best(config: str = "basm", k: int = 2, layer: int = 1, groups: int = 6) -> pd.DataFrame:
    return pd.DataFrame([{"config": config, "k": k, "best_layer": layer, "auc": 0.9, "low": 0.8, "high": 1.0, "shuffled": 0.5,
                          "null_low": 0.3, "null_high": 0.7, "p_perm": 0.005, "p_best_layer_maxnull": 0.005, "p_floor": 0.005,
                          "n_groups": groups}])


def test_group_aucs_are_within_group_mann_whitney():
    y = np.array([1, 0, 1, 0, 1, 0])
    scores = np.array([2.0, 1.0, 0.0, 1.0, 5.0, 5.0])
    aucs = group_aucs(y, scores, ["a", "a", "b", "b", "c", "c"])
    assert list(aucs.index) == ["a", "b", "c"] and list(aucs) == [1.0, 0.0, 0.5]
    assert np.isnan(group_aucs(np.array([1, 1]), np.array([0.0, 1.0]), ["a", "a"])["a"])  # one class: no AUC


def test_probe_beats_shortcut_claim_by_hand_on_planted_aucs():
    probe = np.array([0.9, 1.0, 0.8, 1.0, 0.9, 0.7])
    shortcut = np.array([0.5, 0.6, 0.5, 0.4, 0.5, 0.6])
    names = [f"g{i}" for i in range(6)]
    layers = [0, 1, 2]
    groups = pd.DataFrame([{"config": "basm", "k": 2, "layer": layer, "task_group": g, "probe_auc": p if layer == 1 else 0.5,
                            "shortcut_auc": s} for layer in layers for g, p, s in zip(names, probe, shortcut)])
    claims = probe_claims(_best(), groups, {"shortcut": "bag_of_words", "value": 0.7, "low": 0.6, "high": 0.8})
    [beats] = [c for c in claims if c.name == "basm k=2 probe>shortcut"]
    diff = probe - shortcut
    assert beats.family == SHORTCUT_FAMILY and beats.unit == "AUC" and beats.sesoi == AUC_SESOI and beats.n == 6
    assert beats.estimate == pytest.approx(diff.mean())
    # Bonferroni over the three probed layers: the best layer was chosen after looking
    assert beats.p == pytest.approx(3 * _exact_p(diff)) and beats.p == pytest.approx(3 / 64)
    assert beats.p_min_effect == pytest.approx(3 * _exact_p(diff - AUC_SESOI))
    assert beats.p_floor == pytest.approx(3 / 64) and "bag_of_words" in beats.statement and "Bonferroni × 3" in beats.note
    # one Holm family per question: the new claims never make "readable" untestable
    table = claims_table(claims).set_index("name")
    assert dict(zip(table.index, table["family"])) == {"basm k=2": NAME, "basm k=2 probe>shortcut": SHORTCUT_FAMILY,
                                                        "basm k=2 no vector": NO_VECTOR_FAMILY}
    assert (table["family_size"] == 1).all()

    # the shortcut as good as the probe: no claim; no shortcut at all: not tested, and the note says why
    tied = groups.assign(shortcut_auc=groups["probe_auc"])
    [even] = [c for c in probe_claims(_best(), tied, {"shortcut": "x"}) if c.name.endswith("probe>shortcut")]
    assert even.estimate == 0 and claims_table([even])["verdict"].iloc[0].startswith("not detected")
    none = [c for c in probe_claims(_best(), groups.assign(shortcut_auc=np.nan), None) if c.name.endswith("probe>shortcut")][0]
    assert none.n == 0 and "no shortcut" in none.note
    assert claims_table([none])["verdict"].iloc[0].startswith("not tested")


def _run(features: np.ndarray, y: np.ndarray, groups: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """probe_layers on planted features, then the summary's best-layer and within-group tables."""
    settings = ProbeSettings(permutations=9, resamples=50)
    ids = [f"i{n:04d}" for n in range(len(y))]
    items = {i: SimpleNamespace(bucket="T_ok" if label else "T_wrong", task_group=g) for i, label, g in zip(ids, y, groups)}
    rows = probe_layers(features, y, list(groups), settings)
    raw = pd.DataFrame([{"config": "basm", "k": 2, "layer": layer, "item_ids": ids, **row} for layer, row in enumerate(rows)])
    shortcut = pd.Series(np.random.default_rng(9).normal(size=len(ids)), index=ids)
    return best_layers(raw), group_table(raw, items, shortcut)


def _verdict(features: np.ndarray, y: np.ndarray, groups: np.ndarray) -> pd.Series:
    best, table = _run(features, y, groups)
    claims = claims_table(probe_claims(best, table, {"shortcut": "request_length_words"}))
    return claims.set_index("name").loc["basm k=2 no vector"]


def test_no_vector_equivalence_holds_on_null_features_and_fails_on_a_planted_one():
    n_groups, per = 200, 6  # 3 T_ok and 3 T_wrong per task group, as in the organism's; SE of the mean AUC ≈ 0.018
    y = np.tile([1, 0] * (per // 2), n_groups)
    groups = np.repeat([f"g{i:03d}" for i in range(n_groups)], per)
    rng = np.random.default_rng(0)
    null = rng.normal(size=(len(y), 2, 4))
    row = _verdict(null, y, groups)
    assert row["family"] == NO_VECTOR_FAMILY and row["kind"] == "absence" and row["sesoi"] == AUC_SESOI and row["verdict"].startswith("holds")
    assert abs(row["estimate"]) < AUC_SESOI and "every one of 2 probed layers" in row["statement"]

    strong = null.copy()
    strong[:, 1, 0] += 2.0 * y  # layer 1 carries the label; layer 0 stays null
    row = _verdict(strong, y, groups)
    assert row["verdict"].startswith("not shown") and "L1" in row["statement"]  # the intersection fails on the one strong layer
    assert row["estimate"] > AUC_SESOI

