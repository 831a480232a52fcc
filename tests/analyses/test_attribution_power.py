"""``attribution`` quotes the per-cell test's power at the effects a run observed (the tempting
skill's mean C), not only at the 2.77-logit design effect: each equals statsmodels' two-sample t
power computed here by hand at every tempting cell's own |M⁺| and |M⁻|, averaged over the cells."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.power import TTestIndPower

from probes.analyses.attribution import DESIGN_EFFECTS, MARGIN_EFFECT, SEED_EFFECT, Attribution, tempting_power
from probes.data.dataset import load_dataset, resolve_dataset
from probes.reporting.layout import table_path

FAST = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical", "split": "all"}
CHEAP_STATS = {"resamples": 50, "permutations": 20, "subsamples": 2, "simulations": 20}


def by_hand(effect: float, sigma: float, cells: pd.DataFrame, alpha: float = 0.05) -> float:
    powers = [TTestIndPower().power(effect_size=abs(effect) / sigma, nobs1=p, ratio=m / p, alpha=alpha, alternative="two-sided")
              for p, m in zip(cells["n_plus"], cells["n_minus"]) if p >= 2 and m >= 2]
    return float(np.mean(powers))


def test_power_at_the_observed_mean_equals_statsmodels_by_hand():
    wrong = pd.DataFrame({"pool": "library", "outcome": ["margin"] * 4 + ["call_logodds"] * 2,
                          "c": [0.10, 0.20, 0.12, 0.30, -0.1, 0.1], "n_plus": [5, 4, 6, 1, 5, 4], "n_minus": [7, 8, 6, 11, 7, 8]})
    tempting = wrong.groupby(["pool", "outcome"], sort=False)["c"].agg(n="count", mean="mean").reset_index()
    noise = pd.DataFrame({"pool": "library", "outcome": ["margin", "call_logodds"], "sigma": [0.8, 1.5]})
    out = tempting_power(tempting, wrong, noise, 0.05).set_index("outcome")
    margin = wrong[wrong["outcome"] == "margin"]
    assert out.loc["margin", "sigma"] == 0.8
    # the cell with one mask on a side has no t power and is left out of the mean
    assert out.loc["margin", "power_at_mean"] == pytest.approx(by_hand(margin["c"].mean(), 0.8, margin), abs=1e-12)
    assert out.loc["margin", "design_effect"] == MARGIN_EFFECT == pytest.approx(2 * math.log(4))
    assert out.loc["margin", "power_at_design"] == pytest.approx(by_hand(MARGIN_EFFECT, 0.8, margin), abs=1e-12)
    # the observed effect (0.18 logits) is far below the design's 2.77: so is the power to see it
    assert out.loc["margin", "power_at_mean"] < 0.1 < 0.9 < out.loc["margin", "power_at_design"]
    assert np.isnan(out.loc["call_logodds", "design_effect"]) and np.isnan(out.loc["call_logodds", "power_at_design"])
    assert DESIGN_EFFECTS["correct_choice"] == SEED_EFFECT


def test_the_run_reports_power_at_its_own_tempting_effects(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    result = Attribution(model=tiny_qwen3_dir, out=tmp_path, domains=["retail"], buckets=["T_wrong"], limit=3, k_max=3, masks=8,
                         pools=["library"], figure=False, **CHEAP_STATS, **FAST).run(verbose=False)
    summary = result.summary
    items = {item.id: item for item in load_dataset(resolve_dataset("basm_probe")).items}
    cells = summary.cells[(summary.cells["outcome"] == "margin") & summary.cells["c"].notna()]
    mine = cells[[row.skill == items[row.item_id].tempting_skill for row in cells.itertuples()]]
    sigma = summary.noise.set_index("outcome").loc["margin", "sigma"]
    got = summary.tempting.set_index("outcome").loc["margin"]
    assert got["sigma"] == sigma and got["mean"] == pytest.approx(mine["c"].mean(), abs=1e-12)
    assert got["power_at_mean"] == pytest.approx(by_hand(mine["c"].mean(), sigma, mine), abs=1e-12)
    assert got["power_at_design"] == pytest.approx(by_hand(MARGIN_EFFECT, sigma, mine), abs=1e-12)
    assert "power_at_mean" in table_path(result.out_dir, "attribution", "attribution_tempting").read_text().splitlines()[0]
