"""A run killed between two writes of its rows, shared by the resume tests: the store's ``append``
writes the first batches, then the run dies (``Interrupted``) before the next one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from probes.reporting.results import ResultsStore


class Interrupted(Exception):
    pass


@contextmanager
def killed_after_appends(appends: int) -> Iterator[None]:
    """The run inside writes ``appends`` batches of rows, then raises :class:`Interrupted` when it asks
    to write the next one (the block must raise it); ``ResultsStore.append`` is restored on exit."""
    real, written = ResultsStore.append, 0

    def dying_append(self: ResultsStore, rows: object) -> None:
        nonlocal written
        if written == appends:
            raise Interrupted
        written += 1
        real(self, rows)

    ResultsStore.append = dying_append  # type: ignore[method-assign]
    try:
        with pytest.raises(Interrupted):
            yield
    finally:
        ResultsStore.append = real  # type: ignore[method-assign]
