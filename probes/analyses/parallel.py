"""Data-parallel runs under ``torchrun``: each rank scores a shard of the items, rank 0 merges.

``torchrun --nproc_per_node N -m probes.cli sweep ...`` (or a script that calls
``Analysis.run()`` under ``torchrun``, on one node or several) starts N processes with ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` set. Every analysis then runs the same pipeline on every rank;
only the scoring of jobs (:func:`probes.analyses.jobs.run_jobs`) is split:

- rank 0 opens the results file (checking its configuration, merging the shard files a killed run
  left behind), then every rank reads which keys it holds;
- the items of the pending jobs, in job order, are dealt round-robin to the ranks (an item's jobs
  stay on one rank, for the engine's shared-prefix reuse); each rank appends its rows to its own
  shard file ``<name>.rank<R>-of-<W>.jsonl`` (same header as the results file);
- rank 0 merges the shard files into the results file in job order and deletes them; every rank
  then reads the merged file, so later stages (the heads' causal check) see the same rows.

Only rank 0 writes tables, figures and reports, and only it opens a results file for writing. The
ranks exchange nothing but barriers and job counts, over gloo (also on GPUs: no tensor crosses
processes). Rows do not depend on the world size: the results file of an N-process run holds the
same keys and values as that of a one-process run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from probes.reporting.results import ResultsStore, read_keys, shard_path

# A rank waits at a barrier for the slowest shard, which after a resume can be hours (one shard
# done, another barely started): far beyond torch's 30-minute default.
WAIT = timedelta(days=7)


@dataclass(frozen=True)
class World:
    """This process's place in the run: ``rank`` of ``size`` processes, ``local_rank`` of ``local_size`` on its node."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    group: Any = None  # the gloo process group (None: the default group, or a one-process run)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier(group=self.group)

    @property
    def local_size(self) -> int:
        """The processes of this run on this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 when not set)."""
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if self.size > 1 else 1

    def total(self, n: int) -> int:
        """``n`` summed over the ranks."""
        return self._reduce(n, "SUM")

    def smallest(self, n: int) -> int:
        """The smallest of the ranks' ``n``."""
        return self._reduce(n, "MIN")

    def _reduce(self, n: int, op: str) -> int:
        if self.size == 1:
            return n
        count = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(count, op=getattr(dist.ReduceOp, op), group=self.group)
        return int(count.item())


class ParallelError(RuntimeError):
    """A parallel run cannot start as launched; the message says what to change."""


_WORLD: World | None = None


def world() -> World:
    """The run's world, from the ``torchrun`` environment; the process group is started on first use
    (gloo), or taken over when the caller started one (a gloo group is added if it is not gloo)."""
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_available() and dist.is_initialized():
        group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo", timeout=WAIT)
        _WORLD = World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), group)
    elif size > 1:
        if not dist.is_available():
            raise ParallelError(f"WORLD_SIZE={size} asks for a parallel run, but this torch build has no torch.distributed")
        dist.init_process_group("gloo", timeout=WAIT)  # RANK, MASTER_ADDR, MASTER_PORT from torchrun
        _WORLD = World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    else:
        _WORLD = World()
    return _WORLD


def rank_device(device: str, w: World) -> str:
    """The device a rank loads its model on: a bare ``cuda`` becomes this rank's GPU on its node
    (``LOCAL_RANK``); a device with an index is taken as given (ranks may share a GPU)."""
    if w.size == 1 or device != "cuda":
        return device
    if w.local_rank >= torch.cuda.device_count():
        raise ParallelError(f"rank {w.rank} (LOCAL_RANK {w.local_rank}) has no GPU of its own: this node has "
                           f"{torch.cuda.device_count()}; start at most that many processes per node (--nproc_per_node), "
                           "or name one device (--device cuda:0) for ranks to share")
    return f"cuda:{w.local_rank}"


class ShardedStore:
    """A results file written by the ranks of a parallel run (the interface of
    :class:`~probes.reporting.results.ResultsStore` that :func:`~probes.analyses.jobs.run_jobs` uses).

    ``path`` is the results file; only rank 0 opens it for writing. ``append`` goes to this rank's
    shard file; ``done`` holds the keys of the results file and of the shard.
    """

    def __init__(self, path: str | Path, analysis: str, config: Mapping[str, Any], *, overwrite: bool, w: World) -> None:
        self.path = Path(path)
        self.world = w
        # rank 0 first: it checks the setup, and merges (or, with overwrite, deletes) a killed run's shards
        self.main = ResultsStore(self.path, analysis, config, overwrite=overwrite) if w.rank == 0 else None
        w.barrier()
        self._merged = self.main.done if self.main is not None else read_keys(self.path)
        self.shard = ResultsStore(shard_path(self.path, w.rank, w.size), analysis, config)

    @property
    def done(self) -> frozenset[str]:
        return self._merged | self.shard.done

    def __contains__(self, key: str) -> bool:
        return key in self._merged or key in self.shard

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        rows = list(rows)
        merged = [row["key"] for row in rows if row["key"] in self._merged]
        if merged:
            raise ValueError(f"duplicate result keys {merged[:3]} for {self.path}")
        self.shard.append(rows)

    def merge(self, order: Iterable[str]) -> None:
        """Every rank's shard into the results file (rank 0, keys in ``order`` first); returns on every
        rank once the results file is complete."""
        self.shard.close()  # hands the shard to rank 0
        self.world.barrier()
        if self.main is not None:
            self.main.merge([shard_path(self.path, rank, self.world.size) for rank in range(self.world.size)], list(order))
        self.world.barrier()


def open_store(path: str | Path, analysis: str, config: Mapping[str, Any], *, overwrite: bool) -> ResultsStore | ShardedStore:
    """The results file of a run: a :class:`ResultsStore`, or a :class:`ShardedStore` under ``torchrun``."""
    w = world()
    if w.size == 1:
        return ResultsStore(path, analysis, config, overwrite=overwrite)
    return ShardedStore(path, analysis, config, overwrite=overwrite, w=w)


def on_rank_zero(write: Callable[[], None]) -> None:
    """``write`` (which fills a results file from rows every rank holds, without the model) on rank 0
    only; returns on every rank once it is done."""
    w = world()
    if w.rank == 0:
        write()
    w.barrier()
