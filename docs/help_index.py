"""Regenerate probes/cli/help_index.json, every subcommand's --help, from the real parsers
(tests/cli/test_help_speed.py fails when it is out of date): ``python docs/help_index.py``."""

from probes.cli.help_index import write_index
from probes.cli.main import build_parser

if __name__ == "__main__":
    print(f"wrote {write_index(build_parser(None))}")
