"""The results folder's layout (probes.reporting.layout): one folder per analysis, figures/ and the report at the
top; a folder of the earlier flat layout is refused naming the move, probes.migrate moves it, and the moved
results are read by probes.load and resumed (nothing computed again)."""

from __future__ import annotations

from pathlib import Path

import pytest

import probes
from probes.cli.main import main
from probes.core.files import OutputRefused, OutputRoot
from probes.reporting.layout import OldLayout, analysis_folder, migrate, owner, rows_path, table_path
from runs import fails, rows_file, sweep


def flatten(model_dir: Path) -> list[str]:
    """The earlier layout, planted: every file of the analysis folders moved up into ``model_dir``."""
    names = []
    for folder in [p for p in model_dir.iterdir() if p.is_dir() and p.name != "figures"]:
        for entry in folder.iterdir():
            entry.rename(model_dir / entry.name)
            names.append(entry.name)
        folder.rmdir()
    return sorted(names)


def test_a_flat_folder_is_refused_then_migrated_read_and_resumed(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    model_dir = out / "model"
    assert rows_file(out).is_file() and table_path(model_dir, "sweep", "sweep_summary").is_file()
    assert sorted(p.name for p in model_dir.iterdir()) == ["sweep"]  # rows and tables in the analysis's folder, nothing loose
    rows = rows_file(out).read_bytes()
    moved = flatten(model_dir)
    assert "sweep.jsonl" in moved and "sweep_summary.csv" in moved
    err = fails(sweep(model, out), capsys)
    assert "holds results in the earlier flat layout (sweep.jsonl)" in err and f"basm-probes migrate {model_dir}" in err
    assert not rows_file(out).exists()  # refused before anything was written
    with pytest.raises(OldLayout, match="earlier flat layout"):
        probes.load(model_dir, "sweep")
    capsys.readouterr()
    assert main(["migrate", str(model_dir)]) == 0  # probes.migrate under the command the refusal names
    said = capsys.readouterr().out
    assert all(f"{name} -> sweep/{name}" in said for name in moved) and f"{len(moved)} entries moved" in said
    assert rows_file(out).read_bytes() == rows
    capsys.readouterr()
    assert main(sweep(model, out)) == 0  # resumed: every row already there
    assert rows_file(out).read_bytes() == rows
    for finished in (probes.load(model_dir, "sweep"), probes.load(analysis_folder(model_dir, "sweep")), probes.load(rows_file(out))):
        assert finished.name == "sweep" and len(finished.rows) and "sweep_summary" in finished.tables


def test_each_flat_name_finds_its_analysis() -> None:
    names = ("sweep", "heads", "calls", "paired", "linear", "curate", "mask-eval", "circuit", "steer")
    expected = {"heads_floor_causal.jsonl": "heads", "paired_calls.jsonl": "paired", "calls_checker_rates.csv": "calls",
                "mask_eval_items.csv": "mask-eval", "mask-eval_claims.csv": "mask-eval", "linear_features": "linear",
                "curated-basm_probe": "curate", "circuit_graph_basm_config.json": "circuit", "sweep.rank1-of-2.jsonl": "sweep",
                "steer_train.jsonl": "steer", "notes.txt": None}
    assert {name: owner(name, names) for name in expected} == expected


def test_migrate_moves_nothing_when_a_file_has_no_analysis_or_its_target_exists(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "sweep.jsonl").write_text("rows\n")
    (model_dir / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused, match=r"notes\.txt belong to no analysis .*nothing was moved"):
        migrate(model_dir, ["sweep"])
    (model_dir / "notes.txt").unlink()
    rows_path(model_dir, "sweep").parent.mkdir()
    rows_path(model_dir, "sweep").write_text("newer rows\n")
    with pytest.raises(OutputRefused, match=r"sweep/sweep\.jsonl already exist; nothing was moved"):
        migrate(model_dir, ["sweep"])
    assert (model_dir / "sweep.jsonl").read_text() == "rows\n"


def test_a_move_never_goes_through_a_link(tmp_path: Path) -> None:
    root = OutputRoot(tmp_path / "out")
    root.write("a.txt", "a")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutputRefused, match="link"):
        root.move("a.txt", "link/a.txt")
    assert not (tmp_path / "elsewhere" / "a.txt").exists() and (tmp_path / "out" / "a.txt").is_file()
