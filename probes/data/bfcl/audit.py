"""The label audit: every abstain T_wrong label is checked by a stated rule before it becomes an
item (kept, relabelled, or dropped with its reason; the dropped ones go to ``audit.jsonl``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probes.data.bfcl.evidence import clarified_calls, value_strings
from probes.data.bfcl.replay import Step, Trajectory, Turn, context_messages

AUDIT_RULE = ("abstain only when a call would be premature: an argument is missing only if no value for it appears in the "
              "request or the conversation so far (BFCL's required parameters; values matched whole-word, case-insensitive)")
MISS_FUNC_AUDIT_RULE = ("abstain only when the request cannot be served without a held-out function: BFCL's next turn "
                        "starts with a held-out function, and the request names no function shown at this turn")


def _known_text(trajectory: Trajectory, turn: Turn) -> str:
    """What a model has read at step 0 of ``turn``: the request and every earlier turn (messages,
    call arguments, observations), lower-cased."""
    parts = [turn.user]
    for message in context_messages(trajectory.turns[: turn.index]):
        parts.append(json.dumps(message["tool_call"]["arguments"]) if message["role"] == "assistant" else message["content"])
    return "\n".join(parts).lower()


def _value_given(value: Any, text: str) -> bool:
    """A value appears in ``text`` (lower-cased): one of its textual forms (:func:`~probes.data.bfcl.evidence.value_strings`) as a
    whole word. A value without a textual form (a boolean, an object, one character) cannot be asked
    for by quoting it and counts as given."""
    forms = value_strings(value)
    return not forms or any(re.search(rf"(?<!\w){re.escape(form.lower())}(?!\w)", text) for form in forms)


def missing_arguments(step: Step, text: str, required: Sequence[str], candidates: Iterable[str] | None = None) -> list[str]:
    """The required parameters of ``step``'s call (``candidates`` only, when given) whose value does
    not appear in ``text``: the arguments a model could not have filled in."""
    chosen = set(required) if candidates is None else set(required) & set(candidates)
    return [name for name in required if name in chosen and name in step.arguments and not _value_given(step.arguments[name], text)]


def _names_function(text: str, name: str) -> bool:
    """``text`` names function ``name`` (``_`` read as a space; whole words, case-insensitive)."""
    return re.search(rf"(?<!\w){re.escape(name.replace('_', ' ').lower())}(?!\w)", text.lower()) is not None


@dataclass
class DroppedItem:
    """A T_wrong item the label audit removed: its id, source and the audit entry saying why."""

    item_id: str
    category: str
    source: dict[str, Any]
    audit: list[dict[str, str]]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.item_id, "bucket": "T_wrong", "category": self.category, "source": self.source, "audit": self.audit}


def miss_func_verdict(turn: Turn, following: Turn, visible: Sequence[str], skill_of: Mapping[str, str]) -> tuple[dict[str, Any], str | None]:
    """The audited miss_func T_wrong of the ``[]`` turn before held-out functions come back
    (:data:`MISS_FUNC_AUDIT_RULE`): the tempting tool is the first held-out function with a validated
    skill. Returns ({tool, source, audit}, None), or ({}, reason) when none has a skill (a skipped point)."""
    missing = [name for name in turn.hidden if name not in following.hidden]
    with_skill = [name for name in missing if name in skill_of]
    if not with_skill:
        return {}, f"T_wrong: no validated skill for the held-out function(s) {missing}"
    first = following.steps[0].call.name if following.steps else None
    named = [name for name in visible if _names_function(turn.user, name)]
    if first not in turn.hidden:
        reason, action = f"BFCL's next turn starts with {first}, shown at this turn: the request can be served without the held-out function", "dropped"
    elif named:
        reason, action = f"the request names {', '.join(named)}, shown at this turn: it can be partly served now (a doubtful abstain)", "dropped"
    else:
        reason, action = f"BFCL's next turn starts with the held-out {first}, and the request names no shown function", "kept"
    return {"tool": with_skill[0], "source": {"rule": "miss_func held-out function", "held_out": missing},
            "audit": [{"rule": MISS_FUNC_AUDIT_RULE, "action": action, "reason": reason}]}, None


def miss_param_verdict(trajectory: Trajectory, turn: Turn, following: Turn, visible: Sequence[str], skill_of: Mapping[str, str],
                      required: Mapping[str, tuple[str, ...]]) -> tuple[dict[str, Any], str | None]:
    """The audited miss_param T_wrong of an under-specified ``turn`` (:data:`AUDIT_RULE`): the premature
    call is the first call of BFCL's next turn that lacks a required argument; when BFCL's clarification
    quotes values, only the parameters it quotes can be the missing ones. Returns ({tool, source, audit},
    None), or ({}, reason) when the premature call has no validated skill (a skipped point)."""
    text = _known_text(trajectory, turn)
    quoted = {id(step): params for step, params in clarified_calls(following, following.user)}
    # The pre-audit rule, for the audit's record: the first call quoting a clarified value, else the turn's last call.
    usable = [s for s in following.steps if s.call.name in skill_of and s.call.name in visible]
    before_rule = "uses the clarified value" if quoted else "last call of the next turn"
    before = next((s for s in usable if id(s) in quoted), None) if quoted else (following.steps[-1] if following.steps[-1] in usable else None)

    def lacking(step: Step) -> list[str]:
        return missing_arguments(step, text, required[step.call.name], quoted.get(id(step), []) if quoted else None)

    source: dict[str, Any] = {"rule": "miss_param premature call (first next-turn call lacking a required argument)",
                              "pre_audit_rule": f"miss_param premature call ({before_rule})", "clarification": following.user}

    def verdict(action: str, reason: str, **extra: Any) -> tuple[dict[str, Any], None]:
        return {"audit": [{"rule": AUDIT_RULE, "action": action, "reason": reason}], "source": source, **extra}, None

    first = following.steps[0]
    if first.call.name in visible and not lacking(first):
        checked = (f"the values BFCL's clarification quotes for it ({', '.join(quoted[id(first)])}) are already in the request or the conversation"
                   if quoted.get(id(first)) else "it lacks no required argument")
        return verdict("dropped", f"BFCL's next turn starts with {first.call.text}: {checked}, so it can be made now")
    premature = [step for step in following.steps if lacking(step)]
    if not premature:
        return verdict("dropped", "no call of BFCL's next turn lacks a required argument: every value appears in the request or the conversation")
    chosen = [step for step in premature if step in usable]
    if not chosen:
        return {}, f"T_wrong: no validated skill for the premature call(s) {[s.call.name for s in premature]}"
    step = chosen[0]
    params = lacking(step)
    source["missing_parameters"] = params
    given = ", ".join(f"{p}={step.arguments[p]!r}" for p in params)
    if before is not None and before.call.name == step.call.name:
        return verdict("kept", f"{step.call.name} lacks {given}: not in the request or the conversation", tool=step.call.name)
    was = before.call.name if before is not None else "no call with a validated skill"
    return verdict("relabelled", f"the pre-audit rule ({before_rule}) chose {was}; {step.call.name} is the first call lacking a required "
                                 f"argument ({given} is not in the request or the conversation)", tool=step.call.name)
