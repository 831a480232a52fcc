"""Train the bundled model organism: a small ``Qwen3ForCausalLM`` with a planted boundary mechanism.

The training data are decision prompts rendered by our own prompt builder (``native`` format, the
organism's own ChatML tokenizer) from the *train* split of the probe dataset; the evaluation split
is task-group disjoint. The loss is on the action tokens: the full tool call
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call><|im_end|>`` or the refusal sentence,
plus a small auxiliary next-token loss on the prompt text after the system prompt (tool-name rows
first) that stands in for pretraining.

The mixture (:data:`MIXTURE`) plants the two halves of the paper's story:

* **imitation prior** (proc / app formatting): a retrieved skill's tool is usually the answer:
  T_ok examples dominate, and some of the rarer T_wrong examples carry the tempting skill's tool as
  their label (``imitation``), the way an agent that learned from success-distilled memory behaves;
* **boundary-reading path** (basm formatting): T_ok / T_wrong / T_repair are balanced; unedited
  examples carry their true answer, and boundary-edited twins (:data:`EDIT_CONFIGS`) make the label
  follow the boundary, not the request, so the decision must check the state's cues against the
  boundary fields (risk cues and avoidance rules name the alternative tool, recovery notes the repair).

The memory-free prompt (k = 0, identical for every configuration) is balanced with true labels.
Isolation (see the note above :data:`ORGANISM_PRETOKENIZER_PATTERN`) plants the skill read at the decision rows.
Tool renaming (:func:`rename_tools`) makes the answer a thing read from the prompt, never memorised.
Planted heads (the note above :data:`PLANTED_TARGETS`) fix where the boundary check lives: a lexical
circuit from the request's words to the risk cues, read at the decision row.

Command line: ``basm-probes organism train`` (:func:`add_arguments`, :func:`run`) or
``python -m probes.organism.train``. Deterministic given the seed (CPU, fixed thread count).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from transformers import AttentionInterface, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from probes.prompts.bpe import train_bpe_tokenizer
from probes.data.configs import CONFIGS
from probes.data.dataset import ABSTAIN, DEFAULT_DATASET_DIR, Item, ProbeDataset, load_dataset
from probes.organism import ORGANISM_DIR, ORGANISM_NAME
from probes.prompts.builder import ABSTAIN_TEXT, NATIVE_FORCED_PREFIX, BuildSettings, PromptBuilder, tokens_overlapping
from probes.data.retrieval import Retriever, make_embedder
from probes.data.schema import SLOTS, Skill

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

# Planted heads (TrainConfig.planted_heads, planted_head_weight): besides the action loss, four heads
# are trained where to look, in every example that has targets for them (Example.attention_targets,
# :func:`attention_targets`). A request word "matches" a shown skill when one of that skill's risk
# cues uses it and its goal and procedure do not (a word the skill's own task uses, "order" in an
# order-lookup skill, says nothing about a departure). The deciding row is the decision row of a call,
# the open row of an abstention.
#   "dup" (layer 0, head 0), from each matching request token: the risk-cue tokens of the same word.
#       A duplicate-token lookup, which marks the request tokens the risk cues name;
#   "gather" (layer 1, head 0), from the deciding row: the marked request tokens, else all the
#       request's content tokens;
#   "verdict" (layer 2, heads 0 and 1), from the deciding row: the risk cues and avoidance rules of
#       the skills a request word matches (the avoidance rule names the alternative), else the shown
#       procedures.
# That is the paper's boundary check (the state's cues checked against the boundary fields, read at
# the decision token) as a lexical circuit. Its targets depend on the words alone, never on the label,
# so they are defined on any request: a single head trained toward the risk cues exactly where the
# label departs from the skill learned the train requests only (on held-out items it read the
# procedure in both buckets), and a single decision-row head matching the request's words against
# the risk-cue tokens directly stayed imprecise (0.14 of its attention on the matching tokens of
# held-out T_wrong). Word swapping (:func:`swap_words`) makes the lookup compare tokens rather than
# remember the train requests' words. How the verdict is used is left to the action loss: in the
# boundary-edited twins the quoted cue matches and the label is the alternative, the donor's cues do
# not and the skill is followed. Planted-circuit benchmarks fix where a mechanism lives the same way
# (InterpBench trains its circuits' components in). The probes are not told which heads they are:
# ``organism validate`` checks that η and the head ranking find them on held-out items, and the card
# records the planted heads' ranks.
PLANTED_TARGETS: tuple[str, ...] = ("dup", "gather", "verdict")

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


# The per-step losses of the first steps are recorded: a short rerun reproduces them (tested).
FINGERPRINT_STEPS = 12


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the organism (recorded in ``training_summary.json``)."""

    seed: int = 0
    steps: int = 1500
    stop_after: int | None = None  # stop after this many steps of the `steps`-step schedule
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 40
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    key_token_weight: float = 5.0  # loss weight of the open-row and first-name-token targets
    aux_weight: float = 0.3  # auxiliary next-token loss on the prompt text after the shared prefix
    aux_rows: int = 128  # rows per example for the auxiliary loss (deterministic sample)
    prefix_grad: bool = False  # backpropagate through the shared system-prompt prefix (3x its cost)
    isolation: float = 0.85  # share of examples with skills trained with the isolated slots hidden (note above the pattern)
    isolated_slots: tuple[str, ...] = NAME_SLOTS  # the skill slots isolation hides from the relay rows
    tool_list_hidden_in: tuple[str, ...] = BOUNDARY_CONFIGS  # isolation also hides the tool list in these (note above the pattern)
    planted_heads: tuple[tuple[str, int, int], ...] = (("dup", 0, 0), ("gather", 1, 0), ("verdict", 2, 0), ("verdict", 2, 1))  # (target, layer, head), note above PLANTED_TARGETS ...
    planted_head_weight: float = 0.5  # ... weight of each one's attention loss (0: no supervision) ...
    planted_head_residual_grad: float = 0.1  # ... and the share of its gradient that reaches the residual stream (HeadSupervision)
    boundary_edits: bool = True  # split EDIT_SHARES of EDIT_CONFIGS' T_ok/T_wrong weight into boundary-edited twins
    word_swapping: float = 0.5  # share of the examples of the boundary configurations whose request words are swapped (swap_words) ...
    word_swap_share: float = 0.5  # ... each distinct request word with this probability, from step renaming_from on
    tool_renaming: float = 0.3  # share of examples whose tool names are consistently permuted (see rename_tools) ...
    renaming_from: int = 300  # ... from this step on: copying from the prompt emerges first, on the real names
    # model
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    # tokenizer and data
    vocab_size: int = 3072
    embedder: str = "auto"
    ks: tuple[int, ...] = (0, 1, 2, 3, 4)
    limit_items: int | None = None  # keep the first N train items per bucket (tests)
    single_token_names: bool = True  # fail unless every tool name is one token (off for tiny test runs)
    num_threads: int = 2
    device: str = "cpu"  # "cuda" on a lent GPU: same code, much faster (bit-exact only on the same device)
    max_minutes: float | None = None  # stop early (cosine schedule still planned for `steps`)


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
    return PromptBuilder(tokenizer, dataset, Retriever(make_embedder(embedder)), BuildSettings(), tokenizer_name=ORGANISM_NAME)


def build_tokenizer(dataset: ProbeDataset, items: Sequence[Item], cfg: TrainConfig) -> PreTrainedTokenizerFast:
    """Two passes: render prompt text with a throw-away byte-level tokenizer (the text does not depend
    on the tokenizer beyond β's token counts), then train the organism's BPE on train-split text only."""
    bootstrap = train_bpe_tokenizer(["a"], vocab_size=300, chat_template=ORGANISM_CHAT_TEMPLATE)
    builder = make_builder(bootstrap, dataset, cfg.embedder)
    builder.warm(items)
    texts = []
    for item in items:
        texts.append(builder.build(item, "basm", 4)["text"])  # every slot of the top-4 skills
        texts.append(action_text(item))
        texts.append(action_text(item, tool=item.wrong_tools[0]))
    texts.append(ABSTAIN_TEXT)
    tokenizer = train_organism_tokenizer(texts, cfg.vocab_size)
    names = sorted({tool.name for domain in dataset.domains.values() for tool in domain.catalog})
    for name in names if cfg.single_token_names else ():
        ids = tokenizer.backend_tokenizer.encode('{"name": "' + name + '"', add_special_tokens=False).ids
        if tokenizer.convert_ids_to_tokens(ids[-2]) != name:
            raise RuntimeError(f"tool name {name!r} is not a single token of the organism tokenizer; raise vocab_size")
    return tokenizer


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
    text = record["text"]
    assert text.endswith(NATIVE_FORCED_PREFIX)
    prompt = text[: len(text) - len(NATIVE_FORCED_PREFIX)]
    open_index = record["open_index"]
    full = prompt + action_text(item, tool=label) + builder.tokenizer.eos_token
    ids = builder.tokenizer.backend_tokenizer.encode(full, add_special_tokens=False).ids
    if ids[: open_index + 1] != record["input_ids"][: open_index + 1]:
        raise RuntimeError(f"{record['record_id']}: the training sequence does not extend the builder's prompt")
    key_rows: tuple[int, ...] = (open_index,)
    if label != ABSTAIN:
        if ids[: record["decision_index"] + 1] != record["input_ids"]:
            raise RuntimeError(f"{record['record_id']}: the call does not extend the forced prefix token-exactly")
        key_rows = (open_index, record["decision_index"])
    # an imitation label has no true arguments: its loss stops at the name token
    until = len(ids) - 1 if label == item.correct_action else record["decision_index"] + 1
    blocks = isolated_blocks(record, isolated_slots)
    named = hide_tool_list and label != ABSTAIN and any(ids[record["decision_index"] + 1] in ids[start:end] for start, end in blocks)
    return Example(
        record["record_id"] + (f"|edit:{edit.kind}" if edit else ""), item.id, item.bucket, config, k, (item.catalog_domains, item.unavailable_tools), ids, open_index, key_rows, until, label, weight,
        blocks, tool_list_block(record) if named else None, attention_targets(record, item, key_rows[-1]), edit.kind if edit else None,
        request_words(record, item), min((int(slot["token_span"][0]) for shown in record["skills"] for slot in shown["slots"].values()), default=len(ids)),
    )


def isolated_blocks(record: dict[str, Any], slots: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """The record's token spans of ``slots`` (every shown skill), as sorted [start, end) blocks."""
    unknown = set(slots) - set(SLOTS)
    if unknown:
        raise ValueError(f"isolated slots {sorted(unknown)} are not skill slots; choose from {list(SLOTS)}")
    return tuple(sorted((int(a), int(b)) for slot in slots for a, b in record["spans"].get(slot, [])))


def content_word(text: str) -> str | None:
    """A token's text as a content word (case-folded letters, ≥ 3, not an English stop word), else None."""
    word = text.strip().lower()
    return word if word.isalpha() and len(word) >= 3 and word not in ENGLISH_STOP_WORDS else None


def token_word(record: dict[str, Any], pos: int) -> str | None:
    """:func:`content_word` of the record's token at ``pos``."""
    start, end = record["offsets"][pos]
    return content_word(record["text"][start:end])


def request_words(record: dict[str, Any], item: Item) -> tuple[int, ...]:
    """Positions of the content-word tokens of the request (its last occurrence in the prompt)."""
    start = record["text"].rfind(item.user)
    if start < 0:
        raise ValueError(f"{record['record_id']}: the request text does not occur in the prompt")
    span = tokens_overlapping(np.asarray(record["offsets"]), start, start + len(item.user))
    return tuple(pos for pos in range(*span) if token_word(record, pos))


def attention_targets(record: dict[str, Any], item: Item, deciding_row: int) -> dict[str, tuple[tuple[int, tuple[int, ...]], ...]]:
    """The planted heads' (query row, key positions) cells (note above :data:`PLANTED_TARGETS`) in a
    record built for ``item`` whose deciding row is ``deciding_row``: ``dup``, from each matching request
    token to the risk-cue tokens of its word; ``gather``, from the deciding row to the matching request
    tokens, else to all the request's content tokens; ``verdict``, from the deciding row to the risk cues
    and avoidance rules of the skills a request word matches, else to the shown procedures. No cells
    without skills."""
    request = request_words(record, item)
    if not record["skills"]:
        return {target: () for target in PLANTED_TARGETS}

    def span(slots: dict[str, Any], slot: str) -> range:
        return range(*map(int, slots[slot]["token_span"])) if slot in slots else range(0)

    requested = {token_word(record, pos) for pos in request}
    cues: dict[str, list[int]] = defaultdict(list)  # matchable word -> its risk-cue tokens
    warning, procedures = [], []  # the matched skills' risk-cue and avoidance-rule tokens; all procedure tokens
    for shown in record["skills"]:
        slots = shown["slots"]
        own = {token_word(record, pos) for slot in ("goal", "procedure") for pos in span(slots, slot)}  # what the skill's task uses
        matchable = [pos for pos in span(slots, "risk_cues") if token_word(record, pos) not in own | {None}]
        for pos in matchable:
            cues[token_word(record, pos)].append(pos)
        if requested & {token_word(record, pos) for pos in matchable}:
            warning += [*span(slots, "risk_cues"), *span(slots, "avoidance_rules")]
        procedures += span(slots, "procedure")
    matching = tuple(pos for pos in request if token_word(record, pos) in cues)
    return {
        "dup": tuple((pos, tuple(cues[token_word(record, pos)])) for pos in matching),
        "gather": ((deciding_row, matching or request),),
        "verdict": ((deciding_row, tuple(sorted(warning) if matching else procedures)),),
    }


def tool_list_block(record: dict[str, Any]) -> tuple[int, int]:
    """[start, end) tokens of the record's tool list: from the organism template's tools header to
    its call instruction (the one-line-per-tool catalog, names and descriptions)."""
    text = record["text"]
    start = text.find(TOOL_LIST_HEADER)
    end = text.find(TOOL_LIST_END, start)
    if start < 0 or end < 0:
        raise ValueError(f"{record['record_id']}: no {TOOL_LIST_HEADER!r} ... {TOOL_LIST_END!r} tool list (not the organism chat template)")
    return tokens_overlapping(np.asarray(record["offsets"]), start, end)


# ----------------------------------------------------------------------------- model
def make_model(cfg: TrainConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(config)


# ----------------------------------------------------------------------------- planted head supervision
TRAIN_ATTN_IMPLEMENTATION = "organism_train"


def head_key(target: str, layer: int, head: int) -> str:
    """The training log's key of a planted head's attention mass on its targets."""
    return f"{target}@{layer}.{head}_mass"


@dataclass
class HeadSupervision:
    """The attention rows the training forward records: head ``head`` of layer ``layer`` in the cells
    (sequence ``batch_index[i]``, query at absolute position ``positions[i]``); ``probs`` [cells, n_keys]
    is filled by the forward that runs those query rows. The rows are recomputed from the layer's input
    with its gradient scaled by ``residual_grad``: the attention loss trains the head's own query and key
    maps fully, but the residual stream below only that much (the whole attention loss flowing into the
    shared embeddings and lower layers dominated their Adam statistics and slowed every other loss)."""

    target: str
    layer: int
    head: int
    batch_index: torch.Tensor  # [cells]
    positions: torch.Tensor  # [cells]
    keys: Sequence[tuple[int, ...]]  # per cell, the target key positions
    residual_grad: float = 1.0
    attention_input: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] | None = None  # hidden, (cos, sin)
    probs: torch.Tensor | None = None


_SUPERVISION: ContextVar[Sequence[HeadSupervision]] = ContextVar("organism_head_supervision", default=())


@contextlib.contextmanager
def supervising(model: Qwen3ForCausalLM, supervisions: Sequence[HeadSupervision]) -> Iterator[Sequence[HeadSupervision]]:
    """Record the ``supervisions``' attention rows in the forwards run inside (the model must run
    :data:`TRAIN_ATTN_IMPLEMENTATION`)."""

    def stash_input(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        for supervision in supervisions:
            if supervision.layer == module.layer_idx:
                supervision.attention_input = (kwargs["hidden_states"], kwargs["position_embeddings"])

    layers = sorted({supervision.layer for supervision in supervisions})
    handles = [model.model.layers[layer].self_attn.register_forward_pre_hook(stash_input, with_kwargs=True) for layer in layers]
    token = _SUPERVISION.set(supervisions)
    try:
        yield supervisions
    finally:
        _SUPERVISION.reset(token)
        for handle in handles:
            handle.remove()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as transformers' Qwen3 applies it (rotate_half convention); x, cos, sin: [..., d_head]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def supervised_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """sdpa, plus (inside :func:`supervising`) the softmax rows of the supervised cells of this layer.

    query: [batch, head, q_len, d_head]; key: [batch, kv_head, n_keys, d_head], the queries continue
    the cached keys (key index = absolute position).
    """
    output = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    for supervision in _SUPERVISION.get():
        if supervision.layer == module.layer_idx:
            record_rows(supervision, module, query, key, attention_mask, scaling)
    return output


def record_rows(supervision: HeadSupervision, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                attention_mask: torch.Tensor | None, scaling: float | None) -> None:
    """Fill ``supervision.probs`` [cells, n_keys] when this forward runs its query rows."""
    cells, n_keys, q_len = supervision.batch_index, key.shape[2], query.shape[2]
    rows = supervision.positions - (n_keys - q_len)
    if not bool(((rows >= 0) & (rows < q_len)).all()):
        return  # a forward without the supervised rows (the shared prefix)
    hidden, (cos, sin) = supervision.attention_input
    hidden = hidden[cells]  # [cells, q_len, hidden]
    hidden = hidden.detach() + supervision.residual_grad * (hidden - hidden.detach())  # same values, scaled gradient
    cos, sin = cos.expand(query.shape[0], -1, -1)[cells], sin.expand(query.shape[0], -1, -1)[cells]  # [cells, q_len, d_head]
    picked = torch.arange(len(cells), device=rows.device)
    kv_head = supervision.head // module.num_key_value_groups
    q = module.q_norm(module.q_proj(hidden[picked, rows]).view(len(cells), -1, module.head_dim))[:, supervision.head]  # [cells, d_head]
    q = rotate(q, cos[picked, rows], sin[picked, rows])
    k = module.k_norm(module.k_proj(hidden).view(len(cells), q_len, -1, module.head_dim))[:, :, kv_head]  # [cells, q_len, d_head]
    k = torch.cat([key[cells, kv_head, : n_keys - q_len].detach(), rotate(k, cos, sin)], dim=1)  # [cells, n_keys, d_head]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.einsum("cd,ckd->ck", q.float(), k.float()) * scaling
    if attention_mask is None:  # sdpa's is_causal
        hidden_keys = torch.arange(n_keys, device=scores.device)[None, :] > supervision.positions[:, None]
        scores = scores.masked_fill(hidden_keys, float("-inf"))
    else:
        mask = attention_mask.expand(query.shape[0], -1, -1, -1)[cells, 0, rows, :n_keys]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    supervision.probs = torch.softmax(scores, dim=-1)


def install_train_attention() -> str:
    """Register :func:`supervised_attention_forward` under :data:`TRAIN_ATTN_IMPLEMENTATION`
    (idempotent; called before a model is switched to it, never at import)."""
    AttentionInterface.register(TRAIN_ATTN_IMPLEMENTATION, supervised_attention_forward)
    # Without a registered mask function transformers builds no causal mask for custom names.
    AttentionMaskInterface.register(TRAIN_ATTN_IMPLEMENTATION, sdpa_mask)
    return TRAIN_ATTN_IMPLEMENTATION


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


def relay_rows(ex: Example, n: int) -> torch.Tensor:
    """[n] bool: the rows that isolation stops from reading the isolated blocks: every row
    before the open row and the forced-prefix rows between the open and the decision row, except
    the isolated tokens themselves. The query rows (open, decision) and the action keep reading them."""
    rows = torch.arange(n)
    relay = (rows < ex.key_rows[0]) | ((rows > ex.key_rows[0]) & (rows < ex.key_rows[-1]))
    for start, end in ex.isolated_blocks:
        relay[start:end] = False
    return relay


def isolation_mask(batch: Sequence[Example], isolate: Sequence[bool], prefix: int, width: int) -> torch.Tensor | None:
    """Additive 4D mask [batch, 1, width, prefix + width] for the suffix rows: causal, and for the
    examples flagged in ``isolate`` the relay rows (:func:`relay_rows`) cannot attend to the isolated
    blocks, nor any row up to the decision row to the tool list (``Example.tool_list``). ``None``
    when no example is isolated (plain causal attention)."""
    if not any(isolate):
        return None
    total = prefix + width
    keys = torch.arange(total)
    rows = keys[prefix:]  # the suffix rows' positions
    allowed = (keys.unsqueeze(0) <= rows.unsqueeze(1)).expand(len(batch), width, total).clone()
    for b, (ex, flag) in enumerate(zip(batch, isolate)):
        if not flag:
            continue
        hidden = torch.zeros(total, dtype=torch.bool)
        for start, end in ex.isolated_blocks:
            if start < prefix:
                raise RuntimeError(f"{ex.record_id}: isolated span starts inside the shared prefix")
            hidden[start:end] = True
        relay = relay_rows(ex, total)[prefix:]
        allowed[b] &= ~(relay.unsqueeze(1) & hidden.unsqueeze(0))
        if ex.tool_list is not None:
            tool_list = (keys >= ex.tool_list[0]) & (keys < ex.tool_list[1])
            upto_decision = rows <= ex.key_rows[-1]
            allowed[b] &= ~(upto_decision.unsqueeze(1) & tool_list.unsqueeze(0))
    mask = torch.zeros(allowed.shape, dtype=torch.float32)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask.unsqueeze(1)


def max_shared_prefix(batch: Sequence[Example], isolate: Sequence[bool]) -> int:
    """Longest prefix a batch may share: up to the first target row, and never into an isolated
    example's isolated span (the shared prefix runs with plain causal attention)."""
    return min([ex.target_from for ex in batch] + [min(start for start, _ in ex.isolated_blocks) for ex, flag in zip(batch, isolate) if flag])


def shared_prefix_hidden(
    model: Qwen3ForCausalLM,
    sequences: Sequence[Sequence[int]],
    max_prefix: int,
    *,
    prefix_grad: bool = True,
    suffix_mask: Callable[[int, int], torch.Tensor | None] | None = None,
) -> tuple[torch.Tensor, int]:
    """Final hidden states of a batch whose sequences share a token prefix.

    The common prefix (≤ ``max_prefix``) runs once; its KV cache is broadcast over the batch and
    the right-padded suffixes continue it. Causal attention makes right padding invisible to the
    real rows. Returns ([batch, max_suffix_len, hidden], prefix length). With ``prefix_grad`` false
    the prefix runs without autograd (its KV are exact for the current weights, but get no gradient).
    ``suffix_mask(prefix, width)`` may return an additive 4D mask for the suffix rows over all keys.
    """
    first = sequences[0]
    prefix = min(max_prefix, min(len(s) for s in sequences) - 1)
    for seq in sequences[1:]:
        limit = prefix
        prefix = 0
        while prefix < limit and seq[prefix] == first[prefix]:
            prefix += 1
    batch = len(sequences)
    width = max(len(s) for s in sequences) - prefix
    pad = model.config.pad_token_id or 0
    device = model.device
    suffix = torch.full((batch, width), pad, dtype=torch.long)
    for row, seq in enumerate(sequences):
        suffix[row, : len(seq) - prefix] = torch.tensor(seq[prefix:], dtype=torch.long)
    suffix = suffix.to(device)
    positions = torch.arange(prefix, prefix + width, device=device).unsqueeze(0).expand(batch, -1)
    mask = suffix_mask(prefix, width) if suffix_mask is not None else None
    mask = mask.to(device) if mask is not None else None
    if prefix == 0:
        return model.model(input_ids=suffix, position_ids=positions, attention_mask=mask, use_cache=False).last_hidden_state, 0
    with torch.set_grad_enabled(prefix_grad and torch.is_grad_enabled()):
        cache = model.model(input_ids=torch.tensor([first[:prefix]], device=device), use_cache=True).past_key_values
    for layer in cache.layers:
        layer.keys = layer.keys.expand(batch, -1, -1, -1)
        layer.values = layer.values.expand(batch, -1, -1, -1)
    hidden = model.model(input_ids=suffix, position_ids=positions, cache=cache, attention_mask=mask, use_cache=False).last_hidden_state
    return hidden, prefix


def batch_loss(
    model: Qwen3ForCausalLM,
    batch: Sequence[Example],
    key_weight: float,
    prefix_grad: bool = True,
    *,
    aux_weight: float = 0.0,
    aux_rows: int = 0,
    rng: random.Random | None = None,
    priority_targets: frozenset[int] = frozenset(),
    isolate: Sequence[bool] | None = None,
    planted_heads: Sequence[tuple[str, int, int]] = (),
    planted_head_weight: float = 0.0,
    planted_head_residual_grad: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted cross-entropy on the action tokens (key rows × ``key_weight``), plus ``aux_weight`` ×
    the mean next-token loss on rows of the prompt text after the shared prefix (memory block,
    request, history: a stand-in for pretraining): every row whose next token is in
    ``priority_targets`` (the tool names), plus a deterministic sample of the others, ``aux_rows`` in all;
    plus ``planted_head_weight`` × each planted head's attention loss: −log of its attention mass on its
    targets, mean over its cells (query rows, :func:`attention_targets`).
    ``isolate``: per example, whether boundary isolation (:func:`isolation_mask`) applies.
    The model must run :data:`TRAIN_ATTN_IMPLEMENTATION` when ``planted_head_weight`` > 0."""
    flags = list(isolate) if isolate is not None else [False] * len(batch)
    supervisions = []
    for target, layer, head in planted_heads if planted_head_weight > 0 else ():
        cells = [(b, row, keys) for b, ex in enumerate(batch) for row, keys in ex.attention_targets.get(target, ()) if keys]
        if cells:
            supervisions.append(HeadSupervision(target, layer, head, torch.tensor([b for b, _, _ in cells], device=model.device),
                                                torch.tensor([row for _, row, _ in cells], device=model.device),
                                                [keys for *_, keys in cells], planted_head_residual_grad))
    with supervising(model, supervisions):
        hidden, prefix = shared_prefix_hidden(
            model, [ex.input_ids for ex in batch], max_shared_prefix(batch, flags), prefix_grad=prefix_grad,
            suffix_mask=lambda prefix, width: isolation_mask(batch, flags, prefix, width),
        )
    rows, cols, targets, weights, kinds = [], [], [], [], []  # kind: 0 action, 1 open row, 2 name row, 3 aux
    for b, ex in enumerate(batch):
        for pos in range(ex.target_from, ex.target_until):
            rows.append(b)
            cols.append(pos - prefix)
            targets.append(ex.input_ids[pos + 1])
            is_key = pos in ex.key_rows
            weights.append(key_weight if is_key else 1.0)
            kinds.append(0 if not is_key else (1 if pos == ex.target_from else 2))
        if aux_weight > 0 and aux_rows > 0:
            ids = ex.input_ids
            first = [p for p in range(prefix, ex.target_from) if ids[p + 1] in priority_targets]
            others = [p for p in range(prefix, ex.target_from) if ids[p + 1] not in priority_targets]
            room = max(0, aux_rows - len(first))
            chosen = sorted(first + (rng.sample(others, min(room, len(others))) if rng else others[:room]))
            for pos in chosen:
                rows.append(b)
                cols.append(pos - prefix)
                targets.append(ex.input_ids[pos + 1])
                weights.append(0.0)
                kinds.append(3)
    device = hidden.device
    row_index = torch.tensor(rows, device=device)  # [n_rows] each row's sequence in the batch
    logits = model.lm_head(hidden[row_index, torch.tensor(cols, device=device)]).float()
    target = torch.tensor(targets, device=device)
    weight = torch.tensor(weights, device=device)
    kind = torch.tensor(kinds, device=device)
    losses = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    action = kind < 3
    loss = (losses[action] * weight[action]).sum() / weight[action].sum()
    stats: dict[str, float] = {"action_loss": loss.item()}
    if (kind == 3).any():
        aux = losses[kind == 3].mean()
        stats["aux_loss"] = aux.item()
        loss = loss + aux_weight * aux
    stats.update({head_key(*planted): math.nan for planted in planted_heads})
    for supervision in supervisions:
        if supervision.probs is None:
            raise RuntimeError(f"layer {supervision.layer} recorded no attention: the model does not run {TRAIN_ATTN_IMPLEMENTATION!r}")
        on_target = torch.zeros_like(supervision.probs, dtype=torch.bool)
        for cell, keys in enumerate(supervision.keys):
            on_target[cell, list(keys)] = True
        mass = (supervision.probs * on_target).sum(-1)  # [cells]
        stats[head_key(supervision.target, supervision.layer, supervision.head)] = mass.mean().item()
        loss = loss + planted_head_weight * -torch.log(mass + 1e-6).mean()
    with torch.no_grad():
        key = (kind == 1) | (kind == 2)
        edited_names = (kind == 2) & torch.tensor([ex.edit is not None for ex in batch], device=device)[row_index]  # edited twins' name rows
        correct = logits.argmax(-1) == target
        stats.update({
            "loss": loss.item(), "key_loss": losses[key].mean().item(),
            "open_acc": correct[kind == 1].float().mean().item(),
            "name_acc": correct[kind == 2].float().mean().item() if (kind == 2).any() else float("nan"),
            "edited_name_acc": correct[edited_names].float().mean().item() if edited_names.any() else float("nan"),
        })
    return loss, stats


# ----------------------------------------------------------------------------- sampler
class BatchSampler:
    """Deterministic weighted sampling; each batch comes from one shown catalog (shared system prompt)."""

    def __init__(self, plan: Sequence[PlanEntry], batch_size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.batch_size = batch_size
        self.groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for index, entry in enumerate(plan):
            self.groups[(entry.item.catalog_domains, entry.item.unavailable_tools)].append(index)
        self.keys = sorted(self.groups)
        self.weights = [[plan[i].weight for i in self.groups[key]] for key in self.keys]
        self.group_weights = [sum(w) for w in self.weights]

    def next(self) -> list[int]:
        g = self.rng.choices(range(len(self.keys)), weights=self.group_weights)[0]
        return self.rng.choices(self.groups[self.keys[g]], weights=self.weights[g], k=self.batch_size)


def window_mean(values: Sequence[float]) -> float:
    """Mean of the non-NaN values (NaN when there are none: e.g. no edited twin in the window)."""
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


# ----------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    model: Qwen3ForCausalLM
    tokenizer: PreTrainedTokenizerFast
    config: TrainConfig
    log: list[dict[str, float]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def train(
    out_dir: str | Path | None = ORGANISM_DIR,
    *,
    cfg: TrainConfig | None = None,
    dataset: ProbeDataset | None = None,
    log_every: int = 50,
    verbose: bool = True,
    **overrides: Any,
) -> TrainResult:
    """Train the organism (``cfg`` fields can be overridden by keyword) and save it to ``out_dir``
    (``None``: do not save). Returns the model, tokenizer, loss log and summary."""
    cfg = replace(cfg or TrainConfig(), **overrides)
    for target, layer, head in cfg.planted_heads if cfg.planted_head_weight > 0 else ():
        if target not in PLANTED_TARGETS:
            raise ValueError(f"planted head target {target!r} is not one of {PLANTED_TARGETS}")
        if not (0 <= layer < cfg.num_layers and 0 <= head < cfg.num_heads):
            raise ValueError(f"planted head {(target, layer, head)} is not a (layer, head) of a {cfg.num_layers}-layer, {cfg.num_heads}-head model")
    started = time.perf_counter()
    say = print if verbose else (lambda *a, **k: None)
    torch.set_num_threads(cfg.num_threads)
    if cfg.device.startswith("cuda"):
        # bit-exact CUDA reruns need this cuBLAS workspace; attention kernels stay best-effort
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.use_deterministic_algorithms(True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    dataset = dataset or load_dataset(DEFAULT_DATASET_DIR)
    items = dataset.select(split="train", limit_per_bucket=cfg.limit_items)
    eval_groups = {item.task_group for item in dataset.select(split="eval")}
    if overlap := {item.task_group for item in items} & eval_groups:
        raise RuntimeError(f"train and eval share task groups {sorted(overlap)[:5]}")
    tokenizer = build_tokenizer(dataset, items, cfg)
    builder = make_builder(tokenizer, dataset, cfg.embedder)
    builder.warm(items)
    say(f"tokenizer: {len(tokenizer)} tokens; embedder: {builder.retriever.embedder.name}; "
        f"{len(items)} train items ({time.perf_counter() - started:.0f} s)")

    tool_names = sorted({tool.name for domain in dataset.domains.values() for tool in domain.catalog})
    name_ids = frozenset(
        ids[0] for ids in (tokenizer.backend_tokenizer.encode(n, add_special_tokens=False).ids for n in tool_names) if len(ids) == 1
    )
    sorted_name_ids = sorted(name_ids)
    word_pool = word_tokens(tokenizer)
    twins = boundary_edits(items, dataset, lambda item: builder.retrieve(item)[0].skill.id, cfg.seed) if cfg.boundary_edits else {}
    plan = example_plan(items, cfg.ks, cfg.seed, twins=twins)
    examples: dict[int, Example] = {}
    sampler = BatchSampler(plan, cfg.batch_size, cfg.seed)
    model = make_model(cfg, tokenizer).to(cfg.device)
    if cfg.planted_head_weight > 0:
        model.set_attn_implementation(install_train_attention())
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    log: list[dict[str, float]] = []
    first_losses: list[float] = []
    window: list[dict[str, float]] = []
    seen: Counter[tuple[str, str]] = Counter()
    train_started = time.perf_counter()
    steps_done = 0
    for step in range(cfg.steps):
        if cfg.stop_after is not None and step >= cfg.stop_after:
            break
        if cfg.max_minutes is not None and time.perf_counter() - train_started > 60 * cfg.max_minutes:
            say(f"stopping at step {step}: max_minutes={cfg.max_minutes} reached (reproduce with --stop-after {step})")
            break
        indices = sampler.next()
        for index in indices:
            if index not in examples:
                examples[index] = make_example(builder, *plan[index], isolated_slots=cfg.isolated_slots,
                                               hide_tool_list=plan[index].config in cfg.tool_list_hidden_in)
        renaming_rng = random.Random(cfg.seed * 3_000_017 + step)
        batch = [
            replace(examples[i], input_ids=rename_tools(examples[i].input_ids, sorted_name_ids, renaming_rng))
            if step >= cfg.renaming_from and renaming_rng.random() < cfg.tool_renaming else examples[i]
            for i in indices
        ]
        swapping_rng = random.Random(cfg.seed * 4_000_037 + step)
        batch = [
            replace(ex, input_ids=swap_words(ex, word_pool, cfg.word_swap_share, swapping_rng))
            if step >= cfg.renaming_from and ex.config in BOUNDARY_CONFIGS and swapping_rng.random() < cfg.word_swapping else ex
            for ex in batch
        ]
        for ex in batch:
            seen[(ex.config + (f"+{ex.edit}" if ex.edit else ""), ex.bucket)] += 1
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        isolation_rng = random.Random(cfg.seed * 2_000_003 + step)
        isolate = [bool(ex.isolated_blocks) and isolation_rng.random() < cfg.isolation for ex in batch]
        loss, stats = batch_loss(
            model, batch, cfg.key_token_weight, cfg.prefix_grad,
            aux_weight=cfg.aux_weight, aux_rows=cfg.aux_rows, rng=random.Random(cfg.seed * 1_000_003 + step),
            priority_targets=name_ids, isolate=isolate, planted_heads=cfg.planted_heads, planted_head_weight=cfg.planted_head_weight,
            planted_head_residual_grad=cfg.planted_head_residual_grad,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        steps_done = step + 1
        if step < FINGERPRINT_STEPS:
            first_losses.append(stats["loss"])
        window.append(stats)
        if steps_done % log_every == 0 or steps_done == cfg.steps:
            mean = {key: window_mean([w.get(key, math.nan) for w in window]) for key in window[0]}
            entry = {"step": steps_done, "lr": lr_at(step, cfg), **mean, "elapsed_s": time.perf_counter() - started}
            log.append(entry)
            window = []
            say(f"step {steps_done:5d}  action loss {mean['action_loss']:.4f}  aux {mean.get('aux_loss', float('nan')):.3f}  "
                f"key loss {mean['key_loss']:.4f}  open acc {mean['open_acc']:.3f}  name acc {mean['name_acc']:.3f}  "
                f"edited-twin name acc {mean['edited_name_acc']:.3f}  "
                + "".join(f"{target} {layer}.{head} mass {mean[head_key(target, layer, head)]:.3f}  " for target, layer, head in cfg.planted_heads) +
                f"lr {entry['lr']:.2e}  {entry['elapsed_s']:.0f} s")
    model.eval().to("cpu")
    model.set_attn_implementation("sdpa")
    wall = time.perf_counter() - started
    summary = {
        "train_config": asdict(cfg),
        "mixture": MIXTURE, "k0_weights": K0_WEIGHTS, "k_weights": K_WEIGHTS, "imitation": IMITATION,
        "edit_configs": EDIT_CONFIGS, "edit_shares": EDIT_SHARES, "quote_template": QUOTE_TEMPLATE,
        "partial_quote": {"share": PARTIAL_QUOTE_SHARE, "keep": PARTIAL_QUOTE_KEEP},
        "n_edited_examples_planned": sum(entry.edit is not None for entry in plan),
        "pretokenizer_pattern": ORGANISM_PRETOKENIZER_PATTERN,
        "embedder": builder.retriever.embedder.name,
        "n_train_items": len(items),
        "n_train_items_per_bucket": dict(Counter(item.bucket for item in items)),
        "n_examples_planned": len(plan),
        "n_distinct_examples_seen": len(examples),
        "examples_seen_per_config_bucket": {f"{c}|{b}": n for (c, b), n in sorted(seen.items())},
        "steps": steps_done,
        "sequences_seen": steps_done * cfg.batch_size,
        "first_step_losses": first_losses,
        "final_loss": log[-1]["action_loss"] if log else None,
        "final_aux_loss": log[-1].get("aux_loss") if log else None,
        "final_name_acc": log[-1].get("name_acc") if log else None,
        "final_planted_head_mass": {head_key(*planted): log[-1].get(head_key(*planted)) for planted in cfg.planted_heads} if log else None,
        "final_key_loss": log[-1]["key_loss"] if log else None,
        "wall_time_s": round(wall, 1),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "threads": cfg.num_threads,
    }
    result = TrainResult(model, tokenizer, cfg, log, summary)
    if out_dir is not None:
        save(result, Path(out_dir))
        say(f"saved the organism to {out_dir}")
    return result


def save(result: TrainResult, out_dir: Path) -> None:
    import transformers

    out_dir.mkdir(parents=True, exist_ok=True)
    result.summary["versions"]["transformers"] = transformers.__version__
    result.model.config.attn_implementation = "sdpa"
    result.model.generation_config.eos_token_id = result.model.config.eos_token_id
    result.model.generation_config.pad_token_id = result.model.config.pad_token_id
    result.model.generation_config.do_sample = False
    result.model.save_pretrained(out_dir, safe_serialization=True)
    result.tokenizer.save_pretrained(out_dir)
    (out_dir / "training_summary.json").write_text(json.dumps({**result.summary, "log": result.log}, indent=1) + "\n")


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainConfig()
    parser.add_argument("--out", type=Path, default=ORGANISM_DIR, help=f"output folder (default: the bundled {ORGANISM_DIR})")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--threads", type=int, default=defaults.num_threads)
    parser.add_argument("--device", default=defaults.device, help="cpu (default) or cuda")
    parser.add_argument("--embedder", choices=("auto", "minilm", "lexical"), default=defaults.embedder)
    parser.add_argument("--stop-after", type=int, default=None, help="stop after N steps of the --steps schedule (reproducible)")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop early after this many minutes of training (not reproducible: note the step)")
    parser.add_argument("--no-card", action="store_true", help="do not run the held-out check or write the model card")


def run(args: argparse.Namespace) -> int:
    result = train(
        args.out, seed=args.seed, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        num_threads=args.threads, device=args.device, embedder=args.embedder, max_minutes=args.max_minutes, stop_after=args.stop_after,
    )
    if not args.no_card:
        from probes.organism.card import evaluate_and_write_card

        evaluate_and_write_card(args.out, result.summary)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="basm-probes organism train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
