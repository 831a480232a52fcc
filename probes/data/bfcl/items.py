"""Decision items: every decision point of the probe trajectories as an item of a bucket (T_ok,
T_wrong, T_repair), the points left out with their reasons, and the matched T_wrong/T_ok pairs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sklearn.feature_extraction.text import TfidfVectorizer

from probes.data.bfcl.audit import DroppedItem, miss_func_verdict, miss_param_verdict
from probes.data.bfcl.evidence import error_text
from probes.data.bfcl.replay import Step, Trajectory, Turn, context_messages, replay
from probes.data.bfcl.source import BFCLSource, tool_summary


@dataclass
class SkippedPoint:
    """A decision point (or item) left out, with the reason."""

    item_id: str
    reason: str


class NearestTool:
    """The most similar other tool by TF-IDF cosine over name words + description (deterministic)."""

    def __init__(self, tools: Mapping[str, str]) -> None:
        self.names = sorted(tools)
        texts = [name.replace("_", " ") + " " + tool_summary(tools[name]) for name in self.names]
        matrix = TfidfVectorizer(stop_words="english").fit_transform(texts)
        self.similarity = (matrix @ matrix.T).toarray()
        self.position = {name: i for i, name in enumerate(self.names)}

    def __call__(self, name: str, visible: Iterable[str]) -> str:
        row = self.similarity[self.position[name]]
        options = sorted((name_ for name_ in visible if name_ != name), key=lambda other: (-row[self.position[other]], other))
        return options[0]


def _call_action(step: Step) -> dict[str, Any]:
    return {"kind": "call", "tool": step.call.name, "arguments": step.arguments}


def domain_of(tool: str, catalog: Mapping[str, tuple[str, ...]]) -> str:
    """The domain (BFCL class) whose catalog holds ``tool``."""
    return next(domain for domain, names in catalog.items() if tool in names)


def probe_items(
    trajectory: Trajectory, *, skill_of: Mapping[str, str], catalog: Mapping[str, tuple[str, ...]], nearest: NearestTool,
    required: Mapping[str, tuple[str, ...]],
) -> tuple[list[dict[str, Any]], list[SkippedPoint], list[DroppedItem]]:
    """The decision items of one probe trajectory, the decision points left out with reasons, and the
    abstain items the label audit dropped. ``required``: each tool's required parameters (BFCL's schema)."""
    items: list[dict[str, Any]] = []
    skipped: list[SkippedPoint] = []
    dropped: list[DroppedItem] = []
    task_group = f"bfcl.{trajectory.index:03d}"
    domains = list(trajectory.involved_classes)
    all_tools = [name for domain in domains for name in catalog[domain]]
    prefix = f"bfcl-{trajectory.category}-{trajectory.index:03d}"

    def item(point: str, bucket: str, turn: Turn, history: list[dict[str, Any]], action: dict[str, Any], wrong: list[str],
             tempting_tool: str, cues: list[str], source: dict[str, Any], audit: list[dict[str, str]] | None = None) -> dict[str, Any]:
        return {
            "id": f"{prefix}-{point}-{bucket.split('_')[1]}", "bucket": bucket, "split": "eval",
            "domain": domain_of(tempting_tool, catalog), "task_group": task_group, "category": trajectory.category,
            "catalog_domains": domains, "unavailable_tools": list(turn.hidden), "user": turn.user,
            "context": context_messages(trajectory.turns[: turn.index]), "history": history,
            "correct_action": action, "wrong_tools": wrong, "tempting_skill": skill_of[tempting_tool],
            "state_cues": cues, "source": {"entry": trajectory.entry_id, "turn": turn.index, **source},
            **({"audit": audit} if audit else {}),
        }

    for turn in trajectory.turns:
        visible = [name for name in all_tools if name not in turn.hidden]
        if not turn.steps:
            point = f"t{turn.index}"
            following = trajectory.turns[turn.index + 1] if turn.index + 1 < len(trajectory.turns) else None
            if trajectory.category == "miss_func" and following is not None and following.added_function:
                verdict, reason = miss_func_verdict(turn, following, visible, skill_of)
            elif trajectory.category == "miss_param" and following is not None and following.steps:
                verdict, reason = miss_param_verdict(trajectory, turn, following, visible, skill_of, required)
            else:
                verdict, reason = {}, f"empty ground truth in {trajectory.category} outside the miss_func/miss_param rules"
            if reason is not None:
                skipped.append(SkippedPoint(f"{prefix}-{point}", reason))
            elif verdict["audit"][0]["action"] == "dropped":
                dropped.append(DroppedItem(f"{prefix}-{point}-wrong", trajectory.category, {"entry": trajectory.entry_id, "turn": turn.index, **verdict["source"]},
                                           verdict["audit"]))
            else:
                tool = verdict["tool"]
                # miss_func: the held-out tool is not shown, so its nearest visible tool stands in as the wrong one
                wrong = nearest(tool, visible) if trajectory.category == "miss_func" else tool
                items.append(item(point, "T_wrong", turn, [], {"kind": "abstain"}, [wrong], tool, [], verdict["source"], verdict["audit"]))
            continue
        history: list[dict[str, Any]] = []
        for j, step in enumerate(turn.steps):
            point = f"t{turn.index}s{j}"
            name = step.call.name
            if name in turn.hidden:
                # BFCL data inconsistency: the ground truth calls a function BFCL holds out at this turn.
                skipped.append(SkippedPoint(f"{prefix}-{point}", "ground truth calls a function BFCL holds out at this turn"))
                history.extend(step.messages())
                continue
            if name in skill_of:
                others = [s.call.name for s in turn.steps if s.call.name != name and s.call.name in visible]
                wrong = list(dict.fromkeys(others)) or [nearest(name, visible)]
                items.append(item(point, "T_ok", turn, list(history), _call_action(step), wrong, name, [],
                                  {"rule": "ground-truth step", "step": j}))
            else:
                skipped.append(SkippedPoint(f"{prefix}-{point}-ok", f"T_ok: no validated skill for {name}"))
            if step.skip_failure is not None:
                previous = turn.steps[j - 1]
                if previous.call.name in turn.hidden:
                    skipped.append(SkippedPoint(f"{prefix}-{point}-repair", "T_repair: the skipped call is to a function BFCL holds out at this turn"))
                    skipped.append(SkippedPoint(f"{prefix}-t{turn.index}s{j - 1}-premature", "T_wrong: the correct call is to a function BFCL holds out at this turn"))
                elif name in skill_of:
                    # The executed failure before it happens: at step j-1, the skill of step j's tool
                    # recommends a call that fails if made now (a premature call; the correct action is a call).
                    items.append(item(f"t{turn.index}s{j - 1}", "T_wrong", turn, history[:-2], _call_action(previous), [name], name, [],
                                      {"rule": "premature call (fails if made before the previous call)", "step": j - 1,
                                       "premature_call": step.call.text, "error": error_text(step.skip_failure)}))
                    failed = [
                        {"role": "assistant", "tool_call": {"name": name, "arguments": step.arguments}},
                        {"role": "tool", "name": name, "content": step.skip_failure},
                    ]
                    items.append(item(point, "T_repair", turn, history[:-2] + failed, _call_action(previous), [name], name,
                                      [error_text(step.skip_failure)], {"rule": "previous call skipped", "step": j, "skipped_call": previous.call.text}))
                else:
                    skipped.append(SkippedPoint(f"{prefix}-{point}-repair", f"T_repair: no validated skill for {name}"))
                    skipped.append(SkippedPoint(f"{prefix}-t{turn.index}s{j - 1}-premature", f"T_wrong: no validated skill for the premature {name}"))
            history.extend(step.messages())
    return items, skipped, dropped


def match_items(items: list[dict[str, Any]]) -> list[SkippedPoint]:
    """Pair each T_wrong item with one T_ok item, in place (``match_id`` = the T_wrong's id, on both), so
    that a bucket cannot be read from structure: the same category, step depth (calls in ``history``) and
    catalog gap (``unavailable_tools`` empty or not); among those, the same tempting skill first, then the
    same domain, then the lowest id. Each T_ok is used once; T_wrong items are matched in file order.
    Fixed before any model ran on the items. Returns the unmatched T_wrong items with the reason."""
    def key(row: dict[str, Any]) -> tuple[str, int, bool]:
        return row["category"], len(row["history"]) // 2, bool(row["unavailable_tools"])

    pool: dict[tuple[str, int, bool], list[dict[str, Any]]] = defaultdict(list)
    for row in items:
        if row["bucket"] == "T_ok":
            pool[key(row)].append(row)
    unmatched = []
    for row in items:
        if row["bucket"] != "T_wrong":
            continue
        options = pool[key(row)]
        if not options:
            category, depth, gap = key(row)
            unmatched.append(SkippedPoint(row["id"], f"match: no unused T_ok item in {category} at step depth {depth} {'with' if gap else 'without'} a catalog gap"))
            continue
        best = min(options, key=lambda ok: (ok["tempting_skill"] != row["tempting_skill"], ok["domain"] != row["domain"], ok["id"]))
        options.remove(best)
        best["match_id"] = row["match_id"] = row["id"]
    return unmatched


def invalid_arguments(items: Iterable[Mapping[str, Any]], source: BFCLSource) -> list[str]:
    """The ids of the items whose correct call's arguments violate its tool's JSON schema."""
    invalid = []
    for row in items:
        action = row["correct_action"]
        if action["kind"] == "call":
            tool = source.catalogs[domain_of(action["tool"], source.catalog_names)][action["tool"]]
            if tool.validate_arguments(action["arguments"]):
                invalid.append(row["id"])
    return invalid


@dataclass
class ProbeItems:
    """The items of the probe entries, the decision points left out and the abstain items the label
    audit dropped, each with its reason; the T_wrong items left unmatched; the items whose correct
    arguments violate the tool schema."""

    rows: list[dict[str, Any]]
    skipped: list[SkippedPoint]
    dropped: list[DroppedItem]
    unmatched: list[SkippedPoint]
    invalid_arguments: list[str]


def make_items(source: BFCLSource, categories: Iterable[str], probe_indices: Iterable[int], skill_of: Mapping[str, str]) -> ProbeItems:
    """Replay every probe entry of ``categories`` and turn its decision points into items; then match
    the T_wrong items to T_ok items (:func:`match_items`) and check the correct arguments."""
    nearest = NearestTool({tool["name"]: tool["description"] for entries in source.tools.values() for tool in entries})
    required = {tool["name"]: tuple(tool["parameters"].get("required", [])) for entries in source.tools.values() for tool in entries}
    rows: list[dict[str, Any]] = []
    skipped: list[SkippedPoint] = []
    dropped: list[DroppedItem] = []
    for category, entry in source.entries_of(categories, set(probe_indices)):
        new_items, new_skipped, new_dropped = probe_items(replay(entry, category, source.classes), skill_of=skill_of, catalog=source.catalog_names,
                                                          nearest=nearest, required=required)
        rows.extend(new_items)
        skipped.extend(new_skipped)
        dropped.extend(new_dropped)
    unmatched = match_items(rows)
    return ProbeItems(rows, skipped, dropped, unmatched, invalid_arguments(rows, source))
