"""Seven-slot skill schema (paper §4.1, Eq. 4) and the deterministic validation operator ψ (§4.2).

A skill is ``s = (g, π, T, A, R, N, F)``: goal, procedure, tools, applicability, risk cues,
avoidance rules and recovery notes. The first three slots are the procedural component, the
last four the boundary component ``B(s) = A ⊕ R ⊕ N ⊕ F`` (Eq. 5).

ψ accepts raw extractor output (a JSON string or an already-parsed mapping) and either returns a
:class:`Skill` or raises :class:`SkillValidationError` whose ``problems`` name every failing field.
:func:`build_library` applies ψ to many candidates and keeps the valid ones (Eq. 7).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

PROCEDURAL_SLOTS: tuple[str, ...] = ("goal", "procedure", "tools")
BOUNDARY_SLOTS: tuple[str, ...] = ("applicability", "risk_cues", "avoidance_rules", "recovery_notes")
SLOTS: tuple[str, ...] = PROCEDURAL_SLOTS + BOUNDARY_SLOTS
# ψ demands evidence in these two boundary slots; the other two may be empty lists.
NON_EMPTY_BOUNDARY_SLOTS: tuple[str, ...] = ("risk_cues", "avoidance_rules")

# A quotation: a double-quoted span of at least QUOTE_MIN_WORDS words (a request or an error
# message, not a quoted name). ψ rejects one quoted in two slots: each slot has its own role, and a
# request shown as a success example and as a risk cue says both "do it" and "beware".
QUOTATION = re.compile(r'"([^"]+)"')
QUOTE_MIN_WORDS = 4
# An applicability condition that states a tool is available (with the tool's name): availability
# is a property of each item's catalog, which a library skill cannot know, so a held-out tool's
# skill would claim what the item denies. ψ rejects it.
AVAILABILITY = re.compile(r"\bavailable\b|\bamong the (?:\w+ )?(?:functions|tools)\b|\bin the (?:function|tool)s? (?:list|catalog)\b", re.I)

SLOT_LABELS: dict[str, str] = {
    "goal": "Goal",
    "procedure": "Procedure",
    "tools": "Tools",
    "applicability": "Applicability",
    "risk_cues": "Risk cues",
    "avoidance_rules": "Avoidance rules",
    "recovery_notes": "Recovery notes",
}


@dataclass(frozen=True)
class Tool:
    """One callable function: OpenAI/Qwen function schema."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    domain: str = ""

    def as_function_schema(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` object chat templates expect."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def validate_arguments(self, arguments: Mapping[str, Any]) -> list[str]:
        """Return one message per JSON-Schema violation of ``arguments`` (empty when valid)."""
        validator = jsonschema.Draft202012Validator(dict(self.parameters))
        return [
            f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
            for error in sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
        ]


@dataclass(frozen=True)
class ToolCatalog:
    """A set of tools addressable by name."""

    tools: tuple[Tool, ...]

    def __post_init__(self) -> None:
        names = [tool.name for tool in self.tools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tool catalog has duplicate tool names: {duplicates}")

    def __contains__(self, name: object) -> bool:
        return any(tool.name == name for tool in self.tools)

    def __getitem__(self, name: str) -> Tool:
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(f"tool {name!r} is not in the catalog")

    def __iter__(self):
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tool.name for tool in self.tools)

    def without(self, names: Iterable[str]) -> "ToolCatalog":
        removed = set(names)
        return ToolCatalog(tuple(tool for tool in self.tools if tool.name not in removed))


@dataclass(frozen=True)
class ToolUse:
    """A tool named by a skill, optionally with example arguments."""

    name: str
    arguments: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Skill:
    """A validated seven-slot boundary-aware skill."""

    id: str
    goal: str
    procedure: tuple[str, ...]
    tools: tuple[ToolUse, ...]
    applicability: tuple[str, ...]
    risk_cues: tuple[str, ...]
    avoidance_rules: tuple[str, ...]
    recovery_notes: tuple[str, ...]
    domain: str = ""

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(tool.name for tool in self.tools)

    def slot_items(self, slot: str) -> tuple[str, ...]:
        """A slot's content as a tuple of text items (``goal`` is a one-item tuple)."""
        if slot == "goal":
            return (self.goal,)
        if slot == "tools":
            return self.tool_names
        if slot not in SLOTS:
            raise KeyError(f"unknown slot {slot!r}; expected one of {SLOTS}")
        return getattr(self, slot)

    def boundary_text(self) -> str:
        """``B(s)`` of Eq. 5: the ordered composition of the four boundary slots."""
        return " ".join(item for slot in BOUNDARY_SLOTS for item in self.slot_items(slot))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "goal": self.goal,
            "procedure": list(self.procedure),
            "tools": [
                tool.name if tool.arguments is None else {"name": tool.name, "arguments": dict(tool.arguments)}
                for tool in self.tools
            ],
            **{slot: list(getattr(self, slot)) for slot in BOUNDARY_SLOTS},
        }


@dataclass
class SkillValidationError(ValueError):
    """ψ rejected a candidate skill. ``problems`` maps a field (or ``<json>``) to its reasons."""

    skill_id: str
    problems: dict[str, list[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        details = "; ".join(f"{name}: {' | '.join(reasons)}" for name, reasons in self.problems.items())
        return f"skill {self.skill_id!r} rejected by ψ: {details}"


def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-standard JSON constant {token}")


def _parse_strict_json(raw: str) -> Any:
    """Strict JSON: no NaN/Infinity, no duplicate keys, no trailing garbage."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        duplicated = sorted({key for key in keys if keys.count(key) > 1})
        if duplicated:
            raise ValueError(f"duplicate keys {duplicated}")
        return dict(pairs)

    return json.loads(raw, parse_constant=_reject_constant, object_pairs_hook=no_duplicates)


def _check_text(value: Any) -> list[str]:
    if not isinstance(value, str):
        return [f"must be a string, got {type(value).__name__}"]
    if not value.strip():
        return ["must be a non-empty string"]
    return []


def _check_text_list(value: Any, *, non_empty: bool) -> list[str]:
    if not isinstance(value, list):
        return [f"must be a list of strings, got {type(value).__name__}"]
    problems = []
    if non_empty and not value:
        problems.append("must be a non-empty list")
    for index, item in enumerate(value):
        problems.extend(f"item {index} {reason}" for reason in _check_text(item))
    return problems


def _check_tools(value: Any, catalog: ToolCatalog) -> tuple[list[str], tuple[ToolUse, ...]]:
    if not isinstance(value, list):
        return [f"must be a list of tool names or {{name, arguments}} objects, got {type(value).__name__}"], ()
    if not value:
        return ["must name at least one tool"], ()
    problems: list[str] = []
    uses: list[ToolUse] = []
    for index, entry in enumerate(value):
        if isinstance(entry, str):
            name, arguments = entry, None
        elif isinstance(entry, dict) and set(entry) <= {"name", "arguments"} and isinstance(entry.get("name"), str):
            name, arguments = entry["name"], entry.get("arguments")
            if arguments is not None and not isinstance(arguments, dict):
                problems.append(f"item {index} ({name}): arguments must be an object")
                continue
        else:
            problems.append(f"item {index} must be a tool name or an object with 'name' and optional 'arguments'")
            continue
        if name not in catalog:
            problems.append(f"item {index}: tool {name!r} does not exist in the tool catalog")
            continue
        if arguments is not None:
            problems.extend(f"item {index} ({name}) arguments {msg}" for msg in catalog[name].validate_arguments(arguments))
        uses.append(ToolUse(name, arguments))
    return problems, tuple(uses)


def _quotation_key(text: str) -> str:
    """A quotation compared across slots: whitespace-normalised, lower case, without a trailing cut mark."""
    return " ".join(text.split()).lower().removesuffix(" ...").removesuffix("...")


def repeated_quotations(data: Mapping[str, Any]) -> list[str]:
    """One message per quotation (:data:`QUOTATION`) that stands in two or more slots, one being
    equal to the other or its cut-off start."""
    found: list[tuple[str, str]] = []  # (key, slot)
    for slot in ("goal", "procedure", *BOUNDARY_SLOTS):
        value = data.get(slot)
        for item in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
            if isinstance(item, str):
                found += [(_quotation_key(q), slot) for q in QUOTATION.findall(item) if len(q.split()) >= QUOTE_MIN_WORDS]
    problems = []
    for i, (key, slot) in enumerate(found):
        others = sorted({s for k, s in found[i + 1:] if s != slot and (k.startswith(key) or key.startswith(k))})
        if others:
            problems.append(f"the quotation \"{key[:60]}\" stands in {slot} and in {', '.join(others)}")
    return list(dict.fromkeys(problems))


def availability_claims(applicability: Sequence[Any], catalog: ToolCatalog) -> list[str]:
    """One message per applicability condition that states a catalog tool is available (:data:`AVAILABILITY`)."""
    problems = []
    for index, item in enumerate(applicability):
        if isinstance(item, str) and AVAILABILITY.search(item):
            named = [name for name in catalog.names if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", item)]
            if named:
                problems.append(f"item {index} states that {', '.join(named)} is available: availability belongs to each item's catalog")
    return problems


def validate_skill(raw: str | Mapping[str, Any], catalog: ToolCatalog, *, domain: str = "") -> Skill:
    """The validation operator ψ: return a :class:`Skill` or raise :class:`SkillValidationError`.

    Checks, in order: strict JSON parsing; a JSON object; required fields present and no unknown
    fields; goal a non-empty string; procedure a non-empty list of strings; list-valued boundary
    slots; non-empty risk cues and avoidance rules; every tool exists in ``catalog`` and, where
    arguments are given, they validate against the tool's JSON schema. Two checks beyond §4.2's:
    no quotation stands in two slots (:func:`repeated_quotations`), and no applicability condition
    states that a tool is available (:func:`availability_claims`).
    """
    if isinstance(raw, str):
        try:
            data = _parse_strict_json(raw)
        except ValueError as error:
            raise SkillValidationError("<unparsed>", {"<json>": [f"not strict JSON: {error}"]}) from error
    else:
        data = raw
    if not isinstance(data, Mapping):
        raise SkillValidationError("<unparsed>", {"<json>": [f"must be a JSON object, got {type(data).__name__}"]})

    skill_id = data.get("id")
    problems: dict[str, list[str]] = {}
    if not isinstance(skill_id, str) or not skill_id.strip():
        problems["id"] = ["must be a non-empty string"]
        skill_id = "<missing id>"
    for name in SLOTS:
        if name not in data:
            problems[name] = ["required field is missing"]
    unknown = sorted(set(data) - set(SLOTS) - {"id"})
    if unknown:
        problems["<json>"] = [f"unknown fields {unknown}"]

    if "goal" in data and (reasons := _check_text(data["goal"])):
        problems["goal"] = reasons
    if "procedure" in data and (reasons := _check_text_list(data["procedure"], non_empty=True)):
        problems["procedure"] = reasons
    tool_uses: tuple[ToolUse, ...] = ()
    if "tools" in data:
        reasons, tool_uses = _check_tools(data["tools"], catalog)
        if reasons:
            problems["tools"] = reasons
    for slot in BOUNDARY_SLOTS:
        if slot in data:
            reasons = _check_text_list(data[slot], non_empty=slot in NON_EMPTY_BOUNDARY_SLOTS)
            if reasons:
                problems[slot] = reasons

    if repeated := repeated_quotations(data):
        problems["quotations"] = repeated
    if isinstance(data.get("applicability"), list) and (claims := availability_claims(data["applicability"], catalog)):
        problems.setdefault("applicability", []).extend(claims)

    if problems:
        raise SkillValidationError(skill_id, problems)
    return Skill(
        id=skill_id,
        goal=data["goal"],
        procedure=tuple(data["procedure"]),
        tools=tool_uses,
        applicability=tuple(data["applicability"]),
        risk_cues=tuple(data["risk_cues"]),
        avoidance_rules=tuple(data["avoidance_rules"]),
        recovery_notes=tuple(data["recovery_notes"]),
        domain=domain,
    )


@dataclass(frozen=True)
class LibraryReport:
    """Outcome of library construction: the kept skills and every rejection with its reasons."""

    skills: tuple[Skill, ...]
    rejected: tuple[SkillValidationError, ...]

    def summary(self) -> str:
        lines = [f"kept {len(self.skills)} skills, rejected {len(self.rejected)}"]
        lines.extend(f"  - {error}" for error in self.rejected)
        return "\n".join(lines)


def build_library(
    candidates: Iterable[str | Mapping[str, Any]], catalog: ToolCatalog, *, domain: str = ""
) -> LibraryReport:
    """Eq. 7: keep ψ(ŝ) for every candidate that passes; report the rest instead of halting."""
    kept: list[Skill] = []
    rejected: list[SkillValidationError] = []
    seen: set[str] = set()
    for candidate in candidates:
        try:
            skill = validate_skill(candidate, catalog, domain=domain)
        except SkillValidationError as error:
            rejected.append(error)
            continue
        if skill.id in seen:
            rejected.append(SkillValidationError(skill.id, {"id": ["duplicate skill id in library"]}))
            continue
        seen.add(skill.id)
        kept.append(skill)
    return LibraryReport(tuple(kept), tuple(rejected))


def tools_from_json(entries: Sequence[Mapping[str, Any]], *, domain: str = "") -> tuple[Tool, ...]:
    """Parse tool definitions (``{name, description, parameters}``), checking each JSON schema."""
    if not isinstance(entries, list):
        raise ValueError(f"'tools' of domain {domain!r} must be a list of tool objects, got {type(entries).__name__}")
    tools = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"tool {index} in domain {domain!r} must be an object {{name, description, parameters}}, got {entry!r:.40}")
        missing = [key for key in ("name", "description", "parameters") if key not in entry]
        if missing:
            raise ValueError(f"tool {index} in domain {domain!r} is missing {missing}")
        wrong = [key for key, kind in (("name", str), ("description", str), ("parameters", dict)) if not isinstance(entry[key], kind)]
        if wrong or not entry["name"]:
            raise ValueError(f"tool {index} in domain {domain!r}: 'name' and 'description' must be strings (name non-empty), "
                             f"'parameters' an object; wrong: {wrong or ['name']}")
        try:
            jsonschema.Draft202012Validator.check_schema(entry["parameters"])
        except jsonschema.SchemaError as error:
            raise ValueError(f"tool {entry['name']!r} has an invalid parameters schema: {error.message}") from error
        tools.append(Tool(entry["name"], entry["description"], entry["parameters"], domain))
    return tuple(tools)
