"""A small synthetic circuit, as the circuit analysis hands it to probes.reporting.circuit_graph: 2 layers × 2 heads,
five source spans over a 12-token prompt, the tables of two configurations (the graph keeps meta's), an exact effect
on a few edges only (NaN elsewhere) and a DLA interval left out (NaN) on one node."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

LAYERS, HEADS = 2, 2
TOKENS = ["<|im_start|>", "system", " Skill", " B:", " avoid", " P:", " step", " one", " Cancel", " order", "<tool_call>", "cancel"]
SPANS = {"system": [[0, 2]], "boundary": [[2, 5]], "procedure": [[5, 8]], "request": [[8, 10]], "other": [[10, 12]]}
META = {"model": "tiny-qwen3", "config": "basm", "pair": "knockout", "bucket": "T_wrong", "item_id": "retail-wrong-0001",
        "score": "eap_ig", "circuit_size": 5, "faithfulness": 0.83, "ablation": "mean"}


def tables(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any], dict[str, Any]]:
    """(edges, nodes, prompt, meta) of the synthetic circuit."""
    rng = np.random.default_rng(seed)
    edge_rows, node_rows = [], []
    for config in ("basm", "proc"):
        score = rng.normal(size=LAYERS * HEADS * len(SPANS))
        rank = np.argsort(np.argsort(-np.abs(score))) + 1
        for i, (layer, head, span) in enumerate((l, h, s) for l in range(LAYERS) for h in range(HEADS) for s in SPANS):
            exact = score[i] * 1.1 if rank[i] <= 3 else np.nan  # exact patching on the top 3 only
            edge_rows.append({"config": config, "pair": "knockout", "layer": layer, "head": head, "span": span, "score": score[i],
                              "atp": score[i] * 0.9, "atp_star": score[i] * 0.95, "atp_gd": abs(score[i]), "eap_ig": score[i],
                              "exact": exact, "rank": int(rank[i]), "in_circuit": bool(rank[i] <= META["circuit_size"]),
                              "atp_disagrees": bool(rank[i] == 2)})
        node_rows.append({"config": config, "pair": "knockout", "kind": "embed", "layer": -1, "head": -1})
        for layer in range(LAYERS):
            node_rows += [{"config": config, "pair": "knockout", "kind": "head", "layer": layer, "head": h} for h in range(HEADS)]
            node_rows.append({"config": config, "pair": "knockout", "kind": "mlp", "layer": layer, "head": -1})
    nodes = pd.DataFrame(node_rows)
    dla = rng.normal(size=len(nodes))
    nodes = nodes.assign(dla=dla, dla_low=dla - 0.5, dla_high=dla + 0.5, ablate_total=-dla * 0.3, patch_total=dla * 0.2,
                         patch_direct=dla * 0.4, disagree="")
    nodes.loc[1, ["dla_low", "dla_high"]] = np.nan  # one interval not computed: null in the graph
    nodes.loc[2, "disagree"] = "DLA +, ablation moves the margin the other way"
    attention = {f"{l}.{h}": rng.dirichlet(np.ones(len(TOKENS))).tolist() for l in range(LAYERS) for h in range(HEADS)}
    attention["1.0"] = [0.0] * 3 + [1.0] + [0.0] * (len(TOKENS) - 4)  # L1H0 reads token 3 alone
    prompt = {"tokens": TOKENS, "spans": SPANS, "deciding_row": len(TOKENS) - 1, "attention": attention}
    return pd.DataFrame(edge_rows), nodes, prompt, dict(META)
