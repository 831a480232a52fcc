"""benchmarks/steer.py and gpu.py's steer section (issue #44 item 5): a section that fails is printed as FAILED,
recorded and makes the run exit 1 (planted); the slow test runs the script on the organism and gpu.py's tiny shape,
with more conditions than one engine call takes, so the later calls take the prompt's prefix from the cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runs import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield load_script("benchmarks_gpu_steer", BENCHMARKS / "gpu.py"), load_script("benchmarks_steer", BENCHMARKS / "steer.py")
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("benchmarks_gpu_steer", "benchmarks_steer"):
            del sys.modules[name]


def test_a_failed_section_is_loud(scripts, capsys):
    gpu, _ = scripts
    report = {"failed": {}}
    gpu.loud_section(report, "steer", lambda: {"pieces": {}})
    assert report == {"failed": {}, "steer": {"pieces": {}}} and gpu.exit_status(report) == 0

    def planted():
        raise RuntimeError("planted: the steered branch ran out of memory")

    gpu.loud_section(report, "steer", planted)
    assert report["failed"] == {"steer": "RuntimeError: planted: the steered branch ran out of memory"}
    assert gpu.exit_status(report) == 1
    out, err = capsys.readouterr()
    assert "FAILED steer: RuntimeError: planted" in out and "FAILED sections: steer (RuntimeError: planted" in err


@pytest.mark.slow
def test_steer_benchmark_on_the_organism_and_the_tiny_shape(scripts):
    _, steer = scripts
    from probes.analyses.steer import DEFAULT_CHUNK

    report = steer.main(["--models", "organism", "tiny", "--counts", "1", str(DEFAULT_CHUNK + 1)])
    for name in ("organism", "tiny"):
        r = report[name]
        pieces = r["pieces"]
        assert list(pieces) == ["clean", "decision C=1", f"decision C={DEFAULT_CHUNK + 1}", "call C=1", f"call C={DEFAULT_CHUNK + 1}"]
        assert all(p["forwards"] > 0 for p in pieces.values())
        # one engine call computes the whole prompt; the second of C = chunk + 1 reuses its prefix (up to the branch point)
        assert pieces["decision C=1"]["tokens_computed"] == r["tokens"] and pieces["decision C=1"]["tokens_reused"] == 0
        many = pieces[f"call C={DEFAULT_CHUNK + 1}"]
        assert many["tokens_reused"] > 0.9 * r["branch_from"] and many["tokens_computed"] + many["tokens_reused"] == r["tokens"] * 2
