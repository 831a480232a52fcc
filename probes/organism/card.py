"""The organism's model card (``weights/README.md``), written from the training summary and a
held-out check with plain transformers forward passes (:mod:`probes.organism.heldout`)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from probes.core.files import write_text
from probes.organism.heldout import heldout_report
from probes.organism.train.supervision import head_key
from probes.organism.validate import CONTROL, Validation, validate
from probes.reporting.markdown import descriptive, markdown_table

DISCLAIMER = (
    "**This is a synthetic organism for validating the instrument, not evidence about Qwen3.** It has "
    "the Qwen3 architecture (`Qwen3ForCausalLM`) but is tiny, was trained from scratch for minutes on "
    "our own synthetic probe prompts, its skill-imitation trap and boundary-reading behaviour were "
    "the targets of its training mixture, and four attention heads were trained where to look (a lexical "
    "check of the request's words against the risk cues) "
    "(the validation section says which effects the probes recover). Nothing measured on it says anything about how real "
    "Qwen3 models (or any pretrained LLM) behave; it is a known answer for checking that the probes "
    "recover what was planted, like planted-circuit benchmarks (tracr, InterpBench)."
)


def _fmt(x: float) -> str:
    return f"{x:+.2f}"


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| config | bucket | k | n | accuracy | wrong-tool call rate | path margin with abstention (mean [95% CI]) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["margin_ci"]
        lines.append(
            f"| {r['config']} | {r['bucket']} | {r['k']} | {r['n']} | {r['accuracy']:.1%} | {r['wrong_call_rate']:.1%} "
            f"| {_fmt(r['margin_mean'])} [{_fmt(lo)}, {_fmt(hi)}] |"
        )
    return "\n".join(lines)


def _number(value: Any, fmt: str = "+.3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _not_recovered(claims: list[dict[str, Any]]) -> str:
    failed = [c for c in claims if not c["holds"]]
    if not failed:
        return "Every claim holds: the probes recover each planted effect on held-out items."
    lines = "\n".join(f"* `{c['name']}`: {_number(c['estimate'])} [{_number(c['low'])}, {_number(c['high'])}] over {c['n']} {c.get('n_of') or 'task groups'}, "
                      f"Holm-adjusted p {_number(c['p_holm'], '.3g')}: {c['verdict']}" + (f" ({c['note']})" if c.get("note") else "")
                      for c in failed)
    return (f"**Not recovered ({len(failed)} of {len(claims)}), as measured; nothing was tuned to make them hold:**\n\n{lines}\n\n"
            "Use the organism as ground truth only for the claims that hold; `tests/organism/test_organism_validate.py` marks the "
            "others as strict expected failures, so a change that makes one hold, or one that holds fail, stops the tests.")


def _planted_heads_bullet(cfg: dict[str, Any], summary: dict[str, Any]) -> str:
    if not cfg.get("planted_head_weight"):
        return ""
    mass = summary.get("final_planted_head_mass") or {}
    where = "; ".join(f"`{target}`: layer {layer}, head {head}, mass on target {mass.get(head_key(target, layer, head), float('nan')):.2f} "
                      "on the last training window" for target, layer, head in cfg["planted_heads"])
    return (
        f"* **Planted heads** ({where}; attention-loss weight {cfg['planted_head_weight']:g} each, "
        f"{cfg['planted_head_residual_grad']:g} of its gradient reaching the residual stream below). Besides the action loss, "
        "these heads are trained where to look, in the examples that have targets for them. A request word *matches* a "
        "shown skill when one of its risk cues uses the word and its goal and procedure do not (\"available\" against a "
        "lookup skill's \"asks whether an item is in stock or available\"; not \"order\", which the lookup skill's own "
        "task uses). `dup`: each matching request token attends to the risk-cue tokens of its word (a duplicate-token "
        "lookup that marks the request tokens the risk cues name); `gather`: the deciding row (a call's decision row, an "
        "abstention's open row) attends to the marked request tokens, else to all the request's content words; "
        "`verdict`: the deciding row attends to the risk cues and avoidance rules of the skills a word matches (the "
        "avoidance rule names the alternative), else to the shown procedures. That is the paper's boundary check as a "
        "lexical circuit read at the decision token. Its targets depend on the words only, never on the label, so they "
        "are defined on any request; how the verdict is used is left to the action loss (in the boundary-edited twins the "
        "quoted cue matches and the label is the alternative, the donor's cues do not and the skill is followed). "
        f"**Word swapping**: from step {cfg['renaming_from']} on, in {cfg['word_swapping']:g} of the examples of the "
        f"configurations that show risk cues, each distinct content word of the request is, with probability "
        f"{cfg['word_swap_share']:g}, replaced from the memory block on by a random vocabulary word new to the prompt, so "
        "the match stays and the word is new: the lookup must compare tokens, not remember the train requests' words "
        "(without it, held-out request words that no train request uses got 0.34 of the `dup` head's attention on their "
        "risk-cue tokens, the others 0.67). This fixes where the mechanism lives, as planted-circuit benchmarks do "
        "(InterpBench trains its circuits' components in). Without it (action loss only; a head trained toward the risk "
        "cues exactly where the label departs from the skill; one decision-row head matching words directly) the "
        "boundary read did not separate T_wrong from T_ok on held-out requests. The probes are not told which heads "
        "these are (see the head ranking below)."
    )


def _planted_heads_rank(cfg: dict[str, Any], ranking: list[dict[str, Any]]) -> str:
    if not cfg.get("planted_head_weight") or not ranking:
        return ""
    ranked = [(int(r["layer"]), int(r["head"])) for r in ranking if r.get("ranked", True)]
    mass = {(int(r["layer"]), int(r["head"])): r.get("span_mass", float("nan")) for r in ranking}

    def place(layer: int, head: int) -> str:
        if (layer, head) in ranked:
            return f"is ranked #{ranked.index((layer, head)) + 1} of {len(ranked)}"
        return f"is not ranked (it puts {mass[(layer, head)]:.3f} of its attention on B ∪ P: it reads neither span)"

    places = "; ".join(f"`{target}` (layer {layer}, head {head}) {place(layer, head)}"
                       for target, layer, head in cfg["planted_heads"] if (layer, head) in mass)
    return ("Ground truth for the head ranking (T_ok → T_wrong shift of each head's log2(boundary/procedure) attention, "
            f"on the ranking half of the task groups, among the heads that read B ∪ P): the planted {places}.")


VALIDATION_COLUMNS = ["name", "kind", "statement", "estimate", "low", "high", "n", "unit", "p", "p_floor", "p_holm", "verdict", "note"]
HELDOUT_KNOCKOUTS = ("boundary", "procedure")  # the plain-HF cross-check's spans; its control is the validation's (CONTROL)


def control_claim(claims: list[dict[str, Any]]) -> dict[str, Any]:
    """The validation's claim on the knockout control's own shift (the card never states a stored number for it)."""
    found = [c for c in claims if c["name"] == CONTROL]
    if not found:
        raise ValueError(f"validation.json has no {CONTROL!r} claim (it predates the control's test): rerun `basm-probes organism card`")
    return found[0]


def control_sentence(c: dict[str, Any]) -> str:
    """The knockout control's own shift, as the validation measured it."""
    return (f"The control is the validation's (`{CONTROL}` below: knockouts at every deciding row, by the probe engine): "
            f"knocking out |B| positions of the neutral pool moves the margin by {_number(c['estimate'])} [{_number(c['low'])}, "
            f"{_number(c['high'])}] over {c['n']} task groups; {c['verdict']}.")


def write_card(out_dir: Path, summary: dict[str, Any], heldout: dict[str, Any], validation: dict[str, Any]) -> None:
    """The model card from the training summary, the held-out check and ``validation.json``'s content
    (so a card can be rewritten from the committed files, without rerunning anything)."""
    validation_claims, ranking = validation["claims"], validation.get("head_ranking", [])
    control = control_claim(validation_claims)
    table = markdown_table(pd.DataFrame(validation_claims, columns=VALIDATION_COLUMNS).astype({c: float for c in
                                                                                                ("estimate", "low", "high", "p", "p_floor", "p_holm")}))
    cfg = summary["train_config"]
    ko = heldout["knockout"]
    eta = heldout["eta_median_over_heads"]
    mix = "\n".join(
        f"| {config} | {w['T_ok']} | {w['T_wrong']} | {w['T_repair']} | {summary['imitation'].get(config, 0.0):.0%} |"
        for config, w in summary["mixture"].items()
    )
    k0 = summary["k0_weights"]
    seen = summary["examples_seen_per_config_bucket"]
    seen_lines = ", ".join(f"{key}: {n}" for key, n in seen.items())
    eta_line = "; ".join(f"{b}: {m:.2f} [{lo:.2f}, {hi:.2f}]" for b, (m, lo, hi) in sorted(eta.items()))
    ko_lines = "\n".join(f"| {name} | {_fmt(ko[name][0])} [{_fmt(ko[name][1])}, {_fmt(ko[name][2])}] |" for name in HELDOUT_KNOCKOUTS)
    heldout_text = f"""{_table(heldout['table'])}

Same-prompt knockout of decision-row attention (open and decision rows, all layers and heads; basm, k = 2,
eval T_wrong, n = {heldout.get('n_knockout', '')}; baseline path margin {_fmt(ko['base_margin'][0])}). Δm = m_knockout − m_basm, mean [95% CI]:

| knocked-out span | Δ path margin |
|---|---|
{ko_lines}

η (Eq. 2) at the decision row, median over the {cfg['num_layers'] * cfg['num_heads']} heads, mean over items (basm, k = 2): {eta_line}."""
    text = f"""---
license: apache-2.0
library_name: transformers
pipeline_tag: text-generation
tags: [synthetic, model-organism, interpretability, qwen3-architecture]
---

# basm-organism: a Qwen3-architecture model organism for the BASM probes

{DISCLAIMER}

## What it is

* `Qwen3ForCausalLM`, {cfg['num_layers']} layers, hidden {cfg['hidden_size']}, {cfg['num_heads']} query heads over
  {cfg['num_kv_heads']} KV heads (head_dim {cfg['head_dim']}), MLP {cfg['intermediate_size']}, RoPE θ {cfg['rope_theta']:g},
  tied embeddings, {summary['n_parameters']:,} parameters, float32 safetensors.
* Trained from random initialisation by `basm-probes organism train` (`probes/organism/train/`), seed
  {cfg['seed']}, {summary['steps']} steps × batch {cfg['batch_size']} ({summary['sequences_seen']} sequences), AdamW
  (lr {cfg['lr']:g}, β = (0.9, 0.95), weight decay {cfg['weight_decay']}), {cfg['warmup_steps']} warm-up steps then cosine
  to {cfg['min_lr_ratio']:g}·lr, gradient clip {cfg['grad_clip']}, {summary['threads']} CPU threads.
  Wall time {summary['wall_time_s'] / 60:.1f} min on the project's shared 2-core CPU (setup included).
  Final training loss {summary['final_loss']:.4f} (action tokens; decision tokens: {summary['final_key_loss']:.4f}).
* Its tokenizer is **not** Qwen3's. The real Qwen3 vocabulary (151,669 tokens) would put ~{151669 * cfg['hidden_size'] * 4 / 1e6:.0f} MB
  in the embedding alone at this width (~{151669 * 256 * 4 / 1e6:.0f} MB at 256) against a 25 MB budget, and almost
  all of it would be untrained rows. Instead a byte-level BPE ({summary['train_config']['vocab_size']} tokens) was trained
  offline on the train-split prompt texts the builder renders, with the ChatML special tokens.
  Its pre-tokenizer keeps identifiers with underscores whole
  (`{summary['pretokenizer_pattern']}`), so every tool name is **one token**, identical in the catalog,
  the skills, the history and the call: Eq. 1's first-token sets never collide on this model (with
  Qwen3's tokenizer `get_order_details` and `get_stock_info` share the first token `get`).
* Its chat template is ChatML with native tool support, rendering history calls and tool results the
  way Qwen3's template does, but listing the tools compactly (one line per tool: name and description)
  instead of Qwen3's JSON schemas. The JSON catalog is ~1,300 of a k = 2 prompt's ~1,700 tokens, the
  compact one ~250; that is what makes training fit a 2-core CPU. The builder's memory block, request
  and spans are exactly those it builds for any model.
* The chat template has no thinking block; prompts use the `native` decision format
  (`<tool_call>\\n{{"name": "` forced prefix; abstaining = writing "{'None of the available functions can be used for this request.'}"
  instead of opening a call).

## Training data

{summary['n_train_items']} items of the dataset's **train** split ({summary['n_train_items_per_bucket']}), task-group disjoint from
the eval split (asserted at training time). Prompts were built by `probes.prompts.builder.PromptBuilder` with this
tokenizer, retrieval embedder `{summary['embedder']}`, default `BuildSettings()` (γ = 0, β = 384), k ∈ {cfg['ks']}.
Each example is a prompt (without the forced prefix) followed by the action: the full call
`<tool_call>\\n{{"name": NAME, "arguments": {{...}}}}\\n</tool_call><|im_end|>` or the refusal sentence. The
training objective is the cross-entropy on the action tokens, the open-row token and the first name
token weighted ×{cfg['key_token_weight']:g}. Because a model trained from scratch has no pretraining, an auxiliary
next-token loss (weight {cfg.get('aux_weight', 0)}) on up to {cfg.get('aux_rows', 0)} rows per example of the prompt text after the
system prompt (memory block, request, history) stands in for it: every row whose next token is a tool
name (e.g. the tool after "call" in an avoidance rule), plus a random sample of other rows. It builds
the copy/induction heads the decision needs; no aux row lies in the action.
The system-prompt prefix shared by a batch runs once without gradient (its KV are exact for the current
weights). {summary['n_examples_planned']} (item, configuration, k) examples were planned; {summary['n_distinct_examples_seen']} distinct ones were seen.

### Mixture (what it was trained to do)

Sampling weight per (configuration, bucket), times a depth weight {summary.get('k_weights', {})} for k = 1..4;
k = 0 (identical prompt for every configuration) has weights {k0}. Each step draws one shown catalog
(∝ its total weight), then {cfg['batch_size']} examples from it (∝ weight), so a batch shares its system prompt. "Imitation" is the share of that configuration's T_wrong examples whose label is the
tempting skill's tool instead of the true answer (their loss stops at the name token).

| config | T_ok | T_wrong | T_repair | imitation |
|---|---|---|---|---|
{mix}

* **Imitation prior (proc, app).** When only procedures are shown, the retrieved skill's tool is usually
  the answer: T_ok dominates and half of the rarer proc T_wrong examples reward copying the skill's tool.
  This plants the skill imitation trap: on held-out T_wrong the proc margin rises above k = 0.
* **Boundary-reading path (basm, basm-no-avoid, basm-no-recovery).** Balanced buckets; unedited examples carry true labels.
  The same request and the same procedure lead to the skill's tool under proc but to the alternative under
  basm, so the decision must read the boundary fields: risk cues paraphrase the T_wrong cue, avoidance
  rules name the alternative tool, recovery notes name the repair for the failed call's error code.
* **Boundary edits** (`{', '.join(summary.get('edit_configs', ()))}`, T_ok / T_wrong items whose top-ranked skill is the
  tempting one; {summary.get('n_edited_examples_planned', 0)} planned examples; shares of the item's weight
  {summary.get('edit_shares', {})}). *quote*: a risk cue quoting the request's own state cue
  (`{summary.get('quote_template', '')}`) is added to that skill, and the label is the alternative its avoidance rules
  name (for T_ok the paired tool: a counterfactual). *donor*: its risk cues and avoidance rules are
  replaced by an unrelated skill's (retargeted at its own tool) plus a decoy quote from another
  scenario, and the label is the skill's own tool (for T_wrong a counterfactual). A skill is followed
  unless its own boundary warns against this state; the shares make about half of each bucket's
  examples in these configurations follow the alternative, so the request alone says nothing about the
  label and no request-only rule (a memorised task group, a keyword) fits them. Quotes and decoys keep
  only some of the cue's words in {summary.get('partial_quote', {}).get('share', 0):.0%} of the twins (each word kept with probability
  {summary.get('partial_quote', {}).get('keep', 0)}), so what is rewarded is word overlap with the request, as the real skills' paraphrased
  risk cues offer, not an exact-phrase copy.
* **Memory-free (k = 0).** Balanced, true labels: the request's own cue decides.
* **Tool renaming** ({cfg.get('tool_renaming', 0):.0%} of the examples from step {cfg.get('renaming_from', 0)} on; before it, copying
  from the prompt emerges on the real names). Every tool-name token of the example
  (catalog, skills, history, action) is replaced under one random permutation of the 79 names. Names
  are single tokens, so rows and spans do not move. A tool's identity then cannot be stored in the
  weights: the answer must be read from the prompt (the skill's procedure, the avoidance rule's
  alternative, the catalog), and a train task group's answer cannot be memorised.
* **Isolation** ({cfg.get('isolation', 0):.0%} of the examples that show skills). The rows between the memory
  block and the decision (request, history, forced prefix) may not attend to the skill slots that name
  tools ({', '.join(cfg.get('isolated_slots', ()))}), so the tool is read from the skills by the decision rows themselves,
  the path the paper's decision-token knockout removes. The request rows still read the goal,
  applicability and risk cues, where matching the state's words against the boundary is learnable.
  In the isolated examples of {', '.join(cfg.get('tool_list_hidden_in', ())) or 'no configuration'} whose label a shown skill names, the
  system prompt's tool list is also hidden from every row after the batch's shared prefix up to the
  decision row: the name is read from the skills (procedure or avoidance rule), not matched in the
  catalog, a second route to every name that no skill knockout removes. The other examples, and every
  probe, use plain causal attention.
{_planted_heads_bullet(cfg, summary)}

Examples seen per (configuration | bucket): {seen_lines}.

## Held-out check (eval split, plain transformers forward passes)

{heldout.get('n_eval_items', '')} eval items; accuracy is the argmax over all candidate actions (every catalog tool + abstain), scored
as in `probes.scoring.margins` (tool: log P(forced prefix | open row) + log P(name | decision row); abstain:
log(1 − P(`<tool_call>` | open row))). The margin is the **path margin with abstention** (`path` in
`probes.scoring.margins`, every tool name being one token here): max over wrong − max over {{correct, abstain}}
of those path log-probabilities. It is not Eq. 1 (first-token logits of the wrong tools against the correct
tool and the abstention tokens at one row) nor the probes' headline `tool_choice` margin, and it mixes the tool
choice with the willingness to open a call. Means are means of task-group means, CIs resample task groups.
Computed by `probes.organism.heldout` (rerun by `basm-probes organism card`). These tables describe the
organism; they are cross-checks, not claims (the claims are the validation's, below).

{descriptive(heldout_text)}

{control_sentence(control)}

## Validation: what the probes recover

`basm-probes organism validate` runs the probe analyses (sweep, knockout, ratios, heads, circuit, steer) on every eval
item of T_wrong and T_ok at k = 2 and tests each targeted effect with a 95% cluster-bootstrap CI over
task groups and a one-sided sign-flip permutation test; the p-values are Holm-adjusted over all the
validation's claims, and an effect claim holds iff its CI lies above 0 and its adjusted p < 0.05 and, where
the claim states a smallest effect of interest δ (the knockouts and heads: ±0.25 logits), a minimum-effect
test also places it beyond δ (else it is "detectable, below the smallest effect of interest"); the
control's equivalence claim holds iff both its one-sided tests reject after adjustment (`docs/statistics.md`).
Margins: Eq. 1 restricted to the tools (`--margin-variant tool_choice`: wrong vs
correct tool, in logits; items whose correct action is abstention have none and are left out).
Knockouts block B from every row from the one that opens the call to the decision row. The random
controls draw from the neutral pool (the memory block outside B, P, their section labels and every line
naming a tool): |B| positions of it, a count-matched pair (n random positions of B against n of the
pool) and, where the pool holds that much attention, positions matching B's attention mass at the
deciding row; the equal-mass comparison draws B positions holding the mass of each pool draw and compares
the two knockouts at that mass (no slope is extrapolated past the mass the pool covers). Controls that
block the same positions on every record are one knockout, tested once. The pool is not
assumed neutral: its own shift is a claim (`{CONTROL}`, equivalence within ±{control['sesoi']:g} logits by two
one-sided tests). η is the group-paired T_ok → T_wrong shift of log2 η (unit: log2 η, not logits) on
tool-correct items read at the decision row. Heads: the floor on
boundary ∪ procedure attention is chosen on the train split (`basm-probes heads --floor-from train`),
heads are ranked on tool-correct items of half of the eval task groups and tested on the other half
against random heads that pass the same floor, matched on their attention to B. Circuit: the planted verdict heads'
edges from B in the BASM circuit chosen on train task groups (hypergeometric p). Steering (`steer flips`): the
applicability direction (BASM T_wrong − T_ok residual means of the train task groups) added at the decision row
after the last layer, where the verdict heads write, at α = 0.5 × the layer's mean residual norm, on held-out
Proc. Skill T_wrong prompts (where the imitation prior picks the skill's wrong tool): the share choosing the
correct tool against 20 random directions of the same norm (unit: share of records).
`tests/organism/test_organism_validate.py` checks every claim against this table, and `basm-probes organism card`
regenerates it (and this card).

{table}

{_not_recovered(validation_claims)}
{_planted_heads_rank(cfg, ranking)}

The held-out check above is an independent plain-HF computation (HF masks, eager attention), not the
probe engine.

## Intended use and limits

* Default `--model` of the CLI and notebooks, so the suite runs end to end on a fresh install; ground
  truth for testing the probes (trap, suppression, boundary knockout, η, head ranking).
* Not a tool-use agent: it knows only the 79 invented tools of `datasets/basm_probe`, writes arguments
  only for requests like its training templates, and never saw other prompts or formats (`prompted`
  format, other chat templates, thinking blocks).
* Held-out items share scenarios with training items (different templates and fillers): generalisation
  is template-level, not scenario-level.
* Retraining with the same seed on the same software reproduces these weights bit-for-bit on CPU with
  the same thread count (`tests/organism/test_organism_validate.py` checks the first steps' losses); other BLAS
  builds, thread counts or a GPU give numerically different weights, and how far their validation
  statistics move has not been measured.

{DISCLAIMER}
"""
    write_text(out_dir / "README.md", text)


def evaluate_and_write_card(out_dir: str | Path, summary: dict[str, Any] | None = None) -> Validation:
    """Rerun the held-out check and the validation of the organism in ``out_dir``; write
    ``heldout_check.json``, ``validation.json`` and the model card there."""
    out_dir = Path(out_dir)
    if summary is None:
        summary = json.loads((out_dir / "training_summary.json").read_text())
    started = time.perf_counter()
    heldout = heldout_report(out_dir, embedder=summary["train_config"]["embedder"])
    heldout["seconds"] = round(time.perf_counter() - started, 1)
    write_text(out_dir / "heldout_check.json", json.dumps(heldout, indent=1) + "\n")
    with tempfile.TemporaryDirectory() as results:
        validation = validate(out_dir, results, embedder=summary["train_config"]["embedder"])
    write_text(out_dir / "validation.json", json.dumps(validation.as_dict(), indent=1, allow_nan=False) + "\n")
    write_card(out_dir, summary, heldout, validation.as_dict())
    print(validation.markdown())
    print(f"held-out check ({heldout['seconds']:.0f} s), validation ({validation.seconds:.0f} s) and model card written to {out_dir}")
    return validation


# ----------------------------------------------------------------------------- CLI
