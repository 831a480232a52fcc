"""What ``curate`` and ``mask-eval`` (seed 003 §2.2–2.3) share: the development attribution.

Both analyses split the selected items by their split field (``--split-kind``): the *development*
items (split ``train``) decide everything, the *held-out* items (split ``eval``, other task groups)
only measure. On the development items both score the attribution masks of ``attribution`` (the
``library`` pool: retrieval re-run on the masked library) and compute the benefit matrix
b[j, i] = −C[j, i] of the wrong-tool margin (:mod:`probes.scoring.curation_rules`).

Every prompt beyond the masks is scored once and keyed by what it shows (``shown:<digest>`` of the
shown skills' text), so the thresholds only choose among rows: a rerun with other thresholds
reuses every row it can.
"""


from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from probes.analyses.attribution import Attribution, design, draw, included_sets, mask_jobs, mask_scorer, shown
from probes.analyses.base import Analysis
from probes.analyses.jobs import Job, cached_scorer, run_jobs
from probes.analyses.option_system import ItemOptions, OptionError, k_max_option, shared
from probes.analyses.run_context import RunContext
from probes.data.dataset import Item, ProbeDataset
from probes.prompts.builder import DEFAULT_K_MAX
from probes.reporting.results import load_results
from probes.scoring import curation_rules as cur
from probes.scoring import skill_masking as est
from probes.scoring.claims import Claim, effect_claim

POOL = "library"  # a curated or masked library is retrieved from: the attribution pool that re-runs retrieval
DEVELOPMENT, HELD_OUT = "train", "eval"
# The held-out claims, stated before any run: the one confirmatory cell per contrast is the wrong-tool margin on
# T_wrong (where the imitation trap acts); every other bucket and the wrong-choice rate are exploratory strata.
CONFIRMATORY = ("margin", "T_wrong")
# δ per outcome: the seed's smallest effect it acts on (a 0.10 pass-rate change, §K.2), as a margin 2·logit(0.55)
SESOI = {"margin": (cur.TAU_RETIRE, "logits"), "wrong_choice": (cur.SEED_HARM_THRESHOLD, "share")}
DELTA_COLUMNS = ["item_id", "task_group", "bucket", "contrast", "delta", "outcome"]  # the held-out items' paired differences
OUTCOME_LABELS = {"margin": "wrong-tool margin", "wrong_choice": "wrong two-way choice rate"}


# ---------------------------------------------------------------------------- shared by both
def partition(ctx: RunContext) -> tuple[list[Item], list[Item]]:
    """The development (split ``train``) and held-out (split ``eval``) items of the run."""
    field = "split" if ctx.options.split_kind == "template" else "split_scenario"
    dev = [item for item in ctx.items if getattr(item, field) == DEVELOPMENT]
    held = [item for item in ctx.items if getattr(item, field) == HELD_OUT]
    if not dev:
        raise OptionError(f"{ctx.name}: no development items (split {DEVELOPMENT!r}) among the {len(ctx.items)} selected; "
                          "select --split all (the default) or train")
    return dev, held


def benefit_cells(ctx: RunContext, rows: pd.DataFrame, items: Sequence[Item], skills: tuple[str, ...], masks: np.ndarray) -> pd.DataFrame:
    """The benefit b = −C of the margin (attribution's Eq. 1 over the mask rows), one row per defined
    (skill, development item) cell: skill, item_id, b."""
    sub = rows[rows["condition"].str.startswith(f"{POOL}:m")]
    table = sub.pivot_table(index="mask", columns="item_id", values="margin", aggfunc="first", dropna=False).reindex(index=range(len(masks)))
    out = []
    by_domain: dict[str, list[Item]] = {}
    for item in items:
        by_domain.setdefault(item.domain, []).append(item)
    for domain_items in by_domain.values():
        o, inc, defined, cols = design(ctx, table, domain_items, POOL, skills, masks)
        c = est.causal_scores(o, inc, defined)
        j, i = np.nonzero(np.isfinite(c))
        out.append(pd.DataFrame({"skill": [skills[cols[x]] for x in j], "item_id": [domain_items[x].id for x in i], "b": -c[j, i]}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["skill", "item_id", "b"])


def shown_condition(dataset: ProbeDataset, skill_ids: Sequence[str]) -> str:
    """The row condition of a prompt by what it shows: a digest of the shown skills' text, in order."""
    text = json.dumps([dataset.skills[s].to_json() for s in skill_ids], sort_keys=True)
    return "shown:" + hashlib.sha256(text.encode()).hexdigest()[:16]


Request = tuple[Item, tuple[str, ...]]  # an item and the skills its prompt shows
Margins = Callable[[RunContext, Sequence[Request]], list[float]]


def scoring_margins(store) -> Margins:
    """Score the requests not in ``store`` yet (resumable) and return every request's margin."""
    def margins(ctx: RunContext, requests: Sequence[Request]) -> list[float]:
        jobs = list({job.keys()[0]: job for job in (request_job(ctx, item, seen) for item, seen in requests)}.values())
        score = cached_scorer(ctx, lambda record, job: (), margins=("margin",))

        def scorer(record, job):
            rows = score(record, job)
            for row in rows:
                row.update(condition=job.conditions[0], shown=list(job.skills))
            return rows

        run_jobs(ctx, store, sorted(jobs, key=lambda job: job.item.id), scorer)
        return recorded_margins(load_results(store.path))(ctx, requests)
    return margins


def recorded_margins(rows: pd.DataFrame) -> Margins:
    """The requests' margins read from ``rows`` (a missing one is an error: the run did not score it)."""
    by_key = rows.drop_duplicates("key").set_index("key")["margin"] if len(rows) else pd.Series(dtype=float)

    def margins(ctx: RunContext, requests: Sequence[Request]) -> list[float]:
        keys = [request_job(ctx, item, seen).keys()[0] for item, seen in requests]
        missing = [key for key in keys if key not in by_key.index]
        if missing:
            raise RuntimeError(f"{ctx.name}: {len(missing)} prompts were never scored (e.g. {missing[0]}); rerun the analysis")
        return [float(by_key[key]) for key in keys]
    return margins


def request_job(ctx: RunContext, item: Item, seen: tuple[str, ...]) -> Job:
    return Job(item, ctx.options.config, len(seen), ctx.fmt, (shown_condition(ctx.dataset, seen),), skills=seen)


def on_library(ctx: RunContext, item: Item, library: Iterable[str]) -> tuple[str, ...]:
    """The top k of retrieval re-run on ``library`` (what the item's prompt shows with that library)."""
    return shown(ctx, item, frozenset(library), POOL)


def held_out_claims(deltas: pd.DataFrame, family: str, contrasts: dict[str, str], *, alternative: str = "less",
                    seed: int = 0) -> list[Claim]:
    """One claim per (outcome, bucket, contrast) of the held-out items' paired differences ``deltas``
    (columns outcome, bucket, contrast, task_group, delta; one row per item): the contrast moves the
    outcome in ``alternative``'s direction (lower: fewer wrong choices), tested over task groups against
    the outcome's δ (:data:`SESOI`). ``contrasts`` words each contrast ("the per-item mask against the
    full library"). The :data:`CONFIRMATORY` cell is in ``family``; the rest are exploratory, in
    ``family``-strata (so they do not dilute its Holm correction)."""
    claims = []
    direction = "lowers" if alternative == "less" else "raises"
    for (outcome, bucket, contrast), sub in deltas.groupby(["outcome", "bucket", "contrast"], sort=False):
        sub = sub[np.isfinite(sub["delta"].to_numpy(float))]  # an abstention item has no tool-choice margin
        sesoi, unit = SESOI[outcome]
        exploratory = (outcome, bucket) != CONFIRMATORY
        claims.append(effect_claim(f"{family}-strata" if exploratory else family, f"{contrast} {outcome} {bucket}",
                                   f"on held-out {bucket} items {contrasts[contrast]} {direction} the {OUTCOME_LABELS[outcome]}",
                                   sub["delta"].to_numpy(float), sub["task_group"].to_numpy(), alternative=alternative, sesoi=sesoi,
                                   unit=unit, exploratory=exploratory, seed=seed, note=f"{len(sub)} items"))
    return claims


@dataclass(kw_only=True)
class DevelopmentAttribution(Analysis):
    """Base of ``curate`` and ``mask-eval``: the attribution masks on the development items."""

    k_max: int | None = k_max_option(DEFAULT_K_MAX)
    split: str = shared(ItemOptions, "split", default="all", help="items: the development ones (split train) decide, the held-out "
                        "ones (split eval) only measure; default all (both)")
    masks: int = shared(Attribution, "masks")
    inclusion: float = shared(Attribution, "inclusion")
    config: str = shared(Attribution, "config")

    def development(self, ctx: RunContext) -> tuple[list[Item], list[Item], tuple[str, ...], np.ndarray, Any]:
        """Score the attribution masks of the development items (resumable); returns the items, the
        skills and masks, and the store (opened once: every row of the run goes to it)."""
        dev, held = partition(ctx)
        skills, masks = draw(ctx, self.masks, self.inclusion)
        store = ctx.store(configs=[self.config], masks=[sorted(s) for s in included_sets(skills, masks)])
        run_jobs(ctx, store, mask_jobs(ctx, dev, skills, masks, self.config, (POOL,)), mask_scorer(ctx))
        return dev, held, skills, masks, store

    def matrix(self, ctx: RunContext, rows: pd.DataFrame) -> tuple[list[Item], list[Item], pd.DataFrame]:
        dev, held = partition(ctx)
        skills, masks = draw(ctx, self.masks, self.inclusion)
        return dev, held, benefit_cells(ctx, rows, dev, skills, masks)
