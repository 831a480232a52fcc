"""Locating and loading BFCL's multi-turn data: the category files with their ground truth joined
in, each API class's function docs as JSON Schema tools, and the split of entry indices."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.data.bfcl_exec import load_api_classes
from probes.data.dataset import DatasetError
from probes.data.schema import ToolCatalog, tools_from_json

CATEGORIES: tuple[str, ...] = ("base", "long_context", "miss_func", "miss_param")
# The categories skills are extracted from (the successes of base, the boundary evidence of the other two).
SKILL_CATEGORIES: tuple[str, ...] = ("base", "miss_func", "miss_param")
# BFCL's constants.default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC (FC mode).
ADDED_FUNCTION_PROMPT = "I have updated some more functions you can choose from. What about now?"
# BFCL's multi_turn_func_doc file per class (constants.executable_backend_config).
FUNC_DOC_FILES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
# BFCL's Python-style type names → JSON Schema (the FC handlers do the same conversion).
SCHEMA_TYPES: dict[str, str] = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


class BFCLDataError(DatasetError):
    """The BFCL data are missing or malformed; the message names the file and what to do."""


def locate_bfcl_data(bfcl_dir: str | Path | None = None) -> Path:
    """The BFCL data directory (holding ``BFCL_v*_multi_turn_base.json`` and ``possible_answer/``).

    ``bfcl_dir`` may be that directory or the ``bfcl_eval`` package root; by default the installed
    ``bfcl_eval`` package is located without importing it (its runtime needs pins we do not have).
    """
    if bfcl_dir is None:
        spec = importlib.util.find_spec("bfcl_eval")
        if spec is None or not spec.submodule_search_locations:
            raise BFCLDataError("the BFCL data need the 'bfcl-eval' package: pip install --no-deps bfcl-eval "
                                "(or pass bfcl_dir=<its bfcl_eval folder or data folder>)")
        bfcl_dir = Path(next(iter(spec.submodule_search_locations)))
    root = Path(bfcl_dir)
    for candidate in (root, root / "data"):
        if list(candidate.glob("BFCL_v*_multi_turn_base.json")) and (candidate / "possible_answer").is_dir():
            return candidate
    raise BFCLDataError(f"{root} holds no BFCL multi-turn data (BFCL_v*_multi_turn_base.json and possible_answer/); "
                        "install it with: pip install --no-deps bfcl-eval, or pass the bfcl_eval/data folder")


def api_source_dir(data_dir: Path) -> Path:
    """``bfcl_eval/eval_checker/multi_turn_eval/func_source_code`` next to ``data_dir``."""
    path = Path(data_dir).parent / "eval_checker" / "multi_turn_eval" / "func_source_code"
    if not path.is_dir():
        raise BFCLDataError(f"BFCL's API classes are not at {path}; reinstall with: pip install --no-deps bfcl-eval")
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise BFCLDataError(f"{path}:{number}: invalid JSON: {error}") from error
    return rows


def category_file(data_dir: Path, category: str, *, answers: bool = False) -> Path:
    """The (single) ``BFCL_v*_multi_turn_<category>.json`` file, or its possible answers."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; known: {CATEGORIES}")
    folder = Path(data_dir) / "possible_answer" if answers else Path(data_dir)
    matches = sorted(folder.glob(f"BFCL_v*_multi_turn_{category}.json"))
    if len(matches) != 1:
        raise BFCLDataError(f"expected one BFCL_v*_multi_turn_{category}.json in {folder}, found {[m.name for m in matches]}")
    return matches[0]


def entry_index(entry_id: str) -> int:
    """``multi_turn_miss_func_17`` → 17."""
    match = re.fullmatch(r"multi_turn_[a-z_]+_(\d+)", entry_id)
    if not match:
        raise BFCLDataError(f"unexpected BFCL entry id {entry_id!r} (expected multi_turn_<category>_<n>)")
    return int(match.group(1))


def load_entries(data_dir: Path, category: str) -> list[dict[str, Any]]:
    """Entries of one category with their ground truth joined in (``entry["ground_truth"]``)."""
    path = category_file(data_dir, category)
    answers_path = category_file(data_dir, category, answers=True)
    entries = _read_jsonl(path)
    answers = {row["id"]: row["ground_truth"] for row in _read_jsonl(answers_path)}
    for entry in entries:
        if entry["id"] not in answers:
            raise BFCLDataError(f"{answers_path}: no ground truth for {entry['id']}")
        truth = answers[entry["id"]]
        if len(truth) != len(entry["question"]):
            raise BFCLDataError(f"{answers_path}: {entry['id']} has {len(truth)} ground-truth turns for {len(entry['question'])} question turns")
        entry["ground_truth"] = truth
    return entries


def convert_schema(node: Any) -> Any:
    """BFCL's parameter schema → JSON Schema: ``dict`` → ``object``, ``float`` → ``number``, ...,
    applied to every nested schema (properties, items, additionalProperties)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(out.get("type"), str):
        out["type"] = SCHEMA_TYPES.get(out["type"], out["type"])
    if isinstance(out.get("properties"), dict):
        out["properties"] = {name: convert_schema(sub) for name, sub in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = convert_schema(out[key])
    return out


def load_tools(data_dir: Path, class_name: str) -> list[dict[str, Any]]:
    """One class's function docs as tool objects ``{name, description, parameters}`` (JSON Schema)."""
    path = Path(data_dir) / "multi_turn_func_doc" / FUNC_DOC_FILES[class_name]
    if not path.is_file():
        raise BFCLDataError(f"BFCL function docs {path} are missing; reinstall with: pip install --no-deps bfcl-eval")
    return [
        {"name": doc["name"], "description": doc["description"], "parameters": convert_schema(doc["parameters"])}
        for doc in _read_jsonl(path)
    ]


def tool_summary(description: str) -> str:
    """The function's own sentence from a BFCL description (after the class preamble)."""
    marker = "Tool description:"
    text = description.split(marker, 1)[1] if marker in description else description
    return " ".join(text.split())


def split_indices(indices: Iterable[int], *, skill_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(skill-source indices, probe indices): a seeded permutation, the first ``skill_fraction`` to skills."""
    if not 0.0 < skill_fraction < 1.0:
        raise ValueError(f"skill_fraction must be in (0, 1), got {skill_fraction}")
    ordered = sorted(set(indices))
    shuffled = list(ordered)
    random.Random(seed).shuffle(shuffled)
    n_skill = round(skill_fraction * len(ordered))
    return sorted(shuffled[:n_skill]), sorted(shuffled[n_skill:])


def data_version(data_dir: Path) -> str:
    """Content hash of BFCL's multi-turn files and their answers (the README states it)."""
    digest = hashlib.sha256()
    for category in CATEGORIES:
        for answers in (False, True):
            digest.update(category_file(data_dir, category, answers=answers).read_bytes())
    return digest.hexdigest()[:16]


@dataclass
class BFCLSource:
    """What an import reads of BFCL: the data folder, the API classes, each class's tools (and
    their catalog) and the entries of the categories it uses, every category holding the same
    entry indices."""

    data_dir: Path
    classes: dict[str, type]
    tools: dict[str, list[dict[str, Any]]]  # BFCL class (domain) -> tool objects
    entries: dict[str, list[dict[str, Any]]]  # category -> entries with their ground truth
    catalogs: dict[str, ToolCatalog]  # domain -> its tools as a catalog (ψ checks skills against it; item arguments are validated with it)

    @classmethod
    def load(cls, bfcl_dir: str | Path | None, categories: Sequence[str]) -> BFCLSource:
        """The data of ``categories`` and of :data:`SKILL_CATEGORIES` (``bfcl_dir``: see :func:`locate_bfcl_data`)."""
        data_dir = locate_bfcl_data(bfcl_dir)
        classes = load_api_classes(api_source_dir(data_dir))
        tools = {domain: load_tools(data_dir, domain) for domain in FUNC_DOC_FILES}
        names = [tool["name"] for entries in tools.values() for tool in entries]
        if len(names) != len(set(names)):
            raise BFCLDataError(f"BFCL tool names collide across classes: {sorted({n for n in names if names.count(n) > 1})}")
        entries = {category: load_entries(data_dir, category) for category in sorted(set(categories) | set(SKILL_CATEGORIES))}
        catalogs = {domain: ToolCatalog(tools_from_json(tools[domain], domain=domain)) for domain in tools}
        source = cls(data_dir, classes, tools, entries, catalogs)
        for category, rows in entries.items():
            if {entry_index(entry["id"]) for entry in rows} != source.indices:
                raise BFCLDataError(f"category {category} does not hold the same entry indices as base")
        return source

    @property
    def indices(self) -> set[int]:
        """The entry indices (the same in every category)."""
        return {entry_index(entry["id"]) for entry in self.entries["base"]}

    @property
    def catalog_names(self) -> dict[str, tuple[str, ...]]:
        """Each domain's tool names, in BFCL's order."""
        return {domain: tuple(tool["name"] for tool in entries) for domain, entries in self.tools.items()}

    def tool(self, name: str) -> dict[str, Any]:
        """The tool object named ``name`` (names are unique across the classes)."""
        return next(tool for entries in self.tools.values() for tool in entries if tool["name"] == name)

    def entries_of(self, categories: Iterable[str], indices: set[int]) -> Iterable[tuple[str, dict[str, Any]]]:
        """(category, entry) of ``categories`` whose index is in ``indices``, category by category, in file order."""
        return ((category, entry) for category in categories for entry in self.entries[category] if entry_index(entry["id"]) in indices)
