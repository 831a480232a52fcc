"""Probe backends side by side: time and memory per prompt for the probe set on each backend.

    PYTHONPATH=. python benchmarks/backends.py [--model probes/organism/weights] [--records 3] [--threads 1]

The probe set of one prompt record is one ``probes.scoring.score.score_record`` call with the
knockout analysis's conditions: the baseline, the boundary B, the procedure P, a neutral random
span of |B| memory positions, and B in the first half of the layers; every margin (so every
catalog tool is scored: one multi-token candidate per tool). Records: native format,
configuration ``basm``, k = 1..3, eval items spread over the split (built with the model's own
tokenizer; the organism's with its builder).

Each backend runs in a fresh process: load (timed), one warm-up record, then each record timed;
peak memory = peak RSS during the record's call minus RSS just before it (VmHWM reset through
/proc/self/clear_refs, as benchmarks/engine.py), the largest over the records. The last column
is the largest |margin| difference from the native backend over every row (a parity check).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from probes.prompts.record import PromptRecord

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import _peak_bytes, _start_peak  # noqa: E402  (benchmarks/engine.py: the VmHWM helpers)

ROOT = Path(__file__).resolve().parents[1]
ORGANISM = ROOT / "probes" / "organism" / "weights"
BACKEND_NAMES = ("native", "nnsight", "transformerlens")


def records(model_dir: Path, n: int) -> list[PromptRecord]:
    from probes.data.dataset import load_dataset
    from probes.organism.train.examples import make_builder
    from probes.prompts.builder import BuildSettings, PromptBuilder
    from probes.prompts.tokenizers import load_tokenizer
    from probes.data.retrieval import Retriever, make_embedder

    dataset = load_dataset("basm_probe")
    tokenizer = load_tokenizer(model_dir)
    if model_dir.resolve() == ORGANISM.resolve():
        builder = make_builder(tokenizer, dataset, "lexical")
    else:
        builder = PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings())
    items = dataset.select(split="eval")
    out = []
    for i, item in enumerate(items[:: max(1, len(items) // (n + 1))]):
        record = builder.build(item, "basm", 1 + i % 3, "native")
        if record.spans.get("boundary"):
            out.append(record)
        if len(out) == n + 1:  # one more: the warm-up
            break
    return out


def probe_set(record: PromptRecord, n_layers: int) -> list[Any]:
    from probes.scoring.score import record_rng
    from probes.engine.session import Knockout
    from probes.scoring.controls import block_lengths, control_pool, draw_span, record_tool_names

    blocks = record.spans["boundary"]
    pool = control_pool(record, "memory+procedure", record_tool_names(record))  # |B| positions: the cost of a full-size control
    random, _ = draw_span(pool, block_lengths(blocks), record_rng(0, record.record_id, "random_0"))
    return [
        Knockout.from_spans("boundary", blocks),
        Knockout.from_spans("procedure", record.spans["procedure"]),
        Knockout("random", tuple(random)),
        Knockout.from_spans("boundary_early", blocks, layers=range(n_layers // 2)),
    ]


def worker(backend_name: str, model_dir: Path, n_records: int) -> dict[str, Any]:
    from probes.scoring.score import score_record
    from probes.backends import get_backend

    recs = records(model_dir, n_records)
    t0 = time.perf_counter()
    backend = get_backend(backend_name, model_dir)
    load_s = time.perf_counter() - t0
    score_record(backend, recs[0], probe_set(recs[0], backend.n_layers))  # warm-up
    times, peaks, margins = [], [], []
    for record in recs[1:]:
        conds = probe_set(record, backend.n_layers)
        base = _start_peak()
        t0 = time.perf_counter()
        rows = score_record(backend, record, conds)
        times.append(time.perf_counter() - t0)
        peaks.append(_peak_bytes() - base)
        margins.append([r["margin"] for r in rows])
    return {"load_s": load_s, "times": times, "peak_bytes": max(peaks), "margins": margins,
            "n_tokens": [len(r.input_ids) for r in recs[1:]], "n_candidates": [len(r.candidates) for r in recs[1:]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ORGANISM)
    ap.add_argument("--records", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--worker", metavar="BACKEND")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.records)))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    res = {}
    for name in BACKEND_NAMES:
        cmd = [sys.executable, __file__, "--worker", name, "--model", str(args.model), "--records", str(args.records),
               "--threads", str(args.threads)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
        res[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  done {name}", flush=True)
    first = res["native"]
    print(f"\nmodel {args.model}; {len(first['times'])} records of {min(first['n_tokens'])}..{max(first['n_tokens'])} tokens, "
          f"{max(first['n_candidates'])} candidates; probe set: baseline + 4 knockouts, every margin; "
          f"CPU fp32, {args.threads} thread(s)\n")
    print(f"{'backend':>16} {'load s':>7} {'s/prompt':>9} {'x native':>9} {'peak MiB':>9} {'max |Δmargin| vs native':>24}")
    native_t = sum(first["times"]) / len(first["times"])
    for name, r in res.items():
        t = sum(r["times"]) / len(r["times"])
        dm = max(abs(a - b) for ra, rb in zip(r["margins"], first["margins"]) for a, b in zip(ra, rb))
        print(f"{name:>16} {r['load_s']:7.2f} {t:9.2f} {t / native_t:9.1f} {r['peak_bytes'] / 2**20:9.1f} {dm:24.1e}")


if __name__ == "__main__":
    main()
