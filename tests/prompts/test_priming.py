"""The lexical-priming controls ``basm-anon`` and ``basm-names`` (probes.prompts.priming) under the real Qwen3
tokenizer, on a sample of the bundled dataset (every bucket and domain, k = 1..4, both formats).

Bar: no catalog tool name in any boundary span of ``basm-anon`` (decoded tokens and text), which is
BASM's text with each name replaced by its recorded placeholder; goal, procedure and tool-list spans
byte- and token-identical to BASM's; ``basm-names`` keeps every tool-name mention of every BASM
boundary item and nothing of its wording; every span round-trips; k = 0 stays the shared prompt.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from probes.data.configs import PRIMING_CONFIGS, get_config
from probes.prompts.priming import ToolMentionRewriter
from probes.prompts.builder import BuildSettings, PromptBuilder
from probes.prompts.spans import SpanReport, check_spans
from probes.data.retrieval import Retriever, make_embedder, tools_in_text
from probes.data.schema import BOUNDARY_SLOTS

KS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def dataset(v1_dataset):
    return v1_dataset


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer):
    return qwen3_tokenizer


@pytest.fixture(scope="module")
def all_names(dataset):
    return sorted({tool.name for domain in dataset.domains.values() for tool in domain.catalog})


@pytest.fixture(scope="module")
def triples(qwen3, dataset):
    """(basm, basm-anon, basm-names) records per sampled item, k and format."""
    builder = PromptBuilder(qwen3, dataset, Retriever(make_embedder("lexical")), BuildSettings(), tokenizer_name="qwen3")
    per_domain: dict[tuple[str, str], object] = {}
    for item in dataset.items:  # one item per (domain, bucket)
        per_domain.setdefault((item.domain, item.bucket), item)
    items = list(per_domain.values())
    out = []
    for index, item in enumerate(items):
        for k in KS:
            fmt = "prompted" if (index + k) % 4 == 0 else "native"
            out.append(tuple(builder.build(item, config, k, fmt) for config in ("basm", *PRIMING_CONFIGS)))
    return out


def slot_texts(record, slots):
    return {(skill.rank, slot): span for skill in record.skills for slot, span in skill.slots.items() if slot in slots}


def mentions(text, names):
    return re.findall(r"(?<![\w])(?:" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?![\w])", text)


def test_spans_round_trip_under_qwen3(triples, qwen3):
    report = SpanReport()
    for triple in triples:
        for record in triple:
            check_spans(record, qwen3, report)
    print(f"\n{len(triples) * 3} records: {report.summary()}")
    assert report.mismatches == []
    assert report.total > 0


def test_anon_names_no_tool_in_its_boundary(triples, qwen3, all_names):
    n_replaced = 0
    for basm, anon, _ in triples:
        assert anon.config == "basm-anon" and anon.spans_kind["boundary"] == "rewrite:anonymise"
        ids = anon.input_ids
        for lo, hi in anon.spans.get("boundary", []):
            assert not tools_in_text(qwen3.decode(ids[lo:hi]), all_names), anon.record_id
        placeholders = anon.spans_kind["placeholders"]
        assert len(set(placeholders.values())) == len(placeholders)  # one placeholder per tool
        assert not tools_in_text(" ".join(placeholders.values()), all_names)
        # independently: BASM's boundary text with each name replaced by its recorded placeholder
        original, rewritten = slot_texts(basm, BOUNDARY_SLOTS), slot_texts(anon, BOUNDARY_SLOTS)
        assert original.keys() == rewritten.keys()
        for key, span in original.items():
            expected = span.text
            for name, placeholder in placeholders.items():
                expected = re.sub(rf"(?<![\w]){re.escape(name)}(?![\w])", placeholder, expected)
            assert rewritten[key].text == expected, (anon.record_id, key)
            assert not tools_in_text(rewritten[key].text, all_names)
            n_replaced += len(mentions(span.text, all_names))
        # placeholders are lettered in order of first mention in the boundary text
        first = list(dict.fromkeys(mentions(" ".join(span.text for span in original.values()), all_names)))
        assert list(placeholders) == first
        assert list(placeholders.values()) == [f"tool {chr(ord('A') + i)}" for i in range(len(first))]
    assert n_replaced > 0


def test_procedure_goal_and_tool_spans_identical_to_basm(triples):
    for basm, *controls in triples:
        reference = slot_texts(basm, ("goal", "procedure", "tools"))
        for record in controls:
            spans = slot_texts(record, ("goal", "procedure", "tools"))
            assert spans.keys() == reference.keys()
            for key, span in reference.items():
                lo, hi = span.token_span
                lo2, hi2 = spans[key].token_span
                assert spans[key].text.encode() == span.text.encode()
                assert record.input_ids[lo2:hi2] == basm.input_ids[lo:hi]
        # the whole prompt up to the end of skill 1's tool list (before any boundary field) is the same
        end = reference[1, "tools"].char_span[1]
        assert all(record.text[:end] == basm.text[:end] for record in controls)


def test_names_keeps_every_mention_and_drops_the_wording(triples, all_names):
    n_mentions = 0
    for basm, _, names in triples:
        assert names.spans_kind["boundary"] == "rewrite:names_only"
        original, rewritten = slot_texts(basm, BOUNDARY_SLOTS), slot_texts(names, BOUNDARY_SLOTS)
        expected_slots = {key for key, span in original.items() if mentions(span.text, all_names)}
        assert set(rewritten) == expected_slots, names.record_id
        for key in expected_slots:
            kept = mentions(rewritten[key].text, all_names)
            assert Counter(kept) == Counter(mentions(original[key].text, all_names))
            assert kept == mentions(original[key].text, all_names)  # order too
            for entry in rewritten[key].text.split("\n- "):  # each item is the frame around its names
                n = len(mentions(entry, all_names))
                skeleton = ", ".join(["X"] * (n - 1)) + " and X" if n > 1 else "X"
                assert re.sub(r"(?<![\w])(?:%s)(?![\w])" % "|".join(map(re.escape, all_names)), "X", entry) == f"This note names {skeleton}."
            n_mentions += len(kept)
        memory = names.text[names.text.find("# Retrieved skills"):]
        assert not any(label in memory for label in ("Applicability:", "Risk cues:", "Avoidance rules:", "Recovery notes:"))
        assert "Do not" not in memory
        assert names.spans_kind["named"] == list(dict.fromkeys(mentions(" ".join(s.text for s in original.values()), all_names)))
    assert n_mentions > 0


def test_k0_and_config_registry(qwen3, dataset):
    builder = PromptBuilder(qwen3, dataset, Retriever(make_embedder("lexical")), BuildSettings(), tokenizer_name="qwen3")
    item = dataset.items[0]
    base = builder.build(item, "base", 0)
    for config in PRIMING_CONFIGS:
        assert builder.build(item, config, 0).text == base.text
        assert get_config(config).gated and get_config(config).slots == get_config("basm").slots


def test_rewriter_units():
    names = ["cancel_order", "refund_order", "cancel"]
    anon = ToolMentionRewriter("anonymise", names)
    assert anon.rewrite("Do not call cancel_order; call refund_order.") == "Do not call tool A; call tool B."
    assert anon.rewrite("cancel_orders and my_cancel stay; cancel and refund_order change.") == "cancel_orders and my_cancel stay; tool C and tool B change."
    assert anon.record() == {"boundary": "rewrite:anonymise", "placeholders": {"cancel_order": "tool A", "refund_order": "tool B", "cancel": "tool C"}}
    only = ToolMentionRewriter("names_only", names)
    assert only.rewrite("No tool is named here.") is None
    assert only.rewrite("Call refund_order, never cancel_order or cancel_order.") == "This note names refund_order, cancel_order and cancel_order."
    assert only.rewrite("Use cancel.") == "This note names cancel."
    assert only.label("Risk cues") == "Notes" and anon.label("Risk cues") == "Risk cues"
    with pytest.raises(ValueError, match="tool-mention rewrite"):
        ToolMentionRewriter("mask", names)
    with pytest.raises(ValueError, match="more than 26"):
        many = ToolMentionRewriter("anonymise", [f"tool_{i}" for i in range(27)])
        many.rewrite(" ".join(f"tool_{i}" for i in range(27)))
