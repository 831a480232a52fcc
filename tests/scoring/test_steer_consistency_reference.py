"""steer_stats.sign_consistency (families looked up per cell) against the per-cell mask loop it replaced:
the same table, exactly, with cells without families, NaN family means, a zero and a NaN pooled mean."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from probes.scoring import steer_stats as ss
from probes.scoring.steer_stats import CELL


def masked_consistency(dose: pd.DataFrame, families: pd.DataFrame) -> pd.DataFrame:
    """The old sign_consistency: every cell masks the whole family table."""
    out = []
    for _, cell in dose[dose["alpha"] > 0].iterrows():
        mask = np.logical_and.reduce([families[c] == cell[c] for c in CELL])
        means = families[mask & np.isfinite(families["delta_margin"].to_numpy(float))]
        pooled_sign = np.sign(cell["delta_margin"])
        signs = np.sign(means["delta_margin"].to_numpy(float))
        opposite = means[signs == -pooled_sign] if pooled_sign != 0 else means.iloc[:0]
        out.append({**{c: cell[c] for c in CELL}, "delta_margin": cell["delta_margin"], "n_families": len(means),
                    "share_same_sign": float(np.mean(signs == pooled_sign)) if len(means) and np.isfinite(pooled_sign) else np.nan,
                    "n_opposite": len(opposite),
                    "opposite_families": "; ".join(f"{r.family} {r.delta_margin:+.2f} [{r.low:+.2f}, {r.high:+.2f}]"
                                                   for r in opposite.itertuples())})
    return pd.DataFrame(out, columns=[*CELL, "delta_margin", "n_families", "share_same_sign", "n_opposite", "opposite_families"])


def tables(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    dose = pd.DataFrame(list(itertools.product(["proc"], ["T_wrong", "T_ok"], ["applicability", "probe"], [8, 14], [1], ["decision", "call"],
                                               [-2.0, 0.5, 2.0])), columns=list(CELL))
    dose["delta_margin"] = rng.normal(size=len(dose))
    dose.loc[[2, 5], "delta_margin"] = [0.0, np.nan]
    families = dose[list(CELL)].merge(pd.DataFrame({"family": ["files", "mail", "maps", "web"]}), how="cross")
    families = families.sample(frac=0.8, random_state=seed)  # some cells lack some families, one may lack all
    families["delta_margin"] = rng.normal(size=len(families))
    families.loc[families.index[::5], "delta_margin"] = np.nan
    families["low"], families["high"] = families["delta_margin"] - 0.3, families["delta_margin"] + 0.3
    return dose, families


def test_sign_consistency_is_the_masked_loop() -> None:
    for seed in range(3):
        dose, families = tables(seed)
        got = ss.sign_consistency(dose, families)
        pd.testing.assert_frame_equal(got, masked_consistency(dose, families), check_exact=True)
        assert got["n_opposite"].sum() > 0 and (got["n_families"] < 4).any()
    dose, families = tables()
    empty = ss.sign_consistency(dose, families.iloc[:0])
    pd.testing.assert_frame_equal(empty, masked_consistency(dose, families.iloc[:0]), check_exact=True)
