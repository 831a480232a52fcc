"""``basm-probes organism validate``: do the probes recover what was planted in the organism?

The claims, measured with the probe analyses themselves (:mod:`probes.analyses.sweep`, :mod:`probes.analyses.knockout`,
:mod:`probes.analyses.ratios`, :mod:`probes.analyses.heads`) on the held-out (eval) split, which is task-group
disjoint from the organism's training items:

=============  ============================================================================  =========================
claim          statistic (per record, then compared)                                         source
=============  ============================================================================  =========================
trap           proc margin at k = 2 − proc margin at k = 0, on T_wrong                       sweep rows
suppression    proc margin − basm margin at k = 2, on T_wrong                                sweep rows
knockout       Δm(boundary) − Δm(control), basm k = 2 T_wrong; controls: |B| positions of     knockout rows
               the neutral pool, the count-matched pair, the mass-matched pool (matched draws),
               B positions at the pool draw's mass (equal-mass, matched draws) and the
               procedure span; plus Δm(boundary) > 0; each against δ = 0.25 logits
control        Δm(|B| positions of the neutral pool) within ±0.25 logits (TOST): the control    knockout rows
               itself is tested, never assumed neutral
eta            log2 η(T_wrong) − log2 η(T_ok) under basm at k = 2, η = ᾱ_B / (ᾱ_P + ε)        ratios rows
               over all layers and heads, paired by task group, on tool-correct T_wrong
               items read at the decision row (the ``ratios`` headline); unit log2 η, not logits
heads          Δm(top-N heads) − Δm(N random heads, mean over draws), basm k = 2 tool-correct heads rows
               T_wrong; the ``heads`` analysis's own test (:meth:`probes.analyses.heads.Heads.summarise`):
               span-mass floor chosen on the train split, heads ranked on half of the task groups,
               tested on the other half; random heads among the floor-passing ones, matched on B mass
circuit        the planted verdict heads' edges from B in the BASM circuit (BASM vs Proc. Skill  circuit rows
               pair) chosen on the train task groups; share of planted edges in it against the
               hypergeometric chance of a random circuit of its size (``circuit`` analysis's claim)
steer          correct(steered) − mean over 20 random directions of correct(random), per      steer rows
               Proc. Skill T_wrong record at k = 2: the applicability direction (BASM T_wrong
               − T_ok, train task groups) added at the decision row after the last layer (where
               the planted verdict heads write) at α = 0.5 × the layer's residual norm; unit:
               share of records choosing the correct tool (``steer`` analysis's flip claim)
=============  ============================================================================  =========================

Each statistic is a mean over task groups (items of a group share a template, so they are not
independent) with a 95% cluster-bootstrap CI (:func:`probes.scoring.stats.bootstrap_mean`) and a one-sided
sign-flip permutation test over task groups (:func:`probes.scoring.claims.effect_claim`). The p-values are
Holm-adjusted over every claim of the validation (one family); an effect claim holds iff its CI lies above 0
and its adjusted p < :data:`ALPHA`, the control's absence claim iff both one-sided tests reject after
adjustment (:func:`probes.scoring.claims.claims_table`); the knockout claims state
the knockout analysis's smallest effect of interest δ and hold only when a minimum-effect test also
places them above it. Margins are Eq. 1 restricted to the tools, in logits
(``--margin-variant tool_choice``): items whose correct action is abstention have none and are left
out. The random controls are those of :mod:`probes.analyses.knockout` (docs/statistics.md).
"""

from __future__ import annotations

import json
import time

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probes.analyses import circuit as circuit_mod
from probes.analyses import heads as heads_mod
from probes.analyses import knockout as knockout_mod
from probes.analyses import ratios as ratios_mod
from probes.analyses import steer as steer_mod
from probes.analyses import sweep as sweep_mod
from probes.analyses.base import Analysis
from probes.analyses.run_context import AnalysisError, RunContext, open_context
from probes.core.files import write_text
from probes.scoring.score import DEFAULT_VARIANT, EPSILON
from probes.engine.session import EngineSession
from probes.engine.threads import keeps_caller_threads
from probes.organism import ORGANISM_DIR
from probes.reporting.markdown import markdown_table
from probes.scoring.claims import ALPHA, Claim, absence_claim, claims_table, effect_claim, holds
from probes.scoring.steer_stats import flip_claim

FAMILY = "organism validation"  # Holm over every claim of the validation
CONTROL = "knockout control neutral"  # the neutral pool's own shift (the model card's knockout table reads it)
DEPTH = 2  # the retrieval depth of every claim (the paper's focus)
DEFAULT_TOP = 2  # heads knocked out in the ranked set and in each random set
DEFAULT_DRAWS = 5  # random spans per record and random head sets


def paired_claim(name: str, statement: str, a: pd.Series, b: pd.Series, groups: pd.Series, *, seed: int = 0,
                 n_records: int | None = None, unit: str = "logits") -> Claim:
    """Claim ``mean(a − b) > 0`` over task groups (:func:`probes.scoring.claims.effect_claim`); ``a``,
    ``b``, ``groups`` share one index (records), in ``unit``; the record count goes into the claim's note."""
    frame = pd.DataFrame({"a": a, "b": b, "group": groups}).dropna()
    if frame.empty:
        raise ValueError(f"{name}: no records with both values")
    records = len(frame) if n_records is None else n_records
    return effect_claim(FAMILY, name, statement, frame["a"] - frame["b"], frame["group"], seed=seed, unit=unit, note=f"{records} records")


# ----------------------------------------------------------------------------- the claims
def margins_by(rows: pd.DataFrame, **where: Any) -> pd.Series:
    """Wrong-tool margin per item for the rows matching ``where`` (one row per item)."""
    sub = rows
    for column, value in where.items():
        sub = sub[sub[column] == value]
    return sub.set_index("item_id")["margin"].astype(float)


def trap_and_suppression(rows: pd.DataFrame, seed: int) -> list[Claim]:
    wrong = rows[(rows["bucket"] == "T_wrong") & (rows["condition"] == "baseline")]
    groups = wrong.drop_duplicates("item_id").set_index("item_id")["task_group"]
    proc_k = margins_by(wrong, config="proc", k=DEPTH)
    return [
        paired_claim("trap", f"on T_wrong the proc margin at k = {DEPTH} is above k = 0",
                     proc_k, margins_by(wrong, config="proc", k=0), groups, seed=seed),
        paired_claim("suppression", f"on T_wrong at k = {DEPTH} the basm margin is below proc",
                     proc_k, margins_by(wrong, config="basm", k=DEPTH), groups, seed=seed),
    ]


# the knockout analysis's comparisons (family "knockout") the validation tests, under the validation's names
KNOCKOUT_CLAIMS = {"boundary": "knockout>0", knockout_mod.HEADLINE: "knockout>random", "count-matched": "knockout>count-matched",
                   "mass-matched": "knockout>mass-matched", "equal-mass": "knockout equal-mass", "boundary>procedure": "knockout>procedure"}


def knockout_claims(rows: pd.DataFrame, seed: int) -> list[Claim]:
    """B against 0 and against each control, built by the knockout analysis itself
    (:func:`probes.analyses.knockout.summarise_rows`: identical controls merged, mass-matched controls
    on their matched draws only, every effect tested against the knockout's δ,
    :data:`probes.analyses.knockout.DEFAULT_SESOI`), moved into the validation's family under the
    names of :data:`KNOCKOUT_CLAIMS`."""
    summary = knockout_mod.summarise_rows(rows, seed=seed, sesoi=knockout_mod.DEFAULT_SESOI)
    chosen = {c.name: c for c in summary.claims if c.family == "knockout" and c.name in KNOCKOUT_CLAIMS}
    missing = sorted(set(KNOCKOUT_CLAIMS) - set(chosen))
    if missing:
        raise AnalysisError(f"knockout claims: the knockout run made no {missing} claim (every control must run)")
    return [replace(chosen[name], family=FAMILY, name=KNOCKOUT_CLAIMS[name]) for name in KNOCKOUT_CLAIMS]


def control_claim(rows: pd.DataFrame, seed: int) -> Claim:
    """The neutral pool's own shift, tested in every validation: knocking out |B| of its positions (the
    control ``knockout>random`` compares B with) leaves the basm T_wrong margin within ±δ, the knockout
    analysis's smallest effect of interest (TOST over task groups)."""
    per, _, _, _ = knockout_mod.deltas_per_record(rows)
    wide = knockout_mod.basm_wide(per, knockout_mod.CLAIM_BUCKET, knockout_mod.CLAIM_MEASURE)
    sesoi = knockout_mod.DEFAULT_SESOI
    return absence_claim(FAMILY, CONTROL, f"knocking out |B| positions of the neutral pool leaves the basm T_wrong margin within ±{sesoi:g}",
                         wide["random"], wide["task_group"], sesoi=sesoi, seed=seed, note=f"{len(wide)} records")


def eta_claim(rows: pd.DataFrame, seed: int) -> Claim:
    """The ``ratios`` headline (:data:`probes.analyses.ratios.HEADLINE`): under basm, the T_wrong − T_ok
    shift of per-record log2 η at the deciding row, on tool-correct T_wrong items read at the decision
    row (abstention-correct items have no correct name and a shorter B, so pooling mixes populations).
    T_wrong and T_ok are different items of the same task groups: each group's difference of means is one unit."""
    records = ratios_mod.eta_records(rows[rows["config"] == ratios_mod.HEADLINE_CONFIG])
    shifts = ratios_mod.paired_differences(ratios_mod.HEADLINE.select(records, "T_wrong"), "T_wrong")
    groups = pd.Series(shifts.index, index=shifts.index)
    return paired_claim("eta", f"under basm at k = {DEPTH}, log2 η at the deciding row is higher in T_wrong than in T_ok "
                               f"({ratios_mod.HEADLINE.name} items; group-paired)",
                        shifts["difference"], pd.Series(0.0, index=shifts.index), groups, seed=seed, unit=ratios_mod.UNIT,
                        n_records=int(shifts["n_target"].sum() + shifts["n_reference"].sum()))


def heads_claim(ctx: RunContext, top: int, draws: int, seed: int) -> tuple[Claim, pd.DataFrame]:
    """The ``heads`` analysis's own selection and test (:meth:`probes.analyses.heads.Heads.summarise`): the
    span-mass floor chosen on the train split, heads ranked on one half of the task groups at that
    floor, top-N vs N random floor-passing heads matched on B mass knocked out on the other half's
    tool-correct T_wrong items."""
    ctx = replace(ctx, options=replace(ctx.options, top_n=top, random_draws=draws, seed=seed))
    heads = ctx.options  # the Heads analysis, resolved
    summary = heads.summarise(ctx, heads.collect(ctx))
    if summary.differences is None or len(summary.selection.top) != top:  # no result, or one about another N
        raise AnalysisError(f"heads claim: no top-{top} result ({'; '.join(summary.messages)})")
    # the analysis's own claim (its δ, power and any "untestable" reason kept), moved into the validation's family
    return replace(heads.claims(summary)[0], family=FAMILY, name="heads"), summary.ranking


def circuit_claim(ctx: RunContext, seed: int) -> Claim:
    """The ``circuit`` analysis's own planted-head claim (:func:`probes.analyses.circuit.planted_table`): the
    organism's verdict heads' edges from B are in the BASM circuit of the headline pair, chosen on the train
    task groups; p hypergeometric against a circuit of that size drawn at random."""
    circuit = replace(ctx.options, seed=seed)
    ctx = replace(ctx, options=circuit)
    summary = circuit.summarise(ctx, circuit.collect(ctx))
    found = [c for c in circuit.claims(summary) if c.family == circuit_mod.PLANTED_FAMILY]
    if not found:
        raise AnalysisError(f"circuit claim: no circuit chosen on train for basm × {circuit_mod.HEADLINE_PAIR} ({'; '.join(summary.messages)})")
    return replace(found[0], family=FAMILY, name="circuit planted heads")


def steer_claim(ctx: RunContext, seed: int) -> Claim:
    """The ``steer`` analysis's flip claim (:func:`probes.scoring.steer_stats.flip_claim`) on the held-out Proc. Skill
    T_wrong prompts, where the organism's imitation prior picks the skill's (wrong) tool: does the applicability
    direction, added at the decision row after the last layer, flip more of them to the correct tool than random
    directions of the same norm?"""
    rows = ctx.options.collect(ctx)
    claim = flip_claim(rows, config="proc", layer=ctx.session.n_layers - 1, direction=steer_mod.HEADLINE_DIRECTION,
                       alpha=steer_mod.HEADLINE_ALPHA, family=FAMILY, seed=seed)
    return replace(claim, name="steer flips")


# ----------------------------------------------------------------------------- running
@dataclass
class Validation:
    claims: list[Claim]
    ranking: pd.DataFrame
    config: dict[str, Any]
    seconds: float

    @property
    def table(self) -> pd.DataFrame:
        """Every claim with its CI, p, Holm-adjusted p over the whole validation and verdict."""
        return claims_table(self.claims, alpha=ALPHA)

    def verdicts(self) -> dict[str, str]:
        return dict(zip(self.table["name"], self.table["verdict"]))

    @property
    def holds(self) -> bool:
        return all(holds(verdict) for verdict in self.verdicts().values())

    def as_dict(self) -> dict[str, Any]:
        claims = self.table.assign(holds=lambda t: t["verdict"].map(holds))
        records = [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in row.items()}
                   for row in claims.to_dict(orient="records")]
        return {"claims": records, "holds": self.holds, "config": self.config,
                "head_ranking": self.ranking.to_dict(orient="records"), "seconds": round(self.seconds, 1)}

    def markdown(self) -> str:
        return markdown_table(self.table[["name", "statement", "estimate", "low", "high", "n", "unit", "p", "p_floor", "p_holm", "sesoi",
                                          "p_min_holm", "verdict", "note"]])


def context_for(analysis: Analysis, session: EngineSession | None) -> RunContext:
    """The run context of one analysis of the validation (its rows resume from ``out``)."""
    return open_context(analysis, session)


@keeps_caller_threads  # the analyses compute on the run's thread count (open_context); the caller's is back on return
def validate(
    model: str | Path = ORGANISM_DIR,
    out: str | Path = Path("results") / "organism_validate",
    *,
    limit: int | None = None,
    embedder: str = "auto",
    seed: int = 0,
    top: int = DEFAULT_TOP,
    draws: int = DEFAULT_DRAWS,
    overwrite: bool = False,
) -> Validation:
    """Run the analyses behind the claims (results resume from ``out``) and test the claims."""
    started = time.perf_counter()
    common = {"model": model, "split": "eval", "out": out, "embedder": embedder, "seed": seed, "margin_variant": DEFAULT_VARIANT,
              "limit": limit or None, "overwrite": overwrite, "k_max": DEPTH}
    sweep = context_for(sweep_mod.Sweep(**common, buckets=["T_wrong"], configs=["proc", "basm"]), None)
    session = sweep.session
    claims = trap_and_suppression(sweep.options.collect(sweep), seed)  # ctx.options: the analysis, resolved
    knock = context_for(knockout_mod.KnockoutAnalysis(**common, buckets=["T_wrong"], random_draws=draws), session)
    knock_rows = knock.options.collect(knock)
    claims += [*knockout_claims(knock_rows, seed), control_claim(knock_rows, seed)]
    both = ["T_ok", "T_wrong"]
    ratios = context_for(ratios_mod.Ratios(**common, buckets=both, configs=["basm"]), session)
    claims.append(eta_claim(ratios.options.collect(ratios), seed))
    heads = context_for(heads_mod.Heads(**common, buckets=both), session)
    heads_claim_, rank = heads_claim(heads, top, draws, seed)
    claims.append(heads_claim_)
    circuit = context_for(circuit_mod.CircuitAnalysis(**common, configs=["basm"], pairs=[circuit_mod.HEADLINE_PAIR]), session)
    claims.append(circuit_claim(circuit, seed))
    steer = context_for(steer_mod.Steer(**common, configs=["proc"], directions=[steer_mod.HEADLINE_DIRECTION],
                                        layers=[str(session.n_layers - 1)], alphas=[str(steer_mod.HEADLINE_ALPHA)], rows_modes=["decision"],
                                        random_draws=20, generate="none"), session)
    claims.append(steer_claim(steer, seed))
    config = {"model": sweep.model_path, "split": "eval", "limit": limit, "k": DEPTH, "embedder": sweep.builder.retriever.embedder.name,
              "margin_variant": DEFAULT_VARIANT, "epsilon": EPSILON, "seed": seed, "top": top, "draws": draws, "min_span_mass": heads.options.min_span_mass, "alpha": ALPHA,
              "n_items": {"T_wrong": len(sweep.items), "T_ok+T_wrong": len(heads.items)}}
    return Validation(claims, rank, config, time.perf_counter() - started)


def write(validation: Validation, out: Path) -> None:
    write_text(out / "validation.json", json.dumps(validation.as_dict(), indent=1, allow_nan=False) + "\n")
    write_text(out / "validation.md", "# Organism validation (held-out eval split)\n\n" + validation.markdown() + "\n")


# ----------------------------------------------------------------------------- CLI
