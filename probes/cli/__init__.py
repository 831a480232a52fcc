"""The ``basm-probes`` command line: a thin layer over :mod:`probes.analyses`."""

import sys

# jsonschema compiles the rfc3987_syntax grammars of its optional IRI format checker when imported
# (1.6 s of every command on 2 cores); the package validates no string formats (probes.data.schema runs
# jsonschema without a format checker), so the command line's process keeps that module out.
sys.modules.setdefault("rfc3987_syntax", None)

from probes.cli.main import main  # noqa: E402

__all__ = ["main"]
