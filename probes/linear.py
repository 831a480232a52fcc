"""Residual-stream linear probe control (Fig. 10).

Question: is applicability (T_ok vs T_wrong) a static, linearly readable label of the residual
stream at the decision position, and is it more readable under BASM than under the other memory
configurations? For every configuration, depth k and layer (embeddings = layer 0, then every
decoder layer's output), a logistic-regression probe

    Pipeline(StandardScaler, LogisticRegression(L2, C))

is trained and evaluated with *task-disjoint* cross-validation: ``StratifiedGroupKFold`` over
task groups, so the probe never sees a test item's task template in training. Every item gets an
out-of-fold score; the AUC of those scores is reported with a 95% percentile bootstrap CI over
task groups (groups resampled with replacement, the OOF scores of their items pooled).

Chance is made visible by a shuffled-label baseline per layer: labels are permuted *within* task
groups (every group keeps its composition, so the null has the same group structure as the data),
the same grouped CV is rerun, and the null AUCs' mean and 95% interval are reported together with
a permutation p-value (1 + #null ≥ observed) / (1 + n_permutations).

Features are the residual stream at the decision row (``ProbeSession.run(...,
record_residual=True)``): ``[n_layers + 1, d_model]`` per prompt, cached as ``.npy`` files keyed
by the prompt's token ids (k = 0 prompts are shared by every configuration and computed once).

``--limit N`` keeps N items per bucket taken round-robin over task groups (:func:`spread_limit`),
not the first N in file order (those share one task group, where no task-disjoint CV exists).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import rankdata
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

POSITIVE, NEGATIVE = "T_ok", "T_wrong"  # applicable (1) vs inapplicable (0)
PROBE_BUCKETS: tuple[str, ...] = (POSITIVE, NEGATIVE)
DEFAULT_FOLDS = 5
DEFAULT_C = 1.0
DEFAULT_PERMUTATIONS = 20
DEFAULT_RESAMPLES = 1000


@dataclass(frozen=True)
class ProbeSettings:
    folds: int = DEFAULT_FOLDS
    C: float = DEFAULT_C
    permutations: int = DEFAULT_PERMUTATIONS
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    max_iter: int = 2000


def labels(buckets: Sequence[str]) -> np.ndarray:
    """1 for T_ok (applicable), 0 for T_wrong; other buckets are an error."""
    unknown = sorted(set(buckets) - set(PROBE_BUCKETS))
    if unknown:
        raise ValueError(f"the applicability probe uses {PROBE_BUCKETS} only, got {unknown}")
    return np.array([bucket == POSITIVE for bucket in buckets], dtype=int)


def probe_pipeline(C: float = DEFAULT_C, max_iter: int = 2000, seed: int = 0) -> Pipeline:
    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter, random_state=seed))


def grouped_folds(y: np.ndarray, groups: Sequence[str], n_splits: int = DEFAULT_FOLDS, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Task-disjoint stratified folds (train, test) index arrays.

    ``n_splits`` is lowered to the number of task groups holding each class, so that every
    training fold can contain both classes. Fewer than 2 such groups: no folds (empty list).
    """
    y = np.asarray(y)
    groups = np.asarray(groups)
    per_class = min(len(set(groups[y == c])) for c in (0, 1)) if len(set(y.tolist())) == 2 else 0
    n_splits = min(n_splits, per_class, len(set(groups.tolist())))
    if n_splits < 2:
        return []
    splitter = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    return [(train, test) for train, test in splitter.split(np.zeros(len(y)), y, groups)]


def out_of_fold_scores(X: np.ndarray, y: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]], *, C: float = DEFAULT_C, max_iter: int = 2000, seed: int = 0) -> np.ndarray:
    """Decision-function scores of each item from the probe trained without its fold."""
    scores = np.full(len(y), np.nan)
    for train, test in folds:
        if len(set(y[train].tolist())) < 2:  # cannot happen with grouped_folds' n_splits, kept as a guard
            scores[test] = 0.0
            continue
        model = probe_pipeline(C, max_iter, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(X[train], y[train])
        scores[test] = model.decision_function(X[test])
    return scores


def auc(y: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the Mann–Whitney rank formula (ties count one half; equals
    ``sklearn.metrics.roc_auc_score``, checked in the tests, without its per-call overhead, which
    dominates thousands of bootstrap resamples). NaN scores are dropped; one class: NaN."""
    ok = np.isfinite(scores)
    y, scores = np.asarray(y)[ok].astype(bool), np.asarray(scores, dtype=float)[ok]
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def group_bootstrap_auc(y: np.ndarray, scores: np.ndarray, groups: Sequence[str], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile CI of the pooled AUC, resampling task groups with replacement."""
    groups = np.asarray(groups)
    members = [np.flatnonzero(groups == g) for g in dict.fromkeys(groups.tolist())]
    if len(members) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        index = np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])
        value = auc(y[index], scores[index])
        if np.isfinite(value):
            values.append(value)
    if not values:
        return float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha))


def permute_within_groups(y: np.ndarray, groups: Sequence[str], rng: np.random.Generator) -> np.ndarray:
    """Labels shuffled inside each task group (group composition preserved)."""
    y = np.asarray(y).copy()
    groups = np.asarray(groups)
    for g in dict.fromkeys(groups.tolist()):
        index = np.flatnonzero(groups == g)
        y[index] = y[rng.permutation(index)]
    return y


def probe_layer(X: np.ndarray, y: np.ndarray, groups: Sequence[str], settings: ProbeSettings = ProbeSettings(), *, layer_seed: int = 0) -> dict[str, Any]:
    """AUC (with CI) and shuffled-label baseline of one layer's features ``X [n, d]``."""
    y = np.asarray(y, dtype=int)
    folds = grouped_folds(y, groups, settings.folds, settings.seed)
    base = {"n": len(y), "n_pos": int(y.sum()), "n_neg": int(len(y) - y.sum()), "n_groups": len(set(groups)), "n_folds": len(folds)}
    if not folds:
        nan = float("nan")
        return {**base, "auc": nan, "low": nan, "high": nan, "null_mean": nan, "null_low": nan, "null_high": nan, "p_perm": nan,
                "note": "fewer than 2 task groups per class: no task-disjoint CV"}
    kw = dict(C=settings.C, max_iter=settings.max_iter, seed=settings.seed)
    scores = out_of_fold_scores(X, y, folds, **kw)
    value = auc(y, scores)
    low, high = group_bootstrap_auc(y, scores, groups, resamples=settings.resamples, seed=settings.seed + layer_seed)
    rng = np.random.default_rng([settings.seed, layer_seed, 1])
    null = []
    for _ in range(settings.permutations):
        shuffled = permute_within_groups(y, groups, rng)
        null_folds = grouped_folds(shuffled, groups, settings.folds, settings.seed)
        null.append(auc(shuffled, out_of_fold_scores(X, shuffled, null_folds, **kw)) if null_folds else float("nan"))
    null = np.asarray([v for v in null if np.isfinite(v)])
    if len(null):
        null_stats = {"null_mean": float(null.mean()), "null_low": float(np.quantile(null, 0.025)), "null_high": float(np.quantile(null, 0.975)),
                      "p_perm": float((1 + np.sum(null >= value)) / (1 + len(null)))}
    else:
        null_stats = {"null_mean": float("nan"), "null_low": float("nan"), "null_high": float("nan"), "p_perm": float("nan")}
    return {**base, "auc": value, "low": low, "high": high, **null_stats, "n_permutations": len(null), "note": ""}


# ------------------------------------------------------------------------------------- features
def feature_key(record: Mapping[str, Any]) -> str:
    """Content key of a prompt's decision-row residual: its token ids and decision row."""
    digest = hashlib.sha256()
    digest.update(np.asarray(record["input_ids"], dtype=np.int64).tobytes())
    digest.update(str(sorted(record["query_rows"])).encode())
    return digest.hexdigest()[:24]


def residual_features(session: Any, record: Mapping[str, Any]) -> np.ndarray:
    """``[n_layers + 1, d_model]`` float32 residual stream at the record's decision row."""
    result = session.run(record["input_ids"], [record["decision_index"]], record_residual=True)
    residual = result.conditions[0].residual
    if residual is None:
        raise RuntimeError("the engine returned no residual stream")
    return residual.float().numpy()


class FeatureCache:
    """``.npy`` residuals by :func:`feature_key` in one folder (written atomically)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.npy"

    def __contains__(self, key: str) -> bool:
        return self.path(key).is_file()

    def load(self, key: str) -> np.ndarray:
        return np.load(self.path(key))

    def save(self, key: str, value: np.ndarray) -> None:
        tmp = self.root / f".{key}.tmp.npy"
        np.save(tmp, np.asarray(value, dtype=np.float32))
        tmp.replace(self.path(key))


# ------------------------------------------------------------------------------------- the analysis
NAME = "linear"
FIGURE = "fig10_linear_probe"


def add_arguments(parser: Any) -> None:
    from probes.analysis import add_common_arguments, configs_arg
    from probes.configs import PAPER_CONFIGS

    add_common_arguments(parser, k_max=4, buckets=PROBE_BUCKETS)
    parser.add_argument("--configs", type=configs_arg, default=list(PAPER_CONFIGS),
                        help=f"comma-separated memory configurations (default: {','.join(PAPER_CONFIGS)})")
    group = parser.add_argument_group("linear probe")
    group.add_argument("--folds", type=int, default=DEFAULT_FOLDS, help=f"task-disjoint CV folds (default: {DEFAULT_FOLDS}; lowered to the task groups per class)")
    group.add_argument("--C", type=float, default=DEFAULT_C, help=f"inverse L2 strength of the logistic regression (default: {DEFAULT_C})")
    group.add_argument("--permutations", type=int, default=10, help="shuffled-label (within task group) refits per layer (default: 10)")
    group.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help=f"task-group bootstrap resamples of the AUC CI (default: {DEFAULT_RESAMPLES})")


def spread_limit(items: Sequence[Any], limit: int) -> list[Any]:
    """``limit`` items per bucket taken round-robin over task groups (first item of every group,
    then the second, ...), so that a small run still has several task groups per class."""
    kept: list[Any] = []
    for bucket in dict.fromkeys(item.bucket for item in items):
        by_group: dict[str, list[Any]] = {}
        for item in items:
            if item.bucket == bucket:
                by_group.setdefault(item.task_group, []).append(item)
        queues = list(by_group.values())
        chosen: list[Any] = []
        depth = 0
        while len(chosen) < limit and any(depth < len(q) for q in queues):
            chosen += [q[depth] for q in queues if depth < len(q)][: limit - len(chosen)]
            depth += 1
        kept += chosen
    order = {item.id: i for i, item in enumerate(items)}
    return sorted(kept, key=lambda item: order[item.id])


def apply_spread_limit(analysis: Any) -> None:
    """Keep T_ok / T_wrong items and replace the shared ``--limit`` (the first N items of each
    bucket, usually one task group) by :func:`spread_limit` over the same filters: task-disjoint CV
    needs at least two task groups per class."""
    from probes.analysis import AnalysisError
    from probes.cli import select_items

    args = analysis.args
    items = [item for item in analysis.items if item.bucket in PROBE_BUCKETS]
    if args.limit is not None:
        limit, args.limit = args.limit, None
        try:
            pool = [item for item in select_items(analysis.dataset, args) if item.bucket in PROBE_BUCKETS]
        finally:
            args.limit = limit
        items = spread_limit(pool, limit)
        analysis.builder.warm(items)
    if not items:
        raise AnalysisError(f"linear: no {' / '.join(PROBE_BUCKETS)} items selected (the probe contrasts applicable vs inapplicable states)")
    analysis.items = tuple(items)


def collect_features(analysis: Any) -> tuple[Any, FeatureCache]:
    """Residuals of every (item, config, k) prompt; returns (index rows, feature cache)."""
    from probes.analysis import ROW_FIELDS, Job, run_jobs
    from probes.results import load_results

    configs = list(analysis.args.configs)
    cache = FeatureCache(analysis.out_dir / "linear_features")
    jobs = [Job(item, config, k, analysis.fmt, ("residual",))
            for item in analysis.items for k in range(analysis.args.k_max + 1) for config in configs]

    def scorer(record: dict[str, Any], job: Any) -> list[dict[str, Any]]:
        key = feature_key(record)
        if key not in cache:
            cache.save(key, residual_features(analysis.session, record))
        row = {f: record.get(f) for f in ROW_FIELDS}
        row.update(condition="residual", feature_key=key, label=int(record["bucket"] == POSITIVE),
                   decision_index=record["decision_index"], n_tokens=len(record["input_ids"]))
        return [row]

    store = analysis.store(configs=configs, row="decision", features="residual stream [layer+1, d_model]",
                           limit_mode="spread over task groups")
    run_jobs(analysis, store, jobs, scorer)
    return load_results(store.path), cache


def probe_all(analysis: Any, index: Any, cache: FeatureCache, settings: ProbeSettings) -> Any:
    """Probe every (config, k, layer); rows appended to ``linear_probe.jsonl`` (resumable)."""
    import pandas as pd
    from tqdm.auto import tqdm

    from probes.results import ResultsStore, load_results

    store = ResultsStore(analysis.out_dir / "linear_probe.jsonl", "linear_probe",
                         analysis.config(configs=list(analysis.args.configs), limit_mode="spread over task groups",
                                         probe=asdict_settings(settings)),
                         overwrite=analysis.args.overwrite)
    cells = [(config, int(k), frame.sort_values("item_id")) for (config, k), frame in index.groupby(["config", "k"], sort=True)]
    n_layers = cache.load(index["feature_key"].iloc[0]).shape[0]
    memo: dict[tuple, dict[str, Any]] = {}  # identical feature sets (k = 0) are probed once
    with tqdm(total=len(cells) * n_layers, desc="linear probes", unit="layer", dynamic_ncols=True) as bar:
        for config, k, frame in cells:
            keys = [f"{config}|k{k}|L{layer}" for layer in range(n_layers)]
            if all(key in store for key in keys):
                bar.update(n_layers)
                continue
            features = np.stack([cache.load(key) for key in frame["feature_key"]])  # [n, L+1, d]
            y = frame["label"].to_numpy(dtype=int)
            groups = frame["task_group"].tolist()
            signature = (tuple(frame["feature_key"]), tuple(y.tolist()))
            rows = []
            for layer, key in enumerate(keys):
                if key not in store:
                    memo_key = (signature, layer)
                    if memo_key not in memo:
                        memo[memo_key] = probe_layer(features[:, layer, :], y, groups, settings, layer_seed=layer)
                    rows.append({"key": key, "config": config, "k": k, "format": analysis.fmt, "layer": layer,
                                 "d_model": int(features.shape[2]), **memo[memo_key]})
                bar.update(1)
            store.append(rows)
    return load_results(store.path) if store.path.stat().st_size else pd.DataFrame()


def asdict_settings(settings: ProbeSettings) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(settings)


SUMMARY_COLUMNS = ["config", "k", "layer", "auc", "low", "high", "null_mean", "null_low", "null_high", "p_perm",
                   "n", "n_pos", "n_neg", "n_groups", "n_folds", "note"]


def compute(analysis: Any) -> Any:
    """Features, probes and the summary table (also written to ``linear_summary.csv``)."""
    apply_spread_limit(analysis)
    a = analysis.args
    settings = ProbeSettings(folds=a.folds, C=a.C, permutations=a.permutations, resamples=a.resamples, seed=a.seed)
    index, cache = collect_features(analysis)
    table = probe_all(analysis, index, cache, settings)[SUMMARY_COLUMNS].sort_values(["config", "k", "layer"])
    analysis.out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(analysis.out_dir / f"{NAME}_summary.csv", index=False)
    return table


def figure(analysis: Any, table: Any, figures_dir: Path) -> list[Path]:
    from probes import plots
    from probes.analysis import provenance

    a = analysis.args
    note = (f"{provenance(analysis).replace(f' · margin: {a.margin_variant}', '')}\n"
            f"AUC of out-of-fold scores, StratifiedGroupKFold by task group (≤ {a.folds} folds), "
            f"StandardScaler + L2 logistic regression (C = {a.C}); band: 95% bootstrap CI over task groups; "
            f"grey: labels shuffled within task groups ({a.permutations} refits, mean and 95% range)")
    plots.style()
    return plots.save_figure(plots.fig10_linear_probe(table, note), figures_dir, FIGURE)


def best_layers(table: Any) -> Any:
    """Per configuration and k: the best layer's AUC (CI), the mean AUC over layers and the null."""
    import pandas as pd

    out = []
    for (config, k), frame in table.groupby(["config", "k"], sort=True):
        finite = frame[frame["auc"].notna()]
        if not len(finite):
            continue
        best = finite.loc[finite["auc"].idxmax()]
        out.append({"config": config, "k": int(k), "best_layer": int(best["layer"]), "auc": best["auc"], "low": best["low"],
                    "high": best["high"], "shuffled": best["null_mean"], "p_perm": best["p_perm"],
                    "mean_auc_over_layers": finite["auc"].mean(), "n": int(best["n"]), "n_groups": int(best["n_groups"])})
    return pd.DataFrame(out)


def report_section(analysis: Any, figures_dir: Path) -> Any:
    from probes.analysis import Comparison, ReportSection, markdown_table

    table = compute(analysis)
    paths = figure(analysis, table, figures_dir)
    best = best_layers(table)
    k_max = int(table["k"].max())
    body = ("Task-disjoint (StratifiedGroupKFold by task group) logistic-regression probes for applicability "
            f"(T_ok vs T_wrong) on the decision-row residual stream; best layer per configuration and k "
            f"(shuffled = labels permuted within task groups). The best-layer AUC is selected post hoc: "
            f"compare it with the shuffled baseline at that layer.\n\n{markdown_table(best) if len(best) else '(no AUC: too few task groups)'}")
    comparisons = [Comparison(f"Fig. 10: best-layer probe AUC, {config} (k = {k_max}; paper: no stable high-AUC vector)",
                              float(best[(best["config"] == config) & (best["k"] == k_max)]["auc"].iloc[0]), None, "AUC")
                   for config in ("proc", "basm") if len(best) and ((best["config"] == config) & (best["k"] == k_max)).any()]
    return ReportSection(NAME, "Fig. 10 — residual-stream linear probe control (`linear`)", paths, body, comparisons, table)


def run(args: Any) -> int:
    from probes.analysis import open_analysis

    analysis = open_analysis(args, NAME)
    table = compute(analysis)
    print_summary(table)
    if analysis.args.figure:
        print("figure:", ", ".join(map(str, figure(analysis, table, analysis.out_dir / "figures"))))
    return 0


def print_summary(table: Any) -> None:
    for (config, k), frame in table.groupby(["config", "k"], sort=True):
        if frame["auc"].notna().any():
            best = frame.loc[frame["auc"].idxmax()]
            print(f"{config:>16} k={k}: best layer {int(best['layer'])} AUC {best['auc']:.3f} [{best['low']:.3f}, {best['high']:.3f}] "
                  f"(shuffled {best['null_mean']:.3f}, p = {best['p_perm']:.3g}); mean over layers {frame['auc'].mean():.3f}; "
                  f"n = {int(best['n'])} items / {int(best['n_groups'])} task groups, {int(best['n_folds'])} folds")
        else:
            print(f"{config:>16} k={k}: no AUC ({frame['note'].iloc[0]})")
