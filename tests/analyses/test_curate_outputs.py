"""Where ``curate`` writes its library (issue 41): never through a link out of ``--out``, never over a
folder of unrelated files without ``--overwrite``, never into the current folder for an empty
``--library-out``, never over the dataset it reads. The scorer is the planted stub of
``tests/test_curation.py`` (no model forward pass)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probes.analyses import curate, jobs
from probes.analyses.curate import Curate
from probes.analyses.option_system import OptionError
from probes.core.chat import Reply
from probes.core.files import OutputRefused
from probes.data.dataset import V1_DATASET_DIR, load_dataset

FAST = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical"}
OPTIONS = dict(domains=["retail"], buckets=["T_ok", "T_wrong"], limit=8, k_max=9, masks=40, figure=False, **FAST)
VICTIM = "precious, not basm-probes output\n"


@pytest.fixture
def stub_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    def score(session, record, conditions=(), **_):  # a margin that depends on the shown skills only
        margin = float(len(record.skills)) - 4.0
        return [{"condition": "baseline", "margin": margin, "call_logodds": -margin, "correct_is_abstain": False}]

    monkeypatch.setattr(jobs, "score_record", score)
    monkeypatch.setattr(curate, "chat_generator", lambda model, device: type("Stub", (), {"label": "stub", "__call__": lambda s, m: Reply("")})())


def run(model: Path, out: Path, **extra) -> Path:
    return Curate(model=model, out=out, **{**OPTIONS, **extra}).run(verbose=False).summary.library_dir


@pytest.mark.parametrize("linked", ["README.md", "domains/retail.json"])
def test_a_link_in_the_curated_library_is_never_written_through(linked: str, tiny_qwen3_dir: Path, tmp_path: Path, stub_scoring) -> None:
    library = run(tiny_qwen3_dir, tmp_path / "out")
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    (library / linked).unlink()
    (library / linked).symlink_to(victim)
    if linked == "README.md":  # the README marks the folder as ours: a linked one is not ours, so only --overwrite replaces it
        with pytest.raises(OutputRefused, match="is not a previous curated library"):
            run(tiny_qwen3_dir, tmp_path / "out")
        assert (library / linked).is_symlink()
    assert run(tiny_qwen3_dir, tmp_path / "out", overwrite=linked == "README.md") == library
    assert victim.read_text() == VICTIM
    assert not (library / linked).is_symlink() and (library / linked).is_file()
    load_dataset(library)


def test_a_curated_library_folder_linked_out_of_out_is_refused(tiny_qwen3_dir: Path, tmp_path: Path, stub_scoring) -> None:
    library = run(tiny_qwen3_dir, tmp_path / "out")
    elsewhere = tmp_path / "elsewhere"
    shutil.move(library, elsewhere)
    library.symlink_to(elsewhere)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir() if p.is_file()}
    with pytest.raises(OutputRefused, match="is a symbolic link out of --out"):
        run(tiny_qwen3_dir, tmp_path / "out", overwrite=True)
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir() if p.is_file()} == before


def test_library_out_onto_unrelated_files_needs_overwrite(tiny_qwen3_dir: Path, tmp_path: Path, stub_scoring) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text(VICTIM)
    with pytest.raises(OptionError, match=f"{mine} is not empty and is not a previous curated library; nothing was written"):
        run(tiny_qwen3_dir, tmp_path / "out", library_out=mine)
    assert (mine / "notes.txt").read_text() == VICTIM and not (tmp_path / "out").exists()  # refused before any work
    assert run(tiny_qwen3_dir, tmp_path / "out", library_out=mine, overwrite=True) == mine
    assert not (mine / "notes.txt").exists() and load_dataset(mine).skills
    assert run(tiny_qwen3_dir, tmp_path / "out", library_out=mine) == mine  # its own previous library: replaced


def test_an_empty_library_out_is_refused(tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stub_scoring) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OptionError, match=r"option 'library_out' \(--library-out\) must not be empty"):
        run(tiny_qwen3_dir, tmp_path / "out", library_out="")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", [".", "domains"])
def test_library_out_over_the_source_dataset_is_refused(where: str, tiny_qwen3_dir: Path, tmp_path: Path, stub_scoring) -> None:
    data = tmp_path / "data"
    shutil.copytree(V1_DATASET_DIR, data)
    before = {p.relative_to(data): p.read_bytes() for p in data.rglob("*") if p.is_file()}
    with pytest.raises(OptionError, match="the source dataset"):
        run(tiny_qwen3_dir, tmp_path / "out", dataset=str(data), library_out=data / where, overwrite=True)
    assert {p.relative_to(data): p.read_bytes() for p in data.rglob("*") if p.is_file()} == before
