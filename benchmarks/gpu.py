"""GPU benchmark of the probe engine on a Qwen3-8B-shaped model, or a Gemma 3 270M-shaped one (random bf16
weights, real Qwen3 tokenizer, built locally from a config: nothing is downloaded).

    PYTHONPATH=. python benchmarks/gpu.py [--records 24] [--budget-s 450] [--json out.json]
    PYTHONPATH=. python benchmarks/gpu.py --shape gemma3-270m
    PYTHONPATH=. python benchmarks/gpu.py --tiny [--shape gemma3-270m]  # a tiny shape, fp32, on the CPU (the test)
    PYTHONPATH=. python benchmarks/gpu.py --memory-table  # bf16 weight memory of Qwen3 8B/14B/32B

Sections, side by side in one run (one model instance; its attention implementation is switched):

1. ``records``: per dataset prompt record (real prompt lengths: the native format, configuration
   ``basm`` at k = 1..4, eval items; ``--records`` of them), time and peak memory of a plain sdpa
   forward (``logits_to_keep=1``), of the engine scoring the record with the baseline only
   (``score_record``: every margin and α, so every catalog tool is a scored candidate; ``--tiny``:
   only the correct, wrong and abstain candidates) and with ten knockouts (boundary, procedure,
   four neutral random spans, early and late layer windows, two head sets).
2. ``eager_attn``: HF eager with ``output_attentions=True`` on the longest record.
3. ``mask_4d``: ten full eager forwards of the longest record, each with an explicit per-layer,
   per-head 4D additive mask that removes the knocked keys from the query rows: the reference.
4. ``parity``: the engine's knockout logits (every row from the open row to the decision row)
   against those 4D-mask forwards: max abs difference (bf16 on the GPU) and the logits' scale.
5. ``long``: the engine with ten knockouts at 8k and 32k tokens (random ids; query rows n-8..n-1).
6. ``knockout_analysis``: the knockout analysis' scorer (its deciding-row call, then one
   ``score_record`` with 22 conditions: boundary, 10 neutral random draws, the 10 B-side draws at each
   random draw's attention mass (equal-mass), procedure; every margin)
   on ``--knockout-records`` records, cache cold, in sdpa forwards of the same prompt.
7. ``sweep_item``: the 13 distinct prompts of one item's sweep (k = 0..4 × base, proc, app, basm),
   with the session's prefix reuse and without (``prefix_cache=0``), in sdpa forwards of its
   median prompt; the largest margin difference between the two.
8. ``attribution``: the ``attribution`` analysis' own workload (its job list ``mask_jobs``: K = 12
   masks at f = 0.4 over the library, ``--attribution-items`` T_wrong eval items, both pools; its
   scorer ``mask_scorer``: prefix reuse, identical prompts once) against as many independent
   ``score_record`` calls without reuse, job by job, in sdpa forwards of the run's median prompt.
9. ``circuit``: the ``circuit`` analysis' pieces (:func:`circuit_run`: the deciding rows of the
   first T_wrong eval item's basm prompt at k = 2 and of its proc prompt, AtP + AtP* over every
   (layer, head, span) edge, GradDrop, EAP-IG, exact patching of every edge, DLA + node effects)
   in fp32 (the replay refuses bf16: the model's shape is built again in fp32), in sdpa forwards of
   the clean prompt; a failure is printed as FAILED and recorded under ``failed`` (exit 1).

10. ``steer``: the ``steer`` analysis' cost (:func:`steer_run`, shared with benchmarks/steer.py): the clean scored
   run and the analysis' scorer with C = ``--steer-counts`` random-direction conditions (default 1, 16, 64, 256;
   tiny: 1) at decision rows and at call rows, on the first T_wrong eval item's basm prompt at k = 2 (bf16),
   in sdpa forwards of that prompt, with the prefix tokens computed and reused. Steering had not run on a GPU
   when this section was written: a failure is printed as FAILED, recorded under ``failed`` and makes the
   run exit 1 (the other sections' results are still written).

11. ``analysis LABEL``: the analyses no section above times (``forks``, ``calls --checker``, ``curate``,
   ``repair``: :data:`ANALYSIS_RUNS`, ``--analyses``), each run as a user runs it (``probes.run`` on this
   session, ``--analysis-limit`` items; the model saved to a folder first, by which results are named),
   in sdpa forwards of the steer record per distinct record of its rows. A failure is FAILED (exit 1).

Sections 6-11 run before 5 (which may not fit the budget at 32k). The run ends with one table: analysis,
forwards per prompt, wall time (:func:`cost_table`).

``--shape gemma3-270m``: the same sections on Gemma 3 270M's shape (``Gemma3TextConfig``: 18 layers, five
sliding-window layers of 512 keys to each global one; ``--tiny``: 4 layers, a window of 128 keys); the
4D-mask reference of section 4 applies each layer's window.

Peak memory = ``torch.cuda.max_memory_allocated`` during the call minus the allocation before it
(what the call itself allocated), reset before every call; on the CPU (``--tiny``) it is not measured.
The run budgets its time (``--budget-s``, default 450 s, under the 8-minute bar on one H200):
before each step it projects the step's time from what it has measured and skips it, with the
reason printed and recorded in the JSON, when the rest of the budget would not cover it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from probes.prompts.record import PromptRecord

N_KNOCKOUTS = 10
ATTRIBUTION_MASKS = 12  # skill masks per item of the attribution workload
# Qwen3 shapes (from the public config.json of each checkpoint); 8B is the benchmark's model.
QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "Qwen3-14B": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "Qwen3-32B": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
# Gemma 3 270M's shape (its config.json: 18 layers, five sliding-window layers of 512 keys to each global one,
# one key-value head of 256, QK-norm, a 262,144-token vocabulary); prompts keep the Qwen3 tokenizer's ids,
# which lie inside that vocabulary: what the engine meets is the architecture (sliding windows, QK-norm).
GEMMA3_270M_SHAPE = dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                         head_dim=256, vocab_size=262144, sliding_window=512, query_pre_attn_scalar=256, max_position_embeddings=32768,
                         tie_word_embeddings=True, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3)
# tiny: a window of 128 keys, so the ~1.4k-token prompts cross it on three of the four layers
GEMMA3_TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                         sliding_window=128, query_pre_attn_scalar=16, tie_word_embeddings=True,
                         layer_types=["sliding_attention"] * 3 + ["full_attention"])
SHAPES = ("qwen3-8b", "gemma3-270m")


def qwen3_config(shape: dict[str, Any], **extra: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**{"max_position_embeddings": 40960, "rope_theta": 1_000_000.0, **shape, **extra})


def parameter_count(shape: dict[str, Any]) -> int:
    """Exact parameter count of a Qwen3 of this shape (built on the meta device: no memory)."""
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(qwen3_config(shape))
    return sum(p.numel() for p in model.parameters())


def memory_table() -> list[dict[str, Any]]:
    """bf16 weight memory per Qwen3 size, and the KV cache per 1k tokens (bf16, batch 1)."""
    out = []
    for name, shape in QWEN3_SHAPES.items():
        n = parameter_count(shape)
        kv_per_1k = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2 * 1024
        out.append({"model": name, "parameters": n, "weights_gib_bf16": n * 2 / 2**30, "kv_cache_mib_per_1k_tokens": kv_per_1k / 2**20})
    return out


# --------------------------------------------------------------------------------------------


class Clock:
    """The time budget: ``fits(seconds)`` says whether a step projected to take that long fits."""

    def __init__(self, budget_s: float) -> None:
        self.start, self.budget = time.perf_counter(), budget_s

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def fits(self, projected_s: float) -> bool:
        return projected_s < self.left()


def measure(fn: Callable[[], Any], device: torch.device) -> tuple[float, float | None, Any]:
    """(seconds, peak MiB allocated by the call or None on the CPU, result)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if cuda else None
    return dt, peak, out


def build_model(tiny: bool, device: torch.device, vocab: int, dtype: torch.dtype, shape: str = "qwen3-8b") -> Any:
    """A Qwen3-8B-shaped or Gemma 3 270M-shaped (``shape``; or tiny) causal LM with random weights of
    ``dtype`` on ``device``; a Gemma 3 from a ``Gemma3TextConfig`` directly."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Qwen3ForCausalLM

    if shape == "gemma3-270m":
        cls, cfg = Gemma3ForCausalLM, Gemma3TextConfig(**(GEMMA3_TINY_SHAPE | {"vocab_size": vocab} if tiny else GEMMA3_270M_SHAPE))
    else:
        cls, cfg = Qwen3ForCausalLM, qwen3_config({**TINY_SHAPE, "vocab_size": vocab} if tiny else QWEN3_SHAPES["Qwen3-8B"], max_position_embeddings=40960)
    torch.manual_seed(0)
    with torch.device(device):
        model = cls._from_config(cfg, dtype=dtype)
    return model.eval()


def sliding_windows(cfg: Any) -> list[int | None]:
    """Per layer, the keys a query row sees back (None: every earlier key)."""
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    return [cfg.sliding_window if t == "sliding_attention" else None for t in types]


def knockouts(record: PromptRecord, n_layers: int, n_heads: int, seed: int = 0) -> list[Any]:
    """Ten knockouts of the kinds the analyses run (their spans from the record)."""
    from probes.scoring.score import record_rng
    from probes.engine.session import Knockout
    from probes.scoring.controls import block_lengths, control_pool, draw_span, record_tool_names

    spans = record.spans
    blocks = spans["boundary"]
    pool = control_pool(record, "memory+procedure", record_tool_names(record))  # |B| positions: the cost of a full-size control
    rnd = [draw_span(pool, block_lengths(blocks), record_rng(seed, record.record_id, f"random_{i}"))[0] for i in range(4)]
    half = n_layers // 2
    g = np.random.default_rng(seed)
    heads = [tuple((int(g.integers(n_layers)), int(g.integers(n_heads))) for _ in range(3)) for _ in range(2)]
    conds = [
        Knockout.from_spans("boundary", blocks),
        Knockout.from_spans("procedure", spans["procedure"]),
        *(Knockout(f"random{i}", tuple(r)) for i, r in enumerate(rnd)),
        Knockout.from_spans("boundary_early", blocks, layers=range(half)),
        Knockout.from_spans("boundary_late", blocks, layers=range(half, n_layers)),
        Knockout.from_spans("boundary_heads_a", blocks, heads=heads[0]),
        Knockout.from_spans("boundary_heads_b", blocks, heads=heads[1]),
    ]
    assert len(conds) == N_KNOCKOUTS
    return conds


def synthetic_knockouts(n: int, n_layers: int) -> tuple[list[int], dict[str, list[int]], list[Any]]:
    """Query rows n-8..n-1 and ten knockouts over spans of n/8 tokens (the long-context check)."""
    from probes.engine.session import Knockout

    rows = list(range(n - 8, n))
    w = n // 8
    g = torch.Generator().manual_seed(n)
    spans = {"boundary": list(range(w, 2 * w)), "procedure": list(range(2 * w, 3 * w))}
    rnd = [sorted(torch.randperm(rows[0], generator=g)[:w].tolist()) for _ in range(6)]
    half = n_layers // 2
    conds = [Knockout("boundary", spans["boundary"]), Knockout("procedure", spans["procedure"]),
             *(Knockout(f"random{i}", r) for i, r in enumerate(rnd)),
             Knockout("boundary_early", spans["boundary"], layers=tuple(range(half))),
             Knockout("boundary_late", spans["boundary"], layers=tuple(range(half, n_layers)))]
    return rows, spans, conds


def mask_4d(n: int, n_layers: int, n_heads: int, ko: Any, rows: list[int], dtype: torch.dtype, device: torch.device,
            windows: list[int | None] | None = None) -> list[torch.Tensor]:
    """Per layer, the additive mask [1, head, n, n]: causal (within the layer's sliding window, ``windows``:
    a key is seen while query − key < window), plus -inf at (query row, knocked key) in the knockout's
    active heads. Layers with the same window and active heads share one tensor."""
    active = ko.active(n_layers, n_heads)
    windows = windows or [None] * n_layers
    neg = torch.finfo(dtype).min
    keys = torch.tensor(ko.key_positions, device=device)
    r = torch.tensor(rows, device=device)
    cache: dict[tuple[Any, ...], torch.Tensor] = {}
    out = []
    for layer in range(n_layers):
        sig = (windows[layer], *active[layer].tolist())
        if sig not in cache:
            q, k = torch.arange(n, device=device)[:, None], torch.arange(n, device=device)[None, :]
            visible = (k <= q) & (k > q - windows[layer] if windows[layer] is not None else True)
            m = torch.zeros((), dtype=dtype, device=device).masked_fill(~visible, neg).expand(n_heads, n, n).clone()
            for h in active[layer].nonzero().flatten().tolist():
                m[h, r[:, None], keys[None, :]] = neg
            cache[sig] = m[None]
        out.append(cache[sig])
    return out


def masked_forward(model: Any, ids: list[int], masks: list[torch.Tensor], keep_from: int) -> torch.Tensor:
    """Eager forward with ``masks[layer]`` as each layer's attention mask; logits [n - keep_from, vocab]."""
    handles = []
    for i, layer in enumerate(model.model.layers):
        def pre(_m: Any, args: Any, kwargs: dict[str, Any], mask: torch.Tensor = masks[i]) -> tuple[Any, dict[str, Any]]:
            kwargs["attention_mask"] = mask
            return args, kwargs

        handles.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        with torch.inference_mode():
            x = torch.tensor([ids], device=model.device)
            keep = torch.arange(keep_from, len(ids), device=model.device)
            return model(x, use_cache=False, logits_to_keep=keep).logits[0]
    finally:
        for h in handles:
            h.remove()


def study_builder(tokenizer: Any) -> Any:
    """The prompt builder of a non-organism model's default study (v2 set, semantic gate)."""
    from probes.data.dataset import load_dataset
    from probes.prompts.builder import BuildSettings, PromptBuilder
    from probes.data.retrieval import Retriever, make_embedder

    dataset = load_dataset("basm_probe_v2")
    return PromptBuilder(tokenizer, dataset, Retriever(make_embedder("minilm")), BuildSettings(k_max=4, relevance="semantic"))


def dataset_records(builder: Any, n_records: int) -> list[PromptRecord]:
    """``n_records`` native ``basm`` records of eval items spread over k = 1..4 (real prompt lengths)."""
    items = builder.dataset.select(split="eval")
    step = max(1, len(items) // n_records)
    out = []
    for i, item in enumerate(items[::step][:n_records]):
        record = builder.build(item, "basm", 1 + i % 4, "native")
        if record.spans.get("boundary"):
            out.append(record)
    return out


def sweep_prompts(builder: Any, item: Any, k_max: int = 4) -> list[PromptRecord]:
    """An item's distinct ``sweep`` prompts in sweep's order (k = 0..k_max × base, proc, app, basm)."""
    out: list[PromptRecord] = []
    for k in range(k_max + 1):
        for config in ("base", "proc", "app", "basm"):
            record = builder.build(item, config, k, "native")
            if all(record.input_ids != r.input_ids for r in out):
                out.append(record)
    return out


def attribution_run(session: Any, plain: Any, builder: Any, n_items: int, masks: int, pools: tuple[str, ...],
                    sdpa: Callable[[list[int]], Any], timer: Callable[[Callable[[], Any]], float] | None = None) -> dict[str, Any]:
    """One ``attribution`` run (the analysis' own job list, :func:`~probes.analyses.attribution.mask_jobs`,
    and scorer, :func:`~probes.analyses.attribution.mask_scorer`: K masks at f = 0.4 over the first
    ``n_items`` T_wrong eval items, the analysis' configuration) against as many independent
    ``score_record`` calls by ``plain`` (no reuse), job by job, in sdpa forwards of the run's median
    prompt. ``timer(fn)`` -> seconds (default :func:`timed`; on a GPU one that synchronises)."""
    timer = timer or timed
    from probes.analyses.attribution import Attribution, draw, mask_jobs, mask_scorer
    from probes.scoring.score import score_record
    from probes.engine.prefix_cache import PrefixReuseCounter

    options = Attribution(masks=masks, pools=pools).resolved()
    ctx = SimpleNamespace(options=options, dataset=builder.dataset, items=tuple(builder.dataset.select(buckets=["T_wrong"], split="eval")[:n_items]),
                          builder=builder, fmt="native", session=session, variant=options.margin_variant, _score_cache={})
    skills, drawn = draw(ctx, options.masks, options.inclusion)
    jobs = mask_jobs(ctx, ctx.items, skills, drawn, options.config, options.pools)
    records = [job.build(builder) for job in jobs]
    median = sorted(records, key=lambda r: r.n_tokens)[len(records) // 2]
    scorer = mask_scorer(ctx)
    rows: dict[str, list[dict[str, Any]]] = {"run": [], "calls": []}
    seconds = {"run": 0.0, "calls": 0.0}
    session.clear_prefix_cache()
    session.prefix_reuse = PrefixReuseCounter()
    out: dict[str, Any] = {"jobs": len(jobs), "items": len(ctx.items), "masks": masks, "pools": list(pools), "config": options.config,
                           "distinct_prompts": len({(job.item.id, tuple(r.input_ids)) for job, r in zip(jobs, records)}),
                           "tokens": [min(r.n_tokens for r in records), median.n_tokens, max(r.n_tokens for r in records)]}
    units = [timer(lambda: sdpa(median.input_ids))]
    # job by job, the two sides back to back in alternating order: load drift on a shared machine falls on both
    for i, (record, job) in enumerate(zip(records, jobs)):
        for name in ("run", "calls") if i % 2 == 0 else ("calls", "run"):
            call = (lambda: scorer(record, job)) if name == "run" else (lambda: score_record(plain, record, variant=ctx.variant, margins=("margin",)))
            seconds[name] += timer(lambda: rows[name].extend(call()))
        if i == len(jobs) // 2:
            units.append(timer(lambda: sdpa(median.input_ids)))
    units.append(timer(lambda: sdpa(median.input_ids)))
    unit = statistics.mean(units)
    out["unit_s"] = units
    for name, t in seconds.items():
        out[name] = {"time_s": t, "forwards": t / unit}
        print(f"  attribution {name}: {len(jobs)} jobs {t:.1f} s = {t / unit:.2f} forwards of the median prompt (mean of {len(units)}: "
              f"{', '.join(f'{u:.1f}' for u in units)} s)", flush=True)
    out["ratio"] = out["run"]["forwards"] / out["calls"]["forwards"]
    out["prefix_reuse"] = session.prefix_reuse.as_dict()
    assert len(rows["run"]) == len(rows["calls"])
    # NaN propagates: a margin that one side could not score shows as NaN, not as agreement
    out["max_abs_margin_diff"] = float(np.max(np.abs(np.array([r["margin"] for r in rows["run"]]) - np.array([r["margin"] for r in rows["calls"]]))))
    return out


def first_t_wrong(builder: Any, k: int) -> tuple[Any, PromptRecord]:
    """(item, its native ``basm`` record at ``k``): the first T_wrong eval item whose record has a boundary span."""
    for item in builder.dataset.select(buckets=["T_wrong"], split="eval"):
        record = builder.build(item, "basm", k, "native")
        if record.spans.get("boundary"):
            return item, record
    raise RuntimeError("no T_wrong eval item with a boundary span")


def circuit_run(session: Any, dataset: Any, item: Any, clean: PromptRecord, counterfactual: PromptRecord, sdpa: Callable[[list[int]], Any],
                timer: Callable[[Callable[[], Any]], float] | None = None, ig_steps: int | None = None) -> dict[str, Any]:
    """The ``circuit`` analysis' pieces on one counterfactual pair (``item``'s ``clean`` prompt and its
    ``counterfactual``), built as the analysis builds them (:func:`probes.analyses.circuit.binding_row`,
    :func:`~probes.analyses.circuit.counterpart_row`: its source spans, the binding wrong tool), each in
    sdpa forwards of the clean prompt timed right before it: the clean deciding row (prefix cache
    cold), the counterfactual's (its prefix from the cache where it shares whole blocks with the clean
    one, as in a run), AtP + AtP* alone (one backward), with GradDrop, with EAP-IG (``ig_steps``),
    exact patching of every (layer, head, span) edge one per element, DLA + node effects (ablation
    and patching). ``circuit_atp``: the first three
    summed, issue #43's "AtP over every head × span edge for one pair"; ``*cpu*``: the same in this
    process' CPU seconds (on the CPU with one thread: what other jobs' load does not inflate; on a
    GPU not the cost). ``timer(fn)`` -> seconds."""
    from scipy.stats import spearmanr

    from probes.analyses.circuit import binding_row, counterpart_row
    from probes.engine.decision_row import DEFAULT_IG_STEPS

    timer = timer or timed
    ig_steps = DEFAULT_IG_STEPS if ig_steps is None else ig_steps
    rows: dict[str, Any] = {}
    out: dict[str, Any] = {"record_id": clean.record_id, "counterfactual": counterfactual.record_id,
                           "tokens": [clean.n_tokens, counterfactual.n_tokens], "ig_steps": ig_steps, "pieces": {}}

    def piece(name: str, fn: Callable[[], Any]) -> Any:
        cpu0 = time.process_time()
        unit = timer(lambda: sdpa(clean.input_ids))
        cpu1 = time.process_time()
        result: list[Any] = []
        t = timer(lambda: result.append(fn()))
        cpu2 = time.process_time()
        # CPU seconds of this process too: on a shared CPU, wall time grows with the others' load and CPU time does not
        out["pieces"][name] = {"time_s": t, "unit_s": unit, "forwards": t / unit, "cpu_s": cpu2 - cpu1, "unit_cpu_s": cpu1 - cpu0,
                               "cpu_forwards": (cpu2 - cpu1) / (cpu1 - cpu0)}
        print(f"  circuit {name}: {t:.2f} s = {t / unit:.2f} forwards ({unit:.2f} s); CPU {cpu2 - cpu1:.2f} s = "
              f"{(cpu2 - cpu1) / (cpu1 - cpu0):.2f} forwards' CPU ({cpu1 - cpu0:.2f} s)", flush=True)
        return result[0]

    catalog = dataset.catalog_for(item).names

    def cold_row() -> Any:
        session.clear_prefix_cache()
        return binding_row(session, clean, item, catalog)

    row, deciding = piece("clean row", cold_row)
    reused = session.prefix_reuse.tokens_reused
    cf = piece("counterfactual row", lambda: counterpart_row(session, counterfactual, item, catalog, deciding))
    out["counterfactual_prefix_reused"] = session.prefix_reuse.tokens_reused - reused
    target = cf.messages
    L, H, S = row.n_layers, row.n_heads, len(row.spans)
    out.update(spans=list(row.spans), edges=L * H * S, layers=L, heads=H)
    atp = piece("AtP + AtP*", lambda: row.edge_scores(target, ig_steps=0, grad_drop=False))
    piece("AtP + AtP* + GradDrop", lambda: row.edge_scores(target, ig_steps=0, grad_drop=True))
    piece(f"AtP + AtP* + EAP-IG ({ig_steps})", lambda: row.edge_scores(target, ig_steps=ig_steps, grad_drop=False))
    every_edge = torch.eye(L * H * S, dtype=torch.bool).reshape(-1, L, H, S)
    exact = piece("exact patching (every edge)", lambda: row.patched_metrics(target, every_edge) - row.metric)
    piece("DLA + node effects", lambda: (row.components(), row.node_effects(target)))
    p = out["pieces"]
    atp_pieces = ("clean row", "counterfactual row", "AtP + AtP*")
    out["circuit_atp"] = sum(p[name]["forwards"] for name in atp_pieces)
    out["circuit_atp_cpu"] = sum(p[name]["cpu_forwards"] for name in atp_pieces)
    # what a row keeps: its messages O(L·H·S) and the prefix keys/values (fp32), never an [n, n] tensor
    m = row.messages
    out["messages_bytes"] = sum(t.numel() * t.element_size() for t in (m.log_mass, m.value, m.z, m.mlp))
    cfg = session.model.config
    out["prefix_kv_bytes"] = 2 * L * cfg.num_key_value_heads * cfg.head_dim * row.row * 4
    out["atp_star_vs_exact_spearman"] = float(spearmanr(atp["atp_star"].ravel(), exact).statistic)
    out["max_abs_exact"] = float(np.abs(exact).max())
    return out


STEER_COUNTS = (1, 16, 64, 256)  # steering conditions per prompt timed by steer_run
STEER_ALPHA = 0.5  # the steer analysis' headline α (the value does not change the cost)
STEER_PROJECTED_PER_CONDITION = 0.3  # forwards per condition, for the time budget: the most measured on the CPU (organism, call rows, C = 64)


def steer_run(session: Any, item: Any, record: PromptRecord, sdpa: Callable[[list[int]], Any], counts: tuple[int, ...] = STEER_COUNTS,
              timer: Callable[[Callable[[], Any]], float] | None = None) -> dict[str, Any]:
    """The ``steer`` analysis' cost on one prompt (issue #44 item 5), each piece in sdpa forwards of ``record``
    timed right before it (and in this process' CPU seconds over the forward's): the clean scored run
    (``score_record`` with every candidate action, cache cold) and the analysis' own scorer
    (:func:`probes.analyses.steer.steer_scorer`: the clean run plus C conditions, ``DEFAULT_CHUNK`` per
    engine call, cache cold at its start) for every C of ``counts`` at decision rows and at call rows.
    Conditions: the analysis' random control (seeded Gaussian unit directions, draws 0..C−1) at the layer
    at 2/3 depth, α = ``STEER_ALPHA``, s_L = 1. Per condition: (steered − clean) / C. Prefix tokens: those the
    steered call computed and those its later engine calls took from the cache (the prefix is computed once)."""
    from probes.analyses.steer import DEFAULT_CHUNK, Cell, Directions, steer_scorer
    from probes.scoring.score import score_record

    timer = timer or timed
    cfg = session.model.config
    layer = 2 * cfg.num_hidden_layers // 3
    # the random draws read only the width of the estimated directions: a placeholder of the model's shape
    directions = Directions({"applicability": np.zeros((cfg.num_hidden_layers, cfg.hidden_size))}, np.ones(cfg.num_hidden_layers), (), {}, seed=0)
    job = SimpleNamespace(config="basm", item=item)
    ctx = SimpleNamespace(options=SimpleNamespace(directions=(), chunk=DEFAULT_CHUNK, generate="none"), items=(item,), session=session,
                          variant="tool_choice")
    out: dict[str, Any] = {"record_id": record.record_id, "tokens": record.n_tokens, "layer": layer, "chunk": DEFAULT_CHUNK,
                           "branch_from": min(record.query_rows), "pieces": {}}

    def piece(name: str, fn: Callable[[], Any]) -> dict[str, Any]:
        cpu0 = time.process_time()
        unit = timer(lambda: sdpa(record.input_ids))
        cpu1 = time.process_time()
        session.clear_prefix_cache()  # every piece is a first prompt: nothing reused from another one
        reused, computed = session.prefix_reuse.tokens_reused, session.prefix_reuse.tokens_computed
        t = timer(fn)
        cpu2 = time.process_time()
        p = {"time_s": t, "unit_s": unit, "forwards": t / unit, "cpu_s": cpu2 - cpu1, "unit_cpu_s": cpu1 - cpu0,
             "cpu_forwards": (cpu2 - cpu1) / (cpu1 - cpu0), "tokens_reused": session.prefix_reuse.tokens_reused - reused,
             "tokens_computed": session.prefix_reuse.tokens_computed - computed}
        out["pieces"][name] = p
        print(f"  steer {name}: {t:.2f} s = {p['forwards']:.2f} forwards ({unit:.2f} s); CPU {p['cpu_forwards']:.2f} forwards' CPU; "
              f"prefix tokens computed {p['tokens_computed']}, reused {p['tokens_reused']}", flush=True)
        return p

    clean = piece("clean", lambda: score_record(session, record, actions=True))
    for mode in ("decision", "call"):
        for count in counts:
            plan = [Cell("random", draw, layer, 1, mode, STEER_ALPHA) for draw in range(count)]
            p = piece(f"{mode} C={count}", lambda: steer_scorer(ctx, directions, plan)(record, job))
            p["per_condition"] = (p["forwards"] - clean["forwards"]) / count
            p["cpu_per_condition"] = (p["cpu_forwards"] - clean["cpu_forwards"]) / count
    return out


# The analyses no section above times, each run as a user runs it (``probes.run`` on this session):
# label -> (analysis, options). ``--limit`` items; the unit is one sdpa forward of the steer record.
ANALYSIS_RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "forks": ("forks", {}),
    "checker": ("calls", {"checker": True}),
    "curate": ("curate", {"split": "train"}),  # it curates on development items: --limit of them
    "repair": ("repair", {}),
}


def analysis_run(session: Any, label: str, limit: int, out: Path, record: PromptRecord, sdpa: Callable[[list[int]], Any],
                 timer: Callable[[Callable[[], Any]], float] | None = None) -> dict[str, Any]:
    """``ANALYSIS_RUNS[label]`` on ``session`` (its model saved in a folder: results are named by it) over
    ``limit`` items into ``out``: wall time, its prompts (the rows' distinct records), forwards per prompt
    (wall time / prompts / one sdpa forward of ``record``, timed right before) and the prefix tokens it
    computed and reused."""
    import probes

    timer = timer or timed
    name, options = ANALYSIS_RUNS[label]
    unit = timer(lambda: sdpa(record.input_ids))
    before = dict(vars(session.prefix_reuse))
    result: list[Any] = []
    t = timer(lambda: result.append(probes.run(name, session, limit=limit, out=str(out), figure=False, **options)))
    rows = result[0].rows
    prompts = int(rows["record_id"].nunique()) if "record_id" in rows else len(rows)
    counted = {key: value - before[key] for key, value in vars(session.prefix_reuse).items()}
    out_row = {"analysis": name, "options": options, "limit": limit, "time_s": t, "unit_s": unit, "rows": len(rows), "prompts": prompts,
               "forwards_per_prompt": t / max(prompts, 1) / unit, "prefix_tokens_computed": counted["tokens_computed"],
               "prefix_tokens_reused": counted["tokens_reused"]}
    print(f"  {label}: {t:.2f} s, {prompts} prompts, {out_row['forwards_per_prompt']:.2f} forwards per prompt ({unit:.2f} s)", flush=True)
    return out_row


def loud_section(report: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """``report[name] = fn()``; a failure is printed as FAILED and recorded under ``report["failed"]``, which
    makes the run exit 1 (:func:`exit_status`): a section that has never run on a GPU must not fail silently."""
    try:
        report[name] = fn()
    except Exception as e:
        report["failed"][name] = f"{type(e).__name__}: {e}"
        print(f"FAILED {name}: {type(e).__name__}: {e}", flush=True)


def exit_status(report: dict[str, Any]) -> int:
    """1 when a section failed (named on stderr), else 0."""
    if report["failed"]:
        print(f"FAILED sections: {', '.join(f'{k} ({v})' for k, v in report['failed'].items())}", file=sys.stderr)
        return 1
    return 0


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _summary(values: list[float | None]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "max": None}
    return {"mean": float(np.mean(vals)), "max": float(np.max(vals))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from probes.analyses.knockout import knockout_scorer
    from probes.scoring.score import MARGINS, score_record
    from probes.engine.session import ATTN_IMPLEMENTATION, EngineSession
    from probes.prompts.tokenizers import load_tokenizer

    clock = Clock(args.budget_s)
    # every margin scores every catalog tool (up to the token where it parts from the correct one,
    # through the engine's token trie); --tiny keeps the correct, wrong and abstain candidates
    margins = ("margin",) if args.tiny else MARGINS
    device = torch.device("cpu" if args.tiny else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --tiny on the CPU")
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"tiny": args.tiny, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                              "dtype": args.dtype, "margins": list(margins), "skipped": {}, "failed": {}}

    def skip(step: str, why: str) -> None:
        report["skipped"][step] = why
        print(f"SKIP {step}: {why}", flush=True)

    tokenizer = load_tokenizer("qwen3")
    t0 = time.perf_counter()
    dtype = getattr(torch, args.dtype)
    model = build_model(args.tiny, device, len(tokenizer), dtype, args.shape)
    cfg = model.config
    report["model"] = {"parameters": sum(p.numel() for p in model.parameters()), "layers": cfg.num_hidden_layers,
                       "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "hidden": cfg.hidden_size,
                       "build_s": time.perf_counter() - t0}
    report["shape"] = args.shape
    print(f"model: random {args.shape}{' (tiny)' if args.tiny else ' shape'}, {report['model']['parameters'] / 1e9:.3f}B parameters, "
          f"{args.dtype} on {report['device']}, built in {report['model']['build_s']:.1f} s", flush=True)
    builder = study_builder(tokenizer)
    records = dataset_records(builder, args.records)
    lengths = [len(r.input_ids) for r in records]
    print(f"{len(records)} records, {min(lengths)}..{max(lengths)} tokens", flush=True)
    session = EngineSession(model, tokenizer=tokenizer)  # switches the model to the probe attention

    def plain_sdpa(ids: list[int]) -> Any:
        with torch.inference_mode():
            return model(torch.tensor([ids], device=device), use_cache=False, logits_to_keep=1)

    # 1. Per record: plain sdpa forward, engine baseline only, engine with ten knockouts.
    per_record = []
    warm = records[0]
    model.set_attn_implementation("sdpa")
    plain_sdpa(warm.input_ids)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    # warm-up (CUDA kernels, allocator); on the CPU the baseline alone keeps the test short
    score_record(session, warm, [] if args.tiny else knockouts(warm, cfg.num_hidden_layers, cfg.num_attention_heads), margins=margins)
    for i, record in enumerate(records):
        spent = max((sum(r[m]["time_s"] for m in ("sdpa", "engine_baseline", "engine_10ko")) for r in per_record), default=0.0)
        if not clock.fits(spent * 1.5 + args.reserve_s):
            skip(f"records[{i}:]", f"{clock.left():.0f} s left; a record took up to {spent:.1f} s and "
                 f"{args.reserve_s:.0f} s are kept for the later sections")
            break
        ids = record.input_ids
        conds = knockouts(record, cfg.num_hidden_layers, cfg.num_attention_heads)
        model.set_attn_implementation("sdpa")
        t_sdpa, m_sdpa, _ = measure(lambda: plain_sdpa(ids), device)
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        t_b0, m_b0, _ = measure(lambda: score_record(session, record, [], margins=margins), device)
        t_b10, m_b10, _ = measure(lambda: score_record(session, record, conds, margins=margins), device)
        per_record.append({"record_id": record.record_id, "n_tokens": len(ids),
                           "sdpa": {"time_s": t_sdpa, "peak_mib": m_sdpa},
                           "engine_baseline": {"time_s": t_b0, "peak_mib": m_b0},
                           "engine_10ko": {"time_s": t_b10, "peak_mib": m_b10}})
        print(f"  {record.record_id:45s} n={len(ids):5d}  sdpa {t_sdpa:7.3f} s  engine {t_b0:7.3f} s  "
              f"engine+10ko {t_b10:7.3f} s", flush=True)
    report["records"] = {
        "per_record": per_record,
        "summary": {m: {"time_s": _summary([r[m]["time_s"] for r in per_record]),
                        "peak_mib": _summary([r[m]["peak_mib"] for r in per_record])}
                    for m in ("sdpa", "engine_baseline", "engine_10ko")},
    }

    # 2.-4. On the longest record: eager output_attentions, ten 4D-mask forwards, parity.
    longest = max(records, key=lambda r: len(r.input_ids))
    ids, n = longest.input_ids, len(longest.input_ids)
    qrows = longest.query_rows
    conds = knockouts(longest, cfg.num_hidden_layers, cfg.num_attention_heads)
    sdpa_time = max(r["sdpa"]["time_s"] for r in per_record) if per_record else 1.0
    model.set_attn_implementation("eager")
    if clock.fits(sdpa_time * 20 + args.reserve_s / 2):
        def eager() -> Any:
            with torch.inference_mode():
                return model(torch.tensor([ids], device=device), use_cache=False, logits_to_keep=1, output_attentions=True)

        t, m, _ = measure(eager, device)
        report["eager_attn"] = {"n_tokens": n, "time_s": t, "peak_mib": m}
        print(f"eager output_attentions, n={n}: {t:.3f} s, peak {m} MiB", flush=True)
    else:
        skip("eager_attn", f"{clock.left():.0f} s left")
    eager_time = report.get("eager_attn", {}).get("time_s", sdpa_time * 5)
    if clock.fits(eager_time * N_KNOCKOUTS * 1.5 + args.reserve_s / 2):
        diffs, scale, times, peaks = [], 0.0, [], []
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        engine = session.run(ids, qrows, conditions=conds)  # logits at rows min(query_rows)..n-1
        model.set_attn_implementation("eager")
        for ko, res in zip(conds, engine.conditions[1:]):
            masks = mask_4d(n, cfg.num_hidden_layers, cfg.num_attention_heads, ko, qrows, dtype, device, sliding_windows(cfg))
            t, m, ref = measure(lambda: masked_forward(model, ids, masks, qrows[0]), device)
            del masks
            times.append(t)
            peaks.append(m)
            ref = ref.float().cpu()
            diffs.append(float((res.logits - ref).abs().max()))
            scale = max(scale, float(ref.abs().max()))
        report["mask_4d"] = {"n_tokens": n, "forwards": N_KNOCKOUTS, "time_s": sum(times), "peak_mib": _summary(peaks)["max"]}
        report["parity"] = {"max_abs_diff": max(diffs), "per_knockout": dict(zip([c.name for c in conds], diffs)),
                            "max_abs_logit": scale, "rows": f"{qrows[0]}..{n - 1}"}
        print(f"ten 4D-mask eager forwards, n={n}: {sum(times):.3f} s; engine vs 4D mask: max |Δlogit| = {max(diffs):.2e} "
              f"({args.dtype}; logits up to {scale:.2f})", flush=True)
    else:
        skip("mask_4d", f"{clock.left():.0f} s left; projected {eager_time * N_KNOCKOUTS * 1.5:.0f} s")
    model.set_attn_implementation(ATTN_IMPLEMENTATION)

    # 6.-8. The analyses' paths: the knockout scorer, a sweep item, the attribution workload; each
    # against sdpa forwards of its own prompts, timed next to it (the model runs sdpa outside a probe call).
    def forwards(record: PromptRecord) -> float:
        return measure(lambda: plain_sdpa(record.input_ids), device)[0]

    def margins_of(rows: list[dict[str, Any]]) -> list[float]:
        return [r["margin"] for r in rows]

    unit = max((r["sdpa"]["time_s"] for r in per_record), default=1.0)
    report["knockout_analysis"] = []
    for i, record in enumerate(records[: args.knockout_records]):
        if not clock.fits(unit * 8 + args.reserve_s / 3):
            skip(f"knockout_analysis[{i}:]", f"{clock.left():.0f} s left")
            break
        ctx = SimpleNamespace(options=SimpleNamespace(random_draws=10, controls=("neutral",), priming=False, knockout_rows="path",
                                                      random_pool="neutral", seed=0, mass_tolerance=0.1, margin_variant="tool_choice"),
                              dataset=builder.dataset, session=session, variant="tool_choice", _score_cache={})
        job = SimpleNamespace(config="basm", item=SimpleNamespace(id=record.item_id))
        session.clear_prefix_cache()  # a first prompt: nothing reused from another one
        t_sdpa = forwards(record)
        t, m, rows = measure(lambda: knockout_scorer(ctx, [])(record, job), device)
        report["knockout_analysis"].append({"record_id": record.record_id, "n_tokens": record.n_tokens, "conditions": len(rows) - 1,
                                            "time_s": t, "peak_mib": m, "sdpa_s": t_sdpa, "forwards": t / t_sdpa})
        print(f"  knockout analysis ({len(rows) - 1} conditions, every margin) {record.record_id}: {t:.3f} s = {t / t_sdpa:.2f} sdpa forwards", flush=True)

    def with_and_without_reuse(step: str, prompts: list[PromptRecord]) -> dict[str, Any] | None:
        """The prompts scored in order by the session (prefix reuse, cache cold at the start) and by one without reuse."""
        if not clock.fits(unit * 3 * len(prompts) + args.reserve_s / 3):
            skip(step, f"{clock.left():.0f} s left, projected {unit * 3 * len(prompts):.0f} s")
            return None
        median = sorted(prompts, key=lambda r: r.n_tokens)[len(prompts) // 2]
        out: dict[str, Any] = {"prompts": len(prompts), "tokens": [r.n_tokens for r in prompts], "sdpa_median_prompt_s": forwards(median)}
        margins = {}
        for name, sess in (("reuse", session), ("no_reuse", plain_session)):
            sess.clear_prefix_cache()
            t, m, rows = measure(lambda: [row for r in prompts for row in score_record(sess, r, margins=("margin",))], device)
            margins[name] = margins_of(rows)
            out[name] = {"time_s": t, "peak_mib": m, "forwards": t / out["sdpa_median_prompt_s"]}
        out["max_abs_margin_diff"] = max((abs(a - b) for a, b in zip(margins["reuse"], margins["no_reuse"]) if math.isfinite(a) and math.isfinite(b)),
                                         default=0.0)
        print(f"  {step}: {len(prompts)} prompts, reuse {out['reuse']['time_s']:.3f} s = {out['reuse']['forwards']:.2f} forwards, "
              f"no reuse {out['no_reuse']['time_s']:.3f} s = {out['no_reuse']['forwards']:.2f} (median prompt); "
              f"max |Δmargin| {out['max_abs_margin_diff']:.1e}", flush=True)
        return out

    plain_session = EngineSession(model, tokenizer=tokenizer, prefix_cache=0)
    item_ids = list(dict.fromkeys(r.item_id for r in records))
    first = builder.dataset.select(ids=item_ids[:1])[0]
    if (item_out := with_and_without_reuse("sweep_item", sweep_prompts(builder, first, args.sweep_k_max))) is not None:
        report["sweep_item"] = item_out
    n_jobs = args.masks * args.attribution_items * 2  # both pools
    if clock.fits(unit * 2 * n_jobs + args.reserve_s / 3):
        report["attribution"] = attribution_run(session, plain_session, builder, args.attribution_items, args.masks, ("topk", "library"),
                                                plain_sdpa, timer=lambda fn: measure(fn, device)[0])
    else:
        skip("attribution", f"{clock.left():.0f} s left, projected {unit * 2 * n_jobs:.0f} s")

    # 9. The circuit (issue #43) on one counterfactual pair: the first T_wrong eval item's basm prompt at k = 2
    # against its proc prompt, in fp32 (the deciding-row replay refuses other dtypes): the bf16 model's
    # shape built again in fp32 unless it is fp32 already, its own sdpa forwards the unit.
    if clock.fits(unit * 40 + args.reserve_s / 3):
        item, clean = first_t_wrong(builder, 2)
        counterfactual = builder.build(item, "proc", 2, "native")
        fp32 = model if dtype == torch.float32 else build_model(args.tiny, device, len(tokenizer), torch.float32, args.shape)
        fp32_session = EngineSession(fp32, tokenizer=tokenizer)

        def fp32_sdpa(ids: list[int]) -> Any:
            with torch.inference_mode():
                return fp32(torch.tensor([ids], device=device), use_cache=False, logits_to_keep=1)

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        def circuit() -> dict[str, Any]:
            out = circuit_run(fp32_session, builder.dataset, item, clean, counterfactual, fp32_sdpa, timer=lambda fn: measure(fn, device)[0])
            out["peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20 if device.type == "cuda" else None
            return out

        # loud: the replay's device path had not run on a GPU when this section was written, nor on Gemma 3
        loud_section(report, "circuit", circuit)
        del fp32_session, fp32
    else:
        skip("circuit", f"{clock.left():.0f} s left, projected {unit * 40:.0f} s")

    # 10. Steering (issue #44 item 5) on the first T_wrong eval item's basm prompt at k = 2, in the run's dtype.
    steer_item, steer_record = first_t_wrong(builder, 2)
    projected = unit * (3 + 2 * sum(2 + c * STEER_PROJECTED_PER_CONDITION for c in args.steer_counts))  # a unit before each piece
    if clock.fits(projected + args.reserve_s / 3):
        loud_section(report, "steer", lambda: steer_run(session, steer_item, steer_record, plain_sdpa, tuple(args.steer_counts),
                                                        timer=lambda fn: measure(fn, device)[0]))
    else:
        skip("steer", f"{clock.left():.0f} s left, projected {projected:.0f} s")

    # 11. The analyses no section above times (ANALYSIS_RUNS), each as a user runs it. Results are named and
    # fingerprinted by the model's folder: the model is saved to one (its own weights) first.
    if args.analyses:
        if clock.fits(unit * 30 * args.analysis_limit * len(args.analyses) + args.reserve_s / 3):
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(Path(folder) / "model")
                tokenizer.save_pretrained(Path(folder) / "model")
                model.name_or_path = str(Path(folder) / "model")
                for label in args.analyses:
                    loud_section(report, f"analysis {label}", lambda: analysis_run(session, label, args.analysis_limit, Path(folder) / label,
                                                                                 steer_record, plain_sdpa, timer=lambda fn: measure(fn, device)[0]))
        else:
            for label in args.analyses:
                skip(f"analysis {label}", f"{clock.left():.0f} s left, projected {unit * 30 * args.analysis_limit:.0f} s")

    # 5. The engine with ten knockouts at long contexts.
    report["long"] = []
    last: tuple[int, float] | None = None
    per_tok = (report["records"]["summary"]["engine_10ko"]["time_s"]["max"] or 1.0) / max(lengths)
    for n_long in args.long:
        # projected from the last long run, quadratic in n (attention); else linear from the records
        projected = last[1] * (n_long / last[0]) ** 2 if last else per_tok * n_long * 2
        if not clock.fits(projected * 1.3):
            skip(f"long n={n_long}", f"{clock.left():.0f} s left, projected {projected:.0f} s")
            continue
        rows, spans, lconds = synthetic_knockouts(n_long, cfg.num_hidden_layers)
        g = torch.Generator().manual_seed(0)
        lids = torch.randint(0, cfg.vocab_size, (n_long,), generator=g).tolist()
        try:
            t, m, _ = measure(lambda: session.run(lids, rows, spans, lconds), device)
        except torch.OutOfMemoryError as e:
            skip(f"long n={n_long}", f"out of memory: {e}")
            break
        last = (n_long, t)
        report["long"].append({"n_tokens": n_long, "time_s": t, "peak_mib": m})
        print(f"engine + 10 knockouts, n={n_long}: {t:.3f} s, peak {m} MiB", flush=True)
    report["total_s"] = time.perf_counter() - clock.start
    print_table(report)
    return report


def cost_table(report: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(analysis, forwards per prompt, wall s) for every analysis section that ran: each in sdpa forwards
    of its own prompt, per prompt it scored (a sweep item: per each of its prompts, in its median one)."""
    rows: list[tuple[str, float, float]] = []
    per_record = report.get("records", {}).get("per_record", [])
    if per_record:
        rows.append(("sweep (score_record, baseline)", float(np.mean([r["engine_baseline"]["time_s"] / r["sdpa"]["time_s"] for r in per_record])),
                     sum(r["engine_baseline"]["time_s"] for r in per_record)))
        rows.append(("engine, ten knockouts", float(np.mean([r["engine_10ko"]["time_s"] / r["sdpa"]["time_s"] for r in per_record])),
                     sum(r["engine_10ko"]["time_s"] for r in per_record)))
    if knock := report.get("knockout_analysis"):
        rows.append((f"knockout ({knock[0]['conditions']} conditions)", float(np.mean([k["forwards"] for k in knock])), sum(k["time_s"] for k in knock)))
    if item := report.get("sweep_item"):
        rows.append((f"sweep item ({item['prompts']} prompts, prefix reuse)", item["reuse"]["forwards"] / item["prompts"], item["reuse"]["time_s"]))
    if a := report.get("attribution"):
        rows.append((f"attribution ({a['jobs']} jobs)", a["run"]["forwards"] / a["jobs"], a["run"]["time_s"]))
    if c := report.get("circuit"):
        rows.append(("circuit (one pair: two deciding rows + AtP over every edge)", c["circuit_atp"],
                     sum(c["pieces"][n]["time_s"] for n in ("clean row", "counterfactual row", "AtP + AtP*"))))
    if st := report.get("steer"):
        name, piece = list(st["pieces"].items())[-1]
        rows.append((f"steer ({name})", piece["forwards"], piece["time_s"]))
    for label in ANALYSIS_RUNS:
        if a := report.get(f"analysis {label}"):
            rows.append((f"{label} ({a['prompts']} prompts)", a["forwards_per_prompt"], a["time_s"]))
    return rows


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{report['shape']}, {report['dtype']} on {report['device']}\n")
    print("| analysis | forwards per prompt | wall s |\n|---|---|---|")
    for name, forwards, seconds in cost_table(report):
        print(f"| {name} | {forwards:.2f} | {seconds:.1f} |")
    for name, why in report["failed"].items():
        print(f"| {name} | FAILED: {why} | |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny Qwen3 shape on the CPU (checks the script, not the GPU)")
    ap.add_argument("--records", type=int, default=24, help="dataset records to time (default 24)")
    ap.add_argument("--long", type=int, nargs="*", default=None, help="long-context lengths (default 8192 32768; tiny: 256 512)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="wall-clock budget of the whole run (default 450 s)")
    ap.add_argument("--reserve-s", type=float, default=None, help="seconds kept for sections 2-5 while timing records")
    ap.add_argument("--knockout-records", type=int, default=None, help="records scored by the knockout analysis' scorer (default 4; tiny: 1)")
    ap.add_argument("--attribution-items", type=int, default=None, help="T_wrong eval items of the attribution run (default 2; tiny: 1)")
    ap.add_argument("--sweep-k-max", type=int, default=None, help="the sweep item's largest k (default 4: 13 prompts; tiny: 1)")
    ap.add_argument("--masks", type=int, default=None, help=f"skill masks per attribution item (default {ATTRIBUTION_MASKS}; tiny: 3)")
    ap.add_argument("--steer-counts", type=int, nargs="+", default=None, help="steering conditions per prompt of the steer section "
                    f"(default {' '.join(map(str, STEER_COUNTS))}; tiny: 1)")
    ap.add_argument("--shape", choices=SHAPES, default="qwen3-8b", help="Qwen3-8B's shape, or Gemma 3 270M's (sliding-window layers)")
    ap.add_argument("--analyses", nargs="*", choices=tuple(ANALYSIS_RUNS), default=None,
                    help=f"analyses run as a user runs them (default {' '.join(ANALYSIS_RUNS)}; tiny: repair)")
    ap.add_argument("--analysis-limit", type=int, default=None, help="items per analysis of --analyses (default 2; tiny: 1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default bfloat16; --tiny: float32")
    ap.add_argument("--json", type=Path, help="write the report here")
    ap.add_argument("--memory-table", action="store_true", help="print bf16 weight memory of Qwen3 8B/14B/32B and exit")
    args = ap.parse_args(argv)
    if args.memory_table:
        for row in memory_table():
            print(f"{row['model']:10s} {row['parameters'] / 1e9:6.2f}B parameters  weights {row['weights_gib_bf16']:6.1f} GiB (bf16)  "
                  f"KV cache {row['kv_cache_mib_per_1k_tokens']:.0f} MiB per 1k tokens")
        return 0
    if args.long is None:
        args.long = [256, 512] if args.tiny else [8192, 32768]
    if args.dtype is None:
        args.dtype = "float32" if args.tiny else "bfloat16"
    if args.reserve_s is None:
        args.reserve_s = 5.0 if args.tiny else 150.0
    if args.tiny and args.records == 24:
        args.records = 1
    if args.knockout_records is None:
        args.knockout_records = 1 if args.tiny else 4
    if args.attribution_items is None:
        args.attribution_items = 1 if args.tiny else 2
    if args.sweep_k_max is None:
        args.sweep_k_max = 1 if args.tiny else 4
    if args.masks is None:
        args.masks = 3 if args.tiny else ATTRIBUTION_MASKS
    if args.steer_counts is None:
        args.steer_counts = [1] if args.tiny else list(STEER_COUNTS)
    if args.analyses is None:
        args.analyses = ["repair"] if args.tiny else list(ANALYSIS_RUNS)
    if args.analysis_limit is None:
        args.analysis_limit = 1 if args.tiny else 2
    if bad := [c for c in args.steer_counts if c < 1]:
        ap.error(f"--steer-counts {bad}: a count of conditions is at least 1")
    report = run(args)
    print(f"total {report['total_s']:.1f} s (budget {args.budget_s:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)))
    return exit_status(report)


if __name__ == "__main__":
    sys.exit(main())
