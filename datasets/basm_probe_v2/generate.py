#!/usr/bin/env python3
"""Deterministically (re)generate the committed basm_probe_v2 files. Stdlib only.

    python datasets/basm_probe_v2/generate.py

Writes ``domains/<domain>.json``, ``items.jsonl`` and the counts table in ``README.md`` (between the
COUNTS markers). Tool schemas, catalogs, slot fillers, call arguments, errors and repair tools come
from v1 (``datasets/basm_probe/content_tools.py``, ``content_items.py`` and its ``sample_fillers``),
read in place; requests and the skills of the paired tools come from ``content_pairs.py``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
V1 = os.path.join(os.path.dirname(HERE), "basm_probe")
sys.path.insert(0, HERE)

from content_pairs import ABSTAIN_AUDIT, DROPPED, PAIRS, REPAIR_AUDIT  # noqa: E402


def _load_v1(module: str):
    """Import a v1 module by file path (v1's folder must come first on sys.path for its own imports)."""
    sys.path.insert(0, V1)
    try:
        spec = importlib.util.spec_from_file_location(f"basm_probe_v1_{module}", os.path.join(V1, f"{module}.py"))
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return loaded
    finally:
        sys.path.remove(V1)


V1_TOOLS = _load_v1("content_tools")
V1_ITEMS = _load_v1("content_items")
V1_GENERATE = _load_v1("generate")

SEED = 20260202
N_GROUPS = 3          # templates per direction (task groups g00..g02)
ITEMS_PER_GROUP = 3   # items per bucket per task group (different slot fillers, shared across buckets)
ABSTAIN_EVERY = 4     # every 4th T_wrong item (global counter) is an abstain candidate: it removes its correct
                      # tool if ABSTAIN_RULE keeps it, and its matched T_ok item then hides a decoy (assign_decoys)
SCENARIO_EVAL_EVERY = 3  # pairs 0, 3, 6, ... are held out whole in split_scenario

# The label audit (content_pairs.ABSTAIN_AUDIT / REPAIR_AUDIT hold the per-direction verdicts and reasons).
ABSTAIN_RULE = ("v2-abstain: abstaining is correct only if no shown tool does what the request asks. With the correct tool "
                "hidden, the candidate is the tempting tool (the one the request's opening asks for); its call is wrong, and "
                "the abstain item kept, only if its description excludes the stated situation, a required argument has no "
                "admissible value in the request, or its effect contradicts the state. A read-only lookup the request asks "
                "for, or a call that does less than wanted but nothing contrary, is usable: the item is relabelled to call "
                "its correct tool, which stays in the catalog. (All v2 abstentions hide a tool; none rests on a missing "
                "argument of the correct tool.)")
REPAIR_RULE = "v2-repair: the repair call must not contradict a constraint the request states (a deadline, a date)"


def avoidance_rule(tool: str, other: str) -> str:
    return f"If so, prefer {other} over {tool}."


def build_domains():
    """v1 catalogs and skills; the skills of paired tools are replaced by the v2 versions."""
    v2_skills = {}
    for p in PAIRS:
        scenario = V1_SCENARIOS[p["name"]]
        for tool, other in ((scenario["A"], scenario["B"]), (scenario["B"], scenario["A"])):
            spec = p["skills"][tool]
            v2_skills[tool] = {
                "goal": spec["goal"],
                "procedure": [spec["step"], f"Call {tool} with them."],
                "tools": [tool],
                "applicability": spec["applicability"],
                "risk_cues": spec["risk_cues"],
                "avoidance_rules": [avoidance_rule(tool, other)],
                "recovery_notes": spec["recovery_notes"],
            }
    domains = {}
    for name, spec in V1_TOOLS.DOMAINS.items():
        skills = []
        for skill in spec["skills"]:
            (tool,) = skill["tools"]
            skills.append({"id": skill["id"], **v2_skills[tool]} if tool in v2_skills else skill)
        domains[name] = {"domain": name, "description": spec["description"], "tools": spec["tools"], "skills": skills}
    return domains


V1_SCENARIOS = {s["name"]: s for s in V1_ITEMS.SCENARIOS}


def skill_of(domains, tool: str) -> str:
    return next(s["id"] for d in domains.values() for s in d["skills"] if s["tools"] == [tool])


def catalog_names(domains, catalog) -> list[str]:
    """The item's full catalog in its canonical order (catalog domains in order, each domain's tools in file order),
    as ``probes.data.dataset.ProbeDataset.catalog_for`` lists it before removing unavailable tools."""
    return [t["name"] for d in catalog for t in domains[d]["tools"]]


def assign_decoys(domains, items, twins) -> None:
    """Give every T_ok twin of a kept abstain item a decoy tool to hide, so that the place of the gap in the
    catalog's canonical order is ONE distribution in both buckets: within each cell of ``split`` ×
    ``split_scenario``, the decoys' places are a seeded random permutation of the abstain items' hidden places
    (the same multiset, so also on every split and on all items), repaired by swaps until no twin would hide a
    tool of its own pair or a place past its catalog's end. The decoy is the twin's catalog tool at that place.
    ``twins``: (T_wrong index, T_ok index) into ``items``."""
    rng = random.Random(f"{SEED}:decoys")
    for cell_key in sorted({(items[w]["split"], items[w]["split_scenario"]) for w, _ in twins}):
        cell = [(w, k) for w, k in twins if (items[w]["split"], items[w]["split_scenario"]) == cell_key]
        places = [catalog_names(domains, items[w]["catalog_domains"]).index(items[w]["unavailable_tools"][0]) for w, _ in cell]
        rng.shuffle(places)
        tools = [catalog_names(domains, items[k]["catalog_domains"]) for _, k in cell]
        pair = [{items[k]["correct_action"]["tool"], *items[k]["wrong_tools"]} for _, k in cell]

        def fits(i: int, place: int) -> bool:
            return place < len(tools[i]) and tools[i][place] not in pair[i]

        for i in range(len(cell)):
            if not fits(i, places[i]):
                partners = [j for j in range(len(cell)) if fits(i, places[j]) and fits(j, places[i])]
                if not partners:
                    raise RuntimeError(f"no decoy place fits {items[cell[i][1]]['id']}: the permutation cannot be repaired")
                j = rng.choice(partners)
                places[i], places[j] = places[j], places[i]
        for i, (_, k) in enumerate(cell):
            items[k]["unavailable_tools"] = [tools[i][places[i]]]


def fillers(rng: random.Random, scenario_name: str, g: int) -> dict:
    f = V1_GENERATE.sample_fillers(rng)
    for key, values in V1_ITEMS.TVARS.get(scenario_name, {}).items():
        f[key] = values[g].format(**f) if isinstance(values[g], str) else values[g]
    return f


def build_items(domains):
    rng = random.Random(SEED)
    items = []
    counters = Counter()
    wrong_counter = 0
    twins = []  # (T_wrong index, T_ok index) of the kept abstain items and the T_ok items drawn with their fillers
    for pi, p in enumerate(PAIRS):
        s = V1_SCENARIOS[p["name"]]
        a_args = p["args"].get("a", s["a_args"])
        split_scenario = "eval" if pi % SCENARIO_EVAL_EVERY == 0 else "train"
        eval_group = pi % N_GROUPS  # rotate the held-out template
        for g in range(N_GROUPS):
            # One task group = one template g of the pair in both directions: they share the state
            # sentences, so grouped resampling and CV must never split them.
            task_group = f"{p['domain']}.{p['name']}.g{g:02d}"
            for direction in ("fwd", "rev"):
                forward = direction == "fwd"
                tempting, other = (s["A"], s["B"]) if forward else (s["B"], s["A"])
                tempting_args, other_args = (a_args, s["b_args"]) if forward else (s["b_args"], a_args)
                ok_states, wrong_states = (p["a_state"], p["b_state"]) if forward else (p["b_state"], p["a_state"])
                openings = p[direction]
                fills = [fillers(rng, p["name"], g) for _ in range(ITEMS_PER_GROUP)]
                abstain_kept, abstain_reason = ABSTAIN_AUDIT[(p["name"], tempting)]
                ok_index = {}
                buckets = ["T_ok", "T_wrong"] + (["T_repair"] if forward else [])
                for bucket in buckets:
                    for j, f in enumerate(fills):
                        unavailable, history, audit = [], [], []
                        if bucket == "T_ok":
                            ok_index[j] = len(items)
                            user = f"{openings[g]} {ok_states[g]}".format(**f)
                            cues = [ok_states[g].format(**f)]
                            action = {"kind": "call", "tool": tempting, "arguments": tempting_args(f)}
                            wrong = [other]
                        elif bucket == "T_wrong":
                            user = f"{openings[g]} {wrong_states[g]}".format(**f)
                            cues = [wrong_states[g].format(**f)]
                            wrong_counter += 1
                            action = {"kind": "call", "tool": other, "arguments": other_args(f)}
                            if wrong_counter % ABSTAIN_EVERY == 0:
                                if abstain_kept:
                                    unavailable = [other]
                                    action = {"kind": "abstain"}
                                    twins.append((len(items), ok_index[j]))
                                audit = [{"rule": ABSTAIN_RULE, "action": "kept" if abstain_kept else "relabelled",
                                          "reason": abstain_reason if abstain_kept else
                                          f"abstain -> call {other} ({other} stays in the catalog): {abstain_reason}"}]
                            wrong = [tempting]
                        else:
                            template = p["repair_user"][g] if p["repair_user"] else f"{openings[g]} {ok_states[g]}"
                            user = (f"{template} {p['tail']}" if p["tail"] else template).format(**f)
                            error = V1_GENERATE.fmt_obj(s["error"], f)
                            history = [
                                {"role": "assistant", "tool_call": {"name": s["A"], "arguments": s["r_args"](f) if s["r_args"] is not s["a_args"] else a_args(f)}},
                                {"role": "tool", "name": s["A"], "content": json.dumps(error)},
                            ]
                            cues = [error["error"]]
                            action = {"kind": "call", "tool": s["C"], "arguments": s["c_args"](f)}
                            wrong = [s["A"]]
                            if p["name"] in REPAIR_AUDIT:
                                audit = [{"rule": REPAIR_RULE, "action": "kept", "reason": REPAIR_AUDIT[p["name"]]}]
                        short = {"T_ok": "ok", "T_wrong": "wrong", "T_repair": "repair"}[bucket]
                        counters[(p["domain"], short)] += 1
                        items.append({
                            "id": f"{p['domain']}-{short}-{counters[(p['domain'], short)]:04d}",
                            "bucket": bucket,
                            "split": "eval" if g == eval_group else "train",
                            "split_scenario": split_scenario,
                            "scenario": p["name"],
                            "domain": p["domain"],
                            "task_group": task_group,
                            "catalog_domains": list(s["catalog"]),
                            "unavailable_tools": unavailable,
                            "user": user,
                            "history": history,
                            "correct_action": action,
                            "wrong_tools": wrong,
                            "tempting_skill": skill_of(domains, tempting),
                            "state_cues": cues,
                            **({"audit": audit} if audit else {}),
                        })
    assign_decoys(domains, items, twins)
    return items


def counts_markdown(items) -> str:
    lines = []
    for field in ("split", "split_scenario"):
        domains = sorted({it["domain"] for it in items})
        cols = [(b, sp) for sp in ("eval", "train") for b in ("T_ok", "T_wrong", "T_repair")]
        c = Counter((it["domain"], it["bucket"], it[field]) for it in items)
        lines += [f"`{field}`:", "", "| domain | " + " | ".join(f"{sp} {b}" for b, sp in cols) + " | total |", "|---" * (len(cols) + 2) + "|"]
        for d in domains:
            vals = [c[(d, b, sp)] for b, sp in cols]
            lines.append(f"| {d} | " + " | ".join(map(str, vals)) + f" | {sum(vals)} |")
        tot = [sum(c[(d, b, sp)] for d in domains) for b, sp in cols]
        lines += ["| **all** | " + " | ".join(f"**{v}**" for v in tot) + f" | **{sum(tot)}** |", ""]
    n_abs = sum(1 for it in items if it["correct_action"]["kind"] == "abstain")
    n_abs_eval = sum(1 for it in items if it["correct_action"]["kind"] == "abstain" and it["split"] == "eval")
    audited = Counter((entry["rule"].split(":")[0], entry["action"]) for it in items for entry in it.get("audit", []))
    lines.append(f"Abstain items (T_wrong with the correct tool removed): {n_abs} total, {n_abs_eval} in eval (`split`). "
                 "Label audit: " + ", ".join(f"{rule} {action} {n}" for (rule, action), n in sorted(audited.items())) + ".")
    return "\n".join(lines)


def main():
    domains = build_domains()
    os.makedirs(os.path.join(HERE, "domains"), exist_ok=True)
    for name, out in domains.items():
        with open(os.path.join(HERE, "domains", f"{name}.json"), "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
    items = build_items(domains)
    with open(os.path.join(HERE, "items.jsonl"), "w", encoding="utf-8") as fh:
        for it in items:
            fh.write(json.dumps(it, ensure_ascii=False) + "\n")
    table = counts_markdown(items)
    readme = os.path.join(HERE, "README.md")
    if os.path.exists(readme):
        text = open(readme, encoding="utf-8").read()
        new = re.sub(r"(<!-- COUNTS:BEGIN -->\n).*?(<!-- COUNTS:END -->)", lambda m: m.group(1) + table + "\n" + m.group(2), text, flags=re.S)
        if new != text:
            with open(readme, "w", encoding="utf-8") as fh:
                fh.write(new)
    print(table)
    print(f"wrote {len(items)} items from {len(PAIRS)} pairs in both directions ({len(DROPPED)} v1 scenarios dropped), {len(domains)} domains")


if __name__ == "__main__":
    main()
