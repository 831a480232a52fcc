"""The random controls of a knockout: where they may draw (the control pools) and how (the draws).

The ``knockout`` analysis (:mod:`probes.analyses.knockout`) knocks out, beside the boundary span B
and the procedure span P, control position sets drawn here, and the notebook facade's
``ProbeSession.score(record, knockouts=["random"])`` draws its ``random`` control with
:func:`random_control`. Every draw takes a generator seeded by (seed, record, draw name)
(:func:`probes.scoring.score.record_rng`), so draws do not depend on run order; the functions are
deterministic given it (tests/scoring/test_knockout_controls.py and the organism validation depend on
the exact draws).

- pools (bool masks over the record's tokens): :func:`neutral_pool` (the memory block outside B,
  P, their section labels and every line naming a tool), :func:`control_pool` (``--random-pool``);
- draws: :func:`draw_span` (B's block lengths among the free positions), :func:`draw_positions`
  (n scattered positions: the count-matched pair), :func:`draw_mass_matched` (positions holding a
  target attention mass), :func:`anywhere_control` (B's block lengths anywhere before the call).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from probes.engine.session import span_positions
from probes.prompts.record import PromptRecord
from probes.scoring.score import record_rng

RANDOM_POOLS = ("neutral", "memory", "memory+procedure")


# ----------------------------------------------------------------------------- control pools
def tool_names_of(dataset: Any) -> frozenset[str]:
    """Every tool name of a dataset: its domains' catalogs and its skills' tool lists."""
    names = {tool.name for domain in dataset.domains.values() for tool in domain.catalog}
    return frozenset(names | {name for skill in dataset.skills.values() for name in skill.tool_names})


def record_tool_names(record: PromptRecord) -> frozenset[str]:
    """The tool names a prompt record shows as tools: its catalog's candidates and its skills' tool lists."""
    names = {str(c.action) for c in record.candidates if c.role != "abstain"}
    for skill in record.skills:
        tools = skill.slots.get("tools")
        names |= {name.strip() for name in tools.text.split(",") if name.strip()} if tools else set()
    return frozenset(names)


def _name_pattern(names: Iterable[str]) -> re.Pattern[str] | None:
    names = sorted(set(names), key=len, reverse=True)
    return re.compile(r"(?<![A-Za-z0-9_])(?:" + "|".join(map(re.escape, names)) + r")(?![A-Za-z0-9_])") if names else None


def _offsets(record: PromptRecord) -> np.ndarray:
    """[n_tokens, 2] character offsets: the builder's, absent from a record read back from JSON."""
    if record.offsets is None:
        raise ValueError(f"{record.record_id}: the record has no character offsets (read from JSON): build it with PromptBuilder")
    return np.asarray(record.offsets).reshape(-1, 2)


def memory_lines(record: PromptRecord) -> list[tuple[int, int]]:
    """Character ranges [start, end) of the memory block's lines, each with its newline."""
    memory = record.spans.get("memory")
    if not memory:
        raise ValueError(f"{record.record_id}: the record has no memory span (rebuild it with this version)")
    offsets = _offsets(record)
    (lo, hi), = memory
    start, end = int(offsets[lo][0]), int(offsets[hi - 1][1])
    lines, cursor = [], start
    while cursor < end:
        newline = record.text.find("\n", cursor, end)
        stop = end if newline < 0 else newline + 1
        lines.append((cursor, stop))
        cursor = stop
    return lines


def neutral_pool(record: PromptRecord, tool_names: Iterable[str]) -> np.ndarray:
    """bool [n_tokens]: the memory block's tokens that lie wholly on lines that hold no token of B
    or P, are not the label line of a B or P section (``Risk cues:``, ``Procedure:``) and name no
    tool of ``tool_names`` (a whole-identifier match). What remains is the block's framing, the
    skill headers and tool-free goal text."""
    offsets = _offsets(record)
    (lo, hi), = record.spans["memory"]
    lines = memory_lines(record)
    starts = np.array([a for a, _ in lines])
    first, last = starts[0], lines[-1][1]

    def touched(token: int) -> range:  # the lines a token's characters lie on
        a, b = int(offsets[token][0]), int(offsets[token][1])
        return range(int(np.searchsorted(starts, a, side="right")) - 1, int(np.searchsorted(starts, max(a, b - 1), side="right")))

    bp = set(span_positions(record.spans.get("boundary", []))) | set(span_positions(record.spans.get("procedure", [])))
    on_bp = np.zeros(len(lines), dtype=bool)
    for token in bp:
        if lo <= token < hi:
            on_bp[list(touched(token))] = True
    pattern = _name_pattern(tool_names)
    text = record.text
    excluded = on_bp.copy()
    for i, (a, b) in enumerate(lines):
        line = text[a:b]
        if pattern is not None and pattern.search(line):
            excluded[i] = True
        # the label line of a B or P section: "…:" followed by a line of that section
        if line.strip().endswith(":") and i + 1 < len(lines) and on_bp[i + 1]:
            excluded[i] = True
    free = np.zeros(record.n_tokens, dtype=bool)
    for token in range(lo, hi):
        a, b = int(offsets[token][0]), int(offsets[token][1])
        if token in bp or b <= a or a < first or b > last:  # empty or reaching outside the block: never
            continue
        free[token] = not excluded[list(touched(token))].any()
    return free


def control_pool(record: PromptRecord, pool: str, tool_names: Iterable[str]) -> np.ndarray:
    """bool [n_tokens]: where the random controls draw under ``--random-pool`` (see the module docstring);
    ``memory``: the memory block outside B and P; ``memory+procedure``: outside B only (P allowed)."""
    if pool not in RANDOM_POOLS:
        raise ValueError(f"random pool must be one of {RANDOM_POOLS}, got {pool!r}")
    if pool == "neutral":
        return neutral_pool(record, tool_names)
    if not record.spans.get("memory"):
        raise ValueError(f"{record.record_id}: the record has no memory span (rebuild it with this version)")
    free = np.zeros(record.n_tokens, dtype=bool)
    free[span_positions(record.spans["memory"])] = True
    free[span_positions(record.spans.get("boundary", []))] = False
    if pool == "memory":
        free[span_positions(record.spans.get("procedure", []))] = False
    return free


def pool_text(pool: str) -> str:
    """Where a ``--random-pool`` draws, in words (figure notes and the report)."""
    return {"neutral": "memory block outside B, P, their section labels and every line naming a tool",
            "memory": "memory block outside B and P", "memory+procedure": "memory block outside B (P allowed)"}[pool]


# ----------------------------------------------------------------------------- draws
def draw_span(free: np.ndarray, lengths: Sequence[int], rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Positions of runs with the given ``lengths`` among the ``free`` positions (bool mask),
    non-overlapping. A run with no contiguous room is split in halves until its pieces fit; the
    total is capped at the free room. Returns (sorted positions, lengths of the runs placed)."""
    free = np.asarray(free, dtype=bool).copy()
    out: list[int] = []
    pieces: list[int] = []
    queue = [int(x) for x in rng.permutation(np.asarray(lengths, dtype=int))]
    while queue and free.any():
        length = min(queue.pop(0), int(free.sum()))
        # starts whose whole run is free: a run-length test over the free mask
        window = np.convolve(free.astype(int), np.ones(length, dtype=int), mode="valid") == length
        starts = np.flatnonzero(window)
        if not len(starts):
            queue[:0] = [length - length // 2, length // 2]
            continue
        start = int(rng.choice(starts))
        free[start : start + length] = False
        out += range(start, start + length)
        pieces.append(length)
    return sorted(out), pieces


def draw_positions(free: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` positions drawn uniformly without replacement among the ``free`` ones (n ≤ their count)."""
    candidates = np.flatnonzero(np.asarray(free, dtype=bool))
    if n > len(candidates):
        raise ValueError(f"cannot draw {n} positions from {len(candidates)}")
    return sorted(int(x) for x in rng.choice(candidates, size=n, replace=False))


def draw_mass_matched(free: np.ndarray, weights: np.ndarray, target: float, rng: np.random.Generator,
                      tolerance: float) -> tuple[list[int], float, bool]:
    """Free positions visited in a random order, each kept when it brings the total weight closer to
    ``target`` (so the total ends within half a position's weight of it, above or below with equal
    chance: stopping at the first total inside the band would undershoot on average). Returns
    (positions, their total weight, matched): matched is whether the total lies within ±tolerance·target
    (False where the free positions hold too little weight, or one position too much)."""
    chosen: list[int] = []
    total = 0.0
    for position in rng.permutation(np.flatnonzero(np.asarray(free, dtype=bool))):
        if abs(total + weights[position] - target) < abs(total - target):
            chosen.append(int(position))
            total += float(weights[position])
    return sorted(chosen), total, bool(target > 0 and abs(total - target) <= tolerance * target)


def block_lengths(blocks: Sequence[Sequence[int]]) -> list[int]:
    return [int(e) - int(s) for s, e in blocks]


def anywhere_control(record: PromptRecord, blocks: Sequence[Sequence[int]], rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Same-length runs anywhere before the first query row except B and token 0."""
    free = np.ones(min(record.query_rows), dtype=bool)
    free[0] = False
    free[[p for p in span_positions(blocks) if p < len(free)]] = False
    return draw_span(free, block_lengths(blocks), rng)


def random_control(record: PromptRecord, seed: int = 0, draw: int = 0, tool_names: Iterable[str] | None = None) -> list[int]:
    """The ``random_<draw>`` control of a record: |B| positions of the neutral pool in B's block
    lengths, seeded by (``seed``, record, ``random_<draw>``) as the ``knockout`` analysis seeds it.
    ``tool_names``: the names whose lines the pool leaves out (default: the tools the record shows,
    :func:`record_tool_names`; the analysis passes every tool of the dataset)."""
    names = record_tool_names(record) if tool_names is None else tool_names
    positions, _ = draw_span(neutral_pool(record, names), block_lengths(record.spans.get("boundary", [])),
                             record_rng(seed, record.record_id, f"random_{draw}"))
    return positions
