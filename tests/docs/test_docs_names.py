"""Every dotted ``probes.`` name the prose names resolves: docs/*.md, README.md, benchmarks/README.md,
the organism's model card and the notebooks' markdown cells (their code cells run in test_notebooks).

What counts as a name (the rules :func:`dotted_names` implements):

- ``probes.a.b`` not preceded by a word character, ``-``, ``/`` or ``.``: a file path
  (``probes/engine/session.py``) or the CLI (``basm-probes``) is not a dotted name.
- Call text names the callee: ``probes.run("sweep", k=2)`` checks ``probes.run``.
- A glob or a brace list checks its fixed prefix: ``probes.analyses.*`` checks ``probes.analyses``.
- ``from probes.x import a, b`` checks ``probes.x.a`` and ``probes.x.b``.

A name resolves when its longest importable module prefix imports and the rest is reached by
``getattr``. Only the modules the docs name are imported (the first one pays for torch once).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Not after a word character, "-", "/" or ".": "basm-probes", "src/probes.x" and "x.probes" are not names.
_NAME = re.compile(rf"(?<![\w\-/.])probes(?:\.{_IDENT})+")
_FROM_IMPORT = re.compile(rf"\bfrom\s+(probes(?:\.{_IDENT})*)\s+import\s+(\([^)]*\)|[^\n]+)")


def documents() -> list[Path]:
    """The prose the check covers."""
    paths = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "benchmarks" / "README.md",
             ROOT / "probes" / "organism" / "weights" / "README.md", *sorted((ROOT / "notebooks").glob("*.ipynb"))]
    missing = [str(p.relative_to(ROOT)) for p in paths if not p.is_file()]
    assert not missing, f"documents named by the docs check are missing: {missing}"
    return paths


def prose(path: Path) -> str:
    """A document's text; for a notebook, its markdown cells (one per line block)."""
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


def dotted_names(text: str) -> Iterator[tuple[int, str]]:
    """(line number, name) of every dotted ``probes.`` name in ``text``, by the module docstring's rules."""
    for match in _FROM_IMPORT.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for imported in match.group(2).strip("()").split(","):
            imported = imported.split("#")[0].split(" as ")[0].strip()
            if re.fullmatch(_IDENT, imported):
                yield line, f"{match.group(1)}.{imported}"
    for match in _NAME.finditer(text):
        yield text.count("\n", 0, match.start()) + 1, match.group(0)


def resolve(name: str) -> str | None:
    """None when ``name`` resolves, else why not."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and (module_name + ".").startswith(error.name + "."):
                continue  # this prefix is not a module: try a shorter one
            raise  # the module exists but one of its imports is missing: not a docs problem
        for depth, attribute in enumerate(parts[cut:], start=cut):
            if not hasattr(obj, attribute):
                return f"{'.'.join(parts[:depth])} has no attribute {attribute!r}"
            obj = getattr(obj, attribute)
        return None
    return f"no module {parts[0]!r}"


def unresolved(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: {name}: {why}"
            for line, name in dotted_names(prose(path)) if (why := resolve(name)) is not None]


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_name_resolves(path: Path) -> None:
    assert not unresolved(path), "names in the docs that no longer exist:\n" + "\n".join(unresolved(path))


def test_planted_unknown_names_are_caught(tmp_path: Path) -> None:
    """The check can fail: an unknown attribute, an unknown module and an unknown imported name are
    reported; a file path, the CLI, call text and a glob over real names are not."""
    doc = tmp_path / "planted.md"
    doc.write_text(
        "`probes.engine.session.NoSuchResult` and `probes.no_such_layer.thing`\n"
        "```python\nfrom probes.backends import get_backend, no_such_backend\n```\n"
        "fine: probes/engine/no_such_file.py, `basm-probes run`, `probes.run(\"sweep\", k=2)`, "
        "`probes.analyses.*`, probes.data.dataset.spread_limit.\n",
        encoding="utf-8",
    )
    assert [entry.split(": ")[1] for entry in unresolved(doc)] == [
        "probes.backends.no_such_backend", "probes.engine.session.NoSuchResult", "probes.no_such_layer.thing",
    ]
