"""``report``: run the chosen analyses on one loaded model; write the figures (PNG + PDF, named
after the paper's figures) and ``report.md`` with our numbers next to the paper's.

Each analysis gets the report's shared options (model and session options, format, margin
variant, builder, item filters, seed, ``quick``, ``out``...) and keeps its own defaults for the
rest, and for ``k_max`` and ``buckets`` unless they are given to the report. So a section
reproduces exactly what the analysis's own run computes, and reuses its resumable results in the
same folders (``OUT/<model>/<analysis>/``, :mod:`probes.reporting.layout`).

An analysis module that cannot be imported is an error before anything runs; an analysis that
fails (:class:`~probes.analyses.run_context.AnalysisError`) is reported in ``report.md`` and on the
console, and makes the status non-zero.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probes import analyses as registry
from probes.analyses.base import Analysis, AnalysisResult, Comparison, ReportSection
from probes.analyses.option_system import RunOptions, SPLIT_CHOICES, option, option_fields
from probes.analyses.run_context import (
    AnalysisError,
    RunContext,
    default_model,
    model_label,
    open_context,
    open_session,
    provenance,
    require_session,
    split_label,
)
from probes.analyses.explore import SHOWN as EXPLORED
from probes.analyses.explore import ExploreOptions, write_explore
from probes.analyses.knockout import NAME as KNOCKOUT
from probes.analyses.knockout import basm_deltas, caption, knockout_labels, knockout_panel, selectivity_panel
from probes.analyses.parallel import rank_device, world
from probes.analyses.ratios import eta_panels
from probes.analyses.suppression import NAME as SUPPRESSION
from probes.analyses.suppression import margin_bars
from probes.analyses.sweep import NAME as SWEEP
from probes.core.files import check_inside, write_csv, write_text
from probes.engine.session import EngineSession
from probes.engine.threads import keeps_caller_threads
from probes.reporting import plots
from probes.reporting.layout import CLAIMS, FIGURES, PAGE, REPORT, analysis_folder, check_layout, figures_folder
from probes.reporting.markdown import markdown_table
from probes.reporting.results import environment
from probes.scoring.claims import ALPHA, claims_table, holds, sign_flip_floor

# Shared options set on an analysis only when given to the report (else it keeps its own default).
IF_GIVEN: tuple[str, ...] = ("k_max", "buckets", "split")
# The report's own options that go to every analysis with an option of that name (calls' checker G).
TO_ANALYSES: tuple[str, ...] = ("checker",)


def forwarded(report: ReportOptions, cls: type[Analysis]) -> dict[str, Any]:
    """The options of ``report`` that the analysis ``cls`` receives: every shared option (so none is
    accepted and then dropped; tests/analyses/test_report.py checks each arrives), ``k_max`` and
    ``buckets`` and ``split`` only when given, and :data:`TO_ANALYSES` where ``cls`` has them."""
    shared = {f.name for f in option_fields(RunOptions)}
    out = {name: getattr(report, name) for name in shared if name not in IF_GIVEN}
    out |= {name: getattr(report, name) for name in IF_GIVEN if getattr(report, name) is not None}
    own = {f.name for f in option_fields(cls)}
    out |= {name: getattr(report, name) for name in TO_ANALYSES if name in own}
    return out


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.1f}%" if unit == "%" else f"{value:+.2f}" if unit == "logits" else f"{value:.2f}"


def differences_from_paper(c: Comparison, model: str, variant: str) -> str:
    """Why a comparison with the paper is not like-for-like ("" if it is): another model, another
    margin than the paper's Eq. 1, and always other items (the paper's probe items are not public)."""
    paper_model = "Qwen3-14B" if "Qwen3-14B" in c.note else "Qwen3-8B"
    reasons = [] if paper_model.lower() in Path(str(model)).name.lower() else [f"model is not {paper_model}"]
    if c.unit in ("logits", "%") and c.quantity.startswith(("Fig. 2", "Fig. 5", "Fig. 6", "Fig. 7")) and variant != "eq1":
        reasons.append(f"margin `{variant}`, not Eq. 1 verbatim (abstention items left out)")
    reasons.append("items: this suite's, not the paper's")
    return "; ".join(reasons)


def comparison_table(comparisons: list[Comparison], model: str, variant: str) -> str:
    lines = ["| quantity | ours | paper | unit | not like-for-like because | note |", "|---|---|---|---|---|---|"]
    lines += [f"| {c.quantity} | {_fmt(c.ours, c.unit)} | {_fmt(c.paper, c.unit)} | {c.unit} | "
              f"{differences_from_paper(c, model, variant) if c.paper is not None else '—'} | {c.note} |" for c in comparisons]
    return "\n".join(lines)


def mechanism_figure(sections: dict[str, ReportSection], figures_dir: Path, note: str) -> list[Path]:
    """Fig. 3 (four panels) from the ratios, suppression and knockout summaries; its footer says what
    each panel plots (items and task groups), read from the plotted tables."""
    if not {"ratios", "suppression", "knockout"} <= set(sections):
        return []
    plots.style()
    k = sections["knockout"].summary
    eta = sections["ratios"].summary.eta
    eta = eta[eta["row"] == "deciding"]
    suppression = sections["suppression"].summary.table
    basm_eta = eta[eta["config"] == "basm"]
    panels = [
        "(a) η, BASM: " + ", ".join(f"{r.bucket} {int(r.n_items)} records / {int(r.n)} groups" for r in basm_eta.itertuples()),
        "(b) T_wrong margins: " + (f"{int(suppression['n_items'].max())} items / {int(suppression['n'].max())} groups per configuration"
                                   if len(suppression) else "none"),
        f"(c, d) knockout: {caption(k).splitlines()[0]}; how each control was drawn: report.md, knockout section",
    ]
    fig = fig03_mechanism(eta, suppression, basm_deltas(k), k.recovery, note + "\n" + "\n".join(panels), labels=knockout_labels(k))
    return plots.save_figure(fig, figures_dir, "fig03_mechanism")


CLAIMS_INTRO = (
    "Every claim this report makes, with its estimate, 95% CI over task groups, one-sided sign-flip permutation p "
    "(`p_floor`: the smallest p its task groups allow) and the p adjusted by Holm within its family (`p_holm`, over "
    "`family_size` tests). An effect *holds* only when `p_holm` < 0.05 and its CI excludes 0 on the claimed side and, "
    "where its family states a smallest effect of interest (`sesoi`, one δ per family, fixed before the run), a "
    "minimum-effect test also places it beyond δ (`p_min_holm` < 0.05); shown but not beyond δ, it is *detectable*, "
    "not holding. An absence claim (kind `absence`) holds only when two one-sided tests place it within ±`sesoi` "
    "(TOST). A family whose Holm-adjusted floor (`p_floor` × `family_size`) is not below 0.05 is *untestable*: no "
    "outcome could hold. Exploratory rows (`exploratory`: strata and checks not fixed before the run) are tested the "
    "same way but never hold. Anything else is worded as not detected / not shown, with the power against `sesoi` "
    "where one is stated. The same table is `claims.csv`; `docs/statistics.md` gives each analysis's estimand, "
    "resampling unit and controls.")

CLAIM_COLUMNS = ["family", "name", "kind", "statement", "estimate", "low", "high", "n", "unit", "p", "p_floor", "p_holm", "family_size",
                 "sesoi", "p_min_holm", "exploratory", "verdict"]


def claims_headline(table: pd.DataFrame) -> str:
    """How many confirmatory claims hold (:func:`~probes.scoring.claims.holds`), and the exploratory rows
    apart: a significant exploratory row is never counted as holding."""
    exploratory = table["exploratory"].astype(bool)
    confirmatory = table[~exploratory]
    held = sum(holds(v) for v in confirmatory["verdict"])
    untestable = int(confirmatory["verdict"].str.startswith("untestable").sum())
    significant = int(table.loc[exploratory, "verdict"].str.startswith("exploratory: significant").sum())
    return (f"**{held} of {len(confirmatory)} confirmatory claims hold** ({untestable} untestable with this run's task groups). "
            f"{int(exploratory.sum())} exploratory rows are listed apart from that count ({significant} significant after Holm, "
            "none a finding).")


# --- the headline: report.md's first paragraph and the console's end, quoted from the claims table
def claim_row(claims: pd.DataFrame, family: str, name: str) -> pd.Series | None:
    """The claim ``name`` of ``family`` (None: that analysis did not run or made no such claim)."""
    rows = claims[(claims["family"] == family) & (claims["name"] == name)] if len(claims) else claims
    return rows.iloc[0] if len(rows) else None


def deepest(claims: pd.DataFrame, family: str, contrast: str) -> pd.Series | None:
    """The sweep's ``contrast`` claim (``trap`` / ``suppression``) at its deepest k."""
    names = claims.loc[claims["family"] == family, "name"] if len(claims) else pd.Series(dtype=str)
    depths = [int(n.rsplit("=", 1)[1]) for n in names if n.startswith(f"{contrast} k=")]
    return claim_row(claims, family, f"{contrast} k={max(depths)}") if depths else None


def quoted(row: pd.Series) -> str:
    """A claim's estimate as the headline quotes it: the cells of its row, rounded to two decimals; an
    untestable verdict in one word (the smoke-test sentence says why)."""
    n = f"{int(row['n'])} {row['n_of']}"
    ci = f"95% CI {row['low']:+.2f} to {row['high']:+.2f} over {n}" if np.isfinite([row["low"], row["high"]]).all() else f"no CI: {n}"
    verdict = "untestable here" if row["verdict"].startswith("untestable at") else row["verdict"]
    return f"{row['estimate']:+.2f} {row['unit']} ({ci}; {verdict})"


def control_words(row: pd.Series) -> str:
    """What a knockout comparison sets B against, from its statement ("... more than |B| positions anywhere before the call")."""
    found = re.search(r"more than (.+?)(?: \(|;|$)", row["statement"])
    return found[1] if found else row["name"].split(">", 1)[1]


def holm_size(claims: pd.DataFrame, row: pd.Series) -> int:
    """The number of claims Holm corrects ``row``'s over: as recorded, or, where none of its family could be
    tested (one task group: no p), the claims of its family that have records."""
    if row["family_size"] >= 1:
        return int(row["family_size"])
    return int(((claims["family"] == row["family"]) & (claims["n"] >= 1)).sum())


def groups_needed(family_size: int, alpha: float = ALPHA) -> int:
    """The fewest task groups whose sign-flip floor, Holm-adjusted over ``family_size``, is below ``alpha``."""
    return next(n for n in itertools.count(1) if sign_flip_floor(n) * family_size < alpha)


def headline(claims: pd.DataFrame, *, rerun: str, available: int | None = None) -> list[str]:
    """A few plain sentences from the claims table (:func:`claims_table`): the retrieval trap and the
    boundary suppression (sweep, at its deepest k; the suppression analysis where sweep did not run),
    the boundary knockout against its controls, and, when the quoted claims are untestable with this
    run's task groups, that the run is a smoke test, the groups a testable run needs and ``rerun``,
    the command that runs them (``available``: the T_wrong task groups the dataset holds)."""
    sentences, shown = [], []
    if (trap := deepest(claims, SWEEP, "trap")) is not None:
        shown.append(trap)
        sentences.append(f"Retrieval trap: on T_wrong items at {trap['name'].split()[-1].replace('=', ' = ')}, showing the procedure "
                         f"skills (Proc. Skill) moves the wrong-tool margin above Base's by {quoted(trap)}.")
    suppression = deepest(claims, SWEEP, "suppression")
    if suppression is None:
        suppression = claim_row(claims, SUPPRESSION, "BASM − Proc. Skill (margin)")
    if suppression is not None:
        shown.append(suppression)
        sentences.append(f"Boundary suppression: with the boundary fields (BASM) the wrong-tool margin is below Proc. Skill's by "
                         f"{quoted(suppression)}.")
    if (boundary := claim_row(claims, KNOCKOUT, "boundary")) is not None:
        controls = claims[(claims["family"] == KNOCKOUT) & claims["name"].str.startswith("boundary>")]
        shown += [boundary, *(row for _, row in controls.iterrows())]
        against = "; ".join(f"more than {control_words(row)} by {quoted(row)}" for _, row in controls.iterrows())
        sentences.append(f"Boundary knockout: removing the boundary span raises BASM's T_wrong wrong-tool margin by {quoted(boundary)}"
                         + (f"; against its controls, it raises it {against}." if against else "."))
    # no outcome could reach α: the Holm-adjusted floor of its task groups is not below it
    untestable = [row for row in shown if np.isfinite(row["p_floor"]) and row["p_floor"] * holm_size(claims, row) >= ALPHA]
    if untestable:
        n = min(int(row["n"]) for row in untestable)
        size = max(holm_size(claims, row) for row in untestable)
        needed = groups_needed(size)
        floor = sign_flip_floor(n)
        where = ("" if available is None else f" (this dataset holds {available} T_wrong task groups"
                 + (", too few: add items of more task groups)" if available < needed else ")"))
        sentences.append(f"This run is a smoke test: with {n} task group{'s' * (n != 1)} the smallest p a claim can reach is {floor:.3g} "
                         f"({floor * size:.3g} after Holm over {size} claims), so none can reach p < {ALPHA:g}. "
                         f"A run with at least {needed} task groups per bucket can{where}: `{rerun}`.")
    return sentences or ["None of sweep, suppression or knockout ran: no headline estimate (see the sections below)."]


def t_wrong_groups(ctx: RunContext) -> int:
    """The T_wrong task groups of a run's dataset and split, every item (no ``quick``, no ``limit``)."""
    a = ctx.options
    items = ctx.dataset.select(buckets=["T_wrong"], domains=a.domains, split=None if a.split == "all" else a.split, split_kind=a.split_kind)
    return len({item.task_group for item in items})


def print_ending(lead: list[str], out_dir: Path, analyses: list[str], figures_dir: Path | None, report_path: Path, files: list[Path]) -> None:
    """The console's last lines: the headline, then where the rows, tables, figures, report and page are."""
    n_figures = len(list(figures_dir.glob("*.png"))) if figures_dir is not None else 0
    page = next((p for p in files if p.name == PAGE), None)
    print("\n[report] headline:")
    for sentence in lead:
        print("  " + sentence.replace("`", ""))
    print("[report] where:")
    print(f"  rows and tables  {analysis_folder(out_dir, '<analysis>')}/  ({', '.join(analyses) or 'none ran'})")
    drawn = f"{figures_dir}/  ({n_figures} figure{'s' * (n_figures != 1)})" if figures_dir is not None else "(not drawn: --no-figure)"
    print(f"  figures          {drawn}")
    print(f"  report           {report_path}  (claims: {out_dir / CLAIMS})")
    print(f"  page             {page if page is not None else '(not written)'}")


def rerun_command(options: ReportOptions, model: Any) -> str:
    """The report command that runs every task group of the chosen split (no --quick, no --limit)."""
    parts = ["basm-probes report"]
    parts += [] if options.model is None else [f"--model {model}"]
    parts += [f"--out {options.out}"]
    parts += [] if options.analyses is None else [f"--analyses {','.join(options.analyses)}"]
    return " ".join(parts)


def claims_markdown(table: pd.DataFrame) -> str:
    if not len(table):
        return "No analysis of this report made a testable claim."
    shown = table[CLAIM_COLUMNS].assign(exploratory=table["exploratory"].astype(bool).map({True: "exploratory", False: ""}))
    return claims_headline(table) + "\n\n" + markdown_table(shown)


def write_report(out_dir: Path, header: list[str], sections: list[ReportSection], failed: list[str], fig03: list[Path],
                 *, claims: pd.DataFrame, lead: list[str], figures: bool = True, figures_dir: Path | None = None, model: str,
                 variant: str) -> Path:
    """``report.md`` (opening with the ``lead`` sentences, :func:`headline`) and ``claims.csv`` in ``out_dir``."""
    comparisons = [c for s in sections for c in s.comparisons]
    write_csv(claims, out_dir / CLAIMS)
    rel = os.path.relpath(figures_dir, out_dir) if figures_dir is not None else FIGURES
    where = (f"Each analysis's rows and tables are in its own folder (`<analysis>/`), the figures in `{rel}/`, every claim in "
             f"`{CLAIMS}`; `{PAGE}` shows the records in a browser.")
    parts = ["# basm-probes report", "", *[line for sentence in lead for line in (sentence, "")], where, "", *header, "",
             "## Claims", "", CLAIMS_INTRO, "", claims_markdown(claims), "",
             "## Ours vs the paper", "",
             "Paper numbers: Qwen3-8B unless noted (Fig. 7: Qwen3-14B). Margins in logits. The wrong-tool margin is the "
             "headline `margin` (the margin variant above). By default that is `tool_choice`, **Eq. 1 restricted to the "
             "tools**: first-token logits of the wrong tools against the correct tool, each pair read where the names "
             "diverge; the paper's Y_ctrl also holds the abstention tokens, so items whose correct action is abstention are "
             "left out of it. Eq. 1 verbatim is `--margin-variant eq1`, defined in the prompted format (`--format prompted`), "
             "where abstention and the tool names are predicted at one row. No row below is like-for-like: the last columns "
             "say why.", "",
             comparison_table(comparisons, model, variant), ""]
    if fig03 and figures:
        parts += ["## Fig. 3 — mechanism overview", "", f"![Fig. 3]({rel}/{fig03[0].name})", ""]
    for s in sections:
        parts += [f"## {s.title}", ""]
        if figures:
            parts += [f"![{p.stem}]({rel}/{p.name})" for p in s.figures if p.suffix == ".png"]
        parts += ["", s.markdown, ""]
    if failed:
        parts += ["## Failed", "", *[f"- {line}" for line in failed], ""]
    path = out_dir / REPORT
    write_text(path, "\n".join(parts))
    return path


def error(message: str) -> None:
    print(f"[report] error: {message}", file=sys.stderr)


@dataclass(kw_only=True)
class ReportOptions(RunOptions):
    """The options of :func:`report`: the shared ones (forwarded to each analysis) and its own."""

    name: ClassVar[str] = registry.REPORT

    k_max: int | None = option(None, "largest retrieval depth K (default: each analysis's own)", type=int, minimum=0, group="probe")
    split: str | None = option(None, "dataset split (default: each analysis's own: eval; curate and mask-eval: all, which they divide "
                               "into development and held-out items)", choices=SPLIT_CHOICES, group="items")
    analyses: tuple[str, ...] | None = option(None, "comma-separated analyses (default: every registered one, in report order)",
                                              names=registry.ANALYSES, minimum=1)
    figures_dir: str | Path | None = option(None, "where the figures go (default: OUT/<model>/figures); e.g. figures/ to "
                                            "regenerate the repository's figures", type=Path)
    checker: bool = option(True, "run calls with the boundary checker G (Eq. 11): its rates, precision and recall and Fig. 19 "
                           "in the calls section (--no-checker: calls without G)", type=bool, flag="--no-checker")
    explore: bool = option(True, "end by writing OUT/<model>/explore.html, the run in a browser (--no-explore: skip it)", type=bool,
                           flag="--no-explore")


@keeps_caller_threads  # every analysis computes on the run's thread count (open_context); the caller's is back on return
def report(session: EngineSession | None = None, **options: Any) -> AnalysisResult:
    """Run the chosen registered analyses on one model (``session``, or loaded from ``model``) and
    write their figures, ``report.md`` and ``claims.csv`` next to the paper's numbers; keyword
    ``options``: ``probes.options("report")``. Returns the comparisons with the paper as rows and
    the sections (by analysis) as the summary; status 1 when an analysis failed."""
    return run_report(registry.make(ReportOptions, options), session)


def run_report(options: ReportOptions, session: EngineSession | None = None) -> AnalysisResult:
    """:func:`report` on checked options."""
    start = time.perf_counter()
    names = list(options.analyses or registry.ANALYSES)
    classes: dict[str, type[Analysis]] = {}
    require_session(session)
    for name in names:
        try:
            classes[name] = registry.get(name)
        except ImportError as failure:  # not installed, or broken: an error before anything runs
            error(f"cannot import the {name} analysis: {failure}")
            raise AnalysisError(f"cannot import the {name} analysis ({failure}); fix it or leave it out with analyses") from failure
    model = options.model if options.model is not None else (session.model.name_or_path if session is not None else default_model())
    writer = world().rank == 0  # in a parallel run every rank collects; rank 0 draws and writes the report
    out_dir = check_layout(check_inside(Path(options.out) / model_label(model), options.out))  # a link out of --out is never followed
    if session is None:  # each rank of a parallel run on its node's GPU
        session = open_session(dataclasses.replace(options, device=rank_device(options.device, world())), model)
    sections: dict[str, ReportSection] = {}
    failed: list[str] = []
    available: int | None = None  # the T_wrong task groups of the dataset's split, for the headline's rerun advice
    note = ""
    embedders: set[str] = set()
    studies: set[tuple[str, str]] = set()  # (dataset, r_B) as each analysis resolved them: the defaults depend on the model
    threads: set[int] = set()  # the torch thread counts the analyses computed on (one: each resolves the same option on the same model)
    with tempfile.TemporaryDirectory(prefix="basm-report-figures-") as scratch:
        # figure=False: the sections still draw, into a folder that is discarded
        figures_dir = (Path(options.figures_dir) if options.figures_dir is not None else check_inside(figures_folder(out_dir), out_dir)) if options.figure else Path(scratch)
        for name, cls in classes.items():
            t0 = time.perf_counter()
            try:
                analysis = cls(**{**forwarded(options, cls), "model": model})
                ctx = open_context(analysis, session)
                _rows, summary, _tables = analysis.compute(ctx)
                sections[name] = analysis.section(ctx, summary, analysis.figures(summary, figures_dir) if writer else [])
                sections[name].claims = analysis.claims(summary)
            except AnalysisError as failure:
                failed.append(f"`{name}`: {failure}")
                error(f"{name} failed: {failure}")
                continue
            note = note or provenance(ctx, items=False)
            embedders.add(ctx.builder.retriever.embedder.name)
            studies.add((str(ctx.options.dataset), str(ctx.options.relevance)))
            threads.add(ctx.threads)
            if available is None and name in (SWEEP, SUPPRESSION, KNOCKOUT):
                available = t_wrong_groups(ctx)
            if writer:
                print(f"[report] {name}: {time.perf_counter() - t0:.0f} s, figures: "
                      f"{', '.join(p.name for p in sections[name].figures if p.suffix == '.png') if options.figure else '(no figures)'}")
        fig03 = mechanism_figure(sections, figures_dir, note) if writer else []
    resolved = options.resolved()
    files: list[Path] = []
    claims = claims_table([c for s in sections.values() for c in s.claims])
    lead = headline(claims, rerun=rerun_command(options, model), available=available)
    if not writer:
        path = out_dir / REPORT
    else:
        path = write_report(out_dir, header(options, resolved, model, embedders, studies, threads, time.perf_counter() - start), list(sections.values()),
                            failed, fig03, claims=claims, lead=lead, figures=options.figure, figures_dir=figures_dir, model=str(model),
                            variant=options.margin_variant)
        n_figures = len(list(figures_dir.glob("*.png"))) if options.figure else 0
        print(f"[report] wrote {path} and {n_figures} figures in {time.perf_counter() - start:.0f} s")
        if options.explore and set(sections) & set(EXPLORED):
            # figures_dir: the scratch folder, gone by now, under --no-figure: the page then embeds none
            files.append(write_explore(ExploreOptions(out=options.out, model=model), session, figures_dir=figures_dir))
        elif options.explore:
            print(f"[report] explore.html not written: none of {', '.join(EXPLORED)} ran")
    if failed and writer:
        error(f"{len(failed)} of {len(names)} analyses failed (listed under \"Failed\" in {path})")
    if writer:  # the console ends with the headline and where everything is
        print_ending(lead, out_dir, list(sections), figures_dir if options.figure else None, path, files)
    table = pd.DataFrame([dataclasses.asdict(c) for s in sections.values() for c in s.comparisons],
                         columns=["quantity", "ours", "paper", "unit", "note"])
    return AnalysisResult(options, resolved, table, sections, {"report_comparisons": table}, [path, *files], out_dir, 1 if failed else 0)


def header(given: ReportOptions, a: ReportOptions, model: Any, embedders: set[str], studies: set[tuple[str, str]], threads: set[int],
           wall: float) -> list[str]:
    env = environment()
    counts = " / ".join(map(str, sorted(threads))) or "—"
    session_opts = [f"{counts} torch thread{'' if threads == {1} else 's'} (threads {a.threads})"]
    session_opts += [f"device map {a.device_map}"] * (a.device_map is not None)
    session_opts += ["pickle weights allowed"] * a.allow_pickle + ["remote code trusted"] * a.trust_remote_code
    return [
        f"- **model**: `{model}` ({', '.join([a.dtype, a.device, *session_opts])})",
        f"- **dataset**: {', '.join(f'`{dataset}`' for dataset in sorted({d for d, _ in studies})) or f'`{a.dataset}`'} "
        f"(split {split_label(a)}; filters: bucket {list(a.buckets) if a.buckets else 'per analysis'}, "
        f"domain {list(a.domains) if a.domains else 'all'}, "
        f"limit {f'{a.limit} per bucket, spread over task groups' if a.limit is not None else 'none'}"
        f"{f'; items {list(a.item_ids)}' if a.item_ids else ''})",
        f"- **format**: {a.format} · **margin variant**: {a.margin_variant}"
        + {"tool_choice": " (Eq. 1 restricted to the tools)", "eq1": " (Eq. 1 verbatim)"}.get(a.margin_variant, ""),
        f"- **embedder**: {', '.join(sorted(embedders)) or '—'} (embedder {a.embedder}) · **r_B**: {', '.join(sorted({r for _, r in studies})) or a.relevance} · **γ**: {a.gamma} · **β**: {a.beta}",
        f"- **k**: {'per analysis (sweep 0..K; others at k = K)' if given.k_max is None else f'K = {a.k_max}'} · **seed**: {a.seed}"
        f" · **quick**: {a.quick}"
        + (" (4 task groups per bucket: a percentile bootstrap over so few groups under-covers, so the CIs are indicative only)"
           if a.quick else "")
        + f" · **checker G** (Eq. 11, in `calls`): {'on' if a.checker else 'off'}",
        "- **CIs**: 95% bootstrap over task groups; a cell with fewer than two task groups shows \"no CI (1 group)\"",
        "- **attention aggregate**: η = ratio of mean span attentions and median per-head log2 ratio, ε = 1e-6 (never a mean of per-head ratios)",
        f"- **versions**: python {env['python']}, " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        f"- **wall time**: {wall:.0f} s",
    ]


# --- Fig. 3, the mechanism overview: panels of the ratios, suppression and knockout figures
def legend_below(ax: plt.Axes) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=7.5)


def fig03_mechanism(eta: pd.DataFrame, suppression: pd.DataFrame, deltas: pd.DataFrame, recovery: pd.DataFrame, note: str, *,
                    labels: dict[str, str] | None = None) -> plt.Figure:
    """The four panels of Fig. 3: η per bucket, T_wrong margins, knockout controls, selectivity."""
    fig = plt.figure(figsize=(14, 11))
    grid = fig.add_gridspec(3, 2, height_ratios=[1, 1, 0.14])
    (eta_ax, margin_ax), (knockout_ax, selectivity_ax) = [[fig.add_subplot(grid[r, c]) for c in (0, 1)] for r in (0, 1)]
    legend_ax = fig.add_subplot(grid[2, :])  # (c) and (d) draw the same knockouts: one legend under both, in the layout
    legend_ax.axis("off")
    eta_panels([eta_ax], eta)
    eta_ax.set_title("(a) boundary attention η")
    legend_below(eta_ax)
    margin_bars(margin_ax, suppression, "margin", "wrong-tool margin (logits)")
    margin_ax.set_title(f"(b) {plots.bucket_label('T_wrong')} wrong-tool margin")
    legend_below(margin_ax)
    knockout_panel(knockout_ax, deltas, None, labels)
    wrong = recovery[recovery["measure"] == "margin"] if len(recovery) else recovery
    share = f": {100 * float(wrong['value'].iloc[0]):.1f}% of gap recovered" if len(wrong) else ""
    knockout_ax.set_title(f"(c) boundary knockout vs controls{share}")
    selectivity_panel(selectivity_ax, deltas, labels)
    selectivity_ax.set_title("(d) knockout selectivity")
    handles, names = knockout_ax.get_legend_handles_labels()
    legend_ax.legend(handles, names, loc="upper center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle("Boundary fields suppress wrong-tool preference through state-conditioned attention")
    plots.footnote(fig, note)
    return fig
