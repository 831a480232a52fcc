"""Issue 41, item 2 and 3: out-of-range options are refused by the one option system, before any
work, with the same message through the API, the flags and a TOML options file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import probes
from probes.analyses import ANALYSES, REPORT, dataset_tools, options_of
from probes.analyses.explore import ExploreOptions
from probes.analyses.option_system import SEED_MAX, OptionError, check_option, flag_of, option_fields, value_range
from probes.cli.main import main
from probes.scoring import curation_rules as cur
from probes.scoring.stats import MIN_FOLDS, grouped_folds

NO_MODEL = "/nonexistent/model"  # every refusal below comes before a model or dataset is looked at
TOOLS = (dataset_tools.BuildOptions, dataset_tools.ShowOptions, dataset_tools.ShortcutsOptions, dataset_tools.AuditOptions,
         dataset_tools.CardOptions, dataset_tools.BFCLImportOptions, ExploreOptions)
CLASSES = [*(options_of(name) for name in (*ANALYSES, REPORT)), *TOOLS]


def _field(cls: type, name: str) -> Any:
    return next(f for f in option_fields(cls) if f.name == name)


def _toml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, list) else "[" + ", ".join(map(json.dumps, value)) + "]"


def refused_everywhere(command: str, api: Callable[..., Any], name: str, value: Any, flag_value: list[str], expected: str,
                       tmp_path: Path, capsys: pytest.CaptureFixture, argv: tuple[str, ...] = ()) -> None:
    """``name=value`` is an OptionError holding ``expected`` through ``api``, the flag (exit 2) and the TOML file (exit 2)."""
    with pytest.raises(OptionError) as error:
        api(**{name: value})
    assert expected in str(error.value)
    cls = next(c for c in CLASSES if c.name == command)
    assert main([command, *argv, *(token for v in flag_value for token in (flag_of(_field(cls, name)), v))]) == 2
    assert expected in capsys.readouterr().err
    path = tmp_path / f"{name}.toml"
    path.write_text(f"{name} = {_toml(value)}\n")
    assert main([command, *argv, "--options-file", str(path)]) == 2
    assert f"{path}: {command}: " in (err := capsys.readouterr().err) and expected in err


def _analysis(name: str) -> Callable[..., Any]:
    return lambda **options: probes.run(name, model=NO_MODEL, **options)


# ---------------------------------------------------------------------------- the cases
@pytest.mark.parametrize("folds", [0, 1, -3])
def test_shortcuts_refuses_fewer_than_two_folds(folds: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    refused_everywhere("shortcuts", dataset_tools.shortcuts, "folds", folds, [str(folds)],
                       f"shortcuts: option 'folds' (--folds) must be ≥ 2, got {folds} (one fold leaves no training data", tmp_path, capsys)


def test_linear_folds_are_the_same_option() -> None:
    with pytest.raises(OptionError, match=r"linear: option 'folds' \(--folds\) must be ≥ 2, got 1"):
        probes.run("linear", model=NO_MODEL, folds=1)


def test_grouped_folds_refuse_one_fold_as_a_library_call() -> None:
    """The estimator's own guard (out-of-fold rows were silently missing: no fold, no score)."""
    y, groups = np.array([0, 1] * 6), [f"g{i}" for i in range(12)]
    assert len(grouped_folds(y, groups, MIN_FOLDS)) == MIN_FOLDS
    for n in (1, 0, -3):
        with pytest.raises(ValueError, match=f"n_splits must be ≥ 2 .*got {n}"):
            grouped_folds(y, groups, n)


@pytest.mark.parametrize("resamples", [0, -5])
def test_shortcuts_refuses_no_resamples(resamples: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    refused_everywhere("shortcuts", dataset_tools.shortcuts, "resamples", resamples, [str(resamples)],
                       f"shortcuts: option 'resamples' (--resamples) must be ≥ 1, got {resamples}", tmp_path, capsys)


@pytest.mark.parametrize("alpha", [2.0, 1.0, 0.0, -0.05])
def test_attribution_alpha_is_a_level_in_the_open_unit_interval(alpha: float, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    refused_everywhere("attribution", _analysis("attribution"), "alpha", alpha, [str(alpha)],
                       f"attribution: option 'alpha' (--alpha) must be in (0, 1), got {alpha}", tmp_path, capsys, ("--model", NO_MODEL))


@pytest.mark.parametrize("name", ["attribution", "curate", "mask-eval"])
def test_the_inclusion_probability_is_in_the_open_unit_interval(name: str) -> None:
    for inclusion in (0.0, 1.0, 1.5):
        with pytest.raises(OptionError, match=rf"{name}: option 'inclusion' \(--inclusion\) must be in \(0, 1\), got {inclusion}"):
            probes.run(name, model=NO_MODEL, inclusion=inclusion)


@pytest.mark.parametrize("temperature", [1e-320, 0.0, 1e-4, -1.0])
def test_mask_eval_temperature_is_bounded_away_from_zero(temperature: float, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    refused_everywhere("mask-eval", _analysis("mask-eval"), "temperature", temperature, [repr(temperature)],
                       f"mask-eval: option 'temperature' (--temperature) must be ≥ 0.001, got {temperature!r}", tmp_path, capsys,
                       ("--model", NO_MODEL))


def test_the_smallest_temperature_gives_finite_nearest_neighbour_weights_and_a_smaller_one_is_refused() -> None:
    """Why the bound: at τ = 1e-3 the weights are finite and already the nearest neighbour's (a
    cosine gap of 0.01 weighs e^10 ≈ 22,000 times more); τ → 0 made them NaN (the issue's case)."""
    rng = np.random.default_rng(0)
    dev = rng.normal(size=(6, 8))
    dev /= np.linalg.norm(dev, axis=1, keepdims=True)
    test = dev[0] * 0.9 + dev[1] * 0.1
    test /= np.linalg.norm(test)
    weights = cur.neighbour_weights(dev, test, 3, cur.MIN_TEMPERATURE)
    assert np.isfinite(weights).all() and weights.argmax() == 0 and weights[0] > 1 - 1e-9
    with np.errstate(all="ignore"):  # the formula itself at the τ: NaN weights
        logits = (dev @ test)[:3] / 1e-320
        assert np.isnan(np.exp(logits - logits.max())).any()
    for tau in (1e-320, 0.0, cur.MIN_TEMPERATURE / 2):
        with pytest.raises(ValueError, match="temperature ≥ 0.001"):
            cur.neighbour_weights(dev, test, 3, tau)


def test_mask_eval_refuses_an_empty_protected_prefix(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--protect ""`` protected every skill (every id starts with the empty prefix)."""
    refused_everywhere("mask-eval", _analysis("mask-eval"), "protected", [""], [""],
                       "mask-eval: option 'protected' (--protect): an empty name in ['']", tmp_path, capsys, ("--model", NO_MODEL))
    with pytest.raises(OptionError, match="an empty name in"):
        probes.run("mask-eval", model=NO_MODEL, protected=["tpl-", ""])
    assert probes.analyses.get("mask-eval")(protected=()).protected == ()  # no prefix: nothing protected (stated, not everything)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**70])
def test_sweep_refuses_a_seed_outside_numpys_range_before_loading(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    refused_everywhere("sweep", _analysis("sweep"), "seed", seed, [str(seed)],
                       f"sweep: option 'seed' (--seed) must be in [0, 4294967295], got {seed}", tmp_path, capsys, ("--model", NO_MODEL))


def test_the_seed_range_is_numpys_and_every_seed_option_has_it() -> None:
    """Every seed reaches numpy's RandomState (scikit-learn's folds): it takes 0..2**32 − 1, no more."""
    y, groups = np.array([0, 1] * 6), [f"g{i}" for i in range(12)]
    assert grouped_folds(y, groups, 2, seed=SEED_MAX)
    with pytest.raises(ValueError):
        grouped_folds(y, groups, 2, seed=SEED_MAX + 1)
    seeds = [(cls, f) for cls in CLASSES for f in option_fields(cls) if f.name == "seed"]
    assert len(seeds) >= len(ANALYSES) + 3  # every analysis, report, shortcuts, card, bfcl-import
    for cls, f in seeds:
        assert value_range(f) == "in [0, 4294967295]", cls.name
        assert check_option(cls.name, f, SEED_MAX) == SEED_MAX
        for bad in (-1, SEED_MAX + 1):
            with pytest.raises(OptionError, match=f"{cls.name}: option 'seed' \\(--seed\\) must be in \\[0, 4294967295\\], got {bad}"):
                check_option(cls.name, f, bad)


def test_every_number_option_declares_its_range() -> None:
    """The options of the same kind across every command carry the same range (the list checked)."""
    unbounded = {"gamma"}  # r_B ∈ [−1, 1]: γ ≥ 1 is the closed gate, a control the tests use; γ is finite-checked only
    expected = {  # option → its range; one entry per kind of option
        "seed": "in [0, 4294967295]", "folds": "≥ 2", "resamples": "≥ 1", "permutations": "≥ 1", "subsamples": "≥ 1",
        "simulations": "≥ 1", "random_draws": "≥ 1", "masks": "≥ 2", "alpha": "in (0, 1)", "inclusion": "in (0, 1)",
        "skill_fraction": "in (0, 1)", "min_span_mass": "in [0, 1]", "temperature": "≥ 0.001", "C": "> 0", "sesoi": "> 0",
        "workers": "≥ 1", "limit": "≥ 1", "k_max": "≥ 0", "k": "≥ 0", "beta": "≥ 0", "oracle_rank": "≥ 1", "max_new_tokens": "≥ 1",
    }
    seen = set()
    for cls in CLASSES:
        for f in option_fields(cls):
            if f.metadata["type"] not in (int, float) or f.metadata["repeat"] or f.metadata["names"] is not None or f.name in unbounded:
                continue
            assert value_range(f) is not None, f"{cls.name}: number option {f.name!r} declares no range"
            if f.name in expected:
                assert value_range(f) == expected[f.name], (cls.name, f.name, value_range(f))
                seen.add(f.name)
    assert seen == set(expected)


@pytest.mark.parametrize(("command", "cls", "name", "value"), [
    ("build", dataset_tools.BuildOptions, "workers", 0),
    ("bfcl-import", dataset_tools.BFCLImportOptions, "skill_fraction", 1.0),
    ("linear", None, "C", 0.0),
    ("knockout", None, "sesoi", 0.0),
    ("heads", None, "min_span_mass", 1.5),
])
def test_the_other_ranges_of_the_same_kinds_refuse(command: str, cls: type | None, name: str, value: Any) -> None:
    f = _field(cls or options_of(command), name)
    with pytest.raises(OptionError, match=rf"{command}: option '{name}' .* must be .*, got {value}"):
        check_option(command, f, value)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("out", "", "option 'out' (--out) must not be empty; leave it out for its default (results), or give a path (. for the current folder)"),
    ("device", "", "option 'device' (--device) must not be empty"),
    ("item_ids", ["retail-ok-0001", ""], "option 'item_ids' (--item): an empty name in"),
])
def test_empty_strings_paths_and_names_are_refused(name: str, value: Any, message: str) -> None:
    with pytest.raises(OptionError) as error:
        probes.run("sweep", model=NO_MODEL, **{name: value})
    assert message in str(error.value)


# ---------------------------------------------------------------------------- the TOML file
@pytest.mark.parametrize(("text", "keys"), [
    ("k-max = 1\nk_max = 2\n", "'k-max' and 'k_max'"),
    ("k_max = 2\nk-max = 1\n", "'k_max' and 'k-max'"),
    ('bucket = ["T_ok"]\nbuckets = ["T_wrong"]\n', "'bucket' and 'buckets'"),
    ("figure = true\nno-figure = true\n", "'figure' and 'no-figure'"),
])
def test_a_toml_file_that_sets_one_option_twice_is_refused(text: str, keys: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``k-max = 1`` and ``k_max = 2`` silently ran at 2."""
    path = tmp_path / "run.toml"
    path.write_text(text)
    assert main(["sweep", "--model", NO_MODEL, "--options-file", str(path)]) == 2
    assert f"{path}: keys {keys} both set option" in capsys.readouterr().err
