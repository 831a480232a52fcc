"""Atomic file writers: a text or a table replaces its file only once it is whole.

A writer fills a temporary file next to the target (``.<stem>.<pid>.tmp<suffix>``), fsyncs it and
renames it over the target, so a killed or failing writer (a full disk) leaves the old file whole,
never a shorter one; the temporary files of dead writers are deleted on the next write. Imports
nothing of the package: every layer writes its outputs through here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean_stale_temporaries(path: str | Path) -> list[Path]:
    """Delete the temporary files of :func:`atomic_path` for ``path`` whose writer is dead (a killed
    build or card leaves ``.<stem>.<pid>.tmp<suffix>``); returns them."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.stem)}\.(\d+)\.tmp{re.escape(path.suffix)}")
    stale = [p for p in path.parent.glob(f".{path.stem}.*.tmp{path.suffix}")
             if (m := pattern.fullmatch(p.name)) and int(m[1]) != os.getpid() and not _alive(int(m[1])) and not p.is_symlink()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to ``path`` (same suffix) that replaces ``path`` only when the block
    succeeds: a killed or failing writer leaves the old file whole, never a shorter one. The
    temporary files of killed writers are deleted first; a link at ``path`` is replaced by the new
    file, never written through; an error (a full disk) names ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        with tmp.open("rb+") as handle:
            os.fsync(handle.fileno())
        tmp.replace(path)
    except OSError as error:
        if error.filename is None:  # e.g. EFBIG / ENOSPC from a write: say which file
            raise OSError(error.errno, error.strerror or str(error), str(path)) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """A text output (a report, a card, a JSON summary), written atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    """A summary table, written atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
