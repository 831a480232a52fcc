"""Sliding-window attention on Gemma 3 (issue #46 item 2): a random-weight Gemma 3 whose local layers see
16 keys (conftest ``gemma3_dir``), on prompts ten times longer than the window, against an independent eager
forward whose every layer gets an explicit 4D additive mask (tests/reference.py): the layer's own causal
sliding window, plus the knockout's blocked cells.

Bar (float32): logits and span attention within 1e-5 of the reference under cached branching (prefix reuse
on and off, bit-identical) and under the single-pass path; attention to a key outside a local layer's
window exactly 0; a knockout of keys outside the window on a local layer a no-op there, bit for bit, and
said so by :meth:`Knockout.reach`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.engine.session import BASELINE, EngineSession, Knockout, attention_windows
from reference import knockout_masks, masked_eager_forward

N = 160  # ten windows: a prefix of two 128-token blocks, the far spans out of every local row's reach
QUERY_ROWS = [140, 150, 159]
FAR = list(range(20, 60))  # outside the window of every query row
NEAR = list(range(146, 156))  # inside the window of rows 150 and 159
SPANS = {"far": FAR, "near": NEAR}
LOCAL, GLOBAL = (0, 2), (1,)
CONDITIONS = [Knockout("far", FAR), Knockout("near", NEAR), Knockout("near_local", NEAR, layers=LOCAL),
              Knockout("pairs", FAR + NEAR, heads=((0, 1), (1, 3), (2, 0)))]
TOL = 1e-5
GEMMA3_WINDOW = 16  # conftest's random Gemma 3


@pytest.fixture(scope="module")
def session(gemma3_dir: Path) -> EngineSession:
    return EngineSession(gemma3_dir)


@pytest.fixture(scope="module")
def eager(gemma3_dir: Path):
    return AutoModelForCausalLM.from_pretrained(gemma3_dir, attn_implementation="eager").eval()


def _ids(seed: int, n: int = N) -> list[int]:
    return torch.randint(3, 290, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference(eager, session: EngineSession, ids: list[int], knockout: Knockout) -> tuple[torch.Tensor, torch.Tensor]:
    active = knockout.active(session.n_layers, session.n_heads)
    return masked_eager_forward(eager, ids, knockout_masks(len(ids), active, knockout.key_positions, QUERY_ROWS, session.windows))


def test_the_model_is_gemma3_with_local_and_global_layers(session):
    assert session.model.config.model_type == "gemma3_text"
    assert session.windows == attention_windows(session.model) == [GEMMA3_WINDOW, None, GEMMA3_WINDOW]


def test_the_reference_masks_are_the_model_own(session, eager):
    """The explicit per-layer masks reproduce the model's own eager forward (its sliding and causal masks)."""
    ids = _ids(1)
    with torch.no_grad():
        own = eager(torch.tensor([ids]), use_cache=False, output_attentions=True)
    logits, probs = _reference(eager, session, ids, BASELINE)
    assert (logits - own.logits[0]).abs().max() <= TOL
    assert (probs - torch.stack([a[0] for a in own.attentions])).abs().max() <= TOL


@pytest.mark.parametrize("path", ["run", "forward"])
def test_knockouts_and_span_attention_match_per_layer_4d_masks(session, eager, path):
    ids = _ids(2)
    result = getattr(session, path)(ids, QUERY_ROWS, SPANS, CONDITIONS, record_rows=True)
    for knockout in [BASELINE, *CONDITIONS]:
        logits, probs = _reference(eager, session, ids, knockout)
        got = result[knockout.name]
        assert (got.logits - logits[QUERY_ROWS[0]:]).abs().max() <= TOL, knockout.name
        at_rows = probs[:, :, QUERY_ROWS]  # [layer, head, row, n]
        assert (got.rows - at_rows).abs().max() <= TOL, knockout.name
        for span, positions in SPANS.items():
            assert (got.span_mass[span] - at_rows[..., positions].sum(-1)).abs().max() <= TOL, (knockout.name, span)
        for layer in LOCAL:  # a local layer's row gives exactly 0 to every key outside its window
            for i, row in enumerate(QUERY_ROWS):
                assert torch.all(got.rows[layer, :, i, : row - GEMMA3_WINDOW + 1] == 0)
    assert torch.all(result["baseline"].span_mass["far"][list(LOCAL)] == 0)
    assert result["baseline"].span_mass["far"][list(GLOBAL)].min() > 0


def test_a_knockout_outside_the_window_is_a_no_op_on_local_layers(session):
    """B far outside the window, knocked out on the local layers only: the logits are the baseline's bit for
    bit, and :meth:`Knockout.reach` calls it a no-op there; on the global layer it acts."""
    ids, windows = _ids(3), session.windows
    local, everywhere = Knockout("far_local", FAR, layers=LOCAL), Knockout("far", FAR)
    result = session.run(ids, QUERY_ROWS, SPANS, [local, everywhere])
    assert torch.equal(result["far_local"].logits, result["baseline"].logits)
    assert (result["far"].logits - result["baseline"].logits).abs().max() > 1e-3
    assert not local.reach(session.n_heads, QUERY_ROWS, windows).any()
    assert everywhere.reach(session.n_heads, QUERY_ROWS, windows).any(dim=1).tolist() == [False, True, False]
    # the planted opposite: keys inside the window on a local layer are reached (and move the logits)
    near_local = Knockout("near_local", NEAR, layers=LOCAL)
    assert near_local.reach(session.n_heads, QUERY_ROWS, windows).any(dim=1).tolist() == [True, False, True]
    # rows that the knockout does not block do not count: only row 140 blocked, NEAR is in its future
    assert not Knockout("near_at_140", NEAR, rows=(140,), continuation=False).reach(session.n_heads, QUERY_ROWS, windows).any()


def test_prefix_reuse_and_cached_branching_respect_the_window(gemma3_dir, session, eager):
    """Two prompts sharing 140 tokens (the second reuses the first's prefix blocks, its keys in a mask the
    attention function builds itself) score bit-identically with and without reuse, and a 3-token candidate
    continuation's log-probabilities equal the eager forward of the prompt with the candidate appended."""
    first, second = _ids(4), _ids(4)[:140] + _ids(5)[140:]
    fresh = EngineSession(gemma3_dir, prefix_cache=0)
    candidate = {"c": (N - 1, [7, 8, 9])}
    for ids in (first, second):
        reused = session.run(ids, QUERY_ROWS, SPANS, CONDITIONS, candidates=candidate)
        alone = fresh.run(ids, QUERY_ROWS, SPANS, CONDITIONS, candidates=candidate)
        for a, b in zip(reused.conditions, alone.conditions):
            assert torch.equal(a.logits, b.logits) and all(torch.equal(a.span_mass[s], b.span_mass[s]) for s in SPANS)
            assert torch.equal(a.candidate_token_logprobs["c"], b.candidate_token_logprobs["c"])
    assert session.prefix_reuse.tokens_reused >= 128
    logits, _ = _reference(eager, session, second + [7, 8], BASELINE)
    expected = torch.log_softmax(logits[N - 1:], -1)[torch.arange(3), torch.tensor([7, 8, 9])]
    assert (reused["baseline"].candidate_token_logprobs["c"] - expected).abs().max() <= TOL


def test_the_deciding_row_replay_respects_the_window(session, eager):
    """The circuit's one-row replay (probes.engine.decision_row) past the window: its metric is the eager forward's
    logit difference, the far span holds no mass on the local layers, and knocking out the near span there gives the
    eager metric under that knockout."""
    from probes.engine.decision_row import DecisionRow

    ids, row = _ids(6), N - 1
    row_replay = DecisionRow(session, ids, spans={"far": FAR, "near": NEAR}, wrong_token=7, correct_token=8)
    logits, _ = _reference(eager, session, ids, BASELINE)
    assert abs(row_replay.metric - float(logits[row, 7] - logits[row, 8])) <= TOL
    far = row_replay.spans.index("far")
    assert torch.isinf(row_replay.messages.log_mass[list(LOCAL), :, far]).all() and torch.isfinite(row_replay.messages.log_mass[1, :, far]).all()
    knocked = Knockout("near_at_row", NEAR, rows=(row,), continuation=False)
    active = knocked.active(session.n_layers, session.n_heads)
    logits, _ = masked_eager_forward(eager, ids, knockout_masks(N, active, knocked.key_positions, [row], session.windows))
    assert abs(row_replay.knocked_out("near").metric - float(logits[row, 7] - logits[row, 8])) <= TOL
