"""Dataset cards: measured statistics of a probe dataset folder, written to ``<folder>/CARD.md``.

Works for any folder that :func:`probes.data.dataset.load_dataset` reads (v1 ``basm_probe``,
``basm_probe_v2``, a later import in the same format). The card holds

* counts per bucket × split (``split``, and ``split_scenario`` where the items have it), per domain ×
  bucket, and per correct-action kind;
* every shortcut baseline of :func:`probes.scoring.shortcuts.shortcut_table` (eval and all items;
  with a tokenizer also request length in its tokens; request words crossed with the skill MiniLM
  retrieval ranks first; where items have a ``scenario``, the out-of-fold
  bag-of-words rows again with scenario-disjoint folds) and :func:`~probes.scoring.shortcuts.best_shortcut`;
* where items carry a ``category`` or a ``match_id`` (BFCL), the no-model shortcuts per category and on
  the matched T_ok/T_wrong set (:func:`strata_table`), with the structural rules above 0.55 named;
* where items carry an ``audit`` (or the folder an ``audit.jsonl``), the audited labels counted per
  category, bucket, rule and action;
* how often the boundary relevance gate of Eq. 10 opens (r_B > γ = 0) for the skills retrieved at
  depth ≤ 2, per bucket, under the lexical and the semantic r_B (MiniLM cosines), so a reader sees
  whether a set's boundary text can reach the prompt at all under each measure;
* first-token collision rates in the native tool-call format, computed from the candidate tool
  names directly (:func:`first_name_token`), not from built prompt records: the prompt builder
  restarts tokenization at the last special token before the decision, which in the native format
  is ``<tool_call>``, so the in-context continuation of ``<tool_call>\\n{"name": "`` is exactly what is
  tokenized here. A *decision-set* collision: two of {correct tool, wrong tools} share their first
  name token (the first-token margin of Eq. 1 is then undefined, NaN in ``probes.scoring.margins``); a
  *record* collision is what a native record's ``collision`` field flags: the correct tool or a
  wrong tool shares its first token with any other tool of the shown catalog. The abstain
  continuation starts at another row in this format and never collides;
* where the folder holds a recorded LLM extractor run (``llm_extraction.jsonl``), what ψ keeps of
  it and why the rest was discarded (:func:`llm_record_section`).

The card is regenerated and compared with the committed file by ``tests/reporting/test_cards.py``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probes.data.dataset import ABSTAIN, AUDIT_FILE, BUCKETS, CARD_NAME, SPLITS, ProbeDataset, audit_records, load_dataset
from probes.data.retrieval import RELEVANCE_MEASURES, Embedder, Retriever, make_embedder
from probes.prompts.builder import DEFAULT_K_MAX, NATIVE_FORCED_PREFIX
from probes.prompts.tokenizers import QWEN3_TOKENIZER, load_tokenizer
from probes.scoring.shortcuts import (CATALOG_RULES, COMPARED, DEFAULT_FOLDS, DEFAULT_RESAMPLES, SHORTCUT_RULES, bag_of_words_variants,
                                     best_shortcut, out_of_fold_rows, shortcut_table, split_name)

LLM_RECORD = "llm_extraction.jsonl"  # a recorded LLM extractor run in a dataset folder (optional)
DEFAULT_TOKENIZER = QWEN3_TOKENIZER
NAME_CONTINUATION = '", "arguments": {'  # what follows a tool name in the native format
GATE_DEPTH = DEFAULT_K_MAX  # the analyses' default k_max


def warm_retriever(dataset: ProbeDataset, embedder: Embedder) -> Retriever:
    """A retriever (Eq. 8) with every item state and skill of ``dataset`` embedded."""
    retriever = Retriever(embedder)
    retriever.warm([item.state_text for item in dataset.items], dataset.skills.values(), boundary=embedder.semantic)
    return retriever


def rank1_skills(dataset: ProbeDataset, retriever: Retriever) -> dict[str, str]:
    """Item id -> the skill ``retriever`` ranks first for it (what the first memory block shows)."""
    return {item.id: retriever.retrieve(item, dataset)[0].skill.id for item in dataset.items}


def gate_table(dataset: ProbeDataset, embedder: Embedder, *, depth: int = GATE_DEPTH, gamma: float = 0.0,
               retriever: Retriever | None = None) -> pd.DataFrame:
    """Per bucket and r_B measure: the share of (item, skill retrieved at rank ≤ ``depth``) pairs whose
    boundary fields Eq. 10's gate shows (r_B > ``gamma``), over every item of the dataset
    (``retriever``: one already warmed on the dataset with ``embedder``)."""
    retriever = retriever or warm_retriever(dataset, embedder)
    rows = []
    for item in dataset.items:
        for entry in retriever.retrieve(item, dataset)[:depth]:
            for measure in RELEVANCE_MEASURES:
                rows.append({"bucket": item.bucket, "measure": measure,
                             "open": retriever.boundary_relevance(item.state_text, entry.skill, measure) > gamma})
    frame = pd.DataFrame(rows)
    table = frame.groupby(["bucket", "measure"], sort=True)["open"].agg(["mean", "size"]).reset_index()
    return table.rename(columns={"mean": "open_share", "size": "n_pairs"})


def first_name_token(tokenizer: Any, name: str) -> int:
    """First token id of tool ``name`` continuing the native forced prefix
    ``<tool_call>\\n{"name": "``, tokenized in context (prefix + name + ``", "arguments": {``).
    A BPE merge across the prefix boundary is an error (the decision row would not exist)."""
    prefix = tokenizer(NATIVE_FORCED_PREFIX, add_special_tokens=False)["input_ids"]
    full = tokenizer(NATIVE_FORCED_PREFIX + name + NAME_CONTINUATION, add_special_tokens=False)["input_ids"]
    if full[: len(prefix)] != prefix:
        raise ValueError(f"tool name {name!r} merges with the native prefix {NATIVE_FORCED_PREFIX!r} under this tokenizer")
    return int(full[len(prefix)])


def collision_table(dataset: ProbeDataset, tokenizer: Any) -> tuple[pd.DataFrame, Counter[tuple[str, str]]]:
    """Per bucket: items, decision-set and record collision rates (module docstring); and a
    count of the colliding decision-set name pairs."""
    first: dict[str, int] = {}

    def token(name: str) -> int:
        if name not in first:
            first[name] = first_name_token(tokenizer, name)
        return first[name]

    pairs: Counter[tuple[str, str]] = Counter()
    rows = []
    for bucket in [b for b in BUCKETS if any(item.bucket == b for item in dataset.items)]:
        decision, record = [], []
        for item in dataset.items:
            if item.bucket != bucket:
                continue
            names = sorted({*item.wrong_tools, *([item.correct_action] if item.correct_action != ABSTAIN else [])})
            colliding = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if token(a) == token(b)]
            pairs.update(colliding)
            decision.append(bool(colliding))
            shown = dataset.catalog_for(item).names
            record.append(any(token(name) == token(other) for name in names for other in shown if other != name))
        rows.append({"bucket": bucket, "items": len(decision), "decision_set_collision": float(np.mean(decision)),
                     "record_collision": float(np.mean(record))})
    return pd.DataFrame(rows), pairs


def _markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def _fmt(value: float) -> str:
    return "—" if not np.isfinite(value) else f"{value:.3f}"


def _counts(dataset: ProbeDataset) -> list[str]:
    items = dataset.items
    buckets = [b for b in BUCKETS if any(item.bucket == b for item in items)]
    out = ["## Counts", ""]
    fields = ["split"] + (["split_scenario"] if all(item.split_scenario is not None for item in items) else [])
    for field in fields:
        counts = Counter((getattr(item, field), item.bucket) for item in items)
        frame = pd.DataFrame([{field: split, **{b: counts[(split, b)] for b in buckets}, "total": sum(counts[(split, b)] for b in buckets)} for split in SPLITS])
        out += [f"By bucket × `{field}`:", "", _markdown(frame), ""]
    counts = Counter((item.domain, item.bucket) for item in items)
    frame = pd.DataFrame([{"domain": d, **{b: counts[(d, b)] for b in buckets}} for d in sorted({item.domain for item in items})])
    out += ["By domain (of the tempting skill) × bucket:", "", _markdown(frame), ""]
    kinds = Counter((item.bucket, "abstain" if item.correct_action == ABSTAIN else "call") for item in items)
    frame = pd.DataFrame([{"bucket": b, "call": kinds[(b, "call")], "abstain": kinds[(b, "abstain")]} for b in buckets])
    groups = Counter(item.task_group for item in items)
    out += ["Correct action kind per bucket:", "", _markdown(frame), "",
            f"{len(items)} items in {len(groups)} task groups ({min(groups.values())}–{max(groups.values())} items per group), "
            f"{len({item.tempting_skill for item in items})} distinct tempting skills, {len(dataset.skills)} skills in {len(dataset.domains)} domains.", ""]
    return out


def _scenario_fold_rows(dataset: ProbeDataset, kinds: list[str], *, resamples: int, seed: int, rank1: dict[str, str]) -> pd.DataFrame:
    """The out-of-fold bag-of-words rows again with scenario-disjoint folds (a test item's whole
    scenario out of training), on the card's splits; the notes name the folds."""
    rows = []
    for kind, split in [("template", "eval"), ("template", None)] + [(kind, "eval") for kind in kinds[1:]]:
        pair = [item for item in dataset.select(split=split, split_kind=kind) if item.bucket in ("T_ok", "T_wrong")]
        for variant in bag_of_words_variants(rank1):
            rows += out_of_fold_rows(pair, split_name(split, kind), variant, folds=DEFAULT_FOLDS, fold_groups="scenario", resamples=resamples, seed=seed)
    return pd.DataFrame(rows)


STRUCTURE_BAR = 0.55  # a structural rule above this balanced accuracy on the matched set is named in the card


def strata(dataset: ProbeDataset) -> dict[str, list[str]]:
    """Item ids per stratum: each ``category`` (items that have one), then ``matched`` (items with a
    ``match_id``: each T_wrong item and the T_ok item matched to it). Empty for a dataset without them."""
    out: dict[str, list[str]] = {}
    for category in sorted({item.category for item in dataset.items if item.category is not None}):
        out[category] = [item.id for item in dataset.items if item.category == category]
    matched = [item.id for item in dataset.items if item.match_id is not None]
    if matched:
        out["matched"] = matched
    return out


def strata_table(dataset: ProbeDataset, *, tokenizer: Any = None, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """The no-model shortcuts of :func:`probes.scoring.shortcuts.shortcut_table` on each stratum of
    :func:`strata` (all splits), T_ok vs T_wrong: every rule's balanced accuracy, and the AUC of the
    request length and of the bag-of-words classifiers; ``split`` names the stratum."""
    frames = []
    for name, ids in strata(dataset).items():
        table = shortcut_table(dataset, splits=(None,), tokenizer=tokenizer, resamples=resamples, seed=seed, item_ids=ids)
        keep = (table.compared == COMPARED) & table.shortcut.isin(SHORTCUT_RULES) & (
            (table.statistic == "balanced_accuracy") | ((table.statistic == "auc") & table.shortcut.str.startswith(("request_length", "bag_of_words"))))
        frames.append(table[keep].assign(split=name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _strata(dataset: ProbeDataset, *, tokenizer: Any, resamples: int, seed: int) -> list[str]:
    table = strata_table(dataset, tokenizer=tokenizer, resamples=resamples, seed=seed)
    if table.empty:
        return []
    pairs = Counter(item.bucket for item in dataset.items if item.match_id is not None)
    unmatched = sum(1 for item in dataset.items if item.bucket == "T_wrong" and item.match_id is None)
    shown = table.assign(ci=[f"[{_fmt(lo)}, {_fmt(hi)}]" for lo, hi in zip(table.low, table.high)], value=[_fmt(v) for v in table.value])
    matched = table[(table.split == "matched") & table.shortcut.isin(CATALOG_RULES) & (table.statistic == "balanced_accuracy")]
    above = [f"{row.shortcut} {row.value:.3f} [{_fmt(row.low)}, {_fmt(row.high)}]" for row in matched.itertuples() if row.value > STRUCTURE_BAR]
    return ["## Shortcuts per category and on the matched set", "",
            "The same no-model rules as above (`all` items of each stratum), per `category` and on the `matched` set: each T_wrong item "
            f"with the T_ok item matched to it (same category, step depth and catalog gap; `match_id`): {pairs['T_wrong']} pairs, "
            f"{unmatched} T_wrong items unmatched. The rules and the matching were fixed before any model ran on these items; "
            "nothing here is tuned against a probe outcome. `balanced_accuracy` for the yes/no rules (= their AUC), AUC for length and bag of words.", "",
            _markdown(shown[["shortcut", "split", "statistic", "value", "ci", "n_items", "n_groups"]]), "",
            f"Structural rules (`{'`, `'.join(CATALOG_RULES)}`) above {STRUCTURE_BAR} balanced accuracy on the matched set: "
            + ("; ".join(above) if above else "none") + "."
            + (" Matching cannot remove a rule that reads a bucket's definition, which no T_ok item can share (BFCL: a miss_func "
               "T_wrong's tempting skill is the held-out function's, absent from the catalog by construction); the dataset's README says which."
               if above else ""), ""]


def _audit(dataset: ProbeDataset) -> list[str]:
    records = audit_records(dataset)
    if not records:
        return []
    frame = pd.DataFrame(records)
    frame["category"] = frame["category"].fillna("—")
    counts = frame.groupby(["category", "bucket", "rule", "action"], sort=True).size().reset_index(name="items")
    return ["## Label audit", "",
            f"Items a stated rule checked (`audit` field of the items; dropped items are listed in `{AUDIT_FILE}`; "
            "`basm-probes audit --dataset DIR` prints every change with its reason):", "", _markdown(counts), ""]


def dataset_card(dataset_dir: str | Path, *, tokenizer: str | Path | None = DEFAULT_TOKENIZER, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> str:
    """The card text of the dataset in ``dataset_dir``. ``tokenizer``: ``"qwen3"`` (the real Qwen3
    tokenizer), a local tokenizer folder, or ``None`` (no token lengths, no collision section; the
    card says so). ``resamples``/``seed``: of the bootstrap CIs. Deterministic for fixed arguments."""
    from probes.data.extract_llm import read_record

    dataset_dir = Path(dataset_dir)
    dataset = load_dataset(dataset_dir)
    # every input read and checked before the minutes of statistics: a torn record line stops the card at once
    record = read_record(dataset_dir / LLM_RECORD, {name: domain.catalog for name, domain in dataset.domains.items()}) \
        if (dataset_dir / LLM_RECORD).is_file() else None
    loaded = load_tokenizer(tokenizer) if tokenizer is not None else None
    tokenizer_label = "none" if tokenizer is None else ("Qwen3 (probes.prompts.tokenizers.load_tokenizer('qwen3'))" if str(tokenizer) == "qwen3" else Path(tokenizer).name)
    kinds = ["template"] + (["scenario"] if all(item.split_scenario is not None for item in dataset.items) else [])
    embedder = make_embedder("minilm")
    retriever = warm_retriever(dataset, embedder)
    rank1 = rank1_skills(dataset, retriever)
    common = dict(resamples=resamples, seed=seed, rank1=rank1)
    table = pd.concat([shortcut_table(dataset, splits=("eval", None), split_kind="template", tokenizer=loaded, **common)]
                      + [shortcut_table(dataset, splits=("eval",), split_kind=kind, tokenizer=loaded, **common) for kind in kinds[1:]]
                      + ([_scenario_fold_rows(dataset, kinds, **common)] if all(item.scenario for item in dataset.items) else []),
                      ignore_index=True)
    lines = [f"# Dataset card: {dataset_dir.name}", "",
             "Generated by `probes.reporting.cards.write_card`; do not edit by hand (tests/reporting/test_cards.py regenerates it).",
             f"Parameters: tokenizer = {tokenizer_label}; bootstrap resamples = {resamples}, seed = {seed}; CIs are 95% percentile intervals over task groups.", ""]
    lines += _counts(dataset)
    shown = table.assign(ci=[f"[{_fmt(lo)}, {_fmt(hi)}]" for lo, hi in zip(table.low, table.high)], value=[_fmt(v) for v in table.value])
    lines += ["## Shortcut baselines", "",
              "No-model rules (on the request, or on the shown catalog) and bag-of-words classifiers (`probes.scoring.shortcuts`, whose docstrings define each row). "
              "`all` = train + eval; `scenario:eval` = the scenario-held-out split. Out-of-fold rows say whether their folds are task-disjoint or "
              "scenario-disjoint (every template of a test item's scenario out of training).", "",
              _markdown(shown[["shortcut", "split", "compared", "statistic", "value", "ci", "n_items", "n_groups", "note"]]), ""]
    for split in ["eval"] + (["scenario:eval"] if "scenario" in kinds else []):
        best = best_shortcut(table, split=split)
        described = "; ".join(f"{stat} {entry['value']:.3f} [{_fmt(entry['low'])}, {_fmt(entry['high'])}] ({entry['shortcut']})" for stat, entry in best.items())
        kind, _, name = split.rpartition(":")
        buckets = Counter(item.bucket for item in dataset.select(split=name, split_kind=kind or "template") if item.bucket in ("T_ok", "T_wrong"))
        majority = max(buckets.values()) / sum(buckets.values())
        lines += [f"Best no-model shortcut on `{split}` (AUC orientation-free): {described}. "
                  f"Answering the larger bucket for every item is {majority:.3f} accurate: read accuracy against that.", ""]
    lines += _strata(dataset, tokenizer=loaded, resamples=resamples, seed=seed)
    lines += _audit(dataset)
    gate = gate_table(dataset, embedder, retriever=retriever)
    lines += ["## Boundary relevance gate (Eq. 10)", "",
              f"Share of (item, skill retrieved at rank ≤ {GATE_DEPTH}) pairs whose boundary fields the gate shows at γ = 0, over all items "
              "(MiniLM retrieval). `lexical`: the best content-word coverage of a boundary item by the state (the paper's overlap); "
              "`semantic`: the best MiniLM cosine between the state and a boundary item. "
              "A set whose boundary text shares no content word with the requests closes the lexical gate by design.", "",
              _markdown(gate.assign(open_share=gate.open_share.map(_fmt))), ""]
    lines += ["## First-token collisions (native tool-call format)", ""]
    if loaded is None:
        lines += ["Not computed: no tokenizer was given.", ""]
    else:
        collisions, pairs = collision_table(dataset, loaded)
        frame = collisions.assign(decision_set_collision=collisions.decision_set_collision.map(_fmt), record_collision=collisions.record_collision.map(_fmt))
        listed = ", ".join(f"{a}/{b} ({n})" for (a, b), n in sorted(pairs.items())) or "none"
        lines += ["From the candidate tool names directly (see `probes.reporting.cards`): the first token of each name after "
                  "`<tool_call>\\n{\"name\": \"`. Decision set: two of {correct tool, wrong tools} collide (first-token margin undefined); "
                  "record: the correct or a wrong tool collides with any other shown tool (a native record's `collision` field).", "",
                  _markdown(frame), "", f"Colliding decision-set pairs (items): {listed}.", ""]
    if record is not None:
        lines += llm_record_section(dataset, record)
    return "\n".join(lines)


def llm_record_section(dataset: ProbeDataset, rows: list[dict[str, Any]]) -> list[str]:
    """What ψ keeps of a recorded LLM extractor run (``llm_extraction.jsonl``, written by
    :class:`probes.data.extract_llm.RecordingGenerator`, read by :func:`~probes.data.extract_llm.read_record`):
    every reply checked again against the dataset's catalogs (:func:`~probes.data.extract_llm.replay_record`),
    discarded candidates per reason."""
    from probes.data.extract_llm import replay_record

    extraction = replay_record(rows, {name: domain.catalog for name, domain in dataset.domains.items()})
    models = sorted({(Path(str(row["model"])).name, row["max_new_tokens"]) for row in rows})
    prompted = len(extraction.kept) + len(extraction.rejected)
    first = sum(n == 1 for n in extraction.attempts.values())
    lines = ["## LLM extractor run (recorded)", "",
             f"`{LLM_RECORD}`: {len(rows)} replies of {', '.join(f'`{m}` (at most {n} new tokens)' for m, n in models)} to the",
             f"f_ext prompts of {prompted} candidates (of the {len(dataset.skills)} skills kept here), each reply checked again",
             "here by ψ and the anchor checks (`probes.data.extract_llm.replay_record`). Candidates without boundary evidence",
             "are not prompted. Recorded with `probes.data.extract_llm.RecordingGenerator` around the chat model of",
             "`import_bfcl(..., extractor='llm')`.", "",
             f"Kept: {len(extraction.kept)} ({first} on the first reply, {len(extraction.kept) - first} after a retry); discarded: {len(extraction.rejected)}.", "",
             "| discarded because | candidates |", "|---|---|"]
    lines += [f"| {reason} | {count} |" for reason, count in sorted(extraction.discarded().items(), key=lambda kv: (-kv[1], kv[0]))] or ["| none | 0 |"]
    return lines + [""]


def write_card(dataset_dir: str | Path, *, tokenizer: str | Path | None = DEFAULT_TOKENIZER, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Path:
    """Write :func:`dataset_card` to ``<dataset_dir>/CARD.md`` atomically (through a temporary file
    renamed over it; a dead writer's temporary file is deleted); returns the path."""
    from probes.core.files import write_text

    path = Path(dataset_dir) / CARD_NAME
    text = dataset_card(dataset_dir, tokenizer=tokenizer, resamples=resamples, seed=seed)
    write_text(path, text)  # atomic: a full disk or a kill leaves the previous card whole
    return path

