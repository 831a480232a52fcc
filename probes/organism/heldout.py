"""Held-out behaviour of the organism with plain transformers forward passes (no probe engine).

Used by the training command to fill the model card, and as an independent cross-check of the
probe engine: candidate scoring, accuracy and the wrong-tool margin per configuration × bucket × k,
plus a small same-prompt knockout and attention-ratio check written directly against HF masks.

Scores follow ``probes.scoring.margins`` (native format, log-probability form): a tool ``y`` scores
``log P(forced prefix | open row) + log P(y | decision row)``; abstaining scores
``log(1 − P(<tool_call> | open row))``. The margin is the path margin with abstention over those
scores (``path`` in :mod:`probes.scoring.margins`; not Eq. 1, which compares first-token logits at one
row): ``max_wrong − max(correct, abstain)``. Tool names are single tokens of the organism's tokenizer,
so first-token sets never collide.

Why this module scores candidates itself rather than through the one record scorer
(:func:`probes.scoring.score.score_record`): it is the engine's independent cross-check, so its
forward passes and knockouts are plain transformers calls (no probe engine); its accuracy is the
argmax over every candidate action (every catalog tool and abstention), which the scorer does not
compute; and its margin is the path margin over the first name token with abstention at the open
row (``path`` sums every continuation token, the same on this tokenizer's one-token names;
``first_token`` leaves abstention out, ``eq1`` is undefined in the native format). The tool-only
first-token margin (``tool_margin``) is the scorer's own :func:`probes.scoring.margins.first_token_margin`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen3ForCausalLM

from probes.data.dataset import ABSTAIN, ProbeDataset, load_dataset
from probes.organism import ORGANISM_NAME
from probes.organism.train.batch import shared_prefix_hidden
from probes.prompts.builder import PromptBuilder, make_builder
from probes.prompts.record import PromptRecord
from probes.scoring.margins import candidates_from_record, first_token_margin
from probes.scoring.stats import bootstrap_mean

EVAL_CONFIGS: tuple[str, ...] = ("base", "proc", "app", "basm")


@dataclass
class Scored:
    record_id: str
    item_id: str
    task_group: str
    bucket: str
    config: str
    k: int
    correct: str
    predicted: str
    margin: float  # the path margin with abstention (log-probabilities of the first name token)
    tool_margin: float  # best wrong tool − correct tool, raw decision-row logits (nan for abstain items; margins.first_token_margin)


def load_organism(path: str | Path, attn: str = "sdpa") -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerBase]:
    model = Qwen3ForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation=attn, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return model, tokenizer


def make_eval_builder(tokenizer: PreTrainedTokenizerBase, dataset: ProbeDataset, embedder: str = "auto") -> PromptBuilder:
    return make_builder(tokenizer, dataset, embedder=embedder, tokenizer_name=ORGANISM_NAME)


def _score_record(record: PromptRecord, logp: torch.Tensor, logits_decision: torch.Tensor) -> tuple[str, float, float]:
    """``logp``: log-softmax rows open_index..decision_index of one record."""
    ids = record.input_ids
    open_index, decision = record.open_index, record.decision_index
    prefix = sum(float(logp[r - open_index, ids[r + 1]]) for r in range(open_index, decision))
    p_open = float(logp[0, ids[open_index + 1]].exp())
    scores: dict[str, float] = {}
    roles: dict[str, str] = {}
    for candidate in record.candidates:
        action = candidate.action
        roles[action] = candidate.role
        if action == ABSTAIN:
            scores[action] = float(np.log(max(1e-12, 1.0 - p_open)))
        else:
            scores[action] = prefix + float(logp[decision - open_index, candidate.first_token_id])
    predicted = max(scores, key=scores.get)
    wrong = max(scores[a] for a, r in roles.items() if r == "wrong")
    control = max(scores[a] for a, r in roles.items() if r in ("correct", "abstain"))
    tool_margin = first_token_margin({decision: logits_decision}, candidates_from_record(record), "native", decision).value
    return predicted, wrong - control, tool_margin


@torch.no_grad()
def score_records(model: Qwen3ForCausalLM, records: Sequence[PromptRecord], batch_size: int = 8) -> list[Scored]:
    """Candidate scores of native records, batched by shared prompt prefix."""
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_group[record.input_ids[0:1] and record.text[:200]].append(record)
    out: list[Scored] = []
    for group in by_group.values():
        group.sort(key=lambda r: len(r.input_ids))
        for start in range(0, len(group), batch_size):
            batch = group[start : start + batch_size]
            hidden, prefix = shared_prefix_hidden(model, [r.input_ids for r in batch], min(r.open_index for r in batch))
            for row, record in enumerate(batch):
                rows = hidden[row, record.open_index - prefix : record.decision_index - prefix + 1]
                logits = model.lm_head(rows).float()
                predicted, margin, tool_margin = _score_record(record, logits.log_softmax(-1), logits[-1])
                out.append(Scored(
                    record.record_id, record.item_id, record.task_group, record.bucket, record.config,
                    record.k, record.correct_action, predicted, margin, tool_margin,
                ))
    return out


def build_eval_records(builder: PromptBuilder, items, configs: Sequence[str], ks: Sequence[int]) -> list[PromptRecord]:
    builder.warm(items)
    return list(builder.build_many(items, configs, ks, ["native"]))


def group_ci(values: Sequence[float], groups: Sequence[str]) -> tuple[float, float, float]:
    """Mean of task-group means with its 95% cluster-bootstrap CI (:func:`probes.scoring.stats.bootstrap_mean`);
    NaN values (e.g. the tool margin of abstain items) are left out."""
    keep = np.isfinite(np.asarray(values, dtype=float))
    estimate = bootstrap_mean(np.asarray(values, dtype=float)[keep], np.asarray(groups)[keep])
    return estimate.value, estimate.low, estimate.high


def accuracy_table(scored: Sequence[Scored]) -> list[dict[str, Any]]:
    cells: dict[tuple[str, str, int], list[Scored]] = defaultdict(list)
    for s in scored:
        cells[(s.config, s.bucket, s.k)].append(s)
    rows = []
    for (config, bucket, k), group in sorted(cells.items(), key=lambda kv: (EVAL_CONFIGS.index(kv[0][0]) if kv[0][0] in EVAL_CONFIGS else 99, kv[0][1], kv[0][2])):
        wrong_tools_hit = [s.predicted != s.correct and s.predicted != ABSTAIN for s in group]
        mean, lo, hi = group_ci([s.margin for s in group], [s.task_group for s in group])
        rows.append({
            "config": config, "bucket": bucket, "k": k, "n": len(group),
            "accuracy": float(np.mean([s.predicted == s.correct for s in group])),
            "wrong_call_rate": float(np.mean(wrong_tools_hit)),
            "margin_mean": mean, "margin_ci": [lo, hi],
        })
    return rows


# ----------------------------------------------------------------------------- knockout / attention
def _mask(n: int, rows: Sequence[int], blocked: Sequence[int]) -> torch.Tensor:
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    if len(blocked):
        rr = torch.tensor(list(rows))
        mask[rr.unsqueeze(1), torch.tensor(list(blocked)).unsqueeze(0)] = False
    return mask


def _positions(spans: Sequence[Sequence[int]]) -> list[int]:
    return sorted({p for lo, hi in spans for p in range(lo, hi)})


@torch.no_grad()
def knockout_check(model: Qwen3ForCausalLM, records: Sequence[PromptRecord]) -> list[dict[str, Any]]:
    """Same-prompt knockout of decision-row attention (rows open_index and decision_index, all layers
    and heads) to the boundary span and the procedure span. Returns per-record margins per condition.
    (The control, |B| positions of the neutral pool, is the validation's: :func:`probes.organism.validate.control_claim`.)"""
    out = []
    for record in records:
        ids = record.input_ids
        n = len(ids)
        rows = [record.open_index, record.decision_index]
        boundary = _positions(record.spans.get("boundary", []))
        procedure = _positions(record.spans.get("procedure", []))
        conditions = {"none": [], "boundary": boundary, "procedure": procedure}
        masks = torch.stack([_mask(n, rows, blocked) for blocked in conditions.values()]).unsqueeze(1)
        input_ids = torch.tensor([ids] * len(conditions), device=model.device)
        masks = masks.to(model.device)
        logits = model(input_ids=input_ids, attention_mask=masks, logits_to_keep=n - rows[0]).logits.float()
        entry = {"record_id": record.record_id, "task_group": record.task_group, "bucket": record.bucket}
        for c, name in enumerate(conditions):
            rows_logits = logits[c, : record.decision_index - rows[0] + 1]
            _, margin, tool_margin = _score_record(record, rows_logits.log_softmax(-1), rows_logits[-1])
            entry[name] = margin
            entry[f"{name}_tool"] = tool_margin
        out.append(entry)
    return out


@torch.no_grad()
def attention_ratio(model_eager: Qwen3ForCausalLM, records: Sequence[PromptRecord], eps: float = 1e-6) -> list[dict[str, Any]]:
    """Eq. 2 at the decision row, per (layer, head): η = α_B / (α_P + ε) with length-normalised
    attention mass. Needs a model loaded with ``attn_implementation="eager"``."""
    out = []
    for record in records:
        ids = torch.tensor([record.input_ids], device=model_eager.device)
        attentions = model_eager(input_ids=ids, output_attentions=True, logits_to_keep=1).attentions
        d = record.decision_index
        b = _positions(record.spans.get("boundary", []))
        p = _positions(record.spans.get("procedure", []))
        eta = []
        for layer in attentions:
            row = layer[0, :, d]  # [heads, keys]
            eta.append(((row[:, b].mean(-1)) / (row[:, p].mean(-1) + eps)).tolist())
        out.append({"record_id": record.record_id, "bucket": record.bucket, "task_group": record.task_group, "eta": eta})
    return out


DEFAULT_CELLS: tuple[tuple[str, int], ...] = (
    ("base", 0), *((c, k) for c in ("proc", "basm") for k in (1, 2, 3, 4)), ("app", 2),
)


def heldout_report(
    path: str | Path, *, cells: Sequence[tuple[str, int]] = DEFAULT_CELLS, embedder: str = "auto", knockout_items: int | None = None,
) -> dict[str, Any]:
    """Accuracy/margin table on the eval split per (config, k) cell × bucket, plus knockout and η
    summaries on basm k = 2."""
    model, tokenizer = load_organism(path)
    dataset = load_dataset("basm_probe")
    items = dataset.select(split="eval")
    builder = make_eval_builder(tokenizer, dataset, embedder)
    builder.warm(items)
    records = [builder.build(item, config, k) for item in items for config, k in cells]
    scored = score_records(model, records)
    table = accuracy_table(scored)
    basm2 = [r for r in build_eval_records(builder, items, ["basm"], [2])]
    wrong = [r for r in basm2 if r.bucket == "T_wrong"][:knockout_items]
    knock = knockout_check(model, wrong)
    summary: dict[str, Any] = {"table": table, "knockout": {}, "n_eval_items": len(items), "n_knockout": len(wrong)}
    for name in ("boundary", "procedure"):
        delta = [k[name] - k["none"] for k in knock]
        summary["knockout"][name] = group_ci(delta, [k["task_group"] for k in knock])
    summary["knockout"]["base_margin"] = group_ci([k["none"] for k in knock], [k["task_group"] for k in knock])
    eager, _ = load_organism(path, attn="eager")
    ratios = attention_ratio(eager, basm2)
    eta_by_bucket: dict[str, list[float]] = defaultdict(list)
    groups: dict[str, list[str]] = defaultdict(list)
    for entry in ratios:
        eta_by_bucket[entry["bucket"]].append(float(np.median(np.asarray(entry["eta"]))))
        groups[entry["bucket"]].append(entry["task_group"])
    summary["eta_median_over_heads"] = {b: group_ci(v, groups[b]) for b, v in eta_by_bucket.items()}
    summary["eta_per_head"] = {
        b: np.mean([np.asarray(e["eta"]) for e in ratios if e["bucket"] == b], axis=0).round(3).tolist() for b in eta_by_bucket
    }
    return summary
