"""The one writer: every file the package writes goes through here (``tests/core/test_one_writer.py``
walks the source and fails on any other write).

:class:`OutputRoot` is a run's output folder (``--out``, ``--library-out``, a cache folder). A write
through it is refused (:class:`OutputRefused`) unless its target is inside the root (resolved: no
``..``, no symbolic link inside the root leading out; the root itself may be a link, the user named
it), and it never goes through a link (``O_NOFOLLOW``, and a link at the target is refused, not even
replaced with ``overwrite``). A single file is filled as a temporary next to it
(``.<stem>.<pid>.tmp<suffix>``), fsynced and renamed over it, so a killed or failing writer (a full
disk) leaves the old file whole; the temporaries of dead writers are deleted on the next write. An
existing regular file at an output name is a previous output of the same name and is replaced; a
folder where a file goes is refused. A folder output (a dataset, a curated library, a converted
model) is staged (:meth:`OutputRoot.folder`) and replaces an existing folder only when that folder
is a previous output of the same kind or ``overwrite`` is given.

Results files are appended in place under a lock (:mod:`probes.reporting.results`): they open and
append through :func:`open_locked` and :func:`write_handle` here. Imports nothing of the package:
every layer writes through here.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


class OutputRefused(ValueError):
    """A write that would leave its output root, go through a symbolic link, or replace something
    that is not ours without ``--overwrite``; the message names the path and the fix."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_target(path: str | Path) -> None:
    """Refuse a file target that is a symbolic link or not a regular file: a run never writes
    through a link (its target may lie outside ``--out``), not even with ``--overwrite``."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise OutputRefused(f"{path} is a symbolic link (to {os.readlink(path)}); basm-probes never writes through a link, "
                            "not even with --overwrite: remove the link, or use another --out")
    if not stat.S_ISREG(st.st_mode):
        raise OutputRefused(f"{path} exists and is not a regular file; remove it, or use another --out")


def check_inside(target: str | Path, root: str | Path) -> Path:
    """``target`` (under ``root``, the ``--out`` of a run), refused when it names a place outside
    ``root`` (``..``, an absolute path elsewhere) or a symbolic link inside ``root`` leads it elsewhere
    (``root`` itself may be a link)."""
    target, root = Path(target), Path(root)
    if ".." in target.parts:
        raise OutputRefused(f"{target}: an output path with '..' is refused; basm-probes writes only inside --out {root}")
    real_root, real = root.resolve(), target.resolve()
    if real != real_root and real_root not in real.parents:
        links = [p for p in [target, *target.parents] if p != root and root in p.parents and p.is_symlink()]
        raise OutputRefused(f"{links[0] if links else target} is a symbolic link out of --out {root}; basm-probes writes only "
                            "inside --out and never follows a link out of it: remove the link, or use another --out")
    return target


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


def _named(error: OSError, path: Path) -> OSError:
    """``error`` naming ``path`` (a write error such as EFBIG / ENOSPC names no file)."""
    if error.filename is None:
        return OSError(error.errno, error.strerror or str(error), str(path))
    return error


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to ``path`` (same suffix) that replaces ``path`` only when the block
    succeeds: a killed or failing writer leaves the old file whole, never a shorter one. The
    temporary files of killed writers are deleted first; a link or a folder at ``path`` is refused;
    an error (a full disk) names ``path``. Prefer :class:`OutputRoot`, which also checks the root."""
    path = Path(path)
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        tmp.unlink(missing_ok=True)  # our own leftover (or a link planted at the name): the writer creates it afresh
        yield tmp
        if tmp.is_symlink() or not tmp.is_file():
            raise OutputRefused(f"{tmp}: the temporary of {path} is not a regular file written by this process")
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        check_target(path)  # a link swapped in while the block wrote is refused, not replaced
        tmp.replace(path)
    except OSError as error:
        raise _named(error, path) from error
    finally:
        tmp.unlink(missing_ok=True)


def _exclusive_text(tmp: Path, binary: bool = False) -> Any:
    """``tmp`` created for writing, refused if anything (a link) is already at its name."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8")


@contextmanager
def atomic_text(path: str | Path) -> Iterator[Any]:
    """A text handle whose content replaces ``path`` when the block succeeds (a file written as it goes)."""
    with atomic_path(path) as tmp, _exclusive_text(tmp) as handle:
        yield handle


def write_text(path: str | Path, text: str) -> None:
    """A text output (a report, a card, a JSON summary), written atomically."""
    with atomic_text(path) as handle:
        handle.write(text)


def write_bytes(path: str | Path, data: bytes) -> None:
    """A binary output, written atomically."""
    with atomic_path(path) as tmp, _exclusive_text(tmp, binary=True) as handle:
        handle.write(data)


def write_chunks(path: str | Path, chunks: Iterable[bytes]) -> None:
    """A binary output too large to hold in memory, written atomically as ``chunks`` yields it; an
    error raised by ``chunks`` (a failed check at its end) leaves ``path`` as it was."""
    with atomic_path(path) as tmp, _exclusive_text(tmp, binary=True) as handle:
        for chunk in chunks:
            handle.write(chunk)


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    """A summary table, written atomically."""
    with atomic_text(path) as handle:
        frame.to_csv(handle, index=False)


def save_figure(fig: Figure, path: str | Path, **savefig: Any) -> None:
    """A figure (its format from ``path``'s suffix), drawn into an atomic temporary."""
    path = Path(path)
    with atomic_path(path) as tmp, _exclusive_text(tmp, binary=True) as handle:
        fig.savefig(handle, format=path.suffix.lstrip("."), **savefig)


# ------------------------------------------------------------------------------------- folders
def check_folder(out: Path, *, is_previous: Callable[[Path], bool], overwrite: bool, what: str, flag: str = "--overwrite") -> None:
    """Refuse ``out`` unless it is absent, an empty folder, a previous output of this kind
    (``is_previous``), or ``overwrite`` (a file, or a link to one, is refused either way)."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise OutputRefused(f"{out} exists and is not a folder; the {what} is written as a folder: use another path")
    if overwrite or not any(out.iterdir()) or is_previous(out):
        return
    raise OutputRefused(f"{out} is not empty and is not a previous {what}; nothing was written. Use a new or empty folder, "
                        f"or pass {flag} to replace the whole folder")


@contextmanager
def staged_folder(out: Path, *, is_previous: Callable[[Path], bool], overwrite: bool, what: str,
                  generated: tuple[str, ...] = ()) -> Iterator[Path]:
    """A temporary folder next to ``out`` (same file system) for the block to fill; on success it
    replaces ``out`` (checked with :func:`check_folder`); on failure it is deleted and ``out`` is untouched.
    Of a previous output, the entries that the generator does not write (not in ``generated``) are
    kept; links in the old folder are removed as links, their targets never touched."""
    out = Path(out)
    if out.is_symlink():  # a link to a folder: the folder it names is replaced, never the link by a folder
        out = out.resolve()
    check_folder(out, is_previous=is_previous, overwrite=overwrite, what=what)
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


def make_folder(folder: Path) -> Path:
    """``folder`` and its parents created where absent (a folder the caller has checked is inside its root)."""
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def remove_tree(folder: Path) -> None:
    """Delete a folder of ours (a cache ``--overwrite`` discards); a link there is removed as a link."""
    if folder.is_symlink():
        folder.unlink()
    elif folder.is_dir():
        shutil.rmtree(folder)


# ------------------------------------------------------------------------------------- results files
def open_locked(path: Path) -> int:
    """A read-only descriptor of ``path`` (created if absent) for an exclusive lock, never through a
    link (``O_NOFOLLOW``: a link put there after :func:`check_target` is refused, never followed)."""
    check_target(path)
    try:  # read-only: a finished read-only file can still be opened
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            check_target(path)  # names the link
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OutputRefused(f"{path} exists and is not a regular file; remove it, or use another --out")
    return fd


@contextmanager
def write_handle(path: Path, *, append: bool) -> Iterator[Any]:
    """``path`` opened for writing text in place (appended, or truncated) without following a link;
    a write error (a full disk) names the file. For a file this writer created (a locked results file, a log)."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    try:
        with os.fdopen(os.open(path, flags), "a" if append else "w") as handle:
            yield handle
    except OSError as error:
        raise _named(error, path) from error


def append_text(path: str | Path, text: str) -> None:
    """``text`` added to the end of a file this writer created (a log kept as it goes), never through a link."""
    with write_handle(Path(path), append=True) as handle:
        handle.write(text)


def truncate(path: Path, size: int) -> None:
    """Cut a locked results file to ``size`` bytes (its torn last line); never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def remove_file(path: Path) -> None:
    """Delete a file of ours (a merged shard); a link there is removed as a link."""
    path.unlink()


# ------------------------------------------------------------------------------------- the root
class OutputRoot:
    """A folder every output of one run (or one tool) is written under; see the module docstring.

    Targets are paths under the root, given relative to it or as a path that starts with it."""

    def __init__(self, root: str | Path, *, overwrite: bool = False, flag: str = "--out") -> None:
        if not str(root).strip():  # Path("") is ".": an empty --out would write into the current folder
            raise OutputRefused(f"{flag} is empty; give the folder to write to (\".\" for the current folder)")
        self.root, self.overwrite, self.flag = Path(root), overwrite, flag

    def path(self, target: str | Path = ".") -> Path:
        """``target`` under the root, checked (:func:`check_inside`)."""
        target = Path(target)
        full = target if target.is_absolute() or target.parts[: len(self.root.parts)] == self.root.parts else self.root / target
        return check_inside(full, self.root)

    def child(self, target: str | Path) -> OutputRoot:
        """A checked subfolder as a root of its own (e.g. ``OUT/<model>``)."""
        return OutputRoot(self.path(target), overwrite=self.overwrite, flag=self.flag)

    # (not named like Path's write_text / write_bytes: the one-writer test tells them apart by name)
    def write(self, target: str | Path, text: str) -> Path:
        """A text file (UTF-8), atomically."""
        write_text(path := self.path(target), text)
        return path

    def write_binary(self, target: str | Path, data: bytes) -> Path:
        write_bytes(path := self.path(target), data)
        return path

    def write_chunks(self, target: str | Path, chunks: Iterable[bytes]) -> Path:
        """A large binary file streamed from ``chunks``, atomically (:func:`write_chunks`)."""
        write_chunks(path := self.path(target), chunks)
        return path

    def write_table(self, target: str | Path, frame: pd.DataFrame) -> Path:
        """A CSV table, atomically."""
        write_csv(frame, path := self.path(target))
        return path

    def write_figure(self, target: str | Path, fig: Figure, **savefig: Any) -> Path:
        save_figure(fig, path := self.path(target), **savefig)
        return path

    @contextmanager
    def atomic(self, target: str | Path) -> Iterator[Path]:
        """A temporary path that replaces ``target`` when the block succeeds, for a third-party writer
        that wants a path (``np.save``)."""
        with atomic_path(self.path(target)) as tmp:
            yield tmp

    def check_folder(self, target: str | Path, *, is_previous: Callable[[Path], bool], what: str) -> Path:
        """Refuse a folder target before any work (:func:`check_folder`); returns its path."""
        path = self.path(target)
        check_folder(path, is_previous=is_previous, overwrite=self.overwrite, what=what)
        return path

    @contextmanager
    def folder(self, target: str | Path, *, is_previous: Callable[[Path], bool], what: str,
               generated: tuple[str, ...] = ()) -> Iterator[Path]:
        """A staged folder that replaces ``target`` whole when the block succeeds (:func:`staged_folder`)."""
        with staged_folder(self.path(target), is_previous=is_previous, overwrite=self.overwrite, what=what,
                           generated=generated) as stage:
            yield stage

    def make_folder(self, target: str | Path = ".") -> Path:
        return make_folder(self.path(target))

    @contextmanager
    def files_into(self, target: str | Path = ".") -> Iterator[Path]:
        """A scratch folder for a third-party writer that wants a folder (``save_pretrained``); when the
        block succeeds each file it wrote replaces its namesake in ``target`` (atomically, never through
        a link), the other files of ``target`` kept; a failure leaves ``target`` as it was."""
        folder = self.make_folder(target)
        stage = folder / f".files-{os.getpid()}"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir()
        try:
            yield stage
            written = sorted(stage.iterdir())
            for entry in written:  # every check before the first move: all of it lands, or none
                if entry.is_symlink() or not entry.is_file():
                    raise OutputRefused(f"{entry}: a writer left something other than a file; nothing of it was moved into {folder}")
                check_target(folder / entry.name)
            for entry in written:
                os.replace(entry, folder / entry.name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def remove_tree(self, target: str | Path) -> None:
        remove_tree(self.path(target))

    def move(self, source: str | Path, target: str | Path) -> Path:
        """Rename a file or folder of ours to another name under the root (a results folder reorganised),
        its parent folders created; refused when either is a link or ``target`` exists (never replaced)."""
        source, path = self.path(source), self.path(target)
        for name in (source, path):
            if name.is_symlink():
                raise OutputRefused(f"{name} is a symbolic link; basm-probes moves only its own files, never a link")
        if path.exists():
            raise OutputRefused(f"{path} exists; {source} was not moved over it: remove one of them and move again")
        make_folder(path.parent)
        os.replace(source, path)
        return path
