"""The dataset commands (probes.analyses.dataset_tools): the same from Python as from the command line, checked
by the one option validator, and ``build`` writing atomically."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.analyses import dataset_tools
from probes.analyses.option_system import OptionError, UnknownOption
from probes.cli.main import main


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


@pytest.mark.usefixtures("private_cache")
def test_a_failing_build_leaves_the_previous_records_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    cli_main = importlib.import_module("probes.analyses.dataset_tools")  # the module of build's worker function

    out = tmp_path / "records.jsonl"
    argv = ["build", "--limit", "2", "--k-max", "1", "--config", "basm", "--workers", "1", "--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical", "--out", str(out)]
    assert main(argv) == 0
    before = out.read_bytes()
    real = cli_main._build_item
    calls = []

    def failing(item):
        calls.append(item)
        if len(calls) == 3:
            raise RuntimeError("killed mid-build")
        return real(item)

    monkeypatch.setattr(cli_main, "_build_item", failing)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        main(argv)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl"]  # no temporary file left behind


@pytest.mark.usefixtures("private_cache")
def test_a_killed_builds_empty_temporary_is_cleaned_up(tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    stale = tmp_path / f".rec.{2 ** 22 + 12345}.tmp.jsonl"
    stale.write_bytes(b"")
    argv = ["build", "--limit", "1", "--k-max", "0", "--config", "basm", "--workers", "1", "--dataset", "basm_probe",
            "--embedder", "lexical", "--relevance", "lexical", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["rec.jsonl"]
