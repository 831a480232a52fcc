"""Text shown to a person: code points that are invisible, reorder the text around them or drive a terminal, written as visible marks.

Dataset text is data, and a view must show it as it is: a right-to-left override (U+202E) would
show a request reversed, a zero-width space, word joiner or tag character would hide text, and an
escape character would restyle the terminal. :func:`visible` is the one way every view writes text
(the explore page, ``basm-probes show``, the report's tables): each such code point becomes a mark
that names it, ``⟨U+202E⟩``, and every other character, newlines and tabs included, stays as it is.
It maps code point by code point, so pieces of a text (a prompt's tokens) map to pieces of the
mapped text, and it changes no text without such a code point.
"""

from __future__ import annotations

import unicodedata

# Unicode categories never drawn as themselves: format characters (zero-width space, joiners, bidi
# embeddings, overrides and isolates, the byte-order mark, tag characters), control characters, lone
# surrogates (not encodable as UTF-8), and the line and paragraph separators.
HIDDEN_CATEGORIES = frozenset({"Cf", "Cc", "Cs", "Zl", "Zp"})
LAYOUT = frozenset("\n\t")  # control characters that are the text's layout, drawn as such


def mark(char: str) -> str:
    """The visible mark of one hidden code point: ``⟨U+202E⟩``."""
    return f"⟨U+{ord(char):04X}⟩"


def visible(text: str) -> str:
    """``text`` with every hidden code point (:data:`HIDDEN_CATEGORIES`, but newlines and tabs) replaced
    by its :func:`mark`."""
    if text.isprintable():  # no hidden code point (and no newline): most text, checked in C
        return text
    return "".join(mark(c) if c not in LAYOUT and unicodedata.category(c) in HIDDEN_CATEGORIES else c for c in text)
