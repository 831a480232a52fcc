"""``paired`` (Fig. 12): the equal-token paired status of BASM vs procedure padding.

Implemented in :mod:`probes.analyses.calls` (it reuses the greedy calls); this module gives the analysis
its own name for the CLI and ``basm-probes report``.
"""

from probes.analyses.calls import PAIRED_FIGURE as FIGURE
from probes.analyses.calls import PAIRED_NAME as NAME
from probes.analyses.calls import add_paired_arguments as add_arguments
from probes.analyses.calls import compute_paired as compute
from probes.analyses.calls import paired_report_section as report_section
from probes.analyses.calls import run_paired as run

__all__ = ["FIGURE", "NAME", "add_arguments", "compute", "report_section", "run"]
