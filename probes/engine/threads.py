"""Torch's CPU thread count of a run: the ``auto`` rule, and the scope that sets a count and gives the caller's back.

Why the count matters. Torch splits a reduction (a matrix product's sums, a softmax's) over its threads, so
the same forward pass on another thread count adds in another order and its values differ in the last
bits (a knockout run on the torch default and on one thread: 2 of 27 rows differ at about 1e-6). The
thread count is therefore part of a run's configuration: the analyses record it in the results header
and refuse to resume a file under another count (:mod:`probes.reporting.results`).

Why ``auto`` is not torch's default. Torch starts one thread per core, and its OpenMP threads wait for
each other at the end of every parallel region; when other processes hold the cores, a descheduled
thread stalls the rest at each of the many small regions of a small model's forward pass.
:data:`AUTO_RULE` states the rule and the measurements it rests on.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

AUTO = "auto"
# Below this many parameters one thread is the fastest count on a quiet and on a busy 2-core CPU alike
# (measured, see AUTO_RULE); at or above it a model's matrix products are large enough for more threads to pay.
ONE_THREAD_BELOW = 20_000_000
AUTO_RULE = (
    f"auto: 1 thread for a model under {ONE_THREAD_BELOW:,} parameters, else the cores this process may run on "
    "divided by the ranks on its node (never the load of the moment: the count is recorded and must be the same "
    "when the run resumes)"
)

F = TypeVar("F", bound=Callable[..., Any])


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or ``taskset`` narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def auto_threads(parameters: int, ranks_on_node: int = 1) -> int:
    """The thread count that ``threads="auto"`` resolves to for a model of ``parameters`` parameters,
    one of ``ranks_on_node`` processes of a parallel run on this node (:data:`AUTO_RULE`)."""
    if parameters < ONE_THREAD_BELOW:
        return 1
    return max(1, usable_cores() // max(1, ranks_on_node))


def set_threads(count: int) -> None:
    """Torch's intra-op thread count (the one its reductions are split over). The inter-op count is left
    alone: torch fixes it once any inter-op work has started, and the engine's forward passes use none."""
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


@contextlib.contextmanager
def caller_threads() -> Iterator[None]:
    """Whatever thread count the body sets, the caller's is back on exit (a library leaves the process as it found it)."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        set_threads(before)


def keeps_caller_threads(function: F) -> F:
    """``function`` run in :func:`caller_threads`: an API entry that sets the run's count gives the caller's back."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with caller_threads():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
