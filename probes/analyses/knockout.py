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
    (``control_coverage`` < 1 says so). With it, ``bmass_i``, pooled as ``mass_boundary``: the
    **B-side mass match**, B positions visited in a random order and kept while each brings their
    deciding-row attention mass closer to that of ``random_i`` (:func:`draw_mass_matched` over B);
    possible whenever B holds more mass than the pool draw. Where it holds less, the draw takes all
    of B, is not ``control_matched`` and leaves the equal-mass comparison (counted); the pool-side
    match ``mass_matched`` is then the comparison at equal mass;
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

**Dose at equal mass.** Every row records ``knockout_mass``: the attention mass its positions hold
at the deciding row of the unmodified prompt (Σ over the positions of the softmax probability, mean
over layers and heads; 0 in heads and layers a knockout does not touch), from one extra small engine
call per record (:func:`deciding_attention`); B's own mass is ``boundary_mass``, the whole pool's
``control_pool_mass``. B and the pool are compared at equal mass only, never by slopes: B's
knockouts remove far more mass than the pool's, so a slope fitted to the pool extrapolates it past
its data, and a convex response (the same Δm = c·mass² for every position) then reads as "B moves
more per unit of attention". The ``equal-mass`` claim is the per-draw difference
Δm(``bmass_i``) − Δm(``random_i``) on the draws whose B-side match lies within
``--mass-tolerance``, averaged per record; ``mass-matched`` is Δm(B) − Δm(``mass_i``) on the draws
whose pool-side match does. A mass-matched control (``mass_matched``, ``mass_boundary``) counts only
its matched draws, everywhere (its shift, its claims, its coverage in the tables).

**Identical controls.** Where the pool is smaller than |B|, ``random``, ``count_pool`` and
``mass_matched`` all knock out the whole pool. Every row records ``knockout_digest`` (a hash of what
its knockout blocks: positions, layers, heads, rows); knockouts whose draws block the same sets on
every record are one knockout: tested once, under the first name, the merge stated
(:func:`identical_knockouts`).

**Which comparison is the headline.** Chosen before any run (:data:`HEADLINE`): B against the
neutral control (|B| positions of the pool, the paper's Fig. 6 comparison). No control is neutral by
design: each one's own shift is tested in every run, and where the headline control's own shift is
detected or its equivalence is not shown, the report says that "B > pool" mixes two effects, B's and
the pool's own (:func:`mixing_note`).

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
their claims (:meth:`KnockoutAnalysis.claims`; effect claims are also tested against ``--sesoi``,
the family's one δ, by a minimum-effect test), in one headline table (``knockout_comparisons``:
each comparison's records, coverage and mass ratio); and the share of the Proc. Skill gap that the
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

import hashlib
import json
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
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
from probes.scoring.claims import Claim, absence_claim, claims_table, effect_claim
from probes.scoring.controls import (RANDOM_POOLS, anywhere_control, block_lengths, control_pool, draw_mass_matched, draw_positions,
                                     draw_span, pool_text, tool_names_of)
from probes.scoring.margins import candidates_from_record
from probes.scoring.score import deciding_depth, record_rng
from probes.scoring.selectivity import SELECTIVITY, selectivity_table
from probes.scoring.stats import SHOWN_FLAG, SHOWN_GROUPS, bootstrap_ratio, by_shown, summarise

NAME = "knockout"
FIGURES = ("fig06_knockout_controls", "fig07_knockout_selectivity")
MEASURES = ("margin", "broad_margin", "correct_margin", "call_logodds")
DEFAULT_DRAWS = 5
DEFAULT_SESOI = 0.25  # logits: an odds change of 1.28×, fixed before any run; the equivalence bound of "neutral"
DEFAULT_MASS_TOLERANCE = 0.1
KNOCKOUT_ROWS = ("path", "endpoints")
CONTROLS = ("neutral", "count", "mass", "anywhere")
# draw condition prefix -> (the --controls family that draws it, the knockout its draws pool into)
DRAWS = {"random_": ("neutral", "random"), "bmass_": ("neutral", "mass_boundary"), "bsub_": ("count", "count_boundary"),
         "psub_": ("count", "count_pool"), "mass_": ("mass", "mass_matched"), "anywhere_": ("anywhere", "random_anywhere")}
B_FAMILY = ("boundary", "count_boundary", "mass_boundary")  # knockouts of B's positions (the dose panel's colours)
POOL_FAMILY = ("random", "count_pool", "mass_matched")  # knockouts of the control pool's positions
MATCHED = ("mass_boundary", "mass_matched")  # mass-matched knockouts: only their draws inside the band count
RANDOM_CONTROLS = ("random", "count_pool", "mass_matched", "random_anywhere")  # expected not to move the margin
HEADLINE = "boundary>neutral"  # the headline comparison, chosen before any run: B against |B| positions of the pool
CLAIM_BUCKET, CLAIM_MEASURE = "T_wrong", "margin"
SHOWN_FAMILY = f"{NAME} (defining skill shown)"


# ----------------------------------------------------------------------------- dose
def deciding_ids(record: PromptRecord) -> tuple[list[int], int, int]:
    """(the prompt's ids with the correct name's shared prefix appended where the deciding row lies inside
    it, the deciding row, its depth into the correct name): the deciding row predicts the first token where
    the correct name parts from a wrong one (the decision row for abstention items)."""
    candidates = [c for c in candidates_from_record(record) if c.role != "other"]
    key, depth = deciding_depth(candidates)
    ids = list(record.input_ids)
    if depth:
        ids += list(next(c for c in candidates if c.key == key).token_ids[:depth])
    return ids, int(record.decision_index) + depth, depth


def deciding_run(session: EngineSession, record: PromptRecord) -> tuple[ConditionResult, int, int]:
    """(the unmodified condition, the deciding row, its depth into the correct name) from one engine
    call on :func:`deciding_ids` whose last query row is the deciding row, its full softmax row recorded.
    It branches where the record's scoring call does (its first query row), so that call takes the whole
    prompt prefix from the session's prefix cache."""
    ids, row, depth = deciding_ids(record)
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
    pool_mass: float  # the whole control pool's deciding-row attention mass
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
    in_b = np.isin(np.arange(record.n_tokens), b_positions)
    state = RecordDraws(attention, target, int(free.sum()), float(weights[free].sum()))
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
            elif prefix == "bmass_":  # B's positions holding the mass of this draw's neutral control (drawn just before)
                pool_draw = dict(out)[f"random_{i}"]
                positions, _, matched = draw_mass_matched(in_b, weights, float(weights[pool_draw].sum()), rng, options.mass_tolerance)
                info["control_matched"] = matched
            elif prefix == "bsub_":
                positions = draw_positions(in_b, n_count, rng)
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
    windows_of_layers = ctx.session.windows
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
                       knockout_digest=knockout_digest(knockout) if knockout else "",
                       **(no_op_fields(knockout, record.query_rows, ctx.session.n_heads, windows_of_layers) if knockout else {}),
                       boundary_mass=state.boundary_mass, control_pool_size=state.pool_size, control_pool_mass=state.pool_mass,
                       **state.info.get(row["condition"], {}))
        return rows

    return scorer


def no_op_fields(knockout: Knockout, query_rows: Sequence[int], n_heads: int, windows: Sequence[int | None]) -> dict[str, Any]:
    """Where a knockout removes nothing (:meth:`Knockout.reach`: its keys outside a local layer's sliding window,
    or after its rows): ``knockout_no_op_layers``, the layers it covers that it leaves as they were, and
    ``knockout_no_op``, whether that is every layer it covers (then it is no intervention and counts nowhere)."""
    active = knockout.active(len(windows), n_heads).any(dim=1)
    reached = knockout.reach(n_heads, query_rows, windows).any(dim=1)
    return {"knockout_no_op_layers": int((active & ~reached).sum()), "knockout_no_op": bool(active.any() and not reached.any())}


def knockout_digest(knockout: Knockout) -> str:
    """What a knockout blocks (positions, layers, heads, rows), not its name: two conditions with one
    digest are the same knockout (:func:`identical_knockouts`)."""
    blocked = [knockout.key_positions, knockout.layers, knockout.heads, knockout.rows, knockout.continuation]
    return hashlib.sha256(json.dumps(blocked).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- summary
@dataclass
class KnockoutSummary:
    deltas: pd.DataFrame  # config, bucket, knockout, measure, value, low, high, n, n_items, n_nan, note
    recovery: pd.DataFrame  # measure, value, low, high, n (share of the Proc.–BASM gap, T_wrong)
    windows: pd.DataFrame  # window, value, low, high, n, n_no_op (Δ wrong-tool margin on T_wrong; no_op_windows)
    per_record: pd.DataFrame  # config, item_id, bucket, task_group, knockout, measure, delta, mass (counted draws averaged)
    points: pd.DataFrame  # one row per (record, counted condition, measure): knockout, family, draw, delta, mass
    dropped: pd.DataFrame  # measure, bucket, reason, n_records: records left out of a measure's comparison
    controls: pd.DataFrame  # per control: how it was drawn, its mass against B's, and its own shift
    equal_mass: pd.DataFrame  # config, bucket, measure: Δm(B positions at the pool draw's mass) − Δm(that draw), coverage
    comparisons: pd.DataFrame  # the headline table: B against 0 and each control, with records, coverage, mass ratio, verdict
    claims: list[Claim]
    n_excluded: int  # knocked records without a boundary span
    note: str
    pool: str = "neutral"
    sesoi: float = DEFAULT_SESOI
    shown: pd.DataFrame | None = None  # shown (all | shown | not shown), then the columns of deltas
    recovery_shown: pd.DataFrame | None = None  # shown, then the columns of recovery
    merged: dict[str, str] = field(default_factory=dict)  # knockout -> the identical knockout it is reported as
    mixing: str = ""  # where the headline control is not shown neutral: why "B > pool" mixes two effects


def control_of(condition: str) -> str:
    """The reported knockout of a condition: random draws pool into their control."""
    for prefix, (_, control) in DRAWS.items():
        if condition.startswith(prefix):
            return control
    return condition


def draw_of(condition: str) -> int:
    """The draw index of a control draw (``random_3`` → 3); −1 for a knockout that is not drawn."""
    for prefix in DRAWS:
        if condition.startswith(prefix):
            return int(condition.removeprefix(prefix))
    return -1


def family_of(knockout: str) -> str:
    return "B" if knockout in B_FAMILY else "pool" if knockout in POOL_FAMILY else ""


def counted(knocked: pd.DataFrame) -> np.ndarray:
    """bool per knocked row: False for a draw of a mass-matched knockout (:data:`MATCHED`) whose mass
    missed the band, and for a knockout that removed no key its rows could see (``knockout_no_op``: a
    sliding window hid them on every layer it covers); such a row counts nowhere."""
    matched = knocked["control_matched"] if "control_matched" in knocked else pd.Series(np.nan, index=knocked.index)
    no_op = knocked["knockout_no_op"].eq(True) if "knockout_no_op" in knocked else pd.Series(False, index=knocked.index)
    return ((~knocked["condition"].map(control_of).isin(MATCHED) | matched.eq(True)) & ~no_op).to_numpy()


def deltas_per_record(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, int]:
    """Δm per (knocked record, counted condition, measure) and per (record, knockout, measure) with
    the counted draws averaged into their control, on paired records: per measure only the records
    where it is finite under the baseline and every knockout. Returns (per-record deltas,
    per-condition points, records left out per measure with the reason, records without B). Every
    configuration but the Proc. Skill reference is a knocked one."""
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
        knocked = knocked[counted(knocked)]
        delta = knocked[measure].to_numpy(float) - base.loc[knocked["record_id"]].to_numpy(float)
        frame = knocked[["record_id", "config", "item_id", "bucket", "task_group", SHOWN_FLAG, "condition"]].assign(
            measure=measure, delta=delta, mass=knocked["knockout_mass"].to_numpy(float))
        out.append(frame.assign(knockout=frame["condition"].map(control_of), draw=frame["condition"].map(draw_of)))
    points = pd.concat(out, ignore_index=True)
    points["family"] = points["knockout"].map(family_of)
    # one value per record for each random control: the mean over its counted draws
    per = points.groupby(["record_id", "config", "item_id", "bucket", "task_group", SHOWN_FLAG, "knockout", "measure"], as_index=False,
                         sort=False)[["delta", "mass"]].mean()
    return per, points, pd.DataFrame(dropped, columns=["config", "measure", "bucket", "reason", "n_records"]), int(len(excluded))


def identical_knockouts(rows: pd.DataFrame) -> dict[str, str]:
    """Knockouts (draws pooled) that block the same sets as an earlier one (:data:`KNOCKOUT_LABELS`'
    order) on every BASM record, each mapped to that one: where the pool is smaller than |B|,
    ``random``, ``count_pool`` and ``mass_matched`` all take the whole pool. Compared per record as
    the set of the draws' :func:`knockout_digest`."""
    if "knockout_digest" not in rows:
        raise ValueError("the knockout rows have no knockout_digest (written by an earlier version, which could not tell identical "
                         "controls apart): rerun `knockout` with --overwrite or a new --out")
    knocked = rows[(rows["config"] == "basm") & (rows["condition"] != "baseline")]
    sets = knocked.groupby([knocked["condition"].map(control_of), "record_id"])["knockout_digest"].agg(frozenset)
    blocks = {k: sets.loc[k].to_dict() for k in sets.index.get_level_values(0).unique()}
    order = [k for k in KNOCKOUT_LABELS if k in blocks]
    merged: dict[str, str] = {}
    for i, kept in enumerate(order):
        for other in order[i + 1:]:
            if kept not in merged and other not in merged and blocks[other] == blocks[kept]:
                merged[other] = kept
    return merged


def aliases_of(knockout: str, merged: dict[str, str]) -> list[str]:
    return [alias for alias, kept in merged.items() if kept == knockout]


CONTROL_COLUMNS = ["control", "identical_to", "n_records", "n_draws", "n_counted", "n_matched_records", "mean_coverage", "n_short",
                   "n_split", "mean_procedure_share", "mass_ratio", "pool_mass_ratio", "value", "low", "high", "ci_contains_0"]


def control_draws(rows: pd.DataFrame, deltas: pd.DataFrame, merged: dict[str, str]) -> pd.DataFrame:
    """How each drawn knockout was drawn (coverage of |B|, runs split, share on P), the draws that
    count (a mass-matched draw only inside the band; ``n_matched_records``: records with one), the
    mass they removed against B's (median over records of mass_draws / mass_B), the whole pool's mass
    against B's, which knockout it is identical to (:func:`identical_knockouts`), and its own Δm
    (BASM, T_wrong, margin; counted draws) with whether its CI contains 0."""
    rows = rows[rows["boundary_size"] > 0]  # records without B are excluded from every comparison: from the counts too
    rows = rows.assign(control=rows["condition"].map(control_of))
    draws = rows[rows["control"].isin([c for _, c in DRAWS.values()]) & (rows["config"] == "basm")]
    out = []
    for control, sub in draws.groupby("control", sort=False):
        def column(name: str, default: Any = np.nan) -> pd.Series:  # fields a control's draws do not write are absent
            return sub[name] if name in sub else pd.Series(default, index=sub.index)

        sub = sub.assign(counted=counted(sub), mass=column("knockout_mass"), b_mass=column("boundary_mass"),
                         pool_mass=column("control_pool_mass"))
        kept = sub[sub["counted"]]
        ratio = kept.groupby("record_id")["mass"].mean() / kept.groupby("record_id")["b_mass"].first()
        pool = sub.groupby("record_id")[["pool_mass", "b_mass"]].first()
        shift = deltas[(deltas["config"] == "basm") & (deltas["bucket"] == CLAIM_BUCKET) & (deltas["measure"] == CLAIM_MEASURE)
                       & (deltas["knockout"] == control)]
        value, low, high = (float(shift[c].iloc[0]) for c in ("value", "low", "high")) if len(shift) else (np.nan,) * 3
        coverage = column("control_coverage").astype(float)
        out.append({"control": control, "identical_to": merged.get(control, ""), "n_records": sub["record_id"].nunique(),
                    "n_draws": len(sub), "n_counted": int(sub["counted"].sum()),
                    "n_matched_records": kept["record_id"].nunique() if control in MATCHED else np.nan,
                    "mean_coverage": float(coverage.mean()), "n_short": int((coverage < 1).sum()),
                    "n_split": int(column("control_split", False).fillna(False).astype(bool).sum()),
                    "mean_procedure_share": float(column("control_procedure_share").astype(float).mean()),
                    "mass_ratio": float(ratio.median()) if len(ratio) else np.nan,
                    "pool_mass_ratio": float((pool["pool_mass"] / pool["b_mass"]).median()) if control in POOL_FAMILY else np.nan,
                    "value": value, "low": low, "high": high,
                    "ci_contains_0": bool(low <= 0 <= high) if np.isfinite(low) and np.isfinite(high) else np.nan})
    return pd.DataFrame(out, columns=CONTROL_COLUMNS)


def control_text(control: str, controls: pd.DataFrame, merged: dict[str, str]) -> str:
    """What a control knocked out, in words, from how its draws came out (coverage, matching) and
    the controls identical to it: the claims' statements and Fig. 6's title say this."""
    row = controls.set_index("control").loc[control] if control in set(controls["control"]) else None
    if control in ("random", "random_anywhere"):
        where = "of the control pool" if control == "random" else "anywhere before the call"
        text = f"|B| positions {where}"
        if row is not None and row.n_short:
            whole = "the whole pool" if control == "random" else "all the room there is"
            share = "on every draw" if row.n_short == row.n_draws else f"on {int(row.n_short)} of {int(row.n_draws)} draws"
            text += f" ({whole} where it holds fewer: {share}, mean coverage {row.mean_coverage:.2f} of |B|)"
    elif control in ("count_pool", "count_boundary"):
        text = f"n random positions of {'the control pool' if control == 'count_pool' else 'B'} (n = min(|B|, |pool|))"
    elif control in MATCHED:
        text = ("positions of the control pool holding B's deciding-row attention mass" if control == "mass_matched"
                else "positions of B holding the mass of the |B| pool positions")
        if row is not None:
            text += f" ({int(row.n_matched_records)} of {int(row.n_records)} records matched within the tolerance)"
    else:
        text = control
    aliases = aliases_of(control, merged)
    if aliases:
        text += f"; identical to {', '.join(aliases)} on every record (the same positions), tested once"
    return text


def equal_mass_pairs(points: pd.DataFrame) -> pd.DataFrame:
    """Per (config, bucket, measure, record): Δm(``bmass_i``) − Δm(``random_i``) averaged over the
    draws whose B-side match lies in the band (the only ``mass_boundary`` points counted), with the
    two sides' masses and the number of matched draws."""
    keys = ["config", "bucket", "measure", "record_id", "item_id", "task_group", SHOWN_FLAG]
    columns = [*keys, "delta", "b_mass", "pool_mass", "n_draws"]
    sub = points[points["knockout"].isin(["mass_boundary", "random"])]
    if "mass_boundary" not in set(sub["knockout"]):
        return pd.DataFrame(columns=columns)
    wide = sub.set_index([*keys, "draw", "knockout"])[["delta", "mass"]].unstack("knockout").dropna()
    pairs = pd.DataFrame({"delta": wide[("delta", "mass_boundary")] - wide[("delta", "random")], "b_mass": wide[("mass", "mass_boundary")],
                          "pool_mass": wide[("mass", "random")]}).reset_index()
    out = pairs.groupby(keys, as_index=False, sort=False).agg(delta=("delta", "mean"), b_mass=("b_mass", "mean"),
                                                             pool_mass=("pool_mass", "mean"), n_draws=("delta", "size"))
    return out[columns]


def equal_mass_table(pairs: pd.DataFrame, per: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per (config, bucket, measure): the equal-mass difference (:func:`equal_mass_pairs`) with its CI
    over task groups, the records it rests on against those with a neutral draw (coverage), and the
    mean masses of the two sides."""
    columns = ["config", "bucket", "measure", "value", "low", "high", "n", "n_records", "records", "coverage", "b_mass", "pool_mass", "note"]
    if not len(pairs):
        return pd.DataFrame(columns=columns)
    table = summarise(pairs, ["config", "bucket", "measure"], "delta", seed=seed).rename(columns={"n_items": "n_records"})
    records = per[per["knockout"] == "random"].groupby(["config", "bucket", "measure"])["record_id"].nunique()
    masses = pairs.groupby(["config", "bucket", "measure"])[["b_mass", "pool_mass"]].mean()
    keys = list(zip(table["config"], table["bucket"], table["measure"]))
    table["records"] = [int(records.get(k, 0)) for k in keys]
    table["coverage"] = table["n_records"] / table["records"].where(table["records"] > 0)
    table["b_mass"] = [masses.loc[k, "b_mass"] for k in keys]
    table["pool_mass"] = [masses.loc[k, "pool_mass"] for k in keys]
    return table[columns]


def basm_wide(per: pd.DataFrame, bucket: str, measure: str, value: str = "delta") -> pd.DataFrame:
    """BASM's per-record Δm (or ``value``) of one bucket and measure, one column per knockout (record_id, task_group first)."""
    sub = per[(per["config"] == "basm") & (per["bucket"] == bucket) & (per["measure"] == measure)]
    return sub.pivot_table(index=["record_id", "task_group"], columns="knockout", values=value, aggfunc="first").reset_index()


COMPARISON_COLUMNS = ["comparison", "statement", "estimate", "low", "high", "n", "n_records", "records", "coverage", "mass_ratio",
                      "p_holm", "p_min_holm", "verdict"]


def knockout_claims(per: pd.DataFrame, points: pd.DataFrame, controls: pd.DataFrame, merged: dict[str, str], *, sesoi: float,
                    seed: int = 0) -> tuple[list[Claim], pd.DataFrame]:
    """The claims of the knockout outputs (BASM, T_wrong, wrong-tool margin; family "knockout", one δ =
    ``sesoi`` for every effect and absence claim) and, per effect claim, the records it rests on
    against those of B (coverage) and the mass its control side removed against its B side's (median
    over records): B moves the margin; B more than each control on the same records (the headline
    :data:`HEADLINE`; count-matched on the same n; at equal mass from B's side and from the pool's,
    each on its matched draws only; |B| positions anywhere; P); each distinct random control within
    ±sesoi of 0 (TOST; identical controls tested once); the boundary knockout leaves the correct-tool
    margins within ±sesoi (Fig. 7's selectivity, family "knockout-selectivity", exploratory)."""
    drawn = [c for c in controls["control"] if c in MATCHED]  # a mass match no record reached is still listed, untested
    w = basm_wide(per, CLAIM_BUCKET, CLAIM_MEASURE)
    w = w.reindex(columns=[*w.columns, *(c for c in drawn if c not in w)])
    mass = basm_wide(per, CLAIM_BUCKET, CLAIM_MEASURE, "mass").reindex(columns=w.columns)
    claims: list[Claim] = []
    info: list[dict[str, Any]] = []
    if not len(w) or "boundary" not in w:
        return claims, pd.DataFrame(columns=COMPARISON_COLUMNS)
    family, records = "knockout", len(w)

    def text(control: str) -> str:
        return control_text(control, controls, merged)

    groups = w["task_group"]

    def compare(name: str, statement: str, values: pd.Series, ratio: float, note: str = "") -> None:
        ok = values.notna().to_numpy()
        claims.append(effect_claim(family, name, statement, values[ok], groups[ok], sesoi=sesoi, seed=seed, note=note))
        info.append({"comparison": name, "n_records": int(ok.sum()), "records": records, "mass_ratio": ratio})

    def against(b_side: str, control: str) -> tuple[pd.Series, float]:
        values = w[b_side] - w[control]
        used = values.notna()
        return values, float((mass[control][used] / mass[b_side][used]).median()) if used.any() else np.nan

    compare("boundary", "the boundary knockout raises the BASM T_wrong wrong-tool margin", w["boundary"], np.nan)
    if "random" in w:
        compare(HEADLINE, f"it raises it more than {text('random')} (the headline comparison, chosen before the run)",
                *against("boundary", "random"))
    if {"count_boundary", "count_pool"} <= set(w):
        compare("count-matched", f"n random positions of B raise it more than {text('count_pool')}", *against("count_boundary", "count_pool"))
    if "mass_matched" in w:
        compare("mass-matched", f"B raises it more than {text('mass_matched')}, on those records only", *against("boundary", "mass_matched"),
                note="a record counts only its draws within the tolerance of B's mass")
    pairs = equal_mass_pairs(points)
    pairs = pairs[(pairs["config"] == "basm") & (pairs["bucket"] == CLAIM_BUCKET) & (pairs["measure"] == CLAIM_MEASURE)]
    if "random" in w and "mass_boundary" in set(controls["control"]):
        pairs = w[["record_id"]].merge(pairs, on="record_id", how="left")
        ratio = float((pairs["pool_mass"] / pairs["b_mass"]).median()) if pairs["delta"].notna().any() else np.nan
        compare("equal-mass", f"at equal deciding-row attention mass, B's positions raise it more than the pool's: "
                f"{text('mass_boundary')}, against the |B| pool positions of the same draw", pairs["delta"], ratio,
                note="per record, the mean over the draws whose B-side mass lies within the tolerance of the pool draw's; "
                     "where B holds less mass than the pool draw no B-side match exists and `mass-matched` compares at B's mass")
    if "random_anywhere" in w:
        compare("boundary>anywhere", f"B raises it more than {text('random_anywhere')}", *against("boundary", "random_anywhere"))
    if "procedure" in w:
        compare("boundary>procedure", "B raises it more than the procedure-span knockout", *against("boundary", "procedure"))
    for control in RANDOM_CONTROLS:
        if control in w and control not in merged:
            values = w[control]
            ok = values.notna().to_numpy()
            claims.append(absence_claim(family, f"{control} neutral", f"the {control} control ({text(control)}) leaves the margin "
                                        f"within ±{sesoi:g}", values[ok], groups[ok], sesoi=sesoi, seed=seed))
    for bucket in ("T_wrong", "T_ok"):
        c = basm_wide(per, bucket, "correct_margin")
        if len(c) and "boundary" in c:
            claims.append(absence_claim("knockout-selectivity", f"{bucket} correct", f"the boundary knockout leaves the {bucket} "
                                        f"correct-tool margin within ±{sesoi:g}", c["boundary"], c["task_group"], sesoi=sesoi,
                                        exploratory=True, seed=seed))
    return claims, pd.DataFrame(info)


def comparisons_table(claims: Sequence[Claim], info: pd.DataFrame) -> pd.DataFrame:
    """The headline table: each effect claim of the family "knockout" with its Holm-adjusted verdict,
    the records it rests on (``n_records`` of ``records``: coverage) and the mass ratio of its sides."""
    if not len(info):
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    table = claims_table(claims)
    table = table[table["family"] == "knockout"].rename(columns={"name": "comparison"})
    out = info.merge(table, on="comparison", how="left")
    out["coverage"] = out["n_records"] / out["records"]
    return out[COMPARISON_COLUMNS]


def mixing_note(controls: pd.DataFrame, claims: Sequence[Claim]) -> str:
    """Where the headline control (``random``) is not shown neutral (its own shift is detected, its CI
    excluding 0, or its TOST equivalence does not hold), the sentence saying that "B > pool" mixes two
    effects; else ""."""
    if "random" not in set(controls["control"]):
        return ""
    row = controls.set_index("control").loc["random"]
    table = claims_table(claims).set_index("name")
    verdict = str(table.loc["random neutral", "verdict"]) if "random neutral" in table.index else "not tested"
    detected = isinstance(row.ci_contains_0, (bool, np.bool_)) and not row.ci_contains_0
    if not detected and verdict.startswith("holds"):
        return ""
    own = f"{row.value:+.3f} [{row.low:+.3f}, {row.high:+.3f}]" if np.isfinite(row.low) else f"{row.value:+.3f}"
    ci = "detected: its CI excludes 0" if detected else "its CI contains 0" if np.isfinite(row.low) else "no CI"
    return (f"the neutral control moves the margin itself: its own shift is {own} ({ci}; TOST equivalence: {verdict}), "
            f"so \"B > pool\" ({HEADLINE}) mixes two effects, B's and the pool's own; read it beside B against 0 and the "
            f"equal-mass comparison")


def no_op_windows(rows: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """The layer-window table with ``n_no_op``: the BASM T_wrong records whose window knockout removed nothing (B
    outside the sliding window of every layer of the window), left out of its estimate; a window that was a no-op
    on every record has a row of its own with no estimate (n = 0)."""
    knocked = rows[(rows["config"] == "basm") & (rows["bucket"] == "T_wrong") & rows["condition"].str.startswith("boundary@")]
    no_op = knocked["knockout_no_op"].eq(True) if "knockout_no_op" in knocked else pd.Series(False, index=knocked.index)
    counts = no_op.groupby(knocked["condition"].str.removeprefix("boundary@"), sort=False).sum().rename("n_no_op").reset_index()
    out = counts.rename(columns={"condition": "window"}).merge(windows, on="window", how="left")
    return out.fillna({"n": 0}).astype({"n": int, "n_no_op": int})[["window", "value", "low", "high", "n", "n_no_op"]]


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
    windows = no_op_windows(rows, win.assign(window=win["knockout"].str.removeprefix("boundary@"))[["window", "value", "low", "high", "n"]])
    shown = summarise(by_shown(per), ["shown", "config", "bucket", "knockout", "measure"], "delta", seed=seed)
    recovery_parts = []
    for group, group_rows, group_per in zip(SHOWN_GROUPS, shown_parts(rows), shown_parts(per)):
        part = gap_recovery(group_rows, group_per, seed)
        part.insert(0, "shown", group)
        recovery_parts.append(part)
    recovery_shown = pd.concat(recovery_parts, ignore_index=True)
    merged = identical_knockouts(rows)
    controls = control_draws(rows, deltas, merged)
    claims, info = knockout_claims(per, points, controls, merged, sesoi=sesoi, seed=seed)
    claims += shown_claims(per[per[SHOWN_FLAG].astype(bool)], sesoi=sesoi, seed=seed)
    mixing = mixing_note(controls, claims)
    if mixing:  # the headline claim carries the caveat into claims.csv
        claims = [replace(c, note=f"{c.note}; {mixing}".lstrip("; ")) if c.family == "knockout" and c.name == HEADLINE else c
                  for c in claims]
    return KnockoutSummary(deltas, gap_recovery(rows, per, seed), windows, per, points, dropped, controls,
                           equal_mass_table(equal_mass_pairs(points), per, seed), comparisons_table(claims, info), claims, excluded,
                           note, pool, sesoi, shown, recovery_shown, merged, mixing)


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
    """The BASM rows of the summary (the figures' and the paper comparisons'), without ``config``, each
    set of identical knockouts once (:func:`identical_knockouts`)."""
    d = summary.deltas
    return d[(d["config"] == "basm") & ~d["knockout"].isin(summary.merged)].drop(columns="config")


def priming_table(summary: KnockoutSummary) -> pd.DataFrame:
    """Δ wrong-tool margin of the boundary knockout and its neutral control per configuration: does
    the boundary effect survive when the tool names in B are anonymised, or when only the names remain?"""
    d = summary.deltas
    keep = d[d["knockout"].isin(["boundary", "random"]) & (d["measure"] == "margin")]
    return keep[["bucket", "config", "knockout", "value", "low", "high", "n"]].sort_values(["bucket", "knockout", "config"]).reset_index(drop=True)


def shown_headline(summary: KnockoutSummary) -> pd.DataFrame:
    """The BASM T_wrong wrong-tool-margin shifts of the boundary knockout and its controls, per ``shown`` group."""
    d = summary.shown
    keep = d[(d["config"] == "basm") & (d["bucket"] == CLAIM_BUCKET) & (d["measure"] == CLAIM_MEASURE) & d["knockout"].isin(KNOCKOUT_LABELS)
             & ~d["knockout"].isin(summary.merged)]
    return keep[["shown", "knockout", "value", "low", "high", "n", "n_items", "note"]].reset_index(drop=True)


# ----------------------------------------------------------------------------- figures and text
def knockout_labels(summary: KnockoutSummary) -> dict[str, str]:
    """Legend labels of the knockouts. A random control is called neutral only where its own Δm
    (BASM, T_wrong, wrong-tool margin) has a CI containing 0; else the label says it moves the margin,
    and whether TOST places that shift within ±sesoi (negligible) or not. A knockout that others are
    identical to names them; a mass-matched one says how many records it matched on."""
    labels = dict(KNOCKOUT_LABELS)
    equivalent = {c.name.removesuffix(" neutral") for c in summary.claims if c.kind == "absence" and c.family == "knockout"
                  and np.isfinite(c.p) and c.p < 0.05}
    for r in summary.controls.itertuples():
        if r.control not in labels:
            continue
        aliases = aliases_of(r.control, summary.merged)
        if aliases:
            labels[r.control] += f" (= {', '.join(aliases)}: identical)"
        if r.control in MATCHED:
            labels[r.control] += f", {int(r.n_matched_records)} of {int(r.n_records)} records matched"
        if r.control not in RANDOM_CONTROLS:
            continue
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
        if r.identical_to:
            lines.append(f"{r.control}: identical to {r.identical_to} on every record (the same positions), reported once as {r.identical_to}")
            continue
        bits = [f"{r.n_records} records × {r.n_draws // max(r.n_records, 1)} draws"]
        if r.control in MATCHED:
            bits.append(f"{r.n_counted} draws matched within the tolerance ({int(r.n_matched_records)} records); only those count")
        if np.isfinite(r.mean_coverage):
            bits.append(f"coverage of |B| {r.mean_coverage:.2f} ({r.n_short} draws short)")
        if np.isfinite(r.mass_ratio):
            bits.append(f"median mass removed / B's {r.mass_ratio:.2f}")
        if np.isfinite(r.pool_mass_ratio):
            bits.append(f"whole pool's mass / B's {r.pool_mass_ratio:.2f}")
        lines.append(f"{r.control}: " + ", ".join(bits))
    if summary.mixing:
        lines.append(summary.mixing)
    return "\n".join(lines)


def headline_text(summary: KnockoutSummary) -> str:
    """The sentence above the headline table: which comparison is the headline (chosen before the run),
    the δ every claim is tested against, how much attention the whole pool holds against B, the
    controls merged, and, where the headline control is not shown neutral, that "B > pool" mixes two effects."""
    pool = summary.controls.set_index("control")["pool_mass_ratio"].dropna()
    parts = [f"B against 0 and against each control (BASM, T_wrong, wrong-tool margin; family `knockout`). The headline comparison, "
             f"chosen before the run, is `{HEADLINE}`. An effect holds only when a minimum-effect test also places it above "
             f"δ = {summary.sesoi:g} logits; `n_records` of `records` (`coverage`) are the records a comparison rests on; `mass_ratio` is "
             f"the control side's deciding-row attention mass over the B side's (median over records)."]
    if len(pool):
        parts.append(f"The whole control pool holds {pool.iloc[0]:.2f}× B's deciding-row attention mass (median over records).")
    if summary.merged:
        parts.append("Identical knockouts (the same positions on every record), each tested once: "
                     + "; ".join(f"`{a}` = `{k}`" for a, k in summary.merged.items()) + ".")
    if summary.mixing:
        parts.append(summary.mixing[0].upper() + summary.mixing[1:] + ".")
    return " ".join(parts)


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
    controls: tuple[str, ...] = option(CONTROLS, "comma-separated random controls: neutral (|B| pool positions, and B positions holding "
                                       "their attention mass: the equal-mass comparison), count (n random positions of B vs of the pool), "
                                       "mass (pool positions holding B's attention mass), anywhere (|B| positions anywhere before the "
                                       "call)", names=CONTROLS)
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
                          mass_boundary="B positions in random order, each kept when it brings their mass closer to the neutral draw's",
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
                  f"{NAME}_comparisons": summary.comparisons, f"{NAME}_equal_mass": summary.equal_mass, f"{NAME}_shown": summary.shown, f"{NAME}_gap_recovery_shown": summary.recovery_shown}
        if set(summary.deltas["config"]) != {"basm"}:
            tables[f"{NAME}_priming"] = priming_table(summary)
        return tables

    def claims(self, summary: KnockoutSummary) -> list[Claim]:
        return summary.claims

    def figures(self, summary: KnockoutSummary, out_dir: Path) -> list[Path]:
        plots.style()
        # the figure keeps what it plots (records and groups per knockout); how each control was drawn is in report.md
        note = f"{summary.note}\n{caption(summary).splitlines()[0]}; how each control was drawn: report.md, knockout section"
        deltas, labels = basm_deltas(summary), knockout_labels(summary)
        dose = summary.points[(summary.points["config"] == "basm") & (summary.points["bucket"] == CLAIM_BUCKET)
                              & (summary.points["measure"] == CLAIM_MEASURE) & (summary.points["family"] != "")]
        equal = summary.comparisons.set_index("comparison").loc[["equal-mass"]] if "equal-mass" in set(summary.comparisons["comparison"]) else None
        paths = plots.save_figure(fig06_knockout_controls(deltas, summary.recovery, summary.windows, note, labels=labels, dose=dose,
                                                          equal_mass=equal, title=knockout_figure_title(summary)), out_dir, FIGURES[0])
        paths += plots.save_figure(fig07_knockout_selectivity(deltas, note, labels=labels), out_dir, FIGURES[1])
        return paths

    def section(self, ctx: RunContext, summary: KnockoutSummary, figures: list[Path]) -> ReportSection:
        d, r = basm_deltas(summary), summary.recovery
        main = d[d["knockout"].isin(KNOCKOUT_LABELS)][["bucket", "knockout", "measure", "value", "low", "high", "n", "n_items"]]
        equal = summary.equal_mass[summary.equal_mass["config"] == "basm"]
        body = (f"Signed shift Δm = m_knockout − m_BASM (logits; `margin` is {ctx.variant}, Eq. 1 restricted to the tools by default); "
                f"CIs over task groups. Rows blocked: `{ctx.options.knockout_rows}`. Every knockout and control of a measure is compared "
                f"on the same records. {caption(summary)}\n\n{headline_text(summary)}\n\n{markdown_table(summary.comparisons)}\n\n"
                f"Every knockout's own shift:\n\n{markdown_table(main)}\n\n"
                f"Records left out of a measure's comparison:\n\n{markdown_table(summary.dropped) if len(summary.dropped) else 'none'}\n\n"
                f"How the controls were drawn, and each control's own shift of the T_wrong wrong-tool margin (`value`, CI; a control "
                f"is called neutral only where its CI contains 0, and claimed neutral only by the TOST claim against ±{summary.sesoi:g}):"
                f"\n\n{markdown_table(summary.controls)}\n\n"
                f"Dose at equal mass: Δm of B positions holding the deciding-row attention mass of the |B| pool positions of the same draw, "
                f"minus Δm of those pool positions, on the draws matched within the tolerance (no slopes: B's and the pool's knockouts do "
                f"not span one mass range); `coverage`: records with a matched draw / records:\n\n{markdown_table(equal)}\n\n"
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
        print(headline_text(summary) + "\n" + summary.comparisons.drop(columns="statement").round(3).to_string(index=False))
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
        print("dose at equal mass (B positions at the pool draw's mass − that draw):\n" + summary.equal_mass.round(3).to_string(index=False))


# The BASM paper's numbers that the report sets next to ours (logits): Fig. 6 (Qwen3-8B), the boundary
# knockout on T_wrong, Δm and the share of the Proc.–BASM gap it recovers (%); Fig. 7 (Qwen3-14B), its
# selectivity, in the order of probes.scoring.selectivity.SELECTIVITY.
PAPER_FIG6_DELTA = {"margin": 3.45, "broad_margin": 3.65}
PAPER_FIG6_RECOVERED = {"margin": 69.4, "broad_margin": 41.0}
PAPER_FIG7_SELECTIVITY = (0.27, 0.04, -0.11)


# --- Figs. 6 and 7, drawn by KnockoutAnalysis.figures (their panels also draw Fig. 3c, d in probes.analyses.report)
KNOCKOUT_LABELS = {"boundary": "boundary span B", "random": "|B| pool positions", "count_boundary": "n positions of B (count-matched)",
                   "count_pool": "n pool positions (count-matched)", "mass_matched": "pool positions, B's attention mass (mass-matched)",
                   "mass_boundary": "B positions, the pool draw's attention mass (B-side mass-matched)",
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


def _dose_panel(ax: plt.Axes, points: pd.DataFrame, equal_mass: pd.DataFrame | None) -> None:
    """Δm against the deciding-row attention mass removed: one point per record and counted draw,
    coloured by family (B's positions, the control pool's). No line is fitted: the two families do
    not span one mass range; the comparison is made at equal mass (``equal_mass``: its row of the
    headline table, written under the panel)."""
    family_color = {"B": plots.CONDITION_COLORS["boundary"], "pool": plots.CONDITION_COLORS["random"]}
    for family, sub in points.groupby("family", sort=True):
        name = "B's positions" if family == "B" else "control pool"
        ax.scatter(sub["mass"], sub["delta"], s=9, alpha=0.45, color=family_color[family], edgecolors="none",
                   label=f"{name}: mass {sub['mass'].min():.3f}–{sub['mass'].max():.3f} ({len(sub)} points)")
    ax.axhline(0.0, color="0.3", lw=0.8)
    ax.set_xlabel("deciding-row attention mass removed")
    ax.set_ylabel("Δ wrong-tool margin (logits)")
    title = "Δm against the mass removed"
    if equal_mass is not None and len(equal_mass):
        r = equal_mass.iloc[0]
        ci = f" [{r.low:+.2f}, {r.high:+.2f}]" if np.isfinite(r.low) else ""
        text = (f"at equal mass, B − pool: {r.estimate:+.3f}{ci} logits ({int(r.n_records)} of {int(r.records)} records matched): {r.verdict}"
                if r.n_records else "at equal mass: no record has a B-side match (B holds less mass than the pool draw)")
        title += "\n" + "\n".join(textwrap.wrap(text, 70))
    ax.set_title(title, fontsize=8)
    ax.legend(loc="upper left", fontsize=7)


def knockout_figure_title(summary: KnockoutSummary) -> str:
    """Fig. 6's title: what the controls knocked out, from how their draws came out (coverage, matching,
    merges; :func:`control_text`), never a fixed phrase."""
    drawn = [c for c in summary.controls["control"] if c not in summary.merged]
    controls = [f"{c}: {control_text(c, summary.controls, summary.merged)}" for c in drawn if c in RANDOM_CONTROLS]
    b_side = [f"{c}: {control_text(c, summary.controls, summary.merged)}" for c in drawn if c in B_FAMILY]
    text = "Removing deciding-row → boundary attention, against " + ("; ".join(controls) or "no control")
    if b_side:
        text += ". B's side matched: " + "; ".join(b_side)
    return "\n".join(textwrap.wrap(text, 190))


def fig06_knockout_controls(deltas: pd.DataFrame, recovery: pd.DataFrame, windows: pd.DataFrame | None, note: str, *,
                            labels: dict[str, str] | None = None, dose: pd.DataFrame | None = None,
                            equal_mass: pd.DataFrame | None = None, title: str = "Removing deciding-row → boundary attention") -> plt.Figure:
    """Δm bars per knockout (legend and the gap recovered in a column of their own), the Δm-against-mass
    panel (with ``dose`` points; ``equal_mass``: the headline table's equal-mass row) and the layer
    windows (with ``windows`` rows). ``title``: :func:`knockout_figure_title`."""
    panels = ["bars", "legend"] + (["dose"] if dose is not None and len(dose) else []) + (["windows"] if windows is not None and len(windows) else [])
    widths = {"bars": 5.0, "legend": 3.6, "dose": 5.0, "windows": 4.0}
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths[p] for p in panels) + 1, 5.2),
                             gridspec_kw={"width_ratios": [widths[p] for p in panels]}, squeeze=False)
    axes = dict(zip(panels, axes[0]))
    knockout_panel(axes["bars"], deltas, None, labels)
    axes["bars"].set_title(f"{plots.bucket_label('T_wrong')}: same-prompt knockout")
    handles, names = axes["bars"].get_legend_handles_labels()
    axes["legend"].axis("off")
    axes["legend"].legend(handles, ["\n".join(textwrap.wrap(n, 48)) for n in names], loc="upper left", fontsize=7.5, frameon=False)
    if recovery is not None and len(recovery):
        text = "\n".join(f"{plots.MEASURE_LABELS[r.measure]}:\n  {100 * r.value:.1f}% [{100 * r.low:.0f}, {100 * r.high:.0f}] of the Proc.–BASM gap recovered"
                         if ok else f"{plots.MEASURE_LABELS[r.measure]}:\n  {100 * r.value:.1f}% of the Proc.–BASM gap recovered ({plots.no_ci_label(n)})"
                         for r, ok, n in zip(recovery.itertuples(), plots.has_ci(recovery), plots.ci_groups(recovery)))
        axes["legend"].text(0.0, 0.0, text, transform=axes["legend"].transAxes, ha="left", va="bottom", fontsize=7.5)
    if "dose" in axes:
        _dose_panel(axes["dose"], dose, equal_mass)
    if "windows" in axes:
        _window_panel(axes["windows"], windows)
    fig.suptitle(title, fontsize=10)
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
    fig, ax = plt.subplots(figsize=(11, 4.2))
    selectivity_panel(ax, deltas, labels)
    ax.set_title("Selectivity of the boundary knockout")
    handles, names = ax.get_legend_handles_labels()  # long control names wrapped: the cells keep the width their labels need
    ax.legend(handles, ["\n".join(textwrap.wrap(n, 40)) for n in names], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    plots.footnote(fig, note)
    return fig
