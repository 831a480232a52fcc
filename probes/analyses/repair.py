"""``repair``: the repair loop of Eq. 12 — after a failed call, a targeted hint h_t instead of re-retrieval.

On every T_repair item (the current turn ends in a failed call and its error observation; the correct
action is the repair call, the wrong tool repeats the failed one) the next decision is measured
under four conditions, each a prompt whose memory block (where retrieved skills go) holds:

``no_hint``    nothing (Base, k = 0);
``retrieval``  full re-retrieval: the configuration's top-k skills for the state (``--config``, ``--k``);
``hint``       h_t = Repair(x_t, a_t, o_{t+1}, S_k) (:func:`probes.scoring.checker.repair_hint`): the
               recovery notes of the top-k skills whose tools include the failed tool, kept when their
               condition matches the error observation (deterministic grammar; an optional judge for
               the rest);
``control``    a note of exactly the hint prompt's token count cut from recovery notes of skills that
               do not match the failed call and name neither the failed nor the repair tool: those of
               the item's library, else of the whole dataset (``control_pool``; BFCL's class libraries
               often hold no other note).

Measured per condition: the margin (``--margin-variant``; Eq. 1 verbatim needs ``--format prompted``;
positive = the failed tool is preferred over the repair tool) and the greedy next call (read by the
tool-call parser; ``repair_success`` = it is the item's repair action). Items where no note matched
have no hint and no control row values (counted in the report).

Claims (family ``repair``, paired by item, sign flips over task groups): h_t works only where it
beats **both** baselines, the equal-length control note and the no-hint prompt (two effect claims per
measure; the margin's against δ = 0.25 logits, knockout's smallest effect of interest, since both are
shifts of the same Eq. 1 margin), and the control note is tested for being inert (TOST: control − no
hint within ±δ). A control note that itself moves the margin makes "h_t beats the control" a
comparison against a baseline that moved; the summary words which comparisons hold
(:func:`repair_statements`).

On an imported BFCL dataset every item's conversation is replayed in BFCL's own API classes
(:class:`probes.data.bfcl.ItemEnvironments`), so the failed call's observation is the real one
(``observation_matches``: it equals the stored one), and the model's calls are executed there up to
``--steps`` decisions per condition: after a failed step the next decision gets the condition's memory
rebuilt for the new failure. Every executed call and observation is recorded. Model text is never
evaluated: calls come from the literal-only tool-call parser and run through the public-method
dispatch of :class:`probes.data.bfcl_exec.BFCLEnvironment` (:func:`execute_reply`), each call in a
child process under a time and a memory limit (``BFCLEnvironment.execute_limited``: a call past one
is observed as ``"error: call exceeded the 5 s time limit"`` and leaves the state unchanged).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from probes.analyses import register
from probes.analyses.base import Analysis, ReportSection
from probes.analyses.jobs import Job, run_jobs
from probes.analyses.option_system import depth_option, option
from probes.analyses.run_context import RunContext, provenance
from probes.analyses.calls import MAX_NEW_TOKENS, call_row, generation_prompt, load_judge
from probes.analyses.knockout import DEFAULT_SESOI
from probes.analyses.parallel import open_store
from probes.data.bfcl import ItemEnvironments, is_bfcl_import
from probes.data.bfcl_exec import BFCLEnvironment, Call, is_error_observation
from probes.data.configs import CONFIGS
from probes.data.dataset import Item
from probes.data.schema import Skill
from probes.engine.generate import greedy_generate, stop_token_ids
from probes.prompts.builder import DEFAULT_K_MAX
from probes.prompts.record import PromptRecord
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring.checker import HINT_HEADER, DecisionState, Hint, ProposedCall, names_tool, repair_hint
from probes.scoring.score import score_record
from probes.scoring.claims import Claim, absence_claim, claims_table, effect_claim
from probes.scoring.stats import DEFAULT_SEED, bootstrap_mean, paired_differences, summarise
from probes.scoring.toolcalls import ParsedReply, parse_reply

NAME = "repair"
FIGURE = "fig20_repair_success"
CONDITIONS: tuple[str, ...] = ("no_hint", "retrieval", "hint", "control")
CONTROL_HEADER = HINT_HEADER  # the control differs from h_t in its notes only


# ------------------------------------------------------------------------------------- the failure
def failed_step(item: Item) -> tuple[ProposedCall, str, Item]:
    """The failed call and its observation (the last two messages of the current turn) and the item
    as it stood before that call."""
    if len(item.history) < 2 or not item.history[-2].get("tool_call") or item.history[-1].get("role") != "tool":
        raise ValueError(f"{item.id}: a T_repair item must end in a call and its observation")
    call = item.history[-2]["tool_call"]
    return (ProposedCall(call["name"], dict(call.get("arguments", {}))), str(item.history[-1]["content"]),
            dataclasses.replace(item, history=item.history[:-2]))


def with_observation(item: Item, observation: str) -> Item:
    """``item`` with its last observation replaced (BFCL: the real one)."""
    last = dict(item.history[-1], content=observation)
    return dataclasses.replace(item, history=(*item.history[:-1], last))


def control_source(failed: str, repair: str, skills: Sequence[Skill]) -> str:
    """Recovery notes of the skills that do not match the failed call and name neither the failed
    nor the repair tool, in skill-id order (the control note is cut from them)."""
    notes = [note for skill in sorted(skills, key=lambda s: s.id) if failed not in skill.tool_names
             for note in skill.recovery_notes if not names_tool(note, failed) and not names_tool(note, repair)]
    return "\n".join(f"- {note}" for note in notes)


def control_note_source(item: Item, failed: str, dataset: Any) -> tuple[str, str]:
    """(pool, source) of the control note: :func:`control_source` over the item's library, or, when that
    library has no such note (a BFCL class library often holds only the failed tool's), over every skill
    of the dataset; ``pool`` (``library`` / ``dataset``) is recorded in the control row."""
    for pool, skills in (("library", dataset.library_for(item)), ("dataset", list(dataset.skills.values()))):
        if source := control_source(failed, item.correct_action, skills):
            return pool, source
    raise ValueError(f"{item.id}: no recovery note in the dataset matches neither {failed} nor {item.correct_action}: no control note")


def execute_reply(env: BFCLEnvironment, reply: ParsedReply) -> dict[str, Any] | None:
    """Execute the reply's call (lenient action) in ``env``: only a complete call whose arguments the
    parser read as literals, through the environment's public-method dispatch; None when the reply
    has no call. A call that cannot run is refused (``executed`` False) with the reason."""
    call = reply.action("lenient")
    if call is None:
        return None
    if not call.complete or call.arguments is None:
        return {"name": call.name, "arguments": None, "executed": False, "observation": f"refused: {call.error or 'incomplete call'}",
                "error": True}
    observation = env.execute_limited(Call(f"{call.name}(...)", call.name, tuple(call.positional), dict(call.arguments)))
    return {"name": call.name, "arguments": call.as_dict()["arguments"], "executed": True, "observation": observation,
            "error": is_error_observation(observation)}


# ------------------------------------------------------------------------------------- one condition
class _Decider:
    """Builds a condition's prompt for a state and measures the next decision."""

    def __init__(self, ctx: RunContext, judge: Any) -> None:
        self.ctx = ctx
        self.judge = judge
        self.stop_ids = stop_token_ids(ctx.session.model, ctx.session.tokenizer)

    def skills(self, item: Item) -> list[Skill]:
        return [entry.skill for entry in self.ctx.builder.ordered(item)[: self.ctx.options.depth]]

    def hint(self, item: Item) -> Hint:
        failed, observation, before = failed_step(item)
        state = DecisionState.of(before, self.ctx.dataset.catalog_for(item))
        return repair_hint(failed, observation, state, self.skills(item), judge=self.judge)

    def prompt(self, item: Item, condition: str, hint: Hint) -> PromptRecord | None:
        """The condition's prompt (None: no hint matched, so neither h_t nor its control exists)."""
        builder, fmt, k = self.ctx.builder, self.ctx.fmt, self.ctx.options.depth
        if condition == "no_hint":
            return builder.build(item, "base", 0, fmt)
        if condition == "retrieval":
            return builder.build(item, self.ctx.options.config, k, fmt)
        if not hint.text:
            return None
        body = hint.text.removeprefix(HINT_HEADER)
        hinted = builder.build_note(item, "hint", HINT_HEADER, body, fmt, k=k)
        if condition == "hint":
            return hinted
        _, source = control_note_source(item, hint.failed_tool, self.ctx.dataset)
        return builder.build_equal_note(item, "control", CONTROL_HEADER, source, hinted, fmt, k=k)

    def generate(self, record: PromptRecord) -> dict[str, Any]:
        session = self.ctx.session
        new_ids, stopped = greedy_generate(session.model, generation_prompt(record), self.stop_ids, self.ctx.options.max_new_tokens)
        return call_row(record, new_ids, stopped, session.tokenizer.decode(new_ids, skip_special_tokens=False))


def condition_row(decider: _Decider, item: Item, condition: str, env: BFCLEnvironment | None) -> dict[str, Any]:
    """One condition on one item: the first decision's margin and greedy call, then (BFCL) the executed steps."""
    hint = decider.hint(item)
    record = decider.prompt(item, condition, hint)
    row: dict[str, Any] = {"condition": condition, "hint": hint.as_dict(), "hint_notes_undecided": hint.n_undecided,
                           "has_hint": bool(hint.text),
                           "control_pool": control_note_source(item, hint.failed_tool, decider.ctx.dataset)[0]
                           if condition == "control" and hint.text else None}
    if record is None:
        return {**row, "measured": False}
    scored = score_record(decider.ctx.session, record, variant=decider.ctx.variant)[0]
    call = decider.generate(record)
    row.update(measured=True, prompt_config=record.config, n_prompt_tokens=record.n_tokens, margin=scored["margin"],
               margin_variant=scored["margin_variant"], margin_note=scored["margin_note"], generation=call["generation"],
               action=call["lenient_action"], outcome=call["lenient_outcome"], repair_success=bool(call["lenient_solved"]),
               strict_repair_success=bool(call["strict_solved"]), memory=[s.skill_id for s in record.skills])
    if env is None:
        return row
    steps, state, current = [], env.snapshot(), item
    for step in range(decider.ctx.options.steps):
        reply = parse_reply(call["generation"], template=record.format, catalog=[c.action for c in record.candidates])
        executed = execute_reply(state, reply)
        steps.append({"step": step, "prompt_config": record.config, "generation": call["generation"], "call": executed})
        if executed is None or not executed["error"] or not executed["executed"] or step + 1 == decider.ctx.options.steps:
            break
        current = dataclasses.replace(current, id=f"{item.id}~{condition}{step + 1}", history=(
            *current.history, {"role": "assistant", "tool_call": {"name": executed["name"], "arguments": executed["arguments"]}},
            {"role": "tool", "name": executed["name"], "content": executed["observation"]}))
        hint = decider.hint(current)
        record = decider.prompt(current, condition, hint)
        if record is None:
            steps.append({"step": step + 1, "prompt_config": None, "generation": None, "call": None, "note": "no hint matched the new failure"})
            break
        call = decider.generate(record)
    first = steps[0]["call"] if steps else None
    row.update(steps=steps, first_call_ok=bool(first and first["executed"] and not first["error"]),
               recovered=any(s["call"] and s["call"]["executed"] and not s["call"]["error"] for s in steps))
    return row


# ------------------------------------------------------------------------------------- aggregates
MEASURES: tuple[str, ...] = ("repair_success", "margin", "first_call_ok", "recovered")


def repair_rates(rows: pd.DataFrame, *, resamples: int = 2000, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Per condition × measure: mean with a 95% bootstrap CI over task groups, over the measured rows
    (the BFCL execution measures only where an environment ran)."""
    out = []
    for condition in [c for c in CONDITIONS if c in set(rows["condition"])]:
        frame = rows[(rows["condition"] == condition) & rows["measured"].astype(bool)]
        for measure in MEASURES:
            if measure not in frame or frame[measure].isna().all():
                continue
            sub = frame[frame[measure].notna()]
            est = bootstrap_mean(sub[measure].astype(float).to_numpy(), sub["task_group"].tolist(), resamples=resamples, seed=seed)
            out.append({"condition": condition, "measure": measure, "bucket": "T_repair", "value": est.value, "low": est.low,
                        "high": est.high, "n": len(sub), "n_groups": est.n_units})
    return pd.DataFrame(out, columns=["condition", "measure", "bucket", "value", "low", "high", "n", "n_groups"])


# h_t against each other condition, and the control note against no hint (is it inert?), paired by item
CONTRASTS: dict[str, tuple[str, str]] = {"hint − control": ("hint", "control"), "hint − no_hint": ("hint", "no_hint"),
                                         "hint − retrieval": ("hint", "retrieval"), "control − no_hint": ("control", "no_hint")}
PAIRED_MEASURES: tuple[str, ...] = ("repair_success", "margin")


def repair_contrasts(rows: pd.DataFrame, *, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Per contrast of :data:`CONTRASTS` × measure: the mean per-item difference (both conditions
    measured on the item) with a 95% bootstrap CI over task groups."""
    out = []
    measured = rows[rows["measured"].astype(bool)]
    for measure in PAIRED_MEASURES:
        if measure not in measured or measured[measure].isna().all():
            continue
        deltas = paired_differences(measured.assign(**{measure: measured[measure].astype(float)}), CONTRASTS,
                                    pair=["item_id", "task_group"], side="condition", value=measure)
        out.append(summarise(deltas, ["contrast"], value="delta", seed=seed).assign(measure=measure))
    columns = ["contrast", "measure", "value", "low", "high", "n", "n_items", "n_nan", "note"]
    return pd.concat(out, ignore_index=True)[columns] if out else pd.DataFrame(columns=columns)


# the smallest margin effect of interest: the one knockout states for the same Eq. 1 margin (logits), not re-chosen here
SESOI = DEFAULT_SESOI
BASELINES: dict[str, str] = {"control": "the equal-length control note", "no_hint": "the no-hint prompt"}
# measure -> (the side h_t should move it to, unit, smallest effect of interest: the margin's δ; none stated for the rate)
CLAIMED: dict[str, tuple[str, str, float]] = {"margin": ("less", "logits", SESOI), "repair_success": ("greater", "rate", float("nan"))}
INERT_CLAIM = "control_margin_vs_no_hint"


def _paired(rows: pd.DataFrame, measure: str, a: str, b: str) -> pd.DataFrame:
    """Per item ``measure[a] − measure[b]`` (both measured) with its task group."""
    return paired_differences(rows.assign(**{measure: rows[measure].astype(float)}), {f"{a} − {b}": (a, b)},
                              pair=["item_id", "task_group"], side="condition", value=measure).dropna(subset=["delta"])


def repair_claims(rows: pd.DataFrame, seed: int = DEFAULT_SEED) -> list[Claim]:
    """Family ``repair``, paired by item: per measure, h_t beats the control note and h_t beats the
    no-hint prompt (two effect claims; "h_t works" needs both); and the control note leaves the margin
    within ±:data:`SESOI` of the no-hint prompt (TOST)."""
    rows = rows[rows["measured"].astype(bool)]
    out = []
    for measure, (alternative, unit, sesoi) in CLAIMED.items():
        if measure not in rows or rows[measure].isna().all():
            continue
        direction = "lowers the margin toward the repair tool" if measure == "margin" else "raises greedy repair success"
        for baseline, what in BASELINES.items():
            deltas = _paired(rows, measure, "hint", baseline)
            if len(deltas):
                out.append(effect_claim(NAME, f"hint_{measure}_vs_{baseline}", f"the repair hint h_t (Eq. 12) {direction} against {what} "
                                        f"(paired by item)", deltas["delta"], deltas["task_group"], alternative=alternative,
                                        sesoi=sesoi, unit=unit, seed=seed, note=f"{len(deltas)} items"))
        if measure == "margin" and len(deltas := _paired(rows, measure, "control", "no_hint")):
            out.append(absence_claim(NAME, INERT_CLAIM, f"the control note is inert: control − no hint leaves the margin within ±{SESOI:g} "
                                     f"logits (TOST)", deltas["delta"], deltas["task_group"], sesoi=SESOI, seed=seed,
                                     note=f"{len(deltas)} items"))
    return out


def _ci(row: pd.Series) -> str:
    return f"{row['estimate']:+.2f}" + (f" [{row['low']:+.2f}, {row['high']:+.2f}]" if np.isfinite(row["low"]) else " (no CI)")


def repair_statements(table: pd.DataFrame) -> list[str]:
    """What holds, in words, from the claims table of :func:`repair_claims`: per measure, "h_t works"
    only when both effect claims hold; otherwise which baseline h_t beats and which it is not shown
    to beat (with that claim's estimate and verdict); and whether the control note is inert or itself
    moves the margin."""
    rows = table.set_index("name")
    holds = {name: str(verdict).startswith("holds") for name, verdict in rows["verdict"].items()}  # absence: "holds: equivalent …"
    out = []
    for measure in CLAIMED:
        names = {baseline: f"hint_{measure}_vs_{baseline}" for baseline in BASELINES if f"hint_{measure}_vs_{baseline}" in rows.index}
        if not names:
            continue
        beaten = [b for b, name in names.items() if holds[name]]
        missed = [f"{BASELINES[b]} (h_t − {b.replace('_', ' ')} {_ci(rows.loc[name])}: {rows.loc[name, 'verdict']})"
                  for b, name in names.items() if not holds[name]]
        label = measure.replace("_", " ")
        if len(beaten) == len(BASELINES):
            text = f"{label}: h_t works: it beats both the control note and the no-hint prompt"
        elif beaten:
            text = f"{label}: h_t beats {BASELINES[beaten[0]]} but is not shown to beat {missed[0]}; 'h_t works' does not hold"
        else:
            text = f"{label}: h_t is not shown to beat {' nor '.join(missed)}; 'h_t works' does not hold"
        if measure == "margin" and INERT_CLAIM in rows.index:
            c = rows.loc[INERT_CLAIM]
            if holds[INERT_CLAIM]:
                text += f"; the control note is inert (control − no hint {_ci(c)} logits, within ±{c['sesoi']:g} by TOST)"
            else:  # "moves" only where the CI excludes 0; else the note is merely not shown inert
                side = "toward the failed tool" if c["low"] > 0 else "toward the repair tool" if c["high"] < 0 else ""
                text += (f"; {f'the control note itself moves the margin {side}' if side else 'the control note is not shown inert'}: "
                         f"control − no hint {_ci(c)} logits, not shown within ±{c['sesoi']:g} (TOST)")
        out.append(text)
    return out


@dataclass
class RepairSummary:
    rows: pd.DataFrame
    rates: pd.DataFrame
    note: str
    contrasts: pd.DataFrame
    seed: int = DEFAULT_SEED
    statements: tuple[str, ...] = ()  # what holds, in words (repair_statements)


@register("repair", order=75)
@dataclass(kw_only=True)
class Repair(Analysis):
    """Eq. 12: the next decision after a failed call with no hint, full re-retrieval, h_t and an equal-length control hint."""

    k: int | None = depth_option(DEFAULT_K_MAX, "retrieval depth of S_k (re-retrieval and the hint's skills)")
    config: str = option("basm", "memory configuration of the full re-retrieval condition", choices=tuple(CONFIGS), group="probe")
    steps: int = option(2, "decisions executed per condition on BFCL items (BFCL's API classes)", type=int, minimum=1, group="generation")
    max_new_tokens: int = option(MAX_NEW_TOKENS, "greedy generation budget", type=int, minimum=1, group="generation")
    judge: str | None = option(None, "a local chat model (folder or cache name) that decides recovery notes outside the grammar",
                               group="checker")

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        items = ctx.items_in(["T_repair"])
        if not items:
            raise ValueError("repair needs T_repair items (--bucket T_repair or no bucket filter)")
        bfcl = is_bfcl_import(Path(ctx.dataset.root))
        config = ctx.config(k=ctx.options.depth, config=self.config, steps=self.steps if bfcl else None, judge=self.judge,
                            max_new_tokens=self.max_new_tokens, decoding="greedy", environment="bfcl" if bfcl else None)
        store = open_store(ctx.rows_path(NAME), NAME, config, overwrite=ctx.options.overwrite)
        decider = _Decider(ctx, load_judge(self.judge))
        environments = ItemEnvironments() if bfcl else None
        jobs = [Job(item, self.config, ctx.options.depth, ctx.fmt, CONDITIONS) for item in items]

        def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
            item, env, extra = job.item, None, {}
            if environments is not None:
                env, observations = environments.replay(job.item)
                extra = {"observation_stored": job.item.history[-1]["content"], "observation_real": observations[-1],
                         "observation_matches": observations[-1] == job.item.history[-1]["content"]}
                item = with_observation(job.item, observations[-1])
            base = {"record_id": record.record_id, "item_id": item.id, "bucket": item.bucket, "domain": item.domain,
                    "task_group": item.task_group, "config": self.config, "k": ctx.options.depth, "format": ctx.fmt,
                    "correct_action": item.correct_action, "failed_tool": failed_step(item)[0].name, **extra}
            return [{**base, **condition_row(decider, item, condition, env)} for condition in CONDITIONS]

        run_jobs(ctx, store, jobs, scorer)
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> RepairSummary:
        hinted = rows[rows["condition"] == "hint"]
        n_items = len(hinted)
        note = (f"{provenance(ctx)} · S_k: {self.config} top {ctx.options.depth} · {int(hinted['has_hint'].sum())} of {n_items} "
                f"T_repair items got a hint (a recovery note matched the error) · notes undecided: {int(hinted['hint_notes_undecided'].sum())}"
                f" · judge: {self.judge or 'none'}\nmean ± 95% bootstrap CI over task groups; margin: {ctx.variant} (wrong − repair tool)")
        if "observation_matches" in rows:
            note += f" · BFCL: real observation equals the stored one for {int(hinted['observation_matches'].sum())} of {n_items}; ≤ {self.steps} steps"
        seed = ctx.options.seed
        statements = tuple(repair_statements(claims_table(repair_claims(rows, seed))))
        return RepairSummary(rows, repair_rates(rows, seed=seed), note, repair_contrasts(rows, seed=seed), seed, statements)

    def tables(self, summary: RepairSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.rates, f"{NAME}_contrasts": summary.contrasts}

    def figures(self, summary: RepairSummary, out_dir: Path) -> list[Path]:
        plots.style()
        return plots.save_figure(fig20_repair_success(summary.rates, summary.note), out_dir, FIGURE)

    def section(self, ctx: RunContext, summary: RepairSummary, figures: list[Path]) -> ReportSection:
        body = (f"After a failed call (T_repair), the next decision under no hint, full re-retrieval, the repair hint h_t of Eq. 12 "
                f"(recovery notes whose condition matches the error) and an equal-length control note. {summary.note.splitlines()[0]}."
                f"\n\n{markdown_table(summary.rates)}\n\nh_t against each other condition and the control note against no "
                f"hint, per-item differences (margin: negative = toward the repair tool; 95% CI over task groups):\n\n"
                f"{markdown_table(summary.contrasts)}\n\nWhat holds (h_t works only where it beats both the control note and "
                f"the no-hint prompt; margin effects against δ = {SESOI:g} logits, the smallest effect of interest knockout "
                f"states for the same margin; claims in `{NAME}_claims.csv`):\n\n"
                + "\n".join(f"- {line}" for line in summary.statements))
        return ReportSection(NAME, "Eq. 12 — repair loop (`repair`)", figures, body, [], summary)

    def claims(self, summary: RepairSummary) -> list[Claim]:
        """:func:`repair_claims` of the rows: h_t against each baseline per measure, and the control note's TOST."""
        return repair_claims(summary.rows, summary.seed)

    def print_summary(self, summary: RepairSummary) -> None:
        print(summary.note)
        print("\n".join(summary.statements))
        print(summary.rates.round(3).to_string(index=False))
        print(summary.contrasts.round(3).to_string(index=False))


# --- Fig. 20, drawn by Repair.figures
REPAIR_CONDITION_LABELS: dict[str, str] = {"no_hint": "no hint", "retrieval": "full re-retrieval", "hint": "h_t (Eq. 12)",
                                           "control": "control hint"}


def fig20_repair_success(rates: pd.DataFrame, note: str) -> plt.Figure:
    """Repair success per condition (no hint, full re-retrieval, h_t, equal-length control hint): one
    panel per measure (greedy repair success; Eq. 1 / chosen margin toward the wrong tool), one bar per
    condition and dataset bucket, 95% CI bars over task groups.

    rates: measure, condition, bucket, value, low, high, n, n_groups.
    """
    measures = [m for m in ("repair_success", "margin") if m in set(rates["measure"])]
    conditions = [c for c in REPAIR_CONDITION_LABELS if c in set(rates["condition"])]
    fig, axes = plt.subplots(1, len(measures), figsize=(4.6 * len(measures), 3.4), squeeze=False)
    palette = sns.color_palette("colorblind", len(conditions))
    for col, measure in enumerate(measures):
        ax = axes[0][col]
        sub = rates[rates["measure"] == measure].set_index("condition").reindex(conditions)
        ax.bar(np.arange(len(conditions)), sub["value"].fillna(0), 0.7, color=palette, yerr=plots.ci_errors(sub.reset_index()), capsize=2.5)
        ax.set_xticks(np.arange(len(conditions)), [REPAIR_CONDITION_LABELS[c] for c in conditions], rotation=15)
        ax.set_ylabel({"repair_success": "greedy repair success", "margin": "margin (wrong − repair tool)"}[measure])
        if measure == "repair_success":
            ax.set_ylim(0, 1.04)
        else:
            ax.axhline(0, color="0.3", lw=0.8)
        ax.set_title(f"n = {int(sub['n'].max()) if sub['n'].notna().any() else 0} decisions, "
                     f"{int(sub['n_groups'].max()) if sub['n_groups'].notna().any() else 0} task groups")
    fig.suptitle("Next decision after a failed call: repair success per condition (Eq. 12)")
    plots.footnote(fig, note)
    return fig
