"""Lexical-priming controls: tool-name mentions in the boundary fields, separated from their meaning.

Boundary items often name tools ("Do not call cancel_order …; call create_return_request"). A name
in the prompt can raise that name's logit whatever the sentence says about it, so an avoidance rule
can prime the very tool it forbids. Two rewrites of the boundary items a BASM prompt shows (the
same items: gate γ and budget β are applied to the original text first) separate the two effects:

``anonymise`` (config ``basm-anon``)  every tool name becomes a placeholder ``tool A``, ``tool B`` …,
    one letter per distinct tool within the prompt, in order of first mention, so the rules keep
    their meaning and their co-reference ("call tool B instead") but name no catalog tool.
``names_only`` (config ``basm-names``)  every item that mentions tools becomes a neutral sentence
    listing them, in order, repeats included ("This note names cancel_order and
    create_return_request."); items that name no tool are dropped (a slot left empty is not shown);
    the slot labels become a neutral ``Notes`` label, so neither the rule nor the slot says what to
    do with the names.

The procedure, goal and tool-list slots are untouched. Neither rewrite keeps BASM's token count.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

PLACEHOLDER_PREFIX = "tool "
NAMES_ONLY_LABEL = "Notes"
NAMES_ONLY_FRAME = "This note names {}."
REWRITES: tuple[str, ...] = ("anonymise", "names_only")


def mention_pattern(tool_names: Iterable[str]) -> re.Pattern[str]:
    """Whole-identifier mentions of any of ``tool_names`` (the matching rule of ``tools_in_text``)."""
    names = sorted(set(tool_names), key=len, reverse=True)
    if not names:
        raise ValueError("a tool-mention rewrite needs at least one tool name")
    return re.compile(r"(?<![\w])(?:" + "|".join(re.escape(name) for name in names) + r")(?![\w])")


class ToolMentionRewriter:
    """Rewrites the boundary items of ONE prompt; ``anonymise`` letters persist across its items."""

    def __init__(self, mode: str, tool_names: Iterable[str]) -> None:
        if mode not in REWRITES:
            raise ValueError(f"tool-mention rewrite must be one of {REWRITES}, got {mode!r}")
        self.mode = mode
        self.pattern = mention_pattern(tool_names)
        self.mentioned: list[str] = []  # distinct tool names, in order of first mention

    def label(self, slot_label: str) -> str:
        return NAMES_ONLY_LABEL if self.mode == "names_only" else slot_label

    def rewrite(self, text: str) -> str | None:
        """The rewritten item, or None where ``names_only`` drops it (it names no tool)."""
        mentions = self.pattern.findall(text)
        self.mentioned += [name for name in dict.fromkeys(mentions) if name not in self.mentioned]
        if self.mode == "anonymise":
            if len(self.mentioned) > len(string.ascii_uppercase):
                raise ValueError("more than 26 distinct tools named in one prompt's boundary fields: no placeholder letter left")
            return self.pattern.sub(lambda match: self.placeholder(match.group()), text)
        if not mentions:
            return None
        listed = ", ".join(mentions[:-1]) + " and " + mentions[-1] if len(mentions) > 1 else mentions[0]
        return NAMES_ONLY_FRAME.format(listed)

    def placeholder(self, name: str) -> str:
        return PLACEHOLDER_PREFIX + string.ascii_uppercase[self.mentioned.index(name)]

    def record(self) -> dict[str, object]:
        """What the prompt record says was replaced (``spans_kind``)."""
        if self.mode == "anonymise":
            return {"boundary": "rewrite:anonymise", "placeholders": {name: self.placeholder(name) for name in self.mentioned}}
        return {"boundary": "rewrite:names_only", "named": list(self.mentioned)}
