"""One writer (issue 41): every file the package writes goes through :mod:`probes.core.files`. This
walks the package's source (``ast``) and fails on any other write.

What counts as a write (a call outside ``probes/core/files.py``):
- ``X.write_text(...)`` / ``X.write_bytes(...)`` (``Path``'s; an :class:`~probes.core.files.OutputRoot`
  names its own ``write`` / ``write_binary`` / ``write_table`` / ``write_figure``);
- ``open(...)`` / ``X.open(...)`` / ``io.open(...)`` with a mode holding ``w``, ``a``, ``x`` or ``+`` (reads are free);
- ``os.open`` (only the writer needs flag-level control), and ``os``'s ``replace``, ``rename``, ``remove``,
  ``unlink``, ``truncate``, ``ftruncate``, ``makedirs``, ``mkdir``, ``rmdir``, ``symlink``, ``link``;
- ``X.savefig``, ``X.to_csv`` / ``X.to_json`` / ``X.to_parquet`` given a target (without one they return text),
  ``json.dump`` (to a handle: a file), ``X.tofile``;
- ``np.save`` / ``savez`` / ``savetxt``, ``torch.save``, ``X.save_pretrained`` (third-party writers that want a path),
  unless their target is the name bound by an enclosing ``with ROOT.atomic(...) / ROOT.folder(...) /
  ROOT.files_into(...) as NAME`` (a temporary of the writer's, renamed into place by it);
- ``shutil``'s ``copy``, ``copy2``, ``copyfile``, ``copytree``, ``move``, ``rmtree`` (and importing them by name);
- ``Path``'s ``unlink``, ``mkdir``, ``touch``, ``rmdir``, ``symlink_to``, ``hardlink_to``; ``X.rename(target)`` and
  ``X.replace(target)`` with one argument that is not a string literal (``Series.rename("n")``, ``str.replace(a, b)``
  and ``dataclasses.replace(x, **changes)`` are not writes).
Not counted: ``tempfile`` scratch folders (deleted, never an output; what is written inside them is counted).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from probes.core import files

PACKAGE = Path(__file__).resolve().parents[2] / "probes"
WRITER = Path(files.__file__).resolve().relative_to(PACKAGE).as_posix()  # the one module allowed to write

PATH_WRITES = {"write_text", "write_bytes", "unlink", "mkdir", "touch", "rmdir", "symlink_to", "hardlink_to"}
OS_WRITES = {"open", "replace", "rename", "remove", "unlink", "truncate", "ftruncate", "makedirs", "mkdir", "rmdir", "symlink", "link"}
SHUTIL_WRITES = {"copy", "copy2", "copyfile", "copytree", "move", "rmtree"}
SAVERS = {"savefig", "tofile"}
TABLE_WRITERS = {"to_csv", "to_json", "to_parquet"}
NUMPY_SAVES = {"save", "savez", "savez_compressed", "savetxt"}

def _mode(call: ast.Call, position: int) -> str | None:
    """The mode literal of an open call (``position``: its positional index), or None."""
    node = call.args[position] if len(call.args) > position else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _writes_mode(mode: str | None) -> bool:
    return mode is not None and any(c in mode for c in "wax+")


STAGING = {"atomic", "folder", "files_into"}  # OutputRoot's context managers that hand a temporary to a third-party writer


def _staged_names(tree: ast.AST) -> dict[ast.AST, set[str]]:
    """For each node, the names bound by the enclosing ``with ROOT.<STAGING>(...) as NAME`` blocks."""
    bound: dict[ast.AST, set[str]] = {}

    def visit(node: ast.AST, names: set[str]) -> None:
        bound[node] = names
        if isinstance(node, ast.With | ast.AsyncWith):
            names = names | {item.optional_vars.id for item in node.items
                             if isinstance(item.optional_vars, ast.Name) and isinstance(item.context_expr, ast.Call)
                             and isinstance(item.context_expr.func, ast.Attribute) and item.context_expr.func.attr in STAGING}
        for child in ast.iter_child_nodes(node):
            visit(child, names)

    visit(tree, set())
    return bound


def found_writes(source: str) -> list[str]:
    """Each write call in ``source``, named ``receiver.method`` (or the bare name), in order."""
    found = []
    tree = ast.parse(source)
    staged = _staged_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("shutil", "os"):
            banned = SHUTIL_WRITES if node.module == "shutil" else OS_WRITES
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name in banned]
            continue
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            if func.id == "open" and _writes_mode(_mode(node, 1)):
                found.append("open")
            continue
        if not isinstance(func, ast.Attribute):
            continue
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        name, n_args = func.attr, len(node.args)
        saver = owner in ("np", "numpy") and name in NUMPY_SAVES or owner == "torch" and name == "save" or name == "save_pretrained"
        if saver:
            target = node.args[1] if owner == "torch" and n_args > 1 else node.args[0] if node.args else None
            if not (isinstance(target, ast.Name) and target.id in staged[node]):
                found.append(f"{owner}.{name}" if owner in ("np", "numpy", "torch") else f".{name}")
        elif owner == "os" and name in OS_WRITES or owner == "shutil" and name in SHUTIL_WRITES or owner == "json" and name == "dump":
            found.append(f"{owner}.{name}")
        elif owner in ("os", "json", "np", "numpy", "torch", "shutil", "dataclasses"):
            continue
        elif name in PATH_WRITES or name in SAVERS:
            found.append(f".{name}")
        elif name in TABLE_WRITERS and (n_args or any(k.arg == "path_or_buf" for k in node.keywords)):
            found.append(f".{name}")
        elif name == "open" and _writes_mode(_mode(node, 1 if owner in ("io", "codecs") else 0)):  # io.open(path, mode), Path.open(mode)
            found.append(".open")
        elif name in ("rename", "replace") and n_args == 1 and not node.keywords and not (
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append(f".{name}")
    return found


def package_writes() -> Counter[tuple[str, str]]:
    writes: Counter[tuple[str, str]] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel != WRITER:
            writes.update((rel, write) for write in found_writes(path.read_text(encoding="utf-8")))
    return writes


def test_every_write_goes_through_the_writer() -> None:
    writes = package_writes()
    stray = sorted(f"probes/{rel}: {write} (×{n})" for (rel, write), n in writes.items())
    assert not stray, ("files written outside probes/core/files.py; write through probes.core.files.OutputRoot "
                       "(write, write_binary, write_table, write_figure, folder, atomic):\n" + "\n".join(stray))


PLANTED = '''
from pathlib import Path


def figures(summary, out_dir: Path) -> list[Path]:
    (out_dir / "notes.md").write_text("hello")
    return []
'''


@pytest.mark.parametrize(("source", "expected"), [
    (PLANTED, [".write_text"]),
    ("open(p, 'w').write(t)\nopen(p).read()\nopen(p, mode='ab')", ["open", "open"]),
    ("p.open('a')\np.open('rb')\nwith p.open(mode='x') as h: pass\nio.open(p, 'w')\nio.open(p)", [".open", ".open", ".open"]),
    ("fig.savefig(p)\nframe.to_csv(p, index=False)\nframe.to_csv(index=False)\njson.dump(x, h)\njson.dumps(x)", [".savefig", ".to_csv", "json.dump"]),
    ("shutil.rmtree(d)\nfrom shutil import copytree\nos.replace(a, b)\nos.open(p, os.O_WRONLY)", ["shutil.rmtree", "from shutil import copytree", "os.replace", "os.open"]),
    ("p.unlink()\np.mkdir(parents=True)\ntmp.replace(p)\ntmp.rename(p)", [".unlink", ".mkdir", ".replace", ".rename"]),
    ("s.replace('a', 'b')\nseries.rename('n')\nframe.rename(columns=c)\ndataclasses.replace(x, a=1)\nroot.write(p, t)", []),
    ("np.save(p, a)\ntorch.save(s, p)\nmodel.save_pretrained(d)", ["np.save", "torch.save", ".save_pretrained"]),
    ("with root.atomic('a.npy') as tmp:\n    np.save(tmp, a)\nwith root.files_into() as stage:\n    model.save_pretrained(stage)\n"
     "    model.save_pretrained(elsewhere)\nnp.save(tmp, a)", [".save_pretrained", "np.save"]),
])
def test_the_walk_finds_each_kind_of_write(source: str, expected: list[str]) -> None:
    assert sorted(found_writes(source)) == sorted(expected)


def test_a_planted_write_in_a_new_analysis_module_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the package with a new analysis module that writes its own way: the walk names it."""
    import shutil

    copy = tmp_path / "probes"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "datasets", "weights"))
    (copy / "analyses" / "planted.py").write_text(PLANTED)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", copy)
    with pytest.raises(AssertionError, match=r"probes/analyses/planted.py: \.write_text"):
        test_every_write_goes_through_the_writer()
