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

from collections.abc import Sequence
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
from probes.data.dataset import ABSTAIN
from probes.engine.generate import greedy_generate, stop_token_ids
from probes.prompts.record import PromptRecord
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring.checker import ChatJudge, Decision, DecisionState, Judge, check_call, grammar_coverage, proposed
from probes.scoring.claims import Claim, effect_claim
from probes.scoring.margins import candidate_path_logprobs, candidates_from_record
from probes.scoring.score import row_fields
from probes.scoring.stats import DEFAULT_SEED, bootstrap_mean, paired_differences
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


RUNNABLE_RULES: tuple[str, ...] = ("known_tool", "complete", "schema")


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


def checker_rates(rows: pd.DataFrame, *, resamples: int = 2000, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Per mode × G (without / with) × format × config × k × bucket × rate: mean with a 95% bootstrap
    CI over task groups (the blocked rate only with G and ``on_block report``). ``correct_runnable``:
    solved by a call a runtime could run (G's catalog, completeness and schema checks pass; a
    correct abstention counts): the fair baseline for the correct-call rate with G, which lets no
    unrunnable call through."""
    out = []
    keys = ["format", "config", "k", "bucket"]
    for key, frame in rows.groupby(keys, sort=True):
        for mode in MODES:
            for checker, suffix in (("without", "before"), ("with", "after")):
                outcomes, solved = frame[f"{mode}_outcome_{suffix}"], frame[f"{mode}_solved_{suffix}"].astype(bool)
                for rate, (_, counted) in CHECKER_RATES.items():
                    if rate == "blocked" and checker == "without":
                        continue
                    values = (solved if counted is None else outcomes == counted)
                    if rate == "correct_runnable":  # the correct tool in a call a runtime could run (or a correct abstention)
                        values = solved & (frame[f"{mode}_runnable_{suffix}"].astype(bool) | (outcomes == "abstain"))
                    values = values.astype(float).to_numpy()
                    est = bootstrap_mean(values, frame["task_group"].tolist(), resamples=resamples, seed=seed)
                    out.append({"mode": mode, "checker": checker, **dict(zip(keys, key)), "rate": rate, "value": est.value,
                                "low": est.low, "high": est.high, "n": len(frame), "n_groups": est.n_units, "count": int(values.sum())})
    return pd.DataFrame(out, columns=["mode", "checker", *keys, "rate", "value", "low", "high", "n", "n_groups", "count"])


def checker_quality(rows: pd.DataFrame) -> pd.DataFrame:
    """G against the items' labels, per mode × config: among the calls G decided on (the reply's
    action is a tool call), a *bad* call is one that is not the item's correct action. Precision =
    bad among blocked; recall = blocked among bad (undecided calls count as not blocked under
    ``on_undecided allow``); undecided calls are counted on their own, never as passed. A blocked
    correct call is a false positive against the labels even when a runtime could not run it, so
    ``blocked_correct_unrunnable`` (catalog, completeness or schema failed) and
    ``blocked_correct_runnable`` (blocked by a boundary rule only) split those."""
    out = []
    for mode in MODES:
        called = rows[rows[f"{mode}_verdict"].notna()]
        for config, frame in called.groupby("config", sort=True):
            bad = ~frame[f"{mode}_solved_before"].astype(bool)
            blocked = frame[f"{mode}_blocked"].astype(bool)
            verdict = frame[f"{mode}_verdict"]
            tp = int((bad & blocked).sum())
            runnable_ = frame[f"{mode}_runnable_before"].astype(bool)
            out.append({"mode": mode, "config": config, "calls": len(frame), "bad": int(bad.sum()), "blocked": int(blocked.sum()),
                        "passed": int((verdict == "pass").sum()), "undecided": int((verdict == "undecided").sum()),
                        "blocked_bad": tp, "precision": tp / int(blocked.sum()) if blocked.any() else float("nan"),
                        "recall": tp / int(bad.sum()) if bad.any() else float("nan"),
                        "blocked_correct_unrunnable": int((~bad & blocked & ~runnable_).sum()),
                        "blocked_correct_runnable": int((~bad & blocked & runnable_).sum()),
                        "undecided_bad": int((bad & (verdict == "undecided")).sum()), "judged": int(frame[f"{mode}_judged"].sum())})
    return pd.DataFrame(out, columns=["mode", "config", "calls", "bad", "blocked", "passed", "undecided", "blocked_bad",
                                      "precision", "recall", "blocked_correct_unrunnable", "blocked_correct_runnable",
                                      "undecided_bad", "judged"])


def checker_rule_counts(rows: pd.DataFrame) -> pd.DataFrame:
    """Checks per mode × rule × verdict × decided_by, over every decision."""
    counts: dict[tuple[str, str, str, str], int] = {}
    for mode in MODES:
        for decision in rows[f"{mode}_decision"].dropna():
            for check in decision["checks"]:
                key = (mode, check["rule"], check["verdict"], check["decided_by"])
                counts[key] = counts.get(key, 0) + 1
    return pd.DataFrame([(*key, n) for key, n in sorted(counts.items())], columns=["mode", "rule", "verdict", "decided_by", "checks"])


def checker_table(rates: pd.DataFrame) -> pd.DataFrame:
    """The wrong-, correct-call and abstention rates without and with G, one row per bucket × config ×
    mode × rate, one column per k (value [low, high])."""
    shown = rates[rates["rate"] != "blocked"].assign(cell=lambda f: f.apply(
        lambda r: f"{r['value']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" if r["low"] == r["low"] else f"{r['value']:.2f}", axis=1))
    table = shown.pivot_table(index=["bucket", "config", "mode", "rate"], columns=["checker", "k"], values="cell", aggfunc="first", sort=True)
    table.columns = [f"{checker} G k={k}" for checker, k in table.columns]
    return table.reset_index()


def checker_section(summary: "CheckerSummary") -> str:
    """The report's paragraph on G."""
    return (f"**Boundary checker G (Eq. 11).** Each greedy call is checked against the catalog, its JSON Schema and the avoidance "
            f"rules and applicability conditions of the retrieved skills that name its tool; conditions outside the stated grammar "
            f"are undecided, never passed. {summary.note.splitlines()[0]}.\n\n{markdown_table(checker_table(summary.rates))}\n\n"
            f"G against the labels (bad = not the item's correct action; undecided counted apart):\n\n{markdown_table(summary.quality)}"
            f"\n\nChecks by rule and verdict:\n\n{markdown_table(summary.rules)}\n\nThe grammar's coverage of the dataset's skills "
            f"(conditions written in a form it reads; two-way: a form that can both pass and block):\n\n"
            f"{markdown_table(summary.coverage[['field', 'conditions', 'parsed', 'two_way', 'share_parsed', 'share_two_way']])}")


@dataclass
class CheckerSummary:
    rows: pd.DataFrame
    rates: pd.DataFrame
    quality: pd.DataFrame
    rules: pd.DataFrame
    coverage: pd.DataFrame  # the grammar's coverage of the dataset's skills (grammar_coverage)
    note: str


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
        store = open_store(ctx.out_dir / f"{NAME}.jsonl", NAME, calls_config(ctx, configs), overwrite=ctx.options.overwrite)
        generate_rows(ctx, store, configs)
        return load_results(store.path)

    def collect_checker(self, ctx: RunContext, generations: pd.DataFrame) -> pd.DataFrame:
        """G on every generation (resumable); returns the checker rows."""
        configs = self.configs_run()
        judge = load_judge(self.judge)
        store = open_store(ctx.out_dir / f"{CHECKER_NAME}.jsonl", CHECKER_NAME, checker_config(ctx, configs, self.judge),
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
            checker = CheckerSummary(checked, checker_rates(checked, seed=seed), checker_quality(checked), checker_rule_counts(checked),
                                     grammar_coverage(list(ctx.dataset.skills.values())),
                                     f"{provenance_without_margin(ctx)} · G (Eq. 11) on the greedy call · blocked: {self.on_block} · "
                                     f"undecided: {self.on_undecided} · {judge}\nmean ± 95% bootstrap CI over task groups")
        return CallsSummary(rows, call_rates(rows, seed=seed), syntax_counts(rows), note, seed, checker)

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
            paths += plots.save_figure(fig19_checker_outcomes(summary.checker.rates, summary.checker.note), out_dir, CHECKER_FIGURE)
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
        comparisons = [Comparison(f"Fig. 11: T_wrong {mode} wrong-call rate, {label} (k = {k_max}; paper: qualitative)",
                                  value_at(rates, bucket="T_wrong", config=config, k=k_max, rate="wrong_call", mode=mode), None, "rate")
                       for mode in MODES for config, label in (("proc", "Proc. Skill"), ("basm", "BASM"))]
        if summary.checker is not None:
            body += "\n\n" + checker_section(summary.checker)
        return ReportSection(NAME, "Fig. 11 — recall-depth call rates (`calls`)", figures, body, comparisons, summary)

    def claims(self, summary: CallsSummary) -> list[Claim]:
        """Fig. 11's claim in each mode: on T_wrong at the deepest k, the wrong-call rate under BASM is
        below Proc. Skill, paired by item (per-item differences, task groups as units)."""
        rows = summary.rows
        k = deepest_k(rows, "T_wrong")
        configs = set(rows["config"])
        if k is None or not {"basm", "proc"} <= configs:
            return []
        deepest = rows[(rows["bucket"] == "T_wrong") & (rows["k"] == k)]
        claims = []
        for mode in MODES:
            hits = deepest.assign(hit=rate_values(deepest, mode, "wrong_call").astype(float))
            diff = paired_differences(hits, {"basm − proc": ("basm", "proc")}, pair=["item_id", "task_group", "format"], value="hit").dropna(subset=["delta"])
            if not len(diff):
                continue
            claims.append(effect_claim(
                CLAIM_FAMILY, f"{mode}_wrong_call_basm_below_proc_k{k}",
                f"on T_wrong at k = {k}, the {mode} wrong-call rate under {config_label('basm')} is below {config_label('proc')} (paired by item)",
                diff["delta"], diff["task_group"], alternative="less", unit="rate", seed=summary.seed,
                note=f"{len(diff)} items; {mode}: {mode_description(mode, sorted(set(deepest['format'])))}"))
        return claims

    def print_summary(self, summary: CallsSummary) -> None:
        print(rate_table(summary.rates).round(2).to_string(index=False))
        print(outcome_counts(summary.rows).to_string(index=False))
        print(summary.syntax.groupby(["syntax", "shape", "template_format"])["replies"].sum().to_string())
        if summary.checker is not None:
            print(checker_table(summary.checker.rates).to_string(index=False))
            print(summary.checker.quality.round(3).to_string(index=False))


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
    """Greedy call rates vs retrieval depth: rows = rates (wrong call, correct call, abstention, and
    unknown tool / parse failure / off-template call where any is non-zero), columns = buckets
    (T_wrong first); one colour per configuration, solid = lenient, dashed = strict, 95% CI bars.

    rates: mode, format, config, k, bucket, rate, value, low, high, n, n_groups, count.
    """
    buckets = plots.ordered(rates["bucket"], ("T_wrong", "T_ok", "T_repair"))
    present = set(rates["rate"])
    nonzero = set(rates.loc[rates["value"].fillna(0) > 0, "rate"])
    kinds = [r for r in CALL_RATE_LABELS if r in present and (r in CALL_RATES_ALWAYS or r in nonzero)]
    configs = plots.ordered(rates["config"], plots.CONFIG_ORDER)
    modes = [m for m in plots.CALL_MODE_STYLE if m in set(rates["mode"])]
    plotted = rates[rates["rate"].isin(kinds)]
    fig, axes = plt.subplots(len(kinds), len(buckets), figsize=(4.0 * len(buckets), 2.6 * len(kinds) + 0.6),
                             sharex=True, sharey="row", squeeze=False)
    series = [(c, m) for c in configs for m in modes]
    offsets = {s: (i - (len(series) - 1) / 2) * 0.035 for i, s in enumerate(series)}  # dodge overlapping bars
    for row, kind in enumerate(kinds):
        for col, bucket in enumerate(buckets):
            ax = axes[row][col]
            sub = plotted[(plotted["rate"] == kind) & (plotted["bucket"] == bucket)]
            for config, mode in series:
                line = sub[(sub["config"] == config) & (sub["mode"] == mode)].sort_values("k")
                if not len(line):
                    continue
                ls, marker = plots.CALL_MODE_STYLE[mode]
                x = line["k"] + offsets[(config, mode)]
                ax.errorbar(x, line["value"], yerr=plots.ci_errors(line), marker=marker, ms=3.5, capsize=2.0, ls=ls,
                            color=plots.color(config), lw=1.3, elinewidth=0.8)
                plots.mark_no_ci(ax, x, line, plots.color(config))
            plots.note_no_ci(ax, sub)
            ax.set_ylim(-0.04, 1.04)
            ax.set_xticks(sorted(int(k) for k in rates["k"].unique()))
            if row == 0:
                n_items = int(sub["n"].max()) if len(sub) else 0
                n_groups = int(sub["n_groups"].max()) if len(sub) else 0
                ax.set_title(f"{plots.bucket_label(bucket)}  ({n_items} items, {n_groups} task group{'s' if n_groups != 1 else ''})")
            if row == len(kinds) - 1:
                ax.set_xlabel("retrieval depth k")
            if col == 0:
                ax.set_ylabel(CALL_RATE_LABELS[kind])
    handles = [plt.Line2D([], [], color=plots.color(c), lw=2, label=plots.label(c)) for c in configs]
    handles += [plt.Line2D([], [], color="0.3", ls=plots.CALL_MODE_STYLE[m][0], marker=plots.CALL_MODE_STYLE[m][1], ms=4, label=m) for m in modes]
    axes[0][-1].legend(handles=handles, loc="best", fontsize=7.5)
    fig.suptitle("Realized greedy calls against retrieval depth, strict and lenient", y=1.01)
    ks = sorted(int(k) for k in plotted["k"].unique())
    caption = (f"plotted: {', '.join(CALL_RATE_LABELS[k] for k in kinds)} · modes: {', '.join(modes)} · configurations: "
               f"{', '.join(plots.label(c) for c in configs)} · k = {', '.join(map(str, ks))} · n per point: {plots.n_text(plotted, 'items')}\n"
               f"{plots.call_mode_text(sorted(set(plotted['format'])), lines=True)}")
    plots.footnote(fig, f"{note}\n{caption}")
    return fig


CHECKER_RATE_LABELS: dict[str, str] = {"wrong_call": "wrong call", "correct_call": "correct call",
                                       "correct_runnable": "correct runnable call", "abstained": "abstention",
                                       "blocked": "blocked"}


def fig19_checker_outcomes(rates: pd.DataFrame, note: str) -> plt.Figure:
    """Call outcomes without and with the boundary checker G (Eq. 11), lenient mode, at the deepest
    k: one panel per bucket, bar groups per rate, one bar pair per configuration (light: without G,
    dark: with G), 95% CI bars over task groups.

    rates: mode, checker, format, config, k, bucket, rate, value, low, high, n, n_groups, count.
    """
    data = rates[(rates["mode"] == "lenient") & (rates["k"] == rates["k"].max())]
    buckets = plots.ordered(data["bucket"], ("T_wrong", "T_ok", "T_repair"))
    configs = plots.ordered(data["config"], plots.CONFIG_ORDER)
    kinds = [r for r in CHECKER_RATE_LABELS if r in set(data["rate"])]
    fig, axes = plt.subplots(1, len(buckets), figsize=(4.4 * len(buckets), 3.4), sharey=True, squeeze=False)
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
        ax.set_xticks(np.arange(len(kinds)), [CHECKER_RATE_LABELS[k] for k in kinds])
        ax.set_ylim(0, 1.04)
        n_items = int(sub["n"].max()) if len(sub) else 0
        ax.set_title(f"{plots.bucket_label(bucket)}  ({n_items} items, {int(sub['n_groups'].max()) if len(sub) else 0} groups)")
    axes[0][0].set_ylabel("rate (lenient)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=plots.color(c), label=plots.label(c)) for c in configs]
    handles += [plt.Rectangle((0, 0), 1, 1, color="0.4", alpha=a, label=f"{w} G") for w, a in (("without", 0.45), ("with", 1.0))]
    axes[0][-1].legend(handles=handles, loc="best", fontsize=7.5)
    fig.suptitle(f"Greedy call outcomes without and with the boundary checker G (Eq. 11), k = {int(data['k'].max())}", y=1.02)
    plots.footnote(fig, f"{note}\nn per bar: {plots.n_text(data, 'items')}")
    return fig
