"""The circuit's statistics (``basm-probes circuit``), as pure functions on arrays.

Setting: per held-out item i (task group g_i) the metric m (logit(wrong) − logit(correct) at the
deciding row) of the full model ``m_full[i]``, of the empty circuit ``m_empty[i]`` (every edge
ablated), of a circuit C (its complement ablated) ``m_circuit[i]`` and of random circuits of C's
size ``m_random[i, r]``. "Ablated" is the analysis's stated choice (counterfactual patch, mean or
resample); nothing here depends on it.

``faithfulness``             MIB's normalisation as a ratio of means over items,
                             F(C) = mean(m_C − m_∅) / mean(m_M − m_∅); NaN when the full model and the
                             empty circuit differ by less than :data:`MIN_GAP` (:func:`faithfulness_undefined`
                             says so: such a pair has nothing to explain).
``faithfulness_curve``       F on a grid of sizes with 95% CIs from resampling task groups.
``integrated_faithfulness``  MIB's area under the curve over the fraction of edges kept (trapezoid on
                             a grid that holds 0, the empty circuit, and 1, the full model).
``smallest_faithful_size``   the smallest size whose F reaches :data:`FAITHFUL_THRESHOLD`.
``layer_matched_circuits``   random circuits with C's per-layer edge counts, drawn among the edges of
                             each layer that are not in C; ``possible_matched_sets`` counts them.
``sufficiency_claim``        Shi et al. (NeurIPS 2024) sufficiency, p over task groups: C keeps more of
``partial_necessity_claim``  the behaviour than random circuits of its size; removing C moves the
                             metric toward the empty circuit more than removing random circuits does;
                             ``random_rank_p``: C's descriptive rank among the random circuits.
``minimality_table``         Shi et al.'s minimality, per circuit edge against random added edges.
``estimate_agreement``       AtP-type estimates against exact patching: rank and linear correlation,
                             the largest error, the edges beyond :data:`AGREEMENT_ABS_TOL` +
                             :data:`AGREEMENT_REL_TOL`·|exact| (flagged).
``planted_recovery``         the organism's planted edges from B: their ranks, and the hypergeometric
``planted_claim``            chance of a random circuit of C's size holding as many of them.
``held_out_check``           refuses a selection that saw a held-out task group.

Direction: the tests orient every difference toward the full model, s = sign(mean(m_M − m_∅)), so
a positive value always means "more of the behaviour the circuit is meant to explain".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import integrate
from scipy import stats as scipy_stats

from probes.scoring.claims import Claim, effect_claim
from probes.scoring.stats import DEFAULT_RESAMPLES, DEFAULT_SEED, MAX_SKIPPED_SHARE, cluster_bootstrap_blocks, no_ci_note

# The family's smallest effect of interest in logits of the wrong-tool margin: the knockout family's δ
# (probes.analyses.knockout.DEFAULT_SESOI, an odds change of 1.28×, fixed before any run). It lives in
# the analyses layer, which this one may not import; tests/scoring/test_circuit_stats.py keeps the two equal.
CIRCUIT_SESOI = 0.25
# A full model and empty circuit closer than this (|mean(m_M − m_∅)|, logits) leave nothing to explain: a
# faithfulness would divide by noise. The same δ: a gap below the smallest effect of interest is no effect.
MIN_GAP = CIRCUIT_SESOI
FAITHFUL_THRESHOLD = 0.8  # MIB / the issue: the smallest circuit recovering 80% of the full − empty gap
MINIMALITY_QUANTILE = 0.9  # Shi et al.'s q (their circuitry package and paper configuration)
AGREEMENT_ABS_TOL = 0.1  # logits: an estimate within 0.1 + 0.25·|exact| of the exact effect agrees
AGREEMENT_REL_TOL = 0.25
CIRCUIT_FAMILY = "circuit"
# Minimality tests each edge against random added edges (pooled faithfulness, not task groups) and is
# exploratory: its own family, so it does not enlarge the Holm correction of the confirmatory claims.
MINIMALITY_FAMILY = "circuit minimality"
ORGANISM_FAMILY = "organism circuit"
TIE_RULE = "ties take the worst rank of the tie (a tie never flatters a planted edge)"


# ---------------------------------------------------------------------------- input checks
def _array(name: str, values: Any, ndim: int, *, rows: int | None = None) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension{'s' if ndim > 1 else ''}, got shape {array.shape}")
    if rows is not None and array.shape[0] != rows:
        raise ValueError(f"{name} has {array.shape[0]} items, the full model's metric has {rows}: pass one value per held-out item")
    if not np.isfinite(array).all():
        bad = np.argwhere(~np.isfinite(array))[:5].tolist()
        raise ValueError(f"{name} holds non-finite values (first at {bad}): every metric of a run must be finite")
    return array


def _mask(name: str, values: Any, n: int) -> np.ndarray:
    mask = np.asarray(values)
    if mask.dtype != bool or mask.shape != (n,):
        raise ValueError(f"{name} must be a boolean array of {n} edges, got dtype {mask.dtype} and shape {mask.shape}")
    return mask


def _gap(m_empty: np.ndarray, m_full: np.ndarray) -> float:
    return float(np.mean(m_full - m_empty))


# ---------------------------------------------------------------------------- faithfulness
def faithfulness_undefined(m_empty: Sequence[float], m_full: Sequence[float]) -> str:
    """Why the faithfulness of every circuit of this pair is undefined ("" when it is defined):
    |mean(m_M − m_∅)| below :data:`MIN_GAP` logits."""
    m_full = _array("m_full", m_full, 1)
    gap = _gap(_array("m_empty", m_empty, 1, rows=len(m_full)), m_full)
    if abs(gap) < MIN_GAP:
        return (f"no faithfulness: the full model and the empty circuit differ by {gap:+.3g} logits on average "
                f"(|gap| < {MIN_GAP:g}): the ablation does not move the metric, there is nothing to explain")
    return ""


def faithfulness(m_circuit: Sequence[float], m_empty: Sequence[float], m_full: Sequence[float]) -> float:
    """MIB's faithfulness as a ratio of means over items: mean(m_C − m_∅) / mean(m_M − m_∅); NaN
    when :func:`faithfulness_undefined` gives a reason (it says which)."""
    m_full = _array("m_full", m_full, 1)
    m_empty = _array("m_empty", m_empty, 1, rows=len(m_full))
    m_circuit = _array("m_circuit", m_circuit, 1, rows=len(m_full))
    if faithfulness_undefined(m_empty, m_full):
        return math.nan
    return float(np.mean(m_circuit - m_empty) / _gap(m_empty, m_full))


def _sizes(sizes: Sequence[int], n_edges_total: int) -> np.ndarray:
    sizes = np.asarray(sizes)
    if sizes.ndim != 1 or not len(sizes) or not np.issubdtype(sizes.dtype, np.integer):
        raise ValueError(f"sizes must be a non-empty 1-D array of edge counts (integers), got {sizes!r}")
    if np.any(np.diff(sizes) <= 0) or sizes[0] < 0 or sizes[-1] > n_edges_total:
        raise ValueError(f"sizes must increase strictly within [0, n_edges_total = {n_edges_total}], got {sizes.tolist()}")
    return sizes


def faithfulness_curve(sizes: Sequence[int], n_edges_total: int, m_circuit: np.ndarray, m_empty: Sequence[float],
                       m_full: Sequence[float], groups: Sequence[str], *, resamples: int = DEFAULT_RESAMPLES,
                       seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Faithfulness of the circuit of each size (``m_circuit[i, n]``: item i, the n-th size) with a
    95% percentile CI from resampling task groups (:func:`probes.scoring.stats.cluster_bootstrap_blocks` of
    the ratio of item means; the same group draws at every size). Columns: n_edges, fraction
    (n_edges / n_edges_total), faithfulness, low, high, n_groups, note. Fewer than two task groups:
    no CI (:func:`no_ci_note`). Resamples whose full − empty gap falls below :data:`MIN_GAP` have no
    faithfulness and are left out, counted in the note; above :data:`MAX_SKIPPED_SHARE` of them the CI
    is refused (it would describe only the resamples that happen to move the metric)."""
    sizes = _sizes(sizes, n_edges_total)
    m_full = _array("m_full", m_full, 1)
    m_empty = _array("m_empty", m_empty, 1, rows=len(m_full))
    m_circuit = _array("m_circuit", m_circuit, 2, rows=len(m_full))
    if m_circuit.shape[1] != len(sizes):
        raise ValueError(f"m_circuit has {m_circuit.shape[1]} sizes per item, sizes lists {len(sizes)}")
    groups = np.asarray(groups)
    if groups.shape != m_full.shape:
        raise ValueError(f"{len(groups)} task-group labels for {len(m_full)} items: pass one per item")
    n_groups = len(set(groups.tolist()))
    undefined = faithfulness_undefined(m_empty, m_full)
    gap = m_full - m_empty
    out = []
    for column, size in enumerate(sizes):
        low = high = math.nan
        note = undefined or no_ci_note(n_groups)
        if not note:
            low, high, skipped = _ratio_ci(m_circuit[:, column] - m_empty, gap, groups, resamples=resamples, seed=seed)
            if skipped / resamples > MAX_SKIPPED_SHARE:
                low = high = math.nan
                note = (f"no CI: {skipped} of {resamples} resamples of the task groups have |full − empty| < {MIN_GAP:g} "
                        f"(> {MAX_SKIPPED_SHARE:g} of them)")
            elif skipped:
                note = f"{skipped} of {resamples} resamples with |full − empty| < {MIN_GAP:g} left out of the CI"
        out.append({"n_edges": int(size), "fraction": size / n_edges_total,
                    "faithfulness": faithfulness(m_circuit[:, column], m_empty, m_full),
                    "low": low, "high": high, "n_groups": n_groups, "note": note})
    return pd.DataFrame(out, columns=["n_edges", "fraction", "faithfulness", "low", "high", "n_groups", "note"])


def _ratio_ci(recovered: np.ndarray, gap: np.ndarray, groups: np.ndarray, *, resamples: int,
              seed: int) -> tuple[float, float, int]:
    """The cluster-bootstrap CI of mean(recovered) / mean(gap) and the resamples left out for a gap
    below :data:`MIN_GAP` (no faithfulness there)."""
    skipped = 0

    def ratio(block: np.ndarray) -> np.ndarray:  # all resamples of a block at once: report --quick 0.9 s -> 0.02 s
        nonlocal skipped
        denominator = gap[block].mean(axis=1)
        too_small = np.abs(denominator) < MIN_GAP
        skipped += int(too_small.sum())
        return np.where(too_small, math.nan, recovered[block].mean(axis=1) / denominator)

    low, high = cluster_bootstrap_blocks(ratio, groups, resamples=resamples, seed=seed)
    return low, high, skipped


def integrated_faithfulness(fractions: Sequence[float], f: Sequence[float]) -> float:
    """MIB's integrated faithfulness: the trapezoid area under F over the fraction of edges kept.
    The grid must increase strictly from 0 (the empty circuit, F = 0) to 1 (the full model, F = 1):
    an area over part of [0, 1] is not comparable across models. F undefined everywhere (the pair
    does not move the metric, :func:`faithfulness_undefined`) gives NaN; undefined at some points only
    is refused."""
    fractions = np.asarray(fractions, dtype=float)
    f = np.asarray(f, dtype=float)
    if fractions.ndim != 1 or fractions.shape != f.shape or len(fractions) < 2:
        raise ValueError(f"fractions and f must be 1-D of one length ≥ 2, got shapes {fractions.shape} and {f.shape}")
    if fractions[0] != 0 or fractions[-1] != 1 or np.any(np.diff(fractions) <= 0):
        raise ValueError(f"the fraction grid must increase strictly from 0 (the empty circuit) to 1 (the full model), "
                         f"got {fractions.tolist()}: add the end points")
    undefined = ~np.isfinite(f)
    if undefined.all():
        return math.nan
    if undefined.any():
        raise ValueError(f"faithfulness is undefined at fractions {fractions[undefined].tolist()} only: "
                         f"a curve with holes has no area; rerun those sizes")
    return float(integrate.trapezoid(f, fractions))


def smallest_faithful_size(sizes: Sequence[int], f: Sequence[float], *,
                           threshold: float = FAITHFUL_THRESHOLD) -> tuple[int | None, str]:
    """The smallest size whose faithfulness (the point estimate) reaches ``threshold``, with "";
    or None with the reason. The curve need not be monotone: this is the first size at or above the
    threshold, whatever follows."""
    sizes = np.asarray(sizes)
    f = np.asarray(f, dtype=float)
    if sizes.ndim != 1 or sizes.shape != f.shape or np.any(np.diff(sizes) <= 0):
        raise ValueError(f"sizes must increase strictly and match f one to one, got sizes {sizes.tolist()} and {len(f)} values")
    if not np.isfinite(f).any():
        return None, "faithfulness undefined at every size (the full model and the empty circuit do not differ)"
    if not np.isfinite(f).all():
        raise ValueError(f"faithfulness is undefined at sizes {sizes[~np.isfinite(f)].tolist()} only: rerun those sizes")
    reached = np.flatnonzero(f >= threshold)
    if not len(reached):
        return None, f"no size on the grid reaches faithfulness {threshold:g} (the largest is {np.nanmax(f):.3g})"
    return int(sizes[reached[0]]), ""


# ---------------------------------------------------------------------------- random circuits
def _circuit_pools(edge_layers: np.ndarray, circuit: np.ndarray) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """The circuit's edges checked, and per layer of the circuit the edges of that layer outside it."""
    edge_layers = np.asarray(edge_layers)
    circuit = np.asarray(circuit)
    if edge_layers.ndim != 1 or not np.issubdtype(edge_layers.dtype, np.integer):
        raise ValueError(f"edge_layers must be a 1-D integer array (the layer of each edge), got {edge_layers.dtype} {edge_layers.shape}")
    if circuit.ndim != 1 or (len(circuit) and not np.issubdtype(circuit.dtype, np.integer)):
        raise ValueError(f"circuit must be a 1-D array of edge indices, got {circuit.dtype} {circuit.shape}")
    if len(circuit) and (circuit.min() < 0 or circuit.max() >= len(edge_layers)):
        raise ValueError(f"circuit indexes edges outside 0..{len(edge_layers) - 1}")
    if len(set(circuit.tolist())) != len(circuit):
        raise ValueError("circuit lists an edge twice: a circuit is a set of edges")
    outside = np.ones(len(edge_layers), dtype=bool)
    outside[circuit] = False
    pools = {int(layer): np.flatnonzero(outside & (edge_layers == layer)) for layer in dict.fromkeys(edge_layers[circuit].tolist())}
    return circuit, pools


def possible_matched_sets(edge_layers: np.ndarray, circuit: np.ndarray) -> int:
    """How many distinct layer-matched random circuits exist: Π over layers of C(pool, count)."""
    circuit, pools = _circuit_pools(edge_layers, circuit)
    layers = np.asarray(edge_layers)[circuit]
    return math.prod(math.comb(len(pool), int((layers == layer).sum())) for layer, pool in pools.items())


def layer_matched_circuits(edge_layers: np.ndarray, circuit: np.ndarray, *, draws: int,
                           rng: np.random.Generator) -> np.ndarray:
    """``draws`` random circuits ``[draws, n]`` with the circuit's per-layer edge counts: column j
    holds an edge of circuit[j]'s layer, drawn without replacement among that layer's edges that are
    NOT in the circuit (a random circuit shares no edge with C). The draws are distinct sets when
    :func:`possible_matched_sets` ≥ ``draws``; otherwise independent (repeats unavoidable: report the
    count of possible sets beside any comparison). A layer with fewer free edges than C holds is refused."""
    if draws < 1:
        raise ValueError(f"draws must be ≥ 1, got {draws}")
    circuit, pools = _circuit_pools(edge_layers, circuit)
    layers = np.asarray(edge_layers)[circuit]
    columns = {layer: np.flatnonzero(layers == layer) for layer in pools}
    for layer, pool in pools.items():
        if len(pool) < len(columns[layer]):
            raise ValueError(f"layer {layer}: the circuit holds {len(columns[layer])} edges but only {len(pool)} edges of that layer "
                             f"lie outside it; no layer-matched random circuit exists (choose a smaller circuit)")
    distinct = possible_matched_sets(edge_layers, circuit) >= draws
    out = np.empty((draws, len(circuit)), dtype=np.int64)
    seen: set[tuple[int, ...]] = set()
    row = 0
    while row < draws:
        for layer, pool in pools.items():
            out[row, columns[layer]] = rng.choice(pool, size=len(columns[layer]), replace=False)
        key = tuple(sorted(out[row].tolist()))
        if distinct and key in seen:
            continue
        seen.add(key)
        row += 1
    return out


# ---------------------------------------------------------------------------- Shi et al.'s tests
def _toward_full(m_empty: np.ndarray, m_full: np.ndarray) -> tuple[float, str]:
    """s = sign(mean(m_M − m_∅)) and why it is undefined ("" when it is not)."""
    reason = faithfulness_undefined(m_empty, m_full)
    return (1.0 if _gap(m_empty, m_full) >= 0 else -1.0), reason


def _random_matrix(name: str, values: Any, rows: int) -> np.ndarray:
    array = _array(name, values, 2, rows=rows)
    if array.shape[1] < 1:
        raise ValueError(f"{name} holds no random circuit: pass [items, random circuits]")
    return array


def random_rank_p(f_circuit: float, f_random: Sequence[float]) -> float:
    """The circuit's rank among R random circuits by pooled faithfulness, as a p:
    (1 + #{r: F(R_r) ≥ F(C)}) / (1 + R); ties count against the circuit. Descriptive (over random
    circuits, not task groups); its floor is 1 / (1 + R)."""
    f_random = _array("f_random", f_random, 1)
    if not math.isfinite(f_circuit) or not len(f_random):
        raise ValueError(f"a rank needs a finite F(C) and ≥ 1 random circuit, got F(C) = {f_circuit} and {len(f_random)}")
    return (1 + int((f_random >= f_circuit).sum())) / (1 + len(f_random))


def sufficiency_claim(m_circuit: Sequence[float], m_random: np.ndarray, m_empty: Sequence[float], m_full: Sequence[float],
                      groups: Sequence[str], *, family: str = CIRCUIT_FAMILY, name: str = "sufficiency",
                      seed: int = DEFAULT_SEED) -> Claim:
    """Shi et al.'s sufficiency with p over task groups: the circuit alone keeps more of the behaviour
    than random layer-matched circuits of its size. Per item d = s·(m_C − mean_r m_R), s toward the full
    model; a sign-flip test over task-group means, δ = :data:`CIRCUIT_SESOI`. The note adds the
    descriptive :func:`random_rank_p` of the pooled faithfulness. Untestable when the pair does not move the metric."""
    m_full = _array("m_full", m_full, 1)
    m_empty = _array("m_empty", m_empty, 1, rows=len(m_full))
    m_circuit = _array("m_circuit", m_circuit, 1, rows=len(m_full))
    m_random = _random_matrix("m_random", m_random, len(m_full))
    s, undefined = _toward_full(m_empty, m_full)
    values = s * (m_circuit - m_random.mean(axis=1))
    n_random = m_random.shape[1]
    if undefined:
        note = f"{n_random} random circuits"
    else:
        f_circuit = faithfulness(m_circuit, m_empty, m_full)
        f_random = np.array([faithfulness(m_random[:, r], m_empty, m_full) for r in range(n_random)])
        note = (f"F(C) = {f_circuit:.3f}, random circuits' F median {np.median(f_random):.3f} over {n_random}; rank p = "
                f"{random_rank_p(f_circuit, f_random):.3g} (descriptive, floor {1 / (1 + n_random):.3g})")
    claim = effect_claim(family, name, "the circuit alone keeps more of the wrong-tool margin than random circuits of its size "
                         "drawn in the same layers (toward the full model)", values, groups, sesoi=CIRCUIT_SESOI,
                         note=f"d = s·(m_C − mean_r m_R), s = {s:+.0f} toward the full model; {note}", seed=seed)
    return _untestable(claim, undefined)


def partial_necessity_claim(m_full: Sequence[float], m_without_circuit: Sequence[float], m_without_random: np.ndarray,
                            m_empty: Sequence[float], groups: Sequence[str], *, family: str = CIRCUIT_FAMILY,
                            name: str = "partial necessity", seed: int = DEFAULT_SEED) -> Claim:
    """Shi et al.'s partial necessity with p over task groups: ablating only the circuit moves the
    metric toward the empty circuit more than ablating random layer-matched circuits of its size.
    Per item d = s·((m_M − m_{M∖C}) − mean_r (m_M − m_{M∖R_r})), s toward the full model; a sign-flip
    test over task-group means, δ = :data:`CIRCUIT_SESOI`. Untestable when the pair does not move the metric."""
    m_full = _array("m_full", m_full, 1)
    m_empty = _array("m_empty", m_empty, 1, rows=len(m_full))
    m_without_circuit = _array("m_without_circuit", m_without_circuit, 1, rows=len(m_full))
    m_without_random = _random_matrix("m_without_random", m_without_random, len(m_full))
    s, undefined = _toward_full(m_empty, m_full)
    values = s * ((m_full - m_without_circuit) - (m_full[:, None] - m_without_random).mean(axis=1))
    claim = effect_claim(family, name, "ablating the circuit moves the wrong-tool margin toward the empty circuit more than "
                         "ablating random circuits of its size drawn in the same layers", values, groups, sesoi=CIRCUIT_SESOI,
                         note=f"d = s·((m_M − m_M∖C) − mean_r (m_M − m_M∖R)), s = {s:+.0f}; "
                              f"{m_without_random.shape[1]} random circuits", seed=seed)
    return _untestable(claim, undefined)


def _untestable(claim: Claim, reason: str) -> Claim:
    return replace(claim, untestable=reason) if reason else claim


def minimality_table(circuit: Sequence[int], f_circuit: float, f_without_edge: Sequence[float],
                     f_with_random: Sequence[float], *, quantile: float = MINIMALITY_QUANTILE,
                     family: str = MINIMALITY_FAMILY, name: str = "minimality") -> tuple[pd.DataFrame, Claim]:
    """Shi et al.'s minimality. Per circuit edge e, Δ_e = F(C) − F(C∖e) (``f_without_edge[j]`` is
    F(C without circuit[j])); the reference Δ_r = F(C ∪ {r}) − F(C) over random non-circuit edges r of
    the circuit's layers (``f_with_random``). An edge passes when Δ_e exceeds the reference's
    ``quantile`` (numpy's linear interpolation). Shi et al.'s per-edge p: a binomial test that Δ_e
    beats Δ_r less often than ``quantile`` of the time (small p: the edge is not minimal). Δ is signed
    (Shi et al. compare the sizes of the two changes): an edge whose removal raises F is not needed.

    Returns the table (edge, delta, reference_quantile, beats_share, p, passes) and an exploratory
    claim "some circuit edges are not minimal": the failing share with its Clopper–Pearson CI (edges
    treated as a sample; descriptive) and p = the smallest per-edge p times the number of edges
    (Bonferroni over the circuit's edges)."""
    circuit = np.asarray(circuit)
    f_without_edge = _array("f_without_edge", f_without_edge, 1)
    f_with_random = _array("f_with_random", f_with_random, 1)
    if not math.isfinite(f_circuit):
        raise ValueError("f_circuit is not finite: the pair has no faithfulness (faithfulness_undefined says why); "
                         "minimality cannot be tested")
    if circuit.shape != f_without_edge.shape or not len(circuit) or not len(f_with_random):
        raise ValueError(f"need one F(C∖e) per circuit edge and ≥ 1 random edge: {len(circuit)} edges, "
                         f"{len(f_without_edge)} F(C∖e), {len(f_with_random)} random edges")
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must lie in (0, 1), got {quantile}")
    delta = f_circuit - f_without_edge
    reference = f_with_random - f_circuit
    threshold = float(np.quantile(reference, quantile))
    beats = (delta[:, None] > reference[None, :]).sum(axis=1)
    p = np.array([scipy_stats.binomtest(int(k), len(reference), quantile, alternative="less").pvalue for k in beats])
    table = pd.DataFrame({"edge": circuit, "delta": delta, "reference_quantile": threshold,
                          "beats_share": beats / len(reference), "p": p, "passes": delta > threshold})
    failing = int((~table["passes"]).sum())
    n = len(table)
    interval = scipy_stats.binomtest(failing, n).proportion_ci(confidence_level=0.95, method="exact")
    floor = min(1.0, n * (1 - quantile) ** len(reference))  # an edge beating no random edge: P(X = 0) = (1 − q)^R, × n
    claim = Claim(family, name, f"some circuit edges are not minimal: removing them lowers faithfulness by no more than "
                  f"the {quantile:g}-quantile of adding a random edge of the circuit's layers does",
                  failing / n, float(interval.low), float(interval.high), n, min(1.0, n * float(p.min())),
                  p_floor=floor, unit="share of circuit edges", exploratory=True, n_of="circuit edges",
                  note=f"{failing} of {n} edges fail against {len(reference)} random edges (Δ_r {quantile:g}-quantile "
                       f"{threshold:+.3g}); p: Shi et al.'s per-edge binomial test, smallest × {n} (Bonferroni); "
                       f"CI: Clopper–Pearson over edges, descriptive")
    return table, claim


# ---------------------------------------------------------------------------- estimates against exact patching
def estimate_agreement(estimate: Sequence[float], exact: Sequence[float], *, abs_tol: float = AGREEMENT_ABS_TOL,
                       rel_tol: float = AGREEMENT_REL_TOL) -> tuple[dict[str, Any], np.ndarray]:
    """How an attribution estimate (AtP, AtP*, EAP-IG) of each edge's effect agrees with exact
    patching of the same edges: Spearman rank correlation and Pearson correlation (scipy), the largest
    |estimate − exact| and its edge index, and the edges whose |estimate − exact| exceeds
    ``abs_tol`` + ``rel_tol``·|exact| (returned as a mask: flagged in the output, never dropped).
    Correlations of a constant side are NaN, said in the note."""
    estimate = _array("estimate", estimate, 1)
    exact = _array("exact", exact, 1, rows=len(estimate))
    if len(estimate) < 2:
        raise ValueError(f"agreement needs ≥ 2 edges, got {len(estimate)}")
    error = np.abs(estimate - exact)
    disagrees = error > abs_tol + rel_tol * np.abs(exact)
    constant = [name for name, side in (("estimate", estimate), ("exact", exact)) if np.ptp(side) == 0]
    spearman = pearson = math.nan
    if not constant:
        spearman = float(scipy_stats.spearmanr(estimate, exact).statistic)
        pearson = float(scipy_stats.pearsonr(estimate, exact).statistic)
    worst = int(np.argmax(error))
    summary = {"n_edges": len(estimate), "spearman": spearman, "pearson": pearson, "max_abs_error": float(error[worst]),
               "max_error_edge": worst, "n_disagree": int(disagrees.sum()), "abs_tol": abs_tol, "rel_tol": rel_tol,
               "note": f"no correlation: {' and '.join(constant)} constant over the edges" if constant else ""}
    return summary, disagrees


# ---------------------------------------------------------------------------- the organism's planted edges
def planted_recovery(scores: Sequence[float], from_boundary: Sequence[bool], planted: Sequence[bool],
                     circuit: Sequence[bool]) -> dict[str, Any]:
    """Where the organism's planted edges (its heads' edges from B) land: each one's rank among the
    edges from B by |score| (1 = top; :data:`TIE_RULE`), and the chance that a circuit of the same
    size drawn uniformly among all edges holds at least as many planted edges as the chosen one
    (hypergeometric: population the E edges, K planted, circuit size N)."""
    scores = _array("scores", scores, 1)
    n = len(scores)
    from_boundary, planted, circuit = (_mask(label, mask, n) for label, mask in
                                       (("from_boundary", from_boundary), ("planted", planted), ("circuit", circuit)))
    if not planted.any():
        raise ValueError("no planted edge: pass the organism's planted heads' edges from B")
    if (planted & ~from_boundary).any():
        raise ValueError(f"planted edges {np.flatnonzero(planted & ~from_boundary).tolist()} do not read B: "
                         "a planted edge is a planted head's edge from the boundary span")
    magnitude = np.abs(scores[from_boundary])
    ranks = scipy_stats.rankdata(-magnitude, method="max")  # descending |score|; ties share their worst rank
    rank_of = dict(zip(np.flatnonzero(from_boundary).tolist(), ranks.astype(int).tolist()))
    n_planted, size, hits = int(planted.sum()), int(circuit.sum()), int((planted & circuit).sum())
    p = float(scipy_stats.hypergeom.sf(hits - 1, n, n_planted, size))
    floor = float(scipy_stats.hypergeom.sf(min(n_planted, size) - 1, n, n_planted, size))
    return {"n_edges": n, "n_from_boundary": int(from_boundary.sum()), "n_planted": n_planted, "circuit_size": size,
            "n_planted_in_circuit": hits, "ranks": {edge: rank_of[edge] for edge in np.flatnonzero(planted).tolist()},
            "expected_in_circuit": n_planted * size / n, "p": p, "p_floor": floor, "tie_rule": TIE_RULE}


def planted_claim(scores: Sequence[float], from_boundary: Sequence[bool], planted: Sequence[bool], circuit: Sequence[bool], *,
                  family: str = ORGANISM_FAMILY, name: str = "planted heads in circuit") -> Claim:
    """The validation claim "the planted heads are in the circuit chosen on train items": the share
    of planted edges in the circuit against the share a random circuit of its size holds by chance
    (``null``), p hypergeometric (:func:`planted_recovery`). The share is a count on fixed edges, not
    a sample estimate: low = high = the share, said in the note."""
    found = planted_recovery(scores, from_boundary, planted, circuit)
    share = found["n_planted_in_circuit"] / found["n_planted"]
    ranks = ", ".join(f"edge {edge}: {rank}" for edge, rank in found["ranks"].items())
    return Claim(family, name, "the planted heads' edges from B are in the circuit chosen on train items (more of them than "
                 "a random circuit of its size holds)", share, share, share, found["n_planted"], found["p"],
                 p_floor=found["p_floor"], unit="share of planted edges", null=found["circuit_size"] / found["n_edges"], n_of="planted edges",
                 note=f"{found['n_planted_in_circuit']} of {found['n_planted']} planted edges in a circuit of "
                      f"{found['circuit_size']} of {found['n_edges']} edges ({found['expected_in_circuit']:.2f} by chance); "
                      f"p hypergeometric; a count, no sampling interval; ranks among {found['n_from_boundary']} edges from B "
                      f"by |score| ({found['tie_rule']}): {ranks}")


# ---------------------------------------------------------------------------- the selection split
def held_out_check(train_groups: Iterable[str], heldout_groups: Iterable[str], selection_rows_groups: Iterable[str]) -> None:
    """Refuses a selection that saw a held-out task group: the train and held-out groups must be
    disjoint, and every row the circuit was selected on must belong to a train group (a held-out or
    unknown group is named in the error)."""
    train, heldout = set(train_groups), set(heldout_groups)
    if overlap := sorted(train & heldout):
        raise ValueError(f"task groups {overlap} are both train and held-out: the split must be disjoint")
    used = set(selection_rows_groups)
    if leaked := sorted(used & heldout):
        raise ValueError(f"the circuit was selected on rows of held-out task groups {leaked}: select on train groups only")
    if unknown := sorted(used - train):
        raise ValueError(f"the circuit was selected on rows of task groups {unknown}, in neither split: record the split "
                         f"before selecting")
