"""The catalogue of bad inputs: every one is run through the ``basm-probes`` CLI, and its exit code
and message are written to ``docs/error_catalogue.md``.

    python docs/error_catalogue.py          # rewrite docs/error_catalogue.md

``tests/test_reliability.py`` runs the same cases, checks each code and message, and checks that
the committed table lists every case with its exit code (the messages hold hashes and versions
that vary between machines). Paths are shown relative to the case's
temporary folder (``<tmp>``) and the repository (``<repo>``).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from probes.cli.main import main  # noqa: E402
from probes.data.dataset import V1_DATASET_DIR  # noqa: E402
from probes.organism import ORGANISM_DIR  # noqa: E402

TABLE = Path(__file__).with_suffix(".md")
FAST = ["--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical", "--split", "all", "--limit", "1", "--k-max", "1", "--bucket", "T_wrong", "--configs", "base", "--no-figure"]
NO_MODEL = "<tmp>/no-model"  # options and datasets are checked before the model is looked at


@dataclass(frozen=True)
class Case:
    """One bad input: ``argv`` (``<tmp>`` replaced by the case's folder) after ``setup(tmp)``."""

    name: str
    argv: list[str]
    code: int
    expect: str  # a fragment the message must hold
    setup: Callable[[Path], None] = lambda tmp: None


def _sweep(*extra: str, model: str = NO_MODEL) -> list[str]:
    return ["sweep", "--model", model, "--out", "<tmp>/out", *FAST, *extra]


def _toml(text: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / "run.toml").write_text(text)


def _dataset(edit: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    """A copy of the bundled dataset whose items.jsonl lines are ``edit``-ed."""
    def setup(tmp: Path) -> None:
        shutil.copytree(V1_DATASET_DIR, tmp / "data")
        items = tmp / "data" / "items.jsonl"
        items.write_text("".join(line + "\n" for line in edit(items.read_text().splitlines())))
    return setup


def _domain(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    """A copy of the bundled dataset whose retail domain file is ``edit``-ed."""
    def setup(tmp: Path) -> None:
        shutil.copytree(V1_DATASET_DIR, tmp / "data")
        path = tmp / "data" / "domains" / "retail.json"
        raw = json.loads(path.read_text())
        edit(raw)
        path.write_text(json.dumps(raw))
    return setup


def _first_item(**change: object) -> Callable[[list[str]], list[str]]:
    def edit(lines: list[str]) -> list[str]:
        raw = json.loads(lines[0])
        raw.update(change)
        return [json.dumps(raw), *lines[1:]]
    return edit


def _model(tmp: Path) -> None:
    shutil.copytree(ORGANISM_DIR, tmp / "model")


def _truncated_model(tmp: Path) -> None:
    _model(tmp)
    weights = tmp / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _results(edit: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    """The organism and a finished results file of the case's sweep, its lines ``edit``-ed."""
    def setup(tmp: Path) -> None:
        _model(tmp)
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            assert main(_resolve(_sweep(model="<tmp>/model"), tmp)) == 0
        path = tmp / "out" / "model" / "sweep.jsonl"  # results live under OUT/<model folder name>/
        path.write_text("".join(line + "\n" for line in edit(path.read_text().splitlines())))
    return setup


def _other_weights(lines: list[str]) -> list[str]:
    header = json.loads(lines[0])
    header["_meta"]["config"]["fingerprint"]["weights"] = "0" * 16
    return [json.dumps(header), *lines[1:]]


def _conflicting_shard(tmp: Path) -> None:
    """A finished results file and a killed parallel run's shard file holding one of its keys with another value."""
    _results(lambda lines: lines)(tmp)
    path = tmp / "out" / "model" / "sweep.jsonl"
    header, first = path.read_text().splitlines()[:2]
    row = json.loads(first)
    row["margin"] = 123.0
    path.with_name("sweep.rank1-of-2.jsonl").write_text(f"{header}\n{json.dumps(row)}\n")


DATA = ["--dataset", "<tmp>/data"]
CASES: list[Case] = [
    # options, checked before any model is loaded
    Case("negative depth", _sweep("--k-max", "-1"), 2, "option 'k_max' (--k-max) must be ≥ 0, got -1"),
    Case("depth above the library", _sweep("--k-max", "99"), 2, "(--k-max) 99: item retail-wrong-0001 has only 9 skills to retrieve; use 9 or less"),
    Case("build: depth above the library", ["build", "--out", "<tmp>/r.jsonl", "--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical", "--k-max", "99"], 2, "(--k-max) 99: item retail-ok-0001 has only 9 skills to retrieve; use 9 or less"),
    Case("show: depth above the library", ["show", "retail-ok-0001", "--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical", "--k", "99"], 2, "(--k) 99: item retail-ok-0001 has only 9 skills to retrieve; use 9 or less"),
    Case("show: unknown item", ["show", "no-such-item", "--embedder", "lexical", "--relevance", "lexical"], 2, "unknown or filtered-out item id"),
    Case("--items with an unknown part", _sweep("--items", "garbage"), 2, "'garbage' is not a bucket"),
    Case("semantic gate, lexical embedder", _sweep("--relevance", "semantic"), 2, "relevance 'semantic' (the default for a model other than the bundled organism) needs a semantic embedder"),
    Case("--limit 0", _sweep("--limit", "0"), 2, "option 'limit' (--limit) must be ≥ 1, got 0"),
    Case("no item matches", _sweep("--domain", "retail", "--split", "train", "--item", "retail-ok-0001"), 2, "filtered-out item id"),
    Case("scenario split on a dataset without one", _sweep("--split", "eval", "--split-kind", "scenario"), 2, "split_kind='scenario' needs the item field 'split_scenario'"),
    Case("negative --beta", _sweep("--beta", "-5"), 2, "option 'beta' (--beta) must be ≥ 0, got -5"),
    Case("TOML: wrong type", _sweep("--options-file", "<tmp>/run.toml"), 2, "run.toml: sweep: option 'k_max' (--k-max) must be an integer, got 'two'", _toml('k_max = "two"\n')),
    Case("TOML: unknown key", _sweep("--options-file", "<tmp>/run.toml"), 2, "run.toml: unknown option 'kmax' for sweep; known: ", _toml("kmax = 2\n")),
    Case("TOML: bad choice", _sweep("--options-file", "<tmp>/run.toml"), 2, "run.toml: sweep: option 'format' (--format) must be one of native, prompted, got 'json'", _toml('format = "json"\n')),
    Case("TOML: not TOML", _sweep("--options-file", "<tmp>/run.toml"), 2, "--options-file <tmp>/run.toml: not valid TOML", _toml("k_max = = 2\n")),
    Case("TOML: missing file", _sweep("--options-file", "<tmp>/absent.toml"), 2, "--options-file <tmp>/absent.toml: cannot read it"),
    # datasets, checked with file and line before any model is loaded
    Case("dataset: user null", _sweep(*DATA), 1, "items.jsonl:1: field 'user' must be a non-empty string", _dataset(_first_item(user=None))),
    Case("dataset: history entry without tool_call", _sweep(*DATA), 1, "history[0]: an assistant message needs tool_call",
         _dataset(_first_item(history=[{"role": "assistant"}]))),
    Case("dataset: a line that is 42", _sweep(*DATA), 1, "items.jsonl:1: an item must be a JSON object, got int",
         _dataset(lambda lines: ["42", *lines[1:]])),
    Case("dataset: string catalog_domains", _sweep(*DATA), 1, "field 'catalog_domains' must be a list of strings",
         _dataset(_first_item(catalog_domains="retail"))),
    Case("dataset: unknown tempting skill", _sweep(*DATA), 1, "items.jsonl:1 (item retail-ok-0001): tempting skill",
         _dataset(_first_item(tempting_skill="retail.nope"))),
    Case("dataset: empty items.jsonl", _sweep(*DATA), 1, "holds no items", _dataset(lambda lines: [])),
    Case("domain: tools not a list", _sweep(*DATA), 1, "retail.json: 'tools' of domain 'retail' must be a list",
         _domain(lambda raw: raw.update(tools="get_order_details"))),
    Case("domain: a tool that is 42", _sweep(*DATA), 1, "retail.json: tool 0 in domain 'retail' must be an object",
         _domain(lambda raw: raw["tools"].__setitem__(0, 42))),
    Case("domain: tool name null", _sweep(*DATA), 1, "retail.json: tool 0 in domain 'retail': 'name' and 'description' must be strings",
         _domain(lambda raw: raw["tools"][0].update(name=None))),
    Case("domain: skill slot null", _sweep(*DATA), 1, "goal: must be a string, got NoneType",
         _domain(lambda raw: raw["skills"][0].update(goal=None))),
    Case("dataset: not a dataset folder", _sweep("--dataset", "<tmp>"), 1, "is not a probe dataset"),
    # the model
    Case("model: missing folder", _sweep(), 1, "model directory <tmp>/no-model does not exist"),
    Case("model: CUDA device absent", _sweep("--device", "cuda:99", model="<tmp>/model"), 1, "CUDA device(s) here", _model),
    Case("model: not a device", _sweep("--device", "gpu", model="<tmp>/model"), 1, "is not a torch device", _model),
    Case("model: truncated safetensors", _sweep(model="<tmp>/model"), 1, "model.safetensors", _truncated_model),
    # results files
    Case("results: other weights", _sweep(model="<tmp>/model"), 1, "changed: config.fingerprint.weights",
         _results(_other_weights)),
    Case("results: corrupt middle line", _sweep(model="<tmp>/model"), 1, "sweep.jsonl:2: not a results row",
         _results(lambda lines: [lines[0], lines[1][:20], *lines[1:]])),
    Case("results: repeated key", _sweep(model="<tmp>/model"), 1, "already written on line 2",
         _results(lambda lines: [*lines, lines[1]])),
    Case("results: shard file of a parallel run with other values", _sweep(model="<tmp>/model"), 1, "has values different from those already in sweep.jsonl",
         _conflicting_shard),
    Case("results: not a results file", _sweep(model="<tmp>/model"), 1, "line 1 is not a results header",
         _results(lambda lines: ["hello", *lines[1:]])),
]


def _resolve(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("<tmp>", str(tmp)) for a in argv]


def run_case(case: Case) -> tuple[int, str]:
    """(exit code, stderr with paths shown as <tmp> and <repo>) of one case in a fresh folder."""
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        case.setup(tmp)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(_resolve(case.argv, tmp))
        lines = err.getvalue().splitlines()
        start = next((i for i, line in enumerate(lines) if "error: " in line), None)
        if start is None:
            return code, err.getvalue()
        # the message: its first line and any continuation, without the --debug hint and progress bars
        message = " ".join(line.strip() for line in lines[start:] if not line.startswith("(rerun with --debug"))
        return code, message.replace(str(tmp), "<tmp>").replace(str(ROOT), "<repo>")


def table(results: list[tuple[Case, int, str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def shown(argv: list[str]) -> str:  # the command without the common FAST block
        start = next((i for i in range(len(argv)) if argv[i:i + len(FAST)] == FAST), len(argv))
        return " ".join(argv[:start] + argv[start + len(FAST):])

    rows = [f"| {cell(c.name)} | `{cell(shown(c.argv))}` | {code} | {cell(message)} |" for c, code, message in results]
    return "\n".join([
        "# Error catalogue",
        "",
        "Every bad input that `tests/test_reliability.py` tries, run through the CLI: the exit code (2: a bad",
        "option, 1: any other known error, with no traceback; `--debug` shows it) and the message.",
        f"Generated by `python docs/error_catalogue.py`; every `sweep` command also carries `{' '.join(FAST)}`.",
        "",
        "| input | command | exit | message |",
        "|---|---|---|---|",
        *rows,
        "",
    ])


def generate() -> tuple[list[tuple[Case, int, str]], str]:
    results = [(case, *run_case(case)) for case in CASES]
    return results, table(results)


if __name__ == "__main__":
    TABLE.write_text(generate()[1])
    print(f"wrote {TABLE}")
