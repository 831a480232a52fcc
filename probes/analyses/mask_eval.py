"""``mask-eval`` (seed 003 §2.3): per-item skill masks predicted from the development attribution.

For each held-out item, ``mask-eval`` predicts every skill's effect from its k nearest development
items (Eq. 5–6, :mod:`probes.analyses.development_attribution`), drops the skills predicted to hurt
(Eq. 7) and compares, on the held-out items, the full library, the per-item mask, the reverse mask
(the same number of the most helpful skills dropped) and a random mask of the same size. Its
claims (:func:`~probes.analyses.development_attribution.held_out_claims`): the mask lowers the held-out
T_wrong margin against each of the three (confirmatory); the other buckets, the wrong-choice rate and
the items whose needed skill the mask dropped are exploratory.
"""


from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from probes.analyses import register
from probes.analyses.base import ReportSection
from probes.analyses.development_attribution import (DELTA_COLUMNS, HELD_OUT, DevelopmentAttribution, benefit_cells, held_out_claims,
                                                     on_library, partition, recorded_margins, scoring_margins)
from probes.analyses.option_system import OptionError, RunOptions, option
from probes.analyses.run_context import RunContext, provenance
from probes.data.dataset import Item
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring import curation_rules as cur
from probes.scoring.claims import Claim
from probes.scoring.stats import paired_differences, summarise as ci_summary


POLICIES: tuple[str, ...] = ("full", "mask", "reverse", "random")  # the full library, Eq. 7's mask, the two controls
CONTRASTS = {"mask − full": ("mask", "full"), "mask − reverse": ("mask", "reverse"), "mask − random": ("mask", "random")}
CLAIM_WORDS = {"mask − full": "the per-item mask (Eq. 7), against the full library,",
               "mask − reverse": "the per-item mask, against the reverse mask (as many of the most helpful skills dropped),",
               "mask − random": "the per-item mask, against a random mask of its size,"}
NEEDED = "mask − full, tempting skill dropped"  # the T_ok / T_repair items whose needed skill the mask dropped


# ---------------------------------------------------------------------------- mask-eval
@dataclass
class MaskingSummary:
    items: pd.DataFrame  # item_id, bucket, task_group, policy, n_dropped, dropped, fallback, tempting_dropped, margin, wrong_choice
    policies: pd.DataFrame  # outcome, bucket, policy, value, low, high, n, ...
    contrasts: pd.DataFrame  # outcome, bucket, contrast, value, low, high, n, ...
    deltas: pd.DataFrame  # per held-out item: item_id, task_group, bucket, contrast, delta, outcome (what contrasts summarises)
    needed: pd.DataFrame  # T_ok / T_repair items whose tempting skill the mask dropped: margin change mask − full
    masking: pd.DataFrame  # bucket, n_items, fallback share, mean dropped, share with a mask
    note: str


@register("mask-eval", order=84)
@dataclass(kw_only=True)
class MaskEval(DevelopmentAttribution):
    """Seed 003 §2.3: per-item skill masking on held-out task groups against the full library, a reverse and a random mask."""

    # the policies only choose among rows keyed by what a prompt shows: a rerun with other values reuses them
    value_neutral: ClassVar[frozenset[str]] = RunOptions.value_neutral | {"neighbours", "temperature", "threshold", "protected", "min_skills"}

    neighbours: int = option(cur.SEED_NEIGHBOURS, "k nearest development items of Eq. 6 (the seed's 8)", type=int, minimum=1)
    temperature: float = option(cur.SOFTMAX_TEMPERATURE, "τ of Eq. 5's softmax over cosines (the seed states none; a priori)",
                                type=float, minimum=cur.MIN_TEMPERATURE, why="below it the weights are the nearest neighbour's already, "
                                "and τ → 0 turns them into NaN")
    threshold: float = option(round(cur.MASK_THRESHOLD, 4), "drop a skill when Ĉ < −threshold (logits; the seed's −0.10 pass rate "
                              "as a margin: 2·logit(0.55))", type=float, minimum=0.0)
    protected: tuple[str, ...] = option(cur.PROTECTED_PREFIXES, "skill id prefixes never dropped (the seed's tpl-, shr-, api-)",
                                        flag="--protect", repeat=True)
    min_skills: int | None = option(None, "fewest skills a masked library keeps, else the full library (default: k_max, so the "
                                    "prompt still shows k skills)", type=int, minimum=1)

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        if not partition(ctx)[1]:
            raise OptionError(f"mask-eval: no held-out items (split {HELD_OUT!r}) among the selected; select --split all")
        dev, held, skills, masks, store = self.development(ctx)
        plans = self.masks_for(ctx, dev, held, benefit_cells(ctx, load_results(store.path), dev, skills, masks))
        scoring_margins(store)(ctx, [(p["item"], p["shown"]) for p in plans])
        return load_results(store.path)

    def masks_for(self, ctx: RunContext, dev: list[Item], held: list[Item], cells: pd.DataFrame) -> list[dict[str, Any]]:
        """Each held-out item's four libraries (Eqs. 5–7 and the two controls) and what its prompt shows under each."""
        benefit = cells.pivot_table(index="skill", columns="item_id", values="b", aggfunc="first").reindex(columns=[i.id for i in dev])
        embed = ctx.builder.retriever.embedder.embed
        dev_vectors = embed([item.state_text for item in dev])
        held_vectors = embed([item.state_text for item in held])
        minimum = self.min_skills if self.min_skills is not None else ctx.options.k_max
        plans = []
        for item, vector in zip(held, held_vectors):
            library = [s.id for s in ctx.dataset.library_for(item)]
            weights = cur.neighbour_weights(dev_vectors, vector, min(self.neighbours, len(dev)), self.temperature)
            c_hat, evidence = cur.predicted_effects(benefit.reindex(index=library).to_numpy(float), weights)
            mask = cur.risk_minimising_mask(library, c_hat, self.threshold, self.protected, minimum)
            n = len(mask.dropped)
            rng = np.random.default_rng([ctx.options.seed, 5, *item.id.encode()])
            chosen_by = (cur.Mask(tuple(library), (), False), mask, cur.reverse_drop(library, c_hat, n, self.protected),
                         cur.random_drop(library, n, self.protected, rng))
            for policy, chosen in zip(POLICIES, chosen_by, strict=True):
                plans.append({"item": item, "policy": policy, "dropped": chosen.dropped, "fallback": mask.fallback,
                              "shown": on_library(ctx, item, chosen.kept), "c_hat": dict(zip(library, c_hat)),
                              "evidence": float(np.nanmean(evidence)) if len(evidence) else np.nan})
        return plans

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> MaskingSummary:
        dev, held, cells = self.matrix(ctx, rows)
        plans = self.masks_for(ctx, dev, held, cells)
        margins = recorded_margins(rows)(ctx, [(p["item"], p["shown"]) for p in plans])
        items = pd.DataFrame([{"item_id": p["item"].id, "bucket": p["item"].bucket, "task_group": p["item"].task_group,
                               "policy": p["policy"], "n_dropped": len(p["dropped"]), "dropped": list(p["dropped"]),
                               "fallback": p["fallback"], "tempting_dropped": p["item"].tempting_skill in p["dropped"],
                               "shown": list(p["shown"]), "evidence": p["evidence"], "margin": m} for p, m in zip(plans, margins)])
        items["wrong_choice"] = np.where(items["margin"].notna(), (items["margin"] >= 0).astype(float), np.nan)
        policies, deltas, per_item = [], [], []
        for value in ("margin", "wrong_choice"):
            policies.append(ci_summary(items, ["bucket", "policy"], value).assign(outcome=value))
            delta = paired_differences(items, CONTRASTS, pair=["item_id", "task_group", "bucket"], side="policy", value=value)
            deltas.append(ci_summary(delta, ["bucket", "contrast"], "delta").assign(outcome=value))
            per_item.append(delta.assign(outcome=value))
        mask_rows = items[items["policy"] == "mask"]
        full = items[items["policy"] == "full"].set_index("item_id")["margin"]
        needed_items = mask_rows[mask_rows["tempting_dropped"] & mask_rows["bucket"].isin(["T_ok", "T_repair"])]
        needed_deltas = needed_items.assign(delta=needed_items["margin"].to_numpy() - full.reindex(needed_items["item_id"]).to_numpy(),
                                            contrast=NEEDED, outcome="margin")[DELTA_COLUMNS]
        needed = ci_summary(needed_deltas, ["bucket"], "delta") if len(needed_items) else pd.DataFrame(
            columns=["bucket", "value", "low", "high", "n", "n_items"])
        masking = mask_rows.groupby("bucket", sort=False).agg(n_items=("item_id", "size"), fallback=("fallback", "mean"),
                                                             active=("n_dropped", lambda n: float((n > 0).mean())),
                                                             mean_dropped=("n_dropped", "mean"),
                                                             tempting_dropped=("tempting_dropped", "mean")).reset_index()
        note = (f"{provenance(ctx)} · development {len(dev)}, held-out {len(held)} items · masks K = {self.masks}, f = {self.inclusion} · "
                f"k = {self.neighbours} neighbours, τ = {self.temperature}, drop at Ĉ < −{self.threshold} logits")
        return MaskingSummary(items, pd.concat(policies, ignore_index=True), pd.concat(deltas, ignore_index=True),
                              pd.concat([*per_item, needed_deltas] if len(needed_deltas) else per_item, ignore_index=True), needed, masking, note)

    def tables(self, summary: MaskingSummary) -> dict[str, pd.DataFrame]:
        return {"mask_eval_policies": summary.policies, "mask_eval_contrasts": summary.contrasts, "mask_eval_masking": summary.masking,
                "mask_eval_needed": summary.needed, "mask_eval_items": summary.items}

    def claims(self, summary: MaskingSummary) -> list[Claim]:
        """The mask lowers the held-out margin against the full library and both controls (T_wrong margin:
        confirmatory, family "mask-eval"; the other buckets and the wrong-choice rate: exploratory), and,
        exploratory, dropping a T_ok / T_repair item's needed skill raises its margin."""
        deltas = summary.deltas
        claims = held_out_claims(deltas[deltas["contrast"] != NEEDED], "mask-eval", CLAIM_WORDS)
        return claims + held_out_claims(deltas[deltas["contrast"] == NEEDED], "mask-eval", {NEEDED: "dropping the skill they need"},
                                        alternative="greater")

    def figures(self, summary: MaskingSummary, out_dir: Path) -> list[Path]:
        plots.style()
        return plots.save_figure(fig16_masking_policies(summary.policies, summary.note), out_dir, "fig16_masking_policies")

    def section(self, ctx: RunContext, summary: MaskingSummary, figures: list[Path]) -> ReportSection:
        body = ("Held-out items (task groups never used to decide), the wrong-tool margin and the wrong two-way choice "
                "1[margin ≥ 0] (not greedy calls) per policy, 95% CIs over task groups:\n\n"
                f"{markdown_table(summary.policies)}\n\nPaired differences:\n\n{markdown_table(summary.contrasts)}\n\n"
                f"Masking per bucket (share of items with a mask, fallback share, skills dropped):\n\n{markdown_table(summary.masking)}\n\n"
                "T_ok / T_repair items whose tempting skill (the one they need) the mask dropped, margin change mask − full:\n\n"
                f"{markdown_table(summary.needed)}")
        return ReportSection("mask-eval", "Seed 003 — per-item skill masking on held-out items (`mask-eval`)", figures, body, [], summary)

    def print_summary(self, summary: MaskingSummary) -> None:
        cols = ["outcome", "bucket", "policy", "value", "low", "high", "n"]
        print(summary.policies[cols].round(3).to_string(index=False))
        print(summary.contrasts[["outcome", "bucket", "contrast", "value", "low", "high", "n"]].round(3).to_string(index=False))
        print(summary.masking.round(3).to_string(index=False))


# --- Fig. 16, drawn by MaskEval.figures
def fig16_masking_policies(policies: pd.DataFrame, note: str) -> plt.Figure:
    """Held-out items: the mean wrong-tool margin and the wrong-choice rate per policy (full library,
    per-item mask, reverse mask, random mask) and bucket, with 95% CIs over task groups.

    policies: outcome, bucket, policy, value, low, high."""
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.2))
    order = [p for p in ("full", "mask", "reverse", "random") if p in set(policies["policy"])]
    colors = dict(zip(order, sns.color_palette("colorblind", len(order))))
    for ax, (outcome, title) in zip(axes, (("margin", "mean wrong-tool margin (logits)"), ("wrong_choice", "wrong two-way choice rate"))):
        sub = policies[policies["outcome"] == outcome]
        buckets = [b for b in plots.BUCKET_ORDER if b in set(sub["bucket"])]
        width = 0.8 / len(order)
        for p, policy in enumerate(order):
            cells = sub[sub["policy"] == policy].set_index("bucket").reindex(buckets)
            x = np.arange(len(buckets)) + (p - (len(order) - 1) / 2) * width
            value = cells["value"].to_numpy(float)
            err = np.vstack([value - cells["low"].to_numpy(float), cells["high"].to_numpy(float) - value])
            ax.bar(x, value, width, color=colors[policy], label=policy)
            ax.errorbar(x, value, yerr=np.nan_to_num(err), fmt="none", ecolor="k", lw=0.8, capsize=2)
        ax.set_xticks(np.arange(len(buckets)), [plots.bucket_label(b) for b in buckets])
        ax.axhline(0.0, color="0.3", lw=0.8)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle("Per-item skill masking on held-out task groups")
    plots.footnote(fig, note)
    return fig
