"""Independent reference computations shared by the tests: an *eager* HF forward in which every
layer gets an explicit float 4D additive mask (0 / -inf) that removes chosen keys from chosen query
rows, in chosen (layer, head) cells. Nothing here uses the probe engine."""

from __future__ import annotations

from collections.abc import Sequence

import torch



def knockout_masks(n: int, active: torch.Tensor, key_positions: Sequence[int], query_rows: Sequence[int],
                   windows: Sequence[int | None] | None = None) -> list[torch.Tensor]:
    """One mask [1, head, n, n] per layer: causal, plus -inf at (query row, blocked key) where ``active[layer, head]``.
    ``windows``: per layer a sliding window w (row q sees keys q - w < k <= q) or None (a global layer)."""
    out = []
    for layer in range(active.shape[0]):
        window = None if windows is None else windows[layer]
        query, key = torch.arange(n)[:, None], torch.arange(n)[None, :]
        hidden = (key > query) | ((key <= query - window) if window is not None else torch.zeros(n, n, dtype=torch.bool))
        m = torch.zeros(n, n).masked_fill(hidden, float("-inf")).expand(active.shape[1], n, n).clone()
        for h in range(active.shape[1]):
            if active[layer, h]:
                for q in query_rows:
                    m[h, q, list(key_positions)] = float("-inf")
        out.append(m[None])
    return out


@torch.no_grad()
def masked_eager_forward(model: torch.nn.Module, ids: Sequence[int], masks: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [n, vocab] fp32, attention probabilities [layer, head, n, n]) of an eager model
    whose layer i attends under ``masks[i]`` (set through a pre-hook on its attention module)."""
    handles = []
    for i, layer in enumerate(model.model.layers):

        def pre(_m, args, kwargs, mask=masks[i]):
            kwargs["attention_mask"] = mask
            return args, kwargs

        handles.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        out = model(torch.tensor([list(ids)]), use_cache=False, output_attentions=True)
        return out.logits[0].float(), torch.stack([a[0] for a in out.attentions]).float()
    finally:
        for h in handles:
            h.remove()


# Backend parity (backends/test_backends.py) and the analyses on each backend (analyses/test_backend_option.py):
# the backends compute each forward by different code, so only fp32 rounding differs.
TOL = 1e-5
