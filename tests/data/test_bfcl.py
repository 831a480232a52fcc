"""BFCL multi-turn importer: counts against the source files, miss_func rules, execution, rendering, and
an import never destroying an existing dataset.

Independent computations: counts come from the raw BFCL JSON read here (call names by regex, not
the importer's parser); observations are compared with BFCL's own executor
(``multi_turn_utils.execute_multi_turn_func_call``, which imports only BFCL's constants); the
added-function prompt is read from BFCL's source text; spans are decoded by the real Qwen3 tokenizer.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from probes.cli.main import main
from probes.data import bfcl
from probes.data.bfcl_exec import BFCLEnvironment, load_api_classes, parse_call
from probes.data.dataset import ABSTAIN, DatasetError, load_dataset
from probes.data.retrieval import Retriever, make_embedder
from probes.data.schema import SkillValidationError, validate_skill
from probes.prompts.builder import PromptBuilder
from probes.prompts.context import partition_by_context
from probes.prompts.spans import SpanReport, check_spans
from runs import fails


COMMITTED = Path(__file__).resolve().parents[2] / "datasets" / "bfcl"
COMMITTED_CATEGORIES = bfcl.CATEGORIES  # all four multi-turn categories


pytest.importorskip("bfcl_eval", reason="needs the BFCL data: pip install --no-deps bfcl-eval")


def _raw(data_dir: Path, category: str) -> tuple[list[dict], dict[str, list]]:
    def rows(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    entries = rows(next(data_dir.glob(f"BFCL_v*_multi_turn_{category}.json")))
    answers = {row["id"]: row["ground_truth"] for row in rows(next((data_dir / "possible_answer").glob(f"BFCL_v*_multi_turn_{category}.json")))}
    return entries, answers


def _name(call: str) -> str:
    return re.match(r"\s*(\w+)\s*\(", call).group(1)


@pytest.fixture(scope="module")
def data_dir() -> Path:
    return bfcl.locate_bfcl_data()


@pytest.fixture(scope="module")
def imported(bfcl_import, data_dir):
    """The session's one import with the committed settings (every category): (folder, report, rows)."""
    return bfcl_import


def test_locate_names_the_package_when_missing(tmp_path, data_dir):
    assert (data_dir / "possible_answer").is_dir()
    assert bfcl.locate_bfcl_data(data_dir.parent) == data_dir  # the package root works too
    with pytest.raises(bfcl.BFCLDataError, match=r"pip install --no-deps bfcl-eval"):
        bfcl.locate_bfcl_data(tmp_path)


def test_committed_dataset_is_the_importer_output(imported):
    """Every file of the default import but CARD.md, byte for byte (the session's import skips the card,
    minutes on two cores: tests/reporting/test_cards.py regenerates the committed CARD.md from these files exactly)."""
    out, _, _ = imported
    for name in ["items.jsonl", "audit.jsonl", "skill_sources.json", *(f"domains/{p.name}" for p in (out / "domains").glob("*.json"))]:
        assert (out / name).read_bytes() == (COMMITTED / name).read_bytes(), f"datasets/bfcl/{name} is stale: regenerate it"
    assert (out / "README.md").read_text().replace(str(out), "OUT") == (COMMITTED / "README.md").read_text().replace("datasets/bfcl", "OUT")


def test_split_is_disjoint_by_entry_index(imported):
    _, report, rows = imported
    assert set(report.skill_indices).isdisjoint(report.probe_indices)
    assert sorted(report.skill_indices + report.probe_indices) == list(range(200))
    assert len(report.skill_indices) == 100
    probe_groups = {f"bfcl.{i:03d}" for i in report.probe_indices}
    assert {row["task_group"] for row in rows} <= probe_groups
    sources = json.loads((COMMITTED / "skill_sources.json").read_text())
    used = {bfcl.entry_index(entry) for entries in sources.values() for entry in entries}
    assert used and used <= set(report.skill_indices)


def test_counts_per_category_and_bucket_match_the_source_files(imported, data_dir):
    """Every ground-truth call and every [] turn of a probe entry is an item or a counted skip."""
    out, report, rows = imported
    skill_tools = {skill["tools"][0] for path in (out / "domains").glob("*.json") for skill in json.loads(path.read_text())["skills"]}
    probe = set(report.probe_indices)
    skipped = Counter(point.item_id.split("-")[1] for point in report.skipped)
    for category in COMMITTED_CATEGORIES:
        entries, answers = _raw(data_dir, category)
        calls = [c for e in entries if int(e["id"].rsplit("_", 1)[1]) in probe for turn in answers[e["id"]] for c in turn]
        empty_turns = sum(turn == [] for e in entries if int(e["id"].rsplit("_", 1)[1]) in probe for turn in answers[e["id"]])
        mine = [row for row in rows if row["source"]["entry"].startswith(f"multi_turn_{category}_")]
        by_bucket = Counter(row["bucket"] for row in mine)
        assert by_bucket == Counter({b: report.items[(category, b)] for b in ("T_ok", "T_wrong", "T_repair") if report.items[(category, b)]})
        ok_skipped = sum(1 for p in report.skipped if p.item_id.startswith(f"bfcl-{category}-") and re.search(r"s\d+(-ok)?$", p.item_id))
        # T_ok: one item per ground-truth call with a skilled tool; the rest are counted skips.
        assert by_bucket["T_ok"] + ok_skipped == len(calls)
        hidden_skilled = [  # miss_func: a call to a function BFCL still holds out at that turn is never an item
            c for e in entries if int(e["id"].rsplit("_", 1)[1]) in probe for t, turn in enumerate(answers[e["id"]]) for c in turn
            if _name(c) in skill_tools and any(int(k) > t and _name(c) in names for k, names in e.get("missed_function", {}).items())
        ]
        assert by_bucket["T_ok"] == sum(1 for c in calls if _name(c) in skill_tools) - len(hidden_skilled)
        # Abstain T_wrong: one item, one item the label audit dropped, or one counted skip per [] turn (base has no such rule).
        wrong_skipped = sum(1 for p in report.skipped if p.item_id.startswith(f"bfcl-{category}-") and re.search(r"-t\d+$", p.item_id))
        abstain = sum(1 for row in mine if row["bucket"] == "T_wrong" and row["correct_action"] == {"kind": "abstain"})
        assert abstain + sum(d.category == category for d in report.dropped) + wrong_skipped == empty_turns
        # Premature-call T_wrong: one per T_repair (the same executed failure, one step earlier).
        assert by_bucket["T_wrong"] - abstain == by_bucket["T_repair"]
        assert skipped[category] == ok_skipped + wrong_skipped + sum(1 for p in report.skipped if p.item_id.startswith(f"bfcl-{category}-") and p.item_id.endswith(("-repair", "-premature")))
    readme = (out / "README.md").read_text()
    for category in COMMITTED_CATEGORIES:
        counts = [report.items[(category, b)] for b in ("T_ok", "T_wrong", "T_repair")]
        assert f"| {category} | {counts[0]} | {counts[1]} | {counts[2]} | {sum(counts)} |" in readme
    assert report.items[("miss_func", "T_wrong")] > 50 and report.items[("miss_param", "T_wrong")] > 50
    assert all(report.items[(c, "T_repair")] > 20 for c in COMMITTED_CATEGORIES)


def test_miss_func_empty_turn_rule_and_function_removal(imported, data_dir):
    out, report, rows = imported
    entries, answers = _raw(data_dir, "miss_func")
    by_id = {e["id"]: e for e in entries}
    for entry in entries:  # BFCL's rule: the turn before each function-added turn has ground truth []
        for turn in entry["missed_function"]:
            assert answers[entry["id"]][int(turn) - 1] == [] and entry["question"][int(turn)] == []
    prompt_source = (data_dir.parent / "constants" / "default_prompts.py").read_text()
    added = next(ast.literal_eval(node.value) for node in ast.parse(prompt_source).body
                 if isinstance(node, ast.Assign) and node.targets[0].id == "DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC")
    dataset = load_dataset(out)
    items = {item.id: item for item in dataset.items}
    n_wrong = n_removed = n_added = 0
    for row in rows:
        if not row["source"]["entry"].startswith("multi_turn_miss_func_"):
            continue
        entry = by_id[row["source"]["entry"]]
        turn = row["source"]["turn"]
        held = {name for key, names in entry["missed_function"].items() if int(key) > turn for name in names}
        shown = set(dataset.catalog_for(items[row["id"]]).names)
        assert set(row["unavailable_tools"]) == held and not held & shown
        n_removed += bool(held)
        if str(turn) in entry["missed_function"]:
            assert row["user"] == added and set(entry["missed_function"][str(turn)]) <= shown
            n_added += 1
        if row["bucket"] == "T_wrong" and row["correct_action"] == {"kind": "abstain"}:
            n_wrong += 1
            assert answers[entry["id"]][turn] == [] and str(turn + 1) in entry["missed_function"]
            assert row["correct_action"] == {"kind": "abstain"}
            tempting_tool = dataset.skills[row["tempting_skill"]].tool_names[0]
            assert tempting_tool in entry["missed_function"][str(turn + 1)] and tempting_tool not in shown
    assert n_wrong == report.items[("miss_func", "T_wrong")] - report.items[("miss_func", "T_repair")] and n_removed > 100 and n_added > 50


def test_observations_equal_bfcl_executor_and_are_deterministic(data_dir):
    """Our replay of the ground truth gives BFCL's own executor's observations, twice identically."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    classes = load_api_classes(bfcl.api_source_dir(data_dir))
    for category in ("base", "long_context"):
        entries, answers = _raw(data_dir, category)
        for entry in entries[::40]:
            long_context = category == "long_context"
            runs = []
            for _ in range(2):
                env = BFCLEnvironment(classes, entry["involved_classes"], entry["initial_config"], long_context=long_context)
                runs.append([env.execute(parse_call(c)) for turn in answers[entry["id"]] for c in turn])
            assert runs[0] == runs[1]
            theirs = []
            for turn in answers[entry["id"]]:
                results, _ = execute_multi_turn_func_call(turn, entry["initial_config"], entry["involved_classes"],
                                                          "basm_test", entry["id"], long_context=long_context)
                theirs.extend(results)
            assert runs[0] == theirs, entry["id"]


def test_context_and_repair_observations_come_from_execution(imported, data_dir):
    """An item's context replays the entry: each tool message is the executed call's observation;
    a T_repair error is what the failed call returns when the skipped call is left out."""
    _, _, rows = imported
    classes = load_api_classes(bfcl.api_source_dir(data_dir))
    entries, answers = _raw(data_dir, "base")
    by_id = {e["id"]: e for e in entries}
    repairs = [row for row in rows if row["bucket"] == "T_repair" and row["source"]["entry"] in by_id][:8]
    assert repairs
    for row in repairs:
        entry = by_id[row["source"]["entry"]]
        turn, step = row["source"]["turn"], row["source"]["step"]
        env = BFCLEnvironment(classes, entry["involved_classes"], entry["initial_config"], long_context=False)
        expected = []
        for t in range(turn):
            expected.append(("user", entry["question"][t][0]["content"]))
            for c in answers[entry["id"]][t]:
                expected += [("call", _name(c)), ("tool", env.execute(parse_call(c)))]
        got = [("user", m["content"]) if m["role"] == "user" else ("call", m["tool_call"]["name"]) if m["role"] == "assistant"
               else ("tool", m["content"]) for m in row["context"]]
        assert got == expected
        calls = answers[entry["id"]][turn]
        for c in calls[: step - 1]:
            env.execute(parse_call(c))
        error = env.execute(parse_call(calls[step]))  # the previous call (calls[step - 1]) skipped
        assert row["history"][-1]["content"] == error and "error" in error.lower()
        assert row["correct_action"]["tool"] == _name(calls[step - 1]) and row["wrong_tools"] == [_name(calls[step])]


def test_skills_pass_psi_and_rejections_are_reported(imported):
    out, report, _ = imported
    dataset = load_dataset(out)  # strict: every stored skill passes ψ
    kept = sum(len(ids) for ids in report.kept.values())
    assert kept == len(dataset.skills) and kept + len(report.rejected) == sum(report.candidates.values())
    for problems in report.rejected.values():
        assert any(p.startswith(("risk_cues", "avoidance_rules")) for p in problems)
    for skill in dataset.skills.values():
        assert skill.risk_cues and skill.avoidance_rules and len(skill.tools) == 1
    readme = (out / "README.md").read_text()
    for domain, ids in report.kept.items():
        assert f"| {domain} |" in readme and f"| {report.candidates[domain]} | {len(ids)} |" in readme


MAX_SKILLS_PER_SENTENCE = 2  # two tools can share a request or argument values (held out together, same order id)


def test_slot_texts_come_from_each_skills_own_trajectories(imported, data_dir):
    """No slot sentence is shared by more than MAX_SKILLS_PER_SENTENCE skills once the anchor's name is
    masked (52 of 62 once shared one); every call a skill quotes stands in the raw BFCL ground truth
    of one of the entries it lists as sources (read here, not through the importer)."""
    out, _, _ = imported
    dataset = load_dataset(out)
    sources = json.loads((out / "skill_sources.json").read_text())
    truth = {}
    for category in ("base", "miss_func"):
        truth.update({entry_id: " ".join(c for turn in turns for c in turn) for entry_id, turns in _raw(data_dir, category)[1].items()})
    holders: dict[str, set[str]] = {}
    for skill in dataset.skills.values():
        name = skill.tool_names[0]
        for slot in ("goal", "procedure", "applicability", "risk_cues", "avoidance_rules", "recovery_notes"):
            for sentence in skill.slot_items(slot):
                holders.setdefault(re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", "<T>", sentence), set()).add(skill.id)
        own_calls = re.findall(rf"(?<!\w){re.escape(name)}\([^()]*\)", " ".join(skill.procedure + skill.avoidance_rules))
        assert own_calls, skill.id
        for call in own_calls:
            assert any(call in truth.get(entry, "") for entry in sources[skill.id]), (skill.id, call)
    shared = {sentence: ids for sentence, ids in holders.items() if len(ids) > MAX_SKILLS_PER_SENTENCE}
    assert not shared, shared
    assert max(len(ids) for ids in holders.values()) == MAX_SKILLS_PER_SENTENCE  # the bound is met, not slack


def test_no_request_stands_in_two_slots_and_examples_are_not_degenerate(imported):
    """The example request of a procedure quotes an argument value of the call it names and has at
    least EXAMPLE_MIN_WORDS words; no request is quoted in two slots of one skill (the importer's
    output, checked here with a plain regex rather than ψ's helper)."""
    out, _, _ = imported
    for skill in load_dataset(out).skills.values():
        slots = {slot: " ".join(skill.slot_items(slot)) for slot in ("procedure", "risk_cues", "avoidance_rules", "recovery_notes")}
        quotes = {slot: {q.removesuffix(" ...") for q in re.findall(r'"([^"]+)"', text) if len(q.split()) >= 4} for slot, text in slots.items()}
        for a in quotes:
            for b in quotes:
                assert a == b or not any(x.startswith(y) for x in quotes[a] for y in quotes[b]), (skill.id, a, b)
        for step in skill.procedure:
            if step.startswith("It served requests such as"):
                request, call = re.fullmatch(r'It served requests such as "(.*)" with (.*)\.', step).groups()
                flat = [str(int(v) if isinstance(v, float) and v.is_integer() else v).lstrip("@#")  # 100.0 is quoted as 100, #Travel as Travel
                        for value in (*parse_call(call).args, *parse_call(call).kwargs.values()) for v in (value if isinstance(value, list) else [value])]
                assert len(request.split()) >= bfcl.EXAMPLE_MIN_WORDS and any(v.lower() in request.lower() for v in flat), step


def test_a_held_out_tools_skill_claims_no_availability(imported):
    """miss_func_49 turn 2 holds out tail (and wc, cat); the old tail skill said "tail is among the available functions".
    No shown skill states that a tool the item holds out is available, and ψ rejects the old wording."""
    out, _, rows = imported
    dataset = load_dataset(out)
    item = next(row for row in rows if row["id"] == "bfcl-miss_func-049-t2-wrong")
    assert "tail" in item["unavailable_tools"] and "GorillaFileSystem" in item["catalog_domains"]  # tail's skill is retrievable there
    for row in rows:
        for skill in dataset.skills.values():
            if skill.domain in row["catalog_domains"]:
                for condition in skill.applicability:
                    assert not (re.search(r"\bavailable\b", condition) and any(re.search(rf"\b{t}\b", condition) for t in row["unavailable_tools"])), (row["id"], condition)
    old = {**dataset.skills["GorillaFileSystem.tail"].to_json(), "applicability": ["tail is among the available functions."]}
    with pytest.raises(SkillValidationError, match=r"applicability: item 0 states that tail is available"):
        validate_skill(old, dataset.domains["GorillaFileSystem"].catalog)


def _step(call: str, observation: str = "{}", skip_failure: str | None = None) -> bfcl.Step:
    parsed = parse_call(call)
    return bfcl.Step(parsed, dict(parsed.kwargs), observation, skip_failure)


def test_predecessor_rule_on_hand_built_trajectories():
    """load_file needs open_store (executed without it, it failed) in 2 of 5 uses: a predecessor.
    ping merely came first twice (no dependency): not one. lookup supplied a value once (1 < 2 uses): not one.
    With 11 uses, 2 failures are under 20%: open_store is dropped too. The example request must quote a value."""
    def trajectory(index: int, turns: list[tuple[str, list[bfcl.Step]]]) -> bfcl.Trajectory:
        return bfcl.Trajectory("base", f"multi_turn_base_{index}", index, ("X",),
                               [bfcl.Turn(t, user, False, (), steps) for t, (user, steps) in enumerate(turns)])

    error = '{"error": "no store open"}'
    uses = [
        trajectory(0, [("Open the shop store and load the file report.txt please", [_step("open_store(name='shop')"), _step("load_file(name='report.txt')", skip_failure=error)])]),
        trajectory(1, [("What's inside?", [_step("open_store(name='b')"), _step("load_file(name='b.txt')", skip_failure=error)])]),
        trajectory(2, [("Ping first then load notes.md", [_step("ping()"), _step("load_file(name='notes.md')")])]),
        trajectory(3, [("Ping and load it", [_step("ping()"), _step("load_file(name='c.txt')")])]),
        trajectory(4, [("Find the id and load that file", [_step("lookup()", '{"file": "d.txt"}'), _step("load_file(name='d.txt')")])]),
    ]
    evidence = bfcl.collect_evidence(uses)["load_file"]
    assert [(tool, [u.entry for u in supporting]) for tool, supporting in bfcl.predecessors(evidence)] == [
        ("open_store", ["multi_turn_base_0", "multi_turn_base_1"])]
    assert [u.dependency for u in evidence.successes] == [("fail",), ("fail",), (), (), ("name",)]
    tool = {"name": "load_file", "description": "Tool description: Load a file.",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}
    skill = bfcl.extract_skill(tool, evidence, "X")
    assert skill["procedure"][0].startswith("Call open_store first: in 2 of 5 source uses load_file came right after it")
    assert not any("ping" in step or "lookup" in step for step in skill["procedure"] + skill["applicability"])
    assert skill["procedure"][-1] == "It served requests such as \"Ping first then load notes.md\" with load_file(name='notes.md')."
    assert skill["risk_cues"] == ["load_file(name='report.txt') returned \"no store open\" when open_store(name='shop') had not run before it.",
                                  "load_file(name='b.txt') returned \"no store open\" when open_store(name='b') had not run before it."]
    more = uses + [trajectory(5 + i, [("Load the file e.txt now", [_step("load_file(name='e.txt')")])]) for i in range(6)]
    assert bfcl.predecessors(bfcl.collect_evidence(more)["load_file"]) == []  # 2 of 11 < 20%


def test_items_render_through_the_qwen3_template(imported, qwen3_tokenizer):
    out, _, rows = imported
    dataset = load_dataset(out)
    tokenizer = qwen3_tokenizer
    builder = PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical")), tokenizer_name="qwen3")
    chosen = []
    for bucket in ("T_ok", "T_wrong", "T_repair"):
        chosen += [item for item in dataset.items if item.bucket == bucket and len(item.context) >= 6][:2]
    report = SpanReport()
    for item in chosen:
        prompted = builder.build(item, "basm", 2, "prompted")  # earlier calls as text, observations as tool responses
        check_spans(prompted, tokenizer, report)
        assert prompted.text.count("<tool_response>") == sum(m["role"] == "tool" for m in (*item.context, *item.history))
        for config in ("proc", "basm"):
            record = builder.build(item, config, 2, "native")
            check_spans(record, tokenizer, report)
        text = record.text
        user_turns = [m["content"] for m in item.context if m["role"] == "user"]
        positions = [text.index(f"<|im_start|>user\n{u}") for u in user_turns]
        assert positions == sorted(positions) and positions[-1] < text.index(item.user)
        n_tool = sum(m["role"] == "tool" for m in (*item.context, *item.history))
        assert text.count("<tool_response>") == n_tool
        # every earlier call plus the forced prefix (the template's own example has no quoted name)
        assert text.count('<tool_call>\n{"name": "') == sum(m["role"] == "assistant" for m in (*item.context, *item.history)) + 1
        if item.correct_action == ABSTAIN:
            assert [c.role for c in record.candidates if c.action == ABSTAIN] == ["correct"]
    assert report.total > 0 and report.mismatches == []


def test_partition_by_context_counts_and_lists_skips(imported, qwen3_tokenizer):
    out, _, _ = imported
    dataset = load_dataset(out)
    tokenizer = qwen3_tokenizer
    builder = PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical")), tokenizer_name="qwen3")
    items = dataset.select(limit_per_bucket=2, spread=True)
    lengths = {}
    for item in items:
        records = [builder.build(item, "basm", 1, "native")]
        lengths[item.id] = max(max([len(tokenizer(r.text, add_special_tokens=False)["input_ids"])]
                                   + [c.anchor_index + len(c.token_ids) for c in r.candidates]) for r in records)
    cut = sorted(lengths.values())[len(lengths) // 2]
    part = partition_by_context(builder, items, max_tokens=cut, k=1, configs=("basm",))
    assert {item.id for item in part.kept} == {i for i, n in lengths.items() if n <= cut}
    assert {p.item_id for p in part.skipped} == {i for i, n in lengths.items() if n > cut}
    assert all(f"{lengths[p.item_id]} tokens > {cut}" in p.reason for p in part.skipped)
    assert len(part.kept) + len(part.skipped) == len(items)


def test_long_context_sample_and_schema_conversion(tmp_path, data_dir):
    report = bfcl.import_bfcl(out=tmp_path, categories=("base", "long_context"), max_probe_entries=3)
    assert "first 3 probe indices" in (tmp_path / "README.md").read_text()
    rows = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    size = Counter()
    for row in rows:
        size[row["source"]["entry"].rsplit("_", 1)[0]] += sum(len(m.get("content", "")) for m in row["context"])
    assert size["multi_turn_long_context"] > 2 * size["multi_turn_base"] > 0
    assert report.items[("long_context", "T_ok")] > 0
    types = Counter()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                types[node["type"]] += 1
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in (tmp_path / "domains").glob("*.json"):
        walk(json.loads(path.read_text())["tools"])
    assert types["object"] > 0 and types["number"] > 0 and not types["dict"] and not types["float"]


def test_context_field_is_validated(tmp_path):
    (tmp_path / "domains").mkdir()
    (tmp_path / "domains" / "d.json").write_text(json.dumps({"tools": [{"name": "t", "description": "x", "parameters": {"type": "object"}},
                                                                              {"name": "t2", "description": "y", "parameters": {"type": "object"}}], "skills": [
        {"id": "s", "goal": "g", "procedure": ["p"], "tools": ["t"], "applicability": [], "risk_cues": ["r"], "avoidance_rules": ["a"], "recovery_notes": []}]}))
    item = {"id": "i", "bucket": "T_ok", "split": "eval", "domain": "d", "task_group": "g", "catalog_domains": ["d"], "unavailable_tools": [],
            "user": "u", "history": [], "correct_action": {"kind": "call", "tool": "t"}, "wrong_tools": ["t2"], "tempting_skill": "s", "state_cues": [],
            "context": [{"role": "user", "content": ""}]}  # a scorable item (a wrong tool other than the correct one)
    (tmp_path / "items.jsonl").write_text(json.dumps(item) + "\n")
    with pytest.raises(DatasetError, match=r"items.jsonl:1: context\[0\]: a user message needs a non-empty string 'content'"):
        load_dataset(tmp_path)
    item["context"] = [{"role": "user", "content": "earlier"}, {"role": "assistant", "tool_call": {"name": "t", "arguments": {}}},
                       {"role": "tool", "name": "t", "content": "ok"}]
    (tmp_path / "items.jsonl").write_text(json.dumps(item) + "\n")
    assert load_dataset(tmp_path).items[0].context[0]["content"] == "earlier"


# ---------------------------------------------------------------------------- the LLM extractor
class CommittedSkills:
    """A text generator that answers each prompt with the committed (deterministic) skill of the id
    the prompt asks for, every other one in a fenced ```json block."""

    label = "committed-skills"
    max_new_tokens = 1000
    batch_size = 1

    def __init__(self) -> None:
        self.skills = {s["id"]: s for p in (COMMITTED / "domains").glob("*.json") for s in json.loads(p.read_text())["skills"]}
        self.asked: list[str] = []

    def __call__(self, messages):
        from probes.data.extract_llm import Reply

        skill_id = re.search(r'"id": the string "([^"]+)"', messages[1]["content"]).group(1)
        self.asked.append(skill_id)
        text = json.dumps(self.skills[skill_id])
        return Reply(f"```json\n{text}\n```" if len(self.asked) % 2 else text, False)

    def replies(self, conversations, *, on_batch=None):
        return [self(messages) for messages in conversations]


def test_llm_extractor_given_the_deterministic_answers_writes_the_committed_items(tmp_path, imported):
    """With replies equal to the deterministic skills, the LLM path keeps exactly them (ψ rejects the
    same candidates, those without boundary evidence, here unprompted), so items and skills are the committed ones."""
    _, deterministic, _ = imported
    generator = CommittedSkills()
    report = bfcl.import_bfcl(out=tmp_path, categories=COMMITTED_CATEGORIES, extractor="llm", llm_model=generator, llm_retries=1)
    assert sorted(generator.asked) == sorted(generator.skills)  # one reply each, every kept skill asked for once
    for name in ["items.jsonl", "skill_sources.json", *(f"domains/{p.name}" for p in (COMMITTED / "domains").glob("*.json"))]:
        assert (tmp_path / name).read_bytes() == (COMMITTED / name).read_bytes(), name
    rejections = json.loads((tmp_path / "skill_rejections.json").read_text())
    assert sorted(r["id"] for r in rejections) == sorted(deterministic.rejected) and {r["reason"] for r in rejections} == {"no boundary evidence: not prompted"}
    readme = (tmp_path / "README.md").read_text()
    n_kept, n_rejected = len(generator.skills), len(deterministic.rejected)
    assert "with the chat model `committed-skills`" in readme and "extractor='llm', llm_model=ChatGenerator.load('committed-skills'" in readme
    assert f"Kept: {n_kept} ({n_kept} on the first reply, 0 after a retry); discarded: {n_rejected}." in readme
    assert f"* {n_rejected} × no boundary evidence: not prompted" in readme
    assert report.extraction is not None and len(report.extraction.kept) == n_kept
    bfcl.import_bfcl(out=tmp_path, categories=COMMITTED_CATEGORIES)  # a deterministic import over it leaves no stale rejections
    assert not (tmp_path / "skill_rejections.json").exists()


def test_llm_extractor_with_random_weights_keeps_nothing_and_writes_nothing(tmp_path, tiny_qwen3_dir, imported, capsys):
    from probes.cli.main import main
    from probes.engine.generate import ChatGenerator

    _, deterministic, _ = imported
    n_candidates, n_no_evidence = sum(deterministic.candidates.values()), len(deterministic.rejected)
    generator = ChatGenerator.load(tiny_qwen3_dir, max_new_tokens=4)
    with pytest.raises(bfcl.NoSkillKept) as error:
        bfcl.import_bfcl(out=tmp_path / "out", categories=("base",), extractor="llm", llm_model=generator, llm_retries=0)
    message = str(error.value)
    assert f"the llm extractor kept no skill of {n_candidates} candidates" in message
    assert f"{n_no_evidence} × no boundary evidence: not prompted" in message
    parsed = re.findall(r"(\d+) × (not strict JSON[^;]*)", message)
    assert parsed and sum(int(n) for n, _ in parsed) == n_candidates - n_no_evidence
    assert not (tmp_path / "out").exists()
    assert main(["bfcl-import", "--out", str(tmp_path / "out"), "--extractor", "llm", "--llm-model", str(tiny_qwen3_dir),
                 "--llm-max-new-tokens", "4", "--llm-retries", "0"]) == 1
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_extractor_arguments_are_checked(tmp_path, capsys):
    from probes.cli.main import main

    with pytest.raises(ValueError, match="extractor must be one of"):
        bfcl.import_bfcl(out=tmp_path, extractor="gpt")
    with pytest.raises(ValueError, match="extractor='llm' needs llm_model"):
        bfcl.import_bfcl(out=tmp_path, extractor="llm")
    with pytest.raises(ValueError, match=r"llm_model must be a text generator such as .*ChatGenerator.load\(<model folder>\), got str 'models/x'"):
        bfcl.import_bfcl(out=tmp_path, extractor="llm", llm_model="models/x")
    with pytest.raises(ValueError, match="llm_model is used only with it"):
        bfcl.import_bfcl(out=tmp_path, llm_model=CommittedSkills())
    assert main(["bfcl-import", "--out", str(tmp_path), "--extractor", "llm"]) == 2
    assert "--extractor llm needs --llm-model" in capsys.readouterr().err
    assert main(["bfcl-import", "--out", str(tmp_path), "--llm-model", "x", "--llm-retries", "1"]) == 2
    assert "--llm-model, --llm-retries: used only with --extractor llm" in capsys.readouterr().err
    assert main(["bfcl-import", "--out", str(tmp_path), "--extractor", "llm", "--llm-model", "x", "--llm-retries", "-1"]) == 2
    assert "option 'llm_retries' (--llm-retries) must be ≥ 0, got -1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------- defaults, label audit, matched set
def test_cli_default_is_the_committed_regeneration(tmp_path, monkeypatch):
    """`bfcl-import --out DIR` with no other flag calls the importer with its own defaults, which are the
    settings the committed README's regeneration command states (every category; CARD.md written)."""
    import inspect

    from probes.cli.main import main

    from probes.reporting import cards

    defaults = {name: p.default for name, p in inspect.signature(bfcl.import_bfcl).parameters.items() if p.default is not inspect.Parameter.empty}
    seen, carded = {}, []
    monkeypatch.setattr(bfcl, "import_bfcl", lambda **kwargs: seen.update(kwargs) or type("Report", (), {"summary": lambda self: ""})())
    monkeypatch.setattr(cards, "write_card", carded.append)
    assert main(["bfcl-import", "--out", str(tmp_path)]) == 0
    assert tuple(seen.pop("categories")) == tuple(defaults.pop("categories")) == bfcl.CATEGORIES
    assert {key: seen[key] for key in defaults} == defaults and list(map(Path, carded)) == [tmp_path]  # and CARD.md written after the import
    call = ast.parse(re.search(r"^import_bfcl\(.*\)$", (COMMITTED / "README.md").read_text(), re.M).group(0), mode="eval").body
    stated = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    assert stated == {"out": "datasets/bfcl", "categories": list(bfcl.CATEGORIES), "skill_fraction": defaults["skill_fraction"], "seed": defaults["seed"]}


def _gt_call(text: str, parameters: dict[str, list[str]]) -> tuple[str, dict]:
    """A BFCL ground-truth call string parsed by Python's own parser (independent of bfcl_exec.parse_call);
    positional arguments are named by the order of the function doc's properties (``parameters``)."""
    node = ast.parse(text.strip(), mode="eval").body
    named = dict(zip(parameters[node.func.id], (ast.literal_eval(arg) for arg in node.args)))
    return node.func.id, {**named, **{kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}}


def _appears(value, text: str) -> bool:
    """A ground-truth value is quoted in ``text``: a string (``@``/``#`` stripped), a whole number without
    ``.0``, or any list element, as a whole word; a value with no such form counts as given."""
    elements = value if isinstance(value, list) else [value]
    forms = []
    for element in elements:
        if isinstance(element, bool) or isinstance(element, dict):
            continue
        form = str(int(element)) if isinstance(element, float) and element.is_integer() else str(element).strip().lstrip("@#")
        if len(form) > 1:
            forms.append(form.lower())
    return not forms or any(re.search(r"(?<![A-Za-z0-9_])" + re.escape(form) + r"(?![A-Za-z0-9_])", text.lower()) for form in forms)


def test_label_audit_examples_and_missing_arguments_from_the_raw_data(imported, data_dir):
    """The issue's examples come out as it says, and every kept or relabelled miss_param T_wrong item's
    missing arguments are checked against BFCL's raw function docs and ground truth: required, and their
    value in neither the request nor the earlier turns (the item's own prompt text)."""
    out, report, rows = imported
    dropped = {json.loads(line)["id"]: json.loads(line) for line in (out / "audit.jsonl").read_text().splitlines()}
    assert "lacks no required argument" in dropped["bfcl-miss_param-091-t0-wrong"]["audit"][0]["reason"]  # the request is fully specified
    assert "message_login(user_id='USR001')" in dropped["bfcl-miss_param-143-t3-wrong"]["audit"][0]["reason"]  # available, and asked first
    assert "(travel_date) are already in the request" in dropped["bfcl-miss_param-195-t0-wrong"]["audit"][0]["reason"]  # the date is in the request
    assert "the request names find" in dropped["bfcl-miss_func-035-t0-wrong"]["audit"][0]["reason"]  # find(name='config.py') is available
    assert not {row["id"] for row in rows} & set(dropped)
    docs, order = {}, {}
    for path in (data_dir / "multi_turn_func_doc").glob("*.json"):
        for doc in map(json.loads, path.read_text().splitlines()):
            docs[doc["name"]], order[doc["name"]] = doc["parameters"].get("required", []), list(doc["parameters"].get("properties", {}))
    entries, answers = _raw(data_dir, "miss_param")
    audited = [row for row in rows if row.get("audit")]
    assert {row["bucket"] for row in audited} == {"T_wrong"} and {row["correct_action"]["kind"] for row in audited} == {"abstain"}
    n_checked = 0
    for row in audited:
        if row["category"] != "miss_param":
            continue
        entry_id, turn = row["source"]["entry"], row["source"]["turn"]
        known = "\n".join([row["user"], *(json.dumps(m["tool_call"]["arguments"]) if m["role"] == "assistant" else m["content"] for m in row["context"])])
        calls = [_gt_call(text, order) for text in answers[entry_id][turn + 1]]
        tool = row["wrong_tools"][0]
        assert row["tempting_skill"].endswith("." + tool)
        missing = row["source"]["missing_parameters"]
        assert missing and set(missing) <= set(docs[tool]), row["id"]
        assert any(all(p in arguments and not _appears(arguments[p], known) for p in missing) for name, arguments in calls if name == tool), row["id"]
        first_name, first_arguments = calls[0]
        assert any(not _appears(first_arguments[p], known) for p in docs[first_name] if p in first_arguments), row["id"]  # the first call cannot be made now
        n_checked += 1
    assert n_checked == sum(1 for row in audited if row["category"] == "miss_param") > 30
    actions = Counter(row["audit"][0]["action"] for row in audited) + Counter(d["audit"][0]["action"] for d in dropped.values())
    readme = (out / "README.md").read_text()
    for category in ("miss_func", "miss_param"):
        mine = Counter(r["audit"][0]["action"] for r in audited if r["category"] == category)
        gone = sum(1 for d in dropped.values() if d["category"] == category)
        assert f"| {category} | {mine['kept']} | {mine['relabelled']} | {gone} |" in readme
    assert actions["dropped"] == len(dropped) > 0 and actions["relabelled"] > 0


def test_premature_wrong_items_and_matched_pairs(imported):
    """A premature-call T_wrong is its T_repair twin before the failure (same turn, one step earlier, same
    correct call and premature tool, the real error in `source`); every T_wrong has exactly one matched T_ok
    of the same category, step depth and catalog gap, each T_ok used once."""
    _, report, rows = imported
    by_id = {row["id"]: row for row in rows}
    premature = [row for row in rows if row["bucket"] == "T_wrong" and row["correct_action"]["kind"] == "call"]
    assert len(premature) == sum(1 for row in rows if row["bucket"] == "T_repair") > 100
    for row in premature:
        step = row["source"]["step"]
        repair = by_id[row["id"].replace(f"s{step}-wrong", f"s{step + 1}-repair")]
        assert row["correct_action"] == repair["correct_action"] and row["wrong_tools"] == repair["wrong_tools"] == [row["tempting_skill"].split(".", 1)[1]]
        assert row["history"] == repair["history"][:-2] and repair["state_cues"] == [row["source"]["error"]] and len(row["history"]) == 2 * step
    wrong = [row for row in rows if row["bucket"] == "T_wrong"]
    matched = [row for row in rows if row.get("match_id")]
    assert all(row.get("match_id") == row["id"] for row in wrong) and len(matched) == 2 * len(wrong) == 2 * report.pairs
    partners = Counter(row["match_id"] for row in matched)
    assert set(partners.values()) == {2}
    for row in matched:
        if row["bucket"] == "T_ok":
            twin = by_id[row["match_id"]]
            assert (row["category"], len(row["history"]), bool(row["unavailable_tools"])) == (twin["category"], len(twin["history"]), bool(twin["unavailable_tools"]))


def test_card_structural_rules_per_stratum_match_sklearn():
    """The committed card's per-category and matched-set rows of the structural rules equal
    scikit-learn's balanced accuracy of the rule, recomputed here from the committed items (the card
    prints 3 decimals: tolerance 5e-4); on the matched set step 0 and the catalog gap are at 0.5 exactly."""
    from sklearn.metrics import balanced_accuracy_score

    dataset = load_dataset(COMMITTED)
    card = (COMMITTED / "CARD.md").read_text()
    rules = {
        "history_empty": lambda item: not item.history,
        "catalog_hides_tool": lambda item: bool(item.unavailable_tools),
        "history_empty_x_catalog_gap": lambda item: not item.history and bool(item.unavailable_tools),
        "tempting_tool_hidden": lambda item: dataset.skills[item.tempting_skill].tool_names[0] not in dataset.catalog_for(item).names,
    }
    strata = {category: [i for i in dataset.items if i.category == category] for category in bfcl.CATEGORIES}
    strata["matched"] = [i for i in dataset.items if i.match_id is not None]
    for name, items in strata.items():
        pair = [item for item in items if item.bucket in ("T_ok", "T_wrong")]
        y = [item.bucket == "T_wrong" for item in pair]
        for rule, fires in rules.items():
            expected = balanced_accuracy_score(y, [fires(item) for item in pair])
            value = float(re.search(rf"^\| {rule} \| {name} \| balanced_accuracy \| ([0-9.]+) \|", card, re.M).group(1))
            assert value == pytest.approx(expected, abs=5e-4), (rule, name)
            if name == "matched" and rule in ("history_empty", "catalog_hides_tool", "history_empty_x_catalog_gap"):
                assert expected == 0.5


def test_audit_field_round_trips_and_the_audit_command_lists_every_change(capsys):
    """Every item's `audit` survives loading unchanged; a malformed one is a clear error; `basm-probes
    audit` lists each audited label once (dropped ones from audit.jsonl)."""
    from probes.cli.main import main
    from probes.data.dataset import _parse_item

    rows = [json.loads(line) for line in (COMMITTED / "items.jsonl").read_text().splitlines()]
    dataset = load_dataset(COMMITTED)
    assert [item.audit and [dict(e) for e in item.audit] for item in dataset.items] == [row.get("audit") for row in rows]
    assert [item.match_id for item in dataset.items] == [row.get("match_id") for row in rows]
    row = next(row for row in rows if row.get("audit"))
    for bad in ([{"rule": "r", "action": "moved", "reason": "x"}], [{"rule": "r", "action": "kept"}], []):
        with pytest.raises(DatasetError, match="audit"):
            _parse_item({**row, "audit": bad}, "here")
    dropped = (COMMITTED / "audit.jsonl").read_text().splitlines()
    assert main(["audit", "--dataset", str(COMMITTED), "--action", "dropped"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("bfcl-") for line in printed) == len(dropped) and printed[-1] == f"dropped {len(dropped)}"
    assert main(["audit", "--dataset", str(COMMITTED)]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("bfcl-")]
    assert sorted(listed) == sorted([row["id"] for row in rows if row.get("audit")] + [json.loads(line)["id"] for line in dropped])


@pytest.mark.usefixtures("private_cache")
def test_bfcl_import_never_destroys_an_existing_dataset(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("bfcl_eval", reason="needs the BFCL data: pip install --no-deps bfcl-eval")
    from probes.data.bfcl import folder

    before = {p.relative_to(dataset): p.read_bytes() for p in dataset.rglob("*") if p.is_file()}
    argv = ["bfcl-import", "--out", str(dataset), "--max-probe-entries", "2"]
    assert "is not a previous BFCL import" in fails(argv, capsys, code=2)
    assert {p.relative_to(dataset): p.read_bytes() for p in dataset.rglob("*") if p.is_file()} == before

    out = tmp_path / "bfcl"
    assert main(["bfcl-import", "--out", str(out), "--max-probe-entries", "2", "--no-card"]) == 0
    (out / "CARD.md").write_text("a stale card\n")
    (out / "NOTES.md").write_text("notes written later\n")
    imported = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def killed(*args, **kwargs):
        raise RuntimeError("killed mid-import")

    monkeypatch.setattr(folder, "render_readme", killed)  # inside the write, its last file: nothing of the new import may land
    with pytest.raises(RuntimeError, match="killed mid-import"):
        main(["bfcl-import", "--out", str(out), "--max-probe-entries", "3", "--no-card"])
    monkeypatch.undo()
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == imported
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bfcl.")]  # no staging folder left

    assert main(["bfcl-import", "--out", str(out), "--max-probe-entries", "3", "--no-card"]) == 0  # over a previous import: allowed
    assert (out / "NOTES.md").read_text() == "notes written later\n"  # and what the import does not write is kept
    assert not (out / "CARD.md").exists()  # a card of the previous items is not left stale

    assert main([*argv, "--overwrite", "--no-card"]) == 0
    assert not (dataset / "generate.py").exists() and (dataset / "skill_sources.json").is_file()
