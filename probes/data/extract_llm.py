"""An LLM as the skill extractor f_ext of Eq. 6, its output kept only when ψ accepts it (Eq. 7).

For one anchor (a tool), :class:`LLMExtractor` prompts a chat model with the tool's schema, the
successful uses (τ⁺) and the boundary evidence (τ⁻) of a :class:`Candidate`, and asks for the
seven-slot skill as one JSON object. The reply is read as JSON as it stands, or as the content
of one fenced ```json block filling the whole reply (nothing more lenient), then checked by ψ
(:func:`probes.data.schema.validate_skill`: strict JSON, every slot, non-empty risk cues and
avoidance rules, tools of the catalog) and by two anchor checks (the id asked for, the anchor tool
among the skill's tools). A rejected reply is retried up to ``retries`` times with the reasons
appended to the conversation; a candidate still rejected is discarded with those reasons.

Precision first (§4.2): a candidate without boundary evidence is discarded without prompting,
since any risk cue the model wrote for it would be invented.

Replies are asked for in rounds: every open candidate's conversation at once
(``generator.replies``), so a chat model can batch them. The generator is a
:class:`TextGenerator`; :class:`probes.engine.generate.ChatGenerator` is the one for local HF models.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from probes.core.chat import OnBatch, Reply
from probes.core.files import append_text, write_text
from probes.data.dataset import DatasetError
from probes.data.schema import SLOTS, Skill, SkillValidationError, Tool, ToolCatalog, validate_skill

# What each slot holds, as the prompt states it (keyed by the schema's slots, in their order).
SLOT_SPEC: dict[str, str] = {
    "goal": "a string: what calling the tool achieves (from the successful uses)",
    "procedure": "a non-empty list of strings: the steps, in order (from the successful uses)",
    "tools": "a non-empty list of tool names from the catalog below, including the anchor tool",
    "applicability": "a list of strings: when the procedure is safe to invoke (not that a tool is available: that depends on each request's catalog)",
    "risk_cues": "a non-empty list of strings: observations that make the call unsafe (from the boundary evidence only)",
    "avoidance_rules": "a non-empty list of strings: actions or parameters to avoid in those states (from the boundary evidence only)",
    "recovery_notes": "a list of strings, possibly empty: one-step corrections after a failure (from the boundary evidence only)",
}
SYSTEM_PROMPT = ("You extract boundary-aware skills from tool-use trajectories. "
                 "Reply with one JSON object and nothing else.")
NO_EVIDENCE = "no boundary evidence: not prompted"
RETRIES = 2  # corrected replies asked for after a rejected one
_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?```", re.S)


class TextGenerator(Protocol):
    label: str  # the model, as named in what is written from its replies
    max_new_tokens: int
    batch_size: int  # replies generated together (greedy replies can differ from one-at-a-time ones by float rounding)

    def __call__(self, messages: Sequence[Mapping[str, str]]) -> Reply: ...

    def replies(self, conversations: Sequence[Sequence[Mapping[str, str]]], *, on_batch: OnBatch | None = None) -> list[Reply]:
        """The reply to each conversation, in order; a chat model may generate them in batches,
        calling ``on_batch(indices, replies)`` as each is made."""
        ...


@dataclass(frozen=True)
class Candidate:
    """The evidence for one anchor: the tool, the catalog the skill may name, τ⁺ and τ⁻ as lines."""

    skill_id: str
    tool: Tool
    catalog: ToolCatalog
    successes: tuple[str, ...]
    boundary: tuple[str, ...]
    domain: str = ""


@dataclass(frozen=True)
class Rejection:
    """A discarded candidate: ``reason`` (the short form counted in reports), the ``problems`` of
    its last reply, and every reply in order (none when it was not prompted)."""

    skill_id: str
    reason: str
    problems: tuple[str, ...]
    replies: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"id": self.skill_id, "reason": self.reason, "problems": list(self.problems), "replies": list(self.replies)}


@dataclass
class Extraction:
    """Kept skills, discarded candidates, and how many replies each kept skill took."""

    kept: list[Skill] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)  # kept skill id → replies it took

    def discarded(self) -> Counter:
        """Discarded candidates per reason."""
        return Counter(rejection.reason for rejection in self.rejected)

    def summary(self) -> str:
        lines = [f"LLM extractor: kept {len(self.kept)}, discarded {len(self.rejected)}"]
        lines += [f"  discarded {count}: {reason}" for reason, count in sorted(self.discarded().items())]
        return "\n".join(lines)


_ASKED_ID = re.compile(r'- "id": the string "([^"]+)"')


@dataclass
class RecordingGenerator:
    """A :class:`TextGenerator` that appends every reply of ``generator`` to the JSONL file ``path`` as
    it is made (the skill id asked for, the model and its budget, the text, whether it was cut), so
    that a long run stopped early still leaves what it did; :func:`replay_record` re-checks them."""

    generator: TextGenerator
    path: Path

    def __post_init__(self) -> None:
        self.label, self.max_new_tokens, self.batch_size = self.generator.label, self.generator.max_new_tokens, self.generator.batch_size
        write_text(self.path, "")

    def __call__(self, messages: Sequence[Mapping[str, str]]) -> Reply:
        return self.replies([messages])[0]

    def replies(self, conversations: Sequence[Sequence[Mapping[str, str]]], *, on_batch: OnBatch | None = None) -> list[Reply]:
        def record(indices: list[int], made: list[Reply]) -> None:
            rows = [{"id": _ASKED_ID.search(conversations[index][1]["content"]).group(1), "model": self.label,
                     "max_new_tokens": self.max_new_tokens, "reply": reply.text, "truncated": reply.truncated}
                    for index, reply in zip(indices, made, strict=True)]
            append_text(self.path, "".join(json.dumps(row) + "\n" for row in rows))
            if on_batch is not None:
                on_batch(indices, made)

        return self.generator.replies(conversations, on_batch=record)


RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {"id": str, "model": str, "max_new_tokens": int, "reply": str, "truncated": bool}


def read_record(path: Path, catalogs: Mapping[str, ToolCatalog]) -> list[dict[str, object]]:
    """The rows of a recorded extractor run (:class:`RecordingGenerator`'s JSONL), each checked before
    any is replayed: a JSON object with :data:`RECORD_FIELDS` of their types, whose id is
    ``DOMAIN.TOOL`` with a domain of ``catalogs`` and a tool of its catalog; a :class:`DatasetError`
    naming the file, the line and the id otherwise."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise DatasetError(f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start})") from error
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as error:
            raise DatasetError(f"{where}: not a JSON line ({type(error).__name__}); a torn or edited line of the recorded run: "
                               "remove it, or record the run again") from error
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: a recorded reply must be a JSON object, got {type(row).__name__}")
        wrong = [f"{key!r} ({kind.__name__})" for key, kind in RECORD_FIELDS.items()
                 if not isinstance(row.get(key), kind) or (kind is int and isinstance(row.get(key), bool))]
        if wrong:
            raise DatasetError(f"{where}: a recorded reply needs the fields {', '.join(wrong)}")
        skill_id = row["id"]
        domain, dot, name = skill_id.partition(".")
        if not (dot and domain and name):
            raise DatasetError(f"{where}: id {skill_id!r} is not DOMAIN.TOOL (e.g. retail.get_order_details)")
        if domain not in catalogs:
            raise DatasetError(f"{where}: id {skill_id!r}: unknown domain {domain!r}; the dataset's domains: {', '.join(sorted(catalogs))}")
        if name not in catalogs[domain]:
            raise DatasetError(f"{where}: id {skill_id!r}: domain {domain!r} has no tool {name!r}")
        rows.append(row)
    return rows


def replay_record(rows: Iterable[Mapping[str, object]], catalogs: Mapping[str, ToolCatalog]) -> Extraction:
    """ψ and the anchor checks (:func:`check_reply`) applied again to recorded replies, in order: a
    skill id is kept at its first accepted reply, else discarded with the reason of its last one.
    ``catalogs``: domain → the catalog its skills were checked against; ``rows``: as :func:`read_record` returns them."""
    replies: dict[str, list[Mapping[str, object]]] = {}
    for row in rows:
        replies.setdefault(str(row["id"]), []).append(row)
    extraction = Extraction()
    for skill_id, made in replies.items():
        domain, name = skill_id.split(".", 1)
        candidate = Candidate(skill_id, catalogs[domain][name], catalogs[domain], (), (), domain)
        for number, row in enumerate(made, start=1):
            skill, problems = check_reply(str(row["reply"]), candidate)
            if skill is not None:
                extraction.kept.append(skill)
                extraction.attempts[skill_id] = number
                break
        else:
            extraction.rejected.append(Rejection(skill_id, rejection_reason(problems, bool(made[-1]["truncated"])), tuple(problems),
                                                 tuple(str(row["reply"]) for row in made)))
    return extraction


def reply_json(text: str) -> str:
    """The JSON text of a reply: the whole reply, or the content of one fenced block that is the whole reply."""
    stripped = text.strip()
    match = _FENCE.fullmatch(stripped)
    return match.group(1) if match else stripped


def prompt_messages(candidate: Candidate) -> list[dict[str, str]]:
    """The system and user messages asking for ``candidate``'s skill."""
    tool = candidate.tool
    keys = [f'- "id": the string "{candidate.skill_id}"'] + [f'- "{slot}": {SLOT_SPEC[slot]}' for slot in SLOTS]
    schema = json.dumps({"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)})
    user = "\n".join([
        f"Write the skill for the tool {tool.name} as one JSON object with exactly these keys:",
        *keys,
        "",
        "The successful uses give goal, procedure and tools; the boundary evidence alone gives risk_cues,",
        "avoidance_rules and recovery_notes; quote any one request or message in one slot only. Tool names must come from this catalog: " + ", ".join(candidate.catalog.names) + ".",
        "",
        f"Tool: {schema}",
        "",
        "Successful uses:",
        *(f"- {line}" for line in candidate.successes),
        "",
        "Boundary evidence:",
        *(f"- {line}" for line in candidate.boundary),
    ])
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def check_reply(text: str, candidate: Candidate) -> tuple[Skill | None, list[str]]:
    """(the skill, []) when ψ and the anchor checks accept the reply, else (None, the problems)."""
    try:
        skill = validate_skill(reply_json(text), candidate.catalog, domain=candidate.domain)
    except SkillValidationError as error:
        return None, [f"{name}: {reason}" for name, reasons in error.problems.items() for reason in reasons]
    problems = []
    if skill.id != candidate.skill_id:
        problems.append(f"id: must be {candidate.skill_id!r}, got {skill.id!r}")
    if candidate.tool.name not in skill.tool_names:
        problems.append(f"tools: must include the anchor tool {candidate.tool.name!r}, got {list(skill.tool_names)}")
    return (None, problems) if problems else (skill, [])


def rejection_reason(problems: Sequence[str], truncated: bool) -> str:
    """The short reason of a rejected reply: unparsable (cut at the token budget or not), or the failing fields."""
    if problems[0].startswith("<json>: not strict JSON"):
        return "not strict JSON" + (" (cut at max_new_tokens)" if truncated else "")
    if problems[0].startswith("<json>: must be a JSON object"):
        return "not a JSON object"
    return "invalid fields: " + ", ".join(dict.fromkeys(problem.split(":", 1)[0] for problem in problems))


@dataclass
class LLMExtractor:
    """f_ext with a chat model: one prompt per candidate, up to ``retries`` corrected replies."""

    generator: TextGenerator
    retries: int = RETRIES

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be ≥ 0, got {self.retries}")

    def extract(self, candidate: Candidate) -> Skill | Rejection:
        extraction = self.run([candidate])
        return (extraction.kept or extraction.rejected)[0]

    def run(self, candidates: Iterable[Candidate]) -> Extraction:
        """Every candidate's skill or rejection, in the candidates' order. Replies are asked for in
        rounds (``generator.replies``: every candidate still open, together), the first reply
        then up to ``retries`` corrections; a candidate's conversation is the same as one by one."""
        candidates = list(candidates)
        results: dict[int, Skill | Rejection] = {}
        conversations: dict[int, list[dict[str, str]]] = {}
        replies: dict[int, list[Reply]] = {}
        for index, candidate in enumerate(candidates):
            if candidate.boundary:
                conversations[index], replies[index] = prompt_messages(candidate), []
            else:
                results[index] = Rejection(candidate.skill_id, NO_EVIDENCE, (), ())
        for attempt in range(self.retries + 1):
            pending = [index for index in conversations if index not in results]
            if not pending:
                break
            if len(candidates) > 1:
                print(f"LLM extractor: reply {attempt + 1} of at most {self.retries + 1}, {len(pending)} candidates", flush=True)
            for index, reply in zip(pending, self.generator.replies([conversations[index] for index in pending]), strict=True):
                replies[index].append(reply)
                skill, problems = check_reply(reply.text, candidates[index])
                if skill is not None:
                    results[index] = skill
                elif attempt == self.retries:
                    results[index] = Rejection(candidates[index].skill_id, rejection_reason(problems, reply.truncated), tuple(problems),
                                               tuple(r.text for r in replies[index]))
                else:
                    conversations[index] = conversations[index] + [
                        {"role": "assistant", "content": reply.text},
                        {"role": "user", "content": "That reply was rejected:\n" + "\n".join(f"- {p}" for p in problems)
                         + "\nReply with the corrected JSON object only."},
                    ]
        extraction = Extraction()
        for index in range(len(candidates)):
            result = results[index]
            if isinstance(result, Rejection):
                extraction.rejected.append(result)
            else:
                extraction.kept.append(result)
                extraction.attempts[result.id] = len(replies[index])
        return extraction
