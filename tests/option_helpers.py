"""Helpers shared by the option tests (analyses/test_option_system.py, test_run_context.py, test_report.py,
test_item_selection.py, cli/test_flags.py): an invented non-default value for every option, written as keywords,
flags (``argv_of``) and an options file (``write_toml``), and captures of the pipeline that stop a run where the
options arrive (``capture_analysis``) or where the session would open (``capture_session``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import probes
import probes.analyses
import probes.analyses.base as base
import probes.analyses.report as report
import probes.engine.session
from probes.analyses import ANALYSES, REPORT
from probes.analyses.base import Analysis
from probes.analyses.option_system import option_fields
from probes.cli.checks import sample_value, flag_argv, toml_value


COMMANDS = [*ANALYSES, REPORT]  # every registered analysis, and report
CLASSES = {name: probes.analyses.options_of(name) for name in COMMANDS}
SHARED = [f.name for f in option_fields(Analysis)]


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
    "threads": 2,  # a count; the default is the word auto
    "layers": ("1", "0"),  # steer: first layers of the steered windows (numbers given as strings, --layer 1 --layer 0)
    "alphas": ("0.75", "-0.75"),  # steer: the α grid
    "chat_template": "gemma3",  # a bundled template (an invented file would not exist: refused before the model loads)
}


def option_field(cls: type[Analysis], name: str) -> dataclasses.Field:
    return next(f for f in option_fields(cls) if f.name == name)


def invent_value(cls: type[Analysis], f: dataclasses.Field, tmp_path: Path) -> Any:
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
    elif meta["type"] in (int, float):
        value = sample_value(f)  # the contract check's own pick: one step past the default, inside a bounded range
    elif meta["type"] is Path:
        value = str(tmp_path / f"x-{f.name}")
    else:
        raise AssertionError(f"{cls.name}: no test value for option {f.name}; add one to EXPLICIT")
    assert value != default, (cls.name, f.name)
    return value


def invented_values(cls: type[Analysis], tmp_path: Path, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: invent_value(cls, f, tmp_path) for f in option_fields(cls) if f.name not in skip}


def argv_of(cls: type[Analysis], values: dict[str, Any]) -> list[str]:
    """The CLI flags giving ``values`` (repeat options as repeated flags, names comma-separated)."""
    argv: list[str] = []
    for name, value in values.items():
        f = option_field(cls, name)
        assert f.metadata["type"] is not bool or value != f.default  # a switch can only flip its default
        argv += flag_argv(f, value)
    return argv


def write_toml(path: Path, table: dict[str, Any]) -> Path:
    path.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in table.items()))
    return path


class Captured(Exception):
    """Raised by the patched pipeline once it has received the analysis (nothing is loaded)."""


def capture_analysis(monkeypatch) -> list[tuple[Analysis, Any]]:
    """Every analysis entering the pipeline: ``open_context`` (analyses) or ``open_session`` (report)."""
    seen: list[tuple[Analysis, Any]] = []

    def context(analysis, session=None):
        seen.append((analysis, session))
        raise Captured

    def session(options, model):
        seen.append((options, model))
        raise Captured

    monkeypatch.setattr(base, "open_context", context)
    monkeypatch.setattr(report, "open_session", session)
    return seen


class Loaded(Exception):
    """Raised by the patched ProbeSession instead of loading a model."""


def capture_session(monkeypatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def init(self, model_or_dir, **kwargs):
        seen.update(kwargs, model=str(model_or_dir))
        raise Loaded

    monkeypatch.setattr(probes.engine.session.EngineSession, "__init__", init)
    return seen


NO_MODEL = "/nonexistent/model"  # every check below must fire before the model is looked at
