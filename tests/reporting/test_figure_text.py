"""Every figure the package draws reads at a glance: drawn from the organism's summaries (one ``report --quick``,
stored in figure_summaries.pkl.gz), no visible text leaves the canvas, no two text boxes overlap (titles, axis
and tick labels, colourbar labels, annotations, legends, captions), no value label sits on an error bar, and
nothing warns while drawing. Extents come from matplotlib's renderer, for the texts the renderer drew.

Regenerate the stored summaries after a summary dataclass changes: ``python tests/reporting/test_figure_text.py``
(runs ``report --quick`` on the organism, about 5 min on one thread)."""

from __future__ import annotations

import gzip
import pickle
import sys
import warnings
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.path import Path as LinePath
from matplotlib.text import Text
from matplotlib.transforms import Bbox

import probes.analyses
from probes.analyses.report import mechanism_figure
from probes.analyses.base import ReportSection
from probes.reporting import plots

SUMMARIES = Path(__file__).with_name("figure_summaries.pkl.gz")
TOLERANCE = 0.5  # pixels: boxes that only touch do not overlap
BAND = 0.4  # inches: the most empty space between a caption and the lowest text above it
# each figure, by the analysis that draws it (report: Fig. 3, from the ratios, suppression and knockout summaries)
FIGURES = {"fig02_retrieval_trap": "sweep", "fig03_mechanism": "report", "fig04_boundary_attention": "ratios", "fig05_suppression": "suppression",
           "fig06_knockout_controls": "knockout", "fig07_knockout_selectivity": "knockout", "fig08_head_heatmap": "heads",
           "fig09_candidate_heads": "heads", "fig10_linear_probe": "linear", "fig11_call_rates": "calls", "fig12_paired_status": "paired",
           "fig13_attribution_matrix": "attribution", "fig14_attribution_statistics": "attribution", "fig15_curation_regimes": "curate",
           "fig16_masking_policies": "mask-eval", "fig17_forks_entropy": "forks", "fig18_forks_ranking": "forks",
           "fig19_checker_outcomes": "calls", "fig20_repair_success": "repair", "fig21_circuit_basm": "circuit",
           "fig21_circuit_proc": "circuit", "fig22_looking": "looking", "fig23_steer": "steer"}
SLOW = {"fig23_steer"}  # 150 panels: about 7 s to draw on a quiet core, more than the whole fast tier's share


@dataclass
class Drawn:
    """One text the renderer drew, and its box in display pixels."""

    text: Text
    box: Bbox

    def __str__(self) -> str:
        words = " ".join(self.text.get_text().split())
        return repr(words if len(words) <= 60 else words[:57] + "...")


def drawn_texts(fig: plt.Figure) -> list[Drawn]:
    """Every text the figure draws (not the hidden ones, nor the tick labels outside the view), with its extent:
    Text.draw is watched through one draw without rasterising."""
    drawn: dict[int, Text] = {}
    draw = Text.draw

    def watched(text: Text, renderer) -> None:
        draw(text, renderer)
        if text.get_visible() and text.get_text().strip():
            drawn.setdefault(id(text), text)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Text, "draw", watched)
        fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    return [Drawn(t, t.get_window_extent(renderer)) for t in drawn.values()]


def overlap(a: Bbox, b: Bbox) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > TOLERANCE and min(a.y1, b.y1) - max(a.y0, b.y0) > TOLERANCE


def errorbar_paths(fig: plt.Figure) -> list[tuple[plt.Axes, LinePath]]:
    """The whiskers and caps of every error bar, as display-space paths (a cap: its marker's width)."""
    out = []
    for ax in fig.axes:
        for container in ax.containers:
            bars = container.errorbar if isinstance(container, BarContainer) else container
            if not isinstance(bars, ErrorbarContainer):
                continue
            _, caps, whiskers = bars.lines
            for collection in whiskers:
                for segment in collection.get_segments():
                    if len(segment) and np.isfinite(segment).all():
                        out.append((ax, LinePath(ax.transData.transform(segment))))
            for cap in caps:
                half = cap.get_markersize() * fig.dpi / 72 / 2
                for x, y in ax.transData.transform(np.column_stack(cap.get_data()).astype(float)):
                    if not np.isfinite([x, y]).all():
                        continue
                    if cap.get_marker() == "_":  # a horizontal cap (vertical whiskers)
                        out.append((ax, LinePath([(x - half, y), (x + half, y)])))
                    else:
                        out.append((ax, LinePath([(x, y - half), (x, y + half)])))
    return out


def text_faults(fig: plt.Figure) -> list[str]:
    """What makes a figure's text unreadable: a text leaving the canvas, two text boxes overlapping, a text on an
    error bar, a text wrapped at draw time (``wrap=True``: its measured extent is the unwrapped line's), a caption
    (plots.footnote) floating under an empty band."""
    texts = drawn_texts(fig)
    canvas = fig.bbox
    faults = [f"{t} is wrapped at draw time (wrap=True); wrap it in the text so its extent is measurable"
              for t in texts if t.text.get_wrap()]
    for t in texts:
        b = t.box
        if b.x0 < canvas.x0 - TOLERANCE or b.y0 < canvas.y0 - TOLERANCE or b.x1 > canvas.x1 + TOLERANCE or b.y1 > canvas.y1 + TOLERANCE:
            faults.append(f"{t} leaves the canvas: box ({b.x0:.0f}, {b.y0:.0f})–({b.x1:.0f}, {b.y1:.0f}) px, "
                          f"canvas {canvas.width:.0f} × {canvas.height:.0f} px")
    faults += [f"{a} overlaps {b}" for a, b in combinations(texts, 2) if overlap(a.box, b.box)]
    above = [t.box.y0 for t in texts if t.text.get_gid() != plots.FOOTNOTE]
    for t in texts:
        if t.text.get_gid() == plots.FOOTNOTE and above and (min(above) - t.box.y1) / fig.dpi > BAND:
            faults.append(f"{t} floats {(min(above) - t.box.y1) / fig.dpi:.2f} in under the lowest text above it (at most {BAND} in)")
    whiskers = errorbar_paths(fig)
    for t in texts:
        if t.text.axes is None or not isinstance(t.text, Text) or t.text not in t.text.axes.texts:
            continue  # only annotations in an axes sit among its error bars (tick labels and titles sit outside)
        hits = sum(ax is t.text.axes and path.intersects_bbox(t.box, filled=False) for ax, path in whiskers)
        if hits:
            faults.append(f"{t} lies on {hits} error-bar line{'s' if hits > 1 else ''}")
    return faults


@dataclass
class Made:
    """A figure as plots.save_figure lays it out (not written), and the warnings drawing it raised."""

    figure: plt.Figure
    warnings: list[str]


def laid_out(draw) -> dict[str, Made]:
    """The figures ``draw(out_dir)`` makes, each with every warning raised while ``draw`` ran."""
    made: dict[str, plt.Figure] = {}

    def keep(fig: plt.Figure, out_dir, name: str) -> list[Path]:
        plots.layout(fig)
        made[name] = fig
        return []

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        patch.setattr(plots, "save_figure", keep)
        draw(Path("unused"))
    return {name: Made(fig, [f"{w.category.__name__}: {w.message}" for w in raised]) for name, fig in made.items()}


class Drawer:
    """The package's figures from the stored summaries of the organism's ``report --quick``, each analysis's
    drawn once, when one of its figures is first asked for."""

    def __init__(self) -> None:
        with gzip.open(SUMMARIES, "rb") as f:
            self.stored = pickle.load(f)
        self.made: dict[str, Made] = {}

    def __getitem__(self, name: str) -> Made:
        if name not in self.made:
            self.made.update(self.draw(FIGURES[name]))
        return self.made[name]

    def draw(self, analysis_name: str) -> dict[str, Made]:
        analyses = self.stored["analyses"]
        if analysis_name == "report":
            sections = {name: ReportSection(name, name, [], "", summary=summary) for name, (_, summary) in analyses.items()}
            return laid_out(lambda out: mechanism_figure(sections, out, self.stored["note"]))
        analysis, summary = analyses[analysis_name]
        return laid_out(lambda out: analysis.figures(summary, out))


@pytest.fixture(scope="session")
def figures() -> Drawer:
    with matplotlib.rc_context({"figure.max_open_warning": 0}):  # the drawer holds every figure open at once, by design
        yield Drawer()
    plt.close("all")


def test_every_analysis_is_stored_and_its_figures_listed(figures) -> None:
    assert set(FIGURES.values()) - {"report"} == set(figures.stored["analyses"]) == set(probes.analyses.ANALYSES)


PARAMS = [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in FIGURES]


@pytest.mark.parametrize("name", PARAMS)
def test_no_text_leaves_the_canvas_or_overlaps_another(figures, name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert text_faults(figures[name].figure) == []


@pytest.mark.parametrize("name", PARAMS)
def test_drawing_a_figure_warns_of_nothing(figures, name: str) -> None:
    assert figures[name].warnings == []


def planted(kind: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(3, 2))
    fig.tight_layout()
    if kind == "overlap":
        ax.set_title("a title over a text")
        ax.text(0.5, 1.02, "a text under the title", transform=ax.transAxes, ha="center")
    elif kind == "outside":
        fig.text(0.9, 0.5, "a caption running off the right edge")
    elif kind == "errorbar":
        container = ax.bar([0], [1.0], yerr=[[0.2], [0.8]], capsize=3)
        ax.annotate("1.00", (0, 1.0), xytext=(0, 3), textcoords="offset points", ha="center")
        assert container.errorbar is not None
    elif kind == "wrapped":
        fig.text(0.01, 0.01, "a caption " * 20, wrap=True)
    elif kind == "band":
        ax.set_xticks([])
        plots.footnote(fig, "a caption far under the axes")
        fig.set_size_inches(3, 4)  # the axes keep their place at the top: an inch and more of nothing under them
        fig.texts[-1].set_y(0.02)
    return fig


@pytest.mark.parametrize("kind, fault", [("overlap", "'a text under the title' overlaps 'a title over a text'"),
                                         ("outside", "'a caption running off the right edge' leaves the canvas"),
                                         ("errorbar", "'1.00' lies on 2 error-bar lines"), ("wrapped", "wrapped at draw time"),
                                         ("band", "'a caption far under the axes' floats")])
def test_the_check_fails_on_a_planted_bad_figure(kind: str, fault: str) -> None:
    fig = planted(kind)
    faults = text_faults(fig)
    plt.close(fig)
    assert any(fault in f for f in faults), faults
    if kind != "wrapped":  # the planted fault, and nothing else
        assert len(faults) == 1, faults


def test_the_check_passes_a_clean_figure_and_ignores_hidden_text() -> None:
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_title("clean")
    ax.bar([0], [1.0], yerr=[[0.2], [0.2]], capsize=3)
    ax.text(0.5, 0.5, "hidden, on the title", transform=ax.transAxes, visible=False)
    ax.set_xlim(-0.5, 0.5)
    fig.tight_layout()
    assert text_faults(fig) == []
    plt.close(fig)


def test_drawing_a_figure_that_warns_fails() -> None:
    def warns(out_dir: Path) -> None:
        fig, ax = plt.subplots()
        ax.legend()  # "No artists with labels found to put in legend"
        plots.save_figure(fig, out_dir, "warns")

    assert "No artists with labels" in " ".join(laid_out(warns)["warns"].warnings)


def capture(out: Path) -> dict:
    """Run ``report --quick`` on the organism into ``out`` and keep each analysis with the summary its figures drew."""
    from probes.analyses import report

    stored: dict = {"analyses": {}, "note": ""}
    originals = {}
    for name in probes.analyses.ANALYSES:
        cls = probes.analyses.get(name)
        originals[cls] = cls.figures

        def figures(self, summary, out_dir, _name=name, _draw=cls.figures):
            stored["analyses"][_name] = (self, summary)
            return _draw(self, summary, out_dir)

        cls.figures = figures
    mechanism = report.mechanism_figure

    def keep_note(sections, figures_dir, note):
        stored["note"] = note
        return mechanism(sections, figures_dir, note)

    report.mechanism_figure = keep_note
    try:
        probes.run("report", quick=True, out=out, explore=False)
    finally:
        report.mechanism_figure = mechanism
        for cls, draw in originals.items():
            cls.figures = draw
    return stored


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/figure-summaries")
    with gzip.open(SUMMARIES, "wb") as f:
        pickle.dump(capture(out), f)
    print(f"wrote {SUMMARIES} ({SUMMARIES.stat().st_size / 1e3:.0f} kB) from the report in {out}")
