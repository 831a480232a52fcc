"""The token kinds and block ends of probes.engine.prefix_cache (array lookups and a loop over break positions only)
equal the rules written per token, as they read in the module's docstrings, on real prompts and planted kinds."""

from __future__ import annotations

import numpy as np
import pytest

from probes.engine.prefix_cache import BREAK, BREAK_BLOCK, LINE_BLOCK, LINE_BREAK, MAX_BLOCK, PLAIN, TokenBreaks, prefix_blocks
from probes.prompts.builder import BuildSettings, PromptBuilder
from probes.data.retrieval import Retriever, make_embedder


def kinds_by_token(tokenizer, ids) -> list[int]:
    special, out, previous = set(tokenizer.all_special_ids), [], ""
    for token in ids:
        text = tokenizer.decode([token])
        if "\n\n" in text or (text.startswith("\n") and previous.endswith("\n")) or token in special:
            out.append(BREAK)
        elif "\n" in text:
            out.append(LINE_BREAK)
        else:
            out.append(PLAIN)
        previous = text
    return out


def blocks_by_position(kinds) -> list[tuple[int, int]]:
    out, start = [], 0
    for b in range(1, len(kinds)):
        held = b - start
        if held >= MAX_BLOCK or (kinds[b] == BREAK and held >= BREAK_BLOCK) or (kinds[b] == LINE_BREAK and held >= LINE_BLOCK):
            out.append((start, b))
            start = b
    return out + ([(start, len(kinds))] if len(kinds) else [])


def test_kinds_of_real_prompts_equal_the_per_token_rule(organism_tokenizer, v1_dataset) -> None:
    builder = PromptBuilder(organism_tokenizer, v1_dataset, Retriever(make_embedder("lexical")), BuildSettings(), tokenizer_name="qwen3")
    breaks = TokenBreaks(organism_tokenizer)
    items = v1_dataset.select(buckets=["T_wrong", "T_ok"], split="eval")[:3]
    for record in (builder.build(item, config, k) for item in items for config, k in (("base", 0), ("basm", 2))):
        ids = list(record.input_ids)
        assert breaks.kinds(ids).tolist() == kinds_by_token(organism_tokenizer, ids)
    assert breaks.kinds([]).tolist() == []


@pytest.mark.parametrize("seed", range(40))
def test_block_ends_equal_the_per_position_rule(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3 * MAX_BLOCK))
    p_break, p_line = rng.choice([0.0, 0.002, 0.02, 0.2]), rng.choice([0.0, 0.001, 0.01])
    kinds = np.where(rng.random(n) < p_break, BREAK, np.where(rng.random(n) < p_line, LINE_BREAK, PLAIN)).astype(np.int8)
    assert prefix_blocks(kinds) == blocks_by_position(kinds)


@pytest.mark.parametrize("at", [MAX_BLOCK - 1, MAX_BLOCK, MAX_BLOCK + 1, 2 * MAX_BLOCK + 1, BREAK_BLOCK, BREAK_BLOCK - 1])
@pytest.mark.parametrize("kind", [BREAK, LINE_BREAK])
def test_block_ends_around_a_single_break(at: int, kind: int) -> None:
    kinds = np.full(3 * MAX_BLOCK + 7, PLAIN, dtype=np.int8)
    kinds[at] = kind
    assert prefix_blocks(kinds) == blocks_by_position(kinds)
