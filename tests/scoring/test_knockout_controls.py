"""The knockout's controls and the claims built on them, as a referee would check them.

- The neutral pool, over real records (the real Qwen3 tokenizer and chat template; v1 and v2):
  inside the memory block, never on B or P, never on a line that names a tool or labels a B or P
  section, checked against the record's text by an independent line split.
- Count-matched and mass-matched draws: the same n on both sides; a mass-matched draw inside the
  band, from the pool.
- The mass a knockout removes (``knockout_mass``) against an eager forward's attention at the
  deciding row (explicit 4D mask, tests/reference.py), and against Eq. 2's α · |B| of the scorer.
- A planted dose case where any position's knockout moves the margin in proportion to the
  attention it held: the count-matched comparison calls B special, the mass-matched one does not,
  and the figure refuses to call that control neutral (the equal-mass comparison from B's side:
  tests/analyses/test_knockout_equal_mass.py).
- The claims table: Holm by hand; a null family where one unadjusted p is below 0.05 and no
  adjusted one is; TOST equivalence holds for a small effect and not for one beyond the bound.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.analyses import knockout as K
from probes.data.dataset import load_dataset
from probes.data.retrieval import Retriever, make_embedder
from probes.engine.session import BASELINE, EngineSession, Knockout, span_positions
from probes.prompts.builder import BuildSettings, PromptBuilder
from probes.scoring import controls as C
from probes.scoring.claims import Claim, absence_claim, claims_table, effect_claim
from probes.scoring.score import record_rng
from reference import knockout_masks, masked_eager_forward

TOL = 1e-5


@pytest.fixture(scope="module")
def setup(tiny_qwen3_dir: Path):
    torch.set_num_threads(1)
    session = EngineSession(tiny_qwen3_dir)
    builders = {}
    for name, relevance in (("basm_probe", "lexical"), ("basm_probe_v2", "lexical")):
        dataset = load_dataset(name)
        builders[name] = PromptBuilder(session.tokenizer, dataset, Retriever(make_embedder("lexical")),
                                       BuildSettings(k_max=3, relevance=relevance))
    return session, builders


def _lines(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Independent line split of text[start:end] (each line with its newline)."""
    out, cursor = [], start
    for piece in text[start:end].splitlines(keepends=True):
        out.append((cursor, cursor + len(piece)))
        cursor += len(piece)
    return out


def test_neutral_pool_over_real_records_holds_no_b_p_label_or_tool_line(setup):
    session, builders = setup
    checked = short = 0
    for name, builder in builders.items():
        dataset = builder.dataset
        names = C.tool_names_of(dataset)
        items = dataset.select(split="eval", buckets=["T_wrong", "T_ok", "T_repair"])[::9]
        for item in items:
            for k in (1, 2, 3):
                record = builder.build(item, "basm", k, "native")
                if not record.spans.get("boundary"):
                    continue
                pool = C.neutral_pool(record, names)
                offsets, text = np.asarray(record.offsets), record.text
                (lo, hi), = record.spans["memory"]
                b, p = set(span_positions(record.spans["boundary"])), set(span_positions(record.spans["procedure"]))
                chosen = set(np.flatnonzero(pool).tolist())
                assert chosen, f"{record.record_id}: empty pool"
                assert chosen <= set(range(lo, hi)) and not chosen & b and not chosen & p
                lines = _lines(text, int(offsets[lo][0]), int(offsets[hi - 1][1]))
                # which lines hold a B or P token, from the token offsets
                bp_lines = {i for t in b | p for i, (a, e) in enumerate(lines) if offsets[t][0] < e and offsets[t][1] > a}
                for t in chosen:
                    a, e = offsets[t]
                    for i, (la, le) in enumerate(lines):
                        if a < le and e > la:
                            line = text[la:le]
                            assert i not in bp_lines, (record.record_id, line)
                            assert not any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", line) for n in names), line
                            assert not (line.strip().endswith(":") and i + 1 in bp_lines), line  # a B or P section label
                # count-matched: the same n on both sides, n = min(|B|, |pool|)
                options = SimpleNamespace(random_pool="neutral", random_draws=2, controls=K.CONTROLS, seed=0, mass_tolerance=0.1)
                attention = np.random.default_rng(0).dirichlet(np.ones(record.n_tokens), size=(2, 2))
                draws, state = K.draw_controls(record, attention, options, names)
                drawn = dict(draws)
                n = min(len(b), len(chosen))
                for i in range(2):
                    assert len(drawn[f"bsub_{i}"]) == len(drawn[f"psub_{i}"]) == n == state.info[f"psub_{i}"]["control_n"]
                    assert set(drawn[f"bsub_{i}"]) <= b and set(drawn[f"psub_{i}"]) <= chosen
                    assert set(drawn[f"random_{i}"]) <= chosen and set(drawn[f"mass_{i}"]) <= chosen
                    mass = attention.mean((0, 1))[drawn[f"mass_{i}"]].sum()
                    if state.info[f"mass_{i}"]["control_matched"]:
                        assert abs(mass - state.boundary_mass) <= 0.1 * state.boundary_mass + 1e-12
                    else:  # unmatched only because the whole pool holds too little mass
                        assert attention.mean((0, 1))[list(chosen)].sum() < 0.9 * state.boundary_mass
                short += len(chosen) < len(b)
                checked += 1
    assert checked >= 20
    print(f"\n{checked} records checked; pool smaller than |B| in {short}")


def test_mass_matched_draw_stays_in_the_band_and_says_when_it_cannot():
    rng = np.random.default_rng(1)
    weights = rng.uniform(0, 0.01, 300)
    free = np.zeros(300, dtype=bool)
    free[100:300] = True
    positions, total, matched = C.draw_mass_matched(free, weights, 0.2, rng, 0.05)
    assert matched and 0.19 <= total <= 0.21 and free[positions].all()
    assert abs(weights[positions].sum() - total) <= 1e-12
    positions, total, matched = C.draw_mass_matched(free, weights, 10.0, rng, 0.05)  # more than the pool holds
    assert not matched and sorted(positions) == list(range(100, 300))


def test_knockout_mass_equals_the_eager_attention_at_the_deciding_row(setup, tiny_qwen3_dir):
    """``knockout_mass`` of the scorer's rows against an eager forward (no probe engine) at the deciding
    row of a record whose correct and wrong names share their first token, and B's mass against the
    scorer's own Eq. 2 α · |B|."""
    session, builders = setup
    builder = builders["basm_probe"]
    record = builder.build(builder.dataset.select(ids=["retail-ok-0001"])[0], "basm", 2, "native")
    ctx = SimpleNamespace(options=SimpleNamespace(priming=False, knockout_rows="path", random_pool="neutral", random_draws=1,
                                                  controls=("neutral", "mass"), seed=0, mass_tolerance=0.1, margin_variant="tool_choice"),
                          dataset=builder.dataset, session=session, variant="tool_choice", _score_cache={})
    job = SimpleNamespace(config="basm", item=SimpleNamespace(id=record.item_id))
    rows = {r["condition"]: r for r in K.knockout_scorer(ctx, [])(record, job)}
    base = rows["baseline"]
    d = record.decision_index
    depth = base["deciding_depth"]
    assert depth >= 1, "the item must have a shared name prefix under the real Qwen3 tokenizer"
    correct = next(c for c in record.candidates if c.role == "correct").token_ids
    seq = record.input_ids + correct[:depth]
    eager = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, attn_implementation="eager").eval()
    cfg = eager.config
    _, att = masked_eager_forward(eager, seq, knockout_masks(len(seq), BASELINE.active(cfg.num_hidden_layers, cfg.num_attention_heads), (), []))
    row = att[:, :, d + depth, : record.n_tokens]  # [layer, head, key]
    draws = dict(K.draw_controls(record, K.deciding_attention(session, record), ctx.options, C.tool_names_of(builder.dataset))[0])
    for name in ("boundary", "procedure", "random_0", "mass_0"):
        positions = span_positions(record.spans[name]) if name in ("boundary", "procedure") else draws[name]
        want = float(row[:, :, positions].sum(-1).mean())
        assert abs(rows[name]["knockout_mass"] - want) <= TOL, name
    assert abs(base["boundary_mass"] - base["alpha_boundary"] * base["boundary_size"]) <= TOL
    assert rows["boundary"]["knockout_mass"] > rows["random_0"]["knockout_mass"] > 0  # not vacuous


def test_knockout_scorer_takes_the_prompt_prefix_from_the_cache_and_equals_a_run_without(setup):
    """The deciding-row call branches where the scoring call does, so that call reuses the whole
    prompt prefix; every row equals the rows of a session without reuse."""
    session, builders = setup
    builder = builders["basm_probe"]
    record = builder.build(builder.dataset.select(ids=["retail-ok-0001"])[0], "basm", 2, "native")
    options = SimpleNamespace(priming=False, knockout_rows="path", random_pool="neutral", random_draws=2,
                              controls=("neutral", "count", "mass"), seed=0, mass_tolerance=0.1, margin_variant="tool_choice")
    job = SimpleNamespace(config="basm", item=SimpleNamespace(id=record.item_id))
    out = {}
    for cache in (0, 8):
        probe = EngineSession(session.model, tokenizer=session.tokenizer, prefix_cache=cache)
        ctx = SimpleNamespace(options=options, dataset=builder.dataset, session=probe, variant="tool_choice", _score_cache={})
        out[cache] = (K.knockout_scorer(ctx, [(0,), (1,)])(record, job), probe.prefix_reuse)
    (cold, cold_counter), (warm, warm_counter) = out[0], out[8]
    p = min(record.query_rows)
    assert cold_counter.tokens_reused == 0 and warm_counter.tokens_reused == p and warm_counter.prompts == 2
    assert [r["condition"] for r in warm] == [r["condition"] for r in cold] and len(warm) == 1 + 1 + 2 * 5 + 1 + 2
    for a, b in zip(warm, cold):
        for key, value in b.items():
            if isinstance(value, float) and np.isfinite(value):
                assert abs(a[key] - value) <= TOL, (b["condition"], key)
            else:
                assert a[key] == value or (isinstance(value, float) and np.isnan(a[key])), (b["condition"], key)
    assert len({r["broad_margin"] for r in warm}) > 1  # the knockouts move the margins: not vacuous


# ----------------------------------------------------------------------------- planted dose case
def _planted_rows(groups: int = 10, per_group: int = 3, draws: int = 3, slope: float = 5.0, noise: float = 0.01) -> pd.DataFrame:
    """Rows as the knockout scorer writes them, for a 'model' in which knocking out any set of
    positions raises the margin by ``slope`` × the attention mass they held (nothing is special
    about B). B: 20 positions of 0.01 each (mass 0.2); the pool: 180 positions of 0.0005 and one
    high-attention region of 20 positions of 0.01."""
    rng = np.random.default_rng(0)
    n = 260
    weights = np.zeros(n)
    b = list(range(20, 40))
    weights[b] = 0.01
    free = np.zeros(n, dtype=bool)
    free[60:260] = True
    weights[60:260] = 0.0005
    weights[100:120] = 0.01
    rows = []
    for g in range(groups):
        for r in range(per_group):
            rid = f"item-{g}-{r}|basm|k2|native"
            base = {"record_id": rid, "item_id": f"item-{g}-{r}", "config": "basm", "bucket": "T_wrong", "task_group": f"g{g}", "tempting_shown": r > 0,
                    "boundary_size": len(b), "correct_is_abstain": False, "boundary_mass": 0.2}
            m0 = rng.normal(1.0, 0.5)
            conditions = {"baseline": ([], {}), "boundary": (b, {})}
            for i in range(draws):
                seed = record_rng(0, rid, str(i))
                conditions[f"bsub_{i}"] = (C.draw_positions(np.isin(np.arange(n), b), 20, seed), {"control_n": 20})
                conditions[f"psub_{i}"] = (C.draw_positions(free, 20, seed), {"control_n": 20})
                positions, _, matched = C.draw_mass_matched(free, weights, 0.2, seed, 0.1)
                conditions[f"mass_{i}"] = (positions, {"control_matched": matched})
            for name, (positions, info) in conditions.items():
                mass = float(weights[positions].sum())
                m = m0 + (slope * mass + rng.normal(0, noise) if positions else 0.0)
                rows.append({**base, "condition": name, "margin": m, "broad_margin": m, "correct_margin": 0.0, "call_logodds": 0.0,
                             "knockout_mass": mass, "knockout_digest": K.knockout_digest(Knockout(name, tuple(positions))), **info})
    return pd.DataFrame(rows)


def test_planted_mass_effect_fools_the_count_match_but_not_the_mass_match():
    summary = K.summarise_rows(_planted_rows(), sesoi=0.25)
    claims = claims_table(summary.claims).set_index("name")
    # count-matched: n random positions of B remove more mass than n random pool positions, so B "wins"
    assert claims.loc["count-matched", "verdict"] == "holds"
    # mass-matched: the same mass removed, the same shift; B is not special
    assert claims.loc["mass-matched", "estimate"] == pytest.approx(0.0, abs=0.1)
    assert not claims.loc["mass-matched", "verdict"].startswith("holds")
    # the mass-matched control itself moves the margin: never called neutral
    control = summary.controls.set_index("control").loc["mass_matched"]
    assert control["value"] > 0.5 and not control["ci_contains_0"]
    assert "moves m: CI ∌ 0" in K.knockout_labels(summary)["mass_matched"] and "TOST" not in K.knockout_labels(summary)["mass_matched"]
    assert not claims.loc["mass_matched neutral", "verdict"].startswith("holds")
    assert int(control["n_matched_records"]) == 30


# ----------------------------------------------------------------------------- claims
def test_holm_by_hand_and_a_null_family_that_correction_keeps_null():
    p = [0.01, 0.04, 0.03, 0.2]
    claims = [Claim("f", f"c{i}", "s", 0.1, 0.05, 0.2, 8, pi, p_floor=1 / 256) for i, pi in enumerate(p)]
    table = claims_table(claims)
    order = np.argsort(p)
    m, running, want = len(p), 0.0, np.zeros(len(p))
    for rank, i in enumerate(order):  # Holm: max over the sorted prefix of (m − rank) p, capped at 1
        running = max(running, min(1.0, (m - rank) * p[i]))
        want[i] = running
    assert np.allclose(table["p_holm"], want)

    # 15 effect claims on pure noise over 10 task groups: some unadjusted p < 0.05, no Holm one
    rng = np.random.default_rng(3)
    groups = np.repeat([f"g{i}" for i in range(10)], 2)
    null = [effect_claim("null", f"n{i}", "noise", rng.normal(0, 1, 20), groups, seed=i) for i in range(15)]
    table = claims_table(null)
    assert (table["p"] < 0.05).any() and (table["p_holm"] > 0.05).all()
    assert all(not v.startswith("holds") for v in table["verdict"])
    assert any(v.startswith("not after correction") for v in table["verdict"])
    # families are corrected separately: the same p alone in its family is not adjusted
    alone = claims_table([Claim("a", "x", "s", 0.1, 0.05, 0.2, 8, 0.01, p_floor=1 / 256), Claim("b", "y", "s", 0.1, 0.05, 0.2, 8, 0.01, p_floor=1 / 256)])
    assert np.allclose(alone["p_holm"], 0.01)


def test_tost_equivalence_and_its_limits():
    rng = np.random.default_rng(0)
    groups = np.repeat([f"g{i}" for i in range(10)], 3)
    small = absence_claim("f", "small", "s", rng.normal(0.0, 0.05, 30), groups, sesoi=0.25)
    beyond = absence_claim("f", "beyond", "s", rng.normal(0.4, 0.05, 30), groups, sesoi=0.25)
    few = absence_claim("f", "few", "s", rng.normal(0.0, 0.05, 9), groups[:9], sesoi=0.25)  # 3 task groups
    table = claims_table([small, beyond, few]).set_index("name")
    assert table.loc["small", "verdict"].startswith("holds: equivalent")
    assert table.loc["beyond", "verdict"].startswith("not shown")
    assert table.loc["few", "verdict"].startswith("untestable")  # 3 groups: p ≥ 1/8, whatever the data
    with pytest.raises(ValueError, match="sesoi"):
        absence_claim("f", "x", "s", [0.0, 0.1], ["a", "b"], sesoi=0.0)
