"""``attribution`` (seed 003 §2.1): which skill moves which item's tool choice, by randomized skill masking.

K masks (``--masks``, the seed's 12) each include every skill of the dataset independently with
probability f (``--inclusion``, the seed's 0.4; drawn once from ``--seed``, recorded in the results
header). Under each mask every item is scored with the included skills that retrieval would show,
in two pools (``--pools``, both by default, both recorded):

``topk``     the item's top-k retrieved skills of the full library (k = ``--k-max``); a mask drops
             some of them (the prompt shows the survivors, in rank order);
``library``  the item's whole library; retrieval is re-run on the masked library (Eq. 8 scores each
             skill on its own, so this is the ranking restricted to the included skills) and the
             top k of it are shown.

Each (mask, item) is one forward under memory configuration ``--config`` (default ``proc``, the
trap's configuration); identical prompts of an item are scored once and the shared prompt
prefix is reused by the engine. The outcomes are the Eq. 1 tool-choice margin (``margin``,
wrong − correct: positive prefers a wrong tool), the call log-odds (``call_logodds``) and the
binary correctness of the two-way choice (``correct_choice`` = 1[margin < 0], the deterministic
analogue of the seed's binary outcome). The estimators are :mod:`probes.scoring.skill_masking`'s:
C[j, i] (seed Eq. 1), the variance bound (Eq. 2) next to the empirical per-cell variance, C̄ and H
(Eqs. 3–4, with the interquartile range as the robust heterogeneity), bootstrap sign stability over
masks, and a power table against K: simulated for the seed's binary outcome and for the margin at
its measured noise, and measured by keeping K of the run's masks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from probes.analyses import register
from probes.analyses.base import Analysis, ReportSection
from probes.analyses.jobs import Job, Scorer, cached_scorer, run_jobs
from probes.analyses.option_system import RunOptions, k_max_option, option
from probes.analyses.run_context import RunContext, provenance
from probes.data.configs import CONFIGS
from probes.prompts.builder import SWEEP_K_MAX
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring import curation_rules as cur
from probes.scoring import skill_masking as est
from probes.scoring.claims import Claim, effect_claim

NAME = "attribution"
FIGURES = ("fig13_attribution_matrix", "fig14_attribution_statistics")
POOLS: tuple[str, ...] = ("topk", "library")
OUTCOMES: tuple[str, ...] = ("margin", "call_logodds", "correct_choice")
# The seed's Table 9 setting, read as success rates 0.5 ± 0.30 with and without the skill (a difference of 0.60):
# our simulation then gives about a third of the tests significant at K = 12, near the seed's 38.5%.
SEED_BASE_RATE, SEED_EFFECT = 0.5, 0.60
# The same change of a two-way choice in logits: P(correct) = σ(−margin), so 0.2 → 0.8 is 2·logit(0.8) of margin.
MARGIN_EFFECT = 2 * math.log(0.8 / 0.2)
SIMULATED_K = (4, 6, 8, 12, 16, 20, 30, 40, 50)
DESIGN_EFFECTS = {"margin": MARGIN_EFFECT, "correct_choice": SEED_EFFECT}  # the effects the power table is simulated at


def mask_condition(pool: str, mask: int) -> str:
    return f"{pool}:m{mask:02d}"


def power_grid(power: pd.DataFrame) -> pd.DataFrame:
    """The power table with one column per K (in order), one row per source × outcome × pool."""
    grid = power.pivot_table(index=["source", "outcome", "pool"], columns="K", values="power", sort=False)
    return grid[sorted(grid.columns)]


def draw(ctx: RunContext, n_masks: int, inclusion: float) -> tuple[tuple[str, ...], np.ndarray]:
    """The dataset's skill ids and the ``[K, n_skills]`` masks over them (seeded by ``--seed``)."""
    skills = tuple(ctx.dataset.skills)
    return skills, est.draw_masks(n_masks, len(skills), inclusion, np.random.default_rng([ctx.options.seed, 3]))


def included_sets(skills: tuple[str, ...], masks: np.ndarray) -> list[frozenset[str]]:
    """The skill ids each mask includes."""
    return [frozenset(np.asarray(skills)[row]) for row in masks]


def shown(ctx: RunContext, item, included: frozenset[str], pool: str) -> tuple[str, ...]:
    """The skills the item's prompt shows when only ``included`` are in the library: ``topk`` keeps the
    survivors of the full library's top k, ``library`` re-runs retrieval on the included skills (Eq. 8
    scores each skill on its own, so this is the full ranking restricted to them) and shows its top k."""
    ranked = [entry.skill.id for entry in ctx.builder.retrieve(item)]
    k = ctx.options.k_max
    if pool == "topk":
        return tuple(s for s in ranked[:k] if s in included)
    return tuple(s for s in ranked if s in included)[:k]


def pool_of(ctx: RunContext, item, pool: str) -> frozenset[str]:
    """The skills whose inclusion a mask varies for this item: its top k, or its whole library."""
    if pool == "topk":
        return frozenset(entry.skill.id for entry in ctx.builder.retrieve(item)[: ctx.options.k_max])
    return frozenset(skill.id for skill in ctx.dataset.library_for(item))


def mask_jobs(ctx: RunContext, items, skills: tuple[str, ...], masks: np.ndarray, config: str, pools: tuple[str, ...]) -> list[Job]:
    """One job per (pool, mask, item), an item's jobs in a row with identical prompts next to each other
    (scored once by :func:`mask_scorer`)."""
    included = included_sets(skills, masks)
    jobs = []
    for item in items:
        mine = [Job(item, config, len(seen), ctx.fmt, (mask_condition(pool, m),), skills=seen)
                for pool in pools for m in range(len(masks)) for seen in [shown(ctx, item, included[m], pool)]]
        jobs += sorted(mine, key=lambda job: job.skills)
    return jobs


def mask_scorer(ctx: RunContext) -> Scorer:
    """The scorer of :func:`mask_jobs`: the record's margins, with its pool, mask and shown skills."""
    score = cached_scorer(ctx, lambda record, job: (), margins=("margin",))

    def scorer(record, job):
        pool, mask = job.conditions[0].split(":m")
        rows = score(record, job)
        for row in rows:
            row.update(condition=job.conditions[0], pool=pool, mask=int(mask), shown=list(job.skills))
        return rows

    return scorer


def design(ctx: RunContext, table: pd.DataFrame, items, pool: str, skills: tuple[str, ...],
           masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The arrays of :mod:`probes.scoring.skill_masking` for ``items`` (one domain): outcomes ``[K, I]``
    from ``table`` (masks × item ids), inclusion ``[K, J, I]`` and ``defined`` ``[J, I]`` over the
    skills any of the items can see (their indices into ``skills``: the last value)."""
    index = {s: j for j, s in enumerate(skills)}
    o = table.reindex(columns=[item.id for item in items]).to_numpy(float)  # [K, I]
    pools = [pool_of(ctx, item, pool) for item in items]
    cols = sorted({index[s] for p in pools for s in p})
    defined = np.array([[skills[j] in p for p in pools] for j in cols]).reshape(len(cols), len(items))  # [J, I]
    return o, masks[:, cols][:, :, None] & defined[None], defined, cols


def tempting_power(tempting: pd.DataFrame, wrong: pd.DataFrame, noise: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """``tempting`` (per pool and outcome: the T_wrong items' tempting-skill cells ``wrong``) with the power
    the per-cell test had (:func:`probes.scoring.skill_masking.cell_power`, mean over those cells, at the
    outcome's measured noise ``sigma``) against the observed mean C (``power_at_mean``) and against
    :data:`DESIGN_EFFECTS` (``power_at_design``; NaN for an outcome without one): the power the design
    had for the effects actually seen, next to the one it was planned for."""
    sigma = noise.set_index(["pool", "outcome"])["sigma"]
    out = []
    for row in tempting.itertuples(index=False):
        cells = wrong[(wrong["pool"] == row.pool) & (wrong["outcome"] == row.outcome) & wrong["c"].notna()]
        noise_sd = float(sigma.get((row.pool, row.outcome), np.nan))
        design = DESIGN_EFFECTS.get(row.outcome, np.nan)

        def power(effect: float) -> float:
            values = est.cell_power(effect, noise_sd, cells["n_plus"], cells["n_minus"], alpha=alpha)
            return float(np.nanmean(values)) if np.isfinite(values).any() else np.nan

        out.append({**row._asdict(), "sigma": noise_sd, "power_at_mean": power(row.mean), "design_effect": design,
                    "power_at_design": power(design)})
    return pd.DataFrame(out, columns=[*tempting.columns, "sigma", "power_at_mean", "design_effect", "power_at_design"])


@dataclass
class AttributionSummary:
    cells: pd.DataFrame  # pool, outcome, domain, skill, item_id, bucket, task_group, tempting, c, n_plus, n_minus, var_bound, var_empirical, sign_stability, p_value
    skills: pd.DataFrame  # pool, outcome, skill, c_bar, h_range, h_iqr, n_items, sign_stability
    power: pd.DataFrame  # source, outcome, pool, K, power, effect, noise
    noise: pd.DataFrame  # pool, outcome, sigma (median over items of the outcome's s.d. across masks), n_items
    tempting: pd.DataFrame  # pool, outcome, n, mean, share_positive, sigma, power_at_mean, design_effect, power_at_design (tempting_power)
    n_masks: int
    inclusion: float
    note: str


@register("attribution", order=82)
@dataclass(kw_only=True)
class Attribution(Analysis):
    """Seed 003 §2.1: the causal attribution matrix C of skills × items from K random skill masks."""

    # the statistics' settings do not change a row: a rerun with other values reuses the rows
    value_neutral: ClassVar[frozenset[str]] = RunOptions.value_neutral | {"resamples", "permutations", "subsamples", "simulations", "alpha"}

    k_max: int | None = k_max_option(SWEEP_K_MAX)
    masks: int = option(12, "K: random skill masks (the seed's 12)", type=int, minimum=2)
    inclusion: float = option(0.4, "f: each skill's inclusion probability in a mask (the seed's 0.4)", type=float, minimum=0.0,
                              maximum=1.0, exclusive=True, why="at 0 or 1 every mask is the same: no skill's effect is estimable")
    pools: tuple[str, ...] = option(POOLS, "candidate pools: topk (the item's top-k skills, masked) and library (retrieval re-run "
                                    "on the masked library)", names=POOLS, minimum=1)
    config: str = option("proc", "memory configuration the skills are shown in", choices=tuple(n for n, c in CONFIGS.items() if c.slots))
    resamples: int = option(est.N_BOOTSTRAP, "mask bootstrap resamples for sign stability (the seed's 1,000)", type=int, minimum=1)
    permutations: int = option(200, "permutations of each per-cell test (power table)", type=int, minimum=1)
    subsamples: int = option(20, "draws of K masks out of the run's per K of the measured power table", type=int, minimum=1)
    simulations: int = option(1000, "simulated cells per K of the simulated power table", type=int, minimum=1)
    alpha: float = option(0.05, "level of the per-cell permutation test", type=float, minimum=0.0, maximum=1.0, exclusive=True,
                          why="a test level; at 1 every cell is detected, power 1 at every K")

    def resolved(self) -> Attribution:
        """``--quick`` keeps one pool (the library one where asked): half the prompts of both."""
        options = super().resolved()
        if self.quick and len(self.pools) > 1:
            options = dataclasses.replace(options, pools=("library",) if "library" in self.pools else self.pools[:1])
        return options

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        skills, masks = draw(ctx, self.masks, self.inclusion)
        store = ctx.store(configs=[self.config], masks=[sorted(s) for s in included_sets(skills, masks)])
        run_jobs(ctx, store, mask_jobs(ctx, ctx.items, skills, masks, self.config, ctx.options.pools), mask_scorer(ctx))
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> AttributionSummary:
        skills, masks = draw(ctx, self.masks, self.inclusion)
        index = {s: j for j, s in enumerate(skills)}
        rng = np.random.default_rng([ctx.options.seed, 4])
        weights = est.bootstrap_weights(self.masks, self.resamples, rng)
        rows = rows.assign(correct_choice=np.where(rows["margin"].notna(), (rows["margin"] < 0).astype(float), np.nan))
        by_domain: dict[str, list] = {}
        for item in ctx.items:
            by_domain.setdefault(item.domain, []).append(item)
        cells, boot_rows, noise, detection = [], [], [], []
        for pool in ctx.options.pools:
            sub = rows[rows["pool"] == pool]
            for outcome in OUTCOMES:
                table = sub.pivot_table(index="mask", columns="item_id", values=outcome, aggfunc="first", dropna=False)
                table = table.reindex(index=range(self.masks))
                boot_sum, boot_n = np.zeros((self.resamples, len(skills))), np.zeros((self.resamples, len(skills)))
                sds = []
                for domain, items in by_domain.items():
                    o, inc, defined, cols = design(ctx, table, items, pool, skills, masks)
                    c = est.causal_scores(o, inc, defined)
                    boot = est.causal_scores(np.broadcast_to(o, (self.resamples, *o.shape)), inc, defined, weights)
                    var = est.cell_variances(o, inc, defined)
                    pvalues = est.permutation_pvalues(o, inc, defined, self.permutations, rng)
                    stable = est.sign_agreement(c, boot)
                    boot_sum[:, cols] += np.nansum(np.where(defined[None], boot, 0.0), axis=2)
                    boot_n[:, cols] += np.isfinite(boot).sum(axis=2)
                    sds += [float(np.std(col[np.isfinite(col)], ddof=1)) for col in o.T if np.isfinite(col).sum() > 1]
                    cells.append(pd.DataFrame({
                        "pool": pool, "outcome": outcome, "domain": domain, "skill": [skills[cols[j]] for j in var["j"]],
                        "item_id": [items[i].id for i in var["i"]], "bucket": [items[i].bucket for i in var["i"]],
                        "task_group": [items[i].task_group for i in var["i"]],
                        "tempting": [skills[cols[j]] == items[i].tempting_skill for j, i in zip(var["j"], var["i"])],
                        "c": c[var["j"], var["i"]], "n_plus": var["n_plus"], "n_minus": var["n_minus"],
                        "var_bound": var["var_bound"], "var_empirical": var["var_empirical"],
                        "sign_stability": stable[var["j"], var["i"]], "p_value": pvalues[var["j"], var["i"]]}))
                    if outcome in ("margin", "correct_choice"):
                        detection.append((pool, outcome, o, inc, defined))
                with np.errstate(invalid="ignore"):
                    boot_bar = boot_sum / boot_n
                boot_rows.append((pool, outcome, boot_bar))
                noise.append({"pool": pool, "outcome": outcome, "sigma": float(np.median(sds)) if sds else np.nan, "n_items": len(sds)})
        cells = pd.concat(cells, ignore_index=True)
        stats = est.row_statistics(cells, ["pool", "outcome", "skill"])
        stats["sign_stability"] = np.nan
        for pool, outcome, boot_bar in boot_rows:
            at = (stats["pool"] == pool) & (stats["outcome"] == outcome)
            cols = [index[s] for s in stats.loc[at, "skill"]]
            stats.loc[at, "sign_stability"] = est.sign_agreement(stats.loc[at, "c_bar"].to_numpy(float), boot_bar[:, cols])
        noise = pd.DataFrame(noise)
        power = self.power_table(ctx, detection, noise, rng)
        wrong = cells[cells["tempting"] & (cells["bucket"] == "T_wrong")]
        tempting = wrong.groupby(["pool", "outcome"], sort=False)["c"].agg(
            n="count", mean="mean", share_positive=lambda c: float((c.dropna() > 0).mean()) if c.notna().any() else np.nan).reset_index()
        tempting = tempting_power(tempting, wrong, noise, self.alpha)
        note = (f"{provenance(ctx)} · masks K = {self.masks}, f = {self.inclusion}, config {self.config} · "
                f"{self.resamples} bootstrap resamples, {self.permutations} permutations, α = {self.alpha}")
        return AttributionSummary(cells, stats, power, noise, tempting, self.masks, self.inclusion, note)

    def power_table(self, ctx: RunContext, detection: list, noise: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
        """Power of the per-cell permutation test against K: simulated for the seed's binary outcome and
        for the margin at its measured noise, and measured on this run by keeping K of its masks."""
        parts = []
        binary = est.simulated_power(SIMULATED_K, self.inclusion, SEED_EFFECT, outcome="binary", base_rate=SEED_BASE_RATE,
                                     n_simulations=self.simulations, n_permutations=self.permutations, alpha=self.alpha, rng=rng)
        parts.append(binary.assign(source="simulated", outcome="binary (seed: rates 0.5 ± 0.30)", pool="", effect=SEED_EFFECT, noise=np.nan))
        for row in noise[noise["outcome"] == "margin"].itertuples():
            if not np.isfinite(row.sigma):
                continue
            sim = est.simulated_power(SIMULATED_K, self.inclusion, MARGIN_EFFECT, outcome="gaussian", noise=row.sigma,
                                      n_simulations=self.simulations, n_permutations=self.permutations, alpha=self.alpha, rng=rng)
            parts.append(sim.assign(source="simulated", outcome=f"margin ({MARGIN_EFFECT:.2f} logits at the measured noise)", pool=row.pool,
                                    effect=MARGIN_EFFECT, noise=row.sigma))
        kept = sorted({*range(4, self.masks, 2), self.masks})
        for pool in ctx.options.pools:
            for outcome in ("margin", "correct_choice"):
                chunks = [(o, inc, d) for p, out, o, inc, d in detection if p == pool and out == outcome]
                if not chunks:
                    continue
                totals = pd.concat([est.subsampled_detection(o, inc, d, kept, n_subsamples=self.subsamples, n_permutations=self.permutations,
                                                             alpha=self.alpha, rng=rng) for o, inc, d in chunks])
                totals = totals.groupby("K")[["n_rejected", "n_tests"]].sum().reset_index()
                with np.errstate(invalid="ignore", divide="ignore"):
                    share = totals["n_rejected"] / totals["n_tests"]
                parts.append(pd.DataFrame({"K": totals["K"], "power": share, "n_simulations": totals["n_tests"],
                                           "source": "measured (share of cells significant)", "outcome": outcome, "pool": pool,
                                           "effect": np.nan, "noise": np.nan}))
        return pd.concat(parts, ignore_index=True)[["source", "outcome", "pool", "K", "power", "n_simulations", "effect", "noise"]]

    def tables(self, summary: AttributionSummary) -> dict[str, pd.DataFrame]:
        return {f"{NAME}_skills": summary.skills, f"{NAME}_cells": summary.cells, f"{NAME}_power": summary.power,
                f"{NAME}_noise": summary.noise, f"{NAME}_tempting": summary.tempting}

    def claims(self, summary: AttributionSummary) -> list[Claim]:
        """The planted check, per pool: on T_wrong items the tempting skill raises the wrong-tool margin
        (C > 0, mean over task groups of its cells), tested against the seed's smallest acted-on effect
        (0.10 pass rate, 2·logit(0.55) logits, as in ``curate`` and ``mask-eval``)."""
        cells = summary.cells
        wrong = cells[cells["tempting"] & (cells["bucket"] == "T_wrong") & (cells["outcome"] == "margin")]
        claims = []
        for pool, sub in wrong.groupby("pool", sort=False):
            sub = sub[np.isfinite(sub["c"].to_numpy(float))]
            claims.append(effect_claim(NAME, f"tempting skill C>0 ({pool})", f"on T_wrong items ({pool} pool) including the item's "
                                       "tempting skill raises the wrong-tool margin (C of the margin > 0)", sub["c"].to_numpy(float),
                                       sub["task_group"].to_numpy(), sesoi=cur.TAU_RETIRE, note=f"{len(sub)} items"))
        return claims

    def figures(self, summary: AttributionSummary, out_dir: Path) -> list[Path]:
        plots.style()
        pool = "library" if "library" in set(summary.cells["pool"]) else summary.cells["pool"].iloc[0]
        return [*plots.save_figure(fig13_attribution_matrix(summary.cells, pool, summary.note), out_dir, FIGURES[0]),
                *plots.save_figure(fig14_attribution_statistics(summary.skills, summary.cells, summary.power, summary.note),
                                   out_dir, FIGURES[1])]

    def section(self, ctx: RunContext, summary: AttributionSummary, figures: list[Path]) -> ReportSection:
        margin = summary.skills[summary.skills["outcome"] == "margin"]
        dist = margin.groupby("pool")[["c_bar", "h_range", "h_iqr", "sign_stability"]].describe(percentiles=[0.1, 0.5, 0.9])
        dist = dist.loc[:, (slice(None), ["mean", "10%", "50%", "90%"])]
        dist.columns = [f"{a} {b}" for a, b in dist.columns]
        variance = (summary.cells[summary.cells["outcome"] == "margin"].groupby("pool")[["var_bound", "var_empirical"]].median()
                    .reset_index())
        power = power_grid(summary.power).reset_index()
        power.columns = [f"K={c}" if isinstance(c, int | np.integer) else c for c in power.columns]
        body = (f"C[j, i] (seed Eq. 1) over {summary.n_masks} masks at f = {summary.inclusion}; outcomes: the tool-choice margin "
                "(wrong − correct), the call log-odds, and the correct choice 1[margin < 0]. Per skill, over its items "
                f"(margin):\n\n{markdown_table(dist.reset_index())}\n\n"
                f"Median per-cell variance of C (margin, logits²): the seed's binary bound ¼(1/|M⁺| + 1/|M⁻|) (Eq. 2) next to the "
                f"empirical one:\n\n{markdown_table(variance)}\n\nPlanted check: C of each T_wrong item's tempting skill "
                f"(positive: the skill raises the wrong-tool margin):\n\n{markdown_table(summary.tempting)}\n\n"
                f"power_at_mean: the power the per-cell test had (two-sided t approximation at α = {self.alpha:g}, each tempting "
                "cell's own |M⁺| and |M⁻|, s.d. sigma; mean over the cells) for an effect of the observed mean C; power_at_design: "
                "the same for the effect the power table is simulated at (design_effect).\n\n"
                f"Power of the per-cell permutation test against K (`{NAME}_power.csv`):\n\n{markdown_table(power)}")
        return ReportSection(NAME, "Seed 003 — skill attribution by random masking (`attribution`)", figures, body, [], summary)

    def print_summary(self, summary: AttributionSummary) -> None:
        margin = summary.skills[summary.skills["outcome"] == "margin"]
        print("per skill (margin): C̄, H (range), H (IQR), sign stability — quantiles over skills")
        print(margin.groupby("pool")[["c_bar", "h_range", "h_iqr", "sign_stability"]].quantile([0.1, 0.5, 0.9]).round(3).to_string())
        print("noise (median s.d. of the outcome across masks):\n" + summary.noise.round(3).to_string(index=False))
        print("tempting skill on T_wrong:\n" + summary.tempting.round(3).to_string(index=False))
        print("power:\n" + power_grid(summary.power).round(3).to_string())


# --- Figs. 13 and 14, drawn by Attribution.figures
def fig13_attribution_matrix(cells: pd.DataFrame, pool: str, note: str) -> plt.Figure:
    """The attribution matrix C (seed Eq. 1) of the margin: one panel per domain, skills × items
    (items grouped by bucket), diverging colours on one symmetric scale; a dot marks each item's
    tempting skill.

    cells: pool, outcome, domain, skill, item_id, bucket, tempting, c.
    """
    data = cells[(cells["pool"] == pool) & (cells["outcome"] == "margin")]
    domains = sorted(data["domain"].unique())
    finite = data["c"].abs().dropna()
    vmax = float(np.quantile(finite, 0.98)) if len(finite) else 1.0
    n_cols = min(4, len(domains)) or 1
    n_rows = math.ceil(len(domains) / n_cols) or 1
    fig, grid_axes = plt.subplots(n_rows, n_cols + 1, figsize=(4.2 * n_cols + 0.6, 3.4 * n_rows + 0.6), squeeze=False,
                                  gridspec_kw={"width_ratios": [*[1] * n_cols, 0.06]})
    axes, bar_axes = grid_axes[:, :-1], grid_axes[:, -1]
    image = None
    for ax, domain in zip(axes.flat, domains):
        sub = data[data["domain"] == domain]
        items = (sub.drop_duplicates("item_id").assign(order=lambda f: f["bucket"].map({b: i for i, b in enumerate(plots.BUCKET_ORDER)}))
                 .sort_values(["order", "item_id"])["item_id"].tolist())
        skills = sorted(sub["skill"].unique())
        grid = sub.pivot_table(index="skill", columns="item_id", values="c", aggfunc="first", dropna=False).reindex(index=skills, columns=items)
        image = ax.imshow(grid.to_numpy(float), cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", interpolation="nearest")
        marks = sub[sub["tempting"]]
        ax.scatter([items.index(i) for i in marks["item_id"]], [skills.index(s) for s in marks["skill"]], s=6, c="k", marker="o", lw=0)
        buckets = sub.drop_duplicates("item_id").set_index("item_id").loc[items, "bucket"].tolist()
        edges = [i for i in range(1, len(buckets)) if buckets[i] != buckets[i - 1]]
        for edge in edges:
            ax.axvline(edge - 0.5, color="k", lw=0.8)
        starts = [0, *edges]
        ax.set_xticks([(a + b) / 2 - 0.5 for a, b in zip(starts, [*edges, len(items)])], [plots.bucket_label(buckets[s]) for s in starts], fontsize=8)
        for col, item in enumerate(items):  # a blank column says why it is blank
            if sub.loc[sub["item_id"] == item, "c"].isna().all():
                ax.text(col, (len(skills) - 1) / 2, blank_reason(cells, pool, item), rotation=90, ha="center", va="center",
                        fontsize=7, color="0.3")
        ax.set_yticks(range(len(skills)), skills, fontsize=6)
        ax.set_title(f"{domain} ({len(skills)} skills, {len(items)} items)", fontsize=9)
        ax.grid(False)
    for ax in list(axes.flat)[len(domains):]:
        ax.set_visible(False)
    for ax in bar_axes[1:]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, cax=bar_axes[0], label="C[j, i]: margin with − without skill (logits)")
    fig.suptitle(f"Attribution matrix C of the wrong-tool margin ({pool} pool); dot: the item's tempting skill")
    plots.footnote(fig, note)
    return fig


def blank_reason(cells: pd.DataFrame, pool: str, item: str) -> str:
    """Why an item has no margin anywhere in C: abstention is its correct action (no correct tool; its call
    log-odds are attributed instead), or, failing that, no record gave a margin."""
    calls = cells[(cells["pool"] == pool) & (cells["item_id"] == item) & (cells["outcome"] == "call_logodds")]["c"]
    return "no margin: abstention is correct\n(C of its call log-odds: table)" if calls.notna().any() else "no margin on any record"


def fig14_attribution_statistics(skills: pd.DataFrame, cells: pd.DataFrame, power: pd.DataFrame, note: str) -> plt.Figure:
    """Three panels: C̄ against H per skill (range filled, IQR open; margin, each pool), the cells'
    bootstrap sign stability, and the power of the per-cell permutation test against K.

    skills: pool, outcome, skill, c_bar, h_range, h_iqr; cells: pool, outcome, sign_stability;
    power: source, outcome, pool, K, power.
    """
    fig, axes = plt.subplots(1, 3, figsize=(15.5, 4.2))
    pools = sorted(skills["pool"].unique())
    colors = dict(zip(pools, sns.color_palette("colorblind", len(pools))))
    ax = axes[0]
    for pool in pools:
        sub = skills[(skills["pool"] == pool) & (skills["outcome"] == "margin")]
        ax.scatter(sub["c_bar"], sub["h_range"], s=14, color=colors[pool], label=f"{pool}: H = range")
        ax.scatter(sub["c_bar"], sub["h_iqr"], s=14, facecolors="none", edgecolors=colors[pool], label=f"{pool}: H = IQR")
    ax.axvline(0.0, color="0.3", lw=0.8)
    ax.set_xlabel("C̄(j): mean over items (logits)")
    ax.set_ylabel("H(j): heterogeneity over items (logits)")
    ax.set_title("C̄ against H per skill (margin)")
    ax.legend(fontsize=7)
    ax = axes[1]
    bins = np.linspace(0, 1, 21)
    for pool in pools:
        values = cells[(cells["pool"] == pool) & (cells["outcome"] == "margin")]["sign_stability"].dropna()
        ax.hist(values, bins=bins, histtype="step", lw=1.4, color=colors[pool], label=f"{pool} (n = {len(values)} cells)")
    ax.set_xlabel("share of mask resamples keeping the sign of C")
    ax.set_ylabel("cells")
    ax.set_title("Bootstrap sign stability (margin)")
    ax.legend(fontsize=7)
    ax = axes[2]
    for (source, outcome, pool), sub in power.groupby(["source", "outcome", "pool"], sort=False):
        sub = sub.sort_values("K")
        simulated = source == "simulated"
        ax.plot(sub["K"], sub["power"], marker="o" if simulated else "s", ls="-" if simulated else "--", ms=4,
                label=f"{source}: {outcome}{f' · {pool}' if pool else ''}")
    ax.axhline(0.8, color="0.5", lw=0.6, ls=":")
    ax.set_xlabel("masks K")
    ax.set_ylabel("share of per-cell tests rejecting")
    ax.set_ylim(0, 1.02)
    ax.set_title("Power of the per-cell permutation test")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("Skill attribution: row statistics, stability and power")
    plots.footnote(fig, note)
    return fig
