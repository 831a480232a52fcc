"""Time `basm-probes build` on the full dataset (all items, all configs, k = 0..4, native format,
real Qwen3 tokenizer, MiniLM retrieval), as CI-independent evidence for the < 2 minute bar.

    python benchmarks/build.py [--workers 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from probes.cli.main import main

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--format", default="native")
args = parser.parse_args()
with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    code = main(["build", "--split", "all", "--workers", str(args.workers), "--format", args.format, "--out", str(Path(tmp) / "records.jsonl")])
    elapsed = time.perf_counter() - start
    size = (Path(tmp) / "records.jsonl").stat().st_size / 2**20
print(f"full build: {elapsed:.1f} s wall with {args.workers} worker(s), {size:.0f} MiB of records, exit code {code}")
