"""A finished analysis read back from its results folder: ``probes.load("results/Qwen3-8B", "sweep")``.

An analysis run writes, under ``OUT/<model>/<name>/`` (:mod:`probes.reporting.layout`), its rows
(``<name>.jsonl``, the run configuration in the header) and its summary tables (``<name>_<table>.csv``);
this reads them without the model, torch or the analysis's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probes.reporting.layout import analyses_in, check_layout, rows_path
from probes.reporting.results import load_results


@dataclass
class FinishedRun:
    """One finished analysis: its rows, its summary tables by file stem (the main table first) and
    the configuration it ran with (the results header: options, model, fingerprints); ``out_dir``:
    the folder its rows and tables are in (``OUT/<model>/<name>``)."""

    name: str
    rows: pd.DataFrame
    tables: dict[str, pd.DataFrame]
    config: dict[str, Any]
    out_dir: Path

    @property
    def summary_table(self) -> pd.DataFrame:
        """The main summary table (``<name>_summary``, else the first)."""
        if not self.tables:
            raise LookupError(f"{self.name}: no summary tables ({self.name}_*.csv) in {self.out_dir}")
        return self.tables.get(f"{self.name}_summary", next(iter(self.tables.values())))


def read_table(path: Path) -> pd.DataFrame:
    """A summary table; an empty one (a check that did not run writes no columns) as an empty frame."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def load(path: str | Path, name: str | None = None) -> FinishedRun:
    """Read a finished analysis back: ``path`` is the results folder ``OUT/<model>`` with the
    analysis's ``name``, its folder (``OUT/<model>/sweep``), or its rows file (``OUT/<model>/sweep/sweep.jsonl``)."""
    path = Path(path)
    if path.is_dir() and name in (None, path.name) and rows_path(path.parent, path.name).is_file():
        path = rows_path(path.parent, path.name)
    elif path.is_dir():
        found = analyses_in(check_layout(path))
        if name is None or name not in found:
            what = "which analysis to read: pass name=" if name is None else f"no {name} results there; known:"
            raise FileNotFoundError(f"{path}: {what} {', '.join(found) or '(no results files)'}")
        path = rows_path(path, name)
    elif not path.is_file():
        raise FileNotFoundError(f"{path}: no such results file (OUT/<model>/<analysis>/<analysis>.jsonl)")
    name = name or path.stem
    rows = load_results(path)
    stems = sorted(p.stem for p in path.parent.glob(f"{name}_*.csv"))
    main = f"{name}_summary"
    tables = {stem: read_table(path.parent / f"{stem}.csv") for stem in sorted(stems, key=lambda s: s != main)}
    return FinishedRun(name, rows, tables, rows.attrs["meta"].get("config", {}), path.parent)
