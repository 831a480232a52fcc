"""Markdown and table helpers of the report (no analysis logic)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from probes.core.text import visible

# A document's descriptive part (tables that describe, not claims): tests/docs/test_readme_claims.py checks every
# estimate with a CI outside these markers against docs/claims.csv. HTML comments: invisible where it is rendered.
DESCRIPTIVE_OPEN, DESCRIPTIVE_CLOSE = "<!-- descriptive -->", "<!-- /descriptive -->"


def descriptive(text: str) -> str:
    """``text`` between the descriptive markers."""
    return f"{DESCRIPTIVE_OPEN}\n{text}\n{DESCRIPTIVE_CLOSE}"


def markdown_table(frame: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table (no extra dependency); texts (item and skill ids, reasons) are written
    :func:`~probes.core.text.visible`."""

    def fmt(v: Any) -> str:
        if isinstance(v, float | np.floating):
            return "nan" if not np.isfinite(v) else f"{v:.{digits}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{digits}f}"
        return visible(str(v)).replace("|", "\\|")  # a literal pipe (|B|) would split the cell

    head = "| " + " | ".join(visible(str(c)) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def cell(table: pd.DataFrame, column: str = "value", **where: Any) -> float:
    """The single value of ``column`` where every ``where`` column matches (NaN if absent)."""
    mask = np.ones(len(table), dtype=bool)
    for key, value in where.items():
        mask &= (table[key] == value).to_numpy()
    return float(table.loc[mask, column].iloc[0]) if mask.any() else math.nan
