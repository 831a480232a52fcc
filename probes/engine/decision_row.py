"""The deciding row as a circuit: one row replayed over cached keys, its heads' inputs split by source span.

The circuit analysis (``basm-probes circuit``) asks which components, reading which spans of the
prompt, make the wrong-tool margin at the *deciding row* ``d`` (the row predicting the first token
where the wrong name parts from the correct one; the shared name prefix is part of ``ids``). This
module is its instrument.

Edges and messages
------------------
Every key position ``0..d`` belongs to exactly one *source span* (B, P, the request, the catalogue,
...; positions no span names fall in ``other``). An **edge** is (layer, head, span): what head ``h``
of layer ``L`` reads at row ``d`` from the keys of span ``S``. Its **message** is the pair

    λ_S = logsumexp_{k∈S} s_k        (s: the head's scaled q·k scores at row d)
    ū_S = Σ_{k∈S} softmax_S(s)_k v_k (the span's mean value, weighted within the span)

and the head's output is exactly ``z = Σ_S softmax(λ)_S ū_S`` (the attention output, split by span).
Patching an edge replaces its message by another run's: the counterfactual prompt's deciding row
(the same span of that prompt, read by that prompt's own query), a knockout (``λ = −inf``: the span
removed from that head's softmax, as :class:`~probes.engine.session.Knockout` removes it), or a mean.
Every other edge keeps computing from the (possibly changed) row.

The replay
----------
Rows before ``d`` never see row ``d`` (causality), so a change at the deciding row changes the
deciding row only. Their keys/values come from the session's prefix cache (computed without
gradient, in blocks, bit-identical with or without reuse: probes.engine.prefix_cache); only row ``d``
runs again, through every layer, with its attention computed here in fp32
(:func:`probes.engine.session.row_attention`) and autograd on. A replay is batched: one element per
intervention, so exact patching of N edges is one row forward of batch N, never N prompt forwards.

The metric is the logit difference ``logit(wrong) − logit(correct)`` at row ``d`` for one token
pair fixed per item (the binding pair of the tool-choice margin, which equals it at that row:
``log P`` differences at one row are logit differences).

Estimates
---------
- **DLA** (:meth:`DecisionRow.components`): the final residual at row ``d`` is the embedding plus
  every head's ``W_O^h z_h`` (and ``o_proj``'s bias) plus every MLP's output (pre-norm blocks); each
  is projected on the unembedding difference through the final RMSNorm with its scale frozen at the
  clean run. The parts sum to the metric (checked on every call: an architecture whose residual is
  not such a sum is refused, not approximated).
- **AtP** (Nanda 2023; Kramár et al. 2024): ``Δ̂_e = ∇_msg metric · (msg'_e − msg_e)`` in the
  messages' linear coordinates (mass ``m = exp(λ − c)`` and ``u = m ū``), one backward.
- **AtP\\*** (Kramár et al. 2024), the saturation fix: the head's output under the one patched
  edge is recomputed exactly (the softmax over spans, not its linearisation), and only the effect
  of that change of ``z`` downstream is linear: ``Δ̂_e = ∇_z metric · (z_h[e patched] − z_h)``.
- **GradDrop** (AtP\\*'s cancellation fix): for each later layer ℓ the gradient is stopped through
  layer ℓ's attention and MLP outputs and AtP\\* recomputed; ``gd_e = mean_ℓ |Δ̂_e^{(ℓ)}|`` over
  ℓ = 0..L−1, with ``Δ̂_e^{(ℓ)} = Δ̂_e`` for ℓ at or below the edge's layer. An unsigned score
  (a large value with a small ``Δ̂`` marks effects that cancel along paths).
- **EAP-IG** (Hanna et al. 2024), on messages: every edge's message moves from clean to
  counterfactual together, ``msg(α) = (1 − α) f(α) + α msg'``; at ``steps`` midpoints the gradient
  is taken and ``score_e = mean_k ∇_e metric(α_k) · (msg'_e − f_e(α_k))``. The scores sum to
  ``metric(all patched) − metric(clean)`` up to the quadrature (tests).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from probes.engine.loading import check_context_length
from probes.engine.session import EngineSession, row_attention

OTHER = "other"  # the source span of key positions no given span holds
DEFAULT_IG_STEPS = 16  # EAP-IG midpoints (stated in every output that uses them)
REPLAY_BATCH = 64  # interventions per batched row forward
SUM_TOLERANCE = 1e-4  # DLA parts must sum to the metric within this relative tolerance


@dataclass(frozen=True)
class Messages:
    """One run's deciding row: per edge (layer, head, span) the message, ``log_mass`` [L, H, S]
    (−inf: the span holds no visible key, or is knocked out) and ``value`` [L, H, S, d_head] (0
    where the mass is 0); per node the head outputs ``z`` [L, H, d_head] and the MLP outputs ``mlp``
    [L, d_model]; the run's ``metric`` and the span names."""

    spans: tuple[str, ...]
    log_mass: torch.Tensor
    value: torch.Tensor
    z: torch.Tensor
    mlp: torch.Tensor
    metric: float

    def aligned(self, spans: Sequence[str]) -> Messages:
        """The messages over ``spans`` in that order: a span this run lacks has no mass (as if knocked
        out): the counterfactual of a prompt without B (Proc. Skill) is "B read by nobody"."""
        idx = [self.spans.index(s) if s in self.spans else -1 for s in spans]
        lm = torch.full((*self.log_mass.shape[:2], len(spans)), -math.inf)
        val = torch.zeros((*self.value.shape[:2], len(spans), self.value.shape[-1]))
        for j, i in enumerate(idx):
            if i >= 0:
                lm[:, :, j], val[:, :, j] = self.log_mass[:, :, i], self.value[:, :, i]
        return replace(self, spans=tuple(spans), log_mass=lm, value=val)

    @classmethod
    def mean(cls, runs: Sequence[Messages]) -> Messages:
        """The mean message per edge over ``runs`` (mean λ and ū over the runs where the span has
        mass; none: no mass), mean head and MLP outputs: the target of mean ablation."""
        if not runs:
            raise ValueError("mean ablation needs at least one run to average")
        spans = runs[0].spans
        if any(r.spans != spans for r in runs):
            raise ValueError("mean ablation: runs with different span lists")
        lm = torch.stack([r.log_mass for r in runs])
        has = torch.isfinite(lm)
        n = has.sum(0)
        mean_lm = torch.where(n > 0, torch.where(has, lm, 0.0).sum(0) / n.clamp(min=1), -math.inf)
        val = torch.stack([r.value for r in runs])
        mean_val = (val * has[..., None]).sum(0) / n.clamp(min=1)[..., None]
        return cls(spans, mean_lm, mean_val, torch.stack([r.z for r in runs]).mean(0),
                   torch.stack([r.mlp for r in runs]).mean(0), math.nan)


@dataclass(frozen=True)
class Components:
    """DLA at the deciding row: each part's contribution to the metric (logits), through the final
    norm with its scale frozen at the clean run (``norm_scale``: that scale, 1/rms)."""

    embed: float
    heads: np.ndarray  # [L, H]
    attn_bias: np.ndarray  # [L] o_proj biases (0 where none)
    mlps: np.ndarray  # [L]
    unembed_bias: float
    metric: float
    norm_scale: float

    @property
    def total(self) -> float:
        return float(self.embed + self.heads.sum() + self.attn_bias.sum() + self.mlps.sum() + self.unembed_bias)


def logit_difference(model: torch.nn.Module, wrong_token: int, correct_token: int) -> tuple[torch.Tensor, float]:
    """The metric ``logit(wrong) − logit(correct)`` as a readout of the final norm's output: (the
    unembedding difference [d_model], the output bias difference; 0 without a bias). Refuses tokens
    outside the vocabulary and a pair that is one token."""
    head = model.get_output_embeddings()
    vocab = head.weight.shape[0]
    for tok in (wrong_token, correct_token):
        if not 0 <= int(tok) < vocab:
            raise ValueError(f"metric token {tok} outside the vocabulary 0..{vocab - 1}")
    if int(wrong_token) == int(correct_token):
        raise ValueError("the metric's wrong and correct tokens are the same token: the names never diverge at this row")
    pair = [int(wrong_token), int(correct_token)]
    w = head.weight[pair].float()
    b = getattr(head, "bias", None)
    return (w[0] - w[1]).detach(), float(b[pair[0]] - b[pair[1]]) if b is not None else 0.0


def head_writes(block: torch.nn.Module, z: torch.Tensor) -> torch.Tensor:
    """[H, D]: each head's write to the residual stream, W_O^h z_h (z: [H, d_head]; ``block``: a decoder
    layer; o_proj's bias is not a head's)."""
    w = block.self_attn.o_proj.weight.float()  # [D, H * dh]
    n_heads, dh = z.shape
    return torch.einsum("dhk,hk->hd", w.reshape(w.shape[0], n_heads, dh), z.float().to(w.device))


def frozen_norm(norm: torch.nn.Module, x: torch.Tensor, unembed: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The final RMSNorm at ``x`` as a linear map: (1/rms(x), the direction of ``unembed`` in the residual
    basis). Checked against the module itself, so a norm of another kind is refused."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if eps is None:
        raise NotImplementedError(f"final norm {type(norm).__name__} has no epsilon: not an RMSNorm this replay knows")
    with torch.no_grad():
        ones = torch.ones_like(x)
        gain = norm(ones[None, None])[0, 0].float() * math.sqrt(1 + eps)
        scale = float(torch.rsqrt(x.pow(2).mean() + eps))
        y = norm(x[None, None])[0, 0].float()
    if not torch.allclose(scale * gain * x, y, rtol=1e-4, atol=1e-5 * float(y.abs().max())):
        raise NotImplementedError(f"final norm {type(norm).__name__} is not x·w/rms(x): DLA through it is not defined here")
    return scale, (scale * gain * unembed).detach()


def direct_logit_attribution(model: torch.nn.Module, wrong_token: int, correct_token: int, *, embed: torch.Tensor, z: torch.Tensor,
                             mlp: torch.Tensor, final: torch.Tensor, metric: float) -> Components:
    """DLA at one row from what a run recorded there: the embedding [D], the head outputs ``z`` [L, H, d_head],
    the MLP outputs [L, D], the residual entering the final norm ``final`` [D] (its scale frozen) and the
    run's ``metric``. Refuses parts that do not sum to the metric within :data:`SUM_TOLERANCE` (relative)."""
    unembed, unembed_bias = logit_difference(model, wrong_token, correct_token)
    dev = unembed.device  # the parts may come from another device (a backend's recordings are on the CPU)
    scale, direction = frozen_norm(model.base_model.norm, final.float().to(dev), unembed)
    layers = model.base_model.layers
    heads = np.zeros(tuple(z.shape[:2]))
    bias = np.zeros(len(layers))
    mlps = np.zeros(len(layers))
    with torch.no_grad():
        for layer, block in enumerate(layers):
            heads[layer] = (head_writes(block, z[layer]).to(dev) @ direction).cpu().numpy()
            o_bias = getattr(block.self_attn.o_proj, "bias", None)
            bias[layer] = float(o_bias.float().to(dev) @ direction) if o_bias is not None else 0.0
            mlps[layer] = float(mlp[layer].float().to(dev) @ direction)
        out = Components(float(embed.float().to(dev) @ direction), heads, bias, mlps, unembed_bias, metric, scale)
    if abs(out.total - out.metric) > SUM_TOLERANCE * max(1.0, abs(out.metric)):
        raise ValueError(f"DLA parts sum to {out.total:.6f}, the metric is {out.metric:.6f}: this architecture's residual "
                         "stream is not the embedding plus per-head and MLP outputs read through the final norm and the "
                         "unembedding (post-norms? a rescaled readout?); DLA is not defined for it here")
    return out


@dataclass
class _Intervention:
    """What one batched replay does (B elements). ``edge_alpha`` [B, L, H, S]: each edge's share of the
    way to ``target`` (0 clean, 1 patched); ``z_set``/``z_value`` [B, L, H](, d_head): head outputs
    replaced; ``mlp_set``/``mlp_value`` [B, L](, D): MLP outputs replaced; ``leaves``: gradient leaves on
    every message, head output and MLP output; ``drop_layer``: stop the gradient through that layer's
    attention and MLP outputs."""

    batch: int
    target: Messages | None = None
    edge_alpha: torch.Tensor | None = None
    z_set: torch.Tensor | None = None
    z_value: torch.Tensor | None = None
    mlp_set: torch.Tensor | None = None
    mlp_value: torch.Tensor | None = None
    leaves: bool = False
    drop_layer: int | None = None


@dataclass
class _Trace:
    """What a replay recorded, per layer: the computed messages (m, u with reference c), the target's
    in the same coordinates, the head outputs, the MLP outputs, the gradient leaves."""

    m: dict[int, torch.Tensor]
    u: dict[int, torch.Tensor]
    m_t: dict[int, torch.Tensor]
    u_t: dict[int, torch.Tensor]
    z: dict[int, torch.Tensor]
    mlp: dict[int, torch.Tensor]
    leaf: dict[tuple[str, int], torch.Tensor]
    c: dict[int, torch.Tensor]
    mf: dict[int, torch.Tensor] = field(default_factory=dict)
    uf: dict[int, torch.Tensor] = field(default_factory=dict)
    embed: torch.Tensor | None = None
    final: torch.Tensor | None = None


class DecisionRow:
    """One prompt's deciding row, ready to replay under interventions (module docstring).

    ``ids``: the prompt with the shared name prefix appended; its last position is the deciding row.
    ``spans``: source span -> key positions (disjoint; positions ``0..d``; a span may be empty); positions
    no span holds go to ``other`` (the last span, always present). ``wrong_token`` / ``correct_token``: the metric's pair at that row.
    """

    def __init__(self, session: EngineSession, ids: Sequence[int], *, spans: Mapping[str, Sequence[int]],
                 wrong_token: int, correct_token: int) -> None:
        self.session = session
        model = session.model
        cfg = model.config.get_text_config()
        dtype = next(model.parameters()).dtype
        if dtype != torch.float32:
            raise ValueError(f"the deciding-row replay runs the row in fp32 (its DLA sums to the metric within {SUM_TOLERANCE:g}); "
                             f"the model is {dtype}: load it in float32 (--dtype float32)")
        if getattr(cfg, "final_logit_softcapping", None):
            raise NotImplementedError("the deciding-row replay reads logit differences linearly: final logit softcapping is not supported")
        self.ids = [int(x) for x in ids]
        if len(self.ids) < 2:
            raise ValueError("the deciding row needs at least one earlier position")
        check_context_length(len(self.ids), model.config)
        self.row = len(self.ids) - 1
        self._unembed, self._unembed_bias = logit_difference(model, wrong_token, correct_token)
        self.pair = (int(wrong_token), int(correct_token))
        self.spans, self.span_of = _span_index(spans, self.row + 1)
        self.n_layers, self.n_heads = session.n_layers, session.n_heads
        self._layers = session._layers
        self._norm = model.base_model.norm
        with torch.inference_mode():
            kv = session._prefix_kv(self.ids[: self.row])
        # plain (not inference-mode) fp32 copies: autograd reads them as constants
        self._kv = {layer: (k.float().clone(), v.float().clone()) for layer, (k, v) in kv.items()}
        self._onehot = torch.nn.functional.one_hot(torch.as_tensor(self.span_of), len(self.spans)).float().to(session.device)
        metric, trace = self._replay(_Intervention(1))
        self.messages = self._messages(trace, metric[0])

    # ------------------------------------------------------------------------------ replay
    @property
    def metric(self) -> float:
        return self.messages.metric

    def _attend(self, iv: _Intervention, trace: _Trace) -> Any:
        def attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   scaling: float, sliding_window: int | None) -> torch.Tensor:
            layer = module.layer_idx
            b, h, _, dh = query.shape
            g = key.shape[1]
            kp, vp = self._kv[layer]  # [1, g, d, dh]
            q5 = query.float().reshape(b, g, h // g, dh)
            s = torch.cat((torch.einsum("bgrd,gkd->bgrk", q5, kp[0]),
                           torch.einsum("bgrd,bgd->bgr", q5, key[:, :, 0].float())[..., None]), dim=-1).reshape(b, h, -1) * scaling
            if sliding_window is not None:
                s = s.masked_fill((torch.arange(s.shape[-1], device=s.device) <= self.row - sliding_window), -math.inf)
            t = iv.target
            c = s.max(-1).values.detach()  # [b, h]: a numeric reference that cancels in z
            if t is not None and iv.edge_alpha is not None and bool((iv.edge_alpha[:, layer] > 0).any()):
                # the largest log-mass the mix reads: the row's scores in the spans that keep any of them, the target's
                # in the spans that take any. A span patched away must not set it (a real model's sink heads: λ ≈ 400
                # in the span patched, the kept spans' masses would underflow to 0), nor a target span read nowhere.
                a = iv.edge_alpha[:, layer].to(c.device)
                span_max = torch.where(self._onehot.T.bool(), s[:, :, None, :], -math.inf).amax(-1)  # [b, h, S]
                c = torch.maximum(torch.where(a < 1, span_max, -math.inf).amax(-1),
                                  torch.where(a > 0, t.log_mass[layer].to(c.device)[None], -math.inf).amax(-1)).detach()
            elif t is not None:
                c = torch.maximum(c, t.log_mass[layer].max(-1).values.to(c.device)[None])
            trace.c[layer] = c
            # scores above c lie only in spans patched whole (a = 1), whose row masses the mix never reads: capped, not inf
            e = torch.exp((s - c[..., None]).clamp(max=0))  # [b, h, d + 1]
            m = e @ self._onehot  # [b, h, S]
            e5 = e.reshape(b, g, h // g, -1)
            v_self = value[:, :, 0].float()  # [b, g, dh]
            u = torch.stack([torch.einsum("bgrk,gkd->bgrd", e5[..., :-1] * self._onehot[:-1, j], vp[0])
                             for j in range(len(self.spans))], dim=3).reshape(b, h, len(self.spans), dh)
            self_span = int(self.span_of[-1])
            u_self = (e5[..., -1, None] * v_self[:, :, None]).reshape(b, h, dh)
            own = torch.nn.functional.one_hot(torch.tensor(self_span, device=u.device), len(self.spans)).float()
            u = u + own[None, None, :, None] * u_self[:, :, None]
            trace.m[layer], trace.u[layer] = m.detach(), u.detach()
            if t is not None:
                m_t = torch.exp(t.log_mass[layer][None] - c[..., None])  # [b, h, S]
                u_t = m_t[..., None] * t.value[layer][None]
                trace.m_t[layer], trace.u_t[layer] = m_t.detach(), u_t.detach()
                if iv.edge_alpha is not None:
                    # (1 − a)·x + a·x_t, the ends taken as they are: m + a·(m_t − m) cancels m_t away where m ≫ m_t
                    # (a real model's sink heads: λ ≈ 400, a patched span's mass 1e-16 of the row's), and a fully
                    # patched span must not read the row's masses at all (they may overflow against the target's c)
                    a = iv.edge_alpha[:, layer].to(m.device)
                    m = torch.where(a == 1, m_t, torch.where(a == 0, m, (1 - a) * m + a * m_t))
                    u = torch.where(a[..., None] == 1, u_t, torch.where(a[..., None] == 0, u, (1 - a[..., None]) * u + a[..., None] * u_t))
            trace.mf[layer], trace.uf[layer] = m.detach(), u.detach()
            if iv.leaves:
                m = m + _leaf(trace, "m", layer, m)
                u = u + _leaf(trace, "u", layer, u)
            z = u.sum(2) / m.sum(2)[..., None]  # [b, h, dh]
            if iv.z_set is not None:
                z = torch.where(iv.z_set[:, layer, :, None], iv.z_value[:, layer], z)
            if iv.leaves:
                z = z + _leaf(trace, "z", layer, z)
            trace.z[layer] = z.detach()
            return z[:, None].to(query.dtype)
        return attend

    @contextlib.contextmanager
    def _hooks(self, iv: _Intervention, trace: _Trace) -> Iterator[None]:
        handles = []

        def mlp_hook(layer: int) -> Any:
            def hook(_m: torch.nn.Module, _i: Any, out: torch.Tensor) -> torch.Tensor:
                out = out.float()
                if iv.mlp_set is not None:
                    out = torch.where(iv.mlp_set[:, layer, None, None], iv.mlp_value[:, layer, None], out)
                if iv.leaves:
                    out = out + _leaf(trace, "mlp", layer, out)
                trace.mlp[layer] = out[:, -1].detach()
                return out.detach() if iv.drop_layer == layer else out
            return hook

        def drop_attn(_m: torch.nn.Module, _i: Any, out: Any) -> Any:
            return (out[0].detach(), *out[1:])

        def embed_hook(_m: torch.nn.Module, _i: Any, out: torch.Tensor) -> None:
            trace.embed = out[:, -1].detach().float()

        def final_hook(_m: torch.nn.Module, args: Any) -> None:
            trace.final = args[0][:, -1].detach().float()

        for layer, block in enumerate(self._layers):
            handles.append(block.mlp.register_forward_hook(mlp_hook(layer)))
            if iv.drop_layer == layer:
                handles.append(block.self_attn.register_forward_hook(drop_attn))
        handles.append(self.session.model.get_input_embeddings().register_forward_hook(embed_hook))
        handles.append(self._norm.register_forward_pre_hook(final_hook))
        try:
            yield
        finally:
            for hd in handles:
                hd.remove()

    def _replay(self, iv: _Intervention) -> tuple[torch.Tensor, _Trace]:
        """One batched row forward under ``iv``: the metric per element [B] and what it recorded."""
        trace = _Trace({}, {}, {}, {}, {}, {}, {}, {})
        dev = self.session.device
        iv = _on_device(iv, dev)
        with torch.enable_grad() if iv.leaves else torch.no_grad(), row_attention(self._attend(iv, trace)), self._hooks(iv, trace):
            hidden = self.session.model.base_model(
                input_ids=torch.full((iv.batch, 1), self.ids[-1], device=dev),
                position_ids=torch.full((iv.batch, 1), self.row, device=dev), use_cache=False).last_hidden_state[:, -1]
            metric = hidden.float() @ self._unembed + self._unembed_bias
        if not torch.isfinite(metric.detach()).all():
            raise FloatingPointError(f"the deciding-row replay gave a non-finite metric at row {self.row}")
        return metric, trace

    def _messages(self, trace: _Trace, metric: torch.Tensor) -> Messages:
        lm, val = [], []
        for layer in range(self.n_layers):
            m, u = trace.mf[layer][0], trace.uf[layer][0]
            lm.append(torch.log(m) + trace.c[layer][0][:, None])  # λ = log m + the replay's reference
            val.append(torch.where(m[..., None] > 0, u / m.clamp(min=1e-30)[..., None], 0.0))
        # kept on the CPU: a few [L, H, S] tensors per row, compared and averaged across rows and runs
        return Messages(self.spans, torch.stack(lm).cpu(), torch.stack(val).cpu(), torch.stack([trace.z[i][0] for i in range(self.n_layers)]).cpu(),
                        torch.stack([trace.mlp[i][0] for i in range(self.n_layers)]).cpu(), float(metric))

    # ------------------------------------------------------------------------------ DLA
    def components(self) -> Components:
        """Direct logit attribution at the deciding row (module docstring; :func:`direct_logit_attribution`)."""
        metric, trace = self._replay(_Intervention(1))
        L = self.n_layers
        return direct_logit_attribution(self.session.model, *self.pair, embed=trace.embed[0], z=torch.stack([trace.z[i][0] for i in range(L)]),
                                        mlp=torch.stack([trace.mlp[i][0] for i in range(L)]), final=trace.final[0], metric=float(metric[0]))

    # ------------------------------------------------------------------------------ patching
    def knocked_out(self, span: str) -> Messages:
        """The messages of this row with ``span`` knocked out in every layer and head (the engine's
        :class:`~probes.engine.session.Knockout` of its positions at this row): a run of its own, so the
        other spans' messages are what the changed row's queries read (patching every edge to them
        gives the knockout's metric)."""
        if span not in self.spans:
            raise ValueError(f"span {span!r} is not one of this row's source spans {self.spans}")
        j = self.spans.index(span)
        lm = self.messages.log_mass.clone()
        lm[:, :, j] = -math.inf
        gone = replace(self.messages, log_mass=lm, value=torch.zeros_like(self.messages.value))
        alpha = torch.zeros(1, self.n_layers, self.n_heads, len(self.spans))
        alpha[..., j] = 1.0
        metric, trace = self._replay(_Intervention(1, gone, alpha))
        return self._messages(trace, metric[0])

    def _target(self, target: Messages) -> Messages:
        return target if target.spans == self.spans else target.aligned(self.spans)

    def _batched(self, make: Any, n: int) -> np.ndarray:
        """Metrics of ``n`` interventions, :data:`REPLAY_BATCH` per row forward (``make(i0, i1)``)."""
        out = [self._replay(make(i0, min(n, i0 + REPLAY_BATCH)))[0].detach() for i0 in range(0, n, REPLAY_BATCH)]
        return torch.cat(out).cpu().numpy() if out else np.zeros(0)

    def patched_metrics(self, target: Messages, patched: torch.Tensor) -> np.ndarray:
        """Exact metrics with the edges ``patched`` [B, L, H, S] (bool) taking ``target``'s messages and
        every other edge computing from the row: exact patching of edges (one per element) and the
        circuits of faithfulness (the complement of a circuit patched)."""
        t = self._target(target)
        shape = (self.n_layers, self.n_heads, len(self.spans))
        if patched.shape[1:] != shape:
            raise ValueError(f"patch masks must be [B, {shape}], got {tuple(patched.shape)}")
        alpha = patched.float()
        return self._batched(lambda i0, i1: _Intervention(i1 - i0, t, alpha[i0:i1]), patched.shape[0])

    def exact_edges(self, target: Messages, edges: Sequence[tuple[int, int, int]]) -> np.ndarray:
        """Exact effect on the metric of patching each edge (layer, head, span index) alone: [N]."""
        mask = torch.zeros(len(edges), self.n_layers, self.n_heads, len(self.spans), dtype=torch.bool)
        for i, (layer, head, span) in enumerate(edges):
            mask[i, layer, head, span] = True
        return self.patched_metrics(target, mask) - self.metric

    def node_effects(self, target: Messages | None = None) -> dict[str, np.ndarray]:
        """Per head [L, H] and per MLP [L]: the exact (total) effect on the metric of zeroing its output
        at the deciding row (``*_ablate``); with a ``target``, also of patching in the target's output
        (``*_patch``) and the direct effect of that patch (``*_patch_direct``: the change of its own
        write, through the frozen norm, everything else held)."""
        L, H = self.n_layers, self.n_heads
        n_head = L * H
        clean = self.messages
        kinds = [("ablate", torch.zeros_like(clean.z), torch.zeros_like(clean.mlp))]
        if target is not None:
            t = self._target(target)
            kinds.append(("patch", t.z, t.mlp))
        out: dict[str, np.ndarray] = {}
        for kind, z_value, mlp_value in kinds:
            def make(i0: int, i1: int, z_value: torch.Tensor = z_value, mlp_value: torch.Tensor = mlp_value) -> _Intervention:
                idx = torch.arange(i0, i1)
                z_set = torch.zeros(i1 - i0, L, H, dtype=torch.bool)
                mlp_set = torch.zeros(i1 - i0, L, dtype=torch.bool)
                is_head = idx < n_head
                z_set.view(i1 - i0, -1)[is_head.nonzero()[:, 0], idx[is_head]] = True
                mlp_set[(~is_head).nonzero()[:, 0], idx[~is_head] - n_head] = True
                return _Intervention(i1 - i0, z_set=z_set, z_value=z_value.expand(i1 - i0, -1, -1, -1),
                                     mlp_set=mlp_set, mlp_value=mlp_value.expand(i1 - i0, -1, -1))
            delta = self._batched(make, n_head + L) - self.metric
            out[f"head_{kind}"], out[f"mlp_{kind}"] = delta[:n_head].reshape(L, H), delta[n_head:]
        if target is not None:
            _, trace = self._replay(_Intervention(1))
            _, direction = frozen_norm(self._norm, trace.final[0], self._unembed)
            with torch.no_grad():
                out["head_patch_direct"] = np.stack([
                    ((head_writes(self._layers[layer], t.z[layer]) - head_writes(self._layers[layer], clean.z[layer])) @ direction).cpu().numpy()
                    for layer in range(L)])
                out["mlp_patch_direct"] = ((t.mlp - clean.mlp).to(direction.device) @ direction).cpu().numpy()
        return out

    # ------------------------------------------------------------------------------ attribution
    def _gradients(self, iv: _Intervention) -> _Trace:
        metric, trace = self._replay(replace(iv, leaves=True))
        leaves = list(trace.leaf.values())
        grads = torch.autograd.grad(metric.sum(), leaves, allow_unused=True)
        for key, g in zip(trace.leaf, grads):
            trace.leaf[key] = torch.zeros_like(trace.leaf[key]) if g is None else g
        return trace

    def edge_scores(self, target: Messages, *, ig_steps: int = DEFAULT_IG_STEPS, grad_drop: bool = True) -> dict[str, np.ndarray]:
        """Every edge's estimated effect of patching it to ``target`` [L, H, S] (module docstring):
        ``atp``, ``atp_star`` (saturation fix), ``atp_gd`` (GradDrop, unsigned; NaN without
        ``grad_drop``) and ``eap_ig`` (``ig_steps`` midpoints; NaN with ``ig_steps=0``).
        ``ig_steps=0, grad_drop=False``: AtP and AtP* alone, one backward of the row."""
        if ig_steps < 0:
            raise ValueError(f"ig_steps must be ≥ 0 (0: no EAP-IG), got {ig_steps}")
        t = self._target(target)
        L = self.n_layers
        tr = self._gradients(_Intervention(1, t, torch.zeros(1, L, self.n_heads, len(self.spans))))
        atp = torch.stack([_linear(tr, layer) for layer in range(L)])
        dz = torch.stack([self._single_edge_dz(tr, layer) for layer in range(L)])  # [L, H, S, dh]
        star = torch.stack([(dz[layer] * tr.leaf[("z", layer)][0][:, None]).sum(-1) for layer in range(L)])
        gd = torch.full_like(star, math.nan)
        if grad_drop:
            parts = []
            for drop in range(L):
                if drop == 0:
                    parts.append(star.abs())
                    continue
                g = self._gradients(_Intervention(1, t, torch.zeros(1, L, self.n_heads, len(self.spans)), drop_layer=drop))
                est = torch.stack([(dz[layer] * g.leaf[("z", layer)][0][:, None]).sum(-1) if layer < drop else star[layer]
                                   for layer in range(L)])
                parts.append(est.abs())
            gd = torch.stack(parts).mean(0)
        ig = torch.zeros_like(star) if ig_steps else torch.full_like(star, math.nan)
        for k in range(ig_steps):
            a = (k + 0.5) / ig_steps
            g = self._gradients(_Intervention(1, t, torch.full((1, L, self.n_heads, len(self.spans)), a)))
            ig += torch.stack([_linear(g, layer) for layer in range(L)]) / ig_steps
        return {name: value.cpu().numpy() for name, value in (("atp", atp), ("atp_star", star), ("atp_gd", gd), ("eap_ig", ig))}

    def _single_edge_dz(self, tr: _Trace, layer: int) -> torch.Tensor:
        """[H, S, d_head]: the exact change of each head's output when only edge (head, span) takes the
        target's message (the softmax over spans recomputed: AtP*'s saturation fix)."""
        m, u, m_t, u_t = tr.m[layer][0], tr.u[layer][0], tr.m_t[layer][0], tr.u_t[layer][0]
        z = u.sum(1) / m.sum(1)[:, None]  # [H, dh]
        m_e = m.sum(1)[:, None] - m + m_t  # [H, S]
        u_e = u.sum(1)[:, None] - u + u_t  # [H, S, dh]
        return u_e / m_e[..., None] - z[:, None]


def _on_device(iv: _Intervention, device: torch.device) -> _Intervention:
    """``iv`` with its tensors and its target's on ``device`` (they are built on the CPU; the model may be on a GPU)."""
    moved = {name: value.to(device) for name in ("edge_alpha", "z_set", "z_value", "mlp_set", "mlp_value")
             if (value := getattr(iv, name)) is not None}
    t = iv.target
    if t is not None:
        moved["target"] = replace(t, log_mass=t.log_mass.to(device), value=t.value.to(device), z=t.z.to(device), mlp=t.mlp.to(device))
    return replace(iv, **moved)


def _leaf(trace: _Trace, kind: str, layer: int, like: torch.Tensor) -> torch.Tensor:
    leaf = torch.zeros_like(like, requires_grad=True)
    trace.leaf[(kind, layer)] = leaf
    return leaf


def _linear(tr: _Trace, layer: int) -> torch.Tensor:
    """AtP in the messages' linear coordinates at ``layer``: [H, S] (the trace's gradients · (target − computed))."""
    gm, gu = tr.leaf[("m", layer)][0], tr.leaf[("u", layer)][0]
    return gm * (tr.m_t[layer][0] - tr.m[layer][0]) + (gu * (tr.u_t[layer][0] - tr.u[layer][0])).sum(-1)


def _span_index(spans: Mapping[str, Sequence[int]], n: int) -> tuple[tuple[str, ...], np.ndarray]:
    """(span names, the span index of every key position 0..n-1): disjoint spans, the rest ``other``."""
    names = [s for s in spans if s != OTHER]
    of = np.full(n, -1)
    for j, name in enumerate(names):
        pos = np.asarray(sorted({int(p) for p in spans[name]}), dtype=int)
        if pos.size and (pos.min() < 0 or pos.max() >= n):
            raise ValueError(f"span {name!r} has positions outside 0..{n - 1}")
        clash = pos[of[pos] >= 0] if pos.size else pos
        if clash.size:
            raise ValueError(f"span {name!r} overlaps span {names[of[clash[0]]]!r} at position {clash[0]}: source spans must be disjoint")
        of[pos] = j
    names.append(OTHER)  # always present (possibly empty), so every row of a model has the same edges
    of[of < 0] = len(names) - 1
    return tuple(names), of
