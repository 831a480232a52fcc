"""Regenerate probes/data/embeddings/all-MiniLM-L6-v2.npz, the MiniLM vectors of every text the
bundled datasets' retrieval embeds (tests/data/test_stored_vectors.py fails when one is missing or
they were computed by other model files): ``python docs/embeddings.py``."""

from probes.data.dataset import load_dataset
from probes.data.retrieval import STORED_DATASETS, STORED_VECTORS, MiniLMEmbedder, embedded_texts, write_stored_vectors

if __name__ == "__main__":
    texts = []
    for name in STORED_DATASETS:
        dataset = load_dataset(name)
        texts += embedded_texts([item.state_text for item in dataset.items], dataset.skills.values(), boundary=True)
    print(f"wrote {write_stored_vectors(MiniLMEmbedder(stored=None), texts)} vectors to {STORED_VECTORS}")
