"""Resumable results files: JSON Lines with a metadata header, one tidy row per unit of work.

Line 1 is ``{"_meta": {...}}``: the analysis name, its full configuration (with the fingerprint of
weights, tokenizer, dataset and code) and the package versions. Every other line is a row carrying
a ``key``. A run appends rows as it goes (flushed and fsynced per batch) and never rewrites a
finished row: a rerun with the same configuration skips the keys already present, cuts off only a
torn last line, and refuses a file whose configuration, keys or lines do not check out.

One writer per file: a store holds an exclusive ``fcntl.flock`` on its file for the life of the
process (the kernel drops it when the process dies, so a lock is never stale).

The files are strict JSON: a non-finite float is written as ``null`` and named, with its value
(``"nan"``, ``"inf"``, ``"-inf"``), in the row's ``_nonfinite`` field; :func:`load_results` puts
it back, so analyses see the same NaN as before.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import platform
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

_VERSIONED = ("basm-probes", "torch", "transformers", "tokenizers", "numpy", "pandas", "scikit-learn", "scipy")
NONFINITE = "_nonfinite"


class ResultsConfigMismatch(ValueError):
    """An existing results file was written with a different configuration."""


class ResultsLocked(RuntimeError):
    """Another process is writing the same results file."""


class ResultsCorrupt(ValueError):
    """A results file has a damaged line or a repeated key; the message names the line."""


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


def _encode(value: Any, path: str, nonfinite: dict[str, str]) -> Any:
    """``value`` as strict JSON data; non-finite floats become None and are recorded by path."""
    if isinstance(value, Mapping):
        return {k: _encode(v, f"{path}/{k}" if path else str(k), nonfinite) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_encode(v, f"{path}/{i}", nonfinite) for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        value = value.item()
    elif not isinstance(value, str | int | float | bool | None):
        value = float(value)  # torch scalars and the like, as numbers
    if isinstance(value, float) and not math.isfinite(value):
        nonfinite[path] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return None
    return value


def encode_row(row: Mapping[str, Any]) -> str:
    """One strict-JSON line (no NaN / Infinity tokens)."""
    nonfinite: dict[str, str] = {}
    data = _encode(row, "", nonfinite)
    if nonfinite:
        data[NONFINITE] = nonfinite
    return json.dumps(data, allow_nan=False)


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`encode_row`: the recorded non-finite floats are restored."""
    for path, value in row.pop(NONFINITE, {}).items():
        *parents, last = path.split("/")
        target: Any = row
        for part in parents:
            target = target[int(part) if isinstance(target, list) else part]
        target[int(last) if isinstance(target, list) else last] = float(value)
    return row


def _scan(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """(header, rows, byte length of the complete lines) of a results file.

    A last line without its newline is torn (a kill or a full disk mid-write) and left out. A
    complete line that is not a row, or a key written twice, is damage that resuming or reading
    must not paper over: :class:`ResultsCorrupt` names the line.
    """
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1]
    try:
        meta = json.loads(lines[0])["_meta"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise ResultsCorrupt(f"{path}: line 1 is not a results header; it is not a basm-probes results file "
                             "(use a new --out, or --overwrite to replace it)") from None
    rows, seen = [], {}
    for number, line in enumerate(lines[1:], start=2):
        try:
            row = json.loads(line)
            key = row["key"]
        except (ValueError, KeyError, TypeError):
            raise ResultsCorrupt(f"{path}:{number}: not a results row (damaged or edited); delete that line and rerun "
                                 "to recompute it, or rerun with --overwrite") from None
        if key in seen:
            raise ResultsCorrupt(f"{path}:{number}: key {key!r} was already written on line {seen[key]} (two runs wrote "
                                 "this file at once?); rerun with --overwrite or use a new --out")
        seen[key] = number
        rows.append(decode_row(row))
    return meta, rows, end


def _changes(old: Any, new: Any, where: str = "") -> list[str]:
    """Dotted paths where two configurations differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in sorted(set(old) | set(new)) for c in _changes(old.get(k), new.get(k), f"{where}.{k}" if where else k)]
    return [] if old == new else [f"{where} ({json.dumps(old, default=str)[:40]} → {json.dumps(new, default=str)[:40]})"]


# Locks this process holds, by file identity: a process is one writer, and may reopen its own file.
_LOCKS: dict[tuple[int, int], int] = {}


def _lock(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # read-only: a finished read-only file can still be opened
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in _LOCKS:
        os.close(fd)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ResultsLocked(f"{path} is being written by another basm-probes run; wait for it to finish, "
                            "or use a different --out") from None
    _LOCKS[(st.st_dev, st.st_ino)] = fd  # kept open until exit: the kernel releases the lock then


class ResultsStore:
    """Append-only JSONL results for one analysis run.

    ``config`` must capture everything that determines the rows (model, dataset, items, k, seeds,
    variants...); resuming with a different ``config`` raises instead of mixing results.
    """

    def __init__(self, path: str | Path, analysis: str, config: Mapping[str, Any], *, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.meta = {"analysis": analysis, "config": _canonical(dict(config)), **environment()}
        self._keys: set[str] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _lock(self.path)  # before reading: no other writer can append between our read and our writes
        with self.path.open("rb") as handle:
            has_header = handle.readline().endswith(b"\n")  # else new, or killed while writing line 1
        if has_header and not overwrite:
            self._resume()
        else:
            self._start()

    def _start(self) -> None:
        with self.path.open("w") as handle:  # truncates in place: the locked file stays the same file
            handle.write(encode_row({"_meta": self.meta}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _resume(self) -> None:
        header, rows, end = _scan(self.path)
        expected = {"analysis": self.meta["analysis"], "config": self.meta["config"]}
        changed = _changes({"analysis": header.get("analysis"), "config": header.get("config")}, expected)
        if changed and not rows:  # a header without rows holds no results: nothing to protect
            self._start()
            return
        if changed:
            raise ResultsConfigMismatch(
                f"{self.path} holds {len(rows)} rows computed with a different setup; changed: {'; '.join(changed[:4])}"
                f"{' ...' if len(changed) > 4 else ''}. Rerun with --overwrite to discard them, or use a new --out"
            )
        if end < self.path.stat().st_size:
            os.truncate(self.path, end)  # drop only the torn last line; finished rows are never rewritten
        self._keys.update(row["key"] for row in rows)

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
        if not rows:
            return
        text = "".join(encode_row(row) + "\n" for row in rows)
        with self.path.open("a") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        self._keys.update(keys)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to ``path`` (same suffix) that replaces ``path`` only when the block
    succeeds: a killed or failing writer leaves the old file whole, never a shorter one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        with tmp.open("rb+") as handle:
            os.fsync(handle.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    """A summary table, written atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def read_meta(path: str | Path) -> dict[str, Any]:
    with Path(path).open() as handle:
        return json.loads(handle.readline())["_meta"]


def load_results(path: str | Path) -> pd.DataFrame:
    """The rows of a results file as a DataFrame; ``df.attrs["meta"]`` holds the header.

    Non-finite values come back as NaN; a torn last line (a run in progress or killed) is left out.
    """
    meta, rows, _ = _scan(Path(path))
    frame = pd.DataFrame(rows)
    frame.attrs["meta"] = meta
    return frame
