"""Model fingerprints (probes.engine.loading.model_fingerprint): the weight hash is memoised by size and
mtime, checks sampled content as well, reads samples only, and keeps its memo outside the model folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runs import edit_in_place_keep_mtime


pytestmark = pytest.mark.usefixtures("private_cache")  # a weight-hash memo of its own per test


def test_weight_hash_is_memoised_by_size_and_mtime(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import probes.engine.loading

    first = probes.engine.loading.model_fingerprint(model)
    reads = []
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: reads.append(self.name) or real_open(self, *a, **k))
    assert probes.engine.loading.model_fingerprint(model) == first
    assert "model.safetensors" not in reads


def test_the_hash_memo_checks_sampled_content_as_well(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import probes.engine.loading as loading

    first = loading.model_fingerprint(model)
    weights = model / "model.safetensors"
    memo = json.loads(loading.hash_cache_path().read_text())
    edit_in_place_keep_mtime(weights)
    st = weights.stat()
    # even were the ctime restored too (it cannot be, without root), the sampled blocks differ: the memo misses
    monkeypatch.setattr(loading, "_memo_key", lambda path, stat_, sampled: (
        f"{path.resolve()}|{st.st_dev}:{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|FIXED|{sampled[:32]}"))
    assert loading.model_fingerprint(model)["weights"] != first["weights"]
    assert len(json.loads(loading.hash_cache_path().read_text())) > len(memo)


def test_a_memoised_fingerprint_reads_samples_only(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    import probes.engine.loading as loading

    first = loading.model_fingerprint(model)
    hashed = []
    real = hashlib.sha256

    class Counting:
        def __init__(self, data: bytes = b"") -> None:
            self.h = real(data)
            hashed.append(len(data))

        def update(self, data: bytes) -> None:
            hashed.append(len(data))
            self.h.update(data)

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    monkeypatch.setattr(loading.hashlib, "sha256", Counting)
    assert loading.model_fingerprint(model) == first
    size = (model / "model.safetensors").stat().st_size
    assert size > 4 * loading.SAMPLE_BLOCKS * loading.SAMPLE_BLOCK_SIZE  # else sampling is the whole file
    assert sum(hashed) < size / 4


def test_the_hash_memo_lives_outside_the_model_folder(model: Path) -> None:
    import probes.engine.loading as loading

    before = sorted(p.name for p in model.iterdir())
    loading.model_fingerprint(model)
    assert sorted(p.name for p in model.iterdir()) == before
    assert loading.hash_cache_path().is_file() and model not in loading.hash_cache_path().parents
