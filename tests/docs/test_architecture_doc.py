"""docs/architecture.md's generated part (the layers and every module's concept) is what
``python docs/architecture.py`` writes from ``probes.LAYERS`` and the modules' docstrings today."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def generator():
    spec = importlib.util.spec_from_file_location("architecture_doc", ROOT / "docs" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_tables_are_current() -> None:
    doc = generator()
    text = doc.DOC.read_text()
    assert doc.current(text) == text, "docs/architecture.md is out of date: run python docs/architecture.py"
    # every module of the package has its row, under its layer
    for module in doc.modules():
        if doc.concept(doc.modules()[module]):
            assert f"| `{module}` |" in text, module


def test_a_stale_table_is_caught() -> None:
    doc = generator()
    text = doc.DOC.read_text()
    stale = text.replace("| `probes.engine.hooks` |", "| `probes.engine.old_hooks` |", 1)
    assert stale != text and doc.current(stale) != stale
