"""What the deciding-row replay (probes.engine.decision_row) computes and holds: the cost statements of
benchmarks/README.md (issue #43 item 6).

AtP and AtP* alone (``ig_steps=0, grad_drop=False``) are one backward of the row and equal the full call's
estimates; no operation in the prefix, the replay, attribution or exact patching outputs an [n, n] tensor (an
eager full forward, which outputs one per layer, is caught by the same check); a row holds its messages
(O(layers · heads · spans)), the span indicator and the prefix keys/values, nothing else (a planted [n, n]
tensor is caught); a model not in fp32 is refused with the fix; a backward leaves the prefix cache
bit-identical (a row built from it afterwards equals one built without a cache).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from probes.engine.decision_row import DecisionRow, Messages
from probes.engine.session import EngineSession

N = 201  # prefix of 200 tokens: two prefix blocks (128 + 72), longer than any dimension of the tiny model
SPANS = {"boundary": range(20, 60), "procedure": range(70, 110), "request": range(150, 170)}
WRONG, CORRECT = 17, 33


class OutputShapes(TorchDispatchMode):
    """Records the shape of every tensor an ATen operation outputs (fused kernels count as one operation)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def quadratic(shapes: list[tuple[int, ...]], n: int) -> list[tuple[int, ...]]:
    """Shapes with two dimensions of at least ``n``: an [n, n] (or larger) tensor."""
    return [s for s in shapes if sum(d >= n for d in s) >= 2]


def held_tensors(obj: object) -> list[torch.Tensor]:
    """Every tensor an object keeps in its attributes (through dicts, tuples and Messages)."""
    out: list[torch.Tensor] = []

    def walk(x: object) -> None:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v)
        elif isinstance(x, Messages):
            walk(vars(x))
    walk({k: v for k, v in vars(obj).items() if k != "session"})
    return out


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return torch.randint(5, 290, (N,), generator=torch.Generator().manual_seed(5)).tolist()


@pytest.fixture(scope="module")
def session(qwen3_dir: Path) -> EngineSession:
    return EngineSession(qwen3_dir)


def test_atp_alone_is_one_backward_and_equals_the_full_call(session: EngineSession, ids: list[int], monkeypatch) -> None:
    row = DecisionRow(session, ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)
    target = row.knocked_out("boundary")
    backwards = []
    original = row._gradients
    monkeypatch.setattr(row, "_gradients", lambda iv: backwards.append(iv) or original(iv))
    alone = row.edge_scores(target, ig_steps=0, grad_drop=False)
    assert len(backwards) == 1
    assert np.isnan(alone["eap_ig"]).all() and np.isnan(alone["atp_gd"]).all()
    backwards.clear()
    full = row.edge_scores(target, ig_steps=3)
    assert len(backwards) == 1 + (session.n_layers - 1) + 3  # the counter sees GradDrop's and EAP-IG's backwards
    np.testing.assert_array_equal(alone["atp"], full["atp"])
    np.testing.assert_array_equal(alone["atp_star"], full["atp_star"])
    assert np.isfinite(full["eap_ig"]).all() and np.isfinite(full["atp_gd"]).all()
    assert np.abs(alone["atp_star"]).max() > 0
    with pytest.raises(ValueError, match="ig_steps must be ≥ 0"):
        row.edge_scores(target, ig_steps=-1)


def test_no_n_by_n_tensor_and_linear_memory(session: EngineSession, ids: list[int], qwen3_dir: Path) -> None:
    session.clear_prefix_cache()
    n_prefix = N - 1
    with OutputShapes() as seen:
        row = DecisionRow(session, ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)
        target = row.knocked_out("boundary")
        row.edge_scores(target, ig_steps=2)
        row.components()
        row.node_effects(target)
        L, H, S = row.n_layers, row.n_heads, len(row.spans)
        row.patched_metrics(target, torch.eye(L * H * S, dtype=torch.bool).reshape(-1, L, H, S))
    assert len(seen.shapes) > 1000 and quadratic(seen.shapes, n_prefix) == []
    assert max(s[-1] for s in seen.shapes if len(s) >= 2 and n_prefix in s) == n_prefix  # the row's keys were seen
    # the planted case: an eager forward of the whole prompt outputs [1, heads, n, n] scores in every layer
    eager = AutoModelForCausalLM.from_pretrained(qwen3_dir, attn_implementation="eager").eval()
    with OutputShapes() as planted, torch.no_grad():
        eager(torch.tensor([ids]))
    assert quadratic(planted.shapes, n_prefix).count((1, H, N, N)) >= L

    # what a row keeps: its messages, the span indicator [n, S], the metric direction [D], the prefix K/V
    cfg = session.model.config
    g, dh, D = cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    messages = L * H * S + L * H * S * dh + L * H * dh + L * D
    kv = 2 * L * g * n_prefix * dh
    held = held_tensors(row)
    assert sum(t.numel() for t in held) == messages + N * S + D + kv
    assert quadratic([tuple(t.shape) for t in held], n_prefix) == []
    row.planted = torch.zeros(N, N)
    assert quadratic([tuple(t.shape) for t in held_tensors(row)], n_prefix) == [(N, N)]


def test_refuses_a_model_not_in_fp32(qwen3_dir: Path, ids: list[int]) -> None:
    bf16 = EngineSession(AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.bfloat16).eval())
    with pytest.raises(ValueError, match=r"the model is torch.bfloat16: load it in float32 \(--dtype float32\)"):
        DecisionRow(bf16, ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)
    assert math.isfinite(DecisionRow(EngineSession(qwen3_dir), ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT).metric)


def test_backward_leaves_the_prefix_cache_bit_identical(qwen3_dir: Path, ids: list[int]) -> None:
    """The backward runs through the replayed row only: the cached prefix keys/values it read are constants,
    and a row built afterwards from that cache equals one built without any cache, bit for bit."""
    def messages(row: DecisionRow) -> tuple:
        return row.metric, row.messages.log_mass, row.messages.value, row.messages.z, row.messages.mlp

    warm = EngineSession(qwen3_dir)
    first = DecisionRow(warm, ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)
    first.edge_scores(first.knocked_out("boundary"), ig_steps=2)
    again = DecisionRow(warm, ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)
    assert warm.prefix_reuse.tokens_reused == N - 1  # the whole prefix came from the cache the backward ran beside
    uncached = DecisionRow(EngineSession(qwen3_dir, prefix_cache=0), ids, spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)
    for a, b in zip(messages(again), messages(uncached)):
        assert a == b if isinstance(a, float) else torch.equal(a, b)
    other = DecisionRow(warm, [ids[0] + 1, *ids[1:]], spans=SPANS, wrong_token=WRONG, correct_token=CORRECT)
    assert not torch.equal(other.messages.value, uncached.messages.value)  # the comparison sees a one-token change
