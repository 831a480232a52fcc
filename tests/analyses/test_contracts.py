"""Contracts that catch a newcomer's mistakes: what ``@register`` refuses (an options class that is not a
``kw_only`` dataclass, a class that is no analysis, a report order taken twice), analyses of other
distributions (entry points), the package's module names, and :func:`probes.cli.checks.check_analysis`
on every registered analysis."""

from __future__ import annotations

import dataclasses
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

import probes.analyses
from probes.analyses import ENTRY_POINT_GROUP, register
from probes.analyses.base import Analysis
from probes.analyses.option_system import OptionError, option
from probes.cli import checks
from probes.cli.checks import AnalysisContractError, check_analysis, check_claims, check_figures, check_option_round_trip
from probes.cli.main import main
from probes.data.dataset import ORGANISM_NAME
from probes.scoring.claims import Claim

PACKAGE_DIR = Path(probes.analyses.__file__).resolve().parent


@pytest.fixture
def clean_registry():
    """Whatever a test registers is forgotten afterwards."""
    before = dict(probes.analyses._registered)
    yield
    probes.analyses._registered.clear()
    probes.analyses._registered.update(before)


# ---------------------------------------------------------------------------- options classes
def _undecorated() -> type:
    class Loose(Analysis):
        """Options declared without @dataclass: they would silently be none."""

        depth: int = option(3, "a depth", type=int)

    return Loose


def _annotated() -> type:
    class Plain(Analysis):
        """A plain annotated attribute: no option either."""

        depth: int = 3

    return Plain


def _positional() -> type:
    @dataclass
    class Positional(Analysis):
        """A dataclass, but not kw_only."""

        depth: int = option(3, "a depth", type=int)

    return Positional


def _no_option() -> type:
    @dataclass(kw_only=True)
    class Bare(Analysis):
        """A kw_only field made without option(): no help, flag or check."""

        depth: int = 3

    return Bare


@pytest.mark.parametrize(("make", "message"), [
    (_undecorated, r"Loose is not a dataclass: 'depth' would be no option; decorate the class with @dataclass\(kw_only=True\)"),
    (_annotated, r"Plain is not a dataclass: 'depth' would be no option"),
    (_positional, r"Positional: field 'depth' is positional: decorate the class with @dataclass\(kw_only=True\)"),
    (_no_option, r"Bare: field 'depth' is no option \(no help, flag or check\): declare it with option\(\.\.\.\)"),
])
def test_an_options_class_that_is_not_a_kw_only_dataclass_of_options_is_refused(make, message, clean_registry) -> None:
    with pytest.raises(TypeError, match=message):
        register("newcomer", order=901)(make())
    assert "newcomer" not in probes.analyses._registered


def test_a_class_without_options_of_its_own_or_with_class_constants_registers(clean_registry) -> None:
    class Constants(Analysis):
        """No options of its own; a ClassVar is no option."""

        limit_note: ClassVar[str] = "x"

    @dataclass(kw_only=True)
    class WithOption(Analysis):
        """One option of its own."""

        depth: int = option(3, "a depth", type=int)

    assert register("constants", order=901)(Constants).order == 901
    assert register("with-option", order=902)(WithOption)(depth=2).depth == 2
    assert [f.name for f in dataclasses.fields(WithOption)][-1] == "depth"


def test_a_class_that_is_no_analysis_is_refused(clean_registry) -> None:
    with pytest.raises(TypeError, match=r"@register\('loose'\): .* is not a subclass of probes.analyses.base.Analysis"):
        register("loose", order=901)(type("Loose", (), {}))
    with pytest.raises(TypeError, match="is not a subclass"):
        register("loose", order=901)(lambda: None)


# ---------------------------------------------------------------------------- report order
def test_the_registered_orders_are_unique_and_give_the_report_order() -> None:
    entries = probes.analyses.catalogue()
    orders = [entry.order for entry in entries.values()]
    assert len(set(orders)) == len(orders) and orders == sorted(orders)
    assert list(entries)[:8] == ["sweep", "ratios", "looking", "suppression", "knockout", "heads", "linear", "calls"]


def test_an_order_taken_by_another_analysis_is_refused_at_registration(clean_registry) -> None:
    @dataclass(kw_only=True)
    class Late(Analysis):
        """Late."""

    with pytest.raises(ValueError, match=r"@register\('late', order=10\): order 10 is taken by 'sweep'"):
        register("late", order=10)(Late)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'order'"):
        register("late")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"order must be an integer \(its place in report\), got '10'"):
        register("late", order="10")(Late)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="order must be an integer"):
        register("late", order=True)(Late)
    register("late", order=903)(Late)
    with pytest.raises(ValueError, match=r"order 903 is taken by 'late'"):
        register("later", order=903)(type("Later", (Late,), {"__doc__": "Later."}))


PLANTED = '''
"""Planted (tests/analyses/test_contracts.py)."""

from probes.analyses import register
from probes.analyses.base import Analysis


@register("planted-order", {order})
class PlantedOrder(Analysis):
    """Planted for the order checks."""
'''


@pytest.mark.parametrize(("order", "message"), [
    ("order=10", r"analyses 'sweep' \(probes.analyses.sweep\) and 'planted-order' \(probes.analyses.planted_order\) share order=10"),
    ("", r"planted_order.py: @register\('planted-order'\) on PlantedOrder needs order=N"),
    ("order=2.5", r"@register\('planted-order'\): order must be an integer"),
])
def test_the_catalogue_refuses_a_missing_or_shared_order(order, message, tmp_path, monkeypatch) -> None:
    (tmp_path / "planted_order.py").write_text(PLANTED.replace("{order}", order).replace(", )", ")"))
    monkeypatch.setattr(probes.analyses, "__path__", [*probes.analyses.__path__, str(tmp_path)])
    with pytest.raises((ValueError, TypeError), match=message):
        probes.analyses.catalogue()
    (tmp_path / "planted_order.py").write_text(PLANTED.replace("{order}", "order=904"))
    assert list(probes.analyses.catalogue())[-1] == "planted-order"


# ---------------------------------------------------------------------------- entry points
EXTERNAL = '''
"""An analysis of another distribution (tests/analyses/test_contracts.py)."""

from dataclasses import dataclass

from probes.analyses import register
from probes.analyses.base import Analysis
from probes.analyses.option_system import OptionError, option


@register("external", order=905)
@dataclass(kw_only=True)
class External(Analysis):
    """External: an analysis installed by another distribution."""

    depth: int = option(1, "a depth", type=int, minimum=0)
'''


def _plant_distribution(root: Path, value: str, module: str = "basm_external_analysis", source: str = EXTERNAL) -> Path:
    """A distribution as pip would leave it (module + dist-info with entry_points.txt), pip not run."""
    (root / f"{module}.py").write_text(source)
    info = root / "basm_external-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: basm-external\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nexternal = {value}\n")
    return root


@pytest.fixture
def external(tmp_path, monkeypatch, clean_registry):
    monkeypatch.syspath_prepend(str(_plant_distribution(tmp_path, "basm_external_analysis")))
    yield tmp_path
    sys.modules.pop("basm_external_analysis", None)


def test_an_entry_point_registers_an_analysis_of_another_distribution(external, capsys) -> None:
    entry = probes.analyses.catalogue()["external"]
    assert (entry.module, entry.cls, entry.order) == ("basm_external_analysis", "External", 905)
    assert "basm_external_analysis" not in sys.modules  # listed from its source, not imported
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "external External: an analysis installed by another distribution." in " ".join(capsys.readouterr().out.split())
    assert "basm_external_analysis" not in sys.modules
    cls = probes.analyses.get("external")
    assert cls.__module__ == "basm_external_analysis" and probes.analyses.options("external")["depth"] == "a depth"
    with pytest.raises(SystemExit):
        main(["external", "--help"])
    assert "--depth" in capsys.readouterr().out


@pytest.mark.parametrize(("value", "source", "message"), [
    ("basm_missing_module", EXTERNAL, "entry point external = 'basm_missing_module' .*: module 'basm_missing_module' is not an installed"),
    ("basm_external_analysis:Other", EXTERNAL, "basm_external_analysis:Other.*: Other carries no @register"),
    ("basm_external_analysis", '"""Nothing registered."""\n', "basm_external_analysis carries no @register"),
    ("basm_external_analysis", EXTERNAL.replace("order=905", "order=10"), "analyses 'sweep' .* and 'external' .* share order=10"),
])
def test_a_broken_entry_point_is_a_clear_error(value, source, message, tmp_path, monkeypatch, clean_registry) -> None:
    monkeypatch.syspath_prepend(str(_plant_distribution(tmp_path, value, source=source)))
    with pytest.raises(ValueError, match=message):
        probes.analyses.catalogue()


# ---------------------------------------------------------------------------- module names
def _shadowing(path: list[str]) -> set[str]:
    """The modules on ``path`` named like a name of ``probes.analyses`` (``options``, ``run``...): once
    imported, the submodule would replace that name on the package (``probes.options`` a module)."""
    return {info.name for info in pkgutil.iter_modules(path)} & set(probes.analyses.__all__)


def test_the_package_modules_shadow_no_registry_name_and_register_only_analyses(tmp_path) -> None:
    """The modules that are no analysis (the option system, the run context, the jobs) hold
    no ``@register`` class, as the catalogue reads every module of the package without importing it."""
    assert _shadowing(probes.analyses.__path__) == set()
    (tmp_path / "options.py").write_text('"""The option system, badly named."""\n')
    assert _shadowing([*probes.analyses.__path__, str(tmp_path)]) == {"options"}
    modules = {info.name for info in pkgutil.iter_modules(probes.analyses.__path__)}
    registering = {entry.module.rsplit(".", 1)[1] for entry in probes.analyses.catalogue().values()}
    assert {"base", "option_system", "run_context", "jobs", "parallel", "report", "dataset_tools", "development_attribution", "explore"} <= modules - registering


# ---------------------------------------------------------------------------- check_analysis
# What each analysis's tiny run needs beyond check_analysis's TINY (limit 1, k_max 1, the lexical embedder):
# items it can summarise (heads: a T_ok and a tool-correct T_wrong item; curate, mask-eval: development and
# held-out items) and the smallest resampling and generation budgets.
CHECK_OPTIONS: dict[str, dict] = {
    "ratios": {"buckets": ["T_wrong"], "configs": ["basm"]},
    "knockout": {"random_draws": 1, "buckets": ["T_wrong"]},
    "heads": {"item_ids": ["retail-ok-0001", "retail-wrong-0001"], "limit": None, "split": "all", "top_n": 2, "random_draws": 1, "floor_from": "given"},
    "attribution": {"item_ids": ["retail-wrong-0001"], "split": "all", "masks": 6, "k_max": 3},
    "curate": {"item_ids": ["retail-ok-0004", "retail-wrong-0004", "retail-ok-0001", "retail-wrong-0001"], "limit": None, "split": "all",
               "masks": 6, "k_max": 3},
    "mask-eval": {"item_ids": ["retail-ok-0004", "retail-wrong-0004", "retail-ok-0001", "retail-wrong-0001"], "limit": None, "split": "all",
                  "masks": 6, "k_max": 3},
    "forks": {"resamples": 50, "permutations": 50, "max_new_tokens": 3},
    "calls": {"max_new_tokens": 3},
    "paired": {"max_new_tokens": 3},
    # two train and two held-out task groups per bucket; one layer, one α, two random draws
    "steer": {"limit": 4, "layers": ["2"], "alphas": ["0.5"], "rows_modes": ["decision"], "random_draws": 2, "configs": ["basm"],
              "generate": "none"},
    "looking": {"item_ids": ["retail-wrong-0001", "retail-ok-0001"], "limit": None, "split": "all", "permutations": 99},
}
# The tiny runs that fit the fast tier (single thread, measured: 3-9 s each, ~60 s together with the rest of this
# file); ratios (eager attention of every head), knockout (its random controls), calls (greedy generation) and
# attribution (its mask sets) take 10-20 s each (25-45 s under load): their full check runs in the slow tier, their class and option
# round trip in the fast one (test_every_registered_analysis_keeps_the_contract_of_its_class_and_options), as does
# that of any analysis registered later until it is listed here.
FAST_RUNS = ("sweep", "suppression", "heads", "linear", "repair", "paired", "curate", "mask-eval", "forks", "looking")


@pytest.mark.parametrize("name", list(probes.analyses.ANALYSES))
def test_every_registered_analysis_keeps_the_contract_of_its_class_and_options(name, tmp_path) -> None:
    check_analysis(probes.analyses.get(name), out=tmp_path, run=False)


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in FAST_RUNS else pytest.mark.slow)
                                  for name in probes.analyses.ANALYSES])
def test_every_registered_analysis_passes_check_analysis(name, tmp_path) -> None:
    torch.set_num_threads(1)
    result = check_analysis(probes.analyses.get(name), out=tmp_path, **CHECK_OPTIONS.get(name, {}))
    assert result is not None and result.out_dir == tmp_path / "run" / ORGANISM_NAME


INCOMPLETE = '''
"""Planted (tests/analyses/test_contracts.py)."""

from probes.analyses import register
from probes.analyses.base import Analysis


@register("incomplete", order=907)
class Incomplete(Analysis):
    """Incomplete: no figures, no section."""

    def collect(self, ctx):
        return None

    def summarise(self, ctx, rows):
        return None

    def tables(self, summary):
        return {}
'''

# A planted analysis whose collect appends a row under a new key on every run: a resume that is none.
RESUMES_NOTHING = '''
"""Planted (tests/analyses/test_contracts.py)."""

import itertools
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from probes.analyses import register
from probes.analyses.base import Analysis, ReportSection
from probes.reporting import plots
from probes.reporting.results import load_results

RUNS = itertools.count()


@register("resumes-nothing", order=908)
class ResumesNothing(Analysis):
    """Resumes nothing: one new row per run."""

    def collect(self, ctx) -> pd.DataFrame:
        store = ctx.store()
        store.append([{"key": f"run-{next(RUNS)}|baseline", "item_id": ctx.items[0].id, "margin": 1.0}])
        return load_results(store.path)

    def summarise(self, ctx, rows):
        return rows[["item_id", "margin"]].head(1)

    def tables(self, summary):
        return {"resumes_nothing_summary": summary}

    def figures(self, summary, out_dir: Path) -> list[Path]:
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.bar([0], summary["margin"])
        return plots.save_figure(fig, out_dir, "resumes_nothing")

    def section(self, ctx, summary, figures):
        return ReportSection("resumes-nothing", "Resumes nothing", figures, "one row")
'''


@pytest.fixture
def plant(tmp_path, monkeypatch, clean_registry):
    """Plant a module in a folder searched by the catalogue; returns its class once imported."""
    folder = tmp_path / "planted"
    folder.mkdir()
    monkeypatch.setattr(probes.analyses, "__path__", [*probes.analyses.__path__, str(folder)])
    planted: list[str] = []

    def plant_module(module: str, source: str, name: str) -> type:
        (folder / f"{module}.py").write_text(source)
        planted.append(f"probes.analyses.{module}")
        return probes.analyses.get(name)

    yield plant_module
    for module in planted:
        sys.modules.pop(module, None)


def test_check_analysis_refuses_an_unregistered_or_incomplete_class(plant, tmp_path) -> None:
    @dataclass(kw_only=True)
    class Unregistered(Analysis):
        """Never registered."""

    with pytest.raises(AnalysisContractError, match=r"not registered: decorate it with @register\(NAME, order=N\)"):
        check_analysis(Unregistered, out=tmp_path)
    with pytest.raises(AnalysisContractError, match=r"check_analysis\(incomplete\): does not implement figures, section"):
        check_analysis(plant("incomplete", INCOMPLETE, "incomplete"), out=tmp_path)


def test_check_analysis_fails_an_option_that_resolves_differently_through_the_options_file(monkeypatch, tmp_path) -> None:
    sweep = probes.analyses.get("sweep")
    check_option_round_trip(sweep, tmp_path / "good")
    monkeypatch.setattr(checks, "options_from_file", lambda path, cls: {})  # a reader that drops the file's options
    with pytest.raises(AnalysisContractError, match=r"check_analysis\(sweep\): option 'model' = 'sample' resolves differently: "
                                                    r"model: API 'sample', flags 'sample', TOML None"):
        check_option_round_trip(sweep, tmp_path / "bad")


def test_check_analysis_fails_a_run_that_resumes_nothing(plant, tmp_path) -> None:
    cls = plant("resumes_nothing", RESUMES_NOTHING, "resumes-nothing")
    with pytest.raises(AnalysisContractError, match="the second run changed its results files: a resume must compute nothing new"):
        check_analysis(cls, out=tmp_path, k_max=0, buckets=["T_wrong"])


def test_check_analysis_fails_missing_figures_and_malformed_claims(tmp_path) -> None:
    sweep = probes.analyses.get("sweep")
    png = tmp_path / "fig.png"
    png.write_bytes(b"png")
    with pytest.raises(AnalysisContractError, match="no figures"):
        check_figures(sweep, [])
    with pytest.raises(AnalysisContractError, match=r"figure fig has no \.pdf file"):
        check_figures(sweep, [png])
    good = Claim("sweep", "trap", "proc above base", 0.5, 0.1, 0.9, 4, 0.02)
    check_claims(sweep, [good])
    for bad, message in [(dataclasses.replace(good, p=1.5), "p = 1.5"), (dataclasses.replace(good, low=0.6), r"outside \[0.6, 0.9\]"),
                         (dataclasses.replace(good, statement=""), "no family, name or statement")]:
        with pytest.raises(AnalysisContractError, match=message):
            check_claims(sweep, [bad])
    with pytest.raises(AnalysisContractError, match="a name used twice in its family"):
        check_claims(sweep, [good, good])


def test_an_analysis_of_the_shown_skills_refuses_depth_zero_before_loading(monkeypatch) -> None:
    """ratios, knockout and heads measure the spans of the shown skills: at k = 0 there are none, so the
    depth is refused with the flag to change, before a model is loaded (it was a KeyError after scoring)."""
    from probes.analyses import run_context

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the depth was checked")

    monkeypatch.setattr(run_context, "open_session", no_model)
    needing = sorted(name for name in probes.analyses.ANALYSES if probes.analyses.get(name).min_depth == 1)
    assert needing == ["circuit", "heads", "knockout", "looking", "ratios", "steer"]
    for name, depth, flag in [("ratios", {"k_max": 0}, "k_max (--k-max) 0"), ("knockout", {"k": 0}, "k (--k) 0"),
                              ("heads", {"k_max": 0}, "k_max (--k-max) 0")]:
        with pytest.raises(OptionError, match=rf"^{name}: {re.escape(flag)}: .* need k ≥ 1 .*use --k 1 or more"):
            probes.run(name, limit=1, embedder="lexical", figure=False, **depth)
