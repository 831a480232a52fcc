"""The dataset folder an import writes, in the layout of ``datasets/basm_probe/``
(``domains/<Class>.json``, ``items.jsonl``) with the label audit's dropped items, the skills'
sources (and rejections, for the LLM extractor) and the README; through a staged folder that
replaces ``out`` only once every file is written (:meth:`probes.core.files.OutputRoot.folder`)."""

from __future__ import annotations

import json
from pathlib import Path

from probes.core.files import OutputRoot
from probes.data.bfcl.extract import Skills
from probes.data.bfcl.import_report import ImportReport
from probes.data.bfcl.items import ProbeItems
from probes.data.bfcl.readme import render_readme
from probes.data.dataset import AUDIT_FILE, CARD_NAME

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
    with OutputRoot(report.out, overwrite=overwrite).folder(".", is_previous=is_bfcl_import, what=WHAT, generated=BFCL_IMPORT_FILES) as stage:
        folder = OutputRoot(stage)

        def write(name: str, text: str) -> None:
            report.sizes[name] = folder.write(name, text).stat().st_size

        for domain, content in skills.domain_files.items():
            write(f"domains/{domain}.json", json.dumps(content, indent=1) + "\n")
        write("items.jsonl", "".join(json.dumps(row) + "\n" for row in items.rows))
        folder.write(AUDIT_FILE, "".join(json.dumps(row.to_json()) + "\n" for row in items.dropped))
        if skills.extraction is not None:  # else none: a stale one of an earlier LLM import is not carried over
            folder.write("skill_rejections.json", json.dumps([rejection.to_json() for rejection in skills.extraction.rejected], indent=1) + "\n")
        folder.write("skill_sources.json", json.dumps(skills.sources, indent=1) + "\n")
        folder.write(README, render_readme(report))
