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

import probes.analyses
from probes.analyses import ENTRY_POINT_GROUP, register
from probes.analyses.base import Analysis
from probes.analyses.option_system import option
from probes.cli.main import main

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
    assert list(entries)[:8] == ["sweep", "ratios", "suppression", "knockout", "heads", "linear", "calls", "repair"]


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
"""Planted (tests/test_contracts.py)."""

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
"""An analysis of another distribution (tests/test_contracts.py)."""

from dataclasses import dataclass

from probes.analyses import register
from probes.analyses.base import Analysis
from probes.analyses.option_system import option


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
    assert {"base", "option_system", "run_context", "jobs", "parallel", "report", "tools", "paper"} <= modules - registering
