"""BFCL multi-turn importer: counts against the source files, miss_func rules, execution, rendering.

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

from probes.data import bfcl
from probes.data.bfcl_exec import BFCLEnvironment, load_api_classes, parse_call
from probes.prompts.context import partition_by_context
from probes.data.dataset import ABSTAIN, DatasetError, load_dataset
from probes.prompts.builder import PromptBuilder
from probes.prompts.spans import SpanReport, check_spans
from probes.data.retrieval import Retriever, make_embedder
from probes.data.schema import SkillValidationError, validate_skill

COMMITTED = Path(__file__).resolve().parent.parent / "datasets" / "bfcl"
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
    out, _, _ = imported
    for name in ["items.jsonl", "skill_sources.json", *(f"domains/{p.name}" for p in (out / "domains").glob("*.json"))]:
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
        # T_wrong: one item or one counted skip per [] turn (base has no T_wrong rule).
        wrong_skipped = sum(1 for p in report.skipped if p.item_id.startswith(f"bfcl-{category}-") and re.search(r"-t\d+$", p.item_id))
        assert by_bucket["T_wrong"] + wrong_skipped == empty_turns
        assert skipped[category] == ok_skipped + wrong_skipped + sum(1 for p in report.skipped if p.item_id.startswith(f"bfcl-{category}-") and p.item_id.endswith("-repair"))
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
        if row["bucket"] == "T_wrong":
            n_wrong += 1
            assert answers[entry["id"]][turn] == [] and str(turn + 1) in entry["missed_function"]
            assert row["correct_action"] == {"kind": "abstain"}
            tempting_tool = dataset.skills[row["tempting_skill"]].tool_names[0]
            assert tempting_tool in entry["missed_function"][str(turn + 1)] and tempting_tool not in shown
    assert n_wrong == report.items[("miss_func", "T_wrong")] and n_removed > 100 and n_added > 50


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

    def __init__(self) -> None:
        self.skills = {s["id"]: s for p in (COMMITTED / "domains").glob("*.json") for s in json.loads(p.read_text())["skills"]}
        self.asked: list[str] = []

    def __call__(self, messages):
        from probes.data.extract_llm import Reply

        skill_id = re.search(r'"id": the string "([^"]+)"', messages[1]["content"]).group(1)
        self.asked.append(skill_id)
        text = json.dumps(self.skills[skill_id])
        return Reply(f"```json\n{text}\n```" if len(self.asked) % 2 else text, False)


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
    from probes.data.extract_llm import MAX_NEW_TOKENS

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
    assert f"--llm-retries ≥ 0, got {MAX_NEW_TOKENS} and -1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
