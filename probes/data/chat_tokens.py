"""Chat control strings in dataset text, found so that they are refused: no item, skill or tool may forge a turn.

The prompt builder renders dataset text through the model's chat template and tokenizes it with the
tokenizer's added tokens split out, so a request holding ``<|im_end|><|im_start|>assistant`` becomes
the model's real end-of-turn and start-of-turn tokens: a forged assistant turn, measured as if it were
the conversation. Such text is refused, never rewritten: any rewrite (a zero-width space between the
brackets, escaped brackets) would change the prompt the model reads without the dataset saying so,
and a dataset that means the string as text loses nothing by writing it without its brackets.

Every text of a dataset (:meth:`probes.data.dataset.ProbeDataset.texts`: every field of every item, every
slot of every skill, every tool's name, description and parameter schema, keys included) is searched
(:meth:`~probes.data.dataset.ProbeDataset.chat_tokens`) twice:

- at load (:func:`probes.data.dataset.load_dataset`), whatever the model: :data:`COMMON_CHAT_TOKENS`, the
  control strings of the common chat formats;
- when a prompt builder is made (:class:`probes.prompts.builder.PromptBuilder`): every special and
  added token of that builder's tokenizer (:func:`probes.prompts.tokenizers.special_token_strings`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from probes.core.text import visible

# The control strings of the common chat formats, refused in any dataset: the <|…|> family (ChatML and
# Qwen <|im_start|> <|im_end|> <|endoftext|>, Llama 3 <|start_header_id|> <|eot_id|>, Phi <|user|>
# <|end|>; DeepSeek's fullwidth <｜…｜>), Qwen's and Hermes' tool and thinking tags, Gemma's turn markers,
# the begin/end-of-sequence tokens <s> </s> <bos> <eos>, and Mistral's [INST] and tool markers.
COMMON_CHAT_TOKENS = re.compile(
    r"<[|｜][^\s<>|｜]{1,64}[|｜]>"
    r"|</?(?:tool_call|tool_response|think)>"
    r"|<(?:start|end)_of_turn>"
    r"|</?s>|<(?:bos|eos)>"
    r"|\[/?(?:INST|TOOL_CALLS|AVAILABLE_TOOLS|TOOL_RESULTS|SYSTEM_PROMPT)\]"
)
COMMON_SOURCE = "a chat control string (refused in every dataset, whatever the model)"


@dataclass(frozen=True)
class FoundToken:
    """A chat control string (or a special token) found in a dataset: in item ``owner`` (``kind`` "item") or in domain ``owner``'s
    tools or skills (``kind`` "domain"), at ``field`` (a path such as ``history[0].content``)."""

    kind: str
    owner: str
    field: str
    token: str

    def message(self, where: str, source: str) -> str:
        """The refusal, at ``where`` (the file, line and owner), naming the token's ``source``."""
        plain = re.sub(r"[<>|｜\[\]/]", "", self.token) or "it"
        return visible(f"{where}: field {self.field!r} holds {self.token!r}, {source}. The chat template would hand it to the "
                       f"model as a control token (a forged turn), so it is refused rather than rewritten: write it without "
                       f"its brackets (e.g. {plain!r}) or remove it")


def texts_of(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, text) of every string in a JSON-like ``value``, mapping keys included (a tool schema's
    property names are rendered too)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            inner_path = f"{path}.{key}" if path else str(key)
            yield from texts_of(key, f"{inner_path} (the key)")
            yield from texts_of(inner, inner_path)
    elif isinstance(value, list | tuple):
        for index, inner in enumerate(value):
            yield from texts_of(inner, f"{path}[{index}]")


def token_pattern(tokens: Iterable[str]) -> re.Pattern[str] | None:
    """A pattern that finds any of ``tokens`` (the longest first, as a tokenizer matches them); None for none."""
    ordered = sorted({t for t in tokens if t}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None
