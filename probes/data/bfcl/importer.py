"""``import_bfcl``: BFCL's multi-turn entries to a probe dataset folder, as the pipeline of the
stages of this package (load, split, replay and collect evidence, extract skills, make and audit
the items, write)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from probes.data.bfcl.evidence import collect_evidence
from probes.data.bfcl.extract import EXTRACTORS, extract_skills
from probes.data.bfcl.folder import WHAT, is_bfcl_import, write_folder
from probes.data.bfcl.import_report import ImportReport, counts_by_category
from probes.data.bfcl.items import make_items
from probes.data.bfcl.replay import replay
from probes.data.bfcl.source import CATEGORIES, SKILL_CATEGORIES, BFCLDataError, BFCLSource, category_file, data_version, split_indices
from probes.data.extract_llm import RETRIES, LLMExtractor, TextGenerator
from probes.core.files import OutputRoot


class NoSkillKept(BFCLDataError):
    """The extractor kept no skill, so no decision point has a skill: nothing is written."""


def import_bfcl(
    *,
    out: str | Path,
    bfcl_dir: str | Path | None = None,
    categories: Sequence[str] = CATEGORIES,
    skill_fraction: float = 0.5,
    seed: int = 0,
    max_probe_entries: int | None = None,
    extractor: str = "deterministic",
    llm_model: TextGenerator | None = None,
    llm_retries: int = RETRIES,
    overwrite: bool = False,
) -> ImportReport:
    """Write a probe dataset from BFCL's multi-turn entries to ``out`` (the data files and the README)
    and return what it holds.

    ``categories``: the multi-turn categories items are made from (skills always use the
    skill-source entries of base, miss_func and miss_param). ``skill_fraction``: share of entry
    indices whose trajectories feed skill extraction (none of them yields an item). ``seed``: the
    split's permutation. ``max_probe_entries``: keep only the first N probe indices (a small
    sample; the README says so).

    ``extractor``: ``"deterministic"`` (:func:`~probes.data.bfcl.extract.extract_skill`) or ``"llm"``
    (:class:`probes.data.extract_llm.LLMExtractor` on the same evidence, :func:`~probes.data.bfcl.extract.llm_candidate`),
    which needs ``llm_model``, a text generator such as
    ``probes.engine.generate.ChatGenerator.load(folder)``, and retries a rejected reply
    ``llm_retries`` times. Raises :class:`NoSkillKept`, writing nothing, when no skill passes ψ.

    The measured ``CARD.md`` is not written here (it needs the scoring layer): ``basm-probes
    bfcl-import`` (:func:`probes.analyses.dataset_tools.bfcl_import`) writes it next; a previous import's card
    is removed, not left stale. The committed ``datasets/bfcl/`` is that command's output with every default.

    ``out`` is written into a temporary folder that replaces it at the end
    (:meth:`probes.core.files.OutputRoot.folder`): a non-empty ``out`` that is not a previous BFCL import
    is refused (:class:`~probes.core.files.OutputRefused`) unless ``overwrite``.
    """
    out = OutputRoot(out, overwrite=overwrite).check_folder(".", is_previous=is_bfcl_import, what=WHAT)  # before any work
    llm = _extractor(extractor, llm_model, llm_retries)
    if max_probe_entries is not None and max_probe_entries < 1:  # a negative slice would keep all but the last entries
        raise ValueError(f"--max-probe-entries must be ≥ 1, got {max_probe_entries}")
    categories = tuple(categories)
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown or not categories:
        raise ValueError(f"categories must be a non-empty subset of {CATEGORIES}, got {list(categories)}")

    source = BFCLSource.load(bfcl_dir, categories)
    skill_indices, probe_indices = split_indices(source.indices, skill_fraction=skill_fraction, seed=seed)
    probe_indices = probe_indices[:max_probe_entries]
    evidence = collect_evidence(replay(entry, category, source.classes) for category, entry in source.entries_of(SKILL_CATEGORIES, set(skill_indices)))
    skills = extract_skills(source, evidence, llm)  # Eq. 6 per tool anchor, ψ per domain (Eq. 7)
    if not skills.skill_of:
        reasons = Counter(reason for problems in skills.rejected.values() for reason in problems)
        raise NoSkillKept(f"the {extractor} extractor kept no skill of {sum(skills.candidates.values())} candidates, so no decision "
                          f"point has one; nothing written to {out}. Discarded: "
                          + "; ".join(f"{count} × {reason}" for reason, count in reasons.most_common()))
    items = make_items(source, categories, probe_indices, skills.skill_of)

    report = ImportReport(
        out=out, categories=categories, skill_indices=skill_indices, probe_indices=probe_indices, items=counts_by_category(items.rows),
        skipped=items.skipped, candidates=skills.candidates, kept=skills.kept, rejected=skills.rejected, unanchored=skills.unanchored,
        invalid_arguments=items.invalid_arguments, skill_fraction=skill_fraction, seed=seed, max_probe_entries=max_probe_entries,
        source_files=", ".join(category_file(source.data_dir, c).name for c in categories), data_version=data_version(source.data_dir),
        tools={domain: len(tools) for domain, tools in source.tools.items()}, extractor=extractor, extraction=skills.extraction,
        audited=[row for row in items.rows if "audit" in row], dropped=items.dropped, unmatched=items.unmatched,
        pairs=sum(1 for row in items.rows if row["bucket"] == "T_wrong" and "match_id" in row),
        llm_settings={} if llm is None else {"model": llm.generator.label, "max_new_tokens": llm.generator.max_new_tokens,
                                             "batch_size": llm.generator.batch_size, "retries": llm.retries},
    )
    write_folder(report, skills, items, overwrite=overwrite)
    return report


def _extractor(extractor: str, llm_model: TextGenerator | None, retries: int) -> LLMExtractor | None:
    """The LLM extractor of ``extractor="llm"`` (None: the deterministic one), its arguments checked."""
    if extractor not in EXTRACTORS:
        raise ValueError(f"extractor must be one of {EXTRACTORS}, got {extractor!r}")
    if (extractor == "llm") != (llm_model is not None):
        raise ValueError("extractor='llm' needs llm_model (a text generator), and llm_model is used only with it")
    if llm_model is not None and not callable(llm_model):
        raise ValueError(f"llm_model must be a text generator such as probes.engine.generate.ChatGenerator.load(<model folder>), "
                         f"got {type(llm_model).__name__} {llm_model!r:.80}")
    return LLMExtractor(llm_model, retries=retries) if llm_model is not None else None
