"""The LLM skill extractor: replies read as JSON (or one fenced block), checked by ψ and the anchor
checks, retried with the reasons, discarded with them; and the chat generator on a random Qwen3.

Expected skills are written out here as JSON objects; the reasons are the literal messages ψ gives.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from probes.data.extract_llm import NO_EVIDENCE, Candidate, LLMExtractor, RecordingGenerator, Reply, prompt_messages, replay_record
from probes.data.schema import Tool, ToolCatalog

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CATALOG = ToolCatalog((Tool("get_weather", "Current weather of a city.", PARAMS, "weather"),
                       Tool("get_forecast", "Forecast of a city.", PARAMS, "weather")))
CANDIDATE = Candidate("weather.get_weather", CATALOG["get_weather"], CATALOG,
                      successes=('request "weather in Paris?" -> get_weather(city=\'Paris\')',),
                      boundary=('get_weather failed with "unknown city" when the city was misspelled.',), domain="weather")


def skill(**changes) -> dict:
    out = {
        "id": "weather.get_weather", "goal": "Report the current weather of a city.",
        "procedure": ["Call get_weather with the city the user names."], "tools": ["get_weather"],
        "applicability": ["The user names a city."], "risk_cues": ["The city name is misspelled."],
        "avoidance_rules": ["Do not call get_weather with an unverified city."], "recovery_notes": ["Ask for the city again."],
    }
    out.update(changes)
    return out


class Scripted:
    """A text generator with the ``ChatGenerator`` interface whose replies are given in advance."""

    label = "scripted"
    max_new_tokens = 64
    batch_size = 1

    def __init__(self, *replies: str, truncated: bool = False) -> None:
        self.scripted = list(replies)
        self.truncated = truncated
        self.prompts: list[list[dict[str, str]]] = []
        self.calls: list[int] = []  # conversations per replies() call: one per round of the extractor

    def __call__(self, messages) -> Reply:
        self.prompts.append([dict(m) for m in messages])
        return Reply(self.scripted.pop(0), self.truncated)

    def replies(self, conversations, *, on_batch=None) -> list[Reply]:
        self.calls.append(len(conversations))
        made = [self(messages) for messages in conversations]
        if on_batch is not None:
            on_batch(list(range(len(made))), made)
        return made


def test_a_valid_reply_is_kept_as_written():
    generator = Scripted(json.dumps(skill()))
    result = LLMExtractor(generator, retries=2).extract(CANDIDATE)
    assert result.to_json() == skill() and result.domain == "weather"
    assert len(generator.prompts) == 1 and generator.prompts[0] == prompt_messages(CANDIDATE)
    user = generator.prompts[0][1]["content"]
    for text in ('"weather.get_weather"', '"risk_cues"', "catalog: get_weather, get_forecast.", CANDIDATE.successes[0], CANDIDATE.boundary[0]):
        assert text in user


@pytest.mark.parametrize("fence", ["```json\n{}\n```", "  ```json\n{}```\n", "```\n{}\n```"])
def test_a_fenced_block_filling_the_reply_is_read(fence):
    result = LLMExtractor(Scripted(fence.replace("{}", json.dumps(skill(), indent=1))), retries=0).extract(CANDIDATE)
    assert result.to_json() == skill()


@pytest.mark.parametrize("reply", [
    "Here is the skill:\n```json\n{}\n```",  # text around the block
    "{} Hope this helps.",  # trailing text
    "```json\n{}\n``` and ```json\n{}\n```",  # two blocks
])
def test_nothing_more_lenient_than_one_fence(reply):
    result = LLMExtractor(Scripted(reply.replace("{}", json.dumps(skill()))), retries=0).extract(CANDIDATE)
    assert result.reason == "not strict JSON" and result.problems[0].startswith("<json>: not strict JSON")


@pytest.mark.parametrize("bad, reason, problem", [
    ('{"id": "weather.get_weather", "goal": ', "not strict JSON", "<json>: not strict JSON: Expecting value: line 1 column 38 (char 37)"),
    ("[1, 2]", "not a JSON object", "<json>: must be a JSON object, got list"),
    (json.dumps(skill(risk_cues=[])), "invalid fields: risk_cues", "risk_cues: must be a non-empty list"),
    (json.dumps(skill(tools=["get_wether"])), "invalid fields: tools", "tools: item 0: tool 'get_wether' does not exist in the tool catalog"),
    (json.dumps(skill(tools=["get_forecast"])), "invalid fields: tools", "tools: must include the anchor tool 'get_weather', got ['get_forecast']"),
    (json.dumps(skill(id="weather.forecast")), "invalid fields: id", "id: must be 'weather.get_weather', got 'weather.forecast'"),
])
def test_rejected_replies_are_retried_with_the_reasons_then_discarded(bad, reason, problem):
    generator = Scripted(bad, bad, bad)
    result = LLMExtractor(generator, retries=2).extract(CANDIDATE)
    assert result.reason == reason and problem in result.problems and result.replies == (bad, bad, bad)
    assert len(generator.prompts) == 3
    for attempt, prompt in enumerate(generator.prompts):
        assert prompt[:2] == prompt_messages(CANDIDATE) and len(prompt) == 2 + 2 * attempt
        for assistant, feedback in zip(prompt[2::2], prompt[3::2]):
            assert assistant == {"role": "assistant", "content": bad}
            assert feedback["role"] == "user" and f"- {problem}\n" in feedback["content"]


def test_a_retry_can_recover_and_truncation_is_named():
    generator = Scripted('{"id": "weather.get_weather"', json.dumps(skill()))
    assert LLMExtractor(generator, retries=1).extract(CANDIDATE).to_json() == skill()
    assert "<json>: not strict JSON" in generator.prompts[1][-1]["content"]
    cut = LLMExtractor(Scripted('{"id": "weather.get_', truncated=True), retries=0).extract(CANDIDATE)
    assert cut.reason == "not strict JSON (cut at max_new_tokens)"


def test_run_counts_kept_and_discarded_per_reason():
    no_evidence = Candidate("weather.get_forecast", CATALOG["get_forecast"], CATALOG, ("x",), (), "weather")
    forecast = Candidate("weather.get_forecast", CATALOG["get_forecast"], CATALOG, ("x",), ("y",), "weather")
    forecast_skill = skill(id="weather.get_forecast", tools=["get_forecast"])
    bad = json.dumps(skill(avoidance_rules=[]))
    # in rounds: the first reply of every prompted candidate, then the second of those still open
    replies = [json.dumps(skill()), "not json", bad, "nope",  # candidates 0, 1, 2, 4 (3 has no evidence)
               json.dumps(forecast_skill), bad, "nope"]  # 1 kept after one retry; 2 and 4 discarded
    generator = Scripted(*replies)
    extraction = LLMExtractor(generator, retries=1).run([CANDIDATE, forecast, CANDIDATE, no_evidence, CANDIDATE])
    assert generator.calls == [4, 3]
    assert [p[-1]["content"].startswith("That reply was rejected") for p in generator.prompts] == [False] * 4 + [True] * 3
    assert [s.id for s in extraction.kept] == ["weather.get_weather", "weather.get_forecast"]
    assert extraction.attempts == {"weather.get_weather": 1, "weather.get_forecast": 2}
    assert extraction.discarded() == Counter({"invalid fields: avoidance_rules": 1, NO_EVIDENCE: 1, "not strict JSON": 1})
    assert len(extraction.kept) + len(extraction.rejected) == 5
    assert len(generator.prompts) == len(replies) and not generator.scripted  # the candidate without evidence was not prompted
    assert [r.replies for r in extraction.rejected][1] == ()
    assert "kept 2, discarded 3" in extraction.summary()


def test_a_recorded_run_replays_to_the_same_extraction(tmp_path):
    """RecordingGenerator writes every reply as its batch is made; replay_record re-checks them and
    reaches the extraction the run reached (kept, attempts, reasons), also for a run stopped part-way."""
    forecast = Candidate("weather.get_forecast", CATALOG["get_forecast"], CATALOG, ("x",), ("y",), "weather")
    quoted = json.dumps(skill(id="weather.get_forecast", tools=["get_forecast"], risk_cues=['"weather in Paris right now"'],
                              procedure=['Served "weather in Paris right now?"']))
    replies = [json.dumps(skill()), "not json", quoted]
    recorder = RecordingGenerator(Scripted(*replies), tmp_path / "record.jsonl")
    assert (recorder.label, recorder.max_new_tokens, recorder.batch_size) == ("scripted", 64, 1)
    run = LLMExtractor(recorder, retries=1).run([CANDIDATE, forecast])
    rows = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["weather.get_weather", "weather.get_forecast", "weather.get_forecast"]
    assert rows[0] == {"id": "weather.get_weather", "model": "scripted", "max_new_tokens": 64, "reply": replies[0], "truncated": False}
    replayed = replay_record(rows, {"weather": CATALOG})
    assert [s.to_json() for s in replayed.kept] == [s.to_json() for s in run.kept] and replayed.attempts == run.attempts == {"weather.get_weather": 1}
    assert replayed.discarded() == run.discarded() == Counter({"invalid fields: quotations": 1})
    stopped = replay_record(rows[:2], {"weather": CATALOG})  # stopped after the first round
    assert stopped.attempts == {"weather.get_weather": 1} and stopped.discarded() == Counter({"not strict JSON": 1})


def test_retries_must_not_be_negative():
    with pytest.raises(ValueError, match="retries must be ≥ 0"):
        LLMExtractor(Scripted(), retries=-1)


def test_chat_generator_on_random_qwen3_rejects_every_candidate(tiny_qwen3_dir):
    """Random weights write no JSON: every candidate is discarded as unparsable after its retry. The
    first reply is plain HF greedy generation on the Qwen3 template with thinking off."""
    import torch
    from transformers import AutoModelForCausalLM

    from probes.engine.generate import ChatGenerator

    generator = ChatGenerator.load(tiny_qwen3_dir, max_new_tokens=6)
    candidates = [CANDIDATE, Candidate("weather.get_forecast", CATALOG["get_forecast"], CATALOG, ("x",), ("y",), "weather")]
    extraction = LLMExtractor(generator, retries=1).run(candidates)
    assert not extraction.kept and len(extraction.rejected) == 2
    assert all(r.reason.startswith("not strict JSON") and len(r.replies) == 2 for r in extraction.rejected)
    assert generator.label == str(tiny_qwen3_dir)

    tokenizer = generator.tokenizer
    text = tokenizer.apply_chat_template(prompt_messages(CANDIDATE), tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text.startswith("<|im_start|>system\nYou extract") and text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir).eval()
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    new = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                             eos_token_id=stops, pad_token_id=stops[0])[0, ids.shape[1]:].tolist()
    cut = next((i for i, token in enumerate(new) if token in stops), None)
    assert extraction.rejected[0].replies[0] == tokenizer.decode(new[:cut], skip_special_tokens=True)
    assert extraction.rejected[0].reason.endswith("(cut at max_new_tokens)") == (cut is None)


def test_batched_replies_equal_one_at_a_time(tiny_qwen3_dir):
    """ChatGenerator.replies: left-padded batches (longest prompts first) give each conversation the
    reply it gets alone, in the conversations' order; on_batch sees each batch as it is made."""
    from probes.engine.generate import ChatGenerator, greedy_generate, greedy_generate_batch

    generator = ChatGenerator.load(tiny_qwen3_dir, max_new_tokens=7, batch_size=2)
    conversations = [[{"role": "user", "content": text}] for text in ("weather in Paris today?", "the forecast for Paris and Rome, please " * 4, "hi")]
    seen: list[tuple[list[int], list[Reply]]] = []
    batched = generator.replies(conversations, on_batch=lambda indices, made: seen.append((indices, made)))
    assert batched == [generator(messages) for messages in conversations]
    prompts = [generator.prompt_ids(messages) for messages in conversations]
    assert len(prompts[1]) > len(prompts[0]) > len(prompts[2])  # padding is exercised in both batches' order
    assert [indices for indices, _ in seen] == [[1, 0], [2]]  # longest first
    assert [batched[i] for indices, made in seen for i in indices] == [reply for _, made in seen for reply in made]

    assert greedy_generate_batch(generator.model, prompts, generator._stop_ids, 7) == [
        greedy_generate(generator.model, p, generator._stop_ids, 7) for p in prompts]
    with pytest.raises(ValueError, match="batch_size must be ≥ 1"):
        ChatGenerator(generator.model, generator.tokenizer, batch_size=0)
    with pytest.raises(ValueError, match="none of them empty"):
        greedy_generate_batch(generator.model, [prompts[0], []], generator._stop_ids, 7)
