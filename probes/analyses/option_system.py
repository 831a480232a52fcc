"""The one option system: how a command's keyword options are declared, checked and normalised, and
the options classes the analyses, ``report`` and the dataset commands share.

An option is a keyword-only dataclass field made with :func:`option` (its help, type, choices,
range, flag and group in the field's metadata); :class:`Options` checks every field once, as given
(:func:`check_option`), and :class:`RunOptions` holds the options every analysis shares. The CLI
turns the same fields into flags (:mod:`probes.cli.flags`); nothing here knows about argparse.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from probes.backends import BACKENDS
from probes.data.dataset import BUCKETS, FOLD_GROUPS, SPLIT_KINDS, ProbeDataset
from probes.data.retrieval import EMBEDDERS, RELEVANCE_MEASURES, RETRIEVAL_MODES, Retriever
from probes.engine.threads import AUTO, AUTO_RULE
from probes.prompts.builder import DEFAULT_K_MAX, FORMATS, BuildSettings, PromptBuilder, make_builder
from probes.prompts.tokenizers import BUNDLED_TEMPLATES, ChatTemplateError, with_chat_template
from probes.scoring.score import DEFAULT_VARIANT, MARGIN_VARIANTS
from probes.scoring.stats import MIN_FOLDS

# --quick: a small item subset so that `report --quick` finishes in minutes on 2 CPU cores. The
# limit is spread over task groups (ProbeDataset.select): 4 items per bucket = 4 task groups, the
# fewest that give a bootstrap CI and two task groups per half of a split-half test.
QUICK = {"limit": 4, "k_max": DEFAULT_K_MAX, "random_draws": 2}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)  # the backend option's choices: the backends' registry, named once
SPLIT_CHOICES = ("train", "eval", "all")
# Every seed reaches numpy's legacy RandomState through scikit-learn's fold splitter (random_state),
# which takes 0 ≤ seed < 2**32 (numpy's Generator and torch take more): checked before any work.
SEED_MAX = 2**32 - 1


class OptionError(ValueError):
    """An option has the wrong type, is out of range or selects nothing; the message names it."""


class UnknownOption(OptionError, TypeError):
    """A keyword that is no option of the analysis (a TypeError too, as for any unknown keyword)."""


# ---------------------------------------------------------------------------- options
def option(
    default: Any,
    help: str,
    *,
    type: Callable[..., Any] = str,
    choices: Sequence[Any] | None = None,
    flag: str | None = None,
    repeat: bool = False,
    names: Sequence[str] | None = None,
    group: str = "run",
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive: bool = False,
    why: str | None = None,
    positional: bool = False,
    words: Sequence[str] = (),
) -> Any:
    """A keyword option of an analysis or command (a dataclass field with what the CLI and the validator need).

    ``repeat``: a list given by repeating the flag (``--bucket T_ok --bucket T_wrong``);
    ``names``: a list given as comma-separated names from ``names`` (``--configs base,proc``; a
    live sequence such as :data:`probes.analyses.ANALYSES` is read when checked);
    ``flag``: the CLI flag when it is not ``--field-name`` (``--no-figure`` for a True default);
    ``minimum``: the smallest value of a number, the fewest names of a list; ``maximum``: the largest
    value of a number; ``exclusive``: both bounds are themselves refused (``minimum=0, maximum=1,
    exclusive=True``: a probability in (0, 1)); ``why``: what the range protects, said when it refuses.
    A string, a path and every name of a list must not be empty (a path ``""`` would be the current folder).
    ``positional``: a positional argument of the command (``show ITEM``); ``default`` :data:`REQUIRED`
    makes the option required. ``words``: the words a number option takes besides its numbers (``threads``: auto).
    """
    if isinstance(default, list):
        default = tuple(default)
    meta = {"help": help, "type": type, "choices": tuple(choices) if choices is not None else None, "flag": flag,
            "repeat": repeat, "names": tuple(names) if isinstance(names, list) else names, "group": group, "minimum": minimum,
            "maximum": maximum, "exclusive": exclusive, "why": why, "positional": positional, "words": tuple(words)}
    return field(metadata=meta) if default is REQUIRED else field(default=default, metadata=meta)


REQUIRED: Any = dataclasses.MISSING  # the default of an option that must be given


def shared(cls: type, name: str, *, default: Any = REQUIRED, help: str | None = None) -> Any:
    """Option ``name`` as ``cls`` declares it (same default, help, type and checks), for a class that
    lists it among its own (``RunOptions`` keeps its field order: the option listings show it);
    ``default`` / ``help`` change only those, as a redeclared option does."""
    f = cls.__dataclass_fields__[name]
    meta = {**f.metadata, **({"help": help} if help is not None else {})}
    return field(default=f.default if default is REQUIRED else default, metadata=meta)


def k_max_option(default: int | None) -> Any:
    """The ``k_max`` option (``--k-max``) with ``default``: :data:`~probes.prompts.builder.DEFAULT_K_MAX`
    (the analyses at one depth) or :data:`~probes.prompts.builder.SWEEP_K_MAX` (the depth sweeps, ``build``)."""
    return option(default, "largest retrieval depth K", type=int, minimum=0, group="probe")


def seed_option(help: str, group: str = "run") -> Any:
    """A ``seed`` option (``--seed``), default 0, in 0..:data:`SEED_MAX`."""
    return option(0, help, type=int, minimum=0, maximum=SEED_MAX, group=group,
                  why="numpy's RandomState, which scikit-learn's folds use, takes 0 ≤ seed < 2**32")


def folds_option(default: int, help: str, group: str) -> Any:
    """A ``folds`` option (``--folds``) of grouped cross-validation: at least :data:`~probes.scoring.stats.MIN_FOLDS`."""
    return option(default, help, type=int, minimum=MIN_FOLDS, group=group, why="one fold leaves no training data, so no out-of-fold score")


def fold_groups_option(group: str) -> Any:
    """The ``fold_groups`` option (``--fold-groups``) of grouped cross-validation (``linear``, ``shortcuts``):
    :func:`probes.data.dataset.fold_groups`."""
    return option(FOLD_GROUPS[0], "groups of the CV folds: task_group (a test item's template never in training) or scenario "
                  "(its whole scenario, every template, never in training; needs the item field scenario, e.g. basm_probe_v2)",
                  choices=FOLD_GROUPS, group=group)


def depth_option(default: int | None = None, help: str = "retrieval depth (default: k_max)") -> Any:
    """The ``k`` option (``--k``) of an analysis or command at one retrieval depth; read it as ``options.depth``."""
    return option(default, help, type=int, minimum=0, group="probe")


def option_fields(cls: type) -> list[dataclasses.Field]:
    """The option fields of an analysis class (every dataclass field with option metadata)."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_of(f: dataclasses.Field) -> str:
    """The command-line flag of option field ``f`` (a positional option: its name)."""
    if f.metadata.get("positional"):
        return f.name
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _number(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def value_range(f: dataclasses.Field) -> str | None:
    """The range of number option ``f`` as its refusal states it (``≥ 0``, ``> 0``, ``in (0, 1)``), or None."""
    low, high, exclusive = f.metadata["minimum"], f.metadata["maximum"], f.metadata["exclusive"]
    if low is not None and high is not None:
        return f"in {'(' if exclusive else '['}{_number(low)}, {_number(high)}{')' if exclusive else ']'}"
    if low is not None:
        return f"{'>' if exclusive else '≥'} {_number(low)}"
    if high is not None:
        return f"{'<' if exclusive else '≤'} {_number(high)}"
    return None


def _in_range(f: dataclasses.Field, value: float) -> bool:
    low, high, exclusive = f.metadata["minimum"], f.metadata["maximum"], f.metadata["exclusive"]
    if exclusive:
        return (low is None or value > low) and (high is None or value < high)
    return (low is None or value >= low) and (high is None or value <= high)


def check_option(analysis: str, f: dataclasses.Field, value: Any, where: str = "") -> Any:
    """``value`` checked (and normalised: lists become tuples, paths stay as given) against the
    option's type, choices and range; a precise :class:`OptionError` otherwise."""
    meta = f.metadata
    label = f"{where}{analysis}: option {f.name!r} ({flag_of(f)})"
    if value is None:
        if f.default is None:
            return None
        raise OptionError(f"{label} must not be None (default: {f.default!r})")
    if meta["repeat"] or meta["names"] is not None:
        values = [value] if isinstance(value, str) else value
        if isinstance(values, str) or not isinstance(values, Sequence) or not all(isinstance(v, str) for v in values):
            raise OptionError(f"{label} must be a list of strings, got {value!r}")
        if "" in values:  # an empty name matches nothing, or (a prefix) everything
            raise OptionError(f"{label}: an empty name in {list(values)!r}; give each name, e.g. {flag_of(f)} NAME")
        known = meta["names"] or meta["choices"]
        if known is not None and (unknown := [v for v in values if v not in known]):
            raise OptionError(f"{label}: unknown {unknown}; known: {', '.join(known)}")
        if meta["minimum"] is not None and len(values) < meta["minimum"]:  # of a list: the fewest names
            raise OptionError(f"{label} needs at least {meta['minimum']:g} of {', '.join(known or ())}, got {list(values)!r}")
        return tuple(values)
    kind = meta["type"]
    if kind is bool:
        if not isinstance(value, bool):
            raise OptionError(f"{label} must be true or false, got {value!r}")
    elif kind in (int, float):
        if value in meta["words"]:
            return value
        words = "".join(f" or {word}" for word in meta["words"])
        if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
            raise OptionError(f"{label} must be {'an integer' if kind is int else 'a number'}{words}, got {value!r}")
        if not math.isfinite(value):  # NaN would pass every range check and then close every gate silently
            raise OptionError(f"{label} must be a finite number{words}, got {value!r}")
        if not _in_range(f, value):
            raise OptionError(f"{label} must be {value_range(f)}{words}, got {value!r}" + (f" ({meta['why']})" if meta["why"] else ""))
    elif kind is Path:
        if not isinstance(value, str | Path):
            raise OptionError(f"{label} must be a path, got {value!r}")
    elif not isinstance(value, str):
        raise OptionError(f"{label} must be a string, got {value!r}")
    if isinstance(value, str) and not value:  # a path "" would be the current folder
        default = "" if f.default is REQUIRED else "leave it out, or " if f.default is None else f"leave it out for its default ({f.default}), or "
        raise OptionError(f"{label} must not be empty; {default}give {'a path (. for the current folder)' if kind is Path else 'a value'}")
    if meta["choices"] is not None and value not in meta["choices"]:
        raise OptionError(f"{label} must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
    return value


def header_options(options: RunOptions, of: type | None = None) -> dict[str, Any]:
    """Every option of ``options`` (of the class ``of`` only, when given: a header two analyses share)
    but the value-neutral ones (:attr:`RunOptions.value_neutral`), as JSON values: what the results
    header records so that a resume under another value is refused."""
    def plain(value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else str(value) if isinstance(value, Path) else value

    return {f.name: plain(getattr(options, f.name)) for f in option_fields(of or type(options)) if f.name not in options.value_neutral}


def parse_items(spec: str) -> dict[str, Any]:
    """``items`` compact filter: colon-separated bucket names, domain names and one count,
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



@dataclass(kw_only=True)
class Options:
    """Base of every options class (the analyses, ``report``'s, the dataset commands'): keyword fields
    made with :func:`option`, validated and normalised once, as given. The CLI derives a command's
    flags from its class (:mod:`probes.cli.flags`), so a field shared by several classes (below) is
    declared once and has one flag, one default and one check everywhere."""

    name: ClassVar[str] = ""
    # Options that cannot change a row's value: where results and figures go, how a model may be
    # loaded (its content is fingerprinted), the prefix cache (bit-identical either way), and the
    # shorthands recorded through what they resolve to (quick, items: limit, k_max, buckets, domains; threads: the count
    # actually used, RunContext.config). Every other option is in the results header (header_options), so a resume
    # under another value is refused.
    value_neutral: ClassVar[frozenset[str]] = frozenset({"model", "out", "overwrite", "figure", "quick", "items", "allow_pickle",
                                                         "trust_remote_code", "prefix_cache", "threads"})

    def __post_init__(self) -> None:
        for f in option_fields(type(self)):  # validated and normalised once, as given
            object.__setattr__(self, f.name, check_option(self.name, f, getattr(self, f.name)))


@dataclass(kw_only=True)
class DatasetOption(Options):
    """The dataset (``--dataset``), defaulting to the study default of the model (:func:`probes.prompts.builder.resolve_study`)."""

    dataset: str | Path | None = option(None, "probe dataset folder or bundled name (basm_probe, basm_probe_v2, bfcl); default: "
                                        "basm_probe (v1) for the bundled organism, basm_probe_v2 for every other model", type=Path, group="items")


@dataclass(kw_only=True)
class ItemOptions(DatasetOption):
    """The item filters (``select_items``) of the analyses and ``build``."""

    buckets: tuple[str, ...] | None = option(None, "keep only these buckets (default: all)", flag="--bucket", repeat=True,
                                             choices=BUCKETS, group="items")
    domains: tuple[str, ...] | None = option(None, "keep only these domains", flag="--domain", repeat=True, group="items")
    split: str = option("eval", "dataset split", choices=SPLIT_CHOICES, group="items")
    split_kind: str = option("template", "which split --split reads: template (task groups held out, the item field split) or "
                             "scenario (whole scenarios held out, split_scenario; basm_probe_v2)", choices=SPLIT_KINDS, group="items")
    limit: int | None = option(None, "keep N items of each bucket, round-robin over task groups (one item per group first)",
                               type=int, minimum=1, group="items")
    item_ids: tuple[str, ...] | None = option(None, "keep only these item ids", flag="--item", repeat=True, group="items")


class BuildsPrompts:
    """What an options class with the builder's settings (:class:`BuilderOptions`' fields) can do."""

    k_max: int | None
    embedder: str
    gamma: float
    relevance: str | None
    beta: int
    retrieval: str
    oracle_rank: int
    chat_template: str | Path | None

    @property
    def depth(self) -> int | None:
        """The one retrieval depth of an analysis or command with a ``k`` option: ``k``, else ``k_max``."""
        k = getattr(self, "k", None)
        return k if k is not None else self.k_max

    def make_builder(self, tokenizer: Any, dataset: ProbeDataset, *, retriever: Retriever | None = None, tokenizer_name: str = "") -> PromptBuilder:
        """The prompt builder of these settings (:func:`probes.prompts.builder.make_builder`), ``relevance``
        resolved (:func:`probes.prompts.builder.resolve_study`). ``retriever``: one to share instead of a
        new one of ``embedder``. ``tokenizer`` renders through ``chat_template`` when one is given, and must have its own otherwise."""
        try:
            tokenizer = with_chat_template(tokenizer, self.chat_template, tokenizer_name)
        except ChatTemplateError as error:
            raise OptionError(str(error)) from None
        return make_builder(tokenizer, dataset, embedder=self.embedder if retriever is None else retriever, k_max=self.k_max,
                            gamma=self.gamma, relevance=self.relevance, beta=self.beta, retrieval=self.retrieval,
                            oracle_rank=self.oracle_rank, tokenizer_name=tokenizer_name)


@dataclass(kw_only=True)
class BuilderOptions(Options, BuildsPrompts):
    """The prompt builder's settings (:func:`probes.prompts.builder.make_builder`) of the analyses, ``build`` and ``show``."""

    k_max: int | None = k_max_option(DEFAULT_K_MAX)
    embedder: str = option("auto", "retrieval embedder", choices=EMBEDDERS, group="probe")
    gamma: float = option(BuildSettings.gamma, "boundary relevance gate γ (Eq. 10)", type=float, group="probe")
    relevance: str | None = option(None, "r_B of the gate (Eq. 10): lexical (content-word overlap, the paper's) or semantic "
                                   "(embedding cosine); default: lexical for the bundled organism, semantic for every other model",
                                   choices=RELEVANCE_MEASURES, group="probe")
    beta: int = option(BuildSettings.beta, "boundary token budget β (Eq. 10)", type=int, minimum=0, group="probe")
    retrieval: str = option(BuildSettings.retrieval, "which skills a prompt shows: ranked (Eq. 8's top k) or oracle (the item's "
                            "defining skill moved to rank --oracle-rank of Eq. 8's ranking, the others in their order; depth k "
                            "shows the first k)", choices=RETRIEVAL_MODES, group="probe")
    oracle_rank: int = option(BuildSettings.oracle_rank, "the defining skill's rank under --retrieval oracle (at most the run's "
                              "depth; a shallower k of a sweep does not show it)", type=int, minimum=1, group="probe")
    chat_template: str | Path | None = option(None, "Jinja chat template file for a tokenizer without one (a base checkpoint), or a "
                                              f"bundled one by name ({', '.join(BUNDLED_TEMPLATES)}: Gemma 3's turn format); "
                                              "default: the tokenizer's own", type=Path, group="model")


@dataclass(kw_only=True)
class RunOptions(Options, BuildsPrompts):
    """The options every analysis and ``report`` share (model, probe, items, run), validated and
    normalised once, as given; :meth:`resolved` applies ``items`` and ``quick``. The builder's
    settings and the item filters are :class:`BuilderOptions`' and :class:`ItemOptions`' (``shared``),
    the same as the dataset commands'."""

    # model
    model: str | Path | None = option(None, "local HF folder, local-cache name or .gguf (default: the bundled organism)",
                                      type=Path, group="model")
    dtype: str = option("float32", "float32 | bfloat16 | float16 | auto", choices=("float32", "bfloat16", "float16", "auto"), group="model")
    device: str = option("cpu", "torch device", group="model")
    device_map: str | None = option(None, 'accelerate device map for multi-GPU models, e.g. "auto"', group="model")
    allow_pickle: bool = option(False, "allow .bin (pickle) weights; safetensors only by default", type=bool, group="model")
    trust_remote_code: bool = option(False, "allow model code shipped in the model folder", type=bool, group="model")
    backend: str = option("native", "probe backend: native (cached branching), nnsight or transformerlens (docs/backends.md)",
                          choices=BACKEND_NAMES, group="model")
    remote: bool = option(False, "nnsight only: run on an NDIF deployment (fails at once when offline or unauthorised)", type=bool, group="model")
    prefix_cache: int = option(8, "native only: prompt prefixes kept for key/value reuse across prompts (0: off)", type=int, minimum=0,
                               group="model")
    # probe
    format: str = option("native", "decision format", choices=FORMATS, group="probe")
    margin_variant: str = option(
        DEFAULT_VARIANT, "the headline margin: tool_choice (Eq. 1 restricted to the tools, each wrong/correct pair compared "
        "where their names diverge), eq1 (Eq. 1 verbatim, abstention among the alternatives; prompted format only), first_token (Eq. 1 at the decision row, NaN "
        "where names share a first token) or path (whole-path log-probabilities, abstention included); all are written to the rows",
        choices=MARGIN_VARIANTS, group="probe")
    k_max: int | None = shared(BuilderOptions, "k_max")
    embedder: str = shared(BuilderOptions, "embedder")
    gamma: float = shared(BuilderOptions, "gamma")
    relevance: str | None = shared(BuilderOptions, "relevance")
    beta: int = shared(BuilderOptions, "beta")
    retrieval: str = shared(BuilderOptions, "retrieval")
    oracle_rank: int = shared(BuilderOptions, "oracle_rank")
    chat_template: str | Path | None = shared(BuilderOptions, "chat_template")
    seed: int = seed_option("seed of every random draw", group="probe")
    # items
    dataset: str | Path | None = shared(ItemOptions, "dataset")
    buckets: tuple[str, ...] | None = shared(ItemOptions, "buckets")
    domains: tuple[str, ...] | None = shared(ItemOptions, "domains")
    split: str = shared(ItemOptions, "split")
    split_kind: str = shared(ItemOptions, "split_kind")
    limit: int | None = shared(ItemOptions, "limit")
    item_ids: tuple[str, ...] | None = shared(ItemOptions, "item_ids")
    items: str | None = option(None, "compact item filter BUCKET:DOMAIN:COUNT, e.g. T_wrong:retail:10", group="items")
    too_long: str = option("error", "items whose longest prompt (proc/app/basm at k_max) exceeds the model's context: error (stop), "
                           "or skip them, listed on stderr and recorded in the results header", choices=("error", "skip"), group="items")
    # run
    out: str | Path = option("results", "results folder; each model writes to OUT/<model>/", type=Path)
    overwrite: bool = option(False, "discard existing results instead of resuming", type=bool)
    quick: bool = option(False, f"small run: {QUICK['limit']} items (task groups) per bucket, k ≤ {QUICK['k_max']}", type=bool)
    figure: bool = option(True, "draw the figures (--no-figure: write rows and tables only)", type=bool, flag="--no-figure")
    threads: int | str = option(AUTO, f"torch CPU threads: a count, or {AUTO_RULE}. Values differ in the last bits between "
                                "thread counts, so the count is recorded and a resume under another one is refused",
                                type=int, minimum=1, words=(AUTO,))

    def resolved(self) -> RunOptions:
        """These options with ``items``, ``quick`` and the analysis's default buckets applied."""
        changes: dict[str, Any] = {}
        buckets, domains, limit, k_max = self.buckets, self.domains, self.limit, self.k_max
        if self.items is not None:
            spec = parse_items(self.items)
            if not (spec["buckets"] or spec["domains"] or spec["limit"] is not None):
                raise OptionError(f"{self.name}: option 'items' (--items) {self.items!r} names no bucket, domain or count; "
                                  "the form is BUCKET:DOMAIN:COUNT, e.g. T_wrong:retail:10")
            buckets = tuple(spec["buckets"]) or buckets
            domains = tuple(spec["domains"]) or domains
            limit = spec["limit"] if spec["limit"] is not None else limit
        if self.quick:
            limit = QUICK["limit"] if limit is None else limit
            k_max = QUICK["k_max"] if k_max is None else min(k_max, QUICK["k_max"])
            if hasattr(self, "random_draws"):
                changes["random_draws"] = min(self.random_draws, QUICK["random_draws"])
        changes.update(buckets=buckets, domains=domains, limit=limit, k_max=k_max)
        return dataclasses.replace(self, **changes)


