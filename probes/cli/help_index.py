"""Every subcommand's ``--help`` without importing the analyses (they load torch, transformers and
scikit-learn: 8–20 s before a word of help on a 2-core machine).

A command's flags come from its options class, which lives in the analysis module. ``help_index.json``
(next to this file) holds each command's parser as argparse built it (its groups and arguments, not
the flag types: help never parses a value); ``basm-probes CMD --help`` rebuilds the parser from it.
The index is generated from the real parsers (``python docs/help_index.py``), and
``tests/cli/test_help_speed.py`` fails when a command's help from the index differs from its real
help, naming that command. A command missing from the index (an analysis added by another installed
distribution) gets its help from its real parser.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

INDEX = Path(__file__).with_name("help_index.json")
# Defaults that name bundled files (the organism, the datasets) hold this install's package folder: the
# index stores it as PACKAGE and the help puts back the folder of the package that reads it.
PACKAGE_DIR, PACKAGE = str(Path(__file__).resolve().parents[1]), "<probes package>"

# argparse's action classes by the name add_argument takes; an action outside this table is refused
# when the index is written, so no flag can drop out of the help unnoticed.
ACTIONS: dict[type, str] = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._AppendAction: "append",
    argparse._StoreConstAction: "store_const",
}
# The keywords of add_argument that each action accepts (store_true takes no nargs, choices, metavar).
KEYWORDS = {
    "store": ("dest", "nargs", "default", "choices", "required", "help", "metavar"),
    "append": ("dest", "nargs", "default", "choices", "required", "help", "metavar"),
    "store_true": ("dest", "default", "required", "help"),
    "store_false": ("dest", "default", "required", "help"),
    "store_const": ("dest", "const", "default", "required", "help", "metavar"),
}


def _plain(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (int, float, bool)):
        return value
    return str(value).replace(PACKAGE_DIR, PACKAGE)


def _here(value: Any) -> Any:
    """A stored value with this install's package folder put back (:func:`_plain` took it out)."""
    if isinstance(value, list):
        return [_here(v) for v in value]
    return value.replace(PACKAGE, PACKAGE_DIR) if isinstance(value, str) else value


def describe(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``parser``'s description, groups and arguments (in the order argparse lists them), as JSON-able data."""
    group_of = {id(action): i for i, group in enumerate(parser._action_groups) for action in group._group_actions}
    arguments = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        where = {"group": group_of[id(action)]}
        if isinstance(action, argparse._SubParsersAction):
            arguments.append({**where, "subcommands": {name: {"help": _plain(choice.help), "parser": describe(action.choices[name])}
                                                       for name, choice in zip(action.choices, action._choices_actions)},
                              "dest": action.dest, "required": action.required})
            continue
        kind = ACTIONS.get(type(action))
        if kind is None:
            raise TypeError(f"{parser.prog}: argument {action.dest} uses {type(action).__name__}, which the help index "
                            "cannot record; add it to probes.cli.help_index.ACTIONS")
        keywords = {k: _plain(getattr(action, k)) for k in KEYWORDS[kind]}
        arguments.append({**where, "flags": list(action.option_strings) or None, "action": kind, **keywords})
    groups = [{"title": _plain(g.title), "description": _plain(g.description), "default": g in (parser._positionals, parser._optionals)}
              for g in parser._action_groups]
    return {"description": _plain(parser.description), "groups": groups, "arguments": arguments}


def rebuild(parser: argparse.ArgumentParser, spec: dict[str, Any]) -> None:
    """Add the groups and arguments of ``spec`` (:func:`describe`) to ``parser``, in their order."""
    groups = [parser if g["default"] else parser.add_argument_group(_here(g["title"]), _here(g["description"])) for g in spec["groups"]]
    for argument in spec["arguments"]:
        group = groups[argument["group"]]
        if "subcommands" in argument:
            sub = parser.add_subparsers(dest=argument["dest"], required=argument["required"])
            for name, child in argument["subcommands"].items():
                rebuild(sub.add_parser(name, help=_here(child["help"]), description=_here(child["parser"]["description"])), child["parser"])
            continue
        keywords = {k: _here(v) for k, v in argument.items() if k not in ("group", "flags", "action")}
        if isinstance(keywords.get("metavar"), list):
            keywords["metavar"] = tuple(keywords["metavar"])
        if not argument["flags"]:  # a positional: its name is its dest, and argparse decides whether it is required
            keywords.pop("required")
        flags = argument["flags"] or [keywords.pop("dest")]
        group.add_argument(*flags, action=argument["action"], **keywords)


def load_index() -> dict[str, Any]:
    """The committed index: command name → :func:`describe` of its parser (without ``--debug``)."""
    return json.loads(INDEX.read_text(encoding="utf-8"))


def index_of(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The index of the full parser (``build_parser(None)``: every command's flags, which imports every analysis)."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: describe(sub) for name, sub in commands.choices.items()}


def write_index(parser: argparse.ArgumentParser) -> Path:
    from probes.core.files import OutputRoot

    return OutputRoot(INDEX.parent).write(INDEX.name, json.dumps(index_of(parser), indent=1, ensure_ascii=False) + "\n")
