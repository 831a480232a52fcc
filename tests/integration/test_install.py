"""`pip install .` (not editable) gives a working package: the bundled dataset and organism ship
as package data, and `basm-probes sweep` runs from outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from probes.reporting.layout import rows_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("install")
    wheels, site = tmp / "wheels", tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(ROOT), "-w", str(wheels)],
                   check=True, cwd=tmp)
    (wheel,) = wheels.glob("basm_probes-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)], check=True, cwd=tmp)
    return site


def run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.mark.subprocess
def test_wheel_holds_the_dataset_and_organism_and_runs_a_sweep(installed: Path, tmp_path: Path) -> None:
    where = run_installed(installed, tmp_path, "-c", "import probes, probes.data.dataset as d, probes.organism as o; "
                          "print(probes.__file__); print(d.V1_DATASET_DIR); print(d.V2_DATASET_DIR); print(o.ORGANISM_DIR)")
    assert where.returncode == 0, where.stderr
    package, v1, v2, organism = map(Path, where.stdout.split())
    assert all(path.is_relative_to(installed) for path in (package, v1, v2, organism))
    for dataset in (v1, v2):
        assert (dataset / "items.jsonl").is_file() and list((dataset / "domains").glob("*.json"))
    assert (organism / "model.safetensors").is_file()
    # every subcommand's help ships as the help index, read without importing torch
    helped = run_installed(installed, tmp_path, "-c", "import contextlib, sys; from probes.cli.main import main\n"
                           "with contextlib.suppress(SystemExit): main(['sweep', '--help'])\nprint('torch' in sys.modules)")
    assert helped.returncode == 0 and "--k-max" in helped.stdout and helped.stdout.split()[-1] == "False", helped.stderr
    out = tmp_path / "results"
    sweep = run_installed(installed, tmp_path, "-m", "probes.cli", "sweep", "--limit", "1", "--k-max", "1", "--configs", "base,basm",
                          "--embedder", "lexical", "--no-figure", "--out", str(out))
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    assert rows_path(out / "basm-organism", "sweep").is_file()
    # the explore page's template ships too: the page is written from the installed package
    page = run_installed(installed, tmp_path, "-m", "probes.cli", "explore", "--records", "2", "--out", str(out))
    assert page.returncode == 0, page.stderr[-2000:]
    assert "<script" in (out / "basm-organism" / "explore.html").read_text()
