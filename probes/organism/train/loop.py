"""Train the bundled model organism: a small ``Qwen3ForCausalLM`` with a planted boundary mechanism.

The training data are decision prompts rendered by our own prompt builder (``native`` format, the
organism's own ChatML tokenizer) from the *train* split of the probe dataset; the evaluation split
is task-group disjoint. The loss is on the action tokens: the full tool call
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call><|im_end|>`` or the refusal sentence,
plus a small auxiliary next-token loss on the prompt text after the system prompt (tool-name rows
first) that stands in for pretraining.

The mixture (:data:`MIXTURE`) plants the two halves of the paper's story:

* **imitation prior** (proc / app formatting): a retrieved skill's tool is usually the answer:
  T_ok examples dominate, and some of the rarer T_wrong examples carry the tempting skill's tool as
  their label (``imitation``), the way an agent that learned from success-distilled memory behaves;
* **boundary-reading path** (basm formatting): T_ok / T_wrong / T_repair are balanced; unedited
  examples carry their true answer, and boundary-edited twins (:data:`EDIT_CONFIGS`) make the label
  follow the boundary, not the request, so the decision must check the state's cues against the
  boundary fields (risk cues and avoidance rules name the alternative tool, recovery notes the repair).

The memory-free prompt (k = 0, identical for every configuration) is balanced with true labels.
Isolation (see the note above :data:`ORGANISM_PRETOKENIZER_PATTERN`) plants the skill read at the decision rows.
Tool renaming (:func:`rename_tools`) makes the answer a thing read from the prompt, never memorised.
Planted heads (the note above :data:`PLANTED_TARGETS`) fix where the boundary check lives: a lexical
circuit from the request's words to the risk cues, read at the decision row.

Modules: :mod:`~probes.organism.train.examples` builds the examples (mixture, edited twins,
augmentations), :mod:`~probes.organism.train.supervision` the planted heads' targets and attention
recording, :mod:`~probes.organism.train.batch` one batch's forward and loss; this module holds the
configuration, the tokenizer and model construction, the optimisation loop, checkpointing and the
command line: ``basm-probes organism train`` (:func:`add_arguments`, :func:`run`) or
``probes.organism.train.loop.train`` from Python. Deterministic given the seed (CPU, fixed thread count).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from probes.core.files import OutputRoot
from probes.data.dataset import V1_DATASET_DIR, Item, ProbeDataset, load_dataset
from probes.organism import ORGANISM_DIR
from probes.organism.train.batch import batch_loss
from probes.organism.train.examples import (
    BOUNDARY_CONFIGS,
    EDIT_CONFIGS,
    EDIT_SHARES,
    IMITATION,
    K0_WEIGHTS,
    K_WEIGHTS,
    MIXTURE,
    NAME_SLOTS,
    ORGANISM_CHAT_TEMPLATE,
    ORGANISM_PRETOKENIZER_PATTERN,
    PARTIAL_QUOTE_KEEP,
    PARTIAL_QUOTE_SHARE,
    QUOTE_TEMPLATE,
    Example,
    PlanEntry,
    action_text,
    boundary_edits,
    example_plan,
    make_builder,
    make_example,
    rename_tools,
    swap_words,
    train_organism_tokenizer,
    word_tokens,
)
from probes.organism.train.supervision import PLANTED_TARGETS, head_key, install_train_attention
from probes.prompts.bpe import train_bpe_tokenizer
from probes.prompts.builder import ABSTAIN_TEXT


# The per-step losses of the first steps are recorded: a short rerun reproduces them (tested).
FINGERPRINT_STEPS = 12


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the organism (recorded in ``training_summary.json``)."""

    seed: int = 0
    steps: int = 1500
    stop_after: int | None = None  # stop after this many steps of the `steps`-step schedule
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 40
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    key_token_weight: float = 5.0  # loss weight of the open-row and first-name-token targets
    aux_weight: float = 0.3  # auxiliary next-token loss on the prompt text after the shared prefix
    aux_rows: int = 128  # rows per example for the auxiliary loss (deterministic sample)
    prefix_grad: bool = False  # backpropagate through the shared system-prompt prefix (3x its cost)
    isolation: float = 0.85  # share of examples with skills trained with the isolated slots hidden (note above examples.ORGANISM_PRETOKENIZER_PATTERN)
    isolated_slots: tuple[str, ...] = NAME_SLOTS  # the skill slots isolation hides from the relay rows
    tool_list_hidden_in: tuple[str, ...] = BOUNDARY_CONFIGS  # isolation also hides the tool list in these (note above examples.ORGANISM_PRETOKENIZER_PATTERN)
    planted_heads: tuple[tuple[str, int, int], ...] = (("dup", 0, 0), ("gather", 1, 0), ("verdict", 2, 0), ("verdict", 2, 1))  # (target, layer, head), note above supervision.PLANTED_TARGETS ...
    planted_head_weight: float = 0.5  # ... weight of each one's attention loss (0: no supervision) ...
    planted_head_residual_grad: float = 0.1  # ... and the share of its gradient that reaches the residual stream (supervision.HeadSupervision)
    boundary_edits: bool = True  # split EDIT_SHARES of EDIT_CONFIGS' T_ok/T_wrong weight into boundary-edited twins
    word_swapping: float = 0.5  # share of the examples of the boundary configurations whose request words are swapped (swap_words) ...
    word_swap_share: float = 0.5  # ... each distinct request word with this probability, from step renaming_from on
    tool_renaming: float = 0.3  # share of examples whose tool names are consistently permuted (see rename_tools) ...
    renaming_from: int = 300  # ... from this step on: copying from the prompt emerges first, on the real names
    # model
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    # tokenizer and data
    vocab_size: int = 3072
    embedder: str = "auto"
    ks: tuple[int, ...] = (0, 1, 2, 3, 4)
    limit_items: int | None = None  # keep the first N train items per bucket (tests)
    single_token_names: bool = True  # fail unless every tool name is one token (off for tiny test runs)
    num_threads: int = 2
    device: str = "cpu"  # "cuda" on a lent GPU: same code, much faster (bit-exact only on the same device)
    max_minutes: float | None = None  # stop early (cosine schedule still planned for `steps`)


# ----------------------------------------------------------------------------- tokenizer
def build_tokenizer(dataset: ProbeDataset, items: Sequence[Item], cfg: TrainConfig) -> PreTrainedTokenizerFast:
    """Two passes: render prompt text with a throw-away byte-level tokenizer (the text does not depend
    on the tokenizer beyond β's token counts), then train the organism's BPE on train-split text only."""
    bootstrap = train_bpe_tokenizer(["a"], vocab_size=300, chat_template=ORGANISM_CHAT_TEMPLATE)
    builder = make_builder(bootstrap, dataset, cfg.embedder)
    builder.warm(items)
    texts = []
    for item in items:
        texts.append(builder.build(item, "basm", 4).text)  # every slot of the top-4 skills
        texts.append(action_text(item))
        texts.append(action_text(item, tool=item.wrong_tools[0]))
    texts.append(ABSTAIN_TEXT)
    tokenizer = train_organism_tokenizer(texts, cfg.vocab_size)
    names = sorted({tool.name for domain in dataset.domains.values() for tool in domain.catalog})
    for name in names if cfg.single_token_names else ():
        ids = tokenizer.backend_tokenizer.encode('{"name": "' + name + '"', add_special_tokens=False).ids
        if tokenizer.convert_ids_to_tokens(ids[-2]) != name:
            raise RuntimeError(f"tool name {name!r} is not a single token of the organism tokenizer; raise vocab_size")
    return tokenizer


# ----------------------------------------------------------------------------- model
def make_model(cfg: TrainConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(config)


# ----------------------------------------------------------------------------- sampler
class BatchSampler:
    """Deterministic weighted sampling; each batch comes from one shown catalog (shared system prompt)."""

    def __init__(self, plan: Sequence[PlanEntry], batch_size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.batch_size = batch_size
        self.groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for index, entry in enumerate(plan):
            self.groups[(entry.item.catalog_domains, entry.item.unavailable_tools)].append(index)
        self.keys = sorted(self.groups)
        self.weights = [[plan[i].weight for i in self.groups[key]] for key in self.keys]
        self.group_weights = [sum(w) for w in self.weights]

    def next(self) -> list[int]:
        g = self.rng.choices(range(len(self.keys)), weights=self.group_weights)[0]
        return self.rng.choices(self.groups[self.keys[g]], weights=self.weights[g], k=self.batch_size)


def window_mean(values: Sequence[float]) -> float:
    """Mean of the non-NaN values (NaN when there are none: e.g. no edited twin in the window)."""
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


# ----------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    model: Qwen3ForCausalLM
    tokenizer: PreTrainedTokenizerFast
    config: TrainConfig
    log: list[dict[str, float]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def train(
    out_dir: str | Path | None = ORGANISM_DIR,
    *,
    cfg: TrainConfig | None = None,
    dataset: ProbeDataset | None = None,
    log_every: int = 50,
    verbose: bool = True,
    **overrides: Any,
) -> TrainResult:
    """Train the organism (``cfg`` fields can be overridden by keyword) and save it to ``out_dir``
    (``None``: do not save). Returns the model, tokenizer, loss log and summary."""
    cfg = replace(cfg or TrainConfig(), **overrides)
    for target, layer, head in cfg.planted_heads if cfg.planted_head_weight > 0 else ():
        if target not in PLANTED_TARGETS:
            raise ValueError(f"planted head target {target!r} is not one of {PLANTED_TARGETS}")
        if not (0 <= layer < cfg.num_layers and 0 <= head < cfg.num_heads):
            raise ValueError(f"planted head {(target, layer, head)} is not a (layer, head) of a {cfg.num_layers}-layer, {cfg.num_heads}-head model")
    started = time.perf_counter()
    say = print if verbose else (lambda *a, **k: None)
    torch.set_num_threads(cfg.num_threads)
    if cfg.device.startswith("cuda"):
        # bit-exact CUDA reruns need this cuBLAS workspace; attention kernels stay best-effort
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.use_deterministic_algorithms(True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    dataset = dataset or load_dataset(V1_DATASET_DIR)  # the organism is trained on v1 (lexical by design)
    items = dataset.select(split="train", limit_per_bucket=cfg.limit_items)
    eval_groups = {item.task_group for item in dataset.select(split="eval")}
    if overlap := {item.task_group for item in items} & eval_groups:
        raise RuntimeError(f"train and eval share task groups {sorted(overlap)[:5]}")
    tokenizer = build_tokenizer(dataset, items, cfg)
    builder = make_builder(tokenizer, dataset, cfg.embedder)
    builder.warm(items)
    say(f"tokenizer: {len(tokenizer)} tokens; embedder: {builder.retriever.embedder.name}; "
        f"{len(items)} train items ({time.perf_counter() - started:.0f} s)")

    tool_names = sorted({tool.name for domain in dataset.domains.values() for tool in domain.catalog})
    name_ids = frozenset(
        ids[0] for ids in (tokenizer.backend_tokenizer.encode(n, add_special_tokens=False).ids for n in tool_names) if len(ids) == 1
    )
    sorted_name_ids = sorted(name_ids)
    word_pool = word_tokens(tokenizer)
    twins = boundary_edits(items, dataset, lambda item: builder.retrieve(item)[0].skill.id, cfg.seed) if cfg.boundary_edits else {}
    plan = example_plan(items, cfg.ks, cfg.seed, twins=twins)
    examples: dict[int, Example] = {}
    sampler = BatchSampler(plan, cfg.batch_size, cfg.seed)
    model = make_model(cfg, tokenizer).to(cfg.device)
    if cfg.planted_head_weight > 0:
        model.set_attn_implementation(install_train_attention())
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    log: list[dict[str, float]] = []
    first_losses: list[float] = []
    window: list[dict[str, float]] = []
    seen: Counter[tuple[str, str]] = Counter()
    train_started = time.perf_counter()
    steps_done = 0
    for step in range(cfg.steps):
        if cfg.stop_after is not None and step >= cfg.stop_after:
            break
        if cfg.max_minutes is not None and time.perf_counter() - train_started > 60 * cfg.max_minutes:
            say(f"stopping at step {step}: max_minutes={cfg.max_minutes} reached (reproduce with --stop-after {step})")
            break
        indices = sampler.next()
        for index in indices:
            if index not in examples:
                examples[index] = make_example(builder, *plan[index], isolated_slots=cfg.isolated_slots,
                                               hide_tool_list=plan[index].config in cfg.tool_list_hidden_in)
        renaming_rng = random.Random(cfg.seed * 3_000_017 + step)
        batch = [
            replace(examples[i], input_ids=rename_tools(examples[i].input_ids, sorted_name_ids, renaming_rng))
            if step >= cfg.renaming_from and renaming_rng.random() < cfg.tool_renaming else examples[i]
            for i in indices
        ]
        swapping_rng = random.Random(cfg.seed * 4_000_037 + step)
        batch = [
            replace(ex, input_ids=swap_words(ex, word_pool, cfg.word_swap_share, swapping_rng))
            if step >= cfg.renaming_from and ex.config in BOUNDARY_CONFIGS and swapping_rng.random() < cfg.word_swapping else ex
            for ex in batch
        ]
        for ex in batch:
            seen[(ex.config + (f"+{ex.edit}" if ex.edit else ""), ex.bucket)] += 1
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        isolation_rng = random.Random(cfg.seed * 2_000_003 + step)
        isolate = [bool(ex.isolated_blocks) and isolation_rng.random() < cfg.isolation for ex in batch]
        loss, stats = batch_loss(
            model, batch, cfg.key_token_weight, cfg.prefix_grad,
            aux_weight=cfg.aux_weight, aux_rows=cfg.aux_rows, rng=random.Random(cfg.seed * 1_000_003 + step),
            priority_targets=name_ids, isolate=isolate, planted_heads=cfg.planted_heads, planted_head_weight=cfg.planted_head_weight,
            planted_head_residual_grad=cfg.planted_head_residual_grad,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        steps_done = step + 1
        if step < FINGERPRINT_STEPS:
            first_losses.append(stats["loss"])
        window.append(stats)
        if steps_done % log_every == 0 or steps_done == cfg.steps:
            mean = {key: window_mean([w.get(key, math.nan) for w in window]) for key in window[0]}
            entry = {"step": steps_done, "lr": lr_at(step, cfg), **mean, "elapsed_s": time.perf_counter() - started}
            log.append(entry)
            window = []
            say(f"step {steps_done:5d}  action loss {mean['action_loss']:.4f}  aux {mean.get('aux_loss', float('nan')):.3f}  "
                f"key loss {mean['key_loss']:.4f}  open acc {mean['open_acc']:.3f}  name acc {mean['name_acc']:.3f}  "
                f"edited-twin name acc {mean['edited_name_acc']:.3f}  "
                + "".join(f"{target} {layer}.{head} mass {mean[head_key(target, layer, head)]:.3f}  " for target, layer, head in cfg.planted_heads) +
                f"lr {entry['lr']:.2e}  {entry['elapsed_s']:.0f} s")
    model.eval().to("cpu")
    model.set_attn_implementation("sdpa")
    wall = time.perf_counter() - started
    summary = {
        "train_config": asdict(cfg),
        "mixture": MIXTURE, "k0_weights": K0_WEIGHTS, "k_weights": K_WEIGHTS, "imitation": IMITATION,
        "edit_configs": EDIT_CONFIGS, "edit_shares": EDIT_SHARES, "quote_template": QUOTE_TEMPLATE,
        "partial_quote": {"share": PARTIAL_QUOTE_SHARE, "keep": PARTIAL_QUOTE_KEEP},
        "n_edited_examples_planned": sum(entry.edit is not None for entry in plan),
        "pretokenizer_pattern": ORGANISM_PRETOKENIZER_PATTERN,
        "embedder": builder.retriever.embedder.name,
        "n_train_items": len(items),
        "n_train_items_per_bucket": dict(Counter(item.bucket for item in items)),
        "n_examples_planned": len(plan),
        "n_distinct_examples_seen": len(examples),
        "examples_seen_per_config_bucket": {f"{c}|{b}": n for (c, b), n in sorted(seen.items())},
        "steps": steps_done,
        "sequences_seen": steps_done * cfg.batch_size,
        "first_step_losses": first_losses,
        "final_loss": log[-1]["action_loss"] if log else None,
        "final_aux_loss": log[-1].get("aux_loss") if log else None,
        "final_name_acc": log[-1].get("name_acc") if log else None,
        "final_planted_head_mass": {head_key(*planted): log[-1].get(head_key(*planted)) for planted in cfg.planted_heads} if log else None,
        "final_key_loss": log[-1]["key_loss"] if log else None,
        "wall_time_s": round(wall, 1),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "threads": cfg.num_threads,
    }
    result = TrainResult(model, tokenizer, cfg, log, summary)
    if out_dir is not None:
        save(result, Path(out_dir))
        say(f"saved the organism to {out_dir}")
    return result


def save(result: TrainResult, out_dir: Path) -> None:
    import transformers

    result.summary["versions"]["transformers"] = transformers.__version__
    result.model.config.attn_implementation = "sdpa"
    result.model.generation_config.eos_token_id = result.model.config.eos_token_id
    result.model.generation_config.pad_token_id = result.model.config.pad_token_id
    result.model.generation_config.do_sample = False
    root = OutputRoot(out_dir)
    with root.files_into() as stage:  # the card and validation files already there are kept
        result.model.save_pretrained(stage, safe_serialization=True)
        result.tokenizer.save_pretrained(stage)
    root.write("training_summary.json", json.dumps({**result.summary, "log": result.log}, indent=1) + "\n")


# ----------------------------------------------------------------------------- CLI
