"""basm-probes: mechanistic-interpretability probes for boundary-aware skill memory in tool-use LLMs."""

__version__ = "0.1.0"
