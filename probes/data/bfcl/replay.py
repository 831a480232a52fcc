"""Trajectories: an entry's ground truth executed turn by turn on BFCL's own API classes
(:mod:`probes.data.bfcl_exec`), so every earlier call carries its real observation, with the
skip-the-previous-call failures; and an imported item's conversation replayed the same way."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.data.bfcl.source import ADDED_FUNCTION_PROMPT, BFCLDataError, api_source_dir, entry_index, load_entries, locate_bfcl_data
from probes.data.bfcl_exec import BFCLEnvironment, Call, is_error_observation, load_api_classes, parse_call


@dataclass
class Step:
    """One executed ground-truth call."""

    call: Call
    arguments: dict[str, Any]  # by parameter name
    observation: str
    # The observation of this call when the turn's previous call (a different tool) is skipped,
    # when that is an error and the ground-truth execution is not (the T_repair perturbation).
    skip_failure: str | None = None

    def messages(self) -> list[dict[str, Any]]:
        return [
            {"role": "assistant", "tool_call": {"name": self.call.name, "arguments": self.arguments}},
            {"role": "tool", "name": self.call.name, "content": self.observation},
        ]


@dataclass
class Turn:
    index: int
    user: str
    added_function: bool  # miss_func: the held-out function docs come back at this turn
    hidden: tuple[str, ...]  # functions not available at this turn (miss_func)
    steps: list[Step]


@dataclass
class Trajectory:
    category: str
    entry_id: str
    index: int
    involved_classes: tuple[str, ...]
    turns: list[Turn]


def replay(entry: Mapping[str, Any], category: str, classes: Mapping[str, type]) -> Trajectory:
    """Execute an entry's ground truth turn by turn on BFCL's classes, recording observations and
    the skip-the-previous-call failures."""
    env = BFCLEnvironment(classes, entry["involved_classes"], entry["initial_config"], long_context=category == "long_context")
    held_out = {int(turn): tuple(names) for turn, names in entry.get("missed_function", {}).items()}
    turns = []
    for t, (messages, truth) in enumerate(zip(entry["question"], entry["ground_truth"])):
        if t in held_out:
            if messages:
                raise BFCLDataError(f"{entry['id']}: turn {t} brings back held-out functions but has a user message")
            user = ADDED_FUNCTION_PROMPT
        else:
            if len(messages) != 1 or messages[0].get("role") != "user":
                raise BFCLDataError(f"{entry['id']}: turn {t} must hold one user message, got {messages!r:.120}")
            user = messages[0]["content"]
        hidden = tuple(name for turn, names in sorted(held_out.items()) if turn > t for name in names)
        calls = [parse_call(text) for text in truth]
        steps: list[Step] = []
        # The state before the previous call, kept only when that call is a different tool.
        without_previous: BFCLEnvironment | None = None
        for j, call in enumerate(calls):
            before_this = env.snapshot() if j + 1 < len(calls) and calls[j + 1].name != call.name else None
            arguments = env.bind(call)
            observation = env.execute(call)
            skip_failure = None
            if without_previous is not None and not is_error_observation(observation):
                skipped = without_previous.execute(call)
                if is_error_observation(skipped):
                    skip_failure = skipped
            steps.append(Step(call, arguments, observation, skip_failure))
            without_previous = before_this
        turns.append(Turn(t, user, t in held_out, hidden, steps))
    return Trajectory(category, entry["id"], entry_index(entry["id"]), tuple(entry["involved_classes"]), turns)


def context_messages(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """The chat messages of complete earlier turns: user message, then each call and observation."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        out.append({"role": "user", "content": turn.user})
        for step in turn.steps:
            out.extend(step.messages())
    return out


# ---------------------------------------------------------------------------- an imported item, replayed
def item_entry_id(item: Any) -> str:
    """The BFCL entry an imported item comes from: ``multi_turn_<category>_<index>`` (task group ``bfcl.<index>``)."""
    if not item.category or not item.task_group.startswith("bfcl."):
        raise BFCLDataError(f"{item.id}: not an imported BFCL item (category {item.category!r}, task group {item.task_group!r})")
    return f"multi_turn_{item.category}_{int(item.task_group.split('.', 1)[1])}"


class ItemEnvironments:
    """BFCL environments in the state of an item's decision point: the entry's ``initial_config``
    loaded in BFCL's own API classes, then every call of the item's conversation (earlier turns, then
    the current turn's history) executed in order; the observations are BFCL's real ones."""

    def __init__(self, data_dir: Path | None = None) -> None:
        self.data_dir = locate_bfcl_data(data_dir)
        self.classes = load_api_classes(api_source_dir(self.data_dir))
        self._entries: dict[str, dict[str, Any]] = {}

    def entry(self, entry_id: str) -> dict[str, Any]:
        if entry_id not in self._entries:
            category = re.fullmatch(r"multi_turn_([a-z_]+)_\d+", entry_id).group(1)  # type: ignore[union-attr]
            self._entries.update({e["id"]: e for e in load_entries(self.data_dir, category)})
        return self._entries[entry_id]

    def replay(self, item: Any) -> tuple[BFCLEnvironment, list[str]]:
        """The environment after every call of ``item``'s conversation, and the observation of each call."""
        entry = self.entry(item_entry_id(item))
        env = BFCLEnvironment(self.classes, entry["involved_classes"], entry["initial_config"], long_context=item.category == "long_context")
        observations = []
        for message in (*item.context, *item.history):
            if message.get("tool_call"):
                call = message["tool_call"]
                observations.append(env.execute(Call(f"{call['name']}(...)", call["name"], (), dict(call.get("arguments", {})))))
        return env, observations
