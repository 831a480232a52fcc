"""Runs never lie about their results: each test reproduces one failure of a real run (changed
weights or data under a half-finished output, concurrent writers, kills and full disks mid-write,
corrupt lines, bad options and datasets) and checks that nothing is lost, duplicated or mixed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from probes.cli import main
from probes.dataset import DEFAULT_DATASET_DIR
from probes.results import ResultsConfigMismatch, load_results

torch.set_num_threads(1)
FAST = ["--embedder", "lexical", "--split", "all", "--limit", "1", "--k-max", "1", "--bucket", "T_wrong", "--configs", "base,basm", "--no-figure"]


@pytest.fixture(autouse=True)
def _hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASM_PROBES_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def model(tiny_qwen3_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny model, free to be edited."""
    return Path(shutil.copytree(tiny_qwen3_dir, tmp_path / "model"))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return Path(shutil.copytree(DEFAULT_DATASET_DIR, tmp_path / "dataset"))


def sweep(model: Path, out: Path, *extra: str, dataset: Path = DEFAULT_DATASET_DIR) -> list[str]:
    return ["sweep", "--model", str(model), "--dataset", str(dataset), "--out", str(out), *FAST, *extra]


# ---------------------------------------------------------------------------- 1. fingerprinted resume
def test_changed_weights_stop_a_resume(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out)) == 0
    weights = load_file(model / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1.0
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ResultsConfigMismatch, match=r"fingerprint\.weights.*--overwrite"):
        main(sweep(model, out))
    before = (out / "sweep.jsonl").read_bytes()
    assert main(sweep(model, out, "--overwrite")) == 0
    assert (out / "sweep.jsonl").read_bytes() != before


def test_edited_items_stop_a_resume(model: Path, dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(sweep(model, out, dataset=dataset)) == 0
    (item_id,) = set(load_results(out / "sweep.jsonl")["item_id"])
    items = dataset / "items.jsonl"
    lines = [json.loads(line) for line in items.read_text().splitlines()]
    for raw in lines:
        if raw["id"] == item_id:
            raw["user"] += " Please hurry."
    items.write_text("".join(json.dumps(raw) + "\n" for raw in lines))
    with pytest.raises(ResultsConfigMismatch, match=r"fingerprint\.dataset"):
        main(sweep(model, out, dataset=dataset))


def test_linear_residuals_are_keyed_by_the_weights() -> None:
    from probes.linear import feature_key

    record = {"input_ids": [1, 2, 3], "query_rows": [2]}
    assert feature_key(record, "weightsA|float32") != feature_key(record, "weightsB|float32")


def test_weight_hash_is_memoised_by_size_and_mtime(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import probes.loading

    first = probes.loading.model_fingerprint(model)
    reads = []
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: reads.append(self.name) or real_open(self, *a, **k))
    assert probes.loading.model_fingerprint(model) == first
    assert "model.safetensors" not in reads
