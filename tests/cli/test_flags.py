"""The command line's flags (probes.cli.flags): one flag per option field, flags over the options file,
class defaults for flags not given, and usage errors (exit 2) for what the parser can refuse."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from probes.analyses import dataset_tools
from probes.analyses.option_system import option_fields
from probes.cli.flags import flag_of, flags_of
from probes.cli.main import build_parser, main
from option_helpers import CLASSES, Captured, capture_analysis, write_toml
from runs import StopAtSession, stop_at_session


def test_options_file_errors_are_usage_errors_on_the_command_line(tmp_path, capsys) -> None:
    bad = write_toml(tmp_path / "bad.toml", {"k_max": "two"})
    assert main(["sweep", "--options-file", str(bad)]) == 2
    assert "option 'k_max' (--k-max) must be an integer, got 'two'" in capsys.readouterr().err
    assert main(["sweep", "--options-file", str(write_toml(tmp_path / "u.toml", {"kmax": 1}))]) == 2
    assert "unknown option 'kmax' for sweep" in capsys.readouterr().err
    (tmp_path / "broken.toml").write_text("k_max = = 1\n")
    assert main(["sweep", "--options-file", str(tmp_path / "broken.toml")]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    assert main(["sweep", "--options-file", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_flags_win_over_the_options_file(monkeypatch, tmp_path) -> None:
    seen = capture_analysis(monkeypatch)
    toml = write_toml(tmp_path / "o.toml", {"k_max": 1, "seed": 5, "bucket": ["T_ok"], "no-figure": True, "configs": ["proc"],
                                       "controls": True})
    with pytest.raises(Captured):
        main(["sweep", "--options-file", str(toml), "--k-max", "3", "--bucket", "T_repair", "--configs", "basm,base"])
    (sweep, _), = seen
    assert (sweep.k_max, sweep.buckets, sweep.configs) == (3, ("T_repair",), ("basm", "base"))  # flags win (lists replaced)
    assert (sweep.seed, sweep.figure, sweep.controls) == (5, False, True)  # the file fills the rest
    assert sweep.limit is None and sweep.margin_variant == "tool_choice"  # neither: the class defaults


def test_flags_not_given_keep_the_class_defaults(monkeypatch) -> None:
    seen = capture_analysis(monkeypatch)
    for name, cls in CLASSES.items():
        with pytest.raises(Captured):
            main([name])
        analysis, _ = seen.pop()
        assert analysis == cls(), name  # exactly what Python's defaults give (e.g. sweep's K = 4, report's None)


def test_an_unknown_config_name_on_the_command_line_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as code:
        main(["sweep", "--configs", "basm,nope"])
    assert code.value.code == 2
    assert "--configs: unknown configs ['nope']; known: base, proc, " in capsys.readouterr().err


def test_an_unknown_domain_in_items_is_an_option_error(capsys) -> None:
    assert main(["sweep", "--items", "T_ok:retial:3"]) == 2
    assert "items T_ok:retial:3: 'retial' is not a bucket" in capsys.readouterr().err


TOOLS = {"build": dataset_tools.BuildOptions, "show": dataset_tools.ShowOptions, "shortcuts": dataset_tools.ShortcutsOptions, "audit": dataset_tools.AuditOptions,
         "card": dataset_tools.CardOptions, "bfcl-import": dataset_tools.BFCLImportOptions}


def _parser_flags(command: str) -> set[str]:
    commands = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
    parser = commands.choices[command]
    return {s for a in parser._actions for s in a.option_strings} | {a.dest for a in parser._actions if not a.option_strings}


@pytest.mark.parametrize("command", list(TOOLS))
def test_a_tool_command_has_exactly_the_flags_of_its_option_fields(command: str) -> None:
    cls = TOOLS[command]
    assert cls.name == command
    assert _parser_flags(command) - {"-h", "--help", "--debug"} == flags_of(cls) == {flag_of(f) for f in option_fields(cls)} | {"--options-file"}


@pytest.mark.usefixtures("private_cache")
def test_explicit_flags_beat_the_toml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = stop_at_session(monkeypatch)
    (tmp_path / "run.toml").write_text("k_max = 1\nseed = 3\n")
    with pytest.raises(StopAtSession):  # --k-max 4 is sweep's default, and still explicit
        main(["sweep", "--options-file", str(tmp_path / "run.toml"), "--k-max", "4", "--model", "m", "--out", str(tmp_path)])
    assert seen == {"k_max": 4, "seed": 3}
