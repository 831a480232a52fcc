"""benchmarks/gpu.py on a tiny Qwen3 shape on the CPU (fp32: CPU bf16 is slow and the parity can
then be tight; real Qwen3 tokenizer, one dataset record): every section runs and reports, the engine's knockout logits agree with ten eager
forwards under explicit 4D masks, and the time budget skips steps with a recorded reason."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

GPU_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"


@pytest.fixture(scope="module")
def gpu_bench():
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("benchmarks_gpu", GPU_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_reports_every_section(gpu_bench, tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu_bench.main(["--tiny", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["skipped"] == {}, report["skipped"]
    (record,) = report["records"]["per_record"]
    assert record["n_tokens"] > 1000  # a real dataset prompt under the real Qwen3 tokenizer
    for method in ("sdpa", "engine_baseline", "engine_10ko"):
        assert record[method]["time_s"] > 0 and record[method]["peak_mib"] is None  # no memory on the CPU
    assert report["eager_attn"]["n_tokens"] == record["n_tokens"] and report["eager_attn"]["time_s"] > 0
    assert report["mask_4d"]["forwards"] == 10
    parity = report["parity"]
    assert len(parity["per_knockout"]) == 10
    assert report["dtype"] == "float32" and parity["max_abs_logit"] > 0.1
    assert parity["max_abs_diff"] <= 1e-5
    assert [r["n_tokens"] for r in report["long"]] == [256, 512]
    # the analyses' paths: the knockout scorer (22 conditions: B, 10 pool draws, 10 B-side equal-mass draws, P), a sweep item and the attribution
    # masks, each with and without prefix reuse: the same margins (bit for bit: fixed prefix blocks)
    (knockout,) = report["knockout_analysis"]
    assert knockout["conditions"] == 22 and knockout["forwards"] > 0
    item = report["sweep_item"]
    assert item["prompts"] == 4  # tiny: k = 0..1
    assert item["reuse"]["time_s"] > 0 and item["no_reuse"]["time_s"] > 0 and item["max_abs_margin_diff"] == 0.0
    # the attribution analysis' own jobs (3 masks × 1 item × both pools) against independent calls
    attribution = report["attribution"]
    assert (attribution["jobs"], attribution["items"], attribution["pools"]) == (6, 1, ["topk", "library"])
    assert attribution["run"]["time_s"] > 0 and attribution["calls"]["time_s"] > 0 and attribution["max_abs_margin_diff"] == 0.0
    # the circuit's pieces on one pair (the v2 set's first T_wrong eval item, basm against proc at k = 2), fp32
    circuit = report["circuit"]
    assert circuit["record_id"].endswith("|basm|k2|native") and circuit["counterfactual"].endswith("|proc|k2|native")
    assert circuit["edges"] == 4 * 4 * len(circuit["spans"]) and "boundary" in circuit["spans"]
    assert all(piece["forwards"] > 0 for piece in circuit["pieces"].values()) and len(circuit["pieces"]) == 7
    assert circuit["peak_mib"] is None
    # steering (issue #44 item 5): the steer analysis' scorer, one condition at decision rows and at call rows; no section failed
    steer = report["steer"]
    assert list(steer["pieces"]) == ["clean", "decision C=1", "call C=1"] and report["failed"] == {}
    assert all(p["forwards"] > 0 and p["tokens_computed"] == steer["tokens"] for p in steer["pieces"].values())
    # section 11 (tiny: repair alone), as a user runs it, and the one table of every analysis
    repair = report["analysis repair"]
    assert repair["analysis"] == "repair" and repair["prompts"] >= 1 and repair["forwards_per_prompt"] > 0
    table = [name for name, _, _ in gpu_bench.cost_table(report)]
    assert table[-1].startswith("repair") and any(name.startswith("circuit") for name in table) and len(table) == 8


def test_budget_skips_with_reasons(gpu_bench, tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu_bench.main(["--tiny", "--budget-s", "0", "--json", str(out)]) == 0
    skipped = json.loads(out.read_text())["skipped"]
    assert set(skipped) == {"records[0:]", "eager_attn", "mask_4d", "knockout_analysis[0:]", "sweep_item",
                            "attribution", "circuit", "steer", "analysis repair", "long n=256", "long n=512"}
    assert all("s left" in why for why in skipped.values())


def test_memory_table_counts_qwen3_parameters(gpu_bench):
    """Parameter counts from the architecture against the closed form of a Qwen3 block."""
    for row, shape in zip(gpu_bench.memory_table(), gpu_bench.QWEN3_SHAPES.values()):
        h, i, L, q, kv, d, v = (shape[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                      "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"))
        block = h * q * d * 2 + h * kv * d * 2 + 3 * h * i + 2 * h + 2 * d  # q,o + k,v + MLP + 2 norms + q/k norms
        assert row["parameters"] == L * block + 2 * v * h + h  # untied embeddings and head, final norm
    assert [round(r["parameters"] / 1e9, 2) for r in gpu_bench.memory_table()] == [8.19, 14.77, 32.76]


@pytest.mark.slow
def test_tiny_gemma3_shape_with_sliding_windows(gpu_bench, tmp_path):
    """A Gemma 3 shape (Gemma3TextConfig; a window of 128 keys on three of four layers, ~1.4k-token prompts): the
    engine's knockout logits equal the 4D-mask eager forwards that apply each layer's window; a section the engine
    cannot run on it fails loudly (FAILED, exit 1), named in the report, and the others still run."""
    out = tmp_path / "gpu.json"
    status = gpu_bench.main(["--tiny", "--shape", "gemma3-270m", "--analyses", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["shape"] == "gemma3-270m" and report["parity"]["max_abs_diff"] <= 1e-5
    assert status == (1 if report["failed"] else 0) and set(report["failed"]) <= {"circuit"}  # DLA refuses post-norm blocks
    assert report["sweep_item"]["max_abs_margin_diff"] == 0.0 and report["skipped"] == {}


def test_sliding_window_masks_of_the_reference(gpu_bench):
    """The reference's per-layer mask: causal, within the window on sliding layers (a key is seen while
    query − key < window, as transformers' sliding_window_overlay), the knocked keys at the query rows."""
    from probes.engine.session import Knockout

    masks = gpu_bench.mask_4d(8, 2, 1, Knockout("k", (1,)), [6, 7], torch.float32, torch.device("cpu"), [3, None])
    seen = [m[0, 0] == 0 for m in masks]
    assert seen[0][5].tolist() == [False, False, False, True, True, True, False, False]
    assert seen[1][7].tolist() == [True, False, True, True, True, True, True, True]
    assert seen[1][5].tolist() == [True, True, True, True, True, True, False, False]


@pytest.mark.slow
def test_tiny_run_of_every_added_analysis(gpu_bench, tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu_bench.main(["--tiny", "--records", "1", "--long", "--analyses", *gpu_bench.ANALYSIS_RUNS, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert all(report[f"analysis {label}"]["forwards_per_prompt"] > 0 for label in gpu_bench.ANALYSIS_RUNS)
