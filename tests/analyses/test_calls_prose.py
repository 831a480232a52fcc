"""``calls`` on a base model (issue #46 item 1): replies in prose, with no call of any syntax and no refusal,
are counted and said to be no decisions to abstain, rather than read silently as abstentions."""

from __future__ import annotations

import pandas as pd

from probes.analyses.calls import prose_replies, prose_statement
from probes.prompts.builder import ABSTAIN_TEXT
from probes.scoring.toolcalls import outcome, parse_reply

REPLIES = {
    "prose": "The user wants to know about their account. Let me think about the best way to help them today.",
    "refusal": ABSTAIN_TEXT,
    "call": '<tool_call>\n{"name": "get_user", "arguments": {}}\n</tool_call>',
}


def _rows(kinds: list[str]) -> pd.DataFrame:
    rows = []
    for kind in kinds:
        reply = parse_reply(REPLIES[kind], template="native", catalog=["get_user"])
        rows.append({"kind": kind, "n_calls": len(reply.calls), "refusal": reply.refusal,
                     "lenient_outcome": outcome(reply, "lenient", "get_user", [])})
    return pd.DataFrame(rows)


def test_prose_is_counted_apart_from_refusals_and_calls():
    rows = _rows(["prose", "prose", "refusal", "call"])
    assert list(rows["lenient_outcome"]) == ["abstain", "abstain", "abstain", "correct_tool"]  # the parser's reading
    assert prose_replies(rows) == 2
    statement = prose_statement(rows)
    assert statement.startswith("No call syntax emitted: 2 of 4 replies (50%)") and "not decisions to abstain" in statement


def test_no_statement_without_prose():
    assert prose_statement(_rows(["refusal", "call"])) == ""
