"""Skills (paper §4.2, Eqs. 6–7): one candidate per tool-level anchor, written from the tool's own
evidence by the deterministic extractor (:func:`extract_skill`) or a chat model
(:func:`llm_candidate`, :mod:`probes.data.extract_llm`), then ψ per domain
(:func:`probes.data.schema.build_library`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probes.data.bfcl.evidence import (
    HeldOut,
    MissingParameters,
    SkipFailure,
    ToolEvidence,
    Use,
    boundary_evidence,
    example_requests,
    predecessors,
    quoted_parameters,
    snippet,
)
from probes.data.bfcl.source import FUNC_DOC_FILES, BFCLSource, entry_index, tool_summary
from probes.data.bfcl_exec import parse_call
from probes.data.extract_llm import Candidate, Extraction, LLMExtractor
from probes.data.schema import ToolCatalog, build_library

EXTRACTORS: tuple[str, ...] = ("deterministic", "llm")
EVIDENCE_PER_SLOT = 3  # boundary items kept per slot (one per evidence kind first, then the rest)
LLM_SUCCESSES = 3  # successful uses shown to the LLM extractor (distinct calls, most frequent first)
LLM_EVIDENCE_LINES = 6  # boundary evidence lines shown to it (one per evidence kind first)
VALUES_SHOWN = 3  # argument values quoted per parameter (most frequent first)
OBSERVATION_CHARS = 100  # observation quotes are cut at a word boundary


def _seen_values(uses: Sequence[Use], parameter: str) -> str:
    values = Counter(repr(value) for use in uses for name, value in use.arguments if name == parameter)  # as in the call texts
    top = sorted(values, key=lambda v: (-values[v], v))[:VALUES_SHOWN]
    return ", ".join(top)


def _supplied(evidence: MissingParameters) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in evidence.supplied)


def extract_skill(tool: Mapping[str, Any], evidence: ToolEvidence, domain: str) -> dict[str, Any]:
    """f_ext of Eq. 6 (deterministic): a seven-slot candidate for one tool-level anchor, every slot
    item built from this tool's own source trajectories.

    Goal: the tool's own description sentence. Procedure (τ⁺): each supported predecessor
    (:func:`~probes.data.bfcl.evidence.predecessors`) with the uses that show it, the argument values seen per parameter, the
    most frequent call with the observation it returned, and one example request
    (:func:`~probes.data.bfcl.evidence.example_requests`). Applicability: the required parameters with values seen, and the
    predecessors' calls having run; never that a tool is available (ψ rejects that: availability
    belongs to an item's catalog). Risk cues, avoidance rules, recovery notes (τ⁻): each shown piece
    of boundary evidence (:func:`~probes.data.bfcl.evidence.boundary_evidence`) states its own call, error, request or
    supplied values; none when there is none, which ψ rejects."""
    name = tool["name"]
    uses = evidence.successes
    boundary = boundary_evidence(evidence, EVIDENCE_PER_SLOT)
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
    procedure.append(f"In the source trajectories {typical.call} returned {snippet(typical.observation, OBSERVATION_CHARS)}")
    examples = example_requests(evidence, {entry_index(item.entry) for item in boundary})
    if examples:
        procedure.append(f"It served requests such as \"{snippet(examples[0].request)}\" with {examples[0].call}.")
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
            risk_cues.append(f"The request \"{snippet(item.request)}\" needed {name} while {name} was missing from the function list.")
            # a call without arguments says little by itself: its result is named (the procedure quotes one result already)
            result = f" (it returned {snippet(item.later_observation, OBSERVATION_CHARS // 2)})" if item.later_call and "=" not in item.later_call else ""
            avoidance_rules.append(f"While {name} is missing from the function list, call nothing in its place"
                                   + (f"; only once it came back did {item.later_call} run{result}." if item.later_call else "."))
        else:
            risk_cues.append(f"The request \"{snippet(item.request)}\" gave no {', '.join(p for p, _ in item.supplied)} for {name}.")
            avoidance_rules.append(f"Do not call {name} with a guessed {', '.join(p for p, _ in item.supplied)}: "
                                   f"the user gave {_supplied(item)} only when asked.")
    return {
        "id": f"{domain}.{name}",
        "goal": tool_summary(tool["description"]),
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
    boundary = boundary_evidence(evidence, LLM_EVIDENCE_LINES)
    calls = Counter(use.call for use in evidence.successes)
    ordered = example_requests(evidence, {entry_index(item.entry) for item in boundary})
    ordered += sorted(evidence.successes, key=lambda use: (-calls[use.call], use.call, len(use.request), use.request))
    shown: dict[str, str] = {}
    for use in ordered:
        if use.call not in shown and len(shown) < LLM_SUCCESSES:
            shown[use.call] = (f"request \"{snippet(use.request)}\" -> {use.call} returned {snippet(use.observation, OBSERVATION_CHARS)}"
                               + (f" (after {use.previous})" if use.previous else ""))
    successes = list(shown.values()) + [
        f"{name} depends on {predecessor}: it came right after {predecessor} with a dependency in {len(uses)} of {len(evidence.successes)} uses"
        for predecessor, uses in predecessors(evidence)]
    lines = []
    for item in boundary:
        if isinstance(item, SkipFailure):
            lines.append(f"{item.call} returned \"{item.error}\" when the turn's previous call {item.skipped} was skipped.")
        elif isinstance(item, HeldOut):
            lines.append(f"{name} was missing from the function list for the request \"{snippet(item.request)}\"; the correct action was no call"
                         + (f"; {item.later_call} was made once it came back (it returned {snippet(item.later_observation, OBSERVATION_CHARS // 2)})."
                            if item.later_call else "."))
        else:
            lines.append(f"The request \"{snippet(item.request)}\" did not give {', '.join(p for p, _ in item.supplied)} for {name}; "
                         f"the correct action was to ask; the user then gave {_supplied(item)}.")
    return Candidate(f"{domain}.{name}", catalog[name], catalog, tuple(successes), tuple(lines), domain)


@dataclass
class Skills:
    """What the extraction kept: each domain's file content (description, tools, kept skills), the
    kept skill ids, the rejected ones with ψ's (or the extractor's) problems, and where each kept
    skill's evidence came from."""

    domain_files: dict[str, dict[str, Any]]  # domain -> domains/<domain>.json
    kept: dict[str, list[str]]  # domain -> kept skill ids
    rejected: dict[str, list[str]]  # skill id -> problems
    candidates: dict[str, int]  # domain -> candidate skills
    unanchored: list[str]  # tools with boundary evidence but no successful use (no candidate)
    sources: dict[str, list[str]]  # kept skill id -> the skill-source entries its evidence came from
    extraction: Extraction | None  # the LLM extractor's kept skills, rejections and replies

    @property
    def skill_of(self) -> dict[str, str]:
        """Tool name -> its kept skill's id."""
        return {skill_id.split(".", 1)[1]: skill_id for ids in self.kept.values() for skill_id in ids}


def extract_skills(source: BFCLSource, evidence: Mapping[str, ToolEvidence], llm: LLMExtractor | None) -> Skills:
    """f_ext (Eq. 6) per tool anchor, deterministic (``llm`` None) or by ``llm``, then ψ (Eq. 7) per domain.
    An anchor is a tool with a successful use in the skill-source trajectories."""
    anchors = {domain: [name for name in names if name in evidence and evidence[name].successes] for domain, names in source.catalog_names.items()}
    rejected: dict[str, list[str]] = {}
    extraction: Extraction | None = None
    if llm is None:
        candidates = {domain: [extract_skill(source.tool(name), evidence[name], domain) for name in names] for domain, names in anchors.items()}
    else:
        extraction = llm.run(llm_candidate(source.tool(name), evidence[name], domain, source.catalogs[domain])
                             for domain, names in anchors.items() for name in names)
        candidates = {domain: [skill.to_json() for skill in extraction.kept if skill.domain == domain] for domain in anchors}
        rejected.update((rejection.skill_id, [rejection.reason]) for rejection in extraction.rejected)
    domain_files: dict[str, dict[str, Any]] = {}
    kept: dict[str, list[str]] = {}
    for domain in FUNC_DOC_FILES:
        library = build_library(candidates[domain], source.catalogs[domain], domain=domain)
        kept[domain] = [skill.id for skill in library.skills]
        for error in library.rejected:
            rejected[error.skill_id] = [f"{slot}: {' | '.join(reasons)}" for slot, reasons in error.problems.items()]
        domain_files[domain] = {
            "domain": domain,
            "description": tool_summary(source.tools[domain][0]["description"].split("Tool description:")[0]).rstrip(),
            "tools": source.tools[domain],
            "skills": [skill.to_json() for skill in library.skills],
        }
    return Skills(domain_files=domain_files, kept=kept, rejected=rejected, candidates={domain: len(names) for domain, names in anchors.items()},
                  unanchored=sorted(name for name, ev in evidence.items() if not ev.successes),
                  sources={skill_id: sorted(evidence[skill_id.split(".", 1)[1]].sources) for ids in kept.values() for skill_id in ids},
                  extraction=extraction)
