"""The analysis registry: an analysis is one module (registered at its definition), and the CLI,
``probes.run``, ``report`` and ``probes.load`` pick it up; names and options are checked with
the known ones listed; ``basm-probes --help`` lists the analyses without importing torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import probes
import probes.analyses
from probes.analyses import UnknownAnalysis, register
from probes.analyses.base import Analysis
from probes.analyses.option_system import UnknownOption
from probes.cli.main import main
from probes.reporting import plots
from probes.reporting.layout import rows_path


ROOT = Path(__file__).resolve().parents[2]
PLANTED = '''
"""A planted analysis: one module, nothing else edited (tests/analyses/test_registry.py)."""

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from probes.analyses import register
from probes.analyses.base import Analysis, ReportSection
from probes.analyses.jobs import Job, cached_scorer, run_jobs
from probes.reporting import plots
from probes.reporting.layout import rows_path
from probes.reporting.results import load_results


@register("planted", order=90)
class Planted(Analysis):
    """Planted: the Base margin of each item at k = 0."""

    def collect(self, ctx) -> pd.DataFrame:
        store = ctx.store()
        jobs = [Job(item, "base", 0, ctx.fmt, ("baseline",)) for item in ctx.items]
        run_jobs(ctx, store, jobs, cached_scorer(ctx, lambda record, job: (), margins=("margin",)))
        return load_results(store.path)

    def summarise(self, ctx, rows: pd.DataFrame) -> pd.DataFrame:
        return rows[["item_id", "margin"]]

    def tables(self, summary: pd.DataFrame) -> dict[str, pd.DataFrame]:
        return {"planted_summary": summary}

    def figures(self, summary: pd.DataFrame, out_dir: Path) -> list[Path]:
        plots.style()
        return plots.save_figure(fig99_planted_margins(summary), out_dir, "planted_margins")

    def section(self, ctx, summary: pd.DataFrame, figures: list[Path]) -> ReportSection:
        return ReportSection("planted", "Planted margins (`planted`)", figures, f"{len(summary)} items planted.")


def fig99_planted_margins(summary: pd.DataFrame) -> plt.Figure:
    """Its figure, drawn here with the shared helpers of probes.reporting.plots."""
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar(range(len(summary)), summary["margin"], color=plots.color("base"))
    plots.footnote(fig, f"{len(summary)} items")
    return fig
'''


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A folder with one analysis module, added to the package's search path."""
    folder = tmp_path / "extra_analyses"
    folder.mkdir()
    (folder / "planted.py").write_text(PLANTED)
    monkeypatch.setattr(probes.analyses, "__path__", [*probes.analyses.__path__, str(folder)])
    yield folder
    sys.modules.pop("probes.analyses.planted", None)
    probes.analyses._registered.pop("planted", None)


def test_a_planted_module_is_listed_in_the_help_without_being_imported(planted, capsys) -> None:
    assert "planted" in probes.analyses.ANALYSES and list(probes.ANALYSES)[-1] == "planted"  # order 90: after forks
    with pytest.raises(SystemExit) as code:
        main(["--help"])
    assert code.value.code == 0
    assert "planted             Planted: the Base margin of each item at k = 0." in capsys.readouterr().out
    assert "probes.analyses.planted" not in sys.modules
    with pytest.raises(SystemExit):
        main(["planted", "--help"])
    assert "--k-max" in capsys.readouterr().out and probes.analyses.get("planted").name == "planted"


def test_a_planted_analysis_runs_in_probes_run_report_and_load(planted, tiny_qwen3_dir, tmp_path) -> None:
    common = {"model": str(tiny_qwen3_dir), "embedder": "lexical", "relevance": "lexical", "item_ids": ["retail-wrong-0001"],
              "k_max": 0, "split": "all", "out": tmp_path / "out"}
    result = probes.run("planted", **common)
    assert list(result.rows["item_id"]) == ["retail-wrong-0001"] and result.summary_table.shape == (1, 2)
    assert [p.name for p in result.figures] == ["planted_margins.png", "planted_margins.pdf"]
    # its figure is drawn by its own module: nothing was added to the shared plotting module
    assert sys.modules["probes.analyses.planted"].fig99_planted_margins.__module__ == "probes.analyses.planted"
    assert not misplaced_figures({**package_sources(), "probes.analyses.planted": PLANTED})
    done = probes.load(rows_path(result.out_dir, "planted"))
    assert done.rows["margin"].tolist() == result.rows["margin"].tolist()
    assert list(done.tables) == ["planted_summary"] and done.config["k_max"] == 0
    assert probes.load(result.out_dir, "planted").config == done.config
    assert main(["report", "--analyses", "sweep,planted", "--model", str(tiny_qwen3_dir), "--embedder", "lexical", "--relevance",
                 "lexical", "--item", "retail-wrong-0001", "--k-max", "0", "--split", "all", "--out", str(tmp_path / "out")]) == 0
    text = (result.out_dir / "report.md").read_text()
    assert "## Planted margins (`planted`)" in text and "1 items planted." in text and "planted_margins.png" in text
    assert text.index("## Fig. 2") < text.index("## Planted")  # report order


def test_a_planted_module_with_a_taken_name_is_refused(planted) -> None:
    (planted / "planted.py").write_text(PLANTED.replace('@register("planted", order=90)', '@register("sweep", order=90)'))
    with pytest.raises(ValueError, match="analysis 'sweep' is registered twice: in probes.analyses.sweep and probes.analyses.planted"):
        probes.analyses.catalogue()


def test_a_duplicate_registration_is_refused() -> None:
    with pytest.raises(ValueError, match=r"@register\('sweep'\): .*Other clashes with probes.analyses.sweep.Sweep"):
        probes.analyses.get("sweep")  # registered
        register("sweep", order=10)(type("Other", (Analysis,), {"__doc__": "Other."}))
    with pytest.raises(TypeError, match="is not a subclass of probes.analyses.base.Analysis"):
        register("loose", order=999)(type("Loose", (), {}))
    assert "loose" not in probes.analyses._registered


def test_an_unknown_analysis_names_the_close_ones_and_every_known_one(capsys) -> None:
    with pytest.raises(UnknownAnalysis) as error:
        probes.analyses.get("swep")
    assert str(error.value) == ("unknown analysis 'swep'; did you mean 'sweep'? Known: sweep, ratios, looking, suppression, knockout, heads, "
                                "linear, calls, repair, paired, attribution, curate, mask-eval, forks, circuit, steer")
    with pytest.raises(UnknownAnalysis, match="did you mean 'knockout'"):
        probes.run("knockouts")
    with pytest.raises(SystemExit):
        main(["swep"])
    assert "invalid choice: 'swep'" in capsys.readouterr().err


def test_an_unknown_option_names_the_close_ones_and_every_valid_one() -> None:
    with pytest.raises(UnknownOption) as error:
        probes.run("sweep", kmax=2)
    message = str(error.value)
    assert message.startswith("sweep: unknown option 'kmax'; did you mean 'k_max'? Known: model, dtype, ")
    assert "configs, controls, priming" in message
    with pytest.raises(UnknownOption, match="report: unknown option 'analysis'; did you mean 'analyses'"):
        probes.run("report", analysis=["sweep"])
    assert "k_max" in probes.options("sweep") and "analyses" in probes.options("report")
    assert 'probes.options("sweep")' in probes.run.__doc__


@pytest.mark.subprocess
def test_the_top_level_help_is_fast_and_imports_no_torch() -> None:
    script = textwrap.dedent("""
        import sys, time
        start = time.perf_counter()
        from probes.cli.main import main
        try:
            main(["--help"])
        except SystemExit as exit:
            assert exit.code == 0
        heavy = sorted(m for m in ("torch", "transformers", "pandas", "matplotlib") if m in sys.modules)
        assert not heavy, heavy
        print(f"{time.perf_counter() - start:.2f}", file=sys.stderr)
    """)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert "sweep" in done.stdout and "paired" in done.stdout and "report" in done.stdout
    assert wall < 5, f"basm-probes --help took {wall:.1f} s (interpreter start included); it must stay under 2 s on a quiet machine"


FIGURE_FUNCTION = re.compile(r"fig\d+_")


def package_sources() -> dict[str, str]:
    """The source of every module of the package, by dotted name."""
    root = Path(probes.__file__).resolve().parent
    return {".".join(("probes", *path.relative_to(root).with_suffix("").parts)): path.read_text() for path in root.rglob("*.py")}


def misplaced_figures(sources: dict[str, str]) -> list[str]:
    """Each figure function (``figNN_*``) that does not live with the analysis that draws it: one
    defined outside probes.analyses (in the shared probes.reporting.plots, say), or one its own
    module never calls."""
    out = []
    for module, source in sources.items():
        tree = ast.parse(source)
        called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and FIGURE_FUNCTION.match(node.name):
                if not module.startswith("probes.analyses.") or node.name not in called:
                    out.append(f"{module}.{node.name}")
    return out


def test_each_figure_lives_with_the_analysis_that_draws_it() -> None:
    sources = package_sources()
    figures = [f"{m}.{n.name}" for m, s in sources.items() for n in ast.parse(s).body
               if isinstance(n, ast.FunctionDef) and FIGURE_FUNCTION.match(n.name)]
    assert len(figures) == 22 and all(f.startswith("probes.analyses.") for f in figures), figures  # Figs. 2–23
    assert misplaced_figures(sources) == []
    assert not [name for name in vars(plots) if FIGURE_FUNCTION.match(name)]
    # the check fails on a figure put back into the shared module, or on one its analysis does not draw
    shared = sources["probes.reporting.plots"] + "\n\ndef fig21_planted(table):\n    return None\n"
    assert misplaced_figures({**sources, "probes.reporting.plots": shared}) == ["probes.reporting.plots.fig21_planted"]
    sweep = sources["probes.analyses.sweep"].replace("plots.save_figure(fig02_retrieval_trap(", "plots.save_figure(another_figure(")
    assert misplaced_figures({**sources, "probes.analyses.sweep": sweep}) == ["probes.analyses.sweep.fig02_retrieval_trap"]


def figure_block_faults(source: str) -> list[str]:
    """What in a module's source breaks the resume digest's rule: every figure function after the figure
    block's marker, and nothing that shapes rows (a class, collect) inside it."""
    from probes.analyses.run_context import FIGURE_BLOCK

    marker = FIGURE_BLOCK.decode()
    head, _, block = source.partition(marker)
    faults = [f"figure before the marker: {n.name}" for n in ast.parse(head).body
              if isinstance(n, ast.FunctionDef) and FIGURE_FUNCTION.match(n.name)]
    if block:
        tail = ast.parse(textwrap.dedent(marker.lstrip("\n") + block))
        faults += [f"class in the figure block: {n.name}" for n in tail.body if isinstance(n, ast.ClassDef)]
    return faults


def test_figure_code_is_left_out_of_the_resume_digest() -> None:
    """An analysis's figures close its module, after the marker the digest cuts at: editing a figure keeps
    results resumable, editing anything before it does not."""
    from probes.analyses.run_context import row_source

    sources = package_sources()
    drawing = [m for m, s in sources.items() if m.startswith("probes.analyses.") and FIGURE_FUNCTION.search(s)]
    assert len(drawing) >= 12
    assert {m: figure_block_faults(sources[m]) for m in drawing if figure_block_faults(sources[m])} == {}
    sweep = sources["probes.analyses.sweep"].encode()
    restyled = sweep.replace(b"def fig02_retrieval_trap(", b"def fig02_retrieval_trap(  ", 1)
    assert restyled != sweep and row_source(restyled) == row_source(sweep)
    rescored = sweep.replace(b"class Sweep(", b"class Sweep( ", 1)
    assert row_source(rescored) != row_source(sweep)
    # the check fails on a figure above the marker and on a class below it
    planted = "def fig99_early(t):\n    return t\n" + sources["probes.analyses.sweep"] + "\nclass Late:\n    pass\n"
    assert figure_block_faults(planted) == ["figure before the marker: fig99_early", "class in the figure block: Late"]
