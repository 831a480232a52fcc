"""``forks`` (seed 002, SelSkill): invoke/skip forks at every decision point, and decision entropy.

At every decision point (item) and for every memory configuration (``--configs``, default Proc.
Skill and BASM) and depth k = 1..K, the prompt with the k retrieved skills shown (**invoke**) is
forked against the same prompt without them (**skip**: the configuration's k = 0 prompt, the same
for every configuration and k of an item, scored once). The two prompts share their token prefix
up to the memory block (system turn, tool catalog); the engine's prefix cache
(:mod:`probes.engine.prefix_cache`) computes its keys and values once, bit-identical to a cold run.

Per fork and path (one row per fork, columns ``skip_*`` and ``invoke_*``):

- ``entropy``: next-token entropy over the full vocabulary at the decision row (the row predicting
  the first token of the tool name; :attr:`ConditionResult.entropy`); ``entropy_open`` at the row
  that opens the call (native);
- ``entropy_tools``: entropy of the choice among the shown tools, their whole-name probabilities
  renormalised over the tools (:func:`probes.scoring.fork_estimators.candidate_entropy`);
- ``margin``: Eq. 1 restricted to the tools (``margin_tool_choice``, each wrong/correct pair where
  the names diverge; NaN for items whose correct action is abstention) and ``call_logodds``;
- the greedy call (``calls``' generation and parser: ``strict`` / ``lenient`` action, outcome,
  solved, and the raw generation).

The summary answers the seed's questions on our items, with 95% CIs over task groups:
**Fig. 1b** how often invoke and skip disagree (greedy tool choice, sign of the margin, sign of the
call log-odds) and how often skill access helps, hurts or does not change the greedy outcome;
**Fig. 3** whether invoke paths carry higher entropy than skip paths (paired by fork; claims);
**Appendix E** whether ranking decision points by the skip path's predictive entropy finds the
disagreements better than random ranking (AUROC with a null that permutes the labels within task
groups; claims) and a precision-at-budget curve against the random and all-points baselines. ``docs/statistics.md`` states the estimators.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from probes.analyses import register
from probes.analyses.base import Analysis, Comparison, ReportSection
from probes.analyses.jobs import Job, run_jobs
from probes.analyses.option_system import OptionError, RunOptions, header_options, k_max_option, option
from probes.analyses.run_context import RunContext
from probes.analyses.calls import MAX_NEW_TOKENS, generate_call, provenance_without_margin
from probes.data.configs import CONFIGS, config_label
from probes.engine.generate import stop_token_ids
from probes.engine.logits import entropy
from probes.prompts.builder import SWEEP_K_MAX
from probes.prompts.record import PromptRecord
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring import fork_estimators as est
from probes.scoring import margins as margins_mod
from probes.scoring.claims import Claim, effect_claim
from probes.scoring.score import deciding_depth, row_fields
from probes.scoring.stats import bootstrap_mean, paired_permutation_test
from probes.scoring.toolcalls import MODES

NAME = "forks"
FIGURES = ("fig17_forks_entropy", "fig18_forks_ranking")
CONDITION = "fork"
SKILL_CONFIGS: tuple[str, ...] = tuple(name for name, config in CONFIGS.items() if config.slots)  # configurations that show skills
FORK_CONFIGS: tuple[str, ...] = ("proc", "basm")
# per path: the quantities of the paired entropy comparison (Fig. 3)
PAIRED: dict[str, str] = {"entropy": "entropy over the vocabulary at the decision row (nats)",
                          "entropy_tools": "entropy over the shown tools (nats)",
                          "margin": "Eq. 1 tool-choice margin (logits)", "call_logodds": "call log-odds (logits)"}
# which disagreement a ranking looks for: label -> what it is
LABELS: dict[str, str] = {"call_lenient": "greedy call differs (lenient: any call syntax)",
                          "call_strict": "greedy call differs (strict: template format only)",
                          "margin_sign": "sign of the Eq. 1 tool-choice margin differs",
                          "call_sign": "sign of the call log-odds differs (call vs abstain)"}
HEADLINE_LABEL = "call_lenient"
HEADLINE_SCORE = "entropy"  # with HEADLINE_LABEL: the ranking claimed before the run (family forks-ranking)
SCORES: dict[str, str] = {"entropy": "skip-path entropy over the vocabulary", "entropy_tools": "skip-path entropy over the shown tools"}
EFFECTS: tuple[str, ...] = ("helped", "unchanged", "hurt")
SEED_FIG1B = {"helped": 14.0, "unchanged": 78.0, "hurt": 8.0}  # seed 002 Fig. 1b, % of paired trajectories


# ------------------------------------------------------------------------------------- scoring
def path_row(session: Any, record: PromptRecord, stop_ids: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
    """The quantities of one path: one engine call (every shown tool's whole name scored from the
    decision row) and one greedy generation (``calls``' generation and parser)."""
    cands = margins_mod.candidates_from_record(record)
    tools = [c for c in cands if not c.is_abstention]
    res = session.run(record.input_ids, record.query_rows, candidates={c.key: (c.anchor_index, list(c.token_ids)) for c in tools})
    (result,) = res.conditions
    lp = result.candidate_token_logprobs
    fmt, dec, opn = record.format, int(record.decision_index), record.open_index
    margin = margins_mod.tool_choice_margin(cands, lp, fmt)
    call = call_of(generate_call(session, record, max_new_tokens=max_new_tokens, stop_ids=stop_ids))
    return {
        "entropy": result.entropy,
        "entropy_open": entropy(result.logits_at(int(opn))) if opn is not None else float("nan"),
        "entropy_tools": est.candidate_entropy([float(lp[c.key].sum()) for c in tools]),
        "margin": margin.value, "margin_note": margin.note,
        "call_logodds": margins_mod.call_logodds(result.row_logits, res.input_ids, cands, fmt, dec, opn).value,
        "n_tools": len(tools), "n_tokens": len(record.input_ids), **call,
    }


def call_of(row: dict[str, Any]) -> dict[str, Any]:
    """The greedy call's columns of a ``calls`` row: per mode the action, outcome and solved, and the reply."""
    return {**{f"{mode}_{what}": row[f"{mode}_{what}"] for mode in MODES for what in ("action", "outcome", "solved")},
            "generation": row["generation"], "stopped": row["stopped"]}


def fork_row(skip: dict[str, Any], invoke: dict[str, Any], skip_record: PromptRecord, record: PromptRecord) -> dict[str, Any]:
    """One fork's row: the invoke record's columns, then each path's quantities prefixed by its name."""
    cands = margins_mod.candidates_from_record(record)
    _, depth = deciding_depth(cands)
    row = row_fields(record)
    row.update(condition=CONDITION, skip_record_id=skip_record.record_id, correct_action=record.correct_action,
               correct_is_abstain=not any(c.role == "correct" and not c.is_abstention for c in cands),
               deciding_depth=depth, shared_prefix_tokens=margins_mod.shared_prefix(skip_record.input_ids, record.input_ids))
    for path, values in (("skip", skip), ("invoke", invoke)):
        row.update({f"{path}_{name}": value for name, value in values.items()})
    return row


# ------------------------------------------------------------------------------------- summaries
def with_outcomes(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with the fork's derived 0/1 columns: ``disagree_<label>`` (NaN where a sign is
    undefined) and, per mode, ``<effect>_<mode>`` (skill access helped, left unchanged or hurt the
    greedy outcome)."""
    out = rows.copy()
    for mode in MODES:
        out[f"disagree_call_{mode}"] = (out[f"invoke_{mode}_action"] != out[f"skip_{mode}_action"]).astype(float)
        inv, skp = out[f"invoke_{mode}_solved"].astype(bool), out[f"skip_{mode}_solved"].astype(bool)
        out[f"helped_{mode}"] = (inv & ~skp).astype(float)
        out[f"hurt_{mode}"] = (~inv & skp).astype(float)
        out[f"unchanged_{mode}"] = (inv == skp).astype(float)
    for label, column in (("margin_sign", "margin"), ("call_sign", "call_logodds")):
        a, b = out[f"invoke_{column}"].astype(float), out[f"skip_{column}"].astype(float)
        defined = np.isfinite(a) & np.isfinite(b)
        out[f"disagree_{label}"] = np.where(defined, (np.sign(a) != np.sign(b)).astype(float), np.nan)
    return out


def share_table(rows: pd.DataFrame, *, resamples: int, seed: int) -> pd.DataFrame:
    """Per configuration × k × quantity (the disagreements, the effects per mode): share with a 95%
    bootstrap CI over task groups. Columns: config, k, quantity, value, low, high, n (task groups),
    n_items (defined forks), n_undefined, count."""
    quantities = [f"disagree_{label}" for label in LABELS] + [f"{effect}_{mode}" for mode in MODES for effect in EFFECTS]
    out = []
    for (config, k), frame in rows.groupby(["config", "k"], sort=True):
        for quantity in quantities:
            values = frame[quantity].astype(float).to_numpy()
            defined = np.isfinite(values)
            e = bootstrap_mean(values[defined], frame["task_group"].to_numpy()[defined], resamples=resamples, seed=seed)
            out.append({"config": config, "k": int(k), "quantity": quantity, "value": e.value, "low": e.low, "high": e.high,
                        "n": e.n_units, "n_items": int(defined.sum()), "n_undefined": int((~defined).sum()),
                        "count": int(np.nansum(values))})
    return pd.DataFrame(out, columns=["config", "k", "quantity", "value", "low", "high", "n", "n_items", "n_undefined", "count"])


def paired_table(rows: pd.DataFrame, *, resamples: int, seed: int) -> pd.DataFrame:
    """Per configuration × k × quantity: the skip and invoke means and the paired difference
    invoke − skip, each a mean of task-group means with a 95% bootstrap CI, and the one-sided
    sign-flip p over task groups that the invoke path is higher."""
    out = []
    for (config, k), frame in rows.groupby(["config", "k"], sort=True):
        groups = frame["task_group"].to_numpy()
        for quantity in PAIRED:
            skip, invoke = frame[f"skip_{quantity}"].astype(float).to_numpy(), frame[f"invoke_{quantity}"].astype(float).to_numpy()
            ok = np.isfinite(skip) & np.isfinite(invoke)
            ests = {path: bootstrap_mean(v[ok], groups[ok], resamples=resamples, seed=seed) for path, v in (("skip", skip), ("invoke", invoke))}
            diff = bootstrap_mean((invoke - skip)[ok], groups[ok], resamples=resamples, seed=seed)
            n_groups = len(set(groups[ok].tolist()))
            p = paired_permutation_test(invoke[ok], skip[ok], groups[ok], alternative="greater", seed=seed)[1] if n_groups >= 2 else np.nan
            out.append({"config": config, "k": int(k), "quantity": quantity, "skip": ests["skip"].value, "skip_low": ests["skip"].low,
                        "skip_high": ests["skip"].high, "invoke": ests["invoke"].value, "invoke_low": ests["invoke"].low,
                        "invoke_high": ests["invoke"].high, "difference": diff.value, "low": diff.low, "high": diff.high,
                        "p_greater": p, "n": diff.n_units, "n_items": int(ok.sum()), "n_undefined": int((~ok).sum())})
    return pd.DataFrame(out)


def ranking_tables(rows: pd.DataFrame, *, resamples: int, permutations: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per configuration × k × score × label: the AUROC table and the precision-at-budget curve
    (:mod:`probes.scoring.fork_estimators`). Forks whose label is undefined are left out (counted)."""
    aurocs, curves = [], []
    for (config, k), frame in rows.groupby(["config", "k"], sort=True):
        for label in LABELS:
            y = frame[f"disagree_{label}"].astype(float).to_numpy()
            defined = np.isfinite(y)
            for score in SCORES:
                scores = frame[f"skip_{score}"].astype(float).to_numpy()[defined]
                groups = frame["task_group"].to_numpy()[defined]
                key = {"config": config, "k": int(k), "score": score, "label": label}
                aurocs.append({**key, **est.ranking_auroc(y[defined].astype(bool), scores, groups, resamples=resamples,
                                                          permutations=permutations, seed=seed), "n_undefined": int((~defined).sum())})
                if label == HEADLINE_LABEL or label == "margin_sign":
                    curve = est.budget_curve(y[defined].astype(bool), scores, groups, resamples=resamples, permutations=permutations, seed=seed)
                    curves.append(curve.assign(**key))
    curve = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame()
    if len(curve):
        curve = curve[["config", "k", "score", "label", *[c for c in curve.columns if c not in ("config", "k", "score", "label")]]]
    return pd.DataFrame(aurocs), curve


@dataclass
class ForksSummary:
    rows: pd.DataFrame  # one fork per row, with the derived 0/1 columns
    shares: pd.DataFrame  # config, k, quantity (disagreements, effects): share with CIs
    paired: pd.DataFrame  # config, k, quantity: skip, invoke, invoke − skip with CIs, p
    auroc: pd.DataFrame  # config, k, score, label: AUROC, CI, permutation null
    budget: pd.DataFrame  # config, k, score, label, budget: precision, recall, random and all-points baselines
    note: str
    k_max: int
    seed: int


def pick(table: pd.DataFrame, column: str = "value", **where: Any) -> float:
    sub = table
    for key, value in where.items():
        sub = sub[sub[key] == value]
    return float(sub[column].iloc[0]) if len(sub) else float("nan")


def headline_rows(summary: ForksSummary) -> pd.DataFrame:
    """The answers at the deepest k, one row per configuration: the disagreement shares, the entropy
    difference and the entropy-ranking AUROC (headline label)."""
    out = []
    for config in sorted(set(summary.rows["config"])):
        s, p, a = summary.shares, summary.paired, summary.auroc
        where = {"config": config, "k": summary.k_max}
        out.append({
            "config": config, "k": summary.k_max,
            "greedy call differs": pick(s, quantity="disagree_call_lenient", **where),
            "margin sign differs": pick(s, quantity="disagree_margin_sign", **where),
            "helped (lenient)": pick(s, quantity="helped_lenient", **where), "hurt (lenient)": pick(s, quantity="hurt_lenient", **where),
            "H skip": pick(p, "skip", quantity="entropy", **where), "H invoke": pick(p, "invoke", quantity="entropy", **where),
            "H invoke − skip": pick(p, "difference", quantity="entropy", **where), "p (invoke > skip)": pick(p, "p_greater", quantity="entropy", **where),
            "AUROC (H skip → call differs)": pick(a, "auroc", score=HEADLINE_SCORE, label=HEADLINE_LABEL, **where),
            "AUROC p (within-group permutation)": pick(a, "p_permutation", score=HEADLINE_SCORE, label=HEADLINE_LABEL, **where),
            "forks": int(pick(s, "n_items", quantity="disagree_call_lenient", **where)),
            "task groups": int(pick(s, "n", quantity="disagree_call_lenient", **where)),
        })
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------- claims
ENTROPY_FAMILY = "forks-entropy"  # the seed's direction (Fig. 3: invoke above skip), chosen before the run
ENTROPY_EXPLORATORY_FAMILY = "forks-entropy-exploratory"  # the opposite direction, seen on the organism first
RANKING_FAMILY = "forks-ranking"  # chosen before the run: the headline score and label (the seed's Appendix E ranking)
RANKING_EXPLORATORY_FAMILY = "forks-ranking-exploratory"  # the other scores and labels: tested, adjusted, never "holds"


def entropy_claims(rows: pd.DataFrame, k: int, seed: int) -> list[Claim]:
    """Seed Fig. 3 at depth ``k`` per configuration: the invoke path's entropy (over the vocabulary,
    and over the shown tools) is above the skip path's, paired by fork (sign flips over task groups;
    family ``forks-entropy``); and the opposite direction, below, which the organism showed before it
    was tested (family ``forks-entropy-exploratory``: never "holds")."""
    out = []
    for config in sorted(set(rows["config"])):
        sub = rows[(rows["config"] == config) & (rows["k"] == k)]
        for quantity in ("entropy", "entropy_tools"):
            diff = (sub[f"invoke_{quantity}"].astype(float) - sub[f"skip_{quantity}"].astype(float)).to_numpy()
            for family, side, alternative in ((ENTROPY_FAMILY, "above", "greater"), (ENTROPY_EXPLORATORY_FAMILY, "below", "less")):
                out.append(effect_claim(family, f"{quantity} invoke {side} skip, {config} k={k}",
                                        f"at k = {k} under {config_label(config)}, the invoke path's {PAIRED[quantity]} is {side} the "
                                        f"skip path's (paired by fork)", diff, sub["task_group"], alternative=alternative, unit="nats",
                                        seed=seed, note=f"{len(sub)} forks", exploratory=family == ENTROPY_EXPLORATORY_FAMILY))
    return out


def ranking_claims(auroc: pd.DataFrame, k: int) -> list[Claim]:
    """Appendix E at depth ``k``: "AUROC > 0.5" (null 0.5) for each configuration × score × label of
    ``auroc`` (:func:`ranking_tables`). The p is the within-task-group permutation p, its floor the
    table's ``p_floor``; ``n`` counts the task groups holding a disagreement (the units the CI
    resamples for positives). Where the table refuses a CI the claim is not tested (p NaN; the reason
    in the note): without a CI over task groups nothing says the ranking generalises beyond one group."""
    out = []
    for r in auroc[auroc["k"] == k].itertuples():
        headline = r.score == HEADLINE_SCORE and r.label == HEADLINE_LABEL
        tested = np.isfinite(r.auroc) and not r.ci_note
        note = (f"{r.n_positive} of {r.n} forks disagree in {r.n_groups_positive} of {r.n_groups} task groups; null: labels permuted "
                f"within task groups; {r.n_skipped} bootstrap resamples held one class only (skipped)"
                + (f"; {r.ci_note}" if r.ci_note else ""))
        out.append(Claim(RANKING_FAMILY if headline else RANKING_EXPLORATORY_FAMILY, f"AUROC {r.score} → {r.label}, {r.config} k={k}",
                         f"at k = {k} under {config_label(r.config)}, ranking decision points by the {SCORES[r.score]} finds the "
                         f"forks where {LABELS[r.label]} better than chance (AUROC > 0.5)",
                         r.auroc, r.low, r.high, int(r.n_groups_positive), r.p_permutation if tested else np.nan,
                         p_floor=r.p_floor, unit="AUC", null=0.5, note=note, exploratory=not headline))
    return out


# ------------------------------------------------------------------------------------- the analysis
@register("forks", order=85)
@dataclass(kw_only=True)
class Forks(Analysis):
    """Seed 002: invoke/skip forks at every decision point; disagreement, entropy by path, entropy ranking."""

    # the statistics' settings do not change a row: a rerun with other values reuses the rows
    value_neutral: ClassVar[frozenset[str]] = RunOptions.value_neutral | {"resamples", "permutations"}

    k_max: int | None = k_max_option(SWEEP_K_MAX)
    configs: tuple[str, ...] = option(FORK_CONFIGS, "comma-separated memory configurations whose skills the invoke path shows",
                                      names=SKILL_CONFIGS, minimum=1)
    max_new_tokens: int = option(MAX_NEW_TOKENS, "greedy generation budget of each path's call", type=int, minimum=1, group="generation")
    resamples: int = option(2000, "bootstrap resamples of the task-group CIs", type=int, minimum=1)
    permutations: int = option(2000, "random rankings of the permutation null (AUROC, precision at budget)", type=int, minimum=1)

    @staticmethod
    def depths(ctx: RunContext) -> list[int]:
        """The invoke paths' depths: k = 1..K; under ``--quick`` only K (half the forks of report --quick at K = 2)."""
        return [ctx.options.k_max] if ctx.options.quick else list(range(1, ctx.options.k_max + 1))

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        """Score (resumably) every fork: item × configuration × k = 1..K; returns the rows."""
        if ctx.options.k_max < 1:
            raise OptionError(f"{NAME}: k_max (--k-max) must be at least 1: a fork shows k ≥ 1 skills on its invoke path")
        configs = list(self.configs)
        jobs = [Job(item, config, k, ctx.fmt, (CONDITION,)) for item in ctx.items for k in self.depths(ctx) for config in configs]
        shared = {name: value for name, value in header_options(ctx.options, RunOptions).items() if name != "margin_variant"}
        store = ctx.store(configs=configs, max_new_tokens=self.max_new_tokens, decoding="greedy", skip="the configuration's k = 0 prompt",
                          margin="tool_choice", margin_variant=None, options=shared)
        session = ctx.session
        stop_ids = stop_token_ids(session.model, session.tokenizer)
        skip_cache: dict[str, tuple[str, dict[str, Any]]] = {}  # item -> (skip prompt digest, its path row): scored once per item

        def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
            skip_record = ctx.builder.build(job.item, job.config, 0, job.fmt)
            digest = hashlib.sha256(json.dumps([skip_record.input_ids, [c.to_json() for c in skip_record.candidates]]).encode()).hexdigest()
            cached = skip_cache.get(job.item.id)
            if cached is None or cached[0] != digest:
                skip_cache.clear()  # an item's jobs run together: keep one item's skip path
                skip_cache[job.item.id] = cached = (digest, path_row(session, skip_record, stop_ids, self.max_new_tokens))
            invoke = path_row(session, record, stop_ids, self.max_new_tokens)
            return [fork_row(cached[1], invoke, skip_record, record)]

        run_jobs(ctx, store, jobs, scorer)
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> ForksSummary:
        seed = ctx.options.seed
        rows = with_outcomes(rows)
        shares = share_table(rows, resamples=self.resamples, seed=seed)
        paired = paired_table(rows, resamples=self.resamples, seed=seed)
        auroc, budget = ranking_tables(rows, resamples=self.resamples, permutations=self.permutations, seed=seed)
        note = (f"{provenance_without_margin(ctx)} · margin: tool_choice · greedy calls ≤ {self.max_new_tokens} new tokens · "
                f"skip = the k = 0 prompt · 95% bootstrap CIs over task groups ({self.resamples} resamples) · "
                f"{self.permutations} random rankings")
        return ForksSummary(rows, shares, paired, auroc, budget, note, int(rows["k"].max()), seed)

    def tables(self, summary: ForksSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": headline_rows(summary), f"{NAME}_shares": summary.shares, f"{NAME}_entropy": summary.paired,
                f"{NAME}_auroc": summary.auroc, f"{NAME}_budget": summary.budget}

    def figures(self, summary: ForksSummary, out_dir: Path) -> list[Path]:
        plots.style()
        return [*plots.save_figure(fig17_forks_entropy(summary.paired, summary.note), out_dir, FIGURES[0]),
                *plots.save_figure(fig18_forks_ranking(summary.budget, summary.auroc, summary.k_max, HEADLINE_LABEL, summary.note),
                                   out_dir, FIGURES[1])]

    def section(self, ctx: RunContext, summary: ForksSummary, figures: list[Path]) -> ReportSection:
        k = summary.k_max
        auroc = summary.auroc[(summary.auroc["k"] == k)][["config", "score", "label", "auroc", "low", "high", "n_skipped", "ci_note",
                                                          "null_low", "null_high", "p_permutation", "p_floor", "n", "n_positive",
                                                          "n_groups", "n_groups_positive"]]
        paired = summary.paired[summary.paired["k"] == k][["config", "quantity", "skip", "invoke", "difference", "low", "high", "p_greater",
                                                           "n", "n_items"]]
        body = (f"Each decision point forked at depth k: the prompt with the k retrieved skills shown (invoke) against the same prompt "
                f"without them (skip, the k = 0 prompt), from one shared, cached prefix. Answers at k = {k} (every k in "
                f"`{NAME}_shares.csv`, `{NAME}_entropy.csv`, `{NAME}_auroc.csv`, `{NAME}_budget.csv`); shares and means are means "
                f"of task-group means with 95% bootstrap CIs over task groups.\n\n{markdown_table(headline_rows(summary))}\n\n"
                f"Invoke against skip, paired by fork (seed Fig. 3; p: one-sided sign flips over task groups):\n\n"
                f"{markdown_table(paired)}\n\nRanking the decision points by the skip path's entropy (seed Appendix E): AUROC for "
                f"each kind of disagreement; its 95% CI resamples task groups (`n_skipped`: resamples holding one class only, left "
                f"out; no CI when fewer than 2 task groups hold a disagreement or a non-disagreement, or when a resample holds one class "
                f"only with probability above 10%); "
                f"the null permutes the labels within task groups (each group keeps its count of disagreements, so a score that "
                f"only tells groups apart is not a ranking), with its 2.5–97.5% range and p (floor `p_floor`):\n\n"
                f"{markdown_table(auroc)}\n\nLabels: {'; '.join(f'`{k}` {v}' for k, v in LABELS.items())}. Scores: "
                f"{'; '.join(f'`{k}` {v}' for k, v in SCORES.items())}.")
        comparisons = [Comparison(f"seed 002 Fig. 1b: skill access {effect} the greedy outcome, {config_label(config)} (k = {k})",
                                  100 * pick(summary.shares, quantity=f"{effect}_lenient", config=config, k=k), SEED_FIG1B[effect], "%",
                                  note="seed: % of paired trajectories (ALFWorld, BFCL), Qwen3; ours: decision points")
                       for config in sorted(set(summary.rows["config"])) for effect in EFFECTS]
        return ReportSection(NAME, "Seed 002 — invoke/skip forks and decision entropy (`forks`)", figures, body, comparisons, summary)

    def claims(self, summary: ForksSummary) -> list[Claim]:
        """Seed Fig. 3's entropy direction (families ``forks-entropy``, ``forks-entropy-exploratory``) and Appendix E's ranking
        (``forks-ranking``: the headline AUROC, the skip path's vocabulary entropy for a differing greedy
        call, per configuration; ``forks-ranking-exploratory``: the other scores and labels), each at the
        deepest k (:func:`entropy_claims`, :func:`ranking_claims`)."""
        return entropy_claims(summary.rows, summary.k_max, summary.seed) + ranking_claims(summary.auroc, summary.k_max)

    def print_summary(self, summary: ForksSummary) -> None:
        print(headline_rows(summary).round(3).to_string(index=False))


# --- Figs. 17 and 18, drawn by Forks.figures
FORK_PATH_COLORS: dict[str, tuple[float, float, float]] = {"skip": (0.55, 0.55, 0.55), "invoke": plots.PALETTE[2]}
FORK_SCORE_LABELS: dict[str, str] = {"entropy": "skip entropy (vocabulary)", "entropy_tools": "skip entropy (shown tools)"}


def fig17_forks_entropy(paired: pd.DataFrame, note: str) -> plt.Figure:
    """Seed 002 Fig. 3 on our forks: the entropy at the decision on the skip path (before the fork)
    and on the invoke path (after it), per k, one column per configuration; top row over the
    vocabulary, bottom row over the shown tools. Bars: mean of task-group means, whiskers 95% CIs.

    paired: config, k, quantity, skip, skip_low, skip_high, invoke, invoke_low, invoke_high, n.
    """
    quantities = [("entropy", "entropy over the vocabulary (nats)"), ("entropy_tools", "entropy over the shown tools (nats)")]
    configs = plots.ordered(paired["config"].unique(), plots.CONFIG_ORDER)
    fig, axes = plt.subplots(len(quantities), len(configs), figsize=(4.6 * len(configs), 6.4), squeeze=False)
    for row, (quantity, ylabel) in enumerate(quantities):
        for col, config in enumerate(configs):
            sub = paired[(paired["quantity"] == quantity) & (paired["config"] == config)]
            long = pd.concat([pd.DataFrame({"k": sub["k"].astype(str), "path": path, "value": sub[path], "low": sub[f"{path}_low"],
                                            "high": sub[f"{path}_high"], "n": sub["n"]}) for path in ("skip", "invoke")])
            ks = [str(k) for k in sorted(sub["k"].unique())]
            # the paired difference invoke − skip (the claim) under each k: its mean and CI over task groups
            deltas = {str(r.k): f"k = {r.k}\nΔ {r.difference:+.2f}" + (f" [{r.low:+.2f}, {r.high:+.2f}]" if np.isfinite(r.low) else "")
                      for r in sub.itertuples()}
            ax = axes[row, col]
            plots.grouped_bars(ax, long, ks, ["skip", "invoke"], group_col="k", series_col="path", series_label=lambda p: f"{p} path",
                               series_color=FORK_PATH_COLORS.get, group_label=deltas.get)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{plots.label(config)}" if row == 0 else "")
            if row == 0 and col == len(configs) - 1:
                plots.legend_outside(ax)
    fig.suptitle("Decision entropy before (skip) and after (invoke) the skill fork")
    plots.footnote(fig, note)
    return fig


def fig18_forks_ranking(budget: pd.DataFrame, auroc: pd.DataFrame, k: int, label_name: str, note: str) -> plt.Figure:
    """Seed 002 Appendix E on our forks, at depth ``k``: the share of forked decision points where
    invoke and skip disagree (label ``label_name``) when the points are forked in order of the skip
    path's entropy, against the budget (fraction of points forked); the random ranking (expected
    precision = prevalence, grey band: 2.5–97.5% of random orders) and the all-points baseline
    (every point forked, the square at budget 1). One panel per configuration; AUROC in the titles.

    budget: config, k, score, label, budget, precision, low, high, random_precision, random_low,
    random_high, all_points_precision, n, n_positive, n_groups; auroc: config, k, score, label, auroc, low, high, p_permutation.
    """
    sub = budget[(budget["k"] == k) & (budget["label"] == label_name)]
    configs = plots.ordered(sub["config"].unique(), plots.CONFIG_ORDER)
    fig, axes = plt.subplots(1, max(1, len(configs)), figsize=(6.0 * max(1, len(configs)), 4.4), squeeze=False)
    colors = dict(zip(FORK_SCORE_LABELS, sns.color_palette("colorblind", 6)[3:5]))
    for ax, config in zip(axes[0], configs):
        cell = sub[sub["config"] == config]
        first = cell[cell["score"] == "entropy"].sort_values("budget")
        if len(first):
            ax.fill_between(first["budget"], first["random_low"], first["random_high"], facecolor="none", edgecolor="0.55", hatch="///",
                            lw=0.6, label="random ranking (95% of orders)")
            ax.plot(first["budget"], first["random_precision"], color="0.45", ls="--", lw=1, label="random ranking (expected)")
            ax.scatter([1.0], [first["all_points_precision"].iloc[-1]], marker="s", s=40, color="0.2", zorder=6, label="all points")
        titles = []
        for score, text in FORK_SCORE_LABELS.items():
            curve = cell[cell["score"] == score].sort_values("budget")
            if not len(curve):
                continue
            headline = score == "entropy"  # its 95% CI over task groups as a band; the other ranking as a line only
            if headline:
                lo, hi = plots.ci_band(curve)
                ax.fill_between(curve["budget"], lo, hi, color=colors[score], alpha=0.15, lw=0, label=f"{text}: 95% CI")
            ax.plot(curve["budget"], curve["precision"], marker="o" if headline else "^", ms=3.5, ls="-" if headline else ":",
                    color=colors[score], label=f"ranked by {text}")
            a = auroc[(auroc["config"] == config) & (auroc["k"] == k) & (auroc["score"] == score) & (auroc["label"] == label_name)]
            if len(a):
                r = a.iloc[0]
                ci = f"[{r['low']:.2f}, {r['high']:.2f}]" if np.isfinite(r["low"]) else "(no CI)"
                titles.append(f"AUROC ({text.split('(')[1][:-1]}) {r['auroc']:.2f} {ci}, within-group permutation p = {r['p_permutation']:.2g}")
        n = int(first["n"].iloc[0]) if len(first) else 0
        positives = int(first["n_positive"].iloc[0]) if len(first) else 0
        ax.set_title(f"{plots.label(config)}, k = {k}: {positives} of {n} forks disagree\n" + "\n".join(titles), fontsize=8,
                     fontweight="normal")  # three lines within the panel's width
        ax.set_xlabel("budget: fraction of decision points forked")
        ax.set_ylabel("precision: share of forked points that disagree")
        ax.set_xlim(0, 1.04)
        ax.set_ylim(-0.02, 1.02)
    plots.legend_outside(axes[0][-1])
    fig.suptitle(f"Entropy-guided forking: finding the points where invoke and skip disagree ({label_name})")
    plots.footnote(fig, note)
    return fig
