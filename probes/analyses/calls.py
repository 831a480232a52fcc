"""Realized calls (Fig. 11) and the equal-token paired status (Fig. 12).

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

``paired``: BASM against procedure padding (``pad-procedure``, the equal-token control) on the
same items and depths, in both modes: both solved / only BASM / only padding / both failed. It
reuses a calls results file holding both configurations when one exists and generates only what
is missing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probes.analyses import register
from probes.analyses.base import Analysis, RunContext, option
from probes.data.configs import CONFIGS, CONTROL_CONFIGS, config_label
from probes.data.dataset import ABSTAIN
from probes.engine.generate import greedy_generate, stop_token_ids
from probes.prompts.record import record_id
from probes.scoring.claims import Claim, effect_claim
from probes.scoring.stats import DEFAULT_SEED, bootstrap_mean, paired_permutation_test
from probes.scoring.toolcalls import MODES, OUTCOMES, is_solved, mode_description, outcome, parse_reply

MAX_NEW_TOKENS = 48
PAIRED_STATUSES: tuple[str, ...] = ("both_solved", "only_basm", "only_padding", "both_failed")
PAIRED_CONFIGS: tuple[str, str] = ("basm", "pad-procedure")
CALLS_CONFIGS: tuple[str, ...] = ("base", "proc", "app", "basm", "pad-procedure")
CLAIM_FAMILY = "calls"


# ------------------------------------------------------------------------------------- generation
def generation_prompt(record: Mapping[str, Any]) -> list[int]:
    """The prompt the model continues freely: without the native forced ``<tool_call>`` prefix."""
    ids = list(record["input_ids"])
    if record["format"] == "native":
        if record.get("open_index") is None:
            raise ValueError(f"{record.get('record_id')}: native record without open_index")
        return ids[: int(record["open_index"]) + 1]
    return ids


def shown_tools(record: Mapping[str, Any]) -> list[str]:
    """The tool names the prompt's catalog showed (every candidate action but abstention)."""
    return [c["action"] for c in record["candidates"] if c["action"] != ABSTAIN]


def call_row(record: Mapping[str, Any], new_ids: Sequence[int], stopped: bool, text: str) -> dict[str, Any]:
    """The tidy row of one generation (without ``key``): the raw reply, every call attempt found in
    it, the reply's call (the lenient action, else the first attempt: its ``syntax``, ``shape``,
    ``template_format``, ``known_tool``) and, per mode, the action, outcome and whether it solves
    the item."""
    reply = parse_reply(text, template=record["format"], catalog=shown_tools(record))
    first = reply.action("lenient") or (reply.calls[0] if reply.calls else None)
    row = {k: record.get(k) for k in ("record_id", "item_id", "bucket", "domain", "task_group", "config", "k", "format")}
    row.update(
        correct_action=record["correct_action"], wrong_tools=list(record.get("wrong_tools", ())),
        n_prompt_tokens=len(generation_prompt(record)), n_new_tokens=len(new_ids), stopped=stopped,
        generation=text, parsed=reply.as_dict(), n_calls=len(reply.calls),
        syntax=first.syntax if first else None, shape=first.shape if first else None,
        template_format=first.template_format if first else None, known_tool=first.known_tool if first else None,
        refusal=reply.refusal, empty=reply.empty,
    )
    for mode in MODES:
        action = reply.action(mode)
        result = outcome(reply, mode, record["correct_action"], row["wrong_tools"])
        row.update({f"{mode}_action": action.name if action else result, f"{mode}_outcome": result,
                    f"{mode}_solved": is_solved(result, record["correct_action"])})
    return row


def generate_call(session: Any, record: Mapping[str, Any], *, max_new_tokens: int = MAX_NEW_TOKENS, stop_ids: Sequence[int] | None = None) -> dict[str, Any]:
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


def paired_status(basm_solved: bool, padding_solved: bool) -> str:
    if basm_solved and padding_solved:
        return "both_solved"
    if basm_solved:
        return "only_basm"
    if padding_solved:
        return "only_padding"
    return "both_failed"


def pair_rows(rows: pd.DataFrame, configs: tuple[str, str] = PAIRED_CONFIGS) -> list[dict[str, Any]]:
    """One paired row per (item, k, format) present under both configurations: per configuration its
    reply's call (``syntax``, ``template_format``, ``known_tool``) and per mode its outcome and
    whether it solved the item; per mode the paired status."""
    keys = ["item_id", "k", "format"]
    sides = {_short(config): rows[rows["config"] == config].set_index(keys) for config in configs}
    (first, a), (second, b) = sides.items()
    out = []
    for key in sorted(set(a.index) & set(b.index)):
        ra, rb = a.loc[key], b.loc[key]
        item_id, k, fmt = key
        row = {"key": f"{item_id}|k{k}|{fmt}", "item_id": item_id, "k": int(k), "format": fmt,
               "bucket": ra["bucket"], "domain": ra["domain"], "task_group": ra["task_group"],
               "correct_action": ra["correct_action"], "identical_prompt": int(k) == 0}
        for short, r in ((first, ra), (second, rb)):
            row.update({f"{short}_{field}": r[field] for field in ("syntax", "template_format", "known_tool")})
            for mode in MODES:
                row[f"{short}_{mode}_outcome"] = r[f"{mode}_outcome"]
                row[f"{short}_{mode}_solved"] = bool(r[f"{mode}_solved"])
        for mode in MODES:
            row[f"{mode}_status"] = paired_status(row[f"{first}_{mode}_solved"], row[f"{second}_{mode}_solved"])
        out.append(row)
    return out


def _short(config: str) -> str:
    return {"basm": "basm", "pad-procedure": "padding"}.get(config, config.replace("-", "_"))


def paired_summary(paired: pd.DataFrame, *, resamples: int = 10000, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Per mode × format × k × bucket (and bucket "all"): status counts and shares, plus the paired
    difference in solve rate (BASM − padding, mean of task-group means) with a two-sided sign-flip
    permutation p over task groups."""
    out = []
    frames = pd.concat([paired, paired.assign(bucket="all")])
    for (fmt, k, bucket), frame in frames.groupby(["format", "k", "bucket"], sort=True):
        for mode in MODES:
            counts = frame[f"{mode}_status"].value_counts()
            row = {"mode": mode, "format": fmt, "k": int(k), "bucket": bucket, "n": len(frame),
                   "n_groups": frame["task_group"].nunique()}
            for status in PAIRED_STATUSES:
                row[status] = int(counts.get(status, 0))
                row[f"{status}_share"] = row[status] / len(frame)
            a = frame[f"basm_{mode}_solved"].astype(float).to_numpy()
            b = frame[f"padding_{mode}_solved"].astype(float).to_numpy()
            if row["only_basm"] + row["only_padding"] and row["n_groups"] > 1:
                diff, p = paired_permutation_test(a, b, frame["task_group"].tolist(), alternative="two-sided", resamples=resamples, seed=seed)
            else:  # no discordant pair (the difference is 0) or one task group: nothing to test
                diff, p = float(np.mean(a - b)), float("nan")
            row.update(solve_difference=diff, p_value=p)
            out.append(row)
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------- the analyses
NAME = "calls"
FIGURE = "fig11_call_rates"
PAIRED_NAME = "paired"
PAIRED_FIGURE = "fig12_paired_status"


def calls_config(analysis: Any, configs: Sequence[str]) -> dict[str, Any]:
    """The results-header configuration of a calls run (what the generations depend on)."""
    return analysis.config(configs=list(configs), max_new_tokens=analysis.options.max_new_tokens, decoding="greedy",
                           prompt="without forced prefix", margin_variant=None)


def _canonical(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


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


def generate_rows(analysis: Any, store: Any, configs: Sequence[str], items: Sequence[Any] | None = None,
                  only_keys: set[str] | None = None) -> int:
    """Greedy calls of every (item, config, k) into ``store`` (resumable); returns jobs run.
    ``only_keys``: restrict to these row keys (``{record_id}|greedy``)."""
    from probes.analyses.base import Job, run_jobs

    items = analysis.items if items is None else items
    session = analysis.session
    stop_ids = stop_token_ids(session.model, session.tokenizer)
    memo = _PromptMemo()
    jobs = [Job(item, config, k, analysis.fmt, ("greedy",))
            for item in items for k in range(analysis.options.k_max + 1) for config in configs]
    if only_keys is not None:
        jobs = [job for job in jobs if set(job.keys()) <= only_keys]

    def scorer(record: dict[str, Any], job: Any) -> list[dict[str, Any]]:
        new_ids, stopped, text = memo.generate(session, generation_prompt(record), stop_ids, analysis.options.max_new_tokens)
        row = call_row(record, new_ids, stopped, text)
        row["condition"] = "greedy"
        return [row]

    return run_jobs(analysis, store, jobs, scorer)


def _configs_of(options: Any) -> list[str]:
    return list(dict.fromkeys([*options.configs, *(CONTROL_CONFIGS if options.controls else ())]))


def mode_note(fmt: str) -> str:
    """What strict and lenient mean for a decision format (report, claims)."""
    return " · ".join([*(f"{mode}: {mode_description(mode, [fmt])}" for mode in MODES), "abstain (both): no call of any syntax"])


def _calls_note(analysis: Any, rows: pd.DataFrame) -> str:
    cut = int((~rows["stopped"].astype(bool)).sum())
    failures = " / ".join(f"{int((rows[f'{mode}_outcome'] == 'parse_failure').sum())} {mode}" for mode in MODES)
    used = rows["syntax"].fillna("no call").value_counts()
    syntaxes = ", ".join(f"{name} {count}" for name, count in used.items())
    return (f"{_provenance(analysis)} · greedy, ≤ {analysis.options.max_new_tokens} new tokens, prompt without the forced prefix\n"
            f"mean ± 95% bootstrap CI over task groups · correct call = the item's correct action "
            f"(abstaining when that is correct)\nreplies by syntax: {syntaxes} · parse failures: {failures} of {len(rows)} · "
            f"{cut} hit the token budget")


def _provenance(analysis: Any) -> str:
    """The shared provenance line without the margin variant (no margin is computed here)."""
    from probes.analyses.base import provenance

    return provenance(analysis).replace(f" · margin: {analysis.options.margin_variant}", "")


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


def print_rates(rates: pd.DataFrame) -> None:
    print(rate_table(rates).round(2).to_string(index=False))


@dataclass
class CallsSummary:
    rows: pd.DataFrame  # one generation per record
    rates: pd.DataFrame  # rate per mode, format, config, k, bucket with CIs
    syntax: pd.DataFrame  # replies per syntax
    note: str
    seed: int = DEFAULT_SEED


def collect(analysis: Any) -> pd.DataFrame:
    """Generate (resumably) every record's greedy call; returns the rows."""
    from probes.analyses.parallel import open_store
    from probes.reporting.results import load_results

    configs = _configs_of(analysis.options)
    store = open_store(analysis.out_dir / f"{NAME}.jsonl", NAME, calls_config(analysis, configs), overwrite=analysis.options.overwrite)
    generate_rows(analysis, store, configs)
    return load_results(store.path)


def summarise(analysis: Any, rows: pd.DataFrame) -> CallsSummary:
    seed = analysis.options.seed
    return CallsSummary(rows, call_rates(rows, seed=seed), syntax_counts(rows), _calls_note(analysis, rows), seed)


def figure(summary: CallsSummary, figures_dir: Path) -> list[Path]:
    from probes.reporting import plots

    plots.style()
    return plots.save_figure(plots.fig11_call_rates(summary.rates, summary.note), figures_dir, FIGURE)


def _cell(rates: pd.DataFrame, **where: Any) -> float:
    sub = rates
    for column, value in where.items():
        sub = sub[sub[column] == value]
    return float(sub["value"].iloc[0]) if len(sub) else float("nan")


def _deepest(rows: pd.DataFrame, bucket: str | None = None) -> int | None:
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


def calls_claims(summary: CallsSummary) -> list[Claim]:
    """Fig. 11's claim in each mode: on T_wrong at the deepest k, the wrong-call rate under BASM is
    below Proc. Skill, paired by item (per-item differences, task groups as units)."""
    rows = summary.rows
    k = _deepest(rows, "T_wrong")
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


def section(analysis: Any, summary: CallsSummary, paths: list[Path]) -> Any:
    from probes.analyses.base import Comparison, ReportSection
    from probes.reporting.markdown import markdown_table

    rows, rates = summary.rows, summary.rates
    k_max = int(rates["k"].max())
    syntax = summary.syntax.groupby(["syntax", "shape", "template_format"], sort=True)["replies"].sum().reset_index()
    body = (f"Greedy next action generated without the forced prefix (≤ {analysis.options.max_new_tokens} new tokens) and read "
            f"by the tool-call parser in every syntax; {mode_note(analysis.fmt)}. Rates per bucket, configuration, mode and k "
            f"(rates that are zero everywhere left out; all of them, with CIs, in `calls_summary.csv`).\n\n"
            f"{markdown_table(rate_table(rates))}\n\nOutcome counts:\n\n"
            f"{markdown_table(outcome_counts(rows))}\n\nReplies by call syntax (the reply's first call; `none`: no call attempt; "
            f"per configuration and k in `calls_syntax.csv`):\n\n{markdown_table(syntax)}")
    comparisons = [Comparison(f"Fig. 11: T_wrong {mode} wrong-call rate, {label} (k = {k_max}; paper: qualitative)",
                              _cell(rates, bucket="T_wrong", config=config, k=k_max, rate="wrong_call", mode=mode), None, "rate")
                   for mode in MODES for config, label in (("proc", "Proc. Skill"), ("basm", "BASM"))]
    return ReportSection(NAME, "Fig. 11 — recall-depth call rates (`calls`)", paths, body, comparisons, summary)


# ------------------------------------------------------------------------------------- paired
def _reusable_calls(path: Path, expected: Mapping[str, Any]) -> pd.DataFrame | None:
    """Rows (of the wanted configs) of an existing calls file written with the same settings."""
    from probes.reporting.results import load_results, read_meta

    if not path.is_file() or path.stat().st_size == 0:
        return None
    meta = read_meta(path)
    theirs = dict(meta.get("config", {}))
    mine = _canonical(dict(expected))
    if meta.get("analysis") != NAME or not set(mine["configs"]) & set(theirs.get("configs", [])):
        return None
    theirs.pop("configs", None)
    mine.pop("configs", None)
    if theirs != mine:
        return None
    rows = load_results(path)
    return rows[rows["config"].isin(expected["configs"])] if len(rows) else None


def collect_paired_calls(analysis: Any) -> tuple[pd.DataFrame, str]:
    """Calls of BASM and procedure padding on the run's items and k: reused from a matching calls
    file where present, generated (resumably, into OUT/paired_calls.jsonl) only where missing."""
    from probes.analyses.parallel import open_store
    from probes.reporting.results import load_results

    configs = list(PAIRED_CONFIGS)
    expected = calls_config(analysis, configs)
    source = analysis.options.calls or analysis.out_dir / f"{NAME}.jsonl"
    reused = _reusable_calls(Path(source), expected)
    wanted = {f"{record_id(item.id, config, k, analysis.fmt)}|greedy" for item in analysis.items
              for k in range(analysis.options.k_max + 1) for config in configs}
    have = set(reused["key"]) & wanted if reused is not None else set()
    frames = [reused[reused["key"].isin(wanted)]] if have else []
    missing = wanted - have
    if missing:
        store = open_store(analysis.out_dir / "paired_calls.jsonl", NAME, expected, overwrite=analysis.options.overwrite)
        ran = generate_rows(analysis, store, configs, only_keys=missing)
        generated = load_results(store.path)
        if len(generated):
            frames.append(generated[generated["key"].isin(missing)])
    how = (f"reused {len(have)} generations from {Path(source).name}" if have else "no reusable calls file") + (
        f"; {len(missing)} from paired_calls.jsonl ({ran} generated in this run)" if missing else "")
    return pd.concat(frames, ignore_index=True), how


@dataclass
class PairedSummary:
    paired: pd.DataFrame  # one row per (item, k): the status of BASM vs procedure padding in each mode
    table: pd.DataFrame  # counts, solve difference and p per mode, format, k and bucket
    how: str  # where the generations came from
    note: str
    seed: int = DEFAULT_SEED


def collect_paired(analysis: Any) -> pd.DataFrame:
    """Paired rows (``paired.jsonl``) from the calls of BASM and procedure padding, and where they came from."""
    from probes.analyses.parallel import on_rank_zero
    from probes.reporting.results import ResultsStore, load_results

    calls, how = collect_paired_calls(analysis)
    path = analysis.out_dir / f"{PAIRED_NAME}.jsonl"

    def write() -> None:  # derived from the calls every rank holds: rank 0 alone writes it
        store = ResultsStore(path, PAIRED_NAME, calls_config(analysis, PAIRED_CONFIGS), overwrite=analysis.options.overwrite)
        store.append([row for row in pair_rows(calls) if row["key"] not in store])

    on_rank_zero(write)
    paired = load_results(path)
    paired.attrs["how"] = how
    return paired


def summarise_paired(analysis: Any, paired: pd.DataFrame) -> PairedSummary:
    how = paired.attrs.get("how", "")
    note = (f"{_provenance(analysis)} · greedy calls ({how})\nsolved = the action is the item's "
            f"correct action · Δ = solve rate BASM − procedure padding (mean of task-group means), p: two-sided sign-flip "
            f"permutation test over task groups · k = 0 omitted (both configurations render the identical memory-free prompt)")
    seed = analysis.options.seed
    return PairedSummary(paired, paired_summary(paired, seed=seed), how, note, seed)


def paired_claims(summary: PairedSummary) -> list[Claim]:
    """Fig. 12's claim in each mode: at the deepest k, over all buckets, BASM solves more items than
    procedure padding (per-item differences of solved, task groups as units)."""
    paired = summary.paired
    k = _deepest(paired)
    if not k:  # k = 0 renders identical prompts: nothing to compare
        return []
    deepest = paired[paired["k"] == k]
    return [effect_claim(
        CLAIM_FAMILY, f"{mode}_paired_basm_above_padding_k{k}",
        f"at k = {k}, over all buckets, BASM solves more items than procedure padding ({mode}; paired by item)",
        deepest[f"basm_{mode}_solved"].astype(float) - deepest[f"padding_{mode}_solved"].astype(float), deepest["task_group"],
        alternative="greater", unit="rate", seed=summary.seed,
        note=f"{len(deepest)} items; {mode}: {mode_description(mode, sorted(set(deepest['format'])))}") for mode in MODES]


def paired_figure(summary: PairedSummary, figures_dir: Path) -> list[Path]:
    from probes.reporting import plots

    plots.style()
    return plots.save_figure(plots.fig12_paired_status(summary.table, summary.note), figures_dir, PAIRED_FIGURE)


def paired_section(analysis: Any, paired_summary_: PairedSummary, paths: list[Path]) -> Any:
    from probes.analyses.base import Comparison, ReportSection
    from probes.reporting.markdown import markdown_table

    summary, how = paired_summary_.table, paired_summary_.how
    shown = summary[summary["k"] > 0][["mode", "k", "bucket", "n", *PAIRED_STATUSES, "solve_difference", "p_value"]]
    body = (f"BASM vs procedure padding (equal token count) on the same items and k; solved = the action is the item's correct "
            f"action; {mode_note(analysis.fmt)} ({how}).\n\n{markdown_table(shown)}")
    k_max = int(summary["k"].max())
    comparisons = [Comparison(f"Fig. 12: {mode} solve rate BASM − padding, all buckets (k = {k_max}; paper: BASM ≈ padding on BFCL, "
                              f"slightly ahead on AppWorld)",
                              _cell(summary.rename(columns={"solve_difference": "value"}), bucket="all", k=k_max, mode=mode), None, "rate")
                   for mode in MODES]
    return ReportSection(PAIRED_NAME, "Fig. 12 — equal-token paired status (`paired`)", paths, body, comparisons, paired_summary_)


@register("calls", order=70)
@dataclass(kw_only=True)
class Calls(Analysis):
    """Fig. 11: greedy next-action calls per k, read in every call syntax; strict and lenient rates."""

    k_max: int | None = option(4, "largest retrieval depth K", type=int, minimum=0, group="probe")
    configs: tuple[str, ...] = option(CALLS_CONFIGS, f"comma-separated memory configurations (default: {','.join(CALLS_CONFIGS)}; "
                                      "pad-procedure is included so that `paired` reuses these generations)", names=tuple(CONFIGS))
    controls: bool = option(False, f"add the equal-length controls ({', '.join(CONTROL_CONFIGS)})", type=bool)
    max_new_tokens: int = option(MAX_NEW_TOKENS, "greedy generation budget", type=int, minimum=1, group="generation")

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        return collect(ctx)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> CallsSummary:
        return summarise(ctx, rows)

    def tables(self, summary: CallsSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.rates, f"{NAME}_syntax": summary.syntax}

    def figures(self, summary: CallsSummary, out_dir: Path) -> list[Path]:
        return figure(summary, out_dir)

    def section(self, ctx: RunContext, summary: CallsSummary, figures: list[Path]) -> Any:
        return section(ctx, summary, figures)

    def claims(self, summary: CallsSummary) -> list[Claim]:
        return calls_claims(summary)

    def print_summary(self, summary: CallsSummary) -> None:
        print_rates(summary.rates)
        print(outcome_counts(summary.rows).to_string(index=False))
        print(summary.syntax.groupby(["syntax", "shape", "template_format"])["replies"].sum().to_string())
