"""Probe backends: the same ``run`` contract (``probes.backends.base.Backend``) on three engines.

- ``native``: ``probes.engine.session.EngineSession`` (registered attention function, cached branching).
- ``nnsight``: ``probes.backends.nnsight.NNsightBackend`` (an nnsight trace; local or NDIF).
- ``transformerlens``: ``probes.backends.transformerlens.TransformerLensBackend`` (TransformerBridge hooks).

``get_backend(name, model, **options)`` builds one; ``model`` is a local model directory or an
object that backend accepts (a loaded HF model, an nnsight model, a bridge). See docs/backends.md.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probes.backends.base import Backend

# name -> "module:class", imported on use so that a missing optional package only breaks its backend
BACKENDS: dict[str, str] = {
    "native": "probes.engine.session:EngineSession",
    "nnsight": "probes.backends.nnsight:NNsightBackend",
    "transformerlens": "probes.backends.transformerlens:TransformerLensBackend",
}


def backend_class(name: str) -> type:
    """The class registered under ``name``."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def get_backend(name: str, model: str | Path | Any, **options: Any) -> Backend:
    """Build backend ``name`` over ``model`` with its keyword ``options`` (e.g. ``dtype``,
    ``device``, ``device_map``; ``remote`` for nnsight)."""
    return backend_class(name)(model, **options)


__all__ = ["BACKENDS", "backend_class", "get_backend"]
