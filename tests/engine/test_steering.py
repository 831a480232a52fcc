"""Steering conditions of the engine (probes.engine.session.Steering) against independent computations.

Bar: a zero vector reproduces the clean rows bit for bit; a steered run equals an eager HF forward whose
decoder layer gets the same vector added by a plain forward hook at the same rows (≤ 1e-5, fp32), at the
decision row only, at every row from the branch point, and on a candidate's continuation rows; a planted
linear readout (the unembedding difference of two tokens, added after the last layer) flips exactly at the
α the arithmetic through the final norm gives; bad requests are refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.engine.session import EngineSession, Knockout, Steering

TOL = 1e-5
N = 48
ROWS = [44, 45, 46, 47]  # the query rows: the branch point 44 to the decision row 47
WRONG, CORRECT = 17, 33


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return torch.randint(5, 290, (N,), generator=torch.Generator().manual_seed(5)).tolist()


@pytest.fixture(scope="module")
def session(qwen3_dir: Path) -> EngineSession:
    return EngineSession(qwen3_dir)


@pytest.fixture(scope="module")
def eager(qwen3_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(qwen3_dir, attn_implementation="eager").eval()


def direction(session: EngineSession, seed: int = 0, norm: float = 3.0) -> torch.Tensor:
    v = torch.randn(session.model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    return v / v.norm() * norm


@torch.no_grad()
def eager_steered(model: torch.nn.Module, ids: list[int], vectors: dict[int, torch.Tensor], rows: list[int]) -> torch.Tensor:
    """Logits [n, vocab] of an eager forward whose decoder layer L's output gets ``vectors[L]`` added at ``rows``."""

    def add(vector: torch.Tensor):
        def hook(_m, _inp, output):
            hs = (output[0] if isinstance(output, tuple) else output).clone()
            hs[0, rows] += vector
            return (hs, *output[1:]) if isinstance(output, tuple) else hs
        return hook

    handles = [model.model.layers[layer].register_forward_hook(add(v)) for layer, v in vectors.items()]
    try:
        return model(torch.tensor([ids]), use_cache=False).logits[0].float()
    finally:
        for h in handles:
            h.remove()


def test_zero_vector_reproduces_the_clean_rows_bit_for_bit(session: EngineSession, ids: list[int]) -> None:
    candidates = {"a": (47, [WRONG, 9, 12]), "b": (47, [CORRECT])}
    zero = Steering("zero", {0: torch.zeros(session.model.config.hidden_size), 1: torch.zeros(session.model.config.hidden_size)})
    res = session.run(ids, ROWS, candidates=candidates, conditions=[zero], record_residual=True)
    clean, steered = res.conditions
    assert torch.equal(clean.logits, steered.logits)
    assert torch.equal(clean.residual, steered.residual)
    for name in candidates:
        assert torch.equal(clean.candidate_token_logprobs[name], steered.candidate_token_logprobs[name])
    alone = session.run(ids, ROWS, candidates=candidates).conditions[0]
    assert torch.allclose(alone.logits, steered.logits, atol=TOL, rtol=0)


@pytest.mark.parametrize("rows, at", [(None, ROWS), ((47,), [47]), ((45, 47), [45, 47])])
def test_steered_run_equals_an_eager_forward_with_the_vector_added(session: EngineSession, eager, ids: list[int], rows, at) -> None:
    vectors = {0: direction(session, 1), 1: direction(session, 2, norm=5.0)}
    res = session.run(ids, ROWS, conditions=[Steering("s", vectors, rows=rows)])
    reference = eager_steered(eager, ids, vectors, at)
    steered = res["s"]
    for row in ROWS:
        assert torch.allclose(steered.logits_at(row), reference[row], atol=TOL, rtol=0), row
    # the vector moves the rows it is added at (a test that cannot fail would not)
    assert (steered.logits_at(47) - res.conditions[0].logits_at(47)).abs().max() > 1e-2


def test_continuation_rows_are_steered_only_when_asked(session: EngineSession, eager, ids: list[int]) -> None:
    vectors = {1: direction(session, 3)}
    tokens = [WRONG, 9, 12]
    candidates = {"a": (47, tokens)}
    res = session.run(ids, ROWS, candidates=candidates, conditions=[Steering("with", vectors, rows=(47,)),
                                                                    Steering("without", vectors, rows=(47,), continuation=False)])
    extended = ids + tokens[:-1]
    for name, rows in (("with", [47, 48, 49]), ("without", [47])):
        logp = torch.log_softmax(eager_steered(eager, extended, vectors, rows)[47:], dim=-1)
        expected = logp[torch.arange(3), torch.tensor(tokens)]
        assert torch.allclose(res[name].candidate_token_logprobs["a"], expected, atol=TOL, rtol=0), name


def test_planted_readout_flips_where_the_arithmetic_says(session: EngineSession, ids: list[int]) -> None:
    """d = W_U[correct] − W_U[wrong] added after the last layer at the decision row: the margin
    logit(wrong) − logit(correct) as a function of α is computed by hand through the final norm and the LM
    head from the clean residual; its root α* (bisection) is where the steered run's margin changes sign."""
    model = session.model
    last = model.config.num_hidden_layers - 1
    clean = session.run(ids, ROWS, record_residual=True).conditions[0]
    h = clean.residual[-1].double()  # the last decoder layer's output at the decision row
    w = model.lm_head.weight.double()
    d = w[CORRECT] - w[WRONG]
    d = d / d.norm()

    def margin_by_hand(alpha: float) -> float:
        x = h + alpha * d
        normed = model.model.norm.weight.detach().double() * x * torch.rsqrt(x.pow(2).mean() + model.config.rms_norm_eps)
        logits = normed @ w.T
        return float(logits[WRONG] - logits[CORRECT])

    m0 = margin_by_hand(0.0)
    sign = 1.0 if m0 > 0 else -1.0  # push toward the other token
    lo, hi = 0.0, 1.0
    while margin_by_hand(sign * hi) * m0 > 0:
        hi *= 2
        assert hi < 1e6, "the readout never flips"
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if margin_by_hand(sign * mid) * m0 > 0 else (lo, mid)
    root = sign * (lo + hi) / 2
    eps = 1e-3 * abs(root) + 1e-4
    conditions = [Steering(name, {last: (a * d).float()}, rows=(47,)) for name, a in (("before", root - sign * eps), ("after", root + sign * eps))]
    res = session.run(ids, ROWS, conditions=conditions)
    for c in res.conditions[1:]:
        a = root - sign * eps if c.condition.name == "before" else root + sign * eps
        logits = c.logits_at(47)
        assert abs(float(logits[WRONG] - logits[CORRECT]) - margin_by_hand(a)) < 1e-4
    before, after = (float(res[n].logits_at(47)[WRONG] - res[n].logits_at(47)[CORRECT]) for n in ("before", "after"))
    assert before * m0 > 0 > after * m0


def test_steering_and_knockouts_share_one_run(session: EngineSession, ids: list[int]) -> None:
    vectors = {1: direction(session, 4)}
    knock = Knockout("k", tuple(range(5, 20)))
    both = session.run(ids, ROWS, conditions=[knock, Steering("s", vectors)])
    assert torch.allclose(both["k"].logits, session.run(ids, ROWS, conditions=[knock])["k"].logits, atol=TOL, rtol=0)
    assert torch.allclose(both["s"].logits, session.run(ids, ROWS, conditions=[Steering("s", vectors)])["s"].logits, atol=TOL, rtol=0)


def test_bad_steering_requests_are_refused(session: EngineSession, ids: list[int]) -> None:
    width = session.model.config.hidden_size
    with pytest.raises(ValueError, match="no layer to steer"):
        Steering("empty", {})
    with pytest.raises(ValueError, match="one finite"):
        Steering("nan", {0: torch.full((width,), float("nan"))})
    with pytest.raises(ValueError, match="hidden size"):
        session.run(ids, ROWS, conditions=[Steering("short", {0: torch.ones(width - 1)})])
    with pytest.raises(ValueError, match="layer 9 must lie"):
        session.run(ids, ROWS, conditions=[Steering("deep", {9: torch.ones(width)})])
    with pytest.raises(ValueError, match="not query rows"):
        session.run(ids, ROWS, conditions=[Steering("early", {0: torch.ones(width)}, rows=(3,))])
    with pytest.raises(ValueError, match="runs knockouts only"):
        session.forward(ids, ROWS, conditions=[Steering("single", {0: torch.ones(width)})])


def test_steered_generation_equals_a_cacheless_steered_forward(session: EngineSession, eager, ids: list[int]) -> None:
    """Greedy generation under steered_from (HF generate with its KV cache) writes, at every step, the argmax of an
    eager cache-less forward of the prompt plus the tokens so far with the vector added at every position ≥ start;
    its first token is also the argmax of the engine's steered run at the branch point's row (Steering rows=None)."""
    from probes.engine.generate import greedy_generate, steered_greedy_generate

    vectors = {1: direction(session, 6, norm=8.0)}
    start = 44
    prompt = ids[:45]  # the prompt ends at the row that opens the call (the branch point 44)
    new, _ = steered_greedy_generate(session.model, prompt, [], 6, vectors=vectors, start=start)
    assert len(new) == 6
    for j, token in enumerate(new):
        seq = prompt + new[:j]
        logits = eager_steered(eager, seq, vectors, list(range(start, len(seq))))
        assert int(logits[-1].argmax()) == token, j
    engine = session.run(prompt, [44], conditions=[Steering("s", vectors)])
    assert int(engine["s"].logits_at(44).argmax()) == new[0]
    assert steered_greedy_generate(session.model, prompt, [], 6, vectors={1: torch.zeros_like(vectors[1])}, start=start)[0] == \
        greedy_generate(session.model, prompt, [], 6)[0]
    plain = greedy_generate(session.model, prompt, [], 6)[0]
    assert plain != new  # the vector changes what is written (else the check above could not fail)
    with pytest.raises(ValueError, match="outside the prompt"):
        steered_greedy_generate(session.model, prompt, [], 2, vectors=vectors, start=len(prompt))
