"""The ``basm-probes`` command line: a thin layer over :mod:`probes.analyses`."""

from probes.cli.main import main

__all__ = ["main"]
