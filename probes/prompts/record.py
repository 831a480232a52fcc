"""The prompt record: what the builder returns, ``basm-probes build`` writes (JSON Lines) and every
scorer reads. Fields and meanings: ``docs/prompt_records.md``.

Records are frozen dataclasses (:class:`PromptRecord` with its :class:`Candidate` s, retrieved
:class:`SkillEntry` s and their :class:`SlotSpan` s), so an editor can follow every field.
:meth:`PromptRecord.to_json` gives exactly the JSON object ``basm-probes build`` writes (without the
builder's internal character offsets); :meth:`PromptRecord.from_json` checks such an object and
reads it back (``PromptRecord.from_json(r.to_json()).to_json() == r.to_json()``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from probes.data.dataset import RECORD_ID_SEPARATOR

Span = tuple[int, int]
"""A half-open token range ``[lo, hi)`` into ``input_ids``."""

Spans = dict[str, list[Span]]
"""Token spans per slot name (plus ``boundary`` and ``memory``); ``spans.get(name, [])``."""


def _pair(value: Any) -> tuple[int, int]:
    lo, hi = value
    return int(lo), int(hi)


@dataclass(frozen=True)
class Candidate:
    """One continuation a margin compares; ``token_ids`` continue ``input_ids[:anchor_index + 1]``."""

    role: str  # correct | wrong | abstain | other
    action: str  # a tool name or "<abstain>"
    anchor_index: int
    text: str
    token_ids: list[int]  # [n_continuation_tokens]
    first_token_id: int
    boundary_merge: bool
    collides_with: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "action": self.action, "anchor_index": self.anchor_index, "text": self.text,
                "token_ids": list(self.token_ids), "first_token_id": self.first_token_id,
                "boundary_merge": self.boundary_merge, "collides_with": list(self.collides_with)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "candidate") -> Candidate:
        if lacking := [name for name in CANDIDATE_FIELDS if name not in obj]:
            raise ValueError(f"{where} lacks {', '.join(lacking)}")
        return cls(role=obj["role"], action=obj["action"], anchor_index=int(obj["anchor_index"]), text=obj["text"],
                   token_ids=[int(t) for t in obj["token_ids"]], first_token_id=int(obj["first_token_id"]),
                   boundary_merge=bool(obj["boundary_merge"]), collides_with=list(obj["collides_with"]))


@dataclass(frozen=True)
class SlotSpan:
    """Where one slot body of one retrieved skill sits in the prompt."""

    text: str
    char_span: Span  # [start, end) character offsets into the prompt text
    token_span: Span  # [lo, hi) token positions into input_ids

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "char_span": list(self.char_span), "token_span": list(self.token_span)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SlotSpan:
        return cls(text=obj["text"], char_span=_pair(obj["char_span"]), token_span=_pair(obj["token_span"]))


@dataclass(frozen=True)
class SkillEntry:
    """One retrieved skill shown in the prompt (rank 1 = best, Eq. 8 score, Eq. 10 exposure)."""

    skill_id: str
    rank: int
    score: float
    boundary_exposed: bool
    slots: dict[str, SlotSpan]  # slot name -> where its body sits

    def to_json(self) -> dict[str, Any]:
        return {"skill_id": self.skill_id, "rank": self.rank, "score": self.score,
                "boundary_exposed": self.boundary_exposed,
                "slots": {name: slot.to_json() for name, slot in self.slots.items()}}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SkillEntry:
        return cls(skill_id=obj["skill_id"], rank=int(obj["rank"]), score=obj["score"],
                   boundary_exposed=bool(obj["boundary_exposed"]),
                   slots={name: SlotSpan.from_json(slot) for name, slot in obj["slots"].items()})


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: item × memory configuration × k × decision format."""

    record_id: str
    item_id: str
    bucket: str
    split: str
    domain: str
    task_group: str
    config: str
    k: int
    format: str
    tokenizer: str
    text: str
    input_ids: list[int]  # [n_tokens]
    n_tokens: int
    decision_index: int
    open_index: int | None
    query_rows: list[int]  # [n_query_rows], ascending
    spans: Spans
    spans_kind: dict[str, Any]  # {"boundary": kind, ...}: see docs/prompt_records.md
    skills: list[SkillEntry]  # [k] in rank order
    candidates: list[Candidate]
    collision: bool
    correct_action: str
    wrong_tools: list[str]
    tempting_skill: str  # the item's defining skill
    tempting_rank: int | None  # its rank in the Eq. 8 ranking of the item's library (retrieval quality)
    tempting_shown_rank: int | None  # its rank among the k skills of depth k under the run's retrieval; None: not among them
    retrieval: dict[str, Any]  # embedder, weights, gate, mode (ranked | oracle@R): recorded verbatim
    # [n_tokens, 2] character offsets; builder only, never written (None when read from JSON)
    offsets: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def tempting_shown(self) -> bool:
        """Whether the defining skill is among the k skills of this depth (the paper's setting)."""
        return self.tempting_shown_rank is not None

    @property
    def retrieval_mode(self) -> str:
        """``ranked`` or ``oracle@R`` (:attr:`probes.prompts.builder.BuildSettings.retrieval_mode`)."""
        return self.retrieval["mode"]

    def candidate(self, role: str) -> Candidate | None:
        """The first candidate of ``role`` (``correct``, ``wrong``, ``abstain``), or None."""
        return next((c for c in self.candidates if c.role == role), None)

    def with_config(self, config: str) -> PromptRecord:
        """The same prompt under another configuration name (k = 0 prompts are shared)."""
        return dataclasses.replace(self, config=config, record_id=record_id(self.item_id, config, self.k, self.format))

    def spans_json(self) -> dict[str, list[list[int]]]:
        return {name: [[lo, hi] for lo, hi in spans] for name, spans in self.spans.items()}

    def to_json(self) -> dict[str, Any]:
        """The record as ``basm-probes build`` writes it to JSON Lines (without ``offsets``)."""
        return {
            "record_id": self.record_id, "item_id": self.item_id, "bucket": self.bucket, "split": self.split,
            "domain": self.domain, "task_group": self.task_group, "config": self.config, "k": self.k,
            "format": self.format, "tokenizer": self.tokenizer, "text": self.text, "input_ids": list(self.input_ids),
            "n_tokens": self.n_tokens, "decision_index": self.decision_index, "open_index": self.open_index,
            "query_rows": list(self.query_rows), "spans": self.spans_json(), "spans_kind": self.spans_kind,
            "skills": [skill.to_json() for skill in self.skills],
            "candidates": [candidate.to_json() for candidate in self.candidates],
            "collision": self.collision, "correct_action": self.correct_action, "wrong_tools": list(self.wrong_tools),
            "tempting_skill": self.tempting_skill, "tempting_rank": self.tempting_rank,
            "tempting_shown_rank": self.tempting_shown_rank, "retrieval": self.retrieval,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "record") -> PromptRecord:
        """A record read from JSON, checked: every field of ``docs/prompt_records.md`` present,
        candidates complete, ``record_id`` consistent; a :class:`ValueError` names what is wrong."""
        missing = [name for name in REQUIRED if name not in obj]
        if missing:
            raise ValueError(f"{where}: not a prompt record, missing {', '.join(missing)} (see docs/prompt_records.md)")
        candidates = [Candidate.from_json(c, f"{where}: candidate {i}") for i, c in enumerate(obj["candidates"])]
        expected = record_id(obj["item_id"], obj["config"], obj["k"], obj["format"])
        if obj["record_id"] != expected:
            raise ValueError(f"{where}: record_id {obj['record_id']!r} does not match its fields ({expected!r})")
        if obj["n_tokens"] != len(obj["input_ids"]) or obj["decision_index"] != obj["n_tokens"] - 1:
            raise ValueError(f"{where}: n_tokens / decision_index do not match input_ids")
        values = {name: obj[name] for name in REQUIRED}
        values.update(
            input_ids=[int(t) for t in obj["input_ids"]], query_rows=[int(r) for r in obj["query_rows"]],
            spans={name: [_pair(s) for s in spans] for name, spans in obj["spans"].items()},
            skills=[SkillEntry.from_json(s) for s in obj["skills"]], candidates=candidates,
            wrong_tools=list(obj["wrong_tools"]),
        )
        return cls(**values)


REQUIRED: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PromptRecord) if f.name != "offsets")
CANDIDATE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Candidate))


def record_id(item_id: str, config: str, k: int, fmt: str) -> str:
    """The one builder of a record's id: ``"{item_id}|{config}|k{k}|{format}"`` (item ids hold no ``|``:
    the dataset refuses them at load)."""
    return RECORD_ID_SEPARATOR.join((item_id, config, f"k{k}", fmt))


def record_parts(record_id: str) -> tuple[str, str, int, str]:
    """(item id, configuration, k, format) of a :func:`record_id`."""
    item_id, config, k, fmt = record_id.split(RECORD_ID_SEPARATOR)
    return item_id, config, int(k.removeprefix("k")), fmt
