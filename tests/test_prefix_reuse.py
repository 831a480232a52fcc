"""Shared-prefix key/value reuse across prompts (probes.prefix_cache, ProbeSession.run).

Bar: a sweep-like sequence of real prompt records (one item, k = 0 then proc/app/basm/basm-anon at
k = 1..3, built by PromptBuilder) scored on a tiny random fp32 Qwen3 (the bundled organism's
tokenizer and chat template: a 3k vocabulary keeps the test fast; attention scores widened so
softmax rows are far from uniform) with reuse gives every output of the session without reuse to ≤ 1e-5: logits at every kept row,
span masses, full attention rows, residuals, entropies, candidate log-probabilities and candidate
span masses, under knockouts whose keys lie inside the reused prefix. The reuse counter equals an
independent count of the shared prefixes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from probes.dataset import load_dataset
from probes.engine import Knockout, ProbeSession, span_positions
from probes.organism import ORGANISM_DIR
from probes.prefix_cache import PrefixKVCache, common_prefix_length
from probes.rendering import BuildSettings, PromptBuilder
from probes.retrieval import Retriever, make_embedder

TOL = 1e-5


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(ORGANISM_DIR)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                weight.mul_(3.0)
    out = tmp_path_factory.mktemp("tiny_qwen3_organism_tokenizer")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def records(tiny_dir: Path):
    dataset = load_dataset()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    builder = PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings(), tokenizer_name="qwen3")
    item = dataset.select(buckets=["T_wrong"], split="eval")[0]
    out = [builder.build(item, "base", 0)]
    out += [builder.build(item, config, k) for k in (1, 2, 3) for config in ("proc", "app", "basm", "basm-anon")]
    return out


def score(session: ProbeSession, record: dict):
    spans = {name: span_positions(record["spans"].get(name, [])) for name in ("boundary", "procedure", "memory")}
    conditions = [
        Knockout.from_spans("boundary", record["spans"].get("boundary", [])),
        Knockout.from_spans("memory_l1", record["spans"].get("memory", []), layers=(1,), continuation=False),
    ]
    conditions = [c for c in conditions if c.key_positions]
    candidates = {f"{c['role']}:{c['action']}": (c["anchor_index"], c["token_ids"]) for c in record["candidates"] if c["role"] != "other"}
    return session.run(record["input_ids"], record["query_rows"], spans, conditions, candidates, record_rows=True, record_residual=True)


def assert_same(a, b, where: str) -> None:
    assert a.input_ids == b.input_ids and a.query_rows == b.query_rows
    assert [c.condition for c in a.conditions] == [c.condition for c in b.conditions]
    for x, y in zip(a.conditions, b.conditions):
        tag = f"{where} {x.condition.name}"
        assert x.row_offset == y.row_offset
        assert (x.logits - y.logits).abs().max() <= TOL, tag
        assert (x.rows - y.rows).abs().max() <= TOL, tag
        assert (x.residual - y.residual).abs().max() <= TOL, tag
        assert abs(x.entropy - y.entropy) <= TOL, tag
        assert x.span_mass.keys() == y.span_mass.keys()
        for span in x.span_mass:
            assert (x.span_mass[span] - y.span_mass[span]).abs().max() <= TOL, (tag, span)
        assert x.candidate_token_logprobs.keys() == y.candidate_token_logprobs.keys()
        for name in x.candidate_token_logprobs:
            assert (x.candidate_token_logprobs[name] - y.candidate_token_logprobs[name]).abs().max() <= TOL, (tag, name)
            for span in x.candidate_span_mass[name]:
                assert (x.candidate_span_mass[name][span] - y.candidate_span_mass[name][span]).abs().max() <= TOL, (tag, name, span)


def test_sweep_sequence_with_reuse_equals_without(tiny_dir, records):
    plain = ProbeSession(tiny_dir, prefix_cache=0)
    reuse = ProbeSession(tiny_dir)  # the default: one cached prefix
    for record in records:
        assert_same(score(reuse, record), score(plain, record), record["record_id"])
    assert plain.prefix_reuse.tokens_reused == 0
    # independent count: each prompt's prefix (up to its first query row) against the previous one's
    prefixes = [np.asarray(r["input_ids"][: min(r["query_rows"])]) for r in records]
    shared = [0] + [common_prefix_length(a, b) for a, b in zip(prefixes, prefixes[1:])]
    counter = reuse.prefix_reuse
    assert counter.prompts == len(records)
    assert counter.tokens_reused == sum(shared)
    assert counter.tokens_reused + counter.tokens_computed == sum(r["n_tokens"] for r in records)
    assert counter.fraction_reused > 0.5  # the system turn and tool catalog are shared
    print(f"\n{counter}")


def test_reuse_from_a_longer_cached_prefix_and_a_repeat(tiny_dir, records):
    """A prompt whose whole prefix lies inside a cached one, and the same prompt again."""
    plain = ProbeSession(tiny_dir, prefix_cache=0)
    reuse = ProbeSession(tiny_dir, prefix_cache=2)
    long = records[-1]
    p = min(long["query_rows"])
    short_ids = long["input_ids"][: p - 40]
    rows = [len(short_ids) - 3, len(short_ids) - 1]
    spans = {"boundary": span_positions(long["spans"]["boundary"])[:5]}
    knockout = [Knockout("early", range(10, 30))]
    score(reuse, long)
    for _ in range(2):
        before = reuse.prefix_reuse.tokens_reused
        a = reuse.run(short_ids, rows, spans, knockout, {"c": (rows[-1], [11, 12, 13])}, record_rows=True, record_residual=True)
        assert reuse.prefix_reuse.tokens_reused - before == rows[0]  # the whole prefix came from the cache
        b = plain.run(short_ids, rows, spans, knockout, {"c": (rows[-1], [11, 12, 13])}, record_rows=True, record_residual=True)
        assert_same(a, b, "short")
    assert_same(score(reuse, long), score(plain, long), "repeat")


def test_cache_is_bounded_lru_and_clearable():
    kv = lambda n: {0: (torch.zeros(1, 2, n, 4), torch.ones(1, 2, n, 4))}  # noqa: E731
    cache = PrefixKVCache(2)
    cache.store([1, 2, 3, 4], kv(4))
    cache.store([1, 2, 9], kv(3))
    m, got = cache.longest([1, 2, 3, 7, 7])
    assert m == 3 and got[0][0].shape == (1, 2, 3, 4)
    cache.store([5, 6], kv(2))  # evicts the least recently used entry, [1, 2, 9]
    assert len(cache) == 2 and cache.longest([1, 2, 9])[0] == 2
    assert cache.longest([8])[0] == 0
    cache.clear()
    assert len(cache) == 0 and cache.longest([1, 2, 3])[0] == 0
    off = PrefixKVCache(0)
    off.store([1, 2], kv(2))
    assert len(off) == 0
    with pytest.raises(ValueError, match="prefix cache size"):
        PrefixKVCache(-1)
