"""The option system (probes.analyses.option_system): options declared once as kw_only dataclass fields,
invented values reaching every analysis through Python, flags and the options file, validation that names
the option, and QUICK / ``items``."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import re
from pathlib import Path
from typing import Any

import pytest

import probes
import probes.analyses
import probes.engine.session
from probes.analyses import ANALYSES, REPORT, dataset_tools
from probes.analyses.base import Analysis
from probes.analyses.option_system import OptionError, QUICK, option_fields, RunOptions, header_options, BuilderOptions, ItemOptions
from probes.analyses.report import ReportOptions
from probes.backends import BACKENDS
from probes.cli.flags import flag_of, options_from_file
from probes.cli.main import build_parser, main
from probes.facade import ProbeSession
from probes.prompts.builder import DEFAULT_K_MAX, SWEEP_K_MAX, BuildSettings
from probes.reporting.cards import GATE_DEPTH
from probes.scoring.score import DEFAULT_VARIANT
from option_helpers import CLASSES, COMMANDS, NO_MODEL, SHARED, Captured, argv_of, capture_analysis, capture_session, option_field, write_toml, invented_values


PAPER_ORDER = ("sweep", "ratios", "suppression", "knockout", "heads", "linear", "calls", "paired")


def _options(analysis: Analysis) -> dict[str, Any]:
    return {f.name: getattr(analysis, f.name) for f in option_fields(type(analysis))}


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
    values = invented_values(cls, tmp_path)
    seen = capture_analysis(monkeypatch)
    with pytest.raises(Captured):
        if entry == "python":
            probes.analyses.run(name, **values)
        elif entry == "cli":
            main([name, *argv_of(cls, values)])
        else:  # keys as field names and as flag names, alternately
            table = {(f.name if n % 2 else flag_of(f).lstrip("-")): values[f.name] for n, f in enumerate(option_fields(cls))}
            table = {key: (not value if key.startswith("no-") else value) for key, value in table.items()}  # no-figure = true
            main([name, "--options-file", str(write_toml(tmp_path / "options.toml", table))])
    (analysis, _), = seen
    assert type(analysis) is cls
    got = _options(analysis)
    for option, value in values.items():
        assert got[option] == value, f"{name} ({entry}): option {option} arrives as {got[option]!r}, given {value!r}"


def test_options_file_accepts_field_and_flag_names(tmp_path) -> None:
    path = write_toml(tmp_path / "o.toml", {"k-max": 1, "margin_variant": "path", "bucket": ["T_ok", "T_wrong"], "item": "retail-ok-0001",
                                       "no-figure": True, "configs": ["basm", "proc"], "dataset": "d", "gamma": 1})
    assert options_from_file(path, CLASSES["sweep"]) == {
        "k_max": 1, "margin_variant": "path", "buckets": ("T_ok", "T_wrong"), "item_ids": ("retail-ok-0001",),
        "figure": False, "configs": ("basm", "proc"), "dataset": "d", "gamma": 1}
    assert options_from_file(write_toml(tmp_path / "f.toml", {"figure": False, "no-causal": True}), CLASSES["heads"]) == {
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
    path = write_toml(tmp_path / "bad.toml", table)
    with pytest.raises(OptionError) as error:
        options_from_file(path, CLASSES["sweep"])
    assert str(error.value).startswith(f"{path}: sweep: {message}"), str(error.value)


@pytest.mark.parametrize("key", ["kmax", "top_n", "analyses", "config", "options_file"])
def test_options_file_rejects_unknown_keys(key: str, tmp_path) -> None:
    path = write_toml(tmp_path / "bad.toml", {"seed": 1, key: 1})
    with pytest.raises(OptionError) as error:
        options_from_file(path, CLASSES["sweep"])
    assert str(error.value).startswith(f"{path}: unknown option '{key}' for sweep; known: model, "), str(error.value)


def _wrong(f: dataclasses.Field) -> tuple[Any, str]:
    meta = f.metadata
    if meta["repeat"] or meta["names"] is not None:
        return [3], "must be a list of strings, got [3]"
    if meta["type"] is bool:
        return "yes", "must be true or false, got 'yes'"
    if meta["type"] is int:  # a number option that takes words says so (threads: "or auto")
        return "2", f"must be an integer{''.join(f' or {word}' for word in meta['words'])}, got '2'"
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
    capture_session(monkeypatch)  # a bad option stops before any model is loaded
    with pytest.raises(OptionError) as error:
        probes.analyses.run(name, **options)
    assert str(error.value).startswith(message)


def test_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="kmax"):
        probes.analyses.run("sweep", kmax=2)


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


def _classes() -> list[type]:
    return [probes.analyses.get(name) for name in probes.analyses.ANALYSES] + [ReportOptions]


@pytest.mark.parametrize("cls", _classes(), ids=lambda cls: cls.__name__)
def test_every_option_is_in_the_header_or_declared_value_neutral(cls: type) -> None:
    options = cls()
    names = {f.name for f in option_fields(cls)}
    header = header_options(options)
    assert set(header) == names - cls.value_neutral  # nothing dropped silently
    assert cls.value_neutral <= names | RunOptions.value_neutral  # no stale neutral name
    assert {"backend", "remote", "device_map", "dtype", "gamma", "relevance", "margin_variant", "format"} <= set(header)
    for f in option_fields(cls):  # a changed value changes the header, unless neutral
        if f.name in cls.value_neutral or f.metadata["choices"] is None or len(f.metadata["choices"]) < 2 or f.metadata["repeat"]:
            continue
        other = next(c for c in f.metadata["choices"] if c != getattr(options, f.name))
        assert header_options(dataclasses.replace(options, **{f.name: other})) != header, f.name


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused(value: float) -> None:
    with pytest.raises(OptionError, match="option 'gamma' .* must be a finite number"):
        probes.run("sweep", model=NO_MODEL, gamma=value)


@pytest.mark.parametrize("spec", ["", "::::", ":"])
def test_an_items_filter_that_names_nothing_is_refused(spec: str) -> None:
    with pytest.raises(OptionError, match="names no bucket, domain or count|option 'items' \\(--items\\) must not be empty"):
        probes.run("sweep", model=NO_MODEL, items=spec)


@pytest.mark.parametrize("name", ["sweep", "ratios", "suppression", "linear", "calls"])
def test_an_empty_configuration_list_is_refused(name: str) -> None:
    with pytest.raises(OptionError, match="option 'configs' .* needs at least 1"):
        probes.run(name, model=NO_MODEL, configs=[])


PACKAGE = Path(probes.analyses.__file__).resolve().parent.parent
ROOT = PACKAGE.parent
SWEEPS = ("sweep", "linear", "calls", "paired")  # k = 0..K analyses
AT_ONE_DEPTH = ("ratios", "suppression", "knockout", "heads")  # k (default k_max)


def test_shared_options_are_declared_once() -> None:
    """The item filters and the builder's settings of the analyses and of build/show are the same
    declarations (help, type, choices, range), and so are their flags."""
    shared = [f.name for f in option_fields(ItemOptions)] + [f.name for f in option_fields(BuilderOptions)]
    assert {"dataset", "buckets", "split", "limit", "item_ids", "embedder", "gamma", "relevance", "beta", "k_max"} <= set(shared)
    for cls in (dataset_tools.BuildOptions, dataset_tools.ShowOptions, *(probes.analyses.get(name) for name in probes.analyses.ANALYSES)):
        for name in shared:
            if name not in {f.name for f in option_fields(cls)}:
                assert cls is dataset_tools.ShowOptions and name in {f.name for f in option_fields(ItemOptions)} - {"dataset"}, (cls, name)
                continue
            mine, theirs = option_field(cls, name), option_field(RunOptions, name)
            if cls in (dataset_tools.BuildOptions, dataset_tools.ShowOptions):
                assert dict(mine.metadata) == dict(theirs.metadata), (cls.name, name)
                assert name == "k_max" or mine.default == theirs.default, (cls.name, name)
            else:  # an analysis may redeclare a shared option to change its default (and say so in the help): nothing else
                assert {k: v for k, v in mine.metadata.items() if k != "help"} == {k: v for k, v in theirs.metadata.items() if k != "help"}, \
                    (cls.name, name)
    for cls in (dataset_tools.ShortcutsOptions, dataset_tools.CardOptions):  # the tokenizer option of the statistics: its help says what 'none' does
        assert {k: v for k, v in option_field(cls, "tokenizer").metadata.items() if k != "help"} == \
            {k: v for k, v in option_field(dataset_tools.BuildOptions, "tokenizer").metadata.items() if k != "help"}


def test_each_depth_default_is_one_constant() -> None:
    assert DEFAULT_K_MAX == 2 and SWEEP_K_MAX == 4  # the paper's focus depth; the depth sweeps
    assert option_field(Analysis, "k_max").default == DEFAULT_K_MAX
    for name in AT_ONE_DEPTH:
        cls = probes.analyses.get(name)
        assert option_field(cls, "k_max").default == DEFAULT_K_MAX and option_field(cls, "k").default is None
        assert cls().depth == DEFAULT_K_MAX and cls(k=1).depth == 1
    for name in SWEEPS:
        assert option_field(probes.analyses.get(name), "k_max").default == SWEEP_K_MAX, name
    assert option_field(dataset_tools.BuildOptions, "k_max").default == BuildSettings.k_max == SWEEP_K_MAX
    assert option_field(dataset_tools.ShowOptions, "k").default == DEFAULT_K_MAX == GATE_DEPTH
    assert inspect.signature(ProbeSession.prompt).parameters["k"].default == DEFAULT_K_MAX
    assert "default: 4" in build_parser("build")._subparsers._group_actions[0].choices["build"].format_help().replace("\n", " ")


def _code(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_no_default_or_wiring_is_repeated_in_the_library() -> None:
    sources = {path.relative_to(ROOT).as_posix(): _code(path) for path in PACKAGE.rglob("*.py")}
    notebooks = {path.relative_to(ROOT).as_posix(): _code(path) for path in (ROOT / "notebooks").glob("*.ipynb")}
    k_or_k_max = {name for name, text in {**sources, **notebooks}.items() if re.search(r"\bk is not None else\b.*k_max", text)}
    assert k_or_k_max == {"probes/analyses/option_system.py"}, f"{sorted(k_or_k_max)}: use options.depth (BuildsPrompts.depth)"
    for name, text in {**sources, **notebooks}.items():
        assert not re.search(r"option\(\s*\d+\s*,\s*\"largest retrieval depth", text), f"{name}: use k_max_option(DEFAULT_K_MAX / SWEEP_K_MAX)"
    for name, text in sources.items():
        if name != "probes/prompts/builder.py":
            assert not re.search(r"\bPromptBuilder\(", text), f"{name}: make the builder with probes.prompts.builder.make_builder"
            assert name == "probes/data/dataset.py" or not re.search(r"\bdefault_study\(", text), f"{name}: resolve the study defaults with probes.prompts.builder.resolve_study"
        if name != "probes/cli/flags.py":
            assert "add_argument(\"--k-max\"" not in text and "add_argument(\"--dataset\"" not in text, name


# Where the literal "tool_choice" may stand: its definition (probes.scoring.score: the variants, DEFAULT_VARIANT, the
# quantities), the margin's own name (probes.scoring.margins), dict keys (labels), and forks' header, which names the
# margin it measures whatever the variant. Anywhere else it would re-type the default: use DEFAULT_VARIANT.
# probes/reporting/plots.py's fig02 default is left to the figures' move next to their analyses (another branch).
VARIANT_LITERAL_ALLOWED = {"probes/scoring/score.py", "probes/scoring/margins.py"}
VARIANT_DEFAULT = re.compile(r'"tool_choice"(?!\s*:)')  # a key of a dict (a label) is no default
FORKS_MARGIN_NAME = 'margin="tool_choice", margin_variant=None'


def retyped_defaults(name: str, text: str) -> list[str]:
    """The lines of ``text`` (a module of the package) that re-type a default kept in one constant: the
    margin variant (:data:`probes.scoring.score.DEFAULT_VARIANT`), quick's depth
    (:data:`probes.prompts.builder.DEFAULT_K_MAX`), the backend names (:data:`probes.backends.BACKENDS`)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if name not in VARIANT_LITERAL_ALLOWED and VARIANT_DEFAULT.search(line.replace(FORKS_MARGIN_NAME, "")):
            found.append(f"{name}:{number}: use DEFAULT_VARIANT")
        if line.startswith("QUICK") and re.search(r'"k_max":\s*\d', line):
            found.append(f"{name}:{number}: quick's depth is DEFAULT_K_MAX")
        if not name.startswith("probes/backends/") and re.search(r'["\']nnsight["\'],\s*["\']transformerlens["\']', line):
            found.append(f"{name}:{number}: the backend names are probes.backends.BACKENDS")
    return found


def test_each_knob_has_one_default_constant() -> None:
    sources = {path.relative_to(ROOT).as_posix(): _code(path) for path in PACKAGE.rglob("*.py")}
    assert [line for name, text in sources.items() for line in retyped_defaults(name, text)] == []
    assert QUICK["k_max"] == DEFAULT_K_MAX and option_field(RunOptions, "backend").metadata["choices"] == tuple(BACKENDS)
    assert option_field(RunOptions, "margin_variant").default == DEFAULT_VARIANT
    assert inspect.signature(ProbeSession.score).parameters["variant"].default == DEFAULT_VARIANT
    # the check fails on each re-typed literal
    planted = {
        'def score(record, variant: str = "tool_choice"):': "use DEFAULT_VARIANT",
        'common = {"margin_variant": "tool_choice", "seed": 0}': "use DEFAULT_VARIANT",
        'QUICK = {"limit": 4, "k_max": 2, "random_draws": 2}': "quick's depth is DEFAULT_K_MAX",
        'choices=("native", "nnsight", "transformerlens")': "probes.backends.BACKENDS",
    }
    for line, message in planted.items():
        assert [message in found for found in retyped_defaults("probes/analyses/planted.py", line)] == [True], line
    assert retyped_defaults("probes/analyses/planted.py", 'labels = {"tool_choice": "Eq. 1 over the tools"}') == []
