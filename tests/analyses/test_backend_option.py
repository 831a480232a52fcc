"""The analyses' ``backend=`` option end to end: sweep, knockout and heads run on each backend with
the native rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from probes.reporting.results import load_results
from reference import TOL


@pytest.mark.parametrize("backend", ["nnsight", "transformerlens"])
def test_sweep_knockout_heads_run_on_each_backend_with_the_native_rows(backend, tmp_path):
    """``backend=`` runs sweep, knockout and heads end to end on the bundled organism, and every
    numeric column of their rows equals the native engine's within the fp32 tolerance."""
    from probes.analyses.heads import Heads
    from probes.analyses.knockout import KnockoutAnalysis
    from probes.analyses.sweep import Sweep

    pytest.importorskip({"nnsight": "nnsight", "transformerlens": "transformer_lens"}[backend])
    pair = ["retail-wrong-0001", "retail-ok-0001"]
    runs = {
        "sweep": lambda **o: Sweep(item_ids=pair[:1], k_max=1, configs=["proc", "basm"], **o),
        "knockout": lambda **o: KnockoutAnalysis(item_ids=pair, k=1, random_draws=1, **o),
        "heads": lambda **o: Heads(item_ids=[*pair, "retail-wrong-0004", "retail-ok-0004"], k=1, top_n=2, random_draws=1, **o),
    }
    for name, make in runs.items():
        common = dict(embedder="lexical", split="all", figure=False)
        native = make(out=tmp_path / "native", **common).run(verbose=False)
        other = make(out=tmp_path / backend, backend=backend, **common).run(verbose=False)
        assert other.status == 0 and other.options.backend == backend, name
        files = sorted(p.name for p in native.folder.glob("*.jsonl"))
        assert files == sorted(p.name for p in other.folder.glob("*.jsonl")), name
        for file in files:
            a, b = (load_results(run.folder / file).sort_values("key").reset_index(drop=True) for run in (native, other))
            assert list(a["key"]) == list(b["key"]), (name, file)
            numeric = [c for c in a.columns if pd.api.types.is_float_dtype(a[c]) and c in b]
            assert numeric, (name, file)
            gap = np.nanmax(np.abs(a[numeric].to_numpy(float) - b[numeric].to_numpy(float)))
            assert np.array_equal(a[numeric].isna().to_numpy(), b[numeric].isna().to_numpy()) and gap <= TOL, (name, file, gap)
            print(f"{backend} {file}: max |Δ| {gap:.1e} over {len(numeric)} columns")
