"""The run context (probes.analyses.run_context): options that open the session reach it (model, backend,
embedder), options that contradict a given session are errors, and warnings about the model are printed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import probes
import probes.analyses
import probes.analyses.run_context as run_context
import probes.engine.session
from probes.analyses.option_system import OptionError
from probes.analyses.run_context import check_session
from probes.cli.main import main
from probes.data.dataset import V1_DATASET_DIR
from probes.reporting.layout import rows_path
from option_helpers import CLASSES, COMMANDS, Loaded, argv_of, capture_session, invented_values
from runs import FAST, StopAtSession, stop_at_session


@pytest.mark.parametrize("name", COMMANDS)
def test_session_options_reach_the_session(name: str, monkeypatch, tmp_path) -> None:
    seen = capture_session(monkeypatch)
    # the invented filter values select nothing in the real dataset, and the items are checked before the model
    dataset = run_context._dataset(str(V1_DATASET_DIR))
    monkeypatch.setattr(run_context, "_dataset", lambda root: dataset)
    monkeypatch.setattr(run_context, "select_items", lambda dataset, options: dataset.items[:1])
    cls = CLASSES[name]
    values = invented_values(cls, tmp_path, skip=("backend", "remote"))  # the native session (other backends: below)
    with pytest.raises(Loaded):
        main([name, *argv_of(cls, values)])
    assert seen == {"model": "x-model", "dtype": "bfloat16", "device": "cuda:1", "device_map": "auto",
                    "allow_pickle": True, "trust_remote_code": True, "prefix_cache": values["prefix_cache"]}


def test_backend_options_reach_the_backend(monkeypatch) -> None:
    import probes.backends

    seen: dict[str, Any] = {}

    def get_backend(name, model, **kwargs):
        seen.update(kwargs, name=name, model=str(model))
        raise Loaded

    monkeypatch.setattr(probes.backends, "get_backend", get_backend)
    with pytest.raises(Loaded):
        run_context.open_session(CLASSES["sweep"](backend="nnsight", remote=True, dtype="float16", device="cuda:0", device_map="auto",
                                           allow_pickle=True, trust_remote_code=True), "m")
    assert seen == {"name": "nnsight", "model": "m", "remote": True, "dtype": "float16", "device": "cuda:0", "device_map": "auto",
                    "allow_pickle": True, "trust_remote_code": True}
    with pytest.raises(OptionError, match="remote.*needs backend='nnsight'"):
        run_context.open_session(CLASSES["sweep"](remote=True), "m")


def test_session_options_reach_the_session_from_python(monkeypatch) -> None:
    seen = capture_session(monkeypatch)
    with pytest.raises(Loaded):
        run_context.open_session(CLASSES["sweep"](dtype="float16", device="cuda:0", device_map="balanced", allow_pickle=True,
                                           trust_remote_code=True), "m")
    assert seen == {"model": "m", "dtype": "float16", "device": "cuda:0", "device_map": "balanced",
                    "allow_pickle": True, "trust_remote_code": True, "prefix_cache": 8}


def test_embedder_choice_is_printed_and_recorded(tiny_qwen3_dir, tmp_path, capsys) -> None:
    from probes.data.retrieval import make_embedder
    from probes.reporting.results import load_results

    make_embedder.cache_clear()
    run_context._retriever.cache_clear()
    result = probes.analyses.run("sweep", model=str(tiny_qwen3_dir), embedder="lexical", relevance="lexical", item_ids=["retail-wrong-0001"],
                                 k_max=0, configs=["base"], split="all", out=tmp_path / "py", figure=False)
    assert "embedder: lexical-hashing (--embedder lexical)" in capsys.readouterr().err
    assert result.out_dir == tmp_path / "py" / run_context.model_label(tiny_qwen3_dir)
    make_embedder.cache_clear()
    run_context._retriever.cache_clear()
    assert main(["sweep", "--model", str(tiny_qwen3_dir), "--embedder", "lexical", "--relevance", "lexical", "--item", "retail-wrong-0001",
                 "--k-max", "0", "--configs", "base", "--split", "all", "--out", str(tmp_path / "cli"), "--no-figure"]) == 0
    assert "embedder: lexical-hashing (--embedder lexical)" in capsys.readouterr().err
    rows = load_results(rows_path(tmp_path / "cli" / result.out_dir.name, "sweep"))
    assert rows.attrs["meta"]["config"]["builder"]["embedder"] == "lexical-hashing"
    assert result.rows.attrs["meta"]["config"]["builder"]["embedder"] == "lexical-hashing"


@pytest.mark.parametrize("name", ["sweep", "report"])
def test_a_path_given_as_the_session_says_to_pass_model(name: str) -> None:
    with pytest.raises(OptionError, match="session must be a loaded session .* pass model=PATH"):
        probes.run(name, "/models/Qwen3-8B")


@pytest.mark.usefixtures("private_cache")
def test_prompted_format_on_the_organism_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    stop_at_session(monkeypatch)
    with pytest.raises(StopAtSession):
        main(["sweep", "--format", "prompted", "--out", str(tmp_path), *FAST])
    assert "warning: the bundled organism was trained on the native format only" in capsys.readouterr().err


def _session(dtype: torch.dtype = torch.float32, device: str = "cpu", name: str | None = None) -> SimpleNamespace:
    model = SimpleNamespace(dtype=dtype, device=torch.device(device))
    return SimpleNamespace(model=model, **({"name": name} if name else {}))


@pytest.mark.parametrize(("options", "session", "conflict"), [
    ({"dtype": "bfloat16"}, _session(), "dtype='bfloat16' but the session runs dtype='float32'"),
    ({"device": "cuda:1"}, _session(), "device='cuda:1' but the session runs device='cpu'"),
    ({"backend": "nnsight"}, _session(), "backend='nnsight' but the session runs backend='native'"),
    ({"dtype": "float16", "backend": "transformerlens"}, _session(name="nnsight"), "dtype='float16' but"),
])
def test_options_that_contradict_the_given_session_are_errors(options, session, conflict) -> None:
    sweep = probes.analyses.get("sweep")
    with pytest.raises(OptionError, match="sweep: options contradict the given session: " + conflict.replace("(", r"\(")):
        check_session(sweep(**options), session)


@pytest.mark.parametrize("options", [{}, {"dtype": "auto"}, {"dtype": "bfloat16"}, {"device": "cuda"}, {"device": "cuda:0"}])
def test_options_the_session_agrees_with_are_accepted(options) -> None:
    check_session(probes.analyses.get("sweep")(**options), _session(torch.bfloat16, "cuda:0"))
