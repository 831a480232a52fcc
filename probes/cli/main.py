"""The ``basm-probes`` command line.

Subcommands are registered in :data:`COMMANDS` (name → help, adder of arguments, runner); the
analyses' come from the registry (:func:`probes.analyses.catalogue`). Heavy modules (torch, the
prompt builder, the datasets) are imported by the command that uses them, so ``basm-probes --help``
imports none of them.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from probes import analyses
from probes.core.text import visible


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def register(name: str, help_text: str, add_arguments: Callable[[argparse.ArgumentParser], None], run: Callable[[argparse.Namespace], int]) -> None:
    COMMANDS[name] = Command(help_text, add_arguments, run)


# ---------------------------------------------------------------------------- build, show, shortcuts, card
def _tool_command(options_class: str, run: Callable[[Any], int], module: str = "probes.analyses.dataset_tools",
                  ) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    """The flags (derived from the options class ``<module>.<options_class>``, as an analysis's are)
    and the runner of a tool command; the module is imported when the command is used."""

    def options_cls() -> type:
        import importlib

        return getattr(importlib.import_module(module), options_class)

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from probes.cli.flags import add_options

        add_options(parser, options_cls())

    def runner(args: argparse.Namespace) -> int:
        from probes.cli.flags import options_from_args

        return run(options_from_args(args, options_cls()))

    return add_arguments, runner


def _build(options: dict[str, Any]) -> int:
    from probes.analyses import dataset_tools

    result = dataset_tools.build(**options)
    result.print_summary()
    return result.status


def _show(options: dict[str, Any]) -> int:
    from probes.analyses import dataset_tools

    dataset_tools.show(**options)
    return 0


def _shortcuts(options: dict[str, Any]) -> int:
    from probes.analyses import dataset_tools
    from probes.scoring.shortcuts import best_shortcut

    table = dataset_tools.shortcuts(**options)
    print(table.round(3).to_string(index=False))
    best = best_shortcut(table)
    print("best no-model shortcut on eval: " + "; ".join(f"{k} {v['value']:.3f} ({v['shortcut']})" for k, v in best.items()))
    if options.get("out") is not None:
        print(f"wrote {options['out']}")
    return 0


def _audit(options: dict[str, Any]) -> int:
    from probes.analyses import dataset_tools

    table = dataset_tools.audit(**options)
    if not len(table):
        print("no audited labels in this dataset (or none with these actions)")
        return 0
    for number, rule in enumerate(dict.fromkeys(table["rule"]), start=1):
        print(visible(f"rule {number}: {rule}"))
    rules = {rule: number for number, rule in enumerate(dict.fromkeys(table["rule"]), start=1)}
    for row in table.itertuples():  # the dataset's own text: its hidden code points shown as marks
        print(visible(f"{row.id}\t{row.bucket}\t{row.category}\t{row.action}\trule {rules[row.rule]}\t{row.reason}"))
    print(", ".join(f"{action} {count}" for action, count in table["action"].value_counts().sort_index().items()))
    return 0


def _card(options: dict[str, Any]) -> int:
    from probes.analyses import dataset_tools

    print(f"wrote {dataset_tools.card(**options)}")
    return 0


register("build", "Build prompt records (JSON Lines) for items × configs × k × format.", *_tool_command("BuildOptions", _build))
register("show", "Print one prompt with its procedure and boundary spans highlighted.", *_tool_command("ShowOptions", _show))


# ---------------------------------------------------------------------------- bfcl-import
def _bfcl_import(options: dict[str, Any]) -> int:
    from probes.analyses import dataset_tools

    print(dataset_tools.bfcl_import(**options).summary())
    return 0


register("bfcl-import", "Turn the BFCL multi-turn data (bfcl-eval package) into a probe dataset folder.",
         *_tool_command("BFCLImportOptions", _bfcl_import))


register("shortcuts", "Shortcut baselines of a dataset (request length, lexical-overlap rule, bag of words; no model).",
         *_tool_command("ShortcutsOptions", _shortcuts))
register("audit", "List a dataset's audited labels: every kept, relabelled and dropped item with its rule and reason.",
         *_tool_command("AuditOptions", _audit))
register("card", "Write a dataset's CARD.md: counts, shortcut baselines and first-token collision rates, measured.",
         *_tool_command("CardOptions", _card))


def _explore(options: dict[str, Any]) -> int:
    from probes.analyses.explore import explore

    explore(**options)
    return 0


register("explore", "Write OUT/<model>/explore.html: prompts, spans, deciding-row attention, heads and knockouts, offline in a browser.",
         *_tool_command("ExploreOptions", _explore, "probes.analyses.explore"))


# ---------------------------------------------------------------------------- probe analyses
def _analysis_command(name: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    """The flags (derived from the keyword options) and the runner of ``basm-probes NAME``:
    ``probes.analyses.run(NAME, **options)``. The class is imported when its command is used."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from probes.cli.flags import add_options

        add_options(parser, analyses.options_of(name))

    def run(args: argparse.Namespace) -> int:
        from probes.cli.flags import options_from_args

        return analyses.run(name, **options_from_args(args, analyses.options_of(name))).status

    return add_arguments, run


REPORT_HELP = "Run the chosen analyses; write figures (PNG+PDF) and report.md next to the paper's numbers."


def _migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="a results folder OUT/<model> in the earlier flat layout")


def _migrate(args: argparse.Namespace) -> int:
    moves = analyses.migrate(args.folder)
    for source, target in moves:
        print(f"{source.name} -> {target.parent.name}/{target.name}")
    print(f"{args.folder}: {len(moves)} entries moved into one folder per analysis")
    return 0


register("migrate", "Move a results folder of the earlier flat layout into one folder per analysis (figures, report and page stay).",
         _migrate_arguments, _migrate)


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


def build_parser(command: str | None = None, *, for_help: bool = False) -> argparse.ArgumentParser:
    """The parser; only ``command``'s flags are built (an analysis's come from its class, which
    imports torch), every command's with None, none with "" (the top-level help lists the commands).
    ``for_help``: ``command``'s flags come from the help index (:mod:`probes.cli.help_index`), which
    imports nothing, when the index has the command."""
    parser = argparse.ArgumentParser(prog="basm-probes", description="Probe boundary-aware skill memory inside local HF models.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    from probes.cli import help_index  # here, not at the top: `python -m probes.cli.help_index` imports this module first

    index = help_index.load_index() if for_help else {}
    for name, spec in commands().items():
        sub = subparsers.add_parser(name, help=spec.help, description=spec.help)
        if name == command and name in index:
            help_index.rebuild(sub, index[name])  # its --debug included
            continue
        if command is None or name == command:
            spec.add_arguments(sub)
        sub.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return parser


def _known_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message says what went wrong, where and what to do (no traceback needed).
    Imported when an error happens: these modules load torch."""
    from probes.analyses.option_system import OptionError
    from probes.analyses.run_context import AnalysisError
    from probes.analyses.parallel import ParallelError
    from probes.core.files import OutputRefused
    from probes.data.dataset import DatasetError
    from probes.engine.loading import ModelLoadError, PromptTooLongError
    from probes.reporting.results import ResultsConfigMismatch, ResultsCorrupt, ResultsLocked

    return (OptionError, AnalysisError, DatasetError, ModelLoadError, PromptTooLongError, ResultsConfigMismatch,
            ResultsCorrupt, ResultsLocked, ParallelError, OutputRefused, OSError)


USAGE_ERRORS = 2  # exit code of a bad option (as argparse's own); other known errors exit 1


# The command line runs one job per process over a heap of library objects (torch, transformers, pandas): a cyclic
# collection every 20,000 net allocations rather than Python's 700 (ten full collections, 2 s of the main command).
GC_THRESHOLDS = (20_000, 20, 20)


def main(argv: Sequence[str] | None = None) -> int:
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        return _main(argv)
    finally:
        gc.set_threshold(*thresholds)  # a caller's process (a notebook, the tests) keeps its own


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(next((token for token in argv if not token.startswith("-")), ""), for_help=bool({"-h", "--help"} & set(argv)))
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
        # visible: a message quotes items, paths and ids, whose hidden code points would reorder or restyle the terminal
        print(f"basm-probes {args.command}: error: {visible(message)}\n(rerun with --debug for the traceback)", file=sys.stderr)
        from probes.analyses.option_system import OptionError
        from probes.analyses.run_context import AnalysisError

        return USAGE_ERRORS if isinstance(error, OptionError | AnalysisError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
