"""Where each output of a model's runs lives: the one place that decides the results folder's layout.

::

    OUT/<model>/
        report.md  explore.html  claims.csv   the report, the page, every claim of the report
        figures/                              every figure, PNG + PDF (figNN_*.png)
        <analysis>/                           one folder per analysis: its rows (<analysis>.jsonl, and the
                                              further rows files it writes, e.g. heads/heads_causal.jsonl),
                                              its tables (<table>.csv, its claims among them) and its other
                                              outputs (circuit graphs, the feature cache, a curated library)

Every reader and writer asks here (run contexts, ``report``, ``explore``, :func:`probes.load`, the contract
check, the scripts); a results folder in the earlier flat layout (every file in ``OUT/<model>/``) is
refused with the command that moves it (:func:`check_layout`, :func:`migrate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from probes.core.files import OutputRefused, OutputRoot

FIGURES = "figures"
REPORT = "report.md"
PAGE = "explore.html"
CLAIMS = "claims.csv"
TOP_LEVEL = frozenset({FIGURES, REPORT, PAGE, CLAIMS})  # what stays at OUT/<model>/ itself


class OldLayout(OutputRefused):
    """A results folder in the earlier flat layout; the message names the move."""


def analysis_folder(model_dir: str | Path, analysis: str) -> Path:
    """``OUT/<model>/<analysis>/``: the rows, tables and other outputs of one analysis."""
    return Path(model_dir) / analysis


def rows_path(model_dir: str | Path, analysis: str, stem: str | None = None) -> Path:
    """The rows file ``stem`` (default: the analysis's own, ``<analysis>.jsonl``) of ``analysis``."""
    return analysis_folder(model_dir, analysis) / f"{stem or analysis}.jsonl"


def table_path(model_dir: str | Path, analysis: str, table: str) -> Path:
    """The summary table ``table`` (its file stem, e.g. ``sweep_summary``) of ``analysis``."""
    return analysis_folder(model_dir, analysis) / f"{table}.csv"


def figures_folder(model_dir: str | Path) -> Path:
    """``OUT/<model>/figures/``: every analysis's figures and the report's."""
    return Path(model_dir) / FIGURES


def analyses_in(model_dir: str | Path) -> list[str]:
    """The analyses with results in ``model_dir`` (a folder holding its own rows file)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(p.name for p in model_dir.iterdir() if p.is_dir() and rows_path(model_dir, p.name).is_file())


def flat_results(model_dir: str | Path) -> list[Path]:
    """Rows files directly in ``model_dir``: the earlier flat layout (none in this one)."""
    model_dir = Path(model_dir)
    return sorted(model_dir.glob("*.jsonl")) if model_dir.is_dir() else []


def migrate_command(model_dir: str | Path) -> str:
    return f"basm-probes migrate {model_dir}"


def check_layout(model_dir: str | Path) -> Path:
    """``model_dir``, refused (:class:`OldLayout`) when it holds results in the flat layout: they would be
    neither resumed nor read, and a new run would compute them again beside them."""
    flat = flat_results(model_dir)
    if flat:
        names = ", ".join(p.name for p in flat[:4]) + (f" and {len(flat) - 4} more" if len(flat) > 4 else "")
        raise OldLayout(f"{model_dir} holds results in the earlier flat layout ({names}); results now live in one folder per "
                        f"analysis (OUT/<model>/<analysis>/<analysis>.jsonl with its tables; figures in OUT/<model>/{FIGURES}/). "
                        f"Move them once with: {migrate_command(model_dir)} (or use a new --out)")
    return Path(model_dir)


def owner(name: str, analyses: Sequence[str]) -> str | None:
    """The analysis a flat-layout file or folder named ``name`` belongs to: the longest analysis name
    its name starts with (``heads_causal.jsonl``: heads; ``mask_eval_items.csv``: mask-eval; ``curated-X``: curate)."""
    plain = name.replace("-", "_")
    matches = [a for a in analyses if plain.startswith(a.replace("-", "_"))]
    return max(matches, key=len) if matches else None


def migrate(model_dir: str | Path, analyses: Sequence[str]) -> list[tuple[Path, Path]]:
    """Move a flat-layout results folder into this layout: each file and folder of an analysis into its
    folder, names unchanged; the report, the page, the claims and ``figures/`` stay. Returns the moves
    (source, target); an entry of no analysis is left where it is and named (``OutputRefused`` before any
    move: nothing half-moved)."""
    root = OutputRoot(model_dir)
    model_dir = root.path()
    entries = sorted(p for p in model_dir.iterdir() if p.name not in TOP_LEVEL and not p.name.startswith(".")
                     and not (p.is_dir() and p.name in analyses))
    unknown = [p.name for p in entries if owner(p.name, analyses) is None]
    if unknown:
        raise OutputRefused(f"{model_dir}: {', '.join(unknown)} belong to no analysis ({', '.join(analyses)}); nothing was moved. "
                            "Move or delete them, then migrate again")
    moves = [(p, analysis_folder(model_dir, owner(p.name, analyses)) / p.name) for p in entries]  # type: ignore[arg-type]
    taken = [str(target) for _, target in moves if target.exists() or target.is_symlink()]
    if taken:
        raise OutputRefused(f"{', '.join(taken)} already exist; nothing was moved: remove them (or the flat copies) and migrate again")
    return [(source, root.move(source, target)) for source, target in moves]
