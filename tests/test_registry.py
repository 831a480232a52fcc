"""The analysis registry: an analysis is one module (registered at its definition), and the CLI,
``probes.run``, ``report`` and ``probes.load`` pick it up; names and options are checked with
the known ones listed; ``basm-probes --help`` lists the analyses without importing torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import probes
import probes.analyses
from probes.analyses import UnknownAnalysis, register
from probes.analyses.base import Analysis, OptionError, UnknownOption, check_session
from probes.cli.main import main

ROOT = Path(__file__).resolve().parent.parent

PLANTED = '''
"""A planted analysis: one module, nothing else edited (tests/test_registry.py)."""

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from probes.analyses import register
from probes.analyses.base import Analysis, Job, ReportSection, cached_scorer, run_jobs
from probes.reporting import plots
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
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.bar(range(len(summary)), summary["margin"])
        return plots.save_figure(fig, out_dir, "planted_margins")

    def section(self, ctx, summary: pd.DataFrame, figures: list[Path]) -> ReportSection:
        return ReportSection("planted", "Planted margins (`planted`)", figures, f"{len(summary)} items planted.")
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
    done = probes.load(result.out_dir / "planted.jsonl")
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
    assert str(error.value) == ("unknown analysis 'swep'; did you mean 'sweep'? Known: sweep, ratios, suppression, knockout, heads, "
                                "linear, calls, repair, paired, attribution, curate, mask-eval, forks")
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


def _session(dtype: torch.dtype = torch.float32, device: str = "cpu", name: str | None = None) -> SimpleNamespace:
    model = SimpleNamespace(dtype=dtype, device=torch.device(device))
    return SimpleNamespace(model=model, **({"name": name} if name else {}))


@pytest.mark.parametrize(("options", "session", "conflict"), [
    ({"dtype": "bfloat16"}, _session(), "dtype='bfloat16' but the session runs dtype='float32'"),
    ({"device": "cuda:1"}, _session(), "device='cuda:1' but the session runs device='cpu'"),
    ({"backend": "nnsight"}, _session(), "backend='nnsight' but the session runs backend='native'"),
    ({"dtype": "float16", "backend": "transformerlens"}, _session(name="nnsight"), "dtype='float16' but"),
])
def test_options_that_contradict_the_given_session_are_errors(options, session, conflict) -> None:
    sweep = probes.analyses.get("sweep")
    with pytest.raises(OptionError, match="sweep: options contradict the given session: " + conflict.replace("(", r"\(")):
        check_session(sweep(**options), session)


@pytest.mark.parametrize("options", [{}, {"dtype": "auto"}, {"dtype": "bfloat16"}, {"device": "cuda"}, {"device": "cuda:0"}])
def test_options_the_session_agrees_with_are_accepted(options) -> None:
    check_session(probes.analyses.get("sweep")(**options), _session(torch.bfloat16, "cuda:0"))


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
