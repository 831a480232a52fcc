"""The one writer's rules (:class:`probes.core.files.OutputRoot`), each on a planted bad target."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probes.core.files import OutputRefused, OutputRoot

PRECIOUS = "someone else's file\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(PRECIOUS)
    return path


def test_writes_land_inside_the_root_atomically(tmp_path: Path) -> None:
    root = OutputRoot(tmp_path / "out")
    assert root.write("a/b.txt", "one") == tmp_path / "out" / "a" / "b.txt"
    assert root.write(tmp_path / "out" / "a" / "b.txt", "two").read_text() == "two"  # a path that starts with the root
    assert [p.name for p in (tmp_path / "out" / "a").iterdir()] == ["b.txt"]  # no temporary left


def test_a_failing_writer_leaves_the_old_file_whole(tmp_path: Path) -> None:
    root = OutputRoot(tmp_path)
    root.write("t.npy", "old")
    with pytest.raises(RuntimeError), root.atomic("t.npy") as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert (tmp_path / "t.npy").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.npy"]


@pytest.mark.parametrize("target", ["../escape.txt", "a/../../escape.txt", "/etc/escape.txt"])
def test_a_target_outside_the_root_is_refused(target: str, tmp_path: Path) -> None:
    with pytest.raises(OutputRefused):
        OutputRoot(tmp_path / "out").write(target, "x")
    assert not (tmp_path / "escape.txt").exists()


def test_a_link_inside_the_root_leading_out_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out" / "figures").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutputRefused, match="figures is a symbolic link out of --out"):
        OutputRoot(tmp_path / "out", overwrite=True).write("figures/f.png", "x")
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("inside", [False, True])
def test_a_link_at_the_target_is_never_written_through(inside: bool, overwrite: bool, tmp_path: Path, victim: Path) -> None:
    (tmp_path / "out").mkdir()
    if inside:  # a link to another output: not out of --out, still never written through
        victim = victim.rename(tmp_path / "out" / "victim.txt")
    (tmp_path / "out" / "report.md").symlink_to(victim)
    with pytest.raises(OutputRefused, match=r"is a symbolic link (\(to .*not even with --overwrite|out of --out)"):
        OutputRoot(tmp_path / "out", overwrite=overwrite).write("report.md", "x")
    assert victim.read_text() == PRECIOUS and (tmp_path / "out" / "report.md").is_symlink()


def test_a_folder_where_a_file_goes_is_refused(tmp_path: Path) -> None:
    (tmp_path / "claims.csv").mkdir()
    with pytest.raises(OutputRefused, match="is not a regular file"):
        OutputRoot(tmp_path, overwrite=True).write("claims.csv", "x")


def test_an_empty_root_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputRefused, match="--library-out is empty"):
        OutputRoot("", flag="--library-out")
    assert list(tmp_path.iterdir()) == []


def _ours(folder: Path) -> bool:
    return (folder / "MARK").is_file()


def test_a_folder_not_ours_is_replaced_only_with_overwrite(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "notes.txt").write_text(PRECIOUS)
    with pytest.raises(OutputRefused, match="is not empty and is not a previous library; nothing was written"):
        with OutputRoot(tmp_path).folder("lib", is_previous=_ours, what="library") as stage:
            OutputRoot(stage).write("MARK", "")
    assert (tmp_path / "lib" / "notes.txt").read_text() == PRECIOUS
    with OutputRoot(tmp_path, overwrite=True).folder("lib", is_previous=_ours, what="library") as stage:
        OutputRoot(stage).write("MARK", "")
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["MARK"]
    (tmp_path / "lib" / "CARD.md").write_text("kept")  # ours now: a rerun replaces what it writes and keeps the rest
    with OutputRoot(tmp_path).folder("lib", is_previous=_ours, what="library", generated=("MARK",)) as stage:
        OutputRoot(stage).write("MARK", "again")
    assert (tmp_path / "lib" / "MARK").read_text() == "again" and (tmp_path / "lib" / "CARD.md").read_text() == "kept"


def test_links_in_a_replaced_folder_are_removed_not_followed(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "MARK").write_text("")
    (tmp_path / "lib" / "README.md").symlink_to(victim)
    with OutputRoot(tmp_path).folder("lib", is_previous=_ours, what="library", generated=("MARK", "README.md")) as stage:
        OutputRoot(stage).write("README.md", "new")
        OutputRoot(stage).write("MARK", "")
    assert victim.read_text() == PRECIOUS and not (tmp_path / "lib" / "README.md").is_symlink()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".lib.")]


def test_files_into_keeps_the_other_files_and_refuses_links(tmp_path: Path, victim: Path) -> None:
    root = OutputRoot(tmp_path / "model")
    root.write("README.md", "card")
    with root.files_into() as stage:
        (stage / "config.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["README.md", "config.json"]
    os.symlink(victim, tmp_path / "model" / "weights.bin")
    with pytest.raises(OutputRefused, match="weights.bin is a symbolic link"), root.files_into() as stage:
        (stage / "weights.bin").write_text("w")
    assert victim.read_text() == PRECIOUS and not [p for p in (tmp_path / "model").iterdir() if p.name.startswith(".files-")]
