"""The organism's training examples, built from the probe dataset's *train* split.

The mixture (:data:`MIXTURE`): which (configuration, bucket, k) examples are drawn how often, which
T_wrong labels are imitation labels, and the boundary-edited twins (:class:`BoundaryEdit`,
:func:`boundary_edits`: quotes, partial quotes and donor boundaries) whose label follows the edited
boundary. :func:`example_plan` lists every planned example; :func:`make_example` renders one with our
prompt builder (``native`` format, the organism's ChatML template :data:`ORGANISM_CHAT_TEMPLATE`) into
a training sequence with its loss rows, isolated blocks, tool list and planted-head targets
(:func:`probes.organism.train.supervision.attention_targets`). Per-step augmentations keep the
lengths and rows of a sequence: tool renaming (:func:`rename_tools`) and word swapping
(:func:`swap_words`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
from transformers import PreTrainedTokenizerFast

from probes.data.configs import CONFIGS
from probes.data.dataset import ABSTAIN, Item, ProbeDataset
from probes.data.schema import SLOTS, Skill
from probes.organism import ORGANISM_NAME
from probes.organism.train.supervision import attention_targets, content_word, request_words
from probes.prompts.bpe import train_bpe_tokenizer
from probes.prompts.builder import ABSTAIN_TEXT, NATIVE_FORCED_PREFIX, PromptBuilder
from probes.prompts.builder import make_builder as make_prompt_builder
from probes.prompts.record import PromptRecord
from probes.prompts.spans import tokens_overlapping

# ----------------------------------------------------------------------------- mixture
# Sampling weight of a training example per (configuration, bucket), for every k in 1..4.
# k = 0 prompts are the same for every configuration and use K0_WEIGHTS.
MIXTURE: dict[str, dict[str, float]] = {
    "proc": {"T_ok": 1.0, "T_wrong": 0.35, "T_repair": 0.5},
    "app": {"T_ok": 0.3, "T_wrong": 0.1, "T_repair": 0.15},
    "basm": {"T_ok": 1.0, "T_wrong": 1.0, "T_repair": 1.0},
    "basm-no-avoid": {"T_ok": 0.15, "T_wrong": 0.15, "T_repair": 0.15},
    "basm-no-recovery": {"T_ok": 0.15, "T_wrong": 0.15, "T_repair": 0.15},
}
K0_WEIGHTS: dict[str, float] = {"T_ok": 2.0, "T_wrong": 2.0, "T_repair": 2.0}
# Relative weight of each retrieval depth k >= 1 (deeper prompts cost more; k = 2 is the paper's focus).
K_WEIGHTS: dict[int, float] = {1: 1.0, 2: 2.0, 3: 0.7, 4: 0.4}
# Share of proc/app T_wrong examples whose label is the tempting skill's tool (imitation), not the truth.
IMITATION: dict[str, float] = {"proc": 0.5, "app": 0.3}
# Boundary edits (TrainConfig.boundary_edits, see BoundaryEdit): in these shares of the T_ok / T_wrong
# examples of EDIT_CONFIGS whose top-ranked skill is the tempting one, that skill's boundary is edited
# and the label follows the edited boundary: a skill is followed unless its own boundary warns against
# this state. "quote": a risk cue quoting the request's own state cue is added, and the answer is the
# alternative the avoidance rules name (for T_ok the paired tool, a counterfactual); "donor": the risk
# cues and avoidance rules are an unrelated skill's, plus a decoy quote from another scenario, and the
# answer is the skill's own tool (for T_wrong a counterfactual). The shares make the label independent
# of the request in these configurations (half the T_ok and half the T_wrong examples follow the
# alternative), so only the request-to-boundary match lowers their loss; a 2- and a 3-layer organism
# trained with a request-only shortcut worth 75% ignored the edits entirely. Half the quotes keep only
# some of the cue's words (PARTIAL_QUOTE_KEEP), so the match learned is word overlap, which is what
# the paraphrased risk cues of the real skills offer, not an exact-phrase copy.
EDIT_CONFIGS: tuple[str, ...] = ("basm", "basm-no-recovery")
EDIT_SHARES: dict[str, dict[str, float]] = {"T_ok": {"quote": 0.5, "donor": 0.2}, "T_wrong": {"quote": 0.25, "donor": 0.5}}
QUOTE_TEMPLATE = 'The user says "{cue}".'
PARTIAL_QUOTE_SHARE = 0.5  # share of quotes (and decoys) that keep only some of the cue's words ...
PARTIAL_QUOTE_KEEP = 0.6  # ... each word kept with this probability, in order, at least two words
# The skill slots that name tools (isolated from the relay rows, see the isolation note).
NAME_SLOTS: tuple[str, ...] = ("procedure", "tools", "avoidance_rules", "recovery_notes")
# The trained configurations that show risk cues (the boundary the state is checked against).
BOUNDARY_CONFIGS: tuple[str, ...] = tuple(name for name in MIXTURE if "risk_cues" in CONFIGS[name].slots)
# Isolation (TrainConfig.isolation): in that share of the examples that show skills, the rows between
# the memory block and the decision (the request, the history, the forced prefix) cannot attend to the
# skill slots that name tools (TrainConfig.isolated_slots: procedure, tools, avoidance rules, recovery
# notes), so the tool to call must be read from the skills by the decision rows themselves, which is
# the path the paper's decision-token knockout removes. The request rows still read the goal,
# applicability and risk cues: matching the state's words against them (a duplicate-token lookup at
# the request rows) is what a small model learns; matching a whole paraphrased request at the decision
# row alone was not learned by a 2-layer organism (it ignored the boundary edits). With isolation the
# check takes three steps (request rows match, decision row gathers the verdict, decision row fetches
# the tool from the procedure or the avoidance rule), hence three layers. The other examples train with
# plain causal attention, which is how every probe runs the model.
# Tool list (TrainConfig.tool_list_hidden_in): in the isolated examples of the configurations that
# show boundary fields whose label is named in an isolated slot, the system prompt's tool list is also
# hidden from every row after the batch's shared prefix (which ends inside the memory block at the
# latest, see max_shared_prefix) up to the decision row, so the name is read from the skills (the procedure or
# the avoidance rule's alternative), not matched in the catalog. Without it the organism answered
# mostly from the request and the catalog (held-out basm T_wrong at the k = 0 level): the tool list is
# a second route to every name that no skill knockout removes. Examples whose label no shown skill
# names keep the tool list, and so do proc / app (hiding it only where the label is named would tie
# the catalog's visibility to imitation labels there) and k = 0.

# Pre-tokenization of the organism's BPE: identifiers with underscores (tool names, error codes,
# enum values) stay whole and never absorb a leading space, so every tool name is one token,
# identical in the catalog, the skills, the history and the call; other words as GPT-2 (letters
# with an optional leading space), digits one by one, punctuation runs, whitespace.
ORGANISM_PRETOKENIZER_PATTERN = (
    r"[\p{L}\p{N}]*_[\p{L}\p{N}_]*| ?\p{L}+(?![\p{L}_])| ?\p{N}| ?[^\s\p{L}\p{N}_]+|\s+(?!\S)|\s+"
)


# The organism's chat template: ChatML with native tool support, but a compact tool list (one line
# per tool: name and description) instead of Qwen3's JSON schemas. The JSON catalog is ~1,300 of
# a k = 2 prompt's ~1,700 tokens; the compact one ~250, which is what makes CPU training fit.
# History calls and tool results render the way Qwen3's template renders them.
TOOL_LIST_HEADER = "# Tools\n"
TOOL_LIST_END = "Call one tool as"
ORGANISM_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '" + TOOL_LIST_HEADER.replace("\n", "\\n") + "' }}"
    "{%- for tool in tools %}{{- '- ' + tool.function.name + ': ' + tool.function.description + '\\n' }}{%- endfor %}"
    "{{- '" + TOOL_LIST_END + " <tool_call>\\n{\"name\": <tool-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- for call in message.tool_calls %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# ----------------------------------------------------------------------------- tokenizer
def train_organism_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with the ChatML template of :mod:`probes.prompts.bpe`, but identifier-preserving
    pre-tokenization (:data:`ORGANISM_PRETOKENIZER_PATTERN`) so tool names are single tokens and
    Eq. 1's first-token sets never collide."""
    return train_bpe_tokenizer(
        texts, vocab_size, chat_template=ORGANISM_CHAT_TEMPLATE, split_pattern=ORGANISM_PRETOKENIZER_PATTERN, model_max_length=4096
    )


def action_text(item: Item, *, tool: str | None = None) -> str:
    """The assistant's action after the generation prompt (without the end-of-turn token)."""
    tool = tool or item.correct_action
    if tool == ABSTAIN:
        return ABSTAIN_TEXT
    arguments = dict(item.correct_arguments or {}) if tool == item.correct_action else {}
    return "<tool_call>\n" + json.dumps({"name": tool, "arguments": arguments}) + "\n</tool_call>"


def make_builder(tokenizer: PreTrainedTokenizerFast, dataset: ProbeDataset, embedder: str) -> PromptBuilder:
    """The organism's builder: :func:`probes.prompts.builder.make_builder` with the default settings."""
    return make_prompt_builder(tokenizer, dataset, embedder=embedder, tokenizer_name=ORGANISM_NAME)


# ----------------------------------------------------------------------------- examples
@dataclass
class Example:
    record_id: str
    item_id: str
    bucket: str
    config: str
    k: int
    group: tuple  # (catalog domains, unavailable tools): examples of one group share their system prompt
    input_ids: list[int]
    target_from: int  # rows target_from .. len-2 predict the action tokens
    key_rows: tuple[int, ...]  # open row (and decision row for calls)
    target_until: int  # last row with a loss (exclusive bound: rows < target_until)
    label: str
    weight: float
    isolated_blocks: tuple[tuple[int, int], ...] = ()  # what isolation hides from the relay rows, [start, end) blocks
    tool_list: tuple[int, int] | None = None  # the system prompt's tool list, hidden by isolation up to the decision row
    attention_targets: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] = field(default_factory=dict)  # planted head target -> (query row, key positions) cells
    edit: str | None = None  # the BoundaryEdit kind of an edited twin
    request_words: tuple[int, ...] = ()  # positions of the request's content-word tokens (word swapping) ...
    memory_from: int = 0  # ... whose tokens are swapped from this position (the first skill token) on


@dataclass(frozen=True)
class BoundaryEdit:
    """An edit of a training example's rank-1 (tempting) skill: ``quote`` adds a risk cue quoting
    ``cue`` (the request's own state cue) in front of its risk cues; ``donor`` replaces its risk cues
    and avoidance rules by skill ``donor``'s (:func:`counterfactual_skill`) and adds the quote of
    ``cue`` (a decoy: another scenario's state cue), so both kinds have a quote line."""

    kind: str  # "quote" or "donor"
    cue: str
    donor: str | None = None

    def apply(self, skill: Skill, dataset: ProbeDataset) -> Skill:
        edited = counterfactual_skill(skill, dataset.skills[self.donor]) if self.kind == "donor" else skill
        return replace(edited, risk_cues=(QUOTE_TEMPLATE.format(cue=self.cue), *edited.risk_cues))


class PlanEntry(NamedTuple):
    """One planned training example (the arguments of :func:`make_example`)."""

    item: Item
    config: str
    k: int
    label: str
    weight: float  # sampling weight
    edit: BoundaryEdit | None = None


def counterfactual_donor(item: Item, dataset: ProbeDataset, rng: random.Random) -> Skill:
    """A skill of the item's library, other than the tempting one, whose tools and boundary text name
    none of the item's candidate tools: its risk cues and avoidance rules are about another decision."""
    involved = {item.correct_action, *item.wrong_tools}
    tempting = dataset.skills[item.tempting_skill]
    involved |= set(tempting.tool_names)

    def unrelated(skill: Skill) -> bool:
        text = " ".join(skill.risk_cues + skill.avoidance_rules)
        return skill.id != tempting.id and not involved & set(skill.tool_names) and not any(name in text for name in involved)

    library = dataset.library_for(item)
    donors = [skill for skill in library if unrelated(skill) and skill.domain == tempting.domain] or [s for s in library if unrelated(s)]
    if not donors:
        raise RuntimeError(f"{item.id}: no skill in its library can donate a counterfactual boundary")
    return rng.choice(sorted(donors, key=lambda skill: skill.id))


def counterfactual_skill(skill: Skill, donor: Skill) -> Skill:
    """``skill`` with ``donor``'s risk cues and avoidance rules, retargeted at ``skill``'s own tool
    ("Do not call <donor tool> ..." becomes "Do not call <skill tool> ..."), so that only their
    content, not a tool-name mismatch, says they are about another decision."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, donor.tool_names)) + r")\b")

    def retarget(texts: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(pattern.sub(skill.tool_names[0], text) for text in texts)

    return replace(skill, risk_cues=retarget(donor.risk_cues), avoidance_rules=retarget(donor.avoidance_rules))


def partial_quote(cue: str, rng: random.Random) -> str:
    """``cue`` itself, or (PARTIAL_QUOTE_SHARE) its words each kept with PARTIAL_QUOTE_KEEP, in order;
    at least two words (a random adjacent pair when fewer survive); cues of two words or less stay whole."""
    words = cue.split()
    if rng.random() >= PARTIAL_QUOTE_SHARE or len(words) <= 2:
        return cue
    kept = [word for word in words if rng.random() < PARTIAL_QUOTE_KEEP]
    if len(kept) < 2:
        start = rng.randrange(len(words) - 1)
        kept = words[start : start + 2]
    return " ".join(kept)


def scenario(item: Item) -> str:
    return item.task_group.rsplit(".", 1)[0]


def boundary_edits(items: Sequence[Item], dataset: ProbeDataset, top_skill: Callable[[Item], str], seed: int) -> dict[str, list[tuple[BoundaryEdit, str, float]]]:
    """Per item id: its boundary-edited twins as (edit, label, share of the item's weight), for the
    T_ok / T_wrong items whose rank-1 retrieved skill is the tempting one (see :data:`EDIT_SHARES`)."""
    rng = random.Random(seed * 104_729 + 3)
    decoys = sorted({(scenario(i), cue) for i in items if i.bucket in EDIT_SHARES for cue in i.state_cues})
    twins: dict[str, list[tuple[BoundaryEdit, str, float]]] = {}
    for item in items:
        if item.bucket not in EDIT_SHARES or top_skill(item) != item.tempting_skill:
            continue
        own = item.correct_action if item.bucket == "T_ok" else item.wrong_tools[0]  # the tempting skill's tool
        alternative = item.wrong_tools[0] if item.bucket == "T_ok" else item.correct_action
        pool = [cue for name, cue in decoys if name != scenario(item)] or [cue for _, cue in decoys if cue not in item.user]
        if not pool:
            raise RuntimeError(f"{item.id}: no state cue of another scenario to quote as a decoy (too few train items?)")
        decoy = rng.choice(pool)
        partial_decoy = partial_quote(decoy, rng)
        decoy = decoy if partial_decoy in item.user else partial_decoy
        donor = counterfactual_donor(item, dataset, rng).id
        shares = EDIT_SHARES[item.bucket]
        twins[item.id] = [
            (BoundaryEdit("quote", partial_quote(rng.choice(item.state_cues), rng)), alternative, shares["quote"]),
            (BoundaryEdit("donor", decoy, donor), own, shares["donor"]),
        ]
    return twins


def example_plan(items: Sequence[Item], ks: Sequence[int], seed: int, *,
                 twins: dict[str, list[tuple[BoundaryEdit, str, float]]] | None = None) -> list[PlanEntry]:
    """Every training example of the mixture; ``twins`` (:func:`boundary_edits`) split their shares of
    an item's :data:`EDIT_CONFIGS` weight off into boundary-edited examples."""
    rng = random.Random(seed * 7919 + 17)
    plan: list[PlanEntry] = []
    for item in items:
        if 0 in ks:
            plan.append(PlanEntry(item, "base", 0, item.correct_action, K0_WEIGHTS[item.bucket]))
        item_twins = (twins or {}).get(item.id, ())
        for config, weights in MIXTURE.items():
            for k in ks:
                if k == 0:
                    continue
                label = item.correct_action
                if item.bucket == "T_wrong" and rng.random() < IMITATION.get(config, 0.0):
                    label = item.wrong_tools[0]
                weight = weights[item.bucket] * K_WEIGHTS.get(k, 1.0)
                if config in EDIT_CONFIGS:
                    for edit, edit_label, share in item_twins:
                        plan.append(PlanEntry(item, config, k, edit_label, weight * share, edit))
                    weight *= 1 - sum(share for *_, share in item_twins)
                plan.append(PlanEntry(item, config, k, label, weight))
    return plan


def make_example(
    builder: PromptBuilder, item: Item, config: str, k: int, label: str, weight: float, edit: BoundaryEdit | None = None,
    *, isolated_slots: Sequence[str] = NAME_SLOTS, hide_tool_list: bool = False,
) -> Example:
    """The training sequence of one planned example; its isolated blocks are the spans of ``isolated_slots``,
    and (``hide_tool_list``) its tool list is to be hidden when the label's name occurs in them."""
    retrieved = None
    if edit is not None:
        retrieved = builder.retrieve(item)[:k]
        retrieved[0] = replace(retrieved[0], skill=edit.apply(retrieved[0].skill, builder.dataset))
    record = builder.build(item, config, k, "native", retrieved=retrieved)
    text = record.text
    assert text.endswith(NATIVE_FORCED_PREFIX)
    prompt = text[: len(text) - len(NATIVE_FORCED_PREFIX)]
    open_index = record.open_index
    full = prompt + action_text(item, tool=label) + builder.tokenizer.eos_token
    ids = builder.tokenizer.backend_tokenizer.encode(full, add_special_tokens=False).ids
    if ids[: open_index + 1] != record.input_ids[: open_index + 1]:
        raise RuntimeError(f"{record.record_id}: the training sequence does not extend the builder's prompt")
    key_rows: tuple[int, ...] = (open_index,)
    if label != ABSTAIN:
        if ids[: record.decision_index + 1] != record.input_ids:
            raise RuntimeError(f"{record.record_id}: the call does not extend the forced prefix token-exactly")
        key_rows = (open_index, record.decision_index)
    # an imitation label has no true arguments: its loss stops at the name token
    until = len(ids) - 1 if label == item.correct_action else record.decision_index + 1
    blocks = isolated_blocks(record, isolated_slots)
    named = hide_tool_list and label != ABSTAIN and any(ids[record.decision_index + 1] in ids[start:end] for start, end in blocks)
    return Example(
        record.record_id + (f"|edit:{edit.kind}" if edit else ""), item.id, item.bucket, config, k, (item.catalog_domains, item.unavailable_tools), ids, open_index, key_rows, until, label, weight,
        blocks, tool_list_block(record) if named else None, attention_targets(record, item, key_rows[-1]), edit.kind if edit else None,
        request_words(record, item), min((int(slot.token_span[0]) for shown in record.skills for slot in shown.slots.values()), default=len(ids)),
    )


def isolated_blocks(record: PromptRecord, slots: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """The record's token spans of ``slots`` (every shown skill), as sorted [start, end) blocks."""
    unknown = set(slots) - set(SLOTS)
    if unknown:
        raise ValueError(f"isolated slots {sorted(unknown)} are not skill slots; choose from {list(SLOTS)}")
    return tuple(sorted((int(a), int(b)) for slot in slots for a, b in record.spans.get(slot, [])))


def tool_list_block(record: PromptRecord) -> tuple[int, int]:
    """[start, end) tokens of the record's tool list: from the organism template's tools header to
    its call instruction (the one-line-per-tool catalog, names and descriptions)."""
    text = record.text
    start = text.find(TOOL_LIST_HEADER)
    end = text.find(TOOL_LIST_END, start)
    if start < 0 or end < 0:
        raise ValueError(f"{record.record_id}: no {TOOL_LIST_HEADER!r} ... {TOOL_LIST_END!r} tool list (not the organism chat template)")
    return tokens_overlapping(np.asarray(record.offsets), start, end)


# ----------------------------------------------------------------------------- augmentation
def rename_tools(input_ids: Sequence[int], name_ids: Sequence[int], rng: random.Random) -> list[int]:
    """The sequence with every tool-name token replaced by its image under one random permutation of
    the tool names. Names are single tokens, so lengths, spans and rows do not change, and the
    renaming is consistent across catalog, skills, history and action. It makes a tool's identity
    unlearnable in the weights: the decision must be read from the prompt (the skill's procedure,
    the avoidance rule's alternative, the catalog's descriptions), which is the mechanism the probes
    are meant to find, and it stops the model from memorising a train task group's answer."""
    images = list(name_ids)
    rng.shuffle(images)
    mapping = dict(zip(name_ids, images))
    return [mapping.get(token, token) for token in input_ids]


def word_tokens(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """The vocabulary's content-word tokens with a leading space (the pool :func:`swap_words` draws from)."""
    return sorted(i for token, i in tokenizer.get_vocab().items() if token.startswith("Ġ") and content_word(token[1:]))


def swap_words(ex: Example, pool: Sequence[int], share: float, rng: random.Random) -> list[int]:
    """The sequence with each distinct content word of the request, with probability ``share``, replaced
    by a random ``pool`` token absent from the sequence, at every position from the memory block on
    (skills, request, history, action). Lengths, spans and rows do not change, and whether a request
    word occurs in a risk cue does not either: the match stays, the word is new. A duplicate-token
    lookup trained on the train requests' own words learned those words (held-out request words that
    no train request uses got 0.34 of its attention on their risk-cue tokens, the others 0.67);
    swapping makes it compare tokens, whatever they are."""
    ids = list(ex.input_ids)
    present = set(ids)
    candidates = [token for token in pool if token not in present]
    mapping: dict[int, int] = {}
    for token in sorted({ids[pos] for pos in ex.request_words}):
        if rng.random() < share and candidates:
            mapping[token] = candidates.pop(rng.randrange(len(candidates)))
    return ids[: ex.memory_from] + [mapping.get(token, token) for token in ids[ex.memory_from :]]
