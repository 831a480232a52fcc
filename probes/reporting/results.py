"""Resumable results files: JSON Lines with a metadata header, one tidy row per unit of work.

Line 1 is ``{"_meta": {...}}``: the analysis name, its full configuration (with the fingerprint of
weights, tokenizer, dataset and code) and the package versions. Every other line is a row carrying
a ``key``. A run appends rows as it goes (flushed and fsynced per batch) and never rewrites a
finished row: a rerun with the same configuration skips the keys already present, cuts off only a
torn last line, and refuses a file whose configuration, keys or lines do not check out.

One writer per file: a store holds an exclusive ``fcntl.flock`` on its file for the life of the
process (the kernel drops it when the process dies, so a lock is never stale).

Shard files: the ranks of a parallel run (``probes.analyses.parallel``) each write
``<stem>.rank<R>-of-<W>.jsonl`` next to the results file, with the same header; rank 0 merges them
into the results file (:meth:`ResultsStore.merge`) and deletes them. Opening a results file merges
shard files left by a killed run first (any world size: their rows carry the same keys and
configuration), so their rows are neither lost nor computed again.

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
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


def _release(path: Path, *, delete: bool = False) -> None:
    """Drop this process's lock on ``path`` (none held: nothing to drop); ``delete``: unlink it first,
    so no other process can lock the name in between."""
    st = os.stat(path)
    if delete:
        path.unlink()
    fd = _LOCKS.pop((st.st_dev, st.st_ino), None)
    if fd is not None:
        os.close(fd)


def shard_path(path: str | Path, rank: int, world_size: int) -> Path:
    """The shard file of rank ``rank`` of ``world_size`` for the results file ``path``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{rank}-of-{world_size}{path.suffix}")


def shard_paths(path: str | Path) -> list[Path]:
    """The shard files next to the results file ``path``, by world size and rank."""
    path = Path(path)
    pattern = re.compile(rf"{re.escape(path.stem)}\.rank(\d+)-of-(\d+){re.escape(path.suffix)}")
    found = [(int(m[2]), int(m[1]), p) for p in path.parent.glob(f"{path.stem}.rank*-of-*{path.suffix}")
             if (m := pattern.fullmatch(p.name))]
    return [p for _, _, p in sorted(found)]


def read_keys(path: str | Path) -> frozenset[str]:
    """The keys of a results file (read only, no lock: for readers that never write it)."""
    return frozenset(row["key"] for row in _scan(Path(path))[1])


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
        if leftovers := shard_paths(self.path):  # a killed parallel run: its rows are kept (or discarded with overwrite)
            if overwrite:
                for shard in leftovers:
                    _lock(shard)  # a rank still writing it: ResultsLocked rather than a file pulled from under it
                    _release(shard, delete=True)
            else:
                added = self.merge(leftovers)
                print(f"{self.path.name}: merged {added} rows from the shard files of an unfinished parallel run "
                      f"({', '.join(p.name for p in leftovers)})", file=sys.stderr)

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

    def close(self) -> None:
        """Release this process's lock on the file (a rank hands its shard file to rank 0)."""
        _release(self.path)

    def merge(self, shards: Sequence[Path], order: Sequence[str] = ()) -> int:
        """Append the rows of ``shards`` (shard files of this results file) that are not here yet,
        then delete the shards; returns the number of rows added.

        Keys in ``order`` come first, in that order (a parallel run's job order), then the others in
        file order. A shard must have this file's analysis and configuration, and no live writer; a
        key found twice (here and in a shard, or in two shards) must carry identical values.
        """
        mine = {row["key"]: encode_row(row) for row in _scan(self.path)[1]}
        found: dict[str, tuple[str, Path, dict[str, Any]]] = {}
        for shard in shards:
            if not shard.is_file():
                raise FileNotFoundError(f"{shard}: shard file missing; every rank must write to the same folder "
                                        "(in a multi-node run, --out on a file system that all nodes share)")
            _lock(shard)
            header, rows, _ = _scan(shard)
            changed = _changes({"analysis": header.get("analysis"), "config": header.get("config")},
                               {"analysis": self.meta["analysis"], "config": self.meta["config"]})
            if changed:
                raise ResultsConfigMismatch(
                    f"{shard} (a shard of {self.path.name}) holds {len(rows)} rows computed with a different setup; changed: "
                    f"{'; '.join(changed[:4])}{' ...' if len(changed) > 4 else ''}. Delete it, or rerun with --overwrite")
            for row in rows:
                line = encode_row(row)
                seen = mine.get(row["key"]) or (found[row["key"]][0] if row["key"] in found else None)
                if seen is not None and seen != line:
                    raise ResultsCorrupt(f"{shard}: key {row['key']!r} has values different from those already "
                                         f"in {self.path.name} or another shard; delete the shard files or rerun with --overwrite")
                if seen is None:
                    found[row["key"]] = (line, shard, row)
        ordered = [key for key in dict.fromkeys(order) if key in found]
        first = set(ordered)
        self.append(found[key][2] for key in [*ordered, *(key for key in found if key not in first)])
        for shard in shards:  # after the rows are safely here: a kill in between merges them again, as equal
            _release(shard, delete=True)
        return len(found)

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
