"""The stored MiniLM vectors of the bundled datasets (probes/data/embeddings, ``python docs/embeddings.py``):
they cover every text the bundled retrieval embeds, were computed by the installed model files, equal a
fresh encoding, and a store of other model files is said and not used."""

from __future__ import annotations

import io

import numpy as np
import pytest

from probes.data.dataset import load_dataset
from probes.data.retrieval import STORED_DATASETS, MiniLMEmbedder, Retriever, embedded_texts, make_embedder, text_key


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return make_embedder("minilm")  # the process's one MiniLM (stored vectors and, once needed, the model)


def test_the_store_covers_the_bundled_datasets_and_is_of_these_model_files(embedder: MiniLMEmbedder) -> None:
    assert embedder.stored, f"{embedder.stored_path} is missing or of other model files: run python docs/embeddings.py"
    for name in STORED_DATASETS:
        dataset = load_dataset(name)
        texts = embedded_texts([item.state_text for item in dataset.items], dataset.skills.values(), boundary=True)
        missing = [text for text in texts if text_key(text) not in embedder.stored]
        assert not missing, f"{name}: {len(missing)} texts have no stored vector (e.g. {missing[0][:60]!r}): run python docs/embeddings.py"


def test_stored_vectors_equal_a_fresh_encoding_and_rank_the_same(embedder: MiniLMEmbedder, v1_dataset) -> None:
    items = v1_dataset.select(buckets=["T_wrong"], split="eval")[:3]
    texts = embedded_texts([item.state_text for item in items], list(v1_dataset.skills.values())[:5], boundary=True)
    stored = np.stack([embedder.stored[text_key(text)] for text in texts])
    np.testing.assert_allclose(stored, embedder.encode(texts), rtol=0, atol=1e-5)
    fresh = Retriever(MiniLMEmbedder(stored=None))
    fresh.embedder._model = embedder._model  # the loaded model, shared: no second load
    for item in items:
        ranked = [entry.skill.id for entry in Retriever(embedder).retrieve(item, v1_dataset)]
        assert ranked == [entry.skill.id for entry in fresh.retrieve(item, v1_dataset)]


def test_a_store_of_other_model_files_is_said_and_not_used(embedder: MiniLMEmbedder, tmp_path, capsys) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, fingerprint=np.array("0" * 32), keys=np.array([text_key("cancel my order")]), vectors=np.zeros((1, 384), np.float32))
    (tmp_path / "other.npz").write_bytes(buffer.getvalue())
    other = MiniLMEmbedder(stored=tmp_path / "other.npz")
    other._model = embedder._model
    vector = other.embed(["cancel my order"])[0]
    assert "computed by other all-MiniLM-L6-v2 files" in capsys.readouterr().err
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)  # encoded, not the stored zeros
