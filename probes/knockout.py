"""``knockout`` (Figs. 3c/d, 6 and 7): same-prompt knockout of decision-token → boundary attention.

The prompt tokens stay fixed (BASM at depth k); only attention from the query rows to a span is
removed (its scores set to −inf before the softmax, so each row renormalises over the rest), in
every layer and head unless a layer window is given. In the native format the query rows are the
decision row d_t and the row that opens the tool call (the native margins read both).

Conditions, all evaluated in one cached-branching engine call per record:

- ``boundary``: the boundary span B;
- ``random_i`` (i < ``--random-draws``): a random span of the same length: blocks of the same
  lengths as B's blocks, placed uniformly at random, non-overlapping, among the prompt positions
  before the first query row, excluding B and token 0 (the attention sink); seeded by
  (seed, record, draw), so draws do not depend on run order. Their per-record mean is the
  ``random`` control;
- ``procedure``: the procedure span P;
- ``boundary@La-b`` (with ``--layer-window W``): B knocked out only in layers a..b (windows of
  W consecutive layers).

Reported: the signed shift Δm = m_knockout − m_baseline for the wrong-tool, broad (tool-vs-control)
and correct-tool margins, split as T_wrong–wrong, T_wrong–correct, T_ok–correct (Fig. 7); and the
share of the Proc. Skill gap that the boundary knockout recovers on T_wrong,
mean Δm_boundary / (mean m_Proc − mean m_BASM), with a 95% CI from resampling task groups jointly
for numerator and denominator. Records whose boundary span is empty (the relevance gate γ exposed
no boundary field) are excluded and counted.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probes import plots
from probes.analysis import (
    Analysis,
    Comparison,
    Job,
    ReportSection,
    add_common_arguments,
    bootstrap_ratio,
    cached_scorer,
    cell,
    markdown_table,
    open_analysis,
    provenance,
    record_rng,
    run_jobs,
    summarise,
)
from probes.engine import Knockout, span_positions
from probes.results import load_results

NAME = "knockout"
FIGURES = ("fig06_knockout_controls", "fig07_knockout_selectivity")
MEASURES = ("margin", "broad_margin", "correct_margin")
DEFAULT_DRAWS = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, k_max=2, buckets=("T_wrong", "T_ok"))
    parser.add_argument("--k", type=int, help="retrieval depth (default: --k-max)")
    parser.add_argument("--random-draws", type=int, default=DEFAULT_DRAWS, help=f"random same-length spans per record (default: {DEFAULT_DRAWS})")
    parser.add_argument("--layer-window", type=int, help="also knock out B in windows of this many consecutive layers")


def random_span(record: dict[str, Any], blocks: Sequence[Sequence[int]], rng: np.random.Generator) -> list[int]:
    """Positions of a random span with the blocks' lengths (see the module docstring)."""
    end = min(record["query_rows"])
    taken = np.zeros(end, dtype=bool)
    taken[0] = True
    taken[[p for p in span_positions(blocks) if p < end]] = True
    out: list[int] = []
    for length in rng.permutation([e - s for s, e in blocks]):
        # starts whose whole block is free: a run-length test over the free mask
        free = ~taken
        window = np.convolve(free.astype(int), np.ones(length, dtype=int), mode="valid") == length
        starts = np.flatnonzero(window)
        if len(starts):
            s = int(rng.choice(starts))
            chosen = list(range(s, s + length))
        else:  # no contiguous room left: scattered free positions of the same count
            chosen = sorted(rng.choice(np.flatnonzero(free), size=min(length, int(free.sum())), replace=False).tolist())
        taken[chosen] = True
        out += chosen
    return sorted(out)


def layer_windows(n_layers: int, width: int) -> list[tuple[int, ...]]:
    return [tuple(range(a, min(a + width, n_layers))) for a in range(0, n_layers, width)]


def condition_names(draws: int, windows: Sequence[Sequence[int]]) -> tuple[str, ...]:
    return ("baseline", "boundary", *(f"random_{i}" for i in range(draws)), "procedure",
            *(f"boundary@L{w[0]}-{w[-1]}" for w in windows))


def conditions_for(analysis: Analysis, windows: Sequence[Sequence[int]]):
    def build(record: dict[str, Any], job: Job) -> list[Knockout]:
        if job.config != "basm":
            return []
        blocks = record["spans"].get("boundary", [])
        out = [Knockout.from_spans("boundary", blocks)]
        for i in range(analysis.args.random_draws):
            out.append(Knockout(f"random_{i}", tuple(random_span(record, blocks, record_rng(analysis.args.seed, record["record_id"], f"random_{i}")))))
        out.append(Knockout.from_spans("procedure", record["spans"].get("procedure", [])))
        out += [Knockout.from_spans(f"boundary@L{w[0]}-{w[-1]}", blocks, layers=w) for w in windows]
        return out

    return build


def collect(analysis: Analysis) -> pd.DataFrame:
    a = analysis.args
    k = a.k if a.k is not None else a.k_max
    windows = layer_windows(analysis.session.n_layers, a.layer_window) if a.layer_window else []
    names = condition_names(a.random_draws, windows)
    jobs = []
    for item in analysis.items:
        jobs.append(Job(item, "basm", k, analysis.fmt, names))
        if item.bucket == "T_wrong":  # the Proc. Skill reference of the gap
            jobs.append(Job(item, "proc", k, analysis.fmt, ("baseline",)))
    store = analysis.store(k=k, random_draws=a.random_draws, layer_windows=[list(w) for w in windows],
                           random_span="same block lengths, before the first query row, excluding B and token 0")
    run_jobs(analysis, store, jobs, cached_scorer(analysis, conditions_for(analysis, windows), margins=MEASURES))
    return load_results(store.path)


@dataclass
class KnockoutSummary:
    deltas: pd.DataFrame  # bucket, knockout, measure, value, low, high, n, n_items, n_nan
    recovery: pd.DataFrame  # measure, value, low, high, n (share of the Proc.–BASM gap, T_wrong)
    windows: pd.DataFrame  # window, value, low, high, n (Δ wrong-tool margin on T_wrong)
    per_record: pd.DataFrame  # item_id, bucket, task_group, knockout, measure, delta
    n_excluded: int  # BASM records without a boundary span
    note: str


def deltas_per_record(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Δm per (BASM record, knockout, measure); random draws also averaged into ``random``."""
    basm = rows[rows["config"] == "basm"]
    excluded = basm[(basm["condition"] == "baseline") & (basm["boundary_size"] == 0)]["record_id"]
    basm = basm[~basm["record_id"].isin(set(excluded))]
    base = basm[basm["condition"] == "baseline"].set_index("record_id")
    out = []
    for measure in MEASURES:
        knocked = basm[basm["condition"] != "baseline"]
        delta = knocked[measure].to_numpy(float) - base.loc[knocked["record_id"], measure].to_numpy(float)
        frame = knocked[["record_id", "item_id", "bucket", "task_group", "condition"]].assign(measure=measure, delta=delta)
        frame["knockout"] = frame["condition"].where(~frame["condition"].str.startswith("random_"), "random")
        out.append(frame)
    per = pd.concat(out, ignore_index=True) if out else pd.DataFrame()
    # one value per record for the random control: the mean over its draws
    per = per.groupby(["record_id", "item_id", "bucket", "task_group", "knockout", "measure"], as_index=False, sort=False)["delta"].mean()
    return per, int(len(excluded))


def gap_recovery(rows: pd.DataFrame, per: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Share of the Proc. Skill gap (m_Proc − m_BASM, T_wrong) recovered by the boundary knockout."""
    out = []
    wrong = rows[(rows["bucket"] == "T_wrong") & (rows["condition"] == "baseline")]
    for measure in ("margin", "broad_margin"):
        proc = wrong[wrong["config"] == "proc"].set_index("item_id")[measure]
        basm = wrong[wrong["config"] == "basm"].set_index("item_id")[measure]
        d = per[(per["bucket"] == "T_wrong") & (per["knockout"] == "boundary") & (per["measure"] == measure)].set_index("item_id")
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
    per, excluded = deltas_per_record(rows)
    deltas = summarise(per, ["bucket", "knockout", "measure"], "delta", seed=seed)
    win = deltas[(deltas["bucket"] == "T_wrong") & (deltas["measure"] == "margin") & deltas["knockout"].str.startswith("boundary@")]
    windows = win.assign(window=win["knockout"].str.removeprefix("boundary@"))[["window", "value", "low", "high", "n"]]
    return KnockoutSummary(deltas, gap_recovery(rows, per, seed), windows, per, excluded, note)


def figures(summary: KnockoutSummary, out_dir: Path) -> list[Path]:
    plots.style()
    note = f"{summary.note}\nBASM records without a boundary span excluded: {summary.n_excluded}"
    paths = plots.save_figure(plots.fig06_knockout_controls(summary.deltas, summary.recovery, summary.windows, note), out_dir, FIGURES[0])
    paths += plots.save_figure(plots.fig07_knockout_selectivity(summary.deltas, note), out_dir, FIGURES[1])
    return paths


def knockout_note(analysis: Analysis) -> str:
    a = analysis.args
    return (f"{provenance(analysis)}\nΔm = m_knockout − m_BASM (signed) at k = {a.k if a.k is not None else a.k_max} · "
            f"random: mean of {a.random_draws} same-length spans · mean ± 95% bootstrap CI over task groups")


def run(args: argparse.Namespace) -> int:
    analysis = open_analysis(args, NAME)
    summary = summarise_rows(collect(analysis), knockout_note(analysis), analysis.args.seed)
    summary.deltas.to_csv(analysis.out_dir / f"{NAME}_summary.csv", index=False)
    summary.recovery.to_csv(analysis.out_dir / f"{NAME}_gap_recovery.csv", index=False)
    print(summary.deltas.round(3).to_string(index=False))
    for r in summary.recovery.itertuples():
        print(f"gap recovered ({r.measure}): {100 * r.value:.1f}% [{100 * r.low:.1f}, {100 * r.high:.1f}] "
              f"(Proc {r.proc:.2f}, BASM {r.basm:.2f}, Δm boundary {r.delta:+.2f}; n = {r.n} task groups)")
    print(f"BASM records without a boundary span (excluded): {summary.n_excluded}")
    if analysis.args.figure:
        print("figures:", ", ".join(map(str, figures(summary, analysis.out_dir / "figures"))))
    return 0


def report_section(analysis: Analysis, figures_dir: Path) -> ReportSection:
    summary = summarise_rows(collect(analysis), knockout_note(analysis), analysis.args.seed)
    paths = figures(summary, figures_dir)
    d, r = summary.deltas, summary.recovery
    main = d[d["knockout"].isin(plots.KNOCKOUT_LABELS)][["bucket", "knockout", "measure", "value", "low", "high", "n"]]
    body = (f"Signed shift Δm = m_knockout − m_BASM (logits, {analysis.variant}); CIs over task groups. "
            f"BASM records without a boundary span excluded: {summary.n_excluded}.\n\n{markdown_table(main)}\n\n"
            f"Share of the Proc. Skill gap recovered by the boundary knockout (T_wrong; CI resamples task groups jointly):\n\n"
            f"{markdown_table(r)}")
    if len(summary.windows):
        body += f"\n\nLayer windows (Δ wrong-tool margin, T_wrong):\n\n{markdown_table(summary.windows)}"
    sel = plots.selectivity_table(d)
    comparisons = [
        Comparison("Fig. 6: Δm wrong-tool, boundary knockout (T_wrong)", cell(d, bucket="T_wrong", knockout="boundary", measure="margin"), 3.45),
        Comparison("Fig. 6: Δm tool-vs-control, boundary knockout (T_wrong)", cell(d, bucket="T_wrong", knockout="boundary", measure="broad_margin"), 3.65),
        *(Comparison(f"Fig. 6: Proc.–BASM gap recovered, {plots.MEASURE_LABELS[m]}", 100 * cell(r, measure=m), p, "%",
                     f"gap m_Proc − m_BASM = {cell(r, 'gap', measure=m):+.2f} logits" + ("" if cell(r, "gap", measure=m) > 0 else " (≤ 0: undefined)"))
          for m, p in (("margin", 69.4), ("broad_margin", 41.0))),
    ]
    comparisons += [Comparison(f"Fig. 7: selectivity {b}–{'wrong' if m == 'margin' else 'correct'}", cell(sel, cell=c, knockout="boundary"), p,
                               note="paper: Qwen3-14B")
                    for (b, m, c), p in zip(plots.SELECTIVITY, (0.27, 0.04, -0.11))]
    return ReportSection(NAME, "Figs. 3c/d, 6, 7 — same-prompt knockout (`knockout`)", paths, body, comparisons, summary)
