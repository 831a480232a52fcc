"""The notebooks: committed without outputs, and executed headless (nbclient) on a tiny model.

The parameters cell of every notebook reads ``BASM_MODEL`` / ``BASM_QUICK`` / ``BASM_OUT`` from
the environment, which the executing kernel inherits; results and figures go to ``BASM_OUT/<model>/``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
import torch

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
EXPECTED = {"01_retrieval_depth_sweep.ipynb", "02_knockout.ipynb", "03_head_heatmaps.ipynb"}

torch.set_num_threads(1)


def test_all_notebooks_present():
    assert EXPECTED <= {path.name for path in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs before committing"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "/path/to/Qwen3-8B" in first.source and 'DEVICE = "cuda"' in first.source
    assert "parameters" in nb.cells[1].metadata.get("tags", []) and "BASM_MODEL" in nb.cells[1].source


@pytest.mark.subprocess
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_on_quick_setting(path, tiny_qwen3_dir, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    from probes.analyses.run_context import model_label
    from probes.reporting.layout import figures_folder

    monkeypatch.setenv("BASM_MODEL", str(tiny_qwen3_dir))
    monkeypatch.setenv("BASM_QUICK", "1")
    monkeypatch.setenv("BASM_OUT", str(tmp_path / "results"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # the kernel's "python"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert any(o.get("data", {}).get("image/png") for c in nb.cells if c.cell_type == "code" for o in c.outputs), "no figure shown"
    # results are laid out by model: OUT/<model>/figures
    assert list(figures_folder(tmp_path / "results" / model_label(tiny_qwen3_dir)).glob("*.png"))
    if path.stem in ("02_knockout", "03_head_heatmaps"):  # the explore page, written and linked, not inlined
        assert (tmp_path / "results" / model_label(tiny_qwen3_dir) / "explore.html").is_file()
        assert any("explore.html</a>" in o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        assert not any("<iframe srcdoc=" in o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code"
                       for o in c.outputs), "the executed notebook carries the page: link it"
