"""BFCL multi-turn entries as a probe dataset (decision points, buckets, extracted skill libraries).

Reads the data files of the installed ``bfcl-eval`` package (``bfcl_eval/data``, Apache-2.0) and
writes a dataset folder in the layout of ``datasets/basm_probe/`` (``domains/<Class>.json``,
``items.jsonl``) plus a generated ``README.md`` that states every rule and count below.

Entries and split
    The four multi-turn categories (base, long_context, miss_func, miss_param) hold 200 entries
    each; entry ``i`` of every category is the same scenario (same involved classes, mostly the
    same initial state and requests). Entries are therefore split **by index**: a seeded
    permutation puts ``skill_fraction`` of the indices in the skill-source set (skills are
    extracted from their trajectories) and the rest in the probe set (items come only from them).
    ``task_group`` is ``bfcl.<index>``: all items of one scenario, in every category, form one group.

Trajectories
    BFCL stores no tool outputs. Each entry's ground-truth calls are executed turn by turn on BFCL's
    own API classes loaded with the entry's ``initial_config`` (:mod:`probes.data.bfcl_exec`;
    ``long_context=True`` for the long_context category, as BFCL does), so every earlier call in a
    prompt carries its real observation.

Decision points
    Step ``j`` of turn ``t`` (the ``j``-th ground-truth call of that turn) is a decision point:
    the conversation so far (``context``: every earlier turn's user message, calls and
    observations), the turn's user message (``user``), the turn's calls before ``j`` with their
    observations (``history``), the functions available at that turn (miss_func: functions
    whose doc BFCL holds out until a later turn are removed, as BFCL does; at the turn where they
    come back the user message is BFCL's ``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``) and
    the ground-truth call. A turn whose ground truth is ``[]`` is one decision point whose correct
    action is to make no call (abstain).

Buckets (see :func:`import_bfcl` and the generated README for counts)
    T_ok      every step whose ground-truth tool has a validated skill: that skill (the one a
              retriever should surface) recommends exactly the correct call.
    T_wrong   the retrieved skill recommends a call that is unavailable or premature: step ``j-1``
              of a turn whose step ``j`` fails when made before step ``j-1`` (tempting skill = step
              ``j``'s; the correct action is step ``j-1``'s call), miss_func turns with ground truth
              ``[]`` (the needed function is held out; tempting skill = the held-out function's) and
              miss_param turns with ground truth ``[]`` (tempting skill = the skill of the next turn's
              first call that lacks a required argument). The abstain labels pass a stated audit
              (:data:`AUDIT_RULE`, :data:`MISS_FUNC_AUDIT_RULE`; ``audit`` field, dropped ones in
              ``audit.jsonl``), and every T_wrong is matched to a T_ok item (:func:`match_items`).
    T_repair  step ``j ≥ 1`` whose call fails when the previous call of the turn (a different
              tool) is skipped: the failing call and its real error observation are inserted
              before the decision point, the correct action is the skipped call, and the wrong
              tool is the failed one (repeating it).

Skills (paper §4.2, Eqs. 6–7)
    Tool-level anchors: one candidate per tool called in the skill-source entries' base
    trajectories (:func:`collect_evidence`, :func:`extract_skill`). Every slot item comes from the
    tool's own executed trajectories: the successful uses (calls, argument values, observations,
    predecessors with a dependency) supply goal, procedure, tools and applicability; boundary slots
    come only from evidence: failures (the same skip-the-previous-call perturbation, executed),
    held-out functions (miss_func) and missing parameters (miss_param) of the skill-source
    entries. ψ (:func:`probes.data.schema.build_library`) then rejects every candidate without
    risk cues or avoidance rules, with a quotation in two slots, or claiming a tool is available. ``extractor="llm"`` has a chat model write the candidates from the same
    evidence instead (:func:`llm_candidate`, :mod:`probes.data.extract_llm`); the README says which
    extractor ran and counts what it kept and discarded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sklearn.feature_extraction.text import TfidfVectorizer

from probes.core.files import write_text
from probes.data.bfcl_exec import (
    BFCLEnvironment,
    Call,
    is_error_observation,
    load_api_classes,
    parse_call,
)
from probes.data.dataset import AUDIT_FILE, BUCKETS, DatasetError
from probes.data.staging import check_output, staged_folder
from probes.data.extract_llm import RETRIES, Candidate, Extraction, LLMExtractor, TextGenerator
from probes.data.schema import ToolCatalog, build_library, tools_from_json
from probes.reporting.bfcl_readme import ImportFacts, render_readme
from probes.reporting.cards import CARD_NAME, write_card

CATEGORIES: tuple[str, ...] = ("base", "long_context", "miss_func", "miss_param")
# BFCL's constants.default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC (FC mode).
ADDED_FUNCTION_PROMPT = "I have updated some more functions you can choose from. What about now?"
# BFCL's multi_turn_func_doc file per class (constants.executable_backend_config).
FUNC_DOC_FILES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
# BFCL's Python-style type names → JSON Schema (the FC handlers do the same conversion).
SCHEMA_TYPES: dict[str, str] = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}
EVIDENCE_PER_SLOT = 3  # boundary items kept per slot (one per evidence kind first, then the rest)
SNIPPET_CHARS = 140  # request and error quotes in skill text are cut at a word boundary
ERROR_CHARS = 120
LLM_SUCCESSES = 3  # successful uses shown to the LLM extractor (distinct calls, most frequent first)
LLM_EVIDENCE_LINES = 6  # boundary evidence lines shown to it (one per evidence kind first)
EXTRACTORS: tuple[str, ...] = ("deterministic", "llm")
# The deterministic extractor's fixed rules (stated in the README; see extract_skill).
PREDECESSOR_MIN_USES = 2  # a predecessor needs a dependency in at least this many of the tool's source uses
PREDECESSOR_MIN_SHARE = 0.2  # ... and in at least this share of them
EXAMPLE_MIN_WORDS = 5  # an example request has at least this many words (and quotes an argument value of its call)
VALUES_SHOWN = 3  # argument values quoted per parameter (most frequent first)
OBSERVATION_CHARS = 100  # observation quotes are cut at a word boundary


class BFCLDataError(DatasetError):
    """The BFCL data are missing or malformed; the message names the file and what to do."""


class NoSkillKept(BFCLDataError):
    """The extractor kept no skill, so no decision point has a skill: nothing is written."""


# ---------------------------------------------------------------------------- locating and loading
def locate_bfcl_data(bfcl_dir: str | Path | None = None) -> Path:
    """The BFCL data directory (holding ``BFCL_v*_multi_turn_base.json`` and ``possible_answer/``).

    ``bfcl_dir`` may be that directory or the ``bfcl_eval`` package root; by default the installed
    ``bfcl_eval`` package is located without importing it (its runtime needs pins we do not have).
    """
    if bfcl_dir is None:
        spec = importlib.util.find_spec("bfcl_eval")
        if spec is None or not spec.submodule_search_locations:
            raise BFCLDataError("the BFCL data need the 'bfcl-eval' package: pip install --no-deps bfcl-eval "
                                "(or pass bfcl_dir=<its bfcl_eval folder or data folder>)")
        bfcl_dir = Path(next(iter(spec.submodule_search_locations)))
    root = Path(bfcl_dir)
    for candidate in (root, root / "data"):
        if list(candidate.glob("BFCL_v*_multi_turn_base.json")) and (candidate / "possible_answer").is_dir():
            return candidate
    raise BFCLDataError(f"{root} holds no BFCL multi-turn data (BFCL_v*_multi_turn_base.json and possible_answer/); "
                        "install it with: pip install --no-deps bfcl-eval, or pass the bfcl_eval/data folder")


def api_source_dir(data_dir: Path) -> Path:
    """``bfcl_eval/eval_checker/multi_turn_eval/func_source_code`` next to ``data_dir``."""
    path = Path(data_dir).parent / "eval_checker" / "multi_turn_eval" / "func_source_code"
    if not path.is_dir():
        raise BFCLDataError(f"BFCL's API classes are not at {path}; reinstall with: pip install --no-deps bfcl-eval")
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise BFCLDataError(f"{path}:{number}: invalid JSON: {error}") from error
    return rows


def category_file(data_dir: Path, category: str, *, answers: bool = False) -> Path:
    """The (single) ``BFCL_v*_multi_turn_<category>.json`` file, or its possible answers."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; known: {CATEGORIES}")
    folder = Path(data_dir) / "possible_answer" if answers else Path(data_dir)
    matches = sorted(folder.glob(f"BFCL_v*_multi_turn_{category}.json"))
    if len(matches) != 1:
        raise BFCLDataError(f"expected one BFCL_v*_multi_turn_{category}.json in {folder}, found {[m.name for m in matches]}")
    return matches[0]


def entry_index(entry_id: str) -> int:
    """``multi_turn_miss_func_17`` → 17."""
    match = re.fullmatch(r"multi_turn_[a-z_]+_(\d+)", entry_id)
    if not match:
        raise BFCLDataError(f"unexpected BFCL entry id {entry_id!r} (expected multi_turn_<category>_<n>)")
    return int(match.group(1))


def load_entries(data_dir: Path, category: str) -> list[dict[str, Any]]:
    """Entries of one category with their ground truth joined in (``entry["ground_truth"]``)."""
    path = category_file(data_dir, category)
    answers_path = category_file(data_dir, category, answers=True)
    entries = _read_jsonl(path)
    answers = {row["id"]: row["ground_truth"] for row in _read_jsonl(answers_path)}
    for entry in entries:
        if entry["id"] not in answers:
            raise BFCLDataError(f"{answers_path}: no ground truth for {entry['id']}")
        truth = answers[entry["id"]]
        if len(truth) != len(entry["question"]):
            raise BFCLDataError(f"{answers_path}: {entry['id']} has {len(truth)} ground-truth turns for {len(entry['question'])} question turns")
        entry["ground_truth"] = truth
    return entries


def convert_schema(node: Any) -> Any:
    """BFCL's parameter schema → JSON Schema: ``dict`` → ``object``, ``float`` → ``number``, ...,
    applied to every nested schema (properties, items, additionalProperties)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(out.get("type"), str):
        out["type"] = SCHEMA_TYPES.get(out["type"], out["type"])
    if isinstance(out.get("properties"), dict):
        out["properties"] = {name: convert_schema(sub) for name, sub in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = convert_schema(out[key])
    return out


def load_tools(data_dir: Path, class_name: str) -> list[dict[str, Any]]:
    """One class's function docs as tool objects ``{name, description, parameters}`` (JSON Schema)."""
    path = Path(data_dir) / "multi_turn_func_doc" / FUNC_DOC_FILES[class_name]
    if not path.is_file():
        raise BFCLDataError(f"BFCL function docs {path} are missing; reinstall with: pip install --no-deps bfcl-eval")
    return [
        {"name": doc["name"], "description": doc["description"], "parameters": convert_schema(doc["parameters"])}
        for doc in _read_jsonl(path)
    ]


def split_indices(indices: Iterable[int], *, skill_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(skill-source indices, probe indices): a seeded permutation, the first ``skill_fraction`` to skills."""
    if not 0.0 < skill_fraction < 1.0:
        raise ValueError(f"skill_fraction must be in (0, 1), got {skill_fraction}")
    ordered = sorted(set(indices))
    shuffled = list(ordered)
    random.Random(seed).shuffle(shuffled)
    n_skill = round(skill_fraction * len(ordered))
    return sorted(shuffled[:n_skill]), sorted(shuffled[n_skill:])


# ---------------------------------------------------------------------------- trajectories
@dataclass
class Step:
    """One executed ground-truth call."""

    call: Call
    arguments: dict[str, Any]  # by parameter name
    observation: str
    # The observation of this call when the turn's previous call (a different tool) is skipped,
    # when that is an error and the ground-truth execution is not (the T_repair perturbation).
    skip_failure: str | None = None

    def messages(self) -> list[dict[str, Any]]:
        return [
            {"role": "assistant", "tool_call": {"name": self.call.name, "arguments": self.arguments}},
            {"role": "tool", "name": self.call.name, "content": self.observation},
        ]


@dataclass
class Turn:
    index: int
    user: str
    added_function: bool  # miss_func: the held-out function docs come back at this turn
    hidden: tuple[str, ...]  # functions not available at this turn (miss_func)
    steps: list[Step]


@dataclass
class Trajectory:
    category: str
    entry_id: str
    index: int
    involved_classes: tuple[str, ...]
    turns: list[Turn]


def replay(entry: Mapping[str, Any], category: str, classes: Mapping[str, type]) -> Trajectory:
    """Execute an entry's ground truth turn by turn on BFCL's classes, recording observations and
    the skip-the-previous-call failures."""
    env = BFCLEnvironment(classes, entry["involved_classes"], entry["initial_config"], long_context=category == "long_context")
    held_out = {int(turn): tuple(names) for turn, names in entry.get("missed_function", {}).items()}
    turns = []
    for t, (messages, truth) in enumerate(zip(entry["question"], entry["ground_truth"])):
        if t in held_out:
            if messages:
                raise BFCLDataError(f"{entry['id']}: turn {t} brings back held-out functions but has a user message")
            user = ADDED_FUNCTION_PROMPT
        else:
            if len(messages) != 1 or messages[0].get("role") != "user":
                raise BFCLDataError(f"{entry['id']}: turn {t} must hold one user message, got {messages!r:.120}")
            user = messages[0]["content"]
        hidden = tuple(name for turn, names in sorted(held_out.items()) if turn > t for name in names)
        calls = [parse_call(text) for text in truth]
        steps: list[Step] = []
        # The state before the previous call, kept only when that call is a different tool.
        without_previous: BFCLEnvironment | None = None
        for j, call in enumerate(calls):
            before_this = env.snapshot() if j + 1 < len(calls) and calls[j + 1].name != call.name else None
            arguments = env.bind(call)
            observation = env.execute(call)
            skip_failure = None
            if without_previous is not None and not is_error_observation(observation):
                skipped = without_previous.execute(call)
                if is_error_observation(skipped):
                    skip_failure = skipped
            steps.append(Step(call, arguments, observation, skip_failure))
            without_previous = before_this
        turns.append(Turn(t, user, t in held_out, hidden, steps))
    return Trajectory(category, entry["id"], entry_index(entry["id"]), tuple(entry["involved_classes"]), turns)


def context_messages(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """The chat messages of complete earlier turns: user message, then each call and observation."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        out.append({"role": "user", "content": turn.user})
        for step in turn.steps:
            out.extend(step.messages())
    return out


# ---------------------------------------------------------------------------- evidence and skills
def _snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut + " ..."


def _error_text(observation: str) -> str:
    try:
        value = json.loads(observation)
    except ValueError:
        value = None
    message = value["error"] if isinstance(value, dict) and "error" in value else observation
    return _snippet(str(message), ERROR_CHARS)


def _tool_summary(description: str) -> str:
    """The function's own sentence from a BFCL description (after the class preamble)."""
    marker = "Tool description:"
    text = description.split(marker, 1)[1] if marker in description else description
    return " ".join(text.split())


def _value_strings(value: Any) -> list[str]:
    """The forms in which an argument value can be quoted in text: strings (``@``/``#`` stripped),
    numbers (``20`` for 20.0) and the elements of lists."""
    if isinstance(value, bool):
        return []
    if isinstance(value, str):
        text = value.strip().lstrip("@#")
        return [text] if len(text) > 1 else []
    if isinstance(value, float) and value.is_integer():
        return [str(int(value))]
    if isinstance(value, (int, float)):
        return [str(value)]
    if isinstance(value, list):
        return [text for element in value for text in _value_strings(element)]
    return []


def quoted_parameters(arguments: Mapping[str, Any], text: str, *, min_chars: int = 1) -> list[str]:
    """The parameters whose value is quoted in ``text`` (whole word, case-insensitive; the forms of
    :func:`_value_strings` with at least ``min_chars`` characters)."""
    lowered = text.lower()
    return [
        name for name, value in arguments.items()
        if any(len(form) >= min_chars and re.search(rf"(?<!\w){re.escape(form.lower())}(?!\w)", lowered) for form in _value_strings(value))
    ]


def clarified_calls(turn: Turn, clarification: str) -> list[tuple[Step, list[str]]]:
    """Calls of ``turn`` with an argument value quoted in ``clarification`` (the miss_param turn
    after the under-specified one; a whole-word, case-insensitive match), with those parameters."""
    return [(step, params) for step in turn.steps if (params := quoted_parameters(step.arguments, clarification))]


@dataclass(frozen=True)
class Use:
    """One ground-truth call of the tool in a skill-source base trajectory, as executed."""

    entry: str
    request: str  # the turn's user message
    call: str
    arguments: tuple[tuple[str, Any], ...]  # (parameter, value) as bound, in call order
    observation: str
    previous: str | None  # the turn's call right before this one, when it is another tool
    # How this call depended on ``previous``: "fail" (executed without it, it failed) or the
    # parameters whose values stand in previous's observation; () when neither.
    dependency: tuple[str, ...] = ()

    @property
    def previous_tool(self) -> str | None:
        return None if self.previous is None else parse_call(self.previous).name


@dataclass(frozen=True)
class SkipFailure:
    """The tool's call failed when the turn's previous call (another tool) was skipped (executed)."""

    entry: str
    call: str
    skipped: str  # the skipped call
    error: str  # the error text (snippet)


@dataclass(frozen=True)
class HeldOut:
    """miss_func: a request needed the tool while BFCL held it out; the correct action was no call."""

    entry: str
    request: str
    later_call: str | None  # the tool's call in the turn where it came back
    later_observation: str | None  # and what it returned


@dataclass(frozen=True)
class MissingParameters:
    """miss_param: a request did not give these parameters; the next turn's message supplied them."""

    entry: str
    request: str
    supplied: tuple[tuple[str, Any], ...]  # (parameter, value) quoted in the clarification


@dataclass
class ToolEvidence:
    """What the skill-source trajectories say about one tool: its successful uses (τ⁺) and the
    boundary evidence (τ⁻) of each kind, in trajectory order."""

    successes: list[Use] = field(default_factory=list)
    failures: list[SkipFailure] = field(default_factory=list)
    held_out: list[HeldOut] = field(default_factory=list)
    missing_params: list[MissingParameters] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)


def _dependency(step: Step, previous: Step) -> tuple[str, ...]:
    if step.skip_failure is not None:
        return ("fail",)
    # a value of two characters or more: a lone digit in an observation is no evidence of a data flow
    return tuple(quoted_parameters(step.arguments, previous.observation, min_chars=2))


def collect_evidence(trajectories: Iterable[Trajectory]) -> dict[str, ToolEvidence]:
    """Evidence per tool from skill-source trajectories: uses and skip-the-previous-call failures
    from base, held-out functions from miss_func, missing parameters from miss_param."""
    evidence: dict[str, ToolEvidence] = defaultdict(ToolEvidence)
    for trajectory in trajectories:
        for t, turn in enumerate(trajectory.turns):
            following = trajectory.turns[t + 1] if t + 1 < len(trajectory.turns) else None
            if trajectory.category == "base":
                for j, step in enumerate(turn.steps):
                    before = turn.steps[j - 1] if j and turn.steps[j - 1].call.name != step.call.name else None
                    tool = evidence[step.call.name]
                    tool.successes.append(Use(trajectory.entry_id, turn.user, step.call.text, tuple(step.arguments.items()), step.observation,
                                              None if before is None else before.call.text, () if before is None else _dependency(step, before)))
                    tool.sources.add(trajectory.entry_id)
                    if step.skip_failure is not None and before is not None:
                        tool.failures.append(SkipFailure(trajectory.entry_id, step.call.text, before.call.text, _error_text(step.skip_failure)))
            elif not turn.steps and trajectory.category == "miss_func" and following is not None and following.added_function:
                for name in sorted(set(turn.hidden) - set(following.hidden)):
                    later = next((step for step in following.steps if step.call.name == name), None)
                    evidence[name].held_out.append(HeldOut(trajectory.entry_id, turn.user, *((later.call.text, later.observation) if later else (None, None))))
                    evidence[name].sources.add(trajectory.entry_id)
            elif not turn.steps and trajectory.category == "miss_param" and following is not None:
                for step, params in clarified_calls(following, following.user):
                    supplied = tuple((param, step.arguments[param]) for param in params)
                    evidence[step.call.name].missing_params.append(MissingParameters(trajectory.entry_id, turn.user, supplied))
                    evidence[step.call.name].sources.add(trajectory.entry_id)
    return dict(evidence)


def _round_robin(groups: Sequence[Sequence[Any]], limit: int) -> list[Any]:
    """Up to ``limit`` distinct elements, one per group in turn (the first of each group first)."""
    out: list[Any] = []
    depth = 0
    while len(out) < limit and any(depth < len(group) for group in groups):
        for group in groups:
            if depth < len(group) and len(out) < limit and group[depth] not in out:
                out.append(group[depth])
        depth += 1
    return out


def predecessors(evidence: ToolEvidence) -> list[tuple[str, list[Use]]]:
    """The tools named as predecessors in the procedure, with the uses that support each.

    Rule: P is a predecessor of T when P is the call right before T in the same turn *and* T
    depends on it (executed without P, T failed; or an argument value of T stands in P's
    observation) in at least ``PREDECESSOR_MIN_USES`` of T's source uses and at least
    ``PREDECESSOR_MIN_SHARE`` of them. Order alone (P merely came first) is not support."""
    supported: dict[str, list[Use]] = defaultdict(list)
    for use in evidence.successes:
        if use.dependency:
            supported[use.previous_tool].append(use)
    n = len(evidence.successes)
    return sorted(((tool, uses) for tool, uses in supported.items()
                   if len(uses) >= PREDECESSOR_MIN_USES and len(uses) >= PREDECESSOR_MIN_SHARE * n),
                  key=lambda kv: (-len(kv[1]), kv[0]))


def example_requests(evidence: ToolEvidence, excluded_scenarios: set[int]) -> list[Use]:
    """Uses whose request may be quoted as an example, shortest request first: at least
    ``EXAMPLE_MIN_WORDS`` words, quoting one of its call's argument values within the quoted snippet
    (so it says what the call does: "What's inside?" does not), from a scenario none of the shown
    boundary evidence comes from (BFCL's categories share scenarios, so the same request would stand
    in two slots)."""
    chosen = [use for use in evidence.successes
              if len(use.request.split()) >= EXAMPLE_MIN_WORDS and quoted_parameters(dict(use.arguments), _snippet(use.request))
              and entry_index(use.entry) not in excluded_scenarios]
    return sorted(chosen, key=lambda use: (len(use.request), use.request, use.call))


def _seen_values(uses: Sequence[Use], parameter: str) -> str:
    values = Counter(repr(value) for use in uses for name, value in use.arguments if name == parameter)  # as in the call texts
    top = sorted(values, key=lambda v: (-values[v], v))[:VALUES_SHOWN]
    return ", ".join(top)


def _supplied(evidence: MissingParameters) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in evidence.supplied)


def _boundary_evidence(evidence: ToolEvidence, limit: int) -> list[SkipFailure | HeldOut | MissingParameters]:
    """Up to ``limit`` distinct pieces of boundary evidence, one per kind in turn (trajectory order);
    a skip failure counts once per (call, skipped call, error), the other kinds once per request."""
    failures = list({(f.call, f.skipped, f.error): f for f in reversed(evidence.failures)}.values())[::-1]
    held_out = list({h.request: h for h in reversed(evidence.held_out)}.values())[::-1]
    missing = list({m.request: m for m in reversed(evidence.missing_params)}.values())[::-1]
    return _round_robin([failures, held_out, missing], limit)


def extract_skill(tool: Mapping[str, Any], evidence: ToolEvidence, domain: str) -> dict[str, Any]:
    """f_ext of Eq. 6 (deterministic): a seven-slot candidate for one tool-level anchor, every slot
    item built from this tool's own source trajectories.

    Goal: the tool's own description sentence. Procedure (τ⁺): each supported predecessor
    (:func:`predecessors`) with the uses that show it, the argument values seen per parameter, the
    most frequent call with the observation it returned, and one example request
    (:func:`example_requests`). Applicability: the required parameters with values seen, and the
    predecessors' calls having run; never that a tool is available (ψ rejects that: availability
    belongs to an item's catalog). Risk cues, avoidance rules, recovery notes (τ⁻): each shown piece
    of boundary evidence (:func:`_boundary_evidence`) states its own call, error, request or
    supplied values; none when there is none, which ψ rejects."""
    name = tool["name"]
    uses = evidence.successes
    boundary = _boundary_evidence(evidence, EVIDENCE_PER_SLOT)
    procedure, applicability = [], []
    for predecessor, supporting in predecessors(evidence):
        example = min(supporting, key=lambda use: (use.call, use.previous))
        fails = sum(use.dependency == ("fail",) for use in supporting)
        params = sorted({p for use in supporting if use.dependency != ("fail",) for p in use.dependency})
        why = " and ".join(part for part in (f"executed without it, {name} failed {fails} time(s)" if fails else "",
                                              f"{name} took {', '.join(params)} from its result" if params else "") if part)
        procedure.append(f"Call {predecessor} first: in {len(supporting)} of {len(uses)} source uses {name} came right after it "
                         f"({example.previous} then {example.call}) and {why}.")
        applicability.append(f"{predecessor} has already run in this conversation, as {example.previous} did before {example.call}.")
    parameters = [p for p in tool["parameters"].get("properties", {}) if any(n == p for use in uses for n, _ in use.arguments)]
    calls = Counter(use.call for use in uses)
    typical = min(uses, key=lambda use: (-calls[use.call], len(use.call), use.call, use.entry))
    if parameters:
        procedure.append(f"Call {name} with " + "; ".join(f"{p} (seen: {_seen_values(uses, p)})" for p in parameters) + ".")
    procedure.append(f"In the source trajectories {typical.call} returned {_snippet(typical.observation, OBSERVATION_CHARS)}")
    examples = example_requests(evidence, {entry_index(item.entry) for item in boundary})
    if examples:
        procedure.append(f"It served requests such as \"{_snippet(examples[0].request)}\" with {examples[0].call}.")
    required = [p for p in tool["parameters"].get("required", []) if p in parameters]
    if required:
        quoted = sum(set(required) <= set(quoted_parameters(dict(use.arguments), use.request)) for use in uses)
        applicability.append(f"The request or an earlier result gives {name}'s {', '.join(required)} "
                             f"(the request itself quoted {'it' if len(required) == 1 else 'all of them'} in {quoted} of {len(uses)} source uses).")

    risk_cues, avoidance_rules, recovery_notes = [], [], []
    for item in boundary:
        if isinstance(item, SkipFailure):
            risk_cues.append(f"{item.call} returned \"{item.error}\" when {item.skipped} had not run before it.")
            avoidance_rules.append(f"Do not call {item.call} before {item.skipped} has run.")
            recovery_notes.append(f"If {name} fails because {parse_call(item.skipped).name} has not run, call {item.skipped}, then retry {item.call}.")
        elif isinstance(item, HeldOut):
            risk_cues.append(f"The request \"{_snippet(item.request)}\" needed {name} while {name} was missing from the function list.")
            # a call without arguments says little by itself: its result is named (the procedure quotes one result already)
            result = f" (it returned {_snippet(item.later_observation, OBSERVATION_CHARS // 2)})" if item.later_call and "=" not in item.later_call else ""
            avoidance_rules.append(f"While {name} is missing from the function list, call nothing in its place"
                                   + (f"; only once it came back did {item.later_call} run{result}." if item.later_call else "."))
        else:
            risk_cues.append(f"The request \"{_snippet(item.request)}\" gave no {', '.join(p for p, _ in item.supplied)} for {name}.")
            avoidance_rules.append(f"Do not call {name} with a guessed {', '.join(p for p, _ in item.supplied)}: "
                                   f"the user gave {_supplied(item)} only when asked.")
    return {
        "id": f"{domain}.{name}",
        "goal": _tool_summary(tool["description"]),
        "procedure": procedure,
        "tools": [name],
        "applicability": list(dict.fromkeys(applicability)),
        "risk_cues": list(dict.fromkeys(risk_cues)),
        "avoidance_rules": list(dict.fromkeys(avoidance_rules)),
        "recovery_notes": list(dict.fromkeys(recovery_notes)),
    }


def llm_candidate(tool: Mapping[str, Any], evidence: ToolEvidence, domain: str, catalog: ToolCatalog) -> Candidate:
    """The LLM extractor's evidence for one tool-level anchor, from the same trajectories as
    :func:`extract_skill`'s: up to ``LLM_SUCCESSES`` uses (example requests first, then the other
    distinct calls, most frequent first) with their observations, the supported predecessors, and
    up to ``LLM_EVIDENCE_LINES`` pieces of boundary evidence, as lines."""
    name = tool["name"]
    boundary = _boundary_evidence(evidence, LLM_EVIDENCE_LINES)
    calls = Counter(use.call for use in evidence.successes)
    ordered = example_requests(evidence, {entry_index(item.entry) for item in boundary})
    ordered += sorted(evidence.successes, key=lambda use: (-calls[use.call], use.call, len(use.request), use.request))
    shown: dict[str, str] = {}
    for use in ordered:
        if use.call not in shown and len(shown) < LLM_SUCCESSES:
            shown[use.call] = (f"request \"{_snippet(use.request)}\" -> {use.call} returned {_snippet(use.observation, OBSERVATION_CHARS)}"
                               + (f" (after {use.previous})" if use.previous else ""))
    successes = list(shown.values()) + [
        f"{name} depends on {predecessor}: it came right after {predecessor} with a dependency in {len(uses)} of {len(evidence.successes)} uses"
        for predecessor, uses in predecessors(evidence)]
    lines = []
    for item in boundary:
        if isinstance(item, SkipFailure):
            lines.append(f"{item.call} returned \"{item.error}\" when the turn's previous call {item.skipped} was skipped.")
        elif isinstance(item, HeldOut):
            lines.append(f"{name} was missing from the function list for the request \"{_snippet(item.request)}\"; the correct action was no call"
                         + (f"; {item.later_call} was made once it came back (it returned {_snippet(item.later_observation, OBSERVATION_CHARS // 2)})."
                            if item.later_call else "."))
        else:
            lines.append(f"The request \"{_snippet(item.request)}\" did not give {', '.join(p for p, _ in item.supplied)} for {name}; "
                         f"the correct action was to ask; the user then gave {_supplied(item)}.")
    return Candidate(f"{domain}.{name}", catalog[name], catalog, tuple(successes), tuple(lines), domain)

# ---------------------------------------------------------------------------- report
@dataclass
class SkippedPoint:
    item_id: str
    reason: str


@dataclass
class ImportReport:
    """What :func:`import_bfcl` wrote and everything it left out, with reasons."""

    out: Path
    categories: tuple[str, ...]
    skill_indices: list[int]
    probe_indices: list[int]
    items: Counter  # (category, bucket) → count
    skipped: list[SkippedPoint]
    candidates: dict[str, int]  # domain → candidate skills
    kept: dict[str, list[str]]  # domain → kept skill ids
    rejected: dict[str, list[str]]  # skill id → ψ's problems
    unanchored: list[str]  # tools with boundary evidence but no successful use (no candidate)
    invalid_arguments: list[str]  # item ids whose correct arguments violate the tool schema
    sizes: dict[str, int] = field(default_factory=dict)  # file → bytes
    extractor: str = "deterministic"
    extraction: Extraction | None = None  # the LLM extractor's kept skills, rejections and replies
    llm_settings: dict[str, Any] = field(default_factory=dict)  # model, max_new_tokens, batch_size, retries
    audited: list[dict[str, Any]] = field(default_factory=list)  # item rows the label audit kept or relabelled
    dropped: list[DroppedItem] = field(default_factory=list)  # T_wrong items the label audit removed
    pairs: int = 0  # matched T_wrong/T_ok pairs
    unmatched: list[SkippedPoint] = field(default_factory=list)  # T_wrong items with no matched T_ok

    def skipped_counts(self) -> Counter:
        return Counter(point.reason for point in self.skipped)

    def summary(self) -> str:
        lines = [f"{sum(self.items.values())} items written to {self.out}"]
        for category in self.categories:
            lines.append(f"  {category}: " + ", ".join(f"{b} {self.items[(category, b)]}" for b in BUCKETS))
        lines.append(f"skills: {sum(len(v) for v in self.kept.values())} kept of {sum(self.candidates.values())} candidates "
                     f"({len(self.rejected)} {'rejected by ψ' if self.extraction is None else 'discarded'}); {len(self.unanchored)} tools with evidence but no successful use")
        if self.extraction is not None:
            lines.append(self.extraction.summary())
        for reason, count in sorted(self.skipped_counts().items()):
            lines.append(f"  skipped {count}: {reason}")
        actions = Counter(row["audit"][0]["action"] for row in self.audited)
        lines.append(f"label audit: {actions['kept']} kept, {actions['relabelled']} relabelled, {len(self.dropped)} dropped; "
                     f"matched pairs: {self.pairs}, T_wrong unmatched: {len(self.unmatched)}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- items
class _NearestTool:
    """The most similar other tool by TF-IDF cosine over name words + description (deterministic)."""

    def __init__(self, tools: Mapping[str, str]) -> None:
        self.names = sorted(tools)
        texts = [name.replace("_", " ") + " " + _tool_summary(tools[name]) for name in self.names]
        matrix = TfidfVectorizer(stop_words="english").fit_transform(texts)
        self.similarity = (matrix @ matrix.T).toarray()
        self.position = {name: i for i, name in enumerate(self.names)}

    def __call__(self, name: str, visible: Iterable[str]) -> str:
        row = self.similarity[self.position[name]]
        options = sorted((name_ for name_ in visible if name_ != name), key=lambda other: (-row[self.position[other]], other))
        return options[0]


def _call_action(step: Step) -> dict[str, Any]:
    return {"kind": "call", "tool": step.call.name, "arguments": step.arguments}


# ---------------------------------------------------------------------------- label audit
AUDIT_RULE = ("abstain only when a call would be premature: an argument is missing only if no value for it appears in the "
              "request or the conversation so far (BFCL's required parameters; values matched whole-word, case-insensitive)")
MISS_FUNC_AUDIT_RULE = ("abstain only when the request cannot be served without a held-out function: BFCL's next turn "
                        "starts with a held-out function, and the request names no function shown at this turn")


def _known_text(trajectory: Trajectory, turn: Turn) -> str:
    """What a model has read at step 0 of ``turn``: the request and every earlier turn (messages,
    call arguments, observations), lower-cased."""
    parts = [turn.user]
    for message in context_messages(trajectory.turns[: turn.index]):
        parts.append(json.dumps(message["tool_call"]["arguments"]) if message["role"] == "assistant" else message["content"])
    return "\n".join(parts).lower()


def _value_given(value: Any, text: str) -> bool:
    """A value appears in ``text`` (lower-cased): one of its textual forms (:func:`_value_strings`) as a
    whole word. A value without a textual form (a boolean, an object, one character) cannot be asked
    for by quoting it and counts as given."""
    forms = _value_strings(value)
    return not forms or any(re.search(rf"(?<!\w){re.escape(form.lower())}(?!\w)", text) for form in forms)


def missing_arguments(step: Step, text: str, required: Sequence[str], candidates: Iterable[str] | None = None) -> list[str]:
    """The required parameters of ``step``'s call (``candidates`` only, when given) whose value does
    not appear in ``text``: the arguments a model could not have filled in."""
    chosen = set(required) if candidates is None else set(required) & set(candidates)
    return [name for name in required if name in chosen and name in step.arguments and not _value_given(step.arguments[name], text)]


def _names_function(text: str, name: str) -> bool:
    """``text`` names function ``name`` (``_`` read as a space; whole words, case-insensitive)."""
    return re.search(rf"(?<!\w){re.escape(name.replace('_', ' ').lower())}(?!\w)", text.lower()) is not None


@dataclass
class DroppedItem:
    """A T_wrong item the label audit removed: its id, source and the audit entry saying why."""

    item_id: str
    category: str
    source: dict[str, Any]
    audit: list[dict[str, str]]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.item_id, "bucket": "T_wrong", "category": self.category, "source": self.source, "audit": self.audit}


def probe_items(
    trajectory: Trajectory, *, skill_of: Mapping[str, str], catalog: Mapping[str, tuple[str, ...]], nearest: _NearestTool,
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
            "domain": _domain_of(tempting_tool, catalog), "task_group": task_group, "category": trajectory.category,
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
                missing = [name for name in turn.hidden if name not in following.hidden]
                with_skill = [name for name in missing if name in skill_of]
                if not with_skill:
                    skipped.append(SkippedPoint(f"{prefix}-{point}", f"T_wrong: no validated skill for the held-out function(s) {missing}"))
                    continue
                tempting = with_skill[0]
                source = {"rule": "miss_func held-out function", "held_out": missing}
                first = following.steps[0].call.name if following.steps else None
                named = [name for name in visible if _names_function(turn.user, name)]
                if first not in turn.hidden:
                    reason, action = f"BFCL's next turn starts with {first}, shown at this turn: the request can be served without the held-out function", "dropped"
                elif named:
                    reason, action = f"the request names {', '.join(named)}, shown at this turn: it can be partly served now (a doubtful abstain)", "dropped"
                else:
                    reason, action = f"BFCL's next turn starts with the held-out {first}, and the request names no shown function", "kept"
                audit = [{"rule": MISS_FUNC_AUDIT_RULE, "action": action, "reason": reason}]
                if action == "dropped":
                    dropped.append(DroppedItem(f"{prefix}-{point}-wrong", trajectory.category, {"entry": trajectory.entry_id, "turn": turn.index, **source}, audit))
                else:
                    items.append(item(point, "T_wrong", turn, [], {"kind": "abstain"}, [nearest(tempting, visible)], tempting, [], source, audit))
            elif trajectory.category == "miss_param" and following is not None and following.steps:
                verdict, reason = _miss_param_wrong(trajectory, turn, following, visible, skill_of, required)
                if reason is not None:
                    skipped.append(SkippedPoint(f"{prefix}-{point}", reason))
                elif verdict["audit"][0]["action"] == "dropped":
                    dropped.append(DroppedItem(f"{prefix}-{point}-wrong", trajectory.category, {"entry": trajectory.entry_id, "turn": turn.index, **verdict["source"]},
                                               verdict["audit"]))
                else:
                    items.append(item(point, "T_wrong", turn, [], {"kind": "abstain"}, [verdict["tool"]], verdict["tool"], [], verdict["source"], verdict["audit"]))
            else:
                skipped.append(SkippedPoint(f"{prefix}-{point}", f"empty ground truth in {trajectory.category} outside the miss_func/miss_param rules"))
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
                                       "premature_call": step.call.text, "error": _error_text(step.skip_failure)}))
                    failed = [
                        {"role": "assistant", "tool_call": {"name": name, "arguments": step.arguments}},
                        {"role": "tool", "name": name, "content": step.skip_failure},
                    ]
                    items.append(item(point, "T_repair", turn, history[:-2] + failed, _call_action(previous), [name], name,
                                      [_error_text(step.skip_failure)], {"rule": "previous call skipped", "step": j, "skipped_call": previous.call.text}))
                else:
                    skipped.append(SkippedPoint(f"{prefix}-{point}-repair", f"T_repair: no validated skill for {name}"))
                    skipped.append(SkippedPoint(f"{prefix}-t{turn.index}s{j - 1}-premature", f"T_wrong: no validated skill for the premature {name}"))
            history.extend(step.messages())
    return items, skipped, dropped


def _miss_param_wrong(trajectory: Trajectory, turn: Turn, following: Turn, visible: Sequence[str], skill_of: Mapping[str, str],
                      required: Mapping[str, tuple[str, ...]]) -> tuple[dict[str, Any], str | None]:
    """The audited miss_param T_wrong of an under-specified ``turn`` (:data:`AUDIT_RULE`): the premature
    call is the first call of BFCL's next turn that lacks a required argument; when BFCL's clarification
    quotes values, only the parameters it quotes can be the missing ones. Returns ({tool, source, audit},
    None), or ({}, reason) when the premature call has no validated skill (a skipped point)."""
    text = _known_text(trajectory, turn)
    quoted = {id(step): params for step, params in clarified_calls(following, following.user)}
    # The pre-audit rule, for the audit's record: the first call quoting a clarified value, else the turn's last call.
    usable = [s for s in following.steps if s.call.name in skill_of and s.call.name in visible]
    before_rule = "uses the clarified value" if quoted else "last call of the next turn"
    before = next((s for s in usable if id(s) in quoted), None) if quoted else (following.steps[-1] if following.steps[-1] in usable else None)

    def lacking(step: Step) -> list[str]:
        return missing_arguments(step, text, required[step.call.name], quoted.get(id(step), []) if quoted else None)

    source: dict[str, Any] = {"rule": "miss_param premature call (first next-turn call lacking a required argument)",
                              "pre_audit_rule": f"miss_param premature call ({before_rule})", "clarification": following.user}

    def verdict(action: str, reason: str, **extra: Any) -> tuple[dict[str, Any], None]:
        return {"audit": [{"rule": AUDIT_RULE, "action": action, "reason": reason}], "source": source, **extra}, None

    first = following.steps[0]
    if first.call.name in visible and not lacking(first):
        checked = (f"the values BFCL's clarification quotes for it ({', '.join(quoted[id(first)])}) are already in the request or the conversation"
                   if quoted.get(id(first)) else "it lacks no required argument")
        return verdict("dropped", f"BFCL's next turn starts with {first.call.text}: {checked}, so it can be made now")
    premature = [step for step in following.steps if lacking(step)]
    if not premature:
        return verdict("dropped", "no call of BFCL's next turn lacks a required argument: every value appears in the request or the conversation")
    chosen = [step for step in premature if step in usable]
    if not chosen:
        return {}, f"T_wrong: no validated skill for the premature call(s) {[s.call.name for s in premature]}"
    step = chosen[0]
    params = lacking(step)
    source["missing_parameters"] = params
    given = ", ".join(f"{p}={step.arguments[p]!r}" for p in params)
    if before is not None and before.call.name == step.call.name:
        return verdict("kept", f"{step.call.name} lacks {given}: not in the request or the conversation", tool=step.call.name)
    was = before.call.name if before is not None else "no call with a validated skill"
    return verdict("relabelled", f"the pre-audit rule ({before_rule}) chose {was}; {step.call.name} is the first call lacking a required "
                                 f"argument ({given} is not in the request or the conversation)", tool=step.call.name)


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


def _domain_of(tool: str, catalog: Mapping[str, tuple[str, ...]]) -> str:
    return next(domain for domain, names in catalog.items() if tool in names)


# ---------------------------------------------------------------------------- import
def import_bfcl(
    *,
    out: str | Path,
    bfcl_dir: str | Path | None = None,
    categories: Sequence[str] = CATEGORIES,
    skill_fraction: float = 0.5,
    seed: int = 0,
    max_probe_entries: int | None = None,
    extractor: str = "deterministic",
    llm_model: TextGenerator | None = None,
    llm_retries: int = RETRIES,
    overwrite: bool = False,
    card: bool = True,
) -> ImportReport:
    """Write a probe dataset from BFCL's multi-turn entries to ``out`` and return what it holds.

    ``categories``: the multi-turn categories items are made from (skills always use the
    skill-source entries of base, miss_func and miss_param). ``skill_fraction``: share of entry
    indices whose trajectories feed skill extraction (none of them yields an item). ``seed``: the
    split's permutation. ``max_probe_entries``: keep only the first N probe indices (a small
    sample; the README says so).

    ``extractor``: ``"deterministic"`` (:func:`extract_skill`) or ``"llm"``
    (:class:`probes.data.extract_llm.LLMExtractor` on the same evidence, :func:`llm_candidate`),
    which needs ``llm_model``, a text generator such as
    ``probes.engine.generate.ChatGenerator.load(folder)``, and retries a rejected reply
    ``llm_retries`` times. Raises :class:`NoSkillKept`, writing nothing, when no skill passes ψ.

    ``card``: write the measured ``CARD.md`` (:func:`probes.reporting.cards.write_card` with its defaults;
    minutes on two cores); the committed ``datasets/bfcl/`` is this function's output with every default.

    ``out`` is written into a temporary folder that replaces it at the end
    (:func:`probes.data.staging.staged_folder`): a non-empty ``out`` that is not a previous BFCL import
    is refused (:class:`~probes.data.staging.OutputRefused`) unless ``overwrite``.
    """
    check_output(Path(out), is_previous=is_bfcl_import, overwrite=overwrite, what="BFCL import")  # before any work
    if extractor not in EXTRACTORS:
        raise ValueError(f"extractor must be one of {EXTRACTORS}, got {extractor!r}")
    if max_probe_entries is not None and max_probe_entries < 1:  # a negative slice would keep all but the last entries
        raise ValueError(f"--max-probe-entries must be ≥ 1, got {max_probe_entries}")
    if (extractor == "llm") != (llm_model is not None):
        raise ValueError("extractor='llm' needs llm_model (a text generator), and llm_model is used only with it")
    if llm_model is not None and not callable(llm_model):
        raise ValueError(f"llm_model must be a text generator such as probes.engine.generate.ChatGenerator.load(<model folder>), "
                         f"got {type(llm_model).__name__} {llm_model!r:.80}")
    llm = LLMExtractor(llm_model, retries=llm_retries) if llm_model is not None else None
    categories = tuple(categories)
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown or not categories:
        raise ValueError(f"categories must be a non-empty subset of {CATEGORIES}, got {list(categories)}")
    data_dir = locate_bfcl_data(bfcl_dir)
    classes = load_api_classes(api_source_dir(data_dir))
    tools = {domain: load_tools(data_dir, domain) for domain in FUNC_DOC_FILES}
    catalog_names = {domain: tuple(tool["name"] for tool in entries) for domain, entries in tools.items()}
    names = [name for entries in catalog_names.values() for name in entries]
    if len(names) != len(set(names)):
        raise BFCLDataError(f"BFCL tool names collide across classes: {sorted({n for n in names if names.count(n) > 1})}")

    needed = sorted(set(categories) | {"base", "miss_func", "miss_param"})
    entries = {category: load_entries(data_dir, category) for category in needed}
    indices = {entry_index(entry["id"]) for entry in entries["base"]}
    for category, rows in entries.items():
        if {entry_index(entry["id"]) for entry in rows} != indices:
            raise BFCLDataError(f"category {category} does not hold the same entry indices as base")
    skill_indices, probe_indices = split_indices(indices, skill_fraction=skill_fraction, seed=seed)
    if max_probe_entries is not None:
        probe_indices = probe_indices[:max_probe_entries]
    skill_set, probe_set = set(skill_indices), set(probe_indices)

    # Skills: Eq. 6 per tool anchor, ψ per domain (Eq. 7).
    evidence = collect_evidence(
        replay(entry, category, classes)
        for category in ("base", "miss_func", "miss_param") for entry in entries[category]
        if entry_index(entry["id"]) in skill_set
    )
    tool_by_name = {tool["name"]: (domain, tool) for domain, entries_ in tools.items() for tool in entries_}
    catalogs = {domain: ToolCatalog(tools_from_json(tools[domain], domain=domain)) for domain in tools}
    anchors = {domain: [name for name in catalog_names[domain] if name in evidence and evidence[name].successes] for domain in FUNC_DOC_FILES}
    domain_files: dict[str, dict[str, Any]] = {}
    kept: dict[str, list[str]] = {}
    rejected: dict[str, list[str]] = {}
    unanchored = sorted(name for name, ev in evidence.items() if not ev.successes)
    extraction: Extraction | None = None
    if llm is None:
        candidates = {domain: [extract_skill(tool_by_name[name][1], evidence[name], domain) for name in names]
                      for domain, names in anchors.items()}
    else:
        extraction = llm.run(llm_candidate(tool_by_name[name][1], evidence[name], domain, catalogs[domain])
                             for domain, names in anchors.items() for name in names)
        candidates = {domain: [skill.to_json() for skill in extraction.kept if skill.domain == domain] for domain in anchors}
        rejected.update((rejection.skill_id, [rejection.reason]) for rejection in extraction.rejected)
    candidates_per_domain = {domain: len(names) for domain, names in anchors.items()}
    for domain in FUNC_DOC_FILES:
        library = build_library(candidates[domain], catalogs[domain], domain=domain)
        kept[domain] = [skill.id for skill in library.skills]
        for error in library.rejected:
            rejected[error.skill_id] = [f"{slot}: {' | '.join(reasons)}" for slot, reasons in error.problems.items()]
        domain_files[domain] = {
            "domain": domain,
            "description": _tool_summary(tools[domain][0]["description"].split("Tool description:")[0]).rstrip(),
            "tools": tools[domain],
            "skills": [skill.to_json() for skill in library.skills],
        }
    skill_of = {skill_id.split(".", 1)[1]: skill_id for ids in kept.values() for skill_id in ids}
    if not skill_of:
        reasons = Counter(reason for problems in rejected.values() for reason in problems)
        raise NoSkillKept(f"the {extractor} extractor kept no skill of {sum(candidates_per_domain.values())} candidates, so no decision "
                          f"point has one; nothing written to {out}. Discarded: "
                          + "; ".join(f"{count} × {reason}" for reason, count in reasons.most_common()))

    nearest = _NearestTool({tool["name"]: tool["description"] for entries_ in tools.values() for tool in entries_})
    required = {tool["name"]: tuple(tool["parameters"].get("required", [])) for entries_ in tools.values() for tool in entries_}
    items: list[dict[str, Any]] = []
    skipped: list[SkippedPoint] = []
    dropped: list[DroppedItem] = []
    for category in categories:
        for entry in entries[category]:
            if entry_index(entry["id"]) not in probe_set:
                continue
            new_items, new_skipped, new_dropped = probe_items(replay(entry, category, classes), skill_of=skill_of, catalog=catalog_names,
                                                              nearest=nearest, required=required)
            items.extend(new_items)
            skipped.extend(new_skipped)
            dropped.extend(new_dropped)
    unmatched = match_items(items)

    invalid = []
    for row in items:
        action = row["correct_action"]
        if action["kind"] == "call":
            tool = catalogs[_domain_of(action["tool"], catalog_names)][action["tool"]]
            if tool.validate_arguments(action["arguments"]):
                invalid.append(row["id"])

    out = Path(out)
    with staged_folder(out, is_previous=is_bfcl_import, overwrite=overwrite, what="BFCL import", generated=BFCL_IMPORT_FILES) as stage:
        (stage / "domains").mkdir()
        sizes = {}
        for domain, content in domain_files.items():
            path = stage / "domains" / f"{domain}.json"
            path.write_text(json.dumps(content, indent=1) + "\n")
            sizes[f"domains/{domain}.json"] = path.stat().st_size
        items_path = stage / "items.jsonl"
        items_path.write_text("".join(json.dumps(row) + "\n" for row in items))
        sizes["items.jsonl"] = items_path.stat().st_size
        (stage / AUDIT_FILE).write_text("".join(json.dumps(row.to_json()) + "\n" for row in dropped))
        if extraction is not None:  # else none: a stale one of an earlier LLM import is not carried over
            (stage / "skill_rejections.json").write_text(json.dumps([rejection.to_json() for rejection in extraction.rejected], indent=1) + "\n")
        report = ImportReport(
            out=out, categories=categories, skill_indices=skill_indices, probe_indices=probe_indices,
            items=counts_by_category(items),
            skipped=skipped, candidates=candidates_per_domain, kept=kept, rejected=rejected, unanchored=unanchored,
            invalid_arguments=invalid, sizes=sizes, extractor=extractor, extraction=extraction,
            audited=[row for row in items if "audit" in row], dropped=dropped, unmatched=unmatched,
            pairs=sum(1 for row in items if row["bucket"] == "T_wrong" and "match_id" in row),
            llm_settings={} if llm is None else {"model": llm.generator.label, "max_new_tokens": llm.generator.max_new_tokens,
                                                 "batch_size": llm.generator.batch_size, "retries": llm.retries},
        )
        provenance = {
            skill_id: sorted(evidence[skill_id.split(".", 1)[1]].sources) for ids in kept.values() for skill_id in ids
        }
        (stage / "skill_sources.json").write_text(json.dumps(provenance, indent=1) + "\n")
    # it reads the domain files at report.out: written once the new folder is in place
    write_text(out / "README.md", render_readme(report, readme_facts(data_dir, categories), skill_fraction=skill_fraction, seed=seed,
                                                max_probe_entries=max_probe_entries))
    if card:
        write_card(out)
    return report


BFCL_IMPORT_FILES = ("domains", "items.jsonl", AUDIT_FILE, "skill_sources.json", "skill_rejections.json", "README.md", CARD_NAME)  # what an import writes


def is_bfcl_import(folder: Path) -> bool:
    """``folder`` was written by :func:`import_bfcl`: it has ``skill_sources.json``, and the first item
    of its ``items.jsonl`` comes from a BFCL multi-turn entry."""
    try:
        with (folder / "items.jsonl").open("rb") as handle:
            first = json.loads(handle.readline())
        return (folder / "skill_sources.json").is_file() and str(first["source"]["entry"]).startswith("multi_turn_")
    except (OSError, ValueError, KeyError, TypeError):
        return False


def counts_by_category(items: Iterable[Mapping[str, Any]]) -> Counter:
    """(category, bucket) counts of raw item rows (their ``source.entry`` names the category)."""
    return Counter((row["source"]["entry"].rsplit("_", 1)[0].removeprefix("multi_turn_"), row["bucket"]) for row in items)


def _data_version(data_dir: Path) -> str:
    digest = hashlib.sha256()
    for category in CATEGORIES:
        for answers in (False, True):
            digest.update(category_file(data_dir, category, answers=answers).read_bytes())
    return digest.hexdigest()[:16]


def readme_facts(data_dir: Path, categories: Sequence[str]) -> ImportFacts:
    """What the dataset README states beside the :class:`ImportReport`: the source files and the
    importer's fixed rules."""
    return ImportFacts(files=", ".join(category_file(data_dir, c).name for c in categories), data_version=_data_version(data_dir),
                       domains=tuple(FUNC_DOC_FILES), added_function_prompt=ADDED_FUNCTION_PROMPT,
                       evidence_per_slot=EVIDENCE_PER_SLOT, llm_successes=LLM_SUCCESSES, llm_evidence_lines=LLM_EVIDENCE_LINES,
                       predecessor_min_uses=PREDECESSOR_MIN_USES, predecessor_min_share=PREDECESSOR_MIN_SHARE, example_min_words=EXAMPLE_MIN_WORDS,
                       audit_file=AUDIT_FILE, audit_rule=AUDIT_RULE, miss_func_audit_rule=MISS_FUNC_AUDIT_RULE)


# ---------------------------------------------------------------------------- context length



def item_entry_id(item: Any) -> str:
    """The BFCL entry an imported item comes from: ``multi_turn_<category>_<index>`` (task group ``bfcl.<index>``)."""
    if not item.category or not item.task_group.startswith("bfcl."):
        raise BFCLDataError(f"{item.id}: not an imported BFCL item (category {item.category!r}, task group {item.task_group!r})")
    return f"multi_turn_{item.category}_{int(item.task_group.split('.', 1)[1])}"


class ItemEnvironments:
    """BFCL environments in the state of an item's decision point: the entry's ``initial_config``
    loaded in BFCL's own API classes, then every call of the item's conversation (earlier turns, then
    the current turn's history) executed in order; the observations are BFCL's real ones."""

    def __init__(self, data_dir: Path | None = None) -> None:
        self.data_dir = locate_bfcl_data(data_dir)
        self.classes = load_api_classes(api_source_dir(self.data_dir))
        self._entries: dict[str, dict[str, Any]] = {}

    def entry(self, entry_id: str) -> dict[str, Any]:
        if entry_id not in self._entries:
            category = re.fullmatch(r"multi_turn_([a-z_]+)_\d+", entry_id).group(1)  # type: ignore[union-attr]
            self._entries.update({e["id"]: e for e in load_entries(self.data_dir, category)})
        return self._entries[entry_id]

    def replay(self, item: Any) -> tuple[BFCLEnvironment, list[str]]:
        """The environment after every call of ``item``'s conversation, and the observation of each call."""
        entry = self.entry(item_entry_id(item))
        env = BFCLEnvironment(self.classes, entry["involved_classes"], entry["initial_config"], long_context=item.category == "long_context")
        observations = []
        for message in (*item.context, *item.history):
            if message.get("tool_call"):
                call = message["tool_call"]
                observations.append(env.execute(Call(f"{call['name']}(...)", call["name"], (), dict(call.get("arguments", {})))))
        return env, observations
