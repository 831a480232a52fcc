"""Fig. 7's selectivity of a knockout: its shift of three margins (the wrong-tool and the
correct-tool margin on T_wrong, the correct-tool margin on T_ok), read from the knockout summary."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

# (bucket, measure, cell label) of Fig. 7, in the paper's order (probes.analyses.knockout.PAPER_FIG7_SELECTIVITY)
SELECTIVITY = (("T_wrong", "margin", r"$T_{\mathrm{wrong}}$–wrong"), ("T_wrong", "correct_margin", r"$T_{\mathrm{wrong}}$–correct"),
               ("T_ok", "correct_margin", r"$T_{\mathrm{ok}}$–correct"))


def selectivity_table(deltas: pd.DataFrame, knockouts: Iterable[str]) -> pd.DataFrame:
    """The three cells of Fig. 7 per knockout of ``knockouts`` (the reported ones): the rows of
    ``deltas`` (bucket, knockout, measure, value, low, high, n, ...) with their ``cell``."""
    knockouts = list(knockouts)
    parts = []
    for bucket, measure, cell in SELECTIVITY:
        sub = deltas[(deltas["bucket"] == bucket) & (deltas["measure"] == measure) & deltas["knockout"].isin(knockouts)]
        parts.append(sub.assign(cell=cell))
    return pd.concat(parts) if parts else pd.DataFrame()
