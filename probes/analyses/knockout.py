"""``knockout`` (Figs. 3c/d, 6 and 7): same-prompt knockout of decision → boundary attention.

The prompt tokens stay fixed (BASM at depth k); only attention from the deciding rows to a span is
removed (its scores set to −inf before the softmax, so each row renormalises over the rest), in
every layer and head unless a layer window is given.

Which rows are blocked (``--knockout-rows``, recorded in the rows and the results header):

- ``path`` (default): every query row from the row that opens the tool call to the decision row
  (the forced prefix ``<tool_call>``, ``{"``, ``name``, ``":`` … feeds the decision row), and every
  row of the scored candidate names, so that where a wrong and the correct name share a prefix
  (``get`` …) the rows of that prefix, which predict the deciding token, are blocked too;
- ``endpoints``: the open row and the decision row only, no candidate rows (the measurement of
  earlier versions, kept for comparison; it lets the forced-prefix rows read B freely).

Conditions, all evaluated in one cached-branching engine call per record:

- ``boundary``: the boundary span B; ``procedure``: the procedure span P;
- the controls, each drawn ``--random-draws`` times (seeded by (seed, record, draw), so draws do not
  depend on run order) from the **control pool** (``--random-pool``, default ``neutral``: the tokens
  of the memory block on lines that hold no B or P token, are no label of a B or P section and name
  no tool of the dataset, :func:`neutral_pool`; the pool is where a boundary-like effect *could*
  arise, skill headers and tool-free goal text, but not where the margin trivially moves: the
  procedure the model imitates and the lines that name the tempting tool). Which controls run is
  ``--controls``:

  - ``neutral`` → ``random_i``, pooled as ``random``: |B| positions of the pool in B's block
    lengths (split where no run fits); where the pool holds fewer than |B| positions, all of them
    (``control_coverage`` < 1 says so);
  - ``count`` → ``bsub_i`` / ``psub_i``, pooled as ``count_boundary`` / ``count_pool``: the
    **count-matched** pair, n = min(|B|, |pool|) random positions of B against n random positions
    of the pool (scattered on both sides, the same n per record);
  - ``mass`` → ``mass_i``, pooled as ``mass_matched``: pool positions visited in a random order and
    kept while each brings the attention mass they take from the deciding row closer to B's
    (:func:`draw_mass_matched`); a draw within ``--mass-tolerance`` of B's mass is ``control_matched``.
    Where the whole pool holds less mass than B, no draw can match and the record leaves the
    mass-matched comparison, counted;
  - ``anywhere`` → ``anywhere_i``, pooled as ``random_anywhere``: the earlier control, B's block
    lengths anywhere before the first query row except B and token 0 (it can hit the request and
    the tool schemas);
- ``boundary@La-b`` (with ``--layer-window W``): B knocked out only in layers a..b.

**Dose.** Every row records ``knockout_mass``: the attention mass its positions hold at the
deciding row of the unmodified prompt (Σ over the positions of the softmax probability, mean over
layers and heads; 0 in heads and layers a knockout does not touch), from one extra small engine
call per record (:func:`deciding_attention`). B's own mass is ``boundary_mass``. Δm against the
mass removed is the dose–response: per task group, the least-squares slope through the origin of
Δm on mass for B's family (``boundary``, ``count_boundary``) and for the pool's (``random``,
``count_pool``, ``mass_matched``); the claim "B removes more margin per unit of attention than the
pool" is their per-group difference.

With ``--priming`` the same conditions also run on the lexical-priming controls (``basm-anon``:
tool names in the boundary items replaced by placeholders; ``basm-names``: each boundary item
reduced to a neutral sentence naming its tools), so a boundary effect carried by the tool names
is told apart from one carried by the boundary semantics. Every summary row names its ``config``;
the figures, claims and the gap recovery are BASM's.

Reported: the signed shift Δm = m_knockout − m_baseline for the tool-choice margin (Eq. 1 on the
tools), broad (tool-vs-control) and correct-tool margins and the call log-odds, split as
T_wrong–wrong, T_wrong–correct, T_ok–correct (Fig. 7); every control's own shift against 0 (a
control is called neutral only where its CI contains 0, and claimed neutral only by a TOST
equivalence test against ±``--sesoi``); the paired comparisons of B against each control with
their claims (:meth:`KnockoutAnalysis.claims`); and the share of the Proc. Skill gap that the
boundary knockout recovers on T_wrong, mean Δm_boundary / (mean m_Proc − mean m_BASM), with a 95%
CI from resampling task groups jointly for numerator and denominator. Per measure, every knockout
and control is compared on the same records (those where the measure is defined under every
condition); records left out are counted with their reason. Records whose boundary span is empty
(the relevance gate γ exposed no boundary field) are excluded and counted.

The shifts and the gap recovery are also written split by whether the item's defining skill is
among the k skills shown (``knockout_shown.csv``, ``knockout_gap_recovery_shown.csv``: ``shown`` =
all / shown / not shown, the paper's setting being "shown"), and the boundary claims are repeated
on the shown records (family "knockout (defining skill shown)").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probes.analyses import register
from probes.analyses.base import Analysis, Comparison, ReportSection
from probes.analyses.jobs import Job, cached_scorer, run_jobs
from probes.analyses.option_system import depth_option, option
from probes.analyses.run_context import RunContext, provenance
from probes.data.configs import PRIMING_CONFIGS
from probes.engine.session import ConditionResult, Knockout, EngineSession, span_positions
from probes.prompts.record import PromptRecord
from probes.reporting import plots
from probes.reporting.markdown import cell, markdown_table
from probes.reporting.results import load_results
from probes.scoring.claims import Claim, absence_claim, effect_claim
from probes.scoring.controls import (RANDOM_POOLS, anywhere_control, block_lengths, control_pool, draw_mass_matched, draw_positions,
                                     draw_span, pool_text, tool_names_of)
from probes.scoring.margins import candidates_from_record
from probes.scoring.score import deciding_depth, record_rng
from probes.scoring.selectivity import SELECTIVITY, selectivity_table
from probes.scoring.stats import SHOWN_FLAG, SHOWN_GROUPS, bootstrap_ratio, by_shown, cluster_bootstrap, no_ci_note, summarise

NAME = "knockout"
FIGURES = ("fig06_knockout_controls", "fig07_knockout_selectivity")
MEASURES = ("margin", "broad_margin", "correct_margin", "call_logodds")
DEFAULT_DRAWS = 5
DEFAULT_SESOI = 0.25  # logits: an odds change of 1.28×, fixed before any run; the equivalence bound of "neutral"
DEFAULT_MASS_TOLERANCE = 0.1
KNOCKOUT_ROWS = ("path", "endpoints")
CONTROLS = ("neutral", "count", "mass", "anywhere")
# draw condition prefix -> (the --controls family that draws it, the knockout its draws pool into)
DRAWS = {"random_": ("neutral", "random"), "bsub_": ("count", "count_boundary"), "psub_": ("count", "count_pool"),
         "mass_": ("mass", "mass_matched"), "anywhere_": ("anywhere", "random_anywhere")}
B_FAMILY = ("boundary", "count_boundary")  # knockouts of B's positions (dose–response)
POOL_FAMILY = ("random", "count_pool", "mass_matched")  # knockouts of the control pool's positions
RANDOM_CONTROLS = ("random", "count_pool", "mass_matched", "random_anywhere")  # expected not to move the margin
CLAIM_BUCKET, CLAIM_MEASURE = "T_wrong", "margin"
SHOWN_FAMILY = f"{NAME} (defining skill shown)"


# ----------------------------------------------------------------------------- dose
def deciding_run(session: EngineSession, record: PromptRecord) -> tuple[ConditionResult, int, int]:
    """(the unmodified condition, the deciding row, its depth into the correct name) from one engine
    call whose last query row is the deciding row (the row predicting the first token where the correct
    name parts from a wrong one; the decision row for abstention items), its full softmax row recorded
    (the correct name's shared prefix appended where the deciding row lies inside it). It branches where
    the record's scoring call does (its first query row), so that call takes the whole prompt prefix
    from the session's prefix cache."""
    candidates = [c for c in candidates_from_record(record) if c.role != "other"]
    key, depth = deciding_depth(candidates)
    ids = list(record.input_ids)
    if depth:
        ids += list(next(c for c in candidates if c.key == key).token_ids[:depth])
    row = int(record.decision_index) + depth
    query = sorted({min(record.query_rows), row})
    return session.run(ids, query, record_rows=True).conditions[0], row, depth


def deciding_attention(session: EngineSession, record: PromptRecord) -> np.ndarray:
    """[layer, head, n_tokens] the unmodified softmax row of the deciding row (:func:`deciding_run`)
    over the prompt's tokens."""
    return deciding_run(session, record)[0].rows[:, :, -1, : record.n_tokens].float().numpy()


def removed_mass(attention: np.ndarray, knockout: Knockout) -> float:
    """Attention mass the knockout's key positions hold at the deciding row, mean over every layer and
    head (0 in the layers and heads it leaves alone)."""
    if not knockout.key_positions:
        return 0.0
    layers, heads = attention.shape[:2]
    active = knockout.active(layers, heads).numpy()
    return float((attention[:, :, list(knockout.key_positions)].sum(-1) * active).mean())


def layer_windows(n_layers: int, width: int) -> list[tuple[int, ...]]:
    return [tuple(range(a, min(a + width, n_layers))) for a in range(0, n_layers, width)]


def draw_prefixes(controls: Sequence[str]) -> list[str]:
    """The draw condition prefixes of the chosen ``--controls``, in a fixed order."""
    return [prefix for prefix, (family, _) in DRAWS.items() if family in controls]


def condition_names(draws: int, windows: Sequence[Sequence[int]], controls: Sequence[str] = CONTROLS) -> tuple[str, ...]:
    prefixes = draw_prefixes(controls)
    return ("baseline", "boundary", *(f"{prefix}{i}" for i in range(draws) for prefix in prefixes), "procedure",
            *(f"boundary@L{w[0]}-{w[-1]}" for w in windows))


def blocked_rows(record: PromptRecord, policy: str) -> dict[str, Any]:
    """Knockout keyword arguments of a ``--knockout-rows`` policy."""
    if policy == "path":
        return {"rows": None, "continuation": True}
    if policy == "endpoints":
        rows = [r for r in (record.open_index, record.decision_index) if r is not None]
        return {"rows": rows, "continuation": False}
    raise ValueError(f"--knockout-rows must be one of {KNOCKOUT_ROWS}, got {policy!r}")


def knocked_configs(priming: bool) -> tuple[str, ...]:
    """The configurations whose records get every knockout (the Proc. Skill reference gets none)."""
    return ("basm", *PRIMING_CONFIGS) if priming else ("basm",)


@dataclass
class RecordDraws:
    """The controls drawn for one record: per condition its positions and how it was drawn."""

    attention: np.ndarray  # [layer, head, n_tokens] at the deciding row, unmodified prompt
    boundary_mass: float
    pool_size: int
    info: dict[str, dict[str, Any]] = field(default_factory=dict)  # condition -> control_* row fields


def draw_controls(record: PromptRecord, attention: np.ndarray, options: Any, tool_names: Iterable[str]) -> tuple[list[tuple[str, list[int]]], RecordDraws]:
    """Every control draw of one record as (condition name, positions), and how each was drawn."""
    blocks = record.spans.get("boundary", [])
    b_positions = span_positions(blocks)
    weights = attention.mean(axis=(0, 1))
    free = control_pool(record, options.random_pool, tool_names)
    procedure = set(span_positions(record.spans.get("procedure", [])))
    target = float(weights[b_positions].sum()) if b_positions else 0.0
    n_count = min(len(b_positions), int(free.sum()))
    state = RecordDraws(attention, target, int(free.sum()))
    out: list[tuple[str, list[int]]] = []
    for i in range(options.random_draws):
        for prefix in draw_prefixes(options.controls):
            name = f"{prefix}{i}"
            rng = record_rng(options.seed, record.record_id, name)  # the same salt as earlier versions: same draws
            info: dict[str, Any] = {}
            if prefix in ("random_", "anywhere_"):
                positions, pieces = (draw_span(free, block_lengths(blocks), rng) if prefix == "random_"
                                     else anywhere_control(record, blocks, rng))
                info.update(control_pieces=pieces, control_split=len(pieces) > len(blocks),
                            control_coverage=len(positions) / len(b_positions) if b_positions else float("nan"))
            elif prefix == "bsub_":
                positions = draw_positions(np.isin(np.arange(record.n_tokens), b_positions), n_count, rng)
            elif prefix == "psub_":
                positions = draw_positions(free, n_count, rng)
            else:
                positions, _, matched = draw_mass_matched(free, weights, target, rng, options.mass_tolerance)
                info["control_matched"] = matched
            if prefix in ("bsub_", "psub_"):
                info["control_n"] = n_count
            info["control_procedure_share"] = len(procedure.intersection(positions)) / len(positions) if positions else float("nan")
            state.info[name] = info
            out.append((name, positions))
    return out, state


def record_knockouts(record: PromptRecord, attention: np.ndarray, options: Any, tool_names: Iterable[str],
                     windows: Sequence[Sequence[int]]) -> tuple[list[Knockout], RecordDraws]:
    """Every knockout of one knocked record (boundary, the control draws, procedure, the layer windows)
    and how its controls were drawn; ``attention``: its deciding row (:func:`deciding_attention`)."""
    blocks = record.spans.get("boundary", [])
    rows = blocked_rows(record, options.knockout_rows)
    draws, state = draw_controls(record, attention, options, tool_names)
    out = [Knockout.from_spans("boundary", blocks, **rows)]
    out += [Knockout(name, tuple(positions), **rows) for name, positions in draws]
    out.append(Knockout.from_spans("procedure", record.spans.get("procedure", []), **rows))
    out += [Knockout.from_spans(f"boundary@L{w[0]}-{w[-1]}", blocks, layers=w, **rows) for w in windows]
    return out, state


def knockout_scorer(ctx: RunContext, windows: Sequence[Sequence[int]]):
    """The scorer of a BASM record under every knockout. Each row also says how much attention its
    knockout removes at the deciding row (``knockout_mass``, B's own: ``boundary_mass``) and, for a
    control draw, how it was drawn (``control_*``)."""
    a = ctx.options
    tool_names = tool_names_of(ctx.dataset)
    current: dict[str, Any] = {}  # the record being scored: its draws and its knockouts by name

    def conditions(record: PromptRecord, job: Job) -> list[Knockout]:
        current.clear()
        if job.config not in knocked_configs(a.priming):
            return []
        out, state = record_knockouts(record, deciding_attention(ctx.session, record), a, tool_names, windows)
        current.update(state=state, knockouts={k.name: k for k in out})
        return out

    score = cached_scorer(ctx, conditions, margins=MEASURES)

    def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
        rows = score(record, job)
        if not current:
            return rows
        state: RecordDraws = current["state"]
        for row in rows:
            knockout = current["knockouts"].get(row["condition"])
            row.update(knockout_mass=removed_mass(state.attention, knockout) if knockout else 0.0,
                       boundary_mass=state.boundary_mass, control_pool_size=state.pool_size,
                       **state.info.get(row["condition"], {}))
        return rows

    return scorer


# ----------------------------------------------------------------------------- summary
@dataclass
class KnockoutSummary:
    deltas: pd.DataFrame  # config, bucket, knockout, measure, value, low, high, n, n_items, n_nan, note
    recovery: pd.DataFrame  # measure, value, low, high, n (share of the Proc.–BASM gap, T_wrong)
    windows: pd.DataFrame  # window, value, low, high, n (Δ wrong-tool margin on T_wrong)
    per_record: pd.DataFrame  # config, item_id, bucket, task_group, knockout, measure, delta, mass (draws averaged)
    points: pd.DataFrame  # one row per (record, condition, measure): knockout, family, delta, mass (dose–response)
    dropped: pd.DataFrame  # measure, bucket, reason, n_records: records left out of a measure's comparison
    controls: pd.DataFrame  # per control: how it was drawn, its mass against B's, and whether its CI contains 0
    dose: pd.DataFrame  # config, bucket, measure, family, slope, low, high, n (slopes of Δm on mass removed)
    claims: list[Claim]
    n_excluded: int  # knocked records without a boundary span
    note: str
    pool: str = "neutral"
    sesoi: float = DEFAULT_SESOI
    shown: pd.DataFrame | None = None  # shown (all | shown | not shown), then the columns of deltas
    recovery_shown: pd.DataFrame | None = None  # shown, then the columns of recovery


def control_of(condition: str) -> str:
    """The reported knockout of a condition: random draws pool into their control."""
    for prefix, (_, control) in DRAWS.items():
        if condition.startswith(prefix):
            return control
    return condition


def family_of(knockout: str) -> str:
    return "B" if knockout in B_FAMILY else "pool" if knockout in POOL_FAMILY else ""


def deltas_per_record(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, int]:
    """Δm per (knocked record, condition, measure) and per (record, knockout, measure) with random
    draws averaged into their control, on paired records: per measure only the records where it is
    finite under the baseline and every knockout. Returns (per-record deltas, per-condition points,
    records left out per measure with the reason, records without B). Every configuration but the
    Proc. Skill reference is a knocked one."""
    basm = rows[rows["config"] != "proc"]
    excluded = basm[(basm["condition"] == "baseline") & (basm["boundary_size"] == 0)]["record_id"]
    basm = basm[~basm["record_id"].isin(set(excluded))]
    if "knockout_mass" not in basm:
        basm = basm.assign(knockout_mass=np.nan)
    out, dropped = [], []
    for measure in MEASURES:
        wide = basm.pivot_table(index="record_id", columns="condition", values=measure, aggfunc="first", dropna=False)
        finite = np.isfinite(wide.to_numpy(float)).all(axis=1)
        keep = set(wide.index[finite])
        lost = basm[(basm["condition"] == "baseline") & ~basm["record_id"].isin(keep)]
        for (config, bucket, abstain), sub in lost.groupby(["config", "bucket", lost["correct_is_abstain"].astype(bool)], sort=False):
            reason = "correct action is abstention (no correct tool)" if abstain else "undefined under some condition (names never diverge)"
            dropped.append({"config": config, "measure": measure, "bucket": bucket, "reason": reason, "n_records": len(sub)})
        sub = basm[basm["record_id"].isin(keep)]
        base = sub[sub["condition"] == "baseline"].set_index("record_id")[measure]
        knocked = sub[sub["condition"] != "baseline"]
        delta = knocked[measure].to_numpy(float) - base.loc[knocked["record_id"]].to_numpy(float)
        frame = knocked[["record_id", "config", "item_id", "bucket", "task_group", SHOWN_FLAG, "condition"]].assign(
            measure=measure, delta=delta, mass=knocked["knockout_mass"].to_numpy(float))
        out.append(frame.assign(knockout=frame["condition"].map(control_of)))
    points = pd.concat(out, ignore_index=True)
    points["family"] = points["knockout"].map(family_of)
    # one value per record for each random control: the mean over its draws
    per = points.groupby(["record_id", "config", "item_id", "bucket", "task_group", SHOWN_FLAG, "knockout", "measure"], as_index=False,
                         sort=False)[["delta", "mass"]].mean()
    return per, points, pd.DataFrame(dropped, columns=["config", "measure", "bucket", "reason", "n_records"]), int(len(excluded))


CONTROL_COLUMNS = ["control", "n_records", "n_draws", "mean_coverage", "n_short", "n_split", "mean_procedure_share",
                   "mass_ratio", "n_mass_matched", "value", "low", "high", "ci_contains_0"]


def control_draws(rows: pd.DataFrame, deltas: pd.DataFrame) -> pd.DataFrame:
    """How the random controls were drawn (coverage of |B|, runs split, share on P), the attention
    mass they removed against B's (median over records of mass_control / mass_B), how many records
    have every mass-matched draw inside the band, and each control's own Δm (BASM, T_wrong, margin)
    with whether its CI contains 0."""
    rows = rows.assign(control=rows["condition"].map(control_of))
    draws = rows[rows["control"].isin([c for _, c in DRAWS.values()]) & (rows["config"] == "basm")]
    out = []
    for control, sub in draws.groupby("control", sort=False):
        def column(name: str, default: Any = np.nan) -> pd.Series:  # fields a control's draws do not write are absent
            return sub[name] if name in sub else pd.Series(default, index=sub.index)

        per_record = sub.assign(mass=column("knockout_mass"), b_mass=column("boundary_mass"), matched=column("control_matched", False)
                                ).groupby("record_id")
        ratio = per_record["mass"].mean() / per_record["b_mass"].first()
        shift = deltas[(deltas["config"] == "basm") & (deltas["bucket"] == CLAIM_BUCKET) & (deltas["measure"] == CLAIM_MEASURE)
                       & (deltas["knockout"] == control)]
        value, low, high = (float(shift[c].iloc[0]) for c in ("value", "low", "high")) if len(shift) else (np.nan,) * 3
        coverage = column("control_coverage").astype(float)
        out.append({"control": control, "n_records": sub["record_id"].nunique(), "n_draws": len(sub),
                    "mean_coverage": float(coverage.mean()), "n_short": int((coverage < 1).sum()),
                    "n_split": int(column("control_split", False).fillna(False).astype(bool).sum()),
                    "mean_procedure_share": float(column("control_procedure_share").astype(float).mean()),
                    "mass_ratio": float(ratio.median()),
                    "n_mass_matched": int(per_record["matched"].all().sum()) if control == "mass_matched" else np.nan,
                    "value": value, "low": low, "high": high,
                    "ci_contains_0": bool(low <= 0 <= high) if np.isfinite(low) and np.isfinite(high) else np.nan})
    return pd.DataFrame(out, columns=CONTROL_COLUMNS)


def through_origin(mass: np.ndarray, delta: np.ndarray) -> float:
    """Least-squares slope of Δm on mass through the origin (no knockout, no shift)."""
    ok = np.isfinite(mass) & np.isfinite(delta)
    denominator = float(np.sum(mass[ok] ** 2))
    return float(np.sum(mass[ok] * delta[ok]) / denominator) if denominator > 0 else np.nan


def dose_table(points: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per (config, bucket, measure, family): the slope of Δm on the mass removed (logits per unit of
    deciding-row attention), every draw a point, with a 95% CI resampling task groups."""
    out = []
    for (config, bucket, measure, family), sub in points[points["family"] != ""].groupby(["config", "bucket", "measure", "family"], sort=False):
        mass, delta, groups = sub["mass"].to_numpy(float), sub["delta"].to_numpy(float), sub["task_group"].to_numpy()
        low, high = cluster_bootstrap(lambda idx: through_origin(mass[idx], delta[idx]), groups, seed=seed)
        n = len(set(groups.tolist()))
        out.append({"config": config, "bucket": bucket, "measure": measure, "family": family, "slope": through_origin(mass, delta),
                    "low": low, "high": high, "n": n, "n_points": len(sub), "mean_mass": float(np.nanmean(mass)), "note": no_ci_note(n)})
    return pd.DataFrame(out, columns=["config", "bucket", "measure", "family", "slope", "low", "high", "n", "n_points", "mean_mass", "note"])


def slope_differences(points: pd.DataFrame) -> pd.Series:
    """Per task group: slope(B's family) − slope(the pool's family) (``points`` of one config, bucket, measure)."""
    out = {}
    for group, sub in points.groupby("task_group", sort=False):
        b, pool = sub[sub["family"] == "B"], sub[sub["family"] == "pool"]
        out[group] = through_origin(b["mass"].to_numpy(float), b["delta"].to_numpy(float)) - through_origin(
            pool["mass"].to_numpy(float), pool["delta"].to_numpy(float))
    return pd.Series(out, dtype=float)


def basm_wide(per: pd.DataFrame, bucket: str, measure: str) -> pd.DataFrame:
    """BASM's per-record Δm of one bucket and measure, one column per knockout (record_id, task_group first)."""
    sub = per[(per["config"] == "basm") & (per["bucket"] == bucket) & (per["measure"] == measure)]
    return sub.pivot_table(index=["record_id", "task_group"], columns="knockout", values="delta", aggfunc="first").reset_index()


def knockout_claims(per: pd.DataFrame, points: pd.DataFrame, rows: pd.DataFrame, *, sesoi: float, seed: int = 0) -> list[Claim]:
    """The claims of the knockout outputs (BASM, T_wrong, wrong-tool margin unless stated; family
    "knockout"): B moves the margin; B more than each control on the same records (count-matched on
    the same n, mass-matched on the records whose draws match B's mass, and per unit of mass removed);
    B more than P; each random control within ±sesoi of 0 (TOST); the boundary knockout leaves the
    correct-tool margins within ±sesoi (Fig. 7's selectivity, family "knockout-selectivity")."""
    w = basm_wide(per, CLAIM_BUCKET, CLAIM_MEASURE)
    claims: list[Claim] = []
    if not len(w) or "boundary" not in w:
        return claims
    groups = w["task_group"]
    family = "knockout"
    claims.append(effect_claim(family, "boundary", "the boundary knockout raises the BASM T_wrong wrong-tool margin",
                               w["boundary"], groups, sesoi=sesoi, seed=seed))
    if "random" in w:
        claims.append(effect_claim(family, "boundary>neutral", "it raises it more than |B| positions of the control pool",
                                   w["boundary"] - w["random"], groups, sesoi=sesoi, seed=seed))
    if {"count_boundary", "count_pool"} <= set(w):
        n = rows[(rows["config"] == "basm") & rows["condition"].str.startswith("psub_")].groupby("record_id")["control_n"].first()
        ok = w["record_id"].map(n).fillna(0).to_numpy() > 0
        claims.append(effect_claim(family, "count-matched", "n random positions of B raise it more than n random pool positions "
                                   "(n = min(|B|, |pool|))", (w["count_boundary"] - w["count_pool"])[ok], groups[ok], sesoi=sesoi, seed=seed,
                                   note=f"{int((~ok).sum())} records with an empty pool left out" if (~ok).any() else ""))
    if "mass_matched" in w:
        matched = rows[(rows["config"] == "basm") & rows["condition"].str.startswith("mass_")].groupby("record_id")["control_matched"].all()
        ok = w["record_id"].map(matched).fillna(False).astype(bool).to_numpy()
        claims.append(effect_claim(family, "mass-matched", "B raises it more than pool positions holding B's attention mass",
                                   (w["boundary"] - w["mass_matched"])[ok], groups[ok], sesoi=sesoi, seed=seed,
                                   note=f"{int(ok.sum())} of {len(ok)} records matched within the tolerance; the rest have less "
                                        "mass in the whole pool than in B"))
    dose = points[(points["config"] == "basm") & (points["bucket"] == CLAIM_BUCKET) & (points["measure"] == CLAIM_MEASURE)]
    if {"B", "pool"} <= set(dose["family"]):
        diff = slope_differences(dose)
        claims.append(effect_claim(family, "dose", "per unit of deciding-row attention removed, B's positions raise it more than "
                                   "the pool's (slope difference, logits per unit mass)", diff.to_numpy(), None, seed=seed,
                                   unit="logits / mass", note="slopes through the origin, per task group"))
    if "procedure" in w:
        claims.append(effect_claim(family, "boundary>procedure", "B raises it more than the procedure-span knockout",
                                   w["boundary"] - w["procedure"], groups, sesoi=sesoi, seed=seed))
    for control in RANDOM_CONTROLS:
        if control in w:
            claims.append(absence_claim(family, f"{control} neutral", f"the {control} control leaves the margin within ±{sesoi:g}",
                                        w[control], groups, sesoi=sesoi, seed=seed))
    for bucket in ("T_wrong", "T_ok"):
        c = basm_wide(per, bucket, "correct_margin")
        if len(c) and "boundary" in c:
            claims.append(absence_claim("knockout-selectivity", f"{bucket} correct", f"the boundary knockout leaves the {bucket} "
                                        f"correct-tool margin within ±{sesoi:g}", c["boundary"], c["task_group"], sesoi=sesoi,
                                        exploratory=True, seed=seed))
    return claims


def gap_recovery(rows: pd.DataFrame, per: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Share of the Proc. Skill gap (m_Proc − m_BASM, T_wrong) recovered by the boundary knockout."""
    out = []
    wrong = rows[(rows["bucket"] == "T_wrong") & (rows["condition"] == "baseline")]
    for measure in ("margin", "broad_margin"):
        proc = wrong[wrong["config"] == "proc"].set_index("item_id")[measure]
        basm = wrong[wrong["config"] == "basm"].set_index("item_id")[measure]
        d = per[(per["config"] == "basm") & (per["bucket"] == "T_wrong") & (per["knockout"] == "boundary")
                & (per["measure"] == measure)].set_index("item_id")
        common = d.index.intersection(proc.index).intersection(basm.index)
        if not len(common):
            continue
        value, low, high, n = bootstrap_ratio(d.loc[common, "delta"], proc[common] - basm[common], d.loc[common, "task_group"], seed=seed)
        gap = float((proc[common] - basm[common]).mean())
        # A share of a gap that does not exist (BASM not below Proc. Skill) is meaningless.
        if not gap > 0:
            value = low = high = float("nan")
        out.append({"measure": measure, "value": value, "low": low, "high": high, "n": n, "gap": gap,
                    "proc": float(proc[common].mean()), "basm": float(basm[common].mean()), "delta": float(d.loc[common, "delta"].mean())})
    return pd.DataFrame(out, columns=["measure", "value", "low", "high", "n", "gap", "proc", "basm", "delta"])


def summarise_rows(rows: pd.DataFrame, note: str = "", seed: int = 0, *, pool: str = "neutral", sesoi: float = DEFAULT_SESOI) -> KnockoutSummary:
    per, points, dropped, excluded = deltas_per_record(rows)
    deltas = summarise(per, ["config", "bucket", "knockout", "measure"], "delta", seed=seed)
    win = deltas[(deltas["config"] == "basm") & (deltas["bucket"] == "T_wrong") & (deltas["measure"] == "margin") & deltas["knockout"].str.startswith("boundary@")]
    windows = win.assign(window=win["knockout"].str.removeprefix("boundary@"))[["window", "value", "low", "high", "n"]]
    shown = summarise(by_shown(per), ["shown", "config", "bucket", "knockout", "measure"], "delta", seed=seed)
    recovery_parts = []
    for group, group_rows, group_per in zip(SHOWN_GROUPS, shown_parts(rows), shown_parts(per)):
        part = gap_recovery(group_rows, group_per, seed)
        part.insert(0, "shown", group)
        recovery_parts.append(part)
    recovery_shown = pd.concat(recovery_parts, ignore_index=True)
    claims = knockout_claims(per, points, rows, sesoi=sesoi, seed=seed)
    claims += shown_claims(per[per[SHOWN_FLAG].astype(bool)], sesoi=sesoi, seed=seed)
    return KnockoutSummary(deltas, gap_recovery(rows, per, seed), windows, per, points, dropped, control_draws(rows, deltas),
                           dose_table(points, seed), claims, excluded, note, pool, sesoi, shown, recovery_shown)


def shown_parts(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``frame`` whole, its rows whose defining skill is shown, and the rest (:data:`SHOWN_GROUPS`' order)."""
    shown = frame[SHOWN_FLAG].astype(bool)
    return frame, frame[shown], frame[~shown]


def shown_claims(per: pd.DataFrame, *, sesoi: float, seed: int = 0) -> list[Claim]:
    """The boundary claims on the records whose defining skill is shown (BASM, T_wrong, wrong-tool
    margin; family "knockout (defining skill shown)"): B moves the margin, and more than the neutral control."""
    w = basm_wide(per, CLAIM_BUCKET, CLAIM_MEASURE)
    if not len(w) or "boundary" not in w:
        return []
    claims = [effect_claim(SHOWN_FAMILY, "boundary", "on the records whose defining skill is shown, the boundary knockout raises "
                           "the BASM T_wrong wrong-tool margin", w["boundary"], w["task_group"], sesoi=sesoi, seed=seed)]
    if "random" in w:
        claims.append(effect_claim(SHOWN_FAMILY, "boundary>neutral", "on those records it raises it more than |B| positions of the "
                                   "control pool", w["boundary"] - w["random"], w["task_group"], sesoi=sesoi, seed=seed))
    return claims


def basm_deltas(summary: KnockoutSummary) -> pd.DataFrame:
    """The BASM rows of the summary (the figures' and the paper comparisons'), without ``config``."""
    return summary.deltas[summary.deltas["config"] == "basm"].drop(columns="config")


def priming_table(summary: KnockoutSummary) -> pd.DataFrame:
    """Δ wrong-tool margin of the boundary knockout and its neutral control per configuration: does
    the boundary effect survive when the tool names in B are anonymised, or when only the names remain?"""
    d = summary.deltas
    keep = d[d["knockout"].isin(["boundary", "random"]) & (d["measure"] == "margin")]
    return keep[["bucket", "config", "knockout", "value", "low", "high", "n"]].sort_values(["bucket", "knockout", "config"]).reset_index(drop=True)


def shown_headline(summary: KnockoutSummary) -> pd.DataFrame:
    """The BASM T_wrong wrong-tool-margin shifts of the boundary knockout and its controls, per ``shown`` group."""
    d = summary.shown
    keep = d[(d["config"] == "basm") & (d["bucket"] == CLAIM_BUCKET) & (d["measure"] == CLAIM_MEASURE) & d["knockout"].isin(KNOCKOUT_LABELS)]
    return keep[["shown", "knockout", "value", "low", "high", "n", "n_items", "note"]].reset_index(drop=True)


# ----------------------------------------------------------------------------- figures and text
def knockout_labels(summary: KnockoutSummary) -> dict[str, str]:
    """Legend labels of the knockouts. A random control is called neutral only where its own Δm
    (BASM, T_wrong, wrong-tool margin) has a CI containing 0; else the label says it moves the margin,
    and whether TOST places that shift within ±sesoi (negligible) or not. A mass-matched control no
    record could match is labelled as what it is: the whole pool."""
    labels = dict(KNOCKOUT_LABELS)
    equivalent = {c.name.removesuffix(" neutral") for c in summary.claims if c.kind == "absence" and c.family == "knockout"
                  and np.isfinite(c.p) and c.p < 0.05}
    for r in summary.controls.itertuples():
        if r.control not in labels or r.control not in RANDOM_CONTROLS:
            continue
        if r.control == "mass_matched" and r.n_mass_matched == 0:
            labels[r.control] = "whole pool: no record can match B's mass"
        if not isinstance(r.ci_contains_0, bool):
            verdict = "no CI"
        elif r.ci_contains_0:
            verdict = "neutral: CI ∋ 0"
        else:
            verdict = f"moves m: CI ∌ 0{f', but within ±{summary.sesoi:g} (TOST)' if r.control in equivalent else ''}"
        labels[r.control] = f"{labels[r.control]} ({verdict})"
    return labels


def caption(summary: KnockoutSummary) -> str:
    """What the knockout figures plot, computed from the plotted data."""
    d = basm_deltas(summary)
    main = d[(d["bucket"] == CLAIM_BUCKET) & (d["measure"] == CLAIM_MEASURE)]
    counts = ", ".join(f"{k} {int(r.n_items)} records / {int(r.n)} groups" for k, r in zip(main["knockout"], main.itertuples())
                       if k in KNOCKOUT_LABELS)
    lines = [f"T_wrong wrong-tool margin, paired records per measure: {counts or 'none'}",
             f"control pool ({summary.pool}): {pool_text(summary.pool)}; BASM records without a boundary span excluded: {summary.n_excluded}"]
    for r in summary.controls.itertuples():
        bits = [f"{r.n_records} records × {r.n_draws // max(r.n_records, 1)} draws"]
        if np.isfinite(r.mean_coverage):
            bits.append(f"coverage of |B| {r.mean_coverage:.2f} ({r.n_short} draws short)")
        if np.isfinite(r.mass_ratio):
            bits.append(f"median mass removed / B's {r.mass_ratio:.2f}")
        if r.control == "mass_matched" and np.isfinite(r.n_mass_matched):
            bits.append(f"{int(r.n_mass_matched)} records matched within the tolerance")
        lines.append(f"{r.control}: " + ", ".join(bits))
    return "\n".join(lines)


@register("knockout", order=40)
@dataclass(kw_only=True)
class KnockoutAnalysis(Analysis):
    """Figs. 3c/d, 6, 7: same-prompt knockout of the deciding rows' attention to the boundary span, with controls."""

    min_depth: ClassVar[int] = 1

    buckets: tuple[str, ...] | None = option(("T_wrong", "T_ok"), "keep only these buckets", flag="--bucket",
                                             repeat=True, choices=("T_ok", "T_wrong", "T_repair"), group="items")
    k: int | None = depth_option()
    random_draws: int = option(DEFAULT_DRAWS, "draws per record of every random control", type=int, minimum=1)
    layer_window: int | None = option(None, "also knock out B in windows of this many consecutive layers", type=int, minimum=1)
    random_pool: str = option("neutral", "where the random controls draw: neutral (the memory block outside B, P, their section "
                              "labels and every line naming a tool), memory (outside B and P) or memory+procedure (outside B)",
                              choices=RANDOM_POOLS)
    controls: tuple[str, ...] = option(CONTROLS, "comma-separated random controls: neutral (|B| pool positions), count (n random "
                                       "positions of B vs of the pool), mass (pool positions holding B's attention mass), anywhere "
                                       "(|B| positions anywhere before the call)", names=CONTROLS)
    mass_tolerance: float = option(DEFAULT_MASS_TOLERANCE, "relative band within which a mass-matched draw must match B's "
                                   "deciding-row attention mass", type=float, minimum=0.0)
    sesoi: float = option(DEFAULT_SESOI, "smallest effect of interest (logits): a control is claimed neutral only when TOST "
                          "places its shift within ±sesoi", type=float, minimum=0.0, exclusive=True,
                          why="no shift lies within ±0: TOST could never claim a control neutral")
    priming: bool = option(False, f"also knock out on the lexical-priming controls ({', '.join(PRIMING_CONFIGS)}): tool names in "
                           "the boundary items anonymised, or only the names kept", type=bool)
    knockout_rows: str = option("path", "rows blocked: path (every row from the open row to the decision row and the candidate "
                                "name rows, so a shared name prefix is covered) or endpoints (open and decision rows only)",
                                choices=KNOCKOUT_ROWS)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        a = ctx.options
        k = a.depth
        windows = layer_windows(ctx.session.n_layers, a.layer_window) if a.layer_window else []
        names = condition_names(a.random_draws, windows, a.controls)
        jobs = []
        for item in ctx.items:
            jobs += [Job(item, config, k, ctx.fmt, names) for config in knocked_configs(a.priming)]
            if item.bucket == "T_wrong":  # the Proc. Skill reference of the gap
                jobs.append(Job(item, "proc", k, ctx.fmt, ("baseline",)))
        store = ctx.store(k=k, knocked_configs=list(knocked_configs(a.priming)), random_draws=a.random_draws,
                          layer_windows=[list(w) for w in windows], knockout_rows=a.knockout_rows, random_pool=a.random_pool,
                          controls=list(a.controls), mass_tolerance=a.mass_tolerance,
                          random_span="|B| positions of the pool, B's block lengths (split where no room)",
                          count_matched="n = min(|B|, |pool|) scattered positions of B and of the pool",
                          mass_matched="pool positions in random order, each kept when it brings the deciding-row mass closer to B's",
                          random_anywhere_span="B's block lengths before the first query row, excluding B and token 0")
        run_jobs(ctx, store, jobs, knockout_scorer(ctx, windows))
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> KnockoutSummary:
        a = ctx.options
        note = (f"{provenance(ctx)}\nΔm = m_knockout − m_BASM (signed) at k = {a.depth} · "
                f"rows blocked: {a.knockout_rows} · controls ({', '.join(a.controls)}): means of {a.random_draws} draws per record · "
                f"mass = deciding-row attention removed (mean over layers and heads) · paired records per measure · "
                f"mean ± 95% bootstrap CI over task groups")
        return summarise_rows(rows, note, a.seed, pool=a.random_pool, sesoi=a.sesoi)

    def tables(self, summary: KnockoutSummary) -> dict[str, pd.DataFrame]:
        tables = {f"{NAME}_summary": summary.deltas, f"{NAME}_gap_recovery": summary.recovery, f"{NAME}_controls": summary.controls,
                  f"{NAME}_dose": summary.dose, f"{NAME}_shown": summary.shown, f"{NAME}_gap_recovery_shown": summary.recovery_shown}
        if set(summary.deltas["config"]) != {"basm"}:
            tables[f"{NAME}_priming"] = priming_table(summary)
        return tables

    def claims(self, summary: KnockoutSummary) -> list[Claim]:
        return summary.claims

    def figures(self, summary: KnockoutSummary, out_dir: Path) -> list[Path]:
        plots.style()
        note = f"{summary.note}\n{caption(summary)}"
        deltas, labels = basm_deltas(summary), knockout_labels(summary)
        dose = summary.points[(summary.points["config"] == "basm") & (summary.points["bucket"] == CLAIM_BUCKET)
                              & (summary.points["measure"] == CLAIM_MEASURE) & (summary.points["family"] != "")]
        slopes = summary.dose[(summary.dose["config"] == "basm") & (summary.dose["bucket"] == CLAIM_BUCKET) & (summary.dose["measure"] == CLAIM_MEASURE)]
        paths = plots.save_figure(fig06_knockout_controls(deltas, summary.recovery, summary.windows, note, labels=labels,
                                                          dose=dose, slopes=slopes), out_dir, FIGURES[0])
        paths += plots.save_figure(fig07_knockout_selectivity(deltas, note, labels=labels), out_dir, FIGURES[1])
        return paths

    def section(self, ctx: RunContext, summary: KnockoutSummary, figures: list[Path]) -> ReportSection:
        d, r = basm_deltas(summary), summary.recovery
        main = d[d["knockout"].isin(KNOCKOUT_LABELS)][["bucket", "knockout", "measure", "value", "low", "high", "n", "n_items"]]
        dose = summary.dose[summary.dose["config"] == "basm"]
        body = (f"Signed shift Δm = m_knockout − m_BASM (logits; `margin` is {ctx.variant}, Eq. 1 restricted to the tools by default); "
                f"CIs over task groups. Rows blocked: `{ctx.options.knockout_rows}`. Every knockout and control of a measure is compared "
                f"on the same records. {caption(summary)}\n\n{markdown_table(main)}\n\n"
                f"Records left out of a measure's comparison:\n\n{markdown_table(summary.dropped) if len(summary.dropped) else 'none'}\n\n"
                f"How the controls were drawn, and each control's own shift of the T_wrong wrong-tool margin (`value`, CI; a control "
                f"is called neutral only where its CI contains 0, and claimed neutral only by the TOST claim against ±{summary.sesoi:g}):"
                f"\n\n{markdown_table(summary.controls)}\n\n"
                f"Dose–response: slope of Δm on the deciding-row attention mass removed (logits per unit mass, through the origin; "
                f"family B: `boundary`, `count_boundary`; pool: `random`, `count_pool`, `mass_matched`):\n\n{markdown_table(dose)}\n\n"
                f"Share of the Proc. Skill gap recovered by the boundary knockout (T_wrong; CI resamples task groups jointly):\n\n"
                f"{markdown_table(r)}\n\n"
                f"Split by whether the item's defining skill is among the k shown (the paper's setting: `shown`; "
                f"`{NAME}_shown.csv`, `{NAME}_gap_recovery_shown.csv`), BASM, T_wrong, wrong-tool margin and gap recovery:\n\n"
                f"{markdown_table(shown_headline(summary))}\n\n{markdown_table(summary.recovery_shown)}")
        if ctx.options.priming:
            body += ("\n\nLexical-priming controls (Δ wrong-tool margin; `basm-anon`: tool names in B replaced by placeholders, "
                     f"`basm-names`: B reduced to the tool names it mentions):\n\n{markdown_table(priming_table(summary))}")
        if len(summary.windows):
            body += f"\n\nLayer windows (Δ wrong-tool margin, T_wrong):\n\n{markdown_table(summary.windows)}"
        sel = selectivity_table(d, KNOCKOUT_LABELS)
        comparisons = [
            Comparison("Fig. 6: Δm wrong-tool, boundary knockout (T_wrong)", cell(d, bucket="T_wrong", knockout="boundary", measure="margin"), PAPER_FIG6_DELTA["margin"]),
            Comparison("Fig. 6: Δm tool-vs-control, boundary knockout (T_wrong)", cell(d, bucket="T_wrong", knockout="boundary", measure="broad_margin"), PAPER_FIG6_DELTA["broad_margin"]),
            *(Comparison(f"Fig. 6: Δm {'wrong-tool' if m == 'margin' else 'tool-vs-control'}, boundary knockout (T_wrong, defining skill shown)",
                         cell(summary.shown, shown="shown", config="basm", bucket="T_wrong", knockout="boundary", measure=m), PAPER_FIG6_DELTA[m],
                         note="the paper's setting: the tempting skill is among the k shown")
              for m in ("margin", "broad_margin")),
            *(Comparison(f"Fig. 6: Proc.–BASM gap recovered, {plots.MEASURE_LABELS[m]}", 100 * cell(r, measure=m), p, "%",
                         f"gap m_Proc − m_BASM = {cell(r, 'gap', measure=m):+.2f} logits" + ("" if cell(r, "gap", measure=m) > 0 else " (≤ 0: undefined)"))
              for m, p in PAPER_FIG6_RECOVERED.items()),
        ]
        comparisons += [Comparison(f"Fig. 7: selectivity {b}–{'wrong' if m == 'margin' else 'correct'}", cell(sel, cell=c, knockout="boundary"), p,
                                   note="paper: Qwen3-14B")
                        for (b, m, c), p in zip(SELECTIVITY, PAPER_FIG7_SELECTIVITY)]
        return ReportSection(NAME, "Figs. 3c/d, 6, 7 — same-prompt knockout (`knockout`)", figures, body, comparisons, summary)

    def print_summary(self, summary: KnockoutSummary) -> None:
        print(basm_deltas(summary).round(3).to_string(index=False))
        print("split by whether the defining skill is among the k shown (BASM, T_wrong, wrong-tool margin):\n"
              + shown_headline(summary).round(3).to_string(index=False))
        if set(summary.deltas["config"]) != {"basm"}:
            print("lexical-priming controls (Δ wrong-tool margin):\n" + priming_table(summary).round(3).to_string(index=False))
        for r in summary.recovery.itertuples():
            print(f"gap recovered ({r.measure}): {100 * r.value:.1f}% [{100 * r.low:.1f}, {100 * r.high:.1f}] "
                  f"(Proc {r.proc:.2f}, BASM {r.basm:.2f}, Δm boundary {r.delta:+.2f}; n = {r.n} task groups)")
        print(f"BASM records without a boundary span (excluded): {summary.n_excluded}")
        print("records left out of a measure's paired comparison:\n" + (summary.dropped.to_string(index=False) if len(summary.dropped) else "none"))
        print("controls:\n" + summary.controls.round(3).to_string(index=False))
        print("dose–response slopes:\n" + summary.dose.round(3).to_string(index=False))


# The BASM paper's numbers that the report sets next to ours (logits): Fig. 6 (Qwen3-8B), the boundary
# knockout on T_wrong, Δm and the share of the Proc.–BASM gap it recovers (%); Fig. 7 (Qwen3-14B), its
# selectivity, in the order of probes.scoring.selectivity.SELECTIVITY.
PAPER_FIG6_DELTA = {"margin": 3.45, "broad_margin": 3.65}
PAPER_FIG6_RECOVERED = {"margin": 69.4, "broad_margin": 41.0}
PAPER_FIG7_SELECTIVITY = (0.27, 0.04, -0.11)


# --- Figs. 6 and 7, drawn by KnockoutAnalysis.figures (their panels also draw Fig. 3c, d in probes.analyses.report)
KNOCKOUT_LABELS = {"boundary": "boundary span B", "random": "|B| pool positions", "count_boundary": "n positions of B (count-matched)",
                   "count_pool": "n pool positions (count-matched)", "mass_matched": "pool positions, B's attention mass (mass-matched)",
                   "random_anywhere": "|B| positions anywhere", "procedure": "procedure span P"}


def knockout_panel(ax: plt.Axes, deltas: pd.DataFrame, recovery: pd.DataFrame | None, labels: dict[str, str] | None = None) -> None:
    """Δm per knockout (boundary, the controls, procedure) for the wrong-tool and broad margins on T_wrong.

    deltas: bucket, knockout, measure, value, low, high, n; ``labels``: knockout -> legend label
    (default :data:`KNOCKOUT_LABELS`; the knockout analysis marks which controls are neutral).
    """
    labels = labels or KNOCKOUT_LABELS
    sub = deltas[(deltas["bucket"] == "T_wrong") & deltas["knockout"].isin(KNOCKOUT_LABELS) & deltas["measure"].isin(("margin", "broad_margin"))]
    measures = plots.ordered(sub["measure"], ("margin", "broad_margin"))
    knockouts = plots.ordered(sub["knockout"], tuple(KNOCKOUT_LABELS))
    plots.grouped_bars(ax, sub, measures, knockouts, group_col="measure", series_col="knockout",
                       series_label=lambda k: labels[k], series_color=lambda k: plots.CONDITION_COLORS[k],
                       group_label=lambda m: plots.SHORT_MEASURE_LABELS[m], annotate=len(knockouts) <= 4)
    ax.set_ylabel("Δm = m_knockout − m_BASM (logits)")
    if recovery is not None and len(recovery):
        text = "\n".join(f"{plots.MEASURE_LABELS[r.measure]}: {100 * r.value:.1f}% [{100 * r.low:.0f}, {100 * r.high:.0f}] of the Proc.–BASM gap recovered"
                         if ok else f"{plots.MEASURE_LABELS[r.measure]}: {100 * r.value:.1f}% of the Proc.–BASM gap recovered ({plots.no_ci_label(n)})"
                         for r, ok, n in zip(recovery.itertuples(), plots.has_ci(recovery), plots.ci_groups(recovery)))
        ax.text(0.5, -0.16, text, transform=ax.transAxes, ha="center", va="top", fontsize=8)


def _window_panel(ax: plt.Axes, windows: pd.DataFrame) -> None:
    """Δ wrong-tool margin per layer window of the boundary knockout. windows: window, value, low, high, n."""
    x = np.arange(len(windows))
    ax.bar(x, windows["value"], color=plots.CONDITION_COLORS["boundary"], yerr=plots.ci_errors(windows), capsize=3)
    plots.annotate_no_ci(ax, x, windows)
    ax.set_xticks(x, windows["window"], rotation=45, ha="right")
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.set_xlabel("boundary knockout in layers")
    ax.set_ylabel("Δ wrong-tool margin (logits)")
    ax.set_title("layer windows")


def _dose_panel(ax: plt.Axes, points: pd.DataFrame, slopes: pd.DataFrame) -> None:
    """Δm against the deciding-row attention mass removed: one point per record and draw, coloured by
    family (B's positions, the control pool's), with each family's slope through the origin and its CI.

    points: family ("B" | "pool"), knockout, mass, delta; slopes: family, slope, low, high, n.
    """
    family_color = {"B": plots.CONDITION_COLORS["boundary"], "pool": plots.CONDITION_COLORS["random"]}
    top = float(np.nanmax(points["mass"])) if len(points) and np.isfinite(points["mass"]).any() else 1.0
    for family, sub in points.groupby("family", sort=True):
        ax.scatter(sub["mass"], sub["delta"], s=9, alpha=0.45, color=family_color[family], edgecolors="none")
        fit = slopes[slopes["family"] == family]
        if len(fit):
            r = fit.iloc[0]
            ci = f" [{r.low:+.2f}, {r.high:+.2f}]" if np.isfinite(r.low) else f" ({plots.no_ci_label(r.n)})"
            name = "B's positions" if family == "B" else "control pool"
            ax.plot([0, top], [0, r.slope * top], color=family_color[family], lw=1.6,
                    label=f"{name}: {r.slope:+.2f}{ci} logits per unit mass ({int(r.n_points)} points)")
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.set_xlabel("deciding-row attention mass removed")
    ax.set_ylabel("Δ wrong-tool margin (logits)")
    ax.set_title("dose–response")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=7)


def fig06_knockout_controls(deltas: pd.DataFrame, recovery: pd.DataFrame, windows: pd.DataFrame | None, note: str, *,
                            labels: dict[str, str] | None = None, dose: pd.DataFrame | None = None,
                            slopes: pd.DataFrame | None = None) -> plt.Figure:
    """Δm bars per knockout (legend and the gap recovered in a column of their own), the dose–response
    panel (with ``dose`` points) and the layer windows (with ``windows`` rows)."""
    panels = ["bars", "legend"] + (["dose"] if dose is not None and len(dose) else []) + (["windows"] if windows is not None and len(windows) else [])
    widths = {"bars": 5.0, "legend": 3.6, "dose": 5.0, "windows": 4.0}
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths[p] for p in panels) + 1, 4.4),
                             gridspec_kw={"width_ratios": [widths[p] for p in panels]}, squeeze=False)
    axes = dict(zip(panels, axes[0]))
    knockout_panel(axes["bars"], deltas, None, labels)
    axes["bars"].set_title(f"{plots.bucket_label('T_wrong')}: same-prompt knockout")
    handles, names = axes["bars"].get_legend_handles_labels()
    axes["legend"].axis("off")
    axes["legend"].legend(handles, names, loc="upper left", fontsize=7.5, frameon=False)
    if recovery is not None and len(recovery):
        text = "\n".join(f"{plots.MEASURE_LABELS[r.measure]}:\n  {100 * r.value:.1f}% [{100 * r.low:.0f}, {100 * r.high:.0f}] of the Proc.–BASM gap recovered"
                         if ok else f"{plots.MEASURE_LABELS[r.measure]}:\n  {100 * r.value:.1f}% of the Proc.–BASM gap recovered ({plots.no_ci_label(n)})"
                         for r, ok, n in zip(recovery.itertuples(), plots.has_ci(recovery), plots.ci_groups(recovery)))
        axes["legend"].text(0.0, 0.0, text, transform=axes["legend"].transAxes, ha="left", va="bottom", fontsize=7.5)
    if "dose" in axes:
        _dose_panel(axes["dose"], dose, slopes if slopes is not None else pd.DataFrame(columns=["family"]))
    if "windows" in axes:
        _window_panel(axes["windows"], windows)
    fig.suptitle("Removing deciding-row → boundary attention, against controls of the same count and the same attention mass", y=1.02)
    fig.tight_layout()
    plots.footnote(fig, note)
    return fig


def selectivity_panel(ax: plt.Axes, deltas: pd.DataFrame, labels: dict[str, str] | None = None) -> None:
    labels = labels or KNOCKOUT_LABELS
    table = selectivity_table(deltas, KNOCKOUT_LABELS)
    cells = [c for _, _, c in SELECTIVITY if c in set(table["cell"])]
    knockouts = plots.ordered(table["knockout"], tuple(KNOCKOUT_LABELS))
    plots.grouped_bars(ax, table, cells, knockouts, group_col="cell", series_col="knockout", annotate=len(knockouts) <= 4,
                       series_label=lambda k: labels[k], series_color=lambda k: plots.CONDITION_COLORS[k], group_label=lambda c: c)
    ax.set_ylabel("Δ margin after knockout (logits)")


def fig07_knockout_selectivity(deltas: pd.DataFrame, note: str, *, labels: dict[str, str] | None = None) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(8.5, 4.0))
    selectivity_panel(ax, deltas, labels)
    ax.set_title("Selectivity of the boundary knockout")
    plots.legend_outside(ax)
    plots.footnote(fig, note)
    return fig
