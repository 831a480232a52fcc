"""``heads`` (Figs. 8 and 9): where the boundary signal appears, and whether those heads matter.

1. **Map.** For BASM at depth k, per (layer, head): log2((ᾱ_B + ε) / (ᾱ_P + ε)), with ᾱ Eq. 2's
   length-normalised attention from the decision row averaged over the items of a bucket
   (a ratio of means per head; never a mean of per-item ratios). Fig. 8 shows it on T_wrong.
2. **Ranking.** Heads ranked by the increase of that log-ratio from T_ok to T_wrong (Fig. 9),
   among the heads whose decision row reads the spans at all: mean attention mass on B ∪ P
   (ᾱ_B·|B| + ᾱ_P·|P|) of at least ``--min-span-mass`` in both buckets. A head that reads neither
   span has an ε-dominated ratio, whose shift can be large and means nothing (in an experimental
   organism a head that reads the request ranked first, +4.19, with ~0.01 of its attention on
   B ∪ P); such heads are listed after the ranked ones, ``ranked`` false.
3. **Causal check.** On T_wrong, decision-token → boundary attention is knocked out only in the
   top-N heads, versus N random heads (``--random-draws`` head sets, drawn once with ``--seed``
   from all heads, the same sets for every record). Δm = m_knockout − m_BASM for the wrong-tool
   margin, mean with a 95% bootstrap CI over task groups. The head lists are part of the causal
   results' recorded configuration, so a changed ranking never mixes with old rows.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from probes import plots
from probes.analysis import (
    EPSILON,
    Analysis,
    Comparison,
    Job,
    ReportSection,
    add_common_arguments,
    cached_scorer,
    markdown_table,
    open_analysis,
    provenance,
    run_jobs,
    summarise,
)
from probes.engine import Knockout
from probes.ratios import head_alphas
from probes.results import load_results

NAME = "heads"
FIGURES = ("fig08_head_heatmap", "fig09_candidate_heads")
DEFAULT_TOP = 4
DEFAULT_DRAWS = 3
MIN_SPAN_MASS = 0.05  # attention mass on B ∪ P a head's decision row needs (both buckets) to be ranked


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, k_max=2, buckets=("T_ok", "T_wrong"))
    parser.add_argument("--k", type=int, help="retrieval depth (default: --k-max)")
    parser.add_argument("--top-n", type=int, default=DEFAULT_TOP, help=f"heads in the causal check (default: {DEFAULT_TOP})")
    parser.add_argument("--random-draws", type=int, default=DEFAULT_DRAWS, help=f"random head sets (default: {DEFAULT_DRAWS})")
    parser.add_argument("--min-span-mass", type=float, default=MIN_SPAN_MASS,
                        help=f"rank only heads whose decision row puts this much attention on boundary ∪ procedure (default: {MIN_SPAN_MASS})")
    parser.add_argument("--no-causal", dest="causal", action="store_false", help="skip the knockout check of the ranking")


def depth(args: argparse.Namespace) -> int:
    return args.k if args.k is not None else args.k_max


def collect_attention(analysis: Analysis) -> pd.DataFrame:
    k = depth(analysis.args)
    jobs = [Job(item, "basm", k, analysis.fmt, ("baseline",)) for item in analysis.items]
    store = analysis.store(k=k)
    run_jobs(analysis, store, jobs, cached_scorer(analysis, lambda record, job: (), per_head=True, margins=()))
    return load_results(store.path)


def bucket_rows(rows: pd.DataFrame, bucket: str) -> pd.DataFrame:
    """The BASM rows of ``bucket`` that show both spans."""
    return rows[(rows["bucket"] == bucket) & (rows["boundary_size"] > 0) & (rows["procedure_size"] > 0)]


def log2_map(rows: pd.DataFrame, bucket: str) -> np.ndarray:
    """[layer, head] log2 ratio of item-averaged α on ``bucket`` (NaN-filled if absent)."""
    sub = bucket_rows(rows, bucket)
    if not len(sub):
        return np.array([[np.nan]])
    return np.log2((head_alphas(sub, "boundary").mean(0) + EPSILON) / (head_alphas(sub, "procedure").mean(0) + EPSILON))


def span_mass_map(rows: pd.DataFrame, bucket: str) -> np.ndarray:
    """[layer, head] the decision row's attention mass on B ∪ P (α_B·|B| + α_P·|P|), mean over the items of ``bucket``."""
    sub = bucket_rows(rows, bucket)
    if not len(sub):
        return np.array([[np.nan]])
    sizes = {span: sub[f"{span}_size"].to_numpy(float)[:, None, None] for span in ("boundary", "procedure")}  # [item, 1, 1]
    return (head_alphas(sub, "boundary") * sizes["boundary"] + head_alphas(sub, "procedure") * sizes["procedure"]).mean(0)


def ranking(rows: pd.DataFrame, min_span_mass: float = MIN_SPAN_MASS) -> pd.DataFrame:
    """layer, head, log2 ratio on T_ok and T_wrong, shift = T_wrong − T_ok, span_mass (the smaller bucket
    mean of the mass on B ∪ P) and ranked (span_mass ≥ ``min_span_mass``): the ranked heads by
    descending shift, then the others."""
    ok, wrong = log2_map(rows, "T_ok"), log2_map(rows, "T_wrong")
    if ok.shape != wrong.shape:
        return pd.DataFrame(columns=["layer", "head", "log2_ok", "log2_wrong", "shift", "span_mass", "ranked"])
    layers, heads = np.indices(ok.shape)
    span_mass = np.minimum(span_mass_map(rows, "T_ok"), span_mass_map(rows, "T_wrong"))
    table = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "log2_ok": ok.ravel(), "log2_wrong": wrong.ravel(),
                          "shift": (wrong - ok).ravel(), "span_mass": span_mass.ravel(), "ranked": (span_mass >= min_span_mass).ravel()})
    order = ["ranked", "shift", "layer", "head"]
    return table.sort_values(order, ascending=[False, False, True, True], kind="stable").reset_index(drop=True)


def head_sets(rank: pd.DataFrame, n_layers: int, n_heads: int, top: int, draws: int, seed: int) -> dict[str, list[tuple[int, int]]]:
    """``top-N``: the ranking's first N heads; ``random-N #i``: N heads drawn from all heads."""
    top = min(top, n_layers * n_heads)
    sets = {f"top-{top}": [(int(r.layer), int(r.head)) for r in rank.head(top).itertuples()]}
    rng = np.random.default_rng(seed)
    for i in range(draws):
        flat = rng.choice(n_layers * n_heads, size=top, replace=False)
        sets[f"random-{top} #{i}"] = sorted((int(f // n_heads), int(f % n_heads)) for f in flat)
    return sets


def collect_causal(analysis: Analysis, sets: dict[str, list[tuple[int, int]]]) -> pd.DataFrame:
    k = depth(analysis.args)
    names = {name: f"heads_{i}" for i, name in enumerate(sets)}

    def conditions(record, job):
        blocks = record["spans"].get("boundary", [])
        return [Knockout.from_spans(names[name], blocks, heads=heads) for name, heads in sets.items()]

    causal = replace(analysis, name=f"{NAME}_causal", _score_cache={})
    jobs = [Job(item, "basm", k, analysis.fmt, ("baseline", *names.values())) for item in analysis.items if item.bucket == "T_wrong"]
    store = causal.store(k=k, head_sets={names[n]: [n, [list(h) for h in hs]] for n, hs in sets.items()})
    run_jobs(causal, store, jobs, cached_scorer(causal, conditions, margins=("margin",)))
    rows = load_results(store.path)
    return rows.assign(selection=rows["condition"].map({v: k for k, v in names.items()}))


@dataclass
class HeadsSummary:
    heatmap: np.ndarray  # [layer, head] log2 ratio on T_wrong
    ranking: pd.DataFrame
    causal: pd.DataFrame  # selection, value, low, high, n
    top: int
    note: str


def causal_table(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Δ wrong-tool margin per head set; the random sets also pooled per record into ``random-N``."""
    rows = rows[rows["boundary_size"] > 0]
    base = rows[rows["condition"] == "baseline"].set_index("record_id")["margin"]
    knocked = rows[rows["condition"] != "baseline"].copy()
    knocked["delta"] = knocked["margin"].to_numpy(float) - base.loc[knocked["record_id"]].to_numpy(float)
    knocked["selection"] = knocked["selection"].str.replace(r" #\d+$", "", regex=True)
    per = knocked.groupby(["record_id", "task_group", "selection"], as_index=False, sort=False)["delta"].mean()
    return summarise(per, ["selection"], "delta", seed=seed)


def summarise_rows(rows: pd.DataFrame, causal_rows: pd.DataFrame | None, top: int, note: str = "", seed: int = 0,
                   min_span_mass: float = MIN_SPAN_MASS) -> HeadsSummary:
    causal = causal_table(causal_rows, seed) if causal_rows is not None and len(causal_rows) else pd.DataFrame()
    return HeadsSummary(log2_map(rows, "T_wrong"), ranking(rows, min_span_mass), causal, top, note)


def figures(summary: HeadsSummary, out_dir: Path, k: int) -> list[Path]:
    plots.style()
    title = f"BASM, {plots.bucket_label('T_wrong')}, k = {k}: log2(boundary / procedure attention)"
    paths = plots.save_figure(plots.fig08_head_heatmap(summary.heatmap, summary.note, title), out_dir, FIGURES[0])
    paths += plots.save_figure(plots.fig09_candidate_heads(summary.ranking, summary.causal, summary.top, summary.note), out_dir, FIGURES[1])
    return paths


def compute(analysis: Analysis) -> HeadsSummary:
    """Map and ranking, then (unless ``--no-causal``) the knockout check of the ranking."""
    a = analysis.args
    rows = collect_attention(analysis)
    rank = ranking(rows, a.min_span_mass)
    causal_rows = None
    if a.causal and len(rank) and rank["shift"].notna().any():
        causal_rows = collect_causal(analysis, head_sets(rank, analysis.session.n_layers, analysis.session.n_heads, a.top_n, a.random_draws, a.seed))
    return summarise_rows(rows, causal_rows, a.top_n, heads_note(analysis), a.seed, a.min_span_mass)


def heads_note(analysis: Analysis) -> str:
    a, s = analysis.args, analysis.session
    return (f"{provenance(analysis)}\nper head: log2((ᾱ_B + ε)/(ᾱ_P + ε)), ᾱ averaged over items (ratio of means), ε = {EPSILON:g} · "
            f"ranked: heads with attention mass ≥ {a.min_span_mass:g} on B ∪ P in both buckets · "
            f"causal: Δ wrong-tool margin, boundary knockout in the top-{min(a.top_n, s.n_layers * s.n_heads)} heads "
            f"vs random head sets ({a.random_draws} draws, pooled)")


def report_section(analysis: Analysis, figures_dir: Path) -> ReportSection:
    summary = compute(analysis)
    paths = figures(summary, figures_dir, depth(analysis.args))
    body = (f"Heads ranked by the T_ok → T_wrong increase of log2(boundary/procedure attention) (BASM, k = {depth(analysis.args)}):\n\n"
            f"{markdown_table(summary.ranking.head(10))}")
    if len(summary.causal):
        body += f"\n\nCausal check (Δ wrong-tool margin, boundary knockout in these heads only, T_wrong):\n\n{markdown_table(summary.causal)}"
    comparisons = [Comparison(f"Fig. 9: Δm, boundary knockout in {r.selection} heads", float(r.value), None) for r in summary.causal.itertuples()]
    return ReportSection(NAME, "Figs. 8/9 — boundary heads (`heads`)", paths, body, comparisons, summary)


def run(args: argparse.Namespace) -> int:
    analysis = open_analysis(args, NAME)
    summary = compute(analysis)
    summary.ranking.to_csv(analysis.out_dir / f"{NAME}_ranking.csv", index=False)
    summary.causal.to_csv(analysis.out_dir / f"{NAME}_causal_summary.csv", index=False)
    print(summary.ranking.head(10).round(3).to_string(index=False))
    if len(summary.causal):
        print(summary.causal.round(3).to_string(index=False))
    if analysis.args.figure:
        print("figures:", ", ".join(map(str, figures(summary, analysis.out_dir / "figures", depth(analysis.args)))))
    return 0
