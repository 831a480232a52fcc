"""The job runner: an analysis's rows are scored per :class:`Job` (one prompt record: item × memory
configuration × k × format) and appended to a resumable store, so a rerun scores only the jobs whose
rows are missing (:func:`run_jobs`); :func:`cached_scorer` scores a record's conditions through the
one record scorer (:func:`probes.scoring.score.score_record`), reusing byte-identical prompts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from probes.analyses.parallel import ShardedStore
from probes.data.dataset import Item
from probes.engine.session import Knockout
from probes.prompts.builder import PromptBuilder
from probes.prompts.record import PromptRecord, record_id
from probes.reporting.results import ResultsStore
from probes.scoring.score import MARGINS, row_fields, score_record

if TYPE_CHECKING:
    from probes.analyses.run_context import RunContext


@dataclass(frozen=True)
class Job:
    """One prompt record to score, and the names of the conditions (rows) it yields."""

    item: Item
    config: str
    k: int
    fmt: str
    conditions: tuple[str, ...]
    skills: tuple[str, ...] | None = None  # the ids of the k skills shown instead of the top k (a masked library)

    @property
    def record_id(self) -> str:
        return record_id(self.item.id, self.config, self.k, self.fmt)

    def build(self, builder: PromptBuilder) -> PromptRecord:
        """This job's prompt record: the top k retrieved skills, or ``skills`` in their retrieval order."""
        if self.skills is None:
            return builder.build(self.item, self.config, self.k, self.fmt)
        ranked = {entry.skill.id: entry for entry in builder.retrieve(self.item)}
        return builder.build(self.item, self.config, self.k, self.fmt, retrieved=[ranked[skill] for skill in self.skills])

    def keys(self) -> list[str]:
        return [f"{self.record_id}|{c}" for c in self.conditions]


Scorer = Callable[[PromptRecord, Job], list[dict[str, Any]]]


def run_jobs(ctx: RunContext, store: ResultsStore | ShardedStore, jobs: Sequence[Job], scorer: Scorer) -> int:
    """Score every job whose rows are not all in ``store`` yet; returns the number scored.

    A job whose rows are partly present (a run killed mid-write) is rescored and only the
    missing rows are appended; scoring is deterministic, so the table is the same.

    Under ``torchrun`` (a :class:`~probes.analyses.parallel.ShardedStore`) the pending jobs' items
    are dealt round-robin to the ranks, each scores its own, and the merged results file is complete
    on every rank when this returns; the number is then the total over the ranks.
    """
    done = store.done
    pending = [job for job in jobs if not all(key in done for key in job.keys())]
    if not isinstance(store, ShardedStore):
        return _score_jobs(ctx, store, jobs, pending, scorer)
    ranks = store.world
    # by item, not by job: an item's jobs share their prompt prefix (reused by the engine) on one rank
    order = {item_id: i for i, item_id in enumerate(dict.fromkeys(job.item.id for job in pending))}
    mine = [job for job in pending if order[job.item.id] % ranks.size == ranks.rank]
    scored = _score_jobs(ctx, store, mine, mine, scorer, label=f" [rank {ranks.rank}/{ranks.size}]")
    store.merge(key for job in jobs for key in job.keys())
    return ranks.total(scored)


def _score_jobs(ctx: RunContext, store: ResultsStore | ShardedStore, jobs: Sequence[Job], pending: Sequence[Job], scorer: Scorer,
                label: str = "") -> int:
    with tqdm(total=len(jobs), initial=len(jobs) - len(pending), desc=ctx.name + label, unit="prompt",
              dynamic_ncols=True, smoothing=0.1) as bar:
        for job in pending:
            record = job.build(ctx.builder)
            rows = scorer(record, job)
            for row in rows:
                row["key"] = f"{record.record_id}|{row['condition']}"
            missing = [row for row in rows if row["key"] not in store]
            unexpected = {row["key"] for row in rows} ^ set(job.keys())
            if unexpected:
                raise RuntimeError(f"{job.record_id}: scorer rows {sorted(unexpected)} do not match the job's conditions")
            store.append(missing)
            bar.update(1)
    return len(pending)


def cached_scorer(
    ctx: RunContext,
    conditions_for: Callable[[PromptRecord, Job], Sequence[Knockout]],
    *,
    per_head: bool = False,
    margins: Sequence[str] = MARGINS,
) -> Scorer:
    """A scorer over :func:`score_record` that reuses results for byte-identical prompts of one
    item (k = 0, where every configuration renders the same prompt, and ``base`` at every depth,
    which is that prompt again)."""

    def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
        conditions = list(conditions_for(record, job))
        digest = hashlib.sha256(json.dumps([record.input_ids, [c.to_json() for c in record.candidates], record.spans_json(),
                                            [repr(c) for c in conditions], per_head, list(margins)]).encode()).hexdigest()
        # An item's jobs run together: keep its results only, so memory stays flat over the run.
        for other in [item for item in ctx._score_cache if item != job.item.id]:
            del ctx._score_cache[other]
        cache = ctx._score_cache.setdefault(job.item.id, {})
        if digest not in cache:
            cache[digest] = score_record(ctx.session, record, conditions, variant=ctx.variant, per_head=per_head, margins=margins)
        rows = []
        for cached in cache[digest]:
            row = dict(cached)
            row.update(row_fields(record))
            row["prompt_digest"] = digest[:16]
            rows.append(row)
        return rows

    return scorer

