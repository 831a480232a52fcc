"""The run context: what one analysis run opens before it scores anything, and what it records.

:func:`open_context` resolves an analysis's options, checks them against the dataset, the items
and a given session (every bad value stops the run before a model is loaded), loads the model
(unless a session is given), and returns the :class:`RunContext`: session, dataset, selected
items, prompt builder, output folder, and the full configuration its results header records
(:meth:`RunContext.config`, with the model, data and code fingerprints).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probes.analyses.option_system import OptionError, RunOptions, header_options, parse_items
from probes.core.files import OutputRoot, check_inside
from probes.analyses.parallel import ShardedStore, World, open_store, rank_device, world
from probes.data.dataset import BUCKETS, ORGANISM_DIR, ORGANISM_NAME, Item, ProbeDataset, is_organism, load_dataset, resolve_dataset
from probes.data.retrieval import RetrievalWeights, Retriever, make_embedder
from probes.engine.loading import ModelLoadError, model_fingerprint, model_folder
from probes.engine.session import EngineSession
from probes.engine.threads import AUTO, auto_threads, set_threads
from probes.prompts.builder import PromptBuilder, resolve_study
from probes.prompts.context import SkippedItem, partition_by_context
from probes.prompts.tokenizers import ChatTemplateError, chat_template_file
from probes.reporting.layout import check_layout, figures_folder, rows_path
from probes.reporting.results import ResultsStore
from probes.scoring.score import EPSILON


class AnalysisError(RuntimeError):
    """A run cannot start as configured; the message says what to do."""



def default_model() -> Path:
    """The bundled model organism; a clear error until it has been trained and committed."""
    if not (ORGANISM_DIR / "config.json").is_file():
        raise AnalysisError(
            f"the bundled model organism is not in {ORGANISM_DIR} yet; pass model=PATH (--model PATH): "
            "a local HF folder, a name in the local HF cache, or a .gguf file"
        )
    return ORGANISM_DIR


def model_label(model: str | Path) -> str:
    """The folder name of a model's results under ``out``: the organism's name for the bundled
    organism, a folder's or file's name, or a hub-style name with ``/`` replaced."""
    path = Path(str(model))
    if is_organism(path):
        return ORGANISM_NAME
    if path.exists():
        return path.stem if path.is_file() else path.resolve().name
    return str(model).replace("/", "--")




# ---------------------------------------------------------------------------- the run context
@dataclass
class RunContext:
    """Everything one analysis run needs, opened once by :func:`open_context`: the resolved
    options, the session, the dataset, the selected items and the prompt builder."""

    name: str
    options: Any  # the resolved Analysis (see Analysis.resolved)
    session: EngineSession
    dataset: ProbeDataset
    items: tuple[Item, ...]
    builder: PromptBuilder
    model_path: str
    out_dir: Path  # OUT/<model>: the results folder of the model (probes.reporting.layout)
    model_fingerprint: dict[str, str]
    threads: int  # torch's CPU thread count this run computes on (run_threads), recorded in the results header
    skipped: tuple[SkippedItem, ...] = ()  # items left out by too_long="skip", with the reason
    _score_cache: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)  # item -> prompt digest -> rows

    @property
    def output(self) -> OutputRoot:
        """Where this analysis writes (``OUT/<model>/<analysis>``, :mod:`probes.reporting.layout`): every
        output but the figures through it (:mod:`probes.core.files`)."""
        return OutputRoot(self.out_dir, overwrite=self.options.overwrite).child(self.options.name)

    @property
    def folder(self) -> Path:
        """``OUT/<model>/<analysis>``: this analysis's rows, tables and other outputs."""
        return self.output.root

    @property
    def figures_dir(self) -> Path:
        """``OUT/<model>/figures``: every analysis's figures."""
        return OutputRoot(self.out_dir).path(figures_folder(self.out_dir))

    def rows_path(self, stem: str | None = None) -> Path:
        """A rows file of this analysis: its own (``<analysis>.jsonl``), or ``stem``'s (``heads_causal``)."""
        path = rows_path(self.out_dir, self.options.name, stem)
        check_inside(path.parent, self.out_dir)  # a link there out of --out is refused (the store refuses one at the file)
        return path

    @property
    def variant(self) -> str:
        return self.options.margin_variant

    @property
    def fmt(self) -> str:
        return self.options.format

    def config(self, **extra: Any) -> dict[str, Any]:
        """The full configuration recorded in the results header (resuming requires equality).

        ``fingerprint`` covers everything a row depends on beyond the options: the weights and
        the tokenizer (content hashes), the items and skill libraries (content), and the code.
        """
        a = self.options
        return {
            "model": self.model_path,
            "fingerprint": {**self.model_fingerprint, "dataset": self.dataset.content_digest(self.items), "code": code_digest()},
            "dtype": a.dtype, "device": a.device, "threads": self.threads, "format": a.format, "margin_variant": a.margin_variant,
            "epsilon": EPSILON, "k_max": a.k_max, "seed": a.seed,
            "builder": {"embedder": self.builder.retriever.embedder.name, "gamma": a.gamma, "relevance": a.relevance, "beta": a.beta,
                        "retrieval": self.builder.settings.retrieval_mode},
            "dataset": str(a.dataset),
            "items": {"n": len(self.items), "digest": hashlib.sha256(",".join(i.id for i in self.items).encode()).hexdigest()[:16],
                      "bucket": list(a.buckets) if a.buckets else None, "domain": list(a.domains) if a.domains else None,
                      "split": a.split, "split_kind": a.split_kind, "limit": a.limit},
            **({"skipped_too_long": [[s.item_id, s.reason] for s in self.skipped]} if self.skipped else {}),
            "options": header_options(a),
            **extra,
        }

    def store(self, **extra: Any) -> ResultsStore | ShardedStore:
        return open_store(self.rows_path(self.name), self.name, self.config(**extra), overwrite=self.options.overwrite)

    def items_in(self, buckets: Iterable[str]) -> list[Item]:
        buckets = set(buckets)
        return [item for item in self.items if item.bucket in buckets]


# The modules that draw, plot or report results only, or that no analysis runs (the dataset tools, formerly
# in the CLI); every other module shapes the rows.
_PRESENTATION = ("cli", "reporting/plots.py", "reporting/markdown.py", "reporting/finished.py", "analyses/explore.py", "analyses/report.py",
                 "analyses/dataset_tools.py", "organism")


# An analysis module ends with the figures it draws, after a line starting with this marker; they
# shape no row, so editing a figure keeps the results resumable (as plots.py always did).
FIGURE_BLOCK = b"\n# --- Fig"


def row_source(source: bytes) -> bytes:
    """The part of a module's source that can shape rows: all of it, less its figure block."""
    return source.split(FIGURE_BLOCK, 1)[0]


@functools.cache
def code_digest() -> str:
    """Hash of the source of every module that computes rows (a code change invalidates resume)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if not name.startswith(_PRESENTATION) and not name.startswith("datasets/"):
            h.update(name.encode() + b"\0" + row_source(path.read_bytes()))
    return h.hexdigest()[:16]


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


def select_items(dataset: ProbeDataset, options: Any) -> tuple[Item, ...]:
    """The items of a run: ``limit`` takes N per bucket round-robin over task groups
    (:func:`probes.data.dataset.spread_limit`)."""
    try:
        items = dataset.select(
            buckets=options.buckets, domains=options.domains, split=None if options.split == "all" else options.split,
            split_kind=options.split_kind, ids=options.item_ids, limit_per_bucket=options.limit, spread=True,
        )
    except ValueError as error:  # unknown bucket / domain / item id, or an id the other filters drop
        raise OptionError(f"item filters: {error}") from error
    if not items:
        raise OptionError("no items match the filters (buckets/domains/split/limit/item_ids/items)")
    return items


def check_gate_embedder(options: Any) -> None:
    """The semantic gate (Eq. 10 with embedding cosines) needs a semantic embedder: an option error
    before any model or tokenizer is loaded."""
    if options.relevance == "semantic" and options.embedder == "lexical":
        raise OptionError("relevance 'semantic' (the default for a model other than the bundled organism) needs a semantic "
                          "embedder: pass embedder='minilm' (--embedder minilm), or relevance='lexical' (--relevance lexical)")


def check_oracle(options: Any) -> None:
    """Under ``retrieval="oracle"`` the defining skill's rank must be one the run shows: at most its
    depth (``k``, else ``k_max``); shallower depths of a sweep show the first k of the oracle order."""
    if options.retrieval == "oracle" and options.depth is not None and options.oracle_rank > options.depth:
        raise OptionError(f"oracle_rank (--oracle-rank) {options.oracle_rank} exceeds the run's retrieval depth {options.depth}: "
                          f"no prompt would show the defining skill; use --oracle-rank {options.depth} or less, or a deeper k")


def check_depths(dataset: ProbeDataset, items: Sequence[Item], **depths: int | None) -> None:
    """Retrieval depths (``k_max=...``, ``k=...``) checked against the smallest skill library of
    the items, before any model or tokenizer is loaded."""
    smallest = min(items, key=lambda item: len(dataset.library_for(item)))
    size = len(dataset.library_for(smallest))
    for name, k in depths.items():
        if k is not None and k > size:  # deeper retrieval would repeat the same prompt under new k labels
            flag = "--" + name.replace("_", "-")
            raise OptionError(f"{name} ({flag}) {k}: item {smallest.id} has only {size} skills to retrieve; use {size} or less")


def check_min_depth(options: Any) -> None:
    """The depth an analysis runs at (``k``, else ``k_max``) against the smallest it can measure."""
    minimum = getattr(type(options), "min_depth", 0)
    if options.depth is not None and options.depth < minimum:
        given = "k (--k)" if getattr(options, "k", None) is not None else "k_max (--k-max)"
        raise OptionError(f"{options.name}: {given} {options.depth}: it measures the spans of the shown skills, which "
                          f"need k ≥ {minimum} (at k = 0 no skill is shown); use --k {minimum} or more")


def open_session(options: Any, model: str | Path) -> EngineSession:
    """Load ``model`` with every session option on the chosen backend (the one place analyses
    and ``report`` build their session)."""
    common = {"dtype": options.dtype, "device": options.device, "device_map": options.device_map,
              "allow_pickle": options.allow_pickle, "trust_remote_code": options.trust_remote_code}
    if options.remote and options.backend != "nnsight":
        raise OptionError(f"option 'remote' (--remote) needs backend='nnsight', got backend={options.backend!r}")
    if options.backend == "native":
        return EngineSession(model, **common, prefix_cache=options.prefix_cache)
    from probes.backends import get_backend

    return get_backend(options.backend, model, **common, **({"remote": True} if options.remote else {}))


def session_runs(session: EngineSession) -> dict[str, str]:
    """What a loaded session runs: its dtype, device and backend, as the options name them."""
    return {"dtype": str(session.model.dtype).removeprefix("torch."), "device": str(session.model.device),
            "backend": getattr(session, "name", "native")}


def require_session(session: Any) -> None:
    """``session`` is a loaded session (or None): a path or a name given there is answered, not an AttributeError."""
    if session is not None and not (hasattr(session, "model") and callable(getattr(session, "run", None))):
        raise OptionError(f"session must be a loaded session (probes.ProbeSession(PATH)) or None, got {type(session).__name__} "
                          f"{str(session)[:80]!r}; to load a model by its path, pass model=PATH")


def session_folder(session: EngineSession) -> Path:
    """The folder the session's model was loaded from (a GGUF: its converted folder), as the model names
    it; an error for a model built in memory, whose weights no folder holds (nothing to fingerprint or to
    name the results by)."""
    name = str(getattr(session.model, "name_or_path", "") or "")
    if not (name and Path(name).is_dir()):
        raise AnalysisError(f"the session's model has no folder (name_or_path {name!r}): its weights cannot be fingerprinted "
                            "nor its results named; save it (model.save_pretrained(DIR), with its tokenizer) and open the session from DIR")
    return Path(name)


def model_conflict(options: RunOptions, session: EngineSession) -> str | None:
    """Why ``model=`` is not the weights of ``session`` (None when it is). The same model: ``model``
    loads from the session's own folder (paths resolved, links followed, a local-cache name to its
    snapshot, a .gguf to its converted folder). A copy elsewhere is another model here: the study
    defaults (dataset, gate) and the results folder follow the folder, not the bytes."""
    loaded = session_folder(session).resolve()
    try:
        folder = model_folder(options.model, allow_pickle=options.allow_pickle).resolve()
    except ModelLoadError as error:
        return f"model={str(options.model)!r} is not the session's model {loaded} ({error})"
    return None if folder == loaded else f"model={str(options.model)!r} ({folder}) is not the session's model {loaded}"


def check_session(options: RunOptions, session: EngineSession) -> None:
    """A session option given (not its default) that contradicts the given ``session`` is an error:
    the run would record one thing and measure another. ``model`` must be the session's own (:func:`model_conflict`)."""
    runs = session_runs(session)
    conflicts = [conflict] if options.model is not None and (conflict := model_conflict(options, session)) else []
    for name, actual in runs.items():
        given = getattr(options, name)
        if given == type(options).__dataclass_fields__[name].default or (name == "dtype" and given == "auto"):
            continue  # not given: the session's value is recorded
        same = (torch.device(given).type == torch.device(actual).type and torch.device(given).index in (None, torch.device(actual).index)
                if name == "device" else given == actual)
        if not same:
            conflicts.append(f"{name}={given!r} but the session runs {name}={actual!r}")
    if conflicts:
        raise OptionError(f"{options.name}: options contradict the given session: {'; '.join(conflicts)}. Leave them out "
                          "(the session's are recorded), or load a session with them (or pass no session)")


def run_threads(threads: int | str, session: EngineSession, ranks: World) -> int:
    """The torch thread count of a run: ``threads`` as given, or what ``auto`` resolves to for the session's model
    (:func:`probes.engine.threads.auto_threads`); in a parallel run the smallest of the ranks' counts, so that every
    rank computes on the one count that the shared results header records."""
    count = auto_threads(sum(p.numel() for p in session.model.parameters()), ranks.local_size) if threads == AUTO else threads
    return ranks.smallest(count)


def open_context(analysis: RunOptions, session: EngineSession | None = None) -> RunContext:
    """Resolve the options of ``analysis`` (an :class:`~probes.analyses.base.Analysis`), load the model
    (unless ``session`` is given), the dataset and the builder.

    The prompt builder uses the tokenizer of the model under study, so spans and candidates are
    in the model's own token space. With a ``session``, ``model`` may name only the session's own
    weights (:func:`model_conflict`: it names the results folder); it defaults to the session's folder.
    """
    require_session(session)
    options = analysis.resolved()
    if session is not None:  # before the study (dataset, gate) is chosen by the model
        check_session(options, session)
    torch.manual_seed(options.seed)
    if options.model is not None:
        model: str | Path = options.model
    elif session is not None:
        model = session_folder(session)
    else:
        model = default_model()
    dataset_name, relevance = resolve_study(model, options.dataset, options.relevance)
    options = dataclasses.replace(options, dataset=resolve_dataset(dataset_name), relevance=relevance)
    check_gate_embedder(options)
    # options and dataset first: a bad value stops the run before the model is loaded
    dataset = _dataset(str(options.dataset))
    if options.items:
        unknown = [d for d in parse_items(options.items)["domains"] if d not in dataset.domains]
        if unknown:
            raise OptionError(f"items {options.items}: {', '.join(map(repr, unknown))} is not a bucket ({', '.join(BUCKETS)}), "
                              f"a domain ({', '.join(dataset.domains)}) or a count; the form is BUCKET:DOMAIN:COUNT, e.g. T_wrong:retail:10")
    items = select_items(dataset, options)
    check_depths(dataset, items, k_max=options.k_max, k=getattr(options, "k", None))
    check_min_depth(options)
    check_oracle(options)
    out_dir = check_layout(check_inside(Path(options.out) / model_label(model), options.out))  # a link out of --out is never followed
    if options.chat_template is not None:  # a missing template file stops the run before the model is loaded
        try:
            chat_template_file(options.chat_template)
        except ChatTemplateError as error:
            raise OptionError(str(error)) from None
    if options.format == "prompted" and is_organism(model):
        print("warning: the bundled organism was trained on the native format only; format prompted measures "
              "a format it never saw", file=sys.stderr)
    ranks = world()  # under torchrun: joins the other ranks before the model is loaded
    if session is None:  # each rank of a parallel run on its node's GPU; the option as given is recorded
        session = open_session(dataclasses.replace(options, device=rank_device(options.device, ranks)), model)
    else:  # record what the given session actually runs, not the option defaults (the ranks' GPUs as one device type)
        runs = session_runs(session)
        options = dataclasses.replace(options, dtype=runs["dtype"], device=session.model.device.type if ranks.size > 1 else runs["device"])
    if session.tokenizer is None:
        raise AnalysisError(f"{model}: no tokenizer next to the weights")
    threads = run_threads(options.threads, session, ranks)
    set_threads(threads)  # before anything computes (the embedder too); the API entries give the caller's count back
    builder = options.make_builder(session.tokenizer, dataset, retriever=_retriever(options.embedder), tokenizer_name=str(model))
    builder.warm(items)
    skipped: tuple[SkippedItem, ...] = ()
    if options.too_long == "skip":
        limit = getattr(session.model.config.get_text_config(), "max_position_embeddings", None)
        if limit is not None:
            part = partition_by_context(builder, items, max_tokens=limit, k=options.k_max, fmt=options.format)
            items, skipped = part.kept, part.skipped
            if skipped:
                print(f"{analysis.name}: skipped {len(skipped)} items longer than the model's context ({limit} tokens): "
                      + "; ".join(f"{s.item_id} ({s.reason})" for s in skipped), file=sys.stderr)
            if not items:
                raise OptionError(f"every selected item exceeds the model's context ({limit} tokens)")
    model_path = str(Path(str(model)).resolve()) if Path(str(model)).exists() else str(model)
    # the folder actually loaded (GGUF: converted), and the tokenizer with the chat template the prompts are rendered through
    fingerprint = model_fingerprint(session.model.name_or_path or model, builder.tokenizer)
    return RunContext(analysis.name, options, session, dataset, tuple(items), builder, model_path, out_dir, fingerprint, threads, skipped)


def split_label(options: Any) -> str:
    """The split of a run as reports write it: ``eval``, or ``eval, scenario split`` for another split kind
    (``per analysis`` for a report that leaves it to each analysis)."""
    split = "per analysis" if options.split is None else options.split
    return split if options.split_kind == "template" else f"{split}, {options.split_kind} split"


def provenance(ctx: RunContext, n_items: int | None = None, *, items: bool = True) -> str:
    """One line naming model, dataset, format, margin variant, items and k (figure footnotes, report);
    ``items=False`` leaves the item count out (a composite figure states each panel's own)."""
    a = ctx.options
    n = len(ctx.items) if n_items is None else n_items
    groups = len({item.task_group for item in ctx.items}) if n_items is None else None
    count = f"items: {n}{f' ({groups} task groups)' if groups is not None else ''} · " if items else ""
    return (f"model: {model_label(ctx.model_path)} ({a.dtype}, {a.device}) · dataset: {Path(a.dataset).name} ({split_label(a)}) · "
            f"format: {a.format} · margin: {a.margin_variant} · {count}"
            f"k ≤ {a.k_max} · embedder: {ctx.builder.retriever.embedder.name} · seed {a.seed}")


