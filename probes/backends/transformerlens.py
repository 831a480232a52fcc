"""TransformerLens backend: the probes through a ``TransformerBridge`` and its hooks.

The bridge wraps the HF model (it forces eager attention). One ``run_with_hooks`` per forward:
``blocks.{l}.attn.hook_pattern`` is replaced by the knocked pattern
(:func:`probes.backends.base.knock_pattern`: blocked keys zeroed at the knocked query rows, rows
renormalised). The engine's hook points (probes.engine.hooks) are TransformerLens's own names: each
one a recorder reads is read at the needed rows from the bridge hook of that name. No cached branching: one forward per
condition and per (condition, multi-token candidate), candidate tokens appended (see
:class:`~probes.backends.base.ForwardBackend`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch

from probes.backends.base import Forward, ForwardBackend, RowEdit, knock_pattern
from probes.engine.hooks import HOOK_PATTERN, HOOK_Z, hook_point, hook_site
from probes.engine.loading import load_model
from probes.engine.session import attention_windows


class TransformerLensBackend(ForwardBackend):
    """Probes through TransformerLens.

    ``model``: a local model directory, or an already built ``TransformerBridge`` (e.g. from a
    notebook). A directory is loaded through ``probes.engine.loading`` (local files only) into its *own*
    HF model, which ``boot_transformers`` rewrites in place; ``dtype``/``device``/``device_map``/
    ``allow_pickle``/``trust_remote_code`` as ``EngineSession``.
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
            self.windows = attention_windows(hf)  # read before the bridge rewrites the attention
            bridge = TransformerBridge.boot_transformers(str(model), hf_model=hf.eval(), tokenizer=tokenizer)
        self.bridge = bridge
        self.model = bridge.original_model  # the HF model, as rewritten by the bridge
        self.tokenizer = bridge.tokenizer
        self.config = bridge.original_model.config
        self.n_layers, self.n_heads = bridge.cfg.n_layers, bridge.cfg.n_heads

    def forward_edited(self, ids: list[int], edit: RowEdit, read_rows: Sequence[int], hooks: Collection[str] = ()) -> Forward:
        read = torch.tensor(list(read_rows))
        wanted = set(hooks)
        values: dict[str, torch.Tensor] = {}

        # a bridge hook may be an alias of another name (hook.name): values are keyed by the name asked for
        def pattern_hook(layer: int) -> Any:
            site = hook_site(HOOK_PATTERN, layer)

            def hook(pattern: torch.Tensor, hook: Any) -> torch.Tensor:
                pattern = knock_pattern(pattern, layer, edit)
                if site in wanted:
                    values[site] = pattern[:, :, read.to(pattern.device)].float().cpu()  # [1, head, rows, n]
                return pattern
            return hook

        def read_hook(site: str) -> Any:
            def hook(x: torch.Tensor, hook: Any) -> None:
                x = x[:, read.to(x.device)].float().cpu()
                # hook_z: the bridge hands o_proj's input, heads flattened: [1, rows, head * d_head]
                values[site] = x.unflatten(-1, (self.n_heads, -1)) if hook_point(site)[0] == HOOK_Z and x.dim() == 3 else x
            return hook

        fwd_hooks: list[tuple[str, Any]] = [(hook_site(HOOK_PATTERN, layer), pattern_hook(layer)) for layer in range(self.n_layers)]
        fwd_hooks += [(site, read_hook(site)) for site in wanted if hook_point(site)[0] != HOOK_PATTERN]
        x = torch.tensor([ids], device=self.bridge.cfg.device)
        with torch.inference_mode():
            # logits at the read rows only (the vocabulary is large); the bridge passes it to HF
            logits = self.bridge.run_with_hooks(x, fwd_hooks=fwd_hooks, logits_to_keep=read.to(x.device))
        return Forward(logits=logits[0].float().cpu(), hooks={site: values[site] for site in hooks})
