"""``circuit``: which heads carry B into the tool choice, and how faithful is that explanation?

At the *deciding row* of each tool-correct T_wrong item (the row predicting the first token where the
tempting wrong name parts from the correct one; the shared name prefix appended), the metric is the
logit difference ``logit(wrong) − logit(correct)`` of the binding pair (the wrong tool with the largest
difference: the tool-choice margin at that row). The instrument is :mod:`probes.engine.decision_row`:
edges are (layer, head, source span), a head's input split by the span of its key positions.

1. **Source spans** (:func:`source_spans`, disjoint, assigned in this order): the call prefix (the
   row that opens the call to the deciding row), the request, B (the boundary slots), P (the
   procedures), the rest of the shown skills (goals, tool lists, headers), the tool catalogue, the
   system text before it; every other position (chat-template tokens, earlier turns) is ``other``.
2. **Counterfactual pairs**, fixed a priori (``--pairs``): ``config`` (a) the BASM prompt against the
   Proc. Skill prompt of the same item and k (what the boundary fields change; BASM only);
   ``bucket`` (b) the T_wrong prompt against a T_ok prompt of the same task group (the first by id of
   the same split), same configuration and k, the same name prefix appended; ``knockout`` (c) B knocked
   out at the deciding row in every layer and head (the suite's own knockout as the corruption; BASM
   only). Messages are compared span by span, so prompts of different lengths align; a span the
   counterfactual lacks has no mass there.
3. **Scores** per edge: AtP, AtP* (saturation fix), AtP*+GradDrop (unsigned) and EAP-IG
   (``--ig-steps`` midpoints; each row records the completeness Σ scores / total effect). Exact
   patching verifies the top ``--exact-top`` edges by |score| and ``--exact-random`` others drawn with
   the seed; an estimate off the exact effect by more than the stated tolerance is flagged.
4. **DLA** per head, MLP and embedding, beside each node's exact ablation (zeroed at the deciding row)
   and patching (direct and total) effects; where DLA's sign or size disagrees with the exact effect
   the node table says so.
5. **Circuit** (per configuration and pair): edges ranked by |mean score| on the *train* task
   groups (the even positions of the sorted task groups; the held-out groups the odd ones); the
   smallest size on the MIB fraction grid whose train faithfulness reaches ``--threshold`` is chosen
   on train; then faithfulness curves, sufficiency, partial necessity and minimality against random
   layer-matched circuits on the held-out groups (:mod:`probes.scoring.circuit`). Ablation of the
   edges outside the circuit: the counterfactual's messages (the headline, as in MIB), the mean
   message over train items, and a train item's message (resample); all three reported.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import matplotlib.pyplot as plt
import pandas as pd
import torch

from probes.analyses import register
from probes.analyses.base import Analysis, ReportSection
from probes.analyses.heads import planted_heads, split_groups
from probes.analyses.jobs import Job, run_jobs
from probes.analyses.option_system import depth_option, option
from probes.analyses.parallel import world
from probes.analyses.run_context import AnalysisError, RunContext, model_label, provenance
from probes.backends.circuit_parts import decision_row_components, edge_knockout_effects
from probes.data.dataset import ABSTAIN, Item
from probes.engine.decision_row import DEFAULT_IG_STEPS, DecisionRow, Messages
from probes.engine.session import EngineSession, span_positions
from probes.prompts.record import PromptRecord
from probes.prompts.spans import tokens_overlapping
from probes.reporting import plots
from probes.reporting.circuit_graph import circuit_graph, graph_file, write_circuit_graph
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring.margins import candidates_from_record, shared_prefix
from probes.scoring.circuit_stats import (AGREEMENT_ABS_TOL, AGREEMENT_REL_TOL, estimate_agreement, faithfulness, faithfulness_curve, faithfulness_undefined,
                                    held_out_check, integrated_faithfulness, layer_matched_circuits, minimality_table,
                                    partial_necessity_claim, planted_claim, ORGANISM_FAMILY, planted_recovery, smallest_faithful_size, sufficiency_claim)
from probes.scoring.score import record_rng, row_fields
from probes.scoring.stats import bootstrap_mean

NAME = "circuit"
PAIRS = ("config", "bucket", "knockout")  # (a), (b), (c) of the module docstring
HEADLINE_PAIR = "config"  # the pair whose circuit the claims test, chosen before any run
PAIR_TEXT = {"config": "BASM vs Proc. Skill (same item)", "bucket": "T_wrong vs T_ok (same task group)",
             "knockout": "B knocked out at the deciding row"}
SCORES = ("atp", "atp_star", "atp_gd", "eap_ig")
ABLATIONS = ("patch", "mean", "resample")
HEADLINE_ABLATION = "patch"  # the counterfactual's messages outside the circuit (MIB's ablation)
SPAN_ORDER = ("call_prefix", "request", "boundary", "procedure", "skill_text", "catalog", "system")
FRACTIONS = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # MIB's grid of edge fractions kept
DEFAULT_THRESHOLD = 0.8
DEFAULT_EXACT_TOP = 20
DEFAULT_EXACT_RANDOM = 20
DEFAULT_RANDOM_CIRCUITS = 20
FIGURE = "fig21_circuit"
# The organism's planted heads that read B from the deciding row (its "verdict" heads: the risk cues and
# avoidance rules); "gather" reads the request there and "dup" reads at the request's own rows, no deciding-row edge from B.
PLANTED_FROM_B = ("verdict",)
PLANTED_FAMILY = ORGANISM_FAMILY


# ----------------------------------------------------------------------------- spans and rows
def source_spans(record: PromptRecord, item: Item, catalog: Sequence[str], deciding_row: int) -> dict[str, list[int]]:
    """The record's key positions ``0..deciding_row`` by source span (module docstring, item 1)."""
    n = deciding_row + 1
    offsets = np.asarray(record.offsets)
    taken: set[int] = set()
    out: dict[str, list[int]] = {}

    def claim(name: str, positions: Sequence[int]) -> None:
        keep = sorted(p for p in set(positions) if p < n and p not in taken)
        taken.update(keep)
        out[name] = keep

    open_row = record.open_index if record.open_index is not None else min(record.query_rows)
    claim("call_prefix", range(int(open_row), n))
    start = record.text.rfind(item.user)
    if start < 0:
        raise AnalysisError(f"circuit: {record.record_id}: the request text does not occur in the prompt")
    claim("request", range(*tokens_overlapping(offsets, start, start + len(item.user))))
    boundary = span_positions(record.spans.get("boundary", []))
    procedure = span_positions(record.spans.get("procedure", []))
    claim("boundary", boundary)
    claim("procedure", procedure)
    claim("skill_text", span_positions(record.spans.get("memory", [])))
    memory = record.spans.get("memory")
    system_end = offsets[memory[0][0]][0] if memory else start  # characters before the user's turn content
    names = [(m, m + len(name)) for name in catalog for m in _occurrences(record.text[:system_end], name)]
    if names:
        lo = min(a for a, _ in names)
        last = max(b for _, b in names)
        hi = record.text.find("\n", last)
        claim("catalog", range(*tokens_overlapping(offsets, lo, hi if 0 <= hi < system_end else system_end)))
        claim("system", range(0, tokens_overlapping(offsets, lo, lo + 1)[0]))
    return {name: out.get(name, []) for name in SPAN_ORDER}


def _occurrences(text: str, word: str) -> list[int]:
    out, at = [], text.find(word)
    while at >= 0:
        out.append(at)
        at = text.find(word, at + 1)
    return out


@dataclass(frozen=True)
class Deciding:
    """The deciding row of a record for its binding pair: the extended ids (prompt + the correct name's
    shared prefix), the wrong and correct actions and the tokens they part at."""

    ids: tuple[int, ...]
    wrong: str
    correct: str
    wrong_token: int
    correct_token: int
    depth: int


def deciding_rows(record: PromptRecord) -> list[Deciding]:
    """One :class:`Deciding` per wrong tool that parts from the correct one (the binding one is chosen
    by the metric, :func:`binding_row`)."""
    cands = [c for c in candidates_from_record(record) if c.role != "other"]
    correct = [c for c in cands if c.role == "correct" and not c.is_abstention]
    if not correct:
        raise AnalysisError(f"circuit: {record.record_id}: the correct action is abstention (no tool-choice metric)")
    c = correct[0]
    out = []
    for w in (w for w in cands if w.role == "wrong" and not w.is_abstention):
        s = shared_prefix(c.token_ids, w.token_ids)
        if s == min(len(c.token_ids), len(w.token_ids)):
            continue  # names that never diverge have no deciding row (the margin is NaN there too)
        if c.anchor_index != len(record.input_ids) - 1:
            raise AnalysisError(f"circuit: {record.record_id}: candidates anchor at {c.anchor_index}, not at the prompt's last row")
        out.append(Deciding(tuple(record.input_ids) + tuple(c.token_ids[:s]), w.action, c.action, int(w.token_ids[s]),
                            int(c.token_ids[s]), s))
    if not out:
        raise AnalysisError(f"circuit: {record.record_id}: no wrong tool parts from the correct one")
    return out


def binding_row(session: Any, record: PromptRecord, item: Item, catalog: Sequence[str]) -> tuple[DecisionRow, Deciding]:
    """The deciding row of the wrong tool with the largest logit difference (the tool-choice margin)."""
    best = None
    for d in deciding_rows(record):
        row = DecisionRow(session, d.ids, spans=source_spans(record, item, catalog, len(d.ids) - 1),
                          wrong_token=d.wrong_token, correct_token=d.correct_token)
        if best is None or row.metric > best[0].metric:
            best = (row, d)
    return best


def counterpart_row(session: Any, record: PromptRecord, item: Item, catalog: Sequence[str], d: Deciding) -> DecisionRow:
    """A counterfactual prompt's deciding row for the clean record's pair: the same name prefix and tokens."""
    ids = tuple(record.input_ids) + d.ids[len(d.ids) - d.depth:] if d.depth else tuple(record.input_ids)
    return DecisionRow(session, ids, spans=source_spans(record, item, catalog, len(ids) - 1),
                       wrong_token=d.wrong_token, correct_token=d.correct_token)


def ok_partner(ctx: RunContext, item: Item) -> Item | None:
    """The T_ok item paired with ``item`` for pair (b): the first by id of the same task group and split."""
    same = sorted((i for i in ctx.dataset.items if i.bucket == "T_ok" and i.task_group == item.task_group and i.split == item.split),
                  key=lambda i: i.id)
    return same[0] if same else None


def pairs_for(config: str, pairs: Sequence[str]) -> tuple[str, ...]:
    """The pairs a configuration's prompts take: (a) and (c) need B (BASM), (b) any configuration."""
    return tuple(p for p in pairs if config == "basm" or p == "bucket")


def edge_index(n_layers: int, n_heads: int, n_spans: int) -> pd.DataFrame:
    """Edges in the flat order of [L, H, S] arrays: layer, head, span index."""
    layer, head, span = np.meshgrid(np.arange(n_layers), np.arange(n_heads), np.arange(n_spans), indexing="ij")
    return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "span_index": span.ravel()})


def _nested(a: np.ndarray) -> list:
    return np.asarray(a, dtype=float).round(7).tolist()


def _exact_sample(scores: np.ndarray, top: int, extra: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Flat edge indices verified exactly: the ``top`` largest |score| and ``extra`` drawn among the rest."""
    order = np.argsort(-np.abs(scores.ravel()), kind="stable")
    head, rest = order[:top], order[top:]
    return head, rng.choice(rest, size=min(extra, rest.size), replace=False) if rest.size else rest


def _edge_triples(row: DecisionRow, flat: np.ndarray) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in np.unravel_index(i, (row.n_layers, row.n_heads, len(row.spans)))) for i in flat]


@dataclass
class Counterfactual:
    """One pair's corrupted messages for a clean row, or the reason there is none."""

    target: Messages | None
    source: str
    reason: str = ""


def counterfactual(ctx: RunContext, pair: str, record: PromptRecord, job: Job, row: DecisionRow, d: Deciding) -> Counterfactual:
    """The corrupted messages of ``pair`` (module docstring, item 2) for the clean ``row``."""
    catalog = ctx.dataset.catalog_for(job.item).names
    if pair == "knockout":
        if not span_positions(record.spans.get("boundary", [])):
            return Counterfactual(None, "", "the prompt shows no boundary span")
        return Counterfactual(row.knocked_out("boundary"), "B knocked out")
    if pair == "config":
        other = Job(job.item, "proc", job.k, job.fmt, ()).build(ctx.builder)
        return Counterfactual(counterpart_row(ctx.session, other, job.item, catalog, d).messages, other.record_id)
    partner = ok_partner(ctx, job.item)
    if partner is None:
        return Counterfactual(None, "", f"no T_ok item in task group {job.item.task_group!r}")
    other = Job(partner, job.config, job.k, job.fmt, ()).build(ctx.builder)
    return Counterfactual(counterpart_row(ctx.session, other, partner, ctx.dataset.catalog_for(partner).names, d).messages,
                          other.record_id)


def edge_scorer(ctx: RunContext, train_groups: set[str]) -> Any:
    """The scorer of the edge rows: per record a ``dla`` row and one row per pair."""
    a = ctx.options

    def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
        item = job.item
        row, d = binding_row(ctx.session, record, item, ctx.dataset.catalog_for(item).names)
        base = {**row_fields(record), "half": "train" if item.task_group in train_groups else "heldout", "spans": list(row.spans), "n_layers": row.n_layers,
                "n_heads": row.n_heads, "deciding_row": row.row, "deciding_depth": d.depth, "wrong_action": d.wrong,
                "correct_action": d.correct, "wrong_token": d.wrong_token, "correct_token": d.correct_token, "metric": row.metric,
                "span_sizes": [int((row.span_of == j).sum()) for j in range(len(row.spans))]}
        parts = row.components()
        nodes = row.node_effects()
        out = [{**base, "condition": "dla", "dla_embed": parts.embed, "dla_heads": _nested(parts.heads), "dla_mlps": _nested(parts.mlps),
                "dla_attn_bias": _nested(parts.attn_bias), "dla_unembed_bias": parts.unembed_bias, "norm_scale": parts.norm_scale,
                "head_ablate": _nested(nodes["head_ablate"]), "mlp_ablate": _nested(nodes["mlp_ablate"])}]
        for pair in job.conditions[1:]:
            cf = counterfactual(ctx, pair, record, job, row, d)
            entry = {**base, "condition": pair, "pair": pair, "counterfactual": cf.source, "skipped": cf.reason}
            if cf.target is None:
                out.append(entry)
                continue
            full = float(row.patched_metrics(cf.target, torch.ones(1, row.n_layers, row.n_heads, len(row.spans), dtype=torch.bool))[0])
            scores = row.edge_scores(cf.target, ig_steps=a.ig_steps)
            top, extra = _exact_sample(scores[a.score], a.exact_top, a.exact_random, record_rng(a.seed, record.record_id, pair))
            flat = np.concatenate([top, extra])
            exact = row.exact_edges(cf.target, _edge_triples(row, flat))
            node = row.node_effects(cf.target)
            total = full - row.metric
            entry.update(metric_counterfactual=cf.target.metric, metric_all_patched=full,
                         ig_completeness=float(scores["eap_ig"].sum() / total) if abs(total) > 1e-6 else math.nan,
                         **{name: _nested(scores[name]) for name in SCORES},
                         exact_edges=[int(i) for i in flat], exact_top=len(top), exact=_nested(exact),
                         head_patch=_nested(node["head_patch"]), head_patch_direct=_nested(node["head_patch_direct"]),
                         mlp_patch=_nested(node["mlp_patch"]), mlp_patch_direct=_nested(node["mlp_patch_direct"]))
            out.append(entry)
        return out

    return scorer


def backend_scorer(ctx: RunContext, train_groups: set[str]) -> Any:
    """The ``dla`` row through a forward backend (``--backend nnsight|transformerlens``): DLA at the binding pair's
    deciding row and the exact effect of knocking B out of each head there (probes.backends.circuit_parts, one
    forward per head); the replay's attribution, node ablation and circuits run on the native engine only."""

    def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
        item = job.item
        found = [(decision_row_components(ctx.session, d.ids, wrong_token=d.wrong_token, correct_token=d.correct_token), d)
                 for d in deciding_rows(record)]
        parts, d = max(found, key=lambda candidate: candidate[0].metric)  # the binding pair: the largest logit difference
        spans = source_spans(record, item, ctx.dataset.catalog_for(item).names, len(d.ids) - 1)
        L, H = ctx.session.n_layers, ctx.session.n_heads
        b = spans["boundary"]
        knocked = (edge_knockout_effects(ctx.session, d.ids, span_positions=b, wrong_token=d.wrong_token, correct_token=d.correct_token)
                   if b else np.full((L, H), np.nan))
        return [{**row_fields(record), "condition": "dla", "half": "train" if item.task_group in train_groups else "heldout",
                 "spans": [*SPAN_ORDER, "other"], "n_layers": L, "n_heads": H, "deciding_row": len(d.ids) - 1, "deciding_depth": d.depth,
                 "wrong_action": d.wrong, "correct_action": d.correct, "wrong_token": d.wrong_token, "correct_token": d.correct_token,
                 "metric": parts.metric, "dla_embed": parts.embed, "dla_heads": _nested(parts.heads), "dla_mlps": _nested(parts.mlps),
                 "dla_attn_bias": _nested(parts.attn_bias), "dla_unembed_bias": parts.unembed_bias, "norm_scale": parts.norm_scale,
                 "head_ablate": _nested(np.full((L, H), np.nan)), "mlp_ablate": _nested(np.full(L, np.nan)),
                 "boundary_knockout": _nested(knocked)}]

    return scorer


def tested(items: Sequence[Item]) -> tuple[list[Item], list[str]]:
    """The tool-correct T_wrong items (a tool-choice metric exists) and the ids of the abstention-correct ones."""
    wrong = [i for i in items if i.bucket == "T_wrong"]
    return [i for i in wrong if i.correct_action != ABSTAIN], [i.id for i in wrong if i.correct_action == ABSTAIN]


# ----------------------------------------------------------------------------- circuits
@dataclass(frozen=True)
class Circuit:
    """One configuration × pair: its edges ranked on train (flat [L, H, S] indices, by |mean score|),
    the sizes of the grid, the chosen size (None until chosen on train) and the random circuits."""

    config: str
    pair: str
    shape: tuple[int, int, int]
    spans: tuple[str, ...]
    ranking: tuple[int, ...]
    mean_score: tuple[float, ...]
    sizes: tuple[int, ...]
    chosen: int | None = None
    random: tuple[tuple[tuple[int, ...], ...], ...] = ()  # per size: draws of layer-matched edge sets
    necessity_random: tuple[tuple[int, ...], ...] = ()  # draws at the chosen size
    plus_edges: tuple[int, ...] = ()  # single non-circuit edges added for minimality

    @property
    def n_edges(self) -> int:
        return int(np.prod(self.shape))

    def layers(self) -> np.ndarray:
        return np.arange(self.n_edges) // (self.shape[1] * self.shape[2])

    def top(self, n: int) -> np.ndarray:
        return np.asarray(self.ranking[:n], dtype=int)

    def header(self) -> dict[str, Any]:
        return {"config": self.config, "pair": self.pair, "shape": list(self.shape), "spans": list(self.spans), "ranking": list(self.ranking), "sizes": list(self.sizes),
                "chosen": self.chosen, "random": [list(map(list, r)) for r in self.random],
                "necessity_random": [list(r) for r in self.necessity_random], "plus_edges": list(self.plus_edges)}


def grid_sizes(n_edges: int) -> tuple[int, ...]:
    """Circuit sizes of the MIB fraction grid (:data:`FRACTIONS`), rounded up, distinct."""
    return tuple(dict.fromkeys(int(math.ceil(f * n_edges)) for f in FRACTIONS))


def rank_edges(rows: pd.DataFrame, score: str) -> tuple[np.ndarray, np.ndarray]:
    """(flat edge indices by decreasing |mean score|, the mean scores) over ``rows`` (one pair's scored rows)."""
    stacked = np.stack([np.asarray(v, dtype=float).ravel() for v in rows[score]])
    mean = np.nanmean(stacked, axis=0)
    return np.argsort(-np.abs(mean), kind="stable"), mean


def masks(shape: tuple[int, int, int], keep: Sequence[np.ndarray], patch_only: Sequence[np.ndarray] = ()) -> torch.Tensor:
    """Patch masks [B, L, H, S]: for each ``keep`` set every other edge patched; for each ``patch_only``
    set only those edges patched."""
    n = int(np.prod(shape))
    out = torch.zeros(len(keep) + len(patch_only), n, dtype=torch.bool)
    for i, k in enumerate(keep):
        out[i] = True
        out[i, torch.as_tensor(np.asarray(k, dtype=int))] = False
    for j, p in enumerate(patch_only):
        out[len(keep) + j, torch.as_tensor(np.asarray(p, dtype=int))] = True
    return out.reshape(-1, *shape)


@dataclass
class TrainTargets:
    """The ablation targets drawn from the train items: per configuration the train items' clean
    messages (their mean: mean ablation; one of them, drawn per record with the seed: resample)."""

    messages: dict[str, dict[str, Messages]]
    seed: int

    def mean(self, config: str) -> Messages:
        return Messages.mean(list(self.messages[config].values()))

    def resample(self, config: str, record_id: str) -> tuple[Messages, str]:
        ids = sorted(self.messages[config])
        chosen = ids[int(record_rng(self.seed, record_id, "resample").integers(len(ids)))]
        return self.messages[config][chosen], chosen


def train_targets(ctx: RunContext, items: Sequence[Item], configs: Sequence[str]) -> TrainTargets:
    """One clean deciding row per train item and configuration (one prompt forward each)."""
    out: dict[str, dict[str, Messages]] = {}
    for config in configs:
        out[config] = {}
        for item in items:
            record = Job(item, config, ctx.options.depth, ctx.fmt, ()).build(ctx.builder)
            out[config][item.id] = binding_row(ctx.session, record, item, ctx.dataset.catalog_for(item).names)[0].messages
    return TrainTargets(out, ctx.options.seed)


def faithfulness_scorer(ctx: RunContext, circuits: Mapping[tuple[str, str], Circuit], targets: Any, heldout_groups: set[str]) -> Any:
    """The scorer of the faithfulness rows: per record one row per (pair, ablation) with the metric of
    every circuit of the grid (and, on held-out items, the random circuits, the necessity and the
    minimality interventions of the chosen size). ``targets``: a callable giving the TrainTargets
    (computed on first use: a resumed run that needs none computes none)."""

    def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
        item = job.item
        row, d = binding_row(ctx.session, record, item, ctx.dataset.catalog_for(item).names)
        heldout = item.task_group in heldout_groups
        found: dict[str, Counterfactual] = {}
        out = []
        for condition in job.conditions:
            pair, ablation = condition.split("|")
            circuit = circuits[(job.config, pair)]
            if circuit.shape != (row.n_layers, row.n_heads, len(row.spans)):
                raise AnalysisError(f"circuit: {record.record_id}: edges {(row.n_layers, row.n_heads, len(row.spans))} differ from the ranking's {circuit.shape}")
            cf = found.setdefault(pair, counterfactual(ctx, pair, record, job, row, d))
            entry = {**row_fields(record), "condition": condition, "pair": pair, "ablation": ablation,
                     "half": "heldout" if heldout else "train", "metric": row.metric, "skipped": cf.reason, "ablation_source": ""}
            if cf.target is None:
                out.append(entry)
                continue
            target = cf.target
            if ablation == "mean":
                target, entry["ablation_source"] = targets().mean(job.config), "train mean"
            elif ablation == "resample":
                target, entry["ablation_source"] = targets().resample(job.config, record.record_id)
            else:
                entry["ablation_source"] = cf.source
            m = row.patched_metrics(target, masks(circuit.shape, [circuit.top(n) for n in circuit.sizes]))
            entry.update(m_full=row.metric, m_empty=float(m[0]), m_circuit=_nested(m))
            if heldout:
                chosen = circuit.top(circuit.chosen)
                randoms = [np.asarray(r) for per_size in circuit.random for r in per_size]
                m_random = row.patched_metrics(target, masks(circuit.shape, randoms)) if randoms else np.zeros(0)
                necessity = row.patched_metrics(target, masks(circuit.shape, [], [chosen, *map(np.asarray, circuit.necessity_random)]))
                minimal = row.patched_metrics(target, masks(circuit.shape, [np.delete(chosen, j) for j in range(len(chosen))]
                                                           + [np.append(chosen, e) for e in circuit.plus_edges]))
                per_size = [len(r) for r in circuit.random]
                entry.update(m_random=[_nested(part) for part in np.split(m_random, np.cumsum(per_size)[:-1])] if randoms else [],
                             m_without_circuit=float(necessity[0]), m_without_random=_nested(necessity[1:]),
                             m_without_edge=_nested(minimal[:len(chosen)]), m_with_random_edge=_nested(minimal[len(chosen):]))
            out.append(entry)
        return out

    return scorer


# ----------------------------------------------------------------------------- collection
def collect_faithfulness(ctx: RunContext, circuits: Mapping[tuple[str, str], Circuit], items: Sequence[Item], *, name: str,
                         ablations: Sequence[str], targets: Any, heldout_groups: set[str], **header: Any) -> pd.DataFrame:
    """The faithfulness rows of ``items`` in ``{name}.jsonl``; the circuits are its recorded configuration
    (a changed ranking or chosen size never mixes with old rows)."""
    sub = replace(ctx, name=name, items=tuple(items), _score_cache={})
    jobs = [Job(item, config, ctx.options.depth, ctx.fmt, conditions)
            for config in ctx.options.configs for item in items
            if (conditions := tuple(f"{pair}|{ab}" for pair in pairs_for(config, ctx.options.pairs) if (config, pair) in circuits
                                    for ab in ablations))]
    if not jobs:
        return pd.DataFrame()
    store = sub.store(k=ctx.options.depth, circuits=[c.header() for c in circuits.values()], ablations=list(ablations), **header)
    run_jobs(sub, store, jobs, faithfulness_scorer(sub, circuits, targets, heldout_groups))
    return load_results(store.path)


@dataclass
class CircuitSummary:
    """Everything the tables, figures, report and claims read."""

    edges: pd.DataFrame
    nodes: pd.DataFrame
    faithfulness: pd.DataFrame
    agreement: pd.DataFrame
    minimality: pd.DataFrame
    planted: pd.DataFrame
    circuits: dict[tuple[str, str], Circuit]
    claims: list[Any]
    messages: list[str]
    note: str
    rows: pd.DataFrame
    heldout: pd.DataFrame


@register("circuit", order=86)
@dataclass(kw_only=True)
class CircuitAnalysis(Analysis):
    """Circuit at the deciding row: DLA, span-labelled edges by AtP/AtP*/EAP-IG, exact patching, faithfulness on held-out groups."""

    min_depth: ClassVar[int] = 1

    buckets: tuple[str, ...] | None = option(("T_wrong",), "keep only these buckets (the circuit explains tool-correct T_wrong items; "
                                             "T_ok partners of pair 'bucket' come from the dataset)", flag="--bucket", repeat=True,
                                             choices=("T_ok", "T_wrong", "T_repair"), group="items")
    k: int | None = depth_option()
    configs: tuple[str, ...] = option(("proc", "basm"), "comma-separated memory configurations", names=("proc", "basm", "app", "base"), minimum=1)
    pairs: tuple[str, ...] = option(PAIRS, "comma-separated counterfactual pairs: config (BASM vs Proc), bucket (T_wrong vs T_ok), "
                                    "knockout (B knocked out)", names=PAIRS, minimum=1, group="circuit")
    score: str = option("eap_ig", "the edge score that ranks edges (chosen before the run)", choices=SCORES, group="circuit")
    ig_steps: int = option(DEFAULT_IG_STEPS, "EAP-IG midpoints", type=int, minimum=1, group="circuit")
    exact_top: int = option(DEFAULT_EXACT_TOP, "edges verified by exact patching: the top N by |score| per record", type=int, minimum=0,
                            group="circuit")
    exact_random: int = option(DEFAULT_EXACT_RANDOM, "... and this many others drawn with the seed", type=int, minimum=0, group="circuit")
    random_circuits: int = option(DEFAULT_RANDOM_CIRCUITS, "random layer-matched circuits per size", type=int, minimum=1, group="circuit")
    threshold: float = option(DEFAULT_THRESHOLD, "faithfulness the chosen circuit must reach on train (MIB: 0.8)", type=float,
                              minimum=0.0, maximum=1.0, exclusive=True, why="a share of the full − empty gap", group="circuit")

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        items, abstain = tested(ctx.items)
        if not items:
            raise AnalysisError("circuit: no tool-correct T_wrong item selected (the circuit explains the tool-choice metric)")
        ctx.items = tuple(items)
        train, heldout = split_groups(i.task_group for i in items)
        native = isinstance(ctx.session, EngineSession)
        jobs = [Job(item, config, ctx.options.depth, ctx.fmt, ("dla", *(pairs_for(config, ctx.options.pairs) if native else ())))
                for item in items for config in ctx.options.configs]
        store = ctx.store(k=ctx.options.depth, spans=[*SPAN_ORDER, "other"], train_groups=sorted(train), heldout_groups=sorted(heldout),
                          excluded_abstain=abstain)
        run_jobs(ctx, store, jobs, edge_scorer(ctx, train) if native else backend_scorer(ctx, train))
        return load_results(store.path)

    # ------------------------------------------------------------------------------ summary
    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> CircuitSummary:
        """Rank edges on train, choose each circuit's size on train, test it on the held-out groups."""
        a = ctx.options
        items = list(ctx.items)
        train_groups, heldout_groups = split_groups(i.task_group for i in items)
        rows = rows.assign(skipped=rows.get("skipped", pd.Series("", index=rows.index)).fillna(""),
                           pair=rows.get("pair", pd.Series("", index=rows.index)))  # a backend run writes DLA rows only
        pair_rows = rows[rows["condition"] != "dla"]
        scored = pair_rows[pair_rows["skipped"] == ""]
        messages = [f"split: {len(train_groups)} train task groups choose each circuit, {len(heldout_groups)} held-out groups test it"]
        if not isinstance(ctx.session, EngineSession):
            messages.append(f"--backend {a.backend}: DLA and the exact B-knockout effect per head only (circuit_nodes.csv); attribution "
                            "patching, node ablation, circuits and faithfulness run on the native engine (rerun without --backend)")
        for (config, pair), sub in pair_rows[pair_rows["skipped"] != ""].groupby(["config", "pair"]):
            messages.append(f"{config} × {pair}: {len(sub)} records without a counterfactual ({'; '.join(sorted(set(sub['skipped'])))})")
        circuits: dict[tuple[str, str], Circuit] = {}
        for (config, pair), sub in scored.groupby(["config", "pair"], sort=True):
            train = sub[sub["half"] == "train"]
            held_out_check(train_groups, heldout_groups, train["task_group"])
            if not len(train):
                messages.append(f"{config} × {pair}: no scored train record, no circuit")
                continue
            ranking, mean = rank_edges(train, a.score)
            shape = (int(sub["n_layers"].iloc[0]), int(sub["n_heads"].iloc[0]), len(sub["spans"].iloc[0]))
            circuits[(config, pair)] = Circuit(config, pair, shape, tuple(sub["spans"].iloc[0]), tuple(int(x) for x in ranking), tuple(float(x) for x in mean),
                                               grid_sizes(int(np.prod(shape))))
        train_items = [i for i in items if i.task_group in train_groups]
        heldout_items = [i for i in items if i.task_group in heldout_groups]
        cache: dict[str, TrainTargets] = {}

        def targets() -> TrainTargets:
            if "train" not in cache:
                cache["train"] = train_targets(ctx, train_items, a.configs)
            return cache["train"]

        header = {"score": a.score, "threshold": a.threshold, "train_task_groups": sorted(train_groups), "heldout_task_groups": sorted(heldout_groups)}
        train_rows = collect_faithfulness(ctx, circuits, train_items, name=f"{NAME}_train", ablations=(HEADLINE_ABLATION,),
                                          targets=targets, heldout_groups=heldout_groups, **header)
        chosen, curves = {}, []
        for key, c in circuits.items():
            sub = _usable(train_rows, key)
            if not len(sub):
                messages.append(f"{key[0]} × {key[1]}: no train faithfulness row, no circuit chosen")
                continue
            curve = faithfulness_curve(c.sizes, c.n_edges, _stack(sub["m_circuit"]), sub["m_empty"], sub["m_full"], sub["task_group"],
                                       seed=a.seed)
            curves.append(curve.assign(config=key[0], pair=key[1], ablation=HEADLINE_ABLATION, half="train"))
            size, reason = smallest_faithful_size(c.sizes, curve["faithfulness"], threshold=a.threshold)
            if size is None:
                messages.append(f"{key[0]} × {key[1]}: no circuit chosen on train ({reason})")
                continue
            chosen[key] = self._with_draws(c, size, a.random_circuits, a.seed)
            if size == c.n_edges:
                messages.append(f"{key[0]} × {key[1]}: only the full edge set reaches {a.threshold:g} of the train gap: no proper sub-circuit")
        heldout_rows = collect_faithfulness(ctx, chosen, heldout_items, name=f"{NAME}_heldout", ablations=ABLATIONS, targets=targets,
                                            heldout_groups=heldout_groups, **header)
        claims, minimality = [], []
        for key, c in chosen.items():
            for ablation in ABLATIONS:
                sub = _usable(heldout_rows, key, ablation)
                if not len(sub):
                    continue
                if reason := faithfulness_undefined(sub["m_empty"], sub["m_full"]):
                    messages.append(f"{key[0]} × {key[1]} ({ablation}), held-out: {reason}")
                curve = faithfulness_curve(c.sizes, c.n_edges, _stack(sub["m_circuit"]), sub["m_empty"], sub["m_full"], sub["task_group"],
                                           seed=a.seed)
                curves.append(_with_random_band(curve, c, sub).assign(config=key[0], pair=key[1], ablation=ablation, half="heldout"))
                if ablation != HEADLINE_ABLATION:
                    continue
                at = c.sizes.index(c.chosen)
                groups = sub["task_group"].to_numpy()
                label = f"{key[0]}, {key[1]} pair, {c.chosen} edges"
                if c.random[at]:
                    claims.append(sufficiency_claim(_stack(sub["m_circuit"])[:, at], np.stack([np.asarray(r[at]) for r in sub["m_random"]]),
                                                    sub["m_empty"], sub["m_full"], groups, name=f"sufficiency: {label}", seed=a.seed))
                if c.necessity_random:
                    claims.append(partial_necessity_claim(sub["m_full"], sub["m_without_circuit"], _stack(sub["m_without_random"]),
                                                          sub["m_empty"], groups, name=f"partial necessity: {label}", seed=a.seed))
                f_c = faithfulness(_stack(sub["m_circuit"])[:, at], sub["m_empty"], sub["m_full"])
                if c.plus_edges and math.isfinite(f_c):
                    without = [faithfulness(col, sub["m_empty"], sub["m_full"]) for col in _stack(sub["m_without_edge"]).T]
                    added = [faithfulness(col, sub["m_empty"], sub["m_full"]) for col in _stack(sub["m_with_random_edge"]).T]
                    table, claim = minimality_table(c.top(c.chosen), f_c, without, added, name=f"minimality: {label}")
                    minimality.append(table.assign(config=key[0], pair=key[1]))
                    claims.append(claim)
        edges, agreement = edge_tables(scored, circuits, chosen, a.score)
        planted = planted_table(ctx, chosen)
        if len(planted):
            for r in planted.itertuples():
                if r.config == "basm" and r.pair == HEADLINE_PAIR:
                    claims.append(r.claim)
        nodes = node_table(rows, a.seed)
        graphs = write_graphs(ctx, edges, nodes, chosen, pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(),
                              heldout_items) if world().rank == 0 else []
        messages += [f"circuit graph: {path}" for path in graphs]
        return CircuitSummary(edges, nodes, pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(),
                              agreement, pd.concat(minimality, ignore_index=True) if minimality else pd.DataFrame(),
                              planted.drop(columns="claim") if len(planted) else planted, chosen, claims, messages,
                              circuit_note(ctx), rows, heldout_rows)

    @staticmethod
    def _with_draws(c: Circuit, size: int, draws: int, seed: int) -> Circuit:
        """The circuit at its chosen ``size`` with its random references drawn once (the same for every record)."""
        rng = np.random.default_rng([seed, zlib.crc32(f"{c.config}|{c.pair}".encode())])
        layers = c.layers()

        def matched(n: int) -> tuple[tuple[int, ...], ...]:
            if not 0 < n < c.n_edges:
                return ()
            try:
                return tuple(tuple(int(e) for e in r) for r in layer_matched_circuits(layers, c.top(n), draws=draws, rng=rng))
            except ValueError:  # a layer of the circuit has too few edges outside it: no layer-matched reference at this size
                return ()
        random = tuple(matched(n) for n in c.sizes)
        chosen = c.top(size)
        pool = np.setdiff1d(np.flatnonzero(np.isin(layers, layers[chosen])), chosen)
        plus = tuple(int(e) for e in rng.choice(pool, size=min(draws, pool.size), replace=False)) if pool.size and size else ()
        return replace(c, chosen=size, random=random, necessity_random=random[c.sizes.index(size)], plus_edges=plus)

    def tables(self, summary: CircuitSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_faithfulness": summary.faithfulness, f"{NAME}_edges": summary.edges, f"{NAME}_nodes": summary.nodes,
                f"{NAME}_agreement": summary.agreement, f"{NAME}_minimality": summary.minimality, f"{NAME}_planted": summary.planted}

    def claims(self, summary: CircuitSummary) -> list[Any]:
        return list(summary.claims)

    def figures(self, summary: CircuitSummary, out_dir: Path) -> list[Path]:
        plots.style()
        out = []
        for config in sorted({key[0] for key in summary.circuits}):
            fig = fig21_circuit(summary, config)
            if fig is not None:
                out += plots.save_figure(fig, out_dir, f"{FIGURE}_{config}")
        return out

    def section(self, ctx: RunContext, summary: CircuitSummary, figures: list[Path]) -> ReportSection:
        return ReportSection(NAME, "Circuit at the deciding row (`circuit`)", figures, section_markdown(summary), [], summary, list(summary.claims))

    def print_summary(self, summary: CircuitSummary) -> None:
        for message in summary.messages:
            print(message)
        f = summary.faithfulness
        for r in chosen_rows(f).itertuples():
            print(f"{r.config} × {r.pair} ({r.ablation}): {r.n_edges} edges, held-out faithfulness {r.faithfulness:.3f} "
                  f"[{r.low:.3f}, {r.high:.3f}] (random {r.random_mean:.3f} [{r.random_low:.3f}, {r.random_high:.3f}]), integrated {r.integrated:.3f}")
        for r in summary.planted.itertuples() if len(summary.planted) else ():
            print(f"planted {r.planted_edges}: ranks among edges from B {r.ranks_among_B_edges}; {r.in_circuit} in the {r.config} × {r.pair} "
                  f"circuit of {r.circuit_size} (p = {r.p:.3g})")


# ----------------------------------------------------------------------------- the graph files
def write_graphs(ctx: RunContext, edges: pd.DataFrame, nodes: pd.DataFrame, chosen: Mapping[tuple[str, str], Circuit],
                 curves: pd.DataFrame, heldout_items: Sequence[Item]) -> list[Path]:
    """One circuit graph file per chosen circuit (probes.reporting.circuit_graph), its prompt the first held-out
    item's, with every head's deciding-row attention."""
    if not heldout_items or not chosen:
        return []
    item = heldout_items[0]
    out = []
    for config in sorted({key[0] for key in chosen}):
        record = Job(item, config, ctx.options.depth, ctx.fmt, ()).build(ctx.builder)
        row, d = binding_row(ctx.session, record, item, ctx.dataset.catalog_for(item).names)
        condition = ctx.session.run(list(d.ids), [min(record.query_rows), row.row], record_rows=True).conditions[0]
        weights = condition.rows[:, :, -1, : row.row + 1].float().numpy()
        tokens = [ctx.session.tokenizer.decode([t]) for t in d.ids]
        spans = {name: _ranges(np.flatnonzero(row.span_of == j)) for j, name in enumerate(row.spans)}
        prompt = {"tokens": tokens, "spans": spans, "deciding_row": row.row,
                  "attention": {f"{layer}.{head}": weights[layer, head].tolist() for layer in range(row.n_layers) for head in range(row.n_heads)}}
        for key, c in chosen.items():
            if key[0] != config:
                continue
            e = edges[(edges["config"] == key[0]) & (edges["pair"] == key[1])]
            e = e.assign(score=e[ctx.options.score], atp_disagrees=e["estimate_disagrees"])
            n = nodes[nodes["config"] == config].assign(pair=key[1])
            n = n.assign(patch_total=n.get(f"patch_total_{key[1]}", np.nan), patch_direct=n.get(f"patch_direct_{key[1]}", np.nan))
            at = chosen_rows(curves)
            at = at[(at["config"] == key[0]) & (at["pair"] == key[1]) & (at["ablation"] == HEADLINE_ABLATION)]
            meta = {"model": model_label(ctx.model_path), "config": key[0], "pair": key[1], "bucket": "T_wrong", "item_id": item.id,
                    "score": ctx.options.score, "circuit_size": int(c.chosen), "ablation": HEADLINE_ABLATION,
                    "faithfulness": float(at["faithfulness"].iloc[0]) if len(at) else math.nan}
            out.append(write_circuit_graph(ctx.output, graph_file(*key), circuit_graph(e, n, prompt, meta)))
    return out


def chosen_rows(curves: pd.DataFrame) -> pd.DataFrame:
    """The held-out faithfulness rows at each circuit's chosen size (none when no circuit was chosen)."""
    if not len(curves) or "chosen" not in curves:
        return curves.iloc[:0]
    return curves[(curves["half"] == "heldout") & curves["chosen"].fillna(False).astype(bool)]


def _ranges(positions: np.ndarray) -> list[list[int]]:
    """Sorted positions as half-open runs [[start, end), ...]."""
    if not positions.size:
        return []
    breaks = np.flatnonzero(np.diff(positions) > 1)
    starts = np.r_[positions[0], positions[breaks + 1]]
    ends = np.r_[positions[breaks], positions[-1]] + 1
    return [[int(a), int(b)] for a, b in zip(starts, ends)]


# ----------------------------------------------------------------------------- tables
def _usable(rows: pd.DataFrame, key: tuple[str, str], ablation: str = HEADLINE_ABLATION) -> pd.DataFrame:
    if not len(rows):
        return rows
    skipped = rows["skipped"].fillna("") if "skipped" in rows else pd.Series("", index=rows.index)
    return rows[(rows["config"] == key[0]) & (rows["pair"] == key[1]) & (rows["ablation"] == ablation) & (skipped == "")]


def _stack(column: pd.Series) -> np.ndarray:
    return np.stack([np.asarray(v, dtype=float) for v in column])


def _with_random_band(curve: pd.DataFrame, c: Circuit, rows: pd.DataFrame) -> pd.DataFrame:
    """The curve with, per size, the random layer-matched circuits' faithfulness (pooled over items):
    mean and 2.5–97.5 percentiles over the draws."""
    out = curve.copy()
    stats = {"random_mean": [], "random_low": [], "random_high": [], "random_draws": []}
    for at, _n in enumerate(c.sizes):
        draws = len(c.random[at])
        values = [faithfulness(np.asarray([r[at][d] for r in rows["m_random"]]), rows["m_empty"], rows["m_full"]) for d in range(draws)]
        values = np.asarray(values, dtype=float)
        finite = values[np.isfinite(values)]
        stats["random_draws"].append(draws)
        stats["random_mean"].append(float(finite.mean()) if finite.size else math.nan)
        stats["random_low"].append(float(np.percentile(finite, 2.5)) if finite.size else math.nan)
        stats["random_high"].append(float(np.percentile(finite, 97.5)) if finite.size else math.nan)
    out = out.assign(**stats, chosen=[n == c.chosen for n in c.sizes])
    fractions = np.asarray(c.sizes, dtype=float) / c.n_edges
    return out.assign(integrated=integrated_faithfulness(fractions, out["faithfulness"].to_numpy(float)))


def edge_tables(scored: pd.DataFrame, circuits: Mapping[tuple[str, str], Circuit], chosen: Mapping[tuple[str, str], Circuit],
                score: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per edge: every score's train mean, rank, circuit membership, the exact effect where verified and
    whether the ranking score disagreed with it; and per (configuration, pair, estimator) the agreement
    of estimate and exact patching pooled over the verified (record, edge) instances."""
    edges, agreement = [], []
    for key, c in circuits.items():
        sub = scored[(scored["config"] == key[0]) & (scored["pair"] == key[1])]
        train = sub[sub["half"] == "train"]
        frame = edge_index(*c.shape)
        frame["span"] = [sub["spans"].iloc[0][j] for j in frame["span_index"]]
        for name in SCORES:
            frame[name] = rank_edges(train, name)[1]
        frame["rank"] = np.argsort(np.asarray(c.ranking)) + 1
        size = chosen[key].chosen if key in chosen else None
        frame["in_circuit"] = frame["rank"] <= size if size is not None else False
        # the verified instances: (record, edge, exact, every estimate)
        inst = [(e, x, *(np.asarray(getattr(r, name), dtype=float).ravel()[e] for name in SCORES))
                for r in sub.itertuples() for e, x in zip(r.exact_edges, r.exact)]
        verified = pd.DataFrame(inst, columns=["edge", "exact", *SCORES])
        flags = np.zeros(len(verified), dtype=bool)
        for name in SCORES:
            if len(verified) < 2:
                break
            truth = verified["exact"].abs() if name == "atp_gd" else verified["exact"]  # GradDrop is unsigned
            found, disagrees = estimate_agreement(verified[name], truth)
            agreement.append({"config": key[0], "pair": key[1], "estimator": name, **found})
            if name == score:
                flags = disagrees
        verified["disagrees"] = flags
        per_edge = verified.groupby("edge").agg(exact=("exact", "mean"), n_exact=("exact", "size"), estimate_disagrees=("disagrees", "any"))
        frame = frame.join(per_edge, how="left")
        frame["n_exact"] = frame["n_exact"].fillna(0).astype(int)
        frame["estimate_disagrees"] = frame["estimate_disagrees"].fillna(False).astype(bool)
        edges.append(frame.assign(config=key[0], pair=key[1], n_train=len(train)))
    cols = ["config", "pair", "layer", "head", "span", "rank", "in_circuit", *SCORES, "exact", "n_exact", "estimate_disagrees", "n_train"]
    return (pd.concat(edges, ignore_index=True)[cols].sort_values(["config", "pair", "rank"]) if edges else pd.DataFrame(columns=cols),
            pd.DataFrame(agreement))


def node_table(rows: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Per configuration and node (embedding, head, MLP): DLA (mean with a task-group CI) beside the exact
    effect of zeroing it at the deciding row, and per pair the exact effect of patching it (total) and its
    direct part; ``disagree`` says where DLA is not the exact effect."""
    out = []
    for config, sub in rows.groupby("config", sort=True):
        dla = sub[sub["condition"] == "dla"]
        if not len(dla):
            continue
        groups = dla["task_group"].to_numpy()
        heads, mlps = _stack(dla["dla_heads"]), _stack(dla["dla_mlps"])
        ab_heads, ab_mlps = _stack(dla["head_ablate"]), _stack(dla["mlp_ablate"])
        nodes = [("embed", -1, -1, dla["dla_embed"].to_numpy(float), np.full(len(dla), np.nan))]
        nodes += [("head", layer, head, heads[:, layer, head], ab_heads[:, layer, head])
                  for layer in range(heads.shape[1]) for head in range(heads.shape[2])]
        nodes += [("mlp", layer, -1, mlps[:, layer], ab_mlps[:, layer]) for layer in range(mlps.shape[1])]
        pairs = sub[(sub["condition"] != "dla") & (sub["skipped"] == "")]
        for kind, layer, head, d, ablate in nodes:
            est = bootstrap_mean(d, groups, seed=seed)
            entry = {"config": config, "kind": kind, "layer": layer, "head": head, "dla": est.value, "dla_low": est.low, "dla_high": est.high,
                     "ablate_total": float(np.nanmean(ablate)) if np.isfinite(ablate).any() else math.nan, "n": len(dla)}
            for pair, ps in pairs.groupby("pair"):
                if kind == "embed":
                    continue
                total = _stack(ps[f"{kind}_patch"])
                direct = _stack(ps[f"{kind}_patch_direct"])
                pick = (slice(None), layer, head) if kind == "head" else (slice(None), layer)
                entry[f"patch_total_{pair}"], entry[f"patch_direct_{pair}"] = float(total[pick].mean()), float(direct[pick].mean())
            if kind == "head" and "boundary_knockout" in dla:
                entry["boundary_knockout_exact"] = float(np.nanmean(_stack(dla["boundary_knockout"])[:, layer, head]))
            entry["disagree"] = dla_disagreement(entry["dla"], entry["ablate_total"])
            out.append(entry)
    return pd.DataFrame(out)


def dla_disagreement(dla: float, ablate: float) -> str:
    """Where zeroing a node does not remove its direct contribution (−DLA), beyond the agreement tolerance
    of the edge estimates: later components compensate or amplify."""
    if not (math.isfinite(dla) and math.isfinite(ablate)) or abs(ablate + dla) <= AGREEMENT_ABS_TOL + AGREEMENT_REL_TOL * abs(dla):
        return ""
    if abs(ablate) < abs(dla):
        return f"DLA {dla:+.2f} but zeroing it moves the metric {ablate:+.2f}: later components compensate"
    return f"DLA {dla:+.2f} but zeroing it moves the metric {ablate:+.2f}: its effect runs mostly through later components"


def planted_table(ctx: RunContext, chosen: Mapping[tuple[str, str], Circuit]) -> pd.DataFrame:
    """The organism's planted verdict heads' edges from B: their ranks among edges from B and whether the
    circuit chosen on train holds them (with the claim's hypergeometric p). Empty for any other model."""
    planted = planted_heads(ctx.model_path)
    if not planted:
        return pd.DataFrame()
    verdict = {head for target, head in planted if target in PLANTED_FROM_B}
    out = []
    for key, c in chosen.items():
        if key[0] != "basm":  # the planted heads read B, which only BASM's prompts show
            continue
        layer, head, span = np.unravel_index(np.arange(c.n_edges), c.shape)
        from_b = np.asarray([c.spans[j] == "boundary" for j in span])
        is_planted = from_b & np.asarray([(int(l), int(h)) in verdict for l, h in zip(layer, head)])
        in_circuit = np.isin(np.arange(c.n_edges), c.top(c.chosen))
        scores = np.asarray(c.mean_score)
        found = planted_recovery(scores, from_b, is_planted, in_circuit)
        claim = planted_claim(scores, from_b, is_planted, in_circuit, name=f"planted heads in circuit: {key[0]}, {key[1]} pair")
        out.append({"config": key[0], "pair": key[1], "planted_edges": ", ".join(f"L{l}.H{h}<-B" for l, h in sorted(verdict)),
                    "ranks_among_B_edges": ", ".join(str(r) for r in found["ranks"].values()), "n_from_B": found["n_from_boundary"],
                    "in_circuit": found["n_planted_in_circuit"], "circuit_size": found["circuit_size"], "n_edges": found["n_edges"],
                    "p": found["p"], "claim": claim})
    return pd.DataFrame(out)


def circuit_note(ctx: RunContext) -> str:
    a = ctx.options
    return (f"{provenance(ctx)}\ndeciding row: logit(wrong) − logit(correct) of the binding pair · edges: (layer, head, source span) · "
            f"ranked on train task groups by |mean {a.score}| (EAP-IG: {a.ig_steps} midpoints) · size: smallest on the MIB grid with train "
            f"faithfulness ≥ {a.threshold:g} · held-out: outside edges ablated by the counterfactual (headline), the train mean, a train "
            f"item (resample) · random circuits: {a.random_circuits} layer-matched draws")


def section_markdown(summary: CircuitSummary) -> str:
    """The report's text: what the circuits are, how faithful on held-out groups, the checks beside them."""
    lines = [f"One circuit per configuration and counterfactual pair ({', '.join(f'`{p}`: {t}' for p, t in PAIR_TEXT.items())}); "
             f"the claims test the `{HEADLINE_ABLATION}` ablation (the counterfactual's messages outside the circuit, as MIB does); the "
             "mean and resample ablations are reported beside it, since faithfulness moves with the ablation.", ""]
    lines += [f"- {m}" for m in summary.messages]
    f = summary.faithfulness
    if len(at := chosen_rows(f)):
        cols = ["config", "pair", "ablation", "n_edges", "fraction", "faithfulness", "low", "high", "random_mean", "random_low",
                "random_high", "integrated"]
        lines += ["", "**Held-out faithfulness at the size chosen on train** (ratio of means over items; CI over task groups; "
                  "random: layer-matched circuits of the same size, 2.5–97.5 percentiles over draws):", "",
                  markdown_table(at[[c for c in cols if c in at]].round(3))]
    if len(summary.agreement):
        lines += ["", f"**Estimates against exact patching** (verified edges pooled over records; disagreement: |estimate − exact| > "
                  f"{AGREEMENT_ABS_TOL:g} + {AGREEMENT_REL_TOL:g}·|exact|; GradDrop is unsigned and compared with |exact|):", "",
                  markdown_table(summary.agreement.drop(columns=["note"], errors="ignore").round(3))]
    if len(summary.planted):
        lines += ["", "**Ground truth (the organism).** Its planted verdict heads read the risk cues and avoidance rules (B) from the "
                  "deciding row; their edges from B should lead the ranking and sit in the circuit:", "",
                  markdown_table(summary.planted.round(4))]
    nodes = summary.nodes
    if len(nodes) and "disagree" in nodes:
        odd = nodes[nodes["disagree"] != ""]
        lines += ["", f"**DLA is not causal importance.** {len(odd)} of {len(nodes)} nodes move the metric, when zeroed at the deciding "
                  "row, by more than the tolerance away from their direct contribution (see `circuit_nodes.csv`)."]
        if len(odd):
            top = odd.reindex(odd["dla"].abs().sort_values(ascending=False).index).head(5)
            lines += [f"- {r.config} {r.kind} L{r.layer}" + (f".H{r.head}" if r.head >= 0 else "") + f": {r.disagree}" for r in top.itertuples()]
    return "\n".join(lines)


# --- Figures (they shape no row)
def fig21_circuit(summary: CircuitSummary, config: str) -> plt.Figure | None:
    """One configuration: DLA per head (layer × head), the headline pair's mean edge score per source span
    (layer × head, B outlined), and the held-out faithfulness curves with the random circuits' band."""
    key = (config, HEADLINE_PAIR) if (config, HEADLINE_PAIR) in summary.circuits else next(k for k in summary.circuits if k[0] == config)
    c = summary.circuits[key]
    nodes = summary.nodes[(summary.nodes["config"] == config) & (summary.nodes["kind"] == "head")]
    L, H, S = c.shape
    fig = plt.figure(figsize=(3.0 + 1.6 * S, 6.2))
    grid = fig.add_gridspec(2, S + 1)
    ax = fig.add_subplot(grid[0, 0])
    dla = np.full((L, H), np.nan)
    for r in nodes.itertuples():
        dla[r.layer, r.head] = r.dla
    lim = float(np.nanmax(np.abs(dla))) if np.isfinite(dla).any() else 1.0
    image = ax.imshow(dla, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax.set(title="DLA (logits)", xlabel="head", ylabel="layer", xticks=range(H), yticks=range(L))
    ax.grid(False)
    fig.colorbar(image, ax=ax, shrink=0.8)
    score = np.asarray(c.mean_score).reshape(c.shape)
    lim = float(np.nanmax(np.abs(score))) or 1.0
    for j, span in enumerate(c.spans):
        ax = fig.add_subplot(grid[0, j + 1])
        image = ax.imshow(score[:, :, j], cmap="PuOr_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_title(span.replace("_", " "), fontweight="bold" if span == "boundary" else "normal", fontsize=9)
        ax.set(xticks=[], yticks=[])
        if span == "boundary":
            for side in ax.spines.values():
                side.set(color="crimson", linewidth=2)
    fig.colorbar(image, ax=ax, shrink=0.8, label="edge score (train mean)")
    ax = fig.add_subplot(grid[1, :])
    f = summary.faithfulness
    for (pair, ablation), sub in f[(f["config"] == config) & (f["half"] == "heldout")].groupby(["pair", "ablation"]):
        x = sub["fraction"].to_numpy(float)
        line = ax.plot(x, sub["faithfulness"], marker="o", ms=3, label=f"{pair} · {ablation}",
                       linewidth=2 if (pair, ablation) == (HEADLINE_PAIR, HEADLINE_ABLATION) else 1)[0]
        if ablation == HEADLINE_ABLATION:
            ax.fill_between(x, sub["random_low"], sub["random_high"], color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set(xlabel="fraction of edges kept", ylabel="faithfulness (held-out)",
           title=f"{config}: faithfulness; shaded: random layer-matched circuits (95% of draws)")
    ax.axhline(1.0, color="0.6", linewidth=0.8)
    ax.legend(fontsize=7, ncols=3)
    fig.suptitle(f"Circuit at the deciding row, {config} (edge scores: {key[1]} pair)", fontsize=11)
    return fig
