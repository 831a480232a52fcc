"""The ``steer`` analysis's statistics, as pure functions on its rows (one row per held-out record × condition).

Setting: each held-out record is scored clean (condition ``baseline``) and with α · d̂ added to the
residual stream (``direction`` d̂, from ``layer`` over ``window`` layers, at the decision row or every
row of the call: ``rows_mode``; α on an a-priori grid, both signs). Every direction is oriented so
that α > 0 is expected to *lower* the T_wrong margin; ``random`` directions of the same norm are
drawn ``draw`` = 0, 1, … . Δm = ``margin`` − ``clean_margin`` (the same record's clean margin).

``dose_response``     per cell (config, bucket, direction, layer, window, rows_mode, α), random draws
                      aside: mean Δm, the flip rates wrong → correct / correct → wrong / → abstain
                      (each among the records whose clean choice could flip that way), the
                      correct-choice rate and the mean KL(clean ‖ steered), each with a 95% CI over
                      task groups; the mean Δ of every margin variant.
``random_band``       the same quantities per random draw; the band is their 2.5/97.5 percentiles.
``family_table``      Δm per task family; ``sign_consistency``: at α > 0, the share of families whose
                      Δm has the pooled sign, and the families pushed the other way (a pooled mean
                      can hide a family steered toward the wrong tool).
``steer_claims``      "steering along d̂ lowers the T_wrong margin more than random directions at equal
                      norm" per (config, layer, window), and the T_ok control "does not reduce the
                      correct-call rate" (TOST).
``flip_claim``        "steering flips held-out T_wrong choices more than random directions" (the
                      organism's ground-truth check).

Every mean and rate is the mean over task groups of the group's value (each task group weighs the
same, as in every CI of the suite: :func:`probes.scoring.stats.bootstrap_mean`); a comparison with
random directions is paired per record: the steered value minus the mean over that record's draws.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from probes.scoring.claims import Claim, absence_claim, effect_claim
from probes.scoring.score import MARGIN_VARIANTS
from probes.scoring.stats import DEFAULT_SEED, summarise

CELL: tuple[str, ...] = ("config", "bucket", "direction", "layer", "window", "rows_mode", "alpha")
BAND_CELL: tuple[str, ...] = tuple(c for c in CELL if c != "direction")
FAMILY_CELL: tuple[str, ...] = (*CELL, "family")
# A record's steered rows are paired with its random draws on these columns.
RECORD_CELL: tuple[str, ...] = (*BAND_CELL, "record_id")
RECORD_KEY: tuple[str, ...] = ("config", "record_id")  # a record's baseline row
ROW_COLUMNS: tuple[str, ...] = ("record_id", "task_group", "family", *CELL, "condition", "draw", "margin", "clean_margin",
                                "kl_clean", "top_role", "clean_top_role")
BASELINE = "baseline"
RANDOM = "random"
SHUFFLED = "shuffled"
HEADLINE_ROWS = "decision"  # the claims' rows mode: the decision row only
ROLES: tuple[str, ...] = ("correct", "wrong", "other", "abstain")
MIN_DRAWS = 2  # a band or a mean over random draws needs two of them; the analysis draws ≥ 20 (issue 44)
BAND_PERCENTILES = (2.5, 97.5)
STEER_FAMILY = "steer"
# The non-headline directions (and the shuffled-label control) are exploratory: their own family, so they do
# not enlarge the Holm correction of the confirmatory claims (as circuit minimality does).
EXPLORATORY_FAMILY = "steer exploratory"

# flip measure → the column counting the records whose clean choice could flip that way
FLIPS: dict[str, str] = {"wrong_to_correct": "n_clean_wrong", "correct_to_wrong": "n_clean_correct",
                         "to_abstain": "n_clean_not_abstain"}
MEASURES: tuple[str, ...] = ("delta_margin", *FLIPS, "correct_rate", "kl")
COUNTS: dict[str, str] = {"delta_margin": "n_margin", **FLIPS}  # a measure's count of records, where not every record has it


# ---------------------------------------------------------------------------- rows
def steered_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The steered rows (baseline rows dropped, they are the reference) with one column per measure:
    ``delta_margin`` (NaN where either margin is undefined), the flip indicators (1/0 among the
    records whose clean choice could flip that way, NaN elsewhere), ``correct_rate`` (1/0) and ``kl``.
    Refuses rows that miss a schema column, hold an unknown role or a non-finite α, repeat a
    (record, condition, draw) or give a random direction no draw number."""
    missing = [c for c in ROW_COLUMNS if c not in rows]
    if missing:
        raise ValueError(f"steer rows lack the columns {missing}: score them with actions=True and write the steer row "
                         f"schema (probes.scoring.steer_stats.ROW_COLUMNS)")
    for column in ("top_role", "clean_top_role"):
        unknown = sorted(set(map(str, rows[column])) - set(ROLES))
        if unknown:
            raise ValueError(f"steer rows: {column} holds {unknown}; expected one of {ROLES} (score with actions=True)")
    steered = rows[rows["condition"] != BASELINE].copy()
    alpha = steered["alpha"].to_numpy(float)
    if not np.isfinite(alpha).all():
        raise ValueError(f"steer rows: alpha must be finite in every steered row, got {sorted(set(alpha[~np.isfinite(alpha)]))}")
    unnumbered = steered[(steered["direction"] == RANDOM) & (steered["draw"] < 0)]
    if len(unnumbered):
        raise ValueError(f"steer rows: {len(unnumbered)} random-direction rows have no draw number (draw < 0), e.g. "
                         f"record {unnumbered['record_id'].iloc[0]!r}: number the draws 0, 1, …")
    repeated = steered[steered.duplicated([*RECORD_CELL, "direction", "draw"], keep=False)]
    if len(repeated):
        first = repeated.iloc[0]
        raise ValueError(f"steer rows: {len(repeated)} rows repeat a (record, condition, draw), e.g. record "
                         f"{first['record_id']!r} {_cell_text(first, [*BAND_CELL, 'direction', 'draw'])}: "
                         f"one row per record × condition × draw")
    clean = steered["clean_top_role"]
    top = steered["top_role"]
    steered["delta_margin"] = steered["margin"].astype(float) - steered["clean_margin"].astype(float)
    steered["wrong_to_correct"] = (top == "correct").astype(float).where(clean == "wrong")
    steered["correct_to_wrong"] = (top == "wrong").astype(float).where(clean == "correct")
    steered["to_abstain"] = (top == "abstain").astype(float).where(clean != "abstain")
    steered["correct_rate"] = (top == "correct").astype(float)
    steered["kl"] = steered["kl_clean"].astype(float)
    if variants(rows):  # the rows carry only the headline clean margin: each variant's comes from the baseline row
        clean_rows = rows[rows["condition"] == BASELINE].set_index(list(RECORD_KEY))
        twice = clean_rows.index[clean_rows.index.duplicated()].unique()
        if len(twice):
            raise ValueError(f"steer rows: {len(twice)} records have more than one baseline row, e.g. {twice[0]}: one per record")
        keys = pd.MultiIndex.from_frame(steered[list(RECORD_KEY)])
        unmatched = keys[~keys.isin(clean_rows.index)].unique()
        if len(unmatched):
            raise ValueError(f"steer rows: {len(unmatched)} steered records have no baseline row (condition {BASELINE!r}), "
                             f"e.g. {unmatched[0]}: the margin variants' Δ needs each record's clean row")
        for variant in variants(rows):
            clean_value = clean_rows[f"margin_{variant}"].astype(float).reindex(keys).to_numpy()
            steered[f"delta_{variant}"] = steered[f"margin_{variant}"].astype(float).to_numpy() - clean_value
    return steered


def variants(rows: pd.DataFrame) -> list[str]:
    """The margin variants whose column ``margin_<variant>`` the rows hold."""
    return [v for v in MARGIN_VARIANTS if f"margin_{v}" in rows]


def _cell_text(row: pd.Series | dict, columns: Sequence[str]) -> str:
    return ", ".join(f"{c}={row[c]!r}" for c in columns)


def span_label(layer: int, window: int) -> str:
    """``L16`` for one layer, ``L16-18`` for a window of three (claim names and figure titles)."""
    return f"L{layer}" if window == 1 else f"L{layer}-{layer + window - 1}"


def _group_mean_table(steered: pd.DataFrame, by: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """Per ``by`` cell, each column's mean over task groups of the group means of its finite values
    (NaN without any): the point estimate of :func:`probes.scoring.stats.bootstrap_mean`, for many
    cells at once."""
    per_group = steered.groupby([*by, "task_group"], sort=False)[list(columns)].mean()
    return per_group.groupby(level=list(range(len(by))), sort=False).mean().reset_index()


# ---------------------------------------------------------------------------- dose-response
def dose_response(rows: pd.DataFrame, *, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Per cell (:data:`CELL`) of the non-random directions: ``n_records``, ``n_groups`` (task groups),
    ``delta_margin`` [``_low``, ``_high``] over ``n_margin`` records with a finite Δm, the flip rates
    ``wrong_to_correct`` (among ``n_clean_wrong`` records whose clean choice is the wrong tool),
    ``correct_to_wrong`` (among ``n_clean_correct``), ``to_abstain`` (among ``n_clean_not_abstain``),
    ``correct_rate`` and ``kl`` (mean KL(clean ‖ steered) at the decision row, nats), each with its 95%
    CI over task groups; ``note``: the Δm CI's note of :func:`probes.scoring.stats.summarise` ("no CI
    (1 group)", zero width); ``delta_<variant>``: the mean Δ of each margin variant the rows hold."""
    steered = steered_rows(rows)
    steered = steered[steered["direction"] != RANDOM]
    if steered.empty:
        raise ValueError("steer rows hold no steered row of a non-random direction: nothing to draw a dose-response from")
    out = steered.groupby(list(CELL), sort=False).agg(n_records=("record_id", "size"), n_groups=("task_group", "nunique")).reset_index()
    for measure in MEASURES:
        table = summarise(steered, CELL, measure, seed=seed).rename(columns={
            "value": measure, "low": f"{measure}_low", "high": f"{measure}_high", "n_items": COUNTS.get(measure, "n_items")})
        shown = [measure, f"{measure}_low", f"{measure}_high", *([COUNTS[measure]] if measure in COUNTS else []),
                 *(["note"] if measure == "delta_margin" else [])]
        out = out.merge(table[[*CELL, *shown]], on=list(CELL), how="left")
    deltas = [f"delta_{v}" for v in variants(steered)]
    if deltas:
        out = out.merge(_group_mean_table(steered, CELL, deltas), on=list(CELL), how="left")
    return out


# ---------------------------------------------------------------------------- random band
def random_band(rows: pd.DataFrame) -> pd.DataFrame:
    """Per cell (:data:`BAND_CELL`) of the random directions: ``n_draws``, ``n_records`` (per draw,
    the most of any draw) and for each measure of :func:`dose_response` the mean over draws
    (``<measure>_mean``) and the 2.5/97.5 percentiles of the per-draw values (``<measure>_low`` /
    ``_high``), each draw's value computed as the direction's (mean over task groups). Refuses a cell
    with fewer than :data:`MIN_DRAWS` draws, naming it."""
    steered = steered_rows(rows)
    random = steered[steered["direction"] == RANDOM]
    if random.empty:
        raise ValueError("steer rows hold no random-direction rows (direction 'random'): the band needs the random draws")
    per_draw = _group_mean_table(random, [*BAND_CELL, "draw"], MEASURES).merge(
        random.groupby([*BAND_CELL, "draw"], sort=False).size().rename("n_records").reset_index(), on=[*BAND_CELL, "draw"])
    out = []
    for key, draws in per_draw.groupby(list(BAND_CELL), sort=False):
        cell = dict(zip(BAND_CELL, key))
        if len(draws) < MIN_DRAWS:
            raise ValueError(f"random band: the cell {_cell_text(cell, BAND_CELL)} has {len(draws)} random draw; "
                             f"a band needs at least {MIN_DRAWS} (draw more random directions)")
        row = {**cell, "n_draws": len(draws), "n_records": int(draws["n_records"].max())}
        for measure in MEASURES:
            values = draws[measure].to_numpy(float)
            values = values[np.isfinite(values)]
            low, high = np.percentile(values, BAND_PERCENTILES) if len(values) else (np.nan, np.nan)
            row.update({f"{measure}_mean": values.mean() if len(values) else np.nan, f"{measure}_low": low, f"{measure}_high": high})
        out.append(row)
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------- families
def family_table(rows: pd.DataFrame, *, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Δm per task family and cell (:data:`FAMILY_CELL`, non-random directions): ``delta_margin``
    [``low``, ``high``] over the family's task groups (``n_groups``), ``n_records`` with a finite Δm
    and the ``note`` of :func:`probes.scoring.stats.summarise`."""
    steered = steered_rows(rows)
    steered = steered[steered["direction"] != RANDOM]
    table = summarise(steered, FAMILY_CELL, "delta_margin", seed=seed)
    return table.rename(columns={"value": "delta_margin", "n": "n_groups", "n_items": "n_records", "n_nan": "n_nan_margin"})


def sign_consistency(dose: pd.DataFrame, families: pd.DataFrame) -> pd.DataFrame:
    """Per cell with α > 0 (``dose``: :func:`dose_response`, ``families``: :func:`family_table`): the
    pooled ``delta_margin``, ``n_families`` with a finite mean, ``share_same_sign`` (families whose
    mean has the pooled mean's sign) and ``opposite_families`` ("family +1.00 [+0.80, +1.20]", ";"
    between families): those pushed the other way, which the pooled mean hides."""
    finite = families[np.isfinite(families["delta_margin"].to_numpy(float))]
    # a cell's families by position (one groupby) instead of a mask over the whole family table and a sub-frame per
    # cell: 1.8 s → 0.02 s of CPU on report --quick's 480 cells
    at_cell = finite.groupby(list(CELL), sort=False).indices
    family, mean, low, high = (finite[c].to_numpy() for c in ("family", "delta_margin", "low", "high"))
    out = []
    for cell in dose.loc[dose["alpha"] > 0, [*CELL, "delta_margin"]].to_dict("records"):
        rows = at_cell.get(tuple(cell[c] for c in CELL), np.zeros(0, dtype=int))
        pooled_sign = np.sign(cell["delta_margin"])
        signs = np.sign(mean[rows].astype(float))
        opposite = rows[signs == -pooled_sign] if pooled_sign != 0 else rows[:0]
        out.append({**cell, "n_families": len(rows),
                    "share_same_sign": float(np.mean(signs == pooled_sign)) if len(rows) and np.isfinite(pooled_sign) else np.nan,
                    "n_opposite": len(opposite),
                    "opposite_families": "; ".join(f"{family[r]} {mean[r]:+.2f} [{low[r]:+.2f}, {high[r]:+.2f}]" for r in opposite)})
    return pd.DataFrame(out, columns=[*CELL, "delta_margin", "n_families", "share_same_sign", "n_opposite", "opposite_families"])


# ---------------------------------------------------------------------------- claims
def versus_random(steered: pd.DataFrame, measure: str, direction: str) -> pd.DataFrame:
    """Per record of ``direction`` (``steered``: :func:`steered_rows`): ``difference`` = its ``measure``
    minus the mean of ``measure`` over the same record's random draws (same layer, window, rows mode
    and α), with :data:`RECORD_CELL` and ``task_group``; only finite differences. Refuses a record
    with fewer than :data:`MIN_DRAWS` random draws, naming it."""
    own = steered[steered["direction"] == direction]
    random = steered[steered["direction"] == RANDOM]
    draws = random.groupby(list(RECORD_CELL), sort=False)[measure].agg(random_mean="mean", n_draws="size").reset_index()
    paired = own.merge(draws, on=list(RECORD_CELL), how="left")
    short = paired[paired["n_draws"].fillna(0) < MIN_DRAWS]
    if len(short):
        first = short.iloc[0]
        raise ValueError(f"steer: {len(short)} records of direction {direction!r} have fewer than {MIN_DRAWS} random draws "
                         f"in their cell, e.g. record {first['record_id']!r} ({_cell_text(first, BAND_CELL)}): "
                         f"draw random directions at every layer, window, rows mode and α the direction is steered at")
    paired["difference"] = paired[measure].astype(float) - paired["random_mean"].astype(float)
    return paired[np.isfinite(paired["difference"].to_numpy(float))][[*RECORD_CELL, "task_group", "difference"]]


def steer_claims(rows: pd.DataFrame, *, headline_alpha: float, headline_direction: str, sesoi: float, ok_sesoi: float,
                 seed: int = DEFAULT_SEED) -> list[Claim]:
    """At α = ``headline_alpha`` (> 0), decision-row steering, per (config, layer, window):

    - T_wrong, each non-random direction: per record Δm(direction) − mean Δm(random draws), claimed
      below 0 with the smallest effect of interest ``sesoi`` (logits); confirmatory for
      ``headline_direction`` (family :data:`STEER_FAMILY`), exploratory for the others, the
      shuffled-label control among them (family :data:`EXPLORATORY_FAMILY`);
    - T_ok, ``headline_direction``: per record correct(steered) − correct(clean) ∈ {−1, 0, 1}, claimed
      within ±``ok_sesoi`` (share of calls) by TOST.
    """
    if not headline_alpha > 0:
        raise ValueError(f"headline_alpha must be > 0 (directions are oriented so that α > 0 lowers the T_wrong margin), "
                         f"got {headline_alpha}")
    steered = steered_rows(rows)
    directions = [d for d in dict.fromkeys(steered["direction"]) if d != RANDOM]
    if headline_direction not in directions:
        raise ValueError(f"headline_direction {headline_direction!r} is not among the steered directions {directions}")
    at = steered[(steered["rows_mode"] == HEADLINE_ROWS) & np.isclose(steered["alpha"].to_numpy(float), headline_alpha)]
    if at.empty:
        raise ValueError(f"no steered {HEADLINE_ROWS}-row rows at headline_alpha {headline_alpha:g}; the grid holds α ∈ "
                         f"{sorted(set(steered['alpha']))}: choose the headline α from the grid")
    claims = []
    wrong = at[at["bucket"] == "T_wrong"]
    for direction in [headline_direction, *(d for d in directions if d != headline_direction)]:
        confirmatory = direction == headline_direction
        note = "control: a direction estimated on shuffled bucket labels within task groups" if direction == SHUFFLED else ""
        paired = versus_random(wrong, "delta_margin", direction)
        for (config, layer, window), sub in paired.groupby(["config", "layer", "window"], sort=False):
            span = span_label(layer, window)
            claims.append(effect_claim(
                STEER_FAMILY if confirmatory else EXPLORATORY_FAMILY, f"{config} {span}: {direction} vs random, T_wrong margin",
                f"steering along the {direction} direction ({config}, {span}, α = {headline_alpha:g}, decision row) lowers the "
                f"T_wrong margin more than random directions at equal norm",
                sub["difference"], sub["task_group"], alternative="less", sesoi=sesoi, unit="logits", note=note,
                exploratory=not confirmatory, seed=seed))
    if not claims:
        raise ValueError(f"no T_wrong rows at headline_alpha {headline_alpha:g} ({HEADLINE_ROWS} rows): the steering claims need them")
    ok = at[(at["bucket"] == "T_ok") & (at["direction"] == headline_direction)]
    if ok.empty:
        raise ValueError(f"no T_ok rows of {headline_direction!r} at headline_alpha {headline_alpha:g}: the T_ok control "
                         f"(a direction that helps T_wrong must not make T_ok calls wrong) needs them")
    for (config, layer, window), sub in ok.groupby(["config", "layer", "window"], sort=False):
        span = span_label(layer, window)
        change = sub["correct_rate"] - (sub["clean_top_role"] == "correct").astype(float)
        claims.append(absence_claim(
            STEER_FAMILY, f"{config} {span}: {headline_direction}, T_ok correct calls kept",
            f"steering along the {headline_direction} direction ({config}, {span}, α = {headline_alpha:g}, decision row) does "
            f"not reduce the T_ok correct-call rate (TOST within ±{ok_sesoi:g}: a rise beyond it fails too; it is no harm, "
            f"but not 'no effect')",
            change, sub["task_group"], sesoi=ok_sesoi, unit="share", seed=seed))
    return claims


def flip_claim(rows: pd.DataFrame, *, config: str, layer: int, direction: str, alpha: float, family: str,
               window: int = 1, rows_mode: str = HEADLINE_ROWS, seed: int = DEFAULT_SEED) -> Claim:
    """"Steering along ``direction`` at ``layer`` flips held-out T_wrong choices more than random
    directions": per T_wrong record correct(steered) − mean over its random draws of correct(random),
    claimed above 0 (share of records), over task groups."""
    steered = steered_rows(rows)
    at = steered[(steered["bucket"] == "T_wrong") & (steered["config"] == config) & (steered["layer"] == layer)
                 & (steered["window"] == window) & (steered["rows_mode"] == rows_mode)
                 & np.isclose(steered["alpha"].to_numpy(float), alpha)]
    if not (at["direction"] == direction).any():
        raise ValueError(f"flip claim: no T_wrong rows of direction {direction!r} at config {config!r}, layer {layer}, "
                         f"window {window}, rows_mode {rows_mode!r}, α {alpha:g}: steer there first")
    paired = versus_random(at, "correct_rate", direction)
    span = span_label(layer, window)
    return effect_claim(family, f"{config} {span}: {direction} flips T_wrong vs random",
                        f"steering along the {direction} direction ({config}, {span}, α = {alpha:g}, {rows_mode} rows) flips "
                        f"held-out T_wrong choices to the correct tool more than random directions at equal norm",
                        paired["difference"], paired["task_group"], alternative="greater", unit="share", seed=seed)


# ---------------------------------------------------------------------------- generated calls
GENERATED: dict[str, str] = {"generated_correct": "correct_tool", "generated_wrong": "wrong_tool", "generated_abstain": "abstain"}


def generation_table(rows: pd.DataFrame, *, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """The steered model's own greedy call, read by the suite's parser (lenient), where the rows have one
    (``generated_outcome``; the clean run's as direction ""): per cell the correct-call, wrong-tool and abstention
    rates and ``agreement``, the share whose generated call is the candidate ranking's top action, each a mean over
    task groups with a 95% CI over them. Empty when no row was generated."""
    if "generated_outcome" not in rows:
        return pd.DataFrame()
    made = rows[rows["generated_outcome"].notna()].copy()
    if made.empty:
        return pd.DataFrame()
    for column, outcome in GENERATED.items():
        made[column] = (made["generated_outcome"] == outcome).astype(float)
    made["agreement"] = (made["generated_action"] == made["top_action"]).astype(float)
    out = None
    for measure in (*GENERATED, "agreement"):
        table = summarise(made, CELL, measure, seed=seed).rename(columns={"value": measure, "low": f"{measure}_low", "high": f"{measure}_high",
                                                                         "n": "n_groups", "n_items": "n_records"})
        keep = [*CELL, measure, f"{measure}_low", f"{measure}_high"] + (["n_groups", "n_records"] if out is None else [])
        out = table[keep] if out is None else out.merge(table[keep], on=list(CELL), how="left")
    return out
