"""Every claim an output makes, with its test, and the correction for making many of them.

A :class:`Claim` is one sentence of a report ("the boundary knockout raises the T_wrong margin
more than a mass-matched control") with the estimate behind it, its 95% CI over task groups, a
p-value and the family of comparisons it belongs to. :func:`claims_table` adjusts the p-values
within each family (Holm, through ``statsmodels``) and words a verdict that cannot overstate:

- an **effect** claim ("X > 0", one-sided; > 0.5 for an AUC, the claim's ``null``) is *detected*
  when its Holm-adjusted p is below α and its CI excludes the null value on the claimed side;
  otherwise it is "not detected", with the power the test had against the family's smallest
  effect of interest δ when one is stated. With a stated δ a detected effect *holds* only when a
  **minimum-effect test** (the same sign-flip test of X − δ > 0, Holm-adjusted within the family)
  also rejects; else it is "detectable, below the smallest effect of interest" (its CI lies inside
  ±δ) or "detectable; not shown above the smallest effect of interest". A family states one δ per
  unit, before the run: :func:`claims_table` refuses two;
- an **absence** claim ("X is negligible", e.g. a control that should not move the margin) is a
  two one-sided tests (TOST) equivalence claim against a stated smallest effect of interest δ:
  it *holds* only when both one-sided tests reject |X| ≥ δ after adjustment; otherwise it is
  "not shown", never "no effect";
- an **exploratory** claim (strata, selectivity checks, anything not chosen before the run) is
  tested and adjusted like the others but never "holds": its verdict starts "exploratory:";
- a claim whose design cannot test it whatever the data (``untestable``: the reason, e.g. a random
  reference of three possible head sets) says "untestable: <reason>", keeps its estimate and p, and
  leaves its family's Holm correction (it is no test).

A family whose Holm-adjusted floor (the smallest reachable p times the number of tested claims in
the family, Holm's factor for its smallest p) is not below α is "untestable": no outcome could hold.

p-values of mean differences come from sign-flip permutation tests over task groups
(:func:`probes.scoring.stats.paired_permutation_test`): exact when 2^G ≤ the resamples, so with
G task groups the smallest reachable one-sided p is 1/2^G (else 1/(resamples + 1)), the
``p_floor`` stated in every row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd

from probes.scoring.stats import DEFAULT_SEED, PERMUTATION_RESAMPLES, bootstrap_mean, group_means, paired_permutation_test

ALPHA = 0.05
KINDS = ("effect", "absence")
ALTERNATIVES = ("greater", "less")
COLUMNS = ["family", "name", "kind", "statement", "estimate", "low", "high", "null", "n", "n_of", "unit", "p", "p_floor", "p_holm",
           "family_size", "sesoi", "p_min_effect", "p_min_holm", "power", "exploratory", "verdict", "note"]


@dataclass(frozen=True)
class Claim:
    """One claim: ``estimate`` [``low``, ``high``] over ``n`` units (``n_of``: task groups, unless the
    claim counts something else, e.g. the planted edges of a circuit) and its p.

    ``kind`` "effect": ``p`` is one-sided in ``alternative`` ("greater": the estimate is claimed
    above 0). ``kind`` "absence": ``p`` is the TOST p against ±``sesoi`` and ``alternative`` is
    unused. ``power``: the effect test's power against ``sesoi`` (effect claims with a stated
    ``sesoi`` only; NaN otherwise). ``p_min_effect``: the minimum-effect test's one-sided p that the
    effect exceeds ``sesoi`` on the claimed side (effect claims with a stated ``sesoi``).
    ``exploratory``: chosen after seeing data or one of many strata; never "holds".
    ``untestable``: why the design cannot test the claim whatever the data ("" when it can); the
    verdict says so and the claim leaves its family's Holm correction.
    """

    family: str
    name: str
    statement: str
    estimate: float
    low: float
    high: float
    n: int
    p: float
    kind: str = "effect"
    alternative: str = "greater"
    p_floor: float = math.nan
    sesoi: float = math.nan
    power: float = math.nan
    unit: str = "logits"
    note: str = ""
    null: float = 0.0  # the estimate's value under the null hypothesis (0.5 for an AUC)
    p_min_effect: float = math.nan
    exploratory: bool = False
    untestable: str = ""
    n_of: str = "task groups"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.alternative not in ALTERNATIVES:
            raise ValueError(f"claim {self.name!r}: alternative must be one of {ALTERNATIVES}, got {self.alternative!r}")
        if self.kind == "absence" and not (math.isfinite(self.sesoi) and self.sesoi > 0):
            raise ValueError(f"claim {self.name!r}: an absence claim needs a smallest effect of interest sesoi > 0")


def _units(values: Sequence[float], groups: Sequence[str] | None) -> np.ndarray:
    units = group_means(np.asarray(values, dtype=float), groups)
    return units[np.isfinite(units)]


def sign_flip_floor(n_units: int, resamples: int = PERMUTATION_RESAMPLES) -> float:
    """Smallest one-sided p the sign-flip test over ``n_units`` can give: 1 / 2^n where it enumerates
    every flip (2^n ≤ ``resamples``), else 1 / (resamples + 1) (scipy's Monte Carlo p)."""
    if n_units <= 0:
        return math.nan
    return 2.0 ** -n_units if 2 ** n_units <= resamples else 1 / (resamples + 1)


def t_power(effect: float, sd: float, n_units: int, *, alpha: float = ALPHA) -> float:
    """Power of a one-sided one-sample t test over ``n_units`` to detect a mean of ``effect`` when
    the units' SD is ``sd`` (statsmodels); the sign-flip test over the same units has about this power."""
    from statsmodels.stats.power import TTestPower

    if n_units < 2 or not (math.isfinite(sd) and sd > 0) or not math.isfinite(effect):
        return math.nan
    return float(TTestPower().power(effect_size=abs(effect) / sd, nobs=n_units, alpha=alpha, alternative="larger"))


def effect_claim(family: str, name: str, statement: str, values: Sequence[float], groups: Sequence[str] | None, *,
                 alternative: str = "greater", sesoi: float = math.nan, unit: str = "logits", note: str = "",
                 exploratory: bool = False, seed: int = DEFAULT_SEED) -> Claim:
    """The claim "mean of ``values`` is above 0" (``alternative="less"``: below 0), values per
    record with their task ``groups``: the mean of group means with a 95% bootstrap CI over task
    groups and a one-sided sign-flip permutation p over them. Fewer than two task groups: p is
    NaN (the claim cannot be tested). With a ``sesoi`` δ, also the minimum-effect p: the same
    test on the group means shifted by ∓δ (is the effect beyond δ on the claimed side?)."""
    if math.isfinite(sesoi) and sesoi <= 0:
        raise ValueError(f"claim {name!r}: the smallest effect of interest sesoi must be > 0, got {sesoi}")
    est = bootstrap_mean(values, groups, seed=seed)
    units = _units(values, groups)
    p = p_min = power = math.nan
    if len(units) >= 2:
        _, p = paired_permutation_test(units, np.zeros(len(units)), alternative=alternative, seed=seed)
        if math.isfinite(sesoi):
            shift = sesoi if alternative == "greater" else -sesoi
            _, p_min = paired_permutation_test(units - shift, np.zeros(len(units)), alternative=alternative, seed=seed)
            power = t_power(sesoi, float(np.std(units, ddof=1)), len(units))
    return Claim(family, name, statement, est.value, est.low, est.high, est.n_units, p, "effect", alternative,
                 sign_flip_floor(len(units)), sesoi, power, unit, note, p_min_effect=p_min, exploratory=exploratory)


def absence_claim(family: str, name: str, statement: str, values: Sequence[float], groups: Sequence[str] | None, *,
                  sesoi: float, unit: str = "logits", note: str = "", exploratory: bool = False,
                  seed: int = DEFAULT_SEED) -> Claim:
    """The claim "|mean of ``values``| < ``sesoi``" by two one-sided sign-flip tests over task
    groups (TOST): H0− mean ≤ −δ and H0+ mean ≥ δ, each tested on the group means shifted by δ;
    p = the larger of the two. The CI is the 95% bootstrap CI of the mean (equivalence at α = 0.05
    corresponds to the 90% CI inside ±δ; the 95% one is reported for uniformity)."""
    est = bootstrap_mean(values, groups, seed=seed)
    units = _units(values, groups)
    p = math.nan
    if len(units) >= 2:
        _, p_low = paired_permutation_test(units + sesoi, np.zeros(len(units)), alternative="greater", seed=seed)
        _, p_high = paired_permutation_test(units - sesoi, np.zeros(len(units)), alternative="less", seed=seed)
        p = max(p_low, p_high)
    return Claim(family, name, statement, est.value, est.low, est.high, est.n_units, p, "absence", "greater",
                 sign_flip_floor(len(units)), sesoi, math.nan, unit, note, exploratory=exploratory)


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm-adjusted p-values; NaN stays NaN and is not counted. Written out, not statsmodels'
    ``multipletests``: that runs ``gc.collect()`` on every call (0.4 s with a model in memory, and a
    run adjusts several families); tests/scoring/test_holm.py holds this to statsmodels on random inputs."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(len(p), np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    if finite.size:
        order = finite[np.argsort(p[finite], kind="stable")]
        steps = p[order] * np.arange(finite.size, 0, -1)  # the i-th smallest p times (m - i)
        out[order] = np.minimum(np.maximum.accumulate(steps), 1.0)
    return out


def verdict(row: pd.Series, alpha: float = ALPHA) -> str:
    """The wording a claim earns: "holds", or what was (not) shown, with the power where known;
    an exploratory claim's wording starts "exploratory:" and never says "holds"."""
    if reason := row.get("untestable"):  # the design, not the data, rules the test out: say why
        return f"untestable: {reason}"
    if not np.isfinite(row["p_holm"]):
        return "not tested: no records (see the note)" if int(row["n"]) == 0 else f"not tested: {int(row['n'])} {_n_of(row)}"
    adjusted_floor = row["p_floor"] * max(int(row["family_size"]), 1)  # Holm multiplies the smallest p by the family size
    if np.isfinite(row["p_floor"]) and adjusted_floor >= alpha:  # no outcome could be significant: say why, not "not detected"
        return (f"untestable at α = {alpha:g}: {int(row['n'])} {_n_of(row)} allow p ≥ {row['p_floor']:.3g}, "
                f"{adjusted_floor:.3g} after Holm over {int(row['family_size'])}")
    wording = _confirmatory_verdict(row, alpha)
    if not row["exploratory"]:
        return wording
    return "exploratory: " + ("significant after Holm, not a confirmatory claim" if wording == "holds" else wording)


def _n_of(row: pd.Series) -> str:
    """What a row's n counts (tables written before the column existed: task groups)."""
    n_of = row.get("n_of")
    return n_of if isinstance(n_of, str) and n_of else "task groups"


def _confirmatory_verdict(row: pd.Series, alpha: float) -> str:
    power = f", power {row['power']:.2f} against ±{row['sesoi']:g}" if np.isfinite(row["power"]) else ""
    if row["kind"] == "absence":
        if row["p_holm"] < alpha:
            return f"holds: equivalent to 0 within ±{row['sesoi']:g}"
        return f"not shown: equivalence within ±{row['sesoi']:g} not established{power}"
    greater = row["alternative"] == "greater"
    side_ok = row["low"] > row["null"] if greater else row["high"] < row["null"]
    if row["p_holm"] < alpha and side_ok:
        if not np.isfinite(row["sesoi"]) or row["p_min_holm"] < alpha:
            return "holds"
        delta = row["sesoi"]
        inside = row["high"] < row["null"] + delta if greater else row["low"] > row["null"] - delta
        if inside:
            return f"detectable, below the smallest effect of interest ±{delta:g} (its CI lies inside it)"
        return (f"detectable; not shown above the smallest effect of interest ±{delta:g} "
                f"(minimum-effect p {row['p_min_holm']:.3g} after Holm)")
    if row["p"] < alpha and side_ok:
        return f"not after correction (unadjusted p {row['p']:.3g}){power}"
    return f"not detected{power}"


def claims_table(claims: Sequence[Claim], *, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per claim (:data:`COLUMNS`), p-values Holm-adjusted within each family, and a verdict."""
    if not claims:
        return pd.DataFrame(columns=COLUMNS)
    names = [(c.family, c.name) for c in claims]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"claims named twice in one family: {duplicates}")
    frame = pd.DataFrame([asdict(c) for c in claims])
    frame["p_holm"] = np.nan
    frame["p_min_holm"] = np.nan
    frame["family_size"] = 0
    for family, sub in frame.groupby("family", sort=False):
        for unit, same_unit in sub.groupby("unit", sort=False):
            deltas = sorted(set(same_unit["sesoi"].dropna()))
            if len(deltas) > 1:
                raise ValueError(f"claims family {family!r} states {len(deltas)} smallest effects of interest in {unit} "
                                 f"({deltas}): state one δ per family, before the run")
        tested = sub["untestable"] == ""  # a claim its design cannot test is no test: not in the correction
        p, p_min = sub["p"].where(tested), sub["p_min_effect"].where(tested)
        frame.loc[sub.index, "p_holm"] = holm(p.to_numpy())
        frame.loc[sub.index, "p_min_holm"] = holm(p_min.to_numpy())
        frame.loc[sub.index, "family_size"] = int(np.isfinite(p.to_numpy(float)).sum())
    frame["verdict"] = [verdict(row, alpha) for _, row in frame.iterrows()]
    return frame[COLUMNS + ["alternative"]]


def holds(verdict: str) -> bool:
    """A verdict that says the claim holds ("holds", "holds: equivalent to 0 within ±δ"); an exploratory
    one never does."""
    return verdict == "holds" or verdict.startswith("holds:")


def renamed(claims: Sequence[Claim], family: str) -> list[Claim]:
    """``claims`` moved into ``family`` (e.g. a validation that corrects over all its claims)."""
    return [replace(c, family=family) for c in claims]
