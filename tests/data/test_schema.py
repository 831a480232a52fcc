"""ψ, the deterministic skill validation operator (§4.2): every kind of malformed skill is rejected
with its own precise reason, and library construction keeps the valid skills."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.data.schema import (
    BOUNDARY_SLOTS, SLOTS, SkillValidationError, Tool, ToolCatalog, build_library, validate_skill,
)

CATALOG = ToolCatalog((
    Tool("get_order_details", "Look up an order.", {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}),
    Tool("get_stock_info", "Check stock.", {"type": "object", "properties": {"product": {"type": "string"}, "count": {"type": "integer"}}, "required": ["product"]}),
))

VALID = {
    "id": "shop.lookup_order",
    "goal": "Report the status of an order.",
    "procedure": ["Read the order ID.", "Call get_order_details."],
    "tools": ["get_order_details", {"name": "get_stock_info", "arguments": {"product": "kettle", "count": 2}}],
    "applicability": ["The customer gives an existing order ID."],
    "risk_cues": ["The customer asks about stock before ordering."],
    "avoidance_rules": ["Do not call get_order_details for stock questions."],
    "recovery_notes": [],
}


def reject(raw) -> SkillValidationError:
    with pytest.raises(SkillValidationError) as info:
        validate_skill(raw, CATALOG)
    return info.value


def test_valid_skill_round_trips():
    skill = validate_skill(json.dumps(VALID), CATALOG)
    assert skill.tool_names == ("get_order_details", "get_stock_info")
    assert skill.to_json() == VALID
    assert skill.boundary_text().startswith("The customer gives an existing order ID.")


# Each corruption: (description, mutate(raw dict) -> raw JSON text, field named in the reason, reason fragment)
def _drop(field):
    return lambda d: json.dumps({k: v for k, v in d.items() if k != field})


def _set(field, value):
    return lambda d: json.dumps({**d, field: value})


CORRUPTIONS = [
    ("truncated JSON", lambda d: json.dumps(d)[:-3], "<json>", "not strict JSON"),
    ("NaN constant", lambda d: json.dumps(d)[:-1] + ', "x": NaN}', "<json>", "non-standard JSON constant"),
    ("duplicate key", lambda d: json.dumps(d)[:-1] + ', "goal": "again"}', "<json>", "duplicate keys"),
    ("top-level list", lambda d: json.dumps([d]), "<json>", "must be a JSON object"),
    ("unknown field", _set("notes", ["x"]), "<json>", "unknown fields"),
    ("empty goal", _set("goal", "  "), "goal", "non-empty string"),
    ("goal not a string", _set("goal", ["a"]), "goal", "must be a string"),
    ("procedure not a list", _set("procedure", "do it"), "procedure", "must be a list"),
    ("empty procedure", _set("procedure", []), "procedure", "non-empty list"),
    ("procedure item not text", _set("procedure", ["ok", 3]), "procedure", "item 1 must be a string"),
    ("tool missing from catalog", _set("tools", ["send_rocket"]), "tools", "does not exist in the tool catalog"),
    ("tool arguments violate schema", _set("tools", [{"name": "get_stock_info", "arguments": {"count": 2}}]), "tools", "'product' is a required property"),
    ("tool arguments wrong type", _set("tools", [{"name": "get_stock_info", "arguments": {"product": 5}}]), "tools", "is not of type 'string'"),
    ("tool entry malformed", _set("tools", [{"tool": "get_stock_info"}]), "tools", "must be a tool name or an object"),
    ("no tools", _set("tools", []), "tools", "at least one tool"),
    ("empty risk cues", _set("risk_cues", []), "risk_cues", "non-empty list"),
    ("empty avoidance rules", _set("avoidance_rules", []), "avoidance_rules", "non-empty list"),
    *[(f"{slot} not list-valued", _set(slot, "a sentence"), slot, "must be a list") for slot in BOUNDARY_SLOTS],
    *[(f"missing {slot}", _drop(slot), slot, "required field is missing") for slot in SLOTS],
    ("missing id", _drop("id"), "id", "non-empty string"),
]


@pytest.mark.parametrize("name, mutate, field, fragment", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_each_corruption_is_rejected_with_its_reason(name, mutate, field, fragment):
    error = reject(mutate(copy.deepcopy(VALID)))
    assert field in error.problems, error.problems
    assert any(fragment in reason for reason in error.problems[field]), error.problems[field]
    assert field in str(error)


@settings(max_examples=200, deadline=None)
@given(
    corruptions=st.lists(st.sampled_from(range(len(CORRUPTIONS))), min_size=1, max_size=4, unique=True),
    data=st.data(),
)
def test_fuzzed_corruptions_are_all_reported(corruptions, data):
    """Random combinations of field corruptions: ψ rejects and names every corrupted field.

    Text-level corruptions (which make the whole document unparsable) are applied alone."""
    parse_level = [i for i in corruptions if CORRUPTIONS[i][2] == "<json>" and CORRUPTIONS[i][0] != "unknown field"]
    if parse_level:
        _, mutate, field, fragment = CORRUPTIONS[parse_level[0]]
        error = reject(mutate(copy.deepcopy(VALID)))
        assert any(fragment in reason for reason in error.problems[field])
        return
    raw = copy.deepcopy(VALID)
    last_reason: dict[str, str] = {}
    for index in corruptions:
        _, mutate, field, fragment = CORRUPTIONS[index]
        raw = json.loads(mutate(raw))
        last_reason[field] = fragment  # every corruption leaves its field invalid; the last one decides the reason
    error = reject(json.dumps(raw))
    assert set(last_reason) <= set(error.problems), (last_reason, error.problems)
    for field, fragment in last_reason.items():
        assert any(fragment in reason for reason in error.problems[field]), (field, error.problems[field])


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=12))
def test_arbitrary_json_never_crashes(value):
    """Any JSON value is either a valid skill or a SkillValidationError — never another exception."""
    try:
        validate_skill(json.dumps(value), CATALOG)
    except SkillValidationError as error:
        assert error.problems


def test_library_keeps_valid_and_reports_rejected():
    bad = {**VALID, "id": "bad", "risk_cues": []}
    duplicate = dict(VALID)
    report = build_library([json.dumps(VALID), bad, "{not json", duplicate], CATALOG, domain="shop")
    assert [skill.id for skill in report.skills] == ["shop.lookup_order"]
    assert report.skills[0].domain == "shop"
    reasons = [error.problems for error in report.rejected]
    assert reasons[0] == {"risk_cues": ["must be a non-empty list"]}
    assert "<json>" in reasons[1]
    assert reasons[2] == {"id": ["duplicate skill id in library"]}
    assert "kept 1 skills, rejected 3" in report.summary()


def test_catalog_rejects_duplicate_tools():
    with pytest.raises(ValueError, match="duplicate tool names"):
        ToolCatalog((CATALOG["get_stock_info"], CATALOG["get_stock_info"]))


def test_a_quotation_in_two_slots_is_rejected():
    """A request quoted as a success example and as a risk cue (one of them cut off with " ...") is
    rejected; the same request in two items of one slot, or a short quoted name in two slots, is not."""
    request = "Where is my order 42 right now, and when does it ship?"
    twice = {**VALID, "procedure": [*VALID["procedure"], f'Served requests such as "{request}"'],
             "risk_cues": [f'The request "{request[:28]} ..." gave no order ID.']}
    error = reject(json.dumps(twice))
    assert error.problems == {"quotations": ['the quotation "where is my order 42 right now, and when does it ship?" stands in procedure and in risk_cues']}
    one_slot = {**VALID, "risk_cues": [f'"{request}" gave no ID.', f'"{request}" again.']}
    named = {**VALID, "procedure": ['Read the "order ID" field.'], "avoidance_rules": ['Do not guess the "order ID".']}
    assert validate_skill(one_slot, CATALOG) and validate_skill(named, CATALOG)


@pytest.mark.parametrize("condition, claimed", [
    ("get_order_details is among the available functions.", "get_order_details"),
    ("Use it when get_stock_info is available.", "get_stock_info"),
    ("get_order_details is in the function list.", "get_order_details"),
    ("The customer wants to hear when the kettle is available again.", None),  # names no tool: a fact of the request
])
def test_an_applicability_condition_may_not_claim_a_tool_is_available(condition, claimed):
    raw = {**VALID, "applicability": ["The customer gives an order ID.", condition]}
    if claimed is None:
        assert validate_skill(raw, CATALOG).applicability[1] == condition
        return
    assert reject(raw).problems == {"applicability": [f"item 1 states that {claimed} is available: availability belongs to each item's catalog"]}
