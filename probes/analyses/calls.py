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

import pandas as pd

from probes.analyses import register
from probes.prompts.builder import SWEEP_K_MAX
from probes.analyses.base import (Analysis, Comparison, Job, ReportSection, RunContext, RunOptions, header_options, k_max_option, option,
                                  provenance, run_jobs)
from probes.analyses.parallel import open_store
from probes.data.configs import CONFIGS, CONTROL_CONFIGS, config_label
from probes.data.dataset import ABSTAIN
from probes.engine.generate import greedy_generate, stop_token_ids
from probes.prompts.record import PromptRecord
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring.claims import Claim, effect_claim
from probes.scoring.score import row_fields
from probes.scoring.stats import DEFAULT_SEED, bootstrap_mean
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


def paired_differences(rows: pd.DataFrame, column: str, first: str, second: str) -> pd.DataFrame:
    """``column`` under ``first`` minus under ``second`` per item present under both (0/1 columns as
    numbers), with the item's task group."""
    keys = ["item_id", "task_group"]
    a = rows[rows["config"] == first].set_index(keys)[column].astype(float)
    b = rows[rows["config"] == second].set_index(keys)[column].astype(float)
    both = a.index.intersection(b.index)
    return (a.loc[both] - b.loc[both]).rename("difference").reset_index()


@register("calls", order=70)
@dataclass(kw_only=True)
class Calls(Analysis):
    """Fig. 11: greedy next-action calls per k, read in every call syntax; strict and lenient rates."""

    k_max: int | None = k_max_option(SWEEP_K_MAX)
    configs: tuple[str, ...] = option(CALLS_CONFIGS, f"comma-separated memory configurations (default: {','.join(CALLS_CONFIGS)}; "
                                      "pad-procedure is included so that `paired` reuses these generations)", names=tuple(CONFIGS), minimum=1)
    controls: bool = option(False, f"add the equal-length controls ({', '.join(CONTROL_CONFIGS)})", type=bool)
    max_new_tokens: int = option(MAX_NEW_TOKENS, "greedy generation budget", type=int, minimum=1, group="generation")

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        """Generate (resumably) every record's greedy call; returns the rows."""
        configs = list(dict.fromkeys([*self.configs, *(CONTROL_CONFIGS if self.controls else ())]))
        store = open_store(ctx.out_dir / f"{NAME}.jsonl", NAME, calls_config(ctx, configs), overwrite=ctx.options.overwrite)
        generate_rows(ctx, store, configs)
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
        return CallsSummary(rows, call_rates(rows, seed=seed), syntax_counts(rows), note, seed)

    def tables(self, summary: CallsSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.rates, f"{NAME}_syntax": summary.syntax}

    def figures(self, summary: CallsSummary, out_dir: Path) -> list[Path]:
        plots.style()
        return plots.save_figure(plots.fig11_call_rates(summary.rates, summary.note), out_dir, FIGURE)

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
            diff = paired_differences(deepest.assign(hit=rate_values(deepest, mode, "wrong_call")), "hit", "basm", "proc")
            if not len(diff):
                continue
            claims.append(effect_claim(
                CLAIM_FAMILY, f"{mode}_wrong_call_basm_below_proc_k{k}",
                f"on T_wrong at k = {k}, the {mode} wrong-call rate under {config_label('basm')} is below {config_label('proc')} (paired by item)",
                diff["difference"], diff["task_group"], alternative="less", unit="rate", seed=summary.seed,
                note=f"{len(diff)} items; {mode}: {mode_description(mode, sorted(set(deepest['format'])))}"))
        return claims

    def print_summary(self, summary: CallsSummary) -> None:
        print(rate_table(summary.rates).round(2).to_string(index=False))
        print(outcome_counts(summary.rows).to_string(index=False))
        print(summary.syntax.groupby(["syntax", "shape", "template_format"])["replies"].sum().to_string())
