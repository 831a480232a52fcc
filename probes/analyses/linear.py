"""Residual-stream linear probe control (Fig. 10).

Question: is applicability (T_ok vs T_wrong) a static, linearly readable label of the residual
stream at the decision position, and is it more readable under BASM than under the other memory
configurations? For every configuration, depth k and layer (embeddings = layer 0, then every
decoder layer's output), a probe

    StandardScaler, then L2 logistic regression (C · Σ log-loss + ½‖w‖², intercept unpenalised)

is trained and evaluated with *task-disjoint* cross-validation: ``StratifiedGroupKFold`` over
task groups, so the probe never sees a test item's task template in training (``--fold-groups
scenario``: over whole scenarios, every template of a test item's scenario out of training; the
groups are recorded in the results header, ``probe.fold_groups``). Every item gets an
out-of-fold score; the AUC of those scores is reported with a 95% percentile bootstrap CI over
task groups (groups resampled with replacement, the OOF scores of their items pooled). The
logistic regression is solved to its exact optimum (Newton's method, :func:`fit_logistic`) in the
span of the training rows, which holds the L2 optimum, so d_model ≫ n costs an n-dimensional fit.

Chance: labels are permuted *within* task groups (every group keeps its composition, so the null
has the same group structure and the same folds as the data) and the probe is refit on the
cached features. ``DEFAULT_PERMUTATIONS`` = 199 label permutations are drawn once per
(configuration, k) and applied at every layer. Per layer: the null AUCs' mean and 95% interval
and p = (1 + #null ≥ AUC) / (1 + n). For the post-hoc best layer: the null statistic is the
maximum over layers of the null AUC (same permutation at every layer), and ``p_maxnull`` =
(1 + #max-null ≥ AUC) / (1 + n) is family-wise over layers (Westfall–Young max-T); at the best
layer it is the best-layer p (``p_best_layer_maxnull``). With 199 permutations p can reach 1/200.

Features are the residual stream at the decision row (``ProbeSession.run(...,
record_residual=True)``): ``[n_layers + 1, d_model]`` per prompt, cached as ``.npy`` files keyed
by the prompt's token ids (k = 0 prompts are shared by every configuration and computed once).

``--limit N`` keeps N items per bucket taken round-robin over task groups
(:func:`probes.data.dataset.spread_limit`, as in every analysis), not the first N in file order (those
share one task group, where no task-disjoint CV exists).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy.special import expit
from sklearn.preprocessing import StandardScaler

from probes.analyses import register
from probes.core.files import OutputRoot, remove_tree
from probes.prompts.builder import SWEEP_K_MAX
from probes.analyses.base import Analysis, Comparison, ReportSection
from probes.analyses.jobs import Job, run_jobs
from probes.analyses.option_system import fold_groups_option, folds_option, k_max_option, option
from probes.analyses.run_context import AnalysisError, RunContext, provenance
from probes.analyses.parallel import on_rank_zero
from probes.prompts.record import PromptRecord
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring.claims import Claim, absence_claim, effect_claim
from probes.scoring.score import row_fields
from probes.data.configs import CONFIGS, PAPER_CONFIGS
from probes.data.dataset import fold_groups
from probes.scoring.stats import auc, group_bootstrap_auc, grouped_folds, permuted_labels

POSITIVE, NEGATIVE = "T_ok", "T_wrong"  # applicable (1) vs inapplicable (0)
PROBE_BUCKETS: tuple[str, ...] = (POSITIVE, NEGATIVE)
DEFAULT_FOLDS = 5
DEFAULT_C = 1.0
DEFAULT_PERMUTATIONS = 199  # smallest p = 1 / (1 + 199) = 0.005 < 0.01
DEFAULT_RESAMPLES = 1000
NEWTON_TOL = 1e-9  # Newton decrement² gᵀH⁻¹g ≈ 2 (f − f*): stop within ~5e-10 of the optimal objective
NEWTON_MAX_ITER = 100
LABEL_BLOCK = 256  # label rows fitted together (bounds the [rows, r, r] Hessians' memory)
# The family's smallest effect of interest, in AUC units, fixed before any run: an AUC of 0.6 (a
# random T_ok item outscores a random T_wrong one 60% of the time; Cohen's d ≈ 0.36 for normal
# scores) is the weakest readout we would call a linear "vector". So "no vector" means every
# layer's AUC within 0.5 ± δ (TOST), and "beats the shortcut" means by more than δ.
AUC_SESOI = 0.1


@dataclass(frozen=True)
class ProbeSettings:
    folds: int = DEFAULT_FOLDS
    C: float = DEFAULT_C
    permutations: int = DEFAULT_PERMUTATIONS
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    fold_groups: str = "task_group"  # groups of the CV folds (probes.data.dataset.fold_groups)


def labels(buckets: Sequence[str]) -> np.ndarray:
    """1 for T_ok (applicable), 0 for T_wrong; other buckets are an error."""
    unknown = sorted(set(buckets) - set(PROBE_BUCKETS))
    if unknown:
        raise ValueError(f"the applicability probe uses {PROBE_BUCKETS} only, got {unknown}")
    return np.array([bucket == POSITIVE for bucket in buckets], dtype=int)


def fit_logistic(Z: np.ndarray, Y: np.ndarray, C: float = DEFAULT_C) -> tuple[np.ndarray, np.ndarray]:
    """L2 logistic regressions on features ``Z [m, r]``, one per label row of ``Y [P, m]``:
    the minimiser of C · Σ log-loss + ½‖w‖² (intercept unpenalised), by Newton's method with
    per-row backtracking, all rows batched. Returns (W [P, r], b [P])."""
    m, r = Z.shape
    A = np.hstack([Z, np.ones((m, 1))])
    ridge = np.r_[np.ones(r), 0.0]
    Y = np.asarray(Y, dtype=float)

    def objective(theta: np.ndarray, Y: np.ndarray) -> np.ndarray:
        eta = theta @ A.T
        return C * (np.logaddexp(0.0, eta) - Y * eta).sum(1) + 0.5 * (theta[:, :r] ** 2).sum(1)

    theta = np.zeros((len(Y), r + 1))
    f = objective(theta, Y)
    active = np.arange(len(Y))  # rows not yet converged
    for _ in range(NEWTON_MAX_ITER):
        t_a, y_a = theta[active], Y[active]
        p = expit(t_a @ A.T)
        grad = C * (p - y_a) @ A + ridge * t_a
        hessian = np.matmul(A.T * (C * p * (1 - p))[:, None, :], A) + np.diag(ridge)
        step = np.linalg.solve(hessian, grad[..., None])[..., 0]
        decrement = (grad * step).sum(1)
        going = decrement > NEWTON_TOL
        active, t_a, y_a, step, decrement = active[going], t_a[going], y_a[going], step[going], decrement[going]
        if not len(active):
            return theta[:, :r], theta[:, r]
        size = np.ones(len(active))
        for _ in range(60):  # Armijo: halve each row's step until its objective falls enough
            trial = t_a - size[:, None] * step
            f_trial = objective(trial, y_a)
            short = f_trial > f[active] - 0.25 * size * decrement
            if not short.any():
                break
            size = np.where(short, size / 2, size)
        theta[active], f[active] = trial, f_trial
    raise RuntimeError(f"logistic regression: Newton's method did not converge in {NEWTON_MAX_ITER} iterations "
                       f"for {len(active)} of {len(Y)} label rows (C = {C}, {m} items × {r} features)")


def out_of_fold_scores(X: np.ndarray, Y: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]], *, C: float = DEFAULT_C) -> np.ndarray:
    """Decision-function scores of each item from the probe trained without its fold, for the
    labels ``Y [n]`` or for every label row of ``Y [P, n]`` (same shape as ``Y``).

    The scaler and the training rows' basis depend on the features only, so every label row
    reuses them and only the logistic regressions are refit."""
    Y = np.asarray(Y, dtype=int)
    rows = Y.reshape(-1, Y.shape[-1])
    X = np.asarray(X, dtype=np.float64)
    scores = np.full(rows.shape, np.nan)
    for i, (train, test) in enumerate(folds):
        positives = rows[:, train].sum(1)
        if ((positives == 0) | (positives == len(train))).any():
            raise ValueError(f"fold {i}: its {len(train)} training items hold one class only, so no probe can be fit; "
                             "task-disjoint folds must leave both classes in every training set (use grouped_folds)")
        scaler = StandardScaler().fit(X[train])
        # the L2 optimum lies in the span of the training rows: fit on their coordinates (exact)
        u, s, vt = np.linalg.svd(scaler.transform(X[train]), full_matrices=False)
        keep = s > s[0] * max(len(train), X.shape[1]) * np.finfo(float).eps  # numerical rank (none if constant)
        test_coords = scaler.transform(X[test]) @ vt[keep].T
        for start in range(0, len(rows), LABEL_BLOCK):
            block = slice(start, start + LABEL_BLOCK)
            W, b = fit_logistic(u[:, keep] * s[keep], rows[block, train], C)
            scores[block, test] = W @ test_coords.T + b[:, None]
    return scores.reshape(Y.shape)


def _interval(values: np.ndarray) -> tuple[float, float, float]:
    return float(values.mean()), float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))


def probe_layers(features: np.ndarray, y: np.ndarray, groups: Sequence[str], settings: ProbeSettings = ProbeSettings(),
                 progress: Callable[[], Any] | None = None, fold_on: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per layer of ``features [n, layers, d]``: AUC (with CI), the per-layer
    shuffled-label null and p, the max-over-layers null with each layer's family-wise p, and the
    items' out-of-fold scores (``oof_scores``, in the order of ``y``; None where not probed).
    ``groups``: task groups (the bootstrap and permutation unit); ``fold_on``: the groups of the CV
    folds (default ``groups``; scenarios for scenario-disjoint folds, each task group inside one, so
    the within-task-group permutations keep every fold's composition). ``progress`` is called after
    each layer's fits."""
    if settings.permutations < 1:
        raise ValueError(f"permutations must be ≥ 1 (p = (1 + #null ≥ AUC) / (1 + permutations)), got {settings.permutations}")
    y = np.asarray(y, dtype=int)
    n_layers = features.shape[1]
    folds = grouped_folds(y, groups if fold_on is None else fold_on, settings.folds, settings.seed)
    base = {"n": len(y), "n_pos": int(y.sum()), "n_neg": int(len(y) - y.sum()), "n_groups": len(set(groups)), "n_folds": len(folds)}
    stats = ("auc", "low", "high", "null_mean", "null_low", "null_high", "p_perm", "maxnull_mean", "maxnull_low", "maxnull_high", "p_maxnull",
             "p_floor")
    if not folds:
        return [{**base, **dict.fromkeys(stats, float("nan")), "n_permutations": 0, "oof_scores": None, "note": f"no grouped CV by {settings.fold_groups}: fewer than 2 groups per class, or no split leaves both classes in every training fold"}
                for _ in range(n_layers)]
    shuffled = permuted_labels(y, groups, settings.permutations, settings.seed)
    everything = np.vstack([y, shuffled])  # row 0: the observed labels
    # A layer whose features do not vary over the items (e.g. the embedding of the same decision
    # token) carries no information: it is not probed and leaves the max-over-layers family.
    constant = [bool(np.ptp(features[:, layer, :], axis=0).max() == 0) for layer in range(n_layers)]
    if all(constant):
        raise ValueError("every layer's features are identical across items: nothing to probe")
    aucs = np.full((n_layers, len(everything)), np.nan)  # [layer, observed + permutations]
    observed_scores = []
    for layer in range(n_layers):
        if constant[layer]:
            observed_scores.append(None)
        else:
            scores = out_of_fold_scores(features[:, layer, :], everything, folds, C=settings.C)
            aucs[layer] = [auc(labels_, row) for labels_, row in zip(everything, scores)]
            observed_scores.append(scores[0])
        if progress is not None:
            progress()
    max_null = np.nanmax(aucs[:, 1:], axis=0)
    maxnull_mean, maxnull_low, maxnull_high = _interval(max_null)
    labelings = distinct_labelings(y, groups)
    # With few task groups the within-group permutations repeat: p cannot go below 1/labelings.
    few = f"only {labelings} distinct within-group labelings: p ≥ {1 / labelings:.3g}" if labelings <= settings.permutations else ""
    rows = []
    for layer in range(n_layers):
        if constant[layer]:
            rows.append({**base, **dict.fromkeys(stats, float("nan")), "n_permutations": 0, "oof_scores": None,
                         "note": "features identical across items (input-independent at this row): not probed"})
            continue
        value, null = float(aucs[layer, 0]), aucs[layer, 1:]
        low, high = group_bootstrap_auc(y, observed_scores[layer], groups, resamples=settings.resamples, seed=settings.seed + layer)
        null_mean, null_low, null_high = _interval(null)
        rows.append({**base, "auc": value, "low": low, "high": high, "null_mean": null_mean, "null_low": null_low, "null_high": null_high,
                     "p_perm": float((1 + np.sum(null >= value)) / (1 + len(null))),
                     "maxnull_mean": maxnull_mean, "maxnull_low": maxnull_low, "maxnull_high": maxnull_high,
                     "p_maxnull": float((1 + np.sum(max_null >= value)) / (1 + len(max_null))), "n_permutations": len(null),
                     "p_floor": max(1 / (1 + len(null)), 1 / labelings), "oof_scores": observed_scores[layer].tolist(), "note": few})
    return rows


def distinct_labelings(y: np.ndarray, groups: Sequence[str]) -> int:
    """How many distinct label vectors a within-task-group permutation can produce."""
    y, groups = np.asarray(y), np.asarray(groups)
    return int(np.prod([math.comb(int((groups == g).sum()), int(y[groups == g].sum())) for g in dict.fromkeys(groups.tolist())],
                       dtype=object))


# ------------------------------------------------------------------------------------- features
def feature_key(record: PromptRecord, model: str = "") -> str:
    """Content key of a prompt's decision-row residual: its token ids and decision row, and
    ``model`` (the weights fingerprint and dtype), so changed weights never reuse residuals."""
    digest = hashlib.sha256(model.encode())
    digest.update(np.asarray(record.input_ids, dtype=np.int64).tobytes())
    digest.update(str(sorted(record.query_rows)).encode())
    return digest.hexdigest()[:24]


def residual_features(session: Any, record: PromptRecord) -> np.ndarray:
    """``[n_layers + 1, d_model]`` float32 residual stream at the record's decision row."""
    result = session.run(record.input_ids, [record.decision_index], record_residual=True)
    residual = result.conditions[0].residual
    if residual is None:
        raise RuntimeError("the engine returned no residual stream")
    return residual.float().numpy()


class FeatureCache:
    """``.npy`` residuals by :func:`feature_key` in one folder (written atomically)."""

    def __init__(self, root: str | Path) -> None:
        self.root = OutputRoot(root)
        self.root.make_folder()

    def path(self, key: str) -> Path:
        return self.root.path(f"{key}.npy")

    def __contains__(self, key: str) -> bool:
        return self.path(key).is_file()

    def load(self, key: str) -> np.ndarray:
        return np.load(self.path(key))

    def save(self, key: str, value: np.ndarray) -> None:
        with self.root.atomic(f"{key}.npy") as tmp:
            np.save(tmp, np.asarray(value, dtype=np.float32))


# ------------------------------------------------------------------------------------- the analysis
NAME = "linear"
FEATURES = "linear_features"  # the residual cache's folder in linear's own (steer reads it too)
# Each question its own Holm family, all with δ = AUC_SESOI: "readable" (as before), "beats the best
# shortcut", "no vector at any layer"; so adding a question never makes another one untestable.
SHORTCUT_FAMILY, NO_VECTOR_FAMILY = f"{NAME}-shortcut", f"{NAME}-no-vector"
FIGURE = "fig10_linear_probe"


def probe_all(ctx: RunContext, index: Any, cache: FeatureCache, settings: ProbeSettings) -> Any:
    """Probe every (config, k, layer); rows appended to ``linear_probe.jsonl`` per (config, k), whose
    layers share one set of label permutations (resumable)."""
    from tqdm.auto import tqdm

    from probes.reporting.results import ResultsStore

    path = ctx.rows_path("linear_probe")
    items = {item.id: item for item in ctx.dataset.items}

    def write() -> None:  # rank 0 alone in a parallel run: the probes need every rank's features
        store = ResultsStore(path, "linear_probe",
                             ctx.config(configs=list(ctx.options.configs), limit_mode="spread over task groups",
                                        probe=asdict_settings(settings),
                                        null="labels permuted within task groups, the same permutations at every layer; "
                                             "p_maxnull against the max over layers"),
                             overwrite=ctx.options.overwrite)
        cells = [(config, int(k), frame.sort_values("item_id")) for (config, k), frame in index.groupby(["config", "k"], sort=True)]
        n_layers = cache.load(index["feature_key"].iloc[0]).shape[0]
        memo: dict[tuple, list[dict[str, Any]]] = {}  # identical feature sets (k = 0) are probed once
        with tqdm(total=len(cells) * n_layers, desc="linear probes", unit="layer", dynamic_ncols=True) as bar:
            for config, k, frame in cells:
                keys = [f"{config}|k{k}|L{layer}" for layer in range(n_layers)]
                if all(key in store for key in keys):
                    bar.update(n_layers)
                    continue
                features = np.stack([cache.load(key) for key in frame["feature_key"]])  # [n, L+1, d]
                y = frame["label"].to_numpy(dtype=int)
                groups = frame["task_group"].tolist()
                fold_on = fold_groups([items[item_id] for item_id in frame["item_id"]], settings.fold_groups)
                signature = (tuple(frame["feature_key"]), tuple(y.tolist()))
                if signature in memo:
                    bar.update(n_layers)
                else:
                    memo[signature] = probe_layers(features, y, groups, settings, progress=lambda: bar.update(1), fold_on=fold_on)
                store.append([{"key": key, "config": config, "k": k, "format": ctx.fmt, "layer": layer,
                               "d_model": int(features.shape[2]), "item_ids": frame["item_id"].tolist(), **memo[signature][layer]}
                              for layer, key in enumerate(keys) if key not in store])

    on_rank_zero(write)
    return load_results(path) if path.stat().st_size else pd.DataFrame()


def asdict_settings(settings: ProbeSettings) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(settings)


SUMMARY_COLUMNS = ["config", "k", "layer", "auc", "low", "high", "null_mean", "null_low", "null_high", "p_perm",
                   "maxnull_mean", "maxnull_low", "maxnull_high", "p_maxnull", "n_permutations", "p_floor",
                   "n", "n_pos", "n_neg", "n_groups", "n_folds", "note"]


GROUP_COLUMNS = ["config", "k", "layer", "task_group", "probe_auc", "shortcut_auc"]


@dataclass
class LinearSummary:
    table: Any  # SUMMARY_COLUMNS per (config, k, layer)
    note: str  # the figure's footnote
    shortcut: dict[str, Any] | None = None  # the best no-model shortcut AUC on the same split (probes.scoring.shortcuts)
    groups: Any = None  # GROUP_COLUMNS at the largest k: within-task-group AUCs of the probe and of the best shortcut
    seed: int = 0


def best_shortcut_auc(ctx: RunContext) -> dict[str, Any] | None:
    """The best no-model shortcut's T_ok/T_wrong AUC (request length, lexical overlap, catalog rules, bag of words)
    on exactly this run's items (classifiers fit on the train split still fit on all of it): the bar a
    probe result has to clear, read on the items the probe was read on."""
    from probes.scoring.shortcuts import best_shortcut, shortcut_table, split_name

    a = ctx.options
    split = None if a.split == "all" else a.split
    table = shortcut_table(ctx.dataset, splits=(split,), split_kind=a.split_kind, fold_groups=a.fold_groups, resamples=a.resamples, seed=a.seed,
                           item_ids=[item.id for item in ctx.items])
    return best_shortcut(table, split=split_name(split, a.split_kind)).get("auc")


def shortcut_item_scores(ctx: RunContext, best: dict[str, Any] | None) -> pd.Series:
    """The per-item scores, by item id, of the shortcut :func:`best_shortcut_auc` chose, on the same
    items, oriented T_ok-high as its AUC is (empty without a shortcut): the paired side of the probe −
    shortcut claim."""
    from probes.scoring.shortcuts import PAIR, shortcut_scores

    if best is None:
        return pd.Series(dtype=float)
    a = ctx.options
    split = None if a.split == "all" else a.split
    ids = {item.id for item in ctx.items}
    pair = [item for item in ctx.dataset.select(split=split, split_kind=a.split_kind) if item.id in ids and item.bucket in PAIR]
    wrong_high = shortcut_scores(ctx.dataset, pair, split=split, split_kind=a.split_kind, fold_groups=a.fold_groups, seed=a.seed)[best["shortcut"]]
    y_ok = np.array([item.bucket == POSITIVE for item in pair], dtype=int)
    # best_shortcut reads a rule in whichever direction separates (AUC ≥ 0.5): orient the scores the same way
    ok_high = -wrong_high if auc(y_ok, -wrong_high) >= 0.5 else wrong_high
    return pd.Series(ok_high, index=[item.id for item in pair], dtype=float)


def group_aucs(y: np.ndarray, scores: np.ndarray, groups: Sequence[str]) -> pd.Series:
    """Within-task-group AUC of ``scores`` for y = 1 (T_ok) against y = 0, per task group (first-seen
    order): the paired unit of the probe's claims. NaN for a group holding one class only."""
    y, scores, groups = np.asarray(y), np.asarray(scores, dtype=float), np.asarray(groups)
    order = list(dict.fromkeys(groups.tolist()))
    return pd.Series([auc(y[groups == g], scores[groups == g]) for g in order], index=order, dtype=float)


def group_table(raw: pd.DataFrame, items: dict[str, Any], shortcut: pd.Series) -> pd.DataFrame:
    """:data:`GROUP_COLUMNS` for every probed layer at the largest k of ``raw`` (the probe rows, with
    ``item_ids`` and ``oof_scores``): per task group the probe's within-group AUC and the best
    shortcut's on the same items (NaN without a shortcut score). Rows written before the scores were
    kept never get here: the results header's code digest refuses them on resume."""
    top = raw[(raw["k"] == raw["k"].max()) & raw["auc"].notna()]
    out = []
    for row in top.itertuples():
        ids = list(row.item_ids)
        y = np.array([items[i].bucket == POSITIVE for i in ids], dtype=int)
        groups = [items[i].task_group for i in ids]
        probe, cut = group_aucs(y, np.asarray(row.oof_scores, dtype=float), groups), group_aucs(y, shortcut.reindex(ids).to_numpy(float), groups)
        out.append(pd.DataFrame({"config": row.config, "k": int(row.k), "layer": int(row.layer), "task_group": probe.index,
                                 "probe_auc": probe.to_numpy(), "shortcut_auc": cut.to_numpy()}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=GROUP_COLUMNS)


def probe_claims(best: pd.DataFrame, groups: pd.DataFrame, shortcut: dict[str, Any] | None, *, seed: int = 0) -> list[Claim]:
    """Per configuration at the largest k (``best``: :func:`best_layers`; ``groups``: :func:`group_table`),
    δ = :data:`AUC_SESOI`, one family per question:

    - *readable* (family "linear"): the best layer's AUC above the within-group label-permutation null, p family-wise
      over layers (the max-over-layers null); CI: the AUC's bootstrap CI, held against 0.5;
    - *probe > shortcut* (:data:`SHORTCUT_FAMILY`): mean over task groups of the best layer's within-group AUC minus the best
      shortcut's on the same items (paired), above 0 and (minimum-effect test) above δ. The layer is
      chosen after looking (which favours the probe), so p is Bonferroni-corrected over the probed
      layers; the shortcut is the best of every rule, read in its better direction (which favours the
      shortcut: the safe side);
    - *no vector* (:data:`NO_VECTOR_FAMILY`): every probed layer's mean within-group AUC within 0.5 ± δ (TOST per layer; the
      claim is their intersection, so its p is the largest, that layer's claim is the one shown)."""
    if not len(best):
        return []
    top = best[best["k"] == best["k"].max()]
    claims = []
    for r in top.itertuples():
        claims.append(Claim(NAME, f"{r.config} k={r.k}", f"under {r.config} at k = {r.k} applicability is linearly readable at the best layer "
                            f"(L{r.best_layer}; max-over-layers permutation null)", float(r.auc), float(r.low), float(r.high), int(r.n_groups),
                            float(r.p_best_layer_maxnull), p_floor=float(r.p_floor), unit="AUC", null=0.5,
                            note=f"null AUC at that layer {r.shuffled:.3f} [{r.null_low:.3f}, {r.null_high:.3f}]"))
        mine = groups[(groups["config"] == r.config) & (groups["k"] == r.k)]
        layers = sorted(mine["layer"].unique())
        at_best = mine[mine["layer"] == r.best_layer]
        name = shortcut["shortcut"] if shortcut is not None else "none"
        diff = at_best["probe_auc"] - at_best["shortcut_auc"]  # NaN without a shortcut: no unit, "not tested"
        beats = effect_claim(SHORTCUT_FAMILY, f"{r.config} k={r.k} probe>shortcut",
                             f"under {r.config} at k = {r.k} the best layer's probe (L{r.best_layer}) separates T_ok from T_wrong within "
                             f"task groups better than the best surface shortcut ({name}) on the same items", diff.to_numpy(float),
                             at_best["task_group"].to_numpy(), sesoi=AUC_SESOI, unit="AUC", seed=seed,
                             note=(f"mean within-task-group AUC, probe − shortcut, paired by task group; p Bonferroni × {len(layers)} layers "
                                   f"(the layer was chosen after looking); the shortcut is the best of every rule, read in its better direction"
                                   if shortcut is not None else "no shortcut AUC on these items: nothing to compare with"))
        claims.append(replace(beats, **{field: float(np.minimum(1.0, getattr(beats, field) * len(layers)))  # Bonferroni; NaN stays NaN
                                        for field in ("p", "p_min_effect", "p_floor")}))
        per_layer = [absence_claim(NO_VECTOR_FAMILY, f"{r.config} k={r.k} no vector",
                                   f"under {r.config} at k = {r.k} no layer's probe reads applicability: the mean within-task-group AUC "
                                   f"lies within 0.5 ± {AUC_SESOI:g} at every one of {len(layers)} probed layers (shown: L{layer}, the least "
                                   "clearly equivalent; estimate = AUC − 0.5)",
                                   (mine.loc[mine["layer"] == layer, "probe_auc"] - 0.5).to_numpy(float),
                                   mine.loc[mine["layer"] == layer, "task_group"].to_numpy(), sesoi=AUC_SESOI, unit="AUC", seed=seed,
                                   note=f"intersection–union test over {len(layers)} layers: TOST per layer, p = the largest")
                     for layer in layers]
        if per_layer:
            claims.append(max(per_layer, key=lambda c: c.p if math.isfinite(c.p) else math.inf))
    return claims


def figure_note(ctx: RunContext, table: Any) -> str:

    a = ctx.options
    return (f"{provenance(ctx).replace(f' · margin: {a.margin_variant}', '')}\n"
            f"AUC of out-of-fold scores, StratifiedGroupKFold by {a.fold_groups.replace('_', ' ')} (≤ {a.folds} folds), "
            f"StandardScaler + L2 logistic regression (C = {a.C}); band: 95% bootstrap CI over task groups; "
            f"grey: labels shuffled within task groups ({a.permutations} permutations, the same at every layer; mean and 95% range)\n"
            f"{best_layer_note(best_layers(table))}" + "".join(f"\np floor: {note}" for note in p_floors(table)))


def p_floors(table: Any) -> list[str]:
    """The permutation p floors the run's task groups impose (e.g. "only 16 distinct within-group
    labelings: p ≥ 0.0625"), once each: with few groups no layer can reach a small p."""
    return sorted({str(n) for n in table["note"].dropna() if str(n).startswith("only ")})


def best_layer_note(best: Any) -> str:
    """The largest k's best layers with their family-wise p (one line for the figure note)."""
    if not len(best):
        return "no best layer: too few task groups"
    top = best[best["k"] == best["k"].max()]
    return (f"best layer (k = {int(top['k'].iloc[0])}) vs the max over layers of the null AUC: "
            + ", ".join(f"{r.config} L{r.best_layer} p = {r.p_best_layer_maxnull:.3g}" for r in top.itertuples()))


def best_layers(table: Any) -> Any:
    """Per configuration and k: the best layer (argmax AUC, chosen after looking), its AUC (CI),
    the shuffled null at that layer with its p, the max-over-layers null with the family-wise
    best-layer p, and the mean AUC over layers."""
    out = []
    for (config, k), frame in table.groupby(["config", "k"], sort=True):
        finite = frame[frame["auc"].notna()]
        if not len(finite):
            continue
        best = finite.loc[finite["auc"].idxmax()]
        out.append({"config": config, "k": int(k), "best_layer": int(best["layer"]), "auc": best["auc"], "low": best["low"],
                    "high": best["high"], "shuffled": best["null_mean"], "null_low": best["null_low"], "null_high": best["null_high"],
                    "p_perm": best["p_perm"], "maxnull_low": best["maxnull_low"], "maxnull_high": best["maxnull_high"],
                    "p_best_layer_maxnull": best["p_maxnull"], "n_permutations": int(best["n_permutations"]), "p_floor": best["p_floor"],
                    "mean_auc_over_layers": finite["auc"].mean(), "n": int(best["n"]), "n_groups": int(best["n_groups"])})
    return pd.DataFrame(out)


@register("linear", order=60)
@dataclass(kw_only=True)
class Linear(Analysis):
    """Fig. 10: task-disjoint linear probes for applicability on the decision-row residual stream, per layer."""

    k_max: int | None = k_max_option(SWEEP_K_MAX)
    buckets: tuple[str, ...] | None = option(PROBE_BUCKETS, "keep only these buckets (the probe contrasts T_ok and T_wrong)",
                                             flag="--bucket", repeat=True, choices=("T_ok", "T_wrong", "T_repair"), group="items")
    configs: tuple[str, ...] = option(PAPER_CONFIGS, f"comma-separated memory configurations (default: {','.join(PAPER_CONFIGS)})",
                                      names=tuple(CONFIGS), minimum=1)
    folds: int = folds_option(DEFAULT_FOLDS, "grouped CV folds (lowered to the groups per class)", "linear probe")
    fold_groups: str = fold_groups_option("linear probe")
    C: float = option(DEFAULT_C, "inverse L2 strength of the logistic regression", type=float, minimum=0.0, exclusive=True,
                      why="scikit-learn's logistic regression needs C > 0", group="linear probe")
    permutations: int = option(DEFAULT_PERMUTATIONS, "label permutations within task groups, shared by all layers; p ≥ 1/(1 + N)",
                               type=int, minimum=1, group="linear probe")
    resamples: int = option(DEFAULT_RESAMPLES, "task-group bootstrap resamples of the AUC CI", type=int, minimum=1, group="linear probe")

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        """Residuals of every (item, config, k) prompt of the T_ok / T_wrong items (``--limit`` already spread
        them over task groups, see :func:`probes.data.dataset.spread_limit`: task-disjoint CV needs at least
        two task groups per class); the rows index the cached features."""
        items = [item for item in ctx.items if item.bucket in PROBE_BUCKETS]
        if not items:
            raise AnalysisError(f"linear: no {' / '.join(PROBE_BUCKETS)} items selected (the probe contrasts applicable vs inapplicable states)")
        ctx.items = tuple(items)
        try:  # a dataset without the folds' groups fails here, before any residual
            fold_groups(ctx.items, ctx.options.fold_groups)
        except ValueError as error:
            raise AnalysisError(f"linear --fold-groups {ctx.options.fold_groups}: {error}") from error
        configs = list(ctx.options.configs)
        store = ctx.store(configs=configs, row="decision", features="residual stream [layer+1, d_model]",
                          limit_mode="spread over task groups")  # first: it takes the lock on the output
        root = ctx.folder / FEATURES
        if ctx.options.overwrite:  # --overwrite discards every result, cached residuals too (rank 0 alone, before any rank writes)
            on_rank_zero(lambda: remove_tree(root))
        cache = FeatureCache(root)
        model = f"{ctx.model_fingerprint['weights']}|{ctx.options.dtype}"
        jobs = [Job(item, config, k, ctx.fmt, ("residual",))
                for item in ctx.items for k in range(ctx.options.k_max + 1) for config in configs]

        def scorer(record: PromptRecord, job: Any) -> list[dict[str, Any]]:
            key = feature_key(record, model)
            if key not in cache:
                cache.save(key, residual_features(ctx.session, record))
            row = row_fields(record)
            row.update(condition="residual", feature_key=key, label=int(record.bucket == POSITIVE),
                       decision_index=record.decision_index, n_tokens=len(record.input_ids))
            return [row]

        run_jobs(ctx, store, jobs, scorer)
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> LinearSummary:
        """Probes of every (config, k, layer) on the collected features, and the summary table."""
        a = ctx.options
        settings = ProbeSettings(folds=a.folds, C=a.C, permutations=a.permutations, resamples=a.resamples, seed=a.seed, fold_groups=a.fold_groups)
        raw = probe_all(ctx, rows, FeatureCache(ctx.folder / FEATURES), settings)
        table = raw[SUMMARY_COLUMNS].sort_values(["config", "k", "layer"])
        shortcut = best_shortcut_auc(ctx)
        groups = group_table(raw, {item.id: item for item in ctx.dataset.items}, shortcut_item_scores(ctx, shortcut))
        return LinearSummary(table, figure_note(ctx, table), shortcut, groups, a.seed)

    def tables(self, summary: LinearSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_summary": summary.table}

    def figures(self, summary: LinearSummary, out_dir: Path) -> list[Path]:
        plots.style()
        return plots.save_figure(fig10_linear_probe(summary.table, summary.note, summary.shortcut), out_dir, FIGURE)

    def section(self, ctx: RunContext, summary: LinearSummary, figures: list[Path]) -> ReportSection:
        table = summary.table
        best = best_layers(table)
        k_max = int(table["k"].max())
        body = (f"{'Task' if ctx.options.fold_groups == 'task_group' else 'Scenario'}-disjoint (StratifiedGroupKFold by "
                f"{ctx.options.fold_groups.replace('_', ' ')}) logistic-regression probes for applicability "
                f"(T_ok vs T_wrong) on the decision-row residual stream; best layer per configuration and k "
                f"(shuffled = labels permuted within task groups, null mean and 95% interval at that layer, p_perm = "
                f"(1 + #null ≥ AUC) / (1 + n_permutations)). The best layer is selected after looking, so its test is "
                f"p_best_layer_maxnull: each permutation is applied at every layer and its null statistic is the maximum "
                f"AUC over layers (95% interval: maxnull_low–maxnull_high).\n\n"
                f"{markdown_table(best) if len(best) else '(no AUC: too few task groups)'}")
        if summary.shortcut is not None and len(best):
            cut = summary.shortcut
            below = best[best["low"].isna() | (best["low"] <= cut["value"])]
            body += (f"\n\n**Shortcut bar.** The best surface shortcut on the same {cut.get('n_items', '?')} items ({cut['shortcut']}, no model) separates T_ok "
                     f"from T_wrong with AUC {cut['value']:.3f} [{cut['low']:.3f}, {cut['high']:.3f}]. "
                     + (f"**{len(below)} of {len(best)} best-layer probe results do not beat it** (CI lower bound ≤ the shortcut's AUC): "
                        + ", ".join(f"{r.config} k={r.k}" for r in below.itertuples()) + ". Such a probe result can be read off the "
                        "request's surface and is no evidence that the residual stream encodes applicability."
                        if len(below) else "Every best-layer probe result's CI lies above it."))
        body += (f"\n\n**Claims** (smallest effect of interest δ = {AUC_SESOI:g} AUC, fixed before the run: an AUC of "
                 f"{0.5 + AUC_SESOI:g} is the weakest readout called a vector). Per configuration at k = {k_max}, one Holm family per "
                 f"question: readable at the best layer (`{NAME}`); the best layer beats the best shortcut by more than δ "
                 f"(`{SHORTCUT_FAMILY}`: within-task-group AUC, paired by task group, Bonferroni over the layers); and \"no vector\" "
                 f"(`{NO_VECTOR_FAMILY}`): every layer's within-task-group AUC within 0.5 ± δ (TOST at each layer, all must hold). "
                 f"Absence of a detected probe is not evidence of no vector; only the last claim holding is.")
        floors = p_floors(table)
        if floors:
            body += "\n\n**p floor.** " + "; ".join(floors) + " (too few task groups for a smaller permutation p at any layer)."
        comparisons = [Comparison(f"Fig. 10: best-layer probe AUC, {config} (k = {k_max}; paper: no stable high-AUC vector)",
                                  float(best[(best["config"] == config) & (best["k"] == k_max)]["auc"].iloc[0]), None, "AUC")
                       for config in ("proc", "basm") if len(best) and ((best["config"] == config) & (best["k"] == k_max)).any()]
        return ReportSection(NAME, "Fig. 10 — residual-stream linear probe control (`linear`)", figures, body, comparisons, summary)

    def claims(self, summary: LinearSummary) -> list[Claim]:
        """:func:`probe_claims`: readable at the best layer, beats the best shortcut, no vector at any layer."""
        return probe_claims(best_layers(summary.table), summary.groups, summary.shortcut, seed=summary.seed)

    def print_summary(self, summary: LinearSummary) -> None:
        for (config, k), frame in summary.table.groupby(["config", "k"], sort=True):
            if frame["auc"].notna().any():
                best = frame.loc[frame["auc"].idxmax()]
                print(f"{config:>16} k={k}: best layer {int(best['layer'])} AUC {best['auc']:.3f} [{best['low']:.3f}, {best['high']:.3f}] "
                      f"(shuffled {best['null_mean']:.3f} [{best['null_low']:.3f}, {best['null_high']:.3f}], p = {best['p_perm']:.3g}; "
                      f"max over layers [{best['maxnull_low']:.3f}, {best['maxnull_high']:.3f}], p = {best['p_maxnull']:.3g}; "
                      f"{int(best['n_permutations'])} permutations); mean over layers {frame['auc'].mean():.3f}; "
                      f"n = {int(best['n'])} items / {int(best['n_groups'])} task groups, {int(best['n_folds'])} folds")
            else:
                print(f"{config:>16} k={k}: no AUC ({frame['note'].iloc[0]})")


# --- Fig. 10, drawn by Linear.figures
def fig10_linear_probe(table: pd.DataFrame, note: str, shortcut: dict | None = None) -> plt.Figure:
    """AUC of the task-disjoint applicability probe per layer, one line per configuration (band:
    95% CI over task groups), one panel per retrieval depth k; grey: shuffled-label baseline;
    dotted: the best surface shortcut's AUC (``shortcut``: ``{"shortcut", "value", "low", "high"}``).

    table: config, k, layer, auc, low, high, null_mean, null_low, null_high, n, n_groups, note.
    """
    ks = sorted(int(k) for k in table["k"].unique())
    shown = [k for k in ks if k > 0] or ks  # k = 0 is the same prompt for every configuration
    fig, axes = plt.subplots(1, len(shown), figsize=(max(7.0, 3.9 * len(shown)), 3.9), sharey=True, squeeze=False)
    for ax, k in zip(axes[0], shown):
        sub = table[table["k"] == k]
        null = sub.groupby("layer")[["null_mean", "null_low", "null_high"]].mean().reset_index()
        if null["null_mean"].notna().any():
            ax.fill_between(null["layer"], null["null_low"], null["null_high"], color="0.6", alpha=0.25, lw=0,
                            label="shuffled labels (95% range)")
            ax.plot(null["layer"], null["null_mean"], color="0.45", lw=1, ls="--")
        for config in plots.ordered(sub["config"], plots.CONFIG_ORDER):
            line = sub[sub["config"] == config].sort_values("layer")
            ax.plot(line["layer"], line["auc"], marker="o", ms=3, color=plots.color(config), label=plots.label(config))
            ax.fill_between(line["layer"], line["low"], line["high"], color=plots.color(config), alpha=0.15, lw=0)
        ax.axhline(0.5, color="0.3", lw=0.8)
        if shortcut is not None:
            ax.axhline(shortcut["value"], color="firebrick", lw=1, ls=":",
                       label=f"best shortcut ({shortcut['shortcut']}; {shortcut.get('n_items', '?')} items, the probe's)")
        n_items = int(sub["n"].max()) if len(sub) else 0
        n_groups = int(sub["n_groups"].max()) if len(sub) else 0
        ax.set_title(f"k = {k}  ({n_items} items, {n_groups} task group{'s' if n_groups != 1 else ''})")
        ax.set_xlabel("layer (0 = embeddings)")
        layers = sorted(int(x) for x in sub["layer"].unique())
        step = max(1, len(layers) // 8)
        ax.set_xticks(layers[::step])
        ax.set_ylim(0.0, 1.02)
        if sub["auc"].isna().all():
            reason = sub["note"].dropna().iloc[0] if sub["note"].notna().any() else "no AUC"
            ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes, fontsize=8, color="0.3", wrap=True)
    axes[0][0].set_ylabel(f"probe AUC, {plots.bucket_label('T_ok')} vs {plots.bucket_label('T_wrong')}")
    axes[0][-1].legend(loc="lower right", fontsize=7.5)
    fig.suptitle("Residual-stream probe control: task-disjoint linear probes for applicability")
    plots.footnote(fig, note)
    return fig
