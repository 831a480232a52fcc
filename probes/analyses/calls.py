"""Realized calls (Fig. 11) and the equal-token paired status (Fig. 12).

``calls``: at every retrieval depth k the model greedily generates its next action from the
prompt *without* the forced tool-call prefix (native: the text up to the generation prompt,
``input_ids[:open_index + 1]``; prompted: the whole prompt). The generation is parsed with the
model's real call syntax:

``native``   Qwen3 ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` JSON;
``prompted`` BFCL prompting style ``func_name(param=value, ...)`` (optionally in ``[...]``);

a plain-text answer (a refusal, a question) is an abstention. Output that *tries* to call but
cannot be read (a ``<tool_call>`` without a name, tag-less JSON in native, an empty generation)
is a parse failure and is reported as such, never silently folded into another outcome.

Each parsed action is classified against the item: ``correct_tool`` (the item's correct tool),
``wrong_tool`` (one of its semantically similar but inapplicable tools), ``other_tool`` (any other
name, including hallucinated ones), ``abstain`` or ``parse_failure``. ``solved`` means the greedy
action is the item's correct action (the correct tool, or abstention when abstaining is correct):
the correct-call rate of Fig. 11 and the "solved" of Fig. 12.

``paired``: BASM against procedure padding (``pad-procedure``, the equal-token control) on the
same items and depths: both solved / only BASM / only padding / both failed. It reuses a calls
results file holding both configurations when one exists and generates only what is missing.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from probes.analyses.base import Analysis, RunContext, option
from probes.data.configs import CONFIGS, CONTROL_CONFIGS
from probes.data.dataset import ABSTAIN
from probes.engine.generate import greedy_generate, stop_token_ids
from probes.prompts.record import record_id
from probes.prompts.builder import ABSTAIN_TEXT
from probes.scoring.stats import bootstrap_mean, paired_permutation_test

MAX_NEW_TOKENS = 48
OUTCOMES: tuple[str, ...] = ("correct_tool", "wrong_tool", "other_tool", "abstain", "parse_failure")
PAIRED_STATUSES: tuple[str, ...] = ("both_solved", "only_basm", "only_padding", "both_failed")
PAIRED_CONFIGS: tuple[str, str] = ("basm", "pad-procedure")
CALLS_CONFIGS: tuple[str, ...] = ("base", "proc", "app", "basm", "pad-procedure")

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "<|eot_id|>", "</s>")
_NAME_FIELD = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_PROMPTED_CALL = re.compile(r"^\[?\s*([A-Za-z_][\w.]*)\(")


# ------------------------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class ParsedCall:
    """What a generation says the next action is.

    ``kind``: ``call`` | ``abstain`` | ``parse_failure``. ``name``: the called function (for a
    parse failure, a name that could still be read, else None). ``arguments``: the parsed
    arguments, None when they could not be read (``complete`` is then False). ``syntax``: the
    call syntax actually used (``native`` / ``prompted``). ``n_calls``: calls in the output
    (only the first one is the action).
    """

    kind: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    complete: bool = True
    syntax: str | None = None
    n_calls: int = 0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def clean_generation(text: str) -> str:
    """Cut at the first end-of-turn marker and drop (possibly unterminated) think blocks."""
    cut = min((i for i in (text.find(m) for m in _END_MARKERS) if i >= 0), default=len(text))
    return _THINK.sub("", text[:cut]).strip()


def _json_object(body: str) -> dict[str, Any] | None:
    """The first JSON object in ``body`` (trailing text ignored), or None."""
    start = body.find("{")
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(body[start:])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _native_call(body: str, closed: bool) -> ParsedCall:
    value = _json_object(body)
    if value is not None and isinstance(value.get("name"), str) and value["name"]:
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):  # some models emit the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        ok = isinstance(arguments, dict)
        return ParsedCall(
            "call", value["name"], arguments if ok else None, complete=closed and ok, syntax="native",
            error=None if ok else "arguments are not a JSON object",
        )
    named = _NAME_FIELD.search(body)
    if named:  # cut off by max_new_tokens, or invalid JSON after a readable name
        return ParsedCall("call", json.loads(f'"{named.group(1)}"'), None, complete=False, syntax="native",
                          error="arguments truncated or not valid JSON")
    return ParsedCall("parse_failure", syntax="native", error="<tool_call> without a readable function name")


def parse_native(text: str) -> ParsedCall:
    """Parse a Qwen3-style generation: ``<tool_call>`` JSON, or plain text (abstain)."""
    s = clean_generation(text)
    if not s:
        return ParsedCall("parse_failure", error="empty generation")
    n_calls = s.count("<tool_call>")
    if n_calls:
        body = s[s.find("<tool_call>") + len("<tool_call>"):]
        end = body.find("</tool_call>")
        parsed = _native_call(body[:end] if end >= 0 else body, closed=end >= 0)
        return ParsedCall(**{**parsed.as_dict(), "n_calls": n_calls})
    if s.startswith("{") and _NAME_FIELD.search(s):
        named = _NAME_FIELD.search(s)
        return ParsedCall("parse_failure", json.loads(f'"{named.group(1)}"'), syntax="native",
                          error="JSON call without <tool_call> tags")
    return ParsedCall("abstain", syntax="native")


def _balanced_call(s: str, open_paren: int) -> str | None:
    """``s[:end]`` up to the parenthesis closing the one at ``open_paren`` (quotes respected)."""
    depth, quote, escape = 0, None, False
    for i in range(open_paren, len(s)):
        ch = s[i]
        if quote:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return s[: i + 1]
    return None


def _call_arguments(call_text: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        node = ast.parse(call_text, mode="eval").body
    except SyntaxError as error:
        return None, f"unparsable call: {error.msg}"
    if not isinstance(node, ast.Call):
        return None, "not a call expression"
    try:
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
        positional = [ast.literal_eval(arg) for arg in node.args]
    except (ValueError, SyntaxError, TypeError):
        return None, "argument values are not literals"
    if positional:
        arguments["_positional"] = positional
        return arguments, "positional arguments"
    return arguments, None


def parse_prompted(text: str) -> ParsedCall:
    """Parse a BFCL prompting-style generation: ``func(a=1)`` / ``[func(a=1), ...]`` or plain text."""
    s = clean_generation(text)
    s = re.sub(r"^```\w*\s*|\s*```$", "", s).strip()
    if not s:
        return ParsedCall("parse_failure", error="empty generation")
    if "<tool_call>" in s:  # the model answered in its native syntax instead
        return parse_native(s)
    match = _PROMPTED_CALL.match(s)
    if not match:
        return ParsedCall("abstain", syntax="prompted")
    name = match.group(1)
    body = s[1:].lstrip() if s.startswith("[") else s
    call_text = _balanced_call(body, body.find("("))
    n_calls = 1 + len(re.findall(r"\)\s*,\s*[A-Za-z_][\w.]*\(", s))
    if call_text is None:
        return ParsedCall("call", name, None, complete=False, syntax="prompted", n_calls=n_calls,
                          error="call truncated (unbalanced parentheses)")
    arguments, error = _call_arguments(call_text)
    return ParsedCall("call", name, arguments, complete=arguments is not None, syntax="prompted",
                      n_calls=n_calls, error=error)


def parse_generation(text: str, fmt: str) -> ParsedCall:
    if fmt == "native":
        return parse_native(text)
    if fmt == "prompted":
        return parse_prompted(text)
    raise ValueError(f"unknown decision format {fmt!r}")


def classify(parsed: ParsedCall, correct_action: str, wrong_tools: Sequence[str]) -> str:
    """The outcome of a parsed action for an item (one of :data:`OUTCOMES`)."""
    if parsed.kind == "parse_failure":
        return "parse_failure"
    if parsed.kind == "abstain":
        return "abstain"
    if parsed.name == correct_action:
        return "correct_tool"
    if parsed.name in set(wrong_tools):
        return "wrong_tool"
    return "other_tool"


def is_solved(outcome: str, correct_action: str) -> bool:
    """The greedy action is the correct action (abstention when abstaining is correct)."""
    return outcome == "correct_tool" or (correct_action == ABSTAIN and outcome == "abstain")


# ------------------------------------------------------------------------------------- generation
def generation_prompt(record: Mapping[str, Any]) -> list[int]:
    """The prompt the model continues freely: without the native forced ``<tool_call>`` prefix."""
    ids = list(record["input_ids"])
    if record["format"] == "native":
        if record.get("open_index") is None:
            raise ValueError(f"{record.get('record_id')}: native record without open_index")
        return ids[: int(record["open_index"]) + 1]
    return ids


def call_row(record: Mapping[str, Any], new_ids: Sequence[int], stopped: bool, text: str) -> dict[str, Any]:
    """The tidy row of one generation (without ``key``)."""
    parsed = parse_generation(text, record["format"])
    outcome = classify(parsed, record["correct_action"], record.get("wrong_tools", ()))
    solved = is_solved(outcome, record["correct_action"])
    row = {k: record.get(k) for k in ("record_id", "item_id", "bucket", "domain", "task_group", "config", "k", "format")}
    row.update(
        correct_action=record["correct_action"], wrong_tools=list(record.get("wrong_tools", ())),
        n_prompt_tokens=len(generation_prompt(record)), n_new_tokens=len(new_ids), stopped=stopped,
        generation=text, parsed=parsed.as_dict(), action=parsed.name if parsed.kind == "call" else parsed.kind,
        outcome=outcome, solved=solved, wrong_call=outcome == "wrong_tool", correct_call=solved,
        parse_failure=outcome == "parse_failure", abstained=outcome == "abstain",
        explicit_refusal=outcome == "abstain" and clean_generation(text).startswith(ABSTAIN_TEXT[:30]),
    )
    return row


def generate_call(session: Any, record: Mapping[str, Any], *, max_new_tokens: int = MAX_NEW_TOKENS, stop_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """Generate and parse the next action of one prompt record with a ``ProbeSession``."""
    stop_ids = stop_token_ids(session.model, session.tokenizer) if stop_ids is None else stop_ids
    new_ids, stopped = greedy_generate(session.model, generation_prompt(record), stop_ids, max_new_tokens)
    text = session.tokenizer.decode(new_ids, skip_special_tokens=False)
    return call_row(record, new_ids, stopped, text)


# ------------------------------------------------------------------------------------- aggregates
RATES: dict[str, str] = {"wrong_call": "wrong-call rate", "correct_call": "correct-call rate", "parse_failure": "parse-failure rate", "abstained": "abstention rate"}


def call_rates(rows: pd.DataFrame, *, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per format × config × k × bucket × rate: mean with a 95% bootstrap CI over task groups.

    Columns: format, config, k, bucket, rate, value, low, high, n (items), n_groups, count.
    """
    out = []
    keys = ["format", "config", "k", "bucket"]
    for key, frame in rows.groupby(keys, sort=True):
        for rate in RATES:
            values = frame[rate].astype(float).to_numpy()
            est = bootstrap_mean(values, frame["task_group"].tolist(), resamples=resamples, seed=seed)
            out.append({**dict(zip(keys, key)), "rate": rate, "value": est.value, "low": est.low, "high": est.high,
                        "n": len(frame), "n_groups": est.n_units, "count": int(values.sum())})
    return pd.DataFrame(out, columns=[*keys, "rate", "value", "low", "high", "n", "n_groups", "count"])


def paired_status(basm_solved: bool, padding_solved: bool) -> str:
    if basm_solved and padding_solved:
        return "both_solved"
    if basm_solved:
        return "only_basm"
    if padding_solved:
        return "only_padding"
    return "both_failed"


def pair_rows(rows: pd.DataFrame, configs: tuple[str, str] = PAIRED_CONFIGS) -> list[dict[str, Any]]:
    """One paired row per (item, k, format) present under both configurations."""
    first, second = configs
    keys = ["item_id", "k", "format"]
    a = rows[rows["config"] == first].set_index(keys)
    b = rows[rows["config"] == second].set_index(keys)
    out = []
    for key in sorted(set(a.index) & set(b.index)):
        ra, rb = a.loc[key], b.loc[key]
        item_id, k, fmt = key
        out.append({
            "key": f"{item_id}|k{k}|{fmt}", "item_id": item_id, "k": int(k), "format": fmt,
            "bucket": ra["bucket"], "domain": ra["domain"], "task_group": ra["task_group"],
            "correct_action": ra["correct_action"],
            f"{_short(first)}_solved": bool(ra["solved"]), f"{_short(second)}_solved": bool(rb["solved"]),
            f"{_short(first)}_outcome": ra["outcome"], f"{_short(second)}_outcome": rb["outcome"],
            "status": paired_status(bool(ra["solved"]), bool(rb["solved"])),
            "identical_prompt": int(k) == 0,
        })
    return out


def _short(config: str) -> str:
    return {"basm": "basm", "pad-procedure": "padding"}.get(config, config.replace("-", "_"))


def paired_summary(paired: pd.DataFrame, *, resamples: int = 10000, seed: int = 0) -> pd.DataFrame:
    """Per format × k × bucket (and bucket "all"): status counts and shares, plus the paired
    difference in solve rate (BASM − padding) with a sign-flip permutation p over task groups."""
    out = []
    frames = [paired, paired.assign(bucket="all")]
    for (fmt, k, bucket), frame in pd.concat(frames).groupby(["format", "k", "bucket"], sort=True):
        counts = frame["status"].value_counts()
        row = {"format": fmt, "k": int(k), "bucket": bucket, "n": len(frame), "n_groups": frame["task_group"].nunique()}
        for status in PAIRED_STATUSES:
            row[status] = int(counts.get(status, 0))
            row[f"{status}_share"] = row[status] / len(frame)
        a = frame["basm_solved"].astype(float).to_numpy()
        b = frame["padding_solved"].astype(float).to_numpy()
        if row["only_basm"] + row["only_padding"] and frame["task_group"].nunique() > 1:
            diff, p = paired_permutation_test(a, b, frame["task_group"].tolist(), alternative="two-sided", resamples=resamples, seed=seed)
        else:
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


def _calls_note(analysis: Any, rows: pd.DataFrame) -> str:
    failures = int(rows["parse_failure"].sum())
    cut = int((~rows["stopped"].astype(bool)).sum())
    return (f"{_provenance(analysis)} · greedy, ≤ {analysis.options.max_new_tokens} new tokens, prompt without the forced prefix\n"
            f"mean ± 95% bootstrap CI over task groups · correct call = the item's correct action (abstaining when that is correct) · "
            f"parse failures: {failures} of {len(rows)} generations · {cut} hit the token budget")


def _provenance(analysis: Any) -> str:
    """The shared provenance line without the margin variant (no margin is computed here)."""
    from probes.analyses.base import provenance

    return provenance(analysis).replace(f" · margin: {analysis.options.margin_variant}", "")


def print_rates(rates: pd.DataFrame) -> None:
    shown = rates[rates["rate"].isin(["wrong_call", "correct_call", "parse_failure"])]
    pivot = shown.pivot_table(index=["format", "rate", "bucket", "config"], columns="k", values="value", sort=True)
    print(pivot.round(2).to_string())


@dataclass
class CallsSummary:
    rows: pd.DataFrame  # one generation per record
    rates: pd.DataFrame  # rate per format, rate, bucket, config, k with CIs
    note: str


def collect(analysis: Any) -> pd.DataFrame:
    """Generate (resumably) every record's greedy call; returns the rows."""
    from probes.analyses.parallel import open_store
    from probes.reporting.results import load_results

    configs = _configs_of(analysis.options)
    store = open_store(analysis.out_dir / f"{NAME}.jsonl", NAME, calls_config(analysis, configs), overwrite=analysis.options.overwrite)
    generate_rows(analysis, store, configs)
    return load_results(store.path)


def figure(summary: CallsSummary, figures_dir: Path) -> list[Path]:
    from probes.reporting import plots

    plots.style()
    return plots.save_figure(plots.fig11_call_rates(summary.rates, summary.note), figures_dir, FIGURE)


def _cell(rates: pd.DataFrame, **where: Any) -> float:
    sub = rates
    for column, value in where.items():
        sub = sub[sub[column] == value]
    return float(sub["value"].iloc[0]) if len(sub) else float("nan")


def section(analysis: Any, summary: CallsSummary, paths: list[Path]) -> Any:
    from probes.analyses.base import Comparison, ReportSection
    from probes.reporting.markdown import markdown_table

    rows, rates = summary.rows, summary.rates
    k_max = int(rates["k"].max())
    shown = rates[rates["rate"].isin(["wrong_call", "correct_call", "parse_failure"])]
    table = shown.pivot_table(index=["bucket", "config", "rate"], columns="k", values="value", sort=True).reset_index()
    table.columns = [f"k={c}" if isinstance(c, int | np.integer) else str(c) for c in table.columns]
    outcomes = rows.groupby(["config", "outcome"]).size().unstack(fill_value=0).reset_index()
    body = (f"Greedy next action generated without the forced prefix (≤ {analysis.options.max_new_tokens} new tokens), "
            f"parsed in the model's {analysis.fmt} call syntax; rates per bucket, configuration and k "
            f"(CIs in `calls_summary.csv`).\n\n{markdown_table(table)}\n\nOutcome counts:\n\n{markdown_table(outcomes)}")
    comparisons = [Comparison(f"Fig. 11: T_wrong wrong-call rate, {label} (k = {k_max}; paper: qualitative)",
                              _cell(rates, bucket="T_wrong", config=config, k=k_max, rate="wrong_call"), None, "rate")
                   for config, label in (("proc", "Proc. Skill"), ("basm", "BASM"))]
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
    paired: pd.DataFrame  # one row per (item, k): the status of BASM vs procedure padding
    table: pd.DataFrame  # counts, solve difference and p per format, k and bucket
    how: str  # where the generations came from
    note: str


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
    note = (f"{_provenance(analysis)} · greedy calls ({how})\nsolved = the greedy call is the correct action · "
            f"Δ = solve rate BASM − procedure padding, p: two-sided sign-flip permutation test over task groups · "
            f"k = 0 omitted (both configurations render the identical memory-free prompt)")
    return PairedSummary(paired, paired_summary(paired, seed=analysis.options.seed), how, note)


def paired_figure(summary: PairedSummary, figures_dir: Path) -> list[Path]:
    from probes.reporting import plots

    plots.style()
    return plots.save_figure(plots.fig12_paired_status(summary.table, summary.note), figures_dir, PAIRED_FIGURE)


def paired_section(analysis: Any, paired_summary_: PairedSummary, paths: list[Path]) -> Any:
    from probes.analyses.base import Comparison, ReportSection
    from probes.reporting.markdown import markdown_table

    summary, how = paired_summary_.table, paired_summary_.how
    shown = summary[summary["k"] > 0][["k", "bucket", "n", *PAIRED_STATUSES, "solve_difference", "p_value"]]
    body = (f"BASM vs procedure padding (equal token count) on the same items and k; solved = greedy call is the correct "
            f"action ({how}).\n\n{markdown_table(shown)}")
    k_max = int(summary["k"].max())
    all_k = summary[(summary["bucket"] == "all") & (summary["k"] == k_max)]
    comparisons = [Comparison(f"Fig. 12: solve rate BASM − padding, all buckets (k = {k_max}; paper: BASM ≈ padding on BFCL, slightly ahead on AppWorld)",
                              float(all_k["solve_difference"].iloc[0]) if len(all_k) else float("nan"), None, "rate")]
    return ReportSection(PAIRED_NAME, "Fig. 12 — equal-token paired status (`paired`)", paths, body, comparisons, paired_summary_)


@dataclass(kw_only=True)
class Calls(Analysis):
    """Fig. 11: greedy next-action calls per k; wrong-/correct-call and parse-failure rates."""

    name: ClassVar[str] = NAME
    help: ClassVar[str] = "Fig. 11: greedy next-action calls per k; wrong-/correct-call and parse-failure rates."

    k_max: int | None = option(4, "largest retrieval depth K", type=int, minimum=0, group="probe")
    configs: tuple[str, ...] = option(CALLS_CONFIGS, f"comma-separated memory configurations (default: {','.join(CALLS_CONFIGS)}; "
                                      "pad-procedure is included so that `paired` reuses these generations)", names=tuple(CONFIGS))
    controls: bool = option(False, f"add the equal-length controls ({', '.join(CONTROL_CONFIGS)})", type=bool)
    max_new_tokens: int = option(MAX_NEW_TOKENS, "greedy generation budget", type=int, minimum=1, group="generation")

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        return collect(ctx)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> CallsSummary:
        return CallsSummary(rows, call_rates(rows, seed=ctx.options.seed), _calls_note(ctx, rows))

    def tables(self, summary: CallsSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.rates}

    def figures(self, summary: CallsSummary, out_dir: Path) -> list[Path]:
        return figure(summary, out_dir)

    def section(self, ctx: RunContext, summary: CallsSummary, figures: list[Path]) -> Any:
        return section(ctx, summary, figures)

    def print_summary(self, summary: CallsSummary) -> None:
        print_rates(summary.rates)
        print(summary.rows.groupby(["config", "outcome"]).size().unstack(fill_value=0).to_string())
