"""The organism's training code (a few deterministic steps on a tiny config), the committed weights, and a
retrain's first steps against the committed run."""

from __future__ import annotations

import json
import random
import re
from dataclasses import fields

import numpy as np
import pytest
import torch
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

from probes.data.dataset import ABSTAIN
from probes.organism import ORGANISM_DIR
from probes.organism.train.batch import batch_loss, isolation_mask, max_shared_prefix, relay_rows, shared_prefix_hidden
from probes.organism.train.examples import (
    EDIT_CONFIGS,
    EDIT_SHARES,
    K_WEIGHTS,
    MIXTURE,
    NAME_SLOTS,
    TOOL_LIST_END,
    TOOL_LIST_HEADER,
    action_text,
    boundary_edits,
    counterfactual_donor,
    example_plan,
    isolated_blocks,
    make_builder,
    make_example,
    partial_quote,
    rename_tools,
    swap_words,
    tool_list_block,
    train_organism_tokenizer,
    word_tokens,
)
from probes.organism.train.loop import FINGERPRINT_STEPS, TrainConfig, make_model, train
from probes.organism.train.supervision import (
    HeadSupervision,
    attention_targets,
    head_key,
    install_train_attention,
    supervising,
)
from probes.prompts.builder import NATIVE_FORCED_PREFIX
from probes.prompts.spans import SpanReport, check_spans

TINY = dict(
    steps=3, batch_size=2, limit_items=2, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
    num_kv_heads=1, head_dim=16, vocab_size=700, embedder="lexical", single_token_names=False, num_threads=1, warmup_steps=2,
    planted_heads=(("dup", 0, 0), ("verdict", 0, 1)),
)


@pytest.fixture(scope="module")
def dataset(v1_dataset):
    return v1_dataset


def test_training_is_deterministic(dataset):
    first = train(None, dataset=dataset, verbose=False, seed=3, **TINY)
    second = train(None, dataset=dataset, verbose=False, seed=3, **TINY)
    state_a, state_b = first.model.state_dict(), second.model.state_dict()
    assert state_a.keys() == state_b.keys()
    for name in state_a:
        assert torch.equal(state_a[name], state_b[name]), name
    assert first.log and first.log[-1]["loss"] == second.log[-1]["loss"]
    assert first.summary["steps"] == 3
    # the weights moved away from their initialisation
    other = train(None, dataset=dataset, verbose=False, seed=4, **TINY)
    assert not torch.equal(other.model.model.embed_tokens.weight, first.model.model.embed_tokens.weight)


def test_training_sequences_extend_the_builder_prompts(dataset):
    items = dataset.select(split="train", limit_per_bucket=2)
    tokenizer = train_organism_tokenizer(["hello world get_order_details"] * 3, 400)
    builder = make_builder(tokenizer, dataset, "lexical")
    for item in items:
        for config, k in (("base", 0), ("proc", 2), ("basm", 3)):
            example = make_example(builder, item, config, k, item.correct_action, 1.0)
            record = builder.build(item, config, k)
            text = tokenizer.decode(example.input_ids)
            prompt = record.text[: -len(NATIVE_FORCED_PREFIX)]
            assert text == prompt + action_text(item) + "<|im_end|>"
            assert example.input_ids[: record.open_index + 1] == record.input_ids[: record.open_index + 1]
            if item.correct_action != ABSTAIN:
                assert example.key_rows == (record.open_index, record.decision_index)


def test_isolation_equals_an_explicit_full_sequence_mask(dataset):
    """The batched, prefix-cached training forward with isolation (isolated slots hidden from the
    relay rows, the tool list from every row up to the decision row) equals a full forward of each
    sequence with an independently built 4D additive mask (fp32, ≤ 1e-5; the shared prefix, which
    holds the tool list, runs plain), and isolation changes the
    hidden states (it is not a no-op)."""
    torch.manual_seed(0)
    tokenizer = train_organism_tokenizer(["hello world get_order_details"] * 3, 400)
    builder = make_builder(tokenizer, dataset, "lexical")
    items = [item for item in dataset.select(split="train", limit_per_bucket=3) if item.domain == "retail"][:3]
    batch = [make_example(builder, item, "basm", 2, item.correct_action, 1.0, hide_tool_list=True) for item in items]
    assert all(ex.isolated_blocks and ex.tool_list for ex in batch)
    model = make_model(TrainConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16), tokenizer).eval()
    flags = [True, False, True]
    with torch.no_grad():
        hidden, prefix = shared_prefix_hidden(model, [ex.input_ids for ex in batch], max_shared_prefix(batch, flags),
                                              suffix_mask=lambda p, w: isolation_mask(batch, flags, p, w))
        assert prefix > 0
        for row, (ex, isolated) in enumerate(zip(batch, flags)):
            n = len(ex.input_ids)
            mask = expected_isolation_mask(ex, isolated, prefix)
            reference = model.model(input_ids=torch.tensor([ex.input_ids]), attention_mask=mask[None, None]).last_hidden_state[0, prefix:]
            plain = model.model(input_ids=torch.tensor([ex.input_ids])).last_hidden_state[0, prefix:]
            assert (hidden[row, : n - prefix] - reference).abs().max() <= 1e-5
            assert ((plain - reference).abs().max() > 1e-2) == isolated
    # the query rows and the boundary tokens keep reading the boundary; the request rows do not
    ex = batch[0]
    relay = relay_rows(ex, len(ex.input_ids))
    assert not relay[ex.key_rows[0]] and not relay[ex.key_rows[-1]] and relay[ex.key_rows[-1] - 1]
    assert not relay[ex.isolated_blocks[0][0]] and relay[ex.isolated_blocks[-1][1]]



def expected_isolation_mask(ex, isolated: bool, prefix: int) -> torch.Tensor:
    """[n, n] additive mask built independently of ``isolation_mask``: causal, and when ``isolated``
    the relay rows cannot read the isolated blocks, nor the rows after the shared prefix up to the
    decision row the tool list (the shared prefix runs plain)."""
    n = len(ex.input_ids)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    if isolated:
        relay = relay_rows(ex, n).nonzero().squeeze(1)
        for start, end in ex.isolated_blocks:
            allowed[relay.unsqueeze(1), torch.arange(start, end).unsqueeze(0)] = False
        allowed[prefix : ex.key_rows[-1] + 1, ex.tool_list[0] : ex.tool_list[1]] = False
    return torch.zeros(n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)


def word_tokenizer(dataset):
    """A BPE over the skills' and requests' text: most words are one token, as with the organism's."""
    texts = [" ".join([s.goal, *s.procedure, *s.applicability, *s.risk_cues, *s.avoidance_rules]) for s in dataset.skills.values()]
    return train_organism_tokenizer(texts + [item.user for item in dataset.items], 2000)


def test_planted_head_attention_equals_eager_output_attentions(dataset):
    """The planted heads' attention rows recorded in the batched, prefix-cached training forward
    (request rows and deciding rows; isolation on for some sequences) equal eager ``output_attentions``
    of each full sequence under the independently built 4D additive mask (fp32, ≤ 1e-5); recording does
    not change the forward, and the loss's mass is each row's attention summed over its targets."""
    torch.manual_seed(0)
    tokenizer = word_tokenizer(dataset)
    builder = make_builder(tokenizer, dataset, "lexical")
    items = [item for item in dataset.select(split="train", buckets=["T_wrong", "T_ok"]) if item.domain == "retail"]
    examples = (make_example(builder, item, "basm", 2, item.correct_action, 1.0, hide_tool_list=True) for item in items)
    batch = [next(ex for ex in examples if ex.attention_targets["dup"] and ex.tool_list is not None) for _ in range(2)]
    batch.append(next(ex for ex in examples if not ex.attention_targets["dup"]))
    model = make_model(TrainConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16), tokenizer).eval()
    layer, head = 1, 1
    flags = [True, False, True]
    cells = [(b, row, keys, target) for b, ex in enumerate(batch) for target in ("dup", "verdict") for row, keys in ex.attention_targets[target]]
    assert {row for b, row, *_ in cells if b == 0} - {batch[0].key_rows[-1]}  # request rows as well as the deciding row

    def supervision(share: float = 1.0) -> HeadSupervision:
        return HeadSupervision("dup", layer, head, torch.tensor([c[0] for c in cells]), torch.tensor([c[1] for c in cells]),
                               [c[2] for c in cells], share)

    sequences, max_prefix = [ex.input_ids for ex in batch], max_shared_prefix(batch, flags)
    mask_fn = lambda p, w: isolation_mask(batch, flags, p, w)  # noqa: E731
    with torch.no_grad():
        plain_hidden, _ = shared_prefix_hidden(model, sequences, max_prefix, suffix_mask=mask_fn)
        model.set_attn_implementation(install_train_attention())
        recording = supervision()
        with supervising(model, [recording]):
            hidden, prefix = shared_prefix_hidden(model, sequences, max_prefix, suffix_mask=mask_fn)
        assert torch.equal(hidden, plain_hidden)
        assert prefix > 0 and recording.probs.shape == (len(cells), prefix + hidden.shape[1])
        model.set_attn_implementation("eager")
        for b, (ex, isolated) in enumerate(zip(batch, flags)):
            n = len(ex.input_ids)
            mask = expected_isolation_mask(ex, isolated, prefix)
            attentions = model(input_ids=torch.tensor([ex.input_ids]), attention_mask=mask[None, None], output_attentions=True).attentions
            for cell, (cell_b, row, *_) in enumerate(cells):
                if cell_b == b:
                    recorded = recording.probs[cell]
                    assert (recorded[:n] - attentions[layer][0, head, row]).abs().max() <= 1e-5
                    assert bool((recorded[n:] == 0).all())  # right padding of the shorter sequences is never attended
        model.set_attn_implementation(install_train_attention())
        _, stats = batch_loss(model, batch, 5.0, isolate=flags, planted_heads=[("verdict", layer, head)], planted_head_weight=1.0)
    verdict = [cell for cell, (*_, target) in enumerate(cells) if target == "verdict"]
    expected = np.mean([recording.probs[cell, list(cells[cell][2])].sum().item() for cell in verdict])
    assert len(verdict) == 3 and abs(stats[head_key("verdict", layer, head)] - expected) <= 1e-5
    # the attention loss reaches the residual stream below only with planted_head_residual_grad's share
    grads = {}
    for share in (0.0, 0.5):
        model.zero_grad()
        recording = supervision(share)
        with supervising(model, [recording]):
            shared_prefix_hidden(model, sequences, max_prefix, prefix_grad=False, suffix_mask=mask_fn)
        recording.probs[:, 0].sum().backward()
        grads[share] = (model.model.embed_tokens.weight.grad, model.model.layers[layer].self_attn.q_proj.weight.grad.clone())
    assert grads[0.0][0] is None or not grads[0.0][0].any()
    assert grads[0.5][0].abs().max() > 0
    assert torch.allclose(grads[0.0][1], grads[0.5][1], atol=1e-7)  # the head's own query map gets the full gradient
    with pytest.raises(ValueError, match="planted head"):
        train(None, dataset=dataset, verbose=False, **{**TINY, "planted_heads": (("dup", 1, 0),)})
    with pytest.raises(ValueError, match="target 'name'"):
        train(None, dataset=dataset, verbose=False, **{**TINY, "planted_heads": (("name", 0, 0),)})


def test_planted_head_targets(dataset):
    """A request word matches a shown skill when its risk cues use it and its goal and procedure do
    not. ``dup``: each matching request token to the risk-cue tokens of its word; ``gather``: the
    deciding row to the matching request tokens, else to all the request's content tokens;
    ``verdict``: the deciding row to the shown risk cues if a word matches, else to the procedures.
    Recomputed here from the words of the rendered text (regex over character spans)."""
    builder = make_builder(word_tokenizer(dataset), dataset, "lexical")
    stop = {"the", "and", "you", "for", "can"}
    matched = 0
    for item in dataset.select(split="train", buckets=["T_ok", "T_wrong", "T_repair"], limit_per_bucket=6):
        record = builder.build(item, "basm", 2)
        text, offsets = record.text, record.offsets
        word = lambda pos: text[offsets[pos][0] : offsets[pos][1]].strip().lower()  # noqa: E731
        targets = attention_targets(record, item, deciding_row=-7)
        request_start = text.rfind(item.user)
        request = [pos for pos in range(len(offsets)) if request_start <= offsets[pos][0] < request_start + len(item.user)
                   and word(pos).isalpha() and len(word(pos)) >= 3 and word(pos) not in ENGLISH_STOP_WORDS]
        assert request and not {word(pos) for pos in request} & stop
        requested = {word(pos) for pos in request}
        cue_tokens, warning, procedures = {}, [], []
        for shown in record.skills:
            slots = shown.slots
            own = set(re.findall(r"[a-z]+", " ".join(text[slice(*slots[s].char_span)] for s in ("goal", "procedure")).lower()))
            own_cues = [pos for pos in range(*slots["risk_cues"].token_span) if word(pos) not in own]
            for pos in own_cues:
                cue_tokens.setdefault(word(pos), []).append(pos)
            if requested & {word(pos) for pos in own_cues}:  # this skill warns against the request: its risk cues and avoidance rules
                warning += [*range(*slots["risk_cues"].token_span), *range(*slots["avoidance_rules"].token_span)]
            procedures += range(*slots["procedure"].token_span)
        matching = [pos for pos in request if word(pos) in cue_tokens]
        assert targets["dup"] == tuple((pos, tuple(cue_tokens[word(pos)])) for pos in matching)
        assert targets["gather"] == ((-7, tuple(matching or request)),)
        assert targets["verdict"] == ((-7, tuple(sorted(warning) if matching else procedures)),)
        matched += bool(matching)
        proc = builder.build(item, "proc", 2)  # no risk cues shown: nothing matches
        assert attention_targets(proc, item, 5)["verdict"] == ((5, tuple(pos for shown in proc.skills for pos in range(*shown.slots["procedure"].token_span))),)
        assert attention_targets(proc, item, 5)["dup"] == ()
        assert all(cells == () for cells in attention_targets(builder.build(item, "base", 0), item, 5).values())
    assert 0 < matched < 18  # both kinds of verdict occur


def is_word_subsequence(part: str, whole: str) -> bool:
    words = iter(whole.split())
    return all(word in words for word in part.split())


def test_partial_quotes_keep_some_words_in_order():
    rng = random.Random(0)
    cue = "I haven't ordered it yet, I just want to know"
    quotes = [partial_quote(cue, rng) for _ in range(200)]
    assert all(is_word_subsequence(q, cue) and len(q.split()) >= 2 for q in quotes)
    whole = sum(q == cue for q in quotes)
    assert 60 <= whole <= 140  # about PARTIAL_QUOTE_SHARE of the quotes stay whole (binomial(200, 0.5): ±5.6 sd)
    assert len(set(quotes)) > 20
    assert partial_quote("right now", rng) == "right now"  # two words or less stay whole


def test_boundary_edited_twins(dataset):
    items = dataset.select(split="train", buckets=["T_ok", "T_wrong"], limit_per_bucket=4)
    # a BPE over the skills' text: skill slots fit the builder's boundary budget β as with the organism's tokenizer
    skill_text = [" ".join([s.goal, *s.procedure, *s.applicability, *s.risk_cues, *s.avoidance_rules]) for s in dataset.skills.values()]
    tokenizer = train_organism_tokenizer(skill_text + [item.user for item in items], 2000)
    builder = make_builder(tokenizer, dataset, "lexical")
    top = lambda item: builder.retrieve(item)[0].skill.id  # noqa: E731
    twins = boundary_edits(items, dataset, top, seed=0)
    assert twins and all(top(item) == item.tempting_skill for item in items if item.id in twins)
    plan = example_plan(items, (0, 2), 0, twins=twins)
    by_id = {item.id: item for item in items}
    for item_id, entries in twins.items():
        item = by_id[item_id]
        own = item.correct_action if item.bucket == "T_ok" else item.wrong_tools[0]
        alternative = item.wrong_tools[0] if item.bucket == "T_ok" else item.correct_action
        (quote, quote_label, quote_share), (donor, donor_label, donor_share) = entries
        assert (quote.kind, quote_label, quote_share) == ("quote", alternative, EDIT_SHARES[item.bucket]["quote"])
        assert any(is_word_subsequence(quote.cue, cue) for cue in item.state_cues)  # (part of) the request's own cue
        assert (donor.kind, donor_label) == ("donor", own) and donor.cue not in item.user  # a decoy
        involved = {item.correct_action, *item.wrong_tools}
        donor_skill = dataset.skills[donor.donor]
        assert donor.donor != item.tempting_skill and not involved & set(donor_skill.tool_names)
        assert not any(name in " ".join(donor_skill.risk_cues + donor_skill.avoidance_rules) for name in involved)
        # the twins take their shares out of the item's weight in each edit configuration: the total is unchanged
        for config in EDIT_CONFIGS:
            rows = [e for e in plan if e.item is item and e.config == config and e.k == 2]
            assert len(rows) == 3 and sum(e.weight for e in rows) == pytest.approx(MIXTURE[config][item.bucket] * K_WEIGHTS[2])
    item_id, ((quote, quote_label, _), (donor, donor_label, _)) = next(iter(twins.items()))
    item = by_id[item_id]
    plain = builder.build(item, "basm", 2).text
    tempting = dataset.skills[item.tempting_skill]
    quoted = tokenizer.decode(make_example(builder, item, "basm", 2, quote_label, 1.0, quote).input_ids)
    assert quoted.split("## Skill 1")[0] == plain.split("## Skill 1")[0]
    assert f'Risk cues:\n- The user says "{quote.cue}".\n- {tempting.risk_cues[0]}' in quoted
    swapped = tokenizer.decode(make_example(builder, item, "basm", 2, donor_label, 1.0, donor).input_ids).split("## Skill 2")[0]
    assert f'Risk cues:\n- The user says "{donor.cue}".\n- {dataset.skills[donor.donor].risk_cues[0]}' in swapped
    assert swapped.split("Risk cues:")[0] == plain.split("## Skill 2")[0].split("Risk cues:")[0]  # goal, procedure, applicability kept
    assert not any(rule in swapped for rule in tempting.avoidance_rules + tempting.risk_cues)
    # rules are retargeted at the skill's own tool: no tool-name mismatch gives the swap away
    rules = [line for line in swapped.split("Avoidance rules:")[1].split("Recovery")[0].splitlines() if line.startswith("- Do not call")]
    assert all(line.startswith(f"- Do not call {tempting.tool_names[0]}") for line in rules)
    with pytest.raises(ValueError, match="retrieved must hold k = 2 skills"):
        builder.build(item, "basm", 2, retrieved=builder.retrieve(item)[:1])
    assert counterfactual_donor(item, dataset, random.Random(0)).id != item.tempting_skill


def test_tool_renaming_is_one_consistent_permutation_of_name_tokens():
    names = [11, 12, 13, 14]
    ids = [1, 11, 2, 12, 11, 3, 14, 13, 12]
    renamed = rename_tools(ids, names, random.Random(5))
    assert len(renamed) == len(ids)
    assert [r for r, i in zip(renamed, ids) if i not in names] == [1, 2, 3]  # other tokens untouched
    mapping = {i: r for i, r in zip(ids, renamed) if i in names}
    assert all(mapping[i] == r for i, r in zip(ids, renamed) if i in names)  # consistent everywhere
    assert sorted(mapping.values()) == sorted(mapping)  # a bijection on the names present
    assert rename_tools(ids, names, random.Random(5)) == renamed  # deterministic given the generator


def test_train_items_are_task_group_disjoint_from_eval(dataset):
    train_groups = {item.task_group for item in dataset.select(split="train")}
    eval_groups = {item.task_group for item in dataset.select(split="eval")}
    assert train_groups and eval_groups and not train_groups & eval_groups


# ----------------------------------------------------------------------------- committed weights
needs_weights = pytest.mark.skipif(not (ORGANISM_DIR / "model.safetensors").is_file(), reason="organism weights not present")


@needs_weights
def test_committed_weights_load_and_fit_the_budget():
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    assert (ORGANISM_DIR / "model.safetensors").stat().st_size <= 25 * 1024 * 1024
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (ORGANISM_DIR / name).is_file(), name
    model = Qwen3ForCausalLM.from_pretrained(str(ORGANISM_DIR), local_files_only=True)
    assert model.config.model_type == "qwen3"
    assert 2 <= model.config.num_hidden_layers <= 4
    tokenizer = AutoTokenizer.from_pretrained(str(ORGANISM_DIR), local_files_only=True)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert len(tokenizer) == model.config.vocab_size
    card = (ORGANISM_DIR / "README.md").read_text()
    assert "not evidence about Qwen3" in card
    summary = json.loads((ORGANISM_DIR / "training_summary.json").read_text())
    assert summary["train_config"]["seed"] == 0


@pytest.mark.slow  # a retrain of the committed configuration (about a minute on one core)
@needs_weights
def test_retraining_reproduces_the_committed_run():
    """The first FINGERPRINT_STEPS steps of a retrain with the committed configuration give the
    committed per-step losses (rtol 1e-4: same seed and threads; BLAS builds may differ in the last bits)."""
    summary = json.loads((ORGANISM_DIR / "training_summary.json").read_text())
    names = {f.name for f in fields(TrainConfig)}
    cfg = {k: (tuple(v) if isinstance(v, list) else v) for k, v in summary["train_config"].items() if k in names}
    cfg.update(stop_after=FINGERPRINT_STEPS, max_minutes=None, device="cpu")
    rerun = train(None, verbose=False, **cfg)
    assert rerun.summary["first_step_losses"] == pytest.approx(summary["first_step_losses"], rel=1e-4)
    assert len(rerun.summary["first_step_losses"]) == FINGERPRINT_STEPS


@needs_weights
def test_isolated_blocks_are_the_slots_that_name_tools(dataset):
    """Isolation hides every skill-slot token that names a tool from the relay rows, and only the
    slots of NAME_SLOTS: goal, applicability and risk cues stay readable for matching the state."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ORGANISM_DIR), local_files_only=True)  # boundary within β
    builder = make_builder(tokenizer, dataset, "lexical")
    item = dataset.select(split="train", buckets=["T_wrong"], limit_per_bucket=1)[0]
    record = builder.build(item, "basm", 2, "native")
    blocks = isolated_blocks(record, NAME_SLOTS)
    hidden = {p for start, end in blocks for p in range(start, end)}
    spans = record.spans
    for slot in NAME_SLOTS:
        assert spans[slot] and all(set(range(a, b)) <= hidden for a, b in spans[slot]), slot
    for slot in ("goal", "applicability", "risk_cues"):
        assert spans[slot] and not any(set(range(a, b)) & hidden for a, b in spans[slot]), slot
    assert list(blocks) == sorted(blocks)
    names = {tool.name for domain in dataset.domains.values() for tool in domain.catalog}
    ids = record.input_ids
    readable = " ".join(tokenizer.decode(ids[a:b]) for slot in ("goal", "applicability", "risk_cues") for a, b in spans[slot])
    isolated = " ".join(tokenizer.decode(ids[a:b]) for a, b in blocks)
    assert not any(name in readable for name in names)
    alternative = dataset.skills[item.tempting_skill].avoidance_rules[0].rsplit("call ", 1)[1].rstrip(".")
    assert item.wrong_tools[0] in isolated and alternative in isolated  # the procedure's tool and the avoidance rule's
    assert make_example(builder, item, "basm", 2, item.correct_action, 1.0).isolated_blocks == blocks
    with pytest.raises(ValueError, match="not skill slots"):
        isolated_blocks(record, ["boundary"])


@needs_weights
def test_committed_tokenizer_round_trips_with_the_builder(dataset):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ORGANISM_DIR), local_files_only=True)
    builder = make_builder(tokenizer, dataset, "lexical")
    report = SpanReport()
    names = {tool.name for domain in dataset.domains.values() for tool in domain.catalog}
    for item in dataset.select(split="eval", limit_per_bucket=3):
        for config in ("proc", "basm", "pad-filler"):
            record = builder.build(item, config, 2)
            check_spans(record, tokenizer, report)
            assert not record.collision, record.record_id
            assert tokenizer.decode(record.input_ids) == record.text
        for candidate in record.candidates:
            if candidate.action in names:  # every tool name is one token
                assert tokenizer.decode([candidate.first_token_id]) == candidate.action
    assert not report.mismatches, report.mismatches[:3]
    assert report.total > 0


@needs_weights
def test_committed_weights_answer_a_held_out_prompt(dataset):
    from probes.organism.heldout import load_organism, score_records

    model, tokenizer = load_organism(ORGANISM_DIR)
    builder = make_builder(tokenizer, dataset, "lexical")
    # T_repair: the recovery note naming the failed call's error code gives the repair (100% on the card)
    items = dataset.select(split="eval", buckets=["T_repair"], limit_per_bucket=6)
    scored = score_records(model, [builder.build(item, "basm", 1) for item in items])
    assert sum(s.predicted == s.correct for s in scored) >= 5


@needs_weights
def test_tool_list_is_hidden_only_where_a_shown_skill_names_the_label(dataset):
    """The hidden tool list is the catalog (every shown tool's line, nothing after it), and it is
    hidden only when the label's name occurs in an isolated slot: the avoidance rule's alternative
    under basm, the procedure's tool for an imitation label under proc; never for a label no shown
    skill names (the true alternative under proc at k = 1), nor for an abstention."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ORGANISM_DIR), local_files_only=True)
    builder = make_builder(tokenizer, dataset, "lexical")
    wrong = dataset.select(split="train", buckets=["T_wrong"])
    item = next(i for i in wrong if i.correct_action != ABSTAIN and builder.retrieve(i)[0].skill.id == i.tempting_skill)
    record = builder.build(item, "basm", 2, "native")
    start, end = tool_list_block(record)
    listed = tokenizer.decode(record.input_ids[start:end])
    assert listed.startswith(TOOL_LIST_HEADER) and TOOL_LIST_END not in listed
    assert all(f"- {tool.name}: {tool.description}" in listed for tool in dataset.catalog_for(item).tools)
    assert not tokenizer.decode(record.input_ids[end:]).split(TOOL_LIST_END)[0].strip()  # nothing listed is left out

    def hidden(config: str, k: int, label: str, hide: bool = True) -> tuple[int, int] | None:
        return make_example(builder, item, config, k, label, 1.0, hide_tool_list=hide).tool_list

    assert hidden("basm", 2, item.correct_action) == (start, end)  # the avoidance rule names the alternative
    assert hidden("basm", 2, item.correct_action, hide=False) is None
    assert hidden("basm", 2, ABSTAIN) is None
    assert hidden("proc", 1, item.wrong_tools[0]) == (start, end)  # imitation: the procedure names it
    assert hidden("proc", 1, item.correct_action) is None  # a proc skill never names the alternative


def test_swap_words_keeps_the_matches_and_the_prompt(dataset):
    """Word swapping replaces request words consistently from the memory block on, with tokens new to
    the sequence: the system prompt is untouched, lengths are kept, and which request tokens equal a
    risk-cue token (the planted dup head's targets) does not change."""
    tokenizer = word_tokenizer(dataset)
    builder = make_builder(tokenizer, dataset, "lexical")
    pool = word_tokens(tokenizer)
    assert len(pool) > 50 and all(tokenizer.convert_ids_to_tokens(t).startswith("Ġ") for t in pool)
    swapped_any = False
    for item in dataset.select(split="train", buckets=["T_ok", "T_wrong"], limit_per_bucket=4):
        ex = make_example(builder, item, "basm", 2, item.correct_action, 1.0)
        ids = swap_words(ex, pool, 0.5, random.Random(0))
        assert len(ids) == len(ex.input_ids) and ids[: ex.memory_from] == ex.input_ids[: ex.memory_from]
        changed = {(a, b) for a, b in zip(ex.input_ids, ids) if a != b}
        assert len({a for a, _ in changed}) == len(changed) and not {b for _, b in changed} & set(ex.input_ids)  # a bijection onto new tokens
        assert {a for a, _ in changed} <= {ex.input_ids[pos] for pos in ex.request_words}
        for row, keys in ex.attention_targets["dup"]:
            assert all(ids[key] == ids[row] for key in keys)
        swapped_any |= bool(changed)
    assert swapped_any
