"""``paired`` (Fig. 12): the equal-token paired status of BASM vs procedure padding.

Implemented in :mod:`probes.calls` (it reuses the greedy calls); this module gives the analysis
its own name for the CLI and ``basm-probes report``.
"""

from probes.calls import PAIRED_FIGURE as FIGURE
from probes.calls import PAIRED_NAME as NAME
from probes.calls import add_paired_arguments as add_arguments
from probes.calls import compute_paired as compute
from probes.calls import paired_report_section as report_section
from probes.calls import run_paired as run

__all__ = ["FIGURE", "NAME", "add_arguments", "compute", "report_section", "run"]
