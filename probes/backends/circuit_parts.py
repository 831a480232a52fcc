"""The circuit analysis's backend-portable parts: DLA and exact (head, span) knockouts at the deciding row.

The native deciding-row replay (:class:`probes.engine.decision_row.DecisionRow`) re-runs one row over
the engine's prefix cache; nnsight and TransformerLens cannot. These two functions compute the same
quantities through a backend's ``run`` only (:class:`probes.backends.base.Backend`), so they work on
every backend, the native ``EngineSession`` included. The deciding row ``d`` is the last position of
``ids``; the metric is ``logit(wrong) − logit(correct)`` at ``d``.

- :func:`decision_row_components`: direct logit attribution. One ``run`` records, at row ``d``,
  ``hook_embed``, every layer's ``hook_z`` (the heads' outputs, ``o_proj``'s input) and
  ``hook_resid_post`` (each block's output). The hook points hold no MLP output, so the MLP's is
  derived: ``mlp[L] = resid_post[L] − resid_post[L−1] − attn_out[L]`` with ``resid_post[−1]`` the
  embedding and ``attn_out[L] = o_proj(z[L])`` (every head's write plus ``o_proj``'s bias). That is the
  MLP's output only in a pre-norm block (``x + attn(norm(x))``, then ``+ mlp(norm(·))``); it is checked
  against the block's own MLP applied to its input (``mlp(post_attention_layernorm(resid_mid))``,
  recomputed from the weights at that row) and refused when they differ by more than
  :data:`~probes.engine.decision_row.SUM_TOLERANCE` (relative). The parts are projected through the
  final RMSNorm with its scale frozen at that run and must sum to the metric, by the native replay's
  own code (:func:`probes.engine.decision_row.direct_logit_attribution`).
- :func:`edge_knockout_effects`: exact patching of the (head, span) edges to the knockout
  counterfactual: per (layer, head), one :class:`~probes.engine.session.Knockout` removing the span's
  keys from that head's softmax at row ``d`` only (no candidate continuation is scored, so
  ``continuation`` is irrelevant), and the change of the metric. One ``run``: a batch of branch
  elements on the native engine, one forward per head on the forward backends.

The model's weights are read from ``backend.model`` (the HF model; TransformerLens's bridge wraps the
same modules, nnsight's trace runs them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from probes.backends.base import Backend
from probes.engine.decision_row import SUM_TOLERANCE, Components, direct_logit_attribution, head_writes, logit_difference
from probes.engine.hooks import HOOK_Z, Recorder
from probes.engine.session import Knockout

HEAD_OUTPUTS = Recorder("circuit_z", (HOOK_Z,), lambda z: z, rows="decision")  # per condition [layer, head, d_head]


def _decoder_blocks(backend: Backend) -> list[torch.nn.Module]:
    """The model's decoder layers, refused unless they have what DLA reads."""
    def has(obj: object, path: str) -> bool:
        for part in path.split("."):
            obj = getattr(obj, part, None)
        return obj is not None

    model = backend.model
    missing = [p for p in ("base_model.layers", "base_model.norm") if not has(model, p)]
    layers = list(model.base_model.layers) if not missing else []
    missing += [f"layers[*].{p}" for p in ("self_attn.o_proj", "post_attention_layernorm", "mlp") if not all(has(b, p) for b in layers)]
    if missing:
        raise NotImplementedError(f"DLA through a backend reads an HF decoder (base_model.layers with self_attn.o_proj, "
                                  f"post_attention_layernorm and mlp; base_model.norm); {type(model).__name__} lacks "
                                  f"{', '.join(missing)}")
    return layers


def _metric(logits: torch.Tensor, wrong_token: int, correct_token: int) -> float:
    return float(logits[-1, wrong_token] - logits[-1, correct_token])


def decision_row_components(backend: Backend, ids: Sequence[int], *, wrong_token: int, correct_token: int) -> Components:
    """DLA at the last row of ``ids`` through ``backend.run`` (module docstring): per head, per MLP,
    the embedding and the biases; the same :class:`~probes.engine.decision_row.Components` as
    ``DecisionRow.components``."""
    blocks = _decoder_blocks(backend)
    ids = [int(x) for x in ids]
    logit_difference(backend.model, wrong_token, correct_token)  # refuses a bad pair before the forward
    row = len(ids) - 1
    result = backend.run(ids, [row], record_residual=True, recorders=[HEAD_OUTPUTS]).conditions[0]
    residual = result.residual.float().cpu()  # [L + 1, D]: the embedding, then each block's output
    z = result.recorded[HEAD_OUTPUTS.name].float().cpu()  # [L, H, d_head]
    mlp = []
    with torch.no_grad():
        for layer, block in enumerate(blocks):
            o_proj = block.self_attn.o_proj
            o_bias = getattr(o_proj, "bias", None)
            attn_out = head_writes(block, z[layer]).cpu().sum(0) + (o_bias.float().cpu() if o_bias is not None else 0.0)
            resid_mid = residual[layer] + attn_out
            derived = residual[layer + 1] - resid_mid
            weight = o_proj.weight
            own = block.mlp(block.post_attention_layernorm(resid_mid.to(weight.device, weight.dtype)[None, None]))[0, 0].float().cpu()
            gap = float((derived - own).abs().max())
            if gap > SUM_TOLERANCE * max(1.0, float(residual[layer + 1].abs().max())):
                raise ValueError(f"layer {layer}: the block output minus its input and attention output differs from its MLP "
                                 f"applied to its input by {gap:.3g} (model dtype {weight.dtype}): the residual stream is not "
                                 "a pre-norm sum of attention and MLP outputs (post-norms? a rescaled block?), or the model "
                                 "is not float32 (load it with dtype='float32'); DLA through a backend is not defined for it")
            mlp.append(derived)
    return direct_logit_attribution(backend.model, wrong_token, correct_token, embed=residual[0], z=z, mlp=torch.stack(mlp),
                                    final=residual[-1], metric=_metric(result.logits, wrong_token, correct_token))


def edge_knockout_effects(backend: Backend, ids: Sequence[int], *, span_positions: Sequence[int], wrong_token: int,
                          correct_token: int, heads: Sequence[tuple[int, int]] | None = None) -> np.ndarray:
    """[L, H]: the exact change of the metric at the last row of ``ids`` when ``span_positions`` leave
    one head's softmax at that row (module docstring), for each (layer, head) in ``heads`` (default:
    every head); NaN for heads not asked."""
    ids = [int(x) for x in ids]
    logit_difference(backend.model, wrong_token, correct_token)
    keys = sorted({int(k) for k in span_positions})
    if not keys:
        raise ValueError("span_positions is empty: knocking out no key is the baseline; give the span's key positions")
    L, H = backend.n_layers, backend.n_heads
    cells = [(a, b) for a in range(L) for b in range(H)] if heads is None else [(int(a), int(b)) for a, b in heads]
    bad = [c for c in cells if not (0 <= c[0] < L and 0 <= c[1] < H)]
    if bad or len(set(cells)) != len(cells):
        raise ValueError(f"heads must be distinct (layer, head) pairs in 0..{L - 1} × 0..{H - 1}; got {bad or 'duplicates'}")
    row = len(ids) - 1
    conditions = [Knockout(f"L{a}H{b}", tuple(keys), heads=((a, b),), rows=(row,), continuation=False) for a, b in cells]
    result = backend.run(ids, [row], conditions=conditions)
    base = _metric(result.conditions[0].logits, wrong_token, correct_token)
    out = np.full((L, H), np.nan)
    for (a, b), cond in zip(cells, result.conditions[1:], strict=True):
        out[a, b] = _metric(cond.logits, wrong_token, correct_token) - base
    return out
