"""``ratios`` (Figs. 3a and 4): boundary vs procedure attention at the decision token.

For every record, Eq. 2's length-normalised span attention α_X^{(l,h)} = (1/|X|) Σ_{i∈X} A_{q,i}
is measured for the boundary span B and the procedure span P, per (layer, head), at the
*deciding row* q (the row that predicts the first token where the correct tool's name parts from
a wrong one: the decision row d_t, or a row of their shared name prefix such as after ``get``)
and, in the native format, at the row that opens the tool call (a second, named row; the
``row`` column of the tables). ``--attention-row`` picks the row of the figure and of the
headline. In the equal-length controls B is the control text that occupies the boundary positions.

**Descriptive aggregates** (the paper's Fig. 3a quantity; every record with non-empty B and P,
abstention- and tool-correct items pooled). Per-head ratios η^{(l,h)} = α_B / (α_P + ε) explode
on heads whose procedure attention is near zero, so they are never averaged:

- **η (ratio of means)**: mean α_B / (mean α_P + ε), means over items, layers and heads;
  95% CI by resampling task groups jointly for numerator and denominator; also per population
  of the bucket (every item, tool-correct, abstention-correct: ``eta_by_answer``);
- **median per-head log2 ratio**: α averaged over items per (layer, head), then the median over
  heads of log2((α_B + ε) / (α_P + ε)); 95% CI by resampling task groups.

**Inference: group-paired shifts.** Per record, log2 η = log2((ᾱ_B + ε) / (ᾱ_P + ε)) with ᾱ the
layer-and-head mean of α (the ``alpha_boundary`` / ``alpha_procedure`` row fields). The T_ok,
T_wrong and T_repair items of a task group share a template, so the shift of a target bucket
(T_wrong or T_repair) is taken within each group: mean log2 η of the group's target records minus
the mean of its T_ok records, over the groups that have both; the estimate is the mean over those
groups, with a 95% bootstrap CI over task groups and a one-sided sign-flip p
(:func:`probes.scoring.claims.effect_claim`). Pooling mixes populations, so the shift is also taken
per :data:`STRATA`: by the target item's correct action (a tool call, or abstention: those have no
correct name and are always read at the decision row) and by the row the record is read at (the
decision row, or a later row of the correct name after a shared prefix; both buckets' records).

**Headline** (:data:`HEADLINE`): BASM's T_wrong − T_ok shift on tool-correct items read at the
decision row, at ``--attention-row``: the comparison the paper's claim is about (a tool-choice
decision, read at the same kind of row in both buckets), free of the two populations that pooling
mixes in, and design-based (no model of length). **Length control**: per record,
log2 η ~ [target] + log2|B| + log2|P| + task-group fixed effects, weighted 1/n(group, bucket) so
that without the length terms the bucket coefficient is exactly the group-paired shift; its CI by
cluster bootstrap over task groups, its p from the cluster-robust t (G − 1 df); reported next to
the group-paired differences of log2|B| and log2|P| (``length``). **Controls**: per group, BASM's
shift minus a control's shift (headline stratum).

ε = :data:`probes.scoring.score.EPSILON` (1e-6), stated in every output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import stats as scipy_stats

from probes.reporting import plots
from probes.analyses import register
from probes.analyses.base import Analysis, Comparison, ReportSection
from probes.analyses.jobs import Job, cached_scorer, run_jobs
from probes.analyses.option_system import depth_option, option
from probes.analyses.run_context import RunContext, provenance
from probes.reporting.markdown import cell, markdown_table
from probes.scoring.claims import Claim, effect_claim
from probes.scoring.score import ATTENTION_ROWS, EPSILON
from probes.scoring.stats import DEFAULT_RESAMPLES, MIN_CI_GROUPS, bootstrap_ratio, cluster_bootstrap, cluster_bootstrap_blocks, no_ci_note
from probes.data.configs import CONFIGS, CONTROL_CONFIGS
from probes.reporting.results import load_results

NAME = "ratios"
FIGURE = "fig04_boundary_attention"
DEFAULT_CONFIGS = ("basm", *CONTROL_CONFIGS)
REFERENCE = "T_ok"  # every target bucket is compared with T_ok items of the same task group
TARGETS = ("T_wrong", "T_repair")
HEADLINE_CONFIG = "basm"
HEADLINE_TARGET = "T_wrong"
FAMILY = "ratios"  # the claims the report makes (Holm within)
STRATA_FAMILY = "ratios-strata"  # exploratory: strata and the length-adjusted estimate (Holm within, separately)
UNIT = "log2 η"
LENGTH_TERMS = ("log2_boundary_size", "log2_procedure_size")


@dataclass(frozen=True)
class Stratum:
    """Which records a group-paired shift compares: the target bucket's and T_ok's of each task group."""

    name: str
    answer: str | None = None  # "tool" / "abstain": only target items whose correct action is a tool call / abstention
    row_kind: str | None = None  # "decision" / "later": only records (both buckets) read at the decision row / a later name row

    def select(self, records: pd.DataFrame, target: str) -> pd.DataFrame:
        """The stratum's records of ``target`` and of T_ok (:func:`eta_records` rows)."""
        keep = records["bucket"].isin([target, REFERENCE])
        if self.answer is not None:  # T_ok items are tool-correct in every bundled dataset; the filter is on the target
            keep &= (records["bucket"] == REFERENCE) | (records["abstain"] == (self.answer == "abstain"))
        if self.row_kind is not None:
            keep &= records["later_row"] == (self.row_kind == "later")
        return records[keep]


HEADLINE = Stratum("tool-correct · decision row", "tool", "decision")
POOLED = Stratum("pooled")
STRATA: tuple[Stratum, ...] = (
    HEADLINE, POOLED, Stratum("tool-correct", "tool"), Stratum("abstention-correct", "abstain"),
    Stratum("decision row", row_kind="decision"), Stratum("later name row", row_kind="later"),
    Stratum("tool-correct · later row", "tool", "later"),
)
LENGTH_STRATA = (HEADLINE, POOLED)  # the headline, and the pooled estimate whose mixing the length control might explain


@dataclass
class RatiosSummary:
    eta: pd.DataFrame  # row, bucket, config, eta, eta_low, eta_high, log2_median, log2_low, log2_high, n, n_items
    heads: pd.DataFrame  # row, bucket, config, layer, head, alpha_boundary, alpha_procedure, log2_ratio
    note: str
    shifts: pd.DataFrame  # row, target, config, stratum, value, low, high, n, n_target, n_reference, p, p_floor, note, same_records_as, headline
    controls: pd.DataFrame  # row, target, control, stratum, value, low, high, n, p, p_floor, note
    length: pd.DataFrame  # row, target, config, stratum, adjusted, low, high, p, unadjusted, slopes, lengths, n, n_records, note
    eta_by_answer: pd.DataFrame  # row, bucket, config, population, eta, eta_low, eta_high, n, n_items
    row: str  # the attention row of the figure and the headline
    claims: list[Claim]


def head_alphas(rows: pd.DataFrame, span: str, row: str = "deciding") -> np.ndarray:
    """[item, layer, head] α of ``span`` at ``row`` from the per-head row columns."""
    return np.array(rows[alpha_column(span, row, heads=True)].tolist(), dtype=float)


def alpha_column(span: str, row: str = "deciding", *, heads: bool = False) -> str:
    """The results column of α_span at the deciding row or the open row."""
    if row not in ATTENTION_ROWS:
        raise ValueError(f"attention row must be one of {ATTENTION_ROWS}, got {row!r}")
    return f"alpha_{span}{'_open' if row == 'open' else ''}{'_heads' if heads else ''}"


def with_spans(rows: pd.DataFrame) -> pd.DataFrame:
    """Records with a boundary and a procedure span (η is undefined without both)."""
    return rows[(rows["boundary_size"] > 0) & (rows["procedure_size"] > 0)]


def median_log2(alpha_b: np.ndarray, alpha_p: np.ndarray, epsilon: float = EPSILON) -> float | np.ndarray:
    """alpha_*: [item, layer, head] -> median over heads of log2 of the item-averaged ratio; with leading
    axes ([resample, item, layer, head]) one median per resample."""
    log2_ratio = np.log2((alpha_b.mean(axis=-3) + epsilon) / (alpha_p.mean(axis=-3) + epsilon))
    medians = np.median(log2_ratio.reshape(*log2_ratio.shape[:-2], -1), axis=-1)
    return float(medians) if medians.ndim == 0 else medians


def _median_ci(alpha_b: np.ndarray, alpha_p: np.ndarray, groups: np.ndarray, seed: int, resamples: int = 1000) -> tuple[float, float]:
    # all resamples of a block at once: report --quick 2.0 s -> 0.04 s (py-spy) against one resample at a time
    return cluster_bootstrap_blocks(lambda block: median_log2(alpha_b[block], alpha_p[block]), groups, resamples=resamples, seed=seed)


# ----------------------------------------------------------------------------- per-record log2 η and group-paired shifts
def record_log2_eta(rows: pd.DataFrame, row: str = "deciding") -> pd.Series:
    """log2 η per record at ``row``: log2((ᾱ_B + ε) / (ᾱ_P + ε)), ᾱ = Eq. 2's α averaged over layers and heads."""
    alpha = {span: rows[alpha_column(span, row)].astype(float) for span in ("boundary", "procedure")}
    return np.log2((alpha["boundary"] + EPSILON) / (alpha["procedure"] + EPSILON))


def eta_records(rows: pd.DataFrame, row: str = "deciding") -> pd.DataFrame:
    """One row per record with B and P and a finite log2 η at ``row``: config, bucket, task_group,
    item_id, log2_eta, abstain (its correct action is abstention), later_row (read at a later name
    row than the decision row), log2_boundary_size, log2_procedure_size."""
    rows = with_spans(rows)
    records = pd.DataFrame({
        "config": rows["config"], "bucket": rows["bucket"], "task_group": rows["task_group"], "item_id": rows["item_id"],
        "log2_eta": record_log2_eta(rows, row), "abstain": rows["correct_is_abstain"].astype(bool),
        "later_row": rows["deciding_depth"].astype(int) > 0,
        "log2_boundary_size": np.log2(rows["boundary_size"].astype(float)),
        "log2_procedure_size": np.log2(rows["procedure_size"].astype(float)),
    })
    return records[np.isfinite(records["log2_eta"])]


def paired_differences(records: pd.DataFrame, target: str, value: str = "log2_eta") -> pd.DataFrame:
    """Per task group with records of both ``target`` and T_ok: ``difference`` = mean ``value`` of its
    target records − mean of its T_ok records, and the record counts ``n_target``, ``n_reference``.
    Index: task_group, sorted (the resampling does not depend on the order rows were written in)."""
    columns = ["difference", "n_target", "n_reference"]
    cells = records.groupby(["task_group", "bucket"])[value].agg(["mean", "size"]).unstack("bucket")
    if records.empty or target not in cells["mean"] or REFERENCE not in cells["mean"]:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="task_group"))
    both = cells[cells[("mean", target)].notna() & cells[("mean", REFERENCE)].notna()].sort_index()
    return pd.DataFrame({"difference": both[("mean", target)] - both[("mean", REFERENCE)],
                         "n_target": both[("size", target)].astype(int), "n_reference": both[("size", REFERENCE)].astype(int)})[columns]


def group_claim(differences: pd.Series, family: str, name: str, statement: str, seed: int) -> Claim:
    """The claim "mean over task groups of ``differences`` (one per group, index = group) > 0"."""
    return effect_claim(family, name, statement, differences.to_numpy(float), differences.index.to_numpy(), unit=UNIT, seed=seed)


def claim_cell(claim: Claim) -> dict[str, Any]:
    return {"value": claim.estimate, "low": claim.low, "high": claim.high, "n": claim.n, "p": claim.p, "p_floor": claim.p_floor,
            "note": no_ci_note(claim.n)}


def shift_statement(config: str, target: str, stratum: Stratum, row: str, k: int) -> str:
    return (f"{plots.label(config)}, k = {k}, {row} row: log2 η is higher in {target} than in {REFERENCE} "
            f"({stratum.name}; mean over task groups of the group-paired difference)")


# ----------------------------------------------------------------------------- length control
def length_design(selected: pd.DataFrame, target: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X, y, w, groups) of the length model on the paired groups' records: X = [target indicator,
    log2|B|, log2|P|, one indicator per task group] (no intercept: the group effects are it),
    w = 1 / n(group, bucket), so each group's two buckets weigh the same, as in the paired shift."""
    paired = paired_differences(selected, target).index
    sub = selected[selected["task_group"].isin(paired)]
    labels = np.array(sorted(paired))
    groups = sub["task_group"].to_numpy()
    X = np.column_stack([(sub["bucket"] == target).to_numpy(float), sub[list(LENGTH_TERMS)].to_numpy(float),
                         (groups[:, None] == labels[None, :]).astype(float)])
    w = 1.0 / sub.groupby(["task_group", "bucket"])["log2_eta"].transform("size").to_numpy(float)
    return X, sub["log2_eta"].to_numpy(float), w, groups


def _wls(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """Weighted least-squares coefficients (numpy's least squares on the √w-scaled system; fast enough
    for thousands of cluster resamples), or None when X lacks full column rank (a term is not identified)."""
    root = np.sqrt(w)
    coefficients, _, rank, _ = np.linalg.lstsq(X * root[:, None], y * root, rcond=None)
    return coefficients if rank == X.shape[1] else None


def _cluster_p(X: np.ndarray, y: np.ndarray, w: np.ndarray, groups: np.ndarray) -> float:
    """One-sided p of "the bucket coefficient > 0" from the cluster-robust t (statsmodels CR1, G − 1 df)."""
    fit = sm.WLS(y, X, weights=w).fit(cov_type="cluster", cov_kwds={"groups": pd.factorize(groups)[0]}, use_t=True)
    return float(scipy_stats.t.sf(fit.tvalues[0], fit.df_resid_inference))


def _resampled_coefficient(X: np.ndarray, y: np.ndarray, w: np.ndarray, idx: np.ndarray) -> float:
    """The bucket coefficient on the rows ``idx`` of a cluster resample (indicators of groups not drawn dropped)."""
    n_fixed = 1 + len(LENGTH_TERMS)
    Xr = X[idx]
    Xr = np.hstack([Xr[:, :n_fixed], Xr[:, n_fixed:][:, Xr[:, n_fixed:].any(axis=0)]])
    coefficients = _wls(Xr, y[idx], w[idx])
    return math.nan if coefficients is None else float(coefficients[0])


def length_adjusted(selected: pd.DataFrame, target: str, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """The length-adjusted shift of ``target`` over T_ok on the records ``selected`` (one stratum and
    configuration): the bucket coefficient of :func:`length_design`'s model, its 95% cluster-bootstrap
    CI over task groups, its one-sided cluster-robust p, the two length slopes, and the lengths
    (mean |B|, |P| per bucket in tokens; group-paired differences of log2|B|, log2|P|)."""
    paired = paired_differences(selected, target)
    sub = selected[selected["task_group"].isin(paired.index)]
    out: dict[str, Any] = {"adjusted": math.nan, "low": math.nan, "high": math.nan, "p": math.nan,
                           "unadjusted": float(paired["difference"].mean()) if len(paired) else math.nan,
                           "slope_boundary": math.nan, "slope_procedure": math.nan, "n": len(paired), "n_records": len(sub)}
    for span, column in (("boundary", "log2_boundary_size"), ("procedure", "log2_procedure_size")):
        for side, bucket in (("target", target), ("reference", REFERENCE)):
            out[f"{span}_{side}"] = float(np.exp2(sub.loc[sub["bucket"] == bucket, column]).mean()) if len(sub) else math.nan
        out[f"d_log2_{span}"] = float(paired_differences(sub, target, column)["difference"].mean()) if len(sub) else math.nan
    if not len(paired):
        return {**out, "note": "no task group has records of both buckets"}
    X, y, w, groups = length_design(selected, target)
    coefficients = _wls(X, y, w)
    if coefficients is None:
        return {**out, "note": "not identified: |B| and |P| do not vary within task groups apart from the bucket"}
    out.update(adjusted=float(coefficients[0]), slope_boundary=float(coefficients[1]), slope_procedure=float(coefficients[2]))
    if len(paired) < MIN_CI_GROUPS:
        return {**out, "note": no_ci_note(len(paired))}
    if len(y) <= X.shape[1]:  # as many parameters as records: every resample fits exactly too, so no interval means anything
        return {**out, "note": "no CI, no p: the model fits the records exactly (no residual degrees of freedom)"}
    out["p"] = _cluster_p(X, y, w, groups)
    out["low"], out["high"] = cluster_bootstrap(lambda idx: _resampled_coefficient(X, y, w, idx), groups, resamples=resamples, seed=seed)
    return {**out, "note": ""}


# ----------------------------------------------------------------------------- the summary
def _ratio(sub: pd.DataFrame, row: str, seed: int) -> dict[str, Any]:
    """η (ratio of means) with its CI over task groups, and the number of groups."""
    value, low, high, n = bootstrap_ratio(sub[alpha_column("boundary", row)], sub[alpha_column("procedure", row)],
                                          sub["task_group"].to_numpy(), epsilon=EPSILON, seed=seed)
    return {"eta": value, "eta_low": low, "eta_high": high, "n": n}


def eta_tables(rows: pd.DataFrame, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The descriptive tables, per (row, bucket, config): η and the median per-head log2 ratio; the
    per-head means; and, where a bucket holds abstention-correct items, η of every item, of the
    tool-correct and of the abstention-correct ones (the populations that the pooled η mixes)."""
    eta, heads, by_answer = [], [], []
    for row in [r for r in ATTENTION_ROWS if alpha_column("boundary", r) in rows.columns]:
        for (bucket, config), sub in rows.groupby(["bucket", "config"], sort=False):
            if not sub[alpha_column("boundary", row)].notna().any():
                continue
            key = {"row": row, "bucket": bucket, "config": config}
            pooled = _ratio(sub, row, seed)
            abstain = sub["correct_is_abstain"].astype(bool)
            if abstain.any():
                by_answer.append({**key, "population": "every item", **pooled, "n_items": len(sub)})
                for population, part in (("tool-correct", sub[~abstain]), ("abstention-correct", sub[abstain])):
                    if len(part):
                        by_answer.append({**key, "population": population, **_ratio(part, row, seed), "n_items": len(part)})
            a_b, a_p = head_alphas(sub, "boundary", row), head_alphas(sub, "procedure", row)
            l_low, l_high = _median_ci(a_b, a_p, sub["task_group"].to_numpy(), seed)
            eta.append({**key, **{c: pooled[c] for c in ("eta", "eta_low", "eta_high")}, "log2_median": median_log2(a_b, a_p),
                        "log2_low": l_low, "log2_high": l_high, "n": pooled["n"], "n_items": len(sub)})
            mean_b, mean_p = a_b.mean(0), a_p.mean(0)
            for layer in range(mean_b.shape[0]):
                for head in range(mean_b.shape[1]):
                    heads.append({**key, "layer": layer, "head": head, "alpha_boundary": mean_b[layer, head], "alpha_procedure": mean_p[layer, head],
                                  "log2_ratio": float(np.log2((mean_b[layer, head] + EPSILON) / (mean_p[layer, head] + EPSILON)))})
    by_answer_columns = ["row", "bucket", "config", "population", "eta", "eta_low", "eta_high", "n", "n_items"]
    return pd.DataFrame(eta), pd.DataFrame(heads), pd.DataFrame(by_answer, columns=by_answer_columns)


SHIFT_COLUMNS = ["row", "target", "config", "stratum", "value", "low", "high", "n", "n_target", "n_reference", "p", "p_floor", "note",
                 "same_records_as", "headline"]
CONTROL_COLUMNS = ["row", "target", "control", "stratum", "value", "low", "high", "n", "p", "p_floor", "note"]
LENGTH_COLUMNS = ["row", "target", "config", "stratum", "adjusted", "low", "high", "p", "unadjusted", "slope_boundary", "slope_procedure",
                  "n", "n_records", "boundary_target", "boundary_reference", "d_log2_boundary", "procedure_target", "procedure_reference",
                  "d_log2_procedure", "note"]


def shift_tables(rows: pd.DataFrame, headline_row: str, k: int, seed: int,
                 resamples: int = DEFAULT_RESAMPLES) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[Claim]]:
    """The group-paired shifts per (row, target, config, stratum), BASM's shift minus each control's
    (headline stratum), the length-adjusted shifts (:data:`LENGTH_STRATA`), and the claims: at
    ``headline_row``, BASM's headline shifts and its excess over each control (:data:`FAMILY`), its
    other strata and the length-adjusted estimates (:data:`STRATA_FAMILY`)."""
    shifts, controls, length, claims = [], [], [], []
    for row in [r for r in ATTENTION_ROWS if alpha_column("boundary", r) in rows.columns]:
        records = eta_records(rows, row)
        for target in [t for t in TARGETS if t in set(records["bucket"])]:
            paired: dict[tuple[str, str], pd.Series] = {}
            for config, sub in records.groupby("config", sort=False):
                seen: dict[frozenset, str] = {}  # the records of each stratum so far: a stratum that repeats one is no new claim
                for stratum in STRATA:
                    selected = stratum.select(sub, target)
                    differences = paired_differences(selected, target)
                    paired[config, stratum.name] = differences["difference"]
                    used = frozenset(selected.index[selected["task_group"].isin(differences.index)])
                    claim = group_claim(differences["difference"], FAMILY, f"shift {target} · {plots.label(config)} · {stratum.name}",
                                        shift_statement(config, target, stratum, row, k), seed)
                    headline = (row, config, target, stratum) == (headline_row, HEADLINE_CONFIG, HEADLINE_TARGET, HEADLINE)
                    shifts.append({"row": row, "target": target, "config": config, "stratum": stratum.name, **claim_cell(claim),
                                   "n_target": int(differences["n_target"].sum()), "n_reference": int(differences["n_reference"].sum()),
                                   "same_records_as": seen.get(used, "") if claim.n else "", "headline": headline})
                    if row == headline_row and config == HEADLINE_CONFIG and (stratum == HEADLINE or (claim.n and used not in seen)):
                        claims.append(claim if stratum == HEADLINE else replace(claim, family=STRATA_FAMILY, exploratory=True))
                    seen.setdefault(used, stratum.name)
                    if stratum in LENGTH_STRATA:
                        fit = length_adjusted(selected, target, resamples=resamples, seed=seed)
                        length.append({"row": row, "target": target, "config": config, "stratum": stratum.name, **fit})
                        # a fit without a p (exactly determined, not identified, < 2 groups) claims nothing; the table says why
                        if row == headline_row and config == HEADLINE_CONFIG and stratum == HEADLINE and np.isfinite(fit["p"]):
                            claims.append(Claim(STRATA_FAMILY, f"length-adjusted shift {target} · {plots.label(config)} · {stratum.name}",
                                                f"{shift_statement(config, target, stratum, row, k)}, adjusted for log2|B| and log2|P| "
                                                "within task groups", fit["adjusted"], fit["low"], fit["high"], fit["n"], fit["p"], unit=UNIT,
                                                note="p: cluster-robust t (G − 1 df); CI: cluster bootstrap", exploratory=True))
            if HEADLINE_CONFIG not in set(records["config"]):
                continue
            basm = paired[HEADLINE_CONFIG, HEADLINE.name]
            for control in [c for c in CONTROL_CONFIGS if (c, HEADLINE.name) in paired]:
                excess = (basm - paired[control, HEADLINE.name]).dropna()
                claim = group_claim(excess, FAMILY, f"shift {target} · {plots.label(HEADLINE_CONFIG)} > {plots.label(control)} · {HEADLINE.name}",
                                    f"{row} row, k = {k}: the {REFERENCE} → {target} shift of log2 η ({HEADLINE.name}) is larger under "
                                    f"{plots.label(HEADLINE_CONFIG)} than under the equal-length control {plots.label(control)} "
                                    "(mean over task groups of the difference of group-paired shifts)", seed)
                controls.append({"row": row, "target": target, "control": control, "stratum": HEADLINE.name, **claim_cell(claim)})
                if row == headline_row and target == HEADLINE_TARGET:
                    claims.append(claim)
    return (pd.DataFrame(shifts, columns=SHIFT_COLUMNS), pd.DataFrame(controls, columns=CONTROL_COLUMNS),
            pd.DataFrame(length, columns=LENGTH_COLUMNS), claims)


def summarise_rows(rows: pd.DataFrame, note: str = "", seed: int = 0, *, k: int, row: str = "deciding",
                   resamples: int = DEFAULT_RESAMPLES) -> RatiosSummary:
    """Every table and claim of the rows of one depth ``k``; ``row``: the attention row of the figure and the claims."""
    eta, heads, by_answer = eta_tables(with_spans(rows), seed)
    shifts, controls, length, claims = shift_tables(rows, row, k, seed, resamples)
    return RatiosSummary(eta, heads, note, shifts, controls, length, by_answer, row, claims)


def headline_text(shifts: pd.DataFrame) -> str:
    """The headline estimate in words (:func:`shift_headline`), or why there is none."""
    return shift_headline(shifts) or (f"headline ({plots.label(HEADLINE_CONFIG)}, {HEADLINE_TARGET} − {REFERENCE}, {HEADLINE.name}): "
                                      f"not measured (this run has no {plots.label(HEADLINE_CONFIG)} records of {HEADLINE_TARGET} and "
                                      f"{REFERENCE} at that row)")


def aggregate_note(options: Any) -> str:
    return (f"query row: {options.attention_row} · k = {options.depth} · η = ratio of mean span attentions (not a mean of per-head ratios), "
            f"ε = {EPSILON:g} · median over (layer, head) of log2 of item-averaged α · shifts: per-record log2 η, "
            f"target − {REFERENCE} within each task group, mean over groups · 95% CIs resample task groups")


# What Fig. 4's shift panels (c, d) plot, stated once in report.md rather than in the figure's caption
SHIFT_DEFINITIONS = ("Fig. 4 (c, d): per record log2 η = log2((ᾱ_B + ε) / (ᾱ_P + ε)); per task group, the mean over its target items minus "
                     "the mean over its T_ok items; bars: the mean over the groups with both buckets, whiskers: 95% bootstrap CI over task "
                     "groups; under each stratum: task groups and target / T_ok items per bar (a range where configurations differ). Strata: "
                     "pooled = every record; tool- / abstention-correct = the target items whose correct action is a tool call / abstention "
                     "(vs every T_ok item of the group); decision / later name row = records of both buckets read at the decision row / at a "
                     "later row of the correct name; ★ marks the headline stratum.")


@register("ratios", order=20)
@dataclass(kw_only=True)
class Ratios(Analysis):
    """Figs. 3a/4: length-normalised boundary/procedure attention ratio η per bucket and configuration,
    and its group-paired shifts between buckets by stratum, with a length control."""

    min_depth: ClassVar[int] = 1

    configs: tuple[str, ...] = option(DEFAULT_CONFIGS, f"configurations with a boundary (or control) span (default: {','.join(DEFAULT_CONFIGS)})",
                                      names=tuple(CONFIGS), minimum=1)
    k: int | None = depth_option()
    attention_row: str = option("deciding", "query row of the figure and the headline: the deciding row (the decision row, or the "
                                "row after a shared name prefix) or the native row that opens the tool call; the tables have both",
                                choices=ATTENTION_ROWS)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        k = ctx.options.depth
        jobs = [Job(item, config, k, ctx.fmt, ("baseline",)) for item in ctx.items for config in self.configs]
        store = ctx.store(configs=self.configs, k=k)
        run_jobs(ctx, store, jobs, cached_scorer(ctx, lambda record, job: (), per_head=True, margins=()))
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> RatiosSummary:
        return summarise_rows(rows, f"{provenance(ctx)}\n{aggregate_note(ctx.options)}", ctx.options.seed,
                              row=ctx.options.attention_row, k=ctx.options.depth)

    def tables(self, summary: RatiosSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.eta, f"{NAME}_shifts": summary.shifts, f"{NAME}_controls": summary.controls,
                f"{NAME}_length": summary.length, f"{NAME}_eta_by_answer": summary.eta_by_answer, f"{NAME}_heads": summary.heads}

    def figures(self, summary: RatiosSummary, out_dir: Path) -> list[Path]:
        plots.style()
        row = summary.row
        fig = fig04_boundary_attention(summary.eta[summary.eta["row"] == row], summary.shifts[summary.shifts["row"] == row], summary.note)
        return plots.save_figure(fig, out_dir, FIGURE)

    def section(self, ctx: RunContext, summary: RatiosSummary, figures: list[Path]) -> ReportSection:
        note = aggregate_note(ctx.options)
        e, row = summary.eta, summary.row

        def at(table: pd.DataFrame) -> pd.DataFrame:  # the figure and headline row's part of a table
            return table[table["row"] == row].drop(columns="row")

        body = "\n\n".join([
            f"{note}.",
            f"**{headline_text(summary.shifts)}.** The headline compares like with like: tool-choice decisions read at the decision "
            f"row in both buckets, within task groups (pooling adds abstention-correct items, which have no correct name and a "
            f"different |B|, and items read at a later name row). The pooled η below is descriptive.",
            SHIFT_DEFINITIONS,
            f"Group-paired shifts of log2 η at the {row} row (target − {REFERENCE}; `n` task groups with both buckets; `n_target` / "
            f"`n_reference` items; one-sided sign-flip p, `p_floor` = 2^−n, its smallest value when the test is exact, up to 13 groups):\n\n"
            + markdown_table(at(summary.shifts).drop(columns="headline")),
            f"{plots.label(HEADLINE_CONFIG)}'s shift minus each equal-length control's ({HEADLINE.name}):\n\n" + markdown_table(at(summary.controls)),
            "Length control: log2 η ~ [target] + log2|B| + log2|P| + task-group fixed effects, weighted 1/n(group, bucket); `adjusted` "
            "is the bucket coefficient (cluster-bootstrap CI, cluster-robust one-sided p), `unadjusted` the group-paired shift on the same "
            "records; mean |B|, |P| in tokens per bucket and their group-paired log2 differences:\n\n" + markdown_table(at(summary.length)),
            "Pooled η (ratio of means; descriptive) of every item and of each population where a bucket mixes them:\n\n"
            + markdown_table(at(summary.eta_by_answer)),
            "η and the median per-head log2 ratio per bucket (descriptive; every item with B and P):\n\n"
            + markdown_table(e[["row", "bucket", "config", "eta", "eta_low", "eta_high", "log2_median", "n", "n_items"]]),
        ])
        comparisons = [Comparison(f"Fig. 3a: η at the deciding row, BASM, {b}", cell(e, "eta", row="deciding", bucket=b, config="basm"), p, "ratio")
                       for b, p in PAPER_FIG3A_ETA.items()]
        return ReportSection(NAME, "Figs. 3a/4 — boundary vs procedure attention (`ratios`)", figures, body, comparisons, summary)

    def claims(self, summary: RatiosSummary) -> list[Claim]:
        return summary.claims

    def print_summary(self, summary: RatiosSummary) -> None:
        print(summary.eta.round(3).to_string(index=False))
        shifts = summary.shifts[summary.shifts["row"] == summary.row]
        print(shifts.drop(columns=["row", "headline"]).round(3).to_string(index=False))
        print(summary.length[summary.length["row"] == summary.row].round(3).to_string(index=False))
        print(headline_text(summary.shifts))
        print(aggregate_note(self))


# The BASM paper's numbers that the report sets next to ours (Qwen3-8B): Fig. 3a, η at the decision row
# under BASM, per bucket.
PAPER_FIG3A_ETA = {"T_ok": 0.15, "T_wrong": 1.23, "T_repair": 1.81}


# --- Fig. 4, drawn by Ratios.figures (its η panels also draw Fig. 3a in probes.analyses.report)
def eta_panels(axes: Sequence[plt.Axes], eta: pd.DataFrame) -> None:
    """η (ratio of mean span attentions) and the median per-head log2 ratio, bucket × config.

    eta: bucket, config, eta, eta_low, eta_high, log2_median, log2_low, log2_high, n.
    """
    buckets = plots.ordered(eta["bucket"], plots.BUCKET_ORDER)
    configs = plots.ordered(eta["config"], plots.CONFIG_ORDER)
    panels = (("eta", "η = mean α_B / (mean α_P + ε)"), ("log2", "median over heads of log2(α_B / α_P)"))
    for ax, (col, ylabel) in zip(axes, panels):
        value = "eta" if col == "eta" else "log2_median"
        frame = eta.rename(columns={value: "value", f"{col}_low": "low", f"{col}_high": "high"})
        plots.grouped_bars(ax, frame, buckets, configs, group_col="bucket", series_col="config")
        ax.set_ylabel(ylabel)
    axes[0].axhline(1.0, color="0.5", lw=0.8, ls="--")


def shift_headline(shifts: pd.DataFrame) -> str:
    """The headline estimate in words, from the row of a ratios shifts table marked ``headline``
    ("" when the table has none)."""
    h = shifts[shifts["headline"].astype(bool)]
    if h.empty:
        return ""
    r = h.iloc[0]
    what = f"{plots.label(r['config'])}, {r['target']} − T_ok shift of log2 η, {r['stratum']}, {r['row']} row"
    if not r["n"]:
        return f"headline: {what}: no task group has records of both buckets"
    ci = f" [{r['low']:+.3f}, {r['high']:+.3f}]" if plots.has_ci(h.iloc[:1])[0] else f" ({plots.no_ci_label(r['n'])})"
    p = f", one-sided sign-flip p = {r['p']:.3g}" if np.isfinite(r["p"]) else ""
    return f"headline: {what} = {r['value']:+.3f}{ci}{p}; {int(r['n'])} task groups, {int(r['n_target'])} {r['target']} / {int(r['n_reference'])} T_ok items"


def fig04_boundary_attention(eta: pd.DataFrame, shifts: pd.DataFrame, note: str) -> plt.Figure:
    """(a, b) η and the median per-head log2 ratio per bucket (descriptive, every record pooled);
    (c, d) group-paired shifts of per-record log2 η from T_ok to each target bucket, per stratum
    (x) and configuration (bars). The caption's counts, strata and headline come from these tables.

    eta: bucket, config, eta, eta_low, eta_high, log2_median, log2_low, log2_high, n, n_items.
    shifts: target, config, stratum, value, low, high, n (task groups), n_target, n_reference, same_records_as, row, headline.
    """
    targets = plots.ordered(shifts["target"], ("T_wrong", "T_repair"))
    fig, axes = plt.subplots(2, max(2, len(targets)), figsize=(13, 8.6), squeeze=False)
    eta_panels(axes[0], eta)
    plots.legend_outside(axes[0][1])
    axes[0][0].set_title("(a) boundary / procedure attention η (pooled, descriptive)")
    axes[0][1].set_title("(b) per-head log-ratio (pooled, descriptive)")
    empty: list[str] = []
    repeated: list[str] = []
    for ax, target in zip(axes[1], targets):
        sub = shifts[shifts["target"] == target]
        present = sub.groupby("stratum", sort=False)["n"].max()
        # a stratum whose records are another's under every configuration that has any is the same bar: named, not drawn again
        same = sub[sub["n"] > 0].groupby("stratum", sort=False)["same_records_as"].agg(lambda v: v.iloc[0] if v.nunique() == 1 else "")
        strata = [s for s in present.index if present[s] > 0 and not same[s]]
        empty += [f"{s} ({plots.bucket_label(target)})" for s in present.index if present[s] == 0]
        repeated += [f"{s} = {same[s]} ({plots.bucket_label(target)})" for s in present.index if present[s] > 0 and same[s]]
        headline = set(sub.loc[sub["headline"].astype(bool), "stratum"])
        ticks = {s: ("★ " if s in headline else "") + s.replace(" · ", " ·\n") + "\n" + _n_range(sub.loc[sub["stratum"] == s, "n"]) + " groups\n"
                 + _n_range(sub.loc[sub["stratum"] == s, "n_target"]) + " / " + _n_range(sub.loc[sub["stratum"] == s, "n_reference"]) + " items"
                 for s in strata}
        plots.grouped_bars(ax, sub, strata, plots.ordered(sub["config"], plots.CONFIG_ORDER), group_col="stratum", series_col="config",
                           group_label=lambda s: ticks[s], annotate=False)
        ax.tick_params(axis="x", labelsize=7)
        for tick, s in zip(ax.get_xticklabels(), strata):
            tick.set_fontweight("bold" if s in headline else "normal")
        ax.set_ylabel(f"Δ log2 η: {plots.bucket_label(target)} − {plots.bucket_label('T_ok')}\n(group-paired, mean over task groups)")
        ax.set_title(f"({'cd'[targets.index(target)]}) {plots.bucket_label('T_ok')} → {plots.bucket_label(target)} shift by stratum")
    for ax in axes[1][len(targets):]:
        ax.axis("off")
    if targets:
        plots.legend_outside(axes[1][len(targets) - 1])
    lines = ["(c, d): T_ok → target shift of per-record log2 η, mean over task groups with both buckets, 95% bootstrap CI; under each "
             "stratum: task groups and target / T_ok items per bar; ★ = the headline stratum (strata and estimand: report.md, ratios section)."]
    if empty:
        lines.append("not shown, no task group with records of both buckets: " + ", ".join(empty) + ".")
    if repeated:
        lines.append("not drawn again, the same records as another stratum: " + ", ".join(repeated) + ".")
    headline = shift_headline(shifts)
    if headline:
        lines.append(headline + ".")
    if len(eta):
        lines.append(f"(a, b): every record with non-empty B and P, tool- and abstention-correct pooled: {_n_range(eta['n'])} task groups, "
                     f"{_n_range(eta['n_items'])} items per bar.")
    rows = sorted(set(eta["row"]) | set(shifts["row"]))
    fig.suptitle(f"{'/'.join(rows).capitalize()}-row attention to boundary vs procedure spans, and its shift between buckets")
    plots.footnote(fig, "\n".join([*lines, note]))
    return fig


def _n_range(values: pd.Series) -> str:
    """"12", or "10–12" where the rows of a caption's cell differ."""
    values = sorted(set(int(v) for v in values))
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"
