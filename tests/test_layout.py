"""The package layout holds: no import cycles, no layer imports a layer above it, nothing imports the
CLI, importing the package (or a subpackage) loads no torch, the plots module leaves the matplotlib
backend alone, the attention function is registered only when a session opens, the notebook API
computes exactly what the command line does; and tests/ is laid out like the package."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pandas as pd
import pytest

import probes
from probes.reporting.layout import rows_path, table_path

PACKAGE_DIR = Path(probes.__file__).resolve().parent
ROOT = PACKAGE_DIR.parent


# ---------------------------------------------------------------------------- the import graph
def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under ``package_dir`` (packages by their ``__init__``)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements run when the module is imported: the module body, with its if/try/with and
    class bodies, but not function bodies, and not ``if TYPE_CHECKING:`` blocks."""
    stack: list[ast.stmt] = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            stack.extend(reversed(node.orelse if _is_type_checking(node.test) else [*node.body, *node.orelse]))
        elif isinstance(node, ast.Try | ast.TryStar):
            stack.extend(reversed([*node.body, *(s for h in node.handlers for s in h.body), *node.orelse, *node.finalbody]))
        elif isinstance(node, ast.With | ast.AsyncWith | ast.For | ast.AsyncFor | ast.While | ast.ClassDef):
            stack.extend(reversed([*node.body, *getattr(node, "orelse", [])]))


def imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The absolute names an import statement of ``module`` imports (``from X import Y``: ``X.Y``
    where Y may be a module, else ``X``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [source, *(f"{source}.{alias.name}" for alias in node.names)]


def every_import(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module: module level, inside functions (the lazy imports) and
    in ``if TYPE_CHECKING:`` blocks."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def import_graph(package_dir: Path, imports: Callable[[ast.Module], Iterable[ast.Import | ast.ImportFrom]] = module_level_imports,
                 ) -> dict[str, set[str]]:
    """module -> the modules of the package it imports at module level (``imports=every_import``:
    anywhere in it) (the named module: ``from X import Y`` is an edge to ``X.Y`` when that is a
    module, else to ``X``)."""
    modules = module_names(package_dir)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in imports(tree):
            targets = imported_modules(node, name, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):
                source, *members = targets
                found = [m for m in members if m in modules]
                targets = found if found and len(found) == len(members) else [source, *found]
            for target in targets:
                while target and target not in modules:  # `import a.b.c` of a non-module: the longest module prefix
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) per strongly connected component that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for component in components:  # a shortest path back to the start, inside the component
        start, members = component[0], set(component)
        paths, seen = {start: [start]}, {start}
        frontier = [start]
        cycle = None
        while frontier and cycle is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        cycle = [*paths[v], start]
                        break
                    if w not in seen:
                        seen.add(w)
                        paths[w] = [*paths[v], w]
                        nxt.append(w)
                if cycle:
                    break
            frontier = nxt
        out.append(cycle)
    return out


def test_the_cycle_finder_finds_and_names_a_cycle(tmp_path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("import os\nfrom pkg.b import g\ndef f():\n    from pkg import c\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
                              "try:\n    from pkg.sub import a\nexcept ImportError:\n    pass\n")
    (pkg / "c.py").write_text("from . import b\n")
    graph = import_graph(pkg)
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.a"}, "pkg.sub.a": {"pkg.b"}, "pkg.b": {"pkg.sub.a"}, "pkg.c": {"pkg.b"}}
    assert cycles(graph) == [["pkg.b", "pkg.sub.a", "pkg.b"]]
    assert cycles({"x": {"x"}, "y": set()}) == [["x", "x"]]


def test_no_import_cycles() -> None:
    graph = import_graph(PACKAGE_DIR)
    assert len(graph) > 40 and graph["probes.analyses.sweep"] >= {"probes.analyses.base", "probes.scoring.stats"}
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_the_cycle_finder_sees_imports_inside_functions(tmp_path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def helper():\n    from pkg.high import g\n    return g\n")
    (pkg / "high.py").write_text("from pkg.low import helper\ndef g():\n    return helper\n")
    (pkg / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.low import helper\n")
    assert not cycles(import_graph(pkg))  # at module level there is no cycle ...
    graph = import_graph(pkg, every_import)  # ... but a lazy import closes one
    assert graph == {"pkg": set(), "pkg.low": {"pkg.high"}, "pkg.high": {"pkg.low"}, "pkg.typed": {"pkg.low"}}
    assert cycles(graph) == [["pkg.high", "pkg.low", "pkg.high"]]


def test_no_import_cycles_through_lazy_imports() -> None:
    """No cycle even counting the imports inside functions: a lazy import hides a cycle from the
    interpreter, not from the design (the engine once reached up to the analyses this way)."""
    graph = import_graph(PACKAGE_DIR, every_import)
    assert graph["probes.facade"] >= {"probes.engine.session", "probes.prompts.builder", "probes.scoring.score", "probes.scoring.controls"}
    found = cycles(graph)
    assert not found, "import cycles (module level and inside functions): " + "; ".join(" -> ".join(cycle) for cycle in found)


# ---------------------------------------------------------------------------- the layers
# Bottom up: a module imports only its own layer and the layers below it (docs/architecture.md).
# core: what every layer shares (no package import, no torch); backends: alternative engines built
# on the engine; session: the notebook facade (probes.facade: the engine's session with the prompt
# and score helpers); probes: the package root, whose lazy names (``_EXPORTS``) load the layers
# below it on first use.
LAYERS = probes.LAYERS  # defined once in the package root (docs/architecture.py writes them into the docs)
ORGANISM = probes.ORGANISM_LAYER  # apart: it may import any layer but the CLI, and nothing but the CLI imports it
CLI = "probes.cli"


def layer_of(module: str) -> str:
    """The layer of a module of the package (the root ``probes`` is its own layer: its ``__init__`` only)."""
    for layer in (ORGANISM, *LAYERS):
        if module == layer or (layer != "probes" and module.startswith(layer + ".")):
            return layer
    raise ValueError(f"{module} belongs to no layer: add its subpackage to probes.LAYERS")


def lazy_names(init: Path) -> set[str]:
    """The modules the package root's lazy names load (the values of its ``_EXPORTS``): its imports, made by name."""
    for node in ast.walk(ast.parse(init.read_text(), str(init))):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            return {ast.literal_eval(value) for value in node.value.values}
    raise AssertionError(f"{init} defines no _EXPORTS")


def layer_graph() -> dict[str, set[str]]:
    """Every import of the package, module level and inside functions, with the root's lazy names."""
    graph = import_graph(PACKAGE_DIR, every_import)
    graph["probes"] |= lazy_names(PACKAGE_DIR / "__init__.py")
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``"a -> b (A imports B)"`` for each import of a layer above (or of the organism, or by it of the CLI)."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    out = []
    for module in sorted(graph):
        source = layer_of(module)
        for target in sorted(graph[module]):
            to = layer_of(target)
            if source == ORGANISM:
                allowed = to != CLI
            elif to == ORGANISM:
                allowed = source == CLI
            else:
                allowed = rank[to] <= rank[source]
            if not allowed:
                out.append(f"{module} -> {target} ({source} imports {to})")
    return out


def test_no_layer_imports_a_layer_above() -> None:
    graph = layer_graph()
    assert {layer_of(m) for m in graph} == {*LAYERS, ORGANISM}  # every module has its layer, and every layer a module
    assert graph["probes"] >= {"probes.facade", "probes.analyses"} and graph["probes.data.extract_llm"] >= {"probes.core.chat"}
    offenders = upward_imports(graph)
    assert not offenders, f"{len(offenders)} imports run up the layers: {offenders}"
    assert not cycles(graph)


def test_each_layer_rule_catches_a_planted_import() -> None:
    """Each layer importing the one above it (as the analyses did with the organism, the engine with
    the analyses), the organism imported below the CLI or importing it, and a module of no layer."""
    graph = layer_graph()
    ranked = [next(m for m in sorted(graph) if layer_of(m) == layer) for layer in LAYERS]
    for lower, upper in zip(ranked, ranked[1:]):
        planted = {**graph, lower: graph[lower] | {upper}}
        assert upward_imports(planted) == [f"{lower} -> {upper} ({layer_of(lower)} imports {layer_of(upper)})"], (lower, upper)
        assert not upward_imports({**graph, upper: graph[upper] | {lower}})  # downward: allowed
    assert upward_imports({**graph, "probes.analyses.base": graph["probes.analyses.base"] | {"probes.organism.validate"}}) == [
        "probes.analyses.base -> probes.organism.validate (probes.analyses imports probes.organism)"]
    assert upward_imports({**graph, "probes.organism.card": graph["probes.organism.card"] | {"probes.cli.main"}}) == [
        "probes.organism.card -> probes.cli.main (probes.organism imports probes.cli)"]
    assert not upward_imports({**graph, "probes.organism.card": graph["probes.organism.card"] | {"probes.analyses.base", "probes"}})
    with pytest.raises(ValueError, match="probes.plugins.x belongs to no layer"):
        upward_imports({**graph, "probes.plugins.x": {"probes.core.files"}})


def test_the_layer_check_reads_imports_inside_functions(tmp_path) -> None:
    """From source: an upward import inside a function (invisible at import time) is one."""
    pkg = tmp_path / "probes"
    for sub in ("core", "analyses"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text('_EXPORTS = {"run": "probes.analyses"}\n')
    (pkg / "core" / "files.py").write_text("def write():\n    from probes.analyses import base\n    return base\n")
    (pkg / "analyses" / "base.py").write_text("from probes.core import files\n")
    graph = import_graph(pkg, every_import)
    assert graph["probes.core.files"] == {"probes.analyses.base"}
    assert upward_imports(graph) == ["probes.core.files -> probes.analyses.base (probes.core imports probes.analyses)"]
    assert not upward_imports(import_graph(pkg))  # module level alone misses it


def test_the_notebook_session_is_the_engine_session_with_the_helpers() -> None:
    """``probes.ProbeSession`` is the facade: an engine session (so every analysis takes it) that
    carries ``prompt`` / ``score``; the engine's own session has neither."""
    from probes.engine.session import EngineSession
    from probes.facade import ProbeSession

    assert probes.ProbeSession is ProbeSession and issubclass(ProbeSession, EngineSession)
    assert not any(hasattr(EngineSession, name) for name in ("prompt", "score", "default_dataset"))


# ---------------------------------------------------------------------------- nothing imports the CLI
CLI_NAME = re.compile(r"probes\.cli(\.[A-Za-z_][\w.]*)?(:\w+)?")


def cli_imports(path: Path, module: str) -> list[str]:
    """Where ``path`` imports probes.cli (anywhere: module level or inside functions, by import
    statement or by a module name given to importlib)."""
    tree = ast.parse(path.read_text(), str(path))
    # a module name in a string imports when it is handed to a call (importlib) or is a value of a lazy
    # name map (``_EXPORTS``); a name in a tuple of layers or in a docstring does not
    loaded = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call) for arg in node.args}
    loaded |= {id(value) for node in ast.walk(tree) if isinstance(node, ast.Dict) for value in node.values}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = imported_modules(node, module, path.name == "__init__.py")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and CLI_NAME.fullmatch(node.value)
              and id(node) in loaded):
            names = [node.value]
        if any(n == "probes.cli" or n.startswith(("probes.cli.", "probes.cli:")) for n in names):
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}")
    return found


def test_nothing_outside_the_cli_imports_the_cli(tmp_path) -> None:
    offenders = [where for name, path in module_names(PACKAGE_DIR).items()
                 if not (name == "probes.cli" or name.startswith("probes.cli.")) for where in cli_imports(path, name)]
    assert not offenders, f"modules outside probes/cli import probes.cli: {offenders}"
    # the check sees each form
    probe = tmp_path / "probe.py"
    for source in ("import probes.cli.main", "from probes.cli import main", "from probes import cli",
                   "def f():\n    from probes.cli.options import add_options",
                   "import importlib\nimportlib.import_module('probes.cli.flags')", "from ..cli import main",
                   "_EXPORTS = {'main': 'probes.cli.main'}"):
        probe.write_text(source + "\n")
        assert cli_imports(probe, "probes.analyses.probe"), source
    probe.write_text('"""See probes.cli.main for the flags."""\nimport probes.client\nfrom probes import analyses\n'
                     'LAYERS = ("probes.analyses", "probes.cli")\n')
    assert not cli_imports(probe, "probes.analyses.probe")


# ---------------------------------------------------------------------------- in fresh interpreters
def _script(source: str, **env: str | None) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if k not in env}
    environ.update({k: v for k, v in env.items() if v is not None})
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(source)], cwd=ROOT, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# Every package __init__ but the CLI's, which re-exports probes.cli.main:main (the console script)
# and so loads the prompt builder (transformers, torch): the CLI is the program, not the library.
PACKAGES = sorted(name for name, path in module_names(PACKAGE_DIR).items()
                  if path.name == "__init__.py" and name != "probes.cli")

SCRIPTS = {
    "no_torch": f"""
        import sys
        import {", ".join(PACKAGES)}
        import probes.analyses
        import probes.core.chat, probes.core.files, probes.data.extract_llm, probes.prompts.spans, probes.prompts.lengths  # torch-free leaves
        assert probes.analyses.catalogue()["sweep"].help and "sweep" in probes.ANALYSES  # the registry, without its modules
        heavy = sorted(m for m in ("torch", "transformers", "matplotlib") if m in sys.modules)
        assert not heavy, heavy
        print("ok")
    """,
    # a notebook's chosen backend (here svg; e.g. inline) survives importing and styling the plots
    "backend": """
        import matplotlib
        matplotlib.use("svg")
        before = matplotlib.rcParams._get("backend")
        import probes.reporting.plots
        assert matplotlib.rcParams._get("backend") == before == "svg", matplotlib.rcParams._get("backend")
        probes.reporting.plots.style()
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        print("ok")
    """,
    # not on import (nor on importing the analyses and the CLI): when a session opens; installing is idempotent
    "attention": """
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        import probes.engine.session as s
        import probes.analyses.base, probes.cli.main
        from probes.organism import ORGANISM_DIR
        NAME = s.ATTN_IMPLEMENTATION
        MAPS = (AttentionInterface._global_mapping, AttentionMaskInterface._global_mapping)
        assert NAME == "basm_probe"
        assert [NAME in m for m in MAPS] == [False, False], "registered on import"
        session = s.EngineSession(ORGANISM_DIR)
        assert [NAME in m for m in MAPS] == [True, True], "not registered by opening a session"
        assert session.model.config._attn_implementation == NAME
        for m in MAPS:  # unregistered again: install_attention alone registers it, twice gives the same
            del m[NAME]
        assert s.install_attention() == NAME
        assert MAPS[0][NAME] is s.probe_attention_forward and MAPS[1][NAME] is sdpa_mask
        before = [dict(m) for m in MAPS]
        assert s.install_attention() == NAME
        assert [dict(m) for m in MAPS] == before
        print("ok")
    """,
}
ENV = {"backend": {"MPLBACKEND": None}}


@pytest.fixture(scope="module")
def scripts() -> Iterator[dict[str, subprocess.Popen]]:
    """Every fresh-interpreter check, started at once (they run while the others wait)."""
    procs = {name: _script(source, **ENV.get(name, {})) for name, source in SCRIPTS.items()}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ran(scripts: dict[str, subprocess.Popen], name: str) -> None:
    output, _ = scripts[name].communicate(timeout=300)
    assert scripts[name].returncode == 0 and output.strip().endswith("ok"), f"{name}:\n{output}"


@pytest.mark.subprocess
def test_importing_the_package_and_its_subpackages_loads_no_torch(scripts) -> None:
    assert {"probes", "probes.analyses", "probes.data", "probes.engine", "probes.scoring", "probes.reporting"} <= set(PACKAGES)
    _ran(scripts, "no_torch")


@pytest.mark.subprocess
def test_importing_the_plots_leaves_the_matplotlib_backend_alone(scripts) -> None:
    _ran(scripts, "backend")


@pytest.mark.subprocess
def test_the_attention_function_is_registered_when_a_session_opens(scripts) -> None:
    _ran(scripts, "attention")


# ---------------------------------------------------------------------------- notebook API == CLI
def test_the_notebook_api_and_the_cli_give_the_same_rows(tmp_path, capsys) -> None:
    from probes.analyses.sweep import Sweep
    from probes.cli.main import main
    from probes.engine.session import EngineSession
    from probes.organism import ORGANISM_DIR, ORGANISM_NAME
    from probes.reporting.results import load_results

    session = EngineSession(ORGANISM_DIR)
    api = Sweep(limit=1, k_max=1, buckets=["T_wrong"], embedder="lexical", configs=["proc", "basm"], figure=False,
                out=tmp_path / "api").run(session)
    assert main(["sweep", "--limit", "1", "--k-max", "1", "--bucket", "T_wrong", "--embedder", "lexical",
                 "--configs", "proc,basm", "--no-figure", "--out", str(tmp_path / "cli")]) == 0
    assert api.status == 0 and api.out_dir == tmp_path / "api" / ORGANISM_NAME
    cli = load_results(rows_path(tmp_path / "cli" / ORGANISM_NAME, "sweep"))

    rows = api.rows
    assert len(rows) == 4 and set(rows["config"]) == {"proc", "basm"} and set(rows["k"]) == {0, 1}  # 1 item × 2 configs × k 0..1
    assert rows["margin"].notna().all()
    # every column, every value, in the same order: nothing differs between the two ways in
    pd.testing.assert_frame_equal(rows.reset_index(drop=True), cli.reset_index(drop=True), check_exact=True)
    # the same results header (configuration and fingerprints: model, dataset, code), so each resumes the other
    assert rows.attrs["meta"]["config"] == cli.attrs["meta"]["config"]
    table = pd.read_csv(table_path(tmp_path / "cli" / ORGANISM_NAME, "sweep", "sweep_summary"))
    pd.testing.assert_frame_equal(api.tables["sweep_summary"].reset_index(drop=True), table, check_dtype=False)
    assert sorted(p.name for p in (tmp_path / "api" / ORGANISM_NAME).iterdir()) == \
        sorted(p.name for p in (tmp_path / "cli" / ORGANISM_NAME).iterdir())


# ---------------------------------------------------------------------------- CI runs README's tests
def test_ci_runs_readmes_test_command() -> None:
    """``.ci/run`` ends with exactly the test command of README's "The two commands"."""
    section = (ROOT / "README.md").read_text().split("## The two commands", 1)[1].split("\n## ", 1)[0]
    readme = re.findall(r"^python -m pytest\b.*$", section, flags=re.M)
    assert len(readme) == 1, readme
    ci = [line.split(" #")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == readme[0] and sum(line.startswith("python -m pytest") for line in ci) == 1


def test_the_facade_prompts_and_scores_as_the_scorer_and_the_controls_do(tmp_path) -> None:
    """``session.score(record, knockouts=[...])`` is the one record scorer under the named spans and
    the knockout analysis's ``random_0`` neutral draw (the record's own tool names); an analysis
    runs on the facade as on an engine session."""
    from probes.analyses.sweep import Sweep
    from probes.engine.session import Knockout
    from probes.organism import ORGANISM_DIR
    from probes.scoring.controls import block_lengths, draw_span, neutral_pool, record_tool_names
    from probes.scoring.score import record_rng, score_record

    session = probes.ProbeSession(ORGANISM_DIR, prefix_cache=0)
    items = probes.load_dataset(session.default_dataset).select(split="eval", buckets=["T_wrong"])
    record = next(r for r in (session.prompt(item.id, config="basm", k=2) for item in items) if r.spans.get("boundary"))
    rows = session.score(record, knockouts=["boundary", "procedure", "random"], seed=3)
    blocks = record.spans["boundary"]
    random, _ = draw_span(neutral_pool(record, record_tool_names(record)), block_lengths(blocks), record_rng(3, record.record_id, "random_0"))
    expected = score_record(session, record, [Knockout.from_spans("boundary", blocks),
                                              Knockout.from_spans("procedure", record.spans["procedure"]),
                                              Knockout("random", tuple(random))])
    assert list(rows["condition"]) == ["baseline", "boundary", "procedure", "random"] and 0 < rows["knockout_size"].iloc[3] == len(random)
    pd.testing.assert_frame_equal(rows, pd.DataFrame(expected))
    with pytest.raises(ValueError, match="give a Knockout or one of"):
        session.score(record, knockouts=["nowhere"])
    result = Sweep(limit=1, k_max=1, buckets=["T_wrong"], embedder="lexical", configs=["basm"], figure=False,
                   out=tmp_path).run(session, verbose=False)
    assert result.status == 0 and len(result.rows) == 2


def test_one_min_ci_groups_constant() -> None:
    """The smallest number of task groups with a CI is defined once (probes.scoring.stats); the
    plots and the analyses import it."""
    from probes.reporting import plots
    from probes.scoring import stats

    defined = [f"{name}:{node.lineno}" for name, path in module_names(PACKAGE_DIR).items()
               for node in ast.walk(ast.parse(path.read_text(), str(path)))
               if isinstance(node, ast.Assign | ast.AnnAssign)
               and any(isinstance(t, ast.Name) and t.id == "MIN_CI_GROUPS" for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    assert len(defined) == 1 and defined[0].startswith("probes.scoring.stats:"), defined
    assert plots.MIN_CI_GROUPS is stats.MIN_CI_GROUPS


# ---------------------------------------------------------------------------- the tests' own layout
# tests/ mirrors the package: a test file lives in the folder of the layer whose module it tests and imports
# from that layer; two folders are not layers: what the docs state (names resolve, notebooks run) and the
# installed package and benchmark scripts run as processes. Only this file, about the whole package, sits at
# the top. No __init__.py: pytest's default import mode imports each test file by its name, so names are unique.
TESTS_DIR = Path(__file__).resolve().parent
CROSS_CUTTING = ("docs", "integration")
TOP_LEVEL_TESTS = ("test_layout.py",)


def misplaced_tests(tests_dir: Path, package_dir: Path) -> list[str]:
    """What breaks the layout of ``tests_dir`` against the layers (subpackages) of ``package_dir``."""
    layers = sorted(p.name for p in package_dir.iterdir() if (p / "__init__.py").is_file())
    package = package_dir.name
    problems = [f"{path.name}: a test file goes in the folder of the layer it tests ({', '.join(layers)})"
                for path in sorted(tests_dir.glob("test_*.py")) if path.name not in TOP_LEVEL_TESTS]
    problems += [f"{path.relative_to(tests_dir)}: no __init__.py under tests/ (test files are imported by name)"
                 for path in sorted(tests_dir.rglob("__init__.py"))]
    for folder in sorted(p for p in tests_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))):
        if folder.name not in layers and folder.name not in CROSS_CUTTING:
            problems.append(f"{folder.name}/: neither a layer of {package}/ ({', '.join(layers)}) nor one of {', '.join(CROSS_CUTTING)}")
    seen: dict[str, Path] = {}
    for path in sorted(tests_dir.rglob("test_*.py")):
        relative = path.relative_to(tests_dir)
        if path.name in seen:
            problems.append(f"{seen[path.name]} and {relative}: test file names must be unique (pytest imports them by name)")
        seen.setdefault(path.name, relative)
        if len(relative.parts) > 2:
            problems.append(f"{relative}: one folder per layer, no deeper")
        elif len(relative.parts) == 2 and relative.parts[0] in layers:
            layer = f"{package}.{relative.parts[0]}"
            imported = {name for node in every_import(ast.parse(path.read_text(encoding="utf-8")))
                        for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])}
            siblings = {name for name in imported if (path.parent / f"{name}.py").is_file()}  # test_card_v2 uses test_cards' check
            if not siblings and not any(name == layer or name.startswith(layer + ".") for name in imported):
                problems.append(f"{relative}: imports nothing from {layer}, the layer of its folder")
    return problems


def test_the_tests_are_laid_out_like_the_package() -> None:
    assert misplaced_tests(TESTS_DIR, PACKAGE_DIR) == []


def test_the_test_layout_check_catches_each_planted_misplacement(tmp_path) -> None:
    package, tests = tmp_path / "pkg", tmp_path / "tests"
    for layer in ("scoring", "analyses"):
        (package / layer).mkdir(parents=True)
        (package / layer / "__init__.py").write_text("")
    (tests / "scoring").mkdir(parents=True)
    (tests / "scoring" / "test_stats.py").write_text("from pkg.scoring import stats\n")
    (tests / "docs").mkdir()
    (tests / "docs" / "test_names.py").write_text("")
    (tests / "test_layout.py").write_text("")
    assert misplaced_tests(tests, package) == []
    planted = {
        "test_flat.py": "test_flat.py: a test file goes in the folder of the layer it tests",
        "misc/test_misc.py": "misc/: neither a layer of pkg/",
        "analyses/test_stats.py": "analyses/test_stats.py and scoring/test_stats.py: test file names must be unique",
        "scoring/test_runs.py": "scoring/test_runs.py: imports nothing from pkg.scoring",
        "scoring/deep/test_deep.py": "scoring/deep/test_deep.py: one folder per layer",
        "analyses/__init__.py": "analyses/__init__.py: no __init__.py",
    }
    for name, message in planted.items():
        path = tests / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("from pkg.analyses import run\n")
        found = misplaced_tests(tests, package)
        assert len(found) == 1 and found[0].startswith(message), (name, found)
        path.unlink()
        if not any(path.parent.iterdir()) and path.parent != tests:
            path.parent.rmdir()


# ---------------------------------------------------------------------------- one module name per job
SHARED_MODULE_NAMES = {"__init__", "base"}  # base: each layer's contract (probes.analyses.base, probes.backends.base)


def repeated_module_names(names: list[str]) -> dict[str, list[str]]:
    """Module names (the last dotted part) used by more than one module, beside the allowed ones."""
    by_name: dict[str, list[str]] = {}
    for module in names:
        by_name.setdefault(module.rpartition(".")[2], []).append(module)
    return {name: sorted(found) for name, found in by_name.items() if len(found) > 1 and name not in SHARED_MODULE_NAMES}


def test_no_two_modules_share_a_name() -> None:
    """A search result says its layer and job: ``forks`` is the analysis, ``fork_estimators`` its estimators."""
    files = [p for p in PACKAGE_DIR.rglob("*.py") if p.name != "__init__.py"]
    names = [".".join(p.relative_to(PACKAGE_DIR.parent).with_suffix("").parts) for p in files]
    assert len(names) > 80 and repeated_module_names(names) == {}
    assert repeated_module_names([*names, "probes.scoring.forks"]) == {"forks": ["probes.analyses.forks", "probes.scoring.forks"]}
