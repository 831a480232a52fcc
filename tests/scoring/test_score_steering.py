"""score_record under steering conditions, on a real prompt record (the real Qwen3 tokenizer, a tiny random
Qwen3): ``kl_clean`` equals KL(clean ‖ steered) at the decision row from an eager forward with the vector
added by a plain hook (≤ 1e-5); the clean row's ``top_action`` is the first of ``calls``'s ranking; a steering
row says what it did and carries no knockout field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from probes.analyses.calls import ranked_actions
from probes.data.dataset import load_dataset
from probes.data.retrieval import Retriever, make_embedder
from probes.engine.session import EngineSession, Steering
from probes.prompts.builder import BuildSettings, PromptBuilder
from probes.scoring.score import score_record

TOL = 1e-5


@pytest.fixture(scope="module")
def setup(tiny_qwen3_dir: Path):
    session = EngineSession(tiny_qwen3_dir)
    dataset = load_dataset("basm_probe")
    builder = PromptBuilder(session.tokenizer, dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=1))
    record = builder.build(dataset.select(ids=["retail-wrong-0001"])[0], "basm", 1, "native")
    eager = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, attn_implementation="eager").eval()
    return session, record, eager


def test_kl_and_top_action_of_a_steered_record(setup) -> None:
    session, record, eager = setup
    width = session.model.config.hidden_size
    vector = torch.randn(width, generator=torch.Generator().manual_seed(0)) * 4
    steer = Steering("s", {1: vector}, rows=(record.decision_index,))
    rows = {r["condition"]: r for r in score_record(session, record, [steer], actions=True)}
    clean, steered = rows["baseline"], rows["s"]
    assert clean["kl_clean"] == 0.0
    assert clean["top_action"] == ranked_actions(session, record)[0][0]
    assert clean["top_role"] in ("correct", "wrong", "other", "abstain")
    assert steered["steering_layers"] == [1] and steered["steering_rows"] == [record.decision_index]
    assert abs(steered["steering_norms"][0] - float(vector.norm())) < 1e-4
    assert "knockout_size" not in steered and clean["knockout_size"] == 0

    def hook(_m, _inp, output):
        hs = (output[0] if isinstance(output, tuple) else output).clone()
        hs[0, record.decision_index] += vector
        return (hs, *output[1:]) if isinstance(output, tuple) else hs

    ids = torch.tensor([record.input_ids])
    with torch.no_grad():
        p = torch.log_softmax(eager(ids, use_cache=False).logits[0, record.decision_index].double(), -1)
        handle = eager.model.layers[1].register_forward_hook(hook)
        q = torch.log_softmax(eager(ids, use_cache=False).logits[0, record.decision_index].double(), -1)
        handle.remove()
    expected = float((p.exp() * (p - q)).sum())
    assert expected > 1e-4  # the vector moves the distribution
    assert abs(steered["kl_clean"] - expected) < TOL
