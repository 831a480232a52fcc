"""``heads`` (Figs. 8 and 9): where the boundary signal appears, and whether those heads matter.

1. **Map.** For BASM at depth k, per (layer, head): log2((ᾱ_B + ε) / (ᾱ_P + ε)), with ᾱ Eq. 2's
   length-normalised attention from the deciding row averaged over the items of a bucket
   (a ratio of means per head; never a mean of per-item ratios). Fig. 8 shows it on T_wrong, all items.
2. **Split.** The task groups are split in two halves (:func:`split_groups`): heads are ranked on
   the *ranking* half and the ranking is tested on the *test* half, so no item both selects and
   tests a head.
3. **Ranking.** Heads ranked by the increase of that log-ratio from T_ok to T_wrong (Fig. 9), on
   T_ok and *tool-correct* T_wrong items: a T_wrong item whose correct action is abstention has
   no tool-choice margin to test, so it is its own bucket, shown (``log2_wrong_abstain``) and
   never ranked on. Only heads whose deciding row reads the spans at all are ranked: mean
   attention mass on B ∪ P (ᾱ_B·|B| + ᾱ_P·|P|) of at least the *floor* in both buckets. A head
   that reads neither span has an ε-dominated ratio, whose shift can be large and means nothing;
   such heads are listed after the ranked ones, ``ranked`` false.
4. **The floor** is not chosen on the items it is tested on (:func:`select_floor`). By default
   (``--floor-from train``) it is chosen on the dataset's *train* split, outside this run's task
   groups: the train task groups are split in halves, heads ranked on one at every candidate floor
   (:data:`SENSITIVITY_FLOORS` and ``--min-span-mass``), the top-N against matched random sets
   knocked out on the other, and the floor picked by a rule fixed in advance
   (:func:`choose_floor`). That floor is then applied unchanged to this run. ``--floor-from
   given`` uses ``--min-span-mass`` as a value fixed a priori instead, and says so.
5. **Causal check.** On the test half's tool-correct T_wrong items (abstention-correct ones are
   counted and excluded, with the reason), deciding-row → boundary attention is knocked out only
   in the top-N ranked heads, versus ``--random-draws`` sets of N random heads drawn among the
   non-top heads that pass the floor, matched on their B mass α_B·|B| (the knockout removes B, not
   P; :func:`matched_random_sets`, drawn once with ``--seed``, the same sets for every record).
   The random-head pool's size is reported; when it admits fewer distinct N-head sets than
   :data:`MIN_RANDOM_SETS` the claim is "untestable" (:data:`POOL_RULE`), not "not detected".
   Δm = m_knockout − m_BASM for the wrong-tool margin; top − random per record; means with a 95%
   bootstrap CI over task groups. The head lists are part of the causal results' recorded
   configuration, so a changed ranking never mixes with old rows.
6. **Sensitivity** (descriptive, not used to choose anything): the same ranking and test on this
   run for every candidate floor, all head sets knocked out in one causal collection
   (``heads_sensitivity.csv``).
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probes.analyses import register
from probes.analyses.base import Analysis, Comparison, ReportSection
from probes.analyses.jobs import Job, cached_scorer, run_jobs
from probes.analyses.knockout import DEFAULT_SESOI
from probes.analyses.option_system import depth_option, option
from probes.analyses.run_context import AnalysisError, RunContext, provenance
from probes.analyses.ratios import head_alphas
from probes.data.dataset import ABSTAIN, ORGANISM_DIR, Item, is_organism, spread_limit
from probes.engine.session import Knockout
from probes.prompts.context import partition_by_context
from probes.prompts.record import PromptRecord
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring.claims import ALPHA, Claim, effect_claim
from probes.scoring.score import EPSILON
from probes.scoring.stats import bootstrap_mean, no_ci_note

NAME = "heads"
FLOOR_NAME = f"{NAME}_floor"  # the train rows that choose the floor: heads_floor.jsonl, heads_floor_causal.jsonl
FIGURES = ("fig08_head_heatmap", "fig09_candidate_heads")
DEFAULT_TOP = 4
DEFAULT_DRAWS = 3
MIN_SPAN_MASS = 0.05  # attention mass on B ∪ P a head's deciding row needs (both buckets) to be ranked
SENSITIVITY_FLOORS = (0.0, 0.01, 0.03, 0.05, 0.1, 0.2)  # candidate floors (with --min-span-mass)
FLOOR_SOURCES = ("train", "given")
MATCH_POOL = 2  # a random head is drawn among the MATCH_POOL·N candidate heads nearest its top head in log B mass
MATCH_TOLERANCE = 2.0  # random sets' mean B mass within this factor of the top set's, else the match is weak
ABSTAIN_REASON = "correct action is abstention: no tool-choice margin, and not the population the heads are ranked on"
# The family's smallest effect of interest: the knockout family's δ (logits of the same wrong-tool margin), fixed before any run.
SESOI = DEFAULT_SESOI
# "More than random heads" needs a random reference of at least this many distinct N-head sets: a top set
# that beat every one of M of them would rank first of M + 1, p = 1/(M + 1), below α only for M ≥ ⌊1/α⌋.
MIN_RANDOM_SETS = math.floor(1 / ALPHA)
POOL_RULE = (f"a test against random heads needs at least {MIN_RANDOM_SETS} distinct random sets: a top set beating every "
             f"one of M random sets ranks first of M + 1, p = 1/(M + 1), below α = {ALPHA:g} only for M ≥ {MIN_RANDOM_SETS}")
FLOOR_RULE = ("eligible floors: a full top-N set, matched random sets and a finite Δ on the other half; among them those whose "
              "B-mass match holds first, then the largest Δ = Δm(top) − Δm(random); ties → the higher floor")

Head = tuple[int, int]


def split_groups(groups: Iterable[str]) -> tuple[set[str], set[str]]:
    """Task groups for ranking heads (even positions in sorted order) and for testing them (odd)."""
    ordered = sorted(set(groups))
    return set(ordered[0::2]), set(ordered[1::2])


def with_halves(rows: pd.DataFrame) -> tuple[pd.DataFrame, set[str], set[str]]:
    """``rows`` with a ``half`` column ("rank" / "test", by task group), and the two group sets."""
    rank_groups, test_groups = split_groups(rows["task_group"])
    return rows.assign(half=np.where(rows["task_group"].isin(rank_groups), "rank", "test")), rank_groups, test_groups


def tested_items(items: Iterable[Item], groups: Collection[str]) -> tuple[tuple[Item, ...], tuple[str, ...]]:
    """The T_wrong items of task ``groups`` the causal check scores (a correct tool: the population
    the heads are ranked on) and the ids of the abstention-correct ones it excludes (:data:`ABSTAIN_REASON`)."""
    wrong = [item for item in items if item.bucket == "T_wrong" and item.task_group in groups]
    return (tuple(item for item in wrong if item.correct_action != ABSTAIN),
            tuple(item.id for item in wrong if item.correct_action == ABSTAIN))


# ----------------------------------------------------------------------------- map and ranking
def bucket_rows(rows: pd.DataFrame, bucket: str) -> pd.DataFrame:
    """The BASM rows of ``bucket`` that show both spans."""
    return rows[(rows["bucket"] == bucket) & (rows["boundary_size"] > 0) & (rows["procedure_size"] > 0)]


def log2_map(rows: pd.DataFrame, bucket: str) -> np.ndarray:
    """[layer, head] log2 ratio of item-averaged α on ``bucket`` (NaN-filled if absent)."""
    sub = bucket_rows(rows, bucket)
    if not len(sub):
        return np.array([[np.nan]])
    return np.log2((head_alphas(sub, "boundary").mean(0) + EPSILON) / (head_alphas(sub, "procedure").mean(0) + EPSILON))


def mass_map(rows: pd.DataFrame, bucket: str, spans: Sequence[str] = ("boundary", "procedure")) -> np.ndarray:
    """[layer, head] the deciding row's attention mass on the union of ``spans`` (Σ α_X·|X|), mean over the items of ``bucket``."""
    sub = bucket_rows(rows, bucket)
    return sum(head_alphas(sub, span) * sub[f"{span}_size"].to_numpy(float)[:, None, None] for span in spans).mean(0)


def ranked_rows(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows heads are ranked on (T_ok and T_wrong items with a correct tool) and the
    abstention-correct T_wrong rows, shown apart."""
    if "correct_is_abstain" not in rows:
        raise AnalysisError("head ranking: the rows lack correct_is_abstain (results written by an older version: rerun with --overwrite)")
    abstain = rows["correct_is_abstain"].astype(bool)
    return rows[~abstain], rows[abstain & (rows["bucket"] == "T_wrong")]


def unrankable(rows: pd.DataFrame) -> str:
    """Why ``rows`` cannot rank heads ("" when they can): a bucket without rows that show both spans and have a correct tool."""
    ranked_on, _ = ranked_rows(rows)
    missing = [bucket for bucket in ("T_ok", "T_wrong") if not len(bucket_rows(ranked_on, bucket))]
    return (f"no {' or '.join(missing)} rows with both spans and a correct tool (it needs T_ok and tool-correct T_wrong items)"
            if missing else "")


RANKING_COLUMNS = ["layer", "head", "log2_ok", "log2_wrong", "shift", "log2_wrong_abstain", "span_mass", "b_mass", "ranked", "floor",
                   "n_ok", "n_wrong", "n_abstain", "n_groups"]


def ranking(rows: pd.DataFrame, min_span_mass: float = MIN_SPAN_MASS) -> pd.DataFrame:
    """One row per head (:data:`RANKING_COLUMNS`): log2 ratio on T_ok and on tool-correct T_wrong
    items, shift = T_wrong − T_ok, the log2 ratio on the abstention-correct T_wrong items
    (``log2_wrong_abstain``: shown, never ranked on; NaN when there are none), span_mass (the
    smaller bucket mean of the mass on B ∪ P), b_mass (mean mass on B over the tool-correct T_wrong
    items: what the boundary knockout removes), ranked (span_mass ≥ ``min_span_mass``, the
    ``floor``), and the items ranked on (n_ok, n_wrong, n_groups) and shown apart (n_abstain).
    The ranked heads come first by descending shift, then the others. Raises
    :class:`AnalysisError` when a bucket has no rows showing both spans or the per-head arrays differ."""
    ranked_on, aside = ranked_rows(rows)
    if reason := unrankable(rows):
        raise AnalysisError(f"head ranking: {reason}")
    ok, wrong = log2_map(ranked_on, "T_ok"), log2_map(ranked_on, "T_wrong")
    apart = log2_map(aside, "T_wrong") if len(bucket_rows(aside, "T_wrong")) else np.full(ok.shape, np.nan)
    if not ok.shape == wrong.shape == apart.shape:
        raise AnalysisError(f"head ranking: per-head arrays of T_ok {ok.shape}, T_wrong {wrong.shape} and abstention-correct "
                            f"T_wrong {apart.shape} differ (rows of two models?)")
    layers, heads = np.indices(ok.shape)
    span_mass = np.minimum(mass_map(ranked_on, "T_ok"), mass_map(ranked_on, "T_wrong"))
    b_mass = mass_map(ranked_on, "T_wrong", ("boundary",))
    used = pd.concat([bucket_rows(ranked_on, "T_ok"), bucket_rows(ranked_on, "T_wrong")])
    table = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "log2_ok": ok.ravel(), "log2_wrong": wrong.ravel(),
                          "shift": (wrong - ok).ravel(), "log2_wrong_abstain": apart.ravel(), "span_mass": span_mass.ravel(),
                          "b_mass": b_mass.ravel(), "ranked": (span_mass >= min_span_mass).ravel(), "floor": min_span_mass,
                          "n_ok": bucket_rows(ranked_on, "T_ok")["item_id"].nunique(),
                          "n_wrong": bucket_rows(ranked_on, "T_wrong")["item_id"].nunique(),
                          "n_abstain": bucket_rows(aside, "T_wrong")["item_id"].nunique(), "n_groups": used["task_group"].nunique()})
    order = ["ranked", "shift", "layer", "head"]
    return table.sort_values(order, ascending=[False, False, True, True], kind="stable").reset_index(drop=True)[RANKING_COLUMNS]


# ----------------------------------------------------------------------------- head sets
def top_heads(rank: pd.DataFrame, n: int) -> list[Head]:
    """The first ``n`` *ranked* heads (fewer when fewer reach the span-mass floor)."""
    return [(int(r.layer), int(r.head)) for r in rank[rank["ranked"]].head(n).itertuples()]


def random_candidates(rank: pd.DataFrame, top: Sequence[Head]) -> list[Head]:
    """The heads a random set may hold: non-top heads that pass the floor (``ranked``) and read B
    (B mass > 0, so its log is defined). A head below the floor is never a candidate."""
    ok = rank["ranked"].astype(bool) & np.isfinite(rank["b_mass"]) & (rank["b_mass"] > 0)
    return sorted({(int(r.layer), int(r.head)) for r in rank[ok].itertuples()} - set(top))


def matched_random_sets(rank: pd.DataFrame, top: Sequence[Head], *, draws: int, seed: int) -> tuple[list[list[Head]], int]:
    """``draws`` random head sets matched to ``top`` on B mass, and the pool width used.

    For each top head, one head is drawn (without replacement within a set) among the
    ``MATCH_POOL·N`` :func:`random_candidates` nearest to it in log B mass, so every random set
    reads the boundary about as much as the top set (an unmatched draw mostly picks heads that
    read little of it), and no random head is one the ranking left out. With fewer candidates the
    pool is all of them (the caller reports the width); with fewer than N it raises.
    """
    mass = rank.set_index(["layer", "head"])["b_mass"]
    missing = [h for h in top if not (np.isfinite(mass.loc[h]) and mass.loc[h] > 0)]
    if missing:
        raise AnalysisError(f"matched random heads: top heads {missing} put no attention on B")
    candidates = random_candidates(rank, top)
    if len(candidates) < len(top):
        raise AnalysisError(f"matched random heads: {len(candidates)} floor-passing non-top heads read B, for {len(top)} top heads; "
                            "lower --top-n or the floor")
    nearest, pool = matched_choices(rank, top, candidates)
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(draws):
        chosen: list[Head] = []
        for head in top:
            options = nearest(head, chosen)
            chosen.append(options[int(rng.integers(len(options)))])
        sets.append(sorted(chosen))
    return sets, pool


def matched_choices(rank: pd.DataFrame, top: Sequence[Head], candidates: Sequence[Head]) -> tuple[Callable[[Head, Sequence[Head]], list[Head]], int]:
    """The matched draw's rule: ``nearest(head, chosen)`` lists the heads a random set may take for top
    ``head`` once it holds ``chosen`` (the pool-width candidates not yet chosen nearest to ``head`` in log
    B mass), and that width."""
    mass = rank.set_index(["layer", "head"])["b_mass"]
    log_mass = {h: math.log(mass.loc[h]) for h in [*top, *candidates]}
    pool = min(MATCH_POOL * len(top), len(candidates))

    def nearest(head: Head, chosen: Sequence[Head]) -> list[Head]:
        free = [c for c in candidates if c not in chosen]
        return sorted(free, key=lambda c: (abs(log_mass[c] - log_mass[head]), c))[:pool]

    return nearest, pool


def possible_sets(rank: pd.DataFrame, top: Sequence[Head], *, cap: int = MIN_RANDOM_SETS) -> int:
    """How many distinct sets the matched draw (:func:`matched_random_sets`) can give, counted by
    enumerating its choices up to ``cap`` (the count is min(true count, cap): enough to apply :data:`POOL_RULE`)."""
    nearest, _ = matched_choices(rank, top, random_candidates(rank, top))
    found: set[tuple[Head, ...]] = set()

    def walk(chosen: list[Head]) -> bool:  # True once ``cap`` sets are found
        if len(chosen) == len(top):
            found.add(tuple(sorted(chosen)))
            return len(found) >= cap
        return any(walk([*chosen, head]) for head in nearest(top[len(chosen)], chosen))

    walk([])
    return len(found)


def mean_mass(rank: pd.DataFrame, heads: Sequence[Head], column: str = "b_mass") -> float:
    mass = rank.set_index(["layer", "head"])[column]
    return float(np.mean([mass.loc[h] for h in heads])) if heads else float("nan")


def match_holds(top_mass: float, random_mass: float) -> bool:
    """Whether the random sets' mean B mass lies within :data:`MATCH_TOLERANCE` of the top set's."""
    return bool(top_mass > 0 and 1 / MATCH_TOLERANCE <= random_mass / top_mass <= MATCH_TOLERANCE)


def heads_text(heads: Sequence[Head]) -> str:
    return " ".join(f"L{layer}H{head}" for layer, head in heads)


@dataclass(frozen=True)
class Selection:
    """The ranking at one span-mass floor and the head sets it selects for the causal check."""

    floor: float
    ranking: pd.DataFrame
    sets: dict[str, list[Head]]  # "top-n" first, then "random-n #i"; empty when the check cannot run at this floor
    pool: int  # candidate heads each random head was drawn among (0: no sets)
    note: str  # why the sets are smaller than asked, absent, or weakly matched ("" if none of these)
    match: bool | None = None  # the random sets' B mass within MATCH_TOLERANCE of the top set's (None: no sets)
    random_pool: int = 0  # heads a random set may hold (floor-passing non-top heads that read B)
    possible_sets: int = 0  # distinct sets the matched draw can give (:func:`possible_sets`, counted up to MIN_RANDOM_SETS)

    @property
    def possible_text(self) -> str:
        """:attr:`possible_sets` as a count, "≥ MIN_RANDOM_SETS" where the count stopped there."""
        return f"≥ {MIN_RANDOM_SETS}" if self.possible_sets >= MIN_RANDOM_SETS else str(self.possible_sets)

    @property
    def distinct_sets(self) -> int:
        """Distinct head sets among the random draws."""
        return len({tuple(sorted(self.sets[name])) for name in self.random_names})

    @property
    def pool_too_small(self) -> str:
        """Why the random reference is too small for "more than random heads" to be testable
        (:data:`POOL_RULE`), "" when it is large enough."""
        if not self.sets or self.possible_sets >= MIN_RANDOM_SETS:
            return ""
        return (f"the random-head pool holds {self.random_pool} heads (floor-passing non-top heads that read B), from which the matched "
                f"draw can give {self.possible_text} distinct {len(self.top)}-head sets ({self.distinct_sets} among the draws); {POOL_RULE}")

    @property
    def top_name(self) -> str | None:
        return next(iter(self.sets), None)

    @property
    def random_names(self) -> list[str]:
        return list(self.sets)[1:]

    @property
    def top(self) -> list[Head]:
        return self.sets[self.top_name] if self.top_name else []


def select_heads(rank_rows: pd.DataFrame, *, min_span_mass: float, top: int, draws: int, seed: int) -> Selection:
    """Rank on ``rank_rows`` (the ranking half) and pick the top-``top`` heads and matched random sets.
    No sets (and a note saying why) when no head passes the floor or too few non-top heads do."""
    if draws < 1:
        raise AnalysisError("the causal check needs --random-draws ≥ 1")
    rank = ranking(rank_rows, min_span_mass)
    best = top_heads(rank, top)
    if not best:
        return Selection(min_span_mass, rank, {}, 0, f"no head reaches span mass {min_span_mass:g}")
    n = len(best)
    notes = [f"only {n} of {top} heads reach span mass {min_span_mass:g}"] if n < top else []
    unread = [h for h in best if not mean_mass(rank, [h]) > 0]
    candidates = random_candidates(rank, best)
    if unread:
        notes.append(f"top heads {heads_text(unread)} put no attention on B: no random sets matched on B mass")
    elif len(candidates) < n:
        notes.append(f"{len(candidates)} floor-passing non-top heads read B, for {n} top heads: no random sets "
                     "(heads below the floor are never drawn)")
    if unread or len(candidates) < n:
        return Selection(min_span_mass, rank, {}, 0, "; ".join(notes), random_pool=len(candidates))
    randoms, pool = matched_random_sets(rank, best, draws=draws, seed=seed)
    if pool < MATCH_POOL * n:
        notes.append(f"random heads drawn among all {pool} floor-passing non-top heads (fewer than {MATCH_POOL * n})")
    top_mass, random_mass = mean_mass(rank, best), float(np.mean([mean_mass(rank, h) for h in randoms]))
    match = match_holds(top_mass, random_mass)
    if not match:  # too few floor-passing heads read B as much as the top heads: the comparison is not mass-matched
        notes.append(f"weak match: random sets' mean B mass {random_mass:.3g} vs top {top_mass:.3g}")
    sets = {f"top-{n}": best, **{f"random-{n} #{i}": heads for i, heads in enumerate(randoms)}}
    return Selection(min_span_mass, rank, sets, pool, "; ".join(notes), match, len(candidates), possible_sets(rank, best))


# ----------------------------------------------------------------------------- causal check
def collect_causal(ctx: RunContext, sets: Mapping[str, Sequence[Head]], *, items: Sequence[Item], name: str = f"{NAME}_causal",
                   **header: Any) -> pd.DataFrame:
    """Boundary knockout in each head set on ``items`` (:func:`tested_items`), rows in ``{name}.jsonl``
    (``header``: more of its recorded configuration). Sets with the same heads share one condition;
    the knocked-out rows come once per set name (``selection``), the baseline rows once
    (``selection`` "baseline"). All rows carry ``half`` = "test"."""
    if not items:
        raise AnalysisError("heads causal check: no tool-correct T_wrong item in the test half")
    k = ctx.options.depth
    distinct = list(dict.fromkeys(tuple(sorted(heads)) for heads in sets.values()))
    conditions = {heads: f"heads_{i}" for i, heads in enumerate(distinct)}

    def knockouts(record: PromptRecord, job: Job) -> list[Knockout]:
        blocks = record.spans.get("boundary", [])
        return [Knockout.from_spans(condition, blocks, heads=heads) for heads, condition in conditions.items()]

    selections = {set_name: conditions[tuple(sorted(heads))] for set_name, heads in sets.items()}
    causal = replace(ctx, name=name, items=tuple(items), _score_cache={})
    jobs = [Job(item, "basm", k, ctx.fmt, ("baseline", *conditions.values())) for item in items]
    store = causal.store(k=k, test_groups=sorted({item.task_group for item in items}), selections=selections,
                         head_sets={condition: [list(h) for h in heads] for heads, condition in conditions.items()}, **header)
    run_jobs(causal, store, jobs, cached_scorer(causal, knockouts, margins=("margin",)))
    rows = load_results(store.path)
    named = pd.DataFrame(list(selections.items()), columns=["selection", "condition"])
    base = rows[rows["condition"] == "baseline"].assign(selection="baseline")
    return pd.concat([base, rows.merge(named, on="condition")], ignore_index=True).assign(half="test")


def record_margins(rows: pd.DataFrame, names: Sequence[str]) -> tuple[pd.DataFrame, int, int]:
    """Per record (index) the baseline margin and the margin under each set of ``names``, with
    task_group; and two counts of records left out: those whose prompt shows no boundary span
    (nothing to knock out) and those whose margin is undefined under some set (e.g. names that
    never diverge). Abstention-correct items never get here (:func:`tested_items`)."""
    rows = rows[rows["selection"].isin(["baseline", *names])]
    spanned = rows["boundary_size"] > 0
    no_boundary = rows.loc[~spanned, "record_id"].nunique()
    wide = rows[spanned].set_index(["record_id", "task_group", "selection"])["margin"].astype(float).unstack("selection")
    wide = wide.reindex(columns=["baseline", *names]).reset_index("task_group")
    defined = wide[["baseline", *names]].notna().all(axis=1)
    return wide[defined], int(no_boundary), int((~defined).sum())


def differences(wide: pd.DataFrame, selection: Selection) -> pd.DataFrame:
    """Per record: task_group and value = Δm(top) − mean over the random sets of Δm(random)
    (the baseline cancels: m(top knockout) − mean m(random knockout))."""
    return pd.DataFrame({"task_group": wide["task_group"], "value": wide[selection.top_name] - wide[selection.random_names].mean(axis=1)})


def estimate_row(selection: str, values: pd.Series, groups: pd.Series, *, seed: int, **extra: object) -> dict[str, object]:
    est = bootstrap_mean(values.to_numpy(float), groups.to_numpy(), seed=seed)
    return {"selection": selection, "value": est.value, "low": est.low, "high": est.high, "n": est.n_units, "n_items": len(values),
            "ci_note": no_ci_note(est.n_units), **extra}


def causal_table(rows: pd.DataFrame, selection: Selection, *, excluded: int, seed: int = 0) -> pd.DataFrame:
    """Δm per head set of ``selection``, the random sets pooled per record (``random-n``), and
    ``top-n − random-n`` per record; b_mass is each set's mean B mass on the ranking half (for the
    pooled row, the mean over the random sets); n_abstain_excluded the abstention-correct T_wrong
    items of the test half (``excluded``, not scored), n_no_boundary and n_undefined the records left
    out by :func:`record_margins`."""
    wide, no_boundary, undefined = record_margins(rows, list(selection.sets))
    groups, base = wide["task_group"], wide["baseline"]
    top, randoms = selection.top_name, selection.random_names
    mass = {name: mean_mass(selection.ranking, heads) for name, heads in selection.sets.items()}
    pooled = top.replace("top", "random")
    out = [estimate_row(name, wide[name] - base, groups, seed=seed, b_mass=mass[name], heads=heads_text(selection.sets[name]))
           for name in selection.sets]
    out.append(estimate_row(pooled, wide[randoms].mean(axis=1) - base, groups, seed=seed, b_mass=float(np.mean([mass[n] for n in randoms])),
                            heads=""))
    out.append(estimate_row(f"{top} − {pooled}", differences(wide, selection)["value"], groups, seed=seed, b_mass=float("nan"), heads=""))
    return pd.DataFrame(out).assign(n_abstain_excluded=excluded, n_no_boundary=no_boundary, n_undefined=undefined,
                                    random_pool=selection.random_pool, random_sets_possible=selection.possible_sets,
                                    random_sets_distinct=selection.distinct_sets)


FLOOR_COLUMNS = ["floor", "chosen", "eligible", "n_ranked", "n_top", "top", "top_b_mass", "random_b_mass", "match", "pool", "random_pool",
                 "random_sets_possible", "value", "low", "high", "n", "n_items", "n_abstain_excluded", "n_no_boundary", "n_undefined", "ci_note", "note"]


def floor_rows(causal_rows: pd.DataFrame, floor: float) -> pd.DataFrame:
    """The baseline rows and the rows of the sets selected at ``floor``, named as in its :class:`Selection`."""
    prefix = f"{floor!r}|"
    mine = causal_rows["selection"].str.startswith(prefix) | (causal_rows["selection"] == "baseline")
    return causal_rows[mine].assign(selection=causal_rows["selection"].str.removeprefix(prefix))


def floor_sets(selections: Iterable[Selection]) -> dict[str, list[Head]]:
    """Every floor's head sets, named ``"{floor!r}|{set}"`` (one causal collection for all of them)."""
    return {f"{s.floor!r}|{name}": heads for s in selections for name, heads in s.sets.items()}


def floor_table(selections: Sequence[Selection], causal_rows: pd.DataFrame | None, *, top: int, excluded: int, seed: int = 0,
                skipped: str = "") -> pd.DataFrame:
    """One row per floor (:data:`FLOOR_COLUMNS`): its ranking (n_ranked), top set, the mean B mass
    of the top and random sets and whether the match holds, and Δm(top) − Δm(matched random) on
    the test half (value, low, high over n task groups). ``causal_rows`` name sets
    ``"{floor!r}|{set}"`` (:func:`floor_sets`); None when the check did not run (``skipped`` says
    why; the Δm columns are then NaN). ``eligible``: the floor may be chosen (:func:`choose_floor`);
    ``chosen`` is left False for the caller to mark."""
    out = []
    for sel in selections:
        row = {"floor": sel.floor, "chosen": False, "n_ranked": int(sel.ranking["ranked"].sum()), "n_top": len(sel.top),
               "top": heads_text(sel.top), "top_b_mass": mean_mass(sel.ranking, sel.top), "pool": sel.pool, "random_pool": sel.random_pool,
               "random_sets_possible": sel.possible_sets, "note": sel.note or skipped,
               "random_b_mass": float(np.mean([mean_mass(sel.ranking, sel.sets[n]) for n in sel.random_names])) if sel.sets else np.nan,
               "match": "" if sel.match is None else "holds" if sel.match else "weak", "n_abstain_excluded": excluded}
        if sel.sets and causal_rows is not None:
            diff = causal_table(floor_rows(causal_rows, sel.floor), sel, excluded=excluded, seed=seed).iloc[-1]
            row.update({c: diff[c] for c in ("value", "low", "high", "n", "n_items", "n_no_boundary", "n_undefined", "ci_note")})
        out.append(row)
    table = pd.DataFrame(out).reindex(columns=FLOOR_COLUMNS)
    table = table.astype({c: "Int64" for c in ("n", "n_items", "n_no_boundary", "n_undefined")})  # NaN where the check did not run
    table["eligible"] = (table["n_top"] == top) & (table["match"] != "") & np.isfinite(table["value"].astype(float))
    return table


def choose_floor(table: pd.DataFrame) -> float | None:
    """The floor a :func:`floor_table` selects by the rule fixed before any result was seen
    (:data:`FLOOR_RULE`); None when no floor is eligible."""
    eligible = table[table["eligible"].astype(bool)]
    if not len(eligible):
        return None
    key = eligible.assign(matched=eligible["match"] == "holds", value=eligible["value"].astype(float))
    return float(key.sort_values(["matched", "value", "floor"], ascending=False, kind="stable").iloc[0]["floor"])


@dataclass(frozen=True)
class FloorChoice:
    """The span-mass floor of a run and where it comes from."""

    floor: float | None  # None: not chosen (``how`` says why); the ranking is then shown at --min-span-mass, untested
    source: str  # "train" | "given"
    table: pd.DataFrame  # one row per candidate floor on the train split (empty for "given")
    how: str  # one line: how the floor was chosen, on what, or why it was not

    @property
    def label(self) -> str:
        """Short, for captions: "0.05, chosen on the train split" / "0.05, given a priori" / "not chosen"."""
        if self.floor is None:
            return "not chosen"
        return f"{self.floor:g}, {'chosen on the train split' if self.source == 'train' else 'given a priori'}"


def floor_limit(ctx: RunContext) -> int:
    """Train items per bucket for choosing the floor: ``floor_limit``, else as many as the run has in its largest bucket."""
    a = ctx.options
    return a.floor_limit if a.floor_limit is not None else max(sum(i.bucket == b for i in ctx.items) for b in ("T_ok", "T_wrong"))


def floor_items(ctx: RunContext) -> tuple[Item, ...]:
    """The train items that choose the floor: T_ok and T_wrong of the train split (same domains and
    split kind as the run), outside every task group of the run's items; ``floor_limit`` per bucket
    (default: as many as the run has in its largest bucket), round-robin over task groups."""
    a = ctx.options
    run_groups = {item.task_group for item in ctx.items}
    try:
        train = ctx.dataset.select(buckets=("T_ok", "T_wrong"), domains=a.domains, split="train", split_kind=a.split_kind)
    except ValueError as error:
        raise AnalysisError(f"floor from train: {error}") from error
    train = [item for item in train if item.task_group not in run_groups]
    items = spread_limit(train, floor_limit(ctx))
    if not items:
        raise AnalysisError("floor from train: no T_ok/T_wrong train item outside this run's task groups "
                            f"(split {a.split!r}); run on --split eval, or fix the floor a priori with --floor-from given")
    return tuple(items)


def select_floor(ctx: RunContext, floors: Sequence[float]) -> FloorChoice:
    """The floor of this run (``floor_from``): given a priori, or chosen on the train split by
    :func:`choose_floor` over ``floors``: heads ranked on half of the train task groups at every
    floor, top-N vs matched random sets knocked out on the tool-correct T_wrong items of the other
    half. Train rows go to ``heads_floor.jsonl`` (attention) and ``heads_floor_causal.jsonl``
    (knockouts), resumable like the run's own."""
    a = ctx.options
    if a.floor_from == "given":
        return FloorChoice(a.min_span_mass, "given", pd.DataFrame(columns=FLOOR_COLUMNS),
                           f"floor {a.min_span_mass:g} given a priori (--floor-from given --min-span-mass), not chosen on data")
    if not a.causal:
        return FloorChoice(None, "train", pd.DataFrame(columns=FLOOR_COLUMNS),
                           "floor not chosen: --no-causal skips the train knockouts that choose it")
    items = floor_items(ctx)
    skipped: tuple = ()
    if a.too_long == "skip":  # as open_context does for the run's items; the skipped ones are recorded in the headers
        limit = getattr(ctx.session.model.config.get_text_config(), "max_position_embeddings", None)
        if limit is not None:
            part = partition_by_context(ctx.builder, items, max_tokens=limit, k=a.k_max, fmt=a.format)
            items, skipped = part.kept, part.skipped
    ctx.builder.warm(items)
    rank_groups, test_groups = split_groups(item.task_group for item in items)
    options = replace(a, split="train", item_ids=None, items=None, buckets=("T_ok", "T_wrong"), limit=floor_limit(ctx))
    floor_ctx = replace(ctx, name=FLOOR_NAME, options=options, items=tuple(i for i in items if i.task_group in rank_groups),
                        skipped=skipped, _score_cache={})
    described = (f"the train split outside this run's task groups: ranked on {len(rank_groups)} task groups "
                 f"({len(floor_ctx.items)} items), tested on {len(test_groups)}")
    rank_rows = options.collect(floor_ctx)  # the run's own attention rows, on the floor's train items
    if reason := unrankable(rank_rows):
        return FloorChoice(None, "train", pd.DataFrame(columns=FLOOR_COLUMNS), f"floor not chosen on {described}: {reason}")
    selections = [select_heads(rank_rows, min_span_mass=f, top=a.top_n, draws=a.random_draws, seed=a.seed) for f in floors]
    tested, excluded = tested_items(items, test_groups)
    sets = floor_sets(selections)
    causal_rows = None
    if tested and sets:
        causal_rows = collect_causal(floor_ctx, sets, items=tested, name=f"{FLOOR_NAME}_causal", excluded_abstain=list(excluded),
                                     floors=list(floors), top_n=a.top_n, random_draws=a.random_draws)
    skip = "" if causal_rows is not None else "no tool-correct T_wrong item in the train test half" if not tested else "no head sets"
    table = floor_table(selections, causal_rows, top=a.top_n, excluded=len(excluded), seed=a.seed, skipped=skip)
    floor = choose_floor(table)
    table["chosen"] = table["floor"] == floor
    n_tested = f"{len(tested)} tool-correct T_wrong items ({len(excluded)} abstention-correct excluded)"
    if floor is None:
        return FloorChoice(None, "train", table, f"floor not chosen on {described} ({n_tested}): no eligible floor ({FLOOR_RULE})")
    return FloorChoice(floor, "train", table, f"floor {floor:g} chosen on {described} ({n_tested}) by the rule: {FLOOR_RULE}")


# ----------------------------------------------------------------------------- planted heads (the organism only)
def planted_heads(model_path: str | Path) -> list[tuple[str, Head]] | None:
    """The bundled organism's planted heads, (target, (layer, head)), from its training
    configuration (``training_summary.json``; empty when it planted none); None for any other
    model, where nothing is known about which heads should be found."""
    if not is_organism(model_path):
        return None
    cfg = json.loads((ORGANISM_DIR / "training_summary.json").read_text())["train_config"]
    return [(target, (int(layer), int(head))) for target, layer, head in cfg["planted_heads"]] if cfg.get("planted_head_weight") else []


def planted_text(planted: Sequence[tuple[str, Head]], selection: Selection) -> str:
    """How many of the top heads are planted ones, and where each planted head ranks."""
    if not planted:
        return "planted heads: the organism's training configuration plants none"
    rank = selection.ranking
    ranked = top_heads(rank, len(rank))
    mass = rank.set_index(["layer", "head"])["span_mass"]
    hits = [h for h in selection.top if h in {head for _, head in planted}]
    found = (f"{len(hits)} of the top-{len(selection.top)} heads are planted ({heads_text(hits) or 'none'})" if selection.top
             else "no top set at this floor")
    places = [f"{target} {heads_text([head])} " + (f"ranked #{ranked.index(head) + 1} of {len(ranked)}" if head in ranked else
                                                   f"not ranked (B ∪ P mass {mass.loc[head]:.3g} < floor {selection.floor:g})")
              for target, head in planted]
    return f"planted heads (organism training configuration): {found}; " + "; ".join(places)


# ----------------------------------------------------------------------------- the analysis
@dataclass
class HeadsSummary:
    heatmap: np.ndarray  # [layer, head] log2 ratio on T_wrong, all items
    ranking: pd.DataFrame  # on the ranking half, at the run's floor
    causal: pd.DataFrame  # selection, value, low, high, n, n_items, b_mass, heads, n_abstain_excluded, n_undefined (test half)
    sensitivity: pd.DataFrame  # one row per candidate floor on this run: descriptive, never used to choose
    floor: FloorChoice  # the run's floor, and (from train) its selection table
    selection: Selection  # the head sets at the run's floor
    differences: pd.DataFrame | None  # per record: task_group, Δm(top) − Δm(random) (the claim); None without a causal result
    rows: pd.DataFrame  # the attention rows, with ``half``
    causal_rows: pd.DataFrame | None  # the knockout rows (test half), with ``selection`` and ``half``
    top: int
    seed: int
    note: str
    messages: list[str]  # what a reader must know about this run (floor, split, exclusions, skipped checks, planted heads)


def heads_note(ctx: RunContext, chosen: Selection, choice: FloorChoice) -> str:
    a = ctx.options
    return (f"{provenance(ctx)}\nper head: log2((ᾱ_B + ε)/(ᾱ_P + ε)), ᾱ averaged over items (ratio of means), ε = {EPSILON:g} · "
            f"ranked on half of the task groups (T_ok and tool-correct T_wrong items): heads with attention mass ≥ the floor on B ∪ P "
            f"in both buckets (floor {choice.label}) · causal, other half: Δ wrong-tool margin, boundary knockout in the top-{len(chosen.top)} "
            f"heads vs {a.random_draws} sets of floor-passing non-top heads drawn by B mass (each among the {chosen.pool} nearest), pooled")


SHOWN_RANKING = ["layer", "head", "log2_ok", "log2_wrong", "shift", "log2_wrong_abstain", "span_mass", "b_mass", "ranked"]


@register("heads", order=50)
@dataclass(kw_only=True)
class Heads(Analysis):
    """Figs. 8/9: per-head log2(boundary/procedure) attention, a split-half head ranking and its causal check."""

    min_depth: ClassVar[int] = 1

    buckets: tuple[str, ...] | None = option(("T_ok", "T_wrong"), "keep only these buckets", flag="--bucket",
                                             repeat=True, choices=("T_ok", "T_wrong", "T_repair"), group="items")
    k: int | None = depth_option()
    top_n: int = option(DEFAULT_TOP, "heads in the causal check", type=int, minimum=1)
    random_draws: int = option(DEFAULT_DRAWS, "random head sets", type=int, minimum=1)
    floor_from: str = option("train", "where the span-mass floor comes from: train (chosen on the train split's task groups outside "
                             "this run, by a rule fixed in advance) or given (--min-span-mass, fixed a priori)", choices=FLOOR_SOURCES)
    min_span_mass: float = option(MIN_SPAN_MASS, "span-mass floor: rank only heads whose deciding row puts this much attention on "
                                  "boundary ∪ procedure (with --floor-from train: one more candidate floor)", type=float, minimum=0.0,
                                  maximum=1.0, why="a share of a row's attention: above 1 no head is ranked")
    floor_limit: int | None = option(None, "--floor-from train: train items per bucket that choose the floor (default: as many as the "
                                     "run's largest bucket)", type=int, minimum=1, group="items")
    causal: bool = option(True, "run the knockout check of the ranking (--no-causal: skip it, and the floor's choice on train)",
                          type=bool, flag="--no-causal")

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        k = ctx.options.depth
        jobs = [Job(item, "basm", k, ctx.fmt, ("baseline",)) for item in ctx.items]
        store = ctx.store(k=k)
        run_jobs(ctx, store, jobs, cached_scorer(ctx, lambda record, job: (), per_head=True, margins=()))
        return load_results(store.path)


    # ----------------------------------------------------------------------------- split

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> HeadsSummary:
        """Map (all items); the floor (:func:`select_floor`); ranking (ranking half) at that floor;
        then (unless ``--no-causal``) the knockout check on the test half, at that floor and, for the
        descriptive sensitivity table, at every candidate floor."""
        a = ctx.options
        rows, rank_groups, test_groups = with_halves(rows)
        rank_rows = rows[rows["half"] == "rank"]
        if reason := unrankable(rank_rows):  # before the train rows are collected for a floor this run could not use
            raise AnalysisError(f"head ranking: {reason}")
        floors = sorted({*SENSITIVITY_FLOORS, a.min_span_mass})
        choice = select_floor(ctx, floors)
        floor = a.min_span_mass if choice.floor is None else choice.floor
        selections = {f: select_heads(rank_rows, min_span_mass=f, top=a.top_n, draws=a.random_draws, seed=a.seed) for f in floors}
        chosen = selections[floor]
        rank = chosen.ranking.iloc[0]
        unspanned = rank_rows.loc[(rank_rows["boundary_size"] == 0) | (rank_rows["procedure_size"] == 0), "item_id"].nunique()
        tested, excluded = tested_items(ctx.items, test_groups)
        messages = [choice.how + ("" if choice.floor is not None else f"; the ranking is shown at --min-span-mass {floor:g}, untested"),
                    f"ranking half: {len(rank_groups)} task groups ({rank_rows['item_id'].nunique()} items); ranked on {rank.n_ok} T_ok and "
                    f"{rank.n_wrong} tool-correct T_wrong items that show both spans; {rank.n_abstain} abstention-correct T_wrong items shown "
                    f"apart (log2_wrong_abstain), not ranked on; {unspanned} items show no boundary or no procedure span and are not used",
                    f"test half: {len(test_groups)} task groups; {len(tested)} tool-correct T_wrong items; {len(excluded)} abstention-correct "
                    f"T_wrong items excluded ({ABSTAIN_REASON})"]
        if chosen.note:
            messages.append(f"span mass ≥ {floor:g}: {chosen.note}")
        if chosen.sets:
            messages.append(f"random heads: {len(chosen.random_names)} draws ({chosen.distinct_sets} distinct sets) from a pool of "
                            f"{chosen.random_pool} floor-passing non-top heads that read B, {chosen.possible_text} possible "
                            f"{len(chosen.top)}-head sets; heads ranked just below the top N stay in the pool, as the test defines it"
                            + (f". Too small for the claim to be tested: {POOL_RULE}" if chosen.pool_too_small else ""))
        skipped = ("--no-causal" if not a.causal else "" if tested
                   else "no tool-correct T_wrong item in the test half (the split needs items of ≥ 2 task groups)")
        causal_rows, causal, diffs = None, pd.DataFrame(), None
        if skipped:
            messages.append(f"causal check not run: {skipped}")
        else:
            causal_rows = collect_causal(ctx, floor_sets(selections.values()), items=tested, excluded_abstain=list(excluded),
                                         floor=choice.floor, floor_from=a.floor_from)
            if choice.floor is None:
                messages.append("no causal result at a chosen floor: the sensitivity table below is descriptive only")
            elif chosen.sets:
                causal = causal_table(floor_rows(causal_rows, floor), chosen, excluded=len(excluded), seed=a.seed)
                diffs = differences(record_margins(floor_rows(causal_rows, floor), list(chosen.sets))[0], chosen)
                if no_boundary := int(causal["n_no_boundary"].iloc[0]):
                    messages.append(f"{no_boundary} tested records show no boundary span (nothing to knock out) and are left out")
                if undefined := int(causal["n_undefined"].iloc[0]):
                    messages.append(f"{undefined} tested records have an undefined margin under some head set and are left out")
        sensitivity = floor_table(list(selections.values()), causal_rows, top=a.top_n, excluded=len(excluded), seed=a.seed, skipped=skipped)
        sensitivity["chosen"] = sensitivity["floor"] == choice.floor
        planted = planted_heads(ctx.model_path)
        if planted is not None:
            messages.append(planted_text(planted, chosen))
        return HeadsSummary(log2_map(rows, "T_wrong"), chosen.ranking, causal, sensitivity, choice, chosen, diffs, rows, causal_rows,
                            a.top_n, a.seed, heads_note(ctx, chosen, choice), messages)

    def tables(self, summary: HeadsSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_ranking": summary.ranking, f"{NAME}_causal_summary": summary.causal,
                f"{NAME}_floor_selection": summary.floor.table, f"{NAME}_sensitivity": summary.sensitivity}

    def figures(self, summary: HeadsSummary, out_dir: Path) -> list[Path]:
        plots.style()
        k = self.resolved().depth
        title = f"BASM, {plots.bucket_label('T_wrong')}, k = {k}: log2(boundary / procedure attention)"
        paths = plots.save_figure(fig08_head_heatmap(summary.heatmap, summary.note, title), out_dir, FIGURES[0])
        shown = summary.causal[~summary.causal["selection"].str.contains("#| − ", regex=True)] if len(summary.causal) else summary.causal
        provenance_line = summary.note.split("\n", 1)[0]  # Fig. 9's own caption says what each panel rests on; the definitions: report.md
        paths += plots.save_figure(fig09_candidate_heads(summary.ranking, shown, summary.top, provenance_line, floor=summary.floor.label,
                                                         match_tolerance=MATCH_TOLERANCE), out_dir, FIGURES[1])
        return paths

    def section(self, ctx: RunContext, summary: HeadsSummary, figures: list[Path]) -> ReportSection:
        rank = summary.ranking.iloc[0]
        definitions = summary.note.split("\n", 1)[1]  # what Fig. 9's caption leaves to the report
        body = (f"Floor: {summary.floor.how}.\n\n{definitions}.\n\nHeads ranked on the ranking half ({rank.n_groups} task groups: {rank.n_ok} T_ok and "
                f"{rank.n_wrong} tool-correct T_wrong items; {rank.n_abstain} abstention-correct T_wrong items shown apart) by the "
                f"T_ok → T_wrong increase of log2(boundary/procedure attention) (BASM, k = {ctx.options.depth}; floor "
                f"{summary.floor.label}):\n\n{markdown_table(summary.ranking[SHOWN_RANKING].head(10))}")
        if len(summary.causal):
            matched = "matched on B mass" if summary.selection.match else "drawn by B mass, **weak match** (see b_mass)"
            body += ("\n\nCausal check on the test half's tool-correct T_wrong items (Δ wrong-tool margin, boundary knockout in these heads "
                     f"only; random sets of floor-passing heads {matched}; random_pool: the heads they are drawn from, random_sets_possible: "
                     f"the distinct sets the matched draw can give, counted up to {MIN_RANDOM_SETS}, random_sets_distinct: those drawn):"
                     f"\n\n{markdown_table(summary.causal)}")
        if len(summary.floor.table):
            body += ("\n\nChoice of the floor on the train split (Δm(top) − Δm(random) on the train test half; the chosen row was "
                     f"picked by the rule: {FLOOR_RULE}):\n\n{markdown_table(summary.floor.table)}")
        body += ("\n\nSensitivity to the floor on this run (descriptive: not used to choose the floor): value = Δm(top) − Δm(random), "
                 f"mean over test-half task groups with its 95% CI:\n\n{markdown_table(summary.sensitivity)}")
        body += "".join(f"\n\n- {m}" for m in summary.messages)
        comparisons = [Comparison(f"Fig. 9: Δm, boundary knockout in {r.selection} heads", float(r.value), None)
                       for r in summary.causal.itertuples() if "#" not in r.selection]
        return ReportSection(NAME, "Figs. 8/9 — boundary heads (`heads`)", figures, body, comparisons, summary)

    def claims(self, summary: HeadsSummary) -> list[Claim]:
        """Fig. 9's claim: the top-N heads' boundary knockout moves the T_wrong margin more than matched random heads'."""
        if summary.differences is None or not len(summary.differences):
            return []
        sel, d = summary.selection, summary.differences
        n = len(sel.top)
        top_mass, random_mass = summary.causal["b_mass"].iloc[0], summary.causal["b_mass"].iloc[-2]
        matched = "matched on B mass" if sel.match else f"drawn by B mass (weak match: mean B mass {random_mass:.3g} vs top {top_mass:.3g})"
        statement = (f"knocking out boundary attention in the top-{n} heads (ranked by the T_ok → T_wrong shift on half of the task groups; "
                     f"floor {summary.floor.label}) raises the T_wrong wrong-tool margin more than in {n} random floor-passing heads "
                     f"{matched}, on the other half")
        left_out = summary.causal.iloc[0]
        note = (f"{len(sel.random_names)} random sets ({sel.distinct_sets} distinct) drawn from a random-head pool of {sel.random_pool} heads "
                f"({sel.possible_text} possible {n}-head sets), mean per record; {left_out.n_abstain_excluded} abstention-correct T_wrong items "
                f"excluded; {left_out.n_no_boundary} records without a boundary span and {left_out.n_undefined} with an undefined margin left out")
        claim = effect_claim("heads", f"top-{n}>random-{n}", statement, d["value"].to_numpy(float), d["task_group"].to_numpy(),
                             sesoi=SESOI, seed=summary.seed, note=note)
        return [replace(claim, untestable=sel.pool_too_small)]

    def print_summary(self, summary: HeadsSummary) -> None:
        print(summary.ranking[SHOWN_RANKING].head(10).round(3).to_string(index=False))
        if len(summary.causal):
            print(summary.causal.round(3).to_string(index=False))
        if len(summary.floor.table):
            print("floor chosen on the train split:")
            print(summary.floor.table.round(3).to_string(index=False))
        print("sensitivity on this run (descriptive, not used to choose the floor):")
        print(summary.sensitivity.round(3).to_string(index=False))
        for message in summary.messages:
            print(message)


# --- Figs. 8 and 9, drawn by Heads.figures
def fig08_head_heatmap(log2_ratio: np.ndarray, note: str, title: str) -> plt.Figure:
    """log2_ratio: [layer, head] log2((α_B + ε) / (α_P + ε)), diverging colours centred at 0."""
    n_layers, n_heads = log2_ratio.shape
    fig, ax = plt.subplots(figsize=(max(4.5, 0.35 * n_heads + 2.5), max(3.2, 0.28 * n_layers + 1.5)))
    lim = float(np.nanmax(np.abs(log2_ratio))) if np.isfinite(log2_ratio).any() else 1.0
    image = ax.imshow(log2_ratio, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="log2(boundary / procedure attention)")
    ax.set_xticks(np.arange(n_heads))
    ax.set_yticks(np.arange(n_layers))
    ax.grid(False)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title("\n".join(textwrap.wrap(title, 38)))  # within the heatmap's width: clear of the colourbar's label
    plots.footnote(fig, note)
    return fig


def fig09_candidate_heads(ranking: pd.DataFrame, causal: pd.DataFrame | None, top: int, note: str, *, floor: str,
                          match_tolerance: float) -> plt.Figure:
    """ranking: layer, head, shift (log2 ratio T_wrong − T_ok), ranked (reads B ∪ P enough to be ranked),
    floor, n_ok, n_wrong, n_abstain, n_groups (the items it is computed on); ranked heads first by
    descending shift; only those are shown.
    causal: selection (top-N / random-N), value, low, high, n, n_items, b_mass, n_abstain_excluded
    (Δ wrong-tool margin).
    floor: how the floor was set, as the caption says it ("0.05, chosen on the train split").
    match_tolerance: the random sets are called "matched" only when their mean B mass lies within
    this factor of the top set's, computed from ``causal``'s b_mass (the plotted rows)."""
    has_causal = causal is not None and len(causal) > 0
    fig, axes = plt.subplots(1, 2 if has_causal else 1, figsize=(11 if has_causal else 6.5, 4.0), squeeze=False,
                             gridspec_kw={"width_ratios": [2, 1]} if has_causal else None)
    ax = axes[0][0]
    ranked = ranking[ranking["ranked"].astype(bool)]
    shown = ranked.head(max(top, 12))
    highlighted = min(top, len(shown))
    colors = [plots.CONDITION_COLORS["boundary"] if i < highlighted else (0.7, 0.7, 0.7) for i in range(len(shown))]
    ax.bar(np.arange(len(shown)), shown["shift"], color=colors)
    ax.set_xticks(np.arange(len(shown)), [f"L{r.layer}H{r.head}" for r in shown.itertuples()], rotation=60, ha="right", fontsize=8)
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.set_ylabel(f"Δ log2(α_B / α_P): {plots.bucket_label('T_wrong')} − {plots.bucket_label('T_ok')}")
    ax.set_title(f"heads ranked by the {plots.bucket_label('T_ok')} → {plots.bucket_label('T_wrong')} shift (top {highlighted} highlighted)")
    first = ranking.iloc[0]

    def groups(n: float) -> str:
        return f"{int(n)} task group{'' if int(n) == 1 else 's'}"

    lines = [f"left: ranking half, {groups(first['n_groups'])}: {int(first['n_ok'])} T_ok + {int(first['n_wrong'])} tool-correct "
             f"T_wrong items ({int(first['n_abstain'])} abstention-correct T_wrong items not ranked on); {len(ranked)} of {len(ranking)} heads "
             f"reach B ∪ P mass ≥ {float(first['floor']):g} in both buckets (floor {floor}); the first {len(shown)} shown"]
    if has_causal:
        ax2 = axes[0][1]
        x = np.arange(len(causal))
        ax2.bar(x, causal["value"], yerr=plots.ci_errors(causal), capsize=3,
                color=[plots.CONDITION_COLORS["boundary"] if s.startswith("top") else plots.CONDITION_COLORS["random"] for s in causal["selection"]])
        plots.annotate_no_ci(ax2, x, causal)
        ax2.set_xticks(x, causal["selection"])
        ax2.axhline(0.0, color="0.3", lw=0.8)
        ax2.set_ylabel("Δ wrong-tool margin (logits)")
        ax2.set_title("boundary knockout in these heads")
        tops, randoms = causal[causal["selection"].str.startswith("top")], causal[causal["selection"].str.startswith("random")]
        top_mass, random_mass = float(tops["b_mass"].iloc[0]), float(randoms["b_mass"].mean())
        ratio = random_mass / top_mass if top_mass > 0 else float("nan")
        matched = bool(np.isfinite(ratio) and 1 / match_tolerance <= ratio <= match_tolerance)
        excluded = int(causal["n_abstain_excluded"].iloc[0])
        lines.append(f"right: test half, {groups(causal['n'].max())}, {int(causal['n_items'].max())} tool-correct T_wrong items "
                     f"({excluded} abstention-correct excluded); random: sets of floor-passing non-top heads, pooled per record, "
                     + (f"matched on B mass (mean {random_mass:.3g} vs top {top_mass:.3g})" if matched else
                        f"NOT matched on B mass (mean {random_mass:.3g} vs top {top_mass:.3g}, outside ×{match_tolerance:g})"))
    plots.footnote(fig, "\n".join([*lines, note]))
    return fig
