"""Every analysis' cost per prompt on a real-size model shape, in forwards of the same prompt.

    PYTHONPATH=. python benchmarks/real_shape.py [--threads 1] [--repeats 1] [--layers 28] [--skip ROW ...]
    PYTHONPATH=. python benchmarks/real_shape.py --skip ... --attribution-items 2 --masks 12 --pools library  # the attribution row alone
    PYTHONPATH=. python benchmarks/real_shape.py --tiny ...  # benchmarks/gpu.py's tiny shape (the test)

About 40 sdpa forwards of a 1.6k-token prompt in all (half of them the sweep item without reuse):
about 10 minutes at 15 s per forward.

Model: a random-weight Qwen3 with the shape of Qwen3-0.6B (28 layers, d_model 1024, 16 query /
8 key-value heads of 128, MLP 3072, vocabulary 151,936, tied embeddings; 0.6 B parameters), fp32,
CPU, built from its config (no download). ``--layers`` shortens it for a quick look (the ratios
then overstate the vocabulary's share). Records: the dataset's own prompts built with the real
Qwen3 tokenizer and chat template (native format, lexical retrieval), the first T_wrong eval item
with a boundary span: its ``basm`` prompt at ``--k`` for the per-prompt rows, and its whole sweep
job list (k = 0..4 × base, proc, app, basm; 13 distinct prompts) for the sweep item.

Unit: one plain HF sdpa forward of the same prompt (``logits_to_keep=1``: the LM head at the last
row only), timed right before each measured call; a row's figure is the median over ``--repeats``
of (call time / that forward's time). On a machine shared with other jobs the absolute times drift;
the ratios of adjacent calls are what this reports. Every per-prompt call starts with a cold prefix
cache (a first prompt: no reuse from another prompt), except where the row says "prefix warm".

Rows (native engine, ``ProbeSession``):

- ``sweep``: ``score_record``, baseline, the tool-choice margin (correct, wrong, abstain candidates);
- ``baseline, every margin``: ``score_record`` with every catalog tool scored (broad, correct);
- ``ratios / heads map``: ``score_record``, baseline, attention per head, no margin;
- ``knockout (12)``: the knockout analysis' scorer (``knockout_scorer``: its deciding-row call, then
  one ``score_record``) with 12 conditions, boundary, 10 neutral random draws and procedure, every
  margin; ``knockout (12), prefix warm``: the same prompt again with its prefix cached (what the
  branch costs); ``knockout (default)``: the analysis' defaults (5 draws × 4 control families);
- ``heads causal``: baseline + B knocked out in 6 head sets of 10 heads, the tool-choice margin;
- ``linear``: the residual stream at the decision row.

nnsight and TransformerLens (``probes.backends``) run the probe set of ``knockout (12)`` as
``ForwardBackend`` does: one eager forward with the knockout's softmax edit per condition, plus one
per (condition, multi-token candidate). Running all of them would take hours here, so one such
forward (B knocked out, every row from the branch point read) is timed against an sdpa forward, and
the row is that ratio × the number of forwards ``ForwardBackend.run`` makes for the probe set
(counted from the request: it is not a full run).

Sweep item: the 13 distinct prompts of one item scored as ``sweep`` scores them (``score_record``,
margin only), by a session with the default prefix reuse (cache cold at the item's start) and one
without (``prefix_cache=0``); unit: the sdpa forward of the item's prompt of median length.

Attribution run (issue #29): the ``attribution`` analysis' own job list (``mask_jobs``: K =
``--masks`` skill masks × the first ``--attribution-items`` T_wrong eval items × ``--pools``, config
``proc``, k = 4) scored by its own scorer (``mask_scorer``: identical prompts of an item
once, the prefix cache cold at the run's start and kept across items, as in a run), against the same
jobs as as many independent ``score_record`` calls (a session without reuse, every job scored), job
by job back to back in alternating order (load drift falls on both sides); unit: the sdpa forward of
the run's median prompt, timed before, halfway and after (their mean). Both sides' margins are
compared job by job.

``--tiny``: benchmarks/gpu.py's tiny Qwen3 shape (4 layers, d_model 64) instead; checks the script.

Prints a markdown table (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import TINY_SHAPE, attribution_run, circuit_run, first_t_wrong, qwen3_config, sweep_prompts, timed  # noqa: E402  (benchmarks/gpu.py: the tiny shape, the record, an item's distinct sweep prompts, the attribution and circuit runs)

KNOCKOUT_OPTIONS = dict(priming=False, knockout_rows="path", random_pool="neutral", seed=0, mass_tolerance=0.1,
                        margin_variant="tool_choice")


def real_shape_model(layers: int = 28, tiny: bool = False) -> torch.nn.Module:
    """Random Qwen3 with Qwen3-0.6B's shape (fp32); ``tiny``: benchmarks/gpu.py's tiny shape."""
    from transformers import Qwen3ForCausalLM

    shape = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, tie_word_embeddings=True)
    config = qwen3_config({**(TINY_SHAPE if tiny else shape), "vocab_size": 151936})
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).eval()


def item_records(tokenizer: Any, k: int, k_max: int = 4) -> tuple[Any, Any, Any, list[Any], Any]:
    """(the item, its basm prompt at ``k``, its proc prompt at ``k`` (the circuit's counterfactual),
    its distinct sweep prompts in sweep's order, the prompt builder): the first T_wrong eval item
    with a boundary span."""
    from probes.data.dataset import load_dataset
    from probes.data.retrieval import Retriever, make_embedder
    from probes.prompts.builder import BuildSettings, PromptBuilder

    dataset = load_dataset("basm_probe")
    builder = PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=k_max), tokenizer_name="qwen3")
    item, record = first_t_wrong(builder, k)
    return item, record, builder.build(item, "proc", k, "native"), sweep_prompts(builder, item, k_max), builder


def distinct_prefix_tokens(prefixes: list[list[int]]) -> int:
    """The prefix tokens a sequence of prompts computes with every earlier prefix cached at token
    granularity: the distinct nodes of their token trie (the floor of any block rule)."""
    floor = 0
    for i, ids in enumerate(prefixes):
        shared = [next((j for j, (a, b) in enumerate(zip(ids, old)) if a != b), min(len(ids), len(old))) for old in prefixes[:i]]
        floor += len(ids) - max(shared, default=0)
    return floor


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats of each per-prompt row (median)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--k", type=int, default=2, help="depth of the per-prompt basm record")
    ap.add_argument("--backends", nargs="*", default=["nnsight", "transformerlens"], choices=("nnsight", "transformerlens"))
    ap.add_argument("--skip", nargs="*", default=[], help="row names to leave out (e.g. 'knockout (default)' 'sweep item, no reuse' 'circuit' 'attribution')")
    ap.add_argument("--attribution-items", type=int, default=2, help="T_wrong eval items of the attribution run")
    ap.add_argument("--masks", type=int, default=12, help="K: skill masks of the attribution run (the analysis' default)")
    ap.add_argument("--pools", nargs="+", default=["topk", "library"], choices=("topk", "library"), help="the attribution run's pools")
    ap.add_argument("--ig-steps", type=int, default=None, help="the circuit's EAP-IG midpoints (default: the engine's, 16)")
    ap.add_argument("--tiny", action="store_true", help="benchmarks/gpu.py's tiny Qwen3 shape (checks the script)")
    ap.add_argument("--json", type=Path, help="write the measured figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    from probes.analyses.knockout import knockout_scorer
    from probes.engine.prefix_cache import PrefixReuseCounter
    from probes.engine.session import Knockout, EngineSession, install_attention
    from probes.prompts.tokenizers import load_tokenizer
    from probes.scoring.score import score_record, scored_tokens
    from probes.scoring.margins import candidates_from_record

    started = time.perf_counter()
    tokenizer = load_tokenizer("qwen3")
    item, record, counterfactual, sweep, builder = item_records(tokenizer, args.k)
    dataset = builder.dataset
    model = real_shape_model(args.layers, args.tiny)
    model.set_attn_implementation(install_attention())
    n_params = sum(p.numel() for p in model.parameters())
    session = EngineSession(model, tokenizer=tokenizer)
    cfg = model.config
    print(f"model: random Qwen3{' (tiny)' if args.tiny else '-0.6B shape'}, {cfg.num_hidden_layers} layers, d_model {cfg.hidden_size}, "
          f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, vocab {cfg.vocab_size}, {n_params / 1e9:.2f} B parameters, "
          f"fp32, CPU, {args.threads} thread(s); record {record.record_id}: {record.n_tokens} tokens, "
          f"{len(record.candidates)} candidates; built in {time.perf_counter() - started:.0f} s", flush=True)

    @torch.inference_mode()
    def sdpa(ids: list[int]) -> None:
        # outside a probe call the registered attention is sdpa itself: a plain HF forward
        model(torch.tensor([ids]), use_cache=False, logits_to_keep=1)

    def knockout_call(draws: int, controls: tuple[str, ...]) -> Callable[[], Any]:
        job = SimpleNamespace(config="basm", item=SimpleNamespace(id=record.item_id))

        def call() -> Any:  # a fresh run context each time: cached_scorer's results are not reused
            ctx = SimpleNamespace(options=SimpleNamespace(random_draws=draws, controls=controls, **KNOCKOUT_OPTIONS), dataset=dataset,
                                  session=session, variant="tool_choice", _score_cache={})
            return knockout_scorer(ctx, [])(record, job)
        return call

    blocks = record.spans["boundary"]
    g = torch.Generator().manual_seed(0)
    head_sets = [tuple((int(h) // cfg.num_attention_heads, int(h) % cfg.num_attention_heads)
                       for h in torch.randperm(cfg.num_hidden_layers * cfg.num_attention_heads, generator=g)[:10]) for _ in range(6)]
    heads_conditions = [Knockout.from_spans(f"heads_{i}", blocks, heads=hs) for i, hs in enumerate(head_sets)]

    def cold(fn: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> Any:
            session.clear_prefix_cache()
            return fn()
        return call

    rows: dict[str, Callable[[], Any]] = {
        "sweep": cold(lambda: score_record(session, record, margins=("margin",))),
        "baseline, every margin": cold(lambda: score_record(session, record)),
        "ratios / heads map": cold(lambda: score_record(session, record, per_head=True, margins=())),
        "knockout (12)": cold(knockout_call(10, ("neutral",))),
        "knockout (12), prefix warm": knockout_call(10, ("neutral",)),
        "knockout (default)": cold(knockout_call(5, ("neutral", "count", "mass", "anywhere"))),
        "heads causal": cold(lambda: score_record(session, record, heads_conditions, margins=("margin",))),
        "linear": cold(lambda: session.run(record.input_ids, [record.decision_index], record_residual=True)),
    }
    rows = {name: fn for name, fn in rows.items() if name not in args.skip}
    # the knockout probe set as the scorer asks for it (for the forward backends' count below)
    conditions_seen: list[Any] = []
    original = session.run

    def capture(*a: Any, **kw: Any) -> Any:
        if len(kw.get("conditions", ())) == 12:
            conditions_seen.append(kw["conditions"])
        return original(*a, **kw)

    session.run = capture  # type: ignore[method-assign]
    sdpa(record.input_ids[:64])  # warm-up
    ratios: dict[str, list[float]] = {name: [] for name in rows}
    seconds: dict[str, list[float]] = {name: [] for name in rows}
    unit: list[float] = []
    for repeat in range(args.repeats):
        for name, fn in rows.items():
            if name.endswith("prefix warm") and "knockout (12)" not in rows:
                knockout_call(10, ("neutral",))()  # caches the prefix (not timed); else the row before did
            t_unit = timed(lambda: sdpa(record.input_ids))
            t = timed(fn)
            unit.append(t_unit)
            seconds[name].append(t)
            ratios[name].append(t / t_unit)
            print(f"  [{repeat + 1}/{args.repeats}] {name}: {t:.1f} s = {t / t_unit:.2f} forwards ({t_unit:.1f} s)", flush=True)

    # The forward backends: one edited eager forward, timed against sdpa, × the forwards they need.
    if args.backends and not conditions_seen:
        knockout_call(10, ("neutral",))()
    session.run = original  # type: ignore[method-assign]
    backend_rows: dict[str, tuple[float, float, int]] = {}
    if args.backends:
        conditions = conditions_seen[-1]
        asked = scored_tokens(candidates_from_record(record), record.format)
        multi = sum(len(t) > 1 for _, t in asked.values())
        n_forwards = (1 + len(conditions)) * (1 + multi)
        from probes.backends import get_backend
        from probes.backends.base import RowEdit
        from probes.engine.hooks import HOOK_PATTERN, hook_site

        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp) / "qwen3-0.6b-shape"
            model.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
            rows_read = list(range(min(record.query_rows), record.n_tokens))
            for name in args.backends:
                backend = get_backend(name, model_dir)
                edit = RowEdit(tuple(record.query_rows), conditions[0].key_positions,
                               conditions[0].active(backend.n_layers, backend.n_heads))
                backend.forward_edited(record.input_ids[:64], RowEdit((), (), edit.active), list(range(60, 64)))  # warm-up
                per = []
                for _ in range(args.repeats):
                    t_unit = timed(lambda: sdpa(record.input_ids))
                    patterns = [hook_site(HOOK_PATTERN, layer) for layer in range(backend.n_layers)]  # what span mass reads
                    t = timed(lambda: backend.forward_edited(record.input_ids, edit, rows_read, patterns))
                    per.append(t / t_unit)
                    print(f"  {name}: one edited forward {t:.1f} s = {t / t_unit:.2f} forwards", flush=True)
                backend_rows[name] = (statistics.median(per), statistics.median(per) * n_forwards, n_forwards)
                del backend

    # The circuit (issue #43): one counterfactual pair (this prompt against the same item's proc prompt).
    circuit = None if "circuit" in args.skip else circuit_run(session, dataset, item, record, counterfactual, sdpa, ig_steps=args.ig_steps)

    # Sweep item: 13 distinct prompts, with and without prefix reuse.
    sweep_rows: dict[str, float] = {}
    median_prompt = sorted(sweep, key=lambda r: r.n_tokens)[len(sweep) // 2]
    floor = distinct_prefix_tokens([r.input_ids[: min(r.query_rows)] for r in sweep])
    plain = EngineSession(model, tokenizer=tokenizer, prefix_cache=0)
    sweep_prefix: dict[str, Any] = {"distinct_tokens": floor}
    for name, sess in (("sweep item, reuse", session), ("sweep item, no reuse", plain)):
        if name in args.skip:
            continue
        sess.clear_prefix_cache()
        before = PrefixReuseCounter(**{k: v for k, v in vars(sess.prefix_reuse).items()})
        cpu0 = time.process_time()
        t_unit = timed(lambda: sdpa(median_prompt.input_ids))
        cpu1 = time.process_time()
        t = timed(lambda: [score_record(sess, r, margins=("margin",)) for r in sweep])
        cpu_ratio = (time.process_time() - cpu1) / (cpu1 - cpu0)  # CPU seconds: the ratio a loaded machine distorts least
        sweep_rows[name] = t / t_unit
        computed = sess.prefix_reuse.tokens_computed - before.tokens_computed - sum(r.n_tokens - min(r.query_rows) for r in sweep)
        sweep_prefix[name] = {"prefix_tokens_computed": computed, "prefix_blocks": sess.prefix_reuse.prefix_blocks - before.prefix_blocks,
                              "cpu_forwards": cpu_ratio, "load_average": os.getloadavg()[0]}
        print(f"  {name}: {len(sweep)} prompts {t:.1f} s = {t / t_unit:.2f} forwards of the median prompt ({t_unit:.1f} s; CPU time "
              f"{cpu_ratio:.2f} forwards' CPU; load average {os.getloadavg()[0]:.1f}); "
              f"prefix tokens computed {computed} in {sweep_prefix[name]['prefix_blocks']} blocks ({computed / median_prompt.n_tokens:.2f} "
              f"median prompts; token-level floor {floor}, {floor / median_prompt.n_tokens:.2f})", flush=True)
    reuse = session.prefix_reuse
    attribution = None if "attribution" in args.skip else attribution_run(session, plain, builder, args.attribution_items, args.masks,
                                                                          tuple(args.pools), sdpa)

    unit_text = f"median {statistics.median(unit):.1f} s over {len(unit)}" if unit else "not timed (no per-prompt row)"
    print(f"\nwall time {time.perf_counter() - started:.0f} s; unit (sdpa forward, {record.n_tokens} tokens): {unit_text}; sweep item: {len(sweep)} prompts of "
          f"{min(r.n_tokens for r in sweep)}..{max(r.n_tokens for r in sweep)} tokens (median {median_prompt.n_tokens})\n")
    print("| analysis (per prompt) | forwards of the same prompt (median) | range | s (median) |")
    print("|---|---|---|---|")
    for name in rows:
        print(f"| native: {name} | {statistics.median(ratios[name]):.2f} | {min(ratios[name]):.2f}–{max(ratios[name]):.2f} "
              f"| {statistics.median(seconds[name]):.1f} |")
    for name, (one, total, count) in backend_rows.items():
        print(f"| {name}: knockout (12) probe set | {total:.1f} (= {count} forwards × {one:.2f}) | | |")
    if circuit is not None:
        c, p = circuit, circuit["pieces"]
        print(f"| native: circuit AtP (every head × span edge, one pair: {c['edges']} edges) | {c['circuit_atp']:.2f} "
              f"(CPU time: {c['circuit_atp_cpu']:.2f}) | | {sum(p[n]['time_s'] for n in ('clean row', 'counterfactual row', 'AtP + AtP*')):.1f} |")
        for name, piece in p.items():
            print(f"| native: circuit, {name} | {piece['forwards']:.2f} (CPU time: {piece['cpu_forwards']:.2f}) | | {piece['time_s']:.1f} |")
    for name, value in sweep_rows.items():
        print(f"| {name} ({len(sweep)} prompts) | {value:.2f} (median prompt) | | |")
    if attribution is not None:
        a = attribution
        print(f"| attribution run ({a['masks']} masks × {a['items']} items × {'+'.join(a['pools'])}: {a['jobs']} jobs, "
              f"{a['distinct_prompts']} distinct prompts of {a['tokens'][0]}–{a['tokens'][2]} tokens) | {a['run']['forwards']:.2f} (median prompt, "
              f"{a['tokens'][1]} tokens) | | {a['run']['time_s']:.1f} |")
        print(f"| {a['jobs']} independent `score_record` calls, no reuse | {a['calls']['forwards']:.2f} (median prompt) | | {a['calls']['time_s']:.1f} |")
        print(f"\nattribution run / independent calls: {a['ratio']:.3f}; prompt tokens reused in the run: "
              f"{a['prefix_reuse']['fraction_reused']:.1%}; max |Δ margin| {a['max_abs_margin_diff']:.1e}")
    if circuit is not None:
        print(f"\ncircuit: {circuit['record_id']} ({circuit['tokens'][0]} tokens) against {circuit['counterfactual']} "
              f"({circuit['tokens'][1]} tokens, {circuit['counterfactual_prefix_reused']} prefix tokens from the cache); spans "
              f"{', '.join(circuit['spans'])}; {circuit['layers']} layers × {circuit['heads']} heads × {len(circuit['spans'])} spans; "
              f"held per row: messages {circuit['messages_bytes'] / 2**10:.0f} KiB, prefix K/V {circuit['prefix_kv_bytes'] / 2**20:.1f} MiB; "
              f"AtP* vs exact Spearman {circuit['atp_star_vs_exact_spearman']:.3f} (random weights), max |exact| {circuit['max_abs_exact']:.3g}")
    print(f"\nprefix reuse over the reuse session's calls (before the attribution run): {reuse}")
    report = {"tiny": args.tiny, "layers": cfg.num_hidden_layers, "threads": args.threads,
              "rows": {name: {"forwards": ratios[name], "time_s": seconds[name]} for name in rows},
              "backends": backend_rows, "circuit": circuit, "sweep_item": sweep_rows, "sweep_prefix": sweep_prefix, "attribution": attribution}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
