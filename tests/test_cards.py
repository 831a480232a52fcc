"""Dataset cards: the committed CARD.md files are what the code measures now, and the card's
collision method agrees with the prompt builder's native records."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.reporting.cards import CARD_NAME, collision_table, dataset_card
from probes.data.dataset import load_dataset
from probes.prompts.builder import BuildSettings, PromptBuilder, load_tokenizer
from probes.data.retrieval import Retriever, make_embedder

DATASETS = Path(__file__).resolve().parent.parent / "datasets"


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


@pytest.mark.parametrize("name", ["basm_probe", "basm_probe_v2"])
def test_committed_card_is_regenerated_exactly(name):
    committed = (DATASETS / name / CARD_NAME).read_text(encoding="utf-8")
    assert dataset_card(DATASETS / name) == committed, f"datasets/{name}/{CARD_NAME} is stale: run probes.reporting.cards.write_card"


def test_collisions_match_native_prompt_records(qwen3):
    """Decision-set collision from tool names alone == the `collision` field of real native records
    (Qwen3 tokenizer, memory-free prompts), on items with and without a collision."""
    dataset = load_dataset(DATASETS / "basm_probe")
    builder = PromptBuilder(qwen3, dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=0))
    chosen = [item for item in dataset.items if item.task_group in ("retail.cancel_vs_return.g00", "retail.x_cancel_order_vs_booking.g00", "travel.flight_vs_hotel.g00")]
    subset = type(dataset)(dataset.root, dataset.domains, tuple(chosen))
    table, _ = collision_table(subset, qwen3)
    for bucket, group in table.set_index("bucket").iterrows():
        records = [builder.build(item, "base", 0, "native") for item in chosen if item.bucket == bucket]
        assert group["record_collision"] == pytest.approx(sum(r["collision"] for r in records) / len(records), abs=1e-12)
        decision = [any(c["role"] in ("correct", "wrong") and any(o["role"] in ("correct", "wrong") for o in r["candidates"] if o["action"] in c["collides_with"])
                        for c in r["candidates"]) for r in records]
        assert group["decision_set_collision"] == pytest.approx(sum(decision) / len(decision), abs=1e-12)
    for column in ("decision_set_collision", "record_collision"):
        assert 0 < table[column].max() and table[column].min() < 1  # both outcomes occur in the sample
