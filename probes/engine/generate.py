"""Greedy generation: HF ``generate`` with end-of-turn stops, and a chat-model text generator.

:func:`greedy_generate` continues token ids (the ``calls`` analysis); :class:`ChatGenerator`
turns chat messages into the model's reply text (the LLM skill extractor,
:mod:`probes.data.extract_llm`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from probes.core.chat import BATCH_SIZE, MAX_NEW_TOKENS, OnBatch, Reply, TemplateSupport
from probes.engine.hooks import added_to_outputs
from probes.engine.loading import ModelLoadError, load_model


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-turn ids: the model's generation config eos, the tokenizer's eos, ``<|im_end|>`` and Gemma's ``<end_of_turn>``."""
    ids: set[int] = set()
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update([eos] if isinstance(eos, int) else list(eos or []))
    if tokenizer is not None:
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in ("<|im_end|>", "<|endoftext|>", "<end_of_turn>") if t in vocab)
    return sorted(int(i) for i in ids)


def greedy_generate(model: Any, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """Greedy continuation of ``prompt_ids`` with HF ``generate``. Returns (new ids without the
    stop token, stopped by an end-of-turn token)."""
    return greedy_generate_batch(model, [prompt_ids], stop_ids, max_new_tokens)[0]


@contextlib.contextmanager
def steered_from(model: Any, vectors: Mapping[int, torch.Tensor], start: int) -> Iterator[None]:
    """Inside this context every forward of ``model`` (one sequence; HF ``generate`` with its KV cache included)
    adds ``vectors[L]`` to the output of decoder layer L at every absolute position ≥ ``start``: the prompt's rows
    from ``start`` on, then every generated token. Positions are counted per layer over the forwards of the context
    (a cache-less generation would recount them: refused)."""
    seen = {layer: 0 for layer in vectors}

    def delta(layer: int) -> Any:
        def at_positions(hs: torch.Tensor) -> torch.Tensor:
            if hs.shape[0] != 1:
                raise ValueError(f"steered generation runs one sequence at a time, got a batch of {hs.shape[0]}")
            first, seen[layer] = seen[layer], seen[layer] + hs.shape[1]
            after = torch.arange(first, first + hs.shape[1], device=hs.device) >= start
            return after[None, :, None].to(hs.dtype) * vectors[layer].to(device=hs.device, dtype=hs.dtype)
        return at_positions

    with added_to_outputs(model.base_model.layers, {layer: delta(layer) for layer in vectors}):
        yield


def steered_greedy_generate(model: Any, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_new_tokens: int, *,
                            vectors: Mapping[int, torch.Tensor], start: int) -> tuple[list[int], bool]:
    """:func:`greedy_generate` with ``vectors`` added from position ``start`` on (:func:`steered_from`): the steered
    model's own next action, for the call parser."""
    if not 0 <= start < len(prompt_ids):
        raise ValueError(f"steering starts at position {start}, outside the prompt's 0..{len(prompt_ids) - 1}")
    with steered_from(model, vectors, start):
        return greedy_generate(model, prompt_ids, stop_ids, max_new_tokens)


@torch.inference_mode()
def greedy_generate_batch(model: Any, prompts: Sequence[Sequence[int]], stop_ids: Sequence[int],
                          max_new_tokens: int) -> list[tuple[list[int], bool]]:
    """:func:`greedy_generate` of several prompts in one HF ``generate`` call, left-padded with an
    attention mask (positions follow the mask). A batch of one has no padding: it is exactly the
    plain call; in a larger batch the padding changes float rounding, so a near-tie can resolve
    differently than alone."""
    from transformers import GenerationConfig

    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("greedy generation needs at least one prompt, none of them empty")
    device = model.get_input_embeddings().weight.device
    pad = (list(stop_ids) or [0])[0]
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
        eos_token_id=list(stop_ids) or None, pad_token_id=pad,
    )
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    stops = set(stop_ids)
    results = []
    for row in out[:, width:].tolist():
        stop = next((i for i, token in enumerate(row) if token in stops), None)
        results.append((row, False) if stop is None else (row[:stop], True))
    return results


class ChatGenerator:
    """Greedy replies of a local chat model: ``generator(messages) -> Reply`` (text, and whether it
    ran into ``max_new_tokens``); ``generator.replies(conversations)`` answers many, ``batch_size``
    at a time (:func:`greedy_generate_batch`, prompts of similar length together).

    The messages go through the tokenizer's chat template with the generation prompt (thinking
    off where the template has the switch, as Qwen3's does); the reply is decoded without special
    tokens. ``label`` names the model in what is written from its replies (default: the
    config's ``name_or_path``).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = MAX_NEW_TOKENS, batch_size: int = BATCH_SIZE,
                 label: str | None = None) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        self.batch_size = batch_size
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.label = label if label is not None else str(model.config.name_or_path)
        if getattr(tokenizer, "chat_template", None) is None:
            raise ModelLoadError(f"{self.label}: the tokenizer has no chat template; a chat (instruct) model is needed")
        self._thinking_switch = TemplateSupport(tokenizer).thinking_switch
        self._stop_ids = stop_token_ids(model, tokenizer)

    @classmethod
    def load(cls, model: str | Path, *, max_new_tokens: int = MAX_NEW_TOKENS, batch_size: int = BATCH_SIZE, dtype: str = "float32",
             device: str = "cpu", **load_options: Any) -> "ChatGenerator":
        """Load ``model`` (a folder, a local HF cache name or a ``.gguf`` file) with
        :func:`probes.engine.loading.load_model`; ``label`` is ``model`` as given."""
        loaded, tokenizer = load_model(model, dtype=dtype, device=device, **load_options)
        return cls(loaded, tokenizer, max_new_tokens=max_new_tokens, batch_size=batch_size, label=str(model))

    def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        kwargs: dict[str, Any] = {"enable_thinking": False} if self._thinking_switch else {}
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True, **kwargs)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def __call__(self, messages: Sequence[Mapping[str, str]]) -> Reply:
        return self.replies([messages])[0]

    def replies(self, conversations: Sequence[Sequence[Mapping[str, str]]], *,
                on_batch: OnBatch | None = None) -> list[Reply]:
        """The reply to each conversation, in order; generated ``batch_size`` at a time, longest
        prompts first (similar lengths share a batch: little padding). ``on_batch(indices, replies)``
        is called as each batch is made (a recorder writes them: a stopped run keeps its batches)."""
        prompts = [self.prompt_ids(messages) for messages in conversations]
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        replies: list[Reply | None] = [None] * len(prompts)
        batches = [order[start:start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        # a chat model on a CPU takes minutes per batch: show where the run is
        with tqdm(total=len(prompts), desc="generating", unit="reply", disable=len(batches) < 2) as progress:
            for batch in batches:
                made = greedy_generate_batch(self.model, [prompts[i] for i in batch], self._stop_ids, self.max_new_tokens)
                decoded = [Reply(self.tokenizer.decode(new_ids, skip_special_tokens=True), truncated=not stopped) for new_ids, stopped in made]
                for i, reply in zip(batch, decoded):
                    replies[i] = reply
                if on_batch is not None:
                    on_batch(batch, decoded)
                progress.update(len(batch))
        return replies  # type: ignore[return-value]
