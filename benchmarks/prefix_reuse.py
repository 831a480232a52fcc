"""Shared-prefix key/value reuse across prompts: per-item time of a sweep-like job list, side by side.

    PYTHONPATH=. python benchmarks/prefix_reuse.py [--items 2] [--threads 1] [--models tiny organism]

The job list is ``sweep``'s (T_wrong eval items; per item k = 0..4 × base, proc, app, basm, in that
order; the k = 0 prompt scored once, as ``cached_scorer`` does: 13 prompts per item), scored with
``probes.scoring.score.score_record`` (baseline, ``margins=("margin",)``), once by a session without
reuse (``prefix_cache=0``) and once by a session with the default reuse, both on the same weights.
Per item the two run back to back, alternating which goes first, after a warm-up on two prompts.

Models (fp32, CPU):

- ``tiny``: a random Qwen3 (8 layers, d_model 512, 8 heads over 4 KV heads: benchmarks/engine.py's
  model) with the real Qwen3 tokenizer and chat template, so the prompts have Qwen3's lengths
  (about 1.1–1.9k tokens) and, as in real models, the prompt forward dominates the cost;
- ``organism``: the bundled model organism with its own tokenizer (shorter prompts).

Reported per model: mean seconds per item without and with reuse and their ratio; the item's cost
with reuse in single-prompt units (item time with reuse / mean time of one prompt without reuse);
the share of prompt tokens reused (the session counter) and the tokens computed per item in
units of the mean prompt length; the token positions the cache holds at the end of the last item
(shared prefixes held once); the rows of the branch batch per prompt (conditions and multi-token
candidates, padded; they run with or without reuse); the largest |margin difference| between the
two sessions.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from probes.prompts.record import PromptRecord


def tiny_qwen3(out: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from probes.prompts.tokenizers import load_tokenizer

    tokenizer = load_tokenizer("qwen3")
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=8192,
                         tie_word_embeddings=True)
    Qwen3ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def sweep_records(model_dir: Path, n_items: int, k_max: int, configs: list[str]) -> list[list[PromptRecord]]:
    """Per item, the distinct prompt records in sweep's order (identical prompts once, as ``cached_scorer`` scores them)."""
    from transformers import AutoTokenizer

    from probes.data.dataset import load_dataset
    from probes.prompts.builder import BuildSettings, PromptBuilder
    from probes.data.retrieval import Retriever, make_embedder

    dataset = load_dataset("basm_probe")
    builder = PromptBuilder(AutoTokenizer.from_pretrained(model_dir), dataset, Retriever(make_embedder("lexical")),
                            BuildSettings(k_max=k_max))
    per_item = []
    for item in dataset.select(buckets=["T_wrong"], split="eval")[:n_items]:
        records: list[PromptRecord] = []
        for k in range(k_max + 1):
            for config in configs:
                record = builder.build(item, config, k)
                if all(record.input_ids != r.input_ids for r in records):
                    records.append(record)
        per_item.append(records)
    return per_item


def branch_rows(record: PromptRecord) -> int:
    """Rows of ``run``'s branch for ``score_record``'s sweep call (baseline; correct, wrong and
    abstain candidates): the prompt's rows from the first query row on, then the candidates'
    continuation trie (probes.engine.session.ContinuationTree); the branch runs them, reuse or not."""
    from probes.engine.session import ContinuationTree
    from probes.scoring.margins import candidates_from_record
    from probes.scoring.score import scored_tokens

    asked = scored_tokens([c for c in candidates_from_record(record) if c.role != "other"], record.format)
    return len(ContinuationTree.build(record.input_ids, min(record.query_rows), asked).tokens)


def bench(name: str, model_dir: Path, n_items: int, k_max: int, configs: list[str]) -> dict:
    from transformers import AutoModelForCausalLM

    from probes.engine.prefix_cache import PrefixReuseCounter
    from probes.engine.session import EngineSession, install_attention
    from probes.scoring.score import score_record

    items = sweep_records(model_dir, n_items + 1, k_max, configs)
    items[0] = items[0][:2]  # warm-up
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=install_attention(), dtype=torch.float32)
    sessions = {"plain": EngineSession(model, prefix_cache=0), "reuse": EngineSession(model)}
    times = {"plain": [], "reuse": []}
    prompt_times: list[float] = []
    max_diff = 0.0
    for index, records in enumerate(items):
        order = ("plain", "reuse") if index % 2 else ("reuse", "plain")
        margins = {}
        for mode in order:
            session = sessions[mode]
            session.clear_prefix_cache()  # each item starts cold: no reuse across items here
            start = time.perf_counter()
            rows = []
            for record in records:
                t0 = time.perf_counter()
                rows += score_record(session, record, margins=("margin",))
                if mode == "plain" and index:
                    prompt_times.append(time.perf_counter() - t0)
            if index:
                times[mode].append(time.perf_counter() - start)
            margins[mode] = [row["margin"] for row in rows]
        diffs = [abs(a - b) for a, b in zip(margins["plain"], margins["reuse"]) if math.isfinite(a) and math.isfinite(b)]
        max_diff = max([max_diff, *diffs])
        if index == 0:  # count the measured items only
            sessions["reuse"].prefix_reuse = PrefixReuseCounter()
        else:
            print(f"  [{name}] item {index}: {len(records)} prompts, plain {times['plain'][-1]:.2f} s, reuse {times['reuse'][-1]:.2f} s", flush=True)
    measured = [r for records in items[1:] for r in records]
    n_tokens = sum(r.n_tokens for r in measured)
    counter = sessions["reuse"].prefix_reuse
    plain, reuse = sum(times["plain"]) / n_items, sum(times["reuse"]) / n_items
    mean_prompt_s = sum(prompt_times) / len(prompt_times)
    assert counter.tokens_reused + counter.tokens_computed == n_tokens, "the counter covers every measured prompt token"
    held = sessions["reuse"]._prefix_cache.held_tokens()
    return {
        "model": name, "held_tokens": held, "branch_rows": sum(map(branch_rows, measured)) / len(measured), "items": n_items, "prompts_per_item": len(measured) / n_items, "mean_prompt_tokens": n_tokens / len(measured),
        "plain_s": plain, "reuse_s": reuse, "ratio": reuse / plain, "reuse_in_prompts": reuse / mean_prompt_s,
        "fraction_reused": counter.fraction_reused,
        "computed_in_prompts": counter.tokens_computed / n_items / (n_tokens / len(measured)),
        "max_margin_diff": max_diff,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2, help="measured items per model (after one warm-up item)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k-max", type=int, default=4)
    ap.add_argument("--configs", default="base,proc,app,basm")
    ap.add_argument("--models", nargs="+", default=["tiny", "organism"], choices=("tiny", "organism"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    configs = args.configs.split(",")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            if name == "tiny":
                model_dir = tiny_qwen3(Path(tmp) / "tiny")
            else:
                from probes.organism import ORGANISM_DIR

                model_dir = ORGANISM_DIR
            results.append(bench(name, model_dir, args.items, args.k_max, configs))
    print(f"\nfp32, CPU, {args.threads} thread(s); sweep job list: k = 0..{args.k_max} × {', '.join(configs)}; {args.items} measured items per model")
    print(f"{'model':>9} {'prompts/item':>12} {'tokens/prompt':>13} {'plain s/item':>12} {'reuse s/item':>12} {'ratio':>6} "
          f"{'item, in prompts':>16} {'reused':>7} {'computed, in prompts':>20} {'held tokens':>11} {'branch rows/prompt':>18} {'max |Δm|':>9}")
    for r in results:
        print(f"{r['model']:>9} {r['prompts_per_item']:>12.1f} {r['mean_prompt_tokens']:>13.0f} {r['plain_s']:>12.2f} {r['reuse_s']:>12.2f} "
              f"{r['ratio']:>6.2f} {r['reuse_in_prompts']:>16.2f} {r['fraction_reused']:>7.1%} {r['computed_in_prompts']:>20.2f} {r['held_tokens']:>11} {r['branch_rows']:>18.0f} {r['max_margin_diff']:>9.1e}")


if __name__ == "__main__":
    main()
