"""The one record scorer: a prompt record in, one tidy row per condition out.

:func:`score_record`: one cached-branching engine call per record
evaluates the baseline and every knockout at once, and returns per condition every quantity of
:mod:`probes.scoring.margins`:

- ``margin``: the headline, by default Eq. 1 restricted to the tools (``margin_tool_choice``: wrong
  tools vs the correct tool, each pair at the row where their names diverge); also written:
  ``margin_eq1`` (Eq. 1 verbatim, abstention in Y_ctrl; prompted format only, NaN in native),
  ``margin_first_token`` (the tool-only Eq. 1 strictly at the decision row, NaN under first-token collisions),
  ``margin_path`` (whole-path log-probabilities, abstention included) and ``call_logodds`` (the
  abstention decision, a separate quantity). Items whose correct action is abstention
  (``correct_is_abstain``) have no tool-choice margin: NaN, reported through ``call_logodds``;
- ``broad_margin``: every non-correct catalog tool vs the correct tool (tool-vs-control);
- ``correct_margin``: the correct tool vs the other non-wrong tools (independent of the wrong tool);
- ``alpha_boundary`` / ``alpha_procedure``: Eq. 2's length-normalised span attention at the
  *deciding row* (the row predicting the first token where the correct name parts from a wrong
  one: the decision row, or a row of their shared name prefix), averaged over layers and heads;
  ``alpha_*_open`` at the row that opens the call (native); per ``[layer][head]`` on request.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from probes.engine.session import Condition, EngineSession, Steering, span_positions
from probes.prompts.record import PromptRecord
from probes.scoring import margins as margins_mod

MARGIN_VARIANTS: tuple[str, ...] = ("tool_choice", "eq1", "first_token", "path")
DEFAULT_VARIANT = "tool_choice"
EPSILON = 1e-6  # ε of Eq. 2's ratio (stated in every output that uses it)
MARGINS: tuple[str, ...] = ("margin", "broad_margin", "correct_margin")
# The defining skill's ranks and whether it is shown (the "defining skill shown" split of every
# analysis) and the retrieval mode are columns of every row, whichever analysis wrote it.
ROW_FIELDS = ("record_id", "item_id", "bucket", "domain", "task_group", "config", "k", "format",
              "retrieval_mode", "tempting_rank", "tempting_shown_rank", "tempting_shown")
ATTENTION_ROWS: tuple[str, ...] = ("deciding", "open")


def deciding_depth(cands: Sequence[margins_mod.CandidateInfo]) -> tuple[str | None, int]:
    """(key of the correct tool candidate, token depth of its deciding row): the first token at
    which the correct name parts from any wrong name (0: the decision row itself). Items whose
    correct action is abstention decide among the tools at the decision row: (None, 0)."""
    correct = [c for c in cands if c.role == "correct" and not c.is_abstention]
    wrong = [c for c in cands if c.role == "wrong"]
    if not correct or not wrong:
        return None, 0
    depth = min(margins_mod.shared_prefix(correct[0].token_ids, w.token_ids) for w in wrong)
    # names that never diverge (the margin is NaN then) are read at the correct name's last row
    return correct[0].key, min(depth, len(correct[0].token_ids) - 1)


def scored_tokens(cands: Sequence[margins_mod.CandidateInfo], fmt: str, *, whole: bool = False) -> dict[str, tuple[int, list[int]]]:
    """What the engine scores per candidate: (anchor, tokens) up to the last token a margin reads.

    The correct and wrong candidates whole (``path`` sums them); the abstention answer whole in the
    ``prompted`` format and not at all in ``native`` (there abstaining is not opening the call, read
    at the open row: no margin reads its tokens). The rest of the catalog (``other``) is read only by
    ``broad`` and ``correct``, each pair at the one token where the tool parts from the correct one:
    scored up to that token, the rows of its name beyond it are never run; and not at all where no
    correct tool exists (those margins are NaN then). ``whole``: every tool whole (the top action reads every path).
    """
    correct = [c for c in cands if c.role == "correct" and not c.is_abstention]
    out = {}
    for c in cands:
        toks = list(c.token_ids)
        if c.is_abstention and fmt == "native":
            continue
        if c.role == "other" and not c.is_abstention and not whole:
            if not correct:
                continue
            toks = toks[: margins_mod.shared_prefix(toks, correct[0].token_ids) + 1]
        out[c.key] = (c.anchor_index, toks)
    return out


def row_fields(record: PromptRecord) -> dict[str, Any]:
    """The record's columns of a results row (:data:`ROW_FIELDS`, in that order)."""
    return {name: getattr(record, name) for name in ROW_FIELDS}


def score_record(
    session: EngineSession,
    record: PromptRecord,
    conditions: Sequence[Condition] = (),
    *,
    variant: str = DEFAULT_VARIANT,
    per_head: bool = False,
    margins: Sequence[str] = MARGINS,
    actions: bool = False,
) -> list[dict[str, Any]]:
    """One engine call (baseline + ``conditions``: knockouts or steerings); one row per condition (see
    module docstring). Every row also has ``kl_clean``: KL(clean ‖ condition) of the next-token
    distribution at the decision row, in nats (0 for the baseline), so that a condition that moves the
    margin is told apart from one that breaks the model.

    ``actions``: every candidate action is scored whole and the rows say which one the condition's
    model takes greedily (``top_action``, its ``top_role``: correct / wrong / other / abstain; the
    whole-path log-probabilities of :func:`probes.scoring.margins.candidate_path_logprobs`, as
    ``calls``'s ranking reads them).

    ``margins``: with ``broad_margin`` or ``correct_margin``, every catalog tool is scored, up to
    the token where it parts from the correct tool (:func:`scored_tokens`; the candidates share
    their name prefixes in the engine's token trie); otherwise only the correct, wrong and abstain
    candidates, and those two columns are NaN.
    """
    if variant not in MARGIN_VARIANTS:
        raise ValueError(f"margin variant must be one of {MARGIN_VARIANTS}, got {variant!r}")
    cands = margins_mod.candidates_from_record(record)
    if not actions and not {"broad_margin", "correct_margin"} & set(margins):
        cands = [c for c in cands if c.role != "other"]
    spans = {name: span_positions(record.spans.get(name, [])) for name in ("boundary", "procedure")}
    res = session.run(record.input_ids, record.query_rows, spans=spans, conditions=conditions,
                      candidates=scored_tokens(cands, record.format, whole=actions))
    fmt, dec, opn = record.format, int(record.decision_index), record.open_index
    correct_key, depth = deciding_depth(cands)
    clean = torch.log_softmax(res.conditions[0].logits_at(dec).double(), dim=-1)
    rows = []
    for c in res.conditions:
        row: dict[str, Any] = row_fields(record)
        cond = c.condition
        moved = torch.log_softmax(c.logits_at(dec).double(), dim=-1)
        row.update(condition=cond.name, n_tokens=len(res.input_ids), margin_variant=variant, entropy=c.entropy,
                   kl_clean=float((clean.exp() * (clean - moved)).sum()))
        if isinstance(cond, Steering):
            row.update(steering_layers=list(cond.vectors), steering_norms=[float(v.norm()) for v in cond.vectors.values()],
                       steering_rows="every query row" if cond.rows is None else list(cond.rows), steering_continuation=cond.continuation)
        else:
            row["knockout_size"] = len(cond.key_positions)
            if cond.layers is not None:
                row["knockout_layers"] = list(cond.layers)
            if cond.heads is not None:
                row["knockout_heads"] = [list(h) for h in cond.heads]
            if cond.key_positions:
                row["knockout_rows"] = "every query row" if cond.rows is None else list(cond.rows)
                row["knockout_continuation"] = cond.continuation
        lp = c.candidate_token_logprobs
        if actions:
            paths = margins_mod.candidate_path_logprobs(c.row_logits, res.input_ids, cands, fmt, dec, lp, opn)
            top = max(cands, key=lambda x: paths[x.action])
            row.update(top_action=top.action, top_role="abstain" if top.is_abstention else top.role)
        quantities = {
            "tool_choice": margins_mod.tool_choice_margin(cands, lp, fmt),
            "eq1": margins_mod.eq1_margin(c.row_logits, cands, fmt, dec),
            "first_token": margins_mod.first_token_margin(c.row_logits, cands, fmt, dec),
            "path": margins_mod.path_margin(c.row_logits, res.input_ids, cands, fmt, dec, lp, opn),
        }
        for name, m in quantities.items():
            row[f"margin_{name}"] = m.value
        chosen = quantities[variant]
        row.update(margin=chosen.value, margin_collision=chosen.collision, margin_note=chosen.note,
                   margin_pairs=[list(p) for p in quantities["tool_choice"].pairs],
                   first_token_collision=quantities["first_token"].collision,
                   correct_is_abstain=correct_key is None,
                   call_logodds=margins_mod.call_logodds(c.row_logits, res.input_ids, cands, fmt, dec, opn).value)
        for name, fn in (("broad_margin", margins_mod.broad_margin), ("correct_margin", margins_mod.correct_margin)):
            row[name] = fn(cands, lp, fmt).value if name in margins else math.nan
        # Eq. 2 at the deciding row (a continuation row of the correct name when a prefix is shared)
        row.update(deciding_depth=depth, deciding_row=dec + depth)
        at = {"": (c.candidate_span_mass[correct_key], depth) if depth else (c.span_mass, res.query_rows.index(dec))}
        if opn is not None:
            at["_open"] = (c.span_mass, res.query_rows.index(int(opn)))
        for span in ("boundary", "procedure"):
            size = res.span_sizes[span]
            row[f"{span}_size"] = size
            for suffix, (mass, index) in at.items():
                # alpha: [layer, head] = Eq. 2's α_X at that row
                alpha = mass[span][:, :, index] / size if size else torch.full(mass[span].shape[:2], math.nan)
                row[f"alpha_{span}{suffix}"] = float(alpha.mean())
                if per_head:
                    row[f"alpha_{span}{suffix}_heads"] = alpha.tolist()
        rows.append(row)
    return rows


def record_rng(seed: int, record_id: str, salt: str = "") -> np.random.Generator:
    """A generator seeded by (seed, record, purpose): draws do not depend on run order."""
    return np.random.default_rng([seed, zlib.crc32(f"{record_id}|{salt}".encode())])
