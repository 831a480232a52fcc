"""``knockout`` where a sliding window hides the knocked keys (issue #46 item 2): a knockout that removes no key
its rows can see, on any layer it covers, is recorded as a no-op, counts nowhere, and the layer-window table
says how many records it was a no-op on instead of reporting a Δ of exactly 0 as an effect."""

from __future__ import annotations

import numpy as np
import pandas as pd

from probes.analyses.knockout import counted, no_op_fields, no_op_windows
from probes.engine.session import Knockout

WINDOWS = [16, None, 16, 16]  # Gemma 3's pattern at tiny size: local, global, local, local
ROWS = [140, 159]
FAR, NEAR = range(20, 60), range(146, 156)


def test_no_op_fields_count_the_layers_a_window_hides():
    assert no_op_fields(Knockout("far", FAR), ROWS, 4, WINDOWS) == {"knockout_no_op_layers": 3, "knockout_no_op": False}
    assert no_op_fields(Knockout("far@L2-3", FAR, layers=(2, 3)), ROWS, 4, WINDOWS) == {"knockout_no_op_layers": 2, "knockout_no_op": True}
    assert no_op_fields(Knockout("near@L2-3", NEAR, layers=(2, 3)), ROWS, 4, WINDOWS) == {"knockout_no_op_layers": 0, "knockout_no_op": False}
    # a global model: nothing before the rows is ever out of reach
    assert no_op_fields(Knockout("far@L2-3", FAR, layers=(2, 3)), ROWS, 4, [None] * 4)["knockout_no_op"] is False


def _rows() -> pd.DataFrame:
    rows = []
    for i in range(4):
        for condition, margin, no_op in (("baseline", 1.0, False), ("boundary@L0-0", 1.0, True), ("boundary@L1-1", 0.5 + 0.1 * i, False)):
            rows.append({"config": "basm", "bucket": "T_wrong", "record_id": f"r{i}", "condition": condition, "margin": margin,
                         "knockout_no_op": no_op})
    return pd.DataFrame(rows)


def test_no_op_rows_count_nowhere_and_the_window_table_says_so():
    rows = _rows()
    knocked = rows[rows["condition"] != "baseline"]
    assert list(counted(knocked)) == [False, True] * 4
    estimates = pd.DataFrame([{"window": "L1-1", "value": -0.35, "low": -0.4, "high": -0.3, "n": 4}])
    table = no_op_windows(rows, estimates)
    no_op = table.iloc[0]
    assert (no_op["window"], no_op["n"], no_op["n_no_op"]) == ("L0-0", 0, 4) and np.isnan(no_op["value"])
    assert table.iloc[1].to_dict() == {"window": "L1-1", "value": -0.35, "low": -0.4, "high": -0.3, "n": 4, "n_no_op": 0}
