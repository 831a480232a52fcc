"""The prompt record: what the builder returns, ``basm-probes build`` writes (JSON Lines) and every
scorer reads. Fields and meanings: ``docs/prompt_records.md``.

Records are typed dicts: the builder's output, the JSON Lines files and hand-made test records are
one representation (no conversion layer), and type checkers see every field. :func:`from_json`
checks a record read from disk; :func:`to_json` drops the builder's internal character offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import numpy as np


class Candidate(TypedDict):
    """One continuation a margin compares; ``token_ids`` continue ``input_ids[:anchor_index + 1]``."""

    role: str  # correct | wrong | abstain | other
    action: str  # a tool name or "<abstain>"
    anchor_index: int
    text: str
    token_ids: list[int]
    first_token_id: int
    collides_with: list[str]
    boundary_merge: bool


class PromptRecord(TypedDict, total=False):
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
    input_ids: list[int]
    offsets: np.ndarray  # [n_tokens, 2] character offsets; builder only, never written
    n_tokens: int
    decision_index: int
    open_index: int | None
    query_rows: list[int]
    spans: dict[str, list[list[int]]]
    spans_kind: dict[str, str]
    skills: list[dict[str, Any]]
    candidates: list[Candidate]
    collision: bool
    correct_action: str
    wrong_tools: list[str]
    tempting_skill: str
    tempting_rank: int | None
    retrieval: dict[str, Any]


REQUIRED: tuple[str, ...] = tuple(name for name in PromptRecord.__annotations__ if name != "offsets")
CANDIDATE_FIELDS: tuple[str, ...] = tuple(Candidate.__annotations__)


def record_id(item_id: str, config: str, k: int, fmt: str) -> str:
    """The one builder of a record's id: ``"{item_id}|{config}|k{k}|{format}"``."""
    return f"{item_id}|{config}|k{k}|{fmt}"


def to_json(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as written to JSON Lines (without the builder's internal ``offsets``)."""
    return {key: value for key, value in record.items() if key != "offsets"}


def from_json(obj: Mapping[str, Any], where: str = "record") -> PromptRecord:
    """A record read from JSON, checked: every field of ``docs/prompt_records.md`` present,
    candidates complete, ``record_id`` consistent; a :class:`ValueError` names what is wrong."""
    missing = [name for name in REQUIRED if name not in obj]
    if missing:
        raise ValueError(f"{where}: not a prompt record, missing {', '.join(missing)} (see docs/prompt_records.md)")
    for i, candidate in enumerate(obj["candidates"]):
        if lacking := [name for name in CANDIDATE_FIELDS if name not in candidate]:
            raise ValueError(f"{where}: candidate {i} lacks {', '.join(lacking)}")
    expected = record_id(obj["item_id"], obj["config"], obj["k"], obj["format"])
    if obj["record_id"] != expected:
        raise ValueError(f"{where}: record_id {obj['record_id']!r} does not match its fields ({expected!r})")
    if obj["n_tokens"] != len(obj["input_ids"]) or obj["decision_index"] != obj["n_tokens"] - 1:
        raise ValueError(f"{where}: n_tokens / decision_index do not match input_ids")
    return PromptRecord(**obj)  # type: ignore[typeddict-item]
