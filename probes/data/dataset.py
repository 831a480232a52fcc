"""The probe dataset: tool domains, skill libraries and T_ok / T_wrong / T_repair decision items.

Layout on disk (see ``datasets/basm_probe/README.md``)::

    datasets/basm_probe/domains/<domain>.json   # tools (JSON schemas) + seven-slot skills
    datasets/basm_probe/items.jsonl             # one decision item per line
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from probes.data.chat_tokens import COMMON_CHAT_TOKENS, COMMON_SOURCE, FoundToken, texts_of
from probes.data.schema import LibraryReport, Skill, ToolCatalog, build_library, tools_from_json

BUCKETS: tuple[str, ...] = ("T_ok", "T_wrong", "T_repair")
SPLITS: tuple[str, ...] = ("train", "eval")
SPLIT_KINDS: tuple[str, ...] = ("template", "scenario")  # item field: split, split_scenario
ABSTAIN = "<abstain>"

def bundled_dataset(name: str) -> Path:
    """The folder of a dataset shipped with the package: the repository's top-level ``datasets/``,
    reached through the ``probes/datasets`` link (installed copies hold the files themselves)."""
    return Path(__file__).resolve().parent.parent / "datasets" / name


V1_DATASET_DIR = bundled_dataset("basm_probe")  # the authored set the organism was trained on
V2_DATASET_DIR = bundled_dataset("basm_probe_v2")  # the de-confounded authored set (the default)

# The bundled model organism's folder (trained by probes.organism) and its results folder name. They
# live here, beside the study defaults they select, so that no layer needs to import the organism.
ORGANISM_DIR = Path(__file__).resolve().parent.parent / "organism" / "weights"
ORGANISM_NAME = "basm-organism"


def is_organism(model: str | Path | None) -> bool:
    """Whether ``model`` (a folder or name) is the bundled organism's folder."""
    return model is not None and Path(str(model)).exists() and Path(str(model)).resolve() == ORGANISM_DIR.resolve()


def default_study(*, organism: bool) -> tuple[Path, str]:
    """The dataset folder and the r_B measure of Eq. 10's gate a model is studied on by default.

    The bundled organism is an instrument check whose planted circuit is lexical by design: it was
    trained and validated on v1 with the paper's lexical gate, and keeps both. Every other model
    gets basm_probe_v2, whose boundary text shares no content word with the requests it should
    catch; the lexical gate would hide the boundary fields of about half its items there, so r_B
    is the embedding cosine (:meth:`probes.data.retrieval.Retriever.boundary_relevance`).
    """
    return (V1_DATASET_DIR, "lexical") if organism else (V2_DATASET_DIR, "semantic")


class DatasetError(ValueError):
    """The dataset on disk is malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class Item:
    """One decision point x_t."""

    id: str
    bucket: str
    split: str
    domain: str
    task_group: str
    catalog_domains: tuple[str, ...]
    unavailable_tools: tuple[str, ...]
    user: str
    history: tuple[Mapping[str, Any], ...]
    correct_action: str  # a tool name, or ABSTAIN
    correct_arguments: Mapping[str, Any] | None
    wrong_tools: tuple[str, ...]
    tempting_skill: str
    state_cues: tuple[str, ...]
    # Earlier turns of a multi-turn conversation, rendered before ``user``: user messages,
    # assistant tool calls and tool observations. ``history`` is the current turn after ``user``.
    context: tuple[Mapping[str, Any], ...] = ()
    # Optional second split that holds out whole scenarios (datasets that have one, e.g. basm_probe_v2).
    split_scenario: str | None = None
    # Optional scenario the item's task group belongs to (several templates of one scenario): the group of
    # scenario-disjoint folds (``scenario_groups``) and the unit ``split_scenario`` holds out.
    scenario: str | None = None
    # Optional stratum the item was built in (BFCL: its multi-turn category), for per-category statistics.
    category: str | None = None
    # Optional pairing: a T_wrong item and the T_ok item matched to it share this id (the T_wrong's).
    match_id: str | None = None
    # Optional label audit: what a stated rule did to this item ({"rule", "action", "reason"} each).
    audit: tuple[Mapping[str, str], ...] | None = None

    @property
    def state_text(self) -> str:
        """All text of the decision state: the user request plus any prior call and observation."""
        parts = [self.user]
        for message in self.history:
            if message["role"] == "assistant":
                call = message["tool_call"]
                parts.append(f"{call['name']} {json.dumps(call.get('arguments', {}), sort_keys=True)}")
            else:
                parts.append(str(message["content"]))
        return "\n".join(parts)


_ITEM_FIELDS = (
    "id", "bucket", "split", "domain", "task_group", "catalog_domains", "unavailable_tools",
    "user", "history", "correct_action", "wrong_tools", "tempting_skill", "state_cues",
)


OPTIONAL_FIELDS = ("split_scenario", "scenario", "category", "match_id", "audit")  # left out of a row (and of digests) when None
# joins a record id's parts (probes.prompts.record.record_id), which results and the explore page split again
RECORD_ID_SEPARATOR = "|"
_STRING_FIELDS = ("id", "bucket", "split", "domain", "task_group", "user", "tempting_skill")
_NAME_LIST_FIELDS = ("catalog_domains", "unavailable_tools", "wrong_tools", "state_cues")


def _check_history(history: Any, where: str, field: str = "history", roles: tuple[str, ...] = ("assistant", "tool")) -> None:
    if not isinstance(history, list):
        raise DatasetError(f"{where}: field {field!r} must be a list of messages, got {type(history).__name__}")
    for i, message in enumerate(history):
        at = f"{where}: {field}[{i}]"
        if not isinstance(message, dict) or message.get("role") not in roles:
            raise DatasetError(f"{at} must be an object with role {' or '.join(map(repr, roles))}, got {message!r:.80}")
        if message["role"] == "user":
            if not isinstance(message.get("content"), str) or not message["content"]:
                raise DatasetError(f"{at}: a user message needs a non-empty string 'content'")
        elif message["role"] == "assistant":
            call = message.get("tool_call")
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(call.get("arguments", {}), dict):
                raise DatasetError(f"{at}: an assistant message needs tool_call {{name: string, arguments: object}}, got {call!r:.80}")
        elif not isinstance(message.get("name"), str) or not isinstance(message.get("content"), str):
            raise DatasetError(f"{at}: a tool message needs string 'name' and 'content'")


AUDIT_ACTIONS: tuple[str, ...] = ("kept", "relabelled", "dropped")


def check_audit(audit: Any, where: str) -> None:
    """An ``audit`` field: a list of ``{"rule": str, "action": kept|relabelled|dropped, "reason": str}``."""
    if not isinstance(audit, list) or not audit:
        raise DatasetError(f"{where}: field 'audit' must be a non-empty list of {{rule, action, reason}} objects, got {audit!r:.60}")
    for i, entry in enumerate(audit):
        if (not isinstance(entry, dict) or set(entry) != {"rule", "action", "reason"} or entry["action"] not in AUDIT_ACTIONS
                or not all(isinstance(entry[k], str) and entry[k] for k in ("rule", "reason"))):
            raise DatasetError(f"{where}: audit[{i}] must be {{rule: string, action: one of {AUDIT_ACTIONS}, reason: string}}, got {entry!r:.80}")


def _parse_item(raw: Any, where: str) -> Item:
    if not isinstance(raw, dict):
        raise DatasetError(f"{where}: an item must be a JSON object, got {type(raw).__name__} {raw!r:.40}")
    missing = [name for name in _ITEM_FIELDS if name not in raw]
    if missing:
        raise DatasetError(f"{where}: item is missing fields {missing}")
    for name in _STRING_FIELDS:
        if not isinstance(raw[name], str) or not raw[name]:
            raise DatasetError(f"{where}: field {name!r} must be a non-empty string, got {raw[name]!r:.40}")
    if RECORD_ID_SEPARATOR in raw["id"]:
        raise DatasetError(f"{where}: item id {raw['id']!r} holds {RECORD_ID_SEPARATOR!r}, which joins the parts of a record id "
                           f"(item{RECORD_ID_SEPARATOR}config{RECORD_ID_SEPARATOR}k{RECORD_ID_SEPARATOR}format): rename the item without it")
    for name in _NAME_LIST_FIELDS:
        if not isinstance(raw[name], list) or not all(isinstance(v, str) for v in raw[name]):
            raise DatasetError(f"{where}: field {name!r} must be a list of strings, got {raw[name]!r:.60}")
    _check_history(raw["history"], where)
    if raw.get("scenario") is not None and (not isinstance(raw["scenario"], str) or not raw["scenario"]):
        raise DatasetError(f"{where}: field 'scenario' must be a non-empty string (or leave the field out), got {raw['scenario']!r:.40}")
    _check_history(raw.get("context", []), where, "context", ("user", "assistant", "tool"))
    if raw["bucket"] not in BUCKETS:
        raise DatasetError(f"{where}: bucket {raw['bucket']!r} is not one of {BUCKETS}")
    if raw["split"] not in SPLITS:
        raise DatasetError(f"{where}: split {raw['split']!r} is not one of {SPLITS}")
    if raw.get("split_scenario") is not None and raw["split_scenario"] not in SPLITS:
        raise DatasetError(f"{where}: split_scenario {raw['split_scenario']!r} is not one of {SPLITS} (or leave the field out)")
    for name in ("category", "match_id"):
        if raw.get(name) is not None and (not isinstance(raw[name], str) or not raw[name]):
            raise DatasetError(f"{where}: field {name!r} must be a non-empty string (or leave it out), got {raw[name]!r:.40}")
    if raw.get("audit") is not None:
        check_audit(raw["audit"], where)
    action = raw["correct_action"]
    if not isinstance(action, dict):
        raise DatasetError(f"{where}: correct_action must be {{kind: call, tool}} or {{kind: abstain}}, got {action!r:.60}")
    if action.get("kind") == "abstain":
        correct, arguments = ABSTAIN, None
    elif action.get("kind") == "call" and isinstance(action.get("tool"), str) and isinstance(action.get("arguments", {}), dict):
        correct, arguments = action["tool"], action.get("arguments")
    else:
        raise DatasetError(f"{where}: correct_action must be {{kind: call, tool, arguments?: object}} or {{kind: abstain}}, got {action}")
    return Item(
        id=raw["id"],
        bucket=raw["bucket"],
        split=raw["split"],
        domain=raw["domain"],
        task_group=raw["task_group"],
        catalog_domains=tuple(raw["catalog_domains"]),
        unavailable_tools=tuple(raw["unavailable_tools"]),
        user=raw["user"],
        history=tuple(raw["history"]),
        correct_action=correct,
        correct_arguments=arguments,
        wrong_tools=tuple(raw["wrong_tools"]),
        tempting_skill=raw["tempting_skill"],
        state_cues=tuple(raw["state_cues"]),
        context=tuple(raw.get("context", [])),
        split_scenario=raw.get("split_scenario"),
        scenario=raw.get("scenario"),
        category=raw.get("category"),
        match_id=raw.get("match_id"),
        audit=None if raw.get("audit") is None else tuple(dict(entry) for entry in raw["audit"]),
    )


@dataclass(frozen=True)
class Domain:
    name: str
    description: str
    catalog: ToolCatalog
    library: LibraryReport
    digest: str = ""  # SHA-256 of the domain file (tools and skills), for results fingerprints


@dataclass(frozen=True)
class ProbeDataset:
    """Domains, their validated skill libraries, and the decision items."""

    root: Path
    domains: Mapping[str, Domain]
    items: tuple[Item, ...]

    def texts(self) -> Iterator[tuple[str, str, str, str]]:
        """(kind, owner, field, text) of every text of the dataset: each item's fields (kind "item", owner
        its id), each domain's tools and skills (kind "domain", owner the domain name), keys included."""
        for item in self.items:
            for field, text in texts_of(vars(item), ""):
                yield "item", item.id, field, text
        for name, domain in self.domains.items():
            for tool in domain.catalog:
                for field, text in texts_of({"name": tool.name, "description": tool.description, "parameters": tool.parameters}, ""):
                    yield "domain", name, f"tools[{tool.name!r}].{field}", text
            for skill in domain.library.skills:
                for field, text in texts_of(skill.to_json(), ""):
                    yield "domain", name, f"skills[{skill.id!r}].{field}", text

    @cached_property
    def all_text(self) -> str:
        """Every text of the dataset (:meth:`texts`) joined by NUL: the one string a search for control
        strings screens before it walks the texts one by one."""
        return "\0".join(text for *_, text in self.texts())

    def chat_tokens(self, pattern: re.Pattern[str]) -> list[FoundToken]:
        """Every place a text of the dataset holds a match of ``pattern`` (the first match of each text;
        :mod:`probes.data.chat_tokens`). The texts are walked only when :attr:`all_text` holds a
        match: a clean dataset costs one search per pattern."""
        if not pattern.search(self.all_text):
            return []
        return [FoundToken(kind, owner, field, match.group()) for kind, owner, field, text in self.texts()
                if (match := pattern.search(text))]

    @cached_property
    def skills(self) -> dict[str, Skill]:
        return {skill.id: skill for domain in self.domains.values() for skill in domain.library.skills}

    def catalog_for(self, item: Item) -> ToolCatalog:
        """The tools shown to the model for ``item``: its catalog domains minus unavailable tools."""
        tools = tuple(tool for name in item.catalog_domains for tool in self.domains[name].catalog)
        return ToolCatalog(tools).without(item.unavailable_tools)

    def library_for(self, item: Item) -> tuple[Skill, ...]:
        """Skills retrievable for ``item``: those of its catalog domains."""
        return tuple(skill for name in item.catalog_domains for skill in self.domains[name].library.skills)

    def content_digest(self, items: Iterable[Item]) -> str:
        """Hash of the content that prompts of ``items`` are built from: every field of every item
        and the domain files of their catalogs (editing an item's text changes it)."""
        items = list(items)
        # an absent optional field is left out, so datasets without it keep their digests
        fields = [{k: v for k, v in asdict(item).items() if not (k in OPTIONAL_FIELDS and v is None)} for item in items]
        h = hashlib.sha256(json.dumps(fields, sort_keys=True, default=list).encode())
        for name in sorted({name for item in items for name in item.catalog_domains}):
            h.update(f"{name}\0{self.domains[name].digest}\n".encode())
        return h.hexdigest()[:16]

    def select(
        self,
        *,
        buckets: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        split: str | None = None,
        split_kind: str = "template",
        ids: Iterable[str] | None = None,
        limit_per_bucket: int | None = None,
        spread: bool = False,
    ) -> tuple[Item, ...]:
        """Filter items; ``limit_per_bucket`` keeps N items of each bucket: with ``spread``,
        round-robin over task groups (:func:`spread_limit`; what every analysis's ``--limit``
        does, through :func:`probes.analyses.run_context.select_items`), else the first N in file order (fixtures:
        usually a single task group). The result is in file order.

        ``split_kind``: ``"template"`` filters ``split`` on the item field ``split`` (task groups,
        i.e. templates, held out); ``"scenario"`` on ``split_scenario`` (whole scenarios held out),
        an error for a dataset whose items lack that field."""
        if split_kind not in SPLIT_KINDS:
            raise ValueError(f"split_kind must be one of {SPLIT_KINDS}, got {split_kind!r}")
        if split is not None and split_kind == "scenario" and any(item.split_scenario is None for item in self.items):
            raise ValueError(f"{self.root}: split_kind='scenario' needs the item field 'split_scenario', which this dataset's items lack")
        split_field = "split" if split_kind == "template" else "split_scenario"
        buckets = set(buckets) if buckets is not None else None
        domains = set(domains) if domains is not None else None
        ids = set(ids) if ids is not None else None
        for name, chosen, known in (("bucket", buckets, set(BUCKETS)), ("domain", domains, set(self.domains))):
            if chosen is not None and not chosen <= known:
                raise ValueError(f"unknown {name}(s) {sorted(chosen - known)}; known: {sorted(known)}")
        chosen_items = [
            item for item in self.items
            if (buckets is None or item.bucket in buckets)
            and (domains is None or item.domain in domains)
            and (split is None or getattr(item, split_field) == split)
            and (ids is None or item.id in ids)
        ]
        if ids is not None and (unknown := ids - {item.id for item in chosen_items}):
            raise ValueError(f"unknown or filtered-out item id(s) {sorted(unknown)}")
        if limit_per_bucket is not None and spread:
            chosen_items = spread_limit(chosen_items, limit_per_bucket)
        elif limit_per_bucket is not None:
            counts: Counter[str] = Counter()
            kept = []
            for item in chosen_items:
                if counts[item.bucket] < limit_per_bucket:
                    counts[item.bucket] += 1
                    kept.append(item)
            chosen_items = kept
        return tuple(chosen_items)


def spread_limit(items: Sequence[Item], limit: int) -> list[Item]:
    """``limit`` items per bucket taken round-robin over task groups: the first item of every
    group (groups in file order), then the second, ... The result keeps file order.

    Items of one task group share a template, and CIs resample task groups: the first N items
    in file order are usually a single group, whose CI has zero width. This is the one
    implementation of ``--limit``: every analysis selects its items through
    :func:`probes.analyses.run_context.select_items`, i.e. ``ProbeDataset.select(..., spread=True)``.
    """
    if limit < 0:
        raise ValueError(f"limit must be ≥ 0, got {limit}")
    kept: set[int] = set()  # positions in ``items``
    for bucket in dict.fromkeys(item.bucket for item in items):
        queues: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            if item.bucket == bucket:
                queues.setdefault(item.task_group, []).append(i)
        depth = 0
        chosen = 0
        while chosen < limit and any(depth < len(q) for q in queues.values()):
            for queue in queues.values():
                if depth < len(queue) and chosen < limit:
                    kept.add(queue[depth])
                    chosen += 1
            depth += 1
    return [item for i, item in enumerate(items) if i in kept]


def _check_item_references(item: Item, dataset: ProbeDataset, where: str) -> None:
    unknown_domains = [name for name in item.catalog_domains if name not in dataset.domains]
    if unknown_domains:
        raise DatasetError(f"{where}: unknown catalog domain(s) {unknown_domains}")
    shown = dataset.catalog_for(item)
    if item.correct_action != ABSTAIN and item.correct_action not in shown:
        raise DatasetError(f"{where}: correct tool {item.correct_action!r} is not in the shown catalog")
    hidden = [name for name in item.wrong_tools if name not in shown]
    if hidden:
        raise DatasetError(f"{where}: wrong tool(s) {hidden} are not in the shown catalog")
    _check_scorable(item, where)
    if item.tempting_skill not in dataset.skills:
        raise DatasetError(f"{where}: tempting skill {item.tempting_skill!r} is not in any (valid) skill library")


def _check_scorable(item: Item, where: str) -> None:
    """The wrong-tool margin of Eq. 1 needs at least one wrong tool, none of them the correct action
    (else every margin of the item is undefined, or the scoring fails after the model is loaded)."""
    if not item.wrong_tools:
        raise DatasetError(f"{where}: field 'wrong_tools' is empty; the wrong-tool margin needs at least one wrong tool "
                           "of the shown catalog")
    if item.correct_action in item.wrong_tools:
        raise DatasetError(f"{where}: field 'wrong_tools' holds the correct tool {item.correct_action!r}; "
                           "a tool cannot be both the correct and a wrong action")
    if len(set(item.wrong_tools)) < len(item.wrong_tools):
        repeated = sorted({name for name in item.wrong_tools if item.wrong_tools.count(name) > 1})
        raise DatasetError(f"{where}: field 'wrong_tools' lists {repeated} more than once")


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DatasetError(f"{where}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column {error.start + 1}); "
                           "save the file as UTF-8") from None


BUNDLED_DATASETS: tuple[str, ...] = ("basm_probe", "basm_probe_v2", "bfcl")


def resolve_dataset(spec: str | Path) -> Path:
    """A dataset folder: ``spec`` itself where that folder exists, else the bundled dataset of that
    name (``basm_probe``, ``basm_probe_v2``, ``bfcl``); the resolved folder is what results record."""
    path = Path(spec)
    if path.exists() or str(spec) not in BUNDLED_DATASETS:
        return path
    return bundled_dataset(str(spec))


def load_dataset(root: str | Path, *, strict: bool = True) -> ProbeDataset:
    """Load and validate the dataset at a folder or of a bundled name (:func:`resolve_dataset`).
    With ``strict``, a skill rejected by ψ is an error."""
    root = resolve_dataset(root)
    domain_dir = root / "domains"
    items_path = root / "items.jsonl"
    if not domain_dir.is_dir() or not items_path.is_file():
        raise DatasetError(f"{root} is not a probe dataset: expected {domain_dir}/ and {items_path} "
                           f"(or a bundled dataset name: {', '.join(BUNDLED_DATASETS)})")
    domains: dict[str, Domain] = {}
    domain_files: dict[str, Path] = {}
    for path in sorted(domain_dir.glob("*.json")):
        text = path.read_bytes()
        for line_number, raw_line in enumerate(text.split(b"\n"), start=1):
            _decode(raw_line, f"{path}:{line_number}")
        try:
            raw = json.loads(text.decode("utf-8"))
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path}: invalid JSON: {error}") from error
        if not isinstance(raw, dict):
            raise DatasetError(f"{path}: a domain file must be a JSON object with 'tools' and 'skills', got {type(raw).__name__}")
        name = raw.get("domain", path.stem)
        try:
            catalog = ToolCatalog(tools_from_json(raw.get("tools", []), domain=name))
        except ValueError as error:
            raise DatasetError(f"{path}: {error}") from error
        library = build_library(raw.get("skills", []), catalog, domain=name)
        if strict and library.rejected:
            raise DatasetError(f"{path}: {library.summary()}")
        domains[name] = Domain(name, raw.get("description", ""), catalog, library, hashlib.sha256(path.read_bytes()).hexdigest())
        domain_files[name] = path
    items = []
    lines: dict[str, str] = {}  # item id -> "file:line", for the reference checks
    for line_number, raw_line in enumerate(items_path.read_bytes().splitlines(), start=1):
        where = f"{items_path}:{line_number}"
        line = _decode(raw_line, where)
        if not line.strip():
            continue
        try:
            raw_item = json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{where}: invalid JSON: {error}") from error
        items.append(_parse_item(raw_item, where))
        lines[items[-1].id] = where
    if not items:
        raise DatasetError(f"{items_path} holds no items (the file is empty)")
    dataset = ProbeDataset(root, domains, tuple(items))
    duplicate_ids = sorted(item_id for item_id, count in Counter(item.id for item in items).items() if count > 1)
    if duplicate_ids:
        raise DatasetError(f"{items_path}: duplicate item ids {duplicate_ids[:5]}")
    for item in items:
        _check_item_references(item, dataset, f"{lines[item.id]} (item {item.id})")
    refuse_chat_tokens(dataset, dataset.chat_tokens(COMMON_CHAT_TOKENS), COMMON_SOURCE,
                       lambda found: f"{lines[found.owner]} (item {found.owner})" if found.kind == "item" else str(domain_files[found.owner]))
    return dataset


def refuse_chat_tokens(dataset: ProbeDataset, found: Sequence[FoundToken], source: str,
                       where: Callable[[FoundToken], str] | None = None) -> None:
    """Raise a :class:`DatasetError` naming the first control string ``found`` in ``dataset`` (of
    ``source``) at ``where(found)`` (default: the dataset folder and the item or domain), and how
    many more there are."""
    if not found:
        return
    first = found[0]
    at = where(first) if where else f"{dataset.root} ({first.kind} {first.owner})"
    more = f" ({len(found) - 1} more texts of this dataset hold control strings)" if len(found) > 1 else ""
    raise DatasetError(first.message(at, source) + more)


def task_groups(items: Sequence[Item]) -> list[str]:
    """Group labels for task-disjoint cross-validation."""
    return [item.task_group for item in items]


FOLD_GROUPS = ("task_group", "scenario")


def fold_groups(items: Sequence[Item], kind: str = "task_group") -> list[str]:
    """The groups of grouped cross-validation folds: ``"task_group"`` (a test item's template never in
    training) or ``"scenario"`` (its whole scenario, every template of it, never in training). Scenario
    folds need the item field ``scenario`` (e.g. basm_probe_v2) and task groups nested in scenarios;
    otherwise an error that says so."""
    if kind not in FOLD_GROUPS:
        raise ValueError(f"fold groups must be one of {FOLD_GROUPS}, got {kind!r}")
    if kind == "task_group":
        return task_groups(items)
    missing = [item.id for item in items if item.scenario is None]
    if missing:
        raise ValueError(f"scenario-disjoint folds need the item field 'scenario', which {len(missing)} of {len(items)} items lack "
                         f"(e.g. {missing[0]}); datasets with it: basm_probe_v2. Use task-group folds here.")
    owner: dict[str, str] = {}
    for item in items:
        if owner.setdefault(item.task_group, item.scenario) != item.scenario:
            raise ValueError(f"task group {item.task_group} spans scenarios {owner[item.task_group]!r} and {item.scenario!r}: "
                             "scenario folds would split it")
    return [item.scenario for item in items]
CARD_NAME = "CARD.md"  # a dataset folder's measured card (probes.reporting.cards)
AUDIT_FILE = "audit.jsonl"  # items a label audit dropped: {id, bucket, category?, source, audit} per line


def audit_records(dataset: ProbeDataset) -> list[dict[str, Any]]:
    """Every audited label of ``dataset``: one row ``{id, bucket, category, rule, action, reason}`` per
    audit entry of an item (kept, relabelled) and per item in ``<root>/audit.jsonl`` (dropped, so not
    among the items), in file order. Empty for a dataset without an audit."""
    rows = [{"id": item.id, "bucket": item.bucket, "category": item.category, **entry} for item in dataset.items for entry in item.audit or ()]
    path = dataset.root / AUDIT_FILE
    ids = {item.id for item in dataset.items}
    if path.is_file():
        for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as error:
                raise DatasetError(f"{where}: invalid JSON: {error}") from error
            if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or raw.get("bucket") not in BUCKETS:
                raise DatasetError(f"{where}: a dropped item needs a string 'id' and a bucket of {BUCKETS}, got {raw!r:.80}")
            check_audit(raw.get("audit"), where)
            if raw["id"] in ids:
                raise DatasetError(f"{where}: {raw['id']} is listed as dropped but is still among the items")
            rows += [{"id": raw["id"], "bucket": raw["bucket"], "category": raw.get("category"), **entry} for entry in raw["audit"]]
    return rows
