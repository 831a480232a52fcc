"""Generation (probes.engine.generate): greedy generation through the probe attention equals a plain sdpa model."""

from __future__ import annotations

from probes.engine.generate import greedy_generate, stop_token_ids


def test_generation_through_probe_attention_equals_sdpa(tiny_qwen3_dir):
    """HF generate on the session's model (probe attention registered) = a plain sdpa model."""
    from transformers import AutoModelForCausalLM

    from probes.engine.session import EngineSession

    session = EngineSession(tiny_qwen3_dir)
    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, attn_implementation="sdpa").eval()
    prompt = session.tokenizer("<|im_start|>user\nhello, which tool?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    stops = stop_token_ids(session.model, session.tokenizer)
    session.run(prompt, [len(prompt) - 1], record_residual=True)  # a probe call before must leave no state behind
    ours = greedy_generate(session.model, prompt, stops, 12)
    theirs = greedy_generate(reference, prompt, stops, 12)
    assert ours == theirs and len(ours[0]) > 0
