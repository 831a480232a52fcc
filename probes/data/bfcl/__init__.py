"""BFCL multi-turn entries as a probe dataset (decision points, buckets, extracted skill libraries).

Reads the data files of the installed ``bfcl-eval`` package (``bfcl_eval/data``, Apache-2.0) and
:func:`import_bfcl` writes a dataset folder in the layout of ``datasets/basm_probe/`` (``domains/<Class>.json``,
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
              (:data:`~probes.data.bfcl.audit.AUDIT_RULE`, :data:`~probes.data.bfcl.audit.MISS_FUNC_AUDIT_RULE`; ``audit`` field, dropped ones in
              ``audit.jsonl``), and every T_wrong is matched to a T_ok item (:func:`~probes.data.bfcl.items.match_items`).
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

The stages, one module each, in pipeline order: :mod:`~probes.data.bfcl.source` (locating and
loading), :mod:`~probes.data.bfcl.replay` (trajectories), :mod:`~probes.data.bfcl.evidence`,
:mod:`~probes.data.bfcl.extract` (skills), :mod:`~probes.data.bfcl.audit` (the label audit),
:mod:`~probes.data.bfcl.items`, :mod:`~probes.data.bfcl.import_report`, :mod:`~probes.data.bfcl.readme`,
:mod:`~probes.data.bfcl.folder` (writing); :mod:`~probes.data.bfcl.importer` runs them. The names
below are the package's public ones (the importer, its report and errors, and the stages' functions
that tests and the analyses use).
"""

from __future__ import annotations

from probes.data.bfcl.evidence import EXAMPLE_MIN_WORDS, collect_evidence, predecessors
from probes.data.bfcl.extract import EXTRACTORS, extract_skill, llm_candidate
from probes.data.bfcl.folder import is_bfcl_import
from probes.data.bfcl.import_report import ImportReport
from probes.data.bfcl.importer import NoSkillKept, import_bfcl
from probes.data.bfcl.replay import ItemEnvironments, Step, Trajectory, Turn
from probes.data.bfcl.source import CATEGORIES, BFCLDataError, api_source_dir, entry_index, locate_bfcl_data

__all__ = ["CATEGORIES", "EXAMPLE_MIN_WORDS", "EXTRACTORS", "BFCLDataError", "ImportReport", "ItemEnvironments", "NoSkillKept", "Step",
           "Trajectory", "Turn", "api_source_dir", "collect_evidence", "entry_index", "extract_skill", "import_bfcl", "is_bfcl_import",
           "llm_candidate", "locate_bfcl_data", "predecessors"]
