"""The model-support table (docs/backends.md, issue #46 item 3): one parity check per architecture family, on
random weights of the family's real config shape at tiny dims, on every backend (native, nnsight,
TransformerLens), against an independent eager forward whose every layer gets an explicit 4D mask (the layer's
causal or sliding-window mask, plus the knockout's cells; tests/reference.py).

Families and the real checkpoint whose shape each mirrors: Qwen3 (the organism, Qwen3-0.6B: QK-norm, GQA 2:1),
Llama (SmolLM2-135M: GQA 3:1), Qwen2 (Qwen2.5-Coder-1.5B: q/k/v biases, GQA 6:1), Gemma 3 (270M: local and global
layers, one KV head, QK-norm, a query pre-attention scalar, scaled embeddings; conftest ``gemma3_dir``), Mistral
(a sliding window on every layer, kept in the config), Phi-3 (fused qkv and gate-up projections). Bar: logits,
span masses and full attention rows within 1e-5 (fp32) under knockouts. Gemma 2 (attention logit softcapping) is
refused with a message, not approximated; GPT-2 (no ``base_model.layers``) is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from probes.backends import BACKENDS, get_backend
from probes.engine.session import EngineSession, Knockout
from reference import TOL, knockout_masks, masked_eager_forward

N, ROWS = 80, [60, 70, 79]
SPANS = {"early": list(range(8, 20)), "late": list(range(66, 76))}
CONDITIONS = [Knockout("early", SPANS["early"]), Knockout("late_l0", SPANS["late"], layers=(0,))]
VOCAB = 310  # the random Gemma 3's tokenizer (303 tokens), saved with every family
COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=512, tie_word_embeddings=True,
              bos_token_id=None, eos_token_id=None)
FAMILIES = {
    "qwen3": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=12)),
    "llama": ("LlamaConfig", dict(num_attention_heads=6, num_key_value_heads=2)),
    "qwen2": ("Qwen2Config", dict(num_attention_heads=6, num_key_value_heads=1)),
    "mistral": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=12, sliding_window=16)),
    "phi3": ("Phi3Config", dict(num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)),
}
WINDOWED = {"gemma3": [16, None, 16], "mistral": [16, 16]}


def _family_dir(root: Path, family: str, tokenizer) -> Path:
    config_class, shape = FAMILIES[family]
    torch.manual_seed(11)
    model = AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**COMMON, **shape)).eval()
    with torch.no_grad():  # widen the scores (random init is small) and make Qwen2's biases matter
        for name, p in model.named_parameters():
            if any(part in name for part in ("q_proj", "k_proj", "qkv_proj")):
                p.mul_(10.0) if name.endswith("weight") else p.normal_(0, 1.0)
    out = root / family
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory, gemma3_dir: Path) -> dict[str, Path]:
    root, tokenizer = tmp_path_factory.mktemp("families"), AutoTokenizer.from_pretrained(gemma3_dir)
    return {"gemma3": gemma3_dir, **{family: _family_dir(root, family, tokenizer) for family in FAMILIES}}


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2", "gemma3", "mistral", pytest.param("phi3", marks=pytest.mark.slow)])
def test_every_backend_matches_the_per_layer_mask_reference(family, family_dirs):
    model_dir = family_dirs[family]
    ids = torch.randint(3, 290, (N,), generator=torch.Generator().manual_seed(7)).tolist()
    eager = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    native = EngineSession(model_dir)
    assert native.windows == WINDOWED.get(family, [None] * native.n_layers)
    worst: dict[str, float] = {}
    for name in BACKENDS:
        backend = native if name == "native" else get_backend(name, model_dir)
        assert backend.windows == native.windows
        result = backend.run(ids, ROWS, SPANS, CONDITIONS, record_rows=True)
        for got in result.conditions:
            knockout = got.condition
            active = knockout.active(native.n_layers, native.n_heads)
            logits, probs = masked_eager_forward(eager, ids, knockout_masks(N, active, knockout.key_positions, ROWS, native.windows))
            at_rows = probs[:, :, ROWS]
            diffs = {"logits": (got.logits - logits[ROWS[0]:]).abs().max(), "rows": (got.rows - at_rows).abs().max(),
                     **{f"span {s}": (got.span_mass[s] - at_rows[..., p].sum(-1)).abs().max() for s, p in SPANS.items()}}
            for what, diff in diffs.items():
                worst[f"{name} {what}"] = max(worst.get(f"{name} {what}", 0.0), float(diff))
                assert diff <= TOL, (family, name, knockout.name, what, float(diff))
        # not vacuous: the knockout of the late span (inside every window) moves the logits. The early span lies outside
        # the window of every row where every layer is local (Mistral): the native engine leaves those rows bit for bit
        # (the forward backends renormalise an unchanged row: equal within rounding, checked above)
        assert (result["late_l0"].logits - result["baseline"].logits).abs().max() > 1e-3
        if name == "native":
            assert torch.equal(result["early"].logits, result["baseline"].logits) == (None not in native.windows), family
    print(f"\n{family}: max |diff| vs eager " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))


def test_softcapped_attention_is_refused(tmp_path):
    """Gemma 2 caps its attention logits (tanh): the probe's softmax rows would not be the model's, so it refuses."""
    config = transformers.Gemma2Config(**COMMON, num_attention_heads=4, num_key_value_heads=1, head_dim=12, sliding_window=16)
    session = EngineSession(AutoModelForCausalLM.from_config(config).eval())
    with pytest.raises(NotImplementedError, match="plain softmax attention only"):
        session.run(list(range(3, 40)), [36])


def test_an_architecture_without_decoder_layers_at_base_model_layers_is_refused():
    """GPT-2 keeps its blocks at ``transformer.h``: refused by name, not an AttributeError deep in a run."""
    from probes.engine.loading import ModelLoadError

    model = AutoModelForCausalLM.from_config(transformers.GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4)).eval()
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2' .*base_model.layers"):
        EngineSession(model)
