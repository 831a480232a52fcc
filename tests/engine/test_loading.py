"""Local-only loading: precise errors (also for model files that are not what they say), pickle policy, dtype, context length, and a GGUF of a real
pretrained model (SmolLM2) converted and scored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.engine.loading import ModelLoadError, PromptTooLongError, check_context_length, load_model, resolve_model_dir
from probes.engine.session import EngineSession


def test_loads_local_dir(qwen3_dir):
    model, tok = load_model(qwen3_dir)
    assert model.config.model_type == "qwen3" and tok is not None
    assert next(model.parameters()).dtype == torch.float32
    assert resolve_model_dir(str(qwen3_dir)) == qwen3_dir


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)


def test_no_weights(tmp_path, qwen3_dir):
    shutil.copy(qwen3_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelLoadError, match="no weights"):
        load_model(tmp_path)


def test_pickle_requires_allow_pickle(tmp_path, llama_dir):
    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    for f in [*llama_dir.glob("tokenizer*"), llama_dir / "config.json"]:
        shutil.copy(f, tmp_path / f.name)
    assert not list(tmp_path.glob("*.safetensors"))
    with pytest.raises(ModelLoadError, match="allow-pickle"):
        load_model(tmp_path)
    loaded, _ = load_model(tmp_path, allow_pickle=True)
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)


def test_unsupported_architecture(tmp_path, qwen3_dir):
    shutil.copytree(qwen3_dir, tmp_path / "m")
    cases = [
        ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}, "unsupported architecture 'mamba'"),  # no attention
        ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, "not a causal language model"),
        ({"model_type": "not_a_model_type", "architectures": ["X"]}, "unsupported architecture"),
    ]
    for cfg, msg in cases:
        (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ModelLoadError, match=msg):
            load_model(tmp_path / "m")


def test_hub_name_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        load_model("Qwen/Qwen3-8B")


def test_missing_gguf(tmp_path):
    with pytest.raises(ModelLoadError, match="GGUF file .* does not exist"):
        load_model(tmp_path / "model.gguf")


def test_prompt_longer_than_context(qwen3_dir):
    sess = EngineSession(qwen3_dir)
    assert sess.max_context == 256
    check_context_length(256, sess.model)
    with pytest.raises(PromptTooLongError, match="300 tokens but the model's context is 256"):
        check_context_length(300, sess.model)
    with pytest.raises(PromptTooLongError):
        sess.run(list(range(3, 260)), [250])


def test_bf16_load_smoke(qwen3_dir):
    sess = EngineSession(qwen3_dir, dtype="bfloat16")
    assert next(sess.model.parameters()).dtype == torch.bfloat16
    res = sess.run(list(range(3, 40)), [30, 36], {"s": list(range(5, 10))}, record_rows=True)
    c = res.conditions[0]
    assert c.logits.dtype == torch.float32 and torch.isfinite(c.logits).all()
    # Recorded softmax rows are computed in fp32 and sum to one.
    assert (c.rows.sum(-1) - 1).abs().max() < 1e-5


def test_unknown_dtype(qwen3_dir):
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_model(qwen3_dir, dtype="int3")


def test_smollm2_gguf_converts_once_and_scores_a_sweep(smollm2_gguf, smollm2_dir, tmp_path):
    """A real pretrained model in README's test command (the SmolLM2 end-to-end runs of every analysis
    are ``slow``): the GGUF converts into a cached HF folder that a second conversion returns as is,
    and a sweep on it scores real prompts: Eq. 1 margins finite, NaN exactly where the correct action
    is abstention."""
    from probes.analyses.sweep import Sweep
    from probes.engine.loading import convert_gguf

    assert (smollm2_dir / "config.json").is_file() and any(smollm2_dir.glob("*.safetensors"))
    written = {path.name: path.stat().st_mtime_ns for path in smollm2_dir.iterdir()}
    assert convert_gguf(smollm2_gguf) == smollm2_dir
    assert {path.name: path.stat().st_mtime_ns for path in smollm2_dir.iterdir()} == written  # reused, not rewritten
    session = EngineSession(smollm2_dir)
    assert session.model.config.model_type == "llama" and next(session.model.parameters()).dtype == torch.float32
    result = Sweep(model=smollm2_dir, out=tmp_path, item_ids=["retail-wrong-0001"], configs=["proc", "basm"], k_max=1, dataset="basm_probe",
                   embedder="lexical", relevance="lexical", split="all", figure=False).run(session, verbose=False)
    assert result.status == 0
    rows = result.rows
    assert set(rows["k"]) == {0, 1} and set(rows["config"]) == {"proc", "basm"} and rows["key"].is_unique
    assert (rows["margin"].isna() == rows["correct_is_abstain"].astype(bool)).all()
    assert rows["margin"].notna().any() and np.isfinite(rows["margin"].dropna()).all()


@pytest.mark.usefixtures("private_cache")
def test_model_files_that_are_not_what_they_say_raise_model_load_errors(tmp_path: Path, tiny_qwen3_dir: Path) -> None:
    from probes.engine.loading import ModelLoadError, load_model

    fake = tmp_path / "fake.gguf"
    for data, match in ((b"GGUF" + (3).to_bytes(4, "little"), "struct.error"),
                        (b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little") * 2 + b"\xff" * 50, "damaged or not a GGUF"),
                        (b"\x00" * 64, "GGUF magic")):
        fake.write_bytes(data)
        with pytest.raises(ModelLoadError, match=match) as raised:
            load_model(fake)
        assert str(fake) in str(raised.value)
    pickled = Path(shutil.copytree(tiny_qwen3_dir, tmp_path / "pickled"))
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04\x95 not a pickle of tensors")
    with pytest.raises(ModelLoadError, match=r"pickle weights in .*pickled \(pytorch_model\.bin\): UnpicklingError"):
        load_model(pickled, allow_pickle=True)
