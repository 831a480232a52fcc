"""Writing a generated dataset folder without destroying what is there.

A generator (``bfcl-import``) writes into a temporary sibling folder, which replaces ``out`` only
once every file is written: a failure leaves ``out`` as it was. ``out`` may be absent, empty, or a
folder that the same generator wrote before (recognised by ``is_previous``); any other non-empty
folder is refused unless ``overwrite``. Replacing a previous output keeps the files the generator
does not write (a ``CARD.md`` written later by ``basm-probes card``, notes); ``overwrite`` of a
foreign folder discards all of it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from probes.data.dataset import DatasetError


class OutputRefused(DatasetError):
    """``--out`` holds something a generator must not replace without ``--overwrite``."""


def check_output(out: Path, *, is_previous: Callable[[Path], bool], overwrite: bool, what: str, flag: str = "--overwrite") -> None:
    """Refuse ``out`` unless it is absent, an empty folder, a previous output of this generator, or
    ``overwrite`` (a file or a link to a file is refused either way)."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise OutputRefused(f"{out} exists and is not a folder; the {what} is written as a folder: use another --out")
    if overwrite or not any(out.iterdir()) or is_previous(out):
        return
    raise OutputRefused(f"{out} is not empty and is not a previous {what}; nothing was written. Use a new or empty --out, "
                        f"or pass {flag} to replace the whole folder")


@contextmanager
def staged_folder(out: Path, *, is_previous: Callable[[Path], bool], overwrite: bool, what: str,
                  generated: tuple[str, ...] = ()) -> Iterator[Path]:
    """A temporary folder next to ``out`` (same file system) for the block to fill; on success it
    replaces ``out`` (checked with :func:`check_output`); on failure it is deleted and ``out`` is untouched.
    Of a previous output, the entries that the generator does not write (not in ``generated``) are kept."""
    out = Path(out)
    if out.is_symlink():  # a link to a folder: the folder it names is replaced, never the link by a folder
        out = out.resolve()
    check_output(out, is_previous=is_previous, overwrite=overwrite, what=what)
    keep = out.is_dir() and any(out.iterdir()) and is_previous(out)  # carry the files we do not write over
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.with_name(f".{out.name}.new-{os.getpid()}")
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if out.exists():
        os.replace(out, old)  # the old folder stays whole under a sibling name until the new one is in place
    os.replace(stage, out)
    if old.exists():
        if keep:
            for entry in old.iterdir():
                if entry.name not in generated and not (out / entry.name).exists():
                    os.replace(entry, out / entry.name)
        shutil.rmtree(old)
