"""TransformerLens backend: the probes through a ``TransformerBridge`` and its hooks.

The bridge wraps the HF model (it forces eager attention). One ``run_with_hooks`` per forward:
``blocks.{l}.attn.hook_pattern`` is replaced by the knocked pattern
(:func:`probes.backends.base.knock_pattern`: blocked keys zeroed at the knocked query rows, rows
renormalised) and read at the needed rows; the residual stream is read from ``hook_embed`` (the
token embeddings) and ``blocks.{l}.hook_resid_post``. No cached branching: one forward per
condition and per (condition, multi-token candidate), candidate tokens appended (see
:class:`~probes.backends.base.ForwardBackend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from probes.backends.base import Forward, ForwardBackend, RowEdit, knock_pattern
from probes.engine.loading import load_model


class TransformerLensBackend(ForwardBackend):
    """Probes through TransformerLens.

    ``model``: a local model directory, or an already built ``TransformerBridge`` (e.g. from a
    notebook). A directory is loaded through ``probes.engine.loading`` (local files only) into its *own*
    HF model, which ``boot_transformers`` rewrites in place; ``dtype``/``device``/``device_map``/
    ``allow_pickle``/``trust_remote_code`` as ``ProbeSession``.
    """

    name = "transformerlens"

    def __init__(
        self,
        model: str | Path | Any,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        device_map: str | dict[str, Any] | None = None,
        allow_pickle: bool = False,
        trust_remote_code: bool = False,
    ) -> None:
        try:
            from transformer_lens.model_bridge import TransformerBridge
        except ImportError as e:
            raise ImportError(f"the transformerlens backend needs transformer-lens >= 3 (TransformerBridge): {e}") from e
        if isinstance(model, TransformerBridge):
            bridge = model
        else:
            hf, tokenizer = load_model(model, dtype=dtype, device=device, device_map=device_map, allow_pickle=allow_pickle,
                                       trust_remote_code=trust_remote_code, attn_implementation="eager")
            bridge = TransformerBridge.boot_transformers(str(model), hf_model=hf.eval(), tokenizer=tokenizer)
        self.bridge = bridge
        self.model = bridge.original_model  # the HF model, as rewritten by the bridge
        self.tokenizer = bridge.tokenizer
        self.config = bridge.original_model.config
        self.n_layers, self.n_heads = bridge.cfg.n_layers, bridge.cfg.n_heads

    def forward_edited(self, ids: list[int], edit: RowEdit, read_rows: Sequence[int], residual_row: int | None) -> Forward:
        read = list(read_rows)
        probs: dict[int, torch.Tensor] = {}
        resid: dict[int, torch.Tensor] = {}

        def pattern_hook(pattern: torch.Tensor, hook: Any) -> torch.Tensor:
            layer = hook.layer()
            pattern = knock_pattern(pattern, layer, edit)
            probs[layer] = pattern[0][:, read].float().cpu()  # [head, rows, n]
            return pattern

        def resid_hook(index: int) -> Any:
            def hook(x: torch.Tensor, hook: Any) -> None:
                resid[index] = x[0, residual_row].float().cpu()
            return hook

        hooks: list[tuple[str, Any]] = [(f"blocks.{layer}.attn.hook_pattern", pattern_hook) for layer in range(self.n_layers)]
        if residual_row is not None:
            hooks.append(("hook_embed", resid_hook(0)))
            hooks += [(f"blocks.{layer}.hook_resid_post", resid_hook(layer + 1)) for layer in range(self.n_layers)]
        x = torch.tensor([ids], device=self.bridge.cfg.device)
        with torch.inference_mode():
            # logits at the read rows only (the vocabulary is large); the bridge passes it to HF
            logits = self.bridge.run_with_hooks(x, fwd_hooks=hooks, logits_to_keep=torch.tensor(read, device=x.device))
        return Forward(
            logits=logits[0].float().cpu(),
            probs=torch.stack([probs[layer] for layer in range(self.n_layers)]),
            residual=torch.stack([resid[i] for i in range(self.n_layers + 1)]) if residual_row is not None else None,
        )
