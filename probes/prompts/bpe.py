"""A small byte-level BPE tokenizer trained offline, with a ChatML chat template.

Used to check the prompt builder on a second, independent tokenizer (its template has no tool
support, so the builder's schemas-in-system-message path runs) and as the vocabulary of small
trained models when the 151k-token Qwen3 vocabulary would dominate their parameter count.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CHATML_SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")

# ChatML without tool support: tool schemas must be written into the system message by the caller.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2048,
    *,
    chat_template: str = CHATML_TEMPLATE,
    split_pattern: str | None = None,
    model_max_length: int | None = None,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts``; deterministic for fixed input.

    Pre-tokenization is GPT-2's unless ``split_pattern`` (a regex of isolated pieces) is given."""
    tokenizer = Tokenizer(models.BPE())
    if split_pattern is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHATML_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<tool_call>", "</tool_call>"],
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        **({"model_max_length": model_max_length} if model_max_length is not None else {}),
    )
