"""``curate`` (seed 003 §2.2): repair a skill library from its attribution matrix.

On the development items (:mod:`probes.analyses.development_attribution`), ``curate`` sorts the
skills into regimes by C̄ and H, then splits heterogeneous skills into two conditional variants (each
pair kept only if ψ accepts both and the development gate passes), retires negligible ones, merges
near-duplicates by embedding cosine (keeping the best by C̄), each step gated, and writes the curated
library as a dataset folder (``--library-out``) with a README of every decision. The held-out items
are scored under the original and the curated library. Its claim
(:func:`~probes.analyses.development_attribution.held_out_claims`): the curated library lowers the held-out
T_wrong margin (confirmatory; the other buckets and the wrong-choice rate are exploratory).
"""


from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from probes.analyses import register
from probes.analyses.base import ReportSection
from probes.analyses.development_attribution import (DELTA_COLUMNS, DEVELOPMENT, DevelopmentAttribution, Margins, benefit_cells,
                                                     held_out_claims, on_library, partition, recorded_margins, scoring_margins)
from probes.analyses.option_system import OptionError, RunOptions, option
from probes.analyses.run_context import RunContext, provenance
from probes.core.files import OutputRefused, OutputRoot
from probes.data.dataset import CARD_NAME, DatasetError, Item, ProbeDataset, load_dataset, resolve_dataset
from probes.data.retrieval import skill_text
from probes.engine.generate import ChatGenerator
from probes.data.schema import BOUNDARY_SLOTS, LibraryReport, SkillValidationError, validate_skill
from probes.reporting import plots
from probes.reporting.markdown import markdown_table
from probes.reporting.results import load_results
from probes.scoring import skill_masking as est
from probes.scoring import curation_rules as cur
from probes.scoring.claims import Claim
from probes.scoring.stats import paired_differences, summarise as ci_summary


CONTRAST = "curated − original"


# ---------------------------------------------------------------------------- curate
@dataclass
class CurationSummary:
    skills: pd.DataFrame  # skill, domain, c_bar, h_range, h_iqr, n_items, heterogeneity, regime
    decisions: pd.DataFrame  # step, skill, action, accepted, reason, margin_before, margin_after, correct_before, correct_after, n_items
    held_out: pd.DataFrame  # bucket, library, value, low, high, n, ... (margin) and the curated − original difference
    deltas: pd.DataFrame  # per held-out item: item_id, task_group, bucket, contrast, delta, outcome (the difference held_out summarises)
    library_dir: Path | None
    counts: dict[str, int]
    note: str


@register("curate", order=83)
@dataclass(kw_only=True)
class Curate(DevelopmentAttribution):
    """Seed 003 §2.2: split, retire and merge skills by C̄ and H, each step gated on development items; writes the curated dataset."""

    # the thresholds only choose among rows keyed by what a prompt shows: a rerun with other values reuses them
    value_neutral: ClassVar[frozenset[str]] = RunOptions.value_neutral | {"tau_split", "tau_retire", "tau_merge", "heterogeneity",
                                                                          "max_split", "library_out", "rewriter"}

    tau_split: float = option(round(cur.TAU_SPLIT, 4), "τ_split: H (logits) from which a skill is heterogeneous (the seed's 0.40 pass-rate "
                              "difference as a margin: 2·logit(0.70))", type=float, minimum=0.0)
    tau_retire: float = option(round(cur.TAU_RETIRE, 4), "τ_retire: |C̄| (logits) below which a skill is negligible (the seed's smallest "
                               "acted-on effect, 0.10, as a margin: 2·logit(0.55))", type=float, minimum=0.0)
    tau_merge: float = option(cur.TAU_MERGE, "τ_merge: embedding cosine from which two skills of a domain are near-duplicates "
                              "(the seed states none; a priori)", type=float, minimum=0.0)
    heterogeneity: str = option("h_range", "H: h_range (the seed's Eq. 4, max − min over items) or h_iqr (interquartile range, robust)",
                                choices=("h_range", "h_iqr"))
    max_split: int = option(10, "τ_max_split: heterogeneous skills rewritten, largest H first", type=int, minimum=0)
    rewriter: str | Path | None = option(None, "a local chat model (folder, cache name or .gguf) that writes the split variants; kept "
                                         "when ψ accepts both, else the deterministic variants (the reason recorded)", type=Path)
    library_out: str | Path | None = option(None, "folder of the curated dataset (default OUT/<model>/curate/curated-<dataset>)", type=Path)

    def resolved(self) -> Curate:
        """An explicit ``--library-out`` checked before any model is loaded (:func:`library_folder`)."""
        options = super().resolved()
        if self.library_out is not None:
            try:
                library_folder(options, None if self.dataset is None else resolve_dataset(self.dataset))
            except OutputRefused as refused:
                raise OptionError(f"curate: {refused}") from None
        return options

    def collect(self, ctx: RunContext) -> pd.DataFrame:
        library_folder(ctx.options, ctx.dataset.root, ctx.folder)  # before scoring: a folder it may not replace stops the run now
        dev, held, skills, masks, store = self.development(ctx)
        rows = load_results(store.path)
        plan = curate_library(ctx, dev, benefit_cells(ctx, rows, dev, skills, masks), scoring_margins(store), self)
        if held:
            requests = [(item, on_library(plan.ctx, item, library)) for item in held for library in (plan.original, plan.final)]
            scoring_margins(store)(plan.ctx, requests)
        return load_results(store.path)

    def summarise(self, ctx: RunContext, rows: pd.DataFrame) -> CurationSummary:
        dev, held, cells = self.matrix(ctx, rows)
        plan = curate_library(ctx, dev, cells, recorded_margins(rows), self)  # the same decisions, read from the rows
        held_out = pd.DataFrame()
        per_item = []
        if held:
            margins = recorded_margins(rows)
            frames = []
            for name, library in (("original", plan.original), ("curated", plan.final)):
                values = margins(plan.ctx, [(item, on_library(plan.ctx, item, library)) for item in held])
                frames.append(pd.DataFrame({"item_id": [i.id for i in held], "task_group": [i.task_group for i in held],
                                            "bucket": [i.bucket for i in held], "library": name, "margin": values}))
            long = pd.concat(frames, ignore_index=True)
            long["wrong_choice"] = np.where(long["margin"].notna(), (long["margin"] >= 0).astype(float), np.nan)
            parts = []
            for value in ("margin", "wrong_choice"):
                summary = ci_summary(long, ["bucket", "library"], value).assign(outcome=value)
                delta = paired_differences(long, {CONTRAST: ("curated", "original")}, pair=["item_id", "task_group", "bucket"],
                                           side="library", value=value)
                per_item.append(delta.assign(outcome=value))
                parts += [summary, ci_summary(delta.rename(columns={"contrast": "library"}), ["bucket", "library"], "delta").assign(outcome=value)]
            held_out = pd.concat(parts, ignore_index=True)
        library_dir = write_curated(ctx, plan)
        counts = plan.skills["regime"].value_counts().reindex(list(cur.REGIMES), fill_value=0).to_dict()
        note = (f"{provenance(ctx)} · development items {len(dev)}, held-out {len(held)} · masks K = {self.masks}, f = {self.inclusion} · "
                f"τ_split {self.tau_split}, τ_retire {self.tau_retire} (logits, H = {self.heterogeneity}), τ_merge {self.tau_merge}")
        return CurationSummary(plan.skills, plan.decisions, held_out, pd.concat(per_item, ignore_index=True) if per_item else pd.DataFrame(columns=DELTA_COLUMNS), library_dir, counts, note)

    def tables(self, summary: CurationSummary) -> dict[str, pd.DataFrame]:
        return {"curate_skills": summary.skills, "curate_decisions": summary.decisions, "curate_held_out": summary.held_out}

    def claims(self, summary: CurationSummary) -> list[Claim]:
        """The curated library lowers the held-out margin against the original (T_wrong margin: confirmatory,
        family "curate"; the other buckets and the wrong-choice rate: exploratory). The development gate's
        decisions are rules applied, not findings, and make no claim."""
        return held_out_claims(summary.deltas, "curate", {CONTRAST: "the curated library, against the original,"})

    def figures(self, summary: CurationSummary, out_dir: Path) -> list[Path]:
        plots.style()
        figure = fig15_curation_regimes(summary.skills, summary.decisions, self.heterogeneity, self.tau_split, self.tau_retire, summary.note)
        return plots.save_figure(figure, out_dir, "fig15_curation_regimes")

    def section(self, ctx: RunContext, summary: CurationSummary, figures: list[Path]) -> ReportSection:
        counts = pd.DataFrame([summary.counts])
        decisions = summary.decisions[["step", "skill", "action", "accepted", "reason"]]
        body = (f"Regimes of the skills seen by the development items (benefit = −C of the margin, logits):\n\n{markdown_table(counts)}\n\n"
                f"Decisions (each gated on the development items):\n\n{markdown_table(decisions)}\n\n"
                + (f"Held-out items, original vs curated library (never used to decide):\n\n{markdown_table(summary.held_out)}\n\n"
                   if len(summary.held_out) else "")
                + f"Curated dataset: `{summary.library_dir}` (its README lists every change).")
        return ReportSection("curate", "Seed 003 — library curation: split, retire, merge (`curate`)", figures, body, [], summary)

    def print_summary(self, summary: CurationSummary) -> None:
        print("regimes:", summary.counts)
        print(summary.decisions[["step", "skill", "action", "accepted", "reason"]].to_string(index=False))
        if len(summary.held_out):
            print("held-out:\n" + summary.held_out.round(3).to_string(index=False))
        print(f"curated dataset: {summary.library_dir}")


@dataclass
class Plan:
    """The curation of one run: the decisions, and the libraries (skill ids) before and after."""

    ctx: RunContext  # over the union dataset: the original skills and every variant ψ accepted
    skills: pd.DataFrame
    decisions: pd.DataFrame
    original: frozenset[str]
    final: frozenset[str]
    renamed: dict[str, str]  # a removed skill -> the skill that items naming it as tempting skill now name


def curate_library(ctx: RunContext, dev: list[Item], cells: pd.DataFrame, margins: Margins, options: Curate) -> Plan:
    """Split, retire, merge, in the seed's order; each split, retirement and merged cluster gated on its own."""
    stats = est.row_statistics(cells, ["skill"], value="b")
    domain_of = {s.id: s.domain for s in ctx.dataset.skills.values()}
    seen = dict.fromkeys(s.id for item in dev for s in ctx.dataset.library_for(item))  # the skills of the development items' libraries
    stats = pd.DataFrame({"skill": list(seen)}).merge(stats, on="skill", how="left").assign(
        domain=lambda f: f["skill"].map(domain_of))
    stats["regime"] = cur.regimes(stats["c_bar"], stats[options.heterogeneity], options.tau_split, options.tau_retire).to_numpy()
    stats = stats.set_index("skill", drop=False)
    by_item = {item.id: item for item in dev}
    tempting = {item.tempting_skill for item in ctx.dataset.items}

    # every split candidate's variants, ψ-checked, go into one union dataset (one prompt builder)
    candidates = stats[stats["regime"] == "heterogeneous"].sort_values(options.heterogeneity, ascending=False, kind="stable")
    decisions: list[dict[str, Any]] = []
    variants: dict[str, tuple[Any, Any]] = {}
    rewrite = chat_generator(str(options.rewriter), ctx.options.device) if options.rewriter is not None else None
    for skill_id in candidates["skill"][: options.max_split]:
        row = cells[cells["skill"] == skill_id]
        helped = [by_item[i] for i in row.loc[row["b"] > 0, "item_id"]]
        hurt = [by_item[i] for i in row.loc[row["b"] < 0, "item_id"]]
        catalog = ctx.dataset.domains[domain_of[skill_id]].catalog
        if rewrite is not None and helped and hurt:
            written = cur.chat_variants(rewrite, ctx.dataset.skills[skill_id], helped, hurt, catalog)
            if not isinstance(written, str):
                variants[skill_id] = written
                continue
            decisions.append(decision("split", skill_id, "deterministic variants instead", False, f"{rewrite.label}'s variants: {written}"))
        made = cur.split_variants(ctx.dataset.skills[skill_id], helped, hurt)
        if isinstance(made, str):
            decisions.append(decision("split", skill_id, "kept", False, made))
            continue
        try:
            variants[skill_id] = tuple(validate_skill(v, catalog, domain=domain_of[skill_id]) for v in made)
        except SkillValidationError as error:
            decisions.append(decision("split", skill_id, "kept", False, f"ψ rejected a variant: {error}"))
    for skill_id in candidates["skill"][options.max_split:]:
        decisions.append(decision("split", skill_id, "kept", False, f"beyond max_split ({options.max_split})"))
    union = union_dataset(ctx.dataset, [v for pair in variants.values() for v in pair])
    uctx = dataclasses.replace(ctx, dataset=union, builder=ctx.options.make_builder(ctx.session.tokenizer, union, retriever=ctx.builder.retriever,
                                                                                    tokenizer_name=ctx.builder.tokenizer_name))

    def dev_margins(library: frozenset[str]) -> pd.Series:
        return pd.Series(margins(uctx, [(item, on_library(uctx, item, library)) for item in dev]), index=[item.id for item in dev])

    original = frozenset(ctx.dataset.skills)
    current, renamed = original, {}
    score = dev_margins(current)
    for skill_id, (scoped, guarded) in variants.items():
        trial = (current - {skill_id}) | {scoped.id, guarded.id}
        result = cur.gate(score, after := dev_margins(trial))
        decisions.append(decision("split", skill_id, f"→ {scoped.id}, {guarded.id}", result.accepted, result.reason, result))
        if result.accepted:
            current, score, renamed[skill_id] = trial, after, scoped.id

    retire = [s for s in stats.index[stats["regime"] == "negligible"] if s in current]
    blocked = [s for s in retire if s in tempting]
    for s in blocked:
        decisions.append(decision("retire", s, "kept", False, "the tempting skill of dataset items (an item's tempting_skill must be in a library)"))
    # one at a time, weakest |C̄| first, each gated against the library before it (one harmful retirement
    # must not veto the others); prompts a retirement leaves unchanged are not scored again
    for s in sorted((s for s in retire if s not in blocked), key=lambda s: (abs(stats.loc[s, "c_bar"]), s)):
        trial = current - {s}
        result = cur.gate(score, after := dev_margins(trial))
        decisions.append(decision("retire", s, "retired" if result.accepted else "kept", result.accepted, result.reason, result))
        if result.accepted:
            current, score = trial, after

    # C̄ of a variant: its parent's mean benefit over the items of its side (it has no attribution of its own)
    c_bar = stats["c_bar"].to_dict()
    for parent, (scoped, guarded) in variants.items():
        row = cells[cells["skill"] == parent]["b"]
        c_bar[scoped.id], c_bar[guarded.id] = float(row[row > 0].mean()), float(row[row < 0].mean())
    for domain in sorted(union.domains):  # each cluster gated on its own
        members = [s.id for s in union.domains[domain].library.skills if s.id in current and np.isfinite(c_bar.get(s.id, np.nan))]
        vectors = uctx.builder.retriever.embedder.embed([full_text(union.skills[s]) for s in members]) if len(members) > 1 else np.zeros((0, 1))
        for cluster in cur.merge_clusters(members, vectors, options.tau_merge):
            best = max(cluster, key=lambda s: (c_bar[s], s))
            gone = [s for s in cluster if s != best]
            trial = current - set(gone)
            result = cur.gate(score, after := dev_margins(trial))
            decisions += [decision("merge", s, f"into {best}", result.accepted, result.reason, result) for s in gone]
            if result.accepted:
                current, score = trial, after
                renamed.update(dict.fromkeys(gone, best))
    for old, new in list(renamed.items()):  # a split variant merged away: its parent's items name the survivor
        while new in renamed:
            new = renamed[new]
        renamed[old] = new
    columns = ["step", "skill", "action", "accepted", "reason", "margin_before", "margin_after", "correct_before", "correct_after", "n_items"]
    return Plan(uctx, stats.reset_index(drop=True), pd.DataFrame(decisions, columns=columns), original, current, renamed)


@functools.cache
def chat_generator(model: str, device: str) -> ChatGenerator:
    """The rewriting chat model, loaded once per process (``collect`` and ``summarise`` both ask it, greedily: the same replies)."""
    return ChatGenerator.load(model, device=device)


def decision(step: str, skill: str, action: str, accepted: bool, reason: str, result: cur.GateResult | None = None) -> dict[str, Any]:
    gate = dataclasses.asdict(result) if result is not None else {}
    return {"step": step, "skill": skill, "action": action, "accepted": accepted, "reason": reason,
            **{k: gate.get(k, np.nan) for k in ("margin_before", "margin_after", "correct_before", "correct_after", "n_items")}}


def full_text(skill) -> str:
    """What merging embeds: the goal, procedure and boundary slots (split variants differ only in the last)."""
    return " ".join((skill_text(skill), *(item for slot in BOUNDARY_SLOTS for item in skill.slot_items(slot))))


def union_dataset(dataset: ProbeDataset, extra: Sequence[Any]) -> ProbeDataset:
    """``dataset`` with the skills ``extra`` added to their domains' libraries (the items unchanged)."""
    domains = dict(dataset.domains)
    for skill in extra:
        domain = domains[skill.domain]
        domains[skill.domain] = dataclasses.replace(domain, library=LibraryReport((*domain.library.skills, skill), ()))
    return ProbeDataset(dataset.root, domains, dataset.items)


CURATED_FILES = ("domains", "items.jsonl", "decisions.csv", "README.md", CARD_NAME)  # what a rerun replaces (a stale card too)
WHAT = "curated library"  # how a refused --library-out names it
README_TITLE = "# Curated library of "


def is_curated_library(folder: Path) -> bool:
    """``folder`` was written by ``curate``: its ``decisions.csv`` and its README (a regular file, not a link) with our title."""
    readme = folder / "README.md"
    if readme.is_symlink() or not readme.is_file() or not (folder / "decisions.csv").is_file():
        return False
    with readme.open(encoding="utf-8", errors="replace") as handle:
        return handle.readline().startswith(README_TITLE)


def library_folder(options: Curate, source: Path | None, analysis_dir: Path | None = None) -> tuple[OutputRoot, Path]:
    """The root and folder the curated library is written to, refused (:class:`OutputRefused`) when it is
    empty, the source dataset (or inside it, or holding it), or a non-empty folder that is not a previous
    curated library without ``--overwrite``. Default: ``OUT/<model>/curate/curated-<dataset>`` (needs ``analysis_dir``, ``OUT/<model>/curate``)."""
    if options.library_out is not None:
        root = OutputRoot(options.library_out, overwrite=options.overwrite, flag="--library-out")
        folder = root.path()
    else:
        root = OutputRoot(options.out, overwrite=options.overwrite)
        folder = root.path(analysis_dir / f"curated-{Path(options.dataset).name}")
    if source is not None:
        mine, theirs = folder.resolve(), Path(source).resolve()
        if mine == theirs or theirs in mine.parents or mine in theirs.parents:
            raise OutputRefused(f"--library-out {folder} {'is' if mine == theirs else 'overlaps'} the source dataset {source}; "
                                "the curated library would replace the dataset it is read from: use another folder")
    root.check_folder(folder, is_previous=is_curated_library, what=WHAT)
    return root, folder


def write_curated(ctx: RunContext, plan: Plan) -> Path:
    """The curated library as a dataset folder (domains/, items.jsonl with tempting skills renamed,
    decisions.csv, README.md), staged and checked by loading it back before it replaces the folder
    (:func:`library_folder`): links in a previous library are replaced, never written through."""
    root, out = library_folder(ctx.options, ctx.dataset.root, ctx.folder)
    with root.folder(out, is_previous=is_curated_library, what=WHAT, generated=CURATED_FILES) as stage:
        library = OutputRoot(stage)
        for name, domain in plan.ctx.dataset.domains.items():
            raw = json.loads((ctx.dataset.root / "domains" / f"{name}.json").read_text(encoding="utf-8"))
            raw["skills"] = [s.to_json() for s in domain.library.skills if s.id in plan.final]
            library.write(f"domains/{name}.json", json.dumps(raw, indent=2, ensure_ascii=False) + "\n")
        lines = []
        for line in (ctx.dataset.root / "items.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                raw = json.loads(line)
                raw["tempting_skill"] = plan.renamed.get(raw["tempting_skill"], raw["tempting_skill"])
                lines.append(json.dumps(raw, ensure_ascii=False))
        library.write("items.jsonl", "\n".join(lines) + "\n")
        library.write_table("decisions.csv", plan.decisions)
        counts = plan.skills["regime"].value_counts().to_dict()
        accepted = plan.decisions[plan.decisions["accepted"].astype(bool)]
        readme = [f"{README_TITLE}`{ctx.dataset.root.name}` (seed 003 §2.2, `basm-probes curate`)", "",
                  f"Model: {ctx.model_path}. Decided on {len(partition(ctx)[0])} development items (split {DEVELOPMENT!r}) only.",
                  f"Skills: {len(plan.original)} → {len(plan.final)}. Regimes: {counts}.", "",
                  "Every change below passed the development gate (mean margin no higher, no fewer correct two-way choices);",
                  "`decisions.csv` lists every decision, rejected ones with their reason. Items whose tempting skill was split",
                  "or merged away name its replacement (the scoped variant, the merge survivor).", "",
                  "| step | skill | action | reason |", "|---|---|---|---|",
                  *[f"| {r.step} | {r.skill} | {r.action} | {r.reason} |" for r in accepted.itertuples()]]
        if accepted.empty:
            readme.append("| — | — | no change passed the gate: the library is the original | — |")
        library.write("README.md", "\n".join(readme) + "\n")
        try:
            load_dataset(stage)
        except DatasetError as error:
            raise RuntimeError(f"the curated dataset for {out} does not load: {error}") from error
    return out


# --- Fig. 15, drawn by Curate.figures
REGIME_COLORS = {"heterogeneous": "#d95f02", "beneficial": "#1b9e77", "negligible": "#7570b3", "harmful": "#e7298a", "unmeasured": "0.6"}


def fig15_curation_regimes(skills: pd.DataFrame, decisions: pd.DataFrame, heterogeneity: str, tau_split: float, tau_retire: float,
                           note: str) -> plt.Figure:
    """C̄ against H per skill (benefit scale, logits), coloured by regime, with the thresholds τ_split and
    ±τ_retire; an outline marks each skill whose split, retirement or merge passed the gate.

    skills: skill, c_bar, regime and the column ``heterogeneity`` (h_range or h_iqr) the regimes were decided on;
    decisions: step, skill, accepted."""
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    h = heterogeneity
    measured = skills.dropna(subset=["c_bar", h])
    for regime, sub in measured.groupby("regime", sort=False):
        ax.scatter(sub["c_bar"], sub[h], s=22, color=REGIME_COLORS.get(regime, "0.3"), label=f"{regime} ({len(sub)})")
    changed = set(decisions.loc[decisions["accepted"].astype(bool), "skill"])
    hit = measured[measured["skill"].isin(changed)]
    ax.scatter(hit["c_bar"], hit[h], s=80, facecolors="none", edgecolors="k", lw=1.0, label=f"changed, gate passed ({len(hit)})")
    ax.axhline(tau_split, color="0.3", lw=0.8, ls="--")
    for x in (-tau_retire, tau_retire):
        ax.axvline(x, color="0.5", lw=0.8, ls=":")
    ax.set_xlabel("C̄(j): mean benefit over development items (−C of the margin, logits)")
    ax.set_ylabel(f"H(j) ({'interquartile range' if h == 'h_iqr' else 'range'} over items, logits)")
    ax.set_title(f"Curation regimes (dashed: τ_split = {tau_split:.2f}; dotted: ±τ_retire = {tau_retire:.2f})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    plots.footnote(fig, note)
    return fig
