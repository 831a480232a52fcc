"""``report`` (probes.analyses.report): every shared option forwarded to every analysis, the checker for calls,
the options file under explicit flags, and a section or import error printed and failing the run."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

import probes
import probes.analyses
import probes.analyses.report as report
import probes.engine.session
from probes.analyses import ANALYSES
from probes.analyses.base import Analysis, ReportSection
from probes.analyses.option_system import OptionError, option_fields
from probes.analyses.report import IF_GIVEN, TO_ANALYSES, ReportOptions
from probes.analyses.run_context import AnalysisError
from probes.cli.main import main
from option_helpers import CLASSES, NO_MODEL, SHARED, argv_of, option_field, write_toml, invented_values


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
    options = invented_values(ReportOptions, tmp_path, skip=("analyses", "figures_dir") + (() if given else IF_GIVEN))
    options["analyses"] = ANALYSES
    options["out"] = str(tmp_path / "out")
    opened, session = _patch_report(monkeypatch)
    if entry == "python":
        assert report.report(**options).status == 1  # every analysis "failed" (captured)
    else:
        assert main(["report", *argv_of(ReportOptions, options)]) == 1
    assert [type(a).name for a, _ in opened] == list(ANALYSES)
    for analysis, given_session in opened:
        name = type(analysis).name
        assert given_session is session, name  # one session, loaded once, shared
        for option in SHARED:
            if option in options:
                assert getattr(analysis, option) == options[option], f"report does not forward {option} to {name}"
            else:  # k_max / buckets not given to the report: the analysis keeps its own default
                assert option in IF_GIVEN
                assert getattr(analysis, option) == option_field(type(analysis), option).default, f"{name}: {option}"
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
    toml = write_toml(tmp_path / "run.toml", {"k-max": 1, "seed": 5, "bucket": ["T_ok"]})
    opened, _ = _patch_report(monkeypatch)
    assert main(["report", "--model", "m", "--analyses", "sweep,heads", "--options-file", str(toml), "--k-max", "3",
                 "--out", str(tmp_path)]) == 1
    sweep, heads = (a for a, _ in opened)
    assert (sweep.k_max, sweep.seed, sweep.buckets) == (3, 5, ("T_ok",))  # sweep's default K is 4: the flag wins, the file fills the rest
    assert (heads.k_max, heads.seed, heads.buckets) == (3, 5, ("T_ok",))


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
                          options=SimpleNamespace(dataset="d", relevance="lexical"), out_dir=tmp_path / "m", threads=1)
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


def test_report_needs_an_analysis() -> None:
    with pytest.raises(OptionError, match="option 'analyses' .* needs at least 1"):
        probes.run("report", model=NO_MODEL, analyses=[])
