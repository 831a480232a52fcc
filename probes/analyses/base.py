"""The analysis contract, its options and the one pipeline every analysis runs through.

An analysis is a class whose keyword-only fields are its options, stored as given (as in
scikit-learn): ``Sweep(k_max=4, buckets=["T_wrong"])``. Calling :meth:`Analysis.run` on a loaded
:class:`~probes.engine.session.ProbeSession` (or letting it load ``model``) goes through one
pipeline, the same for every analysis::

    collect(ctx) -> rows  →  summarise(ctx, rows) -> summary  →  tables / figures  →  section (report)

and returns an :class:`AnalysisResult` (rows, summary, tables, figure paths, the options). The CLI
derives each subcommand's flags from these fields (:mod:`probes.cli.options`); nothing here knows
about argparse.

Rows are scored per :class:`Job` (one prompt record: item × memory configuration × k) and appended
to a resumable :class:`~probes.reporting.results.ResultsStore` (key ``"{record_id}|{condition}"``)
under ``out/<model>/``, so several models share one ``out`` folder; a rerun skips the keys already
written and never writes one twice.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch
from tqdm.auto import tqdm

from probes.analyses.parallel import ShardedStore, open_store, rank_device, world
from probes.core.files import write_csv
from probes.data.dataset import BUCKETS, ORGANISM_DIR, ORGANISM_NAME, SPLIT_KINDS, Item, ProbeDataset, is_organism, load_dataset, resolve_dataset
from probes.data.retrieval import EMBEDDERS, RELEVANCE_MEASURES, RETRIEVAL_MODES, RetrievalWeights, Retriever, make_embedder
from probes.engine.loading import model_fingerprint
from probes.engine.session import Knockout, ProbeSession
from probes.prompts.builder import DEFAULT_K_MAX, FORMATS, BuildSettings, PromptBuilder, make_builder, resolve_study
from probes.prompts.record import PromptRecord, record_id
from probes.prompts.context import SkippedItem, partition_by_context
from probes.reporting.results import ResultsStore, check_inside
from probes.scoring.claims import Claim, claims_table
from probes.scoring.score import DEFAULT_VARIANT, EPSILON, MARGIN_VARIANTS, MARGINS, row_fields, score_record

# --quick: a small item subset so that `report --quick` finishes in minutes on 2 CPU cores. The
# limit is spread over task groups (ProbeDataset.select): 4 items per bucket = 4 task groups, the
# fewest that give a bootstrap CI and two task groups per half of a split-half test.
BACKEND_NAMES: tuple[str, ...] = ("native", "nnsight", "transformerlens")  # probes.backends.BACKENDS
QUICK = {"limit": 4, "k_max": 2, "random_draws": 2}
SPLIT_CHOICES = ("train", "eval", "all")


class AnalysisError(RuntimeError):
    """A run cannot start as configured; the message says what to do."""


class OptionError(ValueError):
    """An option has the wrong type, is out of range or selects nothing; the message names it."""


class UnknownOption(OptionError, TypeError):
    """A keyword that is no option of the analysis (a TypeError too, as for any unknown keyword)."""


# ---------------------------------------------------------------------------- options
def option(
    default: Any,
    help: str,
    *,
    type: Callable[..., Any] = str,
    choices: Sequence[Any] | None = None,
    flag: str | None = None,
    repeat: bool = False,
    names: Sequence[str] | None = None,
    group: str = "run",
    minimum: float | None = None,
    positional: bool = False,
) -> Any:
    """A keyword option of an analysis or command (a dataclass field with what the CLI and the validator need).

    ``repeat``: a list given by repeating the flag (``--bucket T_ok --bucket T_wrong``);
    ``names``: a list given as comma-separated names from ``names`` (``--configs base,proc``; a
    live sequence such as :data:`probes.analyses.ANALYSES` is read when checked);
    ``flag``: the CLI flag when it is not ``--field-name`` (``--no-figure`` for a True default);
    ``minimum``: the smallest value of a number, the fewest names of a list.
    ``positional``: a positional argument of the command (``show ITEM``); ``default`` :data:`REQUIRED`
    makes the option required.
    """
    if isinstance(default, list):
        default = tuple(default)
    meta = {"help": help, "type": type, "choices": tuple(choices) if choices is not None else None, "flag": flag,
            "repeat": repeat, "names": tuple(names) if isinstance(names, list) else names, "group": group, "minimum": minimum,
            "positional": positional}
    return field(metadata=meta) if default is REQUIRED else field(default=default, metadata=meta)


REQUIRED: Any = dataclasses.MISSING  # the default of an option that must be given


def shared(cls: type, name: str, *, default: Any = REQUIRED, help: str | None = None) -> Any:
    """Option ``name`` as ``cls`` declares it (same default, help, type and checks), for a class that
    lists it among its own (``RunOptions`` keeps its field order: the option listings show it);
    ``default`` / ``help`` change only those, as a redeclared option does."""
    f = cls.__dataclass_fields__[name]
    meta = {**f.metadata, **({"help": help} if help is not None else {})}
    return field(default=f.default if default is REQUIRED else default, metadata=meta)


def k_max_option(default: int | None) -> Any:
    """The ``k_max`` option (``--k-max``) with ``default``: :data:`~probes.prompts.builder.DEFAULT_K_MAX`
    (the analyses at one depth) or :data:`~probes.prompts.builder.SWEEP_K_MAX` (the depth sweeps, ``build``)."""
    return option(default, "largest retrieval depth K", type=int, minimum=0, group="probe")


def fold_groups_option(group: str) -> Any:
    """The ``fold_groups`` option (``--fold-groups``) of grouped cross-validation (``linear``, ``shortcuts``):
    :func:`probes.data.dataset.fold_groups`."""
    from probes.data.dataset import FOLD_GROUPS

    return option(FOLD_GROUPS[0], "groups of the CV folds: task_group (a test item's template never in training) or scenario "
                  "(its whole scenario, every template, never in training; needs the item field scenario, e.g. basm_probe_v2)",
                  choices=FOLD_GROUPS, group=group)


def depth_option(default: int | None = None, help: str = "retrieval depth (default: k_max)") -> Any:
    """The ``k`` option (``--k``) of an analysis or command at one retrieval depth; read it as ``options.depth``."""
    return option(default, help, type=int, minimum=0, group="probe")


def option_fields(cls: type) -> list[dataclasses.Field]:
    """The option fields of an analysis class (every dataclass field with option metadata)."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_of(f: dataclasses.Field) -> str:
    """The command-line flag of option field ``f`` (a positional option: its name)."""
    if f.metadata.get("positional"):
        return f.name
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def check_option(analysis: str, f: dataclasses.Field, value: Any, where: str = "") -> Any:
    """``value`` checked (and normalised: lists become tuples, paths stay as given) against the
    option's type, choices and range; a precise :class:`OptionError` otherwise."""
    meta = f.metadata
    label = f"{where}{analysis}: option {f.name!r} ({flag_of(f)})"
    if value is None:
        if f.default is None:
            return None
        raise OptionError(f"{label} must not be None (default: {f.default!r})")
    if meta["repeat"] or meta["names"] is not None:
        values = [value] if isinstance(value, str) else value
        if isinstance(values, str) or not isinstance(values, Sequence) or not all(isinstance(v, str) for v in values):
            raise OptionError(f"{label} must be a list of strings, got {value!r}")
        known = meta["names"] or meta["choices"]
        if known is not None and (unknown := [v for v in values if v not in known]):
            raise OptionError(f"{label}: unknown {unknown}; known: {', '.join(known)}")
        if meta["minimum"] is not None and len(values) < meta["minimum"]:  # of a list: the fewest names
            raise OptionError(f"{label} needs at least {meta['minimum']:g} of {', '.join(known or ())}, got {list(values)!r}")
        return tuple(values)
    kind = meta["type"]
    if kind is bool:
        if not isinstance(value, bool):
            raise OptionError(f"{label} must be true or false, got {value!r}")
    elif kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
            raise OptionError(f"{label} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
        if not math.isfinite(value):  # NaN would pass every range check and then close every gate silently
            raise OptionError(f"{label} must be a finite number, got {value!r}")
        if meta["minimum"] is not None and value < meta["minimum"]:
            raise OptionError(f"{label} must be ≥ {meta['minimum']}, got {value!r}")
    elif kind is Path:
        if not isinstance(value, str | Path):
            raise OptionError(f"{label} must be a path, got {value!r}")
    elif not isinstance(value, str):
        raise OptionError(f"{label} must be a string, got {value!r}")
    if meta["choices"] is not None and value not in meta["choices"]:
        raise OptionError(f"{label} must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
    return value


def header_options(options: RunOptions, of: type | None = None) -> dict[str, Any]:
    """Every option of ``options`` (of the class ``of`` only, when given: a header two analyses share)
    but the value-neutral ones (:attr:`RunOptions.value_neutral`), as JSON values: what the results
    header records so that a resume under another value is refused."""
    def plain(value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else str(value) if isinstance(value, Path) else value

    return {f.name: plain(getattr(options, f.name)) for f in option_fields(of or type(options)) if f.name not in options.value_neutral}


def parse_items(spec: str) -> dict[str, Any]:
    """``items`` compact filter: colon-separated bucket names, domain names and one count,
    e.g. ``T_wrong:retail:10`` (any order; each part optional)."""
    out: dict[str, Any] = {"buckets": [], "domains": [], "limit": None}
    for part in filter(None, spec.split(":")):
        if part in BUCKETS:
            out["buckets"].append(part)
        elif part.isdigit():
            out["limit"] = int(part)
        else:
            out["domains"].append(part)
    return out


def default_model() -> Path:
    """The bundled model organism; a clear error until it has been trained and committed."""
    if not (ORGANISM_DIR / "config.json").is_file():
        raise AnalysisError(
            f"the bundled model organism is not in {ORGANISM_DIR} yet; pass model=PATH (--model PATH): "
            "a local HF folder, a name in the local HF cache, or a .gguf file"
        )
    return ORGANISM_DIR


def model_label(model: str | Path) -> str:
    """The folder name of a model's results under ``out``: the organism's name for the bundled
    organism, a folder's or file's name, or a hub-style name with ``/`` replaced."""
    path = Path(str(model))
    if is_organism(path):
        return ORGANISM_NAME
    if path.exists():
        return path.stem if path.is_file() else path.resolve().name
    return str(model).replace("/", "--")


# ---------------------------------------------------------------------------- the contract
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
    out_dir: Path
    status: int = 0

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


@dataclass(kw_only=True)
class Options:
    """Base of every options class (the analyses, ``report``'s, the dataset commands'): keyword fields
    made with :func:`option`, validated and normalised once, as given. The CLI derives a command's
    flags from its class (:mod:`probes.cli.options`), so a field shared by several classes (below) is
    declared once and has one flag, one default and one check everywhere."""

    name: ClassVar[str] = ""
    # Options that cannot change a row's value: where results and figures go, how a model may be
    # loaded (its content is fingerprinted), the prefix cache (bit-identical either way), and the
    # shorthands recorded through what they resolve to (quick, items: limit, k_max, buckets, domains).
    # Every other option is in the results header (header_options), so a resume under another value is refused.
    value_neutral: ClassVar[frozenset[str]] = frozenset({"model", "out", "overwrite", "figure", "quick", "items", "allow_pickle",
                                                         "trust_remote_code", "prefix_cache"})

    def __post_init__(self) -> None:
        for f in option_fields(type(self)):  # validated and normalised once, as given
            object.__setattr__(self, f.name, check_option(self.name, f, getattr(self, f.name)))


@dataclass(kw_only=True)
class DatasetOption(Options):
    """The dataset (``--dataset``), defaulting to the study default of the model (:func:`probes.prompts.builder.resolve_study`)."""

    dataset: str | Path | None = option(None, "probe dataset folder or bundled name (basm_probe, basm_probe_v2, bfcl); default: "
                                        "basm_probe (v1) for the bundled organism, basm_probe_v2 for every other model", type=Path, group="items")


@dataclass(kw_only=True)
class ItemOptions(DatasetOption):
    """The item filters (``select_items``) of the analyses and ``build``."""

    buckets: tuple[str, ...] | None = option(None, "keep only these buckets (default: all)", flag="--bucket", repeat=True,
                                             choices=BUCKETS, group="items")
    domains: tuple[str, ...] | None = option(None, "keep only these domains", flag="--domain", repeat=True, group="items")
    split: str = option("eval", "dataset split", choices=SPLIT_CHOICES, group="items")
    split_kind: str = option("template", "which split --split reads: template (task groups held out, the item field split) or "
                             "scenario (whole scenarios held out, split_scenario; basm_probe_v2)", choices=SPLIT_KINDS, group="items")
    limit: int | None = option(None, "keep N items of each bucket, round-robin over task groups (one item per group first)",
                               type=int, minimum=1, group="items")
    item_ids: tuple[str, ...] | None = option(None, "keep only these item ids", flag="--item", repeat=True, group="items")


class BuildsPrompts:
    """What an options class with the builder's settings (:class:`BuilderOptions`' fields) can do."""

    k_max: int | None
    embedder: str
    gamma: float
    relevance: str | None
    beta: int
    retrieval: str
    oracle_rank: int

    @property
    def depth(self) -> int | None:
        """The one retrieval depth of an analysis or command with a ``k`` option: ``k``, else ``k_max``."""
        k = getattr(self, "k", None)
        return k if k is not None else self.k_max

    def make_builder(self, tokenizer: Any, dataset: ProbeDataset, *, retriever: Retriever | None = None, tokenizer_name: str = "") -> PromptBuilder:
        """The prompt builder of these settings (:func:`probes.prompts.builder.make_builder`), ``relevance``
        resolved (:func:`probes.prompts.builder.resolve_study`). ``retriever``: one to share instead of a
        new one of ``embedder``."""
        return make_builder(tokenizer, dataset, embedder=self.embedder if retriever is None else retriever, k_max=self.k_max,
                            gamma=self.gamma, relevance=self.relevance, beta=self.beta, retrieval=self.retrieval,
                            oracle_rank=self.oracle_rank, tokenizer_name=tokenizer_name)


@dataclass(kw_only=True)
class BuilderOptions(Options, BuildsPrompts):
    """The prompt builder's settings (:func:`probes.prompts.builder.make_builder`) of the analyses, ``build`` and ``show``."""

    k_max: int | None = k_max_option(DEFAULT_K_MAX)
    embedder: str = option("auto", "retrieval embedder", choices=EMBEDDERS, group="probe")
    gamma: float = option(BuildSettings.gamma, "boundary relevance gate γ (Eq. 10)", type=float, group="probe")
    relevance: str | None = option(None, "r_B of the gate (Eq. 10): lexical (content-word overlap, the paper's) or semantic "
                                   "(embedding cosine); default: lexical for the bundled organism, semantic for every other model",
                                   choices=RELEVANCE_MEASURES, group="probe")
    beta: int = option(BuildSettings.beta, "boundary token budget β (Eq. 10)", type=int, minimum=0, group="probe")
    retrieval: str = option(BuildSettings.retrieval, "which skills a prompt shows: ranked (Eq. 8's top k) or oracle (the item's "
                            "defining skill moved to rank --oracle-rank of Eq. 8's ranking, the others in their order; depth k "
                            "shows the first k)", choices=RETRIEVAL_MODES, group="probe")
    oracle_rank: int = option(BuildSettings.oracle_rank, "the defining skill's rank under --retrieval oracle (at most the run's "
                              "depth; a shallower k of a sweep does not show it)", type=int, minimum=1, group="probe")


@dataclass(kw_only=True)
class RunOptions(Options, BuildsPrompts):
    """The options every analysis and ``report`` share (model, probe, items, run), validated and
    normalised once, as given; :meth:`resolved` applies ``items`` and ``quick``. The builder's
    settings and the item filters are :class:`BuilderOptions`' and :class:`ItemOptions`' (``shared``),
    the same as the dataset commands'."""

    # model
    model: str | Path | None = option(None, "local HF folder, local-cache name or .gguf (default: the bundled organism)",
                                      type=Path, group="model")
    dtype: str = option("float32", "float32 | bfloat16 | float16 | auto", choices=("float32", "bfloat16", "float16", "auto"), group="model")
    device: str = option("cpu", "torch device", group="model")
    device_map: str | None = option(None, 'accelerate device map for multi-GPU models, e.g. "auto"', group="model")
    allow_pickle: bool = option(False, "allow .bin (pickle) weights; safetensors only by default", type=bool, group="model")
    trust_remote_code: bool = option(False, "allow model code shipped in the model folder", type=bool, group="model")
    backend: str = option("native", "probe backend: native (cached branching), nnsight or transformerlens (docs/backends.md)",
                          choices=BACKEND_NAMES, group="model")
    remote: bool = option(False, "nnsight only: run on an NDIF deployment (fails at once when offline or unauthorised)", type=bool, group="model")
    prefix_cache: int = option(8, "native only: prompt prefixes kept for key/value reuse across prompts (0: off)", type=int, minimum=0,
                               group="model")
    # probe
    format: str = option("native", "decision format", choices=FORMATS, group="probe")
    margin_variant: str = option(
        DEFAULT_VARIANT, "the headline margin: tool_choice (Eq. 1 restricted to the tools, each wrong/correct pair compared "
        "where their names diverge), eq1 (Eq. 1 verbatim, abstention among the alternatives; prompted format only), first_token (Eq. 1 at the decision row, NaN "
        "where names share a first token) or path (whole-path log-probabilities, abstention included); all are written to the rows",
        choices=MARGIN_VARIANTS, group="probe")
    k_max: int | None = shared(BuilderOptions, "k_max")
    embedder: str = shared(BuilderOptions, "embedder")
    gamma: float = shared(BuilderOptions, "gamma")
    relevance: str | None = shared(BuilderOptions, "relevance")
    beta: int = shared(BuilderOptions, "beta")
    retrieval: str = shared(BuilderOptions, "retrieval")
    oracle_rank: int = shared(BuilderOptions, "oracle_rank")
    seed: int = option(0, "seed of every random draw", type=int, group="probe")
    # items
    dataset: str | Path | None = shared(ItemOptions, "dataset")
    buckets: tuple[str, ...] | None = shared(ItemOptions, "buckets")
    domains: tuple[str, ...] | None = shared(ItemOptions, "domains")
    split: str = shared(ItemOptions, "split")
    split_kind: str = shared(ItemOptions, "split_kind")
    limit: int | None = shared(ItemOptions, "limit")
    item_ids: tuple[str, ...] | None = shared(ItemOptions, "item_ids")
    items: str | None = option(None, "compact item filter BUCKET:DOMAIN:COUNT, e.g. T_wrong:retail:10", group="items")
    too_long: str = option("error", "items whose longest prompt (proc/app/basm at k_max) exceeds the model's context: error (stop), "
                           "or skip them, listed on stderr and recorded in the results header", choices=("error", "skip"), group="items")
    # run
    out: str | Path = option("results", "results folder; each model writes to OUT/<model>/", type=Path)
    overwrite: bool = option(False, "discard existing results instead of resuming", type=bool)
    quick: bool = option(False, f"small run: {QUICK['limit']} items (task groups) per bucket, k ≤ {QUICK['k_max']}", type=bool)
    figure: bool = option(True, "draw the figures (--no-figure: write rows and tables only)", type=bool, flag="--no-figure")

    def resolved(self) -> RunOptions:
        """These options with ``items``, ``quick`` and the analysis's default buckets applied."""
        changes: dict[str, Any] = {}
        buckets, domains, limit, k_max = self.buckets, self.domains, self.limit, self.k_max
        if self.items is not None:
            spec = parse_items(self.items)
            if not (spec["buckets"] or spec["domains"] or spec["limit"] is not None):
                raise OptionError(f"{self.name}: option 'items' (--items) {self.items!r} names no bucket, domain or count; "
                                  "the form is BUCKET:DOMAIN:COUNT, e.g. T_wrong:retail:10")
            buckets = tuple(spec["buckets"]) or buckets
            domains = tuple(spec["domains"]) or domains
            limit = spec["limit"] if spec["limit"] is not None else limit
        if self.quick:
            limit = QUICK["limit"] if limit is None else limit
            k_max = QUICK["k_max"] if k_max is None else min(k_max, QUICK["k_max"])
            if hasattr(self, "random_draws"):
                changes["random_draws"] = min(self.random_draws, QUICK["random_draws"])
        changes.update(buckets=buckets, domains=domains, limit=limit, k_max=k_max)
        return dataclasses.replace(self, **changes)


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

    # -- the pipeline
    def run(self, session: ProbeSession | None = None, *, verbose: bool = True) -> AnalysisResult:
        """Collect rows (resuming from ``out``), summarise, write the tables and figures."""
        ctx = open_context(self, session)
        rows, summary, tables = self.compute(ctx)
        writer = world().rank == 0  # in a parallel run every rank returns the rows; rank 0 draws and prints
        figures = self.figures(summary, ctx.out_dir / "figures") if ctx.options.figure and writer else []
        if verbose and writer:
            self.print_summary(summary)
            if figures:
                print("figures:", ", ".join(str(p) for p in figures if p.suffix == ".png"))
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
            write_csv(table, ctx.out_dir / f"{table_name}.csv")
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


# ---------------------------------------------------------------------------- the run context
@dataclass
class RunContext:
    """Everything one analysis run needs, opened once by :func:`open_context`: the resolved
    options, the session, the dataset, the selected items and the prompt builder."""

    name: str
    options: Any  # the resolved Analysis (see Analysis.resolved)
    session: ProbeSession
    dataset: ProbeDataset
    items: tuple[Item, ...]
    builder: PromptBuilder
    model_path: str
    out_dir: Path
    model_fingerprint: dict[str, str]
    skipped: tuple[SkippedItem, ...] = ()  # items left out by too_long="skip", with the reason
    _score_cache: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)  # item -> prompt digest -> rows

    @property
    def variant(self) -> str:
        return self.options.margin_variant

    @property
    def fmt(self) -> str:
        return self.options.format

    def config(self, **extra: Any) -> dict[str, Any]:
        """The full configuration recorded in the results header (resuming requires equality).

        ``fingerprint`` covers everything a row depends on beyond the options: the weights and
        the tokenizer (content hashes), the items and skill libraries (content), and the code.
        """
        a = self.options
        return {
            "model": self.model_path,
            "fingerprint": {**self.model_fingerprint, "dataset": self.dataset.content_digest(self.items), "code": code_digest()},
            "dtype": a.dtype, "device": a.device, "format": a.format, "margin_variant": a.margin_variant,
            "epsilon": EPSILON, "k_max": a.k_max, "seed": a.seed,
            "builder": {"embedder": self.builder.retriever.embedder.name, "gamma": a.gamma, "relevance": a.relevance, "beta": a.beta,
                        "retrieval": self.builder.settings.retrieval_mode},
            "dataset": str(a.dataset),
            "items": {"n": len(self.items), "digest": hashlib.sha256(",".join(i.id for i in self.items).encode()).hexdigest()[:16],
                      "bucket": list(a.buckets) if a.buckets else None, "domain": list(a.domains) if a.domains else None,
                      "split": a.split, "split_kind": a.split_kind, "limit": a.limit},
            **({"skipped_too_long": [[s.item_id, s.reason] for s in self.skipped]} if self.skipped else {}),
            "options": header_options(a),
            **extra,
        }

    def store(self, **extra: Any) -> ResultsStore | ShardedStore:
        return open_store(self.out_dir / f"{self.name}.jsonl", self.name, self.config(**extra), overwrite=self.options.overwrite)

    def items_in(self, buckets: Iterable[str]) -> list[Item]:
        buckets = set(buckets)
        return [item for item in self.items if item.bucket in buckets]


# The modules that draw, plot or report results only, or that no analysis runs (the dataset tools, formerly
# in the CLI); every other module shapes the rows.
_PRESENTATION = ("cli", "reporting/plots.py", "reporting/markdown.py", "reporting/finished.py", "analyses/explore.py", "analyses/report.py",
                 "analyses/tools.py", "organism")


@functools.cache
def code_digest() -> str:
    """Hash of the source of every module that computes rows (a code change invalidates resume)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if not name.startswith(_PRESENTATION) and not name.startswith("datasets/"):
            h.update(name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


# Shared by the analyses of one process (``report``): loaded and embedded once.
def _dataset(root: str) -> ProbeDataset:
    # keyed by the files' size and mtime too: an edited dataset is loaded afresh, never served stale
    files = sorted(Path(root).rglob("*.json*"))
    return _load_dataset(root, tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))


@functools.cache
def _load_dataset(root: str, signature: tuple[tuple[str, int, int], ...]) -> ProbeDataset:
    return load_dataset(root)


@functools.cache
def _retriever(embedder: str) -> Retriever:
    return Retriever(make_embedder(embedder), RetrievalWeights())


def select_items(dataset: ProbeDataset, options: Any) -> tuple[Item, ...]:
    """The items of a run: ``limit`` takes N per bucket round-robin over task groups
    (:func:`probes.data.dataset.spread_limit`)."""
    try:
        items = dataset.select(
            buckets=options.buckets, domains=options.domains, split=None if options.split == "all" else options.split,
            split_kind=options.split_kind, ids=options.item_ids, limit_per_bucket=options.limit, spread=True,
        )
    except ValueError as error:  # unknown bucket / domain / item id, or an id the other filters drop
        raise OptionError(f"item filters: {error}") from error
    if not items:
        raise OptionError("no items match the filters (buckets/domains/split/limit/item_ids/items)")
    return items


def check_gate_embedder(options: Any) -> None:
    """The semantic gate (Eq. 10 with embedding cosines) needs a semantic embedder: an option error
    before any model or tokenizer is loaded."""
    if options.relevance == "semantic" and options.embedder == "lexical":
        raise OptionError("relevance 'semantic' (the default for a model other than the bundled organism) needs a semantic "
                          "embedder: pass embedder='minilm' (--embedder minilm), or relevance='lexical' (--relevance lexical)")


def check_oracle(options: Any) -> None:
    """Under ``retrieval="oracle"`` the defining skill's rank must be one the run shows: at most its
    depth (``k``, else ``k_max``); shallower depths of a sweep show the first k of the oracle order."""
    if options.retrieval == "oracle" and options.depth is not None and options.oracle_rank > options.depth:
        raise OptionError(f"oracle_rank (--oracle-rank) {options.oracle_rank} exceeds the run's retrieval depth {options.depth}: "
                          f"no prompt would show the defining skill; use --oracle-rank {options.depth} or less, or a deeper k")


def check_depths(dataset: ProbeDataset, items: Sequence[Item], **depths: int | None) -> None:
    """Retrieval depths (``k_max=...``, ``k=...``) checked against the smallest skill library of
    the items, before any model or tokenizer is loaded."""
    smallest = min(items, key=lambda item: len(dataset.library_for(item)))
    size = len(dataset.library_for(smallest))
    for name, k in depths.items():
        if k is not None and k > size:  # deeper retrieval would repeat the same prompt under new k labels
            flag = "--" + name.replace("_", "-")
            raise OptionError(f"{name} ({flag}) {k}: item {smallest.id} has only {size} skills to retrieve; use {size} or less")


def open_session(options: Any, model: str | Path) -> ProbeSession:
    """Load ``model`` with every session option on the chosen backend (the one place analyses
    and ``report`` build their session)."""
    common = {"dtype": options.dtype, "device": options.device, "device_map": options.device_map,
              "allow_pickle": options.allow_pickle, "trust_remote_code": options.trust_remote_code}
    if options.remote and options.backend != "nnsight":
        raise OptionError(f"option 'remote' (--remote) needs backend='nnsight', got backend={options.backend!r}")
    if options.backend == "native":
        return ProbeSession(model, **common, prefix_cache=options.prefix_cache)
    from probes.backends import get_backend

    return get_backend(options.backend, model, **common, **({"remote": True} if options.remote else {}))


def session_runs(session: ProbeSession) -> dict[str, str]:
    """What a loaded session runs: its dtype, device and backend, as the options name them."""
    return {"dtype": str(session.model.dtype).removeprefix("torch."), "device": str(session.model.device),
            "backend": getattr(session, "name", "native")}


def require_session(session: Any) -> None:
    """``session`` is a loaded session (or None): a path or a name given there is answered, not an AttributeError."""
    if session is not None and not (hasattr(session, "model") and callable(getattr(session, "run", None))):
        raise OptionError(f"session must be a loaded session (probes.ProbeSession(PATH)) or None, got {type(session).__name__} "
                          f"{str(session)[:80]!r}; to load a model by its path, pass model=PATH")


def check_session(options: RunOptions, session: ProbeSession) -> None:
    """A session option given (not its default) that contradicts the given ``session`` is an error:
    the run would record one thing and measure another."""
    runs = session_runs(session)
    conflicts = []
    for name, actual in runs.items():
        given = getattr(options, name)
        if given == type(options).__dataclass_fields__[name].default or (name == "dtype" and given == "auto"):
            continue  # not given: the session's value is recorded
        same = (torch.device(given).type == torch.device(actual).type and torch.device(given).index in (None, torch.device(actual).index)
                if name == "device" else given == actual)
        if not same:
            conflicts.append(f"{name}={given!r} but the session runs {name}={actual!r}")
    if conflicts:
        raise OptionError(f"{options.name}: options contradict the given session: {'; '.join(conflicts)}. Leave them out "
                          "(the session's are recorded), or load a session with them (or pass no session)")


def open_context(analysis: Analysis, session: ProbeSession | None = None) -> RunContext:
    """Resolve options, load the model (unless ``session`` is given), the dataset and the builder.

    The prompt builder uses the tokenizer of the model under study, so spans and candidates are
    in the model's own token space. With a ``session``, ``model`` names its weights (recorded in
    the results); it defaults to the session's own folder.
    """
    require_session(session)
    options = analysis.resolved()
    torch.manual_seed(options.seed)
    if options.model is not None:
        model: str | Path = options.model
    elif session is not None:
        model = session.model.name_or_path or default_model()
    else:
        model = default_model()
    dataset_name, relevance = resolve_study(model, options.dataset, options.relevance)
    options = dataclasses.replace(options, dataset=resolve_dataset(dataset_name), relevance=relevance)
    check_gate_embedder(options)
    # options and dataset first: a bad value stops the run before the model is loaded
    dataset = _dataset(str(options.dataset))
    if options.items:
        unknown = [d for d in parse_items(options.items)["domains"] if d not in dataset.domains]
        if unknown:
            raise OptionError(f"items {options.items}: {', '.join(map(repr, unknown))} is not a bucket ({', '.join(BUCKETS)}), "
                              f"a domain ({', '.join(dataset.domains)}) or a count; the form is BUCKET:DOMAIN:COUNT, e.g. T_wrong:retail:10")
    items = select_items(dataset, options)
    check_depths(dataset, items, k_max=options.k_max, k=getattr(options, "k", None))
    check_oracle(options)
    if options.format == "prompted" and is_organism(model):
        print("warning: the bundled organism was trained on the native format only; format prompted measures "
              "a format it never saw", file=sys.stderr)
    ranks = world()  # under torchrun: joins the other ranks before the model is loaded
    if session is None:  # each rank of a parallel run on its node's GPU; the option as given is recorded
        session = open_session(dataclasses.replace(options, device=rank_device(options.device, ranks)), model)
    else:  # record what the given session actually runs, not the option defaults (the ranks' GPUs as one device type)
        check_session(options, session)
        runs = session_runs(session)
        options = dataclasses.replace(options, dtype=runs["dtype"], device=session.model.device.type if ranks.size > 1 else runs["device"])
    if session.tokenizer is None:
        raise AnalysisError(f"{model}: no tokenizer next to the weights")
    builder = options.make_builder(session.tokenizer, dataset, retriever=_retriever(options.embedder), tokenizer_name=str(model))
    builder.warm(items)
    skipped: tuple[SkippedItem, ...] = ()
    if options.too_long == "skip":
        limit = getattr(session.model.config.get_text_config(), "max_position_embeddings", None)
        if limit is not None:
            part = partition_by_context(builder, items, max_tokens=limit, k=options.k_max, fmt=options.format)
            items, skipped = part.kept, part.skipped
            if skipped:
                print(f"{analysis.name}: skipped {len(skipped)} items longer than the model's context ({limit} tokens): "
                      + "; ".join(f"{s.item_id} ({s.reason})" for s in skipped), file=sys.stderr)
            if not items:
                raise OptionError(f"every selected item exceeds the model's context ({limit} tokens)")
    model_path = str(Path(str(model)).resolve()) if Path(str(model)).exists() else str(model)
    fingerprint = model_fingerprint(session.model.name_or_path or model, session.tokenizer)  # the folder actually loaded (GGUF: converted)
    out_dir = check_inside(Path(options.out) / model_label(model), options.out)  # a link out of --out is never followed
    return RunContext(analysis.name, options, session, dataset, tuple(items), builder, model_path, out_dir, fingerprint, skipped)


def split_label(options: Any) -> str:
    """The split of a run as reports write it: ``eval``, or ``eval, scenario split`` for another split kind
    (``per analysis`` for a report that leaves it to each analysis)."""
    split = "per analysis" if options.split is None else options.split
    return split if options.split_kind == "template" else f"{split}, {options.split_kind} split"


def provenance(ctx: RunContext, n_items: int | None = None, *, items: bool = True) -> str:
    """One line naming model, dataset, format, margin variant, items and k (figure footnotes, report);
    ``items=False`` leaves the item count out (a composite figure states each panel's own)."""
    a = ctx.options
    n = len(ctx.items) if n_items is None else n_items
    groups = len({item.task_group for item in ctx.items}) if n_items is None else None
    count = f"items: {n}{f' ({groups} task groups)' if groups is not None else ''} · " if items else ""
    return (f"model: {model_label(ctx.model_path)} ({a.dtype}, {a.device}) · dataset: {Path(a.dataset).name} ({split_label(a)}) · "
            f"format: {a.format} · margin: {a.margin_variant} · {count}"
            f"k ≤ {a.k_max} · embedder: {ctx.builder.retriever.embedder.name} · seed {a.seed}")


# ---------------------------------------------------------------------------- jobs
@dataclass(frozen=True)
class Job:
    """One prompt record to score, and the names of the conditions (rows) it yields."""

    item: Item
    config: str
    k: int
    fmt: str
    conditions: tuple[str, ...]
    skills: tuple[str, ...] | None = None  # the ids of the k skills shown instead of the top k (a masked library)

    @property
    def record_id(self) -> str:
        return record_id(self.item.id, self.config, self.k, self.fmt)

    def build(self, builder: PromptBuilder) -> PromptRecord:
        """This job's prompt record: the top k retrieved skills, or ``skills`` in their retrieval order."""
        if self.skills is None:
            return builder.build(self.item, self.config, self.k, self.fmt)
        ranked = {entry.skill.id: entry for entry in builder.retrieve(self.item)}
        return builder.build(self.item, self.config, self.k, self.fmt, retrieved=[ranked[skill] for skill in self.skills])

    def keys(self) -> list[str]:
        return [f"{self.record_id}|{c}" for c in self.conditions]


Scorer = Callable[[PromptRecord, Job], list[dict[str, Any]]]


def run_jobs(ctx: RunContext, store: ResultsStore | ShardedStore, jobs: Sequence[Job], scorer: Scorer) -> int:
    """Score every job whose rows are not all in ``store`` yet; returns the number scored.

    A job whose rows are partly present (a run killed mid-write) is rescored and only the
    missing rows are appended; scoring is deterministic, so the table is the same.

    Under ``torchrun`` (a :class:`~probes.analyses.parallel.ShardedStore`) the pending jobs' items
    are dealt round-robin to the ranks, each scores its own, and the merged results file is complete
    on every rank when this returns; the number is then the total over the ranks.
    """
    done = store.done
    pending = [job for job in jobs if not all(key in done for key in job.keys())]
    if not isinstance(store, ShardedStore):
        return _score_jobs(ctx, store, jobs, pending, scorer)
    ranks = store.world
    # by item, not by job: an item's jobs share their prompt prefix (reused by the engine) on one rank
    order = {item_id: i for i, item_id in enumerate(dict.fromkeys(job.item.id for job in pending))}
    mine = [job for job in pending if order[job.item.id] % ranks.size == ranks.rank]
    scored = _score_jobs(ctx, store, mine, mine, scorer, label=f" [rank {ranks.rank}/{ranks.size}]")
    store.merge(key for job in jobs for key in job.keys())
    return ranks.total(scored)


def _score_jobs(ctx: RunContext, store: ResultsStore | ShardedStore, jobs: Sequence[Job], pending: Sequence[Job], scorer: Scorer,
                label: str = "") -> int:
    with tqdm(total=len(jobs), initial=len(jobs) - len(pending), desc=ctx.name + label, unit="prompt",
              dynamic_ncols=True, smoothing=0.1) as bar:
        for job in pending:
            record = job.build(ctx.builder)
            rows = scorer(record, job)
            for row in rows:
                row["key"] = f"{record.record_id}|{row['condition']}"
            missing = [row for row in rows if row["key"] not in store]
            unexpected = {row["key"] for row in rows} ^ set(job.keys())
            if unexpected:
                raise RuntimeError(f"{job.record_id}: scorer rows {sorted(unexpected)} do not match the job's conditions")
            store.append(missing)
            bar.update(1)
    return len(pending)


def cached_scorer(
    ctx: RunContext,
    conditions_for: Callable[[PromptRecord, Job], Sequence[Knockout]],
    *,
    per_head: bool = False,
    margins: Sequence[str] = MARGINS,
) -> Scorer:
    """A scorer over :func:`score_record` that reuses results for byte-identical prompts of one
    item (k = 0, where every configuration renders the same prompt, and ``base`` at every depth,
    which is that prompt again)."""

    def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
        conditions = list(conditions_for(record, job))
        digest = hashlib.sha256(json.dumps([record.input_ids, [c.to_json() for c in record.candidates], record.spans_json(),
                                            [repr(c) for c in conditions], per_head, list(margins)]).encode()).hexdigest()
        # An item's jobs run together: keep its results only, so memory stays flat over the run.
        for other in [item for item in ctx._score_cache if item != job.item.id]:
            del ctx._score_cache[other]
        cache = ctx._score_cache.setdefault(job.item.id, {})
        if digest not in cache:
            cache[digest] = score_record(ctx.session, record, conditions, variant=ctx.variant, per_head=per_head, margins=margins)
        rows = []
        for cached in cache[digest]:
            row = dict(cached)
            row.update(row_fields(record))
            row["prompt_digest"] = digest[:16]
            rows.append(row)
        return rows

    return scorer
