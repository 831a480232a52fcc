"""The engine on architecture ``qwen2`` (the real model of issue #42 is Qwen2.5-Coder-1.5B): a
random-weight Qwen2 with grouped-query attention and the q/k/v biases Qwen3 does not have, loaded from a
folder as a user's would be. Its knockouts equal an eager forward under explicit 4D masks, and with no
knockout it equals plain sdpa."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from probes.engine.session import BASELINE, EngineSession, Knockout
from reference import knockout_masks, masked_eager_forward

N = 40
QUERY_ROWS = [18, 30, 39]
SPANS = {"boundary": list(range(4, 12)), "procedure": list(range(12, 22))}
CONDITIONS = [Knockout("all_layers", range(4, 12)), Knockout("window", range(4, 12), layers=(1,)),
              Knockout("pairs", list(range(4, 12)) + [25], heads=((0, 1), (1, 3)))]
TOL = 1e-5


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Path:
    torch.manual_seed(2)
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # widen the scores (random init is small) and make the biases matter
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(10.0) if name.endswith("weight") else p.normal_(0, 1.0)
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # the architecture difference under test
    d = tmp_path_factory.mktemp("qwen2") / "qwen2"
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def _ids(seed: int) -> list[int]:
    return torch.randint(3, 250, (N,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_qwen2_loads_with_grouped_query_attention(qwen2_dir):
    session = EngineSession(qwen2_dir)
    assert session.model.config.model_type == "qwen2"
    assert (session.n_layers, session.n_heads, session.model.config.num_key_value_heads) == (2, 4, 2)


def test_qwen2_knockouts_match_explicit_4d_mask(qwen2_dir):
    session = EngineSession(qwen2_dir)
    eager = AutoModelForCausalLM.from_pretrained(qwen2_dir, attn_implementation="eager").eval()
    ids = _ids(5)
    cached = session.run(ids, QUERY_ROWS, SPANS, CONDITIONS, record_rows=True)
    for knockout in [BASELINE, *CONDITIONS]:
        active = knockout.active(session.n_layers, session.n_heads)
        logits, _ = masked_eager_forward(eager, ids, knockout_masks(N, active, knockout.key_positions, QUERY_ROWS))
        assert (cached[knockout.name].logits - logits[QUERY_ROWS[0]:]).abs().max() <= TOL, knockout.name
        if knockout.key_positions:  # the knockout changed the logits, and blocked keys get no mass
            assert (cached[knockout.name].logits - cached["baseline"].logits).abs().max() > 1e-3
            assert cached[knockout.name].rows[active][..., list(knockout.key_positions)].abs().max() == 0


def test_qwen2_without_knockout_equals_plain_sdpa(qwen2_dir):
    session, ids = EngineSession(qwen2_dir), _ids(6)
    sdpa = AutoModelForCausalLM.from_pretrained(qwen2_dir, attn_implementation="sdpa").eval()
    with torch.no_grad():
        reference = sdpa(torch.tensor([ids]), use_cache=False).logits[0, QUERY_ROWS[0]:]
    assert torch.equal(session.forward(ids, QUERY_ROWS, SPANS).conditions[0].logits, reference)
    assert (session.run(ids, QUERY_ROWS, SPANS).conditions[0].logits - reference).abs().max() <= TOL
