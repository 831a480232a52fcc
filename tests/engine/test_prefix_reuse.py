"""Shared-prefix key/value reuse across prompts (probes.engine.prefix_cache, EngineSession.run).

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

import pytest
import torch

from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from probes.engine.session import Knockout, EngineSession, span_positions
from probes.engine.prefix_cache import PrefixKVCache, Segment, TokenBreaks, join, prefix_blocks
from probes.prompts.builder import BuildSettings, PromptBuilder
from probes.prompts.record import PromptRecord
from probes.scoring.margins import candidates_from_record
from probes.scoring.score import scored_tokens
from probes.data.retrieval import Retriever, make_embedder

TOL = 1e-5


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, organism_tokenizer) -> Path:
    tokenizer = organism_tokenizer
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
def records(tiny_dir: Path, v1_dataset):
    dataset = v1_dataset
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    builder = PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings(), tokenizer_name="qwen3")
    item = dataset.select(buckets=["T_wrong"], split="eval")[0]
    out = [builder.build(item, "base", 0)]
    out += [builder.build(item, config, k) for k in (1, 2, 3) for config in ("proc", "app", "basm", "basm-anon")]
    return out


def score(session: EngineSession, record: PromptRecord):
    spans = {name: span_positions(record.spans.get(name, [])) for name in ("boundary", "procedure", "memory")}
    conditions = [
        Knockout.from_spans("boundary", record.spans.get("boundary", [])),
        Knockout.from_spans("memory_l1", record.spans.get("memory", []), layers=(1,), continuation=False),
        Knockout.from_spans("boundary_heads", record.spans.get("boundary", []), heads=((0, 1), (1, 3))),  # as heads' causal check
    ]
    conditions = [c for c in conditions if c.key_positions]
    # every catalog tool, as score_record asks for them (name prefixes shared in the engine's trie)
    candidates = scored_tokens(candidates_from_record(record), "prompted")  # prompted: the abstention answer too
    assert any(c.role == "other" for c in record.candidates)
    return session.run(record.input_ids, record.query_rows, spans, conditions, candidates, record_rows=True, record_residual=True)


def assert_same(a, b, where: str) -> float:
    """Every output of ``a`` equals ``b``'s to TOL; returns the largest absolute difference."""
    assert a.input_ids == b.input_ids and a.query_rows == b.query_rows
    assert [c.condition for c in a.conditions] == [c.condition for c in b.conditions]
    largest = 0.0
    for x, y in zip(a.conditions, b.conditions):
        tag = f"{where} {x.condition.name}"
        assert x.row_offset == y.row_offset
        assert x.span_mass.keys() == y.span_mass.keys() and x.candidate_token_logprobs.keys() == y.candidate_token_logprobs.keys()
        pairs = [("logits", x.logits, y.logits), ("rows", x.rows, y.rows), ("residual", x.residual, y.residual),
                 ("entropy", torch.tensor(x.entropy), torch.tensor(y.entropy))]
        pairs += [(f"span_mass {s}", x.span_mass[s], y.span_mass[s]) for s in x.span_mass]
        for name in x.candidate_token_logprobs:
            pairs.append((f"logprobs {name}", x.candidate_token_logprobs[name], y.candidate_token_logprobs[name]))
            pairs += [(f"span_mass {name} {s}", x.candidate_span_mass[name][s], y.candidate_span_mass[name][s]) for s in x.candidate_span_mass[name]]
        for what, u, v in pairs:
            assert u.shape == v.shape, (tag, what)
            difference = float((u - v).abs().max()) if u.numel() else 0.0
            assert difference <= TOL, (tag, what, difference)
            largest = max(largest, difference)
    return largest


def test_sweep_sequence_with_reuse_equals_without(tiny_dir, records):
    plain = EngineSession(tiny_dir, prefix_cache=0)
    reuse = EngineSession(tiny_dir, prefix_cache=len(records))  # every earlier prompt stays cached
    largest = max(assert_same(score(reuse, record), score(plain, record), record.record_id) for record in records)
    assert plain.prefix_reuse.tokens_reused == 0
    # independent count: each prompt's prefix (up to its first query row) against every earlier one's,
    # in whole blocks of both (probes.engine.prefix_cache), the whole prefix when an earlier one is the same
    prefixes = [record.input_ids[: min(record.query_rows)] for record in records]
    breaks = TokenBreaks(AutoTokenizer.from_pretrained(tiny_dir))

    def reused(earlier: list[int], prefix: list[int]) -> int:
        common = next((i for i, (x, y) in enumerate(zip(earlier, prefix)) if x != y), min(len(earlier), len(prefix)))
        theirs, end = set(prefix_blocks(breaks.kinds(earlier))), 0
        for a, b in prefix_blocks(breaks.kinds(prefix)):
            if b > common or (a, b) not in theirs:
                break
            end = b
        return end

    shared = [max((reused(earlier, prefix) for earlier in prefixes[:j]), default=0) for j, prefix in enumerate(prefixes)]
    counter = reuse.prefix_reuse
    assert counter.prompts == len(records)
    assert counter.tokens_reused == sum(shared)
    assert counter.tokens_reused + counter.tokens_computed == sum(r.n_tokens for r in records)
    assert counter.fraction_reused > 0.5  # the system turn and tool catalog are shared
    # shared prefixes are held once: about the distinct tokens, far fewer than all prefixes together
    distinct = sum(len(prefix) for prefix in prefixes) - sum(shared)
    assert reuse._prefix_cache.held_tokens() == distinct
    print(f"\n{counter}; cache holds {distinct} of {sum(len(p) for p in prefixes)} prefix tokens; largest |difference| {largest:.1e}")


def test_reuse_from_a_longer_cached_prefix_and_a_repeat(tiny_dir, records):
    """A prompt whose whole prefix lies inside a cached one (its full blocks are reused), and the same
    prompt again (all of it is)."""
    plain = EngineSession(tiny_dir, prefix_cache=0)
    reuse = EngineSession(tiny_dir, prefix_cache=2)
    long = records[-1]
    p = min(long.query_rows)
    short_ids = long.input_ids[: p - 40]
    rows = [len(short_ids) - 3, len(short_ids) - 1]
    spans = {"boundary": span_positions(long.spans["boundary"])[:5]}
    knockout = [Knockout("early", range(10, 30))]
    score(reuse, long)
    long_blocks = prefix_blocks(TokenBreaks(AutoTokenizer.from_pretrained(tiny_dir)).kinds(long.input_ids[:p]))
    for expected in (max(b for _, b in long_blocks if b <= rows[0]), rows[0]):
        before = reuse.prefix_reuse.tokens_reused
        a = reuse.run(short_ids, rows, spans, knockout, {"c": (rows[-1], [11, 12, 13])}, record_rows=True, record_residual=True)
        assert reuse.prefix_reuse.tokens_reused - before == expected
        b = plain.run(short_ids, rows, spans, knockout, {"c": (rows[-1], [11, 12, 13])}, record_rows=True, record_residual=True)
        assert_same(a, b, "short")
    assert_same(score(reuse, long), score(plain, long), "repeat")


def test_cache_is_bounded_lru_and_clearable():
    def segment(start: int, n: int) -> Segment:
        return Segment(start, {0: (torch.arange(n, dtype=torch.float32).expand(1, 2, n)[..., None].repeat(1, 1, 1, 4) + start,
                                   torch.ones(1, 2, n, 4))})

    def pairs(ids: list[int]) -> list[tuple[int, int]]:  # a prefix's own blocks: 2 tokens each here
        return [(a, min(a + 2, len(ids))) for a in range(0, len(ids), 2)]

    cache = PrefixKVCache(2)
    cache.store([1, 2, 3, 4], (segment(0, 2), segment(2, 2)))
    m, got = cache.longest([1, 2, 9], pairs([1, 2, 9]))
    assert m == 2 and [s.length for s in got] == [2]
    cache.store([1, 2, 9], (*got, segment(2, 1)))  # shares positions 0..1 with the first entry
    m, got = cache.longest([1, 2, 3, 7, 7], pairs([1, 2, 3, 7, 7]))
    assert m == 2 and join(got)[0][0].shape == (1, 2, 2, 4)  # [2, 4) of the first entry is not a block of this prefix
    m, got = cache.longest([1, 2, 3, 4, 7], pairs([1, 2, 3, 4, 7]))
    assert m == 4 and torch.equal(join(got)[0][0][0, 0, :, 0], torch.tensor([0.0, 1.0, 2.0, 3.0]))  # positions 0..3
    m, got = cache.longest([1, 2, 9], pairs([1, 2, 9]))
    assert m == 3 and torch.equal(join(got)[0][0][0, 0, :, 0], torch.tensor([0.0, 1.0, 2.0]))  # the same prefix: its partial block too
    assert cache.held_tokens() == 5
    with pytest.raises(ValueError, match="cover the prefix"):
        cache.store([1, 2, 3], (segment(0, 2),))
    cache.store([5, 6], (segment(0, 2),))  # evicts the least recently used entry, [1, 2, 3, 4]
    assert len(cache) == 2 and cache.longest([1, 2, 3, 4], pairs([1, 2, 3, 4]))[0] == 2
    assert cache.longest([8], pairs([8]))[0] == 0
    cache.clear()
    assert len(cache) == 0 and cache.longest([1, 2, 3], pairs([1, 2, 3]))[0] == 0
    off = PrefixKVCache(0)
    off.store([1, 2], (segment(0, 2),))
    assert len(off) == 0
    with pytest.raises(ValueError, match="prefix cache size"):
        PrefixKVCache(-1)
