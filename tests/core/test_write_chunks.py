"""``OutputRoot.write_chunks`` (a file too large to hold in memory, streamed): the chunks land in order,
and a generator that raises after its last chunk (a failed hash check) leaves the old file whole and
no temporary behind."""

from __future__ import annotations

import pytest

from probes.core.files import OutputRoot


def test_chunks_land_in_order(tmp_path):
    path = OutputRoot(tmp_path).write_chunks("big.bin", iter([b"ab", b"", b"cd"]))
    assert path.read_bytes() == b"abcd"


def test_a_failing_stream_leaves_the_old_file_whole(tmp_path):
    root = OutputRoot(tmp_path)
    root.write_binary("big.bin", b"old")

    def chunks():
        yield b"new, longer content"
        raise RuntimeError("hash mismatch")

    with pytest.raises(RuntimeError, match="hash mismatch"):
        root.write_chunks("big.bin", chunks())
    assert (tmp_path / "big.bin").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.bin"]
