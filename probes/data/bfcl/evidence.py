"""Evidence per tool from the skill-source trajectories: its successful uses (τ⁺) and the boundary
evidence (τ⁻) of each kind (executed skip failures, held-out functions, missing parameters), with
the rules that read dependencies, predecessors and example requests off them."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from probes.data.bfcl.replay import Step, Trajectory, Turn
from probes.data.bfcl.source import entry_index
from probes.data.bfcl_exec import parse_call

SNIPPET_CHARS = 140  # request and error quotes in skill text are cut at a word boundary
ERROR_CHARS = 120
# The fixed rules of what counts as evidence (stated in the README; see predecessors and example_requests).
PREDECESSOR_MIN_USES = 2  # a predecessor needs a dependency in at least this many of the tool's source uses
PREDECESSOR_MIN_SHARE = 0.2  # ... and in at least this share of them
EXAMPLE_MIN_WORDS = 5  # an example request has at least this many words (and quotes an argument value of its call)


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut + " ..."


def error_text(observation: str) -> str:
    try:
        value = json.loads(observation)
    except ValueError:
        value = None
    message = value["error"] if isinstance(value, dict) and "error" in value else observation
    return snippet(str(message), ERROR_CHARS)


def value_strings(value: Any) -> list[str]:
    """The forms in which an argument value can be quoted in text: strings (``@``/``#`` stripped),
    numbers (``20`` for 20.0) and the elements of lists."""
    if isinstance(value, bool):
        return []
    if isinstance(value, str):
        text = value.strip().lstrip("@#")
        return [text] if len(text) > 1 else []
    if isinstance(value, float) and value.is_integer():
        return [str(int(value))]
    if isinstance(value, (int, float)):
        return [str(value)]
    if isinstance(value, list):
        return [text for element in value for text in value_strings(element)]
    return []


def quoted_parameters(arguments: Mapping[str, Any], text: str, *, min_chars: int = 1) -> list[str]:
    """The parameters whose value is quoted in ``text`` (whole word, case-insensitive; the forms of
    :func:`value_strings` with at least ``min_chars`` characters)."""
    lowered = text.lower()
    return [
        name for name, value in arguments.items()
        if any(len(form) >= min_chars and re.search(rf"(?<!\w){re.escape(form.lower())}(?!\w)", lowered) for form in value_strings(value))
    ]


def clarified_calls(turn: Turn, clarification: str) -> list[tuple[Step, list[str]]]:
    """Calls of ``turn`` with an argument value quoted in ``clarification`` (the miss_param turn
    after the under-specified one; a whole-word, case-insensitive match), with those parameters."""
    return [(step, params) for step in turn.steps if (params := quoted_parameters(step.arguments, clarification))]


@dataclass(frozen=True)
class Use:
    """One ground-truth call of the tool in a skill-source base trajectory, as executed."""

    entry: str
    request: str  # the turn's user message
    call: str
    arguments: tuple[tuple[str, Any], ...]  # (parameter, value) as bound, in call order
    observation: str
    previous: str | None  # the turn's call right before this one, when it is another tool
    # How this call depended on ``previous``: "fail" (executed without it, it failed) or the
    # parameters whose values stand in previous's observation; () when neither.
    dependency: tuple[str, ...] = ()

    @property
    def previous_tool(self) -> str | None:
        return None if self.previous is None else parse_call(self.previous).name


@dataclass(frozen=True)
class SkipFailure:
    """The tool's call failed when the turn's previous call (another tool) was skipped (executed)."""

    entry: str
    call: str
    skipped: str  # the skipped call
    error: str  # the error text (snippet)


@dataclass(frozen=True)
class HeldOut:
    """miss_func: a request needed the tool while BFCL held it out; the correct action was no call."""

    entry: str
    request: str
    later_call: str | None  # the tool's call in the turn where it came back
    later_observation: str | None  # and what it returned


@dataclass(frozen=True)
class MissingParameters:
    """miss_param: a request did not give these parameters; the next turn's message supplied them."""

    entry: str
    request: str
    supplied: tuple[tuple[str, Any], ...]  # (parameter, value) quoted in the clarification


@dataclass
class ToolEvidence:
    """What the skill-source trajectories say about one tool: its successful uses (τ⁺) and the
    boundary evidence (τ⁻) of each kind, in trajectory order."""

    successes: list[Use] = field(default_factory=list)
    failures: list[SkipFailure] = field(default_factory=list)
    held_out: list[HeldOut] = field(default_factory=list)
    missing_params: list[MissingParameters] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)


def _dependency(step: Step, previous: Step) -> tuple[str, ...]:
    if step.skip_failure is not None:
        return ("fail",)
    # a value of two characters or more: a lone digit in an observation is no evidence of a data flow
    return tuple(quoted_parameters(step.arguments, previous.observation, min_chars=2))


def collect_evidence(trajectories: Iterable[Trajectory]) -> dict[str, ToolEvidence]:
    """Evidence per tool from skill-source trajectories: uses and skip-the-previous-call failures
    from base, held-out functions from miss_func, missing parameters from miss_param."""
    evidence: dict[str, ToolEvidence] = defaultdict(ToolEvidence)
    for trajectory in trajectories:
        for t, turn in enumerate(trajectory.turns):
            following = trajectory.turns[t + 1] if t + 1 < len(trajectory.turns) else None
            if trajectory.category == "base":
                for j, step in enumerate(turn.steps):
                    before = turn.steps[j - 1] if j and turn.steps[j - 1].call.name != step.call.name else None
                    tool = evidence[step.call.name]
                    tool.successes.append(Use(trajectory.entry_id, turn.user, step.call.text, tuple(step.arguments.items()), step.observation,
                                              None if before is None else before.call.text, () if before is None else _dependency(step, before)))
                    tool.sources.add(trajectory.entry_id)
                    if step.skip_failure is not None and before is not None:
                        tool.failures.append(SkipFailure(trajectory.entry_id, step.call.text, before.call.text, error_text(step.skip_failure)))
            elif not turn.steps and trajectory.category == "miss_func" and following is not None and following.added_function:
                for name in sorted(set(turn.hidden) - set(following.hidden)):
                    later = next((step for step in following.steps if step.call.name == name), None)
                    evidence[name].held_out.append(HeldOut(trajectory.entry_id, turn.user, *((later.call.text, later.observation) if later else (None, None))))
                    evidence[name].sources.add(trajectory.entry_id)
            elif not turn.steps and trajectory.category == "miss_param" and following is not None:
                for step, params in clarified_calls(following, following.user):
                    supplied = tuple((param, step.arguments[param]) for param in params)
                    evidence[step.call.name].missing_params.append(MissingParameters(trajectory.entry_id, turn.user, supplied))
                    evidence[step.call.name].sources.add(trajectory.entry_id)
    return dict(evidence)


def _round_robin(groups: Sequence[Sequence[Any]], limit: int) -> list[Any]:
    """Up to ``limit`` distinct elements, one per group in turn (the first of each group first)."""
    out: list[Any] = []
    depth = 0
    while len(out) < limit and any(depth < len(group) for group in groups):
        for group in groups:
            if depth < len(group) and len(out) < limit and group[depth] not in out:
                out.append(group[depth])
        depth += 1
    return out


def predecessors(evidence: ToolEvidence) -> list[tuple[str, list[Use]]]:
    """The tools named as predecessors in the procedure, with the uses that support each.

    Rule: P is a predecessor of T when P is the call right before T in the same turn *and* T
    depends on it (executed without P, T failed; or an argument value of T stands in P's
    observation) in at least ``PREDECESSOR_MIN_USES`` of T's source uses and at least
    ``PREDECESSOR_MIN_SHARE`` of them. Order alone (P merely came first) is not support."""
    supported: dict[str, list[Use]] = defaultdict(list)
    for use in evidence.successes:
        if use.dependency:
            supported[use.previous_tool].append(use)
    n = len(evidence.successes)
    return sorted(((tool, uses) for tool, uses in supported.items()
                   if len(uses) >= PREDECESSOR_MIN_USES and len(uses) >= PREDECESSOR_MIN_SHARE * n),
                  key=lambda kv: (-len(kv[1]), kv[0]))


def example_requests(evidence: ToolEvidence, excluded_scenarios: set[int]) -> list[Use]:
    """Uses whose request may be quoted as an example, shortest request first: at least
    ``EXAMPLE_MIN_WORDS`` words, quoting one of its call's argument values within the quoted snippet
    (so it says what the call does: "What's inside?" does not), from a scenario none of the shown
    boundary evidence comes from (BFCL's categories share scenarios, so the same request would stand
    in two slots)."""
    chosen = [use for use in evidence.successes
              if len(use.request.split()) >= EXAMPLE_MIN_WORDS and quoted_parameters(dict(use.arguments), snippet(use.request))
              and entry_index(use.entry) not in excluded_scenarios]
    return sorted(chosen, key=lambda use: (len(use.request), use.request, use.call))


def boundary_evidence(evidence: ToolEvidence, limit: int) -> list[SkipFailure | HeldOut | MissingParameters]:
    """Up to ``limit`` distinct pieces of boundary evidence, one per kind in turn (trajectory order);
    a skip failure counts once per (call, skipped call, error), the other kinds once per request."""
    failures = list({(f.call, f.skipped, f.error): f for f in reversed(evidence.failures)}.values())[::-1]
    held_out = list({h.request: h for h in reversed(evidence.held_out)}.values())[::-1]
    missing = list({m.request: m for m in reversed(evidence.missing_params)}.values())[::-1]
    return _round_robin([failures, held_out, missing], limit)
