"""basm-probes: mechanistic-interpretability probes for boundary-aware skill memory in tool-use LLMs.

The public API (imported lazily: ``import probes`` loads no torch)::

    import probes
    session = probes.ProbeSession("/models/Qwen3-8B", dtype="bfloat16", device="cuda")
    record = session.prompt("retail-wrong-0013", config="basm", k=2)      # a prompt record
    rows = session.score(record, knockouts=["boundary", "procedure", "random"])
    sweep = probes.run("sweep", session, buckets=["T_wrong"], k_max=4, out="results/")
    sweep.summary_table, sweep.figures
    probes.options("sweep")                                  # each analysis's options, with their help
    done = probes.load("results/Qwen3-8B", "sweep")          # a finished run: rows, tables, config
    probes.report(session, out="results/")                   # every registered analysis, report.md
    probes.explore(session, out="results/")                  # results/<model>/explore.html, offline in a browser
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The package's layers, bottom up: a module imports only its own layer and the layers below it; the
# package root is the layer of its lazy names alone. The organism stands apart: it may import any layer
# but the CLI, and only the CLI imports it. tests/test_layout.py checks every import against these;
# docs/architecture.py writes them into docs/architecture.md.
LAYERS = ("probes.core", "probes.data", "probes.prompts", "probes.engine", "probes.backends", "probes.scoring",
          "probes.reporting", "probes.facade", "probes.analyses", "probes", "probes.cli")
ORGANISM_LAYER = "probes.organism"

_EXPORTS = {
    "ProbeSession": "probes.facade",
    "Knockout": "probes.engine.session",
    "PromptBuilder": "probes.prompts.builder",
    "load_dataset": "probes.data.dataset",
    "score_record": "probes.scoring.score",
    "run": "probes.analyses",
    "migrate": "probes.analyses",
    "options": "probes.analyses",
    "ANALYSES": "probes.analyses",
    "report": "probes.analyses.report",
    "load": "probes.reporting.finished",
    "explore": "probes.analyses.explore",
    "Analysis": "probes.analyses.base",
    "AnalysisResult": "probes.analyses.base",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'probes' has no attribute {name!r}")
