"""Tool calls in what chat models really write: one parser for every call syntax, strict and lenient.

:func:`parse_reply` is the entry point (``calls``, ``paired`` and the boundary checker share it): it
finds every call *attempt* in a reply, in order, whatever syntax it uses, and returns a
:class:`ParsedReply` of :class:`ToolCall` s. Syntaxes (``ToolCall.syntax``, where the call is):

``tool_call_tag``      Qwen / Hermes ``<tool_call>{json}</tool_call>`` (Qwen3's template format)
``mistral``            Mistral ``[TOOL_CALLS] [{json}, ...]`` or ``[TOOL_CALLS]name[ARGS]{json}``
``function_tag``       Llama 3.1's ``<function=name>{json}</function>``
``fenced_json``, ``fenced_tool_call``, ``fenced_python``, ``fenced``, ``fenced_other``
                       a Markdown fence (```json, ```tool_call, ```python / ```py, unlabelled, any
                       other label) around JSON or Python calls; an unclosed fence runs to the end
``bare_json``          a JSON call object (or list of them) anywhere in the text, prose around it
``python``             Python call syntax ``name(arg=value, ...)`` or ``[f(...), g(...)]`` on a line
                       of its own, bare or in single backticks (BFCL's prompting format); a call
                       inside running prose is a mention, not a call

and shapes (``ToolCall.shape``, what the payload looks like): ``name_arguments``
(``{"name", "arguments"}``), ``name_parameters`` (Llama 3's ``{"name", "parameters"}``),
``openai_function`` (``{"type": "function", "function": {"name", "arguments"}}``), ``name_only``
(a name whose arguments never came: inside a call container, or cut off), ``name_args`` (a name,
then its arguments object: ``name[ARGS]{...}``, ``<function=name>{...}``) and ``python_call``;
``in_list`` marks a call inside a list of calls.

JSON is read with ``json.JSONDecoder.raw_decode`` from each ``{`` / ``[`` (prose after the value is
left alone). A value that does not decode is *truncated* (it runs to the end of the text: the token
budget cut it) or *malformed*; either way its longest well-formed prefix is closed (open string
ended, open brackets closed) and decoded, so a cut-off call still shows its name and is a call
attempt that did not complete (``complete`` False), never an abstention. An object shaped like a
tool *schema* (a ``description`` key, or ``parameters`` that are a JSON Schema ``{"type": "object",
"properties": ...}``), which small models echo from their prompt, is not a call; outside a call
container (``<tool_call>``, ``[TOOL_CALLS]``, a ``tool_call`` fence) neither is an object cut off
before its ``arguments`` (or ``parameters``) key, which cannot be told from such an echo.

Python call syntax is decoded by :func:`probes.data.bfcl_exec.call_from_node`: ``ast.parse`` and
``ast.literal_eval`` of every argument, so model text is never evaluated. A call cut off mid-way is
closed the same way as JSON (open string and brackets closed, a keyword being written dropped);
prose with an unclosed parenthesis does not parse so and stays prose. BFCL's own decoder
(``bfcl_eval.model_handler.utils.ast_parse`` / ``default_decode_ast_prompting``) is deliberately not
imported: its module imports tree-sitter parsers at import time, so it fails without bfcl-eval's
pinned dependencies (installed here with ``--no-deps``), and its ``resolve_ast_by_type`` calls
``eval`` on arithmetic and lambda nodes, which must never run on model text. We mirror its rules
instead: backticks, newlines and spaces stripped from the ends, a call or a list of calls, dotted
names; it reads a bare name argument as its string, here a non-literal argument leaves the call
incomplete.

**Strict and lenient.** Each call records ``template_format``: whether it is written where the
prompt's template puts calls (:data:`TEMPLATES`: ``native`` = inside ``<tool_call>`` tags;
``prompted`` = BFCL Python call syntax that is the whole reply, unfenced or in an unlabelled fence
as BFCL's decoder strips it), and ``executable``: whether a tool runtime would run it (``native``:
one complete JSON object with ``name`` and ``arguments`` per tag; ``prompted``: BFCL's decoder reads
the whole reply as calls and this one's arguments are literals). :meth:`ParsedReply.status`:

lenient  the first attempt with a readable name is the action (``call``); attempts with no
         readable name only: ``parse_failure``; no attempt at all: ``abstain``;
strict   the first template-format attempt is the action: ``call`` if it is executable, else
         ``parse_failure`` (the runtime would fail on it); with no template-format attempt, a reply
         that still calls a named tool in another syntax is ``off_template_call`` (a runtime would
         not execute it; never an abstention), one with only unreadable attempts
         ``parse_failure``, one without any attempt ``abstain``.

So ``abstain`` means the same in both modes: the reply contains no call of any syntax.
:func:`outcome` classifies the action against an item (:data:`OUTCOMES`): ``correct_tool``,
``wrong_tool``, ``other_tool`` (in the shown catalog), ``unknown_tool`` (not in it), or the status.

**Bounds.** Parsing takes time linear in the reply's length: each JSON value and each Python call
is walked once (a value or call nested in one already walked reuses that walk), and a cleaned reply
is read only up to two stated bounds. (One cost stays proportional to the nesting: a Python call
attempt on a later line inside a multi-line one that did not parse is parsed by ``ast`` again, so a
chain of k such lines costs k parses, k at most MAX_NESTING.) A reply longer than :data:`MAX_REPLY_CHARS` characters is not
read; a call attempt with more than :data:`MAX_NESTING` brackets open at once ends the reading (the
attempts before it stand). Either way the unread text is one attempt of syntax :data:`UNREAD`, no
name, and ``error`` saying why ("reply longer than 100000 characters", "nesting deeper than 64"), so
such a reply is a ``parse_failure`` unless a readable call came before it. In a Python call a
backslash outside a string that does not continue the line ends the attempt where it stands (no
Python parser accepts it).

**Refusals** (``ParsedReply.refusal``) are read from the prose outside call attempts by the phrase
list :data:`REFUSAL_PATTERNS` (first person declines, "None of the available functions ...", "no
suitable tool"; apologies alone are not refusals). It is a column of its own and never changes an
outcome.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from probes.data.bfcl_exec import BFCLExecutionError, call_from_node, call_name
from probes.data.dataset import ABSTAIN

SYNTAXES: tuple[str, ...] = ("tool_call_tag", "mistral", "function_tag", "fenced_json", "fenced_tool_call", "fenced_python",
                             "fenced", "fenced_other", "bare_json", "python")
SHAPES: tuple[str, ...] = ("name_arguments", "name_parameters", "openai_function", "name_only", "name_args", "python_call")
MODES: tuple[str, ...] = ("strict", "lenient")
TOOL_OUTCOMES: tuple[str, ...] = ("correct_tool", "wrong_tool", "other_tool", "unknown_tool")
OUTCOMES: tuple[str, ...] = (*TOOL_OUTCOMES, "off_template_call", "abstain", "parse_failure")
# Bounds that keep parsing linear in the reply's length (module docstring: bounds). A reply past them
# is one failed attempt (syntax UNREAD) with the reason, never a hang and never a silent truncation.
MAX_REPLY_CHARS = 100_000  # a reply of 512 new tokens is a few thousand characters
MAX_NESTING = 64  # brackets open at once in a JSON value or a Python call; tool arguments nest a few
UNREAD = "unread"  # the syntax of an attempt that was not read: the reply too long, or nested too deep

REFUSAL_PATTERNS: tuple[str, ...] = (
    r"\bnone of the (?:available |provided |given )?(?:functions|tools)\b",
    r"\bno (?:suitable|appropriate|available|applicable|relevant) (?:function|tool)s?\b",
    r"\bI(?: cannot| can ?not| can['’]t| won['’]t| will not| must decline| should not| shouldn['’]t| am unable| am not able"
    r"|['’]m unable|['’]m not able| do not have (?:a|any) (?:function|tool)| don['’]t have (?:a|any) (?:function|tool))\b",
    r"\b(?:cannot|can't|should not|shouldn't) be (?:done|used|performed|completed) with\b",
)
_REFUSAL = re.compile("|".join(REFUSAL_PATTERNS), re.IGNORECASE)

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S)
_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "<|eot_id|>", "<|eom_id|>", "</s>")
# Where a call attempt can start: the explicit containers, a fence, a JSON value, a line that
# starts with a (dotted) name and "(" or a "[" and such a name (the Python alternative comes before
# the bare "[" so that a line "[f(x=1)]" is read as Python).
_OPENER = re.compile(r"<tool_call>|\[TOOL_CALLS\]|<function=|```|^[ \t]*`?(?:\[[ \t]*)?[A-Za-z_][\w.]*\(|[{\[]", re.M)
_FENCE_LABEL = re.compile(r"```([\w-]*)[ \t]*\n?")  # a one-line fence (```json {...} ```) has its body on the label's line
_FUNCTION_TAG = re.compile(r"<function=([^>\s]+)>")
_FUNCTION_CLOSE = re.compile(r"\s*</function>")
_OBJECT_KEY = re.compile(r'\{[ \t\r\n]*"')  # a JSON object that opens with a key (JSON's whitespace only)
_MISTRAL_ARGS = re.compile(r"\s*([A-Za-z_][\w.-]*)\[ARGS\]")
_FENCE_SYNTAX = {"json": "fenced_json", "tool_call": "fenced_tool_call", "python": "fenced_python", "py": "fenced_python", "": "fenced"}


@dataclass(frozen=True)
class Template:
    """The call format a prompt asks for, as a tool runtime would execute it."""

    name: str
    description: str
    syntaxes: frozenset[str]  # where a template-format call is written
    shapes: frozenset[str]  # its payload
    lists: bool  # a list of calls is a valid payload
    whole_reply: bool  # the whole reply must be the call(s) (BFCL's decoder), not a part of it


TEMPLATES: dict[str, Template] = {
    "native": Template("native", "Qwen <tool_call> JSON", frozenset({"tool_call_tag"}), frozenset({"name_arguments"}),
                       lists=False, whole_reply=False),
    "prompted": Template("prompted", "BFCL Python call syntax", frozenset({"python", "fenced"}), frozenset({"python_call"}),
                         lists=True, whole_reply=True),
}


@dataclass(frozen=True)
class ToolCall:
    """One call attempt. ``name`` None: nothing readable (an opened ``<tool_call>`` with no JSON
    object, say). ``complete``: decoded in full with an arguments object (False for a call cut off by
    the token budget, malformed JSON, a non-literal Python argument). ``positional``: Python
    positional arguments (kept apart: a tool schema names every parameter). ``template_format``:
    written where the template's calls are written; ``executable``: and a runtime could run it
    (complete, in the template's shape, the reply readable as the template's calls)."""

    name: str | None
    arguments: dict[str, Any] | None
    syntax: str
    shape: str | None
    complete: bool
    in_list: bool = False
    positional: tuple[Any, ...] = ()
    template_format: bool = False
    executable: bool = False
    known_tool: bool | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """As JSON data: Python literal arguments that JSON has no type for (bytes, sets, complex
        numbers, tuples as keys) are written as lists or their ``repr``."""
        return _plain(asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k if isinstance(k, str) else repr(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(v) for v in value), key=repr)
    if value is None or isinstance(value, str | bool | int | float):
        return value
    return repr(value)


@dataclass(frozen=True)
class ParsedReply:
    """Every call attempt of a reply (``calls``, in text order), whether its prose states a refusal,
    and whether it was empty, for the decision ``template`` (a key of :data:`TEMPLATES`)."""

    text: str  # the cleaned reply (end-of-turn cut, think blocks dropped)
    template: str
    calls: tuple[ToolCall, ...]
    refusal: bool
    empty: bool

    def action(self, mode: str) -> ToolCall | None:
        """The call that is the next action in ``mode`` (None when :meth:`status` is not ``call``)."""
        _check_mode(mode)
        if mode == "lenient":
            return next((c for c in self.calls if c.name is not None), None)
        first = next((c for c in self.calls if c.template_format), None)
        return first if first is not None and first.executable else None

    def status(self, mode: str) -> str:
        """``call`` / ``off_template_call`` / ``abstain`` / ``parse_failure`` (module docstring)."""
        if self.action(mode) is not None:
            return "call"
        if not self.calls:
            return "abstain"
        if mode == "strict" and not any(c.template_format for c in self.calls) and any(c.name is not None for c in self.calls):
            return "off_template_call"
        return "parse_failure"

    def as_dict(self) -> dict[str, Any]:
        return {"template": self.template, "calls": [c.as_dict() for c in self.calls], "refusal": self.refusal, "empty": self.empty}


def mode_description(mode: str, templates: Sequence[str]) -> str:
    """What a mode counts as a call, for prompts of the given decision formats (notes, captions)."""
    _check_mode(mode)
    if mode == "lenient":
        return "any recognised call syntax"
    formats = " / ".join(TEMPLATES[t].description for t in templates)
    return f"only the template's format ({formats}), as a tool runtime would execute it"


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


# ------------------------------------------------------------------------------------- entry point
def parse_reply(text: str, *, template: str, catalog: Collection[str] | None = None) -> ParsedReply:
    """Every call attempt in ``text`` (a model's raw reply), for a prompt whose decision format is
    ``template`` (``native`` or ``prompted``); ``catalog``: the tool names the prompt showed
    (``known_tool`` stays None without it)."""
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {tuple(TEMPLATES)}, got {template!r}")
    spec = TEMPLATES[template]
    clean = clean_generation(text)
    if len(clean) > MAX_REPLY_CHARS:
        return ParsedReply(clean, template, (_unread(f"reply longer than {MAX_REPLY_CHARS} characters"),), False, False)
    found, spans = _scan(clean)
    prose = "".join(clean[a:b] for a, b in _gaps(spans, len(clean)))
    # a whole-reply template (BFCL) holds calls only, and its runtime reads them only when all of them parse
    alone = not spec.whole_reply or not prose.strip("`\n ")
    readable = not spec.whole_reply or _bfcl_accepts(clean)
    known = set(catalog) if catalog is not None else None
    calls = []
    for call in found:
        in_format = call.syntax in spec.syntaxes and alone
        runs = in_format and readable and call.complete and call.shape in spec.shapes and (spec.lists or not call.in_list)
        calls.append(replace(call, template_format=in_format, executable=runs,
                             known_tool=None if known is None or call.name is None else call.name in known))
    return ParsedReply(clean, template, tuple(calls), bool(_REFUSAL.search(prose)), not clean)


def outcome(reply: ParsedReply, mode: str, correct_action: str, wrong_tools: Sequence[str]) -> str:
    """The outcome of ``reply`` for an item in ``mode`` (one of :data:`OUTCOMES`)."""
    call = reply.action(mode)
    if call is None:
        return reply.status(mode)
    if call.name == correct_action:
        return "correct_tool"
    if call.name in set(wrong_tools):
        return "wrong_tool"
    return "unknown_tool" if call.known_tool is False else "other_tool"


def is_solved(outcome_: str, correct_action: str) -> bool:
    """The action is the item's correct action: its correct tool, or abstention when that is correct."""
    return outcome_ == "correct_tool" or (correct_action == ABSTAIN and outcome_ == "abstain")


def clean_generation(text: str) -> str:
    """Cut at the first end-of-turn marker and drop (possibly unterminated) think blocks."""
    cut = min((i for i in (text.find(m) for m in _END_MARKERS) if i >= 0), default=len(text))
    return _THINK.sub("", text[:cut]).strip()


def _gaps(spans: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    out, pos = [], 0
    for a, b in sorted(spans):
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    return out + ([(pos, n)] if pos < n else [])


# ------------------------------------------------------------------------------------- the scan
class _TooDeep(Exception):
    """A call attempt nests more than MAX_NESTING brackets: reading stops there."""

    def __init__(self) -> None:
        super().__init__(f"nesting deeper than {MAX_NESTING}")


def _unread(reason: str) -> ToolCall:
    return ToolCall(None, None, UNREAD, None, False, error=reason)


class _Unlined(str):
    """A reply whose JSON errors do not count their line: ``JSONDecodeError`` counts the lines from
    the document's start to the error, so one failed decode per ``{`` / ``[`` of a long reply would be
    quadratic (only the message is used here)."""

    def count(self, *args: Any) -> int:
        return 0

    def rfind(self, *args: Any) -> int:
        return -1


@dataclass
class _Walks:
    """What the walks over one text found, so that a value or call nested in one already walked is
    answered from it instead of walked again (this keeps the scan linear): ``json`` maps the index of
    a ``{`` / ``[`` to its :func:`_close_prefix` result, ``python`` the index of a Python bracket to
    :func:`_closing`'s."""

    json: dict[int, tuple[list[str], int, bool]]
    python: dict[int, int | None]


def _scan(text: str, fence: str | None = None) -> tuple[list[ToolCall], list[tuple[int, int]]]:
    """Call attempts in ``text`` left to right, and the spans they cover. ``fence``: the syntax that
    bare JSON and Python calls take inside a fence. An attempt nested too deeply is the last one:
    the rest of ``text`` is one unread attempt."""
    calls: list[ToolCall] = []
    spans: list[tuple[int, int]] = []
    walks = _Walks({}, {})
    text = _Unlined(text)
    pos = 0
    while (m := _OPENER.search(text, pos)) is not None:
        token = m.group()
        try:
            if token == "<tool_call>":
                found, end = _tagged(text, m.end())
            elif token == "[TOOL_CALLS]":
                found, end = _mistral(text, m.end())
            elif token == "<function=":
                found, end = _function_tag(text, m.start())
            elif token == "```":
                found, end = _fenced(text, m.start())
            elif token in ("{", "["):
                found, end = _json_at(text, m.start(), fence or "bare_json", explicit=fence == "fenced_tool_call", walks=walks)
            else:
                found, end = _python_at(text, m.start() + len(token) - len(token.lstrip(" \t`")), fence or "python", walks)
        except _TooDeep as error:
            calls.append(_unread(str(error)))
            spans.append((m.start(), len(text)))
            break
        if found:
            calls += found
            spans.append((m.start(), end))
        pos = end  # every reader returns a position past m.start(): where to read on
    return calls, spans


def _tagged(text: str, start: int) -> tuple[list[ToolCall], int]:
    """``<tool_call>`` body up to ``</tool_call>`` (without it: up to the next tag, or the end)."""
    next_open = text.find("<tool_call>", start)
    next_open = len(text) if next_open < 0 else next_open
    close = text.find("</tool_call>", start, next_open)  # searched up to the next tag only: linear over many tags
    stop = next_open if close < 0 else close
    found, used = _json_body(text[start:stop], "tool_call_tag")
    if found[0].name is None:  # not a JSON call (a fence in the tag, say): a runtime fails, but the tool may be readable
        found += _scan(text[start:stop])[0]
    if text.startswith("</tool_call>", stop):
        return found, stop + len("</tool_call>")
    return found, max(start + used, start + 1)


def _mistral(text: str, start: int) -> tuple[list[ToolCall], int]:
    """``[TOOL_CALLS]`` followed by JSON call(s), or by ``name[ARGS]{...}``."""
    named = _MISTRAL_ARGS.match(text, start)
    if named is None:
        body_end = text.find("[TOOL_CALLS]", start)
        body = text[start: body_end if body_end >= 0 else len(text)]
        found, used = _json_body(body, "mistral")
        return found, start + max(used, 1)
    args_at = named.end()
    value, end, error = _decode(text, args_at) if text.startswith("{", args_at) else (None, args_at, "no JSON arguments after [ARGS]")
    arguments, complete, error = _arguments(value, error)
    return [ToolCall(named.group(1), arguments, "mistral", "name_args", complete, error=error)], end


def _function_tag(text: str, start: int) -> tuple[list[ToolCall], int]:
    """Llama 3.1's ``<function=name>{json}</function>``."""
    tag = _FUNCTION_TAG.match(text, start)
    if tag is None:
        return [], start + 1
    at = tag.end()
    value, end, error = _decode(text, at) if text.startswith("{", at) else (None, at, "no JSON arguments in <function=...>")
    arguments, complete, error = _arguments(value, error)
    close = _FUNCTION_CLOSE.match(text, end)
    end = close.end() if close is not None else end
    return [ToolCall(tag.group(1), arguments, "function_tag", "name_args", complete, error=error)], end


def _fenced(text: str, start: int) -> tuple[list[ToolCall], int]:
    """A Markdown fence: its body (to the closing fence, or the end) scanned for calls."""
    label = _FENCE_LABEL.match(text, start)
    assert label is not None  # the pattern matches every "```"
    body_start = label.end()
    close = text.find("```", body_start)
    body_end, end = (close, close + 3) if close >= 0 else (len(text), len(text))
    lang = label.group(1).lower()
    syntax = _FENCE_SYNTAX.get(lang, "fenced_other")
    body = text[body_start:body_end]
    found, _ = _scan(body, fence=syntax)
    if not found and syntax == "fenced_tool_call" and body.strip():
        found = [ToolCall(None, None, syntax, None, False, error="no call in a tool_call fence")]
    return found, end  # a fence without calls is read past too: its closing ``` opens nothing


def _json_body(body: str, syntax: str) -> tuple[list[ToolCall], int]:
    """An explicit call container's body: a JSON call (or list); anything else is an attempt that
    failed (the container says a call starts here)."""
    at = len(body) - len(body.lstrip())
    if at < len(body) and body[at] in "{[":
        found, end = _json_at(body, at, syntax, explicit=True)
        if found:
            return found, end
    return [ToolCall(None, None, syntax, None, False, error=f"no JSON call object in {syntax}")], len(body)


def _json_at(text: str, start: int, syntax: str, *, explicit: bool, walks: _Walks | None = None) -> tuple[list[ToolCall], int]:
    """The JSON call(s) starting at ``text[start]`` (``{`` or ``[``), and where they end; none when
    the value there is not call-shaped. ``explicit``: inside a call container (a bare name is then
    a call whose arguments never came); ``walks``: the scan's earlier walks over ``text``."""
    if not explicit and text[start] == "{" and not _OBJECT_KEY.match(text, start):
        return [], start + 1  # an object without a first key decodes to {} at most: no call (a long run of "{" stays linear)
    value, end, error = _decode(text, start, walks)
    if value is None:
        return [], start + 1
    items, in_list = (value, True) if isinstance(value, list) else ([value], False)
    calls = [_json_call(item, syntax, in_list, explicit, error) for item in items]
    if not calls or any(c is None for c in calls):
        if explicit and not in_list:
            return [ToolCall(None, None, syntax, None, False, error=error or "not a call object")], end
        return [], start + 1
    return [c for c in calls if c is not None], end


def _json_call(obj: Any, syntax: str, in_list: bool, name_only: bool, error: str | None) -> ToolCall | None:
    """A call object (module docstring: shapes), or None for anything else, a tool schema included.
    ``name_only``: a name without arguments still makes a call (inside a call container; elsewhere
    an object cut off after its name cannot be told from an echoed tool schema, so it is none)."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and obj.get("type", "function") == "function":
        body, shape, key = obj["function"], "openai_function", "arguments"
    elif "parameters" in obj and "arguments" not in obj:
        body, shape, key = obj, "name_parameters", "parameters"
    else:
        body, shape, key = obj, "name_arguments", "arguments"
    name = body.get("name")
    if not isinstance(name, str) or not name or _is_schema(body):
        return None
    if key not in body:
        if not name_only or set(body) != {"name"}:
            return None
        shape = "name_only"
    arguments, complete, arg_error = _arguments(body.get(key), None if key in body else "no arguments")
    return ToolCall(name, arguments, syntax, shape, complete and error is None, in_list, error=error or arg_error)


_SCHEMA_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties"})


def _is_schema(body: dict[str, Any]) -> bool:
    """A tool definition (as in the prompt's catalog), not a call: a description, or parameters that
    are a JSON Schema object (only schema keywords, so one cut off early is one too)."""
    params = body.get("parameters")
    return "description" in body or (isinstance(params, dict) and params.get("type") == "object" and set(params) <= _SCHEMA_KEYWORDS)


def _arguments(value: Any, error: str | None) -> tuple[dict[str, Any] | None, bool, str | None]:
    """Call arguments: an object, or a JSON string holding one (OpenAI's API writes them so)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None, False, "arguments are a string that is not JSON"
    if isinstance(value, dict):
        return value, error is None, error
    return None, False, error or "arguments are not an object"


# ------------------------------------------------------------------------------------- JSON
_DECODER = json.JSONDecoder(strict=False)  # models write raw newlines inside strings


def _decode(text: str, start: int, walks: _Walks | None = None) -> tuple[Any, int, str | None]:
    """The JSON value at ``text[start]``: (value, end, None); or, when it does not decode, the
    value of its longest well-formed prefix closed up, where reading stopped, and why; value None
    when not even that decodes. Raises :class:`_TooDeep` for a value nested deeper than MAX_NESTING."""
    try:
        value, end = _DECODER.raw_decode(text, start)
        # only a value with that many brackets can nest that deep (counting them is cheap, walking it is not)
        if str.count(text, "[", start, end) + str.count(text, "{", start, end) > MAX_NESTING and _nesting(value) > MAX_NESTING:
            raise _TooDeep()
        return value, end, None
    except json.JSONDecodeError as exc:
        error = exc.msg
    except RecursionError:  # nested past the interpreter's limit: _close_prefix stops at MAX_NESTING
        error = "nested too deeply"
    closings, stop, truncated = _close_prefix(text, start, {} if walks is None else walks.json)
    for closed in closings:
        try:
            return _DECODER.decode(closed), stop, "truncated JSON" if truncated else f"malformed JSON ({error})"
        except (json.JSONDecodeError, RecursionError):
            continue  # a string cut inside an escape sequence: the shorter closing
    return None, stop, error


def _nesting(value: Any) -> int:
    """How many containers deep a decoded JSON value is (a scalar 0)."""
    deepest, level = 0, [(value, 1)]
    while level:
        item, depth = level.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            level.extend((child, depth + 1) for child in children)
    return deepest


def _close_prefix(text: str, start: int, nested: dict[int, tuple[list[str], int, bool]]) -> tuple[list[str], int, bool]:
    """A JSON container cut off or broken: its longest prefix that ends on a complete value (or an
    opened container), with the open string and brackets closed. Returns (closings to try, longest
    first: a value string cut off is closed where it was cut, else ended before it; the index where
    reading stopped; truncated: reading reached the end of ``text``). ``nested`` receives the same
    result for every container opened inside (a walk from there would repeat this one's steps).
    Raises :class:`_TooDeep` past MAX_NESTING open brackets. ``text[start]`` is ``{`` or ``[``."""
    if start in nested:
        return nested[start]
    stack: list[list[Any]] = []  # [bracket, what it expects next: key / colon / value / comma, where it opened]
    closing = ""  # what closes the open brackets, innermost first
    safe: int | None = None  # where the longest well-formed prefix ends (the stack has not changed since)
    i, n = start, len(text)
    truncated = False
    cut_string: str | None = None  # a value string cut off by the end of the text: its body up to the cut

    while i < n:
        c = text[i]
        expect = stack[-1][1] if stack else "value"
        if c in " \t\r\n":
            i += 1
        elif c == '"' and expect in ("key", "value"):
            j, escaped = i + 1, False
            while j < n and (escaped or text[j] != '"'):
                escaped = not escaped and text[j] == "\\"
                j += 1
            if j == n:  # cut inside a string: a value string can be closed, a key cannot
                if expect == "value" and stack:
                    cut_string = text[:n - 1] if escaped else text
                    i = n
                else:
                    truncated = True
                break
            i = j + 1
            if expect == "key":
                stack[-1][1] = "colon"
            else:
                stack[-1][1] = "comma"
                safe = i
        elif c in "{[" and expect == "value":
            if len(stack) == MAX_NESTING:
                raise _TooDeep()
            if stack:
                stack[-1][1] = "comma"
            stack.append([c, "key" if c == "{" else "value", i])
            closing = ("}" if c == "{" else "]") + closing
            safe = i + 1
            i += 1
        elif c in "}]" and stack and stack[-1][0] == ("{" if c == "}" else "[") and expect in ("comma", "key", "value"):
            opened = stack.pop()[2]
            i += 1
            # the container that opened there, walked alone, ends here on the same prefix
            nested[opened] = [text[opened:safe] + closing[0]], i, False
            closing = closing[1:]
            if not stack:
                break
            safe = i
        elif c == ":" and expect == "colon":
            stack[-1][1] = "value"
            i += 1
        elif c == "," and expect == "comma":
            stack[-1][1] = "key" if stack[-1][0] == "{" else "value"
            i += 1
        elif expect == "value" and stack and (c.isalnum() or c in "-+."):
            j = i
            while j < n and (text[j].isalnum() or text[j] in "-+.eE"):
                j += 1
            if j == n:  # a number or literal cut off: it may be incomplete
                truncated = True
                break
            try:
                json.loads(text[i:j])
            except json.JSONDecodeError:
                break
            i = j
            stack[-1][1] = "comma"
            safe = i
        else:
            break
    else:
        truncated = bool(stack)
    # every container still open stops where this walk stopped; its closings are this walk's, from it on
    for level, (_, _, opened) in enumerate(stack):
        closers = closing[:len(stack) - level]
        closings = [text[opened:safe] + closers]
        if cut_string is not None:
            closings.insert(0, cut_string[opened:] + '"' + closers)
        nested[opened] = closings, i, truncated or cut_string is not None
    return nested[start]


# ------------------------------------------------------------------------------------- Python
def _python_at(text: str, start: int, syntax: str, walks: _Walks) -> tuple[list[ToolCall], int]:
    """Python call syntax at ``text[start]`` (``f(...)`` or ``[f(...), ...]``, optionally in single
    backticks) filling the rest of its line; a call cut off by the end of the text is an attempt
    that did not complete."""
    close = _closing(text, start if text[start] == "[" else text.index("(", start), walks.python)
    if close == _NOT_PYTHON:
        return [], start + 1
    if close is None:  # ran to the end: cut by the token budget, or prose with an unclosed "("
        node = _cut_call(text[start:])
        if node is None:
            return [], start + 1
        return [replace(c, complete=False, error="call cut off") for c in _python_calls(node, text[start:], syntax)], len(text)
    line_end = text.find("\n", close)
    rest = text[close: line_end if line_end >= 0 else len(text)]
    node = _parse_expression(text[start:close])
    if rest.strip(" \t;`") or not _is_calls(node):
        return [], start + 1
    return _python_calls(node, text[start:close], syntax), close


def _is_calls(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Call) or (isinstance(node, ast.List | ast.Tuple) and bool(node.elts)
                                          and all(isinstance(e, ast.Call) for e in node.elts))


def _python_calls(node: ast.expr, source: str, syntax: str) -> list[ToolCall]:
    in_list = not isinstance(node, ast.Call)
    out = []
    elements = node.elts if in_list else [node]
    for element, text in zip(elements, _source_segments(source, elements)):
        try:
            call = call_from_node(element, text)
        except BFCLExecutionError as error:
            out.append(ToolCall(call_name(element), None, syntax, "python_call", False, in_list, error=str(error)))
            continue
        out.append(ToolCall(call.name, dict(call.kwargs), syntax, "python_call", True, in_list, call.args))
    return out


def _source_segments(source: str, nodes: Sequence[ast.expr]) -> list[str]:
    """``ast.get_source_segment(source, node) or source`` for each node, with the line offsets
    computed once (``get_source_segment`` splits the whole source again for every node). The nodes
    may come from ``source`` closed up (a call cut off): a position past a line's end is its end."""
    starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", source)]
    columns: dict[int, list[int]] = {}  # a line's character index at each UTF-8 byte offset, and at its end

    def offset(line: int, byte: int) -> int:
        if line not in columns:
            text = source[starts[line - 1]: starts[line] if line < len(starts) else len(source)]
            columns[line] = [k for k, ch in enumerate(text) for _ in ch.encode()] + [len(text)]
        table = columns[line]
        return starts[line - 1] + table[min(byte, len(table) - 1)]

    return [source[offset(node.lineno, node.col_offset): offset(node.end_lineno, node.end_col_offset)] or source  # type: ignore[arg-type]
            for node in nodes]


def _parse_expression(source: str) -> ast.expr | None:
    try:
        return ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


_PARTIAL_KEYWORD = re.compile(r"\s*(?:[A-Za-z_]\w*\s*(?:=\s*[-+]?\s*)?|[-+]\s*)?")  # `days=`, `days=-`, a lone sign


def _cut_call(source: str) -> ast.expr | None:
    """A Python call cut off mid-way, closed: its open string and brackets closed (a string cut
    inside an escape sequence ended before it), or else a keyword argument being written when it was
    cut (``path=``) dropped first. None when neither is a call: prose with an unclosed parenthesis
    stays prose."""
    closers, last_separator, string_at = _unclosed(source)
    if closers is None:
        return None
    # \U0001F600 is the longest escape: cut at most 9 characters more, never before the string opened
    cuts = range(min(9, len(source) - string_at) + 1) if string_at is not None else range(1)
    for cut in cuts:
        node = _parse_expression(source[:len(source) - cut] + closers)
        if _is_calls(node):
            return node
    if last_separator is not None and _PARTIAL_KEYWORD.fullmatch(source, last_separator):
        shorter = source[:last_separator]
        closers, _, _ = _unclosed(shorter)
        node = _parse_expression(shorter + closers) if closers is not None else None
        return node if _is_calls(node) else None
    return None


def _unclosed(source: str) -> tuple[str | None, int | None, int | None]:
    """What closes ``source``: the open quote and brackets (None when a bracket closes one never
    opened); the index after the last ``(``, ``[``, ``{`` or ``,`` outside strings; and where the
    string still open at the end starts its body (None if none is)."""
    stack, quote, escaped, last, string_at = [], None, False, None, None
    for i, ch in enumerate(source):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote, string_at = ch, i + 1
        elif ch in "([{":
            stack.append(ch)
            last = i + 1
        elif ch in ")]}":
            if not stack or "([{"[")]}".index(ch)] != stack.pop():
                return None, None, None
        elif ch == ",":
            last = i + 1
    closers = "".join({"(": ")", "[": "]", "{": "}"}[bracket] for bracket in reversed(stack))
    return (quote or "") + closers, last, string_at if quote else None


_NOT_PYTHON = -1  # what _closing returns for a backslash outside a string that continues no line


def _closing(text: str, open_at: int, nested: dict[int, int | None]) -> int | None:
    """The index after the bracket closing ``text[open_at]`` (quotes respected), None if it never
    closes, :data:`_NOT_PYTHON` at a backslash outside a string that is not a line continuation
    (Python rejects it, so the call cannot parse; it also keeps walks from different starts apart,
    which keeps them linear). ``nested`` receives the same answer for every bracket opened inside.
    Raises :class:`_TooDeep` past MAX_NESTING open brackets."""
    if open_at in nested:
        return nested[open_at]
    opened: list[int] = []
    quote, escaped = None, False
    i, n = open_at, len(text)
    while i < n:
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            if len(opened) == MAX_NESTING:
                raise _TooDeep()
            opened.append(i)
        elif ch in ")]}":
            nested[opened.pop()] = i + 1
            if not opened:
                return i + 1
        elif ch == "\\":
            if not text.startswith(("\n", "\r"), i + 1):
                nested.update(dict.fromkeys(opened, _NOT_PYTHON))
                return _NOT_PYTHON
            i += 1  # the line break it continues
        i += 1
    nested.update(dict.fromkeys(opened, None))
    return None


def _bfcl_accepts(text: str) -> bool:
    """BFCL's prompting decoder reads the whole reply as calls (``default_decode_ast_prompting``:
    backticks, newlines and spaces stripped, a list added around a single call, quotes stripped)."""
    s = text.strip("`\n ")
    s = ("" if s.startswith("[") else "[") + s + ("" if s.endswith("]") else "]")
    return _is_calls(_parse_expression(s.strip().strip("'")))
