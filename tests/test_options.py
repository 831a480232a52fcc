"""Options reach what they configure; small runs keep several task groups; one task group shows
"no CI" instead of a zero-width interval; report fails loudly."""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

import probes.analyses.base
import probes.engine.session
import probes.analyses.report as report
from probes.reporting import plots
from probes.analyses.base import QUICK, AnalysisError, ReportSection, bootstrap_ratio, no_ci_note, resolve_options, summarise
from probes.cli.main import COMMANDS, main, select_items
from probes.data.dataset import BUCKETS, DEFAULT_DATASET_DIR, load_dataset, spread_limit


@pytest.fixture(scope="module")
def dataset():
    return load_dataset()


# ---------------------------------------------------------------------------- --limit and --quick
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
    for name in ("sweep", "ratios", "suppression", "knockout", "heads", "linear", "calls", "paired"):
        args = _parse(name, ["--limit", "2"])
        items = select_items(dataset, resolve_options(args))
        per_bucket = Counter(i.bucket for i in items)
        for bucket in per_bucket:
            assert len({i.task_group for i in items if i.bucket == bucket}) == 2, (name, bucket)


def test_quick_keeps_four_task_groups_per_bucket(dataset) -> None:
    assert QUICK["limit"] >= 4
    for name in ("sweep", "report"):
        args = resolve_options(_parse(name, ["--quick", "--bucket", "T_ok", "--bucket", "T_wrong", "--bucket", "T_repair"]))
        items = select_items(dataset, args)
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
    sweep = pd.DataFrame({"bucket": "T_wrong", "config": "basm", "k": [0, 1], "value": [1.0, 2.0],
                          "low": [math.nan] * 2, "high": [math.nan] * 2, "n": [1, 1]})
    assert "no CI (1 group)" in _texts(plots.fig02_retrieval_trap(sweep, "note"))
    rates = pd.DataFrame({"format": "native", "config": "basm", "k": [0, 1], "bucket": "T_wrong", "rate": "wrong_call",
                          "value": [0.5, 0.25], "low": [0.5, 0.0], "high": [0.5, 0.5], "n": [3, 6], "n_groups": [1, 2], "count": 1})
    fig = plots.fig11_call_rates(rates, "note")
    assert "hollow markers: no CI (1 group)" in _texts(fig)
    assert _whiskers(fig.axes[0].containers[0]) == 1  # k = 1 (2 groups) only
    windows = pd.DataFrame({"window": ["0-1"], "value": [0.3], "low": [0.3], "high": [0.3], "n": [1]})
    recovery = pd.DataFrame({"measure": ["margin"], "value": [0.5], "low": [math.nan], "high": [math.nan], "n": [1]})
    deltas = pd.DataFrame({"bucket": "T_wrong", "knockout": ["boundary"], "measure": ["margin"], "value": [0.2],
                           "low": [math.nan], "high": [math.nan], "n": [1]})
    texts = _texts(plots.fig06_knockout_controls(deltas, recovery, windows, "note"))
    assert sum("no CI (1 group)" in t for t in texts) == 3  # knockout bar, recovery line, window bar
    causal = pd.DataFrame({"selection": ["top-2", "random-2"], "value": [0.1, 0.2], "low": [math.nan] * 2,
                           "high": [math.nan] * 2, "n": [1, 1]})
    ranking = pd.DataFrame({"layer": [0], "head": [0], "shift": [1.0], "ranked": [True]})
    assert _texts(plots.fig09_candidate_heads(ranking, causal, 1, "note")).count("no CI (1 group)") == 2
    plots.plt.close("all")


# ---------------------------------------------------------------------------- report fails loudly
def test_report_with_an_unimportable_analysis_is_an_error(monkeypatch, tmp_path, capsys) -> None:
    args = _parse("report", ["--model", "m", "--analyses", "sweep,calls", "--out", str(tmp_path)])
    monkeypatch.setitem(sys.modules, "probes.analyses.calls", None)  # `import probes.analyses.calls` raises ImportError
    monkeypatch.setattr(report, "open_session", _no_session)
    code = report.run(args)
    assert code != 0
    assert "cannot import probes.analyses.calls" in capsys.readouterr().err
    assert not (tmp_path / "report.md").exists()


def test_report_section_error_is_printed_and_fails(monkeypatch, tmp_path, capsys) -> None:
    import probes.analyses.sweep

    def boom(analysis, figures_dir):
        raise AnalysisError("boom: no rows")

    analysis = SimpleNamespace(builder=SimpleNamespace(retriever=SimpleNamespace(embedder=SimpleNamespace(name="e"))))
    monkeypatch.setattr(report, "open_session", lambda args, model: object())
    monkeypatch.setattr(report, "open_analysis", lambda args, name, session: analysis)
    monkeypatch.setattr(report, "provenance", lambda analysis: "")
    monkeypatch.setattr(probes.analyses.sweep, "report_section", boom)
    monkeypatch.setattr(importlib.import_module("probes.analyses.ratios"), "report_section",
                        lambda a, d: ReportSection("ratios", "Ratios", [], "body"))
    code = main(["report", "--model", "m", "--analyses", "sweep,ratios", "--out", str(tmp_path)])
    assert code == 1
    assert "sweep failed: boom: no rows" in capsys.readouterr().err
    text = (tmp_path / "report.md").read_text()
    assert "## Failed" in text and "boom: no rows" in text and "## Ratios" in text


def _no_session(args, model):
    raise AssertionError("the model must not be loaded")


# ---------------------------------------------------------------------------- every option arrives
# Values for options whose type the generic rule below cannot invent.
EXPLICIT: dict[str, list[str]] = {
    "k_max": ["1"],  # below --quick's cap, so it survives it
    "configs": ["basm,proc"],
    "analyses": ["sweep"],
    "items": ["T_ok:retail:3"],
    "item_ids": ["retail-ok-0001"],
    "layer_window": ["2"],
}


def _parser(name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=name)
    COMMANDS[name].add_arguments(parser)
    return parser


def _parse(name: str, argv: list[str]) -> argparse.Namespace:
    return _parser(name).parse_args(argv)


def _non_default_argv(parser: argparse.ArgumentParser, tmp_path: Path, skip: set[str] = frozenset()) -> list[str]:
    """A value different from the default for every option of ``parser`` (fails on one it cannot invent)."""
    argv: list[str] = []
    for action in parser._actions:
        if action.dest in ("help", *skip) or not action.option_strings:
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            argv.append(flag)
            continue
        if action.dest in EXPLICIT:
            values = EXPLICIT[action.dest]
        elif action.choices:
            default = action.default if isinstance(action.default, list) else [action.default]
            values = [next(str(c) for c in action.choices if c not in default)]
        elif action.type is int:
            values = [str((action.default or 0) + 1)]
        elif action.type is float:
            values = [str((action.default or 0.0) + 0.25)]
        elif action.type is Path:
            path = tmp_path / action.dest
            if action.dest == "config_file":
                path = tmp_path / "options.toml"
                path.write_text("")
            values = [str(path)]
        elif action.type is None and action.nargs is None:
            values = {"dtype": "bfloat16", "device": "cuda:1", "device_map": "auto"}.get(action.dest, f"x-{action.dest}")
            values = [values]
        else:
            raise AssertionError(f"{parser.prog}: no non-default test value for {flag}; add one to EXPLICIT")
        argv += [flag, *values]
    return argv


class _Loaded(Exception):
    """Raised by the patched ProbeSession instead of loading a model."""


def _capture_session(monkeypatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def init(self, model_or_dir, **kwargs):
        seen.update(kwargs, model=str(model_or_dir))
        raise _Loaded

    monkeypatch.setattr(probes.engine.session.ProbeSession, "__init__", init)
    return seen


ANALYSIS_COMMANDS = [name for name in COMMANDS if "--device-map" in _parser(name)._option_string_actions]


def test_the_common_options_cover_every_analysis() -> None:
    assert set(ANALYSIS_COMMANDS) >= {"sweep", "ratios", "suppression", "knockout", "heads", "linear", "calls", "paired", "report"}


@pytest.mark.parametrize("name", ANALYSIS_COMMANDS)
def test_session_options_reach_the_session(name: str, monkeypatch, tmp_path) -> None:
    seen = _capture_session(monkeypatch)
    # the invented filter values select nothing in a real dataset, and the dataset is checked before the model
    dataset = probes.analyses.base._dataset(str(DEFAULT_DATASET_DIR))
    monkeypatch.setattr(probes.analyses.base, "_dataset", lambda root: dataset)
    monkeypatch.setattr(probes.analyses.base, "select_items", lambda dataset, args: dataset.items[:1])
    argv = _non_default_argv(_parser(name), tmp_path)
    with pytest.raises(_Loaded):
        main([name, *argv])
    assert seen == {"model": "x-model", "dtype": "bfloat16", "device": "cuda:1", "device_map": "auto",
                    "allow_pickle": True, "trust_remote_code": True}


@pytest.mark.parametrize("with_items", [True, False])
def test_report_forwards_every_option_to_every_analysis(with_items: bool, tmp_path) -> None:
    parser = _parser("report")
    argv = _non_default_argv(parser, tmp_path, skip=set() if with_items else {"items"})
    args = resolve_options(parser.parse_args(argv))
    options = [a.dest for a in parser._actions if a.option_strings and a.dest != "help"]
    for name in report.ANALYSES:
        module = report._module(name)
        assert not isinstance(module, str), module
        sub = report.analysis_args(module, args)
        for dest in options:
            if dest in report.REPORT_ONLY or (dest == "items" and not with_items):
                continue
            assert getattr(args, dest) != parser.get_default(dest), f"test value of {dest} is the default"
            assert getattr(sub, dest) == getattr(args, dest), f"report does not forward {dest} to {name}"
        resolved = resolve_options(sub)  # what open_analysis does: must not undo the forwarded values
        for dest in options:
            if dest not in report.REPORT_ONLY:
                assert getattr(resolved, dest) == getattr(args, dest), f"{name} re-resolves {dest}"


def test_report_passes_session_options(monkeypatch, tmp_path) -> None:
    seen = _capture_session(monkeypatch)
    with pytest.raises(_Loaded):
        main(["report", "--model", "m", "--device-map", "auto", "--allow-pickle", "--trust-remote-code",
              "--dtype", "float16", "--device", "cuda:0", "--out", str(tmp_path)])
    assert seen == {"model": "m", "dtype": "float16", "device": "cuda:0", "device_map": "auto",
                    "allow_pickle": True, "trust_remote_code": True}


def test_report_toml_does_not_override_explicit_flags(tmp_path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('k-max = 1\nseed = 5\n')
    args = resolve_options(_parse("report", ["--config", str(toml), "--k-max", "4"]))
    import probes.analyses.sweep

    sub = resolve_options(report.analysis_args(probes.analyses.sweep, args))
    assert (args.k_max, sub.k_max, sub.seed) == (4, 4, 5)  # sweep's default K is 4: the file must not win


def test_embedder_choice_is_printed_and_recorded(tiny_qwen3_dir, tmp_path, capsys) -> None:
    from probes.reporting.results import load_results
    from probes.data.retrieval import make_embedder

    make_embedder.cache_clear()
    probes.analyses.base._retriever.cache_clear()
    assert main(["sweep", "--model", str(tiny_qwen3_dir), "--embedder", "lexical", "--item", "retail-wrong-0001",
                 "--k-max", "0", "--configs", "base", "--split", "all", "--out", str(tmp_path), "--no-figure"]) == 0
    assert "embedder: lexical-hashing (--embedder lexical)" in capsys.readouterr().err
    rows = load_results(tmp_path / "sweep.jsonl")
    assert rows.attrs["meta"]["config"]["builder"]["embedder"] == "lexical-hashing"
