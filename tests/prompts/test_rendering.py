"""The prompt builder on the whole dataset, with the real Qwen3 tokenizer and an offline byte-level BPE.

Bar: spans round-trip for every item × config × k (only whitespace merged at span edges is allowed,
and the count is reported); k = 0 prompts are byte-identical across configurations; equal-length
controls have exactly the BASM token count; first-token collisions are flagged.

The round trip runs in two tiers with the same checks: in the default run on one item per task group
(85 of the 756 items: every task group, (scenario, bucket) template, domain, retrieved skill and slot,
every configuration and k = 0..4), and on every item (37,800 records per tokenizer) under ``-m slow``.
"""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest

from probes.core.chat import TemplateSupport
from probes.prompts.bpe import train_bpe_tokenizer
from probes.data.configs import CONFIGS, get_config
from probes.data.dataset import ABSTAIN
from probes.prompts.builder import ABSTAIN_TEXT, NATIVE_FORCED_PREFIX, TOOLS_BLOCK_HEADER, BuildSettings, PromptBuilder
from probes.prompts.spans import SpanReport, check_spans
from probes.prompts.tokenizers import load_tokenizer
from probes.data.retrieval import Retriever, make_embedder
from probes.data.schema import BOUNDARY_SLOTS

K_MAX = 4


@pytest.fixture(scope="module")
def dataset(v1_dataset):
    return v1_dataset


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer):
    return qwen3_tokenizer


@pytest.fixture(scope="module")
def bpe(dataset):
    texts = [item.user for item in dataset.items]
    texts += [json.dumps(skill.to_json()) for skill in dataset.skills.values()]
    texts += [json.dumps(tool.as_function_schema()) for domain in dataset.domains.values() for tool in domain.catalog]
    return train_bpe_tokenizer(texts, vocab_size=1024)


def make_builder(tokenizer, dataset, **settings):
    return PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings(**settings), tokenizer_name="test")


@pytest.fixture(scope="module")
def qwen3_builder(qwen3, dataset):
    return make_builder(qwen3, dataset)


def one_item_per_task_group(dataset):
    """One item of every task group, chosen so that together they render every (scenario, bucket)
    template (a scenario's three groups give one bucket each) and as many distinct retrieved skills
    (top K_MAX under the lexical retriever the round trip uses), tool lists and correct actions as one
    item per group allows; then, in file order, an item for each retrieved skill still missing (two
    skills retrieved only by T_wrong items of two groups of one scenario need one extra item).
    Returns (items, every skill retrieved at k <= K_MAX over the whole dataset)."""
    retriever = Retriever(make_embedder("lexical"))
    top = {item.id: frozenset(entry.skill.id for entry in retriever.retrieve(item, dataset)[:K_MAX]) for item in dataset.items}
    groups: dict[str, list] = {}
    for item in dataset.items:
        groups.setdefault(item.task_group, []).append(item)
    scenarios: dict[str, list[str]] = {}
    for group in sorted(groups):
        scenarios.setdefault(group.rsplit(".", 1)[0], []).append(group)

    def features(item):
        return {("skill", skill) for skill in top[item.id]} | {("unavailable", item.unavailable_tools), ("correct", str(item.correct_action))}

    seen: set = set()
    chosen = []
    for _, names in sorted(scenarios.items()):
        best = None
        for buckets in itertools.permutations(("T_ok", "T_wrong", "T_repair"), len(names)):
            covered, picks = set(seen), []
            for name, bucket in zip(names, buckets):
                candidates = [item for item in groups[name] if item.bucket == bucket] or groups[name]
                pick = max(candidates, key=lambda item: len(features(item) - covered))  # ties: file order
                covered |= features(pick)
                picks.append(pick)
            if best is None or len(covered) > len(best[0]):
                best = (covered, picks)
        seen, picks = best
        chosen += picks
    retrieved = frozenset().union(*top.values())
    for item in dataset.items:
        if top[item.id] - frozenset().union(*(top[c.id] for c in chosen)):
            chosen.append(item)
    return chosen, retrieved


@pytest.fixture(scope="module")
def round_trip_sample(dataset):
    return one_item_per_task_group(dataset)


def all_records(builder, items, fmt):
    for item in items:
        for config in CONFIGS:
            for k in range(K_MAX + 1):
                yield builder.build(item, config, k, fmt)


def check_round_trip(tokenizer_name, tokenizer, dataset, items, full_every):
    """Every slot span decodes to its slot text (whitespace at edges only); every ``full_every``-th
    record's chunked tokenization equals one full tokenizer call; k = 0 prompts are identical across
    configurations; equal-length controls have exactly BASM's token count."""
    builder = make_builder(tokenizer, dataset)
    report = SpanReport()
    k0_prompts: dict[str, set[str]] = {}
    basm_lengths: dict[tuple[str, int], int] = {}
    control_lengths: dict[tuple[str, int, str], int] = {}
    n_records = n_full = 0
    rendered: set[str] = set()
    for record in all_records(builder, items, "native"):
        n_records += 1
        rendered.update(skill.skill_id for skill in record.skills)
        check_spans(record, tokenizer, report)
        if record.k == 0:
            k0_prompts.setdefault(record.item_id, set()).add(record.text)
        if record.config == "basm":
            basm_lengths[record.item_id, record.k] = record.n_tokens
        if get_config(record.config).control:
            control_lengths[record.item_id, record.k, record.config] = record.n_tokens
        if n_records % full_every == 0:  # the piecewise tokenization equals one full tokenizer call
            n_full += 1
            full = tokenizer(record.text, add_special_tokens=False, return_offsets_mapping=True)
            assert full["input_ids"] == record.input_ids
            assert np.array_equal(np.asarray(full["offset_mapping"]).reshape(-1, 2), record.offsets)
    print(f"\n[{tokenizer_name}] {n_records} records ({len(items)} items, {n_full} full tokenizations): {report.summary()}")
    assert n_records == len(items) * len(CONFIGS) * (K_MAX + 1)
    assert n_full > 0
    assert report.mismatches == []
    assert report.exact + report.whitespace_edges == report.total > 0
    # k = 0: every configuration renders the same bytes
    assert len(k0_prompts) == len(items) and all(len(texts) == 1 for texts in k0_prompts.values())
    # equal-length controls: exactly the BASM token count under this tokenizer
    mismatched = {key: n for key, n in control_lengths.items() if n != basm_lengths[key[0], key[1]]}
    assert not mismatched, list(mismatched.items())[:5]
    assert len(control_lengths) == 2 * len(items) * (K_MAX + 1)
    return rendered


@pytest.mark.parametrize("tokenizer_name", ["qwen3", "bpe"])
def test_spans_round_trip_on_one_item_per_task_group(tokenizer_name, request, dataset, round_trip_sample):
    """The whole-dataset round trip below, every configuration and k, on one item per task group (plus
    one for the retrieved skills they miss): every task group, (scenario, bucket) template, domain,
    catalog, history shape and retrieved skill of the dataset is rendered."""
    items, retrieved = round_trip_sample
    scenario = lambda item: item.task_group.rsplit(".", 1)[0]
    every = dataset.items
    assert {item.task_group for item in items} == {item.task_group for item in every} and len(items) <= len({item.task_group for item in every}) + 1
    for key in (lambda item: (scenario(item), item.bucket), lambda item: item.domain, lambda item: item.catalog_domains,
                lambda item: bool(item.history), lambda item: item.correct_action == ABSTAIN):
        assert {key(item) for item in items} == {key(item) for item in every}
    rendered = check_round_trip(tokenizer_name, request.getfixturevalue(tokenizer_name), dataset, items, full_every=11)
    assert rendered == retrieved


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer_name", ["qwen3", "bpe"])
def test_spans_round_trip_for_every_item_config_and_k(tokenizer_name, request, dataset):
    """Every slot span decodes to its slot text (whitespace at edges only); chunked tokenization is exact."""
    check_round_trip(tokenizer_name, request.getfixturevalue(tokenizer_name), dataset, dataset.items, full_every=97)


def test_prompted_format_spans_and_candidates(qwen3_builder, qwen3, dataset):
    report = SpanReport()
    for item in dataset.select(split="eval", limit_per_bucket=10):
        for config in ("proc", "basm", "pad-procedure"):
            record = qwen3_builder.build(item, config, 2, "prompted")
            check_spans(record, qwen3, report)
            assert record.open_index is None and record.query_rows == [record.decision_index]
            assert all(c.anchor_index == record.decision_index for c in record.candidates)
            assert not record.text.endswith(NATIVE_FORCED_PREFIX)
    assert report.mismatches == []


def test_native_format_layout(qwen3_builder, qwen3, dataset):
    item = dataset.select(buckets=["T_wrong"], split="eval")[0]
    record = qwen3_builder.build(item, "basm", 2, "native")
    ids, text = record.input_ids, record.text
    assert text.endswith(NATIVE_FORCED_PREFIX)
    assert "<think>\n\n</think>" in text  # thinking disabled through the real template switch
    assert record.decision_index == len(ids) - 1
    # the open row is the last token of the generation prompt; the forced prefix starts with <tool_call>
    assert qwen3.decode(ids[record.open_index + 1 :]) == NATIVE_FORCED_PREFIX
    assert ids[record.open_index + 1] == qwen3.convert_tokens_to_ids("<tool_call>")
    # every row from the open row to the decision row: the forced-prefix rows feed the decision
    assert record.query_rows == list(range(record.open_index, record.decision_index + 1))
    assert len(record.query_rows) == len(qwen3.encode(NATIVE_FORCED_PREFIX, add_special_tokens=False)) + 1
    (memory,) = record.spans["memory"]  # the memory block holds every slot span
    assert all(memory[0] <= s and e <= memory[1] for name, spans in record.spans.items() for s, e in spans if name != "memory")
    for candidate in record.candidates:
        # independent in-context tokenization: the whole prompt plus the call as the model writes it
        if candidate.action == ABSTAIN:
            full_text = qwen3.decode(ids[: record.open_index + 1]) + ABSTAIN_TEXT
        else:
            full_text = text + candidate.action + '", "arguments": {'
        full = qwen3(full_text, add_special_tokens=False)["input_ids"]
        start = candidate.anchor_index + 1
        assert full[start : start + len(candidate.token_ids)] == candidate.token_ids
        assert qwen3.decode(candidate.token_ids).startswith(candidate.action if candidate.action != ABSTAIN else ABSTAIN_TEXT)
        assert not candidate.boundary_merge


def test_qwen3_get_tools_collide_on_first_token(qwen3_builder, qwen3, dataset):
    """get_stock_info vs get_order_details share the first token 'get': flagged, never silent."""
    item = next(i for i in dataset.items if i.correct_action == "get_stock_info" and "get_order_details" in i.wrong_tools)
    record = qwen3_builder.build(item, "proc", 1, "native")
    by_action = {c.action: c for c in record.candidates}
    assert qwen3.decode([by_action["get_stock_info"].first_token_id]) == "get"
    assert by_action["get_stock_info"].first_token_id == by_action["get_order_details"].first_token_id
    assert "get_order_details" in by_action["get_stock_info"].collides_with
    assert record.collision is True
    # the abstain candidate is anchored at the open row and collides with nothing
    assert by_action[ABSTAIN].anchor_index == record.open_index and by_action[ABSTAIN].collides_with == []


def test_template_without_tool_support_gets_schemas_in_system_message(bpe, dataset):
    assert not TemplateSupport(bpe).tools
    builder = make_builder(bpe, dataset)
    item = dataset.select(buckets=["T_repair"], split="eval")[0]
    record = builder.build(item, "basm", 1, "native")
    system = record.text.split("<|im_end|>")[0]
    assert TOOLS_BLOCK_HEADER in system
    assert all(f'"name": "{name}"' in system for name in dataset.catalog_for(item).names)
    # the failed call of the history is written as text, the error as a tool response
    assert "<tool_response>" in record.text and item.history[0]["tool_call"]["name"] in record.text


def test_configurations_show_their_slots(qwen3_builder, dataset):
    item = dataset.select(buckets=["T_wrong"], split="eval")[0]
    expected = {
        "base": set(), "proc": {"goal", "procedure", "tools"},
        "app": {"goal", "procedure", "tools", "applicability"},
        "basm": {"goal", "procedure", "tools", *BOUNDARY_SLOTS},
        "basm-no-avoid": {"goal", "procedure", "tools", *BOUNDARY_SLOTS} - {"avoidance_rules"},
        "basm-no-recovery": {"goal", "procedure", "tools", *BOUNDARY_SLOTS} - {"recovery_notes"},
        "pad-filler": {"goal", "procedure", "tools", "control"},
        "pad-procedure": {"goal", "procedure", "tools", "control"},
    }
    for config, slots in expected.items():
        record = qwen3_builder.build(item, config, 1, "native")
        shown = {slot for skill in record.skills for slot in skill.slots}
        assert shown == slots, config
        if get_config(config).control:
            assert record.spans_kind["boundary"] == f"control:{get_config(config).control}"
            assert "Risk cues" not in record.text


def test_gate_and_budget(qwen3, dataset):
    item = dataset.select(buckets=["T_wrong"], split="eval")[0]
    closed = make_builder(qwen3, dataset, gamma=1.0).build(item, "basm", 3, "native")
    assert not any(skill.boundary_exposed for skill in closed.skills) and "boundary" not in closed.spans
    budget = 40
    tight = make_builder(qwen3, dataset, beta=budget).build(item, "basm", 3, "native")
    boundary_text = [span.text for skill in tight.skills for slot, span in skill.slots.items() if slot in BOUNDARY_SLOTS]
    items = [part for text in boundary_text for part in text.split("\n- ")]
    assert sum(len(qwen3(part, add_special_tokens=False)["input_ids"]) for part in items) <= budget
    assert tight.n_tokens < make_builder(qwen3, dataset).build(item, "basm", 3, "native").n_tokens


def test_invalid_requests_are_rejected(qwen3_builder, dataset):
    item = dataset.items[0]
    with pytest.raises(ValueError, match="unknown memory configuration"):
        qwen3_builder.build(item, "procedural", 1)
    with pytest.raises(ValueError, match="decision format"):
        qwen3_builder.build(item, "basm", 1, "json")
    with pytest.raises(ValueError, match="k must be"):
        qwen3_builder.build(item, "basm", -1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer("/nonexistent/tokenizer")


def test_records_are_deterministic(qwen3, dataset):
    item = dataset.select(buckets=["T_repair"], split="eval")[0]
    first = make_builder(qwen3, dataset).build(item, "pad-procedure", 4, "native")
    second = make_builder(qwen3, dataset).build(item, "pad-procedure", 4, "native")
    assert first.text == second.text and first.input_ids == second.input_ids
    assert re.search(r"## Skill 4", first.text)
