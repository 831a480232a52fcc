"""``calls`` (Fig. 11): realized calls, read in every call syntax, strict and lenient.

``calls``: at every retrieval depth k the model greedily generates its next action from the
prompt *without* the forced tool-call prefix (native: the text up to the generation prompt,
``input_ids[:open_index + 1]``; prompted: the whole prompt). The reply is read by the one tool-call
parser, :func:`probes.scoring.toolcalls.parse_reply`, which recognises every syntax chat models
write (the template's ``<tool_call>`` JSON, bare or fenced JSON, OpenAI- and Llama-style objects,
Mistral's ``[TOOL_CALLS]``, Python call syntax) and each row records the matched ``syntax`` and
``shape``, whether the call was in the template's format (``template_format``) and whether the
tool was in the prompt's catalog (``known_tool``). Every reply gets two outcomes
(:data:`probes.scoring.toolcalls.OUTCOMES`):

``strict``   only a call in the template's format counts, as a tool runtime would execute it; a
             reply calling a tool in another syntax is ``off_template_call``;
``lenient``  any recognised call counts;

and in both an ``abstain`` is a reply without a call of any syntax, a ``parse_failure`` one that
starts a call that cannot be completed or decoded, ``unknown_tool`` a call to a tool the prompt
did not show. ``refusal`` (whether the prose declines) is a column of its own. ``solved`` means the
action is the item's correct action (the correct tool, or abstention when abstaining is correct):
the correct-call rate of Fig. 11 and the "solved" of Fig. 12. The raw generation is in every row.

``paired`` (:mod:`probes.analyses.paired`) reuses these generations.
"""

from __future__ import annotations

import textwrap
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probes.analyses import register
from probes.prompts.builder import SWEEP_K_MAX
from probes.analyses.base import Analysis, Comparison, ReportSection
from probes.analyses.jobs import Job, run_jobs
from probes.analyses.option_system import RunOptions, header_options, k_max_option, option
from probes.analyses.run_context import RunContext, provenance
from probes.analyses.parallel import open_store
from probes.data.configs import CONFIGS, CONTROL_CONFIGS, config_label
from probes.data.dataset import ABSTAIN, BUNDLED_DATASETS, bundled_dataset, load_dataset
from probes.data.schema import Skill
from probes.engine.generate import greedy_generate, stop_token_ids
from probes.prompts.record import PromptRecord
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring.checker import (BOUNDARY_RULES, RULES, RUNNABLE_RULES, ChatJudge, Decision, DecisionState, Judge, boundary_verdict,
                                    check_call, combined_verdict, grammar_coverage, proposed)
from probes.scoring.claims import Claim, effect_claim
from probes.scoring.margins import candidate_path_logprobs, candidates_from_record
from probes.scoring.score import row_fields
from probes.scoring.stats import DEFAULT_SEED, MIN_CI_GROUPS, bootstrap_mean, ci_text, cluster_bootstrap_blocks, no_ci_note, paired_differences
from probes.scoring.toolcalls import MODES, OUTCOMES, is_solved, mode_description, outcome, parse_reply

MAX_NEW_TOKENS = 48
CALLS_CONFIGS: tuple[str, ...] = ("base", "proc", "app", "basm", "pad-procedure")
CLAIM_FAMILY = "calls"


# ------------------------------------------------------------------------------------- generation
def generation_prompt(record: PromptRecord) -> list[int]:
    """The prompt the model continues freely: without the native forced ``<tool_call>`` prefix."""
    ids = list(record.input_ids)
    if record.format == "native":
        if record.open_index is None:
            raise ValueError(f"{record.record_id}: native record without open_index")
        return ids[: int(record.open_index) + 1]
    return ids


def shown_tools(record: PromptRecord) -> list[str]:
    """The tool names the prompt's catalog showed (every candidate action but abstention)."""
    return [c.action for c in record.candidates if c.action != ABSTAIN]


def call_row(record: PromptRecord, new_ids: Sequence[int], stopped: bool, text: str) -> dict[str, Any]:
    """The tidy row of one generation (without ``key``): the raw reply, every call attempt found in
    it, the reply's call (the lenient action, else the first attempt: its ``syntax``, ``shape``,
    ``template_format``, ``known_tool``) and, per mode, the action, outcome and whether it solves
    the item."""
    reply = parse_reply(text, template=record.format, catalog=shown_tools(record))
    first = reply.action("lenient") or (reply.calls[0] if reply.calls else None)
    row = row_fields(record)  # the record_id, item_id, bucket, domain, task_group, config, k, format columns
    row.update(
        correct_action=record.correct_action, wrong_tools=list(record.wrong_tools),
        n_prompt_tokens=len(generation_prompt(record)), n_new_tokens=len(new_ids), stopped=stopped,
        generation=text, parsed=reply.as_dict(), n_calls=len(reply.calls),
        syntax=first.syntax if first else None, shape=first.shape if first else None,
        template_format=first.template_format if first else None, known_tool=first.known_tool if first else None,
        refusal=reply.refusal, empty=reply.empty,
    )
    for mode in MODES:
        action = reply.action(mode)
        result = outcome(reply, mode, record.correct_action, row["wrong_tools"])
        row.update({f"{mode}_action": action.name if action else result, f"{mode}_outcome": result,
                    f"{mode}_solved": is_solved(result, record.correct_action)})
    return row


def generate_call(session: Any, record: PromptRecord, *, max_new_tokens: int = MAX_NEW_TOKENS, stop_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """Generate and parse the next action of one prompt record with a ``ProbeSession``."""
    stop_ids = stop_token_ids(session.model, session.tokenizer) if stop_ids is None else stop_ids
    new_ids, stopped = greedy_generate(session.model, generation_prompt(record), stop_ids, max_new_tokens)
    text = session.tokenizer.decode(new_ids, skip_special_tokens=False)
    return call_row(record, new_ids, stopped, text)


# ------------------------------------------------------------------------------------- aggregates
# rate name -> (label, outcome it counts; None: solved). Strict replies that call off the template's
# format have their own rate; lenient has none by definition.
RATES: dict[str, tuple[str, str | None]] = {
    "wrong_call": ("wrong-call rate", "wrong_tool"),
    "correct_call": ("correct-call rate", None),
    "abstained": ("abstention rate", "abstain"),
    "other_tool": ("other-tool rate", "other_tool"),
    "unknown_tool": ("unknown-tool rate", "unknown_tool"),
    "parse_failure": ("parse-failure rate", "parse_failure"),
    "off_template_call": ("off-template call rate", "off_template_call"),
}


def rate_values(rows: pd.DataFrame, mode: str, rate: str) -> pd.Series:
    """0/1 per row: whether the row counts towards ``rate`` in ``mode``."""
    counted = RATES[rate][1]
    return rows[f"{mode}_solved"].astype(bool) if counted is None else rows[f"{mode}_outcome"] == counted


def call_rates(rows: pd.DataFrame, *, resamples: int = 2000, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Per mode × format × config × k × bucket × rate: mean with a 95% bootstrap CI over task groups.

    Columns: mode, format, config, k, bucket, rate, value, low, high, n (items), n_groups, count.
    """
    out = []
    keys = ["format", "config", "k", "bucket"]
    for key, frame in rows.groupby(keys, sort=True):
        for mode in MODES:
            for rate in RATES:
                if mode == "lenient" and rate == "off_template_call":
                    continue
                values = rate_values(frame, mode, rate).astype(float).to_numpy()
                est = bootstrap_mean(values, frame["task_group"].tolist(), resamples=resamples, seed=seed)
                out.append({"mode": mode, **dict(zip(keys, key)), "rate": rate, "value": est.value, "low": est.low,
                            "high": est.high, "n": len(frame), "n_groups": est.n_units, "count": int(values.sum())})
    return pd.DataFrame(out, columns=["mode", *keys, "rate", "value", "low", "high", "n", "n_groups", "count"])


def syntax_counts(rows: pd.DataFrame) -> pd.DataFrame:
    """Replies per format × config × k × syntax × shape × template format (``none``: no call attempt)."""
    keys = ["format", "config", "k", "syntax", "shape", "template_format"]
    frame = rows.assign(syntax=rows["syntax"].fillna("none"), shape=rows["shape"].fillna("none"),
                        template_format=rows["template_format"].astype(object).where(rows["syntax"].notna(), "none"))
    return frame.groupby(keys, sort=True).size().rename("replies").reset_index()


def prose_replies(rows: pd.DataFrame) -> int:
    """Replies with no call attempt in any syntax that do not decline either: prose. They are ``abstain``
    outcomes (no call), but not decisions to abstain (a base checkpoint, never tuned to call tools, writes them)."""
    return int(((rows["n_calls"] == 0) & ~rows["refusal"].astype(bool)).sum())


def prose_statement(rows: pd.DataFrame) -> str:
    """The sentence that says how many ``abstain`` outcomes are prose (:func:`prose_replies`); empty when none is."""
    n = prose_replies(rows)
    if not n:
        return ""
    return (f"No call syntax emitted: {n} of {len(rows)} replies ({n / len(rows):.0%}) hold no call in any syntax and do not "
            "decline; they count as abstain outcomes but are not decisions to abstain (a base checkpoint without chat tuning "
            "rarely writes calls): read the abstention rate as the rate of replies without a call.")


# ------------------------------------------------------------------------------------- the boundary checker G
CHECKER_NAME = "calls_checker"
CHECKER_FIGURE = "fig19_checker_outcomes"
ON_BLOCK: tuple[str, ...] = ("revise", "report")
ON_UNDECIDED: tuple[str, ...] = ("allow", "block")
CHECKED_OUTCOMES: tuple[str, ...] = (*OUTCOMES, "blocked")


def ranked_actions(session: Any, record: PromptRecord) -> list[tuple[str, float]]:
    """The record's candidate actions (every catalog tool and abstention), best first, by their whole-path
    log-probability (:func:`probes.scoring.margins.candidate_path_logprobs`): one engine call."""
    cands = candidates_from_record(record)
    scored = {c.key: (c.anchor_index, list(c.token_ids)) for c in cands if not (c.is_abstention and record.format == "native")}
    result = session.run(record.input_ids, record.query_rows, candidates=scored)
    base = result.conditions[0]
    logprobs = candidate_path_logprobs(base.row_logits, result.input_ids, cands, record.format, int(record.decision_index),
                                       base.candidate_token_logprobs, record.open_index)
    return sorted(logprobs.items(), key=lambda kv: -kv[1])


def complete_call(session: Any, record: PromptRecord, tool: str, mode: str, max_new_tokens: int) -> dict[str, Any]:
    """The model's arguments for ``tool``: greedy generation from the prompt with the call opened and the
    tool's name forced (its candidate tokens after the anchor row), read in ``mode`` by the one parser.
    Returns the reply text (from where the free generation starts), whether it stopped at an end of
    turn, and the parsed call (None unless it is a call of ``tool``)."""
    candidate = next((c for c in record.candidates if c.action == tool), None)
    if candidate is None:
        raise ValueError(f"{record.record_id}: {tool!r} is not a candidate of the prompt")
    prompt = [*record.input_ids[: candidate.anchor_index + 1], *candidate.token_ids]
    new_ids, stopped = greedy_generate(session.model, prompt, stop_token_ids(session.model, session.tokenizer), max_new_tokens)
    text = session.tokenizer.decode([*prompt[len(generation_prompt(record)):], *new_ids], skip_special_tokens=False)
    call = parse_reply(text, template=record.format, catalog=shown_tools(record)).action(mode)
    return {"text": text, "stopped": stopped, "call": call if call is not None and call.name == tool else None}


def revise(ranked: Sequence[tuple[str, float]], blocked: str, complete: Any, decide: Any, on_undecided: str) -> tuple[str, dict[str, Any]]:
    """The revised action of a blocked call: the next-best candidate after ``blocked`` when it is a tool whose
    completed call (``complete(tool)``: the model's own arguments for it) G passes on every rule, the schema
    included (``decide(call)``; undecided counts as passed only with ``on_undecided`` allow); else abstention,
    also when abstention ranks next. One candidate only: walking down the ranking until G passes something
    would search for a call rather than revise one. Returns the action and what was tried."""
    nxt = next(((action, logprob) for action, logprob in ranked if action != blocked), None)
    if nxt is None or nxt[0] == ABSTAIN:
        return ABSTAIN, {"action": None if nxt is None else ABSTAIN, "logprob": None if nxt is None else nxt[1],
                         "reason": "no candidate left" if nxt is None else "abstention ranks next"}
    action, logprob = nxt
    completion = complete(action)
    tried = {"action": action, "logprob": logprob, "text": completion["text"], "stopped": completion["stopped"]}
    if completion["call"] is None:
        return ABSTAIN, {**tried, "reason": f"the completion is not a readable call of {action}"}
    decision: Decision = decide(completion["call"])
    tried.update(call=completion["call"].as_dict(), verdict=decision.verdict, decision=decision.as_dict())
    allowed = decision.verdict == "pass" or (decision.verdict == "undecided" and on_undecided == "allow")
    return (action if allowed else ABSTAIN), {**tried, "reason": f"G: {decision.verdict}"}


def runnable(decision: Decision) -> bool:
    """A runtime could run the call: G's catalog, completeness and schema checks all pass."""
    return all(c.verdict == "pass" for c in decision.checks if c.rule in RUNNABLE_RULES)


def checked_outcome(action: str, correct_action: str, wrong_tools: Sequence[str], catalog: Sequence[str]) -> str:
    """The outcome of a revised action (one of :data:`OUTCOMES`)."""
    if action == ABSTAIN:
        return "abstain"
    if action == correct_action:
        return "correct_tool"
    return "wrong_tool" if action in wrong_tools else "other_tool" if action in catalog else "unknown_tool"


def checker_rows(ctx: RunContext, item: Any, record: PromptRecord, generation: dict[str, Any], judge: Judge | None,
                 on_block: str, on_undecided: str) -> dict[str, Any]:
    """G on one greedy call (the row's lenient and strict actions): per mode the decision, whether it
    blocks, the action and outcome with G (a revision: :func:`revise`), and whether that solves the item."""
    catalog = ctx.dataset.catalog_for(item)
    state = DecisionState.of(item, catalog)
    by_id = ctx.dataset.skills
    skills = [by_id[entry.skill_id] for entry in record.skills]
    reply = parse_reply(generation["generation"], template=record.format, catalog=shown_tools(record))
    row = row_fields(record)
    row.update(condition="checker", correct_action=record.correct_action, wrong_tools=list(record.wrong_tools),
               retrieved=[entry.skill_id for entry in record.skills])
    ranked: list[tuple[str, float]] | None = None
    completions: dict[tuple[str, str], dict[str, Any]] = {}  # (tool, mode): one generation per tool and mode

    def decide(call: Any) -> Decision:
        return check_call(proposed(call), state, skills, judge=judge)

    for mode in MODES:
        before = generation[f"{mode}_outcome"]
        call = reply.action(mode)
        decision = None if call is None else decide(call)
        verdict = None if decision is None else decision.verdict
        blocks = verdict == "block" or (verdict == "undecided" and on_undecided == "block")
        after, action, revision = before, generation[f"{mode}_action"], None
        if blocks and on_block == "report":
            after, action = "blocked", "blocked"
        elif blocks:
            ranked = ranked_actions(ctx.session, record) if ranked is None else ranked

            def complete(tool: str, mode: str = mode) -> dict[str, Any]:
                if (tool, mode) not in completions:
                    completions[(tool, mode)] = complete_call(ctx.session, record, tool, mode, ctx.options.max_new_tokens)
                return completions[(tool, mode)]

            action, revision = revise(ranked, call.name, complete, decide, on_undecided)
            after = checked_outcome(action, record.correct_action, record.wrong_tools, shown_tools(record))
        runnable_before = decision is not None and runnable(decision)
        runnable_after = (runnable_before if not blocks else on_block == "revise" and action != ABSTAIN)  # G passed the revised call
        row.update({f"{mode}_verdict": verdict, f"{mode}_blocked": blocks, f"{mode}_decision": decision.as_dict() if decision else None,
                    f"{mode}_runnable_before": runnable_before, f"{mode}_runnable_after": runnable_after,
                    f"{mode}_n_undecided": 0 if decision is None else sum(c.verdict == "undecided" for c in decision.checks),
                    f"{mode}_judged": 0 if decision is None else sum(c.decided_by == "judge" for c in decision.checks),
                    f"{mode}_outcome_before": before, f"{mode}_solved_before": bool(generation[f"{mode}_solved"]),
                    f"{mode}_outcome_after": after, f"{mode}_action_after": action, f"{mode}_revision": revision,
                    f"{mode}_solved_after": is_solved(after, record.correct_action)})
    return row


def checker_config(ctx: RunContext, configs: Sequence[str], judge_label: str | None) -> dict[str, Any]:
    """The header of the checker rows: the generations' configuration and G's options."""
    options = ctx.options
    return {**calls_config(ctx, configs), "checker": {"on_block": options.on_block, "on_undecided": options.on_undecided,
                                                       "judge": judge_label, "judge_max_new_tokens": JUDGE_MAX_NEW_TOKENS}}


JUDGE_MAX_NEW_TOKENS = 4  # one word: YES or NO


def load_judge(model: str | None) -> ChatJudge | None:
    """The judge of undecided conditions: a local chat model through ChatGenerator (None: no judge)."""
    if model is None:
        return None
    from probes.engine.generate import ChatGenerator  # torch: only when a judge is asked for

    generator = ChatGenerator.load(model, max_new_tokens=JUDGE_MAX_NEW_TOKENS)
    return ChatJudge(generator, generator.label)


def score_checker(ctx: RunContext, store: Any, generations: pd.DataFrame, configs: Sequence[str], judge: Judge | None) -> int:
    """G on every generation row into ``store`` (resumable); returns jobs run."""
    by_key = {row["key"].rsplit("|", 1)[0]: row for row in generations.to_dict("records")}
    jobs = [Job(item, config, k, ctx.fmt, ("checker",)) for item in ctx.items for k in range(ctx.options.k_max + 1) for config in configs]

    def scorer(record: PromptRecord, job: Any) -> list[dict[str, Any]]:
        return [checker_rows(ctx, job.item, record, by_key[record.record_id], judge, ctx.options.on_block, ctx.options.on_undecided)]

    return run_jobs(ctx, store, jobs, scorer)


CHECKER_RATES: dict[str, tuple[str, str | None]] = {"wrong_call": RATES["wrong_call"], "correct_call": RATES["correct_call"],
                                                    "correct_runnable": ("correct runnable call rate", None),
                                                    "abstained": RATES["abstained"], "blocked": ("blocked rate", "blocked")}
CHECKER_SIDES: dict[str, str] = {"without": "before", "with": "after"}  # G's side -> the rows' column suffix


def checker_values(frame: pd.DataFrame, mode: str, checker: str, rate: str) -> pd.Series:
    """True per row where the row counts towards ``rate`` (:data:`CHECKER_RATES`) in ``mode``, ``checker``
    without or with G. ``correct_runnable``: solved by a call a runtime could run (G's catalog,
    completeness and schema checks pass) or by a correct abstention."""
    suffix = CHECKER_SIDES[checker]
    outcomes, solved = frame[f"{mode}_outcome_{suffix}"], frame[f"{mode}_solved_{suffix}"].astype(bool)
    if rate == "correct_runnable":
        return solved & (frame[f"{mode}_runnable_{suffix}"].astype(bool) | (outcomes == "abstain"))
    counted = CHECKER_RATES[rate][1]
    return solved if counted is None else outcomes == counted


def checker_rates(rows: pd.DataFrame, *, resamples: int = 2000, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Per mode × G (without / with) × format × config × k × bucket × rate (:func:`checker_values`): mean
    with a 95% bootstrap CI over task groups (the blocked rate only with G and ``on_block report``).
    ``correct_runnable`` is the fair baseline for the correct-call rate with G, which lets no
    unrunnable call through."""
    out = []
    keys = ["format", "config", "k", "bucket"]
    for key, frame in rows.groupby(keys, sort=True):
        for mode in MODES:
            for checker in CHECKER_SIDES:
                for rate in CHECKER_RATES:
                    if rate == "blocked" and checker == "without":
                        continue
                    values = checker_values(frame, mode, checker, rate).astype(float).to_numpy()
                    est = bootstrap_mean(values, frame["task_group"].tolist(), resamples=resamples, seed=seed)
                    out.append({"mode": mode, "checker": checker, **dict(zip(keys, key)), "rate": rate, "value": est.value,
                                "low": est.low, "high": est.high, "n": len(frame), "n_groups": est.n_units, "count": int(values.sum())})
    return pd.DataFrame(out, columns=["mode", "checker", *keys, "rate", "value", "low", "high", "n", "n_groups", "count"])


# G's boundary checking is measured at k ≥ 1 only: k = 0 shows no skill, so no boundary rule can apply there
# (Base's calls would all be "passed" and flatter precision).
BOUNDARY_K_MIN = 1


def decision_boundary_verdicts(rows: pd.DataFrame, mode: str) -> pd.Series:
    """Per row: G's verdict from its boundary rules alone (:func:`probes.scoring.checker.boundary_verdict`;
    ``none``: no boundary rule applied), None where the reply made no call."""
    return rows[f"{mode}_decision"].map(lambda d: boundary_verdict(d["checks"]) if isinstance(d, dict) else None)


def _known_tool(decision: Any) -> bool:
    return isinstance(decision, dict) and any(c["rule"] == "known_tool" and c["verdict"] == "pass" for c in decision["checks"])


def pooled_ratio(hits: np.ndarray, totals: np.ndarray, groups: Sequence[str], *, resamples: int = 2000,
                 seed: int = DEFAULT_SEED) -> tuple[float, float, float, int]:
    """Σ hits / Σ totals over the rows (a precision or a recall: pooled counts, as the table's counts
    beside it) with a 95% percentile CI from resampling task groups
    (:func:`probes.scoring.stats.cluster_bootstrap_blocks`). Returns (value, low, high, resamples used):
    resamples whose drawn groups hold no total are undefined and left out (their number is the
    difference to ``resamples``); no CI (NaN) below two task groups or without a total."""
    hits, totals = np.asarray(hits, dtype=float), np.asarray(totals, dtype=float)
    if totals.sum() == 0:
        return math.nan, math.nan, math.nan, 0
    used = 0

    def ratio(block: np.ndarray) -> np.ndarray:  # all resamples of a block at once
        nonlocal used
        total = totals[block].sum(axis=1)
        used += int(np.count_nonzero(total))
        return np.where(total != 0, hits[block].sum(axis=1) / total, math.nan)

    low, high = cluster_bootstrap_blocks(ratio, groups, resamples=resamples, seed=seed)
    return float(hits.sum() / totals.sum()), low, high, used


QUALITY_COLUMNS = ["mode", "config", "calls", "bad", "bad_share", "boundary_blocked", "block_share", "boundary_blocked_bad", "blocked_groups",
                   "precision", "precision_low", "precision_high", "recall", "recall_low", "recall_high", "n_groups",
                   "boundary_undecided", "boundary_undecided_bad", "boundary_passed", "boundary_passed_bad", "no_boundary_rule",
                   "judged", "excluded_k0", "excluded_unknown_tool", "note"]


def checker_quality(rows: pd.DataFrame, *, resamples: int = 2000, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """G's boundary checking against the items' labels, per mode × config, over the calls at k ≥ 1 of a
    tool the prompt's catalog shows (k = 0 shows no skill; a call of another tool is the catalog
    check's: both are counted in ``excluded_*``, never in the rates). *bad*: the call is not the item's
    correct action. A *boundary detection* is a block by a boundary rule (avoidance, applicability);
    a block by the catalog, completeness or schema checks is not one (:func:`checker_rule_counts`
    counts those). Precision = bad among detections, recall = detections among bad calls, each a
    pooled ratio with a 95% CI over task groups (:func:`pooled_ratio`); a random blocker with the same
    block rate has precision ``bad_share`` and recall ``block_share``. Calls whose boundary rules stayed
    undecided (``boundary_undecided``; blocked only under ``--on-undecided block``) are neither detections
    nor passes; ``no_boundary_rule``: no retrieved skill had a rule about the tool; ``blocked_groups``: the
    task groups the detections come from."""
    out = []
    for mode in MODES:
        called = rows[rows[f"{mode}_verdict"].notna()]
        for config, frame in called.groupby("config", sort=True):
            at_k = frame[frame["k"] >= BOUNDARY_K_MIN]
            known = at_k[at_k[f"{mode}_decision"].map(_known_tool)]
            bad = ~known[f"{mode}_solved_before"].astype(bool).to_numpy()
            verdict = decision_boundary_verdicts(known, mode).to_numpy()
            detected = verdict == "block"
            groups = known["task_group"].tolist()
            precision = pooled_ratio(bad & detected, detected, groups, resamples=resamples, seed=seed)
            recall = pooled_ratio(bad & detected, bad, groups, resamples=resamples, seed=seed)
            n_groups = len(set(groups))
            out.append({"mode": mode, "config": config, "calls": len(known), "bad": int(bad.sum()),
                        "bad_share": bad.mean() if len(known) else math.nan, "boundary_blocked": int(detected.sum()),
                        "block_share": detected.mean() if len(known) else math.nan, "boundary_blocked_bad": int((bad & detected).sum()),
                        "blocked_groups": len(set(np.asarray(groups)[detected].tolist())),
                        "precision": precision[0], "precision_low": precision[1], "precision_high": precision[2],
                        "recall": recall[0], "recall_low": recall[1], "recall_high": recall[2], "n_groups": n_groups,
                        "boundary_undecided": int((verdict == "undecided").sum()), "boundary_undecided_bad": int((bad & (verdict == "undecided")).sum()),
                        "boundary_passed": int((verdict == "pass").sum()), "boundary_passed_bad": int((bad & (verdict == "pass")).sum()),
                        "no_boundary_rule": int((verdict == "none").sum()), "judged": int(known[f"{mode}_judged"].sum()),
                        "excluded_k0": len(frame) - len(at_k), "excluded_unknown_tool": len(at_k) - len(known),
                        "note": _quality_note(precision, recall, n_groups, resamples)})
    return pd.DataFrame(out, columns=QUALITY_COLUMNS)


def _quality_note(precision: tuple[float, float, float, int], recall: tuple[float, float, float, int], n_groups: int,
                  resamples: int) -> str:
    """Why a CI is missing, of zero width, or over fewer resamples than drawn."""
    if n_groups < MIN_CI_GROUPS:
        return no_ci_note(n_groups)
    notes = []
    for name, (value, low, high, used), total in (("precision", precision, "boundary block"), ("recall", recall, "bad call")):
        if not math.isfinite(value):
            notes.append(f"{name}: no {total}")
        elif low == high:
            notes.append(f"{name}: zero width, every resample gives {value:.2f}")
        if math.isfinite(value) and used < resamples:
            notes.append(f"{name} CI over the {used} of {resamples} resamples that drew a {total}")
    return "; ".join(notes)


RULE_COUNT_COLUMNS = ["mode", "config", "kind", "rule", "calls", "blocked", "blocked_bad", "blocked_correct", "blocked_alone",
                      "undecided", "judged"]


def checker_rule_counts(rows: pd.DataFrame) -> pd.DataFrame:
    """G's rules apart, per mode × config × rule, over every call at k ≥ 1 (the unknown tools' included):
    ``kind`` boundary (avoidance, applicability: boundary checking) or runnable (catalog, completeness,
    schema: whether a runtime could run the call; their blocks are not boundary detections); the calls
    the rule checked, blocked (bad: not the item's correct action), blocked as the only blocking rule,
    left undecided, and its checks a judge decided. A call blocked by several rules counts under each."""
    counts: dict[tuple[str, str, str], dict[str, int]] = {}
    for mode in MODES:
        called = rows[rows[f"{mode}_verdict"].notna() & (rows["k"] >= BOUNDARY_K_MIN)]
        for config, decision, solved in zip(called["config"], called[f"{mode}_decision"], called[f"{mode}_solved_before"].astype(bool)):
            by_rule: dict[str, list[dict[str, Any]]] = {}
            for check in decision["checks"]:
                by_rule.setdefault(check["rule"], []).append(check)
            verdicts = {rule: combined_verdict(c["verdict"] for c in checks) for rule, checks in by_rule.items()}
            blocking = [rule for rule, verdict in verdicts.items() if verdict == "block"]
            for rule, verdict in verdicts.items():
                cell = counts.setdefault((mode, config, rule), dict.fromkeys(RULE_COUNT_COLUMNS[4:], 0))
                cell["calls"] += 1
                cell["blocked"] += verdict == "block"
                cell["blocked_bad"] += verdict == "block" and not solved
                cell["blocked_correct"] += verdict == "block" and solved
                cell["blocked_alone"] += blocking == [rule]
                cell["undecided"] += verdict == "undecided"
                cell["judged"] += sum(c["decided_by"] == "judge" for c in by_rule[rule])
    order = {rule: i for i, rule in enumerate(RULES)}
    keys = sorted(counts, key=lambda key: (MODES.index(key[0]), key[1], order[key[2]]))
    return pd.DataFrame([{"mode": mode, "config": config, "kind": "boundary" if rule in BOUNDARY_RULES else "runnable", "rule": rule,
                          **counts[(mode, config, rule)]} for mode, config, rule in keys], columns=RULE_COUNT_COLUMNS)


def boundary_only(rows: pd.DataFrame, mode: str, on_undecided: str) -> pd.DataFrame:
    """``rows`` with G's side of ``mode`` as if only its boundary rules could block: a call no boundary rule
    blocks (under ``on_undecided``) keeps its outcome without G; a blocked one keeps its outcome with G
    (the revision as run)."""
    verdict = decision_boundary_verdicts(rows, mode)
    kept = ~((verdict == "block") | ((verdict == "undecided") & (on_undecided == "block")))
    out = rows.copy()
    for column in ("outcome", "solved", "runnable"):
        out[f"{mode}_{column}_after"] = out[f"{mode}_{column}_after"].where(~kept, out[f"{mode}_{column}_before"])
    return out


# The paired claims on G (family "checker"): G is BASM's checker (Eq. 11), so they are made on BASM's records at
# k ≥ 1, chosen before any run, with one smallest effect of interest for the family: one call in ten.
CHECKER_FAMILY = "checker"
CHECKER_CLAIM_CONFIG = "basm"
CHECKER_SESOI = 0.10  # rate


def checker_claims(rows: pd.DataFrame, *, on_block: str, on_undecided: str, seed: int = DEFAULT_SEED) -> list[Claim]:
    """G with − without on the same records (item × k, task groups as units), per mode, under BASM at
    k ≥ 1: (1) on T_wrong, G lowers the wrong-tool execution rate (the outcome G exists to prevent);
    (2) its boundary rules alone do (calls blocked only by the catalog, completeness or schema checks
    counted as run: :func:`boundary_only`), the tested form of boundary recall; (3) over every bucket,
    G lowers the correct runnable call rate (what it costs). Each one-sided (less), with the family's
    δ = :data:`CHECKER_SESOI`."""
    basm = rows[(rows["config"] == CHECKER_CLAIM_CONFIG) & (rows["k"] >= BOUNDARY_K_MIN)]
    wrong = basm[basm["bucket"] == "T_wrong"]
    policy = f"blocked calls: {on_block} · undecided: {on_undecided}"
    claims = []
    for mode in MODES:
        for name, frame, rate, statement in (
                ("wrong_call_with_g", wrong, "wrong_call",
                 f"on T_wrong at k ≥ 1 under {config_label(CHECKER_CLAIM_CONFIG)}, G lowers the {mode} wrong-tool execution rate "
                 f"(with − without G, paired by record)"),
                ("wrong_call_boundary_rules", boundary_only(wrong, mode, on_undecided), "wrong_call",
                 f"on T_wrong at k ≥ 1 under {config_label(CHECKER_CLAIM_CONFIG)}, G's boundary rules alone (avoidance, applicability) "
                 f"lower the {mode} wrong-tool execution rate (calls blocked only by the catalog, completeness or schema checks "
                 f"counted as run; paired by record)"),
                ("correct_runnable_with_g", basm, "correct_runnable",
                 f"at k ≥ 1 under {config_label(CHECKER_CLAIM_CONFIG)} (every bucket), G lowers the {mode} correct runnable call rate "
                 f"(its cost; with − without G, paired by record)")):
            if not len(frame):
                continue
            delta = (checker_values(frame, mode, "with", rate).astype(float) - checker_values(frame, mode, "without", rate).astype(float))
            claims.append(effect_claim(
                CHECKER_FAMILY, f"{mode}_{name}", statement, delta.to_numpy(), frame["task_group"].tolist(), alternative="less",
                sesoi=CHECKER_SESOI, unit="rate", seed=seed,
                note=f"{len(frame)} records of {frame['item_id'].nunique()} items, k = {', '.join(map(str, sorted(set(frame['k']))))} "
                     f"(k = 0 shows no skill) · {policy} · δ = {CHECKER_SESOI:g} for the family, stated before the run"))
    return claims


def checker_table(rates: pd.DataFrame) -> pd.DataFrame:
    """The wrong-, correct-call and abstention rates without and with G, one row per bucket × config ×
    mode × rate, one column per k (value [low, high])."""
    shown = rates[rates["rate"] != "blocked"].assign(cell=lambda f: f.apply(
        lambda r: f"{r['value']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" if r["low"] == r["low"] else f"{r['value']:.2f}", axis=1))
    table = shown.pivot_table(index=["bucket", "config", "mode", "rate"], columns=["checker", "k"], values="cell", aggfunc="first", sort=True)
    table.columns = [f"{checker} G k={k}" for checker, k in table.columns]
    return table.reset_index()


def ratio_text(value: float, low: float, high: float, n_groups: int) -> str:
    """A precision or recall as text: value [low, high]; the value with why it has no CI; or, where every
    task-group resample gives the same value, that said instead of a CI of zero width."""
    if not math.isfinite(value):
        return "—"
    if low == high:
        return f"{value:.2f} (every task-group resample gives {value:.2f})"
    return ci_text(value, low, high, n_groups, ".2f")


def boundary_table(quality: pd.DataFrame) -> pd.DataFrame:
    """The boundary-only precision and recall (:func:`checker_quality`) as text cells: value [low, high],
    or the value with why it has no CI."""
    cells = {name: [ratio_text(v, lo, hi, n) for v, lo, hi, n in zip(quality[name], quality[f"{name}_low"], quality[f"{name}_high"],
                                                                          quality["n_groups"])] for name in ("precision", "recall")}
    table = quality.assign(**cells)
    return table[["mode", "config", "calls", "bad", "boundary_blocked", "boundary_blocked_bad", "blocked_groups", "precision", "bad_share", "recall",
                  "block_share", "boundary_undecided", "boundary_undecided_bad", "no_boundary_rule", "n_groups", "excluded_k0",
                  "excluded_unknown_tool"]].round(3)


def checker_statement(summary: "CheckerSummary", mode: str = "lenient") -> str:
    """What G achieves, in words: its boundary rules' detections, recall and precision per configuration
    (``mode``), the other rules' blocks apart, whether a judge ran, and the grammar's coverage."""
    quality = summary.quality[summary.quality["mode"] == mode]
    lines = [f"What G's boundary rules achieve ({mode} reading; avoidance and applicability rules only; calls of catalog tools at "
             f"k ≥ 1: k = 0 shows no skill and is left out):"]
    def groups(n: int) -> str:
        return f"{n} task group{'' if n == 1 else 's'}"

    for r in quality.itertuples():
        if not r.calls:
            lines.append(f"- {config_label(r.config)}: no call to check at k ≥ 1.")
            continue
        recall = "recall undefined (no bad call)" if not r.bad else f"recall {ratio_text(r.recall, r.recall_low, r.recall_high, r.n_groups)}"
        precision = "no precision (no boundary block)" if not r.boundary_blocked else \
            f"precision {ratio_text(r.precision, r.precision_low, r.precision_high, r.n_groups)} (bad share {r.bad_share:.2f}; " \
            f"{r.boundary_blocked_bad} of {r.boundary_blocked} blocks on bad calls, from {groups(r.blocked_groups)} of {r.n_groups})"
        lines.append(f"- {config_label(r.config)}: blocked {r.boundary_blocked_bad} of {r.bad} bad calls ({recall}; a random "
                     f"blocker at the same rate: {r.block_share:.2f}), {precision}; {r.boundary_undecided_bad} bad calls left "
                     f"undecided ({'blocked' if summary.on_undecided == 'block' else 'they run'} under --on-undecided "
                     f"{summary.on_undecided}), {r.no_boundary_rule} of {r.calls} calls met no boundary rule.")
    rules = summary.rules[(summary.rules["mode"] == mode) & (summary.rules["kind"] == "runnable")]
    other = ", ".join(f"{rule} {int(n)}" for rule, n in rules.groupby("rule", sort=False)["blocked"].sum().items() if n)
    lines.append(f"Blocks by the catalog, completeness and schema checks (whether a runtime could run the call; not boundary "
                 f"checking, not counted above; k ≥ 1, every configuration): {other or 'none'}.")
    judged = int(quality["judged"].sum())
    lines.append(f"Judge: {summary.judge} decided {judged} boundary conditions the grammar left undecided." if summary.judge else
                 "No judge ran (none runs unless --judge names a local chat model): every condition outside the grammar stayed undecided.")
    own = summary.coverage[summary.coverage["dataset"] == summary.dataset].set_index("field")
    if len(own):
        lines.append(f"The grammar parses {own.loc['applicability', 'share_parsed']:.0%} of this dataset's applicability conditions and "
                     f"{own.loc['avoidance', 'share_parsed']:.0%} of its avoidance rules, no risk cue; unparsed conditions go to the judge "
                     f"or stay undecided (per dataset: {CHECKER_NAME}_coverage.csv).")
    return "\n".join(lines)


def checker_section(summary: "CheckerSummary") -> str:
    """The report's paragraph on G."""
    coverage = summary.coverage[["dataset", "field", "conditions", "parsed", "two_way", "share_parsed", "share_two_way"]]
    return (f"**Boundary checker G (Eq. 11).** Each greedy call is checked against the catalog, its JSON Schema and the avoidance "
            f"rules and applicability conditions of the retrieved skills that name its tool; conditions outside the stated grammar "
            f"are undecided, never passed. {summary.note.splitlines()[0]}.\n\n{markdown_table(checker_table(summary.rates))}\n\n"
            f"{checker_statement(summary)}\n\nG's boundary rules against the labels (bad = not the item's correct action; k ≥ 1; "
            f"calls of catalog tools; precision and recall pooled over records with 95% CIs over task groups; bad_share and "
            f"block_share: a random blocker's precision and recall; undecided counted apart; strict and lenient):\n\n"
            f"{markdown_table(boundary_table(summary.quality))}\n\nPrecision and recall are reported without a claim: a test "
            f"against a random blocker needs task groups that hold a boundary block and both bad and correct calls (`blocked_groups`: "
            f"the task groups the blocks come from); the tested form of boundary recall is the claim that the boundary "
            f"rules alone lower the wrong-tool execution rate (family `{CHECKER_FAMILY}`, δ = {CHECKER_SESOI:g}).\n\n"
            f"Blocks by rule (runnable: the catalog, completeness and schema checks, not boundary checking; k ≥ 1):\n\n"
            f"{markdown_table(summary.rules)}\n\nThe grammar's coverage per bundled dataset (conditions written in a form it "
            f"reads; two-way: a form that can both pass and block; the rest go to the judge or stay undecided):\n\n"
            f"{markdown_table(coverage)}")


def coverage_libraries(ctx: RunContext) -> dict[str, list[Skill]]:
    """The skill libraries whose grammar coverage a checker run reports: every bundled dataset, and the run's
    own dataset under its folder when it is not one of them."""
    own = ctx.dataset.root.resolve()
    libraries = {}
    for name in BUNDLED_DATASETS:
        dataset = ctx.dataset if bundled_dataset(name).resolve() == own else load_dataset(name)
        libraries[name] = list(dataset.skills.values())
    if own not in {bundled_dataset(name).resolve() for name in BUNDLED_DATASETS}:
        libraries[str(ctx.dataset.root)] = list(ctx.dataset.skills.values())
    return libraries


def dataset_name(ctx: RunContext) -> str:
    """The run's dataset as :func:`coverage_libraries` names it."""
    own = ctx.dataset.root.resolve()
    return next((name for name in BUNDLED_DATASETS if bundled_dataset(name).resolve() == own), str(ctx.dataset.root))


def dataset_coverage(libraries: Mapping[str, Sequence[Skill]]) -> pd.DataFrame:
    """:func:`probes.scoring.checker.grammar_coverage` per dataset (name -> its skills), one table with a
    ``dataset`` column; a form no field of a dataset uses counts 0."""
    frames = [grammar_coverage(skills).assign(dataset=name) for name, skills in libraries.items()]
    table = pd.concat(frames, ignore_index=True)
    forms = [c for c in table.columns if c.startswith("form_")]
    table[forms] = table[forms].fillna(0).astype(int)
    return table[["dataset", *[c for c in table.columns if c != "dataset"]]]


@dataclass
class CheckerSummary:
    rows: pd.DataFrame
    rates: pd.DataFrame
    quality: pd.DataFrame  # boundary-only precision and recall (checker_quality)
    rules: pd.DataFrame  # blocks by rule, boundary and runnable apart (checker_rule_counts)
    coverage: pd.DataFrame  # the grammar's coverage per dataset (dataset_coverage)
    note: str
    dataset: str  # the run's dataset, as named in coverage
    on_block: str
    on_undecided: str
    judge: str | None  # the judge model, None: no judge ran


# ------------------------------------------------------------------------------------- the analyses
NAME = "calls"
FIGURE = "fig11_call_rates"


def calls_config(ctx: RunContext, configs: Sequence[str]) -> dict[str, Any]:
    """The results-header configuration of a calls run (what the generations depend on; ``paired`` reads it too):
    the shared options, the configurations and the token budget (each analysis's other options do not
    change a generation)."""
    shared = {name: value for name, value in header_options(ctx.options, RunOptions).items() if name != "margin_variant"}  # no margin in a call
    return ctx.config(configs=list(configs), max_new_tokens=ctx.options.max_new_tokens, decoding="greedy",
                      prompt="without forced prefix", margin_variant=None, options=shared)


class _PromptMemo:
    """Reuse the generation of a byte-identical prompt (k = 0 is shared by every configuration)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.value: tuple[list[int], bool, str] | None = None

    def generate(self, session: Any, prompt: list[int], stop_ids: Sequence[int], max_new_tokens: int) -> tuple[list[int], bool, str]:
        key = (tuple(prompt), max_new_tokens)
        if key != self.key:
            new_ids, stopped = greedy_generate(session.model, prompt, stop_ids, max_new_tokens)
            self.key, self.value = key, (new_ids, stopped, session.tokenizer.decode(new_ids, skip_special_tokens=False))
        assert self.value is not None
        return self.value


def generate_rows(ctx: RunContext, store: Any, configs: Sequence[str], items: Sequence[Any] | None = None,
                  only_keys: set[str] | None = None) -> int:
    """Greedy calls of every (item, config, k) into ``store`` (resumable); returns jobs run.
    ``only_keys``: restrict to these row keys (``{record_id}|greedy``)."""
    items = ctx.items if items is None else items
    session = ctx.session
    stop_ids = stop_token_ids(session.model, session.tokenizer)
    memo = _PromptMemo()
    jobs = [Job(item, config, k, ctx.fmt, ("greedy",))
            for item in items for k in range(ctx.options.k_max + 1) for config in configs]
    if only_keys is not None:
        jobs = [job for job in jobs if set(job.keys()) <= only_keys]

    def scorer(record: PromptRecord, job: Any) -> list[dict[str, Any]]:
        new_ids, stopped, text = memo.generate(session, generation_prompt(record), stop_ids, ctx.options.max_new_tokens)
        row = call_row(record, new_ids, stopped, text)
        row["condition"] = "greedy"
        return [row]

    return run_jobs(ctx, store, jobs, scorer)


def mode_note(fmt: str) -> str:
    """What strict and lenient mean for a decision format (report, claims)."""
    return " · ".join([*(f"{mode}: {mode_description(mode, [fmt])}" for mode in MODES), "abstain (both): no call of any syntax"])


def provenance_without_margin(ctx: RunContext) -> str:
    """The shared provenance line without the margin variant (no margin is computed from calls)."""
    return provenance(ctx).replace(f" · margin: {ctx.options.margin_variant}", "")


SHOWN_RATES: tuple[str, ...] = ("wrong_call", "correct_call", "abstained", "unknown_tool", "parse_failure", "off_template_call")


def rate_table(rates: pd.DataFrame) -> pd.DataFrame:
    """The shown rates as one row per bucket × config × rate, one column per mode and k; beyond the
    wrong- and correct-call rates only the rates that are non-zero somewhere (all in the CSV)."""
    nonzero = set(rates.loc[rates["value"].fillna(0) > 0, "rate"]) | {"wrong_call", "correct_call"}
    shown = rates[rates["rate"].isin([r for r in SHOWN_RATES if r in nonzero])]
    table = shown.pivot_table(index=["bucket", "config", "rate"], columns=["mode", "k"], values="value", sort=True)
    table = table[[c for mode in MODES for c in table.columns if c[0] == mode]]
    table.columns = [f"{mode} k={k}" for mode, k in table.columns]
    return table.reset_index()


def outcome_counts(rows: pd.DataFrame) -> pd.DataFrame:
    """Replies per mode × configuration × outcome."""
    long = pd.concat([pd.DataFrame({"mode": mode, "config": rows["config"], "outcome": rows[f"{mode}_outcome"]}) for mode in MODES])
    table = pd.crosstab([long["mode"], long["config"]], long["outcome"])
    return table[[o for o in OUTCOMES if o in table.columns]].reset_index()


@dataclass
class CallsSummary:
    rows: pd.DataFrame  # one generation per record
    rates: pd.DataFrame  # rate per mode, format, config, k, bucket with CIs
    syntax: pd.DataFrame  # replies per syntax
    note: str
    seed: int = DEFAULT_SEED
    checker: CheckerSummary | None = None  # G (Eq. 11) with --checker
    no_call_syntax: int = 0  # replies without any call and without declining: prose (prose_replies)


def value_at(rates: pd.DataFrame, **where: Any) -> float:
    """The ``value`` of the first row matching ``where`` (NaN if none)."""
    sub = rates
    for column, value in where.items():
        sub = sub[sub[column] == value]
    return float(sub["value"].iloc[0]) if len(sub) else float("nan")


def deepest_k(rows: pd.DataFrame, bucket: str | None = None) -> int | None:
    """The largest k in ``rows`` (of ``bucket``), None when empty."""
    sub = rows if bucket is None else rows[rows["bucket"] == bucket]
    return int(sub["k"].max()) if len(sub) else None


@register("calls", order=70)
@dataclass(kw_only=True)
class Calls(Analysis):
    """Fig. 11: greedy next-action calls per k, read in every call syntax; strict and lenient rates."""

    k_max: int | None = k_max_option(SWEEP_K_MAX)
    configs: tuple[str, ...] = option(CALLS_CONFIGS, f"comma-separated memory configurations (default: {','.join(CALLS_CONFIGS)}; "
                                      "pad-procedure is included so that `paired` reuses these generations)", names=tuple(CONFIGS), minimum=1)
    controls: bool = option(False, f"add the equal-length controls ({', '.join(CONTROL_CONFIGS)})", type=bool)
    max_new_tokens: int = option(MAX_NEW_TOKENS, "greedy generation budget", type=int, minimum=1, group="generation")
    checker: bool = option(False, "run the boundary checker G (Eq. 11) on every greedy call (rows in calls_checker.jsonl)",
                           type=bool, group="checker")
    on_block: str = option("revise", "a call G blocks: revise (the next-best candidate, its arguments generated with its name forced, "
                           "when G passes that full call; else abstain) or report (counted as blocked)",
                           choices=ON_BLOCK, group="checker")
    on_undecided: str = option("allow", "a call with undecided conditions and no violation: allow (it runs; counted as undecided, "
                               "never as passed) or block", choices=ON_UNDECIDED, group="checker")
    judge: str | None = option(None, "a local chat model (folder or cache name) that decides G's undecided conditions "
                               "(prompt, model and verdicts recorded in each check)", group="checker")

    def configs_run(self) -> list[str]:
        return list(dict.fromkeys([*self.configs, *(CONTROL_CONFIGS if self.controls else ())]))

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        """Generate (resumably) every record's greedy call; returns the rows."""
        configs = self.configs_run()
        store = open_store(ctx.rows_path(NAME), NAME, calls_config(ctx, configs), overwrite=ctx.options.overwrite)
        generate_rows(ctx, store, configs)
        return load_results(store.path)

    def collect_checker(self, ctx: RunContext, generations: pd.DataFrame) -> pd.DataFrame:
        """G on every generation (resumable); returns the checker rows."""
        configs = self.configs_run()
        judge = load_judge(self.judge)
        store = open_store(ctx.rows_path(CHECKER_NAME), CHECKER_NAME, checker_config(ctx, configs, self.judge),
                           overwrite=ctx.options.overwrite)
        score_checker(ctx, store, generations, configs, judge)
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> CallsSummary:
        cut = int((~rows["stopped"].astype(bool)).sum())
        failures = " / ".join(f"{int((rows[f'{mode}_outcome'] == 'parse_failure').sum())} {mode}" for mode in MODES)
        used = rows["syntax"].fillna("no call").value_counts()
        syntaxes = ", ".join(f"{name} {count}" for name, count in used.items())
        note = (f"{provenance_without_margin(ctx)} · greedy, ≤ {ctx.options.max_new_tokens} new tokens, prompt without the forced prefix\n"
                f"mean ± 95% bootstrap CI over task groups · correct call = the item's correct action "
                f"(abstaining when that is correct)\nreplies by syntax: {syntaxes} · parse failures: {failures} of {len(rows)} · "
                f"{cut} hit the token budget")
        seed = ctx.options.seed
        checker = None
        if self.checker:
            checked = self.collect_checker(ctx, rows)
            judge = f"judge {self.judge}" if self.judge else "no judge"
            checker = CheckerSummary(checked, checker_rates(checked, seed=seed), checker_quality(checked, seed=seed), checker_rule_counts(checked),
                                     dataset_coverage(coverage_libraries(ctx)),
                                     f"{provenance_without_margin(ctx)} · G (Eq. 11) on the greedy call · blocked: {self.on_block} · "
                                     f"undecided: {self.on_undecided} · {judge}\nmean ± 95% bootstrap CI over task groups",
                                     dataset_name(ctx), self.on_block, self.on_undecided, self.judge)
        return CallsSummary(rows, call_rates(rows, seed=seed), syntax_counts(rows), note, seed, checker, prose_replies(rows))

    def tables(self, summary: CallsSummary) -> dict[str, pd.DataFrame]:
        tables = {f"{NAME}_summary": summary.rates, f"{NAME}_syntax": summary.syntax}
        if summary.checker is not None:
            tables.update({f"{CHECKER_NAME}_rates": summary.checker.rates, f"{CHECKER_NAME}_quality": summary.checker.quality,
                           f"{CHECKER_NAME}_rules": summary.checker.rules, f"{CHECKER_NAME}_coverage": summary.checker.coverage})
        return tables

    def figures(self, summary: CallsSummary, out_dir: Path) -> list[Path]:
        plots.style()
        paths = plots.save_figure(fig11_call_rates(summary.rates, summary.note), out_dir, FIGURE)
        if summary.checker is not None:
            paths += plots.save_figure(fig19_checker_outcomes(summary.checker.rates, summary.checker.quality, summary.checker.note),
                                       out_dir, CHECKER_FIGURE)
        return paths

    def section(self, ctx: RunContext, summary: CallsSummary, figures: list[Path]) -> ReportSection:
        rows, rates = summary.rows, summary.rates
        k_max = int(rates["k"].max())
        syntax = summary.syntax.groupby(["syntax", "shape", "template_format"], sort=True)["replies"].sum().reset_index()
        body = (f"Greedy next action generated without the forced prefix (≤ {ctx.options.max_new_tokens} new tokens) and read "
                f"by the tool-call parser in every syntax; {mode_note(ctx.fmt)}. Rates per bucket, configuration, mode and k "
                f"(rates that are zero everywhere left out; all of them, with CIs, in `calls_summary.csv`).\n\n"
                f"{markdown_table(rate_table(rates))}\n\nOutcome counts:\n\n"
                f"{markdown_table(outcome_counts(rows))}\n\nReplies by call syntax (the reply's first call; `none`: no call attempt; "
                f"per configuration and k in `calls_syntax.csv`):\n\n{markdown_table(syntax)}")
        if statement := prose_statement(rows):
            body += f"\n\n{statement}"
        comparisons = [Comparison(f"Fig. 11: T_wrong {mode} wrong-call rate, {label} (k = {k_max}; paper: qualitative)",
                                  value_at(rates, bucket="T_wrong", config=config, k=k_max, rate="wrong_call", mode=mode), None, "rate")
                       for mode in MODES for config, label in (("proc", "Proc. Skill"), ("basm", "BASM"))]
        if summary.checker is not None:
            body += "\n\n" + checker_section(summary.checker)
        return ReportSection(NAME, "Fig. 11 — recall-depth call rates (`calls`)", figures, body, comparisons, summary)

    def claims(self, summary: CallsSummary) -> list[Claim]:
        """Fig. 11's claim in each mode: on T_wrong at the deepest k, the wrong-call rate under BASM is
        below Proc. Skill, paired by item (per-item differences, task groups as units); with the checker,
        G's paired claims (:func:`checker_claims`)."""
        rows = summary.rows
        k = deepest_k(rows, "T_wrong")
        configs = set(rows["config"])
        claims: list[Claim] = []
        deepest = rows[(rows["bucket"] == "T_wrong") & (rows["k"] == k)] if k is not None and {"basm", "proc"} <= configs else rows.iloc[:0]
        for mode in MODES if len(deepest) else ():
            hits = deepest.assign(hit=rate_values(deepest, mode, "wrong_call").astype(float))
            diff = paired_differences(hits, {"basm − proc": ("basm", "proc")}, pair=["item_id", "task_group", "format"], value="hit").dropna(subset=["delta"])
            if not len(diff):
                continue
            claims.append(effect_claim(
                CLAIM_FAMILY, f"{mode}_wrong_call_basm_below_proc_k{k}",
                f"on T_wrong at k = {k}, the {mode} wrong-call rate under {config_label('basm')} is below {config_label('proc')} (paired by item)",
                diff["delta"], diff["task_group"], alternative="less", unit="rate", seed=summary.seed,
                note=f"{len(diff)} items; {mode}: {mode_description(mode, sorted(set(deepest['format'])))}"))
        if summary.checker is not None:
            checker = summary.checker
            claims += checker_claims(checker.rows, on_block=checker.on_block, on_undecided=checker.on_undecided, seed=summary.seed)
        return claims

    def print_summary(self, summary: CallsSummary) -> None:
        print(rate_table(summary.rates).round(2).to_string(index=False))
        print(outcome_counts(summary.rows).to_string(index=False))
        print(summary.syntax.groupby(["syntax", "shape", "template_format"])["replies"].sum().to_string())
        if statement := prose_statement(summary.rows):
            print(statement)
        if summary.checker is not None:
            print(checker_table(summary.checker.rates).to_string(index=False))
            print(boundary_table(summary.checker.quality).to_string(index=False))
            print(checker_statement(summary.checker))


# --- Figs. 11 and 19, drawn by Calls.figures
CALL_RATE_LABELS: dict[str, str] = {
    "wrong_call": "wrong-call rate",
    "correct_call": "correct-call rate",
    "abstained": "abstention rate",
    "unknown_tool": "unknown-tool rate",
    "parse_failure": "parse-failure rate",
    "off_template_call": "off-template call rate",
}
CALL_RATES_ALWAYS = ("wrong_call", "correct_call", "abstained")  # the rest are drawn where some cell is non-zero


def fig11_call_rates(rates: pd.DataFrame, note: str) -> plt.Figure:
    """Greedy call rates vs retrieval depth: one panel per rate (wrong call, correct call, abstention, and
    unknown tool / parse failure / off-template call where any is non-zero) and bucket (T_wrong first) that is
    non-zero somewhere, the others named in the caption; one colour per configuration, solid = lenient,
    dashed = strict, a 95% CI band for the first mode's line.

    rates: mode, format, config, k, bucket, rate, value, low, high, n, n_groups, count.
    """
    buckets = plots.ordered(rates["bucket"], ("T_wrong", "T_ok", "T_repair"))
    present = set(rates["rate"])
    nonzero = set(rates.loc[rates["value"].fillna(0) > 0, "rate"])
    kinds = [r for r in CALL_RATE_LABELS if r in present and (r in CALL_RATES_ALWAYS or r in nonzero)]
    configs = plots.ordered(rates["config"], plots.CONFIG_ORDER)
    modes = [m for m in plots.CALL_MODE_STYLE if m in set(rates["mode"])]
    plotted = rates[rates["rate"].isin(kinds)]
    # one panel per rate and bucket that is non-zero somewhere; the all-zero ones are named in the caption, not drawn
    nonzero_cells = set(map(tuple, plotted.loc[plotted["value"].fillna(0) > 0, ["rate", "bucket"]].drop_duplicates().to_numpy()))
    cells = [(kind, bucket) for kind in kinds for bucket in buckets if (kind, bucket) in nonzero_cells]
    zero = [f"{CALL_RATE_LABELS[kind]} in {bucket}" for kind in kinds for bucket in buckets if (kind, bucket) not in nonzero_cells]
    columns = min(3, max(1, len(cells)))
    n_rows = max(1, -(-len(cells) // columns))
    fig, axes = plt.subplots(n_rows, columns, figsize=(4.0 * columns + 1.6, 2.7 * n_rows + 0.6), sharex=True, sharey=True, squeeze=False)
    for ax, (kind, bucket) in zip(axes.flat, cells):
        sub = plotted[(plotted["rate"] == kind) & (plotted["bucket"] == bucket)]
        for config in configs:
            for mode in modes:
                line = sub[(sub["config"] == config) & (sub["mode"] == mode)].sort_values("k")
                if not len(line):
                    continue
                ls, marker = plots.CALL_MODE_STYLE[mode]
                ax.plot(line["k"], line["value"], marker=marker, ms=3.5, ls=ls, color=plots.color(config), lw=1.3)
                if mode == modes[0]:  # one CI band per configuration (the first mode's): ten whiskered lines do not read
                    ax.fill_between(line["k"], *plots.ci_band(line), color=plots.color(config), alpha=0.12, lw=0)
                    plots.mark_no_ci(ax, line["k"], line, plots.color(config))
        plots.note_no_ci(ax, sub)
        ax.set_ylim(-0.04, 1.04)
        ax.set_xticks(sorted(int(k) for k in rates["k"].unique()))
        ax.set_title(f"{CALL_RATE_LABELS[kind]}, {plots.bucket_label(bucket)}")
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel("retrieval depth k")
    for ax in axes.flat[len(cells):]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("rate")
    handles = [plt.Line2D([], [], color=plots.color(c), lw=2, label=plots.label(c)) for c in configs]
    handles += [plt.Line2D([], [], color="0.3", ls=plots.CALL_MODE_STYLE[m][0], marker=plots.CALL_MODE_STYLE[m][1], ms=4, label=m) for m in modes]
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5)
    fig.suptitle("Realized greedy calls against retrieval depth, strict and lenient")
    ks = sorted(int(k) for k in plotted["k"].unique())
    caption = (f"plotted: {', '.join(CALL_RATE_LABELS[k] for k in kinds)} · modes: {', '.join(modes)} · configurations: "
               f"{', '.join(plots.label(c) for c in configs)} · k = {', '.join(map(str, ks))} · n per point: {plots.n_text(plotted, 'items')}\n"
               f"bands: 95% bootstrap CI over task groups of the {modes[0] if modes else ''} rates (the other mode's line has none)"
               f"{' · zero throughout, not drawn: ' + ', '.join(zero) if zero else ''}\n"
               f"{plots.call_mode_text(sorted(set(plotted['format'])), lines=True)}")
    plots.footnote(fig, f"{note}\n{caption}")
    return fig


CHECKER_RATE_LABELS: dict[str, str] = {"wrong_call": "wrong call", "correct_call": "correct call",
                                       "correct_runnable": "correct runnable call", "abstained": "abstention",
                                       "blocked": "blocked"}


def fig19_checker_outcomes(rates: pd.DataFrame, quality: pd.DataFrame, note: str) -> plt.Figure:
    """Call outcomes without and with the boundary checker G (Eq. 11), lenient mode, at the deepest
    k: one panel per bucket, bar groups per rate, one bar pair per configuration (light: without G,
    dark: with G), 95% CI bars over task groups; and a last panel with what G's boundary rules alone
    achieve at k ≥ 1 (:func:`checker_quality`): precision and recall per configuration with their CIs,
    each beside a random blocker's (grey ticks: the bad share and the block share).

    rates: mode, checker, format, config, k, bucket, rate, value, low, high, n, n_groups, count.
    quality: checker_quality's columns.
    """
    data = rates[(rates["mode"] == "lenient") & (rates["k"] == rates["k"].max())]
    buckets = plots.ordered(data["bucket"], ("T_wrong", "T_ok", "T_repair"))
    configs = plots.ordered(data["config"], plots.CONFIG_ORDER)
    kinds = [r for r in CHECKER_RATE_LABELS if r in set(data["rate"])]
    fig, axes = plt.subplots(1, len(buckets) + 1, figsize=(4.4 * (len(buckets) + 1), 3.4), sharey=True, squeeze=False)
    width = 0.8 / (2 * len(configs))
    for col, bucket in enumerate(buckets):
        ax = axes[0][col]
        sub = data[data["bucket"] == bucket]
        for i, config in enumerate(configs):
            for j, checker in enumerate(("without", "with")):
                bars = sub[(sub["config"] == config) & (sub["checker"] == checker)].set_index("rate").reindex(kinds)
                x = np.arange(len(kinds)) - 0.4 + width * (2 * i + j + 0.5)
                rgb = plots.color(config)
                ax.bar(x, bars["value"].fillna(0), width, color=rgb, alpha=0.45 if checker == "without" else 1.0,
                       yerr=plots.ci_errors(bars.reset_index()), capsize=1.5, error_kw={"elinewidth": 0.7})
        ax.set_xticks(np.arange(len(kinds)), ["\n".join(textwrap.wrap(CHECKER_RATE_LABELS[k], 10)) for k in kinds])
        ax.set_ylim(0, 1.04)
        n_items = int(sub["n"].max()) if len(sub) else 0
        ax.set_title(f"{plots.bucket_label(bucket)}  ({n_items} items, {int(sub['n_groups'].max()) if len(sub) else 0} groups)")
    axes[0][0].set_ylabel("rate (lenient)")
    boundary_panel(axes[0][-1], quality[quality["mode"] == "lenient"], configs)
    handles = [plt.Rectangle((0, 0), 1, 1, color=plots.color(c), label=plots.label(c)) for c in configs]
    handles += [plt.Rectangle((0, 0), 1, 1, color="0.4", alpha=a, label=f"{w} G") for w, a in (("without", 0.45), ("with", 1.0))]
    axes[0][-1].add_artist(axes[0][-1].get_legend())  # the boundary panel's own legend stays; the configurations' goes beside it
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5)  # over no bar
    fig.suptitle(f"Greedy call outcomes without and with the boundary checker G (Eq. 11), k = {int(data['k'].max())}; "
                 f"its boundary rules alone at k ≥ 1")
    lenient = quality[quality["mode"] == "lenient"]
    plots.footnote(fig, f"{note}\nn per bar: {plots.n_text(data, 'items')}\nlast panel: calls of catalog tools at k ≥ 1 "
                        f"({int(lenient['calls'].sum())} calls; k = 0 shows no skill and is left out); detections = blocks by an "
                        f"avoidance or applicability rule only (the catalog, completeness and schema blocks are not)\npooled "
                        f"ratios with 95% CIs over task groups; hollow: no CI")
    return fig


def boundary_panel(ax: plt.Axes, quality: pd.DataFrame, configs: Sequence[str]) -> None:
    """Boundary-only precision (circles) and recall (squares) per configuration with CI bars, hollow without
    a CI; a grey tick at a random blocker's value (bad share, block share)."""
    for i, config in enumerate(configs):
        row = quality[quality["config"] == config]
        for offset, name, chance, marker in ((-0.15, "precision", "bad_share", "o"), (0.15, "recall", "block_share", "s")):
            if not len(row) or not np.isfinite(row[name].iloc[0]):
                continue
            point = pd.DataFrame({"value": row[name].to_numpy(), "low": row[f"{name}_low"].to_numpy(),
                                  "high": row[f"{name}_high"].to_numpy(), "n_groups": row["n_groups"].to_numpy()})
            ok = plots.has_ci(point)[0]
            ax.errorbar([i + offset], point["value"], yerr=plots.ci_errors(point), fmt=marker, ms=5, capsize=2,
                        color=plots.color(config), mfc=plots.color(config) if ok else "white")
            ax.plot([i + offset - 0.08, i + offset + 0.08], [row[chance].iloc[0]] * 2, color="0.5", lw=1.2)
    ax.set_xticks(np.arange(len(configs)), ["\n".join(textwrap.wrap(plots.label(c), 10)) for c in configs], fontsize=7)
    ax.set_xlim(-0.6, len(configs) - 0.4)
    ax.set_title("G's boundary rules, k ≥ 1 (lenient)")
    ax.legend(handles=[plt.Line2D([], [], color="0.3", marker="o", ls="", label="precision"),
                       plt.Line2D([], [], color="0.3", marker="s", ls="", label="recall"),
                       plt.Line2D([], [], color="0.5", lw=1.2, label="random blocker")], loc="best", fontsize=7)
