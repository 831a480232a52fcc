"""The measurements a referee checks, on real prompt records (the real Qwen3 tokenizer and chat
template, a tiny random Qwen3), each against an independent computation: an eager HF forward with
an explicit float 4D mask (tests/reference.py), never the probe engine.

- Eq. 1 where the correct and the wrong name share their first token (``get``): compared at the
  row after the shared prefix, with the boundary knockout blocking every row from the open row to
  that row (the forced prefix and the shared name prefix included).
- Eq. 2's α at that deciding row, from the eager attention probabilities.
- The earlier pools' random control lies inside the memory block and outside B (and P).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.scoring.score import record_rng, score_record
from probes.data.dataset import load_dataset
from probes.engine.session import BASELINE, Knockout, EngineSession, span_positions
from probes.scoring.controls import anywhere_control, block_lengths, control_pool, draw_span, record_tool_names
from probes.prompts.builder import BuildSettings, PromptBuilder
from probes.data.retrieval import Retriever, make_embedder
from reference import knockout_masks, masked_eager_forward

COLLIDING_ITEM = "retail-ok-0001"  # get_order_details vs get_stock_info: both start with "get"
TOL = 1e-5


@pytest.fixture(scope="module")
def setup(tiny_qwen3_dir: Path):
    torch.set_num_threads(1)
    session = EngineSession(tiny_qwen3_dir)
    dataset = load_dataset("basm_probe")
    builder = PromptBuilder(session.tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=2))
    eager = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, attn_implementation="eager").eval()
    return session, dataset, builder, eager


def _roles(record):
    by_role = {c.role: c for c in record.candidates if c.role in ("correct", "wrong")}
    return by_role["correct"].token_ids, by_role["wrong"].token_ids


def test_eq1_at_the_divergence_row_with_every_deciding_row_knocked_out(setup):
    session, dataset, builder, eager = setup
    record = builder.build(dataset.select(ids=[COLLIDING_ITEM])[0], "basm", 2, "native")
    correct, wrong = _roles(record)
    s = next(i for i in range(min(len(correct), len(wrong))) if correct[i] != wrong[i])
    assert s >= 1 and record.collision, "the item must have a first-token collision under the real Qwen3 tokenizer"
    d, o = record.decision_index, record.open_index
    assert record.query_rows == list(range(o, d + 1))  # the forced-prefix rows are query rows

    boundary = Knockout.from_spans("boundary", record.spans["boundary"])
    rows = {r["condition"]: r for r in score_record(session, record, [boundary])}
    assert np.isnan(rows["baseline"]["margin_first_token"]) and rows["baseline"]["first_token_collision"]
    assert rows["baseline"]["deciding_row"] == d + s

    seq = record.input_ids + correct[:s]  # the prompt and the shared name prefix
    cfg = eager.config
    for name, ko in (("baseline", BASELINE), ("boundary", boundary)):
        active = ko.active(cfg.num_hidden_layers, cfg.num_attention_heads)
        blocked = list(range(o, d + s + 1))  # open row .. the row that predicts the deciding token
        logits, att = masked_eager_forward(eager, seq, knockout_masks(len(seq), active, ko.key_positions, blocked))
        want = float(logits[d + s, wrong[s]] - logits[d + s, correct[s]])
        assert abs(rows[name]["margin"] - want) <= TOL, name
        if name == "baseline":
            for span in ("boundary", "procedure"):
                pos = span_positions(record.spans[span])
                alpha = att[:, :, d + s, pos].sum(-1) / len(pos)  # [layer, head]
                assert abs(rows[name][f"alpha_{span}"] - float(alpha.mean())) <= TOL
                alpha_open = att[:, :, o, pos].sum(-1) / len(pos)
                assert abs(rows[name][f"alpha_{span}_open"] - float(alpha_open.mean())) <= TOL
    # The knockout did something, so the comparison is not vacuous.
    assert abs(rows["boundary"]["margin"] - rows["baseline"]["margin"]) > 1e-4

    # Blocking only the endpoints (the earlier measurement) gives a different number: the
    # forced-prefix and name-prefix rows matter.
    ends = Knockout.from_spans("boundary", record.spans["boundary"], rows=[o, d], continuation=False)
    (_, row_ends) = score_record(session, record, [ends])
    active = ends.active(cfg.num_hidden_layers, cfg.num_attention_heads)
    logits, _ = masked_eager_forward(eager, seq, knockout_masks(len(seq), active, ends.key_positions, [o, d]))
    assert abs(row_ends["margin"] - float(logits[d + s, wrong[s]] - logits[d + s, correct[s]])) <= TOL
    assert abs(row_ends["margin"] - rows["boundary"]["margin"]) > 1e-6


def test_memory_random_spans_stay_in_the_memory_block_outside_b(setup):
    """Property test over many real records: the earlier pools' random control (``memory``: outside
    B and P; ``memory+procedure``: outside B) is inside the memory block, of |B| positions where the
    block has room; the anywhere control stays before the call and off B and token 0. (The default
    neutral pool is checked in tests/scoring/test_knockout_controls.py.)"""
    _, dataset, builder, _ = setup
    items = dataset.select(split="eval", buckets=["T_wrong", "T_ok", "T_repair"])[::7]
    checked = short = short_with_p = 0
    for item in items:
        for k in (1, 2, 3):
            record = builder.build(item, "basm", k, "native")
            blocks = record.spans.get("boundary", [])
            if not blocks:
                continue
            memory = set(span_positions(record.spans["memory"]))
            b, p = set(span_positions(blocks)), set(span_positions(record.spans["procedure"]))
            for draw in range(3):
                names = record_tool_names(record)
                rng = record_rng(0, record.record_id, f"random_{draw}")
                positions, pieces = draw_span(control_pool(record, "memory", names), block_lengths(blocks), rng)
                chosen = set(positions)
                assert len(chosen) == len(positions) == sum(pieces)
                assert chosen <= memory and not chosen & b and not chosen & p
                room = len(memory - b - p)
                assert len(chosen) == min(len(b), room)  # |B| positions, or all the room there is
                short += len(chosen) < len(b)
                with_p, _ = draw_span(control_pool(record, "memory+procedure", names), block_lengths(blocks),
                                      record_rng(0, record.record_id, f"random_{draw}"))
                assert set(with_p) <= memory and not set(with_p) & b and len(with_p) == min(len(b), len(memory - b))
                short_with_p += len(with_p) < len(b)
                anywhere, _ = anywhere_control(record, blocks, record_rng(0, record.record_id, f"anywhere_{draw}"))
                assert not set(anywhere) & b and 0 not in anywhere and max(anywhere) < min(record.query_rows)
                checked += 1
    assert checked >= 30
    print(f"\n{checked} draws checked; shorter than |B|: {short} outside B and P, {short_with_p} outside B")


def test_draw_span_keeps_block_lengths_where_there_is_room_and_splits_otherwise():
    rng = np.random.default_rng(0)
    free = np.zeros(40, dtype=bool)
    free[5:15] = free[20:30] = True
    positions, pieces = draw_span(free, [8, 6], rng)
    assert sorted(pieces) == [6, 8] and len(positions) == 14 and free[positions].all()
    # a run of 12 fits no 10-long room: it is split, and the total is kept
    positions, pieces = draw_span(free, [12, 6], rng)
    assert len(positions) == 18 and len(pieces) > 2 and max(pieces) <= 10 and free[positions].all()
    # more than the room: capped at the room, never a position outside it
    positions, pieces = draw_span(free, [30], rng)
    assert len(positions) == 20 and free[positions].all()


def test_eq1_verbatim_on_prompted_records_against_eager_logits(setup):
    """``margin_eq1`` (Eq. 1 as the paper writes it, abstention in Y_ctrl) on prompted records of a
    tool-correct and an abstention-correct T_wrong item, against the eager forward's logits at the
    decision row; and the tool-only headline is NaN for the abstention item while Eq. 1 is not."""
    from probes.data.dataset import ABSTAIN

    session, dataset, builder, eager = setup
    cfg = eager.config
    checked = {"tool": 0, "abstain": 0, "collision": 0}
    for item in dataset.select(split="eval", buckets=["T_wrong"])[::3]:
        kind = "abstain" if item.correct_action == ABSTAIN else "tool"
        if checked[kind] and checked["collision"]:
            continue
        record = builder.build(item, "basm", 2, "prompted")
        (row,) = score_record(session, record, [])
        first = {c.role: [] for c in record.candidates}
        for c in record.candidates:
            first[c.role].append(c.token_ids[0])
        # Y_ctrl: the correct tool's first token and the abstention answer's (an abstention item's correct candidate is that answer)
        control = set(first.get("correct", [])) | set(first.get("abstain", []))
        if set(first["wrong"]) & control:
            assert np.isnan(row["margin_eq1"])  # a shared first token is flagged, never a number
            checked["collision"] += 1
            continue
        d = record.decision_index
        logits, _ = masked_eager_forward(eager, record.input_ids, knockout_masks(
            len(record.input_ids), BASELINE.active(cfg.num_hidden_layers, cfg.num_attention_heads), (), []))
        want = float(max(logits[d, t] for t in first["wrong"]) - max(logits[d, t] for t in control))
        assert abs(row["margin_eq1"] - want) <= TOL, item.id
        if kind == "abstain":
            assert np.isnan(row["margin_tool_choice"])  # the tool-only headline has nothing to compare here
        checked[kind] += 1
    assert checked["tool"] and checked["abstain"] and checked["collision"], checked
