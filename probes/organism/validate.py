"""``basm-probes organism validate``: do the probes recover what was planted in the organism?

Five claims, measured with the probe analyses themselves (:mod:`probes.analyses.sweep`, :mod:`probes.analyses.knockout`,
:mod:`probes.analyses.ratios`, :mod:`probes.analyses.heads`) on the held-out (eval) split, which is task-group
disjoint from the organism's training items:

=============  ============================================================================  =========================
claim          statistic (per record, then compared)                                         source
=============  ============================================================================  =========================
trap           proc margin at k = 2 − proc margin at k = 0, on T_wrong                       sweep rows
suppression    proc margin − basm margin at k = 2, on T_wrong                                sweep rows
knockout       Δm(boundary) − Δm(control), basm k = 2 T_wrong; controls: |B| positions of     knockout rows
               the neutral pool, the count-matched pair, the mass-matched pool, the dose
               slopes (per group) and the procedure span; plus Δm(boundary) > 0
eta            log2 η(T_wrong) − log2 η(T_ok) under basm at k = 2, η = ᾱ_B / (ᾱ_P + ε)        ratios rows
               over all layers and heads, paired by task group, on tool-correct T_wrong
               items read at the decision row (the ``ratios`` headline)
heads          Δm(top-N heads) − Δm(N random heads, mean over draws), basm k = 2 tool-correct heads rows
               T_wrong; the ``heads`` analysis's own test (:meth:`probes.analyses.heads.Heads.summarise`):
               span-mass floor chosen on the train split, heads ranked on half of the task groups,
               tested on the other half; random heads among the floor-passing ones, matched on B mass
=============  ============================================================================  =========================

Each statistic is a mean over task groups (items of a group share a template, so they are not
independent) with a 95% cluster-bootstrap CI (:func:`probes.scoring.stats.bootstrap_mean`) and a one-sided
sign-flip permutation test over task groups (:func:`probes.scoring.claims.effect_claim`). The p-values are
Holm-adjusted over every claim of the validation (one family); a claim holds iff its CI lies above 0
and its adjusted p < :data:`ALPHA` (:func:`probes.scoring.claims.claims_table`). Margins are Eq. 1 restricted to the tools, in logits
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

from probes.analyses import heads as heads_mod
from probes.analyses import knockout as knockout_mod
from probes.analyses import ratios as ratios_mod
from probes.analyses import sweep as sweep_mod
from probes.analyses.base import Analysis
from probes.analyses.run_context import AnalysisError, RunContext, open_context
from probes.core.files import write_text
from probes.scoring.score import DEFAULT_VARIANT, EPSILON
from probes.engine.session import EngineSession
from probes.engine.threads import keeps_caller_threads
from probes.organism import ORGANISM_DIR
from probes.reporting.markdown import markdown_table
from probes.scoring.claims import ALPHA, Claim, claims_table, effect_claim

FAMILY = "organism validation"  # Holm over every claim of the validation
DEPTH = 2  # the retrieval depth of every claim (the paper's focus)
DEFAULT_TOP = 2  # heads knocked out in the ranked set and in each random set
DEFAULT_DRAWS = 5  # random spans per record and random head sets


def paired_claim(name: str, statement: str, a: pd.Series, b: pd.Series, groups: pd.Series, *, seed: int = 0,
                 n_records: int | None = None) -> Claim:
    """Claim ``mean(a − b) > 0`` over task groups (:func:`probes.scoring.claims.effect_claim`); ``a``,
    ``b``, ``groups`` share one index (records); the record count goes into the claim's note."""
    frame = pd.DataFrame({"a": a, "b": b, "group": groups}).dropna()
    if frame.empty:
        raise ValueError(f"{name}: no records with both values")
    records = len(frame) if n_records is None else n_records
    return effect_claim(FAMILY, name, statement, frame["a"] - frame["b"], frame["group"], seed=seed, note=f"{records} records")


# ----------------------------------------------------------------------------- the five claims
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


def knockout_claims(rows: pd.DataFrame, seed: int) -> list[Claim]:
    """B against 0 and against each control of the knockout analysis, per record on the same records
    (:func:`probes.analyses.knockout.deltas_per_record`): the neutral pool's |B| positions, the
    count-matched pair, the mass-matched pool (records whose draws match B's mass), the dose slopes
    (per task group) and P."""
    per, points, _, _ = knockout_mod.deltas_per_record(rows)
    per = per[(per["config"] == "basm") & (per["bucket"] == "T_wrong") & (per["measure"] == "margin")]
    wide = per.pivot_table(index=["item_id", "task_group"], columns="knockout", values="delta", aggfunc="first")
    wide = wide.reset_index().set_index("item_id")
    groups = wide["task_group"]
    zero = pd.Series(0.0, index=wide.index)
    claims = [
        paired_claim("knockout>0", "boundary knockout raises the basm T_wrong margin", wide["boundary"], zero, groups, seed=seed),
        paired_claim("knockout>random", "boundary knockout raises it more than |B| random positions of the neutral pool (the memory "
                     "block outside B, P, their section labels and every line naming a tool)", wide["boundary"], wide["random"], groups, seed=seed),
        paired_claim("knockout>count-matched", "n random positions of B raise it more than n random positions of that pool "
                     "(n = min(|B|, |pool|))", wide["count_boundary"], wide["count_pool"], groups, seed=seed),
    ]
    matched = rows[(rows["config"] == "basm") & rows["condition"].str.startswith("mass_")].groupby("item_id")["control_matched"].all()
    ok = pd.Series(wide.index.map(matched), index=wide.index).fillna(False).astype(bool)
    statement = "boundary knockout raises it more than pool positions holding B's attention mass"
    matched_note = f"{int(ok.sum())} of {len(ok)} records have draws matching B's mass (elsewhere the whole pool holds less attention than B)"
    # always listed: where no record can be matched the claim is "not tested", never silently dropped
    claims.append(effect_claim(FAMILY, "knockout>mass-matched", statement, (wide["boundary"] - wide["mass_matched"])[ok], groups[ok],
                               seed=seed, note=matched_note))
    dose = points[(points["config"] == "basm") & (points["bucket"] == "T_wrong") & (points["measure"] == "margin")]
    slopes = knockout_mod.slope_differences(dose)
    claims.append(paired_claim("knockout dose", "per unit of deciding-row attention removed, B's positions raise it more than the "
                               "pool's (slope difference per task group)", slopes, pd.Series(0.0, index=slopes.index),
                               pd.Series(slopes.index, index=slopes.index), seed=seed))
    claims.append(paired_claim("knockout>procedure", "boundary knockout raises it more than the procedure-span knockout",
                               wide["boundary"], wide["procedure"], groups, seed=seed))
    return claims


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
                        shifts["difference"], pd.Series(0.0, index=shifts.index), groups, seed=seed,
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
    values = summary.differences
    claim = paired_claim("heads", heads.claims(summary)[0].statement, values["value"], pd.Series(0.0, index=values.index),
                         values["task_group"], seed=seed)
    return claim, summary.ranking


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
        return all(verdict == "holds" for verdict in self.verdicts().values())

    def as_dict(self) -> dict[str, Any]:
        claims = self.table.assign(holds=lambda t: t["verdict"] == "holds")
        records = [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in row.items()}
                   for row in claims.to_dict(orient="records")]
        return {"claims": records, "holds": self.holds, "config": self.config,
                "head_ranking": self.ranking.to_dict(orient="records"), "seconds": round(self.seconds, 1)}

    def markdown(self) -> str:
        return markdown_table(self.table[["name", "statement", "estimate", "low", "high", "n", "p", "p_floor", "p_holm", "verdict", "note"]])


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
    """Run the analyses behind the five claims (results resume from ``out``) and test the claims."""
    started = time.perf_counter()
    common = {"model": model, "split": "eval", "out": out, "embedder": embedder, "seed": seed, "margin_variant": DEFAULT_VARIANT,
              "limit": limit or None, "overwrite": overwrite, "k_max": DEPTH}
    sweep = context_for(sweep_mod.Sweep(**common, buckets=["T_wrong"], configs=["proc", "basm"]), None)
    session = sweep.session
    claims = trap_and_suppression(sweep.options.collect(sweep), seed)  # ctx.options: the analysis, resolved
    knock = context_for(knockout_mod.KnockoutAnalysis(**common, buckets=["T_wrong"], random_draws=draws), session)
    claims += knockout_claims(knock.options.collect(knock), seed)
    both = ["T_ok", "T_wrong"]
    ratios = context_for(ratios_mod.Ratios(**common, buckets=both, configs=["basm"]), session)
    claims.append(eta_claim(ratios.options.collect(ratios), seed))
    heads = context_for(heads_mod.Heads(**common, buckets=both), session)
    heads_claim_, rank = heads_claim(heads, top, draws, seed)
    claims.append(heads_claim_)
    config = {"model": sweep.model_path, "split": "eval", "limit": limit, "k": DEPTH, "embedder": sweep.builder.retriever.embedder.name,
              "margin_variant": DEFAULT_VARIANT, "epsilon": EPSILON, "seed": seed, "top": top, "draws": draws, "min_span_mass": heads.options.min_span_mass, "alpha": ALPHA,
              "n_items": {"T_wrong": len(sweep.items), "T_ok+T_wrong": len(heads.items)}}
    return Validation(claims, rank, config, time.perf_counter() - started)


def write(validation: Validation, out: Path) -> None:
    write_text(out / "validation.json", json.dumps(validation.as_dict(), indent=1, allow_nan=False) + "\n")
    write_text(out / "validation.md", "# Organism validation (held-out eval split)\n\n" + validation.markdown() + "\n")


# ----------------------------------------------------------------------------- CLI
