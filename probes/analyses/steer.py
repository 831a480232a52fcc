"""``steer``: is the readable direction causal? Steer the residual stream at the decision row and read the choice.

The linear probes read applicability from the decision-row residual stream; this analysis adds a direction
there and asks whether the tool choice follows. Everything is estimated on the **train** task groups (the
even positions of the sorted task groups of the selected tool-correct T_ok / T_wrong items,
:func:`probes.analyses.heads.split_groups`) and tested on the **held-out** ones (the odd positions).

1. **Directions**, per decoder layer L, from the residual stream at the decision row (the output of layer
   L, before the final norm; :func:`probes.analyses.linear.residual_features`, cached beside ``linear``'s),
   each a unit vector oriented so that α > 0 is expected to *lower* the T_wrong margin (toward the correct
   tool; "the skill does not apply here"):

   - ``applicability``: mean(T_wrong) − mean(T_ok) of the BASM prompts (``--direction-config``) of the
     train items (the headline, chosen before any run);
   - ``config_difference``: mean(BASM) − mean(Proc. Skill) on the same train T_wrong items (what the
     boundary fields add to the stream);
   - ``probe``: the weight vector of the L2 logistic probe (``linear``'s estimator, T_wrong = 1) on the
     standardised train features, mapped back to the residual basis (w / σ);
   - ``unembedding``: the item's own tool-choice readout, γ ⊙ (W_U[correct] − W_U[wrong]) at the tokens
     where the correct name parts from the first wrong one (γ: the final norm's weight), estimated on no
     item (the logit lens's direction, read off the weights);
   - controls: ``shuffled`` (``applicability`` with the bucket labels permuted within task groups, seeded)
     and ``random`` (``--random-draws`` Gaussian directions per layer, seeded by (seed, layer, draw)).

2. **Intervention** on the held-out items: α · s_L · d̂ added to the output of layer L (``--window`` layers
   from L, each with its own direction and scale), s_L = the mean residual norm at the decision row over the
   train prompts (the layer's residual norm), α on the a-priori grid ``--alpha`` (both signs), at the decision
   row only (``decision``: the decision row and the candidate continuation rows, so that the row deciding
   between names that share a prefix is steered too) and at every row from the call's opening row
   (``call``). The clean prefix is computed once per prompt; every condition is a branch of the cached run
   (probes.engine.session.Steering), ``--chunk`` conditions per engine call.

3. **Outcomes** per record and condition (probes.scoring.score.score_record with ``actions=True``): every
   margin variant, the greedy top action among every candidate (whole-path log-probabilities), and
   ``kl_clean``, KL(clean ‖ steered) of the next-token distribution at the decision row, which tells a
   steering that flips the choice from one that breaks the model. ``--generate headline`` (the default) also lets
   the clean and the steered model write their call, greedily, read by the suite's call parser (lenient;
   :func:`probes.analyses.calls.call_row`), at α = :data:`HEADLINE_ALPHA` with ``call`` rows (the vector added from
   the call's opening row on, every generated token included: :func:`probes.engine.generate.steered_greedy_generate`),
   for every direction but the random ones: the ranking's top action is checked against what the model writes.
   Statistics: :mod:`probes.scoring.steer_stats`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from sklearn.preprocessing import StandardScaler

from probes.analyses import register
from probes.analyses.base import Analysis, ReportSection
from probes.analyses.heads import split_groups
from probes.analyses.jobs import Job, run_jobs
from probes.analyses.calls import MAX_NEW_TOKENS, call_row, generation_prompt
from probes.analyses.linear import DEFAULT_C, FEATURES, FeatureCache, feature_key, fit_logistic, residual_features
from probes.analyses.linear import NAME as LINEAR
from probes.analyses.option_system import depth_option, option
from probes.analyses.parallel import on_rank_zero
from probes.analyses.run_context import AnalysisError, RunContext, provenance
from probes.core.files import remove_tree
from probes.data.dataset import ABSTAIN, Item
from probes.engine.generate import greedy_generate, steered_greedy_generate, stop_token_ids
from probes.engine.session import EngineSession, Steering
from probes.prompts.record import PromptRecord
from probes.reporting.layout import analysis_folder
from probes.reporting.results import load_results
from probes.scoring.circuit_stats import held_out_check
from probes.scoring.margins import candidates_from_record, shared_prefix
from probes.scoring.score import row_fields, score_record
from probes.scoring import steer_stats
from probes.scoring.steer_stats import span_label
from probes.scoring.stats import permute_within_groups
from probes.reporting import plots
from probes.reporting.plots import BUCKET_ORDER, CONFIG_ORDER, PALETTE, bucket_label, ci_errors, footnote, mark_no_ci, ordered, style
from probes.reporting.markdown import markdown_table

NAME = "steer"
DIRECTIONS = ("applicability", "config_difference", "probe", "unembedding")
CONTROLS = ("shuffled", "random")
HEADLINE_DIRECTION = "applicability"  # the claims' direction, chosen before any run
ROWS_MODES = ("decision", "call")
DEFAULT_ALPHAS = ("-1", "-0.5", "-0.25", "-0.125", "0.125", "0.25", "0.5", "1")
HEADLINE_ALPHA = 0.5  # the claims' α, chosen before any run
DEFAULT_RANDOM_DRAWS = 20
DEFAULT_CHUNK = 64
SESOI = 0.25  # logits: the knockout analysis's smallest effect of interest, for the margin claims
OK_SESOI = 0.1  # share: a T_ok correct-call rate lowered by less than 10 points is "not reduced"
BUCKETS = ("T_wrong", "T_ok")
FIGURE = "fig23_steer"
GENERATE = ("headline", "none")


# ----------------------------------------------------------------------------- items and names
def task_family(item: Item) -> str:
    """The task family a per-family statistic groups by: the item's scenario where the dataset has one, else its domain."""
    return item.scenario or item.domain


def tested_items(items: Sequence[Item]) -> tuple[list[Item], list[str]]:
    """The tool-correct T_ok / T_wrong items (a tool-choice margin exists) and the ids of the abstention-correct ones."""
    pool = [i for i in items if i.bucket in BUCKETS]
    return [i for i in pool if i.correct_action != ABSTAIN], [i.id for i in pool if i.correct_action == ABSTAIN]


def parse_numbers(values: Sequence[str], kind: type, flag: str) -> tuple:
    """``--layer`` / ``--alpha`` values (given as strings) as numbers, or a message naming the bad one."""
    out = []
    for value in values:
        try:
            out.append(kind(value))
        except ValueError:
            raise AnalysisError(f"steer: {flag} {value!r} is not {'an integer' if kind is int else 'a number'}") from None
        if kind is float and not math.isfinite(out[-1]):
            raise AnalysisError(f"steer: {flag} {value!r} must be finite")
    if len(set(out)) != len(out):
        raise AnalysisError(f"steer: {flag} repeats a value: {list(values)}")
    return tuple(out)


@dataclass(frozen=True)
class Cell:
    """One steering condition: a direction (draw: the random draw, else -1) at layers ``layer .. layer + window − 1``,
    at ``rows_mode`` rows, scaled by α."""

    direction: str
    draw: int
    layer: int
    window: int
    rows_mode: str
    alpha: float

    @property
    def name(self) -> str:
        kind = f"random{self.draw}" if self.direction == "random" else self.direction
        return f"{kind}|L{self.layer}+{self.window}|{self.rows_mode}|{self.alpha:+g}"

    def fields(self) -> dict[str, Any]:
        return {"direction": self.direction, "draw": self.draw, "layer": self.layer, "window": self.window,
                "rows_mode": self.rows_mode, "alpha": self.alpha}


def cells(directions: Sequence[str], layers: Sequence[int], window: int, rows_modes: Sequence[str], alphas: Sequence[float],
          draws: int) -> list[Cell]:
    """Every steering condition of a record, in a fixed order (the store's keys)."""
    kinds = [(d, -1) for d in (*directions, "shuffled")] + [("random", i) for i in range(draws)]
    return [Cell(d, i, layer, window, mode, a) for layer in layers for mode in rows_modes for a in alphas for d, i in kinds]


# ----------------------------------------------------------------------------- directions
@dataclass(frozen=True)
class Directions:
    """Unit directions per name, [n_layers, d_model] (``unembedding`` is per item: not here), the scale
    s_L per layer, the train task groups they were estimated on and the random draws' seed."""

    vectors: Mapping[str, np.ndarray]
    scale: np.ndarray
    train_groups: tuple[str, ...]
    n_train: Mapping[str, int]
    seed: int

    def digest(self) -> str:
        """A content digest of every direction and scale (recorded in the held-out rows' header)."""
        h = hashlib.sha256(self.scale.astype(np.float32).tobytes())
        for name in sorted(self.vectors):
            h.update(name.encode())
            h.update(self.vectors[name].astype(np.float32).tobytes())
        return h.hexdigest()[:16]

    def random(self, layer: int, draw: int) -> np.ndarray:
        """The unit random direction of (layer, draw), seeded by (seed, layer, draw): the same in every run and record."""
        width = next(iter(self.vectors.values())).shape[1]
        v = np.random.default_rng([self.seed, layer, draw]).standard_normal(width)
        return v / np.linalg.norm(v)


def _unit(v: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    if not np.all(norms > 0):
        raise AnalysisError("steer: a direction is zero at some layer (the two means coincide): nothing to steer along")
    return v / norms


def estimate_directions(features: pd.DataFrame, stack: np.ndarray, *, seed: int, C: float = DEFAULT_C) -> Directions:
    """The directions of the module docstring from the train rows ``features`` (config, bucket, item_id,
    task_group per row) and their residuals ``stack`` [row, n_layers + 1, d_model] (embeddings first)."""
    x = stack[:, 1:, :].astype(np.float64)  # decoder layer outputs: [row, L, d]
    basm = (features["config"] == "basm").to_numpy()
    wrong = (features["bucket"] == "T_wrong").to_numpy()
    ok = (features["bucket"] == "T_ok").to_numpy()
    if not (basm & wrong).any() or not (basm & ok).any():
        raise AnalysisError("steer: the train split has no BASM T_wrong or no BASM T_ok prompt: no applicability direction")
    out = {"applicability": _unit(x[basm & wrong].mean(0) - x[basm & ok].mean(0))}
    proc = (features["config"] == "proc").to_numpy() & wrong
    if proc.any():
        both = sorted(set(features.loc[basm & wrong, "item_id"]) & set(features.loc[proc, "item_id"]))
        pick = features["item_id"].isin(both).to_numpy()
        out["config_difference"] = _unit(x[basm & wrong & pick].mean(0) - x[proc & pick].mean(0))
    sel = basm & (wrong | ok)
    y = wrong[sel].astype(int)
    probe = np.zeros(x.shape[1:])
    for layer in range(x.shape[1]):
        scaler = StandardScaler().fit(x[sel, layer])
        w, _ = fit_logistic(scaler.transform(x[sel, layer]), y[None, :], C=C)
        probe[layer] = w[0] / scaler.scale_  # ∂ score / ∂ x: the probe's direction in the residual basis
    out["probe"] = _unit(probe)
    groups = features.loc[sel, "task_group"].tolist()
    shuffled = permute_within_groups(wrong[sel].astype(int), groups, np.random.default_rng([seed, 7]))
    xs = x[sel]
    if shuffled.all() or not shuffled.any():
        raise AnalysisError("steer: shuffling the bucket labels within task groups left one class (too few train items)")
    out["shuffled"] = _unit(xs[shuffled == 1].mean(0) - xs[shuffled == 0].mean(0))
    scale = np.linalg.norm(x[basm], axis=-1).mean(0)  # [L]
    counts = {"basm_T_wrong": int((basm & wrong).sum()), "basm_T_ok": int((basm & ok).sum()), "proc_T_wrong": int(proc.sum())}
    return Directions(out, scale, tuple(sorted(set(features["task_group"]))), counts, seed)


def unembedding_direction(session: EngineSession, record: PromptRecord) -> np.ndarray:
    """γ ⊙ (W_U[correct] − W_U[wrong]) at the tokens where the correct name parts from the record's first wrong one."""
    cands = candidates_from_record(record)
    correct = next((c for c in cands if c.role == "correct" and not c.is_abstention), None)
    wrong = next((c for c in cands if c.role == "wrong" and not c.is_abstention), None)
    if correct is None or wrong is None:
        raise AnalysisError(f"steer: {record.record_id}: no correct and wrong tool to read a tool-choice direction from")
    s = shared_prefix(correct.token_ids, wrong.token_ids)
    if s >= min(len(correct.token_ids), len(wrong.token_ids)):
        raise AnalysisError(f"steer: {record.record_id}: the correct and wrong names never part (no deciding token)")
    model = session.model
    # the two rows only: converting the whole unembedding to float64 per record costs vocabulary × d_model × 8 bytes
    rows = model.get_output_embeddings().weight.detach()[[correct.token_ids[s], wrong.token_ids[s]]].double()
    norm = model.base_model.norm.weight.detach().double()
    v = (norm * (rows[0] - rows[1])).cpu().numpy()
    return _unit(v[None])[0]


def steering(cell: Cell, directions: Directions, record: PromptRecord, unembedding: np.ndarray | None) -> Steering:
    """The engine condition of ``cell`` on ``record``: per layer of the window α · s_L · d̂_L."""
    vectors = {}
    for layer in range(cell.layer, cell.layer + cell.window):
        if cell.direction == "random":
            d = directions.random(layer, cell.draw)
        elif cell.direction == "unembedding":
            d = unembedding
        else:
            d = directions.vectors[cell.direction][layer]
        vectors[layer] = torch.as_tensor(cell.alpha * float(directions.scale[layer]) * d, dtype=torch.float32)
    rows = (int(record.decision_index),) if cell.rows_mode == "decision" else None
    return Steering(cell.name, vectors, rows=rows, continuation=True)


# ----------------------------------------------------------------------------- collection
def train_features(ctx: RunContext, items: Sequence[Item], configs: Sequence[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """The decision-row residuals of the train prompts (``steer_train.jsonl`` indexes ``linear_features``' cache)."""
    sub = replace(ctx, name=f"{NAME}_train", items=tuple(items), _score_cache={})
    root = analysis_folder(ctx.out_dir, LINEAR) / FEATURES
    if ctx.options.overwrite:
        on_rank_zero(lambda: remove_tree(root))
    cache = FeatureCache(root)
    model = f"{ctx.model_fingerprint['weights']}|{ctx.options.dtype}"
    jobs = [Job(item, config, ctx.options.depth, ctx.fmt, ("residual",)) for item in items for config in configs
            if config == "basm" or item.bucket == "T_wrong"]
    store = sub.store(k=ctx.options.depth, row="decision", features="residual stream [layer+1, d_model]")

    def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
        key = feature_key(record, model)
        if key not in cache:
            cache.save(key, residual_features(ctx.session, record))
        return [{**row_fields(record), "condition": "residual", "feature_key": key, "half": "train"}]

    run_jobs(sub, store, jobs, scorer)
    rows = load_results(store.path)
    return rows, np.stack([cache.load(key) for key in rows["feature_key"]])


def directions_of(ctx: RunContext, train: Sequence[Item], train_groups: set[str], heldout_groups: set[str]) -> Directions:
    """The directions estimated on the train items (their residuals resume from the cache: a second call runs no forward)."""
    features, stack = train_features(ctx, train, ("basm", "proc") if "config_difference" in ctx.options.directions else ("basm",))
    held_out_check(train_groups, heldout_groups, features["task_group"])
    return estimate_directions(features, stack, seed=ctx.options.seed)


def generated(cell: Cell | None) -> bool:
    """Whether ``--generate headline`` lets the model write its call under ``cell`` (None: the clean run)."""
    return cell is None or (cell.direction != "random" and cell.rows_mode == "call" and cell.alpha == HEADLINE_ALPHA)


def generated_call(ctx: RunContext, record: PromptRecord, steering: Steering | None) -> dict[str, Any]:
    """The model's greedy reply to ``record`` (clean, or with ``steering``'s vectors added from the call's first row on),
    read by the call parser: its lenient action and outcome and the text."""
    session = ctx.session
    stops = stop_token_ids(session.model, session.tokenizer)
    prompt = generation_prompt(record)
    if steering is None:
        new, stopped = greedy_generate(session.model, prompt, stops, MAX_NEW_TOKENS)
    else:
        new, stopped = steered_greedy_generate(session.model, prompt, stops, MAX_NEW_TOKENS, vectors=steering.vectors,
                                               start=min(record.query_rows))
    row = call_row(record, new, stopped, session.tokenizer.decode(new, skip_special_tokens=False))
    return {"generated_action": row["lenient_action"], "generated_outcome": row["lenient_outcome"], "generation": row["generation"]}


def steer_scorer(ctx: RunContext, directions: Directions, plan: Sequence[Cell]) -> Any:
    """Per held-out record: the clean run and every cell of ``plan``, ``--chunk`` conditions per engine call
    (the prefix is computed once and reused from the cache by the later calls); with ``--generate headline`` the
    generated calls of :func:`generated`'s cells."""
    a = ctx.options
    families = {item.id: task_family(item) for item in ctx.items}

    def scorer(record: PromptRecord, job: Job) -> list[dict[str, Any]]:
        unembedding = unembedding_direction(ctx.session, record) if "unembedding" in a.directions else None
        conditions = [steering(c, directions, record, unembedding) for c in plan]
        by_name = {c.name: c for c in plan}
        rows: list[dict[str, Any]] = []
        for start in range(0, max(len(conditions), 1), a.chunk):
            scored = score_record(ctx.session, record, conditions[start:start + a.chunk], variant=ctx.variant, actions=True)
            rows += scored if not rows else scored[1:]  # the clean run once
        clean = rows[0]
        steerings = {c.name: c for c in conditions}
        for row in rows:
            cell = by_name.get(row["condition"])
            if a.generate == "headline" and generated(cell):
                row.update(generated_call(ctx, record, steerings[cell.name] if cell else None))
            row.update(**(cell.fields() if cell else {"direction": "", "draw": -1, "layer": -1, "window": 0, "rows_mode": "", "alpha": 0.0}),
                       scale=float(np.mean([directions.scale[layer] for layer in range(cell.layer, cell.layer + cell.window)])) if cell else 0.0,
                       family=families[job.item.id], half="heldout", clean_margin=clean["margin"], clean_top_role=clean["top_role"])
        return rows

    return scorer


@dataclass
class SteerSummary:
    """Everything the tables, figure, report and claims read."""

    dose: pd.DataFrame
    band: pd.DataFrame
    families: pd.DataFrame
    consistency: pd.DataFrame
    directions: pd.DataFrame
    generation: pd.DataFrame
    claims: list[Any]
    messages: list[str]
    note: str


@register("steer", order=87)
@dataclass(kw_only=True)
class Steer(Analysis):
    """Steering: add a direction read on train items (applicability, BASM − Proc., the probe's, the unembedding) to the decision-row residual stream of held-out items; margins, flips and KL against random directions."""

    min_depth: ClassVar[int] = 1

    buckets: tuple[str, ...] | None = option(BUCKETS, "keep only these buckets (directions contrast T_ok and T_wrong; T_ok is the "
                                             "harm control)", flag="--bucket", repeat=True, choices=("T_ok", "T_wrong", "T_repair"),
                                             group="items")
    k: int | None = depth_option()
    configs: tuple[str, ...] = option(("proc", "basm"), "comma-separated memory configurations whose held-out prompts are steered",
                                      names=("proc", "basm", "app", "base"), minimum=1)
    directions: tuple[str, ...] = option(DIRECTIONS, "comma-separated directions (the shuffled-label and random controls always run)",
                                         names=DIRECTIONS, minimum=1, group="steer")
    layers: tuple[str, ...] | None = option(None, "first decoder layer of a steered window (repeat: --layer 2 --layer 5; default: every layer)",
                                            flag="--layer", repeat=True, group="steer")
    window: int = option(1, "layers steered from each --layer (each with its own direction and scale)", type=int, minimum=1, group="steer")
    alphas: tuple[str, ...] = option(DEFAULT_ALPHAS, "α grid, fixed before the run, both signs (repeat: --alpha 0.5 --alpha -0.5); the "
                                     "vector added is α · (the layer's mean residual norm) · unit direction", flag="--alpha", repeat=True,
                                     group="steer")
    rows_modes: tuple[str, ...] = option(ROWS_MODES, "where the vector is added: decision (the decision row and the name's rows), "
                                         "call (every row from the call's opening row)", names=ROWS_MODES, minimum=1, group="steer")
    random_draws: int = option(DEFAULT_RANDOM_DRAWS, "random directions per layer (same norm and α; at least 2: the band)", type=int,
                               minimum=1, group="steer")
    generate: str = option("headline", "headline: the clean and steered models also write their call (α = 0.5, call rows, every "
                           "direction but the random ones), read by the call parser; none: the candidate ranking only", choices=GENERATE,
                           group="steer")
    chunk: int = option(DEFAULT_CHUNK, "steering conditions per engine call (memory: chunk × branch rows × d_model)", type=int, minimum=1,
                        group="steer")

    value_neutral: ClassVar[frozenset[str]] = Analysis.value_neutral | {"chunk"}

    def plan(self, ctx: RunContext) -> list[Cell]:
        n_layers = ctx.session.n_layers
        layers = parse_numbers(self.layers, int, "--layer") if self.layers else tuple(range(n_layers - self.window + 1))
        if bad := [layer for layer in layers if not 0 <= layer <= n_layers - self.window]:
            raise AnalysisError(f"steer: --layer {bad} with --window {self.window} runs past the model's {n_layers} layers "
                                f"(first layers 0..{n_layers - self.window})")
        if ctx.options.random_draws < steer_stats.MIN_DRAWS:
            raise AnalysisError(f"steer: --random-draws {ctx.options.random_draws}: the random band and the claims need at least "
                                f"{steer_stats.MIN_DRAWS} draws (20 by default)")
        alphas = parse_numbers(self.alphas, float, "--alpha")
        if 0.0 in alphas:
            raise AnalysisError("steer: --alpha 0 is the clean run, which every record has already; leave it out")
        return cells(ctx.options.directions, layers, self.window, ctx.options.rows_modes, alphas, ctx.options.random_draws)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        if not isinstance(ctx.session, EngineSession):
            raise AnalysisError(f"steer: --backend {ctx.options.backend} runs knockouts only; steering runs on the native engine "
                                "(leave --backend out)")
        items, abstain = tested_items(ctx.items)
        if not any(i.bucket == "T_wrong" for i in items) or not any(i.bucket == "T_ok" for i in items):
            raise AnalysisError("steer: the directions contrast T_ok and T_wrong: select tool-correct items of both buckets")
        ctx.items = tuple(items)
        train_groups, heldout_groups = split_groups(i.task_group for i in items)
        train = [i for i in items if i.task_group in train_groups]
        heldout = [i for i in items if i.task_group in heldout_groups]
        if not heldout:
            raise AnalysisError("steer: fewer than two task groups selected: nothing is held out (raise --limit)")
        plan = self.plan(ctx)
        directions = directions_of(ctx, train, train_groups, heldout_groups)
        jobs = [Job(item, config, ctx.options.depth, ctx.fmt, ("baseline", *(c.name for c in plan)))
                for item in heldout for config in ctx.options.configs]
        store = ctx.store(k=ctx.options.depth, train_groups=sorted(train_groups), heldout_groups=sorted(heldout_groups),
                          excluded_abstain=abstain, directions_digest=directions.digest(), n_train=dict(directions.n_train),
                          orientation="α > 0 toward the correct tool (lower T_wrong margin)")
        run_jobs(ctx, store, jobs, steer_scorer(ctx, directions, plan))
        return load_results(store.path)

    # ------------------------------------------------------------------------------ summary
    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> SteerSummary:
        """Dose–response against the random band, per family, the claims (probes.scoring.steer_stats)."""
        a = ctx.options
        items, _ = tested_items(ctx.items)
        train_groups, heldout_groups = split_groups(i.task_group for i in items)
        if leaked := sorted(set(rows["task_group"]) - heldout_groups):
            raise AnalysisError(f"steer: rows of task groups {leaked} are not held out: the steered items must be held out")
        directions = directions_of(ctx, [i for i in items if i.task_group in train_groups], train_groups, heldout_groups)
        dose = steer_stats.dose_response(rows, seed=a.seed)
        generation = steer_stats.generation_table(rows, seed=a.seed)
        band = steer_stats.random_band(rows)
        families = steer_stats.family_table(rows, seed=a.seed)
        consistency = steer_stats.sign_consistency(dose, families)
        claimed = (rows["rows_mode"] == steer_stats.HEADLINE_ROWS) & np.isclose(rows["alpha"].astype(float), HEADLINE_ALPHA)
        claims = steer_stats.steer_claims(rows, headline_alpha=HEADLINE_ALPHA, headline_direction=HEADLINE_DIRECTION, sesoi=SESOI,
                                          ok_sesoi=OK_SESOI, seed=a.seed) if claimed.any() else []
        messages = [] if claimed.any() else [f"no claims: they read α = {HEADLINE_ALPHA:g} at {steer_stats.HEADLINE_ROWS} rows, which this "
                                             "run did not steer (the tables and the figure describe what it did)"]
        if a.generate == "headline" and not any(generated(cell) for cell in self.plan(ctx)):
            messages.append(f"written calls: the clean run's only (--generate headline writes the steered calls at α = {HEADLINE_ALPHA:g} "
                            "with call rows, which this run does not steer)")
        messages += [f"split: directions from {len(train_groups)} train task groups ({', '.join(f'{k} {v}' for k, v in directions.n_train.items())} "
                    f"prompts); {rows['record_id'].nunique()} held-out prompts of {len(heldout_groups)} task groups steered"]
        return SteerSummary(dose, band, families, consistency, direction_table(directions), generation, claims, messages, steer_note(ctx))

    def tables(self, summary: SteerSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_dose": summary.dose, f"{NAME}_random": summary.band, f"{NAME}_families": summary.families,
                f"{NAME}_consistency": summary.consistency, f"{NAME}_directions": summary.directions,
                **({f"{NAME}_generation": summary.generation} if len(summary.generation) else {})}

    def claims(self, summary: SteerSummary) -> list[Any]:
        return list(summary.claims)

    def figures(self, summary: SteerSummary, out_dir: Path) -> list[Path]:
        plots.style()
        return plots.save_figure(fig23_steer(summary.dose, summary.band, summary.note), out_dir, FIGURE) if len(summary.dose) else []

    def section(self, ctx: RunContext, summary: SteerSummary, figures: list[Path]) -> ReportSection:
        return ReportSection(NAME, "Steering along readable directions (`steer`)", figures, section_markdown(summary), [], summary,
                             list(summary.claims))

    def print_summary(self, summary: SteerSummary) -> None:
        for message in summary.messages:
            print(message)
        d = summary.dose
        head = d[(d["direction"] == HEADLINE_DIRECTION) & (d["alpha"] == HEADLINE_ALPHA) & (d["rows_mode"] == "decision")]
        for r in head.itertuples():
            print(f"{r.config} {r.bucket} L{r.layer}: Δmargin {r.delta_margin:+.3f} [{r.delta_margin_low:+.3f}, {r.delta_margin_high:+.3f}], "
                  f"correct-choice rate {r.correct_rate:.2f}, wrong → correct {r.wrong_to_correct:.2f} of {r.n_clean_wrong}, KL {r.kl:.3f} nats "
                  f"(α = {HEADLINE_ALPHA:g}, {HEADLINE_DIRECTION})")


def direction_table(directions: Directions) -> pd.DataFrame:
    """Per direction and layer: the cosine with the headline direction, the layer's scale s_L, the train counts."""
    head = directions.vectors[HEADLINE_DIRECTION]
    out = []
    for name, v in directions.vectors.items():
        for layer in range(v.shape[0]):
            out.append({"direction": name, "layer": layer, "cosine_with_applicability": float(v[layer] @ head[layer]),
                        "scale": float(directions.scale[layer]), **directions.n_train, "train_task_groups": len(directions.train_groups)})
    return pd.DataFrame(out)


def steer_note(ctx: RunContext) -> str:
    a = ctx.options
    return (f"{provenance(ctx)}\nvector α · s_L · d̂ at the output of layer L (window {a.window}); s_L = mean decision-row residual norm of the "
            f"train prompts · directions from train task groups, steered items held out · α > 0 toward the correct tool · random: "
            f"{a.random_draws} Gaussian directions per layer · claims at α = {HEADLINE_ALPHA:g}, decision rows, {HEADLINE_DIRECTION}")


def section_markdown(summary: SteerSummary) -> str:
    """The report's text: what was steered, the headline cells against the random band, the family signs."""
    lines = ["Each direction is estimated on the train task groups and added at the decision row of the held-out items; α > 0 is "
             "oriented toward the correct tool. A direction counts only against random directions of the same norm at the same α "
             "(the band), and the KL from the clean next-token distribution says whether a flip came with a broken model.", ""]
    lines += [f"- {m}" for m in summary.messages]
    d = summary.dose
    head = d[(d["alpha"] == HEADLINE_ALPHA) & (d["rows_mode"] == "decision")]
    if len(head):
        cols = [c for c in ["config", "bucket", "direction", "layer", "n_records", "delta_margin", "delta_margin_low", "delta_margin_high",
                            "correct_rate", "wrong_to_correct", "correct_to_wrong", "to_abstain", "kl"] if c in head]
        lines += ["", f"**At α = {HEADLINE_ALPHA:g}, decision rows** (mean Δmargin with 95% CIs over task groups; rates over records):", "",
                  markdown_table(head[cols].round(3))]
    g = summary.generation
    if len(g):
        cols = [c for c in ["config", "bucket", "direction", "layer", "n_records", "generated_correct", "generated_wrong", "generated_abstain",
                            "agreement"] if c in g]
        lines += ["", f"**The calls the model writes** (greedy, read by the call parser, lenient; α = {HEADLINE_ALPHA:g}, the vector added "
                  "from the call's first row on; `agreement`: the written call is the candidate ranking's top action):", "",
                  markdown_table(g[cols].round(3))]
    c = summary.consistency
    if len(c) and "opposite_families" in c:
        split = c[(c["alpha"] == HEADLINE_ALPHA) & (c["opposite_families"].astype(str) != "")]
        if len(split):
            lines += ["", "**A pooled mean hides families pushed the other way** (α = "
                      f"{HEADLINE_ALPHA:g}; `steer_consistency.csv`):", ""]
            lines += [f"- {r.config} {r.bucket} {r.direction} L{r.layer} ({r.rows_mode}): {r.opposite_families}" for r in split.head(8).itertuples()]
    return "\n".join(lines)


# --- Figures (they shape no row): Fig. 23, from the tables of probes.scoring.steer_stats (dose_response, random_band): one block
# of three panel rows per configuration × bucket (Δ margin, correct-choice rate, KL), one column per (first layer, window);
# one colour per direction, solid lines at the decision row, dashed at every row of the call; error bars = 95% CIs over task
# groups (hollow markers: no CI); shaded: the middle 95% of the random draws.

DIRECTION_ORDER = ("applicability", "config_difference", "probe", "unembedding", "shuffled")
DIRECTION_COLORS: dict[str, tuple[float, float, float]] = {
    "applicability": PALETTE[0], "config_difference": PALETTE[1], "probe": PALETTE[2], "unembedding": PALETTE[4],
    "shuffled": PALETTE[5],  # not grey: grey is the random band
}
ROWS_MODE_STYLE: dict[str, tuple[str, str]] = {"decision": ("-", "o"), "call": ("--", "s")}  # line style, marker
BAND_SHADE: dict[str, float] = {"decision": 0.28, "call": 0.12}  # opacity of the random band per rows mode
# measure shown in a panel row → (axis label, relative panel height)
PANELS: dict[str, tuple[str, float]] = {
    "delta_margin": ("Δ wrong-tool margin\n(logits)", 1.0),
    "correct_rate": ("correct-choice\nrate", 0.8),
    "kl": ("KL(clean‖steered)\n(nats)", 0.55),
}
DOSE_COLUMNS = ("config", "bucket", "direction", "layer", "window", "rows_mode", "alpha", "n_groups",
                *(f"{m}{s}" for m in PANELS for s in ("", "_low", "_high")))
BAND_COLUMNS = ("config", "bucket", "layer", "window", "rows_mode", "alpha", *(f"{m}_{s}" for m in PANELS for s in ("low", "high")))
COLUMN_WIDTH = 2.9  # inches per layer column: the panel titles fit above it
BLOCK_HEIGHT = 4.4  # inches per configuration × bucket block of three panel rows


def _check(table: pd.DataFrame, columns: tuple[str, ...], name: str, source: str) -> None:
    missing = [c for c in columns if c not in table]
    if missing:
        raise ValueError(f"fig23_steer: the {name} table lacks {missing}; pass the table of probes.scoring.steer_stats.{source}")
    if table.empty:
        raise ValueError(f"fig23_steer: the {name} table is empty; nothing to draw")
    for column, known in (("rows_mode", ROWS_MODE_STYLE), ("direction", DIRECTION_COLORS)):
        unknown = sorted(set(table[column]) - set(known)) if column in table else []
        if unknown:
            raise ValueError(f"fig23_steer: the {name} table's {column} holds {unknown}; the figure draws {list(known)} "
                             f"(add a style for a new one in probes.reporting.steer_figure)")


def _measure(frame: pd.DataFrame, measure: str) -> pd.DataFrame:
    """The plots helpers' columns (value, low, high, n_groups) for one measure of the dose table."""
    return pd.DataFrame({"value": frame[measure].to_numpy(float), "low": frame[f"{measure}_low"].to_numpy(float),
                         "high": frame[f"{measure}_high"].to_numpy(float), "n_groups": frame["n_groups"].to_numpy(float)})


def _by_panel(table: pd.DataFrame, keys: tuple[str, ...]) -> dict[tuple, pd.DataFrame]:
    """``table``'s rows per value of ``keys`` (in table order), each sorted by α as a panel draws them: split once
    instead of masking the whole table for every panel, measure and line (building Fig. 23: 3.2 s → 2.4 s of CPU)."""
    return {key: rows.sort_values("alpha") for key, rows in table.groupby(list(keys), sort=False)}


def fig23_steer(dose: pd.DataFrame, band: pd.DataFrame, note: str) -> plt.Figure:
    """Δ margin, correct-choice rate and KL vs α per direction, the random band shaded; see the module."""
    _check(dose, DOSE_COLUMNS, "dose-response", "dose_response")
    _check(band, BAND_COLUMNS, "random band", "random_band")
    style()
    blocks = [(c, b) for c in ordered(dose["config"], CONFIG_ORDER) for b in ordered(dose["bucket"], BUCKET_ORDER)
              if ((dose["config"] == c) & (dose["bucket"] == b)).any()]
    spans = sorted(set(zip(dose["layer"].astype(int), dose["window"].astype(int))))
    directions = ordered(dose["direction"], DIRECTION_ORDER)
    modes = ordered(dose["rows_mode"], tuple(ROWS_MODE_STYLE))
    alphas = sorted(set(dose["alpha"].astype(float)) | {0.0})
    # α doubles along the grid: evenly spaced ordinal positions keep every tick readable (a linear axis crowds the
    # small ones); 0, the clean run, sits in the middle
    place = {a: i for i, a in enumerate(alphas)}

    def at_alpha(values: pd.Series) -> np.ndarray:
        return np.asarray([place[a] for a in values.astype(float)], dtype=float)

    fig = plt.figure(figsize=(1.2 + COLUMN_WIDTH * len(spans) + 1.8, 0.5 + BLOCK_HEIGHT * len(blocks)))
    heights = [h for _ in blocks for _, h in PANELS.values()]
    grid = fig.add_gridspec(len(heights), len(spans) + 1, height_ratios=heights, width_ratios=[1.0] * len(spans) + [0.55])  # no local spacing: tight_layout sets it
    lines = _by_panel(dose, ("config", "bucket", "layer", "window", "rows_mode", "direction"))
    shades = _by_panel(band, ("config", "bucket", "layer", "window", "rows_mode"))
    for b, (config, bucket) in enumerate(blocks):
        for j, (layer, window) in enumerate(spans):
            for p, (measure, (ylabel, _)) in enumerate(PANELS.items()):
                ax = fig.add_subplot(grid[b * len(PANELS) + p, j])
                for mode in modes:
                    shade = shades.get((config, bucket, layer, window, mode), band.iloc[:0])
                    ax.fill_between(at_alpha(shade["alpha"]), shade[f"{measure}_low"].to_numpy(float),
                                    shade[f"{measure}_high"].to_numpy(float), color="0.5", alpha=BAND_SHADE[mode], linewidth=0)
                    for direction in directions:
                        sub = lines.get((config, bucket, layer, window, mode, direction))
                        if sub is None:
                            continue
                        values, x = _measure(sub, measure), at_alpha(sub["alpha"])
                        line, marker = ROWS_MODE_STYLE[mode]
                        rgb = DIRECTION_COLORS[direction]
                        ax.errorbar(x, values["value"], yerr=ci_errors(values), color=rgb, linestyle=line, marker=marker,
                                    ms=3.5, lw=1.3, capsize=2, elinewidth=0.8)
                        mark_no_ci(ax, x, values, rgb)
                ax.axvline(place[0.0], color="0.6", lw=0.6)
                if measure == "delta_margin":
                    ax.axhline(0.0, color="0.3", lw=0.8)
                    ax.set_title(f"{config} {bucket_label(bucket)} · {span_label(layer, window)}", fontsize=9.5)
                if measure == "correct_rate":
                    ax.set_ylim(-0.05, 1.05)
                ax.set_xticks(range(len(alphas)), [f"{a:g}" for a in alphas], rotation=90)
                ax.tick_params(labelsize=7.5)
                if (b, measure) == (len(blocks) - 1, "kl"):  # one α axis for every panel: labelled once, at the bottom
                    ax.set_xlabel("α (× residual norm)", fontsize=8)
                else:
                    ax.tick_params(labelbottom=False)
                if j == 0:
                    ax.set_ylabel(ylabel, fontsize=8)
    legend_ax = fig.add_subplot(grid[:len(PANELS), -1])
    legend_ax.axis("off")
    handles = [Line2D([], [], color=DIRECTION_COLORS[d], lw=1.5, label=d.replace("_", " ")) for d in directions]
    handles += [Line2D([], [], color="0.3", linestyle=ROWS_MODE_STYLE[m][0], marker=ROWS_MODE_STYLE[m][1],
                       ms=3.5, label=f"{m} rows") for m in modes]
    handles += [Patch(color="0.5", alpha=BAND_SHADE[m], label=f"random, {m} rows\n(95% of draws)") for m in modes]
    legend_ax.legend(handles=handles, loc="upper left", fontsize=7.5, title="direction", title_fontsize=8)
    footnote(fig, note)
    return fig
