"""Option values that would silently change or void a run (issue 26: items 4 and 5): every option is in
the results header or declared value-neutral, so a resume under another value is refused; non-finite
numbers, filters that name nothing and empty name lists are errors before any model is loaded; a
session argument that is not a session is answered with what to pass."""

from __future__ import annotations

import dataclasses
import math

import pytest

import probes
import probes.analyses
from probes.analyses.option_system import OptionError, RunOptions, header_options, option_fields
from probes.analyses.report import ReportOptions

NO_MODEL = "/nonexistent/model"  # every check below must fire before the model is looked at


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


def test_report_needs_an_analysis() -> None:
    with pytest.raises(OptionError, match="option 'analyses' .* needs at least 1"):
        probes.run("report", model=NO_MODEL, analyses=[])


@pytest.mark.parametrize("name", ["sweep", "report"])
def test_a_path_given_as_the_session_says_to_pass_model(name: str) -> None:
    with pytest.raises(OptionError, match="session must be a loaded session .* pass model=PATH"):
        probes.run(name, "/models/Qwen3-8B")
