"""The shared runner of every probe analysis (``sweep``, ``ratios``, ``suppression``, ``knockout``,
``heads``, ``linear``, ``calls``, ``paired``).

An analysis is a list of :class:`Job` s, one per prompt record (item × memory config × k), and a
scorer that turns the record into tidy rows, one per condition. :func:`run_jobs` builds each
record lazily with the tokenizer of the model under study, scores it, and appends its rows to a
resumable :class:`~probes.reporting.results.ResultsStore` (key ``"{record_id}|{condition}"``), under one
tqdm bar whose total is every job of the run, so the ETA covers the whole run. A rerun skips the
keys already written and never writes one twice.

:func:`score_record` is the one record scorer: one cached-branching engine call per record
evaluates the baseline and every knockout at once, and returns per condition every quantity of
:mod:`probes.scoring.margins`:

- ``margin``: the headline, by default Eq. 1 on the tool choice (``margin_tool_choice``: wrong
  tools vs the correct tool, each pair at the row where their names diverge); also written:
  ``margin_first_token`` (Eq. 1 strictly at the decision row, NaN under first-token collisions),
  ``margin_path`` (whole-path log-probabilities, abstention included) and ``call_logodds`` (the
  abstention decision, a separate quantity). Items whose correct action is abstention
  (``correct_is_abstain``) have no tool-choice margin: NaN, reported through ``call_logodds``;
- ``broad_margin``: every non-correct catalog tool vs the correct tool (tool-vs-control);
- ``correct_margin``: the correct tool vs the other non-wrong tools (independent of the wrong tool);
- ``alpha_boundary`` / ``alpha_procedure``: Eq. 2's length-normalised span attention at the
  *deciding row* (the row predicting the first token where the correct name parts from a wrong
  one: the decision row, or a row of their shared name prefix), averaged over layers and heads;
  ``alpha_*_open`` at the row that opens the call (native); per ``[layer][head]`` on request.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import sys
import tomllib
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from probes.scoring import margins as margins_mod
from probes.cli.main import add_dataset_arguments, check_options, select_items
from probes.data.configs import CONFIGS
from probes.data.dataset import BUCKETS, Item, ProbeDataset, load_dataset
from probes.engine.session import Knockout, ProbeSession, span_positions
from probes.engine.loading import model_fingerprint
from probes.prompts.builder import FORMATS, BuildSettings, PromptBuilder
from probes.reporting.results import ResultsStore
from probes.data.retrieval import RetrievalWeights, Retriever, make_embedder
from probes.scoring.stats import bootstrap_mean

MARGIN_VARIANTS: tuple[str, ...] = ("tool_choice", "first_token", "path")
DEFAULT_VARIANT = "tool_choice"
EPSILON = 1e-6  # ε of Eq. 2's ratio (stated in every output that uses it)
# --quick: a small item subset so that `report --quick` finishes in minutes on 2 CPU cores. The
# limit is spread over task groups (ProbeDataset.select): 4 items per bucket = 4 task groups, the
# fewest that give a bootstrap CI and two task groups per half of a split-half test.
QUICK = {"limit": 4, "k_max": 2, "random_draws": 2}


class AnalysisError(RuntimeError):
    """A run cannot start as configured; the message says what to do."""


# ---------------------------------------------------------------------------- options
def default_model() -> Path:
    """The bundled model organism; a clear error until it has been trained and committed."""
    from probes.organism import ORGANISM_DIR

    if not (ORGANISM_DIR / "config.json").is_file():
        raise AnalysisError(
            f"the bundled model organism is not in {ORGANISM_DIR} yet; pass --model PATH "
            "(a local HF folder, a name in the local HF cache, or a .gguf file)"
        )
    return ORGANISM_DIR


def parse_items(spec: str) -> dict[str, Any]:
    """``--items`` compact filter: colon-separated bucket names, domain names and one count,
    e.g. ``T_wrong:retail:10`` (any order; each part optional)."""
    out: dict[str, Any] = {"buckets": [], "domains": [], "limit": None}
    for part in filter(None, spec.split(":")):
        if part in BUCKETS:
            out["buckets"].append(part)
        elif part.isdigit():
            out["limit"] = int(part)
        else:
            out["domains"].append(part)
    return out


def add_common_arguments(parser: argparse.ArgumentParser, *, k_max: int = 2, buckets: Sequence[str] | None = None) -> None:
    """Options shared by every analysis. ``k_max``/``buckets``: this analysis's defaults."""
    group = parser.add_argument_group("model")
    group.add_argument("--model", help="local HF folder, local-cache name or .gguf (default: the bundled organism)")
    group.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | auto (default: float32)")
    group.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    group.add_argument("--device-map", default=None, help='accelerate device map for multi-GPU models, e.g. "auto"')
    group.add_argument("--allow-pickle", action="store_true", help="allow .bin (pickle) weights; safetensors only by default")
    group.add_argument("--trust-remote-code", action="store_true", help="allow model code shipped in the model folder")
    group = parser.add_argument_group("probe")
    group.add_argument("--format", default="native", choices=FORMATS, help="decision format (default: native)")
    group.add_argument(
        "--margin-variant", default=DEFAULT_VARIANT, choices=MARGIN_VARIANTS,
        help="the headline margin: tool_choice (default; Eq. 1 on the tool choice, each wrong/correct pair "
        "compared where their names diverge), first_token (Eq. 1 at the decision row, NaN where names share "
        "a first token) or path (whole-path log-probabilities, abstention included); all are written to the rows",
    )
    group.add_argument("--k-max", type=int, default=k_max, help=f"largest retrieval depth K (default: {k_max})")
    group.add_argument("--embedder", choices=("auto", "minilm", "lexical"), default="auto", help="retrieval embedder")
    group.add_argument("--gamma", type=float, default=BuildSettings.gamma, help="boundary relevance gate γ (Eq. 10)")
    group.add_argument("--beta", type=int, default=BuildSettings.beta, help="boundary token budget β (Eq. 10)")
    group.add_argument("--seed", type=int, default=0, help="seed of every random draw (default: 0)")
    add_dataset_arguments(parser)
    parser.set_defaults(_default_buckets=tuple(buckets) if buckets else None)
    parser.add_argument("--items", help="compact item filter BUCKET:DOMAIN:COUNT, e.g. T_wrong:retail:10")
    group = parser.add_argument_group("run")
    group.add_argument("--out", type=Path, default=Path("results"), help="results folder (default: results/)")
    group.add_argument("--config", type=Path, dest="config_file", help="TOML file of options; explicit flags override it")
    group.add_argument("--overwrite", action="store_true", help="discard existing results instead of resuming")
    group.add_argument("--quick", action="store_true",
                       help=f"small run: {QUICK['limit']} items (task groups) per bucket, k ≤ {QUICK['k_max']}")
    group.add_argument("--no-figure", dest="figure", action="store_false", help="write rows only")
    parser.set_defaults(_parser=parser)


def _toml_value(action: argparse.Action, key: str, value: Any, where: Path) -> Any:
    """A TOML value checked and parsed as its flag would be; a type error names the file and key."""
    def bad(expected: str) -> AnalysisError:
        return AnalysisError(f"{where}: option {key!r} must be {expected}, got {value!r} ({type(value).__name__})")

    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    values = value if isinstance(action, argparse._AppendAction) and isinstance(value, list) else [value]
    parsed = []
    for v in values:
        if action.type in (int, float):
            if isinstance(v, bool) or not isinstance(v, int | float) or (action.type is int and not isinstance(v, int)):
                raise bad("an integer" if action.type is int else "a number")
        elif not isinstance(v, str):
            raise bad("a string" + (" or a list of strings" if isinstance(action, argparse._AppendAction) else ""))
        elif callable(action.type):
            try:
                v = action.type(v)  # same parsing as the flag
            except (argparse.ArgumentTypeError, ValueError) as error:
                raise AnalysisError(f"{where}: option {key!r}: {error}") from error
        if action.choices is not None and v not in action.choices:
            raise AnalysisError(f"{where}: option {key!r} must be one of {', '.join(map(str, action.choices))}, got {v!r}")
        parsed.append(v)
    return parsed if isinstance(action, argparse._AppendAction) else parsed[0]


def resolve_options(args: argparse.Namespace) -> argparse.Namespace:
    """Apply the TOML file (for options not given as flags), ``--items`` and ``--quick``.

    Flags given on the command line win (``args._explicit``, recorded by :func:`probes.cli.main.main`;
    without it, a value other than the default counts as given). The TOML file is applied once
    per namespace: ``report`` resolves its own options, then forwards them (and ``config_file``,
    for the record) to each analysis, whose own resolution must not re-apply the file.
    """
    parser: argparse.ArgumentParser = args._parser
    if args.config_file is not None and not getattr(args, "_config_applied", False):
        args._config_applied = True
        try:
            with Path(args.config_file).open("rb") as handle:
                table = tomllib.load(handle)
        except OSError as error:
            raise AnalysisError(f"--config {args.config_file}: cannot read it ({error.strerror})") from error
        except tomllib.TOMLDecodeError as error:
            raise AnalysisError(f"--config {args.config_file}: not valid TOML: {error}") from error
        # keys are flag names without dashes (`k-max`, `item`) or their destinations (`k_max`, `item_ids`)
        actions = {action.dest: action for action in parser._actions if action.option_strings}
        actions |= {o.lstrip("-").replace("-", "_"): a for a in parser._actions for o in a.option_strings}
        explicit = getattr(args, "_explicit", None)
        for key, value in table.items():
            action = actions.get(key.replace("-", "_"))
            if action is None or action.dest in ("help", "config_file"):
                raise AnalysisError(f"{args.config_file}: unknown option {key!r}")
            value = _toml_value(action, key, value, args.config_file)
            given = action.dest in explicit if explicit is not None else getattr(args, action.dest) != parser.get_default(action.dest)
            if not given:
                setattr(args, action.dest, value)
    if args.items:
        spec = parse_items(args.items)
        args.bucket = spec["buckets"] or args.bucket
        args.domain = spec["domains"] or args.domain
        args.limit = spec["limit"] if spec["limit"] is not None else args.limit
    if args.bucket is None and args._default_buckets:
        args.bucket = list(args._default_buckets)
    if args.quick:
        args.limit = QUICK["limit"] if args.limit is None else args.limit
        args.k_max = QUICK["k_max"] if args.k_max is None else min(args.k_max, QUICK["k_max"])
        if hasattr(args, "random_draws"):
            args.random_draws = min(args.random_draws, QUICK["random_draws"])
    return args


# ---------------------------------------------------------------------------- the run context
@dataclass
class Analysis:
    """Everything an analysis run needs, opened once by :func:`open_analysis`."""

    name: str
    args: argparse.Namespace
    session: ProbeSession
    dataset: ProbeDataset
    items: tuple[Item, ...]
    builder: PromptBuilder
    model_path: str
    out_dir: Path
    model_fingerprint: dict[str, str]
    _score_cache: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def variant(self) -> str:
        return self.args.margin_variant

    @property
    def fmt(self) -> str:
        return self.args.format

    def config(self, **extra: Any) -> dict[str, Any]:
        """The full configuration recorded in the results header (resuming requires equality).

        ``fingerprint`` covers everything a row depends on beyond the options: the weights and
        the tokenizer (content hashes), the items and skill libraries (content), and the code.
        """
        a = self.args
        return {
            "model": self.model_path,
            "fingerprint": {**self.model_fingerprint, "dataset": self.dataset.content_digest(self.items), "code": code_digest()},
            "dtype": a.dtype, "device": a.device, "format": a.format, "margin_variant": a.margin_variant,
            "epsilon": EPSILON, "k_max": a.k_max, "seed": a.seed,
            "builder": {"embedder": self.builder.retriever.embedder.name, "gamma": a.gamma, "beta": a.beta},
            "dataset": str(a.dataset),
            "items": {"n": len(self.items), "digest": hashlib.sha256(",".join(i.id for i in self.items).encode()).hexdigest()[:16],
                      "bucket": a.bucket, "domain": a.domain, "split": a.split, "limit": a.limit},
            **extra,
        }

    def store(self, **extra: Any) -> ResultsStore:
        return ResultsStore(self.out_dir / f"{self.name}.jsonl", self.name, self.config(**extra), overwrite=self.args.overwrite)

    def items_in(self, buckets: Iterable[str]) -> list[Item]:
        buckets = set(buckets)
        return [item for item in self.items if item.bucket in buckets]


# The modules that draw, plot or report results only; every other module shapes the rows.
_PRESENTATION_MODULES = ("cli.py", "plots.py", "report.py")


@functools.cache
def code_digest() -> str:
    """Hash of the source of every module that computes rows (a code change invalidates resume)."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.name not in _PRESENTATION_MODULES:
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


# Shared by the analyses of one process (``report``): loaded and embedded once.
# Shared by the analyses of one process (``report``): loaded and embedded once.
def _dataset(root: str) -> ProbeDataset:
    # keyed by the files' size and mtime too: an edited dataset is loaded afresh, never served stale
    files = sorted(Path(root).rglob("*.json*"))
    return _load_dataset(root, tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))


@functools.cache
def _load_dataset(root: str, signature: tuple[tuple[str, int, int], ...]) -> ProbeDataset:
    return load_dataset(root)


@functools.cache
def _retriever(embedder: str) -> Retriever:
    return Retriever(make_embedder(embedder), RetrievalWeights())


# Options that configure the model session (every one reaches ProbeSession; see open_session).
SESSION_OPTIONS: tuple[str, ...] = ("model", "dtype", "device", "device_map", "allow_pickle", "trust_remote_code")


def open_session(args: argparse.Namespace, model: str | Path) -> ProbeSession:
    """Load ``model`` with every session option of ``args`` (the one place analyses and ``report``
    build their :class:`ProbeSession`)."""
    return ProbeSession(
        model, dtype=args.dtype, device=args.device, device_map=args.device_map,
        allow_pickle=args.allow_pickle, trust_remote_code=args.trust_remote_code,
    )


def open_analysis(args: argparse.Namespace, name: str, *, session: ProbeSession | None = None) -> Analysis:
    """Resolve options, load the model (unless ``session`` is given), the dataset and the builder.

    The prompt builder uses the tokenizer of the model under study, so spans and candidates are
    in the model's own token space.
    """
    args = resolve_options(args)
    torch.manual_seed(args.seed)
    model = args.model if args.model is not None else default_model()
    # options and dataset first: a bad value stops the run before the model is loaded
    dataset = _dataset(str(args.dataset))
    if args.items:
        unknown = [d for d in parse_items(args.items)["domains"] if d not in dataset.domains]
        if unknown:
            raise AnalysisError(f"--items {args.items}: {', '.join(map(repr, unknown))} is not a bucket ({', '.join(BUCKETS)}), "
                                f"a domain ({', '.join(dataset.domains)}) or a count; the form is BUCKET:DOMAIN:COUNT, e.g. T_wrong:retail:10")
    items = select_items(dataset, args)
    check_options(args, dataset, items)
    if args.format == "prompted" and Path(model).resolve() == default_model().resolve():
        print("warning: the bundled organism was trained on the native format only; --format prompted measures "
              "a format it never saw", file=sys.stderr)
    if session is None:
        session = open_session(args, model)
    if session.tokenizer is None:
        raise AnalysisError(f"{model}: no tokenizer next to the weights")
    retriever = _retriever(args.embedder)
    builder = PromptBuilder(session.tokenizer, dataset, retriever, BuildSettings(k_max=args.k_max, gamma=args.gamma, beta=args.beta),
                            tokenizer_name=str(model))
    builder.warm(items)
    model_path = str(Path(model).resolve()) if Path(str(model)).exists() else str(model)
    fingerprint = model_fingerprint(session.model.name_or_path or model, session.tokenizer)  # the folder actually loaded (GGUF: converted)
    return Analysis(name, args, session, dataset, items, builder, model_path, Path(args.out), fingerprint)


# ---------------------------------------------------------------------------- jobs
@dataclass(frozen=True)
class Job:
    """One prompt record to score, and the names of the conditions (rows) it yields."""

    item: Item
    config: str
    k: int
    fmt: str
    conditions: tuple[str, ...]

    @property
    def record_id(self) -> str:
        return f"{self.item.id}|{self.config}|k{self.k}|{self.fmt}"

    def keys(self) -> list[str]:
        return [f"{self.record_id}|{c}" for c in self.conditions]


Scorer = Callable[[dict[str, Any], Job], list[dict[str, Any]]]


def run_jobs(analysis: Analysis, store: ResultsStore, jobs: Sequence[Job], scorer: Scorer) -> int:
    """Score every job whose rows are not all in ``store`` yet; returns the number scored.

    A job whose rows are partly present (a run killed mid-write) is rescored and only the
    missing rows are appended; scoring is deterministic, so the table is the same.
    """
    done = store.done
    pending = [job for job in jobs if not all(key in done for key in job.keys())]
    with tqdm(total=len(jobs), initial=len(jobs) - len(pending), desc=analysis.name, unit="prompt",
              dynamic_ncols=True, smoothing=0.1) as bar:
        for job in pending:
            record = analysis.builder.build(job.item, job.config, job.k, job.fmt)
            rows = scorer(record, job)
            for row in rows:
                row["key"] = f"{record['record_id']}|{row['condition']}"
            missing = [row for row in rows if row["key"] not in store]
            unexpected = {row["key"] for row in rows} ^ set(job.keys())
            if unexpected:
                raise RuntimeError(f"{job.record_id}: scorer rows {sorted(unexpected)} do not match the job's conditions")
            store.append(missing)
            bar.update(1)
    return len(pending)


# ---------------------------------------------------------------------------- scoring
MARGINS: tuple[str, ...] = ("margin", "broad_margin", "correct_margin")
ROW_FIELDS = ("record_id", "item_id", "bucket", "domain", "task_group", "config", "k", "format")
ATTENTION_ROWS: tuple[str, ...] = ("deciding", "open")


def deciding_depth(cands: Sequence[margins_mod.CandidateInfo]) -> tuple[str | None, int]:
    """(key of the correct tool candidate, token depth of its deciding row): the first token at
    which the correct name parts from any wrong name (0: the decision row itself). Items whose
    correct action is abstention decide among the tools at the decision row: (None, 0)."""
    correct = [c for c in cands if c.role == "correct" and not c.is_abstention]
    wrong = [c for c in cands if c.role == "wrong"]
    if not correct or not wrong:
        return None, 0
    depth = min(margins_mod.shared_prefix(correct[0].token_ids, w.token_ids) for w in wrong)
    # names that never diverge (the margin is NaN then) are read at the correct name's last row
    return correct[0].key, min(depth, len(correct[0].token_ids) - 1)


def score_record(
    session: ProbeSession,
    record: Mapping[str, Any],
    conditions: Sequence[Knockout] = (),
    *,
    variant: str = DEFAULT_VARIANT,
    per_head: bool = False,
    margins: Sequence[str] = MARGINS,
) -> list[dict[str, Any]]:
    """One engine call (baseline + ``conditions``); one row per condition (see module docstring).

    ``margins``: with ``broad_margin`` or ``correct_margin``, every catalog tool is scored (each
    multi-token candidate is one more branch element per condition); otherwise only the correct,
    wrong and abstain candidates, and those two columns are NaN.
    """
    if variant not in MARGIN_VARIANTS:
        raise ValueError(f"margin variant must be one of {MARGIN_VARIANTS}, got {variant!r}")
    cands = margins_mod.candidates_from_record(record)
    if not {"broad_margin", "correct_margin"} & set(margins):
        cands = [c for c in cands if c.role != "other"]
    spans = {name: span_positions(record["spans"].get(name, [])) for name in ("boundary", "procedure")}
    res = session.run(record["input_ids"], record["query_rows"], spans=spans, conditions=conditions,
                      candidates={c.key: (c.anchor_index, list(c.token_ids)) for c in cands})
    fmt, dec, opn = record["format"], int(record["decision_index"]), record.get("open_index")
    correct_key, depth = deciding_depth(cands)
    rows = []
    for c in res.conditions:
        row: dict[str, Any] = {f: record.get(f) for f in ROW_FIELDS}
        cond = c.condition
        row.update(condition=cond.name, knockout_size=len(cond.key_positions), n_tokens=len(res.input_ids),
                   margin_variant=variant, entropy=c.entropy)
        if cond.layers is not None:
            row["knockout_layers"] = list(cond.layers)
        if cond.heads is not None:
            row["knockout_heads"] = [list(h) for h in cond.heads]
        if cond.key_positions:
            row["knockout_rows"] = "every query row" if cond.rows is None else list(cond.rows)
            row["knockout_continuation"] = cond.continuation
        lp = c.candidate_token_logprobs
        quantities = {
            "tool_choice": margins_mod.tool_choice_margin(cands, lp, fmt),
            "first_token": margins_mod.first_token_margin(c.row_logits, cands, fmt, dec),
            "path": margins_mod.path_margin(c.row_logits, res.input_ids, cands, fmt, dec, lp, opn),
        }
        for name, m in quantities.items():
            row[f"margin_{name}"] = m.value
        chosen = quantities[variant]
        row.update(margin=chosen.value, margin_collision=chosen.collision, margin_note=chosen.note,
                   margin_pairs=[list(p) for p in quantities["tool_choice"].pairs],
                   first_token_collision=quantities["first_token"].collision,
                   correct_is_abstain=correct_key is None,
                   call_logodds=margins_mod.call_logodds(c.row_logits, res.input_ids, cands, fmt, dec, opn).value)
        for name, fn in (("broad_margin", margins_mod.broad_margin), ("correct_margin", margins_mod.correct_margin)):
            row[name] = fn(cands, lp, fmt).value if name in margins else math.nan
        # Eq. 2 at the deciding row (a continuation row of the correct name when a prefix is shared)
        row.update(deciding_depth=depth, deciding_row=dec + depth)
        at = {"": (c.candidate_span_mass[correct_key], depth) if depth else (c.span_mass, res.query_rows.index(dec))}
        if opn is not None:
            at["_open"] = (c.span_mass, res.query_rows.index(int(opn)))
        for span in ("boundary", "procedure"):
            size = res.span_sizes[span]
            row[f"{span}_size"] = size
            for suffix, (mass, index) in at.items():
                # alpha: [layer, head] = Eq. 2's α_X at that row
                alpha = mass[span][:, :, index] / size if size else torch.full(mass[span].shape[:2], math.nan)
                row[f"alpha_{span}{suffix}"] = float(alpha.mean())
                if per_head:
                    row[f"alpha_{span}{suffix}_heads"] = alpha.tolist()
        rows.append(row)
    return rows


def cached_scorer(
    analysis: Analysis,
    conditions_for: Callable[[dict[str, Any], Job], Sequence[Knockout]],
    *,
    per_head: bool = False,
    margins: Sequence[str] = MARGINS,
) -> Scorer:
    """A scorer over :func:`score_record` that reuses results for byte-identical prompts within
    a run (e.g. k = 0, where every configuration renders the same prompt)."""

    def scorer(record: dict[str, Any], job: Job) -> list[dict[str, Any]]:
        conditions = list(conditions_for(record, job))
        digest = hashlib.sha256(json.dumps([record["input_ids"], record["candidates"], record["spans"],
                                            [repr(c) for c in conditions], per_head, list(margins)]).encode()).hexdigest()
        if digest not in analysis._score_cache:
            analysis._score_cache.clear()  # identical prompts are consecutive (same item): keep memory flat
            analysis._score_cache[digest] = score_record(analysis.session, record, conditions, variant=analysis.variant,
                                                         per_head=per_head, margins=margins)
        rows = []
        for cached in analysis._score_cache[digest]:
            row = dict(cached)
            row.update({f: record.get(f) for f in ROW_FIELDS})
            row["prompt_digest"] = digest[:16]
            rows.append(row)
        return rows

    return scorer


def record_rng(seed: int, record_id: str, salt: str = "") -> np.random.Generator:
    """A generator seeded by (seed, record, purpose): draws do not depend on run order."""
    return np.random.default_rng([seed, zlib.crc32(f"{record_id}|{salt}".encode())])


def names_arg(known: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """An argparse type for a comma-separated list of names from ``known``."""
    known = tuple(known)

    def parse(value: str) -> list[str]:
        names = [v.strip() for v in value.split(",") if v.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; known: {', '.join(known)}")
        return names

    return parse


configs_arg = names_arg(CONFIGS, "configuration(s)")  # ``--configs base,proc,...`` (names from probes.data.configs)


def provenance(analysis: Analysis, n_items: int | None = None) -> str:
    """One line naming model, dataset, format, margin variant, items and k (figure footnotes, report)."""
    a = analysis.args
    n = len(analysis.items) if n_items is None else n_items
    groups = len({item.task_group for item in analysis.items}) if n_items is None else None
    return (f"model: {Path(analysis.model_path).name} ({a.dtype}, {a.device}) · dataset: {Path(a.dataset).name} ({a.split}) · "
            f"format: {a.format} · margin: {a.margin_variant} · items: {n}{f' ({groups} task groups)' if groups is not None else ''} · "
            f"k ≤ {a.k_max} · embedder: {analysis.builder.retriever.embedder.name} · seed {a.seed}")


# ---------------------------------------------------------------------------- summaries
MIN_CI_GROUPS = 2  # a bootstrap over fewer task groups has zero width: no CI is reported


def no_ci_note(n_groups: int) -> str:
    """The note of a cell too small for a CI (``""`` when it has one)."""
    n_groups = int(n_groups)
    return "" if n_groups >= MIN_CI_GROUPS else f"no CI ({n_groups} group{'' if n_groups == 1 else 's'})"


def ci_text(value: float, low: float, high: float, n_groups: int, fmt: str = "+.3f") -> str:
    """``value [low, high]``, or ``value (no CI (1 group))`` for a cell without a CI."""
    note = no_ci_note(n_groups)
    if note or not (np.isfinite(low) and np.isfinite(high)):
        return f"{value:{fmt}} ({note or 'no CI'})"
    return f"{value:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def summarise(rows: pd.DataFrame, by: Sequence[str], value: str = "margin", *, seed: int = 0) -> pd.DataFrame:
    """Mean of ``value`` per ``by`` cell with a 95% bootstrap CI over task groups.

    Columns: *by, value, low, high, n (task groups), n_items (finite rows), n_nan (undefined
    rows, e.g. margins under first-token collisions; excluded), note. A cell with fewer than two
    task groups has no CI: low = high = NaN and note "no CI (1 group)" (never a zero-width CI).
    """
    out = []
    for key, sub in rows.groupby(list(by), sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        finite = sub[np.isfinite(sub[value].astype(float))]
        est = bootstrap_mean(finite[value].astype(float).to_numpy(), finite["task_group"].to_numpy(), seed=seed)
        out.append({**dict(zip(by, key)), "value": est.value, "low": est.low, "high": est.high, "n": est.n_units,
                    "n_items": len(finite), "n_nan": len(sub) - len(finite), "note": no_ci_note(est.n_units)})
    return pd.DataFrame(out, columns=[*by, "value", "low", "high", "n", "n_items", "n_nan", "note"])


def bootstrap_ratio(
    numerator: Sequence[float],
    denominator: Sequence[float],
    groups: Sequence[str],
    *,
    epsilon: float = 0.0,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float, int]:
    """mean(numerator) / (mean(denominator) + ε) with a percentile CI from resampling task groups
    *jointly* for numerator and denominator. Returns (value, low, high, n groups); low = high =
    NaN with fewer than two groups (no CI, see :func:`no_ci_note`)."""
    num, den, groups = np.asarray(numerator, float), np.asarray(denominator, float), np.asarray(groups)
    ok = np.isfinite(num) & np.isfinite(den)
    num, den, groups = num[ok], den[ok], groups[ok]
    labels = list(dict.fromkeys(groups.tolist()))
    if not labels:
        return math.nan, math.nan, math.nan, 0
    g_num = np.array([num[groups == g].mean() for g in labels])
    g_den = np.array([den[groups == g].mean() for g in labels])
    value = float(g_num.mean() / (g_den.mean() + epsilon))
    if len(labels) < MIN_CI_GROUPS:
        return value, math.nan, math.nan, len(labels)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(labels), size=(resamples, len(labels)))
    with np.errstate(divide="ignore", invalid="ignore"):
        stats = g_num[idx].mean(1) / (g_den[idx].mean(1) + epsilon)
    stats = stats[np.isfinite(stats)]
    low, high = np.percentile(stats, [2.5, 97.5]) if len(stats) else (math.nan, math.nan)
    return value, float(low), float(high), len(labels)


# ---------------------------------------------------------------------------- report sections
@dataclass(frozen=True)
class Comparison:
    """One line of the report's "ours vs paper" table (``paper`` None: not published)."""

    quantity: str
    ours: float
    paper: float | None
    unit: str = "logits"
    note: str = ""


@dataclass
class ReportSection:
    """What an analysis contributes to ``basm-probes report``: its figures, a markdown body, the
    comparisons with the paper, and its summary object (reused by composite figures)."""

    name: str
    title: str
    figures: list[Path]
    markdown: str
    comparisons: list[Comparison] = field(default_factory=list)
    summary: Any = None


def markdown_table(frame: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table (no extra dependency)."""

    def fmt(v: Any) -> str:
        if isinstance(v, float | np.floating):
            return "nan" if not np.isfinite(v) else f"{v:.{digits}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{digits}f}"
        return str(v)

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def cell(table: pd.DataFrame, column: str = "value", **where: Any) -> float:
    """The single value of ``column`` where every ``where`` column matches (NaN if absent)."""
    mask = np.ones(len(table), dtype=bool)
    for key, value in where.items():
        mask &= (table[key] == value).to_numpy()
    return float(table.loc[mask, column].iloc[0]) if mask.any() else math.nan
