"""The bundled model organism: a small Qwen3ForCausalLM trained on our own decision prompts with a
planted boundary mechanism (see ``weights/README.md``, the model card).

It is a synthetic organism for validating the instrument, not evidence about Qwen3.
"""

from __future__ import annotations

from pathlib import Path

# The location and the test live with the study defaults (the layers below read them from there).
from probes.data.dataset import ORGANISM_DIR, ORGANISM_NAME, is_organism


def organism_path() -> Path:
    """Folder of the committed organism (config, safetensors, tokenizer, chat template, card)."""
    if not (ORGANISM_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the bundled organism is missing from {ORGANISM_DIR}; retrain it with `basm-probes organism train`"
        )
    return ORGANISM_DIR


__all__ = ["ORGANISM_DIR", "ORGANISM_NAME", "is_organism", "organism_path"]
