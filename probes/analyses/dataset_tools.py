"""The dataset tools: ``build``, ``show``, ``shortcuts``, ``audit``, ``card`` and ``bfcl-import``, as options classes and library functions.

Each tool is an options class made of the same :func:`~probes.analyses.option_system.option` fields as the
analyses (the item filters of :class:`~probes.analyses.option_system.ItemOptions`, the builder's settings of
:class:`~probes.analyses.option_system.BuilderOptions`, declared once there) and a function that takes those
options as keywords, so it runs the same from Python and from the command line::

    >>> from probes.analyses import dataset_tools
    >>> result = dataset_tools.build(dataset="basm_probe", limit=2, k_max=2, configs=["basm"], out="records.jsonl")
    >>> record = dataset_tools.show(item="retail-wrong-0003", k=2)

``basm-probes build|show|shortcuts|audit|card|bfcl-import`` derive their flags from these classes
(:func:`probes.cli.flags.add_options`) and call these functions; nothing here knows about argparse.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from probes.analyses.option_system import (
    BuilderOptions,
    DatasetOption,
    ItemOptions,
    OptionError,
    Options,
    REQUIRED,
    depth_option,
    flag_of,
    fold_groups_option,
    folds_option,
    k_max_option,
    option,
    option_fields,
    seed_option,
    shared,
)
from probes.analyses.run_context import check_depths, check_gate_embedder, check_oracle, select_items
from probes.core.chat import BATCH_SIZE, MAX_NEW_TOKENS
from probes.core.text import visible
from probes.data.configs import CONFIGS
from probes.data.bfcl import CATEGORIES as BFCL_CATEGORIES
from probes.data.bfcl import EXTRACTORS
from probes.data.dataset import AUDIT_ACTIONS, BUCKETS, V2_DATASET_DIR, Item, audit_records, fold_groups, load_dataset
from probes.data.extract_llm import RETRIES
from probes.prompts.builder import DEFAULT_K_MAX, FORMATS, SWEEP_K_MAX, PromptBuilder, resolve_study
from probes.prompts.record import PromptRecord
from probes.prompts.spans import SpanReport, check_spans
from probes.prompts.tokenizers import QWEN3_TOKENIZER, load_tokenizer
from probes.scoring.shortcuts import DEFAULT_FOLDS, DEFAULT_RESAMPLES

NO_TOKENIZER = "none"  # shortcuts / card: no tokenizer (words only; no token lengths or collisions)


# ---------------------------------------------------------------------------- shared by the tools
@dataclass(kw_only=True)
class TokenizerOption(Options):
    """The tokenizer of the prompts (``build``, ``show``) or of the statistics (``shortcuts``, ``card``)."""

    tokenizer: str = option(QWEN3_TOKENIZER, "'qwen3' (bundled real Qwen3 tokenizer) or a local folder", group="probe")


@dataclass(kw_only=True)
class BootstrapOptions(Options):
    """The task-group bootstrap of ``shortcuts`` and ``card``."""

    resamples: int = option(DEFAULT_RESAMPLES, "task-group bootstrap resamples", type=int, minimum=1)
    seed: int = seed_option("seed of the bootstrap (and of the folds)")


def _study(options: Any) -> Any:
    """``dataset`` and ``relevance`` resolved by the tokenizer's model (:func:`probes.prompts.builder.resolve_study`)."""
    dataset, relevance = resolve_study(options.tokenizer, options.dataset, options.relevance)
    options = dataclasses.replace(options, dataset=dataset, relevance=relevance)
    check_gate_embedder(options)
    return options


def _make(cls: type, options: dict[str, Any]) -> Any:
    from probes.analyses import make

    return make(cls, options)


# ---------------------------------------------------------------------------- build
@dataclass(kw_only=True)
class BuildOptions(ItemOptions, BuilderOptions, TokenizerOption):
    """Build prompt records (JSON Lines) for items × configs × k × format."""

    name: ClassVar[str] = "build"

    k_max: int | None = k_max_option(SWEEP_K_MAX)
    configs: tuple[str, ...] | None = option(None, "memory configurations (default: all)", flag="--config", repeat=True,
                                             choices=sorted(CONFIGS), group="probe")
    formats: tuple[str, ...] | None = option(None, "decision formats (default: native)", flag="--format", repeat=True,
                                             choices=FORMATS, group="probe")
    workers: int = option(min(2, multiprocessing.cpu_count()), "worker processes (forked)", type=int, minimum=1)
    out: str | Path = option(Path("results/records.jsonl"), "JSON Lines output", type=Path)


@dataclass
class BuildResult:
    """What :func:`build` wrote: the records file, the counts the command prints, the span round-trip."""

    options: BuildOptions
    out: Path
    items: tuple[Item, ...]
    configs: list[str]
    formats: list[str]
    embedder: str
    n_records: int
    report: SpanReport
    collisions: Counter[str] = field(default_factory=Counter)
    tempting_first: Counter[str] = field(default_factory=Counter)
    elapsed: float = 0.0

    @property
    def status(self) -> int:
        return 1 if self.report.mismatches else 0

    def print_summary(self) -> None:
        o = self.options
        per_bucket = Counter(item.bucket for item in self.items)
        print(f"wrote {self.n_records} prompt records for {len(self.items)} items to {self.out} in {self.elapsed:.1f} s")
        print(f"embedder: {self.embedder}; tokenizer: {o.tokenizer}; configs: {', '.join(self.configs)}; k = 0..{o.k_max}; "
              f"formats: {', '.join(self.formats)}")
        print(f"span round-trip: {self.report.summary()}")
        for bucket in BUCKETS:
            if per_bucket[bucket]:
                print(f"{bucket}: {per_bucket[bucket]} items, tempting skill ranked first in {self.tempting_first[bucket] / per_bucket[bucket]:.1%}, "
                      f"records with first-token collisions: {self.collisions[bucket]}")
        for line in self.report.mismatches[:20]:
            print("MISMATCH", line, file=sys.stderr)


_WORKER_BUILDER: PromptBuilder | None = None
_WORKER_JOB: tuple[Sequence[str], Sequence[int], Sequence[str]] = ((), (), ())


def _build_item(item: Item) -> tuple[list[dict[str, Any]], SpanReport]:
    assert _WORKER_BUILDER is not None
    configs, ks, formats = _WORKER_JOB
    report = SpanReport()
    records = []
    for record in _WORKER_BUILDER.build_many([item], configs, ks, formats):
        check_spans(record, _WORKER_BUILDER.tokenizer, report)
        records.append(record.to_json())
    return records, report


def build_records(builder: PromptBuilder, items: Sequence[Item], configs: Sequence[str], ks: Sequence[int], formats: Sequence[str], *,
                  workers: int = 1) -> Iterator[tuple[list[dict[str, Any]], SpanReport]]:
    """Yield (records of one item, span report) in item order; ``workers`` > 1 forks processes."""
    global _WORKER_BUILDER, _WORKER_JOB
    builder.warm(items)  # embeddings computed once in the parent, inherited by forked workers
    _WORKER_BUILDER, _WORKER_JOB = builder, (configs, ks, formats)
    if workers <= 1:
        yield from map(_build_item, items)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_build_item, items, chunksize=4)


def build(**options: Any) -> BuildResult:
    """Build the prompt records of the selected items × configurations × k = 0..k_max × formats and write
    them to ``out`` (JSON Lines, replaced whole at the end); options: :class:`BuildOptions`."""
    from probes.core.files import atomic_text

    start = time.perf_counter()
    o = _study(_make(BuildOptions, options))
    dataset = load_dataset(o.dataset)
    items = select_items(dataset, o)
    check_depths(dataset, items, k_max=o.k_max)
    check_oracle(o)
    builder = o.make_builder(load_tokenizer(o.tokenizer), dataset, tokenizer_name=str(o.tokenizer))
    configs = list(o.configs or CONFIGS)
    formats = list(o.formats or ["native"])
    result = BuildResult(o, Path(o.out), items, configs, formats, builder.retriever.embedder.name, 0, SpanReport())
    # into a temporary file renamed at the end: a killed or failing build leaves the old out whole
    with atomic_text(result.out) as handle:
        for records, item_report in build_records(builder, items, configs, list(range(o.k_max + 1)), formats, workers=o.workers):
            result.report.exact += item_report.exact
            result.report.whitespace_edges += item_report.whitespace_edges
            result.report.mismatches += item_report.mismatches
            for record in records:
                handle.write(json.dumps(record) + "\n")
                result.collisions[record["bucket"]] += record["collision"]
            result.n_records += len(records)
            result.tempting_first[records[0]["bucket"]] += records[0]["tempting_rank"] == 1
    result.elapsed = time.perf_counter() - start
    return result


# ---------------------------------------------------------------------------- show
@dataclass(kw_only=True)
class ShowOptions(DatasetOption, BuilderOptions, TokenizerOption):
    """Print one prompt with its procedure and boundary spans highlighted."""

    name: ClassVar[str] = "show"

    item: str = option(REQUIRED, "item id, e.g. retail-wrong-0003", positional=True)
    k_max: int | None = k_max_option(SWEEP_K_MAX)
    config: str = option("basm", "memory configuration", choices=sorted(CONFIGS), group="probe")
    k: int = depth_option(DEFAULT_K_MAX, "retrieval depth")
    format: str = option("native", "decision format", choices=FORMATS, group="probe")


def prompt_record(**options: Any) -> PromptRecord:
    """The prompt record of one item (options: :class:`ShowOptions`), built as ``build`` builds it."""
    o = _study(_make(ShowOptions, options))
    dataset = load_dataset(o.dataset)
    try:
        (item,) = dataset.select(ids=[o.item])
    except ValueError as error:
        raise OptionError(f"{o.item!r}: {error}") from error
    check_depths(dataset, [item], k_max=o.k_max, k=o.k)
    check_oracle(o)
    builder = o.make_builder(load_tokenizer(o.tokenizer), dataset, tokenizer_name=str(o.tokenizer))
    return builder.build(item, o.config, o.depth, o.format)


def print_record(record: PromptRecord) -> None:
    """One prompt record on the console: the text with P and B highlighted, the candidates, the retrieved skills.
    Every text is printed :func:`~probes.core.text.visible` and as plain text (rich markup such as
    ``[red]`` in an item or a tool name is printed, not applied)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def plain(value: Any) -> Text:
        return Text(visible(str(value)))

    styles = {"procedure": "bold green", "boundary": "bold magenta"}
    styled = [(int(record.offsets[lo][0]), int(record.offsets[hi - 1][1]), style)
              for name, style in styles.items() for lo, hi in record.spans.get(name, [])]  # character ranges
    cuts = sorted({0, len(record.text), *(edge for lo, hi, _ in styled for edge in (lo, hi))})
    text = Text()
    for a, b in zip(cuts, cuts[1:]):  # the prompt cut where a span starts or ends, each piece made visible
        style = next((style for lo, hi, style in reversed(styled) if lo <= a and b <= hi), None)  # B over P where they meet
        text.append(visible(record.text[a:b]), style=style)
    console = Console()
    console.rule(plain(f"{record.record_id}  ({record.n_tokens} tokens, {record.bucket}, correct: {record.correct_action})"))
    console.print(text)
    console.print(Text.assemble(("procedure span P", styles["procedure"]), "   ", (f"boundary span B ({record.spans_kind['boundary']})", styles["boundary"])))
    table = Table(title=f"candidates (decision row {record.decision_index}, open row {record.open_index})")
    for column in ("role", "action", "anchor", "token ids", "collides with"):
        table.add_column(column)
    for candidate in record.candidates:
        table.add_row(*map(plain, (candidate.role, candidate.action, candidate.anchor_index, candidate.token_ids, ", ".join(candidate.collides_with))))
    console.print(table)
    skills = ", ".join(f"{s.rank}. {s.skill_id} ({s.score:.3f}{', boundary' if s.boundary_exposed else ''})" for s in record.skills)
    console.print(plain(f"retrieved: {skills or '—'}  | embedder: {record.retrieval['embedder']} | retrieval: {record.retrieval_mode} | "
                        f"tempting skill {record.tempting_skill}: Eq. 8 rank {record.tempting_rank}, shown rank {record.tempting_shown_rank}"))


def show(**options: Any) -> PromptRecord:
    """Print the prompt record of one item with its spans highlighted (:func:`print_record`) and return it."""
    record = prompt_record(**options)
    print_record(record)
    return record


# ---------------------------------------------------------------------------- shortcuts, card
@dataclass(kw_only=True)
class ShortcutsOptions(DatasetOption, TokenizerOption, BootstrapOptions):
    """Shortcut baselines of a dataset (request length, lexical-overlap rule, bag of words; no model)."""

    name: ClassVar[str] = "shortcuts"

    dataset: str | Path | None = shared(DatasetOption, "dataset", default=V2_DATASET_DIR,
                                        help="probe dataset folder or bundled name (default: the bundled basm_probe_v2)")
    tokenizer: str = shared(TokenizerOption, "tokenizer", help=f"tokenizer of the token-length rule ('{NO_TOKENIZER}': words only)")
    split_kind: str = shared(ItemOptions, "split_kind")
    folds: int = folds_option(DEFAULT_FOLDS, "grouped folds of the bag-of-words classifier (groups: --fold-groups)", "run")
    fold_groups: str = fold_groups_option("run")
    out: str | Path | None = option(None, "write the table as CSV here", type=Path)


def shortcuts(**options: Any) -> pd.DataFrame:
    """The shortcut baselines of a dataset (:func:`probes.scoring.shortcuts.shortcut_table`; options:
    :class:`ShortcutsOptions`), written as CSV to ``out`` when given."""
    from probes.scoring.shortcuts import shortcut_table

    o = _make(ShortcutsOptions, options)
    dataset = load_dataset(o.dataset)
    try:
        fold_groups(dataset.items, o.fold_groups)
    except ValueError as error:
        raise OptionError(f"--fold-groups {o.fold_groups}: {error}") from error
    tokenizer = None if o.tokenizer == NO_TOKENIZER else load_tokenizer(o.tokenizer)
    table = shortcut_table(dataset, split_kind=o.split_kind, tokenizer=tokenizer, folds=o.folds,
                           fold_groups=o.fold_groups, resamples=o.resamples, seed=o.seed)
    if o.out is not None:
        from probes.core.files import write_csv

        write_csv(table, o.out)
    return table


@dataclass(kw_only=True)
class AuditOptions(DatasetOption):
    """List a dataset's audited labels: every kept, relabelled and dropped item with its rule and reason."""

    name: ClassVar[str] = "audit"

    dataset: str | Path | None = shared(DatasetOption, "dataset", default=V2_DATASET_DIR,
                                        help="probe dataset folder or bundled name (default: the bundled basm_probe_v2)")
    actions: tuple[str, ...] | None = option(None, "only these audit actions (default: all)", flag="--action", repeat=True,
                                             choices=AUDIT_ACTIONS)


def audit(**options: Any) -> pd.DataFrame:
    """The audited labels of a dataset (:func:`probes.data.dataset.audit_records`; options:
    :class:`AuditOptions`): columns ``id, bucket, category, rule, action, reason``."""
    o = _make(AuditOptions, options)
    table = pd.DataFrame(audit_records(load_dataset(o.dataset)), columns=["id", "bucket", "category", "rule", "action", "reason"])
    return table[table.action.isin(o.actions)].reset_index(drop=True) if o.actions else table


@dataclass(kw_only=True)
class CardOptions(TokenizerOption, BootstrapOptions):
    """Write a dataset's CARD.md: counts, shortcut baselines and first-token collision rates, measured."""

    name: ClassVar[str] = "card"

    dataset: str | Path = option(REQUIRED, "dataset folder; CARD.md is (re)written there", type=Path, positional=True)
    tokenizer: str = shared(TokenizerOption, "tokenizer", help=f"tokenizer of the length and collision statistics ('{NO_TOKENIZER}': skip them)")


def card(**options: Any) -> Path:
    """Write the dataset's measured ``CARD.md`` (:func:`probes.reporting.cards.write_card`; options:
    :class:`CardOptions`); returns its path."""
    from probes.reporting.cards import write_card

    o = _make(CardOptions, options)
    return write_card(o.dataset, tokenizer=None if o.tokenizer == NO_TOKENIZER else o.tokenizer, resamples=o.resamples, seed=o.seed)


# ---------------------------------------------------------------------------- bfcl-import
@dataclass(kw_only=True)
class BFCLImportOptions(Options):
    """Turn the BFCL multi-turn data (bfcl-eval package) into a probe dataset folder."""

    name: ClassVar[str] = "bfcl-import"

    out: str | Path = option(REQUIRED, "dataset folder to write (loads with --dataset OUT)", type=Path)
    overwrite: bool = option(False, "replace a non-empty --out that is not a previous BFCL import", type=bool)
    bfcl_dir: str | Path | None = option(None, "BFCL data folder (default: the installed bfcl-eval package's)", type=Path)
    categories: tuple[str, ...] = option(BFCL_CATEGORIES, "comma-separated multi-turn categories of the probe items",
                                         names=BFCL_CATEGORIES, minimum=1)
    skill_fraction: float = option(0.5, "share of entries whose trajectories feed skill extraction", type=float, minimum=0.0, maximum=1.0,
                                   exclusive=True, why="both the skill-source and the probe entries must be some")
    seed: int = seed_option("seed of the entry split")
    max_probe_entries: int | None = option(None, "keep only the first N probe entries (a small sample)", type=int, minimum=1)
    card: bool = option(True, "do not write CARD.md (its shortcut tables take minutes on two cores); a previous one is removed, "
                        "not left stale", type=bool, flag="--no-card")
    extractor: str = option("deterministic", "f_ext of the skills: the deterministic templates, or a local chat model (--llm-model)",
                            choices=EXTRACTORS, group="skill extractor")
    llm_model: str | Path | None = option(None, "chat model of --extractor llm: a local folder, a name in the local HF cache or a "
                                          ".gguf file", type=Path, group="skill extractor")
    llm_max_new_tokens: int = option(MAX_NEW_TOKENS, "reply budget of the chat model (--extractor llm)", type=int, minimum=1,
                                     group="skill extractor")
    llm_batch_size: int = option(BATCH_SIZE, "replies the chat model generates together (--extractor llm; greedy replies in a "
                                 "batch can differ from one-at-a-time ones by float rounding)", type=int, minimum=1, group="skill extractor")
    llm_retries: int = option(RETRIES, "corrected replies asked for after a rejected one (--extractor llm)", type=int, minimum=0,
                              group="skill extractor")
    llm_dtype: str = option("float32", "dtype of the chat model (--extractor llm)", choices=("float32", "bfloat16", "float16", "auto"),
                            group="skill extractor")
    llm_device: str = option("cpu", "device of the chat model (--extractor llm): cpu, cuda, cuda:N, mps", group="skill extractor")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.extractor == "llm" and self.llm_model is None:
            raise OptionError("--extractor llm needs --llm-model (a local chat model folder, HF cache name or .gguf file)")
        llm_only = [flag_of(f) for f in option_fields(type(self))
                    if f.name.startswith("llm_") and getattr(self, f.name) != f.default]
        if self.extractor != "llm" and llm_only:
            raise OptionError(f"{', '.join(llm_only)}: used only with --extractor llm")


def bfcl_import(**options: Any) -> Any:
    """Import the BFCL multi-turn data (:func:`probes.data.bfcl.import_bfcl`; options:
    :class:`BFCLImportOptions`; ``llm_model`` is loaded with
    :class:`~probes.engine.generate.ChatGenerator`), then write the folder's measured ``CARD.md``
    (:func:`probes.reporting.cards.write_card`, unless ``card`` is off); returns the import's report."""
    from probes.data import bfcl
    from probes.reporting.cards import write_card

    o = _make(BFCLImportOptions, options)
    llm_model = None
    if o.extractor == "llm":
        from probes.engine.generate import ChatGenerator  # torch: only for the LLM extractor

        llm_model = ChatGenerator.load(o.llm_model, max_new_tokens=o.llm_max_new_tokens, batch_size=o.llm_batch_size, dtype=o.llm_dtype, device=o.llm_device)
    try:
        report = bfcl.import_bfcl(out=o.out, bfcl_dir=o.bfcl_dir, categories=o.categories, skill_fraction=o.skill_fraction, seed=o.seed,
                                  max_probe_entries=o.max_probe_entries, extractor=o.extractor, llm_model=llm_model,
                                  llm_retries=o.llm_retries, overwrite=o.overwrite)
    except (bfcl.BFCLDataError, OptionError):
        raise  # missing or malformed BFCL data: a data error
    except ValueError as error:  # the importer's checks of its arguments and of --out
        raise OptionError(str(error)) from error
    if o.card:  # the import removed the previous card: it measured the previous items
        write_card(o.out)
    return report
