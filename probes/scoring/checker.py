"""The boundary checker G (paper §4.2, Eq. 11) and the repair hint h_t (Eq. 12), deterministic first.

**G** compares a proposed call ``a_t`` with the retrieved skills whose tools or goal name its tool
(``S*_k``, :func:`matching_skills`) and returns a :class:`Decision` of :class:`Check` s, each with
a verdict ``pass`` / ``block`` / ``undecided``:

``known_tool``     the tool is in the prompt's catalog (else ``block``);
``schema``         the arguments satisfy the tool's JSON Schema (``jsonschema``, through
                   :meth:`probes.data.schema.Tool.validate_arguments`); arguments that could not
                   be read (a cut-off call, positional Python arguments) are ``block``: a runtime
                   cannot bind them to the schema;
``avoidance``      every avoidance rule N(s) of S*_k that names the tool (word match);
``applicability``  every applicability condition A(s) of S*_k.

The machine-checkable grammar (:data:`AVOIDANCE_GRAMMAR`, :data:`APPLICABILITY_GRAMMAR`; ``T`` is
the called tool, ``U`` another tool, ``p`` a parameter name):

N  ``Do not call T(args) before U(args') has run.``   applies when the call's arguments include
   ``args``; violated when no earlier call of the conversation is ``U(args')``;
N  ``Do not call T with a guessed p: ...``             violated when the call's ``p`` value does
   not occur in the conversation text (request, earlier turns, observations);
N  ``While T is missing from the function list, ...``  violated when ``T`` is not in the catalog;
A  ``U has already run in this conversation ...``     holds when an earlier call is ``U``;
A  ``The request or an earlier result gives T's p, q (...)``  holds when each of those arguments
   the call passes occurs in the conversation text.

Anything else (every rule of the authored sets' natural-language form, "Do not call T for
personal nudges; ...") is ``undecided`` — never ``pass``. An optional judge (:class:`ChatJudge`,
any local chat model through :class:`probes.engine.generate.ChatGenerator`) may decide undecided
checks; its prompt, model and reply are kept in the check. The decision's verdict is ``block`` if
any check blocks, else ``undecided`` if any check is undecided, else ``pass``.

**h_t** (:func:`repair_hint`): after a failed call, the recovery notes F(s) of the retrieved skills
whose tools include the failed tool, kept when their condition matches the error observation
(:data:`RECOVERY_GRAMMAR`):

F  ``If T fails with CODE, ...``                        CODE (upper-case) occurs in the observation;
F  ``If T fails because U has not run, ...``            the observation is an error and no call of
                                                        the current turn (since the request) is ``U``;

anything else is undecided (the judge may decide it). The hint is the matching notes in retrieval
order under :data:`HINT_HEADER`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from probes.data.bfcl_exec import BFCLExecutionError, is_error_observation, parse_call
from probes.data.dataset import Item
from probes.data.schema import Skill, ToolCatalog

VERDICTS: tuple[str, ...] = ("pass", "block", "undecided")
RULES: tuple[str, ...] = ("known_tool", "schema", "avoidance", "applicability")
HINT_HEADER = "# Repair hint\nA recovery note for the failed call:\n"

_NAME = r"[A-Za-z_][\w.]*"
_BEFORE = re.compile(rf"^Do not call ({_NAME})(\(.*?\)) before ({_NAME}\(.*?\)) has run\.?$")
_GUESSED = re.compile(rf"^Do not call ({_NAME}) with a guessed (\w+)\b")
_MISSING = re.compile(rf"^While ({_NAME}) is missing from the function list\b")
_HAS_RUN = re.compile(rf"^({_NAME}) has already run in this conversation\b")
_GIVES = re.compile(rf"^The request or an earlier result gives ({_NAME})'s ([\w, ]+?)(?: \(|\.|$)")
_FAILS_WITH = re.compile(rf"^If ({_NAME}) fails with ([A-Z][A-Z0-9_]{{2,}})\b")
_FAILS_BECAUSE = re.compile(rf"^If ({_NAME}) fails because ({_NAME}) has not run\b")

AVOIDANCE_GRAMMAR: tuple[str, ...] = (
    "Do not call T(args) before U(args') has run.",
    "Do not call T with a guessed p: ...",
    "While T is missing from the function list, ...",
)
APPLICABILITY_GRAMMAR: tuple[str, ...] = (
    "U has already run in this conversation ...",
    "The request or an earlier result gives T's p, q (...)",
)
RECOVERY_GRAMMAR: tuple[str, ...] = ("If T fails with CODE, ...", "If T fails because U has not run, ...")


# ------------------------------------------------------------------------------------- the state
@dataclass(frozen=True)
class ProposedCall:
    """A call to check: its tool, its keyword arguments (None: not readable) and positional ones."""

    name: str
    arguments: Mapping[str, Any] | None
    positional: tuple[Any, ...] = ()


@dataclass(frozen=True)
class DecisionState:
    """What G may read of x_t: the conversation's text, its earlier calls and the shown catalog."""

    text: str
    calls: tuple[ProposedCall, ...]  # every earlier call of the conversation
    catalog: ToolCatalog
    turn_calls: tuple[ProposedCall, ...] = ()  # the calls since the current request

    @classmethod
    def of(cls, item: Item, catalog: ToolCatalog) -> "DecisionState":
        """The state of ``item``: earlier turns (``context``), the request, the current turn's history."""
        parts, calls = [], []
        for message in (*item.context, {"role": "user", "content": item.user}, *item.history):
            if message.get("tool_call"):
                call = message["tool_call"]
                calls.append(ProposedCall(call["name"], dict(call.get("arguments", {}))))
                parts.append(f"{call['name']} {json.dumps(call.get('arguments', {}), sort_keys=True)}")
            else:
                parts.append(str(message["content"]))
        in_turn = sum(1 for message in item.history if message.get("tool_call"))
        return cls("\n".join(parts), tuple(calls), catalog, tuple(calls[len(calls) - in_turn:]))

    def has_run(self, name: str, arguments: Mapping[str, Any] | None = None, *, turn: bool = False) -> bool:
        """An earlier call (of the current turn with ``turn``) is ``name`` (with at least ``arguments`` when given)."""
        return any(c.name == name and (arguments is None or _includes(c.arguments, arguments)) for c in (self.turn_calls if turn else self.calls))

    def gives(self, value: Any) -> bool:
        """``value`` occurs in the conversation text (each element of a list; numbers as written)."""
        values = value if isinstance(value, list | tuple) else [value]
        return all(_value_text(v) in self.text for v in values)


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _includes(arguments: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    return arguments is not None and all(name in arguments and arguments[name] == value for name, value in wanted.items())


def _literal_arguments(text: str) -> dict[str, Any] | None:
    """The keyword arguments of a call written in a rule (``f(a='x')``), literal-only; None if unreadable."""
    try:
        return dict(parse_call(text).kwargs)
    except BFCLExecutionError:
        return None


# ------------------------------------------------------------------------------------- checks
@dataclass(frozen=True)
class JudgeVerdict:
    """A judge's answer on one undecided condition: its verdict and what produced it."""

    verdict: str  # holds | violated | unknown
    model: str
    prompt: str
    reply: str


@dataclass(frozen=True)
class Check:
    """One rule of G on one call: ``decided_by`` is ``rule`` (the grammar), ``judge`` or ``none``."""

    rule: str
    skill_id: str | None
    text: str
    verdict: str
    reason: str
    decided_by: str = "rule"
    judge: JudgeVerdict | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    """G on one call: the matched skills ``S*_k`` and every check."""

    tool: str
    matched_skills: tuple[str, ...]
    checks: tuple[Check, ...]

    @property
    def verdict(self) -> str:
        verdicts = {c.verdict for c in self.checks}
        return "block" if "block" in verdicts else "undecided" if "undecided" in verdicts else "pass"

    @property
    def blocking(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.verdict == "block")

    def as_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "matched_skills": list(self.matched_skills), "verdict": self.verdict,
                "checks": [c.as_dict() for c in self.checks]}


class Judge(Protocol):
    """Decides a natural-language condition: ``holds`` / ``violated`` / ``unknown``."""

    def __call__(self, kind: str, condition: str, state: DecisionState, call: ProposedCall | None, observation: str | None = None) -> JudgeVerdict: ...


def names_tool(text: str, tool: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(tool)}(?![\w])", text) is not None


def matching_skills(tool: str, skills: Sequence[Skill]) -> list[Skill]:
    """S*_k(x_t, a_t): the skills whose tools include ``tool`` or whose goal names it."""
    return [s for s in skills if tool in s.tool_names or names_tool(s.goal, tool)]


def _avoidance(rule: str, call: ProposedCall, state: DecisionState) -> tuple[str, str]:
    """(verdict, reason) of one avoidance rule that names the called tool."""
    if (m := _BEFORE.match(rule)) and m.group(1) == call.name:
        example, prerequisite = _literal_arguments(m.group(1) + m.group(2)), m.group(3)
        needed = _literal_arguments(prerequisite)
        if example is None or needed is None:
            return "undecided", "a call in the rule is not literal"
        if not _includes(call.arguments, example):
            return "pass", f"the rule is about {m.group(1)}{m.group(2)}; this call's arguments differ"
        name = prerequisite.split("(", 1)[0]
        return ("pass", f"{prerequisite} has run") if state.has_run(name, needed) else ("block", f"{prerequisite} has not run")
    if (m := _GUESSED.match(rule)) and m.group(1) == call.name:
        parameter = m.group(2)
        if call.arguments is None or parameter not in call.arguments:
            return "pass", f"the call does not pass {parameter}"
        value = call.arguments[parameter]
        return ("pass", f"{parameter}={value!r} occurs in the conversation") if state.gives(value) \
            else ("block", f"{parameter}={value!r} occurs nowhere in the conversation (guessed)")
    if (m := _MISSING.match(rule)) and m.group(1) == call.name:
        return ("pass", f"{call.name} is in the catalog") if call.name in state.catalog else ("block", f"{call.name} is not in the catalog")
    return "undecided", "not in the avoidance grammar"


def _applicability(condition: str, call: ProposedCall, state: DecisionState) -> tuple[str, str]:
    """(verdict, reason) of one applicability condition; ``pass`` means it holds."""
    if m := _HAS_RUN.match(condition):
        name = m.group(1)
        return ("pass", f"{name} has run") if state.has_run(name) else ("block", f"{name} has not run")
    if (m := _GIVES.match(condition)) and m.group(1) == call.name:
        if call.arguments is None:
            return "block", "the call's arguments are not readable"
        parameters = [p.strip() for p in m.group(2).split(",") if p.strip() in call.arguments]
        missing = [p for p in parameters if not state.gives(call.arguments[p])]
        if missing:
            return "block", f"{', '.join(missing)} not given in the conversation"
        return "pass", f"{', '.join(parameters) or 'no listed parameter passed'}: given in the conversation"
    return "undecided", "not in the applicability grammar"


def check_call(call: ProposedCall, state: DecisionState, skills: Sequence[Skill], *, judge: Judge | None = None,
               schema: bool = True) -> Decision:
    """G(x_t, a_t, S_k) of Eq. 11 (module docstring): every rule, deterministic first, then the judge
    on what stayed undecided. ``schema`` False: a tool without its arguments (a revision picks a tool)."""
    checks = [Check("known_tool", None, call.name, "pass" if call.name in state.catalog else "block",
                    "in the catalog" if call.name in state.catalog else "not in the catalog")]
    if call.name in state.catalog and schema:
        if call.arguments is None or call.positional:
            checks.append(Check("schema", None, call.name, "block", "arguments not readable as named JSON values"))
        else:
            problems = state.catalog[call.name].validate_arguments(call.arguments)
            checks.append(Check("schema", None, call.name, "block" if problems else "pass", "; ".join(problems) or "valid"))
    matched = matching_skills(call.name, skills)
    for skill in matched:
        for rule in skill.avoidance_rules:
            if names_tool(rule, call.name):
                checks.append(Check("avoidance", skill.id, rule, *_avoidance(rule, call, state)))
        for condition in skill.applicability:
            checks.append(Check("applicability", skill.id, condition, *_applicability(condition, call, state)))
    if judge is not None:
        checks = [_judged(c, judge, state, call) if c.verdict == "undecided" else c for c in checks]
    return Decision(call.name, tuple(s.id for s in matched), tuple(checks))


def _judged(check: Check, judge: Judge, state: DecisionState, call: ProposedCall) -> Check:
    answer = judge(check.rule, check.text, state, call)
    # holds: the condition holds / the rule is kept; violated: it fails / the call breaks it
    verdict = {"holds": "pass", "violated": "block"}.get(answer.verdict, "undecided")
    return Check(check.rule, check.skill_id, check.text, verdict, f"judge: {answer.verdict}",
                 "judge" if verdict != "undecided" else "none", answer)


# ------------------------------------------------------------------------------------- the judge
JUDGE_QUESTIONS: dict[str, str] = {
    "avoidance": "Does the proposed call break this rule?",
    "applicability": "Does this condition hold in the conversation?",
    "recovery": "Does this recovery note's condition match the error observation?",
}
JUDGE_INSTRUCTION = "You check tool calls against rules. Answer with one word: YES or NO."


class ChatJudge:
    """Decides undecided conditions with a local chat model (``generator(messages) -> Reply``, e.g.
    :class:`probes.engine.generate.ChatGenerator`); a reply that does not start with YES or NO is
    ``unknown`` and the check stays undecided."""

    def __init__(self, generator: Callable[[list[dict[str, str]]], Any], model: str) -> None:
        self.generator = generator
        self.model = model

    def prompt(self, kind: str, condition: str, state: DecisionState, call: ProposedCall | None, observation: str | None) -> str:
        lines = [f"Conversation:\n{state.text}"]
        if call is not None:
            lines.append(f"Proposed call: {call.name} {json.dumps(call.arguments, sort_keys=True, default=repr)}")
        if observation is not None:
            lines.append(f"Error observation: {observation}")
        kind_label = {"avoidance": "Rule", "applicability": "Condition", "recovery": "Recovery note"}[kind]
        lines.append(f"{kind_label}: {condition}\n{JUDGE_QUESTIONS[kind]}")
        return "\n\n".join(lines)

    def __call__(self, kind: str, condition: str, state: DecisionState, call: ProposedCall | None, observation: str | None = None) -> JudgeVerdict:
        prompt = self.prompt(kind, condition, state, call, observation)
        reply = self.generator([{"role": "system", "content": JUDGE_INSTRUCTION}, {"role": "user", "content": prompt}])
        text = getattr(reply, "text", reply)
        word = text.strip().split(maxsplit=1)[0].strip(".,!:").upper() if text.strip() else ""
        yes = {"avoidance": "violated", "applicability": "holds", "recovery": "holds"}[kind]
        no = {"avoidance": "holds", "applicability": "violated", "recovery": "violated"}[kind]
        return JudgeVerdict({"YES": yes, "NO": no}.get(word, "unknown"), self.model, prompt, text)


# ------------------------------------------------------------------------------------- h_t
@dataclass(frozen=True)
class NoteMatch:
    """One recovery note of a skill matching the failed call, and whether its condition matched."""

    skill_id: str
    note: str
    verdict: str  # match | no_match | undecided
    reason: str
    decided_by: str = "rule"
    judge: JudgeVerdict | None = None


@dataclass(frozen=True)
class Hint:
    """h_t of Eq. 12: the notes considered and the hint text (empty when no note matched)."""

    failed_tool: str
    notes: tuple[NoteMatch, ...] = field(default_factory=tuple)

    @property
    def matched(self) -> tuple[str, ...]:
        return tuple(n.note for n in self.notes if n.verdict == "match")

    @property
    def text(self) -> str:
        return HINT_HEADER + "\n".join(f"- {note}" for note in self.matched) if self.matched else ""

    @property
    def n_undecided(self) -> int:
        return sum(n.verdict == "undecided" for n in self.notes)

    def as_dict(self) -> dict[str, Any]:
        return {"failed_tool": self.failed_tool, "text": self.text, "notes": [asdict(n) for n in self.notes]}


def _note(note: str, failed: ProposedCall, observation: str, state: DecisionState) -> tuple[str, str]:
    if (m := _FAILS_WITH.match(note)) and m.group(1) == failed.name:
        code = m.group(2)
        return ("match", f"{code} in the observation") if code in observation else ("no_match", f"{code} not in the observation")
    if (m := _FAILS_BECAUSE.match(note)) and m.group(1) == failed.name:
        prerequisite = m.group(2)
        if not is_error_observation(observation):  # BFCL's test; the authored sets' {"error": ...} too
            return "no_match", "the observation is not an error"
        if state.has_run(prerequisite, turn=True):
            return "no_match", f"{prerequisite} has run in this turn"
        return "match", f"an error and {prerequisite} has not run in this turn"
    return "undecided", "not in the recovery grammar"


def repair_hint(failed: ProposedCall, observation: str, state: DecisionState, skills: Sequence[Skill], *,
                judge: Judge | None = None) -> Hint:
    """h_t = Repair(x_t, a_t, o_{t+1}, S_k) (Eq. 12): the recovery notes of the skills of ``skills``
    whose tools include the failed tool, matched against the observation (module docstring).
    ``state`` is the conversation before the failed call."""
    notes = []
    for skill in skills:
        if failed.name not in skill.tool_names:
            continue
        for note in skill.recovery_notes:
            verdict, reason = _note(note, failed, observation, state)
            if verdict == "undecided" and judge is not None:
                answer = judge("recovery", note, state, failed, observation)
                verdict = {"holds": "match", "violated": "no_match"}.get(answer.verdict, "undecided")
                notes.append(NoteMatch(skill.id, note, verdict, f"judge: {answer.verdict}", "judge" if verdict != "undecided" else "none", answer))
                continue
            notes.append(NoteMatch(skill.id, note, verdict, reason))
    return Hint(failed.name, tuple(notes))


def proposed(name: str | None, arguments: Any, positional: Sequence[Any] = ()) -> ProposedCall | None:
    """A :class:`ProposedCall` from a parsed tool call's fields (None without a name)."""
    if name is None:
        return None
    return ProposedCall(name, dict(arguments) if isinstance(arguments, Mapping) else None, tuple(positional))

