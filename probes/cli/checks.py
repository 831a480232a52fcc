"""``check_analysis(cls)``: does an analysis keep the contract every analysis shares? (As scikit-learn's
``check_estimator``: a new analysis's test calls it, and ``tests/analyses/test_contracts.py`` calls it on every
registered one.)

It checks, in order, each with an :class:`AnalysisContractError` naming the analysis and what broke:

- **the class**: an :class:`~probes.analyses.base.Analysis` registered under its name (the catalogue
  and :func:`probes.analyses.get` agree), a help, the pipeline's methods implemented, its options
  ``option(...)`` fields of a ``kw_only`` dataclass (:func:`probes.analyses.check_options_class`);
- **options** (:func:`check_option_round_trip`): each option, given a value other than its default,
  arrives the same through the API (``probes.run(name, **options)``), the command-line flags and an
  ``--options-file`` TOML table (or is refused by all three);
- **a tiny run** (:func:`check_run`, unless ``run=False``) on the bundled organism (:data:`TINY`: ``limit=1``, ``k_max=1``, the
  lexical embedder, unless given): rows written under unique keys, a results header
  holding the full configuration (every recorded option, the fingerprints), every table written as CSV,
  each figure as PNG + PDF, a report section, well-formed claims; then a second run that computes
  nothing new (every results file unchanged) and returns the same rows.

It lives in the CLI layer, the top one, because it drives an analysis through every entry the
package offers, the command line's flags and options file included.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from probes import analyses
from probes.analyses.base import Analysis, AnalysisResult, ReportSection
from probes.analyses.option_system import OptionError, RunOptions, flag_of, header_options, option_fields
from probes.analyses.run_context import open_context
from probes.cli.flags import add_options, options_from_args, options_from_file
from probes.core.files import OutputRoot
from probes.engine.threads import keeps_caller_threads
from probes.reporting.layout import rows_path, table_path
from probes.reporting.results import load_results
from probes.scoring.claims import Claim, claims_table

HEADER = {"model", "fingerprint", "dtype", "device", "threads", "format", "k_max", "seed", "builder", "dataset", "items", "options"}  # RunContext.config
PIPELINE = ("collect", "summarise", "tables", "figures", "section")  # what every analysis implements
# The tiny run: one item per bucket, one skill shown (k = 0 shows no memory block, which the analyses
# at one depth measure), the lexical embedder (no embedding model to load).
TINY = {"limit": 1, "k_max": 1, "embedder": "lexical"}


class AnalysisContractError(AssertionError):
    """An analysis breaks the contract; the message names the analysis and the broken part."""


def _fail(cls: type, message: str) -> AnalysisContractError:
    return AnalysisContractError(f"check_analysis({getattr(cls, 'name', '') or cls.__qualname__}): {message}")


def check_analysis(cls: type, *, out: str | Path, run: bool = True, **options: Any) -> AnalysisResult | None:
    """Check that ``cls`` keeps the analysis contract (the module docstring lists what is checked);
    results go under ``out``. ``options``: keyword options of the tiny run (e.g. ``buckets`` or
    ``item_ids`` an analysis needs; :data:`TINY` unless given).
    ``run=False`` checks the class and its options only. Returns the tiny run's result."""
    check_class(cls)
    check_option_round_trip(cls, Path(out) / "round-trip")
    return check_run(cls, Path(out) / "run", **options) if run else None


def check_class(cls: type) -> None:
    """Registered, with a help, the pipeline implemented, options that are options."""
    if not (isinstance(cls, type) and issubclass(cls, Analysis)):
        raise _fail(cls, f"{cls!r} is not a subclass of probes.analyses.base.Analysis")
    entry = analyses.catalogue().get(cls.name)
    if not cls.name or entry is None:
        raise _fail(cls, "not registered: decorate it with @register(NAME, order=N) in a module of probes.analyses "
                    f"or of an entry point of the group {analyses.ENTRY_POINT_GROUP}")
    if analyses.get(cls.name) is not cls:
        raise _fail(cls, f"probes.analyses.get({cls.name!r}) is {analyses.get(cls.name)!r}, not this class")
    if not entry.help:
        raise _fail(cls, "no help: the class docstring's first paragraph is its help")
    missing = [method for method in PIPELINE if getattr(cls, method) is getattr(Analysis, method)]
    if missing:
        raise _fail(cls, f"does not implement {', '.join(missing)} (the pipeline: {' → '.join(PIPELINE)})")
    try:
        analyses.check_options_class(cls.name, cls)
    except TypeError as error:
        raise _fail(cls, str(error)) from error


# ---------------------------------------------------------------------------- options
def sample_value(f: dataclasses.Field) -> Any:
    """A valid value of option ``f`` other than its default (a choice, a name, a number above its minimum)."""
    meta, default = f.metadata, f.default
    known = list(meta["names"] or meta["choices"] or ())
    if meta["repeat"] or meta["names"] is not None:
        wanted = max(int(meta["minimum"] or 1), 1)
        others = [name for name in known if name not in (default or ())] or known
        return tuple((others + known)[:wanted]) if known else ("sample",)
    if meta["type"] is bool:
        return not default
    if known:
        return next((choice for choice in known if choice != default), known[0])
    if meta["type"] in (int, float):
        base = default if isinstance(default, int | float) else (meta["minimum"] or 0)
        value = base + (1 if meta["type"] is int else 0.25)
        top = meta["maximum"]
        if top is not None and (value > top or (meta["exclusive"] and value >= top)):  # above the range: step down inside it
            value = base - 1 if meta["type"] is int else (base + (meta["minimum"] or 0)) / 2
        return value
    return "sample"


def flag_argv(f: dataclasses.Field, value: Any) -> list[str]:
    """The command-line tokens that give option ``f`` the value ``value`` (a switch flips its default;
    a repeat option repeats its flag; names are comma-separated)."""
    flag, meta = flag_of(f), f.metadata
    if meta["type"] is bool:
        return [flag]  # the switch flips the default
    if meta["repeat"]:
        return [token for item in value for token in (flag, str(item))]
    if meta["names"] is not None:
        return [flag, ",".join(value)]
    return [flag, str(value)]


def toml_value(value: Any) -> str:
    """An option value as a TOML value (the options file's form of it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string (escapes included)


def _outcome(cls: type, given: Mapping[str, Any] | None, error: Exception | None = None) -> Any:
    """The resolved options that ``given`` makes (or the kind of error it raises)."""
    if error is not None:
        return type(error).__name__
    try:
        resolved = analyses.make(cls, dict(given or {})).resolved()
    except OptionError as refused:
        return type(refused).__name__
    return {f.name: getattr(resolved, f.name) for f in option_fields(cls)}


def check_option_round_trip(cls: type, folder: Path) -> None:
    """Each option, at a value other than its default, resolves the same through the API, the flags
    and the TOML options file (the file is written under ``folder``)."""
    folder = OutputRoot(folder)
    for f in option_fields(cls):
        if f.metadata.get("positional"):
            continue
        value = sample_value(f)
        api = _outcome(cls, {f.name: value})
        parser = argparse.ArgumentParser(prog=cls.name, exit_on_error=False)
        add_options(parser, cls)
        try:
            flags = _outcome(cls, options_from_args(parser.parse_args(flag_argv(f, value)), cls))
        except (argparse.ArgumentError, OptionError) as error:
            flags = _outcome(cls, None, error)
        path = folder.write(f"{f.name}.toml", f"{f.name} = {toml_value(value)}\n")
        try:
            toml = _outcome(cls, options_from_file(path, cls))
        except (OptionError, tomllib.TOMLDecodeError) as error:
            toml = _outcome(cls, None, error)
        if not api == flags == toml:
            raise _fail(cls, f"option {f.name!r} = {value!r} resolves differently: {_diff(api, flags, toml)}")
        if isinstance(api, str):
            raise _fail(cls, f"option {f.name!r}: the valid value {value!r} is refused ({api}) by API, flags and TOML alike")


def _diff(api: Any, flags: Any, toml: Any) -> str:
    if not all(isinstance(x, dict) for x in (api, flags, toml)):
        return f"API {api!r}, flags {flags!r}, TOML {toml!r}"
    keys = [k for k in api if not api[k] == flags.get(k) == toml.get(k)]
    return "; ".join(f"{k}: API {api[k]!r}, flags {flags.get(k)!r}, TOML {toml.get(k)!r}" for k in keys)


# ---------------------------------------------------------------------------- the tiny run


def _results_files(out_dir: Path) -> dict[str, bytes]:
    return {str(path.relative_to(out_dir)): path.read_bytes() for path in sorted(out_dir.rglob("*.jsonl"))}


@keeps_caller_threads  # its open_context sets the run's thread count; the caller's is back on return
def check_run(cls: type, out: Path, **options: Any) -> AnalysisResult:
    """A tiny run, its outputs, and a resumed second run (see the module docstring)."""
    given = {**TINY, **options, "out": out}
    result = analyses.make(cls, given).run(verbose=False)
    name, out_dir = cls.name, result.out_dir
    if not len(result.rows):
        raise _fail(cls, f"the run on {given} wrote no rows")
    if "key" not in result.rows or not result.rows["key"].is_unique:
        raise _fail(cls, "the rows' keys are missing or repeated (a resume would skip or duplicate rows)")
    path = rows_path(out_dir, name)
    if not path.is_file():
        raise _fail(cls, f"no results file {path}")
    config = load_results(path).attrs["meta"]["config"]
    # the run's configuration (RunContext.config): its fields, and every shared option a row's value depends on
    missing = sorted((HEADER - set(config)) | (set(header_options(result.options, RunOptions)) - set(config.get("options", {})) - set(config)))
    if missing:
        raise _fail(cls, f"the results header of {path.name} lacks {missing}: record the full configuration "
                    "(ctx.store(**extra) writes RunContext.config(**extra))")
    if not result.tables:
        raise _fail(cls, "no tables")
    for table, frame in result.tables.items():
        if not isinstance(frame, pd.DataFrame) or not table_path(out_dir, name, table).is_file():
            raise _fail(cls, f"table {table!r} is not a DataFrame written as {table}.csv")
    check_figures(cls, result.figures)
    ctx = open_context(result.options)  # the run's resolved options (the model loaded again)
    section = result.analysis.section(ctx, result.summary, result.figures)
    if not (isinstance(section, ReportSection) and section.title and section.markdown.strip()):
        raise _fail(cls, f"section() returned {section!r}, not a ReportSection with a title and a body")
    check_claims(cls, result.analysis.claims(result.summary))
    before = _results_files(out_dir)
    again = analyses.make(cls, given).run(verbose=False)
    if _results_files(out_dir) != before:
        raise _fail(cls, "the second run changed its results files: a resume must compute nothing new")
    pd.testing.assert_frame_equal(again.rows.reset_index(drop=True), result.rows.reset_index(drop=True), check_exact=True)
    return result


def check_figures(cls: type, figures: list[Path]) -> None:
    """At least one figure, each as PNG and PDF, none empty."""
    stems = {path.with_suffix("") for path in figures}
    if not stems:
        raise _fail(cls, "no figures (figures() returns the PNG and PDF files it wrote)")
    for stem in stems:
        for suffix in (".png", ".pdf"):
            file = stem.with_suffix(suffix)
            if not (file.is_file() and file.stat().st_size > 0):
                raise _fail(cls, f"figure {stem.name} has no {suffix} file ({file})")


def check_claims(cls: type, claims: list[Claim]) -> None:
    """Every claim complete and in range: a family, a unique name, a statement, p in [0, 1] (or NaN),
    low ≤ estimate ≤ high where finite (a :class:`Claim` checks its kind and alternative itself);
    ``claims_table`` takes them."""
    names = set()
    for claim in claims:
        problem = (not isinstance(claim, Claim) and "not a Claim"
                   or not (claim.family and claim.name and claim.statement) and "no family, name or statement"
                   or (claim.family, claim.name) in names and "a name used twice in its family"
                   or not (math.isnan(claim.p) or 0 <= claim.p <= 1) and f"p = {claim.p}"
                   or all(map(math.isfinite, (claim.low, claim.estimate, claim.high))) and not claim.low <= claim.estimate <= claim.high
                   and f"estimate {claim.estimate} outside [{claim.low}, {claim.high}]")
        if problem:
            raise _fail(cls, f"claim {getattr(claim, 'name', claim)!r}: {problem}")
        names.add((claim.family, claim.name))
    if claims:
        claims_table(claims)


__all__ = ["AnalysisContractError", "check_analysis", "check_class", "check_claims", "check_figures", "check_option_round_trip",
           "check_run", "sample_value"]
