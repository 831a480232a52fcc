"""One option system: every command's flags come from option fields, each shared option and each
default is declared once, the prompt builder is made by one factory, the study defaults are
resolved in one place, and the dataset tools run the same from Python as from the command line."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import pytest

import probes.analyses
from probes.analyses import dataset_tools
from probes.analyses.base import Analysis
from probes.analyses.option_system import (
    QUICK,
    BuilderOptions,
    ItemOptions,
    OptionError,
    RunOptions,
    UnknownOption,
    option_fields,
)
from probes.backends import BACKENDS
from probes.cli.flags import flag_of, flags_of
from probes.cli.main import build_parser, main
from probes.prompts.builder import DEFAULT_K_MAX, SWEEP_K_MAX, BuildSettings
from probes.scoring.score import DEFAULT_VARIANT
from probes.reporting.cards import GATE_DEPTH
from probes.facade import ProbeSession

PACKAGE = Path(probes.analyses.__file__).resolve().parent.parent
ROOT = PACKAGE.parent
TOOLS = {"build": dataset_tools.BuildOptions, "show": dataset_tools.ShowOptions, "shortcuts": dataset_tools.ShortcutsOptions, "audit": dataset_tools.AuditOptions,
         "card": dataset_tools.CardOptions, "bfcl-import": dataset_tools.BFCLImportOptions}
SWEEPS = ("sweep", "linear", "calls", "paired")  # k = 0..K analyses
AT_ONE_DEPTH = ("ratios", "suppression", "knockout", "heads")  # k (default k_max)


def _field(cls: type, name: str):
    return next(f for f in option_fields(cls) if f.name == name)


def _parser_flags(command: str) -> set[str]:
    commands = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
    parser = commands.choices[command]
    return {s for a in parser._actions for s in a.option_strings} | {a.dest for a in parser._actions if not a.option_strings}


@pytest.mark.parametrize("command", list(TOOLS))
def test_a_tool_command_has_exactly_the_flags_of_its_option_fields(command: str) -> None:
    cls = TOOLS[command]
    assert cls.name == command
    assert _parser_flags(command) - {"-h", "--help", "--debug"} == flags_of(cls) == {flag_of(f) for f in option_fields(cls)} | {"--options-file"}


def test_shared_options_are_declared_once() -> None:
    """The item filters and the builder's settings of the analyses and of build/show are the same
    declarations (help, type, choices, range), and so are their flags."""
    shared = [f.name for f in option_fields(ItemOptions)] + [f.name for f in option_fields(BuilderOptions)]
    assert {"dataset", "buckets", "split", "limit", "item_ids", "embedder", "gamma", "relevance", "beta", "k_max"} <= set(shared)
    for cls in (dataset_tools.BuildOptions, dataset_tools.ShowOptions, *(probes.analyses.get(name) for name in probes.analyses.ANALYSES)):
        for name in shared:
            if name not in {f.name for f in option_fields(cls)}:
                assert cls is dataset_tools.ShowOptions and name in {f.name for f in option_fields(ItemOptions)} - {"dataset"}, (cls, name)
                continue
            mine, theirs = _field(cls, name), _field(RunOptions, name)
            if cls in (dataset_tools.BuildOptions, dataset_tools.ShowOptions):
                assert dict(mine.metadata) == dict(theirs.metadata), (cls.name, name)
                assert name == "k_max" or mine.default == theirs.default, (cls.name, name)
            else:  # an analysis may redeclare a shared option to change its default (and say so in the help): nothing else
                assert {k: v for k, v in mine.metadata.items() if k != "help"} == {k: v for k, v in theirs.metadata.items() if k != "help"}, \
                    (cls.name, name)
    for cls in (dataset_tools.ShortcutsOptions, dataset_tools.CardOptions):  # the tokenizer option of the statistics: its help says what 'none' does
        assert {k: v for k, v in _field(cls, "tokenizer").metadata.items() if k != "help"} == \
            {k: v for k, v in _field(dataset_tools.BuildOptions, "tokenizer").metadata.items() if k != "help"}


def test_each_depth_default_is_one_constant() -> None:
    assert DEFAULT_K_MAX == 2 and SWEEP_K_MAX == 4  # the paper's focus depth; the depth sweeps
    assert _field(Analysis, "k_max").default == DEFAULT_K_MAX
    for name in AT_ONE_DEPTH:
        cls = probes.analyses.get(name)
        assert _field(cls, "k_max").default == DEFAULT_K_MAX and _field(cls, "k").default is None
        assert cls().depth == DEFAULT_K_MAX and cls(k=1).depth == 1
    for name in SWEEPS:
        assert _field(probes.analyses.get(name), "k_max").default == SWEEP_K_MAX, name
    assert _field(dataset_tools.BuildOptions, "k_max").default == BuildSettings.k_max == SWEEP_K_MAX
    assert _field(dataset_tools.ShowOptions, "k").default == DEFAULT_K_MAX == GATE_DEPTH
    assert inspect.signature(ProbeSession.prompt).parameters["k"].default == DEFAULT_K_MAX
    assert "default: 4" in build_parser("build")._subparsers._group_actions[0].choices["build"].format_help().replace("\n", " ")


def _code(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_no_default_or_wiring_is_repeated_in_the_library() -> None:
    sources = {path.relative_to(ROOT).as_posix(): _code(path) for path in PACKAGE.rglob("*.py")}
    notebooks = {path.relative_to(ROOT).as_posix(): _code(path) for path in (ROOT / "notebooks").glob("*.ipynb")}
    k_or_k_max = {name for name, text in {**sources, **notebooks}.items() if re.search(r"\bk is not None else\b.*k_max", text)}
    assert k_or_k_max == {"probes/analyses/option_system.py"}, f"{sorted(k_or_k_max)}: use options.depth (BuildsPrompts.depth)"
    for name, text in {**sources, **notebooks}.items():
        assert not re.search(r"option\(\s*\d+\s*,\s*\"largest retrieval depth", text), f"{name}: use k_max_option(DEFAULT_K_MAX / SWEEP_K_MAX)"
    for name, text in sources.items():
        if name != "probes/prompts/builder.py":
            assert not re.search(r"\bPromptBuilder\(", text), f"{name}: make the builder with probes.prompts.builder.make_builder"
            assert name == "probes/data/dataset.py" or not re.search(r"\bdefault_study\(", text), f"{name}: resolve the study defaults with probes.prompts.builder.resolve_study"
        if name != "probes/cli/flags.py":
            assert "add_argument(\"--k-max\"" not in text and "add_argument(\"--dataset\"" not in text, name


# Where the literal "tool_choice" may stand: its definition (probes.scoring.score: the variants, DEFAULT_VARIANT, the
# quantities), the margin's own name (probes.scoring.margins), dict keys (labels), and forks' header, which names the
# margin it measures whatever the variant. Anywhere else it would re-type the default: use DEFAULT_VARIANT.
# probes/reporting/plots.py's fig02 default is left to the figures' move next to their analyses (another branch).
VARIANT_LITERAL_ALLOWED = {"probes/scoring/score.py", "probes/scoring/margins.py"}
VARIANT_DEFAULT = re.compile(r'"tool_choice"(?!\s*:)')  # a key of a dict (a label) is no default
FORKS_MARGIN_NAME = 'margin="tool_choice", margin_variant=None'


def retyped_defaults(name: str, text: str) -> list[str]:
    """The lines of ``text`` (a module of the package) that re-type a default kept in one constant: the
    margin variant (:data:`probes.scoring.score.DEFAULT_VARIANT`), quick's depth
    (:data:`probes.prompts.builder.DEFAULT_K_MAX`), the backend names (:data:`probes.backends.BACKENDS`)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if name not in VARIANT_LITERAL_ALLOWED and VARIANT_DEFAULT.search(line.replace(FORKS_MARGIN_NAME, "")):
            found.append(f"{name}:{number}: use DEFAULT_VARIANT")
        if line.startswith("QUICK") and re.search(r'"k_max":\s*\d', line):
            found.append(f"{name}:{number}: quick's depth is DEFAULT_K_MAX")
        if not name.startswith("probes/backends/") and re.search(r'["\']nnsight["\'],\s*["\']transformerlens["\']', line):
            found.append(f"{name}:{number}: the backend names are probes.backends.BACKENDS")
    return found


def test_each_knob_has_one_default_constant() -> None:
    sources = {path.relative_to(ROOT).as_posix(): _code(path) for path in PACKAGE.rglob("*.py")}
    assert [line for name, text in sources.items() for line in retyped_defaults(name, text)] == []
    assert QUICK["k_max"] == DEFAULT_K_MAX and _field(RunOptions, "backend").metadata["choices"] == tuple(BACKENDS)
    assert _field(RunOptions, "margin_variant").default == DEFAULT_VARIANT
    assert inspect.signature(ProbeSession.score).parameters["variant"].default == DEFAULT_VARIANT
    # the check fails on each re-typed literal
    planted = {
        'def score(record, variant: str = "tool_choice"):': "use DEFAULT_VARIANT",
        'common = {"margin_variant": "tool_choice", "seed": 0}': "use DEFAULT_VARIANT",
        'QUICK = {"limit": 4, "k_max": 2, "random_draws": 2}': "quick's depth is DEFAULT_K_MAX",
        'choices=("native", "nnsight", "transformerlens")': "probes.backends.BACKENDS",
    }
    for line, message in planted.items():
        assert [message in found for found in retyped_defaults("probes/analyses/planted.py", line)] == [True], line
    assert retyped_defaults("probes/analyses/planted.py", 'labels = {"tool_choice": "Eq. 1 over the tools"}') == []


def test_the_tools_run_from_python_as_from_the_command_line(tmp_path: Path) -> None:
    options = {"dataset": "basm_probe", "limit": 1, "k_max": 1, "configs": ["base", "basm"], "workers": 1, "embedder": "lexical",
               "relevance": "lexical"}
    result = dataset_tools.build(**options, out=tmp_path / "python.jsonl")
    assert result.status == 0 and result.n_records == 3 * 2 * 2 and result.options.k_max == 1
    argv = ["build", "--dataset", "basm_probe", "--limit", "1", "--k-max", "1", "--config", "base", "--config", "basm", "--workers", "1",
            "--embedder", "lexical", "--relevance", "lexical", "--out", str(tmp_path / "cli.jsonl")]
    assert main(argv) == 0
    assert (tmp_path / "cli.jsonl").read_bytes() == (tmp_path / "python.jsonl").read_bytes()
    toml = tmp_path / "build.toml"
    toml.write_text('dataset = "basm_probe"\nlimit = 1\nk-max = 1\nconfig = ["base", "basm"]\nworkers = 1\nembedder = "lexical"\nrelevance = "lexical"\n')
    assert main(["build", "--options-file", str(toml), "--out", str(tmp_path / "toml.jsonl")]) == 0
    assert (tmp_path / "toml.jsonl").read_bytes() == (tmp_path / "python.jsonl").read_bytes()


def test_tool_options_are_checked_by_the_one_validator(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(OptionError, match=r"build: option 'limit' \(--limit\) must be ≥ 1, got 0"):
        dataset_tools.build(limit=0)
    with pytest.raises(OptionError, match=r"show: option 'k' \(--k\) must be ≥ 0, got -1"):
        dataset_tools.prompt_record(item="retail-ok-0001", k=-1)
    with pytest.raises(UnknownOption, match="did you mean 'k_max'"):
        dataset_tools.build(kmax=1)
    for argv in (["build", "--beta", "-1"], ["build", "--k-max", "-1"], ["show", "retail-ok-0001", "--k", "-2"]):
        capsys.readouterr()
        assert main(argv) == 2
        assert "must be ≥ 0" in capsys.readouterr().err
