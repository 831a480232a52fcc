"""Backend parity: native engine, nnsight and TransformerLens give the same measurements (remote=True:
test_ndif.py; the analyses' ``backend=`` option: analyses/test_backend_option.py).

Matrix (fp32): a tiny random Qwen3 with the real Qwen3 tokenizer and chat template (a native record
whose correct and wrong names share their first token, so α is read in a continuation row), a tiny
random Llama with the organism's tokenizer (native), and the bundled organism (native and prompted). Each backend
scores the records through the one record scorer, ``probes.scoring.score.score_record``; every numeric
column (Eq. 1 margins, path margin, call log-odds, entropy, α of B and P at the deciding and the
open row, also per head, and the per-head ratio η) and the knockout effects Δm must agree, and so must the raw results: logits at every
branch row, span masses at every query row, full query rows and the residual stream.

Tolerance (fp32): 1e-5, absolute for margins, Δm, entropy, α, span masses and attention rows;
relative to the largest magnitude for raw logits and residuals. The backends compute the same fp32
forward by different code (sdpa plus exact query rows with -inf scores, vs eager softmax with the
blocked keys zeroed and the row renormalised), so only rounding differs. Measured maxima (printed
by pytest -s): margins and Δm ≤ 2.4e-6, path margin ≤ 1.01e-5 (tolerance 2e-5: a sum over the names' tokens), entropy ≤ 2.9e-6, α (mean and per
head) ≤ 2.3e-9, per-head η = α_B / (α_P + ε) ≤ 1.2e-5 relative (tolerance 1e-4 relative),
span masses and rows ≤ 2.8e-6, logits ≤ 9.5e-6 absolute, residual ≤ 1.2e-6 relative.
The prompted case (1751 tokens) is the longest, ~10-15 s on 2 cores.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from probes.backends import BACKENDS, get_backend
from probes.data.dataset import load_dataset
from probes.data.retrieval import Retriever, make_embedder
from probes.engine.hooks import HOOK_PATTERN, HOOK_Z, Recorder
from probes.engine.session import Knockout, span_positions
from probes.organism.train.examples import make_builder
from probes.prompts.builder import BuildSettings, PromptBuilder
from probes.prompts.record import PromptRecord
from probes.scoring.margins import candidates_from_record
from probes.scoring.score import EPSILON, score_record, scored_tokens
from reference import TOL


ORGANISM = Path(__file__).resolve().parents[2] / "probes" / "organism" / "weights"
COLLIDING_ITEM = "retail-ok-0001"  # get_order_details vs get_stock_info: both start with "get" under Qwen3


# The path margin sums the log-probabilities of every token of both names, so the rounding of each term
# adds up: 2 × TOL. Measured 1.01e-5 on the organism's memory-heads knockout since the native engine scores
# continuations through a token trie (tree-masked rows, another summation order than nnsight's forward).
PATH_TOL = 2 * TOL
SCORED = ("margin",)  # correct, wrong and abstain candidates: the parity of multi-token scoring without every catalog tool


def _tiny(arch: str, out: Path, tokenizer: object) -> None:
    torch.manual_seed({"qwen3": 3, "llama": 4}[arch])
    common = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=8192, tie_word_embeddings=True,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = Qwen3ForCausalLM(Qwen3Config(**common)) if arch == "qwen3" else LlamaForCausalLM(LlamaConfig(**common))
    with torch.no_grad():  # widen the scores: random init gives near-uniform attention rows
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(8.0 if arch == "qwen3" else 30.0)
            elif "q_norm" in name or "k_norm" in name:  # Qwen3 normalises q and k after the projection
                p.mul_(4.0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, qwen3_tokenizer, organism_tokenizer) -> dict[str, tuple[Path, object]]:
    """name -> (model directory, tokenizer): the tiny Qwen3 has the real Qwen3 tokenizer (long
    prompts, vocab 151669); the tiny Llama the organism's (short prompts, vocab 3072)."""
    torch.set_num_threads(1)
    out = {"organism": (ORGANISM, organism_tokenizer)}
    for arch, tokenizer in (("qwen3", qwen3_tokenizer), ("llama", organism_tokenizer)):
        d = tmp_path_factory.mktemp(f"tiny_{arch}")
        _tiny(arch, d, tokenizer)
        out[arch] = (d, tokenizer)
    return out


# (model, record format, conditions): together every way a Knockout restricts itself (all layers,
# a layer window, (layer, head) pairs on chosen rows without the continuation) on both formats.
MATRIX = [
    ("qwen3", "native", ("boundary", "memory_heads")),
    ("llama", "native", ("procedure_l1", "boundary")),
    ("organism", "native", ("boundary", "procedure_l1", "memory_heads")),
    # 1751 tokens: one eager forward per candidate, ~10-15 s on a loaded 2-core machine
    ("organism", "prompted", ("memory_heads",)),
]


def _record(name: str, tokenizer: object, fmt: str) -> PromptRecord:
    dataset = load_dataset("basm_probe")
    if name != "qwen3":  # the organism's tokenizer and chat template
        builder = make_builder(tokenizer, dataset, "lexical")
    else:
        builder = PromptBuilder(tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=1))
    return builder.build(dataset.select(ids=[COLLIDING_ITEM])[0], "basm", 1, fmt)


def _conditions(record: PromptRecord, names: tuple[str, ...]) -> list[Knockout]:
    spans = record.spans
    every = {
        "boundary": Knockout.from_spans("boundary", spans["boundary"]),
        "procedure_l1": Knockout.from_spans("procedure_l1", spans["procedure"], layers=[1]),
        "memory_heads": Knockout.from_spans("memory_heads", spans["memory"], heads=[(0, 1), (1, 2)],
                                            rows=[record.decision_index], continuation=False),
    }
    return [every[n] for n in names]


def _numeric(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if isinstance(v, float) and not math.isnan(v)}


@pytest.fixture(scope="module")
def backends(models) -> dict[str, dict[str, object]]:
    return {name: {b: get_backend(b, model_dir) for b in BACKENDS} for name, (model_dir, _) in models.items()}


@pytest.mark.parametrize(("name", "fmt", "condition_names"), MATRIX)
def test_backends_agree_on_scored_records_and_raw_results(name, fmt, condition_names, models, backends):
    record = _record(name, models[name][1], fmt)
    conds = _conditions(record, condition_names)
    assert record.format == fmt
    worst: dict[str, float] = {}
    rows = {}
    for b, backend in backends[name].items():
        t0 = time.perf_counter()
        rows[b] = score_record(backend, record, conds, margins=SCORED, per_head=True)
        print(f"\n{name} {fmt} {len(record.input_ids)} tokens, {b}: {time.perf_counter() - t0:.2f} s")
    native = rows["native"]
    base = native[0]["margin"]
    # Not vacuous: a knockout moves the margin.
    assert max(abs(r["margin"] - base) for r in native[1:]) > 1e-3
    if name == "qwen3":  # the real Qwen3 tokenizer: correct and wrong names share their first token
        assert record.collision and native[0]["deciding_row"] > record.decision_index  # α in a continuation row
    for b in ("nnsight", "transformerlens"):
        assert [r["condition"] for r in rows[b]] == [r["condition"] for r in native]
        for want, got in zip(native, rows[b]):
            w, g = _numeric(want), _numeric(got)
            assert set(w) == set(g), (b, set(w) ^ set(g))
            assert w.keys() >= {"margin", "margin_path", "call_logodds", "entropy", "alpha_boundary", "alpha_procedure"}
            for k in w:
                diff = abs(w[k] - g[k])
                worst[f"{b} {k}"] = max(worst.get(f"{b} {k}", 0.0), diff)
                assert diff <= (PATH_TOL if k == "margin_path" else TOL), (name, fmt, b, want["condition"], k, w[k], g[k])
            # per-head α at the deciding and open rows, and the per-head ratio η = α_B / (α_P + ε)
            heads = [k for k in want if k.endswith("_heads")]
            assert {"alpha_boundary_heads", "alpha_procedure_heads"} <= set(heads)
            for k in heads:
                diff = float(np.abs(np.asarray(want[k]) - np.asarray(got[k])).max())
                worst[f"{b} {k}"] = max(worst.get(f"{b} {k}", 0.0), diff)
                assert diff <= TOL, (name, fmt, b, want["condition"], k)
            eta = [(np.asarray(r["alpha_boundary_heads"]) + EPSILON) / (np.asarray(r["alpha_procedure_heads"]) + EPSILON)
                   for r in (want, got)]
            rel = float((np.abs(eta[0] - eta[1]) / eta[0]).max())
            worst[f"{b} eta_heads (relative)"] = max(worst.get(f"{b} eta_heads (relative)", 0.0), rel)
            assert rel <= 1e-4, (name, fmt, b, want["condition"], rel)
            # the knockout effect Δm
            dm = abs((want["margin"] - base) - (got["margin"] - rows[b][0]["margin"]))
            worst[f"{b} delta_m"] = max(worst.get(f"{b} delta_m", 0.0), dm)
            assert dm <= TOL

    # Raw results (no candidates): logits at every branch row, span masses, full rows, residual.
    record_spans = {s: span_positions(record.spans[s]) for s in ("boundary", "procedure", "memory")}
    raw = {b: backend.run(record.input_ids, record.query_rows, spans=record_spans, conditions=conds[:1],
                          record_rows=True, record_residual=True) for b, backend in backends[name].items()}
    ref = raw["native"]
    assert float(ref.conditions[0].rows.max()) > 0.2  # attention rows far from uniform
    for b in ("nnsight", "transformerlens"):
        for c_ref, c in zip(ref.conditions, raw[b].conditions, strict=True):
            assert c.row_offset == c_ref.row_offset and c.logits.shape == c_ref.logits.shape
            diffs = {
                # logits and residual relative to their scale (a trained model's logits reach ~20)
                "logits": (c.logits - c_ref.logits).abs().max() / c_ref.logits.abs().max().clamp(min=1.0),
                "rows": (c.rows - c_ref.rows).abs().max(),
                "residual": (c.residual - c_ref.residual).abs().max() / c_ref.residual.abs().max().clamp(min=1.0),
                **{f"span_mass {s}": (c.span_mass[s] - c_ref.span_mass[s]).abs().max() for s in record_spans},
            }
            for k, v in diffs.items():
                worst[f"{b} raw {k}"] = max(worst.get(f"{b} raw {k}", 0.0), float(v))
                assert v <= TOL, (name, b, c.condition.name, k, float(v))
    print(f"{name} {fmt}: max |diff| " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))


# ---------------------------------------------------------------------------- a per-row quantity declared here only
# Declared once, in this file: the engine, the backends and the scorer are not touched to record them.
HEAD_OUT_NORM = Recorder("head_out_norm", (HOOK_Z,), lambda z: z.norm(dim=-1), rows="decision")  # per condition [layer, head]
PATTERN_PEAK = Recorder("pattern_peak", (HOOK_PATTERN,), lambda p: p.amax(dim=-1), candidates=True)  # [layer, head, row]


def _eager_reference(model_dir: Path, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent of every backend: an HF eager forward with ``output_attentions`` (pattern [layer,
    head, n, n]) and o_proj's input caught by a forward pre-hook (z [layer, n, head, d_head])."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    cfg = model.config
    z: dict[int, torch.Tensor] = {}
    handles = [layer.self_attn.o_proj.register_forward_pre_hook(lambda _m, args, i=i: z.__setitem__(i, args[0][0]))
               for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    for h in handles:
        h.remove()
    heads = torch.stack([z[i].unflatten(-1, (cfg.num_attention_heads, -1)) for i in range(cfg.num_hidden_layers)])
    return torch.stack(out.attentions)[:, 0], heads


def test_a_recorder_declared_in_one_place_is_recorded_alike_on_every_backend(models, backends):
    """A new quantity (the per-head output norm at the decision row, from ``hook_z``; the peak attention
    probability at every query and candidate row, from ``hook_pattern``) is one ``Recorder``: native,
    nnsight and TransformerLens record it alike under knockouts, and it equals an eager HF forward."""
    model_dir, tokenizer = models["qwen3"]
    record = _record("qwen3", tokenizer, "native")
    conds = _conditions(record, ("boundary", "memory_heads"))
    cands = scored_tokens(candidates_from_record(record), record.format)
    assert any(len(t) > 1 for _, t in cands.values())  # continuation rows are recorded too
    recorders = [HEAD_OUT_NORM, PATTERN_PEAK]
    got = {b: backend.run(record.input_ids, record.query_rows, conditions=conds, candidates=cands, recorders=recorders)
           for b, backend in backends["qwen3"].items()}
    native = got["native"]
    n_layers, n_heads, n_rows = 2, 4, len(record.query_rows)
    base = native.conditions[0]
    assert base.recorded["head_out_norm"].shape == (n_layers, n_heads)
    assert base.recorded["pattern_peak"].shape == (n_layers, n_heads, n_rows)
    assert base.span_mass == {} and base.rows is None and base.residual is None  # only what was asked
    # Not vacuous: the knockout moves the quantity.
    assert (native["boundary"].recorded["head_out_norm"] - base.recorded["head_out_norm"]).abs().max() > 1e-3
    worst: dict[str, float] = {}
    for b in ("nnsight", "transformerlens"):
        for want, have in zip(native.conditions, got[b].conditions, strict=True):
            pairs = [(k, want.recorded[k], have.recorded[k]) for k in ("head_out_norm", "pattern_peak")]
            pairs += [(f"pattern_peak {c}", want.candidate_recorded[c]["pattern_peak"], have.candidate_recorded[c]["pattern_peak"])
                      for c in cands]
            for k, w, h in pairs:
                assert w.shape == h.shape, (b, k)
                diff = float((w - h).abs().max())
                k = k.split(" ")[0] + (" (candidate rows)" if " " in k else "")
                worst[f"{b} {k}"] = max(worst.get(f"{b} {k}", 0.0), diff)
                assert diff <= TOL, (b, want.condition.name, k, diff)
    # Independent computation, baseline: eager HF forward of the prompt and of each candidate's continuation.
    pattern, z = _eager_reference(model_dir, record.input_ids)
    rows = record.query_rows
    ref = {"head_out_norm": z[:, rows[-1]].norm(dim=-1), "pattern_peak": pattern[:, :, rows].amax(dim=-1)}
    for name, (anchor, toks) in cands.items():
        p_cand, _ = _eager_reference(model_dir, record.input_ids[: anchor + 1] + toks[:-1]) if len(toks) > 1 else (pattern, None)
        # a continuation row's own keys are not prompt positions: the peak over the prompt keys it sees
        ref[f"pattern_peak {name}"] = p_cand[:, :, anchor : anchor + len(toks), : anchor + 1].amax(dim=-1)
    for k, want in ref.items():
        name, _, cand = k.partition(" ")
        for b, res in got.items():
            have = res.conditions[0].candidate_recorded[cand][name] if cand else res.conditions[0].recorded[name]
            diff = float((have - want).abs().max())
            k = name + (" (candidate rows)" if cand else "")
            worst[f"{b} vs eager {k}"] = max(worst.get(f"{b} vs eager {k}", 0.0), diff)
            assert diff <= TOL, (b, k, diff)
    # The single-pass reference path records it too.
    single = backends["qwen3"]["native"].forward(record.input_ids, record.query_rows, conditions=conds, recorders=recorders)
    for want, have in zip(native.conditions, single.conditions, strict=True):
        for k in ("head_out_norm", "pattern_peak"):
            assert float((want.recorded[k] - have.recorded[k]).abs().max()) <= TOL, (want.condition.name, k)
    print("\nrecorder parity: max |diff| " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))


def test_the_native_engine_hands_recorders_rows_never_the_full_pattern(models, backends):
    """What a recorder's ``fn`` sees on the native engine: pattern rows over the prompt's keys, at most
    the branch rows (the query rows and the candidates' rows), never the n×n pattern."""
    model_dir, tokenizer = models["qwen3"]
    record = _record("qwen3", tokenizer, "native")
    cands = scored_tokens(candidates_from_record(record), record.format)
    seen: list[tuple[int, ...]] = []
    spy = Recorder("shape", (HOOK_PATTERN,), lambda p: (seen.append(tuple(p.shape)), p[..., :1])[1], candidates=True)
    backends["qwen3"]["native"].run(record.input_ids, record.query_rows, candidates=cands, recorders=[spy])
    n = len(record.input_ids)
    branch_rows = n - min(record.query_rows) + sum(len(t) - 1 for _, t in cands.values())
    assert seen and all(s[-1] == n and s[2] <= branch_rows < n for s in seen), (seen, branch_rows, n)


def test_prebuilt_notebook_objects_are_accepted(models, backends):
    """An nnsight model built in a notebook (sdpa: switched to eager) and a booted bridge."""
    from nnsight import LanguageModel
    from transformer_lens.model_bridge import TransformerBridge

    model_dir, tokenizer = models["organism"]
    record = _record("organism", tokenizer, "native")
    conds = _conditions(record, ("boundary",))
    lm = LanguageModel(AutoModelForCausalLM.from_pretrained(model_dir).eval(), tokenizer=tokenizer)
    bridge = TransformerBridge.boot_transformers(str(model_dir), hf_model=AutoModelForCausalLM.from_pretrained(model_dir).eval(),
                                                 tokenizer=tokenizer)
    want = score_record(backends["organism"]["native"], record, conds, margins=SCORED)
    for backend in (get_backend("nnsight", lm), get_backend("transformerlens", bridge)):
        for w, g in zip(want, score_record(backend, record, conds, margins=SCORED)):
            assert abs(w["margin"] - g["margin"]) <= TOL and abs(w["alpha_boundary"] - g["alpha_boundary"]) <= TOL
    assert lm.config._attn_implementation == "eager"


def test_backends_refuse_what_the_engine_refuses(models, backends):
    backend = backends["organism"]["transformerlens"]
    with pytest.raises(ValueError, match="blocks every key"):
        backend.run([5, 6, 7], [1], conditions=[Knockout("all", (0, 1))])
    with pytest.raises(ValueError, match="anchor"):
        backend.run([5, 6, 7], [1], candidates={"x": (0, [4])})
    with pytest.raises(ValueError, match="unknown backend"):
        get_backend("vllm", models["organism"][0])
