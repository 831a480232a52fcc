"""The BASM paper's published numbers that the report sets next to ours (Qwen3-8B unless noted;
margins in logits). One place, so a reader can check each against the paper."""

from __future__ import annotations

# Fig. 2: T_wrong wrong-tool margin against k (k = 0: every configuration coincides).
FIG2 = {"k0": 7.31, "proc_k2": 10.71, "basm_k2": 2.26}
# Fig. 3a: η at the decision row under BASM, per bucket.
FIG3A_ETA = {"T_ok": 0.15, "T_wrong": 1.23, "T_repair": 1.81}
# Fig. 5: T_wrong margins per configuration at k = 2.
FIG5_MARGIN = {"proc": 10.71, "pad-filler": 6.60, "pad-procedure": 5.14, "basm": 2.26}
FIG5_BROAD = {"proc": 14.24, "basm": 5.20}
# Fig. 6: boundary knockout on T_wrong: Δm and the share of the Proc.–BASM gap it recovers (%).
FIG6_DELTA = {"margin": 3.45, "broad_margin": 3.65}
FIG6_RECOVERED = {"margin": 69.4, "broad_margin": 41.0}
# Fig. 7 (Qwen3-14B): selectivity of the boundary knockout, in the order of probes.scoring.selectivity.SELECTIVITY.
FIG7_SELECTIVITY = (0.27, 0.04, -0.11)
