"""Torch's CPU thread count of a run: the ``auto`` rule, and the scope that sets a count and gives the caller's back.

Why the count matters. Torch splits a reduction (a matrix product's sums, a softmax's) over its threads, so
the same forward pass on another thread count adds in another order and its values differ in the last
bits (a knockout run on the torch default and on one thread: 2 of 27 rows differ at about 1e-6). The
thread count is therefore part of a run's configuration: the analyses record it in the results header
and refuse to resume a file under another count (:mod:`probes.reporting.results`).

Why ``auto`` is not torch's default. Torch starts one thread per core, and its OpenMP threads wait for
each other (spinning) at the end of every parallel region; when other processes hold the cores, a
descheduled thread stalls the rest at each of the many small regions of a small model's forward pass.
Measured on this project's 2-core machine, shared with other jobs (``benchmarks/threads.py``):

- ``basm-probes sweep`` (the organism, 984,320 parameters, 1,680 prompts; wall, with the CPU seconds the run
  itself used), back to back with other jobs beside it: at load ≈ 3, 1 thread 68.8 s (43.8 s CPU), 2 threads
  (torch's default there) 620.5 s (332.5 s CPU: the rest is spinning); at load 5–7, 114.4 s (43.9) against
  537.7 s (394.1); at load ≈ 2, 43.5 s (40.2) against over 240 s (stopped). With two busy processes added
  (load 6–13): 1 thread 405, 426 and 470 s (50–52 s CPU: the run got about an eighth of a core); 2 threads
  stopped after 10 min at 108 of 1,680 prompts (projected 1.5 h).
- One forward pass of 256 tokens, random Qwen3 shapes, load average ≈ 10, wall (CPU) per pass:
  0.98 M parameters 110 ms (26) on 1 thread, 929 ms (267) on 2; 5.2 M 241 (68) / 2998 (888);
  33.6 M 1106 (317) / 6971 (2083); 102 M 2979 (830) / 11458 (3691).

Two threads lost at every size measured, by 4–12×, while on 2 quiet cores they can gain at most 2× (README's
quiet-machine figures for the organism's sweep, 24–46 s, were taken on torch's default; one thread needs
40–54 s of CPU for it). The rule (:data:`AUTO_RULE`): one thread below :data:`ONE_THREAD_BELOW` parameters,
about the largest size measured; above it, where matrix products are large enough for threads to pay on a
quiet machine, the cores this process may run on, divided by the ranks on its node and never more than
torch's own count (which ``OMP_NUM_THREADS`` sets: a machine shared with other jobs caps it there).
The count never follows the load of the moment: it is recorded, and a resume must find the same.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

AUTO = "auto"
ONE_THREAD_BELOW = 100_000_000  # about the largest model measured above (102 M; one thread was faster at every size)
AUTO_RULE = (
    f"auto: 1 thread for a model under {ONE_THREAD_BELOW:,} parameters, else the cores this process may run on divided "
    "by the ranks on its node, at most torch's own count (OMP_NUM_THREADS)"
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
    return max(1, min(torch.get_num_threads(), usable_cores() // max(1, ranks_on_node)))


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
