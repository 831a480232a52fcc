"""Checks on the logits the engine returns: finite values, next-token entropy."""

from __future__ import annotations

import torch


class NonFiniteLogitsError(ValueError):
    """Logits contained NaN or inf, so no margin is meaningful."""


def check_finite(t: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise NonFiniteLogitsError(f"{what}: {bad} non-finite values (NaN/inf); check the dtype (try float32) and the weights")


def entropy(logits: torch.Tensor) -> float:
    """Next-token entropy (nats) of one logit vector."""
    check_finite(logits, "entropy logits")
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(-(logp.exp() * logp).sum())
