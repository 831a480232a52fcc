"""The tool-call parser's bounds (issue 41, the hangs): parsing takes time linear in the reply's length,
a reply longer than MAX_REPLY_CHARS or nested deeper than MAX_NESTING is a ``parse_failure`` that says
why, and the calls read before a too-deep attempt stand.

Measured before the fix (this 2-core CPU, loaded): 1,000 nested ``[`` 8 s (25 s in the issue), 2,000 over
60 s, 1,000 nested ``{"a":`` 11 s, a list of 4,000 Python calls 17 s; after: each under 0.01 s but the
list, 0.8 s (two ``ast.parse`` of its 32 kB, linear)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probes.scoring.toolcalls import MAX_NESTING, MAX_REPLY_CHARS, UNREAD, parse_reply

# Seconds per 100 kB of reply. Measured on this 2-core CPU under the suite's load: the slowest reading
# is a list of Python calls (two ast.parse of the whole reply), 2.6 s per 100 kB; the JSON worst cases
# below take under 1 s. A quadratic reading of 100 kB takes minutes.
SECONDS_PER_100KB = 6.0
QUICK = 2.0  # what the cases that took 8 to over 60 s take now is milliseconds; this leaves room for a loaded machine


def timed(text: str, template: str = "native"):
    started = time.perf_counter()
    reply = parse_reply(text, template=template, catalog=["f", "get_weather"])
    return reply, time.perf_counter() - started


def bound(text: str) -> float:
    return 0.2 + SECONDS_PER_100KB * len(text) / 100_000


@pytest.mark.parametrize("template", ["native", "prompted"])
@pytest.mark.parametrize("text", ["[" * 1000, "[" * 2000, '{"a":' * 1000], ids=["1000-brackets", "2000-brackets", "1000-objects"])
def test_the_issues_deep_replies_are_parse_failures_in_no_time(text, template):
    reply, seconds = timed(text, template)
    assert seconds < QUICK
    assert reply.status("lenient") == reply.status("strict") == "parse_failure"
    (call,) = reply.calls
    assert call.syntax == UNREAD and call.name is None and call.error == f"nesting deeper than {MAX_NESTING}"


def test_the_issues_list_of_4000_calls_reads_every_call_in_linear_time():
    text = "[" + ", ".join(f"f(x={i})" for i in range(4000)) + "]"
    reply, seconds = timed(text, "prompted")
    assert seconds < bound(text)
    assert reply.status("strict") == "call" and len(reply.calls) == 4000
    assert [c.arguments["x"] for c in reply.calls] == list(range(4000))


def test_nesting_up_to_the_bound_reads_and_one_more_is_refused():
    deep_args = '{"name": "f", "arguments": {"x": ' + "[" * (MAX_NESTING - 2) + "]" * (MAX_NESTING - 2) + "}}"
    assert parse_reply(f"<tool_call>{deep_args}</tool_call>", template="native").status("strict") == "call"
    too_deep = '{"name": "f", "arguments": {"x": ' + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1) + "}}"
    reply = parse_reply(f"<tool_call>{too_deep}</tool_call>", template="native")
    assert reply.status("strict") == "parse_failure" and reply.calls[-1].error == f"nesting deeper than {MAX_NESTING}"
    python = "f(x=" + "[" * MAX_NESTING + "]" * MAX_NESTING + ")"
    assert parse_reply(python, template="prompted").calls[0].error == f"nesting deeper than {MAX_NESTING}"


def test_calls_before_a_too_deep_attempt_stand():
    reply = parse_reply('<tool_call>{"name": "f", "arguments": {}}</tool_call> then ' + "[" * 500, template="native")
    assert reply.status("strict") == "call" and reply.action("strict").name == "f"
    assert [c.syntax for c in reply.calls] == ["tool_call_tag", UNREAD]


def test_a_reply_longer_than_the_bound_is_a_parse_failure_that_says_so():
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert parse_reply(call + " " * (MAX_REPLY_CHARS - len(call)), template="native").status("strict") == "call"  # stripped
    reply, seconds = timed(call + "x" * MAX_REPLY_CHARS)
    assert seconds < QUICK
    assert reply.status("lenient") == "parse_failure"
    assert reply.calls[0].error == f"reply longer than {MAX_REPLY_CHARS} characters" and reply.calls[0].syntax == UNREAD


def test_a_backslash_outside_a_string_ends_a_python_call_as_python_would():
    # no merging walks: each line's call is in a string of the one before, which used to walk to the end
    text = "f(\\'\n" * 20000
    reply, seconds = timed(text, "prompted")
    assert seconds < bound(text)
    assert reply.status("lenient") == "abstain"
    assert parse_reply("f(x=1, \\\n  y=2)", template="prompted").status("strict") == "call"  # a line continuation


# ------------------------------------------------------------------------------------- generated worst cases
UNIT = st.sampled_from(["[", "{", '{"a":', '{"name": "f", "arguments": {', "f(", "[f(", "\"", "'", "\\", ",", ":", "1",
                        '"x"', "]", "}", ")", "\n", " ", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "```", "`",
                        "<function=f>", "get_weather(city='Paris')", '{"name": "f", "arguments": {}}'])


@st.composite
def worst_cases(draw) -> str:
    """A long reply built from a short pattern repeated: deep nesting of [ and {"a":, long lists of
    calls, long strings with many {, unterminated structures; a prefix and a tail around it."""
    prefix = "".join(draw(st.lists(UNIT, max_size=6)))
    pattern = "".join(draw(st.lists(UNIT, min_size=1, max_size=4)))
    tail = "".join(draw(st.lists(UNIT, max_size=4)))
    size = draw(st.sampled_from([2_000, 20_000, 100_000]))
    return (prefix + pattern * (size // len(pattern) + 1))[:size - len(tail)] + tail


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=worst_cases(), template=st.sampled_from(["native", "prompted"]))
def test_property_parsing_finishes_within_a_linear_time_bound(text, template):
    reply, seconds = timed(text, template)
    assert seconds < bound(text), f"{seconds:.2f} s for {len(text)} characters"
    assert reply.status("lenient") in ("call", "abstain", "parse_failure")


@pytest.mark.parametrize("text", [
    "[" * 64 + "1," * 50_000,  # deep, long and unterminated: every container's walk is the outer one's
    '["' + "{" * 99_000,  # a long string of {
    '{"a": "' + '{"a": ' * 16_000,  # openers inside a string, one walk per phase
    json.dumps([{"name": "f", "arguments": {"x": 1}}] * 3_000),  # a long JSON list of calls
    "[" + "[1]," * 24_000,  # many closed lists in one open one
    "<tool_call>" * 9_000,  # many unclosed tags
])
def test_named_worst_cases_finish_within_the_bound(text):
    for template in ("native", "prompted"):
        _, seconds = timed(text, template)
        assert seconds < bound(text), f"{seconds:.2f} s for {len(text)} characters"
