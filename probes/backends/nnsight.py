"""nnsight backend: the probes through an nnsight trace of the HF model (locally, or on NDIF).

The model runs with transformers' *eager* attention, whose softmax is a Python call. Inside one
``model.trace`` per forward, each layer's probabilities are reached through nnsight's source
tracing, ``layers[i].self_attn.source.<attention call>.source.nn_functional_softmax_0``: its
output is read at the needed rows and, under a knockout, replaced by the knocked pattern
(:func:`probes.backends.base.knock_pattern`: blocked keys zeroed, rows renormalised). The other
hook points (probes.engine.hooks) are read where a recorder asks for them: ``hook_embed`` from
``embed_tokens``, ``hook_z`` from ``o_proj``'s input, ``hook_resid_post`` from each decoder layer's output. No cached branching: one
forward per condition and per (condition, multi-token candidate), candidate tokens appended
(see :class:`~probes.backends.base.ForwardBackend`).

``remote=True`` sends each trace to an NDIF deployment. Before anything is built, a preflight
(:func:`ndif_preflight`) needs an API key, a reachable service that knows the key, and the model
RUNNING there; otherwise it raises :class:`NDIFUnavailableError` at once. The deployment must run
eager attention (the edited softmax is eager's); with sdpa or flash attention the first trace
raises a RuntimeError that says so. Remote runs have not been exercised against a live NDIF.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch

from probes.backends.base import Forward, ForwardBackend, RowEdit, knock_pattern
from probes.engine.hooks import HOOK_EMBED, HOOK_PATTERN, HOOK_RESID_POST, HOOK_Z, hook_site
from probes.engine.loading import ModelLoadError, load_model

SOFTMAX_OP = "nn_functional_softmax_0"  # the softmax call inside transformers' eager_attention_forward


class NDIFUnavailableError(ModelLoadError):
    """``remote=True`` cannot run: no key, NDIF unreachable, key refused, or model not hosted (a load
    error: the CLI prints it without a traceback)."""


def _nnsight() -> Any:
    try:
        import nnsight
    except ImportError as e:  # e.g. nnsight installed without its greenlet dependency
        raise ImportError(f"the nnsight backend needs the nnsight package and its dependencies ({e}); "
                          "pip install nnsight") from e
    return nnsight


def ndif_preflight(repo_id: str) -> None:
    """Raise :class:`NDIFUnavailableError` unless NDIF is reachable, knows the configured API key,
    and runs ``repo_id`` now. Every check is one short request; nothing is retried."""
    nnsight = _nnsight()
    from nnsight import ndif

    host = nnsight.CONFIG.API.HOST
    if not nnsight.CONFIG.API.APIKEY:
        raise NDIFUnavailableError("remote=True needs an NDIF API key: nnsight.CONFIG.set_default_api_key(KEY) "
                                   "(or NDIF_API_KEY); or run locally with remote=False")
    try:
        who = ndif.whoami()
        deployments = ndif._get("/status").get("deployments", {})
    except Exception as e:  # httpx errors: offline, DNS, refused, HTTP 4xx/5xx
        raise NDIFUnavailableError(f"cannot reach NDIF at {host} ({type(e).__name__}: {e}); "
                                   "run locally with remote=False") from e
    if who.get("email") is None:
        raise NDIFUnavailableError(f"NDIF at {host} does not recognise the configured API key; check it at https://login.ndif.us")
    running = sorted({d.get("repo_id") for d in deployments.values() if d.get("application_state") == "RUNNING"} - {None})
    if repo_id not in running:
        raise NDIFUnavailableError(f"NDIF at {host} is not running {repo_id!r} now (running: {', '.join(running) or 'none'}); "
                                   "run locally with remote=False")


class NNsightBackend(ForwardBackend):
    """Probes through nnsight.

    ``model``: a local model directory (loaded with eager attention through ``probes.engine.loading``),
    an already built ``nnsight.LanguageModel`` / ``TransformersModel`` (e.g. from a notebook; a
    local one is switched to eager attention in place), or, with ``remote=True``, a hub repo id.
    ``dtype``/``device``/``device_map``/``allow_pickle``/``trust_remote_code``: as ``EngineSession``
    (local directories only).
    """

    name = "nnsight"

    def __init__(
        self,
        model: str | Path | Any,
        *,
        remote: bool = False,
        dtype: str = "float32",
        device: str = "cpu",
        device_map: str | dict[str, Any] | None = None,
        allow_pickle: bool = False,
        trust_remote_code: bool = False,
    ) -> None:
        nnsight = _nnsight()
        from nnsight import TransformersModel

        self.remote = remote
        if isinstance(model, TransformersModel):
            if remote:
                ndif_preflight(model.repo_id)
            else:
                model._module.set_attn_implementation("eager")
            lm = model
        elif remote:
            ndif_preflight(str(model))
            lm = TransformersModel(str(model), task="text-generation")
        else:
            hf, tokenizer = load_model(model, dtype=dtype, device=device, device_map=device_map, allow_pickle=allow_pickle,
                                       trust_remote_code=trust_remote_code, attn_implementation="eager")
            lm = TransformersModel(hf.eval(), task="text-generation", tokenizer=tokenizer)
        if remote:
            # the knockout edit runs on the server: ship this package's code with each request
            nnsight.register("probes")
        if lm.config.get_text_config()._attn_implementation != "eager" and not remote:
            raise RuntimeError("the nnsight backend needs eager attention (its softmax is the edited operation)")
        self.lm = lm
        self.model = lm._module  # the HF model (the analysis runner reads its name_or_path; calls generate with it)
        self.tokenizer = lm.tokenizer
        self.config = lm.config
        cfg = lm.config.get_text_config()
        self.n_layers, self.n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
        base = getattr(lm, lm._module.base_model_prefix)
        self._embed, self._layers = base.embed_tokens, base.layers
        calls = [n for n in self._layers[0].self_attn.source.names if n.startswith("attention_interface_")]
        if not calls:
            raise RuntimeError(f"{type(lm._module).__name__}: its attention module does not call transformers' attention interface")
        self._attention_call = calls[-1]  # the call; an earlier one is the lookup's assignment

    def _softmax(self, layer: int) -> Any:
        """The softmax call inside layer ``layer``'s attention function (inside a trace)."""
        attention = getattr(self._layers[layer].self_attn.source, self._attention_call).source
        try:
            return getattr(attention, SOFTMAX_OP)
        except AttributeError as e:  # e.g. a remote deployment running sdpa or flash attention
            raise RuntimeError(f"layer {layer}: the attention function has no {SOFTMAX_OP} (attn_implementation="
                               f"{self.config.get_text_config()._attn_implementation!r}); the nnsight backend edits the "
                               "softmax of transformers' eager attention") from e

    def forward_edited(self, ids: list[int], edit: RowEdit, read_rows: Sequence[int], hooks: Collection[str] = ()) -> Forward:
        wanted = set(hooks)
        x = torch.tensor([ids], device=self._embed.device if not self.remote else "cpu")
        read = torch.tensor(list(read_rows), device=x.device)  # logits and hooks at the read rows only (the vocabulary is large)
        saved: dict[str, Any] = {}
        # nnsight reads modules in the order they run: the embeddings, then per layer the softmax
        # (hook_pattern), o_proj's input (hook_z) and the layer's output (hook_resid_post)
        with torch.inference_mode(), self.lm.trace(x, remote=self.remote, logits_to_keep=read):
            if HOOK_EMBED in wanted:
                saved[HOOK_EMBED] = self._embed.output[:, read].float().save()
            for layer in range(self.n_layers):
                softmax = self._softmax(layer)
                pattern = knock_pattern(softmax.output, layer, edit)
                if edit.applies(layer):
                    softmax.output = pattern
                site = hook_site(HOOK_PATTERN, layer)
                if site in wanted:
                    saved[site] = pattern[:, :, read].float().save()  # [1, head, rows, n]; advanced indexing copies
                site = hook_site(HOOK_Z, layer)
                if site in wanted:  # o_proj's input: [1, n, head * d_head]
                    saved[site] = self._layers[layer].self_attn.o_proj.input[:, read].float().unflatten(-1, (self.n_heads, -1)).save()
                site = hook_site(HOOK_RESID_POST, layer)
                if site in wanted:
                    out = self._layers[layer].output
                    hs = out[0] if isinstance(out, tuple) else out
                    saved[site] = hs[:, read].float().save()
            logits = self.lm.output.logits[0].float().save()
        return Forward(logits=logits.cpu(), hooks={site: saved[site].cpu() for site in hooks})
