"""Content-defined prefix blocks and per-layer key/value buffers (probes.engine.prefix_cache).

Block ends are a function of the token ids and the tokenizer's line breaks alone: a prefix's blocks
are those of any longer prefix that end inside it, whatever order the tokenizer's tokens were first
seen in. So a prompt's logits are bit-identical scored cold, after the other prompts of its item (in
either order) and with the cache off, while the prompts still share whole blocks; block ends that
depend on what was computed before break that (a planted rule, caught). A later block writes its keys
and values into the prefix's buffers instead of concatenating the keys before it (a planted
concatenation, caught).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

import probes.engine.session as session_module
from probes.data.retrieval import Retriever, make_embedder
from probes.engine.prefix_cache import (BREAK, BREAK_BLOCK, LINE_BLOCK, LINE_BREAK, MAX_BLOCK, PLAIN, PrefixBuffers, PrefixReuseCounter,
                                        TokenBreaks,
                                        prefix_blocks)
from probes.engine.session import EngineSession
from probes.prompts.builder import BuildSettings, PromptBuilder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, organism_tokenizer) -> Path:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(organism_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    out = tmp_path_factory.mktemp("tiny_qwen3_block_ends")
    Qwen3ForCausalLM(config).eval().save_pretrained(out)
    organism_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def records(tiny_dir: Path, v1_dataset) -> list:
    """One item's prompts as a sweep visits them (they part inside the memory block)."""
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_dir), v1_dataset, Retriever(make_embedder("lexical")), BuildSettings(),
                            tokenizer_name="qwen3")
    item = v1_dataset.select(buckets=["T_wrong"], split="eval")[0]
    return [builder.build(item, config, k) for k, config in ((0, "base"), (1, "proc"), (1, "basm"), (2, "proc"), (2, "basm"))]


def test_the_rule_on_planted_kinds() -> None:
    start = BREAK_BLOCK + 5 + LINE_BLOCK
    n = start + MAX_BLOCK + 100
    kinds = np.full(n, PLAIN, dtype=np.int8)
    kinds[[10, BREAK_BLOCK + 5]] = BREAK  # the first is too early in its block
    kinds[[BREAK_BLOCK + 20, start]] = LINE_BREAK  # so is the first
    assert prefix_blocks(kinds) == [(0, BREAK_BLOCK + 5), (BREAK_BLOCK + 5, start), (start, start + MAX_BLOCK), (start + MAX_BLOCK, n)]
    assert prefix_blocks(kinds[:7]) == [(0, 7)] and prefix_blocks(kinds[:0]) == []


def test_block_ends_are_a_function_of_the_tokens_up_to_them(tiny_dir: Path, records: list) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    forward, backward = TokenBreaks(tokenizer), TokenBreaks(tokenizer)
    for record in reversed(records):  # the second reads the tokenizer's tokens in another order
        backward.kinds(record.input_ids)
    for record in records:
        ids = record.input_ids
        kinds = forward.kinds(ids)
        assert np.array_equal(kinds, backward.kinds(ids))
        whole = prefix_blocks(kinds)
        assert len(whole) >= 3 and (kinds == BREAK).any() and (kinds == LINE_BREAK).any()
        for p in range(1, len(ids), 37):
            inside = [(a, b) for a, b in whole if b < p]
            assert prefix_blocks(forward.kinds(ids[:p])) == inside + [(inside[-1][1] if inside else 0, p)]
    assert (TokenBreaks(None).kinds(records[0].input_ids) == PLAIN).all()  # no tokenizer: blocks of MAX_BLOCK


def _logits_in_orders(tiny_dir: Path, records: list) -> tuple[list[list[torch.Tensor]], list[int]]:
    """Each record's baseline logits: cold, in the sweep's order and in reverse with reuse, and with the cache off;
    and the tokens each reuse session reused."""
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    cold, forward, backward = (EngineSession(model, tokenizer=tokenizer) for _ in range(3))
    off = EngineSession(model, tokenizer=tokenizer, prefix_cache=0)

    def logits(session: EngineSession, record) -> torch.Tensor:
        return session.run(record.input_ids, record.query_rows).conditions[0].logits

    def cold_logits(record) -> torch.Tensor:
        cold.clear_prefix_cache()
        return logits(cold, record)

    by_order = {id(r): logits(backward, r) for r in reversed(records)}
    out = [[cold_logits(r), logits(forward, r), by_order[id(r)], logits(off, r)] for r in records]
    return out, [forward.prefix_reuse.tokens_reused, backward.prefix_reuse.tokens_reused]


def test_warm_cold_uncached_and_either_order_are_bit_identical(tiny_dir: Path, records: list) -> None:
    per_record, reused = _logits_in_orders(tiny_dir, records)
    for record, (cold, *others) in zip(records, per_record):
        assert all(torch.equal(cold, other) for other in others), record.record_id
    prefixes = sum(min(r.query_rows) for r in records)
    assert min(reused) > prefixes / 2  # the prompts share whole blocks (the system turn, catalog, first skills)


def test_block_ends_that_depend_on_the_past_are_caught(tiny_dir: Path, records: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the first prefix of a session in one block, later ones in 64-token blocks (ends that
    depend on what was computed before, not on the tokens): scored warm, a prompt differs from cold."""
    calls = []

    def history_dependent(kinds: np.ndarray) -> list[tuple[int, int]]:
        calls.append(len(kinds))
        n = len(kinds)
        return [(0, n)] if len(calls) == 1 else [(a, min(a + 64, n)) for a in range(0, n, 64)]

    monkeypatch.setattr(session_module, "prefix_blocks", history_dependent)
    per_record, _ = _logits_in_orders(tiny_dir, records[:3])
    assert not all(torch.equal(cold, other) for cold, *others in per_record for other in others)


class _Concatenations(TorchDispatchMode):
    """The largest position count of an ``aten.cat`` output along the key axis (dim 2 of a 4-D tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.cat.default and out.dim() == 4:
            self.largest = max(self.largest, out.shape[2])
        return out


def _largest_concatenation(tiny_dir: Path, records: list) -> tuple[int, int]:
    """(the largest concatenation while a warm prompt computes its own blocks, the largest of those blocks)."""
    session = EngineSession(tiny_dir)
    session.run(records[1].input_ids, records[1].query_rows)
    record = records[3]  # shares the first skill with records[1], then its own blocks
    prefix = record.input_ids[: min(record.query_rows)]
    session.prefix_reuse = PrefixReuseCounter()
    with _Concatenations() as seen:
        session._prefix_kv(prefix)
    reused = session.prefix_reuse.tokens_reused
    computed = [b - a for a, b in prefix_blocks(session._token_breaks.kinds(prefix)) if a >= reused]
    assert reused > 0 and len(computed) == session.prefix_reuse.prefix_blocks > 0
    return seen.largest, max(computed)


def test_a_block_writes_into_the_buffers_and_concatenates_nothing(tiny_dir: Path, records: list, monkeypatch: pytest.MonkeyPatch) -> None:
    largest, block = _largest_concatenation(tiny_dir, records)
    assert largest <= block  # RoPE's halves and the like, inside a block; never the keys before it
    write = PrefixBuffers.write

    def concatenating(self, layer, start, key, value):  # planted: the keys before the block joined to it
        k, v = write(self, layer, start, key, value)
        return torch.cat((k[:, :, :start], key), dim=2), torch.cat((v[:, :, :start], value), dim=2)

    monkeypatch.setattr(PrefixBuffers, "write", concatenating)
    largest, block = _largest_concatenation(tiny_dir, records)
    assert largest > block
