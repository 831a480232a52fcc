#!/usr/bin/env python3
"""Lay tests/ out like the package (tests_layout_plan.md): pure file moves with ``git mv`` and the
path fixes they need. Splitting the catch-all files is done by hand, following the plan.

Run from anywhere inside the repository, after the other branches are merged:

    python apply_tests_layout.py            # moves, fixes, prints what it did
    python -m pytest -q -p no:cacheprovider --collect-only -q | tail -1   # every test still collected

Idempotent: a file already at its new place is left alone, a fix already made is not made twice, so
a second run changes nothing. It stops (exit 1, nothing half-done for that file) on what it cannot
place: a flat test file that MOVES does not name (a test added by another branch: add it to MOVES),
a file present both at its old and its new place, or two test files with the same name (pytest's
default "prepend" import mode imports test modules by file name).

What it does:
1. The unreferenced fixture folder tests/data/mini goes to tests/fixtures/mini, so that tests/data/ can
   hold the tests of probes.data.
2. Every flat tests/test_*.py named in MOVES goes to tests/<folder>/ (no __init__.py: pytest's prepend
   mode puts each test's folder on sys.path, so ``from test_cards import ...`` keeps working between
   files of one folder).
3. In the moved files the repository root is one level further up: ``Path(__file__).resolve().parent.parent``
   and ``.parents[1]`` become ``.parents[2]``.
4. Every mention ``tests/test_NAME.py`` in the repository's text files (docs, READMEs, code docstrings,
   the generated cards and their generators alike, so that regenerated text still equals the committed
   one) becomes ``tests/<folder>/test_NAME.py``.
5. pyproject.toml's pytest options get ``pythonpath = ["tests"]``: the shared helpers tests/reference.py
   and tests/interrupt.py stay importable as ``reference`` and ``interrupt`` from every folder (today
   only because tests/conftest.py's folder happens to be put on sys.path).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# test file -> its folder under tests/ (tests_layout_plan.md says why each goes where).
MOVES: dict[str, str] = {
    # probes.data
    "test_schema.py": "data", "test_retrieval.py": "data", "test_basm_probe_v2.py": "data", "test_bfcl.py": "data",
    "test_extract_llm.py": "data",
    # probes.prompts
    "test_records.py": "prompts", "test_rendering.py": "prompts", "test_priming.py": "prompts", "test_oracle.py": "prompts",
    # probes.engine
    "test_engine.py": "engine", "test_loading.py": "engine", "test_prefix_blocks.py": "engine", "test_prefix_reuse.py": "engine",
    # probes.backends
    "test_backends.py": "backends",
    # probes.scoring
    "test_margins.py": "scoring", "test_measures.py": "scoring", "test_checker.py": "scoring", "test_toolcalls.py": "scoring",
    "test_stats.py": "scoring", "test_shortcuts.py": "scoring", "test_knockout_controls.py": "scoring",
    # probes.reporting
    "test_cards.py": "reporting", "test_card_v2.py": "reporting", "test_card_bfcl.py": "reporting",
    # probes.analyses
    "test_analyses.py": "analyses", "test_attribution.py": "analyses", "test_curation.py": "analyses", "test_forks.py": "analyses",
    "test_heads.py": "analyses", "test_linear.py": "analyses", "test_linear_calls.py": "analyses",
    "test_ratios_shifts.py": "analyses", "test_registry.py": "analyses", "test_resume.py": "analyses",
    "test_bfcl_analyses.py": "analyses", "test_distributed.py": "analyses", "test_options.py": "analyses",
    "test_option_values.py": "analyses", "test_one_option_system.py": "analyses",
    "test_explore.py": "analyses",  # the page builder is probes.analyses.explore
    "test_contracts.py": "analyses",  # register()'s contracts and check_analysis over every registered analysis
    # probes.cli
    "test_cli_build.py": "cli",
    # probes.organism
    "test_organism_train.py": "organism", "test_organism_validate.py": "organism",
    # what the docs state: dotted names resolve, the notebooks run
    "test_docs_names.py": "docs", "test_notebooks.py": "docs",
    # the installed package and the benchmark scripts, run as processes
    "test_install.py": "integration", "test_benchmarks_gpu.py": "integration", "test_benchmarks_real_shape.py": "integration",
}
# Stay in tests/: the whole package's import graph, and the catch-all that the hand split dissolves.
STAY: frozenset[str] = frozenset({"test_layout.py", "test_reliability.py"})
# Text files whose mentions of test paths are rewritten (data files such as items.jsonl never are).
TEXT_SUFFIXES = (".py", ".md", ".toml", ".cfg", ".ini", ".txt", ".ipynb", ".j2")
TEXT_FILES = (".ci/run",)
PLAN_FILES = ("apply_tests_layout.py", "tests_layout_plan.md")  # they name the old paths on purpose

ROOT_FROM_FILE = re.compile(r"Path\(__file__\)\.resolve\(\)(?:\.parent\.parent|\.parents\[1\])(?![\w.\[])")
PYTHONPATH_LINE = 'pythonpath = ["tests"]  # tests/reference.py and tests/interrupt.py, imported by name from every folder'


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def fail(message: str) -> None:
    sys.exit(f"apply_tests_layout: {message}")


def move_fixtures(root: Path) -> list[str]:
    old, new = root / "tests" / "data" / "mini", root / "tests" / "fixtures" / "mini"
    if not old.exists():
        return []
    if new.exists():
        fail(f"both {old.relative_to(root)} and {new.relative_to(root)} exist")
    new.parent.mkdir(exist_ok=True)
    git(root, "mv", str(old.relative_to(root)), str(new.relative_to(root)))
    return ["git mv tests/data/mini tests/fixtures/mini"]


def move_tests(root: Path) -> list[str]:
    tests = root / "tests"
    unplaced = sorted(p.name for p in tests.glob("test_*.py") if p.name not in MOVES and p.name not in STAY)
    if unplaced:
        fail(f"flat test files without a folder in MOVES: {unplaced}")
    done = []
    for name, folder in MOVES.items():
        old, new = tests / name, tests / folder / name
        if old.exists() and new.exists():
            fail(f"both tests/{name} and tests/{folder}/{name} exist")
        if not old.exists() and not new.exists():
            fail(f"neither tests/{name} nor tests/{folder}/{name} exists: update MOVES")
        if old.exists():
            new.parent.mkdir(exist_ok=True)
            git(root, "mv", f"tests/{name}", f"tests/{folder}/{name}")
            done.append(f"git mv tests/{name} tests/{folder}/{name}")
    seen: dict[str, Path] = {}
    for path in sorted(tests.rglob("test_*.py")):
        if path.name in seen:
            fail(f"two test files named {path.name}: {seen[path.name].relative_to(root)} and {path.relative_to(root)} "
                 "(pytest's prepend import mode needs unique test file names)")
        seen[path.name] = path
    return done


def fix_root_paths(root: Path) -> list[str]:
    done = []
    for folder in sorted(set(MOVES.values())):
        for path in sorted((root / "tests" / folder).glob("*.py")):
            text = path.read_text(encoding="utf-8")
            fixed, n = ROOT_FROM_FILE.subn("Path(__file__).resolve().parents[2]", text)
            if n:
                path.write_text(fixed, encoding="utf-8")
                done.append(f"{path.relative_to(root)}: repository root is parents[2] ({n}×)")
    return done


def fix_mentions(root: Path) -> list[str]:
    mention = re.compile(r"(?<![\w/.-])tests/(" + "|".join(re.escape(n) for n in MOVES) + r")(?![\w])")
    done = []
    for name in git(root, "ls-files").splitlines():
        path = root / name
        if name in PLAN_FILES or not (name.endswith(TEXT_SUFFIXES) or name in TEXT_FILES) or not path.is_file() or path.is_symlink():
            continue
        text = path.read_text(encoding="utf-8")
        fixed, n = mention.subn(lambda m: f"tests/{MOVES[m.group(1)]}/{m.group(1)}", text)
        if n:
            path.write_text(fixed, encoding="utf-8")
            done.append(f"{name}: {n} mention(s) of moved test files")
    return done


def add_pythonpath(root: Path) -> list[str]:
    path = root / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    options = text.split("[tool.pytest.ini_options]", 1)
    if len(options) != 2:
        fail("pyproject.toml has no [tool.pytest.ini_options] table")
    table = options[1].split("\n[", 1)[0]
    if re.search(r"^pythonpath\s*=", table, re.M):
        if 'pythonpath = ["tests"]' not in table:
            fail("pyproject.toml sets another pytest pythonpath: add \"tests\" to it by hand")
        return []
    if not re.search(r"^testpaths = .*$", table, re.M):
        fail("pyproject.toml's pytest options have no testpaths line to put pythonpath after")
    new_table = re.sub(r"^(testpaths = .*)$", lambda m: f"{m.group(1)}\n{PYTHONPATH_LINE}", table, count=1, flags=re.M)
    path.write_text(options[0] + "[tool.pytest.ini_options]" + options[1].replace(table, new_table, 1), encoding="utf-8")
    return ["pyproject.toml: pytest pythonpath = [\"tests\"]"]


def main() -> int:
    root = Path(git(Path.cwd(), "rev-parse", "--show-toplevel").strip())
    done = [*move_fixtures(root), *move_tests(root), *fix_root_paths(root), *fix_mentions(root), *add_pythonpath(root)]
    print("\n".join(done) if done else "nothing to do: the layout is already applied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
