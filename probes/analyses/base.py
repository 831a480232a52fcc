"""The analysis contract and the one pipeline every analysis runs through.

An analysis is a class whose keyword-only fields are its options, stored as given (as in
scikit-learn): ``Sweep(k_max=4, buckets=["T_wrong"])``. Calling :meth:`Analysis.run` on a loaded
:class:`~probes.engine.session.EngineSession` (or letting it load ``model``) goes through one
pipeline, the same for every analysis::

    collect(ctx) -> rows  →  summarise(ctx, rows) -> summary  →  tables / figures  →  section (report)

and returns an :class:`AnalysisResult` (rows, summary, tables, figure paths, the options). Its
parts live beside this module, one job each: the options (:mod:`probes.analyses.option_system`),
the run context (:mod:`probes.analyses.run_context`) and the job runner (:mod:`probes.analyses.jobs`);
:func:`probes.cli.checks.check_analysis` tests that a class keeps this contract.

Rows are scored per :class:`Job` (one prompt record: item × memory configuration × k) and appended
to a resumable :class:`~probes.reporting.results.ResultsStore` (key ``"{record_id}|{condition}"``)
in ``out/<model>/<analysis>/`` (:mod:`probes.reporting.layout`), so several models share one ``out``
folder; a rerun skips the keys already written and never writes one twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from probes.analyses.option_system import RunOptions
from probes.analyses.parallel import world
from probes.analyses.run_context import RunContext, open_context
from probes.engine.session import EngineSession
from probes.engine.threads import keeps_caller_threads
from probes.reporting.layout import analysis_folder, table_path
from probes.scoring.claims import Claim, claims_table


@dataclass(frozen=True)
class Comparison:
    """One line of the report's "ours vs the paper" table (``paper`` None: not published)."""

    quantity: str
    ours: float
    paper: float | None
    unit: str = "logits"
    note: str = ""


@dataclass
class ReportSection:
    """What an analysis contributes to ``report``: its figures, a markdown body, the comparisons
    with the paper, and its summary object (reused by composite figures)."""

    name: str
    title: str
    figures: list[Path]
    markdown: str
    comparisons: list[Comparison] = field(default_factory=list)
    summary: Any = None
    claims: list[Claim] = field(default_factory=list)


@dataclass
class AnalysisResult:
    """What :meth:`Analysis.run` returns: the rows (one per record × condition), the summary
    object, the summary tables written next to the rows, the figure files, and the options the
    analysis ran with (as given, and as resolved: ``quick``, ``items``, default buckets)."""

    analysis: Analysis
    options: Analysis
    rows: pd.DataFrame
    summary: Any
    tables: dict[str, pd.DataFrame]
    figures: list[Path]
    out_dir: Path  # OUT/<model>: the report, the page and figures/ here, this analysis's files in `folder`
    status: int = 0

    @property
    def folder(self) -> Path:
        """``OUT/<model>/<analysis>``: this analysis's rows and tables (:mod:`probes.reporting.layout`)."""
        return analysis_folder(self.out_dir, self.analysis.name)

    @property
    def summary_table(self) -> pd.DataFrame:
        """The main summary table (the first of :attr:`tables`)."""
        return next(iter(self.tables.values()))

    def show(self) -> None:
        """Display the PNG figures (in a notebook)."""
        from IPython.display import Image, display

        for path in self.figures:
            if path.suffix == ".png":
                display(Image(filename=str(path)))



def ending(name: str, folder: Path, figures_dir: Path, figures: list[Path]) -> str:
    """The last console lines of one analysis's run: where its rows and tables are, and its figures."""
    drawn = [p.name for p in figures if p.suffix == ".png"]
    return (f"{name}: rows and tables in {folder}/\n"
            + (f"{name}: figures in {figures_dir}/: {', '.join(drawn)}" if drawn else f"{name}: no figures (none drawn, or --no-figure)"))


@dataclass(kw_only=True)
class Analysis(RunOptions):
    """Base of every analysis: the shared options, and the pipeline (:meth:`run`).

    A subclass is registered with ``@register("name", order=N)`` (:mod:`probes.analyses`), its
    docstring's first paragraph is its help, it adds its own options (:func:`option` fields;
    redeclaring a shared field changes its default) and implements :meth:`collect`,
    :meth:`summarise`, :meth:`tables`, :meth:`figures`, :meth:`section` (and optionally
    :meth:`claims`, :meth:`print_summary`, :meth:`status`). Every method gets the run context as
    ``ctx`` (:class:`RunContext`).
    """

    order: ClassVar[int] = 0  # set by @register: its place in report and in the listings
    # The smallest retrieval depth it can measure: 1 for an analysis that reads the spans of the shown
    # skills (at k = 0 there is no boundary or procedure span to attend to or knock out).
    min_depth: ClassVar[int] = 0

    # -- the pipeline
    @keeps_caller_threads  # the run computes on its own thread count (open_context); the caller's is back on return
    def run(self, session: EngineSession | None = None, *, verbose: bool = True) -> AnalysisResult:
        """Collect rows (resuming from ``out``), summarise, write the tables and figures."""
        ctx = open_context(self, session)
        rows, summary, tables = self.compute(ctx)
        writer = world().rank == 0  # in a parallel run every rank returns the rows; rank 0 draws and prints
        figures = self.figures(summary, ctx.figures_dir) if ctx.options.figure and writer else []
        if verbose and writer:
            self.print_summary(summary)
            print(ending(self.name, ctx.folder, ctx.figures_dir, figures))
        return AnalysisResult(self, ctx.options, rows, summary, tables, figures, ctx.out_dir, self.status(summary))

    def compute(self, ctx: RunContext) -> tuple[pd.DataFrame, Any, dict[str, pd.DataFrame]]:
        """Collect and summarise on an open context; the summary tables are written next to the rows.
        (:meth:`run` and ``report`` both go through here.)"""
        rows = self.collect(ctx)
        summary = self.summarise(ctx, rows)
        tables = self.tables(summary)
        claims = self.claims(summary)
        if claims:  # Holm within each family of this analysis (report.md corrects over all of its claims the same way)
            tables[f"{self.name}_claims"] = claims_table(claims)
        for table_name, table in tables.items() if world().rank == 0 else ():
            ctx.output.write_table(table_path(ctx.out_dir, self.name, table_name), table)
        return rows, summary, tables

    # -- the contract (implemented by each analysis)
    def collect(self, ctx: RunContext) -> pd.DataFrame:
        """Score every job (resuming) and return all rows of this run."""
        raise NotImplementedError

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> Any:
        """The summary object of the rows (its tables, CIs over task groups, notes)."""
        raise NotImplementedError

    def tables(self, summary: Any) -> dict[str, pd.DataFrame]:
        """The summary tables, by file stem (written as CSV next to the rows)."""
        raise NotImplementedError

    def figures(self, summary: Any, out_dir: Path) -> list[Path]:
        """Draw this analysis's figures into ``out_dir`` (PNG + PDF); returns the files."""
        raise NotImplementedError

    def section(self, ctx: RunContext, summary: Any, figures: list[Path]) -> ReportSection:
        """This analysis's part of ``report.md``."""
        raise NotImplementedError

    def claims(self, summary: Any) -> list[Claim]:
        """Every claim this analysis's outputs make (:mod:`probes.scoring.claims`): estimate, CI, p and
        family; written as ``<name>_claims.csv`` and gathered by ``report`` into ``claims.csv``."""
        return []

    def print_summary(self, summary: Any) -> None:
        """A console summary (the CLI prints it)."""
        tables = self.tables(summary)
        if tables:
            print(next(iter(tables.values())).round(3).to_string(index=False))

    def status(self, summary: Any) -> int:
        """The exit status of the CLI command: 0, or 1 when a built-in check failed."""
        return 0


