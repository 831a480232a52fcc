"""Gemma 3's chat template, shipped for checkpoints without one (issue #46 item 1): prompts render in Gemma's
turn format (system folded into the first user turn, tools declared there as text), their spans decode to
their slot text with 0 mismatches, and a tokenizer without a template is refused with the option to pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from probes.analyses.option_system import OptionError
from probes.analyses.sweep import Sweep
from probes.core.chat import TemplateSupport
from probes.data.configs import CONFIGS
from probes.prompts.builder import NATIVE_FORCED_PREFIX, SYSTEM_INSTRUCTION, TOOLS_BLOCK_HEADER
from probes.prompts.spans import SpanReport, check_spans
from probes.prompts.tokenizers import BUNDLED_TEMPLATES, ChatTemplateError, with_chat_template

K_MAX = 2


def _items(dataset, n_groups: int) -> list:
    """The first item of each of ``n_groups`` task groups, spread over the buckets."""
    seen, out = set(), []
    for item in dataset.items:
        if item.task_group not in seen and len(out) < n_groups:
            seen.add(item.task_group)
            out.append(item)
    return out


def _round_trip(tokenizer, dataset, items) -> SpanReport:
    builder = Sweep(k_max=K_MAX, embedder="lexical", relevance="lexical", chat_template="gemma3").make_builder(tokenizer, dataset)
    report = SpanReport()
    for item in items:
        for config in CONFIGS:
            for k in range(K_MAX + 1):
                record = builder.build(item, config, k, "native")
                check_spans(record, builder.tokenizer, report)
                assert record.text.startswith("<bos><start_of_turn>user\n" + SYSTEM_INSTRUCTION)
                assert record.text.endswith("<start_of_turn>model\n" + NATIVE_FORCED_PREFIX)
                assert TOOLS_BLOCK_HEADER not in record.text  # the template declares the tools, not the builder's fallback
    return report


@pytest.fixture(scope="module")
def tokenizer(gemma3_dir: Path):
    return AutoTokenizer.from_pretrained(gemma3_dir)


def test_gemma3_turn_format_with_tools_in_the_first_user_turn(tokenizer):
    gemma = with_chat_template(tokenizer, "gemma3")
    assert tokenizer.chat_template is None  # a copy: the caller's tokenizer keeps its own
    assert TemplateSupport(gemma).tools and not TemplateSupport(gemma).thinking_switch
    tool = {"type": "function", "function": {"name": "get_x", "description": "d", "parameters": {"type": "object", "properties": {}}}}
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_x", "arguments": {"a": 1}}}]},
                {"role": "tool", "name": "get_x", "content": "R"}]
    text = gemma.apply_chat_template(messages, tools=[tool], tokenize=False, add_generation_prompt=True)
    first, call, result, prompt = text.split("<end_of_turn>\n")
    assert first.startswith("<bos><start_of_turn>user\nS\n\n") and first.endswith('"properties": {}}}}\n\nU') and '"name": "get_x"' in first
    assert call == '<start_of_turn>model\n<tool_call>\n{"name": "get_x", "arguments": {"a": 1}}\n</tool_call>'
    assert result == "<start_of_turn>user\n<tool_response>\nR\n</tool_response>"
    assert prompt == "<start_of_turn>model\n"


def test_spans_are_exact_through_the_gemma3_template(tokenizer, v2_dataset):
    report = _round_trip(tokenizer, v2_dataset, _items(v2_dataset, 3))
    assert report.mismatches == [] and report.total > 0


def test_a_tokenizer_without_a_chat_template_is_refused_with_the_option_to_pass(tokenizer, v2_dataset, tmp_path):
    with pytest.raises(OptionError, match=r"has no chat template .*--chat-template FILE.*gemma3"):
        Sweep(embedder="lexical", relevance="lexical").make_builder(tokenizer, v2_dataset, tokenizer_name="gemma-3-270m")
    with pytest.raises(ChatTemplateError, match=r"nowhere.jinja' is neither a file nor a bundled template \(gemma3\)"):
        with_chat_template(tokenizer, tmp_path / "nowhere.jinja")
    own = tmp_path / "own.jinja"
    own.write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert with_chat_template(tokenizer, own).apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "<bos>x"
    assert BUNDLED_TEMPLATES["gemma3"].is_file()


@pytest.mark.slow
def test_spans_are_exact_with_the_real_gemma3_tokenizer(gemma3_270m_dir, v2_dataset):
    """Gemma 3 270M's own tokenizer (SentencePiece-style, 262,144 tokens) through the bundled template."""
    report = _round_trip(AutoTokenizer.from_pretrained(gemma3_270m_dir), v2_dataset, _items(v2_dataset, 30))
    print(f"\n[gemma3] {report.summary()}")
    assert report.mismatches == [] and report.total > 0
