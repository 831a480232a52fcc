"""The probe analyses: registered where they are defined, and :func:`run`, the one way to run any of them.

>>> import probes
>>> session = probes.ProbeSession("/models/Qwen3-8B", dtype="bfloat16", device="cuda")
>>> sweep = probes.run("sweep", session, buckets=["T_wrong"], k_max=4, out="results/")
>>> sweep.summary_table, sweep.figures

An analysis is one module of this package whose class carries ``@register("name", order=N)``; its
docstring's first paragraph is its help. The catalogue (name, module, help, order) is read from the
modules' source with :mod:`ast`, so listing the analyses (``basm-probes --help``, :data:`ANALYSES`)
imports none of them (they load torch, pandas and matplotlib); :func:`get` imports a module when
its analysis is first used and checks that it registered the class the catalogue promised.

An installed distribution adds analyses through an entry point of the group ``basm_probes.analyses``
(``my_analysis = "my_package.my_analysis"``: a module whose source carries ``@register``); its
module is catalogued the same way, from its source. :func:`probes.cli.checks.check_analysis`
tests that a class keeps the contract.

Report order is explicit and unique: every ``@register`` gives ``order=`` (an integer that places
the analysis in ``report`` and in the listings; the paper's analyses use 10, 20, ... 80), and an
order taken by another analysis is an error, at registration and in the catalogue, so the report's
sequence never depends on name ties or import order.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import pkgutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from probes.analyses.base import Analysis, AnalysisResult
    from probes.engine.session import EngineSession

REPORT = "report"  # not an analysis: the function over all of them
# Loaded by name, as the analysis modules are: the report module imports this registry.
REPORT_MODULE = "probes.analyses.report"
ENTRY_POINT_GROUP = "basm_probes.analyses"  # analyses of other distributions: entry points naming their modules

T = TypeVar("T", bound=type)
_registered: dict[str, type] = {}  # name -> class, filled as the analysis modules are imported


class UnknownAnalysis(KeyError):
    """A name that no analysis is registered under; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class Entry:
    """One registered analysis as its module's source declares it (nothing imported)."""

    name: str
    module: str
    cls: str
    help: str
    order: int


def register(name: str, *, order: int):
    """Class decorator: register an :class:`~probes.analyses.base.Analysis` subclass under ``name``
    (the CLI subcommand, ``probes.run``'s first argument, its results file stem). ``order`` places
    it in ``report`` (and in the listings): an integer no other analysis uses; the paper's analyses
    use 10, 20, ... 80.

    The arguments must be literals: the catalogue reads them from the source without importing it.
    The class must be an ``Analysis`` whose own options are ``option(...)`` fields of a
    ``@dataclass(kw_only=True)`` (an undecorated field would silently be no option).
    """

    def decorate(cls: T) -> T:
        from probes.analyses.base import Analysis

        if not (isinstance(cls, type) and issubclass(cls, Analysis)):
            raise TypeError(f"@register({name!r}): {cls!r} is not a subclass of probes.analyses.base.Analysis")
        if name == REPORT:
            raise ValueError(f"@register({name!r}): the name is taken by the report command")
        check_order(name, order)
        check_options_class(name, cls)
        known = _registered.get(name)
        # re-importing the same module (importlib.reload) re-registers its class; another class is a clash
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"@register({name!r}): {cls.__module__}.{cls.__qualname__} clashes with "
                             f"{known.__module__}.{known.__qualname__}, registered under that name already")
        taken = {other.order: other_name for other_name, other in _registered.items() if other_name != name}
        taken |= {entry.order: entry.name for entry in catalogue().values() if entry.name != name}
        if order in taken:
            raise ValueError(f"@register({name!r}, order={order}): order {order} is taken by {taken[order]!r}; "
                             f"each analysis has its own (taken: {', '.join(map(str, sorted(taken)))})")
        cls.name, cls.order = name, order
        _registered[name] = cls
        return cls

    return decorate


def check_order(name: str, order: Any) -> None:
    """``order`` is an integer (a bool is not)."""
    if isinstance(order, bool) or not isinstance(order, int):
        raise TypeError(f"@register({name!r}): order must be an integer (its place in report), got {order!r}")


def check_options_class(name: str, cls: type) -> None:
    """Every option of ``cls`` is an ``option(...)`` field of a ``kw_only`` dataclass; a field declared
    on a class without ``@dataclass(kw_only=True)`` (or a plain annotated attribute) would be no option
    at all (no flag, not in :func:`options`, ignored as a keyword), so it is an error naming the field."""
    where = f"@register({name!r}): {cls.__module__}.{cls.__qualname__}"
    fix = "decorate the class with @dataclass(kw_only=True) under @register and declare each option with option(...)"
    loose = [attr for attr, value in vars(cls).items() if isinstance(value, dataclasses.Field)]
    loose += [attr for attr, kind in inspect.get_annotations(cls).items()
              if "ClassVar" not in str(kind) and attr not in cls.__dataclass_fields__]  # type: ignore[attr-defined]
    if loose:
        raise TypeError(f"{where} is not a dataclass: {', '.join(map(repr, dict.fromkeys(loose)))} would be no option; {fix}")
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.kw_only:
            raise TypeError(f"{where}: field {f.name!r} is positional: {fix}")
        if "help" not in f.metadata:
            raise TypeError(f"{where}: field {f.name!r} is no option (no help, flag or check): declare it with option(...)")


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError as error:
        raise ValueError(f"@register arguments must be literals, got {ast.unparse(node)!r}") from error


def _entries_of(module: str, source: str, path: str) -> list[Entry]:
    """The ``@register`` classes of one module's source."""
    entries = []
    for node in ast.parse(source, path).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for deco in node.decorator_list:
            func = deco.func if isinstance(deco, ast.Call) else None
            if not (isinstance(func, ast.Name) and func.id == "register" or isinstance(func, ast.Attribute) and func.attr == "register"):
                continue
            if not deco.args:
                raise ValueError(f"{path}: @register on {node.name} needs the analysis's name")
            keywords = {k.arg: _literal(k.value) for k in deco.keywords}
            doc = (ast.get_docstring(node) or "").strip()
            if not doc:
                raise ValueError(f"{path}: {node.name} has no docstring (its first paragraph is the analysis's help)")
            summary = " ".join(doc.split("\n\n")[0].split())  # the first paragraph, on one line
            name = _literal(deco.args[0])
            if "order" not in keywords:
                raise ValueError(f"{path}: @register({name!r}) on {node.name} needs order=N, its place in report (an integer no other "
                                 "analysis uses)")
            check_order(name, keywords["order"])
            entries.append(Entry(name, module, node.name, summary, keywords["order"]))
    return entries


@functools.lru_cache(maxsize=256)
def _entries_in(module: str, path: str, mtime_ns: int) -> tuple[Entry, ...]:
    """The ``@register`` classes of one module file (parsed again when it changes)."""
    source = Path(path).read_text(encoding="utf-8")
    return tuple(_entries_of(module, source, path)) if "register(" in source else ()


@functools.lru_cache(maxsize=8)
def _entry_points(environment: tuple[tuple[str, int], ...]) -> tuple[importlib.metadata.EntryPoint, ...]:
    """The entry points of :data:`ENTRY_POINT_GROUP` (scanning the installed distributions takes ~10 ms:
    read again when ``sys.path`` or one of its folders changes)."""
    return tuple(dict.fromkeys(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)))


def _path_state() -> tuple[tuple[str, int], ...]:
    return tuple((entry, os.stat(entry).st_mtime_ns if os.path.isdir(entry) else 0) for entry in sys.path)


def _plugin_entries() -> list[Entry]:
    """The analyses of other distributions' entry points, read from their modules' source (finding a
    module in a package imports that package's ``__init__``, not the module)."""
    entries: list[Entry] = []
    for point in _entry_points(_path_state()):
        label = f"entry point {point.name} = {point.value!r} (group {ENTRY_POINT_GROUP})"
        try:
            spec = importlib.util.find_spec(point.module)
        except ImportError as error:
            raise ValueError(f"{label}: cannot find module {point.module!r}: {error}") from error
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            raise ValueError(f"{label}: module {point.module!r} is not an installed .py source file")
        path = Path(spec.origin)
        found = _entries_in(point.module, str(path), path.stat().st_mtime_ns)
        if not found or (point.attr and point.attr not in {entry.cls for entry in found}):
            raise ValueError(f"{label}: {point.attr or point.module} carries no @register(...) in {path}")
        entries += [entry for entry in found if not point.attr or entry.cls == point.attr]
    return entries


def catalogue() -> dict[str, Entry]:
    """Every analysis of this package's modules (``__path__``: a folder added to it is searched too)
    and of the installed entry points (:data:`ENTRY_POINT_GROUP`), by name, in report order; read from
    the source, nothing imported. A name or an order declared twice is an error naming both."""
    found: dict[str, Entry] = {}
    for info in pkgutil.iter_modules(__path__):
        spec = info.module_finder.find_spec(info.name, None)  # type: ignore[call-arg]
        if info.ispkg or spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        path = Path(spec.origin)
        for entry in _entries_in(f"{__name__}.{info.name}", str(path), path.stat().st_mtime_ns):
            _add(found, entry)
    for entry in _plugin_entries():
        _add(found, entry)
    return dict(sorted(found.items(), key=lambda item: item[1].order))


def _add(found: dict[str, Entry], entry: Entry) -> None:
    if entry.name in found:
        raise ValueError(f"analysis {entry.name!r} is registered twice: in {found[entry.name].module} and {entry.module}")
    same = next((other for other in found.values() if other.order == entry.order), None)
    if same is not None:
        raise ValueError(f"analyses {same.name!r} ({same.module}) and {entry.name!r} ({entry.module}) share order={entry.order}: "
                         "each analysis has its own place in report")
    found[entry.name] = entry


def unknown_message(name: str, known: Sequence[str], what: str = "analysis") -> str:
    """The message for an unknown ``name`` (an analysis, an option): the close matches, then every known one."""
    close = difflib.get_close_matches(name, list(known), n=3)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    return f"unknown {what} {name!r}{hint} Known: {', '.join(known)}"


def make(cls: type, options: dict[str, Any]) -> Any:
    """``cls(**options)``, with an unknown keyword answered by the close matches and every valid option."""
    from probes.analyses.option_system import OptionError, UnknownOption, flag_of, option_fields

    known = [f.name for f in option_fields(cls)]
    for key in options:
        if key not in known:
            raise UnknownOption(f"{cls.name}: {unknown_message(key, known, 'option')}")
    for f in option_fields(cls):
        if f.name not in options and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise OptionError(f"{cls.name}: option {f.name!r} ({flag_of(f)}) is required")
    return cls(**options)


def get(name: str) -> type[Analysis]:
    """The analysis class registered under ``name`` (its module is imported on first use)."""
    entries = catalogue()
    if name not in entries:
        raise UnknownAnalysis(unknown_message(name, list(entries)))
    entry = entries[name]
    importlib.import_module(entry.module)
    cls = _registered.get(name)
    if cls is None or (cls.__module__, cls.__name__) != (entry.module, entry.cls):
        raise RuntimeError(f"{entry.module} declares @register({name!r}) on {entry.cls} but registered "
                           f"{'nothing' if cls is None else f'{cls.__module__}.{cls.__qualname__}'} under that name")
    return cls


def options_of(name: str) -> type:
    """The options class of the command ``name``: the analysis class, or the report's options."""
    if name == REPORT:
        return importlib.import_module(REPORT_MODULE).ReportOptions
    return get(name)


def options(name: str) -> dict[str, str]:
    """The keyword options of analysis ``name`` (or ``"report"``) and their help, e.g.
    ``probes.options("sweep")``."""
    from probes.analyses.option_system import option_fields

    return {f.name: f.metadata["help"] for f in option_fields(options_of(name))}


def run(name: str, session: EngineSession | None = None, **options: Any) -> AnalysisResult:
    """Run the analysis ``name`` (or ``"report"``) with keyword ``options`` on ``session`` (loaded
    from ``model`` when None); the CLI's ``basm-probes NAME`` does exactly this.

    Each analysis has its own options: ``probes.options("sweep")`` lists them with their help,
    ``help(probes.analyses.get("sweep"))`` shows the class, ``basm-probes sweep --help`` the flags.
    An unknown option is an :class:`~probes.analyses.option_system.OptionError` naming the valid ones; an
    option that contradicts the given ``session`` (``dtype``, ``device``, ``backend``...) is one too.
    """
    if name == REPORT:
        return importlib.import_module(REPORT_MODULE).report(session, **options)
    return make(get(name), options).run(session)


def migrate(model_dir: str | Path) -> list[tuple[Path, Path]]:
    """Move a results folder ``OUT/<model>`` of the earlier flat layout into one folder per analysis
    (:mod:`probes.reporting.layout`); returns the moves (source, target)."""
    from probes.reporting.layout import migrate as move_into_folders

    return move_into_folders(model_dir, tuple(catalogue()))


class RegisteredNames(Sequence):
    """The registered analyses' names in report order, read afresh on each use (a module added to
    ``__path__`` appears): :data:`ANALYSES`."""

    def __getitem__(self, index: Any) -> Any:
        return tuple(catalogue())[index]

    def __len__(self) -> int:
        return len(catalogue())

    def __repr__(self) -> str:
        return repr(tuple(catalogue()))


ANALYSES = RegisteredNames()


__all__ = ["ANALYSES", "ENTRY_POINT_GROUP", "Entry", "RegisteredNames", "UnknownAnalysis", "catalogue", "get", "make", "migrate", "options", "options_of", "register", "run"]
