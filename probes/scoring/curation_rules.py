"""Library curation and per-item masking (seed 003 §2.2–2.3): the estimators and rules, on arrays.

Every quantity is on the *benefit* scale b[j, i] = −C[j, i] of the wrong-tool margin (logits): the
margin is wrong − correct, so a skill whose inclusion lowers it helps, and b > 0 reads as the seed's
C > 0 (a skill that raises the pass rate). Thresholds given on the seed's pass-rate scale are carried
to logits by :func:`rate_difference_in_logits`.

- regimes (§2.2): heterogeneous H(j) ≥ τ_split; else negligible |C̄(j)| < τ_retire; else beneficial
  (C̄ > 0) or harmful (C̄ < 0); a skill no development item can see is ``unmeasured``;
- split (§2.2 step 1): :func:`split_variants` rewrites a heterogeneous skill into two conditional
  variants from its boundary fields and the content words of the state cues of the items where it
  helps (b > 0) and hurts (b < 0); :func:`chat_variants` asks a local chat model instead, kept only
  when ψ accepts both;
- merge (§2.2 step 3): :func:`merge_clusters`, connected components of cosine ≥ τ_merge, best by C̄;
- gate: :func:`gate`, a restructured library is kept only if it scores no worse on the development items;
- per-item masking (§2.3): :func:`neighbour_weights` (Eq. 5), :func:`predicted_effects` (Eq. 6) and
  :func:`risk_minimising_mask` (Eq. 7), with the controls :func:`reverse_drop` and :func:`random_drop`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.sparse.csgraph import connected_components

from probes.data.dataset import Item
from probes.data.extract_llm import TextGenerator, reply_json
from probes.data.retrieval import content_words
from probes.data.schema import Skill, SkillValidationError, ToolCatalog, validate_skill

REGIMES: tuple[str, ...] = ("heterogeneous", "beneficial", "negligible", "harmful", "unmeasured")
SEED_TAU_SPLIT = 0.40  # the seed's τ_split on the pass-rate scale (§A.1: "H ≥ τ_split = 0.40")
SEED_HARM_THRESHOLD = 0.10  # the seed's smallest effect it acts on: a masked skill has Ĉ < −0.10 (§K.2)
SEED_NEIGHBOURS = 8  # k nearest development tasks of Eq. 6 (§3)
PROTECTED_PREFIXES: tuple[str, ...] = ("tpl-", "shr-", "api-")  # the seed's protected prefixes (Eq. 7)
CUE_WORDS = 4  # content words named by each condition of a split variant


def rate_difference_in_logits(difference: float) -> float:
    """A pass-rate difference around 0.5 (rates 0.5 ± d/2) as a margin difference: with
    P(correct) = σ(−margin), 2·logit(0.5 + d/2). The attribution power table maps the seed's 0.60 the same way."""
    if not 0.0 < difference < 1.0:
        raise ValueError(f"a rate difference must be in (0, 1), got {difference}")
    p = 0.5 + difference / 2
    return 2.0 * math.log(p / (1.0 - p))


TAU_SPLIT = rate_difference_in_logits(SEED_TAU_SPLIT)  # 1.695 logits
TAU_RETIRE = rate_difference_in_logits(SEED_HARM_THRESHOLD)  # 0.401 logits
MASK_THRESHOLD = TAU_RETIRE
TAU_MERGE = 0.90  # the seed states no value; a priori "near-identical text", never tuned here
SOFTMAX_TEMPERATURE = 0.1  # the seed states no value; a priori: a cosine gap of 0.1 weighs e times more
# The smallest τ: at 1e-3 a cosine gap of 0.01 already weighs e^10 times more (the nearest neighbour
# alone), so a smaller τ changes no weight but lets float32 cosine rounding (~1e-7) move them, and
# τ → 0 overflows cos/τ to inf, the weights to NaN and every mask to the full library.
MIN_TEMPERATURE = 1e-3


def regimes(c_bar: pd.Series, heterogeneity: pd.Series, tau_split: float, tau_retire: float) -> pd.Series:
    """The regime of each skill from its C̄ (benefit scale) and H; NaN C̄ or H: ``unmeasured``."""
    out = pd.Series("unmeasured", index=c_bar.index, dtype=object)
    measured = c_bar.notna() & heterogeneity.notna()
    out[measured & (heterogeneity >= tau_split)] = "heterogeneous"
    rest = measured & (heterogeneity < tau_split)
    out[rest & (c_bar.abs() < tau_retire)] = "negligible"
    out[rest & (c_bar >= tau_retire)] = "beneficial"
    out[rest & (c_bar <= -tau_retire)] = "harmful"
    return out


def cue_words(side: Sequence[Item], other: Sequence[Item], n: int = CUE_WORDS) -> list[str]:
    """The content words of the state cues of ``side``'s items that no item of ``other`` has, most
    frequent first (ties alphabetical), at most ``n``: the trigger of a split variant."""
    theirs = set().union(*(content_words(" ".join(item.state_cues)) for item in other)) if other else set()
    counts = Counter(word for item in side for word in content_words(" ".join(item.state_cues)) if word not in theirs)
    return [word for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def split_variants(skill: Skill, helped: Sequence[Item], hurt: Sequence[Item]) -> tuple[dict[str, Any], dict[str, Any]] | str:
    """Two conditional variants of ``skill`` (seven-slot JSON, for ψ), or the reason there are none.

    ``<id>.scoped`` targets the items where the skill helps: its applicability gains the trigger
    "the request mentions <words of the helped items' cues>". ``<id>.guarded`` targets the items where
    it hurts: its risk cues and avoidance rules gain the words of the hurt items' cues, so that its
    boundary says when not to follow the procedure. Deterministic: the words come from the items'
    ``state_cues`` (:func:`cue_words`), the rest of each variant is the skill's own text."""
    if not helped or not hurt:
        return f"no development item where it {'helps' if not helped else 'hurts'}"
    helps, hurts = cue_words(helped, hurt), cue_words(hurt, helped)
    if not helps or not hurts:
        return f"no cue word that only the items where it {'helps' if not helps else 'hurts'} share"
    tools = ", ".join(skill.tool_names)
    base = skill.to_json()
    scoped = {**base, "id": f"{skill.id}.scoped",
              "applicability": [*skill.applicability, f"The request mentions {', '.join(helps)}."]}
    guarded = {**base, "id": f"{skill.id}.guarded",
               "risk_cues": [*skill.risk_cues, f"The request mentions {', '.join(hurts)}."],
               "avoidance_rules": [*skill.avoidance_rules, f"Do not call {tools} when the request mentions {', '.join(hurts)}."]}
    return scoped, guarded


REWRITE_SYSTEM = ("You rewrite a tool-use skill into two conditional variants. Reply with one JSON object "
                  '{"scoped": <skill>, "guarded": <skill>} and nothing else.')
REWRITE_EXAMPLES = 5  # requests shown per side


def rewrite_messages(skill: Skill, helped: Sequence[Item], hurt: Sequence[Item]) -> list[dict[str, str]]:
    """The chat messages asking for the two variants of :func:`split_variants` in the model's own words."""
    user = "\n".join([
        "The skill below helps on some requests and hurts on others. Write two variants of it, each a JSON object with the",
        f'same keys as the skill, the same goal, procedure and tools: "scoped" (id "{skill.id}.scoped") adds to its applicability',
        f'a condition that says when it applies (the requests it helps on); "guarded" (id "{skill.id}.guarded") adds to its',
        "risk_cues and avoidance_rules when not to follow it (the requests it hurts on). Quote no request.",
        "", f"Skill: {json.dumps(skill.to_json())}", "", "It helps on:", *(f"- {item.user}" for item in helped[:REWRITE_EXAMPLES]),
        "", "It hurts on:", *(f"- {item.user}" for item in hurt[:REWRITE_EXAMPLES])])
    return [{"role": "system", "content": REWRITE_SYSTEM}, {"role": "user", "content": user}]


def chat_variants(generate: TextGenerator, skill: Skill, helped: Sequence[Item], hurt: Sequence[Item],
                  catalog: ToolCatalog) -> tuple[Skill, Skill] | str:
    """The two variants written by a chat model (greedy), each accepted by ψ with the id asked for and
    the skill's own tools; else the reason they are not kept."""
    reply = generate(rewrite_messages(skill, helped, hurt))
    try:
        data = json.loads(reply_json(reply.text))
    except json.JSONDecodeError as error:
        return f"not JSON{' (cut at max_new_tokens)' if reply.truncated else ''}: {error}"
    if not isinstance(data, dict) or set(data) != {"scoped", "guarded"}:
        return "not an object with exactly the keys scoped and guarded"
    out = []
    for side in ("scoped", "guarded"):
        try:
            variant = validate_skill(json.dumps(data[side]), catalog, domain=skill.domain)
        except SkillValidationError as error:
            return f"{side}: {error}"
        if variant.id != f"{skill.id}.{side}" or variant.tool_names != skill.tool_names:
            return f"{side}: id must be {skill.id}.{side} and tools {list(skill.tool_names)}, got {variant.id} and {list(variant.tool_names)}"
        out.append(variant)
    return out[0], out[1]


@dataclass(frozen=True)
class GateResult:
    """A development gate: the mean margin and the correct two-way choices under both libraries."""

    accepted: bool
    margin_before: float
    margin_after: float
    correct_before: int
    correct_after: int
    n_items: int
    reason: str


def gate(before: pd.Series, after: pd.Series) -> GateResult:
    """Keep the restructured library only if it scores no worse on the development items: a mean
    margin no higher and no fewer correct two-way choices (1[margin < 0], the seed's pass rate),
    over the items where both margins are defined (the same items, or the gate fails)."""
    both = pd.concat({"before": before, "after": after}, axis=1)
    finite = both.dropna()
    if len(finite) != both["before"].notna().sum() or finite.empty:
        return GateResult(False, math.nan, math.nan, 0, 0, len(finite), "the margin is undefined on development items it had")
    m0, m1 = float(finite["before"].mean()), float(finite["after"].mean())
    c0, c1 = int((finite["before"] < 0).sum()), int((finite["after"] < 0).sum())
    worse = [text for bad, text in ((m1 > m0, f"mean margin {m0:+.4f} → {m1:+.4f}"), (c1 < c0, f"correct choices {c0} → {c1}")) if bad]
    reason = "no worse: " + f"mean margin {m0:+.4f} → {m1:+.4f}, correct {c0} → {c1}" if not worse else "worse: " + "; ".join(worse)
    return GateResult(not worse, m0, m1, c0, c1, len(finite), reason)


def merge_clusters(ids: Sequence[str], embeddings: np.ndarray, tau_merge: float) -> list[list[str]]:
    """Clusters of near-duplicates: connected components of the graph with an edge where the cosine of
    two (unit-norm) embeddings is ≥ ``tau_merge``; only clusters of two or more, members in input order."""
    if len(ids) < 2:
        return []
    adjacency = (embeddings @ embeddings.T) >= tau_merge
    n, labels = connected_components(adjacency, directed=False)
    return [[ids[i] for i in np.flatnonzero(labels == label)] for label in range(n) if (labels == label).sum() > 1]


def neighbour_weights(development: np.ndarray, test: np.ndarray, k: int, temperature: float) -> np.ndarray:
    """w(t) of Eq. 5: softmax(cos(e_t, e_i) / τ) over the k development items nearest by cosine
    (unit-norm embeddings; ties by index), zero elsewhere. development ``[M, d]``, test ``[d]`` → ``[M]``."""
    if k < 1 or not temperature >= MIN_TEMPERATURE:
        raise ValueError(f"need k ≥ 1 and a temperature ≥ {MIN_TEMPERATURE:g}, got k={k}, temperature={temperature}")
    cosines = development @ test
    nearest = np.argsort(-cosines, kind="stable")[:k]
    logits = cosines[nearest] / temperature
    weights = np.zeros(len(development))
    weights[nearest] = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    return weights


def predicted_effects(benefit: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ĉ(s_j, t) of Eq. 6, the weighted row of the benefit matrix ``[J, M]`` (NaN: skill j unseen by
    item i), renormalised over the neighbours where the cell is defined; returns Ĉ ``[J]`` (NaN where no
    neighbour has evidence) and the weight share with evidence ``[J]``."""
    defined = np.isfinite(benefit)
    mass = (defined * weights[None]).sum(axis=1)
    total = np.where(defined, benefit, 0.0) @ weights
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mass > 0, total / mass, np.nan), mass


@dataclass(frozen=True)
class Mask:
    """A per-item library: the skills kept and dropped, and whether the fallback to the full library ran."""

    kept: tuple[str, ...]
    dropped: tuple[str, ...]
    fallback: bool


def protected(skill: str, prefixes: Sequence[str]) -> bool:
    return skill.startswith(tuple(prefixes))


def risk_minimising_mask(skills: Sequence[str], c_hat: np.ndarray, threshold: float, prefixes: Sequence[str], min_skills: int) -> Mask:
    """Eq. 7, removal only: drop every unprotected skill predicted to hurt (Ĉ < −threshold); a skill
    without a prediction (NaN) is kept. Fewer than ``min_skills`` left: the full library (fallback)."""
    drop = tuple(s for s, c in zip(skills, c_hat) if np.isfinite(c) and c < -threshold and not protected(s, prefixes))
    kept = tuple(s for s in skills if s not in drop)
    if drop and len(kept) < min_skills:
        return Mask(tuple(skills), (), True)
    return Mask(kept, drop, False)


def reverse_drop(skills: Sequence[str], c_hat: np.ndarray, n: int, prefixes: Sequence[str]) -> Mask:
    """The reverse-masking control: drop the ``n`` unprotected skills predicted to help most (highest
    Ĉ, ties by id; skills without a prediction are never chosen)."""
    ranked = sorted(((c, s) for s, c in zip(skills, c_hat) if np.isfinite(c) and not protected(s, prefixes)), key=lambda cs: (-cs[0], cs[1]))
    drop = tuple(s for _, s in ranked[:n])
    return Mask(tuple(s for s in skills if s not in drop), drop, False)


def random_drop(skills: Sequence[str], n: int, prefixes: Sequence[str], rng: np.random.Generator) -> Mask:
    """The random control: drop ``n`` unprotected skills drawn uniformly without replacement."""
    pool = [s for s in skills if not protected(s, prefixes)]
    drop = tuple(pool[i] for i in sorted(rng.choice(len(pool), size=min(n, len(pool)), replace=False)))
    return Mask(tuple(s for s in skills if s not in drop), drop, False)
