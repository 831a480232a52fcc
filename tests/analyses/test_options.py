"""Options reach what they configure (Python keywords, CLI flags, the TOML options file, report);
bad options are precise errors; small runs keep several task groups; one task group shows "no CI"
instead of a zero-width interval; report fails loudly."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

import probes.analyses
import probes.analyses.base as base
import probes.analyses.run_context as run_context
import probes.analyses.report as report
import probes.engine.session
from probes.analyses import ANALYSES, REPORT
from probes.analyses.base import Analysis, ReportSection
from probes.analyses.option_system import OptionError, QUICK, option_fields
from probes.analyses.run_context import AnalysisError, select_items
from probes.analyses.report import IF_GIVEN, TO_ANALYSES, ReportOptions
from probes.cli.main import build_parser, main
from probes.cli.flags import flag_of, options_from_file
from probes.data.dataset import BUCKETS, V1_DATASET_DIR, spread_limit
from probes.reporting import plots
from probes.scoring.stats import bootstrap_ratio, no_ci_note, summarise

COMMANDS = [*ANALYSES, REPORT]  # every registered analysis, and report
CLASSES = {name: probes.analyses.options_of(name) for name in COMMANDS}
PAPER_ORDER = ("sweep", "ratios", "suppression", "knockout", "heads", "linear", "calls", "paired")
SHARED = [f.name for f in option_fields(Analysis)]


@pytest.fixture(scope="module")
def dataset(v1_dataset):
    return v1_dataset


# ---------------------------------------------------------------------------- invented option values
# Values for options whose value the generic rule below cannot invent (all differ from every default).
EXPLICIT: dict[str, Any] = {
    "model": "x-model",
    "device": "cuda:1",
    "device_map": "auto",
    "items": "T_ok:retail:3",
    "item_ids": ("retail-ok-0001", "retail-wrong-0001"),
    "domains": ("retail", "travel"),
    "k": 3,  # not any analysis's default, and deep enough for the invented oracle_rank (2): a shallower depth is refused under --retrieval oracle
    "judge": "x-judge-model",  # calls --checker: a local chat model for undecided conditions
    "protected": ("tpl-", "x-"),  # mask-eval: skill id prefixes never masked
}


def _field(cls: type[Analysis], name: str) -> dataclasses.Field:
    return next(f for f in option_fields(cls) if f.name == name)


def _invent(cls: type[Analysis], f: dataclasses.Field, tmp_path: Path) -> Any:
    """A valid value of option ``f`` of ``cls`` different from its default (fails on one it cannot invent)."""
    meta, default = f.metadata, f.default
    if f.name in EXPLICIT:
        value = EXPLICIT[f.name]
    elif meta["type"] is bool:
        value = not default
    elif meta["names"] is not None:  # two names, in an order no default has
        value = (meta["names"][-1], meta["names"][0])
    elif meta["repeat"] and meta["choices"] is not None:
        value = (meta["choices"][-1], meta["choices"][0])
    elif meta["choices"] is not None:
        value = next(c for c in meta["choices"] if c != default)
    elif meta["type"] is int:
        value = (default or 0) + 1
    elif meta["type"] is float:
        value = (default or 0.0) + 0.25
    elif meta["type"] is Path:
        value = str(tmp_path / f"x-{f.name}")
    else:
        raise AssertionError(f"{cls.name}: no test value for option {f.name}; add one to EXPLICIT")
    assert value != default, (cls.name, f.name)
    return value


def _values(cls: type[Analysis], tmp_path: Path, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: _invent(cls, f, tmp_path) for f in option_fields(cls) if f.name not in skip}


def _argv(cls: type[Analysis], values: dict[str, Any]) -> list[str]:
    """The CLI flags giving ``values`` (repeat options as repeated flags, names comma-separated)."""
    argv: list[str] = []
    for name, value in values.items():
        f = _field(cls, name)
        flag = flag_of(f)
        if f.metadata["type"] is bool:
            assert value != f.default
            argv.append(flag)
        elif f.metadata["repeat"]:
            for v in value:
                argv += [flag, v]
        elif f.metadata["names"] is not None:
            argv += [flag, ",".join(value)]
        else:
            argv += [flag, str(value)]
    return argv


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def _toml(path: Path, table: dict[str, Any]) -> Path:
    path.write_text("".join(f"{key} = {_toml_value(value)}\n" for key, value in table.items()))
    return path


def _options(analysis: Analysis) -> dict[str, Any]:
    return {f.name: getattr(analysis, f.name) for f in option_fields(type(analysis))}


# ---------------------------------------------------------------------------- capturing the pipeline
class _Captured(Exception):
    """Raised by the patched pipeline once it has received the analysis (nothing is loaded)."""


def _capture_analysis(monkeypatch) -> list[tuple[Analysis, Any]]:
    """Every analysis entering the pipeline: ``open_context`` (analyses) or ``open_session`` (report)."""
    seen: list[tuple[Analysis, Any]] = []

    def context(analysis, session=None):
        seen.append((analysis, session))
        raise _Captured

    def session(options, model):
        seen.append((options, model))
        raise _Captured

    monkeypatch.setattr(base, "open_context", context)
    monkeypatch.setattr(report, "open_session", session)
    return seen


class _Loaded(Exception):
    """Raised by the patched ProbeSession instead of loading a model."""


def _capture_session(monkeypatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def init(self, model_or_dir, **kwargs):
        seen.update(kwargs, model=str(model_or_dir))
        raise _Loaded

    monkeypatch.setattr(probes.engine.session.EngineSession, "__init__", init)
    return seen


# ---------------------------------------------------------------------------- every option arrives
def test_every_analysis_has_every_shared_option_and_a_flag_for_each() -> None:
    assert REPORT not in ANALYSES
    assert [name for name in ANALYSES if name in PAPER_ORDER] == list(PAPER_ORDER)  # report order: the paper's
    for name, cls in CLASSES.items():
        assert cls.name == name and issubclass(cls, ReportOptions if name == REPORT else Analysis)
        assert set(SHARED) <= {f.name for f in option_fields(cls)}, name
        commands = next(a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction))
        parser = commands.choices[name]
        flags = {s for action in parser._actions for s in action.option_strings}
        for f in option_fields(cls):
            assert flag_of(f) in flags, (name, f.name)
        assert "--options-file" in flags


@pytest.mark.parametrize("entry", ["python", "cli", "options-file"])
@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_reaches_the_analysis(name: str, entry: str, monkeypatch, tmp_path) -> None:
    cls = CLASSES[name]
    values = _values(cls, tmp_path)
    seen = _capture_analysis(monkeypatch)
    with pytest.raises(_Captured):
        if entry == "python":
            probes.analyses.run(name, **values)
        elif entry == "cli":
            main([name, *_argv(cls, values)])
        else:  # keys as field names and as flag names, alternately
            table = {(f.name if n % 2 else flag_of(f).lstrip("-")): values[f.name] for n, f in enumerate(option_fields(cls))}
            table = {key: (not value if key.startswith("no-") else value) for key, value in table.items()}  # no-figure = true
            main([name, "--options-file", str(_toml(tmp_path / "options.toml", table))])
    (analysis, _), = seen
    assert type(analysis) is cls
    got = _options(analysis)
    for option, value in values.items():
        assert got[option] == value, f"{name} ({entry}): option {option} arrives as {got[option]!r}, given {value!r}"


@pytest.mark.parametrize("name", COMMANDS)
def test_session_options_reach_the_session(name: str, monkeypatch, tmp_path) -> None:
    seen = _capture_session(monkeypatch)
    # the invented filter values select nothing in the real dataset, and the items are checked before the model
    dataset = run_context._dataset(str(V1_DATASET_DIR))
    monkeypatch.setattr(run_context, "_dataset", lambda root: dataset)
    monkeypatch.setattr(run_context, "select_items", lambda dataset, options: dataset.items[:1])
    cls = CLASSES[name]
    values = _values(cls, tmp_path, skip=("backend", "remote"))  # the native session (other backends: below)
    with pytest.raises(_Loaded):
        main([name, *_argv(cls, values)])
    assert seen == {"model": "x-model", "dtype": "bfloat16", "device": "cuda:1", "device_map": "auto",
                    "allow_pickle": True, "trust_remote_code": True, "prefix_cache": values["prefix_cache"]}


def test_backend_options_reach_the_backend(monkeypatch) -> None:
    import probes.backends

    seen: dict[str, Any] = {}

    def get_backend(name, model, **kwargs):
        seen.update(kwargs, name=name, model=str(model))
        raise _Loaded

    monkeypatch.setattr(probes.backends, "get_backend", get_backend)
    with pytest.raises(_Loaded):
        run_context.open_session(CLASSES["sweep"](backend="nnsight", remote=True, dtype="float16", device="cuda:0", device_map="auto",
                                           allow_pickle=True, trust_remote_code=True), "m")
    assert seen == {"name": "nnsight", "model": "m", "remote": True, "dtype": "float16", "device": "cuda:0", "device_map": "auto",
                    "allow_pickle": True, "trust_remote_code": True}
    with pytest.raises(OptionError, match="remote.*needs backend='nnsight'"):
        run_context.open_session(CLASSES["sweep"](remote=True), "m")


def test_session_options_reach_the_session_from_python(monkeypatch) -> None:
    seen = _capture_session(monkeypatch)
    with pytest.raises(_Loaded):
        run_context.open_session(CLASSES["sweep"](dtype="float16", device="cuda:0", device_map="balanced", allow_pickle=True,
                                           trust_remote_code=True), "m")
    assert seen == {"model": "m", "dtype": "float16", "device": "cuda:0", "device_map": "balanced",
                    "allow_pickle": True, "trust_remote_code": True, "prefix_cache": 8}


# ---------------------------------------------------------------------------- report forwards
def _patch_report(monkeypatch) -> tuple[list[tuple[Analysis, Any]], object]:
    """Report runs on a stand-in session; every analysis it opens is captured (and fails, so the run goes on)."""
    session = object()
    opened: list[tuple[Analysis, Any]] = []

    def context(analysis, given_session=None):
        opened.append((analysis, given_session))
        raise AnalysisError("captured")

    monkeypatch.setattr(report, "open_session", lambda options, model: session)
    monkeypatch.setattr(report, "open_context", context)
    return opened, session


@pytest.mark.parametrize("entry", ["python", "cli"])
@pytest.mark.parametrize("given", [True, False], ids=["k_max-buckets-given", "not-given"])
def test_report_forwards_every_shared_option_to_every_analysis(given: bool, entry: str, monkeypatch, tmp_path) -> None:
    options = _values(ReportOptions, tmp_path, skip=("analyses", "figures_dir") + (() if given else IF_GIVEN))
    options["analyses"] = ANALYSES
    options["out"] = str(tmp_path / "out")
    opened, session = _patch_report(monkeypatch)
    if entry == "python":
        assert report.report(**options).status == 1  # every analysis "failed" (captured)
    else:
        assert main(["report", *_argv(ReportOptions, options)]) == 1
    assert [type(a).name for a, _ in opened] == list(ANALYSES)
    for analysis, given_session in opened:
        name = type(analysis).name
        assert given_session is session, name  # one session, loaded once, shared
        for option in SHARED:
            if option in options:
                assert getattr(analysis, option) == options[option], f"report does not forward {option} to {name}"
            else:  # k_max / buckets not given to the report: the analysis keeps its own default
                assert option in IF_GIVEN
                assert getattr(analysis, option) == _field(type(analysis), option).default, f"{name}: {option}"
        for f in option_fields(type(analysis)):  # its own options keep its own defaults, but for the report's TO_ANALYSES
            if f.name in TO_ANALYSES:
                assert getattr(analysis, f.name) == options[f.name], f"report does not forward {f.name} to {name}"
            elif f.name not in SHARED:
                assert getattr(analysis, f.name) == f.default, f"{name}: {f.name}"
    assert (tmp_path / "out" / "x-model" / "report.md").is_file()


def test_report_runs_calls_with_the_checker_unless_told_not_to() -> None:
    calls, sweep = probes.analyses.get("calls"), probes.analyses.get("sweep")
    assert report.forwarded(ReportOptions(), calls)["checker"] is True  # calls' own default is False
    assert report.forwarded(ReportOptions(checker=False), calls)["checker"] is False
    assert "checker" not in report.forwarded(ReportOptions(), sweep)  # only where the analysis has the option


def test_report_options_file_does_not_override_explicit_flags(monkeypatch, tmp_path) -> None:
    toml = _toml(tmp_path / "run.toml", {"k-max": 1, "seed": 5, "bucket": ["T_ok"]})
    opened, _ = _patch_report(monkeypatch)
    assert main(["report", "--model", "m", "--analyses", "sweep,heads", "--options-file", str(toml), "--k-max", "3",
                 "--out", str(tmp_path)]) == 1
    sweep, heads = (a for a, _ in opened)
    assert (sweep.k_max, sweep.seed, sweep.buckets) == (3, 5, ("T_ok",))  # sweep's default K is 4: the flag wins, the file fills the rest
    assert (heads.k_max, heads.seed, heads.buckets) == (3, 5, ("T_ok",))


# ---------------------------------------------------------------------------- the options file
def test_options_file_accepts_field_and_flag_names(tmp_path) -> None:
    path = _toml(tmp_path / "o.toml", {"k-max": 1, "margin_variant": "path", "bucket": ["T_ok", "T_wrong"], "item": "retail-ok-0001",
                                       "no-figure": True, "configs": ["basm", "proc"], "dataset": "d", "gamma": 1})
    assert options_from_file(path, CLASSES["sweep"]) == {
        "k_max": 1, "margin_variant": "path", "buckets": ("T_ok", "T_wrong"), "item_ids": ("retail-ok-0001",),
        "figure": False, "configs": ("basm", "proc"), "dataset": "d", "gamma": 1}
    assert options_from_file(_toml(tmp_path / "f.toml", {"figure": False, "no-causal": True}), CLASSES["heads"]) == {
        "figure": False, "causal": False}


@pytest.mark.parametrize(("table", "message"), [
    ({"k_max": "two"}, "option 'k_max' (--k-max) must be an integer, got 'two'"),
    ({"k-max": True}, "option 'k_max' (--k-max) must be an integer, got True"),
    ({"seed": 1.5}, "option 'seed' (--seed) must be an integer, got 1.5"),
    ({"k_max": -1}, "option 'k_max' (--k-max) must be ≥ 0, got -1"),
    ({"gamma": "high"}, "option 'gamma' (--gamma) must be a number, got 'high'"),
    ({"figure": "no"}, "option 'figure' (--no-figure) must be true or false, got 'no'"),
    ({"no-figure": "yes"}, "option 'figure' (--no-figure) must be true or false, got 'yes'"),
    ({"dtype": "fp8"}, "option 'dtype' (--dtype) must be one of float32, bfloat16, float16, auto, got 'fp8'"),
    ({"configs": ["basm", "nope"]}, "option 'configs' (--configs): unknown ['nope']"),
    ({"bucket": ["T_bad"]}, "option 'buckets' (--bucket): unknown ['T_bad']"),
    ({"item_ids": [1]}, "option 'item_ids' (--item) must be a list of strings, got [1]"),
    ({"device": 0}, "option 'device' (--device) must be a string, got 0"),
    ({"out": 3}, "option 'out' (--out) must be a path, got 3"),
])
def test_options_file_types_are_checked(table: dict[str, Any], message: str, tmp_path) -> None:
    path = _toml(tmp_path / "bad.toml", table)
    with pytest.raises(OptionError) as error:
        options_from_file(path, CLASSES["sweep"])
    assert str(error.value).startswith(f"{path}: sweep: {message}"), str(error.value)


@pytest.mark.parametrize("key", ["kmax", "top_n", "analyses", "config", "options_file"])
def test_options_file_rejects_unknown_keys(key: str, tmp_path) -> None:
    path = _toml(tmp_path / "bad.toml", {"seed": 1, key: 1})
    with pytest.raises(OptionError) as error:
        options_from_file(path, CLASSES["sweep"])
    assert str(error.value).startswith(f"{path}: unknown option '{key}' for sweep; known: model, "), str(error.value)


def test_options_file_errors_are_usage_errors_on_the_command_line(tmp_path, capsys) -> None:
    bad = _toml(tmp_path / "bad.toml", {"k_max": "two"})
    assert main(["sweep", "--options-file", str(bad)]) == 2
    assert "option 'k_max' (--k-max) must be an integer, got 'two'" in capsys.readouterr().err
    assert main(["sweep", "--options-file", str(_toml(tmp_path / "u.toml", {"kmax": 1}))]) == 2
    assert "unknown option 'kmax' for sweep" in capsys.readouterr().err
    (tmp_path / "broken.toml").write_text("k_max = = 1\n")
    assert main(["sweep", "--options-file", str(tmp_path / "broken.toml")]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    assert main(["sweep", "--options-file", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_flags_win_over_the_options_file(monkeypatch, tmp_path) -> None:
    seen = _capture_analysis(monkeypatch)
    toml = _toml(tmp_path / "o.toml", {"k_max": 1, "seed": 5, "bucket": ["T_ok"], "no-figure": True, "configs": ["proc"],
                                       "controls": True})
    with pytest.raises(_Captured):
        main(["sweep", "--options-file", str(toml), "--k-max", "3", "--bucket", "T_repair", "--configs", "basm,base"])
    (sweep, _), = seen
    assert (sweep.k_max, sweep.buckets, sweep.configs) == (3, ("T_repair",), ("basm", "base"))  # flags win (lists replaced)
    assert (sweep.seed, sweep.figure, sweep.controls) == (5, False, True)  # the file fills the rest
    assert sweep.limit is None and sweep.margin_variant == "tool_choice"  # neither: the class defaults


def test_flags_not_given_keep_the_class_defaults(monkeypatch) -> None:
    seen = _capture_analysis(monkeypatch)
    for name, cls in CLASSES.items():
        with pytest.raises(_Captured):
            main([name])
        analysis, _ = seen.pop()
        assert analysis == cls(), name  # exactly what Python's defaults give (e.g. sweep's K = 4, report's None)


# ---------------------------------------------------------------------------- option validation
def _wrong(f: dataclasses.Field) -> tuple[Any, str]:
    meta = f.metadata
    if meta["repeat"] or meta["names"] is not None:
        return [3], "must be a list of strings, got [3]"
    if meta["type"] is bool:
        return "yes", "must be true or false, got 'yes'"
    if meta["type"] is int:
        return "2", "must be an integer, got '2'"
    if meta["type"] is float:
        return "x", "must be a number, got 'x'"
    if meta["type"] is Path:
        return 3, "must be a path, got 3"
    return 3, "must be a string, got 3"


@pytest.mark.parametrize("name", COMMANDS)
def test_a_wrong_type_is_an_option_error_naming_the_option(name: str) -> None:
    cls = CLASSES[name]
    for f in option_fields(cls):
        value, message = _wrong(f)
        with pytest.raises(OptionError) as error:
            cls(**{f.name: value})
        assert str(error.value) == f"{name}: option {f.name!r} ({flag_of(f)}) {message}"


@pytest.mark.parametrize(("name", "options", "message"), [
    ("sweep", {"configs": ["basm", "nope"]}, "sweep: option 'configs' (--configs): unknown ['nope']; known: base, proc, "),
    ("ratios", {"configs": "proc-skill"}, "ratios: option 'configs' (--configs): unknown ['proc-skill']"),
    ("linear", {"configs": ("base", "BASM")}, "linear: option 'configs' (--configs): unknown ['BASM']"),
    ("report", {"analyses": ["sweep", "report"]}, "report: option 'analyses' (--analyses): unknown ['report']"),
    ("knockout", {"buckets": ["T_wrong", "wrong"]}, "knockout: option 'buckets' (--bucket): unknown ['wrong']"),
    ("sweep", {"k_max": -1}, "sweep: option 'k_max' (--k-max) must be ≥ 0, got -1"),
    ("sweep", {"limit": 0}, "sweep: option 'limit' (--limit) must be ≥ 1, got 0"),
    ("sweep", {"k_max": 1.0}, "sweep: option 'k_max' (--k-max) must be an integer, got 1.0"),
    ("sweep", {"seed": None}, "sweep: option 'seed' (--seed) must not be None (default: 0)"),
    ("calls", {"format": "json"}, "calls: option 'format' (--format) must be one of native, prompted, got 'json'"),
    ("knockout", {"random_pool": "everything"}, "knockout: option 'random_pool' (--random-pool) must be one of "),
])
def test_option_errors_name_the_option(name: str, options: dict[str, Any], message: str, monkeypatch) -> None:
    _capture_session(monkeypatch)  # a bad option stops before any model is loaded
    with pytest.raises(OptionError) as error:
        probes.analyses.run(name, **options)
    assert str(error.value).startswith(message)


def test_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="kmax"):
        probes.analyses.run("sweep", kmax=2)


def test_an_unknown_config_name_on_the_command_line_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as code:
        main(["sweep", "--configs", "basm,nope"])
    assert code.value.code == 2
    assert "--configs: unknown configs ['nope']; known: base, proc, " in capsys.readouterr().err


# ---------------------------------------------------------------------------- quick and items
def test_quick_caps_limit_depth_and_draws() -> None:
    sweep, knockout, heads = CLASSES["sweep"], CLASSES["knockout"], CLASSES["heads"]
    assert (sweep(quick=True).resolved().limit, sweep(quick=True).resolved().k_max) == (QUICK["limit"], QUICK["k_max"])
    assert sweep(quick=True, k_max=1).resolved().k_max == 1  # below the cap: kept
    assert sweep(quick=True, limit=2).resolved().limit == 2  # an explicit limit wins
    assert (sweep().resolved().limit, sweep().resolved().k_max) == (None, 4)  # no quick: nothing changes
    assert knockout(quick=True).resolved().random_draws == QUICK["random_draws"] < knockout().random_draws
    assert heads(quick=True, random_draws=1).resolved().random_draws == 1
    assert ReportOptions(quick=True).resolved().k_max == QUICK["k_max"]  # report's "each analysis's own" under quick
    assert CLASSES["ratios"](quick=True).resolved().k_max == min(Analysis.k_max, QUICK["k_max"])


def test_items_sets_buckets_domains_and_limit() -> None:
    sweep = CLASSES["sweep"]
    a = sweep(items="T_ok:retail:3", buckets=["T_wrong"], domains=["travel"], limit=9).resolved()
    assert (a.buckets, a.domains, a.limit) == (("T_ok",), ("retail",), 3)
    a = sweep(items="retail").resolved()
    assert (a.buckets, a.domains, a.limit) == (("T_wrong",), ("retail",), None)  # sweep's own buckets kept
    a = sweep(items="7:T_repair:T_ok", quick=True).resolved()
    assert (a.buckets, a.domains, a.limit, a.k_max) == (("T_repair", "T_ok"), None, 7, QUICK["k_max"])  # items' count beats quick's
    given = sweep(items="T_ok:3", quick=True)
    assert given.resolved() is not given and (given.buckets, given.limit, given.k_max) == (("T_wrong",), None, 4)  # as given


def test_the_pipeline_selects_items_with_the_resolved_options(monkeypatch) -> None:
    seen = []

    def select(dataset, options):
        seen.append(options)
        raise _Captured

    monkeypatch.setattr(run_context, "select_items", select)
    with pytest.raises(_Captured):
        main(["sweep", "--quick", "--items", "T_ok:retail:3", "--k-max", "3"])
    (options,) = seen
    assert (options.buckets, options.domains, options.limit, options.k_max, options.quick) == (("T_ok",), ("retail",), 3, 2, True)


def test_an_unknown_domain_in_items_is_an_option_error(capsys) -> None:
    assert main(["sweep", "--items", "T_ok:retial:3"]) == 2
    assert "items T_ok:retial:3: 'retial' is not a bucket" in capsys.readouterr().err


# ---------------------------------------------------------------------------- limit and quick select groups
def test_limit_spreads_over_task_groups(dataset) -> None:
    eval_items = dataset.select(split="eval")
    chosen = dataset.select(split="eval", limit_per_bucket=5, spread=True)
    for bucket in BUCKETS:
        mine = [i for i in chosen if i.bucket == bucket]
        assert len(mine) == 5 and len({i.task_group for i in mine}) == 5, bucket
        # one item per group first: the first item of each of the first five groups (file order)
        pool = [i for i in eval_items if i.bucket == bucket]
        firsts = [i for n, i in enumerate(pool) if i.task_group not in {j.task_group for j in pool[:n]}]
        assert mine == firsts[:5]
    order = {item.id: n for n, item in enumerate(dataset.items)}
    assert [order[i.id] for i in chosen] == sorted(order[i.id] for i in chosen)  # file order kept


def test_limit_cycles_through_groups_when_larger_than_groups() -> None:
    items = [SimpleNamespace(id=f"{g}{n}", bucket="T_ok", task_group=g) for g in "ab" for n in range(3)]
    assert [i.id for i in spread_limit(items, 3)] == ["a0", "a1", "b0"]
    assert [i.id for i in spread_limit(items, 10)] == [i.id for i in items]


def test_every_analysis_selects_items_through_the_spread_limit(dataset) -> None:
    for name in ANALYSES:
        items = select_items(dataset, CLASSES[name](limit=2).resolved())
        per_bucket = Counter(i.bucket for i in items)
        assert per_bucket, name
        for bucket in per_bucket:
            assert per_bucket[bucket] == 2, (name, bucket)
            assert len({i.task_group for i in items if i.bucket == bucket}) == 2, (name, bucket)


def test_split_kind_selects_whole_held_out_scenarios(dataset, v2_dataset) -> None:
    """``split_kind="scenario"`` reads ``split_scenario``: v2's eval scenarios, none of their pairs in
    train; a dataset without that field is a precise option error."""
    v2 = v2_dataset
    items = select_items(v2, CLASSES["sweep"](dataset="basm_probe_v2", split_kind="scenario", buckets=["T_wrong"]).resolved())
    assert len(items) == sum(i.bucket == "T_wrong" and i.split_scenario == "eval" for i in v2.items) == 126
    eval_pairs = {i.task_group.rsplit(".", 1)[0] for i in items}
    assert not eval_pairs & {i.task_group.rsplit(".", 1)[0] for i in v2.items if i.split_scenario == "train"}
    assert {i.split for i in items} == {"train", "eval"}  # the template split cuts across it
    with pytest.raises(OptionError, match="split_scenario"):
        select_items(dataset, CLASSES["sweep"](split_kind="scenario").resolved())


def test_quick_keeps_four_task_groups_per_bucket(dataset) -> None:
    assert QUICK["limit"] >= 4
    for name in ("sweep", "report"):
        options = CLASSES[name](quick=True, buckets=["T_ok", "T_wrong", "T_repair"]).resolved()
        items = select_items(dataset, options)
        for bucket in BUCKETS:
            groups = {i.task_group for i in items if i.bucket == bucket}
            assert len(groups) >= 4, (name, bucket, groups)


# ---------------------------------------------------------------------------- no CI for one group
def _rows(groups: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"cell": "a", "task_group": groups, "margin": np.arange(len(groups), dtype=float)})


def test_summarise_gives_no_ci_for_one_group() -> None:
    one = summarise(_rows(["g1", "g1", "g1"]), ["cell"]).iloc[0]
    assert one["n"] == 1 and one["value"] == 1.0
    assert math.isnan(one["low"]) and math.isnan(one["high"]) and one["note"] == "no CI (1 group)"
    two = summarise(_rows(["g1", "g1", "g2", "g2"]), ["cell"]).iloc[0]
    assert two["n"] == 2 and two["low"] < two["high"] and two["note"] == ""
    assert no_ci_note(1) == plots.no_ci_label(1) == "no CI (1 group)"


def test_bootstrap_ratio_gives_no_ci_for_one_group() -> None:
    value, low, high, n = bootstrap_ratio([1.0, 2.0], [1.0, 1.0], ["g", "g"])
    assert n == 1 and value == 1.5 and math.isnan(low) and math.isnan(high)


def _whiskers(errorbar) -> int:
    """Error bars drawn (non-empty, finite segments) by an ErrorbarContainer."""
    return sum(seg.size > 0 and bool(np.isfinite(seg).all()) for seg in errorbar.lines[2][0].get_segments())


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_bar_plots_draw_no_bar_and_say_no_ci() -> None:
    frame = pd.DataFrame({"bucket": ["T_wrong", "T_wrong"], "config": ["proc", "basm"], "value": [1.0, 0.5],
                          "low": [0.5, math.nan], "high": [1.5, math.nan], "n": [3, 1]})
    fig, ax = plots.plt.subplots()
    plots.grouped_bars(ax, frame, ["T_wrong"], ["proc", "basm"], group_col="bucket", series_col="config")
    caps = [_whiskers(c.errorbar) for c in ax.containers if hasattr(c, "errorbar")]
    assert caps == [1, 0]  # proc: one whisker; basm (1 group): none, not a zero-width one
    assert any("no CI (1 group)" in t for t in _texts(fig))
    # a zero-width interval from one group (as older results files hold) draws no whisker either
    zero = frame.assign(low=[0.5, 0.5], high=[1.5, 0.5])
    assert np.isnan(plots.ci_errors(zero)[:, 1]).all() and np.isfinite(plots.ci_errors(zero)[:, 0]).all()
    plots.plt.close("all")


def test_line_and_error_bar_figures_say_no_ci() -> None:
    from probes.analyses.calls import fig11_call_rates
    from probes.analyses.heads import fig09_candidate_heads
    from probes.analyses.knockout import fig06_knockout_controls
    from probes.analyses.sweep import fig02_retrieval_trap
    from probes.scoring.score import DEFAULT_VARIANT

    sweep = pd.DataFrame({"bucket": "T_wrong", "config": "basm", "k": [0, 1], "value": [1.0, 2.0],
                          "low": [math.nan] * 2, "high": [math.nan] * 2, "n": [1, 1]})
    assert "no CI (1 group)" in _texts(fig02_retrieval_trap(sweep, "note", DEFAULT_VARIANT))
    rates = pd.DataFrame({"mode": "lenient", "format": "native", "config": "basm", "k": [0, 1], "bucket": "T_wrong", "rate": "wrong_call",
                          "value": [0.5, 0.25], "low": [0.5, 0.0], "high": [0.5, 0.5], "n": [3, 6], "n_groups": [1, 2], "count": 1})
    fig = fig11_call_rates(rates, "note")
    assert "hollow markers: no CI (1 group)" in _texts(fig)
    assert _whiskers(fig.axes[0].containers[0]) == 1  # k = 1 (2 groups) only
    windows = pd.DataFrame({"window": ["0-1"], "value": [0.3], "low": [0.3], "high": [0.3], "n": [1]})
    recovery = pd.DataFrame({"measure": ["margin"], "value": [0.5], "low": [math.nan], "high": [math.nan], "n": [1]})
    deltas = pd.DataFrame({"bucket": "T_wrong", "knockout": ["boundary"], "measure": ["margin"], "value": [0.2],
                           "low": [math.nan], "high": [math.nan], "n": [1]})
    texts = _texts(fig06_knockout_controls(deltas, recovery, windows, "note"))
    assert sum("no CI (1 group)" in t for t in texts) == 3  # knockout bar, recovery line, window bar
    causal = pd.DataFrame({"selection": ["top-2", "random-2"], "value": [0.1, 0.2], "low": [math.nan] * 2,
                           "high": [math.nan] * 2, "n": [1, 1], "n_items": [1, 1], "b_mass": [0.2, 0.2], "n_abstain_excluded": [0, 0]})
    ranking = pd.DataFrame({"layer": [0], "head": [0], "shift": [1.0], "ranked": [True], "floor": [0.05], "n_ok": [1], "n_wrong": [1],
                            "n_abstain": [0], "n_groups": [1]})
    fig = fig09_candidate_heads(ranking, causal, 1, "note", floor="0.05, given a priori", match_tolerance=2.0)
    assert _texts(fig).count("no CI (1 group)") == 2
    plots.plt.close("all")


# ---------------------------------------------------------------------------- report fails loudly
def _no_session(options, model):
    raise AssertionError("the model must not be loaded")


def test_report_with_an_unimportable_analysis_is_an_error(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setitem(sys.modules, "probes.analyses.calls", None)  # `import probes.analyses.calls` raises ImportError
    monkeypatch.setattr(report, "open_session", _no_session)
    with pytest.raises(AnalysisError, match="cannot import the calls analysis"):
        report.report(model="m", analyses=["sweep", "calls"], out=tmp_path)
    capsys.readouterr()
    code = main(["report", "--model", "m", "--analyses", "sweep,calls", "--out", str(tmp_path)])
    assert code != 0
    err = capsys.readouterr().err
    assert "cannot import the calls analysis" in err and "probes.analyses.calls" in err
    assert not list(tmp_path.rglob("report.md"))


def test_report_section_error_is_printed_and_fails(monkeypatch, tmp_path, capsys) -> None:
    sweep, ratios = CLASSES["sweep"], CLASSES["ratios"]

    def boom(self, ctx):
        raise AnalysisError("boom: no rows")

    ctx = SimpleNamespace(builder=SimpleNamespace(retriever=SimpleNamespace(embedder=SimpleNamespace(name="e"))),
                          options=SimpleNamespace(dataset="d", relevance="lexical"), out_dir=tmp_path / "m")
    monkeypatch.setattr(report, "open_session", lambda options, model: object())
    monkeypatch.setattr(report, "open_context", lambda analysis, session: ctx)
    monkeypatch.setattr(report, "provenance", lambda ctx, **_: "")
    monkeypatch.setattr(sweep, "collect", boom)
    monkeypatch.setattr(ratios, "collect", lambda self, ctx: pd.DataFrame())
    monkeypatch.setattr(ratios, "summarise", lambda self, ctx, rows: None)
    monkeypatch.setattr(ratios, "claims", lambda self, summary: [])
    monkeypatch.setattr(ratios, "tables", lambda self, summary: {})
    monkeypatch.setattr(ratios, "figures", lambda self, summary, out_dir: [])
    monkeypatch.setattr(ratios, "section", lambda self, ctx, summary, figures: ReportSection("ratios", "Ratios", [], "body"))
    code = main(["report", "--model", "m", "--analyses", "sweep,ratios", "--out", str(tmp_path)])
    assert code == 1
    assert "sweep failed: boom: no rows" in capsys.readouterr().err
    text = (tmp_path / "m" / "report.md").read_text()
    assert "## Failed" in text and "boom: no rows" in text and "## Ratios" in text


# ---------------------------------------------------------------------------- the embedder is said
def test_embedder_choice_is_printed_and_recorded(tiny_qwen3_dir, tmp_path, capsys) -> None:
    from probes.data.retrieval import make_embedder
    from probes.reporting.results import load_results

    make_embedder.cache_clear()
    run_context._retriever.cache_clear()
    result = probes.analyses.run("sweep", model=str(tiny_qwen3_dir), embedder="lexical", relevance="lexical", item_ids=["retail-wrong-0001"],
                                 k_max=0, configs=["base"], split="all", out=tmp_path / "py", figure=False)
    assert "embedder: lexical-hashing (--embedder lexical)" in capsys.readouterr().err
    assert result.out_dir == tmp_path / "py" / run_context.model_label(tiny_qwen3_dir)
    make_embedder.cache_clear()
    run_context._retriever.cache_clear()
    assert main(["sweep", "--model", str(tiny_qwen3_dir), "--embedder", "lexical", "--relevance", "lexical", "--item", "retail-wrong-0001",
                 "--k-max", "0", "--configs", "base", "--split", "all", "--out", str(tmp_path / "cli"), "--no-figure"]) == 0
    assert "embedder: lexical-hashing (--embedder lexical)" in capsys.readouterr().err
    rows = load_results(tmp_path / "cli" / result.out_dir.name / "sweep.jsonl")
    assert rows.attrs["meta"]["config"]["builder"]["embedder"] == "lexical-hashing"
    assert result.rows.attrs["meta"]["config"]["builder"]["embedder"] == "lexical-hashing"
