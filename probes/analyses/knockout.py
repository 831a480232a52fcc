"""``knockout`` (Figs. 3c/d, 6 and 7): same-prompt knockout of decision → boundary attention.

The prompt tokens stay fixed (BASM at depth k); only attention from the deciding rows to a span is
removed (its scores set to −inf before the softmax, so each row renormalises over the rest), in
every layer and head unless a layer window is given.

Which rows are blocked (``--knockout-rows``, recorded in the rows and the results header):

- ``path`` (default): every query row from the row that opens the tool call to the decision row
  (the forced prefix ``<tool_call>``, ``{"``, ``name``, ``":`` … feeds the decision row), and every
  row of the scored candidate names, so that where a wrong and the correct name share a prefix
  (``get`` …) the rows of that prefix, which predict the deciding token, are blocked too;
- ``endpoints``: the open row and the decision row only, no candidate rows (the measurement of
  earlier versions, kept for comparison; it lets the forced-prefix rows read B freely).

Conditions, all evaluated in one cached-branching engine call per record:

- ``boundary``: the boundary span B;
- ``random_i`` (i < ``--random-draws``), the neutral control: as many positions as B, drawn from
  the memory block outside B (skill headers, goals, tool lines and procedure text), never from
  the system prompt, the tool schemas or the request, which carry the task. The share of its
  positions that fall on P is recorded (``control_procedure_share``); ``--random-pool memory``
  keeps it off P too, at the price of a shorter span (with the real Qwen3 tokenizer the memory
  block outside B and P is smaller than B in most records). Blocks keep B's block lengths where
  there is room; a block that does not fit is split into shorter runs (recorded as
  ``control_pieces``). Where the pool holds fewer positions than B, all of them are blocked and
  ``control_coverage`` < 1 says so. Their per-record mean is the ``random`` control;
- ``anywhere_i``: the earlier control, same-length runs anywhere before the first query row except
  B and token 0 (the attention sink), which can hit the request or the tool names. Its mean is the
  ``random_anywhere`` control, reported beside the neutral one;
- ``procedure``: the procedure span P;
- ``boundary@La-b`` (with ``--layer-window W``): B knocked out only in layers a..b.

With ``--priming`` the same conditions also run on the lexical-priming controls (``basm-anon``:
tool names in the boundary items replaced by placeholders; ``basm-names``: each boundary item
reduced to a neutral sentence naming its tools), so a boundary effect carried by the tool names
is told apart from one carried by the boundary semantics. Every summary row names its ``config``;
the figures and the gap recovery are BASM's.

Draws are seeded by (seed, record, draw), so they do not depend on run order.

Reported: the signed shift Δm = m_knockout − m_baseline for the tool-choice (Eq. 1), broad
(tool-vs-control), correct-tool margins and the call log-odds, split as T_wrong–wrong,
T_wrong–correct, T_ok–correct (Fig. 7); and the share of the Proc. Skill gap that the boundary
knockout recovers on T_wrong, mean Δm_boundary / (mean m_Proc − mean m_BASM), with a 95% CI from
resampling task groups jointly for numerator and denominator. Per measure, every knockout and
control is compared on the same records (those where the measure is defined under every
condition); records left out are counted with their reason. Records whose boundary span is empty
(the relevance gate γ exposed no boundary field) are excluded and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from probes.reporting import plots
from probes.analyses import paper
from probes.data.configs import PRIMING_CONFIGS
from probes.analyses.base import Analysis, Comparison, Job, ReportSection, RunContext, cached_scorer, option, provenance, run_jobs
from probes.reporting.markdown import cell, markdown_table
from probes.scoring.score import record_rng
from probes.scoring.stats import bootstrap_ratio, summarise
from probes.engine.session import Knockout, span_positions
from probes.reporting.results import load_results

NAME = "knockout"
FIGURES = ("fig06_knockout_controls", "fig07_knockout_selectivity")
MEASURES = ("margin", "broad_margin", "correct_margin", "call_logodds")
DEFAULT_DRAWS = 5
KNOCKOUT_ROWS = ("path", "endpoints")
RANDOM_POOLS = ("memory+procedure", "memory")
CONTROL_PREFIXES = {"random_": "random", "anywhere_": "random_anywhere"}  # draw condition -> control


def draw_span(free: np.ndarray, lengths: Sequence[int], rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Positions of runs with the given ``lengths`` among the ``free`` positions (bool mask),
    non-overlapping. A run with no contiguous room is split in halves until its pieces fit; the
    total is capped at the free room. Returns (sorted positions, lengths of the runs placed)."""
    free = np.asarray(free, dtype=bool).copy()
    out: list[int] = []
    pieces: list[int] = []
    queue = [int(x) for x in rng.permutation(np.asarray(lengths, dtype=int))]
    while queue and free.any():
        length = min(queue.pop(0), int(free.sum()))
        # starts whose whole run is free: a run-length test over the free mask
        window = np.convolve(free.astype(int), np.ones(length, dtype=int), mode="valid") == length
        starts = np.flatnonzero(window)
        if not len(starts):
            queue[:0] = [length - length // 2, length // 2]
            continue
        start = int(rng.choice(starts))
        free[start : start + length] = False
        out += range(start, start + length)
        pieces.append(length)
    return sorted(out), pieces


def block_lengths(blocks: Sequence[Sequence[int]]) -> list[int]:
    return [int(e) - int(s) for s, e in blocks]


def memory_control(record: dict[str, Any], blocks: Sequence[Sequence[int]], rng: np.random.Generator,
                   pool: str = "memory+procedure") -> tuple[list[int], list[int]]:
    """The neutral random span: |B| positions of the memory block outside B (and outside P when
    ``pool`` is ``memory``); see the module docstring."""
    if pool not in RANDOM_POOLS:
        raise ValueError(f"random pool must be one of {RANDOM_POOLS}, got {pool!r}")
    memory = record["spans"].get("memory")
    if not memory:
        raise ValueError(f"{record['record_id']}: the record has no memory span (rebuild it with this version)")
    free = np.zeros(record["n_tokens"], dtype=bool)
    free[span_positions(memory)] = True
    free[span_positions(blocks)] = False
    if pool == "memory":
        free[span_positions(record["spans"].get("procedure", []))] = False
    return draw_span(free, block_lengths(blocks), rng)


def pool_text(pool: str) -> str:
    """Where a ``--random-pool`` draws, in words (figure notes and the report)."""
    return "outside B and P" if pool == "memory" else "outside B (P allowed)"


def anywhere_control(record: dict[str, Any], blocks: Sequence[Sequence[int]], rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Same-length runs anywhere before the first query row except B and token 0."""
    free = np.ones(min(record["query_rows"]), dtype=bool)
    free[0] = False
    free[[p for p in span_positions(blocks) if p < len(free)]] = False
    return draw_span(free, block_lengths(blocks), rng)


def layer_windows(n_layers: int, width: int) -> list[tuple[int, ...]]:
    return [tuple(range(a, min(a + width, n_layers))) for a in range(0, n_layers, width)]


def condition_names(draws: int, windows: Sequence[Sequence[int]]) -> tuple[str, ...]:
    return ("baseline", "boundary", *(f"{prefix}{i}" for i in range(draws) for prefix in CONTROL_PREFIXES), "procedure",
            *(f"boundary@L{w[0]}-{w[-1]}" for w in windows))


def blocked_rows(record: dict[str, Any], policy: str) -> dict[str, Any]:
    """Knockout keyword arguments of a ``--knockout-rows`` policy."""
    if policy == "path":
        return {"rows": None, "continuation": True}
    if policy == "endpoints":
        rows = [r for r in (record.get("open_index"), record["decision_index"]) if r is not None]
        return {"rows": rows, "continuation": False}
    raise ValueError(f"--knockout-rows must be one of {KNOCKOUT_ROWS}, got {policy!r}")


def knocked_configs(priming: bool) -> tuple[str, ...]:
    """The configurations whose records get every knockout (the Proc. Skill reference gets none)."""
    return ("basm", *PRIMING_CONFIGS) if priming else ("basm",)


def knockout_scorer(analysis: RunContext, windows: Sequence[Sequence[int]]):
    """The scorer of a BASM record under every knockout; each control row also says how it was
    drawn: ``control_pieces`` (run lengths) and ``control_coverage`` (positions blocked / |B|)."""
    a = analysis.options
    drawn: dict[str, tuple[list[int], list[int]]] = {}  # condition -> (positions, run lengths) of the record being scored

    def conditions(record: dict[str, Any], job: Job) -> list[Knockout]:
        drawn.clear()
        if job.config not in knocked_configs(a.priming):
            return []
        blocks = record["spans"].get("boundary", [])
        rows = blocked_rows(record, a.knockout_rows)
        out = [Knockout.from_spans("boundary", blocks, **rows)]
        for i in range(a.random_draws):
            for prefix, draw in (("random_", lambda *x: memory_control(*x, pool=a.random_pool)), ("anywhere_", anywhere_control)):
                drawn[f"{prefix}{i}"] = draw(record, blocks, record_rng(a.seed, record["record_id"], f"{prefix}{i}"))
                out.append(Knockout(f"{prefix}{i}", tuple(drawn[f"{prefix}{i}"][0]), **rows))
        out.append(Knockout.from_spans("procedure", record["spans"].get("procedure", []), **rows))
        out += [Knockout.from_spans(f"boundary@L{w[0]}-{w[-1]}", blocks, layers=w, **rows) for w in windows]
        return out

    score = cached_scorer(analysis, conditions, margins=MEASURES)

    def scorer(record: dict[str, Any], job: Job) -> list[dict[str, Any]]:
        rows = score(record, job)
        blocks = record["spans"].get("boundary", [])
        size = len(span_positions(blocks))
        procedure = set(span_positions(record["spans"].get("procedure", [])))
        for row in rows:
            if row["condition"] in drawn:
                positions, pieces = drawn[row["condition"]]
                row.update(control_pieces=pieces, control_coverage=len(positions) / size if size else float("nan"),
                           control_split=len(pieces) > len(blocks),
                           control_procedure_share=len(procedure.intersection(positions)) / len(positions) if positions else float("nan"))
        return rows

    return scorer


def collect(analysis: RunContext) -> pd.DataFrame:
    a = analysis.options
    k = a.k if a.k is not None else a.k_max
    windows = layer_windows(analysis.session.n_layers, a.layer_window) if a.layer_window else []
    names = condition_names(a.random_draws, windows)
    jobs = []
    for item in analysis.items:
        jobs += [Job(item, config, k, analysis.fmt, names) for config in knocked_configs(a.priming)]
        if item.bucket == "T_wrong":  # the Proc. Skill reference of the gap
            jobs.append(Job(item, "proc", k, analysis.fmt, ("baseline",)))
    store = analysis.store(k=k, knocked_configs=list(knocked_configs(a.priming)), random_draws=a.random_draws, layer_windows=[list(w) for w in windows], knockout_rows=a.knockout_rows,
                           random_pool=a.random_pool, random_span="|B| positions of the pool, B's block lengths (split where no room)",
                           random_anywhere_span="B's block lengths before the first query row, excluding B and token 0")
    run_jobs(analysis, store, jobs, knockout_scorer(analysis, windows))
    return load_results(store.path)


@dataclass
class KnockoutSummary:
    deltas: pd.DataFrame  # config, bucket, knockout, measure, value, low, high, n, n_items, n_nan
    recovery: pd.DataFrame  # measure, value, low, high, n (share of the Proc.–BASM gap, T_wrong)
    windows: pd.DataFrame  # window, value, low, high, n (Δ wrong-tool margin on T_wrong)
    per_record: pd.DataFrame  # config, item_id, bucket, task_group, knockout, measure, delta
    dropped: pd.DataFrame  # measure, bucket, reason, n_records: records left out of a measure's comparison
    controls: pd.DataFrame  # control, n_records, n_draws, mean_coverage, n_short, n_split, mean_procedure_share
    n_excluded: int  # knocked records without a boundary span
    note: str


def control_of(condition: str) -> str:
    """The reported knockout of a condition: random draws pool into their control."""
    for prefix, control in CONTROL_PREFIXES.items():
        if condition.startswith(prefix):
            return control
    return condition


def deltas_per_record(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Δm per (knocked record, knockout, measure), random draws averaged into their control, on
    paired records: per measure only the records where it is finite under the baseline and every
    knockout. Returns (per-record deltas, records left out per measure with the reason, records
    without B). Every configuration but the Proc. Skill reference is a knocked one."""
    basm = rows[rows["config"] != "proc"]
    excluded = basm[(basm["condition"] == "baseline") & (basm["boundary_size"] == 0)]["record_id"]
    basm = basm[~basm["record_id"].isin(set(excluded))]
    out, dropped = [], []
    for measure in MEASURES:
        wide = basm.pivot_table(index="record_id", columns="condition", values=measure, aggfunc="first", dropna=False)
        finite = np.isfinite(wide.to_numpy(float)).all(axis=1)
        keep = set(wide.index[finite])
        lost = basm[(basm["condition"] == "baseline") & ~basm["record_id"].isin(keep)]
        for (config, bucket, abstain), sub in lost.groupby(["config", "bucket", lost["correct_is_abstain"].astype(bool)], sort=False):
            reason = "correct action is abstention (no correct tool)" if abstain else "undefined under some condition (names never diverge)"
            dropped.append({"config": config, "measure": measure, "bucket": bucket, "reason": reason, "n_records": len(sub)})
        sub = basm[basm["record_id"].isin(keep)]
        base = sub[sub["condition"] == "baseline"].set_index("record_id")[measure]
        knocked = sub[sub["condition"] != "baseline"]
        delta = knocked[measure].to_numpy(float) - base.loc[knocked["record_id"]].to_numpy(float)
        frame = knocked[["record_id", "config", "item_id", "bucket", "task_group", "condition"]].assign(measure=measure, delta=delta)
        out.append(frame.assign(knockout=frame["condition"].map(control_of)))
    per = pd.concat(out, ignore_index=True)
    # one value per record for each random control: the mean over its draws
    per = per.groupby(["record_id", "config", "item_id", "bucket", "task_group", "knockout", "measure"], as_index=False,
                      sort=False)["delta"].mean()
    return per, pd.DataFrame(dropped, columns=["config", "measure", "bucket", "reason", "n_records"]), int(len(excluded))


def control_draws(rows: pd.DataFrame) -> pd.DataFrame:
    """How the random controls were drawn: coverage of |B| and how often a run had to be split."""
    rows = rows.assign(control=rows["condition"].map(control_of))
    draws = rows[rows["control"].isin(set(CONTROL_PREFIXES.values())) & (rows["config"] == "basm")]
    if not len(draws):
        return pd.DataFrame(columns=["control", "n_records", "n_draws", "mean_coverage", "n_short", "n_split", "mean_procedure_share"])
    out = []
    for control, sub in draws.groupby("control", sort=False):
        out.append({"control": control, "n_records": sub["record_id"].nunique(), "n_draws": len(sub),
                    "mean_coverage": float(sub["control_coverage"].mean()), "n_short": int((sub["control_coverage"] < 1).sum()),
                    "n_split": int(sub["control_split"].astype(bool).sum()),
                    "mean_procedure_share": float(sub["control_procedure_share"].mean())})
    return pd.DataFrame(out)


def gap_recovery(rows: pd.DataFrame, per: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Share of the Proc. Skill gap (m_Proc − m_BASM, T_wrong) recovered by the boundary knockout."""
    out = []
    wrong = rows[(rows["bucket"] == "T_wrong") & (rows["condition"] == "baseline")]
    for measure in ("margin", "broad_margin"):
        proc = wrong[wrong["config"] == "proc"].set_index("item_id")[measure]
        basm = wrong[wrong["config"] == "basm"].set_index("item_id")[measure]
        d = per[(per["config"] == "basm") & (per["bucket"] == "T_wrong") & (per["knockout"] == "boundary")
                & (per["measure"] == measure)].set_index("item_id")
        common = d.index.intersection(proc.index).intersection(basm.index)
        if not len(common):
            continue
        value, low, high, n = bootstrap_ratio(d.loc[common, "delta"], proc[common] - basm[common], d.loc[common, "task_group"], seed=seed)
        gap = float((proc[common] - basm[common]).mean())
        # A share of a gap that does not exist (BASM not below Proc. Skill) is meaningless.
        if not gap > 0:
            value = low = high = float("nan")
        out.append({"measure": measure, "value": value, "low": low, "high": high, "n": n, "gap": gap,
                    "proc": float(proc[common].mean()), "basm": float(basm[common].mean()), "delta": float(d.loc[common, "delta"].mean())})
    return pd.DataFrame(out, columns=["measure", "value", "low", "high", "n", "gap", "proc", "basm", "delta"])


def summarise_rows(rows: pd.DataFrame, note: str = "", seed: int = 0) -> KnockoutSummary:
    per, dropped, excluded = deltas_per_record(rows)
    deltas = summarise(per, ["config", "bucket", "knockout", "measure"], "delta", seed=seed)
    win = deltas[(deltas["config"] == "basm") & (deltas["bucket"] == "T_wrong") & (deltas["measure"] == "margin") & deltas["knockout"].str.startswith("boundary@")]
    windows = win.assign(window=win["knockout"].str.removeprefix("boundary@"))[["window", "value", "low", "high", "n"]]
    return KnockoutSummary(deltas, gap_recovery(rows, per, seed), windows, per, dropped, control_draws(rows), excluded, note)


def basm_deltas(summary: KnockoutSummary) -> pd.DataFrame:
    """The BASM rows of the summary (the figures' and the paper comparisons'), without ``config``."""
    return summary.deltas[summary.deltas["config"] == "basm"].drop(columns="config")


def priming_table(summary: KnockoutSummary) -> pd.DataFrame:
    """Δ wrong-tool margin of the boundary knockout and its neutral control per configuration: does
    the boundary effect survive when the tool names in B are anonymised, or when only the names remain?"""
    d = summary.deltas
    keep = d[d["knockout"].isin(["boundary", "random"]) & (d["measure"] == "margin")]
    return keep[["bucket", "config", "knockout", "value", "low", "high", "n"]].sort_values(["bucket", "knockout", "config"]).reset_index(drop=True)


def draw_figures(summary: KnockoutSummary, out_dir: Path) -> list[Path]:
    plots.style()
    note = f"{summary.note}\nBASM records without a boundary span excluded: {summary.n_excluded}"
    deltas = basm_deltas(summary)
    paths = plots.save_figure(plots.fig06_knockout_controls(deltas, summary.recovery, summary.windows, note), out_dir, FIGURES[0])
    paths += plots.save_figure(plots.fig07_knockout_selectivity(deltas, note), out_dir, FIGURES[1])
    return paths


def knockout_note(analysis: RunContext) -> str:
    a = analysis.options
    return (f"{provenance(analysis)}\nΔm = m_knockout − m_BASM (signed) at k = {a.k if a.k is not None else a.k_max} · "
            f"rows blocked: {a.knockout_rows} · random: mean of {a.random_draws} spans of |B| positions in the memory block "
            f"{pool_text(a.random_pool)}; "
            f"random anywhere: same-length runs anywhere before the call · paired records per measure · mean ± 95% bootstrap CI over task groups")


def section(analysis: RunContext, summary: KnockoutSummary, paths: list[Path]) -> ReportSection:
    d, r = basm_deltas(summary), summary.recovery
    main = d[d["knockout"].isin(plots.KNOCKOUT_LABELS)][["bucket", "knockout", "measure", "value", "low", "high", "n"]]
    body = (f"Signed shift Δm = m_knockout − m_BASM (logits; `margin` is {analysis.variant}, Eq. 1 on the tool choice by default); "
            f"CIs over task groups. Rows blocked: `{analysis.options.knockout_rows}`. Every knockout and control of a measure is compared "
            f"on the same records. BASM records without a boundary span excluded: {summary.n_excluded}.\n\n{markdown_table(main)}\n\n"
            f"Records left out of a measure's comparison:\n\n{markdown_table(summary.dropped) if len(summary.dropped) else 'none'}\n\n"
            f"How the random controls were drawn (`random`: the memory block {pool_text(analysis.options.random_pool)}, "
            f"the default neutral control; "
            f"`random_anywhere`: anywhere before the call):\n\n{markdown_table(summary.controls)}\n\n"
            f"Share of the Proc. Skill gap recovered by the boundary knockout (T_wrong; CI resamples task groups jointly):\n\n"
            f"{markdown_table(r)}")
    if analysis.options.priming:
        body += ("\n\nLexical-priming controls (Δ wrong-tool margin; `basm-anon`: tool names in B replaced by placeholders, "
                 f"`basm-names`: B reduced to the tool names it mentions):\n\n{markdown_table(priming_table(summary))}")
    if len(summary.windows):
        body += f"\n\nLayer windows (Δ wrong-tool margin, T_wrong):\n\n{markdown_table(summary.windows)}"
    sel = plots.selectivity_table(d)
    comparisons = [
        Comparison("Fig. 6: Δm wrong-tool, boundary knockout (T_wrong)", cell(d, bucket="T_wrong", knockout="boundary", measure="margin"), paper.FIG6_DELTA["margin"]),
        Comparison("Fig. 6: Δm tool-vs-control, boundary knockout (T_wrong)", cell(d, bucket="T_wrong", knockout="boundary", measure="broad_margin"), paper.FIG6_DELTA["broad_margin"]),
        *(Comparison(f"Fig. 6: Proc.–BASM gap recovered, {plots.MEASURE_LABELS[m]}", 100 * cell(r, measure=m), p, "%",
                     f"gap m_Proc − m_BASM = {cell(r, 'gap', measure=m):+.2f} logits" + ("" if cell(r, "gap", measure=m) > 0 else " (≤ 0: undefined)"))
          for m, p in paper.FIG6_RECOVERED.items()),
    ]
    comparisons += [Comparison(f"Fig. 7: selectivity {b}–{'wrong' if m == 'margin' else 'correct'}", cell(sel, cell=c, knockout="boundary"), p,
                               note="paper: Qwen3-14B")
                    for (b, m, c), p in zip(plots.SELECTIVITY, paper.FIG7_SELECTIVITY)]
    return ReportSection(NAME, "Figs. 3c/d, 6, 7 — same-prompt knockout (`knockout`)", paths, body, comparisons, summary)


def print_summary(summary: KnockoutSummary) -> None:
    print(basm_deltas(summary).round(3).to_string(index=False))
    if set(summary.deltas["config"]) != {"basm"}:
        print("lexical-priming controls (Δ wrong-tool margin):\n" + priming_table(summary).round(3).to_string(index=False))
    for r in summary.recovery.itertuples():
        print(f"gap recovered ({r.measure}): {100 * r.value:.1f}% [{100 * r.low:.1f}, {100 * r.high:.1f}] "
              f"(Proc {r.proc:.2f}, BASM {r.basm:.2f}, Δm boundary {r.delta:+.2f}; n = {r.n} task groups)")
    print(f"BASM records without a boundary span (excluded): {summary.n_excluded}")
    print("records left out of a measure's paired comparison:\n" + (summary.dropped.to_string(index=False) if len(summary.dropped) else "none"))
    print("random controls:\n" + summary.controls.round(3).to_string(index=False))


@dataclass(kw_only=True)
class KnockoutAnalysis(Analysis):
    """Figs. 3c/d, 6, 7: same-prompt knockout of the deciding rows' attention to the boundary span, with controls."""

    name: ClassVar[str] = NAME
    help: ClassVar[str] = "Figs. 3c/d, 6, 7: same-prompt knockout of deciding-row → boundary attention, with controls."

    buckets: tuple[str, ...] | None = option(("T_wrong", "T_ok"), "keep only these buckets", flag="--bucket",
                                             repeat=True, choices=("T_ok", "T_wrong", "T_repair"), group="items")
    k: int | None = option(None, "retrieval depth (default: k_max)", type=int, minimum=0, group="probe")
    random_draws: int = option(DEFAULT_DRAWS, "random spans per record and control", type=int, minimum=1)
    layer_window: int | None = option(None, "also knock out B in windows of this many consecutive layers", type=int, minimum=1)
    random_pool: str = option("memory+procedure", "where the neutral random spans are drawn: the memory block outside B (the share "
                              "on P is recorded) or outside B and P (often shorter than B)", choices=RANDOM_POOLS)
    priming: bool = option(False, f"also knock out on the lexical-priming controls ({', '.join(PRIMING_CONFIGS)}): tool names in "
                           "the boundary items anonymised, or only the names kept", type=bool)
    knockout_rows: str = option("path", "rows blocked: path (every row from the open row to the decision row and the candidate "
                                "name rows, so a shared name prefix is covered) or endpoints (open and decision rows only)",
                                choices=KNOCKOUT_ROWS)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        return collect(ctx)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> KnockoutSummary:
        return summarise_rows(rows, knockout_note(ctx), ctx.options.seed)

    def tables(self, summary: KnockoutSummary) -> dict[str, pd.DataFrame]:
        tables = {f"{NAME}_summary": summary.deltas, f"{NAME}_gap_recovery": summary.recovery}
        if set(summary.deltas["config"]) != {"basm"}:
            tables[f"{NAME}_priming"] = priming_table(summary)
        return tables

    def figures(self, summary: KnockoutSummary, out_dir: Path) -> list[Path]:
        return draw_figures(summary, out_dir)

    def section(self, ctx: RunContext, summary: KnockoutSummary, figures: list[Path]) -> ReportSection:
        return section(ctx, summary, figures)

    def print_summary(self, summary: KnockoutSummary) -> None:
        print_summary(summary)
