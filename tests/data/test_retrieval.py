"""Eq. 8 retrieval: its parts, determinism, the embedder record, and the dataset-level bar
(the tempting skill ranks first in ≥ 90% of T_wrong items)."""

from __future__ import annotations

import numpy as np
import pytest

from probes.data.retrieval import (
    LexicalEmbedder, RetrievalWeights, Retriever, boundary_relevance, content_words, jaccard,
    make_embedder, step_overlap, tools_in_text,
)


@pytest.fixture(scope="module")
def dataset(v1_dataset):
    return v1_dataset


def test_parts_of_the_score(dataset):
    skill = dataset.skills["retail.lookup_order"]
    assert jaccard({"a", "b"}, {"b", "c"}) == pytest.approx(1 / 3)
    assert jaccard(set(), set()) == 0.0
    assert tools_in_text("then call get_order_details twice", ["get_order", "get_order_details"]) == {"get_order_details"}
    assert content_words("Call get_order_details for the order") == {"order", "details"}  # "call", "get" are stop words
    state = " ".join(skill.procedure)
    assert step_overlap(state, skill) == 1.0
    assert 0.0 < boundary_relevance(skill.risk_cues[0], skill) <= 1.0
    assert boundary_relevance("zzz qqq", skill) == 0.0


def test_score_is_the_weighted_sum_and_ranking_is_deterministic(dataset):
    item = dataset.select(buckets=["T_wrong"], split="eval")[0]
    weights = RetrievalWeights(sem=0.3, tool=0.5, step=0.2)
    retriever = Retriever(LexicalEmbedder(), weights)
    ranked = retriever.rank(item.state_text, tools_in_text(item.state_text, dataset.catalog_for(item).names), dataset.library_for(item))
    for entry in ranked:
        assert entry.score == pytest.approx(0.3 * entry.semantic + 0.5 * entry.tool + 0.2 * entry.step, abs=1e-12)
    assert [e.score for e in ranked] == sorted((e.score for e in ranked), reverse=True)
    again = Retriever(LexicalEmbedder(), weights).rank(item.state_text, set(), dataset.library_for(item))
    assert [e.skill.id for e in again] == [e.skill.id for e in Retriever(LexicalEmbedder(), weights).rank(item.state_text, set(), dataset.library_for(item))]


def test_minilm_is_used_when_installed_and_embeds_unit_vectors():
    embedder = make_embedder("auto")
    assert embedder.name == "all-MiniLM-L6-v2"
    vectors = embedder.embed(["cancel my order", "cancel my booking"])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="embedder must be"):
        make_embedder("bert")


@pytest.mark.parametrize("embedder", ["minilm", "lexical"])
def test_tempting_skill_ranks_first_in_most_t_wrong_items(dataset, embedder):
    retriever = Retriever(make_embedder(embedder))
    items = dataset.select(buckets=["T_wrong"], split="eval")
    retriever.warm([item.state_text for item in items], dataset.skills.values())
    first = sum(
        retriever.rank(item.state_text, tools_in_text(item.state_text, dataset.catalog_for(item).names), dataset.library_for(item))[0].skill.id
        == item.tempting_skill
        for item in items
    )
    share = first / len(items)
    print(f"\n[{embedder}] tempting skill ranked first in {first}/{len(items)} = {share:.1%} of eval T_wrong items")
    assert share >= 0.90
