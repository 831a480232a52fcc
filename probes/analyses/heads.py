"""``heads`` (Figs. 8 and 9): where the boundary signal appears, and whether those heads matter.

1. **Map.** For BASM at depth k, per (layer, head): log2((ᾱ_B + ε) / (ᾱ_P + ε)), with ᾱ Eq. 2's
   length-normalised attention from the decision row averaged over the items of a bucket
   (a ratio of means per head; never a mean of per-item ratios). Fig. 8 shows it on T_wrong, all items.
2. **Split.** The task groups are split in two halves (:func:`split_groups`): heads are ranked on
   the *ranking* half (T_ok and T_wrong items) and the ranking is tested on the T_wrong items of
   the *test* half, so no item both selects and tests a head.
3. **Ranking.** Heads ranked by the increase of that log-ratio from T_ok to T_wrong (Fig. 9),
   among the heads whose decision row reads the spans at all: mean attention mass on B ∪ P
   (ᾱ_B·|B| + ᾱ_P·|P|) of at least ``--min-span-mass`` in both buckets. A head that reads neither
   span has an ε-dominated ratio, whose shift can be large and means nothing (in an experimental
   organism a head that reads the request ranked first, +4.19, with ~0.01 of its attention on
   B ∪ P); such heads are listed after the ranked ones, ``ranked`` false.
4. **Causal check.** On the test half's T_wrong items, deciding-row → boundary attention is
   knocked out only in the top-N ranked heads, versus ``--random-draws`` sets of N random heads
   matched on B ∪ P span mass (:func:`matched_random_sets`, drawn once with ``--seed``, the same
   sets for every record). Δm = m_knockout − m_BASM for the wrong-tool margin; top − random per
   record; means with a 95% bootstrap CI over task groups. The head lists are part of the causal
   results' recorded configuration, so a changed ranking never mixes with old rows.
5. **Sensitivity.** The same ranking and top-vs-matched-random test for a range of span-mass
   floors (:data:`SENSITIVITY_FLOORS` and ``--min-span-mass``), all head sets knocked out in one
   causal collection (``heads_sensitivity.csv``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from probes.reporting import plots
from probes.analyses.base import Analysis, AnalysisError, Comparison, Job, ReportSection, RunContext, cached_scorer, option, provenance, run_jobs
from probes.reporting.markdown import markdown_table
from probes.scoring.score import EPSILON
from probes.scoring.stats import no_ci_note
from probes.engine.session import Knockout
from probes.analyses.ratios import head_alphas
from probes.reporting.results import load_results
from probes.scoring.stats import bootstrap_mean

NAME = "heads"
FIGURES = ("fig08_head_heatmap", "fig09_candidate_heads")
DEFAULT_TOP = 4
DEFAULT_DRAWS = 3
MIN_SPAN_MASS = 0.05  # attention mass on B ∪ P a head's decision row needs (both buckets) to be ranked
SENSITIVITY_FLOORS = (0.0, 0.01, 0.03, 0.05, 0.1, 0.2)  # --min-span-mass values of the sensitivity table
MATCH_POOL = 2  # a random head is drawn among the MATCH_POOL·N non-top heads nearest its top head in log span mass
MATCH_TOLERANCE = 2.0  # random sets' mean span mass within this factor of the top set's, else the match is flagged

Head = tuple[int, int]


def depth(options: Any) -> int:
    return options.k if options.k is not None else options.k_max


def collect_attention(analysis: RunContext) -> pd.DataFrame:
    k = depth(analysis.options)
    jobs = [Job(item, "basm", k, analysis.fmt, ("baseline",)) for item in analysis.items]
    store = analysis.store(k=k)
    run_jobs(analysis, store, jobs, cached_scorer(analysis, lambda record, job: (), per_head=True, margins=()))
    return load_results(store.path)


# ----------------------------------------------------------------------------- split
def split_groups(groups: Iterable[str]) -> tuple[set[str], set[str]]:
    """Task groups for ranking heads (even positions in sorted order) and for testing them (odd)."""
    ordered = sorted(set(groups))
    return set(ordered[0::2]), set(ordered[1::2])


def with_halves(rows: pd.DataFrame) -> tuple[pd.DataFrame, set[str], set[str]]:
    """``rows`` with a ``half`` column ("rank" / "test", by task group), and the two group sets."""
    rank_groups, test_groups = split_groups(rows["task_group"])
    return rows.assign(half=np.where(rows["task_group"].isin(rank_groups), "rank", "test")), rank_groups, test_groups


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


def span_mass_map(rows: pd.DataFrame, bucket: str) -> np.ndarray:
    """[layer, head] the decision row's attention mass on B ∪ P (α_B·|B| + α_P·|P|), mean over the items of ``bucket``."""
    sub = bucket_rows(rows, bucket)
    sizes = {span: sub[f"{span}_size"].to_numpy(float)[:, None, None] for span in ("boundary", "procedure")}  # [item, 1, 1]
    return (head_alphas(sub, "boundary") * sizes["boundary"] + head_alphas(sub, "procedure") * sizes["procedure"]).mean(0)


def ranking(rows: pd.DataFrame, min_span_mass: float = MIN_SPAN_MASS) -> pd.DataFrame:
    """layer, head, log2 ratio on T_ok and T_wrong, shift = T_wrong − T_ok, span_mass (the smaller bucket
    mean of the mass on B ∪ P) and ranked (span_mass ≥ ``min_span_mass``): the ranked heads by
    descending shift, then the others. Raises :class:`AnalysisError` when a bucket has no rows
    showing both spans or the buckets' per-head arrays differ in shape."""
    missing = [bucket for bucket in ("T_ok", "T_wrong") if not len(bucket_rows(rows, bucket))]
    if missing:
        raise AnalysisError(f"head ranking: no {' or '.join(missing)} rows with both spans (it needs T_ok and T_wrong items)")
    ok, wrong = log2_map(rows, "T_ok"), log2_map(rows, "T_wrong")
    if ok.shape != wrong.shape:
        raise AnalysisError(f"head ranking: per-head arrays of T_ok {ok.shape} and T_wrong {wrong.shape} differ (rows of two models?)")
    layers, heads = np.indices(ok.shape)
    span_mass = np.minimum(span_mass_map(rows, "T_ok"), span_mass_map(rows, "T_wrong"))
    table = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "log2_ok": ok.ravel(), "log2_wrong": wrong.ravel(),
                          "shift": (wrong - ok).ravel(), "span_mass": span_mass.ravel(), "ranked": (span_mass >= min_span_mass).ravel()})
    order = ["ranked", "shift", "layer", "head"]
    return table.sort_values(order, ascending=[False, False, True, True], kind="stable").reset_index(drop=True)


# ----------------------------------------------------------------------------- head sets
def top_heads(rank: pd.DataFrame, n: int) -> list[Head]:
    """The first ``n`` *ranked* heads (fewer when fewer reach the span-mass floor)."""
    return [(int(r.layer), int(r.head)) for r in rank[rank["ranked"]].head(n).itertuples()]


def matched_random_sets(rank: pd.DataFrame, top: Sequence[Head], *, draws: int, seed: int) -> tuple[list[list[Head]], int]:
    """``draws`` random head sets matched to ``top`` on B ∪ P span mass, and the pool width used.

    For each top head, one head is drawn (without replacement within a set) among the
    ``MATCH_POOL·N`` non-top heads nearest to it in log span mass, so every random set reads the
    spans about as much as the top set (an unmatched draw mostly picks heads that read neither).
    With fewer candidates the pool is all of them (the caller reports the width); with fewer
    than N it raises.
    """
    log_mass = {(int(r.layer), int(r.head)): np.log(r.span_mass) for r in rank.itertuples() if np.isfinite(r.span_mass) and r.span_mass > 0}
    missing = [h for h in top if h not in log_mass]
    if missing:
        raise AnalysisError(f"matched random heads: top heads {missing} have no positive span mass")
    candidates = sorted(set(log_mass) - set(top))
    if len(candidates) < len(top):
        raise AnalysisError(f"matched random heads: {len(candidates)} non-top heads for {len(top)} top heads; lower --top-n")
    pool = min(MATCH_POOL * len(top), len(candidates))
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(draws):
        chosen: list[Head] = []
        for head in top:
            free = [c for c in candidates if c not in chosen]
            nearest = sorted(free, key=lambda c: (abs(log_mass[c] - log_mass[head]), c))[:pool]
            chosen.append(nearest[int(rng.integers(len(nearest)))])
        sets.append(sorted(chosen))
    return sets, pool


def mean_span_mass(rank: pd.DataFrame, heads: Sequence[Head]) -> float:
    mass = rank.set_index(["layer", "head"])["span_mass"]
    return float(np.mean([mass.loc[h] for h in heads])) if heads else float("nan")


def heads_text(heads: Sequence[Head]) -> str:
    return " ".join(f"L{layer}H{head}" for layer, head in heads)


@dataclass(frozen=True)
class Selection:
    """The ranking at one span-mass floor and the head sets it selects for the causal check."""

    floor: float
    ranking: pd.DataFrame
    sets: dict[str, list[Head]]  # "top-n" first, then "random-n #i"
    pool: int  # non-top heads each random head was drawn among (0: no sets)
    note: str  # why the sets are smaller than asked, or absent ("" if neither)

    @property
    def top_name(self) -> str | None:
        return next(iter(self.sets), None)

    @property
    def random_names(self) -> list[str]:
        return list(self.sets)[1:]


def select_heads(rank_rows: pd.DataFrame, *, min_span_mass: float, top: int, draws: int, seed: int) -> Selection:
    """Rank on ``rank_rows`` (the ranking half) and pick the top-``top`` heads and matched random sets."""
    if draws < 1:
        raise AnalysisError("the causal check needs --random-draws ≥ 1")
    rank = ranking(rank_rows, min_span_mass)
    best = top_heads(rank, top)
    if not best:
        return Selection(min_span_mass, rank, {}, 0, f"no head reaches span mass {min_span_mass:g}")
    randoms, pool = matched_random_sets(rank, best, draws=draws, seed=seed)
    n = len(best)
    notes = [f"only {n} of {top} heads reach span mass {min_span_mass:g}"] if n < top else []
    if pool < MATCH_POOL * n:
        notes.append(f"random heads drawn among all {pool} non-top heads (fewer than {MATCH_POOL * n})")
    top_mass, random_mass = mean_span_mass(rank, best), float(np.mean([mean_span_mass(rank, h) for h in randoms]))
    if not 1 / MATCH_TOLERANCE <= random_mass / top_mass <= MATCH_TOLERANCE:
        # too few heads read B ∪ P as much as the top heads: the comparison is not mass-matched
        notes.append(f"weak match: random sets' mean B ∪ P mass {random_mass:.3g} vs top {top_mass:.3g}")
    sets = {f"top-{n}": best, **{f"random-{n} #{i}": heads for i, heads in enumerate(randoms)}}
    return Selection(min_span_mass, rank, sets, pool, "; ".join(notes))


# ----------------------------------------------------------------------------- causal check
def collect_causal(analysis: RunContext, sets: Mapping[str, Sequence[Head]], *, groups: Collection[str]) -> pd.DataFrame:
    """Boundary knockout in each head set on the T_wrong items of task ``groups``. Sets with the same
    heads share one condition; the knocked-out rows come once per set name (``selection``), the
    baseline rows once (``selection`` "baseline"). All rows carry ``half`` = "test"."""
    k = depth(analysis.options)
    distinct = list(dict.fromkeys(tuple(sorted(heads)) for heads in sets.values()))
    conditions = {heads: f"heads_{i}" for i, heads in enumerate(distinct)}

    def knockouts(record, job):
        blocks = record["spans"].get("boundary", [])
        return [Knockout.from_spans(name, blocks, heads=heads) for heads, name in conditions.items()]

    items = tuple(item for item in analysis.items if item.bucket == "T_wrong" and item.task_group in groups)
    if not items:
        raise AnalysisError("heads causal check: no T_wrong item in the test half")
    selections = {name: conditions[tuple(sorted(heads))] for name, heads in sets.items()}
    causal = replace(analysis, name=f"{NAME}_causal", items=items, _score_cache={})
    jobs = [Job(item, "basm", k, analysis.fmt, ("baseline", *conditions.values())) for item in items]
    store = causal.store(k=k, test_groups=sorted(groups), head_sets={name: [list(h) for h in heads] for heads, name in conditions.items()},
                         selections=selections)
    run_jobs(causal, store, jobs, cached_scorer(causal, knockouts, margins=("margin",)))
    rows = load_results(store.path)
    named = pd.DataFrame(list(selections.items()), columns=["selection", "condition"])
    base = rows[rows["condition"] == "baseline"].assign(selection="baseline")
    return pd.concat([base, rows.merge(named, on="condition")], ignore_index=True).assign(half="test")


def record_margins(rows: pd.DataFrame, names: Sequence[str]) -> tuple[pd.DataFrame, int]:
    """Per record (index) the baseline margin and the margin under each set of ``names``, with
    task_group; records with an undefined margin (e.g. abstention items) are dropped and counted."""
    rows = rows[(rows["boundary_size"] > 0) & rows["selection"].isin(["baseline", *names])]
    wide = rows.set_index(["record_id", "task_group", "selection"])["margin"].astype(float).unstack("selection")
    wide = wide.reindex(columns=["baseline", *names]).reset_index("task_group")
    defined = wide[["baseline", *names]].notna().all(axis=1)
    return wide[defined], int((~defined).sum())


def estimate_row(selection: str, values: pd.Series, groups: pd.Series, *, seed: int, **extra: object) -> dict[str, object]:
    est = bootstrap_mean(values.to_numpy(float), groups.to_numpy(), seed=seed)
    return {"selection": selection, "value": est.value, "low": est.low, "high": est.high, "n": est.n_units, "n_items": len(values),
            "ci_note": no_ci_note(est.n_units), **extra}


def causal_table(rows: pd.DataFrame, selection: Selection, *, seed: int = 0) -> pd.DataFrame:
    """Δm per head set of ``selection``, the random sets pooled per record (``random-n``), and
    ``top-n − random-n`` per record; span_mass is each set's mean B ∪ P mass (for the pooled row,
    the mean over the random sets), n_dropped the records without a defined margin."""
    wide, dropped = record_margins(rows, list(selection.sets))
    groups, base = wide["task_group"], wide["baseline"]
    top, randoms = selection.top_name, selection.random_names
    mass = {name: mean_span_mass(selection.ranking, heads) for name, heads in selection.sets.items()}
    pooled = top.replace("top", "random")
    out = [estimate_row(name, wide[name] - base, groups, seed=seed, span_mass=mass[name], heads=heads_text(selection.sets[name]))
           for name in selection.sets]
    random_mean = wide[randoms].mean(axis=1)
    out.append(estimate_row(pooled, random_mean - base, groups, seed=seed, span_mass=float(np.mean([mass[n] for n in randoms])), heads=""))
    out.append(estimate_row(f"{top} − {pooled}", wide[top] - random_mean, groups, seed=seed, span_mass=float("nan"), heads=""))
    return pd.DataFrame(out).assign(n_dropped=dropped)


SENSITIVITY_COLUMNS = ["floor", "chosen", "n_ranked", "top", "top_span_mass", "random_span_mass", "pool",
                       "value", "low", "high", "n", "n_items", "n_dropped", "ci_note", "note"]


def floor_rows(causal_rows: pd.DataFrame, floor: float) -> pd.DataFrame:
    """The baseline rows and the rows of the sets selected at ``floor``, named as in its :class:`Selection`."""
    prefix = f"{floor!r}|"
    mine = causal_rows["selection"].str.startswith(prefix) | (causal_rows["selection"] == "baseline")
    return causal_rows[mine].assign(selection=causal_rows["selection"].str.removeprefix(prefix))


def sensitivity_table(selections: Sequence[Selection], causal_rows: pd.DataFrame | None, *, chosen: float, seed: int = 0,
                      skipped: str = "") -> pd.DataFrame:
    """One row per floor: its ranking (n_ranked), top set, the mean span mass of the top and random
    sets, and Δm(top) − Δm(matched random) on the test half (value, low, high over n task groups).
    ``causal_rows`` name sets ``"{floor!r}|{set}"``; None when the check did not run (``skipped``
    says why; the Δm columns are then NaN)."""
    out = []
    for sel in selections:
        top = sel.sets[sel.top_name] if sel.top_name else []
        row = {"floor": sel.floor, "chosen": sel.floor == chosen, "n_ranked": int(sel.ranking["ranked"].sum()), "top": heads_text(top),
               "top_span_mass": mean_span_mass(sel.ranking, top), "pool": sel.pool, "note": sel.note or skipped,
               "random_span_mass": float(np.mean([mean_span_mass(sel.ranking, sel.sets[n]) for n in sel.random_names])) if top else np.nan}
        if top and causal_rows is not None:
            diff = causal_table(floor_rows(causal_rows, sel.floor), sel, seed=seed).iloc[-1]
            row.update({c: diff[c] for c in ("value", "low", "high", "n", "n_items", "n_dropped", "ci_note")})
        out.append(row)
    return pd.DataFrame(out).reindex(columns=SENSITIVITY_COLUMNS)


# ----------------------------------------------------------------------------- the analysis
@dataclass
class HeadsSummary:
    heatmap: np.ndarray  # [layer, head] log2 ratio on T_wrong, all items
    ranking: pd.DataFrame  # on the ranking half, at --min-span-mass
    causal: pd.DataFrame  # selection, value, low, high, n, n_items, span_mass, heads, n_dropped (test half)
    sensitivity: pd.DataFrame  # one row per span-mass floor
    rows: pd.DataFrame  # the attention rows, with ``half``
    causal_rows: pd.DataFrame | None  # the knockout rows (test half), with ``selection`` and ``half``
    top: int
    note: str
    messages: list[str]  # what a reader must know about this run (split, skipped checks, smaller sets)


def draw_figures(summary: HeadsSummary, out_dir: Path, k: int) -> list[Path]:
    plots.style()
    title = f"BASM, {plots.bucket_label('T_wrong')}, k = {k}: log2(boundary / procedure attention)"
    paths = plots.save_figure(plots.fig08_head_heatmap(summary.heatmap, summary.note, title), out_dir, FIGURES[0])
    shown = summary.causal[~summary.causal["selection"].str.contains("#| − ", regex=True)] if len(summary.causal) else summary.causal
    paths += plots.save_figure(plots.fig09_candidate_heads(summary.ranking, shown, summary.top, summary.note), out_dir, FIGURES[1])
    return paths


def compute(analysis: RunContext, rows: pd.DataFrame | None = None) -> HeadsSummary:
    """Map (all items), ranking (ranking half), then (unless ``--no-causal``) the knockout check of
    the ranking on the test half, at ``--min-span-mass`` and at every floor of the sensitivity table."""
    a = analysis.options
    rows, rank_groups, test_groups = with_halves(collect_attention(analysis) if rows is None else rows)
    rank_rows, test_wrong = rows[rows["half"] == "rank"], rows[(rows["half"] == "test") & (rows["bucket"] == "T_wrong")]
    floors = sorted({*SENSITIVITY_FLOORS, a.min_span_mass})
    selections = [select_heads(rank_rows, min_span_mass=f, top=a.top_n, draws=a.random_draws, seed=a.seed) for f in floors]
    chosen = selections[floors.index(a.min_span_mass)]
    messages = [f"ranking half: {len(rank_groups)} task groups ({rank_rows['item_id'].nunique()} items); "
                f"test half: {len(test_groups)} task groups ({test_wrong['item_id'].nunique()} T_wrong items)"]
    messages += [f"span mass ≥ {s.floor:g}: {s.note}" for s in selections if s.note]
    skipped = ("--no-causal" if not a.causal else "" if len(test_wrong)
               else "no T_wrong item in the test half (the split needs items of ≥ 2 task groups)")
    causal_rows, causal = None, pd.DataFrame()
    if skipped:
        messages.append(f"causal check not run: {skipped}")
    else:
        causal_rows = collect_causal(analysis, {f"{s.floor!r}|{name}": heads for s in selections for name, heads in s.sets.items()},
                                     groups=test_groups)
        if chosen.sets:
            causal = causal_table(floor_rows(causal_rows, chosen.floor), chosen, seed=a.seed)
    sensitivity = sensitivity_table(selections, causal_rows, chosen=a.min_span_mass, seed=a.seed, skipped=skipped)
    return HeadsSummary(log2_map(rows, "T_wrong"), chosen.ranking, causal, sensitivity, rows, causal_rows, a.top_n,
                        heads_note(analysis, chosen), messages)


def heads_note(analysis: RunContext, chosen: Selection) -> str:
    a = analysis.options
    n = len(chosen.sets[chosen.top_name]) if chosen.top_name else 0
    return (f"{provenance(analysis)}\nper head: log2((ᾱ_B + ε)/(ᾱ_P + ε)), ᾱ averaged over items (ratio of means), ε = {EPSILON:g} · "
            f"ranked on half of the task groups: heads with attention mass ≥ {a.min_span_mass:g} on B ∪ P in both buckets · "
            f"causal, other half: Δ wrong-tool margin, boundary knockout in the top-{n} heads vs {a.random_draws} random sets "
            f"matched on B ∪ P mass (each head drawn among the {chosen.pool} nearest non-top heads), pooled")


def section(analysis: RunContext, summary: HeadsSummary, paths: list[Path]) -> ReportSection:
    body = (f"Heads ranked on the ranking half by the T_ok → T_wrong increase of log2(boundary/procedure attention) "
            f"(BASM, k = {depth(analysis.options)}):\n\n{markdown_table(summary.ranking.head(10))}")
    if len(summary.causal):
        body += ("\n\nCausal check on the test half's T_wrong items (Δ wrong-tool margin, boundary knockout in these heads only; "
                 f"random sets matched on B ∪ P span mass):\n\n{markdown_table(summary.causal)}")
    body += ("\n\nSensitivity to the span-mass floor (`--min-span-mass`): value = Δm(top) − Δm(matched random), mean over "
             f"test-half task groups with its 95% CI:\n\n{markdown_table(summary.sensitivity)}")
    body += "".join(f"\n\n- {m}" for m in summary.messages)
    comparisons = [Comparison(f"Fig. 9: Δm, boundary knockout in {r.selection} heads", float(r.value), None)
                   for r in summary.causal.itertuples() if "#" not in r.selection]
    return ReportSection(NAME, "Figs. 8/9 — boundary heads (`heads`)", paths, body, comparisons, summary)


@dataclass(kw_only=True)
class Heads(Analysis):
    """Figs. 8/9: per-head log2(boundary/procedure) attention, a split-half head ranking and its causal check."""

    name: ClassVar[str] = NAME
    help: ClassVar[str] = "Figs. 8/9: per-head log2(boundary/procedure) attention, head ranking and its causal check."

    buckets: tuple[str, ...] | None = option(("T_ok", "T_wrong"), "keep only these buckets", flag="--bucket",
                                             repeat=True, choices=("T_ok", "T_wrong", "T_repair"), group="items")
    k: int | None = option(None, "retrieval depth (default: k_max)", type=int, minimum=0, group="probe")
    top_n: int = option(DEFAULT_TOP, "heads in the causal check", type=int, minimum=1)
    random_draws: int = option(DEFAULT_DRAWS, "random head sets", type=int, minimum=1)
    min_span_mass: float = option(MIN_SPAN_MASS, "rank only heads whose decision row puts this much attention on boundary ∪ procedure",
                                  type=float, minimum=0.0)
    causal: bool = option(True, "run the knockout check of the ranking (--no-causal: skip it)", type=bool, flag="--no-causal")

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        return collect_attention(ctx)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> HeadsSummary:
        return compute(ctx, rows)

    def tables(self, summary: HeadsSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_ranking": summary.ranking, f"{NAME}_causal_summary": summary.causal, f"{NAME}_sensitivity": summary.sensitivity}

    def figures(self, summary: HeadsSummary, out_dir: Path) -> list[Path]:
        return draw_figures(summary, out_dir, depth(self.resolved()))

    def section(self, ctx: RunContext, summary: HeadsSummary, figures: list[Path]) -> ReportSection:
        return section(ctx, summary, figures)

    def print_summary(self, summary: HeadsSummary) -> None:
        print(summary.ranking.head(10).round(3).to_string(index=False))
        if len(summary.causal):
            print(summary.causal.round(3).to_string(index=False))
        print(summary.sensitivity.round(3).to_string(index=False))
        for message in summary.messages:
            print(message)
