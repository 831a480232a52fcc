"""``linear`` probe statistics: the default permutation test can reach p < 0.01, the best-layer
claim is tested against the max-over-layers null (one label permutation shared by every layer),
the exact Newton fit equals scikit-learn's pipeline, and a one-class training fold is an error."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

import probes.analyses.linear as linear
from probes.analyses.linear import DEFAULT_PERMUTATIONS, ProbeSettings, grouped_folds, out_of_fold_scores, permuted_labels, probe_layers


@pytest.fixture(autouse=True)
def _one_blas_thread():
    with threadpool_limits(1):
        yield


def _data(n_groups: int = 10, per: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """40 items in 10 task groups, each group half T_ok (1), half T_wrong (0)."""
    return np.tile([1, 0] * (per // 2), n_groups), np.repeat([f"g{i:02d}" for i in range(n_groups)], per)


def _planted(y: np.ndarray, rng: np.random.Generator, d: int = 8, shift: float = 2.0) -> np.ndarray:
    X = rng.normal(size=(len(y), d))
    X[:, 0] += shift * y  # one feature dimension carries the label
    return X


def test_one_default_permutation_count_reaches_p_below_001():
    from probes.analyses.linear import Linear
    from probes.cli.main import build_parser
    from probes.cli.flags import options_from_args

    assert ProbeSettings().permutations == DEFAULT_PERMUTATIONS >= 199
    assert Linear().permutations == DEFAULT_PERMUTATIONS
    args = build_parser().parse_args(["linear"])
    assert Linear(**options_from_args(args, Linear)).permutations == DEFAULT_PERMUTATIONS  # the CLI and the library share one default
    assert 1 / (1 + DEFAULT_PERMUTATIONS) < 0.01


def test_default_settings_planted_feature_vs_random():
    y, groups = _data()
    rng = np.random.default_rng(0)
    planted, noise = probe_layers(np.stack([_planted(y, rng), rng.normal(size=(len(y), 8))], axis=1), y, groups)
    assert planted["n_permutations"] == DEFAULT_PERMUTATIONS and planted["n_folds"] == 5
    assert planted["auc"] > 0.8 and planted["p_perm"] < 0.01 and planted["p_perm"] == pytest.approx(1 / 200)
    assert planted["null_low"] < 0.5 < planted["null_high"] < planted["auc"]
    assert noise["p_perm"] > 0.05 and noise["null_low"] < noise["auc"] < noise["null_high"]


def test_permuted_labels_are_seeded_and_keep_groups_and_folds():
    y, groups = _data()
    Y = permuted_labels(y, groups, 50, seed=3)
    assert Y.shape == (50, len(y)) and np.array_equal(Y, permuted_labels(y, groups, 50, seed=3))
    assert len({row.tobytes() for row in Y}) > 40
    for g in set(groups):
        assert (Y[:, groups == g].sum(1) == y[groups == g].sum()).all()
    # folds depend on the per-group class counts only: permuted labels get the observed folds
    reference = grouped_folds(y, groups, 5, seed=0)
    for row in Y[:5]:
        assert all(np.array_equal(a[1], b[1]) for a, b in zip(grouped_folds(row, groups, 5, seed=0), reference))


def test_max_over_layers_null_for_the_best_layer(monkeypatch):
    y, groups = _data()
    rng = np.random.default_rng(1)
    random_layers = [rng.normal(size=(len(y), 8)) for _ in range(4)]
    draws = []
    original = linear.permuted_labels

    def spy(*args, **kwargs):
        draws.append(original(*args, **kwargs))
        return draws[-1]

    monkeypatch.setattr(linear, "permuted_labels", spy)
    one_informative = probe_layers(np.stack([*random_layers[:2], _planted(y, rng), *random_layers[2:]], axis=1), y, groups)
    assert len(draws) == 1 and draws[0].shape == (DEFAULT_PERMUTATIONS, len(y))  # one permutation matrix for all layers
    best = max(one_informative, key=lambda row: row["auc"])
    assert best is one_informative[2] and best["p_maxnull"] < 0.01
    assert len({row["maxnull_high"] for row in one_informative}) == 1  # one max-null per (config, k)

    all_random = probe_layers(np.stack(random_layers, axis=1), y, groups)
    best = max(all_random, key=lambda row: row["auc"])
    assert best["p_maxnull"] > 0.05 and best["p_maxnull"] >= best["p_perm"]  # family-wise ≥ per layer
    assert best["maxnull_mean"] > best["null_mean"]


def test_same_permutations_at_every_layer():
    """A duplicated layer gets the identical null, and with only copies the max-null is that null."""
    y, groups = _data()
    X = np.random.default_rng(2).normal(size=(len(y), 8))
    settings = ProbeSettings(permutations=49, resamples=50)
    a, b = probe_layers(np.stack([X, X], axis=1), y, groups, settings)
    for key in ("auc", "null_mean", "null_low", "null_high", "p_perm"):
        assert a[key] == b[key], key
    assert (a["maxnull_low"], a["maxnull_high"], a["p_maxnull"]) == (a["null_low"], a["null_high"], a["p_perm"])


@pytest.mark.parametrize("d", [6, 120])  # fewer and more features than training items
def test_newton_fit_equals_sklearn_pipeline(d):
    y, groups = _data()
    X = _planted(y, np.random.default_rng(4), d=d, shift=1.0)
    folds = grouped_folds(y, groups, 5, seed=0)
    ours = out_of_fold_scores(X, y, folds, C=0.5)
    reference = np.full(len(y), np.nan)
    for train, test in folds:
        model = make_pipeline(StandardScaler(), LogisticRegression(C=0.5, tol=1e-12, max_iter=100_000)).fit(X[train], y[train])
        reference[test] = model.decision_function(X[test])
    np.testing.assert_allclose(ours, reference, atol=1e-4)  # lbfgs stops at a gradient ~1e-7, Newton closer
    both = out_of_fold_scores(X, np.stack([y, y[::-1]]), folds, C=0.5)  # label rows fitted together = one by one
    np.testing.assert_allclose(both[0], ours, atol=1e-9)
    np.testing.assert_allclose(both[1], out_of_fold_scores(X, y[::-1], folds, C=0.5), atol=1e-9)


def test_one_class_training_fold_is_an_error():
    y, groups = _data()
    X = np.random.default_rng(5).normal(size=(len(y), 4))
    positives, negatives = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    folds = [(positives, negatives), (negatives, positives)]
    with pytest.raises(ValueError, match=r"fold 0: its 20 training items hold one class only"):
        out_of_fold_scores(X, y, folds)


def test_no_task_disjoint_cv_and_zero_permutations():
    y, groups = _data(n_groups=1)
    (row,) = probe_layers(np.zeros((len(y), 1, 3)), y, groups)
    assert np.isnan(row["auc"]) and np.isnan(row["p_maxnull"]) and row["n_folds"] == 0 and "no grouped CV by task_group" in row["note"]
    with pytest.raises(ValueError, match="permutations must be ≥ 1"):
        probe_layers(np.zeros((len(y), 1, 3)), y, groups, ProbeSettings(permutations=0))


def test_constant_layer_is_not_probed_and_leaves_the_max_null_family():
    """The embedding of one fixed decision token is the same for every item: AUC 0.5 there would
    be an artefact, and it must not be chosen as the best layer."""
    y, groups = _data()
    X = _planted(y, np.random.default_rng(3), d=4)
    features = np.stack([np.ones_like(X), X], axis=1)  # layer 0 constant
    rows = probe_layers(features, y, groups, ProbeSettings(permutations=19))
    assert np.isnan(rows[0]["auc"]) and "identical across items" in rows[0]["note"]
    assert np.isfinite(rows[1]["auc"]) and rows[1]["n_permutations"] == 19
    with pytest.raises(ValueError, match="identical across items"):
        probe_layers(np.ones((len(y), 2, 3)), y, groups, ProbeSettings(permutations=5))


def test_few_groups_state_the_smallest_reachable_p():
    y = np.array([1, 0] * 4)
    groups = np.repeat(["a", "b", "c", "d"], 2)
    assert linear.distinct_labelings(y, groups) == 16  # 2 labelings per group of one T_ok and one T_wrong
    X = np.c_[y + 0.01 * np.arange(8), np.arange(8) % 3][:, None, :].astype(float)
    (row,) = probe_layers(X, y, groups, ProbeSettings(permutations=19, folds=2))
    assert "16 distinct within-group labelings" in row["note"]


def test_grouped_folds_leave_both_classes_in_every_training_fold():
    """Groups that hold both classes can make a split put one class alone in a training fold; the
    folds are then recomputed with fewer splits, or none is returned (a note, not a crash)."""
    rng = np.random.default_rng(0)
    empty = 0
    for trial in range(300):
        n_groups = int(rng.integers(2, 6))
        groups = [f"g{g}" for g in range(n_groups) for _ in range(int(rng.integers(1, 4)))]
        y = rng.integers(0, 2, len(groups))
        folds = grouped_folds(y, groups, 5, seed=trial)
        empty += not folds
        for train, test in folds:
            assert set(y[train].tolist()) == {0, 1}
            assert not {groups[i] for i in train} & {groups[i] for i in test}
    assert 0 < empty < 300  # both outcomes occur in this family


def test_scenario_folds_keep_every_scenario_on_one_side(v2_dataset, v1_dataset):
    """``fold_on`` (``--fold-groups scenario``): the probe's folds are the scenario-grouped folds, which never
    put one scenario in a training and a test part, while permutations stay within task groups; the
    scores equal out_of_fold_scores on those folds computed here. v1 has no ``scenario``: an error."""
    from probes.data.dataset import fold_groups

    items = [item for item in v2_dataset.select(split="eval", split_kind="scenario") if item.bucket in ("T_ok", "T_wrong")]
    y = np.array([item.bucket == "T_ok" for item in items], dtype=int)
    groups, scenarios = [item.task_group for item in items], fold_groups(items, "scenario")
    folds = grouped_folds(y, scenarios, 5, seed=0)
    for train, test in folds:
        assert not {scenarios[i] for i in train} & {scenarios[i] for i in test}
    X = _planted(y, np.random.default_rng(6), d=6, shift=1.0)
    (row,) = probe_layers(X[:, None, :], y, groups, ProbeSettings(permutations=9, resamples=20, fold_groups="scenario"), fold_on=scenarios)
    assert row["n_folds"] == len(folds) and row["n_groups"] == len(set(groups))
    assert row["auc"] == pytest.approx(linear.auc(y, out_of_fold_scores(X, y, folds)), abs=1e-12)
    with pytest.raises(ValueError, match="need the item field 'scenario'"):
        fold_groups(v1_dataset.items[:10], "scenario")


def test_fold_groups_option_reaches_the_header_settings():
    """``--fold-groups`` is one option of ``linear`` and ``shortcuts`` (CLI = library), and the probe
    settings recorded in the results header carry it."""
    from probes.analyses.linear import Linear, asdict_settings
    from probes.analyses.dataset_tools import ShortcutsOptions
    from probes.cli.main import build_parser
    from probes.cli.flags import options_from_args

    parser = build_parser()
    assert Linear(**options_from_args(parser.parse_args(["linear", "--fold-groups", "scenario"]), Linear)).fold_groups == "scenario"
    assert Linear().fold_groups == ShortcutsOptions().fold_groups == "task_group"
    assert asdict_settings(ProbeSettings(fold_groups="scenario"))["fold_groups"] == "scenario"
    with pytest.raises(SystemExit):
        parser.parse_args(["linear", "--fold-groups", "domain"])
    from probes.analyses.option_system import OptionError
    from probes.analyses.dataset_tools import shortcuts

    with pytest.raises(OptionError, match="--fold-groups scenario: scenario-disjoint folds need the item field 'scenario'"):
        shortcuts(dataset="basm_probe", fold_groups="scenario", tokenizer="none")


@pytest.mark.usefixtures("private_cache")
def test_linear_residuals_are_keyed_by_the_weights() -> None:
    from probes.analyses.linear import feature_key
    from probes.prompts.record import PromptRecord

    record = PromptRecord(record_id="i|base|k0|native", item_id="i", bucket="T_ok", split="eval", domain="d", task_group="g", config="base",
                          k=0, format="native", tokenizer="t", text="abc", input_ids=[1, 2, 3], n_tokens=3, decision_index=2, open_index=None,
                          query_rows=[2], spans={}, spans_kind={"boundary": "boundary"}, skills=[], candidates=[], collision=False,
                          correct_action="x", wrong_tools=[], tempting_skill="s", tempting_rank=None, tempting_shown_rank=None,
                          retrieval={"mode": "ranked"})
    assert feature_key(record, "weightsA|float32") != feature_key(record, "weightsB|float32")
