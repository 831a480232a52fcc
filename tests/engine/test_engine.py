"""Engine exactness against independent references (tiny random fp32 models, GQA 4 heads / 2 KV).

Tolerances (fp32): recorded rows vs eager ``output_attentions`` ≤ 1e-5; knockout logits vs an
explicit per-layer/per-head float 4D additive mask on an *eager* model ≤ 1e-5; vs TransformerLens
TransformerBridge hook edits ≤ 1e-4; cached branch vs full forward ≤ 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.engine.hooks import HOOK_EMBED, HOOK_PATTERN, HOOK_RESID_POST, HOOK_Z, Recorder, hook_point
from probes.scoring.score import score_record
from probes.engine.session import ATTN_IMPLEMENTATION, BASELINE, ContinuationTree, Knockout, EngineSession, span_positions
from probes.prompts.record import Candidate, PromptRecord
from reference import knockout_masks, masked_eager_forward

N = 48
QUERY_ROWS = [20, 33, 47]
SPANS = {"boundary": list(range(4, 14)), "procedure": list(range(14, 26)), "self": [47]}
CONDITIONS = [
    Knockout("all_layers", range(4, 14)),
    Knockout("window", range(4, 14), layers=(1,)),
    Knockout("pairs", list(range(4, 14)) + [30, 31], heads=((0, 1), (1, 2), (1, 3))),
]
TOL = 1e-5


def _ids(seed: int = 0, n: int = N) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (n,), generator=g).tolist()


@pytest.fixture(scope="module")
def sessions(model_root: Path) -> dict[str, EngineSession]:
    return {arch: EngineSession(model_root / arch) for arch in ("qwen3", "llama")}


@pytest.fixture(scope="module")
def eager_models(model_root: Path) -> dict[str, torch.nn.Module]:
    return {
        arch: AutoModelForCausalLM.from_pretrained(model_root / arch, attn_implementation="eager").eval()
        for arch in ("qwen3", "llama")
    }


def _reference_logits(model: torch.nn.Module, ids: list[int], ko: Knockout, query_rows: Sequence[int]) -> torch.Tensor:
    """Logits [n, vocab] of an eager forward where each layer gets its own 4D float mask via a pre-hook."""
    return _reference(model, ids, ko, query_rows)[0]


def _reference(model: torch.nn.Module, ids: list[int], ko: Knockout, query_rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [n, vocab], attention probabilities [layer, head, n, n]) of that eager forward."""
    cfg = model.config
    active = ko.active(cfg.num_hidden_layers, cfg.num_attention_heads)
    return masked_eager_forward(model, ids, knockout_masks(len(ids), active, ko.key_positions, query_rows))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_recorded_rows_match_eager_output_attentions(arch, sessions, eager_models):
    sess, ids = sessions[arch], _ids(1)
    with torch.no_grad():
        att = eager_models[arch](torch.tensor([ids]), output_attentions=True).attentions
    eager_rows = torch.stack([a[0][:, QUERY_ROWS, :] for a in att])  # [layer, head, r, n]
    for res in (sess.run(ids, QUERY_ROWS, SPANS, record_rows=True), sess.forward(ids, QUERY_ROWS, SPANS, record_rows=True)):
        base = res.conditions[0]
        assert base.rows.shape == (sess.n_layers, sess.n_heads, len(QUERY_ROWS), N)
        assert (base.rows - eager_rows).abs().max() <= TOL
        for name, pos in SPANS.items():
            assert (base.span_mass[name] - eager_rows[..., pos].sum(-1)).abs().max() <= TOL
    # Rows are far from uniform, so the comparison is not vacuous.
    assert eager_rows.max() > 0.2


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_knockouts_match_explicit_4d_mask(arch, sessions, eager_models):
    sess, ids = sessions[arch], _ids(2)
    p = QUERY_ROWS[0]
    cached = sess.run(ids, QUERY_ROWS, SPANS, CONDITIONS, record_rows=True)
    single = sess.forward(ids, QUERY_ROWS, SPANS, CONDITIONS, record_rows=True)
    for ko in [BASELINE, *CONDITIONS]:
        ref = _reference_logits(eager_models[arch], ids, ko, QUERY_ROWS)[p:]
        for res in (cached, single):
            assert (res[ko.name].logits - ref).abs().max() <= TOL, ko.name
        if ko.key_positions:
            # The knockout really changed something, and blocked keys get exactly zero mass.
            assert (cached[ko.name].logits - cached["baseline"].logits).abs().max() > 1e-3
            act = ko.active(sess.n_layers, sess.n_heads)
            assert cached[ko.name].rows[act][..., list(ko.key_positions)].abs().max() == 0


def test_no_knockout_equals_plain_sdpa(qwen3_dir, sessions):
    sess, ids = sessions["qwen3"], _ids(3)
    sdpa = AutoModelForCausalLM.from_pretrained(qwen3_dir, attn_implementation="sdpa").eval()
    with torch.no_grad():
        ref = sdpa(torch.tensor([ids]), use_cache=False).logits[0, QUERY_ROWS[0] :]
    single = sess.forward(ids, QUERY_ROWS, SPANS)
    # The single path runs the sdpa kernel itself for every row: bit-identical.
    assert torch.equal(single.conditions[0].logits, ref)
    cached = sess.run(ids, QUERY_ROWS, SPANS)
    assert (cached.conditions[0].logits - ref).abs().max() <= TOL


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_cached_branch_equals_full_forwards(arch, sessions, eager_models):
    sess, ids = sessions[arch], _ids(4)
    # Candidates sharing name prefixes run through one token trie (``shares`` and ``twin`` reuse
    # rows of ``multi``; ``early2`` rows of ``early``): each must equal its own full forward.
    cands = {"multi": (47, [5, 6, 7, 8]), "single": (47, [9]), "early": (33, [10, 11, 12]),
             "shares": (47, [5, 6, 9]), "twin": (47, [5, 13]), "early2": (33, [10, 11, 14, 15])}
    tree = ContinuationTree.build(ids, QUERY_ROWS[0], cands)
    assert len(tree.tokens) == N - QUERY_ROWS[0] + 3 + 0 + 2 + 0 + 0 + 1  # the shared nodes once
    assert tree.rows["shares"][:2] == tree.rows["multi"][:2] and tree.rows["early2"][:3] == tree.rows["early"]
    cached = sess.run(ids, QUERY_ROWS, SPANS, CONDITIONS, cands, record_rows=True, record_residual=True)
    for ko in [BASELINE, *CONDITIONS]:
        full = sess.forward([*ids], QUERY_ROWS, SPANS, [ko], record_rows=True, record_residual=True, include_baseline=False)
        a, b = cached[ko.name], full.conditions[0]
        assert (a.logits - b.logits).abs().max() <= TOL
        assert (a.rows - b.rows).abs().max() <= TOL
        for s in SPANS:
            assert (a.span_mass[s] - b.span_mass[s]).abs().max() <= TOL
        assert (a.residual - b.residual).abs().max() <= TOL
        assert abs(a.entropy - b.entropy) <= TOL
        # Candidates: a full forward over prompt[:anchor+1] + ids, knocking out the query rows up to
        # the anchor and every continuation row; span masses at the rows predicting each token.
        for name, (anchor, toks) in cands.items():
            seq = ids[: anchor + 1] + toks
            blocked = [r for r in QUERY_ROWS if r <= anchor] + list(range(anchor + 1, anchor + len(toks)))
            logits, att = _reference(eager_models[arch], seq, ko, blocked)
            ref = torch.log_softmax(logits, -1)
            rows = torch.arange(anchor, anchor + len(toks))
            assert (a.candidate_token_logprobs[name] - ref[rows, toks]).abs().max() <= TOL, (ko.name, name)
            for s, pos in SPANS.items():
                want = att[:, :, rows][..., [q for q in pos if q <= anchor]].sum(-1)  # [layer, head, len(toks)]
                assert (a.candidate_span_mass[name][s] - want).abs().max() <= TOL, (ko.name, name, s)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_knockout_rows_and_continuations_are_selectable(arch, sessions, eager_models):
    """``rows`` limits a knockout to some query rows; ``continuation=False`` spares candidate rows."""
    sess, ids = sessions[arch], _ids(5)
    toks = [5, 6, 7]
    ko = Knockout("some_rows", range(4, 14), rows=(33,), continuation=False)
    res = sess.run(ids, QUERY_ROWS, SPANS, [ko], {"c": (47, toks)})[ko.name]
    logits = _reference_logits(eager_models[arch], ids + toks[:-1], ko, [33])
    assert (res.logits - logits[QUERY_ROWS[0] : N]).abs().max() <= TOL
    want = torch.log_softmax(logits, -1)[torch.arange(47, 50), toks]
    assert (res.candidate_token_logprobs["c"] - want).abs().max() <= TOL
    # ... and the default (every query row, continuations too) gives something else.
    every = sess.run(ids, QUERY_ROWS, SPANS, [Knockout("all", range(4, 14))], {"c": (47, toks)})["all"]
    assert (every.candidate_token_logprobs["c"] - res.candidate_token_logprobs["c"]).abs().max() > 1e-3


def test_condition_batching_does_not_change_results(sessions):
    sess, ids = sessions["qwen3"], _ids(5)
    together = sess.run(ids, QUERY_ROWS, SPANS, CONDITIONS, {"c": (47, [1, 2])})
    for ko in CONDITIONS:
        alone = sess.run(ids, QUERY_ROWS, SPANS, [ko], {"c": (47, [1, 2])})
        assert (together[ko.name].logits - alone[ko.name].logits).abs().max() <= TOL
        assert (together[ko.name].candidate_token_logprobs["c"] - alone[ko.name].candidate_token_logprobs["c"]).abs().max() <= TOL


def test_residual_matches_hidden_states(qwen3_dir, sessions):
    sess, ids = sessions["qwen3"], _ids(6)
    sdpa = AutoModelForCausalLM.from_pretrained(qwen3_dir).eval()
    with torch.no_grad():
        hs = sdpa(torch.tensor([ids]), output_hidden_states=True).hidden_states
    res = sess.run(ids, QUERY_ROWS, record_residual=True).conditions[0].residual
    assert res.shape == (sess.n_layers + 1, 64)
    # hidden_states[L] is after the final norm in transformers; ours is the raw layer output.
    for layer in range(sess.n_layers):
        assert (res[layer] - hs[layer][0, QUERY_ROWS[-1]]).abs().max() <= TOL


def test_transformer_lens_hook_edits(qwen3_dir, sessions):
    """TransformerLens bridge reference, two ways: scores set to -inf on the knocked edges
    (hook_attn_scores, pre-softmax: the keys leave the softmax) and the pattern zeroed on those
    edges and renormalised (hook_pattern) — the same distribution, written post-softmax."""
    from transformer_lens.model_bridge import TransformerBridge

    sess, ids = sessions["qwen3"], _ids(7)
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir)  # its own copy: the bridge rewrites it in place
    bridge = TransformerBridge.boot_transformers(str(qwen3_dir), hf_model=hf, tokenizer=sess.tokenizer)
    res = sess.run(ids, QUERY_ROWS, SPANS, CONDITIONS)
    p = QUERY_ROWS[0]
    for ko in CONDITIONS:
        act = ko.active(sess.n_layers, sess.n_heads)
        keys = list(ko.key_positions)
        rows = torch.tensor(QUERY_ROWS)

        def edge_mask(shape: torch.Size, layer: int) -> torch.Tensor:
            m = torch.zeros(shape, dtype=torch.bool)
            for h in range(sess.n_heads):
                if act[layer, h]:
                    m[:, h, rows[:, None], torch.tensor(keys)[None, :]] = True
            return m

        def scores_hook(x, hook):
            return x.masked_fill(edge_mask(x.shape, hook.layer()), float("-inf"))

        def pattern_hook(x, hook):
            x = x.masked_fill(edge_mask(x.shape, hook.layer()), 0.0)
            return x / x.sum(-1, keepdim=True)

        layers = range(sess.n_layers)
        for suffix, fn in (("hook_attn_scores", scores_hook), ("hook_pattern", pattern_hook)):
            hooks = [(f"blocks.{layer}.attn.{suffix}", fn) for layer in layers]
            with torch.no_grad():
                logits = bridge.run_with_hooks(torch.tensor([ids]), fwd_hooks=hooks)[0, p:].float()
            assert (res[ko.name].logits - logits).abs().max() <= 1e-4, (ko.name, suffix)


def test_registered_attention_is_sdpa_outside_probes(qwen3_dir, sessions):
    """Generation etc. still work with the probe attention installed (it defers to sdpa)."""
    sess = sessions["qwen3"]
    assert sess.model.config._attn_implementation == ATTN_IMPLEMENTATION
    sdpa = AutoModelForCausalLM.from_pretrained(qwen3_dir).eval()
    x = torch.tensor([_ids(8, 20)])
    with torch.no_grad():
        assert torch.equal(sess.model(x).logits, sdpa(x).logits)


def test_session_from_loaded_model(qwen3_dir, sessions):
    """An already loaded model gets the probe attention installed and behaves identically."""
    sess = EngineSession(AutoModelForCausalLM.from_pretrained(qwen3_dir), tokenizer=sessions["qwen3"].tokenizer)
    assert sess.model.config._attn_implementation == ATTN_IMPLEMENTATION
    ids = _ids(11)
    a = sess.run(ids, QUERY_ROWS, SPANS, CONDITIONS[:1])
    b = sessions["qwen3"].run(ids, QUERY_ROWS, SPANS, CONDITIONS[:1])
    for x, y in zip(a.conditions, b.conditions):
        assert torch.equal(x.logits, y.logits)


def test_attention_rows_tidy(sessions):
    sess = sessions["qwen3"]
    res = sess.run(_ids(9), QUERY_ROWS, SPANS, CONDITIONS[:1])
    rows = res.attention_rows()
    assert len(rows) == 2 * len(SPANS) * sess.n_layers * sess.n_heads * len(QUERY_ROWS)
    r = next(x for x in rows if x["span"] == "boundary" and x["condition"] == "baseline")
    assert r["mean"] == pytest.approx(r["mass"] / 10)


def test_invalid_requests(sessions):
    sess, ids = sessions["qwen3"], _ids(10)
    with pytest.raises(ValueError, match="blocks every key"):
        sess.run(ids, [5], conditions=[Knockout("all", range(6))])
    with pytest.raises(ValueError, match="anchor"):
        sess.run(ids, [30], candidates={"x": (10, [1])})
    with pytest.raises(ValueError, match="layers` or `heads"):
        Knockout("bad", [1], layers=(0,), heads=((0, 0),))
    with pytest.raises(ValueError, match="out of range"):
        sess.run(ids, [30], conditions=[Knockout("bad", [1], layers=(7,))])
    assert span_positions([[3, 5], [4, 7]]) == [3, 4, 5, 6]


def test_recorders_refuse_what_they_cannot_record(sessions):
    """A recorder names known hook points, rows it can take, and a name of its own."""
    sess, ids = sessions["qwen3"], _ids(10)
    norm = Recorder("norm", (HOOK_Z,), lambda z: z.norm(dim=-1))
    assert Recorder("norm", (HOOK_Z,), norm.fn).sites(2) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    with pytest.raises(ValueError, match="must be hook points"):
        Recorder("q", ("blocks.{L}.attn.hook_q",), norm.fn)
    with pytest.raises(ValueError, match="rows must be 'query'"):
        Recorder("x", (HOOK_Z,), norm.fn, rows="decision", candidates=True)
    with pytest.raises(ValueError, match="different axes"):
        Recorder("x", (HOOK_Z, HOOK_PATTERN), norm.fn)
    with pytest.raises(ValueError, match="unknown hook"):
        hook_point("blocks.0.attn.hook_q")
    for bad in ([Recorder("span_mass", (HOOK_Z,), norm.fn)], [norm, norm]):
        with pytest.raises(ValueError, match="recorder names must be unique"):
            sess.run(ids, [5], recorders=bad)
    # the residual recorder's sites run embeddings first, then layer by layer, as ConditionResult.residual
    res = sess.run(ids, [5, 9], recorders=[Recorder("resid", (HOOK_EMBED, HOOK_RESID_POST), lambda x: x, rows="decision")],
                   record_residual=True).conditions[0]
    assert torch.equal(res.recorded["resid"], res.residual) and res.residual.shape == (sess.n_layers + 1, 64)


def _native_record(tok, names: dict[str, str], collide: bool) -> PromptRecord:
    """A native-format record: prompt, then `<tool_call>\n{"name": "` forced up to the decision row."""
    prompt = tok.encode("Use the tool only when the applicability conditions hold. Risk: the account is locked.")
    forced = tok.encode('<tool_call>\n{"name": "')
    ids = prompt + forced
    open_index = len(prompt) - 1
    d = len(ids) - 1
    cands = []
    for role, action in names.items():
        t = tok.encode(action + '"')
        cands.append(Candidate(role=role, action=action, anchor_index=d, text=action, token_ids=t, first_token_id=t[0], boundary_merge=False))
    cands.append(Candidate(role="abstain", action="abstain", anchor_index=open_index, text="I", token_ids=[tok.encode("I")[0]],
                           first_token_id=tok.encode("I")[0], boundary_merge=False))
    return PromptRecord(
        record_id="x|proc|k2|native", item_id="x", bucket="T_wrong", split="eval", domain="", task_group="", config="proc", k=2,
        format="native", tokenizer="", text="", input_ids=ids, n_tokens=len(ids), decision_index=d, open_index=open_index,
        query_rows=list(range(open_index, d + 1)), spans={"boundary": [(2, 8)], "procedure": [(8, 14)]}, spans_kind={"boundary": "boundary"},
        skills=[], candidates=cands, collision=collide, correct_action=names["correct"], wrong_tools=[names["wrong"]],
        tempting_skill="", tempting_rank=None, tempting_shown_rank=None, retrieval={"mode": "ranked"},
    )


def test_score_record_resolves_a_shared_first_token_at_the_divergence_row(sessions):
    sess = sessions["qwen3"]
    tok = sess.tokenizer
    rec = _native_record(tok, {"wrong": "get_user_orders", "correct": "get_user_profile"}, True)
    w, c = rec.candidates[0].token_ids, rec.candidates[1].token_ids
    s = next(i for i in range(min(len(w), len(c))) if w[i] != c[i])
    assert s > 0, "the names must share a first token for this test"
    rows = score_record(sess, rec, [Knockout.from_spans("boundary", rec.spans["boundary"])])
    assert [r["condition"] for r in rows] == ["baseline", "boundary"]
    d = rec.decision_index
    for r, ko in zip(rows, [BASELINE, Knockout.from_spans("boundary", rec.spans["boundary"])]):
        assert r["first_token_collision"] and math.isnan(r["margin_first_token"])  # never a silent 0
        assert not r["margin_collision"] and r["deciding_depth"] == s and r["deciding_row"] == d + s
        assert r["margin_pairs"] == [["get_user_orders", "get_user_profile", s]]
        # Independent: a full run over the prompt plus the shared prefix; raw logits at the row after it.
        res = sess.forward(rec.input_ids + c[:s], list(range(rec.open_index, d + s + 1)), conditions=[ko] if ko.key_positions else [],
                           include_baseline=not ko.key_positions)
        logits = res.conditions[0].logits_at(d + s)
        assert r["margin"] == pytest.approx(float(logits[w[s]] - logits[c[s]]), abs=1e-5)


def test_score_record_eq1_with_abstention_present_matches_raw_logits(sessions):
    """Abstention stays among the candidates; Eq. 1 restricted to the tools does not use it, and the
    abstention decision is its own quantity (call log-odds at the open row)."""
    sess = sessions["qwen3"]
    tok = sess.tokenizer
    rec = _native_record(tok, {"wrong": "cancel_order", "correct": "refund_payment"}, False)
    assert any(c.role == "abstain" for c in rec.candidates)
    row = score_record(sess, rec)[0]
    with torch.no_grad():
        logits = sess.model(torch.tensor([rec.input_ids])).logits[0].float()  # raw logits, no engine
    w, c = (x.first_token_id for x in rec.candidates[:2])
    d, o = rec.decision_index, rec.open_index
    assert row["margin"] == pytest.approx(float(logits[d, w] - logits[d, c]), abs=1e-5)
    assert row["margin_first_token"] == pytest.approx(row["margin"], abs=1e-5)
    p_open = torch.softmax(logits[o].double(), -1)[rec.input_ids[o + 1]]
    assert row["call_logodds"] == pytest.approx(float(torch.log(p_open) - torch.log1p(-p_open)), abs=1e-4)
    assert not row["correct_is_abstain"]


def test_score_record_scores_other_tools_only_up_to_the_token_the_margins_read(sessions):
    """Broad and correct margins read each catalog tool at the one token where it parts from the
    correct tool; ``score_record`` runs no row beyond it. Same rows as scoring every tool whole."""
    from probes.scoring import margins
    from probes.scoring.score import scored_tokens

    sess = sessions["qwen3"]
    tok = sess.tokenizer
    rec = _native_record(tok, {"wrong": "get_user_orders", "correct": "get_user_profile"}, True)
    d = rec.decision_index
    for action in ("get_user_settings_page", "delete_user_account", "get_weather_forecast"):
        t = tok.encode(action + '"')
        rec.candidates.append(Candidate(role="other", action=action, anchor_index=d, text=action, token_ids=t, first_token_id=t[0],
                                        boundary_merge=False))
    cands = margins.candidates_from_record(rec)
    asked = scored_tokens(cands, "native")
    assert not any(c.is_abstention for c in cands if c.key in asked)  # native: no margin reads the abstention tokens
    cut = [c for c in cands if c.role == "other" and len(asked[c.key][1]) < len(c.token_ids)]
    assert cut, "some catalog tool must be cut for this test"
    ko = Knockout.from_spans("boundary", rec.spans["boundary"])
    rows = score_record(sess, rec, [ko])
    # Independent: every candidate scored whole, the margins computed from those log-probs.
    full = sess.run(rec.input_ids, rec.query_rows, conditions=[ko], candidates={c.key: (c.anchor_index, list(c.token_ids)) for c in cands})
    for row, res in zip(rows, full.conditions):
        lp = res.candidate_token_logprobs
        for name, fn in (("broad_margin", margins.broad_margin), ("correct_margin", margins.correct_margin),
                         ("margin", margins.tool_choice_margin)):
            assert math.isfinite(row[name]) and row[name] == pytest.approx(fn(cands, lp, "native").value, abs=1e-5), name
        want = margins.path_margin(res.row_logits, rec.input_ids, cands, "native", d, lp, rec.open_index).value
        assert row["margin_path"] == pytest.approx(want, abs=1e-5)
    assert rows[0]["broad_margin"] != pytest.approx(rows[1]["broad_margin"], abs=1e-4)  # the knockout moves it
