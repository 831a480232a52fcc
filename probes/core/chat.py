"""Chat-model conventions shared by the prompt builder, the engine's generator and the LLM skill extractor (no torch).

- :class:`TemplateSupport`: what a tokenizer's chat template can do (tool schemas, a thinking
  switch), detected by rendering probes; the prompt builder renders with it
  (:mod:`probes.prompts.builder`) and :class:`probes.engine.generate.ChatGenerator` turns thinking
  off with it;
- :class:`Reply`, :data:`MAX_NEW_TOKENS`, :data:`BATCH_SIZE` and :data:`OnBatch`: a generated reply, the default reply budget and batch of a
  chat-model text generator (the LLM skill extractor's, :mod:`probes.data.extract_llm`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAX_NEW_TOKENS = 512  # reply budget: a seven-slot skill with a few items per slot fits
# Replies a chat-model text generator makes together. SmolLM2-135M, fp32, 2 CPU cores, 900-token
# prompts: a decoding step takes 57 ms alone, 165 ms for 8, 482 ms for 32 (2.8× and 3.8× the throughput).
BATCH_SIZE = 8


@dataclass(frozen=True)
class Reply:
    """A generated reply: its text and whether it ran into ``max_new_tokens`` (no end-of-turn)."""

    text: str
    truncated: bool = False


OnBatch = Callable[[list[int], list[Reply]], None]  # called as a batch of replies is made: (indices into the conversations, their replies)


class TemplateSupport:
    """What a tokenizer's chat template can do, detected by rendering probes."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if tokenizer.chat_template is None:
            raise ValueError("tokenizer has no chat template; a chat-tuned tokenizer is required")
        probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        tool = {"type": "function", "function": {"name": "probe_tool_zz", "description": "d", "parameters": {"type": "object", "properties": {}}}}
        plain = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        with_tools = tokenizer.apply_chat_template(probe, tools=[tool], tokenize=False, add_generation_prompt=True)
        self.tools = "probe_tool_zz" in with_tools and with_tools != plain
        try:
            thinking_off = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        except TypeError:
            thinking_off = plain
        self.thinking_switch = thinking_off != plain
