#!/usr/bin/env python3
"""Deterministically (re)generate the committed basm_probe files. Stdlib only.

    python datasets/basm_probe/generate.py

Writes ``domains/<domain>.json``, ``items.jsonl`` and refreshes the counts table in ``README.md``
(between the COUNTS markers). Content is hand-written in ``content_tools.py`` (catalogs, skills)
and ``content_items.py`` (scenarios, templates, fillers); this file only combines them.
"""
from __future__ import annotations

import json
import os
import random
import re
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from content_items import DATES_FUTURE, DATES_PAST, FILLERS, SCENARIOS, TICKET_NOTES, TVARS  # noqa: E402
from content_tools import DOMAINS  # noqa: E402

SEED = 20260101
N_GROUPS = 3          # task groups per scenario (one template per bucket per group)
ITEMS_PER_GROUP = 3   # items per bucket per group (different slot fillers)
ABSTAIN_EVERY = 4     # every 4th T_wrong item (globally) is an abstain case
BUCKETS = [("T_ok", "ok"), ("T_wrong", "wrong"), ("T_repair", "repair")]


def sample_fillers(rng: random.Random) -> dict:
    f = {k: rng.choice(v) for k, v in FILLERS.items()}
    f["name"] = f"{f['first']} {f['last']}"
    f["email"] = f"{f['first'].lower()}.{f['last'].lower()}@example.com"
    f["order_id"] = "ORD-%05d" % rng.randint(10000, 99999)
    f["booking_id"] = "BK-%05d" % rng.randint(10000, 99999)
    f["flight_no"] = "%s%d" % (f["airline"], rng.randint(100, 999))
    f["date"] = rng.choice(DATES_FUTURE)
    f["date_past"] = rng.choice(DATES_PAST)
    f["nights"] = rng.randint(2, 6)
    f["qty"] = rng.randint(1, 4)
    f["account_id"] = "ACC-%04d" % rng.randint(1000, 9999)
    f["account2"] = "ACC-%04d" % rng.randint(1000, 9999)
    f["amount"] = rng.choice([120, 250, 480, 600, 980, 1400])
    f["last4"] = "%04d" % rng.randint(0, 9999)
    f["ticket_id"] = "T-%04d" % rng.randint(1000, 9999)
    f["ticket2"] = "T-%04d" % rng.randint(1000, 9999)
    f["msg_id"] = "MSG-%04d" % rng.randint(1000, 9999)
    f["event_id"] = "EVT-%04d" % rng.randint(1000, 9999)
    f["alert_id"] = "ALR-%04d" % rng.randint(1000, 9999)
    f["person_email"] = f"{f['person'].lower()}@northwind.example"
    hh = rng.randint(9, 16)
    f["hh"] = hh
    f["start"] = f"{f['date']}T{hh:02d}:00"
    f["dur"] = rng.choice([30, 45, 60, 90])
    f["mins"] = rng.choice([30, 60, 90, 120])
    f["oldfile_base"] = os.path.splitext(os.path.basename(f["oldfile"]))[0]
    minor, patch = rng.randint(1, 9), rng.randint(0, 9)
    f["prev_version"] = f"v2.{minor}.{patch}"
    f["version"] = f"v2.{minor}.{patch + 1}"
    f["ticket_note"] = rng.choice(TICKET_NOTES)
    return f


def fmt(s: str, f: dict) -> str:
    return s.format(**f)


def fmt_obj(o, f):
    if isinstance(o, str):
        return fmt(o, f)
    if isinstance(o, dict):
        return {k: fmt_obj(v, f) for k, v in o.items()}
    if isinstance(o, list):
        return [fmt_obj(v, f) for v in o]
    return o


def build_items():
    rng = random.Random(SEED)
    catalogs = {d: [t["name"] for t in spec["tools"]] for d, spec in DOMAINS.items()}
    items = []
    counters = Counter()
    wrong_counter = 0
    for si, s in enumerate(SCENARIOS):
        eval_group = si % N_GROUPS  # rotate so every template position appears in eval
        for g in range(N_GROUPS):
            split = "eval" if g == eval_group else "train"
            task_group = f"{s['domain']}.{s['name']}.g{g:02d}"
            for bucket, short in BUCKETS:
                for _k in range(ITEMS_PER_GROUP):
                    f = sample_fillers(rng)
                    for key, vals in TVARS.get(s["name"], {}).items():
                        f[key] = vals[g]
                    for key in list(TVARS.get(s["name"], {})):
                        if isinstance(f[key], str):
                            f[key] = fmt(f[key], f)
                    unavailable = []
                    history = []
                    if bucket == "T_ok":
                        tmpl, cues = s["ok"][g]
                        action = {"kind": "call", "tool": s["A"], "arguments": s["a_args"](f)}
                        wrong = [s["B"]]
                    elif bucket == "T_wrong":
                        tmpl, cues = s["wrong"][g]
                        wrong_counter += 1
                        if wrong_counter % ABSTAIN_EVERY == 0:
                            unavailable = [s["B"]]
                            action = {"kind": "abstain"}
                        else:
                            action = {"kind": "call", "tool": s["B"], "arguments": s["b_args"](f)}
                        wrong = [s["A"]]
                    else:
                        tmpl = s["repair"][g]
                        err = fmt_obj(s["error"], f)
                        history = [
                            {"role": "assistant", "tool_call": {"name": s["A"], "arguments": s["r_args"](f)}},
                            {"role": "tool", "name": s["A"], "content": json.dumps(err)},
                        ]
                        cues = [err["error"]]
                        action = {"kind": "call", "tool": s["C"], "arguments": s["c_args"](f)}
                        wrong = [s["A"]]
                    counters[(s["domain"], short)] += 1
                    items.append({
                        "id": f"{s['domain']}-{short}-{counters[(s['domain'], short)]:04d}",
                        "bucket": bucket,
                        "split": split,
                        "domain": s["domain"],
                        "task_group": task_group,
                        "catalog_domains": list(s["catalog"]),
                        "unavailable_tools": unavailable,
                        "user": fmt(tmpl, f),
                        "history": history,
                        "correct_action": action,
                        "wrong_tools": wrong,
                        "tempting_skill": s["skill"],
                        "state_cues": [fmt(c, f) if "{" in c else c for c in cues],
                    })
    return items


def counts_markdown(items) -> str:
    domains = sorted({it["domain"] for it in items})
    cols = [(b, sp) for sp in ("eval", "train") for b in ("T_ok", "T_wrong", "T_repair")]
    c = Counter((it["domain"], it["bucket"], it["split"]) for it in items)
    head = "| domain | " + " | ".join(f"{sp} {b}" for b, sp in cols) + " | total |"
    sep = "|---" * (len(cols) + 2) + "|"
    rows = [head, sep]
    for d in domains:
        vals = [c[(d, b, sp)] for b, sp in cols]
        rows.append(f"| {d} | " + " | ".join(map(str, vals)) + f" | {sum(vals)} |")
    tot = [sum(c[(d, b, sp)] for d in domains) for b, sp in cols]
    rows.append("| **all** | " + " | ".join(f"**{v}**" for v in tot) + f" | **{sum(tot)}** |")
    n_abs = sum(1 for it in items if it["correct_action"]["kind"] == "abstain")
    n_abs_eval = sum(1 for it in items if it["correct_action"]["kind"] == "abstain" and it["split"] == "eval")
    rows.append("")
    rows.append(f"Abstain items (T_wrong with the paired tool removed): {n_abs} total, {n_abs_eval} in eval.")
    return "\n".join(rows)


def main():
    os.makedirs(os.path.join(HERE, "domains"), exist_ok=True)
    for d, spec in DOMAINS.items():
        out = {"domain": d, "description": spec["description"], "tools": spec["tools"], "skills": spec["skills"]}
        with open(os.path.join(HERE, "domains", f"{d}.json"), "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
    items = build_items()
    with open(os.path.join(HERE, "items.jsonl"), "w", encoding="utf-8") as fh:
        for it in items:
            fh.write(json.dumps(it, ensure_ascii=False) + "\n")
    table = counts_markdown(items)
    readme = os.path.join(HERE, "README.md")
    if os.path.exists(readme):
        text = open(readme, encoding="utf-8").read()
        new = re.sub(r"(<!-- COUNTS:BEGIN -->\n).*?(<!-- COUNTS:END -->)",
                     lambda m: m.group(1) + table + "\n" + m.group(2), text, flags=re.S)
        if new != text:
            with open(readme, "w", encoding="utf-8") as fh:
                fh.write(new)
    print(table)
    print(f"wrote {len(items)} items, {len(DOMAINS)} domains")


if __name__ == "__main__":
    main()
