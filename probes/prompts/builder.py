"""Prompt builder: decision prompts with k retrieved skills, exact token spans and scored candidates.

For one item, configuration and depth k the builder

1. retrieves the top-k skills (Eq. 8–9; ``retrieval="oracle"``: the item's defining skill moved to
   rank R, :func:`probes.data.retrieval.oracle_order`) and formats the memory block (Eq. 10): the procedural
   slots always, boundary slots per configuration, gated by r_B > γ and compressed to β tokens;
2. renders the conversation through the tokenizer's real chat template (tool schemas passed to
   templates that support them, written into the system message for templates that do not);
3. tokenizes with offsets and maps every slot's character span to a half-open token span;
4. tokenizes every candidate continuation *in context* and flags shared first tokens.

Decision formats
----------------
``native``   Qwen3 ``<tool_call>`` JSON. The prompt ends with the forced prefix
             ``<tool_call>\\n{"name": "``; the decision token is the first token of the function
             name. Abstention is "not opening a tool call", scored at ``open_index`` (the last
             token of the generation prompt) against the first token of the forced prefix.
``prompted`` BFCL prompting-mode style: the answer is ``func_name(params)`` or a plain-text
             refusal, both starting at the first answer token, so Eq. 1 applies directly.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from probes.core.chat import TemplateSupport
from probes.prompts.record import Candidate, PromptRecord, SkillEntry, SlotSpan, Spans, record_id
from probes.data.configs import MemoryConfig, get_config
from probes.data.chat_tokens import token_pattern
from probes.data.dataset import ABSTAIN, Item, ProbeDataset, default_study, is_organism, refuse_chat_tokens
from probes.data.retrieval import RETRIEVAL_MODES, Retriever, ScoredSkill, check_relevance, make_embedder, oracle_order
from probes.data.schema import BOUNDARY_SLOTS, SLOT_LABELS, ToolCatalog
from probes.prompts.lengths import cut_to_tokens, length_trials
from probes.prompts.priming import ToolMentionRewriter
from probes.prompts.spans import tokens_overlapping
from probes.prompts.tokenizers import special_token_strings

FORMATS: tuple[str, ...] = ("native", "prompted")
NATIVE_FORCED_PREFIX = '<tool_call>\n{"name": "'
ABSTAIN_TEXT = "None of the available functions can be used for this request."
USER_PLACEHOLDER = "@@basm-user-turn@@"
REQUEST_HEADER = "\n\n# Current request\n"
SYSTEM_INSTRUCTION = (
    "You are a careful tool-use agent. Decide the single next action for the user's request "
    "using the available functions."
)
PROMPTED_INSTRUCTION = (
    "You are given a question and a set of possible functions. Based on the question, make the one "
    "function call that achieves the purpose. If none of the functions can be used, point it out "
    'with a reply that starts with "None of the available functions". If you decide to invoke a '
    "function, you MUST put it in the format of func_name(params_name1=params_value1, "
    "params_name2=params_value2...). You SHOULD NOT include any other text in the response.\n"
    "Here is a list of functions in JSON format that you can invoke.\n"
)
# Written into the system message for chat templates without tool support (copied from Qwen3's).
TOOLS_BLOCK_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_BLOCK_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)
FILLER_SOURCE = (
    "The afternoon light moved slowly across the quiet room while the clock on the wall kept its "
    "steady rhythm. A few clouds drifted over the distant hills and the river carried small leaves "
    "toward the old stone bridge. Nothing in particular happened, and the day continued calmly. "
)

CONTROL_LABELS = {"filler": "\nNotes:\n", "procedure": "\nAdditional steps:\n"}

# The retrieval depths, each defined here once and imported wherever it is a default.
DEFAULT_K_MAX = 2  # the paper's focus depth: analyses at one depth (k = k_max), show's --k, the card's gate, session.prompt's k
SWEEP_K_MAX = 4  # the depth sweeps k = 0..K: sweep, linear, calls, paired, build (and the builder's settings)

@dataclass(frozen=True)
class BuildSettings:
    """Knobs of the builder; recorded verbatim in every results file."""

    k_max: int = SWEEP_K_MAX
    gamma: float = 0.0  # boundary fields of a skill are exposed iff r_B(x, s) > γ
    relevance: str = "lexical"  # r_B's measure: "lexical" (content-word overlap) or "semantic" (embedding cosine)
    beta: int = 384  # boundary-token budget per prompt (Compress_β of Eq. 10)
    enable_thinking: bool = False
    retrieval: str = "ranked"  # which skills are shown: "ranked" (Eq. 8's top k) or "oracle" (the defining skill at rank oracle_rank)
    oracle_rank: int = 1  # the defining skill's rank under "oracle" (at k < oracle_rank it is not shown)

    def __post_init__(self) -> None:
        if self.retrieval not in RETRIEVAL_MODES:
            raise ValueError(f"retrieval must be one of {RETRIEVAL_MODES}, got {self.retrieval!r}")
        if isinstance(self.oracle_rank, bool) or not isinstance(self.oracle_rank, int) or self.oracle_rank < 1:
            raise ValueError(f"oracle_rank must be an integer >= 1, got {self.oracle_rank!r}")

    @property
    def retrieval_mode(self) -> str:
        """The retrieval as rows and records name it: ``ranked`` or ``oracle@R``."""
        return self.retrieval if self.retrieval == "ranked" else f"oracle@{self.oracle_rank}"


@dataclass
class _Segment:
    text: str
    rank: int | None = None  # skill rank (1-based); None for the block header
    slot: str | None = None  # schema slot, or "control" for an equal-length control section
    body: bool = False  # slot content (spanned) rather than its label or separators


@dataclass
class _MemoryBlock:
    segments: list[_Segment] = field(default_factory=list)
    rewriter: ToolMentionRewriter | None = None  # the priming configurations' boundary rewrite

    def add(self, text: str, rank: int | None = None, slot: str | None = None, body: bool = False) -> None:
        self.segments.append(_Segment(text, rank, slot, body))

    @property
    def text(self) -> str:
        return "".join(segment.text for segment in self.segments)

    def char_ranges(self, start: int, select) -> dict[tuple[int, str], list[int]]:
        """Character range [first, last) per (rank, slot) of the segments ``select`` keeps."""
        ranges: dict[tuple[int, str], list[int]] = {}
        cursor = start
        for segment in self.segments:
            if select(segment):
                ranges.setdefault((segment.rank, segment.slot), [cursor, cursor])[1] = cursor + len(segment.text)
            cursor += len(segment.text)
        return ranges


class PromptBuilder:
    """Builds typed prompt records (:class:`~probes.prompts.record.PromptRecord`, see ``docs/prompt_records.md``) for items × configs × k × format."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        dataset: ProbeDataset,
        retriever: Retriever,
        settings: BuildSettings = BuildSettings(),
        *,
        tokenizer_name: str = "",
    ) -> None:
        if not tokenizer.is_fast:
            raise ValueError("a fast (Rust) tokenizer with offset mapping is required")
        check_relevance(settings.relevance, retriever.embedder)
        self.tokenizer = tokenizer
        self.dataset = dataset
        self.retriever = retriever
        self.settings = settings
        self.tokenizer_name = tokenizer_name or getattr(tokenizer, "name_or_path", "")
        self.template = TemplateSupport(tokenizer)
        if (pattern := token_pattern(special_token_strings(tokenizer))) is not None:
            refuse_chat_tokens(dataset, dataset.chat_tokens(pattern), f"a control token of the tokenizer {self.tokenizer_name!r}")
        self._backend = tokenizer.backend_tokenizer
        added = tokenizer.added_tokens_decoder
        plain = all(not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added.values())
        self._added_ids = {token.content: token_id for token_id, token in added.items()}
        self._added_pattern = (
            re.compile("|".join(re.escape(c) for c in sorted(self._added_ids, key=len, reverse=True)))
            if plain and added else None
        )
        self._piece_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._render_cache: dict[tuple[str, str], str] = {}
        self._continuation_cache: dict[tuple[str, str, int | None], tuple[list[int], bool]] = {}
        self._special_ids = frozenset(tokenizer.all_special_ids) | frozenset(tokenizer.added_tokens_decoder)
        self._token_count_cache: dict[str, int] = {}
        self._retrieval_cache: dict[str, list[ScoredSkill]] = {}
        self._order_cache: dict[str, list[ScoredSkill]] = {}
        self._control_sources: dict[tuple, list[str]] = {}
        self._control_plans: dict[tuple, tuple[int, dict[int, int]]] = {}
        # every tool of every domain: a boundary item can name a tool outside the item's catalog
        self._all_tool_names = tuple(sorted({tool.name for domain in dataset.domains.values() for tool in domain.catalog}))

    # ------------------------------------------------------------------ retrieval
    def retrieve(self, item: Item) -> list[ScoredSkill]:
        """All retrievable skills for ``item`` ranked by Eq. 8 (cached per item)."""
        if item.id not in self._retrieval_cache:
            self._retrieval_cache[item.id] = self.retriever.retrieve(item, self.dataset)
        return self._retrieval_cache[item.id]

    def ordered(self, item: Item) -> list[ScoredSkill]:
        """The skills in the order prompts show them: the Eq. 8 ranking (``ranked``), or with the
        item's defining skill moved to rank ``oracle_rank`` (``oracle``); depth k shows the first k."""
        if item.id not in self._order_cache:
            ranked = self.retrieve(item)
            self._order_cache[item.id] = (ranked if self.settings.retrieval == "ranked"
                                          else oracle_order(ranked, item.tempting_skill, self.settings.oracle_rank))
        return self._order_cache[item.id]

    def warm(self, items: Sequence[Item]) -> None:
        """Embed all states and skills in one batch before building."""
        self.retriever.warm([item.state_text for item in items], self.dataset.skills.values(),
                            boundary=self.settings.relevance == "semantic")

    # ------------------------------------------------------------------ memory block
    def _count_tokens(self, text: str) -> int:
        if text not in self._token_count_cache:
            self._token_count_cache[text] = len(self._backend.encode(text, add_special_tokens=False).ids)
        return self._token_count_cache[text]

    def _boundary_plan(self, item: Item, retrieved: Sequence[ScoredSkill], config: MemoryConfig) -> list[dict[str, tuple[str, ...]]]:
        """Per retrieved skill, the boundary items to show (after gate γ and budget β when gated)."""
        shown_slots = [slot for slot in config.slots if slot in BOUNDARY_SLOTS]
        plan: list[dict[str, tuple[str, ...]]] = []
        budget = self.settings.beta
        for entry in retrieved:
            slots: dict[str, tuple[str, ...]] = {}
            exposed = not config.gated or self.retriever.boundary_relevance(item.state_text, entry.skill, self.settings.relevance) > self.settings.gamma
            for slot in shown_slots if exposed else ():
                kept = []
                for text in entry.skill.slot_items(slot):
                    cost = self._count_tokens(text)
                    if config.gated:
                        if cost > budget:
                            continue
                        budget -= cost
                    kept.append(text)
                if kept:
                    slots[slot] = tuple(kept)
            plan.append(slots)
        return plan

    def _memory_block(
        self, item: Item, retrieved: Sequence[ScoredSkill], config: MemoryConfig, control_tokens: dict[int, int] | None = None
    ) -> _MemoryBlock:
        """Eq. 10's ρ(x). With ``control_tokens`` (rank → token count), each exposed boundary
        section is replaced by an equal-length control section of the configuration's kind."""
        block = _MemoryBlock()
        if not retrieved or not config.slots:
            return block
        # The priming rewrites apply to the items BASM shows (gate and budget on the original text).
        rewriter = block.rewriter = ToolMentionRewriter(config.rewrite, self._all_tool_names) if config.rewrite else None
        plan = self._boundary_plan(item, retrieved, config)
        block.add("# Retrieved skills\nThese skills were distilled from past successful tasks.")
        for rank, (entry, boundary) in enumerate(zip(retrieved, plan), start=1):
            skill = entry.skill
            block.add(f"\n\n## Skill {rank}\n{SLOT_LABELS['goal']}: ", rank)
            block.add(skill.goal, rank, "goal", body=True)
            block.add(f"\n{SLOT_LABELS['procedure']}:\n1. ", rank)
            for index, step in enumerate(skill.procedure):
                if index:
                    block.add(f"\n{index + 1}. ", rank, "procedure", body=True)
                block.add(step, rank, "procedure", body=True)
            block.add(f"\n{SLOT_LABELS['tools']}: ", rank)
            block.add(", ".join(skill.tool_names), rank, "tools", body=True)
            if control_tokens is not None:
                if rank in control_tokens:
                    label = CONTROL_LABELS[config.control]
                    body_tokens = control_tokens[rank] - self._count_tokens(label)
                    block.add(label, rank, "control")
                    block.add(self._control_text(config.control, body_tokens, item, retrieved, rank), rank, "control", body=True)
                continue
            for slot in BOUNDARY_SLOTS:
                items = boundary.get(slot, ())
                if rewriter:
                    items = tuple(text for text in map(rewriter.rewrite, items) if text is not None)
                if not items:
                    continue
                block.add(f"\n{rewriter.label(SLOT_LABELS[slot]) if rewriter else SLOT_LABELS[slot]}:\n- ", rank, slot)
                for index, text in enumerate(items):
                    if index:
                        block.add("\n- ", rank, slot, body=True)
                    block.add(text, rank, slot, body=True)
        return block

    # ------------------------------------------------------------------ rendering
    def _messages(self, item: Item, user: str, fmt: str, catalog: ToolCatalog) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        schemas = [tool.as_function_schema() for tool in catalog]
        system = SYSTEM_INSTRUCTION
        native_tools = fmt == "native" and self.template.tools
        if fmt == "prompted":
            system = PROMPTED_INSTRUCTION + json.dumps([schema["function"] for schema in schemas]) + "\n\n" + system
        elif not native_tools:
            system = system + "\n\n" + TOOLS_BLOCK_HEADER + "".join("\n" + json.dumps(s) for s in schemas) + TOOLS_BLOCK_FOOTER
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        messages += self._conversation(item.context, fmt, native_tools)
        messages.append({"role": "user", "content": user})
        messages += self._conversation(item.history, fmt, native_tools)
        return messages, (schemas if native_tools else None)

    @staticmethod
    def _conversation(messages: Sequence[Any], fmt: str, native_tools: bool) -> list[dict[str, Any]]:
        """Chat messages for earlier turns (``item.context``) or the current turn's calls (``item.history``)."""
        out: list[dict[str, Any]] = []
        for message in messages:
            call_or_result = message.get("tool_call")
            if message["role"] == "user":
                out.append({"role": "user", "content": message["content"]})
            elif native_tools:
                if call_or_result:
                    out.append({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": dict(call_or_result)}]})
                else:
                    out.append({"role": "tool", "name": message["name"], "content": message["content"]})
            elif call_or_result:
                text = (
                    f"{call_or_result['name']}({', '.join(f'{k}={json.dumps(v)}' for k, v in call_or_result.get('arguments', {}).items())})"
                    if fmt == "prompted"
                    else f"<tool_call>\n{json.dumps(dict(call_or_result))}\n</tool_call>"
                )
                out.append({"role": "assistant", "content": text})
            else:
                out.append({"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"})
        return out

    def _render_with_user(self, item: Item, fmt: str, catalog: ToolCatalog, user: str) -> str:
        """Render once per (item, format) with a placeholder user turn, then substitute the text.

        The substitution is checked against a direct rendering the first time, so a template
        that transforms message content fails loudly instead of producing a different prompt."""
        key = (item.id, fmt)
        template = self._render_cache.get(key)
        if template is None:
            template = self._render(*self._messages(item, USER_PLACEHOLDER, fmt, catalog))
            direct = self._render(*self._messages(item, user, fmt, catalog))
            if template.count(USER_PLACEHOLDER) != 1 or template.replace(USER_PLACEHOLDER, user) != direct:
                raise ValueError("the chat template transforms the user message; its prompts cannot be spanned exactly")
            self._render_cache[key] = template
        return template.replace(USER_PLACEHOLDER, user)

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools is not None:
            kwargs["tools"] = tools
        if self.template.thinking_switch:
            kwargs["enable_thinking"] = self.settings.enable_thinking
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def _encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        # The Rust backend directly: identical ids/offsets to tokenizer(text, add_special_tokens=False)
        # (checked in the tests) without the Python wrapper's per-call overhead.
        encoding = self._backend.encode(text, add_special_tokens=False)
        return np.asarray(encoding.ids, dtype=np.int64), np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)

    def _tokenize(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Tokenize ``text`` piecewise between added special tokens, reusing cached pieces.

        HF tokenizers cut the text at added tokens before normalisation and pre-tokenisation, so
        the pieces are tokenized independently; caching them makes the shared system turn and
        history free after their first use. Falls back to one call when the added tokens have
        strip/word flags that make the cut context-dependent.
        """
        if self._added_pattern is None:
            return self._encode(text)
        id_pieces: list[np.ndarray] = []
        offset_pieces: list[np.ndarray] = []
        cursor = 0
        for match in [*self._added_pattern.finditer(text), None]:
            end = match.start() if match else len(text)
            if end > cursor:
                piece = text[cursor:end]
                cached = self._piece_cache.get(piece)
                if cached is None:
                    cached = self._piece_cache[piece] = self._encode(piece)
                id_pieces.append(cached[0])
                offset_pieces.append(cached[1] + cursor)
            if match:
                id_pieces.append(np.asarray([self._added_ids[match.group()]], dtype=np.int64))
                offset_pieces.append(np.asarray([match.span()], dtype=np.int64))
                cursor = match.end()
        if not id_pieces:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.int64)
        return np.concatenate(id_pieces), np.concatenate(offset_pieces)

    # ------------------------------------------------------------------ candidates
    def _continuation_ids(self, ids: np.ndarray, offsets: np.ndarray, text: str, anchor: int, continuation: str, stop_char: int | None) -> tuple[list[int], bool]:
        """Token ids of ``continuation`` after ``text[:offsets[anchor][1]]``, tokenized in context.

        Tokenization restarts at the last special token at or before ``anchor``: HF tokenizers split
        special tokens out before pre-tokenization, so the text before it cannot interact with what
        follows. Returns (ids, boundary_merge) where boundary_merge is true when the in-context
        tokenization changed tokens of the prompt itself (a BPE merge across the boundary).
        ``stop_char`` keeps only tokens up to the one containing that continuation character.
        """
        restart = next((i for i in range(anchor, -1, -1) if ids[i] in self._special_ids), 0)
        prefix_end = offsets[anchor][1]
        tail_start = offsets[restart][0]
        key = (text[tail_start:prefix_end], continuation, stop_char)
        if key not in self._continuation_cache:
            self._continuation_cache[key] = self._tokenize_continuation(ids[restart : anchor + 1], *key)
        return self._continuation_cache[key]

    def _tokenize_continuation(self, expected: np.ndarray, prefix: str, continuation: str, stop_char: int | None) -> tuple[list[int], bool]:
        tail_ids, tail_offsets = self._tokenize(prefix + continuation)
        shared = min(len(expected), len(tail_ids))
        differs = np.flatnonzero(tail_ids[:shared] != expected[:shared])
        common = int(differs[0]) if len(differs) else shared
        merge = common < len(expected)
        cont_ids, cont_offsets = tail_ids[common:], tail_offsets[common:]
        if stop_char is not None:
            cont_ids = cont_ids[cont_offsets[:, 0] <= len(prefix) + stop_char]
        return [int(token) for token in cont_ids], merge

    def _candidates(self, item: Item, fmt: str, ids: np.ndarray, offsets: np.ndarray, text: str, open_index: int | None, catalog: ToolCatalog) -> list[Candidate]:
        decision = len(ids) - 1
        wrong = set(item.wrong_tools)
        entries: list[tuple[str, str]] = [("correct", item.correct_action)]
        entries += [("wrong", name) for name in item.wrong_tools]
        if item.correct_action != ABSTAIN:
            entries.append(("abstain", ABSTAIN))
        entries += [("other", name) for name in catalog.names if name != item.correct_action and name not in wrong]
        candidates = []
        for role, action in entries:
            if action == ABSTAIN:
                anchor = open_index if fmt == "native" else decision
                continuation, stop_char = ABSTAIN_TEXT, None
            elif fmt == "native":
                anchor, continuation, stop_char = decision, action + '", "arguments": {', len(action)
            else:
                anchor, continuation, stop_char = decision, action + "(", len(action)
            token_ids, merge = self._continuation_ids(ids, offsets, text, anchor, continuation, stop_char)
            candidates.append(Candidate(
                role=role, action=action, anchor_index=anchor,
                text=continuation if stop_char is None else continuation[: stop_char + 1],
                token_ids=token_ids, first_token_id=token_ids[0], boundary_merge=merge,
            ))
        return [
            dataclasses.replace(candidate, collides_with=sorted(
                other.action for other in candidates
                if other.action != candidate.action
                and other.anchor_index == candidate.anchor_index
                and other.first_token_id == candidate.first_token_id
            ))
            for candidate in candidates
        ]

    # ------------------------------------------------------------------ equal-length controls
    def _control_words(self, kind: str, item: Item, retrieved: Sequence[ScoredSkill], rank: int) -> list[str]:
        """Source words of a control section. Trailing punctuation is dropped: punctuation merges
        with the following newline into one token, which would make in-context counts parity-bound."""
        if kind == "filler":
            text = FILLER_SOURCE
        else:
            shown = {entry.skill.id for entry in retrieved}
            others = [s for s in self.dataset.library_for(item) if s.id not in shown] or [e.skill for e in retrieved]
            start = rank % len(others)
            text = " ".join(step for skill in others[start:] + others[:start] for step in skill.procedure)
        return [word.rstrip(".,;:!?") for word in text.split() if word.rstrip(".,;:!?")]

    def _control_text(self, kind: str, n_tokens: int, item: Item, retrieved: Sequence[ScoredSkill], rank: int) -> str:
        """Neutral filler or extra procedure text of ``n_tokens`` tokens (standalone) where possible.

        The source is cut at the character where its token count reaches ``n_tokens`` (binary
        search, then a scan of nearby cuts).
        """
        if n_tokens <= 0:
            return ""
        key = (kind, item.id, tuple(entry.skill.id for entry in retrieved), rank)
        words = self._control_sources.get(key)
        if words is None:
            words = self._control_sources[key] = self._control_words(kind, item, retrieved, rank)
        while self._count_tokens(" ".join(words)) < n_tokens + 8:
            words = self._control_sources[key] = words + words
        source = " ".join(words)

        def count(text: str) -> int:  # uncached: prefixes are one-off strings
            return len(self._backend.encode(text, add_special_tokens=False).ids)

        return cut_to_tokens(source, n_tokens, count)

    # ------------------------------------------------------------------ records
    def _assemble(self, item: Item, block: _MemoryBlock, fmt: str) -> dict[str, Any]:
        catalog = self.dataset.catalog_for(item)
        # The memory block opens the user turn: the system turn (instruction + tool schemas) then
        # stays identical across configurations and k, and its tokens are reused from the cache.
        user = block.text + REQUEST_HEADER + item.user if block.text else item.user
        rendered = self._render_with_user(item, fmt, catalog, user)
        text = rendered + (NATIVE_FORCED_PREFIX if fmt == "native" else "")
        ids, offsets = self._tokenize(text)
        open_index = None
        if fmt == "native":
            # the generation prompt must end on a token boundary, else the forced prefix merged into it
            open_index = int(np.searchsorted(offsets[:, 1], len(rendered), side="left"))
            if open_index >= len(offsets) - 1 or offsets[open_index, 1] != len(rendered):
                raise ValueError(f"{item.id}: the forced tool-call prefix merged with the end of the generation prompt")
        memory_start = rendered.find(user)
        if rendered.count(user) != 1:
            raise ValueError(f"{item.id}: the user message does not occur exactly once in the rendered prompt")
        return {
            "text": text, "input_ids": ids.tolist(), "offsets": offsets, "open_index": open_index,
            "memory_start": memory_start, "memory_end": memory_start + len(block.text), "catalog": catalog,
        }

    def _slot_spans(self, block: _MemoryBlock, assembled: dict[str, Any]) -> list[dict[str, Any]]:
        """Per (rank, slot): character and token spans of the slot body in the final prompt."""
        ranges = block.char_ranges(assembled["memory_start"], lambda segment: segment.body)
        out = []
        for (rank, slot), (start, end) in sorted(ranges.items(), key=lambda kv: kv[1][0]):
            lo, hi = tokens_overlapping(assembled["offsets"], start, end)
            out.append({"rank": rank, "slot": slot, "char_span": (start, end), "token_span": (lo, hi), "text": assembled["text"][start:end]})
        return out

    def _record(self, item: Item, config: MemoryConfig, k: int, fmt: str, retrieved: Sequence[ScoredSkill], block: _MemoryBlock,
                assembled: dict[str, Any], depth_skills: Sequence[ScoredSkill]) -> PromptRecord:
        ids: list[int] = assembled["input_ids"]
        slot_spans = self._slot_spans(block, assembled)
        spans: Spans = {}
        if assembled["memory_end"] > assembled["memory_start"]:
            # The whole memory block (labels and skill text): where the neutral random control draws.
            spans["memory"] = [tokens_overlapping(assembled["offsets"], assembled["memory_start"], assembled["memory_end"])]
        for entry in slot_spans:
            spans.setdefault(entry["slot"], []).append(entry["token_span"])
            if entry["slot"] in BOUNDARY_SLOTS or entry["slot"] == "control":
                spans.setdefault("boundary", []).append(entry["token_span"])
        slots_by_rank: dict[int, dict[str, SlotSpan]] = {}
        for entry in slot_spans:
            slots_by_rank.setdefault(entry["rank"], {})[entry["slot"]] = SlotSpan(entry["text"], entry["char_span"], entry["token_span"])
        skills = []
        for rank, entry in enumerate(retrieved, start=1):
            slots = slots_by_rank.get(rank, {})
            skills.append(SkillEntry(
                skill_id=entry.skill.id, rank=rank, score=round(entry.score, 6),
                boundary_exposed=any(slot in BOUNDARY_SLOTS or slot == "control" for slot in slots),
                slots=slots,
            ))
        decision = len(ids) - 1
        open_index = assembled["open_index"]
        candidates = self._candidates(item, fmt, np.asarray(ids), assembled["offsets"], assembled["text"], open_index, assembled["catalog"])
        tempting_rank = next((rank for rank, e in enumerate(self.retrieve(item), 1) if e.skill.id == item.tempting_skill), None)
        shown_rank = next((rank for rank, e in enumerate(depth_skills, 1) if e.skill.id == item.tempting_skill), None)
        return PromptRecord(
            record_id=record_id(item.id, config.name, k, fmt),
            item_id=item.id, bucket=item.bucket, split=item.split, domain=item.domain,
            task_group=item.task_group, config=config.name, k=k, format=fmt,
            tokenizer=self.tokenizer_name,
            text=assembled["text"], input_ids=ids, offsets=assembled["offsets"], n_tokens=len(ids),
            decision_index=decision, open_index=open_index,
            # Every row from the one that opens the call to the decision row: the forced-prefix rows
            # feed the decision row, so knockouts and attention cover all of them.
            query_rows=list(range(open_index, decision + 1)) if open_index is not None else [decision],
            spans=spans,
            spans_kind=(
                block.rewriter.record() if block.rewriter
                else {"boundary": "boundary" if config.control is None else f"control:{config.control}"}
            ),
            skills=skills,
            candidates=candidates,
            collision=any(c.collides_with and c.role != "other" for c in candidates),
            correct_action=item.correct_action, wrong_tools=list(item.wrong_tools),
            tempting_skill=item.tempting_skill, tempting_rank=tempting_rank, tempting_shown_rank=shown_rank,
            retrieval={"embedder": self.retriever.embedder.name, "weights": asdict(self.retriever.weights),
                       "mode": self.settings.retrieval_mode,
                      "gate": {"relevance": self.settings.relevance, "gamma": self.settings.gamma, "beta": self.settings.beta}},
        )

    def build(
        self, item: Item, config: str | MemoryConfig, k: int, fmt: str = "native", *, retrieved: Sequence[ScoredSkill] | None = None
    ) -> PromptRecord:
        """One prompt record for ``item`` under ``config`` with the first ``k`` skills of
        :meth:`ordered` (``retrieved``: show these k skills instead, e.g. counterfactual edits of the
        top k). The record's ``tempting_shown_rank`` is the defining skill's rank among those k skills,
        whether or not ``config`` shows skills (Base at depth k is split with the memory
        configurations at depth k, so contrasts with it stay paired)."""
        config = get_config(config) if isinstance(config, str) else config
        if fmt not in FORMATS:
            raise ValueError(f"decision format must be one of {FORMATS}, got {fmt!r}")
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if retrieved is not None and len(retrieved) != k:
            raise ValueError(f"retrieved must hold k = {k} skills, got {len(retrieved)}")
        depth_skills = self.ordered(item)[:k] if retrieved is None else list(retrieved)
        retrieved = depth_skills if config.slots else []
        block = self._memory_block(item, retrieved, config)
        if config.control is None:
            return self._record(item, config, k, fmt, retrieved, block, self._assemble(item, block, fmt), depth_skills)
        return self._build_control(item, config, k, fmt, retrieved, block, depth_skills)

    def build_note(self, item: Item, name: str, header: str, body: str, fmt: str = "native", *, k: int = 0) -> PromptRecord:
        """A prompt whose memory block is one note in place of the retrieved skills (Eq. 12: the repair
        hint h_t is injected instead of re-retrieval): ``header``, then ``body`` spanned as slot
        ``note``. The record's configuration is ``name``; ``k`` only names the depth it stands for."""
        block = _MemoryBlock()
        block.add(header)
        block.add(body, None, "note", body=True)
        config = MemoryConfig(name, name, ())
        return self._record(item, config, k, fmt, [], block, self._assemble(item, block, fmt), self.ordered(item)[:k])

    def build_equal_note(self, item: Item, name: str, header: str, source: str, target: PromptRecord, fmt: str = "native", *,
                         k: int = 0) -> PromptRecord:
        """:meth:`build_note` with a body cut from ``source`` so the prompt has exactly ``target``'s token
        count (an equal-length control note); raises ValueError when no cut matches."""
        if not source.strip():
            raise ValueError(f"{item.id}: empty source for the {name} note")
        while self._count_tokens(source) < target.n_tokens:
            source = source + " " + source
        lo, hi = target.spans["note"][0]
        wanted = hi - lo  # the target note's body tokens in context
        for n in (wanted, wanted - 1, wanted + 1, wanted - 2, wanted + 2, wanted - 3, wanted + 3):
            record = self.build_note(item, name, header, cut_to_tokens(source, n, self._count_tokens), fmt, k=k)
            if record.n_tokens == target.n_tokens:
                return record
        raise ValueError(f"{item.id}: could not build the {name} note with exactly {target.n_tokens} tokens")

    def _control_plan(self, item: Item, k: int, fmt: str, block: _MemoryBlock) -> tuple[int, dict[int, int]]:
        """Token count of the reference (BASM) prompt and of each skill's boundary section in it;
        shared by both controls, so computed once per (item, k, format, block)."""
        key = (item.id, k, fmt, block.text)
        if key not in self._control_plans:
            reference = self._assemble(item, block, fmt)
            sections = block.char_ranges(reference["memory_start"], lambda segment: segment.slot in BOUNDARY_SLOTS)
            per_rank: dict[int, list[int]] = {}
            for (rank, _slot), (start, end) in sections.items():
                bounds = per_rank.setdefault(rank, [start, end])
                bounds[0], bounds[1] = min(bounds[0], start), max(bounds[1], end)
            control_tokens = {}
            for rank, (start, end) in per_rank.items():
                lo, hi = tokens_overlapping(reference["offsets"], start, end)
                control_tokens[rank] = hi - lo
            self._control_plans[key] = (len(reference["input_ids"]), control_tokens)
        target, control_tokens = self._control_plans[key]
        return target, dict(control_tokens)

    def _build_control(self, item: Item, config: MemoryConfig, k: int, fmt: str, retrieved: Sequence[ScoredSkill], block: _MemoryBlock,
                       depth_skills: Sequence[ScoredSkill]) -> PromptRecord:
        """Equal-length control: same prompt as BASM with every boundary section (labels included)
        replaced by filler or procedure text, adjusted until the total token count matches."""
        target, control_tokens = self._control_plan(item, k, fmt, block)
        if not control_tokens:
            return self._record(item, config, k, fmt, retrieved, block, self._assemble(item, block, fmt), depth_skills)
        # Section token counts are additive up to merges at the section edges: the residue on the last
        # section, then small joint adjustments of the last and first ones (probes.prompts.lengths).
        control_block = self._memory_block(item, retrieved, config, control_tokens)
        assembled = self._assemble(item, control_block, fmt)
        difference = target - len(assembled["input_ids"])
        if difference == 0:
            return self._record(item, config, k, fmt, retrieved, control_block, assembled, depth_skills)
        for trial in length_trials(control_tokens, difference):
            control_block = self._memory_block(item, retrieved, config, trial)
            assembled = self._assemble(item, control_block, fmt)
            if len(assembled["input_ids"]) == target:
                return self._record(item, config, k, fmt, retrieved, control_block, assembled, depth_skills)
        raise ValueError(f"{item.id}: could not build the {config.name} control at k={k} with exactly {target} tokens")

    def build_many(self, items: Iterable[Item], configs: Sequence[str], ks: Sequence[int], formats: Sequence[str]) -> Iterator[PromptRecord]:
        """All records; at k = 0 the prompt is built once and shared by every configuration
        (their byte identity is asserted per configuration by the tests through :meth:`build`)."""
        for item in items:
            for fmt in formats:
                for k in ks:
                    shared = self.build(item, "base", 0, fmt) if k == 0 else None
                    for config in configs:
                        if shared is None:
                            yield self.build(item, config, k, fmt)
                        else:
                            yield shared.with_config(config)


# ---------------------------------------------------------------------------- the one way to make a builder
def resolve_study(model: str | Path | None, dataset: str | Path | None = None, relevance: str | None = None) -> tuple[str | Path, str]:
    """The dataset and the r_B measure of a study of ``model`` (a model folder, or the tokenizer's
    name or folder): those given, else the model's study defaults
    (:func:`probes.data.dataset.default_study`: v1 and lexical for the bundled organism,
    basm_probe_v2 and semantic for every other model). The one place these defaults are applied."""

    study_dataset, study_relevance = default_study(organism=is_organism(model))
    return dataset or study_dataset, relevance or study_relevance


def make_builder(
    tokenizer: PreTrainedTokenizerBase,
    dataset: ProbeDataset,
    *,
    embedder: str | Retriever = "auto",
    k_max: int = BuildSettings.k_max,
    gamma: float = BuildSettings.gamma,
    relevance: str = BuildSettings.relevance,
    beta: int = BuildSettings.beta,
    retrieval: str = BuildSettings.retrieval,
    oracle_rank: int = BuildSettings.oracle_rank,
    tokenizer_name: str = "",
) -> PromptBuilder:
    """A :class:`PromptBuilder` over ``dataset`` in ``tokenizer``'s token space: the one factory the
    library uses (analyses, the notebook facade, ``build``/``show``, the organism). ``embedder``: an
    embedder name (:func:`probes.data.retrieval.make_embedder`) or a :class:`Retriever` to share
    (its embeddings are cached); the settings are :class:`BuildSettings`' (defaults included)."""
    retriever = embedder if isinstance(embedder, Retriever) else Retriever(make_embedder(embedder))
    settings = BuildSettings(k_max=k_max, gamma=gamma, relevance=relevance, beta=beta, retrieval=retrieval, oracle_rank=oracle_rank)
    return PromptBuilder(tokenizer, dataset, retriever, settings, tokenizer_name=tokenizer_name)
