"""Resumable results files: JSON Lines with a metadata header, one tidy row per unit of work.

Line 1 is ``{"_meta": {...}}``: the analysis name, its full configuration and the package
versions. Every other line is a row carrying a ``key``. A run appends rows as it goes (flushed
per batch), so an interrupted run loses at most the batch in flight; a rerun with the same
configuration skips the keys already present and never writes a key twice.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

_VERSIONED = ("basm-probes", "torch", "transformers", "tokenizers", "numpy", "pandas", "scikit-learn", "scipy")


class ResultsConfigMismatch(ValueError):
    """An existing results file was written with a different configuration."""


def environment() -> dict[str, Any]:
    versions = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": platform.python_version(), "platform": platform.platform(), "versions": versions}


def _canonical(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


class ResultsStore:
    """Append-only JSONL results for one analysis run.

    ``config`` must capture everything that determines the rows (model, dataset, items, k, seeds,
    variants...); resuming with a different ``config`` raises instead of mixing results.
    """

    def __init__(self, path: str | Path, analysis: str, config: Mapping[str, Any], *, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.meta = {"analysis": analysis, "config": _canonical(dict(config)), **environment()}
        self._keys: set[str] = set()
        if self.path.exists() and overwrite:
            self.path.unlink()
        if self.path.exists() and self.path.stat().st_size > 0:
            self._resume()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("w") as handle:
                handle.write(json.dumps({"_meta": self.meta}) + "\n")

    def _resume(self) -> None:
        with self.path.open() as handle:
            lines = handle.read().split("\n")
        header = json.loads(lines[0])["_meta"]
        if header["analysis"] != self.meta["analysis"] or header["config"] != self.meta["config"]:
            raise ResultsConfigMismatch(
                f"{self.path} holds results of {header['analysis']!r} with a different configuration; "
                "use a new --out path or --overwrite"
            )
        complete = []
        for line in lines[1:]:
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a row cut off by the interruption: drop it
                break
            complete.append(line)
            self._keys.add(row["key"])
        # rewrite without a torn last line, so appends start on a clean line
        with self.path.open("w") as handle:
            handle.write("\n".join([lines[0], *complete]) + "\n")

    @property
    def done(self) -> frozenset[str]:
        return frozenset(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Write rows (each with a unique ``key``); keys already present are an error."""
        rows = list(rows)
        keys = [row["key"] for row in rows]
        repeated = [key for key in keys if key in self._keys] + [key for i, key in enumerate(keys) if key in keys[:i]]
        if repeated:
            raise ValueError(f"duplicate result keys {repeated[:3]} for {self.path}")
        with self.path.open("a") as handle:
            for row in rows:
                handle.write(json.dumps(row, default=float) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self._keys.update(keys)


def read_meta(path: str | Path) -> dict[str, Any]:
    with Path(path).open() as handle:
        return json.loads(handle.readline())["_meta"]


def load_results(path: str | Path) -> pd.DataFrame:
    """The rows of a results file as a DataFrame; ``df.attrs["meta"]`` holds the header."""
    path = Path(path)
    rows = []
    with path.open() as handle:
        meta = json.loads(handle.readline())["_meta"]
        for line in handle:
            if line.strip():
                rows.append(json.loads(line))
    frame = pd.DataFrame(rows)
    frame.attrs["meta"] = meta
    return frame
