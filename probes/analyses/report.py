"""``report``: run the chosen analyses on one loaded model; write ``figures/`` (PNG + PDF, named
after the paper's figures) and ``report.md`` with our numbers next to the paper's.

Every analysis module taking part exposes ``add_arguments(parser)`` and
``report_section(analysis, figures_dir) -> ReportSection`` (see :mod:`probes.analyses.base`). The report
builds each analysis's options from that module's own defaults, overridden by the options given
to every common option given to ``report`` (:data:`FORWARDED`: model and session options, format,
margin variant, builder, item filters, k, seed, ``--quick``...), so a section reproduces exactly
what the analysis's own subcommand would compute, and reuses its resumable results files in the
same ``--out`` folder.

An analysis module that cannot be imported is an error before anything runs; an analysis that
fails (:class:`~probes.analyses.base.AnalysisError`) is reported in ``report.md`` and on the console,
and makes the exit status non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from probes.reporting import plots
from probes.analyses.base import (
    AnalysisError,
    Comparison,
    ReportSection,
    add_common_arguments,
    default_model,
    names_arg,
    open_analysis,
    open_session,
    provenance,
    resolve_options,
)
from probes.reporting.results import atomic_path, environment

# In paper order. A module that cannot be imported is an error (leave it out with --analyses).
ANALYSES: tuple[str, ...] = ("sweep", "ratios", "suppression", "knockout", "heads", "linear", "calls", "paired")


def _common_options() -> tuple[str, ...]:
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    return tuple(a.dest for a in parser._actions if a.dest != "help" and not a.dest.startswith("_"))


# Common options set on an analysis only when given to `report` (else it keeps its own default).
IF_GIVEN: tuple[str, ...] = ("k_max", "bucket")
# Options forwarded from `report` to every analysis: every other common option, so none is parsed
# and then dropped (tests/test_options.py checks each arrives).
FORWARDED: tuple[str, ...] = tuple(name for name in _common_options() if name not in IF_GIVEN)
# Options of `report` itself.
REPORT_ONLY: tuple[str, ...] = ("analyses",)


_analyses_arg = names_arg(ANALYSES, "analyses")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.set_defaults(k_max=None)  # each analysis keeps its own K unless --k-max is given
    parser.add_argument("--analyses", type=_analyses_arg, default=list(ANALYSES),
                        help=f"comma-separated analyses (default: all available: {','.join(ANALYSES)})")


def _module(name: str) -> ModuleType | str:
    """The analysis module, or why it cannot take part."""
    try:
        module = importlib.import_module(f"probes.{name}")
    except ImportError as error:  # not installed, or broken: an error (see run)
        return f"cannot import probes.{name}: {error}"
    if not (hasattr(module, "report_section") and hasattr(module, "add_arguments")):
        return f"probes.{name} has no report_section()"
    return module


def analysis_args(module: ModuleType, args: argparse.Namespace) -> argparse.Namespace:
    """The module's own defaults, overridden by the report's forwarded options."""
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    sub = parser.parse_args([])
    for key in FORWARDED:
        setattr(sub, key, getattr(args, key))
    for key in IF_GIVEN:
        if getattr(args, key) is not None:
            setattr(sub, key, getattr(args, key))
    # the report already applied the TOML file to the values forwarded above; re-applying it in
    # the analysis would overwrite explicit flags that happen to equal the analysis's defaults
    sub._config_applied = True
    return sub


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.1f}%" if unit == "%" else f"{value:+.2f}" if unit == "logits" else f"{value:.2f}"


def comparison_table(comparisons: list[Comparison]) -> str:
    lines = ["| quantity | ours | paper | unit | note |", "|---|---|---|---|---|"]
    lines += [f"| {c.quantity} | {_fmt(c.ours, c.unit)} | {_fmt(c.paper, c.unit)} | {c.unit} | {c.note} |" for c in comparisons]
    return "\n".join(lines)


def mechanism_figure(sections: dict[str, ReportSection], figures_dir: Path, note: str) -> list[Path]:
    """Fig. 3 (four panels) from the ratios, suppression and knockout summaries."""
    if not {"ratios", "suppression", "knockout"} <= set(sections):
        return []
    plots.style()
    k = sections["knockout"].summary
    eta = sections["ratios"].summary.eta
    fig = plots.fig03_mechanism(eta[eta["row"] == "deciding"], sections["suppression"].summary.table, k.deltas, k.recovery, note)
    return plots.save_figure(fig, figures_dir, "fig03_mechanism")


def write_report(out_dir: Path, header: list[str], sections: list[ReportSection], failed: list[str], fig03: list[Path],
                 *, figures: bool = True) -> Path:
    comparisons = [c for s in sections for c in s.comparisons]
    parts = ["# basm-probes report", "", *header, "", "## Ours vs the paper", "",
             "Paper numbers: Qwen3-8B unless noted (Fig. 7: Qwen3-14B). Margins in logits. The wrong-tool margin is the "
             "headline `margin` (the margin variant above; by default `tool_choice`, the paper's Eq. 1: first-token logits of "
             "the wrong tools against the correct tool, each pair read where the names diverge). Items whose correct action "
             "is abstention have no correct tool and are left out of it.", "",
             comparison_table(comparisons), ""]
    if fig03 and figures:
        parts += ["## Fig. 3 — mechanism overview", "", f"![Fig. 3](figures/{fig03[0].name})", ""]
    for s in sections:
        parts += [f"## {s.title}", ""]
        if figures:
            parts += [f"![{p.stem}](figures/{p.name})" for p in s.figures if p.suffix == ".png"]
        parts += ["", s.markdown, ""]
    if failed:
        parts += ["## Failed", "", *[f"- {line}" for line in failed], ""]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.md"
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts))
    return path


def error(message: str) -> None:
    print(f"[report] error: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    args = resolve_options(args)
    modules = {name: _module(name) for name in args.analyses}
    if broken := [reason for reason in modules.values() if isinstance(reason, str)]:
        for reason in broken:
            error(reason)
        error("nothing was run; fix the module or leave it out with --analyses")
        return 2
    model = args.model if args.model is not None else default_model()
    args.model = str(model)
    session = open_session(args, model)
    out_dir = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="basm-report-figures-") as scratch:
        # --no-figure: the sections still draw (report_section), into a folder that is discarded
        figures_dir = out_dir / "figures" if args.figure else Path(scratch)
        sections: dict[str, ReportSection] = {}
        failed: list[str] = []
        note = ""
        embedders: set[str] = set()
        for name in args.analyses:
            module = modules[name]
            t0 = time.perf_counter()
            try:
                analysis = open_analysis(analysis_args(module, args), name, session=session)
                sections[name] = module.report_section(analysis, figures_dir)
            except AnalysisError as failure:
                failed.append(f"`{name}`: {failure}")
                error(f"{name} failed: {failure}")
                continue
            note = note or provenance(analysis)
            embedders.add(analysis.builder.retriever.embedder.name)
            print(f"[report] {name}: {time.perf_counter() - t0:.0f} s, figures: "
                  f"{', '.join(p.name for p in sections[name].figures if p.suffix == '.png') if args.figure else '(--no-figure)'}")
        fig03 = mechanism_figure(sections, figures_dir, note)
    env = environment()
    wall = time.perf_counter() - start
    session_opts = [f"device map {args.device_map}"] * (args.device_map is not None)
    session_opts += ["pickle weights allowed"] * args.allow_pickle + ["remote code trusted"] * args.trust_remote_code
    header = [
        f"- **model**: `{args.model}` ({', '.join([args.dtype, args.device, *session_opts])})",
        f"- **dataset**: `{args.dataset}` (split {args.split}; filters: bucket {args.bucket or 'per analysis'}, domain {args.domain or 'all'}, "
        f"limit {f'{args.limit} per bucket, spread over task groups' if args.limit is not None else 'none'}"
        f"{f'; items {args.item_ids}' if args.item_ids else ''})",
        f"- **format**: {args.format} · **margin variant**: {args.margin_variant}"
        + (" (Eq. 1 on the tool choice)" if args.margin_variant == "tool_choice" else ""),
        f"- **embedder**: {', '.join(sorted(embedders)) or '—'} (--embedder {args.embedder}) · **γ**: {args.gamma} · **β**: {args.beta}",
        f"- **k**: {'per analysis (sweep 0..K; others at k = K)' if args.k_max is None else f'K = {args.k_max}'} · **seed**: {args.seed}"
        f" · **quick**: {args.quick}"
        + (" (4 task groups per bucket: a percentile bootstrap over so few groups under-covers, so the CIs are indicative only)"
           if args.quick else ""),
        "- **CIs**: 95% bootstrap over task groups; a cell with fewer than two task groups shows \"no CI (1 group)\"",
        "- **attention aggregate**: η = ratio of mean span attentions and median per-head log2 ratio, ε = 1e-6 (never a mean of per-head ratios)",
        f"- **versions**: python {env['python']}, " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        f"- **wall time**: {wall:.0f} s",
    ]
    path = write_report(out_dir, header, list(sections.values()), failed, fig03, figures=args.figure)
    n_figures = len(list((out_dir / "figures").glob("*.png"))) if args.figure else 0
    print(f"[report] wrote {path} and {n_figures} figures in {wall:.0f} s")
    if failed:
        error(f"{len(failed)} of {len(args.analyses)} analyses failed (listed under \"Failed\" in {path})")
        return 1
    return 0
