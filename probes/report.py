"""``report``: run the chosen analyses on one loaded model; write ``figures/`` (PNG + PDF, named
after the paper's figures) and ``report.md`` with our numbers next to the paper's.

Every analysis module taking part exposes ``add_arguments(parser)`` and
``report_section(analysis, figures_dir) -> ReportSection`` (see :mod:`probes.analysis`). The report
builds each analysis's options from that module's own defaults, overridden by the options given
to ``report`` (model, format, margin variant, item filters, k, seed, ``--quick``), so a section
reproduces exactly what the analysis's own subcommand would compute, and reuses its resumable
results files in the same ``--out`` folder.
"""

from __future__ import annotations

import argparse
import importlib
import math
import time
from pathlib import Path
from types import ModuleType

from probes import plots
from probes.analysis import (
    AnalysisError,
    Comparison,
    ReportSection,
    add_common_arguments,
    default_model,
    names_arg,
    open_analysis,
    provenance,
    resolve_options,
)
from probes.engine import ProbeSession
from probes.results import environment

# In paper order. Modules that are not installed (yet) are skipped with a note.
ANALYSES: tuple[str, ...] = ("sweep", "ratios", "suppression", "knockout", "heads", "linear", "calls", "paired")
# Options forwarded from `report` to every analysis (everything else keeps the analysis's default).
FORWARDED = ("model", "dtype", "device", "format", "margin_variant", "embedder", "gamma", "beta", "seed", "dataset",
             "split", "limit", "item_ids", "domain", "out", "overwrite", "quick")


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
    except ImportError as error:  # not installed, or broken: say so in the report, run the rest
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
    if args.k_max is not None:
        sub.k_max = args.k_max
    if args.bucket is not None:
        sub.bucket = args.bucket
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
    fig = plots.fig03_mechanism(sections["ratios"].summary.eta, sections["suppression"].summary.table, k.deltas, k.recovery, note)
    return plots.save_figure(fig, figures_dir, "fig03_mechanism")


def write_report(out_dir: Path, header: list[str], sections: list[ReportSection], skipped: list[str], fig03: list[Path]) -> Path:
    comparisons = [c for s in sections for c in s.comparisons]
    parts = ["# basm-probes report", "", *header, "", "## Ours vs the paper", "",
             "Paper numbers: Qwen3-8B unless noted (Fig. 7: Qwen3-14B). Margins in logits under the margin variant above.", "",
             comparison_table(comparisons), ""]
    if fig03:
        parts += ["## Fig. 3 — mechanism overview", "", f"![Fig. 3](figures/{fig03[0].name})", ""]
    for s in sections:
        parts += [f"## {s.title}", ""]
        parts += [f"![{p.stem}](figures/{p.name})" for p in s.figures if p.suffix == ".png"]
        parts += ["", s.markdown, ""]
    if skipped:
        parts += ["## Not run", "", *[f"- {line}" for line in skipped], ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(parts))
    return path


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    args = resolve_options(args)
    model = args.model if args.model is not None else default_model()
    args.model = str(model)
    session = ProbeSession(model, dtype=args.dtype, device=args.device)
    out_dir, figures_dir = Path(args.out), Path(args.out) / "figures"
    sections: dict[str, ReportSection] = {}
    skipped: list[str] = []
    note = ""
    for name in args.analyses:
        module = _module(name)
        if isinstance(module, str):
            skipped.append(f"`{name}`: {module}")
            continue
        t0 = time.perf_counter()
        analysis = open_analysis(analysis_args(module, args), name, session=session)
        try:
            sections[name] = module.report_section(analysis, figures_dir)
        except AnalysisError as error:
            skipped.append(f"`{name}`: {error}")
            continue
        note = note or provenance(analysis)
        print(f"[report] {name}: {time.perf_counter() - t0:.0f} s, figures: {', '.join(p.name for p in sections[name].figures if p.suffix == '.png')}")
    fig03 = mechanism_figure(sections, figures_dir, note)
    env = environment()
    wall = time.perf_counter() - start
    header = [
        f"- **model**: `{args.model}` ({args.dtype}, {args.device})",
        f"- **dataset**: `{args.dataset}` (split {args.split}; filters: bucket {args.bucket or 'per analysis'}, domain {args.domain or 'all'}, "
        f"limit {args.limit if args.limit is not None else 'none'} per bucket)",
        f"- **format**: {args.format} · **margin variant**: {args.margin_variant} (default divergence: defined under first-token collisions)",
        f"- **k**: {'per analysis (sweep 0..K; others at k = K)' if args.k_max is None else f'K = {args.k_max}'} · **seed**: {args.seed}"
        f" · **quick**: {args.quick}",
        "- **attention aggregate**: η = ratio of mean span attentions and median per-head log2 ratio, ε = 1e-6 (never a mean of per-head ratios)",
        f"- **versions**: python {env['python']}, " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        f"- **wall time**: {wall:.0f} s",
    ]
    path = write_report(out_dir, header, list(sections.values()), skipped, fig03)
    print(f"[report] wrote {path} and {len(list(figures_dir.glob('*.png')))} figures in {wall:.0f} s")
    return 0
