"""The dataset folder an import writes, in the layout of ``datasets/basm_probe/``
(``domains/<Class>.json``, ``items.jsonl``) with the label audit's dropped items, the skills'
sources (and rejections, for the LLM extractor) and the README; through a staged folder that
replaces ``out`` only once every file is written (:func:`probes.data.staging.staged_folder`)."""

from __future__ import annotations

import json
from pathlib import Path

from probes.data.bfcl.extract import Skills
from probes.data.bfcl.import_report import ImportReport
from probes.data.bfcl.items import ProbeItems
from probes.data.bfcl.readme import render_readme
from probes.data.dataset import AUDIT_FILE, CARD_NAME
from probes.data.staging import staged_folder

README = "README.md"
# What an import writes: a previous import's files of these names are replaced or, when this one
# writes none (skill_rejections.json of a deterministic import, CARD.md), removed rather than left stale.
BFCL_IMPORT_FILES = ("domains", "items.jsonl", AUDIT_FILE, "skill_sources.json", "skill_rejections.json", README, CARD_NAME)
WHAT = "BFCL import"  # how a refused --out names the generator


def is_bfcl_import(folder: Path) -> bool:
    """``folder`` was written by :func:`~probes.data.bfcl.import_bfcl`: it has ``skill_sources.json``, and the first item
    of its ``items.jsonl`` comes from a BFCL multi-turn entry."""
    try:
        with (folder / "items.jsonl").open("rb") as handle:
            first = json.loads(handle.readline())
        return (folder / "skill_sources.json").is_file() and str(first["source"]["entry"]).startswith("multi_turn_")
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_folder(report: ImportReport, skills: Skills, items: ProbeItems, *, overwrite: bool) -> None:
    """Write the import to ``report.out`` (staged; a failure leaves ``out`` as it was) and record each
    data file's size in ``report.sizes``."""
    with staged_folder(report.out, is_previous=is_bfcl_import, overwrite=overwrite, what=WHAT, generated=BFCL_IMPORT_FILES) as stage:
        (stage / "domains").mkdir()
        for domain, content in skills.domain_files.items():
            path = stage / "domains" / f"{domain}.json"
            path.write_text(json.dumps(content, indent=1) + "\n")
            report.sizes[f"domains/{domain}.json"] = path.stat().st_size
        items_path = stage / "items.jsonl"
        items_path.write_text("".join(json.dumps(row) + "\n" for row in items.rows))
        report.sizes["items.jsonl"] = items_path.stat().st_size
        (stage / AUDIT_FILE).write_text("".join(json.dumps(row.to_json()) + "\n" for row in items.dropped))
        if skills.extraction is not None:  # else none: a stale one of an earlier LLM import is not carried over
            (stage / "skill_rejections.json").write_text(json.dumps([rejection.to_json() for rejection in skills.extraction.rejected], indent=1) + "\n")
        (stage / "skill_sources.json").write_text(json.dumps(skills.sources, indent=1) + "\n")
        (stage / README).write_text(render_readme(report), encoding="utf-8")
