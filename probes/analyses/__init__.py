"""The probe analyses (one registry) and :func:`run`, the one way to run any of them.

>>> import probes
>>> session = probes.ProbeSession("/models/Qwen3-8B", dtype="bfloat16", device="cuda")
>>> sweep = probes.run("sweep", session, buckets=["T_wrong"], k_max=4, out="results/")
>>> sweep.summary_table, sweep.figures

Analysis modules are imported when first used (they load torch, pandas and matplotlib).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probes.analyses.base import Analysis, AnalysisResult
    from probes.engine.session import ProbeSession

# name -> "module:class", in paper order (report runs them in this order)
REGISTRY: dict[str, str] = {
    "sweep": "probes.analyses.sweep:Sweep",
    "ratios": "probes.analyses.ratios:Ratios",
    "suppression": "probes.analyses.suppression:Suppression",
    "knockout": "probes.analyses.knockout:KnockoutAnalysis",
    "heads": "probes.analyses.heads:Heads",
    "linear": "probes.analyses.linear:Linear",
    "calls": "probes.analyses.calls:Calls",
    "paired": "probes.analyses.paired:Paired",
    "report": "probes.analyses.report:Report",
}
ANALYSES: tuple[str, ...] = tuple(name for name in REGISTRY if name != "report")


def get(name: str) -> type[Analysis]:
    """The analysis class registered under ``name``."""
    if name not in REGISTRY:
        raise KeyError(f"unknown analysis {name!r}; known: {', '.join(REGISTRY)}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def run(name: str, session: ProbeSession | None = None, **options: Any) -> AnalysisResult:
    """Run the analysis ``name`` with keyword ``options`` on ``session`` (loaded from ``model``
    when None); the CLI's ``basm-probes NAME`` does exactly this."""
    return get(name)(**options).run(session)


__all__ = ["ANALYSES", "REGISTRY", "get", "run"]
