"""The registry of memory configurations: which skill slots each configuration shows.

Names are the CLI/record names; ``label`` is the name the paper's figures use.
"""

from __future__ import annotations

from dataclasses import dataclass

from probes.data.schema import BOUNDARY_SLOTS, PROCEDURAL_SLOTS


@dataclass(frozen=True)
class MemoryConfig:
    name: str
    label: str
    slots: tuple[str, ...]  # slots rendered for every retrieved skill, in schema order
    gated: bool = False  # apply the boundary relevance gate γ and budget β (Eq. 10)
    control: str | None = None  # equal-length control: boundary text replaced by "filler" or "procedure"
    rewrite: str | None = None  # boundary items' tool mentions rewritten: "anonymise" or "names_only" (probes.prompts.priming)
    description: str = ""

    @property
    def shows_boundary(self) -> bool:
        return any(slot in BOUNDARY_SLOTS for slot in self.slots)


_BASM_SLOTS = PROCEDURAL_SLOTS + BOUNDARY_SLOTS

CONFIGS: dict[str, MemoryConfig] = {
    config.name: config
    for config in (
        MemoryConfig("base", "Base", (), description="memory-free agent"),
        MemoryConfig("proc", "Proc. Skill", PROCEDURAL_SLOTS, description="goal, procedure, tools"),
        MemoryConfig("app", "App. Skill", PROCEDURAL_SLOTS + ("applicability",), description="Proc. Skill + applicability"),
        MemoryConfig("basm", "BASM", _BASM_SLOTS, gated=True, description="all seven slots, gate γ, budget β"),
        MemoryConfig(
            "basm-no-avoid", "BASM − Avoid", tuple(s for s in _BASM_SLOTS if s != "avoidance_rules"), gated=True,
            description="BASM without avoidance rules",
        ),
        MemoryConfig(
            "basm-no-recovery", "BASM − Recovery", tuple(s for s in _BASM_SLOTS if s != "recovery_notes"), gated=True,
            description="BASM without recovery notes",
        ),
        MemoryConfig(
            "pad-filler", "Irrelevant padding", _BASM_SLOTS, gated=True, control="filler",
            description="BASM with each boundary block replaced by neutral filler of equal token count",
        ),
        MemoryConfig(
            "pad-procedure", "Procedure padding", _BASM_SLOTS, gated=True, control="procedure",
            description="BASM with each boundary block replaced by extra procedure text of equal token count",
        ),
        MemoryConfig(
            "basm-anon", "BASM, tools anonymised", _BASM_SLOTS, gated=True, rewrite="anonymise",
            description="BASM with every tool name in the boundary items replaced by a placeholder (tool A, tool B, ...)",
        ),
        MemoryConfig(
            "basm-names", "BASM, tool names only", _BASM_SLOTS, gated=True, rewrite="names_only",
            description="BASM with each boundary item reduced to a neutral sentence listing the tool names it mentions",
        ),
    )
}

PAPER_CONFIGS: tuple[str, ...] = ("base", "proc", "app", "basm")
CONTROL_CONFIGS: tuple[str, ...] = ("pad-filler", "pad-procedure")
PRIMING_CONFIGS: tuple[str, ...] = ("basm-anon", "basm-names")  # tool naming vs boundary meaning


def get_config(name: str) -> MemoryConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown memory configuration {name!r}; known: {sorted(CONFIGS)}") from None


def config_label(name: str) -> str:
    return get_config(name).label
