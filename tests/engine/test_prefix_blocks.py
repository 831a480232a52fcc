"""Prefix keys and values are computed in blocks that depend on the tokens only (probes.engine.prefix_cache;
a session without a tokenizer, as here, sees no line breaks: blocks of MAX_BLOCK tokens), so a row's
numbers never depend on what the prefix cache held: a prompt scored after another that shares part of
its prefix (a warm cache), scored first (a cold cache, as after a resume) and scored with the cache off
give bit-identical logits. Before the blocks, a warm prefix extension multiplied other row counts than
the cold single forward and differed in the last bits (up to ~1e-6 here). Content-defined block ends:
tests/engine/test_prefix_block_ends.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from probes.engine.prefix_cache import MAX_BLOCK, Segment, reusable
from probes.engine.session import EngineSession

VOCAB = 512


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    path = tmp_path_factory.mktemp("tiny_qwen3_512")
    Qwen3ForCausalLM(config).eval().save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def _logits(session: EngineSession, ids: list[int]) -> torch.Tensor:
    return session.run(ids, query_rows=[len(ids) - 3, len(ids) - 1]).conditions[0].logits


# (shared tokens, prompt length): the splits that differed in the last bits without blocks
@pytest.mark.parametrize(("shared", "n"), [(1100, 1301), (100, 260), (MAX_BLOCK, 1100)])
def test_warm_cold_and_uncached_prefixes_are_bit_identical(model, shared: int, n: int) -> None:
    torch.set_num_threads(1)
    tokens = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    earlier = tokens[:shared] + [1] * 50
    warm = EngineSession(model)
    _logits(warm, earlier)
    reused_before = warm.prefix_reuse.tokens_reused
    warm_logits = _logits(warm, tokens)
    # the warm run reused the shared full blocks, and nothing else
    assert warm.prefix_reuse.tokens_reused - reused_before == (min(shared, n - 3) // MAX_BLOCK) * MAX_BLOCK
    cold_logits = _logits(EngineSession(model), tokens)
    uncached_logits = _logits(EngineSession(model, prefix_cache=0), tokens)
    assert torch.equal(warm_logits, cold_logits)
    assert torch.equal(cold_logits, uncached_logits)


def test_the_same_prompt_again_reuses_its_partial_block() -> None:
    """A partial last block is a block of an identical prefix only; other blocks of any prefix that has them too."""
    def segment(start: int, length: int) -> Segment:
        return Segment(start, {0: (torch.zeros(1, 1, length, 1), torch.zeros(1, 1, length, 1))})

    cached = (segment(0, 100), segment(100, 40))  # a prefix of 140 tokens in blocks [0, 100), [100, 140)
    assert reusable(cached, shared=140, own=[(0, 100), (100, 140)]) == cached
    assert reusable(cached, shared=140, own=[(0, 100), (100, 190)]) == cached[:1]  # a longer prefix: its own block differs
    assert reusable(cached, shared=99, own=[(0, 100), (100, 140)]) == ()
    assert reusable(cached, shared=140, own=[(0, 60), (60, 140)]) == ()  # other block ends: nothing
