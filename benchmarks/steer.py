"""Steering's cost per prompt in forwards of the same prompt (issue #44 item 5).

    PYTHONPATH=. python benchmarks/steer.py [--models organism real] [--counts 1 16 64 256] [--threads 1] [--json out.json]
    PYTHONPATH=. python benchmarks/steer.py --models organism tiny --counts 1 4  # the test: benchmarks/gpu.py's tiny shape

One typical BASM k = 2 prompt per model, timed by :func:`gpu.steer_run` (the function gpu.py's steer section
uses): the clean scored run (``score_record`` with every candidate action) and the ``steer`` analysis' own
scorer with C random-direction conditions at the layer at 2/3 depth, at decision rows and at call rows, each
with the prefix cache cold at its start and in sdpa forwards of the same prompt timed right before it.

Models:

- ``organism``: the bundled organism (3 layers, d_model 128), its own tokenizer and builder; the first T_wrong
  eval item with a boundary span of its dataset;
- ``real``: a random-weight Qwen3 with Qwen3-0.6B's shape (benchmarks/real_shape.py), the real Qwen3
  tokenizer; the record of real_shape.py (``retail-wrong-0001``, ``basm`` at k = 2, 1,599 tokens);
- ``tiny``: benchmarks/gpu.py's tiny Qwen3 shape with the same record (checks the script).

Prints a markdown table (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import STEER_COUNTS, steer_run, timed  # noqa: E402  (benchmarks/gpu.py: the steer timing its GPU section shares)
from real_shape import item_records, real_shape_model  # noqa: E402

MODELS = ("organism", "real", "tiny")


def organism_case() -> tuple[Any, Any, Any]:
    """(session, item, record): the organism and its first T_wrong eval item's BASM prompt at k = 2."""
    from probes.data.dataset import load_dataset
    from probes.facade import ProbeSession
    from probes.organism import organism_path

    session = ProbeSession(organism_path())
    for item in load_dataset(session.default_dataset).select(buckets=["T_wrong"], split="eval"):
        record = session.prompt(item, config="basm", k=2, embedder="lexical")
        if record.spans.get("boundary"):
            return session, item, record
    raise RuntimeError("the organism's dataset has no T_wrong eval item with a boundary span")


def qwen3_case(tiny: bool) -> tuple[Any, Any, Any]:
    """(session, item, record): a random Qwen3 of Qwen3-0.6B's shape (or gpu.py's tiny one) and real_shape.py's record."""
    from probes.engine.session import EngineSession, install_attention
    from probes.prompts.tokenizers import load_tokenizer

    tokenizer = load_tokenizer("qwen3")
    item, record, *_ = item_records(tokenizer, 2)
    model = real_shape_model(tiny=tiny)
    model.set_attn_implementation(install_attention())
    return EngineSession(model, tokenizer=tokenizer), item, record


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["organism", "real"], choices=MODELS)
    ap.add_argument("--counts", nargs="+", type=int, default=list(STEER_COUNTS), help="steering conditions per prompt")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the measured figures here")
    args = ap.parse_args(argv)
    if bad := [c for c in args.counts if c < 1]:
        ap.error(f"--counts {bad}: a count of conditions is at least 1")
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"threads": args.threads, "counts": args.counts}
    for name in args.models:
        started = time.perf_counter()
        session, item, record = organism_case() if name == "organism" else qwen3_case(tiny=name == "tiny")
        model = session.model

        @torch.inference_mode()
        def sdpa(ids: list[int]) -> None:  # outside a probe call the registered attention is sdpa itself: a plain HF forward
            model(torch.tensor([ids]), use_cache=False, logits_to_keep=1)

        sdpa(record.input_ids[:64])  # warm-up
        cfg = model.config
        print(f"{name}: {cfg.num_hidden_layers} layers, d_model {cfg.hidden_size}, vocab {cfg.vocab_size}; {record.record_id}, "
              f"{record.n_tokens} tokens, branch from row {min(record.query_rows)}; built in {time.perf_counter() - started:.0f} s", flush=True)
        report[name] = steer_run(session, item, record, sdpa, tuple(args.counts), timer=timed)
    for name in args.models:
        r = report[name]
        print(f"\n{name}: {r['record_id']} ({r['tokens']} tokens; branch from row {r['branch_from']}); layer {r['layer']}, "
              f"{r['chunk']} conditions per engine call\n")
        print("| piece | forwards per prompt (CPU) | per condition (CPU) | prefix tokens computed / reused | s |")
        print("|---|---|---|---|---|")
        print(f"| plain sdpa forward | 1 | | | {r['pieces']['clean']['unit_s']:.2f} |")
        for piece, p in r["pieces"].items():
            per = f"{p['per_condition']:.4f} ({p['cpu_per_condition']:.4f})" if "per_condition" in p else ""
            print(f"| {piece} | {p['forwards']:.2f} ({p['cpu_forwards']:.2f}) | {per} | {p['tokens_computed']} / {p['tokens_reused']} "
                  f"| {p['time_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
