#!/usr/bin/env python3
"""Self-check for the committed basm_probe dataset (stdlib + jsonschema).

    python datasets/basm_probe/check.py [--min-eval 60]

Exits non-zero and lists every violation if any check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
BUCKETS = ("T_ok", "T_wrong", "T_repair")
SKILL_FIELDS = ["id", "goal", "procedure", "tools", "applicability", "risk_cues", "avoidance_rules",
                "recovery_notes"]
ITEM_FIELDS = ["id", "bucket", "split", "domain", "task_group", "catalog_domains", "unavailable_tools", "user",
               "history", "correct_action", "wrong_tools", "tempting_skill", "state_cues"]
MAX_USER_WORDS = 60


def load(root=HERE):
    domains = {}
    ddir = os.path.join(root, "domains")
    for fn in sorted(os.listdir(ddir)):
        if fn.endswith(".json"):
            with open(os.path.join(ddir, fn), encoding="utf-8") as fh:
                d = json.load(fh)
            domains[d["domain"]] = d
    with open(os.path.join(root, "items.jsonl"), encoding="utf-8") as fh:
        items = [json.loads(line) for line in fh if line.strip()]
    return domains, items


def check(domains, items, min_eval=60, min_domains=8, min_tools=8):
    errs = []
    E = errs.append
    tools = {}
    skills = {}
    skill_domain = {}
    if len(domains) < min_domains:
        E(f"only {len(domains)} domains (< {min_domains})")
    for dname, d in domains.items():
        for key in ("domain", "description", "tools", "skills"):
            if key not in d:
                E(f"domain {dname}: missing key {key}")
        if len(d["tools"]) < min_tools:
            E(f"domain {dname}: only {len(d['tools'])} tools")
        for t in d["tools"]:
            if set(t) != {"name", "description", "parameters"}:
                E(f"tool {t.get('name')}: keys {sorted(t)}")
            if t["name"] in tools:
                E(f"tool name {t['name']} not globally unique")
            prm = t["parameters"]
            if prm.get("type") != "object" or "properties" not in prm or "required" not in prm:
                E(f"tool {t['name']}: parameters must be an object schema with properties/required")
            for r in prm.get("required", []):
                if r not in prm.get("properties", {}):
                    E(f"tool {t['name']}: required {r} not in properties")
            try:
                jsonschema.Draft202012Validator.check_schema(prm)
            except jsonschema.SchemaError as ex:
                E(f"tool {t['name']}: invalid JSON schema: {ex.message}")
            tools[t["name"]] = (dname, t)
    for dname, d in domains.items():
        dtools = {t["name"] for t in d["tools"]}
        covered = set()
        for s in d["skills"]:
            sid = s.get("id", "?")
            if list(s) != SKILL_FIELDS:
                E(f"skill {sid}: fields {list(s)} != {SKILL_FIELDS}")
            if sid in skills:
                E(f"skill id {sid} duplicated")
            if not sid.startswith(dname + "."):
                E(f"skill {sid}: id must start with '{dname}.'")
            skills[sid] = s
            skill_domain[sid] = dname
            if not isinstance(s.get("goal"), str) or not s["goal"].strip():
                E(f"skill {sid}: empty goal")
            for f in SKILL_FIELDS[2:]:
                if not isinstance(s.get(f), list):
                    E(f"skill {sid}: {f} must be a list")
            if not (2 <= len(s["procedure"]) <= 4):
                E(f"skill {sid}: procedure has {len(s['procedure'])} steps (want 2-4)")
            for f in ("risk_cues", "avoidance_rules"):
                if not s[f]:
                    E(f"skill {sid}: {f} is empty")
            for f in ("procedure", "applicability", "risk_cues", "avoidance_rules", "recovery_notes"):
                for x in s[f]:
                    if not isinstance(x, str) or not x.strip():
                        E(f"skill {sid}: {f} has a non-string/empty entry")
                    elif len(x.split()) > 24:
                        E(f"skill {sid}: {f} entry too long ({len(x.split())} words): {x}")
            for st in s["tools"]:
                name = st if isinstance(st, str) else st.get("name")
                if name not in tools:
                    E(f"skill {sid}: unknown tool {name}")
                    continue
                covered.add(name)
                if isinstance(st, dict):
                    try:
                        jsonschema.validate(st.get("arguments", {}), tools[name][1]["parameters"])
                    except jsonschema.ValidationError as ex:
                        E(f"skill {sid}: tool args for {name} invalid: {ex.message}")
        missing = dtools - covered
        if missing:
            E(f"domain {dname}: tools without a skill: {sorted(missing)}")

    # ---- items
    ids = Counter(it.get("id") for it in items)
    for i, n in ids.items():
        if n > 1:
            E(f"item id {i} duplicated")
    group_splits = defaultdict(set)
    counts = Counter()
    for it in items:
        iid = it.get("id", "?")
        if list(it) != ITEM_FIELDS:
            E(f"{iid}: fields {list(it)} != {ITEM_FIELDS}")
            continue
        if it["bucket"] not in BUCKETS:
            E(f"{iid}: bad bucket {it['bucket']}")
        if it["split"] not in ("train", "eval"):
            E(f"{iid}: bad split {it['split']}")
        counts[(it["bucket"], it["split"])] += 1
        group_splits[it["task_group"]].add(it["split"])
        if it["domain"] not in domains:
            E(f"{iid}: unknown domain")
        if it["domain"] not in it["catalog_domains"]:
            E(f"{iid}: domain not in catalog_domains")
        shown = set()
        for cd in it["catalog_domains"]:
            if cd not in domains:
                E(f"{iid}: unknown catalog domain {cd}")
                continue
            shown |= {t["name"] for t in domains[cd]["tools"]}
        for u in it["unavailable_tools"]:
            if u not in shown:
                E(f"{iid}: unavailable tool {u} not in the catalog domains")
        shown -= set(it["unavailable_tools"])
        if it["tempting_skill"] not in skills:
            E(f"{iid}: unknown tempting_skill {it['tempting_skill']}")
        elif skill_domain[it["tempting_skill"]] not in it["catalog_domains"]:
            E(f"{iid}: tempting skill outside the catalog domains")
        if not it["wrong_tools"]:
            E(f"{iid}: wrong_tools empty")
        for w in it["wrong_tools"]:
            if w not in shown:
                E(f"{iid}: wrong tool {w} not in shown catalog")
        act = it["correct_action"]
        if act.get("kind") == "call":
            if act["tool"] not in shown:
                E(f"{iid}: correct tool {act['tool']} not in shown catalog")
            elif act["tool"] in it["wrong_tools"]:
                E(f"{iid}: correct tool is also a wrong tool")
            else:
                try:
                    jsonschema.validate(act["arguments"], tools[act["tool"]][1]["parameters"])
                except jsonschema.ValidationError as ex:
                    E(f"{iid}: arguments invalid for {act['tool']}: {ex.message}")
        elif act.get("kind") == "abstain":
            if it["bucket"] != "T_wrong":
                E(f"{iid}: abstain outside T_wrong")
            if not it["unavailable_tools"]:
                E(f"{iid}: abstain but no unavailable_tools (needed tool must be removed)")
        else:
            E(f"{iid}: bad correct_action kind")
        if len(it["user"].split()) > MAX_USER_WORDS:
            E(f"{iid}: user message has {len(it['user'].split())} words")
        if not it["state_cues"]:
            E(f"{iid}: state_cues empty")
        temp_tools = set()
        if it["tempting_skill"] in skills:
            temp_tools = {t if isinstance(t, str) else t["name"] for t in skills[it["tempting_skill"]]["tools"]}
        if it["bucket"] in ("T_ok", "T_wrong"):
            if it["history"]:
                E(f"{iid}: {it['bucket']} item must have empty history")
            for c in it["state_cues"]:
                if c not in it["user"]:
                    E(f"{iid}: state cue not in user text: {c!r}")
        if it["bucket"] == "T_ok" and act.get("tool") not in temp_tools:
            E(f"{iid}: T_ok correct tool is not the tempting skill's tool")
        if it["bucket"] == "T_wrong" and not (set(it["wrong_tools"]) & temp_tools):
            E(f"{iid}: T_wrong wrong tool is not the tempting skill's tool")
        if it["bucket"] == "T_repair":
            h = it["history"]
            if len(h) != 2 or h[0].get("role") != "assistant" or h[1].get("role") != "tool":
                E(f"{iid}: T_repair history must be [assistant tool_call, tool result]")
                continue
            call = h[0]["tool_call"]
            if call["name"] not in tools:
                E(f"{iid}: history calls unknown tool {call['name']}")
            else:
                try:
                    jsonschema.validate(call["arguments"], tools[call["name"]][1]["parameters"])
                except jsonschema.ValidationError as ex:
                    E(f"{iid}: history call arguments invalid: {ex.message}")
            if h[1].get("name") != call["name"]:
                E(f"{iid}: tool result name != called tool")
            if it["wrong_tools"] != [call["name"]]:
                E(f"{iid}: T_repair wrong_tools must be [failed tool]")
            if act.get("tool") == call["name"]:
                E(f"{iid}: T_repair correct action repeats the failed call")
            try:
                err = json.loads(h[1]["content"])
            except ValueError:
                E(f"{iid}: tool result is not JSON")
                continue
            code = err.get("error")
            if code not in it["state_cues"]:
                E(f"{iid}: error code not among state_cues")
            notes = skills.get(it["tempting_skill"], {}).get("recovery_notes", [])
            if not any(code in n and act.get("tool", "") in n for n in notes):
                E(f"{iid}: no recovery note of {it['tempting_skill']} names {code} -> {act.get('tool')}")
    for g, sp in group_splits.items():
        if len(sp) > 1:
            E(f"task_group {g} appears in both splits")
    for b in BUCKETS:
        if counts[(b, "eval")] < min_eval:
            E(f"eval {b}: {counts[(b, 'eval')]} items (< {min_eval})")
    return errs, counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-eval", type=int, default=60)
    args = ap.parse_args()
    domains, items = load()
    errs, counts = check(domains, items, min_eval=args.min_eval)
    for b in BUCKETS:
        print(f"{b:9s} eval={counts[(b, 'eval')]:4d} train={counts[(b, 'train')]:4d}")
    n_tools = sum(len(d["tools"]) for d in domains.values())
    n_skills = sum(len(d["skills"]) for d in domains.values())
    print(f"{len(domains)} domains, {n_tools} tools, {n_skills} skills, {len(items)} items")
    if errs:
        print(f"FAILED: {len(errs)} problem(s)")
        for e in errs[:200]:
            print("  -", e)
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
