"""Greedy generation: HF ``generate`` with end-of-turn stops, and a chat-model text generator.

:func:`greedy_generate` continues token ids (the ``calls`` analysis); :class:`ChatGenerator`
turns chat messages into the model's reply text (the LLM skill extractor,
:mod:`probes.data.extract_llm`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from probes.engine.chat import MAX_NEW_TOKENS, Reply, TemplateSupport
from probes.engine.loading import ModelLoadError, load_model


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-turn ids: the model's generation config eos, the tokenizer's eos and ``<|im_end|>``."""
    ids: set[int] = set()
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update([eos] if isinstance(eos, int) else list(eos or []))
    if tokenizer is not None:
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab)
    return sorted(int(i) for i in ids)


@torch.inference_mode()
def greedy_generate(model: Any, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """Greedy continuation of ``prompt_ids`` with HF ``generate``. Returns (new ids without the
    stop token, stopped by an end-of-turn token)."""
    from transformers import GenerationConfig

    device = model.get_input_embeddings().weight.device
    input_ids = torch.tensor([list(prompt_ids)], device=device)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
        eos_token_id=list(stop_ids) or None, pad_token_id=(list(stop_ids) or [0])[0],
    )
    out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
    new = out[0, input_ids.shape[1]:].tolist()
    stops = set(stop_ids)
    for i, token in enumerate(new):
        if token in stops:
            return new[:i], True
    return new, False


class ChatGenerator:
    """Greedy replies of a local chat model: ``generator(messages) -> Reply`` (text, and whether it
    ran into ``max_new_tokens``).

    The messages go through the tokenizer's chat template with the generation prompt (thinking
    off where the template has the switch, as Qwen3's does); the reply is decoded without special
    tokens. ``label`` names the model in what is written from its replies (default: the
    config's ``name_or_path``).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = MAX_NEW_TOKENS, label: str | None = None) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.label = label if label is not None else str(model.config.name_or_path)
        if getattr(tokenizer, "chat_template", None) is None:
            raise ModelLoadError(f"{self.label}: the tokenizer has no chat template; a chat (instruct) model is needed")
        self._thinking_switch = TemplateSupport(tokenizer).thinking_switch
        self._stop_ids = stop_token_ids(model, tokenizer)

    @classmethod
    def load(cls, model: str | Path, *, max_new_tokens: int = MAX_NEW_TOKENS, dtype: str = "float32", device: str = "cpu",
             **load_options: Any) -> "ChatGenerator":
        """Load ``model`` (a folder, a local HF cache name or a ``.gguf`` file) with
        :func:`probes.engine.loading.load_model`; ``label`` is ``model`` as given."""
        loaded, tokenizer = load_model(model, dtype=dtype, device=device, **load_options)
        return cls(loaded, tokenizer, max_new_tokens=max_new_tokens, label=str(model))

    def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        kwargs: dict[str, Any] = {"enable_thinking": False} if self._thinking_switch else {}
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True, **kwargs)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def __call__(self, messages: Sequence[Mapping[str, str]]) -> Reply:
        new_ids, stopped = greedy_generate(self.model, self.prompt_ids(messages), self._stop_ids, self.max_new_tokens)
        return Reply(self.tokenizer.decode(new_ids, skip_special_tokens=True), truncated=not stopped)
