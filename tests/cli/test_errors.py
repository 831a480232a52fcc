"""The command line's errors: every bad input of the catalogue (docs/error_catalogue.md) gives its exit code and
message without a traceback, bad options leave previous results untouched, and Ctrl-C says how to resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.cli.main import main
from probes.reporting.results import ResultsCorrupt
from runs import CATALOGUE, fails, rows_file, sweep


pytestmark = pytest.mark.usefixtures("private_cache")  # a weight-hash memo of its own per test


@pytest.mark.parametrize("case", CATALOGUE.CASES, ids=lambda case: case.name)
def test_every_bad_input_gives_its_code_and_message(case) -> None:
    code, message = CATALOGUE.run_case(case)
    assert (code, "Traceback" in message) == (case.code, False), message
    assert case.expect in message and message.count("error: ") == 1


def test_the_catalogue_in_docs_lists_every_case_with_its_code() -> None:
    rows = [line.split(" | ") for line in CATALOGUE.TABLE.read_text().partition("## Handled without a CLI error")[0].splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [(row[0].lstrip("| ").replace("\\|", "|"), int(row[2])) for row in rows] == [(c.name, c.code) for c in CATALOGUE.CASES]


def test_the_catalogue_has_no_silent_case() -> None:
    assert all(case.code != 0 for case in CATALOGUE.CASES)
    assert f"Silent cases (exit 0 with a wrong or destroyed result): 0 of {len(CATALOGUE.CASES)}." in CATALOGUE.TABLE.read_text()


def test_bad_options_leave_previous_results_untouched(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    before = rows_file(out).read_bytes()
    fails(sweep(model, out, "--k-max", "-1", "--overwrite"), capsys, code=2)
    assert rows_file(out).read_bytes() == before


def test_ctrl_c_says_how_to_resume_and_debug_shows_the_traceback(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    import probes.analyses.jobs

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(probes.analyses.jobs, "score_record", interrupt)
    capsys.readouterr()
    assert main(sweep(model, tmp_path / "out")) == 130
    err = capsys.readouterr().err
    assert "rerun the same command to resume" in err and "Traceback" not in err
    with pytest.raises(KeyboardInterrupt):
        main([*sweep(model, tmp_path / "out"), "--debug"])
    with pytest.raises(ResultsCorrupt):
        rows_file(tmp_path / "out").write_text("not json\n")
        main([*sweep(model, tmp_path / "out"), "--debug"])


def test_every_input_handled_elsewhere_names_a_test_that_exists() -> None:
    """The catalogue's second table: each bad input whose outcome is not an exit code names the test that
    holds it; a renamed or deleted test makes the table lie, so it fails here."""
    import ast

    root = CATALOGUE.ROOT
    assert len(CATALOGUE.ELSEWHERE) >= 10
    for tested in CATALOGUE.ELSEWHERE:
        path, _, function = tested.test.partition("::")
        source = (root / path).read_text()
        assert function in {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}, tested.test
    assert "## Handled without a CLI error" in CATALOGUE.TABLE.read_text()
    assert all(tested.test in CATALOGUE.TABLE.read_text() for tested in CATALOGUE.ELSEWHERE)
