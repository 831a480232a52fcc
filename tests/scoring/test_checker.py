"""The boundary checker G (Eq. 11), the repair hint h_t (Eq. 12) and BFCL execution of model calls (the
``repair`` analysis and resume of ``calls --checker``: analyses/test_repair.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from probes.core.chat import Reply
from probes.data.dataset import Item
from probes.data.schema import Skill, Tool, ToolCatalog, ToolUse
from probes.scoring.checker import ChatJudge, DecisionState, ProposedCall, check_call, matching_skills, repair_hint


torch.set_num_threads(1)


CAT = Tool("cat", "Print a file.", {"type": "object", "properties": {"file_name": {"type": "string"}}, "required": ["file_name"],
                                     "additionalProperties": False})


CD = Tool("cd", "Change directory.", {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]})
CATALOG = ToolCatalog((CAT, CD))


def _skill(**slots) -> Skill:
    fields = {"id": "fs.cat", "goal": "Show a file's content.", "procedure": ("Call cat.",), "tools": (ToolUse("cat"),),
              "applicability": (), "risk_cues": ("x",), "avoidance_rules": (), "recovery_notes": ()}
    return Skill(**{**fields, **slots})


def _item(user: str = "Show me notes.txt please.", history: tuple = ()) -> Item:
    return Item(id="i", bucket="T_wrong", split="eval", domain="fs", task_group="g", catalog_domains=("fs",), unavailable_tools=(),
                user=user, history=history, correct_action="cat", correct_arguments=None, wrong_tools=("cd",), tempting_skill="fs.cat",
                state_cues=())


CD_RAN = ({"role": "assistant", "tool_call": {"name": "cd", "arguments": {"folder": "docs"}}},
          {"role": "tool", "name": "cd", "content": '{"current_working_directory": "docs"}'})


def _state(**item) -> DecisionState:
    return DecisionState.of(_item(**item), CATALOG)


def _rules(decision, rule):
    return [c for c in decision.checks if c.rule == rule]


# ------------------------------------------------------------------------------------- G's rules
def test_unknown_tool_and_schema() -> None:
    state = _state()
    unknown = check_call(ProposedCall("rm", {"path": "x"}), state, [_skill()])
    assert unknown.verdict == "block" and _rules(unknown, "known_tool")[0].verdict == "block"
    wrong_type = check_call(ProposedCall("cat", {"file_name": 3}), state, [])
    assert wrong_type.verdict == "block" and "is not of type 'string'" in _rules(wrong_type, "schema")[0].reason
    extra = check_call(ProposedCall("cat", {"file_name": "a", "mode": "r"}), state, [])
    assert extra.verdict == "block"
    unreadable = check_call(ProposedCall("cat", None), state, [])
    assert _rules(unreadable, "schema")[0].verdict == "block"
    valid = check_call(ProposedCall("cat", {"file_name": "notes.txt"}), state, [])
    assert valid.verdict == "pass" and [c.rule for c in valid.checks] == ["known_tool", "complete", "schema"]  # S*_k empty: the product is 1


def test_an_incomplete_call_is_blocked_as_incomplete_not_by_its_prefix_schema() -> None:
    from probes.scoring.checker import proposed
    from probes.scoring.toolcalls import parse_reply

    # cut off by the token budget inside a value: the readable prefix {"file_name": "no"} would pass the schema
    reply = parse_reply('<tool_call>\n{"name": "cat", "arguments": {"file_name": "no', template="native")
    call = proposed(reply.action("lenient"))
    assert call is not None and not call.complete and call.arguments == {"file_name": "no"}
    decision = check_call(call, _state(), [])
    assert decision.verdict == "block" and [(c.rule, c.verdict) for c in decision.checks] == [("known_tool", "pass"), ("complete", "block")]
    assert "truncated" in _rules(decision, "complete")[0].reason
    # malformed JSON (a value where a key belongs) is incomplete too
    malformed = parse_reply('<tool_call>\n{"name": "cat", "arguments": {"file_name": "a", "b": "c": "d"}}\n</tool_call>', template="native")
    assert _rules(check_call(proposed(malformed.action("lenient")), _state(), []), "complete")[0].verdict == "block"


def test_avoidance_rules() -> None:
    before = _skill(avoidance_rules=("Do not call cat(file_name='notes.txt') before cd(folder='docs') has run.",))
    call = ProposedCall("cat", {"file_name": "notes.txt"})
    assert check_call(call, _state(), [before]).verdict == "block"
    assert check_call(call, _state(history=CD_RAN), [before]).verdict == "pass"
    other_file = check_call(ProposedCall("cat", {"file_name": "b.txt"}), _state(), [before])
    assert other_file.verdict == "pass" and "differ" in _rules(other_file, "avoidance")[0].reason
    guessed = _skill(avoidance_rules=("Do not call cat with a guessed file_name: the user gave file_name='x' only when asked.",))
    assert check_call(ProposedCall("cat", {"file_name": "secret.txt"}), _state(), [guessed]).verdict == "block"
    assert check_call(call, _state(), [guessed]).verdict == "pass"  # notes.txt is in the request
    missing = _skill(avoidance_rules=("While cat is missing from the function list, call nothing in its place.",))
    assert check_call(call, _state(), [missing]).verdict == "pass"
    # a rule that names another tool only is not this call's; a natural-language rule naming it is undecided
    prose = _skill(avoidance_rules=("Do not call cat for binary files; call cd.", "Do not call cd twice."))
    decision = check_call(call, _state(), [prose])
    assert [c.verdict for c in _rules(decision, "avoidance")] == ["undecided"] and decision.verdict == "undecided"


def test_applicability_holds_fails_undecided() -> None:
    ran = _skill(applicability=("cd has already run in this conversation, as cd(folder='docs') did before cat(file_name='a').",))
    call = ProposedCall("cat", {"file_name": "notes.txt"})
    assert check_call(call, _state(history=CD_RAN), [ran]).verdict == "pass"
    assert check_call(call, _state(), [ran]).verdict == "block"
    gives = _skill(applicability=("The request or an earlier result gives cat's file_name (the request itself quoted it in 3 of 4 source uses).",))
    assert check_call(call, _state(), [gives]).verdict == "pass"
    assert check_call(ProposedCall("cat", {"file_name": "other.txt"}), _state(), [gives]).verdict == "block"
    prose = _skill(applicability=("The user wants to read a text file.",))
    decision = check_call(call, _state(), [prose])
    assert decision.verdict == "undecided" and _rules(decision, "applicability")[0].decided_by == "rule"
    # undecided never passes, and a block wins over it
    assert check_call(call, _state(), [prose, ran]).verdict == "block"


def _not_found(name: str, identifier: str) -> tuple:
    return ({"role": "assistant", "tool_call": {"name": name, "arguments": {"file_name": identifier}}},
            {"role": "tool", "name": name, "content": '{"error": "FILE_NOT_FOUND", "message": "No file %s."}' % identifier})


def _verdict(kind: str, text: str, call: ProposedCall, state: DecisionState, n_conditions: int = 1) -> str:
    from probes.scoring.checker import decide

    return decide(kind, text, call, state, n_conditions)[0]


def test_avoidance_forms_on_identifier_prefixes_and_alternatives() -> None:
    rule = "Do not call cat for BK- travel bookings; call cd."
    assert _verdict("avoidance", rule, ProposedCall("cat", {"file_name": "BK-20417"}), _state()) == "block"
    assert _verdict("avoidance", rule, ProposedCall("cat", {"file_name": "notes.txt"}), _state()) == "pass"
    # the user names a BK- reference the call does not pass: what the call is for cannot be told
    assert _verdict("avoidance", rule, ProposedCall("cat", {"file_name": "notes.txt"}), _state(user="Cancel BK-20417.")) == "undecided"
    # the rule's alternative never breaks it; a rule that forbids a tool for a free-text reason stays undecided for it
    assert _verdict("avoidance", rule, ProposedCall("cd", {"folder": "x"}), _state()) == "pass"
    prose = "Do not call cat for personal nudges; call cd."
    assert _verdict("avoidance", prose, ProposedCall("cat", {"file_name": "a"}), _state()) == "undecided"
    assert _verdict("avoidance", prose, ProposedCall("cd", {"folder": "a"}), _state()) == "pass"
    assert _verdict("avoidance", "Do not call cd when cat was called; call cd twice.", ProposedCall("cd", {"folder": "a"}), _state()) == "undecided"
    prefer = "If so, prefer cd over cat."
    assert _verdict("avoidance", prefer, ProposedCall("cd", {"folder": "a"}), _state()) == "pass"
    assert _verdict("avoidance", prefer, ProposedCall("cat", {"file_name": "a"}), _state()) == "undecided"


def test_applicability_forms_on_identifiers_observations_and_email() -> None:
    call = ProposedCall("cat", {"file_name": "ORD-48213"})
    given = "The customer gives an existing order ID such as ORD-48213."
    assert _verdict("applicability", given, call, _state(user="Where is ORD-30001?")) == "pass"
    assert _verdict("applicability", given, call, _state(user="Where is my order?")) == "block"
    # the only ID given was reported not found: no existing ID is given
    assert _verdict("applicability", given, call, _state(user="Where is ORD-30001?", history=_not_found("cat", "ORD-30001"))) == "block"
    # the model's own call is not what the user gave
    assert _verdict("applicability", given, call, _state(user="Where is my order?", history=CD_RAN)) == "block"
    form = "The order ID has the ORD- shop format."
    assert _verdict("applicability", form, call, _state()) == "pass"
    assert _verdict("applicability", form, ProposedCall("cat", {"file_name": "BK-20417"}), _state()) == "block"
    assert _verdict("applicability", form, ProposedCall("cat", {"file_name": "notes.txt"}), _state()) == "undecided"
    found = "The card digits given by the customer were not found."
    assert _verdict("applicability", found, call, _state(history=_not_found("cat", "x"))) == "pass"
    assert _verdict("applicability", found, call, _state()) == "block"
    assert _verdict("applicability", found, call, _state(), n_conditions=2) == "undecided"  # another condition may apply
    either = "The booking reference is unknown or was not found."
    assert _verdict("applicability", either, call, _state(history=_not_found("cat", "x"))) == "pass"
    assert _verdict("applicability", either, call, _state()) == "undecided"  # "unknown" is not read
    refused = "An immediate transfer was refused because of the daily limit."
    assert _verdict("applicability", refused, call, _state()) == "block"
    assert _verdict("applicability", refused, call, _state(history=_not_found("cat", "x"))) == "undecided"  # its reason is not read
    assert _verdict("applicability", refused, call, _state(), n_conditions=2) == "undecided"
    email = "The traveller provides an email address."
    assert _verdict("applicability", email, call, _state(user="I am ana.ruiz@example.com.")) == "pass"
    assert _verdict("applicability", email, call, _state(user="I lost my booking.")) == "block"
    checkout = "The customer provides the email address used at checkout."
    assert _verdict("applicability", checkout, call, _state(user="I am ana.ruiz@example.com.")) == "undecided"
    assert _verdict("applicability", checkout, call, _state()) == "block"
    # must stay undecided: an example that is no identifier, and plain prose
    for text in ("An agent username such as mlopez is given.", "The customer wants a temporary, reversible lock."):
        assert _verdict("applicability", text, call, _state(user="mlopez, lock it")) == "undecided"


def test_grammar_coverage_counts_by_hand(bfcl_dataset) -> None:
    from probes.scoring.checker import condition_forms, grammar_coverage

    skills = [_skill(applicability=("cd has already run in this conversation.", "The user is happy.", "Ask for ORD- ids."),
                     avoidance_rules=("Do not call cat for fun; call cd.", "Do not call cat twice."),
                     recovery_notes=("If cat fails with NOPE, stop.",)),
              _skill(id="b", applicability=("The customer gives an ID such as T-1.",))]
    coverage = grammar_coverage(skills).set_index("field")
    # by hand: applicability 4 conditions, 3 in a form (has_run, id_format, id_given), all two-way
    assert coverage.loc["applicability", ["conditions", "parsed", "two_way"]].tolist() == [4, 3, 3]
    assert coverage.loc["applicability", "form_id_given"] == 1 and coverage.loc["applicability", "form_id_format"] == 1
    # avoidance: 2 rules, 1 parsed (the alternative form, one verdict only)
    assert coverage.loc["avoidance", ["conditions", "parsed", "two_way", "form_alternative"]].tolist() == [2, 1, 0, 1]
    assert coverage.loc["recovery", ["conditions", "parsed"]].tolist() == [1, 1] and coverage.loc["avoidance", "share_parsed"] == 0.5
    assert condition_forms("applicability", "The user is happy.") == ()
    with pytest.raises(ValueError, match="kind"):
        condition_forms("risk", "x")
    # BFCL's generated boundary fields are written in the grammar throughout; no form reads a risk cue
    bfcl = grammar_coverage(list(bfcl_dataset.skills.values())).set_index("field")
    read = bfcl.drop(index="risk")
    assert (read["parsed"] == read["conditions"]).all() and (bfcl["conditions"] > 0).all() and bfcl.loc["risk", "parsed"] == 0


def test_matching_skills_by_tool_or_goal() -> None:
    by_tool, by_goal = _skill(), _skill(id="fs.nav", goal="Go to the folder, then cat the file.", tools=(ToolUse("cd"),))
    other = _skill(id="fs.cd", goal="Change folder.", tools=(ToolUse("cd"),))
    assert [s.id for s in matching_skills("cat", [by_tool, by_goal, other])] == ["fs.cat", "fs.nav"]


def test_judge_stub_decides_undecided_and_is_recorded() -> None:
    prose = _skill(applicability=("The user wants to read a text file.",), avoidance_rules=("Do not call cat for binary files.",))
    call = ProposedCall("cat", {"file_name": "notes.txt"})
    seen = []

    def stub(answer):
        def generator(messages):
            seen.append(messages)
            return Reply(answer)
        return ChatJudge(generator, "stub-model")

    yes = check_call(call, _state(), [prose], judge=stub("YES"))
    # YES: the applicability condition holds (pass), the avoidance rule is broken (block)
    verdicts = {c.rule: c.verdict for c in yes.checks}
    assert verdicts == {"known_tool": "pass", "complete": "pass", "schema": "pass", "avoidance": "block", "applicability": "pass"}
    judged = _rules(yes, "applicability")[0]
    assert judged.decided_by == "judge" and judged.judge.model == "stub-model" and judged.judge.reply == "YES"
    assert "The user wants to read a text file." in judged.judge.prompt and judged.judge.prompt in seen[-1][1]["content"]
    no = check_call(call, _state(), [prose], judge=stub("No."))
    assert {c.rule: c.verdict for c in no.checks}["avoidance"] == "pass" and no.verdict == "block"  # applicability violated
    unsure = check_call(call, _state(), [prose], judge=stub("Maybe"))
    assert unsure.verdict == "undecided" and all(c.decided_by != "judge" for c in unsure.checks)


def test_checker_rates_count_correct_runnable_calls_by_hand() -> None:
    from probes.analyses.calls import checker_rates

    # four items of four groups: a correct runnable call, a correct call with invalid arguments (G blocks it:
    # abstention after), a correct abstention, a wrong call
    frame = pd.DataFrame({"format": "native", "config": "basm", "k": 1, "bucket": "T_ok", "task_group": list("abcd"),
                          **{f"{m}_{c}": v for m in ("strict", "lenient") for c, v in (
                              ("outcome_before", ["correct_tool", "correct_tool", "abstain", "wrong_tool"]),
                              ("solved_before", [True, True, True, False]),
                              ("runnable_before", [True, False, False, True]),
                              ("outcome_after", ["correct_tool", "abstain", "abstain", "wrong_tool"]),
                              ("solved_after", [True, False, True, False]),
                              ("runnable_after", [True, False, False, True]))}})
    rates = checker_rates(frame, resamples=50).set_index(["mode", "checker", "rate"])["value"]
    assert rates[("lenient", "without", "correct_call")] == 0.75 and rates[("lenient", "without", "correct_runnable")] == 0.5
    assert rates[("lenient", "with", "correct_call")] == 0.5 and rates[("lenient", "with", "correct_runnable")] == 0.5
    assert rates[("strict", "with", "abstained")] == 0.5 and rates[("strict", "with", "wrong_call")] == 0.25


def test_revise_completes_the_next_candidate_or_abstains() -> None:
    from probes.analyses.calls import revise
    from probes.data.dataset import ABSTAIN
    from probes.scoring.checker import Decision
    from probes.scoring.toolcalls import ToolCall

    def completing(readable=True):
        asked = []

        def complete(tool):
            asked.append(tool)
            call = ToolCall(tool, {"x": 1}, "tool_call_tag", "name_arguments", True) if readable else None
            return {"text": f"{tool}...", "stopped": True, "call": call}
        return complete, asked

    def deciding(verdict):
        return lambda call: Decision(call.name, (), (dataclasses.replace(_check(), verdict=verdict),))

    ranked = [("a", -1.0), ("b", -2.0), ("c", -3.0), (ABSTAIN, -4.0)]
    complete, asked = completing()
    action, tried = revise(ranked, "a", complete, deciding("pass"), "allow")
    assert action == "b" and asked == ["b"] and tried["call"]["arguments"] == {"x": 1} and tried["verdict"] == "pass"
    # one candidate only: G blocking b's completed call abstains rather than trying c
    complete, asked = completing()
    assert revise(ranked, "a", complete, deciding("block"), "allow")[0] == ABSTAIN and asked == ["b"]
    # undecided passes only under on_undecided allow
    assert revise(ranked, "a", completing()[0], deciding("undecided"), "allow")[0] == "b"
    assert revise(ranked, "a", completing()[0], deciding("undecided"), "block")[0] == ABSTAIN
    # a completion that is not a readable call of b, or abstention ranking next: abstain without a G call
    action, tried = revise(ranked, "a", completing(readable=False)[0], deciding("pass"), "allow")
    assert action == ABSTAIN and "not a readable call" in tried["reason"]
    complete, asked = completing()
    assert revise([("a", -1.0), (ABSTAIN, -2.0), ("b", -3.0)], "a", complete, deciding("pass"), "allow")[0] == ABSTAIN and asked == []
    # the blocked tool is skipped wherever it ranks (an unknown tool is not a candidate at all)
    assert revise(ranked, "zz", completing()[0], deciding("pass"), "allow")[0] == "a"


def test_complete_call_forces_the_tool_name(tiny_qwen3_dir: Path, v1_dataset) -> None:
    from probes.analyses.calls import complete_call, generation_prompt
    from probes.facade import ProbeSession

    session = ProbeSession(tiny_qwen3_dir)
    item = next(i for i in v1_dataset.items if i.bucket == "T_wrong")
    record = session.prompt(item, config="basm", k=1, dataset="basm_probe", embedder="lexical", relevance="lexical")
    tool = record.wrong_tools[0]
    out = complete_call(session, record, tool, "lenient", 6)
    candidate = next(c for c in record.candidates if c.action == tool)
    forced = session.tokenizer.decode([*record.input_ids[len(generation_prompt(record)):candidate.anchor_index + 1], *candidate.token_ids])
    assert out["text"].startswith(forced) and out["text"].startswith('<tool_call>') and f'"name": "{tool}' in out["text"]
    assert out["call"] is None or out["call"].name == tool
    with pytest.raises(ValueError, match="not a candidate"):
        complete_call(session, record, "no_such_tool", "lenient", 2)


def _check():
    from probes.scoring.checker import Check

    return Check("applicability", "s", "t", "pass", "r")


# ------------------------------------------------------------------------------------- h_t
def test_hint_notes_by_error_code() -> None:
    skill = _skill(recovery_notes=("If cat fails with FILE_NOT_FOUND, call cd to the right folder.", "If cat returns nothing, ask the user."))
    hint = repair_hint(ProposedCall("cat", {"file_name": "a"}), '{"error": "FILE_NOT_FOUND"}', _state(), [skill])
    assert hint.matched == ("If cat fails with FILE_NOT_FOUND, call cd to the right folder.",) and hint.n_undecided == 1
    other = repair_hint(ProposedCall("cat", {"file_name": "a"}), '{"error": "DENIED"}', _state(), [skill])
    assert other.matched == () and other.text == ""
    judged = repair_hint(ProposedCall("cat", {"file_name": "a"}), '{"error": "DENIED"}', _state(), [skill],
                         judge=ChatJudge(lambda messages: Reply("YES"), "stub"))
    assert judged.matched == ("If cat returns nothing, ask the user.",) and judged.notes[1].judge.model == "stub"


@pytest.fixture(scope="module")
def environments():
    pytest.importorskip("bfcl_eval", reason="needs BFCL's API classes: pip install --no-deps bfcl-eval")
    from probes.data.bfcl import ItemEnvironments

    return ItemEnvironments()


def test_bfcl_scripted_failure_gives_the_real_observation_and_its_hint(bfcl_dataset, environments) -> None:
    from probes.analyses.repair import failed_step

    item = next(i for i in bfcl_dataset.items if i.id == "bfcl-base-000-t1s1-repair")
    env, observations = environments.replay(item)
    # the scripted failed call: grep before cd(folder='temp'), executed in GorillaFileSystem
    assert item.history[-2]["tool_call"] == {"name": "grep", "arguments": {"file_name": "final_report.pdf", "pattern": "budget analysis"}}
    assert observations[-1] == '{"error": "grep: final_report.pdf: No such file or directory"}' == item.history[-1]["content"]
    assert type(env.instances["GorillaFileSystem"]).__name__ == "GorillaFileSystem"
    failed, observation, before = failed_step(item)
    hint = repair_hint(failed, observations[-1], DecisionState.of(before, bfcl_dataset.catalog_for(item)),
                       [s for s in bfcl_dataset.library_for(item) if s.id == "GorillaFileSystem.grep"])
    assert hint.matched and all(note.startswith("If grep fails because cd has not run") for note in hint.matched)
    # the repair call the hint points to runs in the same environment
    from probes.data.bfcl_exec import Call

    assert "error" not in env.execute(Call("cd(folder='temp')", "cd", (), {"folder": "temp"}))


def test_control_note_falls_back_to_the_dataset_when_the_library_has_no_other_note(bfcl_dataset) -> None:
    from probes.analyses.repair import control_note_source, control_source

    item = next(i for i in bfcl_dataset.items if i.id == "bfcl-base-079-t1s2-repair")
    failed = item.history[-2]["tool_call"]["name"]
    # VehicleControlAPI's library holds no recovery note that names neither startEngine nor pressBrakePedal
    assert failed == "startEngine" and control_source(failed, item.correct_action, bfcl_dataset.library_for(item)) == ""
    pool, source = control_note_source(item, failed, bfcl_dataset)
    assert pool == "dataset" and source and "startEngine" not in source and "pressBrakePedal" not in source
    files = next(i for i in bfcl_dataset.items if i.id == "bfcl-base-000-t1s1-repair")
    assert control_note_source(files, "grep", bfcl_dataset)[0] == "library"


HOSTILE = (
    "__import__('os').system('touch /tmp/pwned')",
    "os.system('touch /tmp/pwned')",
    "cd(folder=__import__('os').getcwd())",
    "cd(folder=open('/etc/passwd').read())",
    "import os\nos.system('touch /tmp/pwned')",
    "cd.__globals__['os'].system('x')",
    "_load_scenario(scenario={})",
    "__init__()",
    "exec(\"import os\")",
    "[cd(folder='a'), (lambda: 1)()]",
    "cd(**{'folder': 'a'})",
)


@pytest.mark.parametrize("reply", HOSTILE)
def test_hostile_replies_are_refused(reply: str, bfcl_dataset, environments) -> None:
    from probes.analyses.repair import execute_reply
    from probes.scoring.toolcalls import parse_reply

    item = next(i for i in bfcl_dataset.items if i.id == "bfcl-base-000-t1s1-repair")
    env, _ = environments.replay(item)
    before = env.snapshot()
    executed = execute_reply(env, parse_reply(reply, template="prompted"))
    assert executed is None or not executed["executed"] or executed["error"], executed
    assert not Path("/tmp/pwned").exists()
    fs, fs_before = env.instances["GorillaFileSystem"], before.instances["GorillaFileSystem"]
    assert fs._current_dir.name == fs_before._current_dir.name  # nothing changed the state


def test_candidate_path_logprobs_agree_with_the_path_margin(tiny_qwen3_dir: Path, v1_dataset) -> None:
    from probes.analyses.calls import ranked_actions
    from probes.scoring.score import score_record
    from probes.facade import ProbeSession

    session = ProbeSession(tiny_qwen3_dir)
    item = next(i for i in v1_dataset.items if i.bucket == "T_wrong")
    record = session.prompt(item, config="basm", k=1, dataset="basm_probe", embedder="lexical", relevance="lexical")
    ranked = dict(ranked_actions(session, record))
    path = score_record(session, record, variant="path")[0]["margin_path"]
    wrong = max(ranked[t] for t in record.wrong_tools if t in ranked)
    controls = max(ranked[a] for a in (record.correct_action, "<abstain>") if a in ranked)
    assert math.isclose(wrong - controls, path, abs_tol=1e-5)
