"""What the command line's process imports: jsonschema without its IRI grammars (1.6 s per command),
which changes no validation, since no schema is checked with a format checker."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runs import ROOT

pytestmark = pytest.mark.subprocess


def test_the_command_line_never_compiles_the_iri_grammars() -> None:
    code = (
        "import sys, probes.cli, probes.data.schema, jsonschema\n"
        "assert sys.modules['rfc3987_syntax'] is None, 'rfc3987_syntax was imported'\n"
        # formats are annotations without a format checker, with or without the IRI checker
        "assert jsonschema.Draft202012Validator({'type': 'string', 'format': 'iri'}).is_valid('not an iri')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
