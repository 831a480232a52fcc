#!/usr/bin/env python3
"""Self-check of basm_probe_v2; exits non-zero on any violation.

    PYTHONPATH=. python datasets/basm_probe_v2/check.py

Uses the suite itself (``probes.data.dataset.load_dataset`` and the word measures of
``probes.scoring.shortcuts``), so the dataset is checked with exactly the definitions its card and
the shortcut baselines report; request lengths are counted with the real Qwen3 tokenizer
(``probes.prompts.tokenizers.load_tokenizer("qwen3")``).
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

from probes.data.dataset import load_dataset  # noqa: E402
from probes.prompts.tokenizers import load_tokenizer  # noqa: E402
from probes.scoring.shortcuts import content_words, has_contrast, has_negation, skill_length, slot_words  # noqa: E402

MAX_TOKEN_GAP = 2  # Qwen3 tokens between the T_ok and T_wrong request of one template and filler draw
ID_PREFIX = re.compile(r"\b[A-Z]{1,4}-")  # BK-, ORD-, T-, ...
DECIDING_SLOTS = ("applicability", "risk_cues", "avoidance_rules")


def pairs_of(items):
    """(T_ok, T_wrong) items drawn with the same fillers: the k-th of each bucket in a task group."""
    by_group = defaultdict(lambda: defaultdict(list))
    for item in items:
        by_group[item.task_group][item.bucket].append(item)
    for group, buckets in by_group.items():
        yield from zip(buckets["T_ok"], buckets["T_wrong"])


def problems(root: Path = HERE) -> list[str]:
    found: list[str] = []
    dataset = load_dataset(root)
    items = dataset.items

    # the committed files are what the generator writes now (loaded by path: no clash with any other "generate")
    spec = importlib.util.spec_from_file_location("basm_probe_v2_generate", HERE / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    domains = generate.build_domains()
    if [json.loads(line) for line in (root / "items.jsonl").read_text().splitlines()] != generate.build_items(domains):
        found.append("items.jsonl differs from what generate.py produces: run generate.py")
    for name, spec in domains.items():
        if json.loads((root / "domains" / f"{name}.json").read_text()) != spec:
            found.append(f"domains/{name}.json differs from what generate.py produces: run generate.py")

    for item in items:
        skill = dataset.skills[item.tempting_skill]
        if item.bucket in ("T_ok", "T_wrong"):
            shared = content_words(item.user) & slot_words(skill, DECIDING_SLOTS)
            if shared:
                found.append(f"{item.id}: request shares {sorted(shared)} with {skill.id}'s applicability/risk cues/avoidance rules")
        if item.bucket == "T_repair":
            shared = content_words(item.state_text) & slot_words(skill, ("recovery_notes",))
            if shared:
                found.append(f"{item.id}: state shares {sorted(shared)} with {skill.id}'s recovery notes")
            for cue in item.state_cues:
                if any(cue.lower() in note.lower() for note in skill.recovery_notes):
                    found.append(f"{item.id}: error code {cue} occurs in {skill.id}'s recovery notes")
    for skill_id in sorted({item.tempting_skill for item in items}):
        skill = dataset.skills[skill_id]
        for slot in DECIDING_SLOTS + ("recovery_notes",):
            for text in getattr(skill, slot):
                if ID_PREFIX.search(text):
                    found.append(f"{skill_id}.{slot}: names an id prefix: {text!r}")

    tokenizer = load_tokenizer("qwen3")
    for ok, wrong in pairs_of(items):
        gap = abs(len(tokenizer(ok.user, add_special_tokens=False)["input_ids"]) - len(tokenizer(wrong.user, add_special_tokens=False)["input_ids"]))
        if gap > MAX_TOKEN_GAP:
            found.append(f"{ok.id}/{wrong.id}: requests differ by {gap} Qwen3 tokens (> {MAX_TOKEN_GAP})")
        for name, test in (("negation", has_negation), ("contrast", has_contrast)):
            if test(ok.user) != test(wrong.user):
                found.append(f"{ok.id}/{wrong.id}: {name} in only one of the two requests")

    # every tempting pair in both directions: (tempting tool, correct tool) and its mirror
    directions = {(dataset.skills[item.tempting_skill].tool_names[0], item.correct_action) for item in items if item.bucket == "T_wrong" and item.correct_action != "<abstain>"}
    for tempting, correct in sorted(directions):
        if (correct, tempting) not in directions:
            found.append(f"pair ({tempting} tempting, {correct} correct) has no mirror ({correct} tempting, {tempting} correct)")
    from content_pairs import PAIRS
    for p in PAIRS:
        for side in ("a_state", "b_state"):
            if len(set(p[side])) < 3:
                found.append(f"{p['name']}.{side}: fewer than 3 distinct paraphrases")

    tempting = {item.tempting_skill for item in items}
    library = {skill.id: skill for item in items for skill in dataset.library_for(item)}
    mean_tempting = sum(skill_length(library[s]) for s in tempting) / len(tempting)
    others = [skill_length(skill) for sid, skill in library.items() if sid not in tempting]
    if mean_tempting > sum(others) / len(others):
        found.append(f"tempting skills are longer than the others: {mean_tempting:.1f} vs {sum(others) / len(others):.1f} words of goal + procedure")

    for field in ("split", "split_scenario"):
        unit = (lambda item: item.task_group) if field == "split" else (lambda item: item.task_group.split(".")[1])
        seen = defaultdict(set)
        for item in items:
            seen[unit(item)].add(getattr(item, field))
        for key, values in sorted(seen.items()):
            if len(values) > 1:
                found.append(f"{field}: {key} is in both splits")
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    print(f"{len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
