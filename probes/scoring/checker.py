"""The boundary checker G (paper §4.2, Eq. 11) and the repair hint h_t (Eq. 12), deterministic first.

**G** compares a proposed call ``a_t`` with the retrieved skills whose tools or goal name its tool
(``S*_k``, :func:`matching_skills`) and returns a :class:`Decision` of :class:`Check` s, each with
a verdict ``pass`` / ``block`` / ``undecided``:

``known_tool``     the tool is in the prompt's catalog (else ``block``);
``complete``       the call was decoded in full (else ``block``: cut off by the token budget,
                   malformed JSON, a non-literal argument; a runtime cannot run it, and its readable
                   prefix is not schema-checked, so the reason stays the true one);
``schema``         the arguments satisfy the tool's JSON Schema (``jsonschema``, through
                   :meth:`probes.data.schema.Tool.validate_arguments`); positional Python arguments
                   are ``block``: a runtime cannot bind them to the schema;
``avoidance``      every avoidance rule N(s) of S*_k that names the tool (word match);
``applicability``  every applicability condition A(s) of S*_k.

The machine-checkable grammar is :data:`FORMS` (each form: how it is written, its regular
expression, what it decides; :data:`AVOIDANCE_GRAMMAR` / :data:`APPLICABILITY_GRAMMAR` list them).
``T`` is the called tool, ``U`` another tool, ``p`` a parameter, ``PFX`` an identifier prefix
(``ORD``, ``BK``, ``EVT``, ``T``):

N  ``Do not call T(args) before U(args') has run.``  block a call of T with ``args`` unless an
   earlier call is ``U(args')``;
N  ``Do not call T with a guessed p: ...``            block when p's value occurs nowhere in the
                                                      conversation text;
N  ``While T is missing from the function list, ...`` block when T is not in the catalog;
N  ``Do not call T for PFX- ...``                    block when an argument starts with ``PFX-``;
                                                      pass when none does and the user names no
                                                      ``PFX-`` identifier; else undecided;
N  ``Do not ...; call U ...``                         pass for a call of U, the rule's alternative;
N  ``If so, prefer U over T.``                        pass for a call of U; T undecided ("if so"
                                                      is the skill's risk cue, free text);
A  ``U has already run in this conversation ...``    holds when an earlier call is U;
A  ``The request or an earlier result gives T's p, q (...)``  holds when each of those arguments the
                                                      call passes occurs in the conversation text;
A  ``... gives|provides|names ... such as PFX-123``  holds when the user's messages name a
                                                      ``PFX-<digits>`` identifier that no not-found
                                                      error observation names;
A  ``... PFX- ...`` (``The order ID has the ORD- shop format.``)  holds when an argument starts
                                                      with ``PFX-``, fails when an identifier-shaped
                                                      argument has another prefix, else undecided;
A  ``... was|were not found ...``                    holds when an error observation says not found;
A  ``... was|were rejected|refused ...``             an error observation is required (its reason
                                                      is not read: undecided when there is one);
A  ``... provides an|the email address ...``         fails without an e-mail address in the user's
                                                      messages; holds with one when nothing follows.

The last three describe an event. When the conversation does not show it, the condition fails only
if it is its skill's sole applicability condition and has no "or": the data do not say whether a
skill's conditions are alternatives ("names a future date" / "an immediate transfer was refused")
or all required, and a missing event must not block a call that another condition licenses.

Anything else (most of the authored sets' natural language: "Do not call T for personal nudges")
is ``undecided`` — never ``pass``; :func:`grammar_coverage` counts how much of a library is in the
grammar (no form reads a skill's risk cues). An optional judge (:class:`ChatJudge`, any local chat
model through :class:`probes.engine.generate.ChatGenerator`) may decide undecided checks; its prompt,
model and reply are kept in the check; none runs unless one is named. The decision's verdict is
``block`` if any check blocks, else ``undecided`` if any check is undecided, else ``pass``. Only a
block by a boundary rule (:data:`BOUNDARY_RULES`: avoidance, applicability) is boundary checking;
the catalog, completeness and schema checks (:data:`RUNNABLE_RULES`) say whether a runtime could run
the call at all (:func:`boundary_verdict` reads the first kind alone).

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import pandas as pd

from probes.data.bfcl_exec import BFCLExecutionError, is_error_observation, parse_call
from probes.data.dataset import Item
from probes.data.schema import Skill, ToolCatalog

VERDICTS: tuple[str, ...] = ("pass", "block", "undecided")
RULES: tuple[str, ...] = ("known_tool", "complete", "schema", "avoidance", "applicability")
# G's rules in two kinds: whether a runtime could run the call at all, and the skills' boundary rules. Only a
# block by a boundary rule is boundary checking; risk cues have no form (G never reads them) and recovery notes are h_t's.
RUNNABLE_RULES: tuple[str, ...] = ("known_tool", "complete", "schema")
BOUNDARY_RULES: tuple[str, ...] = ("avoidance", "applicability")
HINT_HEADER = "# Repair hint\nA recovery note for the failed call:\n"

_NAME = r"[A-Za-z_][\w.]*"
_ID_PREFIX = r"[A-Z]{1,5}"  # an identifier's upper-case prefix: ORD-, BK-, EVT-, T-
_ID = re.compile(rf"\b{_ID_PREFIX}-\w+")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_NOT_FOUND = re.compile(r"not[ _]found", re.IGNORECASE)
_OR = re.compile(r"\bor\b")


@dataclass(frozen=True)
class Form:
    """One machine-checkable form of the grammar: how it is ``written`` (T the called tool, U another
    tool, p a parameter, PFX an identifier prefix), its ``pattern`` (``re.match`` on the condition)
    and what it ``decides``."""

    kind: str  # avoidance | applicability | recovery
    name: str
    written: str
    pattern: re.Pattern[str]
    decides: str
    two_way: bool = True  # it can both pass and block a call of the tool it is about (else one verdict only)


FORMS: tuple[Form, ...] = (
    Form("avoidance", "before", "Do not call T(args) before U(args') has run.",
         re.compile(rf"^Do not call ({_NAME})(\(.*?\)) before ({_NAME}\(.*?\)) has run\.?$"),
         "a call of T with at least args: block unless an earlier call is U(args'); other calls of T pass"),
    Form("avoidance", "guessed", "Do not call T with a guessed p: ...", re.compile(rf"^Do not call ({_NAME}) with a guessed (\w+)\b"),
         "block when T's p value occurs nowhere in the conversation text, else pass"),
    Form("avoidance", "missing", "While T is missing from the function list, ...",
         re.compile(rf"^While ({_NAME}) is missing from the function list\b"), "block when T is not in the catalog, else pass"),
    Form("avoidance", "id_prefix", "Do not call T for PFX- ...",
         re.compile(rf"^Do not call ({_NAME}) for (?:an? )?({_ID_PREFIX})- "),
         "block when an argument of T starts with PFX-; pass when none does and the request names no PFX- identifier; "
         "else undecided"),
    Form("avoidance", "alternative", "Do not ...; call U ...", re.compile(rf"^Do not (.+?); call ({_NAME})\b"),
         "pass for a call of U (the rule's alternative, not named in what it forbids); other calls: another form or undecided", two_way=False),
    Form("avoidance", "prefer", "If so, prefer U over T.", re.compile(rf"^If so, prefer ({_NAME}) over ({_NAME})\.?$"),
         "pass for a call of U; a call of T undecided ('if so' refers to the skill's risk cues, free text)", two_way=False),
    Form("applicability", "has_run", "U has already run in this conversation ...",
         re.compile(rf"^({_NAME}) has already run in this conversation\b"), "pass when an earlier call is U, else block"),
    Form("applicability", "gives", "The request or an earlier result gives T's p, q (...)",
         re.compile(rf"^The request or an earlier result gives ({_NAME})'s ([\w, ]+?)(?: \(|\.|$)"),
         "for a call of T: pass when each listed argument it passes occurs in the conversation text, else block"),
    Form("applicability", "id_given", "... gives|provides|names ... such as PFX-123 ...",
         re.compile(rf"^(?=.*\b(?:gives|provides|names)\b).*\bsuch as ({_ID_PREFIX})-\d+\b"),
         "pass when the user's messages name a PFX-<digits> identifier that no not-found error observation names, else block"),
    Form("applicability", "id_format", "... PFX- ... (an identifier's prefix, e.g. 'The order ID has the ORD- shop format.')",
         re.compile(rf"^(?!.*\bsuch as\b).*?\b({_ID_PREFIX})- "),
         "pass when an argument starts with PFX-; block when an identifier-shaped argument (PFX2-...) has another prefix "
         "and none starts with PFX-; else undecided"),
    Form("applicability", "not_found", "... was|were not found ...", re.compile(r"^.*\b(?:was|were) not found\b"),
         "pass when an error observation of the conversation says not found; without one: block when the condition has no "
         "'or' and is the skill's only applicability condition, else undecided"),
    Form("applicability", "refused", "... was|were rejected|refused ...", re.compile(r"^.*\b(?:was|were) (?:rejected|refused)\b"),
         "without an error observation in the conversation: block when the condition has no 'or' and is the skill's only "
         "applicability condition; else undecided (the reason of an error is not read)", two_way=False),
    Form("applicability", "email", "... provides an|the email address ...", re.compile(r"^.*\bprovides (?:an|the) email address\b(.*)$"),
         "block when the user's messages hold no e-mail address; pass when they do and nothing follows 'email address'; "
         "else undecided"),
    Form("recovery", "fails_with", "If T fails with CODE, ...", re.compile(rf"^If ({_NAME}) fails with ([A-Z][A-Z0-9_]{{2,}})\b"),
         "match when CODE occurs in the observation"),
    Form("recovery", "fails_because", "If T fails because U has not run, ...",
         re.compile(rf"^If ({_NAME}) fails because ({_NAME}) has not run\b"),
         "match when the observation is an error and no call of the current turn is U"),
)
_FORM = {(f.kind, f.name): f for f in FORMS}
AVOIDANCE_GRAMMAR: tuple[str, ...] = tuple(f.written for f in FORMS if f.kind == "avoidance")
APPLICABILITY_GRAMMAR: tuple[str, ...] = tuple(f.written for f in FORMS if f.kind == "applicability")
RECOVERY_GRAMMAR: tuple[str, ...] = tuple(f.written for f in FORMS if f.kind == "recovery")


def condition_forms(kind: str, text: str) -> tuple[str, ...]:
    """The names of the grammar's forms of ``kind`` that ``text`` is written in (empty: free text)."""
    if kind not in ("avoidance", "applicability", "recovery"):
        raise ValueError(f"kind must be avoidance, applicability or recovery, got {kind!r}")
    return tuple(f.name for f in FORMS if f.kind == kind and f.pattern.match(text))


# ------------------------------------------------------------------------------------- the state
@dataclass(frozen=True)
class ProposedCall:
    """A call to check: its tool, its keyword arguments (None: not readable) and positional ones;
    ``complete`` False (with the parser's ``error``) for a call cut off by the token budget, malformed
    JSON or a non-literal argument: its arguments are only the readable prefix."""

    name: str
    arguments: Mapping[str, Any] | None
    positional: tuple[Any, ...] = ()
    complete: bool = True
    error: str | None = None


@dataclass(frozen=True)
class DecisionState:
    """What G may read of x_t: the conversation's text, its earlier calls and the shown catalog;
    ``said`` is the user's messages only, ``observations`` every tool observation, in order."""

    text: str
    calls: tuple[ProposedCall, ...]  # every earlier call of the conversation
    catalog: ToolCatalog
    turn_calls: tuple[ProposedCall, ...] = ()  # the calls since the current request
    said: str = ""
    observations: tuple[str, ...] = ()

    @classmethod
    def of(cls, item: Item, catalog: ToolCatalog) -> "DecisionState":
        """The state of ``item``: earlier turns (``context``), the request, the current turn's history."""
        parts, calls, said, observations = [], [], [], []
        for message in (*item.context, {"role": "user", "content": item.user}, *item.history):
            if message.get("tool_call"):
                call = message["tool_call"]
                calls.append(ProposedCall(call["name"], dict(call.get("arguments", {}))))
                parts.append(f"{call['name']} {json.dumps(call.get('arguments', {}), sort_keys=True)}")
            else:
                parts.append(str(message["content"]))
                (said if message["role"] == "user" else observations).append(str(message["content"]))
        in_turn = sum(1 for message in item.history if message.get("tool_call"))
        return cls("\n".join(parts), tuple(calls), catalog, tuple(calls[len(calls) - in_turn:]), "\n".join(said), tuple(observations))

    @property
    def errors(self) -> tuple[str, ...]:
        """The observations that are errors (BFCL's test; the authored sets' ``{"error": ...}`` too)."""
        return tuple(o for o in self.observations if is_error_observation(o))

    def not_found(self) -> tuple[str, ...]:
        """The error observations that say something was not found."""
        return tuple(o for o in self.errors if _NOT_FOUND.search(o))

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
        return combined_verdict(c.verdict for c in self.checks)

    @property
    def blocking(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.verdict == "block")

    def as_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "matched_skills": list(self.matched_skills), "verdict": self.verdict,
                "checks": [c.as_dict() for c in self.checks]}


def combined_verdict(verdicts: Iterable[str]) -> str:
    """``block`` if any check blocks, else ``undecided`` if any is undecided, else ``pass`` (also of no check)."""
    verdicts = set(verdicts)
    return "block" if "block" in verdicts else "undecided" if "undecided" in verdicts else "pass"


def boundary_verdict(checks: Iterable[Mapping[str, Any]]) -> str:
    """G's verdict from its boundary rules alone (:data:`BOUNDARY_RULES`), on a decision's checks as written to
    the rows (:meth:`Decision.as_dict`): ``block`` / ``undecided`` / ``pass``, or ``none`` when no boundary
    rule applied (no retrieved skill names the tool, or none of its rules does)."""
    verdicts = [c["verdict"] for c in checks if c["rule"] in BOUNDARY_RULES]
    return combined_verdict(verdicts) if verdicts else "none"


class Judge(Protocol):
    """Decides a natural-language condition: ``holds`` / ``violated`` / ``unknown``."""

    def __call__(self, kind: str, condition: str, state: DecisionState, call: ProposedCall | None, observation: str | None = None) -> JudgeVerdict: ...


def names_tool(text: str, tool: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(tool)}(?![\w])", text) is not None


def matching_skills(tool: str, skills: Sequence[Skill]) -> list[Skill]:
    """S*_k(x_t, a_t): the skills whose tools include ``tool`` or whose goal names it."""
    return [s for s in skills if tool in s.tool_names or names_tool(s.goal, tool)]


Verdict = tuple[str, str]  # (pass | block | undecided, reason)


def _string_arguments(call: ProposedCall) -> list[str]:
    return [v for v in (call.arguments or {}).values() if isinstance(v, str)]


def _before(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    if m.group(1) != call.name:
        return None
    example, prerequisite = _literal_arguments(m.group(1) + m.group(2)), m.group(3)
    needed = _literal_arguments(prerequisite)
    if example is None or needed is None:
        return "undecided", "a call in the rule is not literal"
    if not _includes(call.arguments, example):
        return "pass", f"the rule is about {m.group(1)}{m.group(2)}; this call's arguments differ"
    name = prerequisite.split("(", 1)[0]
    return ("pass", f"{prerequisite} has run") if state.has_run(name, needed) else ("block", f"{prerequisite} has not run")


def _guessed(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    if m.group(1) != call.name:
        return None
    parameter = m.group(2)
    if call.arguments is None or parameter not in call.arguments:
        return "pass", f"the call does not pass {parameter}"
    value = call.arguments[parameter]
    return ("pass", f"{parameter}={value!r} occurs in the conversation") if state.gives(value) \
        else ("block", f"{parameter}={value!r} occurs nowhere in the conversation (guessed)")


def _missing(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    if m.group(1) != call.name:
        return None
    return ("pass", f"{call.name} is in the catalog") if call.name in state.catalog else ("block", f"{call.name} is not in the catalog")


def _id_prefix(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    if m.group(1) != call.name:
        return None
    prefix = m.group(2) + "-"
    if any(v.startswith(prefix) for v in _string_arguments(call)):
        return "block", f"an argument is a {prefix} identifier"
    if re.search(rf"\b{prefix}\w", state.said):
        return "undecided", f"the user names a {prefix} identifier the call does not pass"
    return "pass", f"no {prefix} identifier in the call or the user's messages"


def _alternative(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    if m.group(2) != call.name or names_tool(m.group(1), call.name):
        return None
    return "pass", f"the rule names {call.name} as what to call instead"


def _prefer(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    if m.group(1) == call.name:
        return "pass", f"the rule prefers {call.name}"
    if m.group(2) == call.name:
        return "undecided", "'if so' refers to the skill's risk cues (free text)"
    return None


def _has_run(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    name = m.group(1)
    return ("pass", f"{name} has run") if state.has_run(name) else ("block", f"{name} has not run")


def _gives(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    if m.group(1) != call.name:
        return None
    if call.arguments is None:
        return "block", "the call's arguments are not readable"
    parameters = [p.strip() for p in m.group(2).split(",") if p.strip() in call.arguments]
    missing = [p for p in parameters if not state.gives(call.arguments[p])]
    if missing:
        return "block", f"{', '.join(missing)} not given in the conversation"
    return "pass", f"{', '.join(parameters) or 'no listed parameter passed'}: given in the conversation"


def _id_given(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    prefix = m.group(1) + "-"
    named = re.findall(rf"\b{prefix}\d+\b", state.said)
    live = [i for i in named if not any(i in o for o in state.not_found())]
    if live:
        return "pass", f"the user gives {live[0]}"
    return "block", (f"every {prefix} identifier the user gave was not found" if named else f"the user gives no {prefix} identifier")


def _id_format(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    prefix = m.group(1) + "-"
    values = _string_arguments(call)
    if any(v.startswith(prefix) for v in values):
        return "pass", f"an argument starts with {prefix}"
    others = [v for v in values if _ID.fullmatch(v)]
    if others:
        return "block", f"the identifier {others[0]!r} is not a {prefix} one"
    return "undecided", "the call passes no identifier"


def _trigger_absent(condition: str, n_conditions: int, what: str) -> Verdict:
    """A condition that names an event (an error) the conversation does not show: it fails, unless another
    condition of the skill or a disjunct of this one may be what applies."""
    if _OR.search(condition) or n_conditions > 1:
        return "undecided", f"no {what}, but the condition is one of several (or has an 'or')"
    return "block", f"no {what} in the conversation"


def _not_found(m: re.Match[str], call: ProposedCall, state: DecisionState, n_conditions: int) -> Verdict | None:
    if found := state.not_found():
        return "pass", f"an error observation says not found: {found[-1][:80]}"
    return _trigger_absent(m.string, n_conditions, "not-found error observation")


def _refused(m: re.Match[str], call: ProposedCall, state: DecisionState, n_conditions: int) -> Verdict | None:
    if state.errors:
        return "undecided", "an error was observed; its reason is not read"
    return _trigger_absent(m.string, n_conditions, "error observation")


def _email(m: re.Match[str], call: ProposedCall, state: DecisionState, _: int) -> Verdict | None:
    if not (found := _EMAIL.search(state.said)):
        return "block", "the user's messages hold no e-mail address"
    if m.group(1).strip(" ."):
        return "undecided", f"the user gives {found.group(0)}; '{m.group(1).strip(' .')}' is not checked"
    return "pass", f"the user gives {found.group(0)}"


_DECIDE: dict[tuple[str, str], Callable[[re.Match[str], ProposedCall, DecisionState, int], Verdict | None]] = {
    ("avoidance", "before"): _before, ("avoidance", "guessed"): _guessed, ("avoidance", "missing"): _missing,
    ("avoidance", "id_prefix"): _id_prefix, ("avoidance", "alternative"): _alternative, ("avoidance", "prefer"): _prefer,
    ("applicability", "has_run"): _has_run, ("applicability", "gives"): _gives, ("applicability", "id_given"): _id_given,
    ("applicability", "id_format"): _id_format, ("applicability", "not_found"): _not_found, ("applicability", "refused"): _refused,
    ("applicability", "email"): _email,
}


def decide(kind: str, text: str, call: ProposedCall, state: DecisionState, n_conditions: int = 1) -> Verdict:
    """(verdict, reason) of one avoidance rule or applicability condition on ``call`` (``pass``: the rule is
    kept / the condition holds): the first form of the grammar that decides it, else ``undecided``.
    ``n_conditions``: how many applicability conditions the skill lists (trigger forms read it)."""
    forms = condition_forms(kind, text)
    for name in forms:
        m = _FORM[(kind, name)].pattern.match(text)
        assert m is not None
        if (verdict := _DECIDE[(kind, name)](m, call, state, n_conditions)) is not None:
            return verdict
    return "undecided", (f"form {'/'.join(forms)} does not decide a call of {call.name}" if forms else f"not in the {kind} grammar")


def check_call(call: ProposedCall, state: DecisionState, skills: Sequence[Skill], *, judge: Judge | None = None) -> Decision:
    """G(x_t, a_t, S_k) of Eq. 11 (module docstring): every rule, deterministic first, then the judge
    on what stayed undecided."""
    checks = [Check("known_tool", None, call.name, "pass" if call.name in state.catalog else "block",
                    "in the catalog" if call.name in state.catalog else "not in the catalog")]
    if call.name in state.catalog:
        if not call.complete:  # its arguments are a readable prefix only: a schema verdict on them would misstate the failure
            checks.append(Check("complete", None, call.name, "block", f"{call.error or 'incomplete'}: a runtime cannot run it"))
        elif call.arguments is None or call.positional:
            checks.append(Check("complete", None, call.name, "pass", "decoded in full"))
            checks.append(Check("schema", None, call.name, "block", "arguments not readable as named JSON values"))
        else:
            checks.append(Check("complete", None, call.name, "pass", "decoded in full"))
            problems = state.catalog[call.name].validate_arguments(call.arguments)
            checks.append(Check("schema", None, call.name, "block" if problems else "pass", "; ".join(problems) or "valid"))
    matched = matching_skills(call.name, skills)
    for skill in matched:
        for rule in skill.avoidance_rules:
            if names_tool(rule, call.name):
                checks.append(Check("avoidance", skill.id, rule, *decide("avoidance", rule, call, state)))
        for condition in skill.applicability:
            checks.append(Check("applicability", skill.id, condition,
                                *decide("applicability", condition, call, state, len(skill.applicability))))
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
    if (m := _FORM[("recovery", "fails_with")].pattern.match(note)) and m.group(1) == failed.name:
        code = m.group(2)
        return ("match", f"{code} in the observation") if code in observation else ("no_match", f"{code} not in the observation")
    if (m := _FORM[("recovery", "fails_because")].pattern.match(note)) and m.group(1) == failed.name:
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


def proposed(call: Any) -> ProposedCall | None:
    """A :class:`ProposedCall` from a parsed :class:`probes.scoring.toolcalls.ToolCall` (None without a name)."""
    if call is None or call.name is None:
        return None
    arguments = dict(call.arguments) if isinstance(call.arguments, Mapping) else None
    return ProposedCall(call.name, arguments, tuple(call.positional), call.complete, call.error)


COVERAGE_FIELDS: tuple[tuple[str, str], ...] = (("applicability", "applicability"), ("avoidance", "avoidance_rules"),
                                                ("risk", "risk_cues"), ("recovery", "recovery_notes"))


def grammar_coverage(skills: Sequence[Skill]) -> pd.DataFrame:
    """Per boundary field (applicability, avoidance, risk, recovery): the skills' conditions, how many are
    written in a form of the grammar (``parsed``; the rest is free text: undecided unless a judge
    decides it), how many in a form that can both pass and block (``two_way``; the others give one
    verdict, e.g. pass for a rule's alternative tool) and how many per form. Risk cues have no form:
    G never reads them (``parsed`` 0)."""
    out = []
    for kind, attribute in COVERAGE_FIELDS:
        texts = [text for skill in skills for text in getattr(skill, attribute)]
        forms = [() if kind == "risk" else condition_forms(kind, text) for text in texts]
        two_way = sum(any(_FORM[(kind, name)].two_way for name in names) for names in forms)
        row = {"field": kind, "conditions": len(texts), "parsed": sum(bool(f) for f in forms), "two_way": two_way}
        row["share_parsed"] = row["parsed"] / len(texts) if texts else float("nan")
        row["share_two_way"] = two_way / len(texts) if texts else float("nan")
        row.update({f"form_{f.name}": sum(f.name in names for names in forms) for f in FORMS if f.kind == kind})
        out.append(row)
    frame = pd.DataFrame(out)
    forms = [c for c in frame.columns if c.startswith("form_")]
    frame[forms] = frame[forms].fillna(0).astype(int)  # a form of another field: none of this field's conditions
    return frame

