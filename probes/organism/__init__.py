"""The bundled model organism: a small Qwen3ForCausalLM trained on our own decision prompts with a
planted boundary mechanism (see ``weights/README.md``, the model card).

It is a synthetic organism for validating the instrument, not evidence about Qwen3.
"""

from __future__ import annotations

from pathlib import Path

ORGANISM_DIR = Path(__file__).resolve().parent / "weights"
ORGANISM_NAME = "basm-organism"


def is_organism(model: str | Path | None) -> bool:
    """Whether ``model`` (a folder or name) is the bundled organism's folder."""
    return model is not None and Path(str(model)).exists() and Path(str(model)).resolve() == ORGANISM_DIR.resolve()


def organism_path() -> Path:
    """Folder of the committed organism (config, safetensors, tokenizer, chat template, card)."""
    if not (ORGANISM_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the bundled organism is missing from {ORGANISM_DIR}; retrain it with `basm-probes organism train`"
        )
    return ORGANISM_DIR


__all__ = ["ORGANISM_DIR", "ORGANISM_NAME", "is_organism", "organism_path"]
