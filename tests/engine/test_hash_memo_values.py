"""Issue 41: the weights hash memo (``hashes.json``) is only a memo: a value that is not a SHA-256 hex
digest is never used as a fingerprint, and a memo the JSON parser cannot read (200,000 ``[``) is rebuilt."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from probes.engine import loading


@pytest.fixture
def weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BASM_PROBES_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"weights " * 1000)
    return path


def _true(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("value", ["not-a-hash", "0" * 16, "A" * 64, "g" * 64, 42, None, ["0" * 64]])
def test_a_memo_value_that_is_no_sha256_digest_is_hashed_again(weights: Path, value: object, capsys: pytest.CaptureFixture) -> None:
    assert loading.file_sha256(weights) == _true(weights)
    index = loading.hash_cache_path()
    memo = json.loads(index.read_text())
    (key,) = memo
    index.write_text(json.dumps({key: value}))  # a forged or damaged value under the file's own key
    assert loading.file_sha256(weights) == _true(weights)  # was: the forged value, as the fingerprint
    assert "1 of its entries are not SHA-256 hex digests" in capsys.readouterr().err
    assert json.loads(index.read_text()) == {key: _true(weights)}  # rewritten with the true digest


@pytest.mark.parametrize("text", ["[" * 200_000, '{"a": ' * 200_000, "[1, 2]", "torn {", "\udcff"])
def test_a_memo_that_is_no_json_object_is_rebuilt(weights: Path, text: str, capsys: pytest.CaptureFixture) -> None:
    index = loading.hash_cache_path()
    index.parent.mkdir(parents=True)
    index.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert loading.file_sha256(weights) == _true(weights)  # was: RecursionError for the deep nestings
    assert f"warning: hash memo {index}: " in capsys.readouterr().err
    assert list(json.loads(index.read_text()).values()) == [_true(weights)]


def test_a_well_formed_memo_is_used_silently(weights: Path, capsys: pytest.CaptureFixture) -> None:
    first = loading.file_sha256(weights)
    capsys.readouterr()
    assert loading.file_sha256(weights) == first and capsys.readouterr().err == ""
