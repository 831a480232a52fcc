"""Command-line flags derived from a command's keyword options, and the TOML options file.

Every option field of an options class (an :class:`~probes.analyses.base.Analysis`, ``report``'s
options, a dataset tool's: :mod:`probes.analyses.dataset_tools`) becomes one flag (``k_max`` → ``--k-max``;
``repeat`` options are repeated flags, ``names`` options comma-separated, ``positional`` ones
positional arguments). Flags default to "not given", so the class's own defaults apply, exactly as
in Python. Every subcommand's flags are made here, from the one option system
(:mod:`probes.analyses.option_system`).
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from probes.analyses.option_system import OptionError, check_option, flag_of, option_fields

OPTIONS_FILE = "options_file"


def flags_of(cls: type) -> set[str]:
    """Every flag (and positional) that :func:`add_options` makes for ``cls``."""
    return {flag_of(f) for f in option_fields(cls)} | {"--options-file"}


def _names(known: Sequence[str], what: str) -> Any:
    def parse(value: str) -> list[str]:
        names = [v.strip() for v in value.split(",") if v.strip()]
        if unknown := [n for n in names if n not in known]:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; known: {', '.join(known)}")
        return names

    return parse


def _number_or_word(kind: type, words: Sequence[str]) -> Any:
    """The flag type of a number option that also takes ``words`` (``--threads 2``, ``--threads auto``)."""
    def parse(value: str) -> Any:
        return value if value in words else kind(value)

    parse.__name__ = f"{'integer' if kind is int else 'number'} or {' or '.join(words)}"  # argparse's "invalid ... value"
    return parse


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per option of ``cls``, in groups, each defaulting to "not given"."""
    groups: dict[str, Any] = {}
    for f in option_fields(cls):
        meta = f.metadata
        if meta.get("positional"):  # argparse's own "positional arguments" group
            parser.add_argument(f.name, type=meta["type"] if meta["type"] in (int, float) else str, choices=meta["choices"], help=meta["help"])
            continue
        group = groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        default = f.default
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        required = default is dataclasses.MISSING  # checked by probes.analyses.make, so an options file may give it too
        help_text = meta["help"] + (" (required)" if required else "" if default is None or meta["type"] is bool else f" (default: {shown})")
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        if meta["type"] is bool:
            kw["action"] = "store_false" if default else "store_true"
        elif meta["repeat"]:
            kw.update(action="append", choices=meta["choices"])
        elif meta["names"] is not None:
            kw["type"] = _names(meta["names"], f.name.replace("_", " "))
        elif meta["words"]:
            kw["type"] = _number_or_word(meta["type"], meta["words"])
        else:
            kw.update(type=meta["type"] if meta["type"] in (int, float) else str, choices=meta["choices"])
        group.add_argument(flag_of(f), **kw)
    parser.add_argument("--options-file", dest=OPTIONS_FILE, type=Path, default=argparse.SUPPRESS,
                        help="TOML file of options (keys: option names, e.g. k_max or k-max); flags given here override it")


def options_from_file(path: Path, cls: type) -> dict[str, Any]:
    """The options of a TOML file, checked as the keyword options are; unknown keys are errors, and so
    are two keys of one option (``k-max`` and ``k_max``, ``bucket`` and ``buckets``): neither may win silently."""
    try:
        with Path(path).open("rb") as handle:
            table = tomllib.load(handle)
    except OSError as error:
        raise OptionError(f"--options-file {path}: cannot read it ({error.strerror})") from error
    except tomllib.TOMLDecodeError as error:
        raise OptionError(f"--options-file {path}: not valid TOML: {error}") from error
    fields = {f.name: f for f in option_fields(cls)}
    fields |= {flag_of(f).lstrip("-").replace("-", "_"): f for f in option_fields(cls)}  # e.g. `bucket`, `item`, `no_figure`
    out, keys = {}, {}
    for key, value in table.items():
        f = fields.get(key.replace("-", "_"))
        if f is None:
            raise OptionError(f"{path}: unknown option {key!r} for {cls.name}; known: {', '.join(f.name for f in option_fields(cls))}")
        if f.name in keys:
            raise OptionError(f"{path}: keys {keys[f.name]!r} and {key!r} both set option {f.name!r} ({flag_of(f)}); keep one")
        keys[f.name] = key
        if key.replace("-", "_") != f.name and f.metadata["type"] is bool and flag_of(f).startswith("--no-"):
            value = not value if isinstance(value, bool) else value  # `no-figure = true` means figure = false
        out[f.name] = check_option(cls.name, f, value, where=f"{path}: ")
    return out


def options_from_args(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """Keyword options of ``cls`` from parsed flags: the TOML file first, flags given win."""
    given = dict(vars(args))
    path = given.pop(OPTIONS_FILE, None)
    for key in ("command", "debug", "organism_command"):
        given.pop(key, None)
    options = options_from_file(path, cls) if path is not None else {}
    options.update(given)
    return options
