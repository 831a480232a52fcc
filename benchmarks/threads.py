"""Torch's thread count against the load of the machine: the measurements behind ``threads="auto"``
(:mod:`probes.engine.threads`).

    PYTHONPATH=. python benchmarks/threads.py forward [--busy 0 2] [--threads 1 2] [--repeats 5]
    PYTHONPATH=. python benchmarks/threads.py sweep   [--busy 0 2] [--threads 1 2] [--repeats 1]
    PYTHONPATH=. python benchmarks/threads.py quick   [--busy 0 2] [--threads auto] [--repeats 1]

``forward``: one plain forward pass (no grad, 256 tokens) of random-weight Qwen3 models from the organism's
size up, per thread count, the median over ``--repeats``, with ``--busy`` N processes spinning beside it
(``python -c "while True: pass"``, killed after). ``sweep``: the wall time of the main command,
``basm-probes sweep --threads N`` from a fresh folder, with N busy processes beside it; ``quick`` the same for
``basm-probes report --quick`` (issue #45's two targets: under 60 s and under 4 min with two busy processes). Each
line also gives the load average before the measurement (on a shared machine other jobs are part of the load) and
the command's CPU seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

# (hidden, layers, MLP, vocabulary): the organism's shape, then larger ones
SHAPES = [(128, 3, 384, 3072), (256, 4, 768, 8192), (512, 8, 1536, 16384), (768, 12, 2048, 32000)]
TOKENS = 256


@contextlib.contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` processes spinning on a core each, for the body's duration."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    time.sleep(0.5 if n else 0)
    try:
        yield
    finally:
        for process in spinners:
            process.kill()
            process.wait()


def load() -> float:
    return os.getloadavg()[0]


def forward(args: argparse.Namespace) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    print("| parameters | busy | load before | " + " | ".join(f"{t} thread{'s' * (t != 1)}: wall ms (CPU ms)" for t in args.threads)
          + " |\n|---|---|---|" + "---|" * len(args.threads))
    for hidden, layers, mlp, vocab in SHAPES:
        torch.manual_seed(0)
        config = Qwen3Config(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=mlp, vocab_size=vocab,
                             num_attention_heads=max(2, hidden // 64), num_key_value_heads=max(1, hidden // 128), head_dim=64,
                             max_position_embeddings=TOKENS, tie_word_embeddings=True)
        model = Qwen3ForCausalLM(config).eval()
        parameters = sum(p.numel() for p in model.parameters())
        ids = torch.randint(0, vocab, (1, TOKENS))
        for n_busy in args.busy:
            with busy(n_busy), torch.no_grad():
                before = load()
                times: dict[int, list[tuple[float, float]]] = {t: [] for t in args.threads}
                for repeat in range(args.repeats + 1):  # the counts alternate, so a change of load hits each alike
                    for threads in args.threads:
                        torch.set_num_threads(threads)
                        wall, cpu = time.perf_counter(), time.process_time()
                        model(ids)
                        if repeat:  # the first round warms up
                            times[threads].append((time.perf_counter() - wall, time.process_time() - cpu))
                cells = [f"{1000 * statistics.median(w for w, _ in times[t]):.0f} ({1000 * statistics.median(c for _, c in times[t]):.0f})"
                         for t in args.threads]
                print(f"| {parameters:,} | {n_busy} | {before:.1f} | " + " | ".join(cells) + " |", flush=True)


COMMANDS = {"sweep": ["sweep"], "quick": ["report", "--quick"]}  # README's main command, and every analysis at --quick


def command(args: argparse.Namespace) -> None:
    print("| busy | threads | load before | wall (s) | CPU (s) |\n|---|---|---|---|---|")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    for _ in range(args.repeats):
        for n_busy in args.busy:
            for threads in args.threads:
                with tempfile.TemporaryDirectory() as out, busy(n_busy):
                    before = load()
                    start, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
                    subprocess.run([sys.executable, "-m", "probes.cli", *COMMANDS[args.what], "--out", out, "--threads", str(threads)],
                                   env=env, check=True, capture_output=True)
                    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
                    print(f"| {n_busy} | {threads} | {before:.1f} | {wall:.1f} | {cpu:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("forward", *COMMANDS))
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="busy processes beside the measurement")
    parser.add_argument("--threads", nargs="+", default=["1", "2"], help="thread counts (sweep: also auto)")
    parser.add_argument("--repeats", type=int, default=None, help="forward: passes per median (5); sweep, quick: rounds (1)")
    args = parser.parse_args()
    if args.what == "forward":
        args.threads = [int(t) for t in args.threads]
        args.repeats = args.repeats or 5
        forward(args)
    else:
        args.repeats = args.repeats or 1
        command(args)


if __name__ == "__main__":
    main()
