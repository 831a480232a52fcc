"""Resumable results files: JSON Lines with a metadata header, one tidy row per unit of work.

Line 1 is ``{"_meta": {...}}``: the analysis name, its full configuration (with the fingerprint of
weights, tokenizer, dataset and code) and the package versions. Every other line is a row carrying
a ``key``. A run appends rows as it goes (flushed per batch, so a killed process loses none; fsynced at
most every :data:`SYNC_SECONDS`, so a power loss costs at most those seconds' rows, which a rerun computes
again; an fsync per prompt took 12 ms each on a loaded 2-core machine, 5 s of a 76 s sweep) and never rewrites a
finished row: a rerun with the same configuration skips the keys already present, cuts off only a
torn last line, and refuses a file whose configuration, keys or lines do not check out.

One writer per file: a store holds an exclusive ``fcntl.flock`` on its file for the life of the
process (the kernel drops it when the process dies, so a lock is never stale).

Only our own files: a results path that is a symbolic link is refused (never written through, not
even with ``--overwrite``), and a file whose line 1 is not a results header is replaced only with
``--overwrite`` (:class:`ResultsNotOurs`). Every row is checked against the row schema on resume
and on reading (:func:`_parse_row`): a bad line is named with its number and never kept.

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
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probes.core.files import OutputRefused, make_folder, open_locked, remove_file, truncate, write_handle

SYNC_SECONDS = 2.0
_VERSIONED = ("basm-probes", "torch", "transformers", "tokenizers", "numpy", "pandas", "scikit-learn", "scipy")
NONFINITE = "_nonfinite"


class ResultsConfigMismatch(ValueError):
    """An existing results file was written with a different configuration."""


class ResultsLocked(RuntimeError):
    """Another process is writing the same results file."""


class ResultsCorrupt(ValueError):
    """A results file has a damaged line or a repeated key; the message names the line."""


class ResultsNotOurs(ResultsCorrupt, OutputRefused):
    """A results path holds a file that is not a results file of ours (no results header): replaced
    only with ``--overwrite``. (A link or a folder there is refused by the writer itself,
    :class:`~probes.core.files.OutputRefused`, never written through, not even with ``--overwrite``.)"""


def environment() -> dict[str, Any]:
    versions = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": platform.python_version(), "platform": platform.platform(), "versions": versions}


def canonical(value: Any) -> Any:
    """``value`` as a results header stores it (JSON round trip, keys sorted): compare headers in this form."""
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


_NONFINITE_VALUES = ("nan", "inf", "-inf")


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`encode_row`: the recorded non-finite floats are restored.

    Raises ``ValueError`` for a ``_nonfinite`` field that :func:`encode_row` cannot have written (not
    an object, a value other than nan / inf / -inf, a path that does not lead to a ``null``)."""
    nonfinite = row.pop(NONFINITE, {})
    if not isinstance(nonfinite, dict):
        raise ValueError(f"{NONFINITE} must be an object {{path: nan|inf|-inf}}, got {type(nonfinite).__name__}")
    for path, value in nonfinite.items():
        if value not in _NONFINITE_VALUES:
            raise ValueError(f"{NONFINITE}[{path!r}] must be one of {', '.join(_NONFINITE_VALUES)}, got {value!r:.40}")
        *parents, last = path.split("/")
        target: Any = row
        try:
            for part in parents:
                target = target[int(part) if isinstance(target, list) else part]
            index = int(last) if isinstance(target, list) else last
            if not isinstance(target, dict | list) or target[index] is not None:
                raise ValueError
        except (KeyError, IndexError, TypeError, ValueError):
            raise ValueError(f"{NONFINITE} path {path!r:.60} does not lead to a null value of the row") from None
        target[index] = float(value)
    return row


def _strict_constant(token: str) -> Any:
    raise ValueError(f"{token} is not strict JSON (a non-finite value is written as null and named in {NONFINITE})")


def _parse_row(line: bytes) -> dict[str, Any]:
    """One results row, checked against the row schema (``ValueError`` says what is wrong): a strict-JSON
    object with a non-empty string ``key``, at least one other field, and a valid ``_nonfinite``."""
    row = json.loads(line, parse_constant=_strict_constant)
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    key = row.get("key")
    if not isinstance(key, str) or not key:
        raise ValueError(f"'key' must be a non-empty string, got {key!r:.40}")
    if not set(row) - {"key", NONFINITE}:
        raise ValueError("the row holds a key and nothing else")
    for fields, recipe in _KEY_RECIPES:  # a key made of the row's own fields must match them
        if all(field in row for field in fields) and key != recipe(row):
            raise ValueError(f"key {key!r:.60} does not match its fields {', '.join(fields)} (expected {recipe(row)!r:.60})")
    return decode_row(row)


# How the analyses form keys from a row's fields (probes.analyses.jobs.run_jobs; calls' paired rows).
_KEY_RECIPES: tuple[tuple[tuple[str, ...], Callable[[dict[str, Any]], str]], ...] = (
    (("record_id", "condition"), lambda row: f"{row['record_id']}|{row['condition']}"),
    (("item_id", "k", "format", "identical_prompt"), lambda row: f"{row['item_id']}|k{row['k']}|{row['format']}"),
)


def _recipe(row: dict[str, Any]) -> int | None:
    """Which key recipe a row follows (None: none)."""
    return next((i for i, (fields, _) in enumerate(_KEY_RECIPES) if all(field in row for field in fields)), None)


def _scan(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """(header, rows, byte length of the complete lines) of a results file.

    A last line without its newline is torn (a kill or a full disk mid-write) and left out. A
    complete line that is not a row of the schema (:func:`_parse_row`), a row of another kind than
    the file's others, or a key written twice, is damage that resuming or reading must not paper
    over: :class:`ResultsCorrupt` names the line.
    """
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1]
    try:
        meta = json.loads(lines[0], parse_constant=_strict_constant)["_meta"]
        if not isinstance(meta, dict) or not isinstance(meta.get("analysis"), str) or not isinstance(meta.get("config"), dict):
            raise ValueError
    except (IndexError, ValueError, KeyError, TypeError):
        raise ResultsNotOurs(f"{path}: line 1 is not a results header; it is not a basm-probes results file "
                             "(use a new --out, or --overwrite to replace it)") from None
    rows, seen, numbers = [], {}, []
    for number, line in enumerate(lines[1:], start=2):
        try:
            row = _parse_row(line)
        except (ValueError, KeyError, TypeError) as error:
            raise ResultsCorrupt(f"{path}:{number}: not a results row (damaged or edited: {error}); delete that line and rerun "
                                 "to recompute it, or rerun with --overwrite") from None
        except RecursionError:
            raise ResultsCorrupt(f"{path}:{number}: not a results row (nested too deeply); delete that line and rerun "
                                 "to recompute it, or rerun with --overwrite") from None
        key = row["key"]
        if key in seen:
            raise ResultsCorrupt(f"{path}:{number}: key {key!r} was already written on line {seen[key]} (two runs wrote "
                                 "this file at once?); rerun with --overwrite or use a new --out")
        seen[key] = number
        rows.append(row)
        numbers.append(number)
    recipes = [_recipe(row) for row in rows]  # one file, one kind of row: a row keyed otherwise is foreign
    if len(set(recipes)) > 1:
        common = max(set(recipes), key=recipes.count)
        number = next(n for n, r in zip(numbers, recipes) if r != common)
        want = ", ".join(_KEY_RECIPES[common][0]) if common is not None else "none of record_id/condition"
        raise ResultsCorrupt(f"{path}:{number}: not a results row of this file (the other rows carry {want}); delete that "
                             "line and rerun to recompute it, or rerun with --overwrite")
    return meta, rows, end


def _changes(old: Any, new: Any, where: str = "") -> list[str]:
    """Dotted paths where two configurations differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in sorted(set(old) | set(new)) for c in _changes(old.get(k), new.get(k), f"{where}.{k}" if where else k)]
    return [] if old == new else [f"{where} ({json.dumps(old, default=str)[:40]} → {json.dumps(new, default=str)[:40]})"]


def _thread_fix(recorded: Any, current: Mapping[str, Any]) -> str:
    """The sentence a refusal adds when the rows were computed on another torch thread count (a header's
    ``config.threads``, :mod:`probes.engine.threads`): the count that resumes them; "" otherwise."""
    before, now = recorded.get("threads") if isinstance(recorded, dict) else None, current.get("threads")
    if before == now or before is None:
        return ""
    return (f"They were computed on {before} torch thread{'s' * (before != 1)} and this run uses {now}: torch sums in another "
            f"order on another thread count, so the values would differ in the last digits and the file would mix them. "
            f"Rerun with --threads {before} (threads={before}) to resume them on their count. ")


# Locks this process holds, by file identity: a process is one writer, and may reopen its own file.
_LOCKS: dict[tuple[int, int], int] = {}


def _lock(path: Path) -> None:
    fd = open_locked(path)  # never through a link, not even one swapped in after the check
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
        remove_file(path)
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


_HEADER_START = b'{"_meta": '


def _torn_header(first: bytes) -> bool:
    """``first`` (line 1 without its newline) is empty, or the start of a header that a killed run
    did not finish: a file this package created, safe to restart."""
    return first.startswith(_HEADER_START) or _HEADER_START.startswith(first)


def _unfinished(shard: Path) -> bool:
    """A shard file that a rank killed before its header was complete (0 bytes, or a torn line 1)."""
    with shard.open("rb") as handle:
        first = handle.readline()
    return not first.endswith(b"\n") and _torn_header(first)


class ResultsStore:
    """Append-only JSONL results for one analysis run.

    ``config`` must capture everything that determines the rows (model, dataset, items, k, seeds,
    variants...); resuming with a different ``config`` raises instead of mixing results.
    """

    def __init__(self, path: str | Path, analysis: str, config: Mapping[str, Any], *, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.meta = {"analysis": analysis, "config": canonical(dict(config)), **environment()}
        self._keys: set[str] = set()
        self._synced = time.monotonic()
        make_folder(self.path.parent)
        _lock(self.path)  # before reading: no other writer can append between our read and our writes
        with self.path.open("rb") as handle:
            first = handle.readline()
        if first.endswith(b"\n") and not overwrite:
            self._resume()  # checks that line 1 is our header, and every row
        elif first.endswith(b"\n") or overwrite or _torn_header(first):
            self._start()
        else:  # a file of some other program at our path: never replaced without --overwrite
            raise ResultsNotOurs(f"{self.path} is not a basm-probes results file (line 1 is not a results header); it is left "
                                 "as it is: move it away, use a new --out, or --overwrite to replace it")
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
        with write_handle(self.path, append=False) as handle:  # truncates in place: the locked file stays the same file
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
                f"{' ...' if len(changed) > 4 else ''}. {_thread_fix(header.get('config'), self.meta['config'])}"
                "Rerun with --overwrite to discard them, or use a new --out"
            )
        if end < self.path.stat().st_size:
            truncate(self.path, end)  # drop only the torn last line; finished rows are never rewritten
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
            if _unfinished(shard):  # a rank killed before it wrote its header holds no rows: nothing to merge
                continue
            header, rows, _ = _scan(shard)
            changed = _changes({"analysis": header.get("analysis"), "config": header.get("config")},
                               {"analysis": self.meta["analysis"], "config": self.meta["config"]})
            if changed:
                raise ResultsConfigMismatch(
                    f"{shard} (a shard of {self.path.name}) holds {len(rows)} rows computed with a different setup; changed: "
                    f"{'; '.join(changed[:4])}{' ...' if len(changed) > 4 else ''}. {_thread_fix(header.get('config'), self.meta['config'])}"
                    "Delete it, or rerun with --overwrite")
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
        with write_handle(self.path, append=True) as handle:
            handle.write(text)
            handle.flush()
            if time.monotonic() - self._synced >= SYNC_SECONDS:
                os.fsync(handle.fileno())
                self._synced = time.monotonic()
        self._keys.update(keys)


def read_meta(path: str | Path) -> dict[str, Any]:
    with Path(path).open() as handle:
        return json.loads(handle.readline())["_meta"]


class Header(dict):
    """A results file's header as ``frame.attrs["meta"]``, shared by every frame derived from it
    (read it, don't change it): pandas deep-copies ``attrs`` on every operation, which copied the
    header two million times in ``report --quick`` (70 s) before it was shared."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Header:
        return self


def load_results(path: str | Path) -> pd.DataFrame:
    """The rows of a results file as a DataFrame; ``df.attrs["meta"]`` holds the header.

    Non-finite values come back as NaN; a torn last line (a run in progress or killed) is left out.
    """
    meta, rows, _ = _scan(Path(path))
    frame = pd.DataFrame(rows)
    frame.attrs["meta"] = Header(meta)
    return frame
