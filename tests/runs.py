"""Helpers shared by the tests that run ``basm-probes`` on a private copy of the tiny model (conftest's ``model``
and ``dataset``): a fast sweep's argv, its results file, a failing run's message, the error catalogue of
docs/error_catalogue.py, a stop where the session would open, and a page opened in the Playwright browser."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from probes.cli.main import main
from probes.data.dataset import V1_DATASET_DIR
from probes.reporting.layout import rows_path


FAST = ["--embedder", "lexical", "--relevance", "lexical", "--split", "all", "--limit", "1", "--k-max", "1", "--bucket", "T_wrong", "--configs", "base,basm", "--no-figure"]


def fails(argv: list[str], capsys: pytest.CaptureFixture, code: int = 1) -> str:
    """Run the CLI, expect exit ``code`` and a short message without a traceback; return stderr."""
    capsys.readouterr()
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: " in err
    return err


def sweep(model: Path, out: Path, *extra: str, dataset: Path = V1_DATASET_DIR) -> list[str]:
    return ["sweep", "--model", str(model), "--dataset", str(dataset), "--out", str(out), *FAST, *extra]


def rows_file(out: Path) -> Path:
    """The sweep's results file: rows live under OUT/<model label>/sweep/, and the ``model`` fixture's folder is named ``model``."""
    return rows_path(out / "model", "sweep")


ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str, path: Path):
    """A script outside the package (docs/*.py, benchmarks/*.py) imported as module ``name``; registered in
    ``sys.modules`` first because its dataclasses resolve their module by name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


CATALOGUE = load_script("error_catalogue", ROOT / "docs" / "error_catalogue.py")


class StopAtSession(Exception):
    pass


def stop_at_session(monkeypatch: pytest.MonkeyPatch) -> dict:
    import probes.analyses.run_context

    seen = {}

    def stop(args, model):
        seen.update(k_max=args.k_max, seed=args.seed)
        raise StopAtSession

    monkeypatch.setattr(probes.analyses.run_context, "open_session", stop)
    return seen


def edit_in_place_keep_mtime(path: Path) -> None:
    before = path.stat()
    CATALOGUE.edit_tensor_keep_mtime(path)
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


def open_page(browser, path: Path, *, timeout_ms: int | None = None) -> tuple[Any, Any, list[str]]:
    """(context, page, errors): ``path`` opened offline in a fresh 1400×900 context of the Playwright ``browser``;
    ``errors`` collects every console error and uncaught page error."""
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    if timeout_ms is not None:
        page.set_default_timeout(timeout_ms)
    page.goto(Path(path).resolve().as_uri())
    return context, page, errors
