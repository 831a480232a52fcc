"""Issue 41: ``probes.run(name, session, model=...)`` with a ``model`` that is not the session's own
weights wrote the session's rows under OUT/<that model>/, recorded as that model and on the dataset
that model's study picks. It is an option error, before the dataset or any row."""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

import probes
from probes.analyses.option_system import OptionError
from probes.analyses.run_context import AnalysisError, check_session, session_folder

FAST = {"limit": 1, "k_max": 1, "configs": ["base"], "embedder": "lexical", "relevance": "lexical", "figure": False}


@pytest.fixture(scope="module")
def session(tiny_qwen3_dir: Path) -> probes.ProbeSession:
    return probes.ProbeSession(tiny_qwen3_dir)


def _refused(session, model: str | Path, tmp_path: Path, match: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(OptionError, match=match):
        probes.run("sweep", session, model=model, out=out, **FAST)
    assert not out.exists()  # nothing written, not even the results folder


def test_a_model_path_that_does_not_exist_is_not_the_sessions(session, tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    _refused(session, "/other", tmp_path, rf"sweep: options contradict the given session: model='/other' is not the session's model "
                                          rf"{tiny_qwen3_dir.resolve()} \(model directory /other does not exist\)")


def test_another_model_folder_or_a_copy_is_not_the_sessions(session, tiny_qwen3_dir: Path, qwen3_dir: Path, tmp_path: Path) -> None:
    _refused(session, qwen3_dir, tmp_path, f"model='{qwen3_dir}' \\({qwen3_dir.resolve()}\\) is not the session's model")
    copy = tmp_path / "copy"
    shutil.copytree(tiny_qwen3_dir, copy)  # the same bytes elsewhere: its own study defaults and results folder
    _refused(session, copy, tmp_path, "model='.*copy' .* is not the session's model")
    (tmp_path / "notes").mkdir()
    _refused(session, tmp_path / "notes", tmp_path, "has no config.json")


def test_the_sessions_own_folder_by_any_path_is_accepted(session, tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch) -> None:
    sweep = probes.analyses.get("sweep")
    link = tmp_path / "link"
    link.symlink_to(tiny_qwen3_dir)
    monkeypatch.chdir(tiny_qwen3_dir.parent)
    for model in (tiny_qwen3_dir, str(tiny_qwen3_dir) + "/", link, os.path.relpath(tiny_qwen3_dir)):
        check_session(sweep(model=model), session)
    result = probes.run("sweep", session, model=link, out=tmp_path / "out", **FAST)
    assert result.out_dir == tmp_path / "out" / tiny_qwen3_dir.name  # a link names the folder it leads to


def test_a_session_without_a_folder_has_no_weights_to_name(session, tmp_path: Path) -> None:
    """A model built in memory: the run fell back to the organism's name and fingerprint."""
    model = AutoModelForCausalLM.from_config(copy.deepcopy(session.model.config))
    model.name_or_path = ""  # built, not loaded: transformers names no folder
    in_memory = probes.ProbeSession(model, tokenizer=session.tokenizer)
    with pytest.raises(AnalysisError, match="the session's model has no folder \\(name_or_path ''\\): .*save it"):
        session_folder(in_memory)
    for model_option in ({}, {"model": session.model.name_or_path}):
        with pytest.raises(AnalysisError, match="has no folder"):
            probes.run("sweep", in_memory, out=tmp_path / "out", **model_option, **FAST)
    assert not (tmp_path / "out").exists()


def test_a_gguf_file_is_the_session_of_its_converted_folder(smollm2_gguf: Path, smollm2_dir: Path, tiny_qwen3_dir: Path) -> None:
    loaded = SimpleNamespace(model=SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"), name_or_path=str(smollm2_dir)))
    sweep = probes.analyses.get("sweep")
    check_session(sweep(model=smollm2_gguf), loaded)
    with pytest.raises(OptionError, match="is not the session's model"):
        check_session(sweep(model=tiny_qwen3_dir), loaded)


def test_a_session_without_a_model_is_the_bundled_organism() -> None:
    """``probes.ProbeSession()``: the model the CLI loads without --model, and its study defaults."""
    from probes.organism import ORGANISM_DIR

    session = probes.ProbeSession()
    assert Path(session.model.name_or_path) == ORGANISM_DIR
    assert session.default_dataset == probes.ProbeSession(ORGANISM_DIR).default_dataset
