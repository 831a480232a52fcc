"""The typed prompt record: the builder returns :class:`PromptRecord` (with typed candidates,
retrieved skills and slot spans); ``to_json`` writes the documented JSON Lines object and
``from_json`` reads it back, checked (docs/prompt_records.md)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from probes.data.configs import CONFIGS
from probes.data.retrieval import RetrievalWeights, Retriever, make_embedder
from probes.prompts.builder import BuildSettings, PromptBuilder
from probes.prompts.record import REQUIRED, Candidate, PromptRecord, SkillEntry, SlotSpan, record_id

# the documented fields, in the order ``basm-probes build`` writes them
DOCUMENTED = ("record_id", "item_id", "bucket", "split", "domain", "task_group", "config", "k", "format", "tokenizer",
              "text", "input_ids", "n_tokens", "decision_index", "open_index", "query_rows", "spans", "spans_kind",
              "skills", "candidates", "collision", "correct_action", "wrong_tools", "tempting_skill", "tempting_rank", "tempting_shown_rank", "retrieval")
CANDIDATE_KEYS = ("role", "action", "anchor_index", "text", "token_ids", "first_token_id", "boundary_merge", "collides_with")


@pytest.fixture(scope="module")
def records(qwen3_tokenizer, v1_dataset) -> list[PromptRecord]:
    builder = PromptBuilder(qwen3_tokenizer, v1_dataset, Retriever(make_embedder("lexical"), RetrievalWeights()),
                            BuildSettings(k_max=2, relevance="lexical"), tokenizer_name="qwen3")
    items = [v1_dataset.select(buckets=[bucket], split="eval")[0] for bucket in ("T_ok", "T_wrong", "T_repair")]
    return list(builder.build_many(items, list(CONFIGS), [0, 2], ["native", "prompted"]))


def test_the_builder_returns_typed_records(records) -> None:
    assert len(records) == 3 * len(CONFIGS) * 2 * 2
    for record in records:
        assert isinstance(record, PromptRecord) and record.offsets is not None and record.offsets.shape == (record.n_tokens, 2)
        assert all(isinstance(c, Candidate) for c in record.candidates)
        assert all(isinstance(s, SkillEntry) and all(isinstance(slot, SlotSpan) for slot in s.slots.values()) for s in record.skills)
        assert all(isinstance(span, tuple) and len(span) == 2 for spans in record.spans.values() for span in spans)
        assert record.record_id == record_id(record.item_id, record.config, record.k, record.format)
        assert len(record.skills) == record.k or not CONFIGS[record.config].slots
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.k = 3  # type: ignore[misc]
    # k = 0 prompts are one prompt under every configuration's name
    k0 = [r for r in records if r.k == 0 and r.item_id == records[0].item_id and r.format == "native"]
    assert {r.config for r in k0} == set(CONFIGS) and len({json.dumps(r.to_json()["input_ids"]) for r in k0}) == 1


def test_to_json_is_the_documented_object_and_from_json_reads_it_back(records) -> None:
    assert REQUIRED == DOCUMENTED
    for record in records:
        obj = record.to_json()
        assert tuple(obj) == DOCUMENTED
        assert all(tuple(c) == CANDIDATE_KEYS for c in obj["candidates"])
        assert all(isinstance(span, list) for spans in obj["spans"].values() for span in spans)
        line = json.dumps(obj)
        back = PromptRecord.from_json(json.loads(line))
        assert back == record and back.offsets is None  # offsets are never written
        assert json.dumps(back.to_json()) == line


def test_from_json_names_what_is_wrong(records) -> None:
    good = records[1].to_json()
    with pytest.raises(ValueError, match="missing spans"):
        PromptRecord.from_json({k: v for k, v in good.items() if k != "spans"})
    with pytest.raises(ValueError, match="candidate 0 lacks token_ids"):
        PromptRecord.from_json({**good, "candidates": [{k: v for k, v in good["candidates"][0].items() if k != "token_ids"}]})
    with pytest.raises(ValueError, match="does not match its fields"):
        PromptRecord.from_json({**good, "k": good["k"] + 1})
    with pytest.raises(ValueError, match="n_tokens / decision_index"):
        PromptRecord.from_json({**good, "n_tokens": good["n_tokens"] + 1})


def test_a_record_read_back_has_no_offsets_and_the_controls_say_so(records) -> None:
    from probes.scoring.controls import random_control

    record = next(r for r in records if r.config == "basm" and r.spans.get("boundary"))
    assert isinstance(random_control(record, 0), list)  # built: the offsets are there
    with pytest.raises(ValueError, match="no character offsets"):
        random_control(PromptRecord.from_json(record.to_json()), 0)
