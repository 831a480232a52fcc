"""The ``basm-probes`` command line.

Subcommands are registered in :data:`COMMANDS` (name → help, adder of arguments, runner); the
analyses' come from the registry (:func:`probes.analyses.catalogue`). Heavy modules (torch, the
prompt builder, the datasets) are imported by the command that uses them, so ``basm-probes --help``
imports none of them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from probes import analyses

if TYPE_CHECKING:
    from probes.data.dataset import Item, ProbeDataset
    from probes.prompts.builder import PromptBuilder
    from probes.prompts.spans import SpanReport


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def register(name: str, help_text: str, add_arguments: Callable[[argparse.ArgumentParser], None], run: Callable[[argparse.Namespace], int]) -> None:
    COMMANDS[name] = Command(help_text, add_arguments, run)


# ---------------------------------------------------------------------------- shared options
def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.data.dataset import BUCKETS, SPLIT_KINDS

    group = parser.add_argument_group("items")
    group.add_argument("--dataset", type=Path, help="probe dataset folder (default: the bundled v1 set for the bundled organism's "
                       "tokenizer, basm_probe_v2 otherwise)")
    group.add_argument("--bucket", action="append", choices=BUCKETS, help="keep only these buckets (repeatable)")
    group.add_argument("--domain", action="append", help="keep only these domains (repeatable)")
    group.add_argument("--split", choices=("train", "eval", "all"), default="eval", help="dataset split (default: eval)")
    group.add_argument("--split-kind", choices=SPLIT_KINDS, default="template",
                       help="which split --split reads: template (the item field split) or scenario (split_scenario; basm_probe_v2)")
    group.add_argument("--limit", type=int, help="keep N items of each bucket, taken round-robin over task groups (one item per group first)")
    group.add_argument("--item", action="append", dest="item_ids", help="keep only these item ids (repeatable)")


def add_builder_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.data.retrieval import EMBEDDERS, RELEVANCE_MEASURES
    from probes.prompts.builder import BuildSettings
    from probes.prompts.tokenizers import QWEN3_TOKENIZER

    group = parser.add_argument_group("prompt builder")
    group.add_argument("--tokenizer", default=QWEN3_TOKENIZER, help="'qwen3' (bundled real Qwen3 tokenizer) or a local folder")
    group.add_argument("--embedder", choices=EMBEDDERS, default="auto")
    group.add_argument("--gamma", type=float, default=BuildSettings.gamma, help="boundary relevance gate γ (Eq. 10)")
    group.add_argument("--relevance", choices=RELEVANCE_MEASURES, help="r_B of the gate: lexical or semantic "
                       "(default: lexical for the bundled organism's tokenizer, semantic otherwise)")
    group.add_argument("--beta", type=int, default=BuildSettings.beta, help="boundary token budget β (Eq. 10)")
    group.add_argument("--k-max", type=int, default=BuildSettings.k_max, help="largest retrieval depth K")


def select_build_items(dataset: ProbeDataset, args: argparse.Namespace) -> tuple[Item, ...]:
    """The items of ``build`` / ``show``: the library's selection (:func:`probes.analyses.base.select_items`)."""
    from probes.analyses.base import select_items

    return select_items(dataset, SimpleNamespace(buckets=args.bucket, domains=args.domain, split=args.split,
                                                 split_kind=args.split_kind, item_ids=args.item_ids, limit=args.limit))


def check_build_options(args: argparse.Namespace, dataset: ProbeDataset, items: Sequence[Item]) -> None:
    from probes.analyses.base import OptionError, check_depths

    if args.limit is not None and args.limit < 1:
        raise OptionError(f"--limit {args.limit}: must be ≥ 1 (items per bucket)")
    for flag, k in (("--k-max", args.k_max), ("--k", getattr(args, "k", None))):
        if k is not None and k < 0:
            raise OptionError(f"{flag} {k}: the retrieval depth must be ≥ 0")
    check_depths(dataset, items, k_max=args.k_max, k=getattr(args, "k", None))
    if args.beta < 0:
        raise OptionError(f"--beta {args.beta}: the boundary token budget must be ≥ 0")


def resolve_study(args: argparse.Namespace) -> argparse.Namespace:
    """``--dataset`` and ``--relevance`` default to the study defaults of the tokenizer's model
    (:func:`probes.data.dataset.default_study`)."""
    from probes.data.dataset import default_study
    from probes.organism import is_organism

    study_dataset, study_relevance = default_study(organism=is_organism(args.tokenizer))
    args.dataset = args.dataset or study_dataset
    args.relevance = getattr(args, "relevance", None) or study_relevance
    return args


def make_builder(args: argparse.Namespace, dataset: ProbeDataset, tokenizer: Any | None = None) -> PromptBuilder:
    from probes.data.retrieval import RetrievalWeights, Retriever, make_embedder
    from probes.prompts.builder import BuildSettings, PromptBuilder
    from probes.prompts.tokenizers import load_tokenizer

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(args.tokenizer)
    settings = BuildSettings(k_max=args.k_max, gamma=args.gamma, relevance=args.relevance, beta=args.beta)
    return PromptBuilder(tokenizer, dataset, Retriever(make_embedder(args.embedder), RetrievalWeights()), settings, tokenizer_name=str(args.tokenizer))


# ---------------------------------------------------------------------------- build
_WORKER_BUILDER: PromptBuilder | None = None
_WORKER_JOB: tuple[Sequence[str], Sequence[int], Sequence[str]] = ((), (), ())


def _build_item(item: Item) -> tuple[list[dict[str, Any]], SpanReport]:
    from probes.prompts.spans import SpanReport, check_spans

    assert _WORKER_BUILDER is not None
    configs, ks, formats = _WORKER_JOB
    report = SpanReport()
    records = []
    for record in _WORKER_BUILDER.build_many([item], configs, ks, formats):
        check_spans(record, _WORKER_BUILDER.tokenizer, report)
        records.append(record.to_json())
    return records, report


def build_records(builder: PromptBuilder, items: Sequence[Item], configs: Sequence[str], ks: Sequence[int], formats: Sequence[str], *, workers: int = 1):
    """Yield (records of one item, span report) in item order; ``workers`` > 1 forks processes."""
    global _WORKER_BUILDER, _WORKER_JOB
    builder.warm(items)  # embeddings computed once in the parent, inherited by forked workers
    _WORKER_BUILDER, _WORKER_JOB = builder, (configs, ks, formats)
    if workers <= 1:
        yield from map(_build_item, items)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_build_item, items, chunksize=4)


def _build_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.data.configs import CONFIGS
    from probes.prompts.builder import FORMATS

    add_dataset_arguments(parser)
    add_builder_arguments(parser)
    parser.add_argument("--config", action="append", dest="configs", choices=sorted(CONFIGS), help="memory configurations (default: all)")
    parser.add_argument("--format", action="append", dest="formats", choices=FORMATS, help="decision formats (default: native)")
    parser.add_argument("--workers", type=int, default=min(2, multiprocessing.cpu_count()))
    parser.add_argument("--out", type=Path, default=Path("results/records.jsonl"), help="JSON Lines output")


def _build(args: argparse.Namespace) -> int:
    from probes.data.configs import CONFIGS
    from probes.data.dataset import BUCKETS, load_dataset
    from probes.prompts.spans import SpanReport
    from probes.reporting.results import atomic_path

    start = time.perf_counter()
    dataset = load_dataset(resolve_study(args).dataset)
    items = select_build_items(dataset, args)
    check_build_options(args, dataset, items)
    builder = make_builder(args, dataset)
    configs = args.configs or list(CONFIGS)
    formats = args.formats or ["native"]
    ks = list(range(args.k_max + 1))
    report = SpanReport()
    n_records = 0
    collisions: Counter[str] = Counter()
    tempting_first: Counter[str] = Counter()
    # into a temporary file renamed at the end: a killed or failing build leaves the old --out whole
    with atomic_path(args.out) as tmp, tmp.open("w") as handle:
        for records, item_report in build_records(builder, items, configs, ks, formats, workers=args.workers):
            report.exact += item_report.exact
            report.whitespace_edges += item_report.whitespace_edges
            report.mismatches += item_report.mismatches
            for record in records:
                handle.write(json.dumps(record) + "\n")
                collisions[record["bucket"]] += record["collision"]
            n_records += len(records)
            tempting_first[records[0]["bucket"]] += records[0]["tempting_rank"] == 1
    elapsed = time.perf_counter() - start
    per_bucket = Counter(item.bucket for item in items)
    print(f"wrote {n_records} prompt records for {len(items)} items to {args.out} in {elapsed:.1f} s")
    print(f"embedder: {builder.retriever.embedder.name}; tokenizer: {args.tokenizer}; configs: {', '.join(configs)}; k = 0..{args.k_max}; formats: {', '.join(formats)}")
    print(f"span round-trip: {report.summary()}")
    for bucket in BUCKETS:
        if per_bucket[bucket]:
            print(f"{bucket}: {per_bucket[bucket]} items, tempting skill ranked first in {tempting_first[bucket] / per_bucket[bucket]:.1%}, records with first-token collisions: {collisions[bucket]}")
    for line in report.mismatches[:20]:
        print("MISMATCH", line, file=sys.stderr)
    return 1 if report.mismatches else 0


register("build", "Build prompt records (JSON Lines) for items × configs × k × format.", _build_arguments, _build)


# ---------------------------------------------------------------------------- show
def _show_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.data.configs import CONFIGS
    from probes.prompts.builder import FORMATS

    parser.add_argument("item", help="item id, e.g. retail-wrong-0003")
    parser.add_argument("--dataset", type=Path, help="probe dataset folder (default as for build)")
    parser.set_defaults(limit=None)
    add_builder_arguments(parser)
    parser.add_argument("--config", default="basm", choices=sorted(CONFIGS))
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--format", default="native", choices=FORMATS)


def _show(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from probes.analyses.base import OptionError
    from probes.data.dataset import load_dataset

    dataset = load_dataset(resolve_study(args).dataset)
    try:
        (item,) = dataset.select(ids=[args.item])
    except ValueError as error:
        raise OptionError(f"{args.item!r}: {error}") from error
    check_build_options(args, dataset, [item])
    builder = make_builder(args, dataset)
    record = builder.build(item, args.config, args.k, args.format)
    styles = {"procedure": "bold green", "boundary": "bold magenta"}
    text = Text(record.text)
    offsets = record.offsets
    for name, style in styles.items():
        for lo, hi in record.spans.get(name, []):
            text.stylize(style, offsets[lo][0], offsets[hi - 1][1])
    console = Console()
    console.rule(f"{record.record_id}  ({record.n_tokens} tokens, {record.bucket}, correct: {record.correct_action})")
    console.print(text)
    console.print(Text.assemble(("procedure span P", styles["procedure"]), "   ", (f"boundary span B ({record.spans_kind['boundary']})", styles["boundary"])))
    table = Table(title=f"candidates (decision row {record.decision_index}, open row {record.open_index})")
    for column in ("role", "action", "anchor", "token ids", "collides with"):
        table.add_column(column)
    for candidate in record.candidates:
        table.add_row(candidate.role, candidate.action, str(candidate.anchor_index), str(candidate.token_ids), ", ".join(candidate.collides_with))
    console.print(table)
    skills = ", ".join(f"{s.rank}. {s.skill_id} ({s.score:.3f}{', boundary' if s.boundary_exposed else ''})" for s in record.skills)
    console.print(f"retrieved: {skills or '—'}  | embedder: {record.retrieval['embedder']}")
    return 0


register("show", "Print one prompt with its procedure and boundary spans highlighted.", _show_arguments, _show)


# ---------------------------------------------------------------------------- bfcl-import
def _bfcl_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.data.bfcl import CATEGORIES, EXTRACTORS
    from probes.data.extract_llm import MAX_NEW_TOKENS, RETRIES

    parser.add_argument("--out", type=Path, required=True, help="dataset folder to write (loads with --dataset OUT)")
    parser.add_argument("--bfcl-dir", type=Path, help="BFCL data folder (default: the installed bfcl-eval package's)")
    parser.add_argument("--categories", default="base,miss_func,miss_param",
                        help=f"comma-separated multi-turn categories of the probe items (of {','.join(CATEGORIES)})")
    parser.add_argument("--skill-fraction", type=float, default=0.5, help="share of entries whose trajectories feed skill extraction")
    parser.add_argument("--seed", type=int, default=0, help="seed of the entry split")
    parser.add_argument("--max-probe-entries", type=int, help="keep only the first N probe entries (a small sample)")
    group = parser.add_argument_group("skill extractor")
    group.add_argument("--extractor", choices=EXTRACTORS, default="deterministic",
                       help="f_ext of the skills: the deterministic templates, or a local chat model (--llm-model)")
    group.add_argument("--llm-model", help="chat model of --extractor llm: a local folder, a name in the local HF cache or a .gguf file")
    group.add_argument("--llm-max-new-tokens", type=int, help=f"reply budget of the chat model (default {MAX_NEW_TOKENS})")
    group.add_argument("--llm-retries", type=int, help=f"corrected replies asked for after a rejected one (default {RETRIES})")
    group.add_argument("--llm-dtype", help="dtype of the chat model: float32 (default), bfloat16, float16, auto")
    group.add_argument("--llm-device", help="device of the chat model: cpu (default), cuda, cuda:N, mps")


def _bfcl_import(args: argparse.Namespace) -> int:
    from probes.analyses.base import OptionError
    from probes.data.bfcl import BFCLDataError, import_bfcl
    from probes.data.extract_llm import MAX_NEW_TOKENS, RETRIES

    llm_flags = {"--llm-model": args.llm_model, "--llm-max-new-tokens": args.llm_max_new_tokens, "--llm-retries": args.llm_retries,
                 "--llm-dtype": args.llm_dtype, "--llm-device": args.llm_device}
    llm_model, retries = None, RETRIES if args.llm_retries is None else args.llm_retries
    if args.extractor == "llm":
        if args.llm_model is None:
            raise OptionError("--extractor llm needs --llm-model (a local chat model folder, HF cache name or .gguf file)")
        max_new_tokens = MAX_NEW_TOKENS if args.llm_max_new_tokens is None else args.llm_max_new_tokens
        if max_new_tokens < 1 or retries < 0:
            raise OptionError(f"--llm-max-new-tokens must be ≥ 1 and --llm-retries ≥ 0, got {max_new_tokens} and {retries}")
        from probes.engine.generate import ChatGenerator

        llm_model = ChatGenerator.load(args.llm_model, max_new_tokens=max_new_tokens, dtype=args.llm_dtype or "float32",
                                       device=args.llm_device or "cpu")
    elif given := [flag for flag, value in llm_flags.items() if value is not None]:
        raise OptionError(f"{', '.join(given)}: used only with --extractor llm")
    try:
        report = import_bfcl(out=args.out, bfcl_dir=args.bfcl_dir, categories=[c.strip() for c in args.categories.split(",") if c.strip()],
                             skill_fraction=args.skill_fraction, seed=args.seed, max_probe_entries=args.max_probe_entries,
                             extractor=args.extractor, llm_model=llm_model, llm_retries=retries)
    except BFCLDataError:
        raise  # missing or malformed BFCL data: reported as a data error
    except ValueError as error:
        raise OptionError(str(error)) from error
    print(report.summary())
    return 0


register("bfcl-import", "Turn the BFCL multi-turn data (bfcl-eval package) into a probe dataset folder.", _bfcl_arguments, _bfcl_import)


# ---------------------------------------------------------------------------- shortcuts, card
def _shortcuts_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.data.dataset import V2_DATASET_DIR
    from probes.prompts.tokenizers import QWEN3_TOKENIZER

    parser.add_argument("--dataset", type=Path, default=V2_DATASET_DIR, help="probe dataset folder (default: the bundled basm_probe_v2)")
    parser.add_argument("--split-kind", choices=("template", "scenario"), default="template", help="which held-out split")
    parser.add_argument("--tokenizer", default=QWEN3_TOKENIZER, help="tokenizer of the token-length rule ('none': words only)")
    parser.add_argument("--folds", type=int, default=5, help="task-disjoint folds of the bag-of-words classifier")
    parser.add_argument("--resamples", type=int, default=1000, help="task-group bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the table as CSV here")


def _shortcuts(args: argparse.Namespace) -> int:
    from probes.data.dataset import load_dataset
    from probes.prompts.tokenizers import load_tokenizer
    from probes.scoring.shortcuts import best_shortcut, shortcut_table

    tokenizer = None if args.tokenizer == "none" else load_tokenizer(args.tokenizer)
    table = shortcut_table(load_dataset(args.dataset), split_kind=args.split_kind, tokenizer=tokenizer, folds=args.folds,
                           resamples=args.resamples, seed=args.seed)
    print(table.round(3).to_string(index=False))
    best = best_shortcut(table)
    print("best no-model shortcut on eval: " + "; ".join(f"{k} {v['value']:.3f} ({v['shortcut']})" for k, v in best.items()))
    if args.out is not None:
        from probes.reporting.results import write_csv

        write_csv(table, args.out)
        print(f"wrote {args.out}")
    return 0


def _card_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.prompts.tokenizers import QWEN3_TOKENIZER

    parser.add_argument("dataset", type=Path, help="dataset folder; CARD.md is (re)written there")
    parser.add_argument("--tokenizer", default=QWEN3_TOKENIZER, help="tokenizer of the length and collision statistics ('none': skip them)")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)


def _card(args: argparse.Namespace) -> int:
    from probes.reporting.cards import write_card

    path = write_card(args.dataset, tokenizer=None if args.tokenizer == "none" else args.tokenizer, resamples=args.resamples, seed=args.seed)
    print(f"wrote {path}")
    return 0


register("shortcuts", "Shortcut baselines of a dataset (request length, lexical-overlap rule, bag of words; no model).",
         _shortcuts_arguments, _shortcuts)
register("card", "Write a dataset's CARD.md: counts, shortcut baselines and first-token collision rates, measured.", _card_arguments, _card)


# ---------------------------------------------------------------------------- probe analyses
def _analysis_command(name: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    """The flags (derived from the keyword options) and the runner of ``basm-probes NAME``:
    ``probes.analyses.run(NAME, **options)``. The class is imported when its command is used."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from probes.cli.options import add_options

        add_options(parser, analyses.options_of(name))

    def run(args: argparse.Namespace) -> int:
        from probes.cli.options import options_from_args

        return analyses.run(name, **options_from_args(args, analyses.options_of(name))).status

    return add_arguments, run


REPORT_HELP = "Run the chosen analyses; write figures (PNG+PDF) and report.md next to the paper's numbers."


ORGANISM_COMMANDS = {
    "train": "train the bundled model organism from the dataset's train split",
    "validate": "test on held-out items that the probes recover the planted mechanism",
    "card": "rerun the held-out check and the validation; rewrite validation.json and the model card",
}


def _organism_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.cli import organism

    actions = parser.add_subparsers(dest="organism_command", required=True)
    for name, help_text in ORGANISM_COMMANDS.items():
        getattr(organism, f"{name}_arguments")(actions.add_parser(name, help=help_text, description=help_text))


def _organism(args: argparse.Namespace) -> int:
    from probes.cli import organism

    return getattr(organism, args.organism_command)(args)


register("organism", "The bundled model organism: `organism train` retrains it, `organism validate` checks the probes on it, "
         "`organism card` rewrites its validation and model card.",
         _organism_arguments, _organism)


# ---------------------------------------------------------------------------- entry point
def commands() -> dict[str, Command]:
    """Every subcommand in help order: the dataset tools, the registered analyses (report order),
    ``report``, ``organism``."""
    tools = {name: spec for name, spec in COMMANDS.items() if name != "organism"}
    analysis_commands = {entry.name: Command(entry.help, *_analysis_command(entry.name)) for entry in analyses.catalogue().values()}
    clashes = set(tools) & set(analysis_commands)
    if clashes:
        raise RuntimeError(f"analyses {sorted(clashes)} are named like a built-in command; rename them")
    return {**tools, **analysis_commands, analyses.REPORT: Command(REPORT_HELP, *_analysis_command(analyses.REPORT)),
            "organism": COMMANDS["organism"]}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s flags are built (an analysis's come from its class, which
    imports torch), every command's with None, none with "" (the top-level help lists the commands)."""
    parser = argparse.ArgumentParser(prog="basm-probes", description="Probe boundary-aware skill memory inside local HF models.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, spec in commands().items():
        sub = subparsers.add_parser(name, help=spec.help, description=spec.help)
        if command is None or name == command:
            spec.add_arguments(sub)
        sub.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return parser


def _known_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message says what went wrong, where and what to do (no traceback needed).
    Imported when an error happens: these modules load torch."""
    from probes.analyses.base import AnalysisError, OptionError
    from probes.analyses.parallel import ParallelError
    from probes.data.dataset import DatasetError
    from probes.engine.loading import ModelLoadError, PromptTooLongError
    from probes.reporting.results import ResultsConfigMismatch, ResultsCorrupt, ResultsLocked

    return (OptionError, AnalysisError, DatasetError, ModelLoadError, PromptTooLongError, ResultsConfigMismatch,
            ResultsCorrupt, ResultsLocked, ParallelError, OSError)


USAGE_ERRORS = 2  # exit code of a bad option (as argparse's own); other known errors exit 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(next((token for token in argv if not token.startswith("-")), ""))
    args = parser.parse_args(argv)
    try:
        return commands()[args.command].run(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("\ninterrupted: the rows written so far are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug or not isinstance(error, _known_errors()):
            raise
        message = f"{error.strerror}: {error.filename}" if isinstance(error, OSError) and error.filename else str(error)
        print(f"basm-probes {args.command}: error: {message}\n(rerun with --debug for the traceback)", file=sys.stderr)
        from probes.analyses.base import AnalysisError, OptionError

        return USAGE_ERRORS if isinstance(error, OptionError | AnalysisError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
