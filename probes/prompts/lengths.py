"""The length searches of the equal-length controls (configurations ``pad-filler`` and
``pad-procedure``): a control section cut to a token count, and the adjustments tried until the
whole control prompt has exactly the reference (BASM) prompt's token count."""

from __future__ import annotations

from collections.abc import Callable, Iterator


def cut_to_tokens(source: str, n_tokens: int, count: Callable[[str], int]) -> str:
    """A prefix of ``source`` of ``n_tokens`` tokens (``count``) where possible.

    The source is cut at the character where its token count reaches ``n_tokens`` (binary search,
    then a scan of nearby cuts)."""
    lo, hi = 0, len(source)  # largest cut with count(source[:cut]) <= n_tokens (counts grow with the cut)
    while lo < hi:
        middle = (lo + hi + 1) // 2
        if count(source[:middle]) <= n_tokens:
            lo = middle
        else:
            hi = middle - 1
    # Nearest cuts first; return the first exact count ending in a letter or digit (punctuation
    # can merge with the following newline). Otherwise the closest count: the caller's
    # in-context search absorbs the residue.
    best: tuple[tuple[int, bool, int], str] | None = None
    for cut in sorted(range(max(1, lo - 24), min(len(source), lo + 24) + 1), key=lambda c: (abs(c - lo), c)):
        text = source[:cut].rstrip()
        if not text:
            continue
        n = count(text)
        if n == n_tokens and text[-1].isalnum():
            return text
        score = (abs(n - n_tokens), not text[-1].isalnum(), abs(cut - lo))
        if best is None or score < best[0]:
            best = (score, text)
    assert best is not None, "the control source is never empty"
    return best[1]


def length_trials(control_tokens: dict[int, int], difference: int) -> Iterator[dict[int, int]]:
    """The section token counts (rank → tokens) to try, in order, for a control prompt
    ``difference`` tokens short of the reference. Section token counts are additive up to merges at
    the section edges: the residue goes on the last section, then small joint adjustments of the
    last and first sections are searched (each pair of counts once)."""
    first, last = min(control_tokens), max(control_tokens)
    tried: set[tuple[int, int]] = set()
    for first_step in (0, 1, -1, 2, -2):
        for last_step in (0, 1, -1, 2, -2, 3, -3):
            trial = dict(control_tokens)
            trial[last] += difference + last_step
            trial[first] += first_step
            if (trial[first], trial[last]) in tried:
                continue
            tried.add((trial[first], trial[last]))
            yield trial
