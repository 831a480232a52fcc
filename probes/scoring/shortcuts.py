"""Shortcut baselines: how far a decision item can be solved without reading boundary semantics.

Pure functions, no model. Each statistic is computed on the same items as the probes
(:meth:`probes.data.dataset.ProbeDataset.select` by split) with the probes' unit of resampling: task
groups (items of one group share a template). :func:`shortcut_table` returns one tidy row per
shortcut × split × compared buckets; :func:`best_shortcut` gives the strongest accuracy and AUC
among the no-model rules (request- and catalog-level), to be drawn as reference lines on the
linear-probe figure.

Words. A *content word* is a lower-cased token of ``[a-z0-9]+(?:_[a-z0-9]+)*`` (a snake_case tool
name stays one token, so ``create_return_request`` never matches the prose word "return"; an id
``BK-20417`` gives the prefix token ``bk`` and a number), after apostrophe suffixes (``'s``,
``n't``, ``'ll``...) are cut, that is not in :data:`STOPWORDS` and not all digits, mapped by
:func:`lemma`. Both the list and the lemmatiser are fixed here so that every dataset is measured
the same way; they were not tuned to reproduce any reported figure.

Length AUC. Orientation: AUC = P(length of a T_wrong request > length of a T_ok request), ties
counting one half (Mann-Whitney; :func:`probes.analyses.linear.auc` with T_wrong as the positive class).
0.5 = length carries no bucket information; below 0.5 = T_ok requests are longer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression

from probes.data.dataset import Item, ProbeDataset, fold_groups as item_fold_groups
from probes.data.retrieval import content_words as retrieval_words
from probes.data.schema import Skill
from probes.scoring.stats import auc, bootstrap_mean, cluster_bootstrap_blocks, group_bootstrap_auc, grouped_folds

PAIR = ("T_ok", "T_wrong")
COMPARED = "T_ok vs T_wrong"
HIDING = "T_ok vs T_wrong, items hiding a tool"
DEFAULT_RESAMPLES = 1000
DEFAULT_FOLDS = 5

# Function words, auxiliaries, pronouns, contraction stems (``don't`` -> ``don``) and the
# politeness marker "please". Negation is measured on its own (NEGATION_PATTERN), so the
# negators are stop words here too.
STOPWORDS = frozenset("""
a an the and or but nor if then than so as of to in on at by for from with without into onto about over under
up down out off again further once here there when where why how what which who whom whose this that these those
i me my mine myself we us our ours you your yours he him his she her hers it its they them their theirs
am is are was were be been being have has had having do does did doing will would shall should can could may
might must ought not no never none nothing nobody neither
don doesn didn isn aren wasn weren haven hasn hadn won wouldn shouldn couldn cannot
all any both each few more most other some such own same too very just also only even still yet
one please now s t
""".split())

NEGATION_PATTERN = re.compile(r"\b(?:not|no|never|none|nothing|nobody|nowhere|neither|nor|without|cannot)\b|n[’']t\b", re.I)
CONTRAST_PATTERN = re.compile(r"\b(?:but|instead|however|though|although|rather|only|just|still|yet|whereas|except|unless)\b", re.I)
_TOKEN = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
_APOSTROPHE_SUFFIX = re.compile(r"[’'][a-z]*")
_KEEP_DOUBLE = set("lsz")


@lru_cache(maxsize=1 << 16)
def lemma(word: str) -> str:
    """Deterministic suffix stripper (not a dictionary lemmatiser), applied in this order to a
    lower-cased token without ``_`` (tool names are returned unchanged):

    1. plural: ``-ies`` -> ``-y``; else a final ``-s`` is dropped unless the word ends in
       ``ss``, ``us`` or ``is``;
    2. ``-ing`` or ``-ed`` is dropped, then a doubled final consonant other than l/s/z is undoubled
       (``shipped`` -> ``ship``);
    3. a final ``-e`` is dropped (``arrive``/``arrived``/``arriving`` -> ``arriv``).

    A step applies only if at least three letters remain.
    """
    if "_" in word:
        return word
    if word.endswith("ies") and len(word) - 3 >= 3:
        word = word[:-3] + "y"
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) - 1 >= 3:
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if len(word) >= 4 and word[-1] == word[-2] and word[-1] not in _KEEP_DOUBLE and word[-1] not in "aeiou":
                word = word[:-1]
            break
    if word.endswith("e") and len(word) - 1 >= 3:
        word = word[:-1]
    return word


@lru_cache(maxsize=1 << 16)  # pure; the cards call it on the same requests for every rule and fold
def content_words(text: str) -> frozenset[str]:
    """The content words of ``text`` (module docstring): tokens minus stop words and numbers, lemmatised."""
    tokens = _TOKEN.findall(_APOSTROPHE_SUFFIX.sub("", text.lower()))
    return frozenset(lemma(token) for token in tokens if token not in STOPWORDS and not token.isdigit())


def slot_words(skill: Skill, slots: Iterable[str], words: Callable[[str], frozenset[str]] | None = None) -> frozenset[str]:
    """Content words (``words``, default :func:`content_words`) of the named list slots of
    ``skill`` (e.g. ``risk_cues``, ``avoidance_rules``)."""
    words = words or content_words
    return frozenset().union(*(words(entry) for slot in slots for entry in getattr(skill, slot)))


def has_negation(text: str) -> bool:
    """True iff ``text`` holds a negator of :data:`NEGATION_PATTERN` (``not``, ``no``, ``n't``, ``without``...)."""
    return NEGATION_PATTERN.search(text) is not None


def has_contrast(text: str) -> bool:
    """True iff ``text`` holds a contrast/restriction word of :data:`CONTRAST_PATTERN` (``but``, ``instead``, ``only``...)."""
    return CONTRAST_PATTERN.search(text) is not None


def word_count(text: str) -> int:
    """Whitespace-separated words."""
    return len(text.split())


def overlap_rule(item: Item, skill: Skill, *, words: Callable[[str], frozenset[str]] | None = None) -> str:
    """The reviewer's lexical rule, no model: ``T_wrong`` iff the request (``item.user``) shares
    strictly more content words with the tempting skill's risk cues + avoidance rules than with its
    applicability; else ``T_ok`` (a tie, e.g. no shared word at all, is ``T_ok``). ``words``:
    :func:`content_words` by default; :func:`probes.data.retrieval.content_words` (scikit-learn's
    English stop words, no lemmatisation, tool names split on ``_``) is the retriever's own notion."""
    words = words or content_words
    request = words(item.user)
    against = len(request & slot_words(skill, ("risk_cues", "avoidance_rules"), words))
    for_ = len(request & slot_words(skill, ("applicability",), words))
    return "T_wrong" if against > for_ else "T_ok"


def shares_risk_word(item: Item, skill: Skill) -> bool:
    """The request shares at least one content word with the tempting skill's risk cues."""
    return bool(content_words(item.user) & slot_words(skill, ("risk_cues",)))


def error_code(item: Item) -> str:
    """The error code of a T_repair item: the string ``error`` field of the JSON content of the
    last tool message in its history. A history without one is an error naming the item."""
    for message in reversed(item.history):
        if message["role"] == "tool":
            try:
                content = json.loads(message["content"])
            except json.JSONDecodeError as error:
                raise ValueError(f"item {item.id}: the tool observation is not JSON ({error}); an error code needs {{'error': CODE}}") from error
            if isinstance(content, dict) and isinstance(content.get("error"), str):
                return content["error"]
            break
    raise ValueError(f"item {item.id}: no tool observation with a string 'error' field in its history")


def skill_length(skill: Skill) -> int:
    """Words of goal + procedure (what Proc. Skill retrieval and formatting show)."""
    return word_count(skill.goal) + sum(word_count(step) for step in skill.procedure)


def _row(shortcut: str, split: str, compared: str, statistic: str, value: float, low: float, high: float, n_items: int, n_groups: int, note: str) -> dict[str, Any]:
    if n_groups > 1 and np.isfinite(low) and low == high and "by construction" not in note:
        # a zero-width CI over several task groups is a property of the items, never precision: say so
        note = f"{note}; every resample of the task groups gives {value:.3f}, so the CI has no width by construction"
    return {"shortcut": shortcut, "split": split, "compared": compared, "statistic": statistic, "value": value,
            "low": low, "high": high, "n_items": n_items, "n_groups": n_groups, "note": note}


def _rate_row(shortcut: str, split: str, compared: str, statistic: str, values: Sequence[float], groups: Sequence[str] | None, note: str, *, resamples: int, seed: int) -> dict[str, Any]:
    estimate = bootstrap_mean(values, groups, resamples=resamples, seed=seed)
    if len(values) > 1 and len(set(values)) == 1:
        unit = "item" if groups is not None else "task group"
        note = f"{note}; every {unit} gives {values[0]:g}, so the CI has no width by construction"
    return _row(shortcut, split, compared, statistic, estimate.value, estimate.low, estimate.high, len(values), estimate.n_units, note)


def balanced_accuracy(correct: np.ndarray, y: np.ndarray) -> float | np.ndarray:
    """Mean of the per-class accuracies (NaN where a class is absent): chance is 0.5 whatever the
    class balance, unlike plain accuracy on an imbalanced set such as BFCL's (2,034 T_ok, 182 T_wrong).
    ``correct`` is 0/1 (its sums are exact counts); with a leading axis ([resample, item]) one value per resample."""
    correct, y = np.asarray(correct, dtype=float), np.asarray(y)
    with np.errstate(invalid="ignore", divide="ignore"):  # a class absent: 0 / 0, NaN
        per_class = [np.where(y == c, correct, 0.0).sum(axis=-1) / (y == c).sum(axis=-1) for c in (0, 1)]
    value = (per_class[0] + per_class[1]) / 2
    return float(value) if value.ndim == 0 else value


def _accuracy_rows(shortcut: str, split: str, predicted: Sequence[str], items: Sequence[Item], note: str, *, resamples: int, seed: int) -> list[dict[str, Any]]:
    """``accuracy`` (a mean, CI over task groups) and ``balanced_accuracy`` (:func:`balanced_accuracy`;
    CI from resampling task groups) of a T_ok/T_wrong rule's per-item predictions. A rule that gives
    one answer for every item is at chance by construction, and its note says so."""
    correct = np.array([guess == item.bucket for guess, item in zip(predicted, items)], dtype=float)
    y = np.array([item.bucket == "T_wrong" for item in items], dtype=int)
    if len(set(predicted)) == 1:
        note = f"{note}; the rule answers {predicted[0]} for all {len(items)} items (never separates them): chance by construction"
    groups = [item.task_group for item in items]
    low, high = cluster_bootstrap_blocks(lambda block: balanced_accuracy(correct[block], y[block]), groups, resamples=resamples, seed=seed)
    return [_rate_row(shortcut, split, COMPARED, "accuracy", correct, groups, note, resamples=resamples, seed=seed),
            _row(shortcut, split, COMPARED, "balanced_accuracy", balanced_accuracy(correct, y), low, high, len(items), len(set(groups)),
                 f"{note}; mean of the T_ok and T_wrong accuracies (chance 0.5)")]


def length_rows(items: Sequence[Item], split: str, lengths: Sequence[int], unit: str, *, resamples: int, seed: int) -> list[dict[str, Any]]:
    """Length-alone AUC (T_wrong positive, score = request length in ``unit``) with its percentile
    CI over task groups (:func:`group_bootstrap_auc`), and the share of task groups
    whose mean T_wrong length exceeds their mean T_ok length, a tie counting one half (0.5 =
    uninformative; CI: bootstrap over groups)."""
    y = np.array([item.bucket == "T_wrong" for item in items], dtype=int)
    lengths = np.asarray(lengths, dtype=float)
    groups = [item.task_group for item in items]
    low, high = group_bootstrap_auc(y, lengths, groups, resamples=resamples, seed=seed)
    rows = [_row(f"request_length_{unit}", split, COMPARED, "auc", auc(y, lengths), low, high, len(items), len(set(groups)),
                 f"AUC of request length in {unit} for T_wrong (positive) vs T_ok; 0.5 = uninformative")]
    longer = []
    for group in dict.fromkeys(groups):
        member = np.array([g == group for g in groups])
        wrong, ok = lengths[member & (y == 1)], lengths[member & (y == 0)]
        if len(wrong) and len(ok):
            longer.append(0.5 if wrong.mean() == ok.mean() else float(wrong.mean() > ok.mean()))
    if longer:
        rows.append(_rate_row(f"request_length_{unit}", split, COMPARED, "share_groups_wrong_longer", longer, None, f"share of task groups whose mean T_wrong request is longer (in {unit}) than their mean T_ok request; ties count 1/2",
                              resamples=resamples, seed=seed))
    return rows


def skill_word_features(skill_id: str, text: str) -> list[str]:
    """The features of :func:`bag_of_words` with ``by_skill=True``: the request's content words,
    each word again crossed with the tempting skill (``"<skill>|<word>"``), and the skill alone."""
    words = sorted(content_words(text))
    return [*words, *(f"{skill_id}|{word}" for word in words), f"{skill_id}|"]


def bag_of_words(items: Sequence[Item], *, folds: int = DEFAULT_FOLDS, seed: int = 0, by_skill: bool = False,
                 fold_groups: str = "task_group", skills: Mapping[str, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold P(T_ok) of a bag-of-words classifier of the request text alone: binary
    CountVectorizer over the content-word analyser of this module (fit on the training fold only)
    and scikit-learn's L2 LogisticRegression (C = 1, lbfgs), with the linear probes' grouped
    folds (:func:`probes.analyses.linear.grouped_folds`: StratifiedGroupKFold, ≤ ``folds``) over
    ``fold_groups`` (:func:`probes.data.dataset.fold_groups`: task groups, or whole scenarios).
    Returns (labels with T_ok = 1, out-of-fold scores); items in no test fold get NaN.

    ``by_skill``: the words are also crossed with the tempting skill (:func:`skill_word_features`), or with
    ``skills[item.id]`` where given (e.g. the skill retrieval ranks first, which the prompt shows).
    A label that is "which state sentence follows" XOR "which skill tempts" (counterbalanced pairs)
    is invisible to single words but linear in these features, and a residual probe can read both
    from the prompt without any boundary text."""
    y = np.array([item.bucket == "T_ok" for item in items], dtype=int)
    groups = item_fold_groups(items, fold_groups)
    scores = np.full(len(items), np.nan)
    for train, test in grouped_folds(y, groups, folds, seed):
        scores[test] = _fit_bag_of_words([items[i] for i in train], [items[i] for i in test], by_skill=by_skill, skills=skills)
    return y, scores


def held_out_bag_of_words(train: Sequence[Item], test: Sequence[Item], *, by_skill: bool = False,
                          skills: Mapping[str, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bag_of_words` fit once on ``train`` (a training split) and scored on ``test``: the
    held-out protocol of a split, where the out-of-fold one stays inside it. Returns (labels of
    ``test`` with T_ok = 1, P(T_ok))."""
    return np.array([item.bucket == "T_ok" for item in test], dtype=int), _fit_bag_of_words(train, test, by_skill=by_skill, skills=skills)


def _fit_bag_of_words(train: Sequence[Item], test: Sequence[Item], *, by_skill: bool, skills: Mapping[str, str] | None = None) -> np.ndarray:
    def features(item: Item) -> list[str]:
        if not by_skill:
            return sorted(content_words(item.user))
        return skill_word_features(item.tempting_skill if skills is None else skills[item.id], item.user)

    vectorizer = CountVectorizer(analyzer=features, binary=True)
    X_train = vectorizer.fit_transform(list(train))
    model = LogisticRegression(C=1.0, max_iter=1000).fit(X_train, np.array([item.bucket == "T_ok" for item in train], dtype=int))
    return model.predict_proba(vectorizer.transform(list(test)))[:, 1]


def hides_a_tool(item: Item, dataset: ProbeDataset) -> bool:
    """The catalog shown for ``item`` leaves out a tool of its catalog domains (``unavailable_tools``)."""
    return bool(item.unavailable_tools)


def tempting_tool_hidden(item: Item, dataset: ProbeDataset) -> bool:
    """A tool of the tempting skill is not in the catalog shown for ``item``."""
    shown = set(dataset.catalog_for(item).names)
    return any(use.name not in shown for use in dataset.skills[item.tempting_skill].tools)


def hidden_tool_place(item: Item, dataset: ProbeDataset) -> int:
    """The place (0-based) of the gap in the item's catalog in canonical order (its catalog domains in
    order, each domain's tools in file order, before any removal): the first place of an
    ``unavailable_tools`` entry. An item that hides no tool is an error."""
    full = [name for domain in item.catalog_domains for name in dataset.domains[domain].catalog.names]
    places = [full.index(name) for name in item.unavailable_tools if name in full]
    if not places:
        raise ValueError(f"item {item.id} hides no tool of its catalog domains {list(item.catalog_domains)}")
    return min(places)


def hidden_place_rows(items: Sequence[Item], dataset: ProbeDataset, split: str, *, resamples: int, seed: int) -> list[dict[str, Any]]:
    """Among the T_ok / T_wrong items that hide a tool (abstain items and their decoy-hiding T_ok twins),
    the AUC of :func:`hidden_tool_place` for T_wrong (positive) vs T_ok, CI over task groups: 0.5 = the
    place of the gap says nothing about the bucket. No row unless both buckets hide tools."""
    hiding = [item for item in items if item.unavailable_tools]
    if len({item.bucket for item in hiding}) < 2:
        return []
    y = np.array([item.bucket == "T_wrong" for item in hiding], dtype=int)
    place = np.array([hidden_tool_place(item, dataset) for item in hiding], dtype=float)
    groups = [item.task_group for item in hiding]
    low, high = group_bootstrap_auc(y, place, groups, resamples=resamples, seed=seed)
    return [_row("hidden_tool_place", split, HIDING, "auc", auc(y, place), low, high, len(hiding), len(set(groups)),
                 "AUC of the gap's place in the catalog's canonical order for T_wrong (positive) vs T_ok, items hiding a tool only; "
                 f"0.5 = uninformative; first seven places: {int((place[y == 1] < 7).sum())}/{int(y.sum())} T_wrong, "
                 f"{int((place[y == 0] < 7).sum())}/{int((1 - y).sum())} T_ok")]


def bag_of_words_variants(rank1: Mapping[str, str] | None) -> list[tuple[str, bool, Mapping[str, str] | None, str]]:
    """(shortcut, by_skill, skills, what) of the bag-of-words rows: plain words, words × the tempting
    skill, and, with ``rank1`` (item id -> the skill retrieval ranks first), words × the rank-1 skill."""
    variants = [("bag_of_words", False, None, "request words"), ("bag_of_words_by_skill", True, None, "request words, each also crossed with the tempting skill")]
    if rank1 is not None:
        variants.append(("bag_of_words_by_rank1_skill", True, rank1, "request words, each also crossed with the skill retrieval ranks first"))
    return variants


def out_of_fold_rows(pair: Sequence[Item], split: str, variant: tuple[str, bool, Mapping[str, str] | None, str], *, folds: int,
                     fold_groups: str, resamples: int, seed: int) -> list[dict[str, Any]]:
    """The out-of-fold rows of one of :func:`bag_of_words_variants` on the T_ok / T_wrong items ``pair``:
    accuracy and balanced accuracy (P(T_ok) > 0.5) and AUC, folds grouped by ``fold_groups``, which the
    notes name (task-disjoint or scenario-disjoint)."""
    shortcut, by_skill, skills, what = variant
    groups = [item.task_group for item in pair]
    disjoint = "task-disjoint" if fold_groups == "task_group" else f"{fold_groups}-disjoint"
    y, scores = bag_of_words(pair, folds=folds, seed=seed, by_skill=by_skill, fold_groups=fold_groups, skills=skills)
    scored = np.isfinite(scores)
    if not scored.any():
        return []
    kept = [g for g, ok in zip(groups, scored) if ok]
    predicted = ["T_ok" if score > 0.5 else "T_wrong" for score in scores[scored]]
    low, high = group_bootstrap_auc(y[scored], scores[scored], kept, resamples=resamples, seed=seed)
    return [*_accuracy_rows(shortcut, split, predicted, [item for item, ok in zip(pair, scored) if ok],
                            f"{what}; out-of-fold, ≤ {folds} {disjoint} folds", resamples=resamples, seed=seed),
            _row(shortcut, split, COMPARED, "auc", auc(y[scored], scores[scored]), low, high, int(scored.sum()), len(set(kept)),
                 "AUC of out-of-fold P(T_ok), " + ("" if fold_groups == "task_group" else f"{disjoint} folds, ") + "T_ok positive")]


def history_empty(item: Item, dataset: ProbeDataset) -> bool:
    """No call has been made in the current turn yet (``item.history`` is empty: step 0)."""
    return not item.history


def history_empty_and_catalog_gap(item: Item, dataset: ProbeDataset) -> bool:
    """:func:`history_empty` and :func:`hides_a_tool`."""
    return history_empty(item, dataset) and hides_a_tool(item, dataset)


def history_empty_and_tempting_tool_hidden(item: Item, dataset: ProbeDataset) -> bool:
    """:func:`history_empty` and :func:`tempting_tool_hidden`."""
    return history_empty(item, dataset) and tempting_tool_hidden(item, dataset)


# Prompt-level rules: they read the shown catalog or the prompt's structure, never the request or any
# boundary text. Fixed before any model ran on the items they are reported for.
CATALOG_RULES: dict[str, tuple[Callable[[Item, ProbeDataset], bool], str]] = {
    "catalog_hides_tool": (hides_a_tool, "T_wrong iff the shown catalog leaves out a tool of the item's domains (prompt-level, no request text)"),
    "tempting_tool_hidden": (tempting_tool_hidden, "T_wrong iff a tool of the tempting skill is not in the shown catalog (prompt-level, no request text)"),
    "history_empty": (history_empty, "T_wrong iff no call was made yet in the current turn (step 0; prompt structure, no request text)"),
    "history_empty_x_catalog_gap": (history_empty_and_catalog_gap, "T_wrong iff step 0 and the shown catalog leaves out a tool (prompt structure)"),
    "history_empty_x_tempting_tool_hidden": (history_empty_and_tempting_tool_hidden,
                                             "T_wrong iff step 0 and a tool of the tempting skill is not shown (prompt structure)"),
}


def _rule_rows(shortcut: str, split: str, predicted: Sequence[str], items: Sequence[Item], note: str, *, resamples: int, seed: int) -> list[dict[str, Any]]:
    """:func:`_accuracy_rows` of a yes/no rule, and its ``auc`` (T_wrong positive, the rule's answer
    as a 0/1 score: equal to its balanced accuracy), so that the AUC bar of the linear probes
    (:func:`best_shortcut`) covers every rule."""
    y = np.array([item.bucket == "T_wrong" for item in items], dtype=int)
    score = np.array([guess == "T_wrong" for guess in predicted], dtype=float)
    groups = [item.task_group for item in items]
    low, high = group_bootstrap_auc(y, score, groups, resamples=resamples, seed=seed)
    return [*_accuracy_rows(shortcut, split, predicted, items, note, resamples=resamples, seed=seed),
            _row(shortcut, split, COMPARED, "auc", auc(y, score), low, high, len(items), len(set(groups)),
                 "AUC of the rule's answer (T_wrong = 1) for T_wrong (positive) vs T_ok; = its balanced accuracy")]


def rule_answers(pair: Sequence[Item], dataset: ProbeDataset) -> dict[str, tuple[list[str], str]]:
    """Each yes/no rule's answer ("T_wrong" / "T_ok") for every item of ``pair``, with the rule's
    note: the lexical overlap rules (:func:`overlap_rule`, with this module's words and with the
    retriever's) and :data:`CATALOG_RULES`. The one place a rule becomes per-item answers, for the
    table's rows and for :func:`shortcut_scores`."""
    skill = [dataset.skills[item.tempting_skill] for item in pair]
    answers = {
        "overlap_rule": ([overlap_rule(item, s) for item, s in zip(pair, skill)],
                         "T_wrong iff the request shares more content words with risk cues + avoidance rules than with applicability"),
        "overlap_rule_retrieval_words": ([overlap_rule(item, s, words=retrieval_words) for item, s in zip(pair, skill)],
                                         "overlap_rule with the retriever's words (probes.data.retrieval.content_words)")}
    for rule, (fires, note) in CATALOG_RULES.items():
        answers[rule] = (["T_wrong" if fires(item, dataset) else "T_ok" for item in pair], note)
    return answers


def train_pair(dataset: ProbeDataset, split: str | None, split_kind: str) -> list[Item]:
    """The T_ok / T_wrong train items a classifier is fit on for the ``auc_fit_on_train`` rows: the
    split kind's train split when the table reads ``eval``, none otherwise."""
    return [item for item in dataset.select(split="train", split_kind=split_kind) if item.bucket in PAIR] if split == "eval" else []


def shortcut_scores(dataset: ProbeDataset, pair: Sequence[Item], *, split: str | None, split_kind: str = "template",
                    folds: int = DEFAULT_FOLDS, fold_groups: str = "task_group", seed: int = 0, tokenizer: Any = None,
                    rank1: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """Per-item scores of every no-model rule of :data:`SHORTCUT_RULES` on the T_ok / T_wrong items
    ``pair`` of ``split``, oriented T_wrong-high (a rule's answer as 0/1, a request length, 1 − the
    out-of-fold or fit-on-train P(T_ok) of a bag of words), keyed as :func:`best_shortcut` names
    them ("<shortcut> (fit on train)" for the fit-on-train classifiers). The AUC of each equals the
    AUC row :func:`shortcut_table` writes for it on the same items (checked in the tests); an item
    no fold scored is NaN. For a paired comparison with a probe on the same items."""
    scores = {"request_length_words": np.array([word_count(item.user) for item in pair], dtype=float)}
    if tokenizer is not None:
        scores["request_length_tokens"] = np.array([len(tokenizer(item.user, add_special_tokens=False)["input_ids"]) for item in pair], dtype=float)
    for rule, (predicted, _) in rule_answers(pair, dataset).items():
        scores[rule] = np.array([guess == "T_wrong" for guess in predicted], dtype=float)
    train = train_pair(dataset, split, split_kind)
    for shortcut, by_skill, skills, _ in bag_of_words_variants(rank1):
        scores[shortcut] = 1 - bag_of_words(pair, folds=folds, seed=seed, by_skill=by_skill, fold_groups=fold_groups, skills=skills)[1]
        if len({item.bucket for item in train}) == 2:
            scores[f"{shortcut} (fit on train)"] = 1 - held_out_bag_of_words(train, pair, by_skill=by_skill, skills=skills)[1]
    return scores


def split_name(split: str | None, split_kind: str = "template") -> str:
    """How :func:`shortcut_table` names a split in its ``split`` column: ``eval``, ``all`` (``None``)
    or, for another split kind, ``scenario:eval``."""
    if split is None:
        return "all"
    return split if split_kind == "template" else f"{split_kind}:{split}"


def shortcut_table(
    dataset: ProbeDataset,
    *,
    splits: Sequence[str | None] = ("eval", "train", None),
    split_kind: str = "template",
    tokenizer: Any = None,
    folds: int = DEFAULT_FOLDS,
    fold_groups: str = "task_group",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    item_ids: Collection[str] | None = None,
    rank1: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Every shortcut statistic of ``dataset`` per split (``None`` = all items, written ``all``);
    ``split_kind`` picks the split field (:meth:`probes.data.dataset.ProbeDataset.select`: ``"template"``
    = ``split``, ``"scenario"`` = ``split_scenario``), written in the ``split`` column as e.g.
    ``eval`` or ``scenario:eval``. ``item_ids``: only these items of each split (an analysis's own
    items, so a bar is read on exactly the items its probe used); classifiers fit on the train split
    still fit on all of it.

    Columns: ``shortcut, split, compared, statistic, value, low, high, n_items, n_groups, note``;
    ``low``/``high`` are a 95% percentile bootstrap CI over task groups (NaN where the statistic
    has no resampling unit). Rows:

    * ``request_length_words`` (and ``request_length_tokens`` when ``tokenizer`` is given; tokens of
      ``item.user`` without special tokens): ``auc`` and ``share_groups_wrong_longer``
      (:func:`length_rows`), T_ok vs T_wrong.
    * ``overlap_rule`` ``accuracy``: share of T_ok and T_wrong items whose bucket
      :func:`overlap_rule` gets right (chance 0.5 on a balanced pair), CI over task groups;
      ``overlap_rule_retrieval_words``: the same with the retriever's word notion.
    * ``shares_risk_word`` ``rate`` per bucket (T_ok, T_wrong): :func:`shares_risk_word`.
    * ``negation`` / ``contrast`` ``rate`` per bucket (all buckets): :func:`has_negation` /
      :func:`has_contrast` on ``item.user``.
    * every ``accuracy`` row has a ``balanced_accuracy`` twin (:func:`balanced_accuracy`), the one
      to read on an imbalanced set.
    * ``catalog_hides_tool`` and ``tempting_tool_hidden`` (:data:`CATALOG_RULES`): yes/no rules on the
      shown catalog alone (an abstain item that removes its correct tool, a held-out function);
      ``history_empty`` (step 0) and its conjunctions with those two: rules on the prompt's structure.
    * ``hidden_tool_place`` ``auc`` (compared ``T_ok vs T_wrong, items hiding a tool``): :func:`hidden_place_rows`.
    * every yes/no rule (the overlap and catalog rules) also has an ``auc`` row of its 0/1 answer.
    * ``bag_of_words`` ``accuracy`` (out-of-fold P(T_ok) > 0.5; CI over groups) and ``auc``
      (T_ok positive; CI :func:`group_bootstrap_auc`): :func:`bag_of_words`;
      ``bag_of_words_by_skill``: the same with the words crossed with the tempting skill; folds over
      ``fold_groups`` (``"task_group"`` or ``"scenario"``: :func:`probes.data.dataset.fold_groups`). On ``eval``,
      each also has ``auc_fit_on_train``: fit on the same split kind's train items
      (:func:`held_out_bag_of_words`), so the scenario split shows what survives unseen scenarios;
      ``bag_of_words_by_rank1_skill`` (with ``rank1``, item id -> the skill retrieval ranks first): the
      words crossed with the rank-1 skill the prompt shows instead of the dataset's tempting skill.
    * a rule that answers the same for every item, and a rate whose every unit has the same
      value, say in ``note`` that the CI has no width by construction.
    * ``repair_code_copy`` ``rate``: share of T_repair items whose :func:`error_code` occurs
      verbatim (case-sensitive substring) in the tempting skill's recovery notes.
    * ``tempting_skill_length`` ``ratio``: mean :func:`skill_length` of the distinct tempting
      skills of the items over that of the other skills in their catalog domains' libraries
      (no CI; ``n_items`` = number of skills, ``note`` holds both means).

    The skill used is always ``item.tempting_skill`` (the one the dataset says retrieval ranks
    first); retrieval itself is not run.
    """
    item_fold_groups(dataset.items, fold_groups)  # a dataset without the folds' groups fails before any statistic
    rows: list[dict[str, Any]] = []
    for split in splits:
        name = split_name(split, split_kind)
        chosen = dataset.select(split=split, split_kind=split_kind)
        if item_ids is not None:
            chosen = tuple(item for item in chosen if item.id in set(item_ids))
        if not chosen:
            raise ValueError(f"{dataset.root}: no items in split {name!r}" + (" among the given item ids" if item_ids is not None else ""))
        pair = [item for item in chosen if item.bucket in PAIR]
        groups = [item.task_group for item in pair]
        common = dict(resamples=resamples, seed=seed)
        if len({item.bucket for item in pair}) == 2:
            rows += length_rows(pair, name, [word_count(item.user) for item in pair], "words", **common)
            if tokenizer is not None:
                lengths = [len(tokenizer(item.user, add_special_tokens=False)["input_ids"]) for item in pair]
                rows += length_rows(pair, name, lengths, "tokens", **common)
            for rule, (predicted, note) in rule_answers(pair, dataset).items():
                rows += _rule_rows(rule, name, predicted, pair, note, **common)
            rows += hidden_place_rows(pair, dataset, name, **common)
            train = train_pair(dataset, split, split_kind)
            for variant in bag_of_words_variants(rank1):
                rows += out_of_fold_rows(pair, name, variant, folds=folds, fold_groups=fold_groups, **common)
                shortcut, by_skill, skills, _ = variant
                if len({item.bucket for item in train}) == 2:
                    y, scores = held_out_bag_of_words(train, pair, by_skill=by_skill, skills=skills)
                    low, high = group_bootstrap_auc(y, scores, groups, resamples=resamples, seed=seed)
                    rows.append(_row(shortcut, name, COMPARED, "auc_fit_on_train", auc(y, scores), low, high, len(pair), len(set(groups)),
                                     f"AUC of P(T_ok) fit on the {split_kind} split's train items, T_ok positive"))
        for bucket in PAIR:
            members = [item for item in pair if item.bucket == bucket]
            if members:
                rows.append(_rate_row("shares_risk_word", name, bucket, "rate",
                                      [float(shares_risk_word(item, dataset.skills[item.tempting_skill])) for item in members],
                                      [item.task_group for item in members], "request shares a content word with the tempting skill's risk cues", **common))
        for bucket in dict.fromkeys(item.bucket for item in chosen):
            members = [item for item in chosen if item.bucket == bucket]
            member_groups = [item.task_group for item in members]
            rows.append(_rate_row("negation", name, bucket, "rate", [float(has_negation(item.user)) for item in members], member_groups, "request holds a negator", **common))
            rows.append(_rate_row("contrast", name, bucket, "rate", [float(has_contrast(item.user)) for item in members], member_groups, "request holds a contrast/restriction word", **common))
        repairs = [item for item in chosen if item.bucket == "T_repair"]
        if repairs:
            copied = [float(any(error_code(item) in note for note in dataset.skills[item.tempting_skill].recovery_notes)) for item in repairs]
            rows.append(_rate_row("repair_code_copy", name, "T_repair", "rate", copied, [item.task_group for item in repairs],
                                  "error code occurs verbatim in the tempting skill's recovery notes", **common))
        tempting = {item.tempting_skill for item in chosen}
        library = {skill.id: skill for item in chosen for skill in dataset.library_for(item)}
        others = [skill_length(skill) for sid, skill in library.items() if sid not in tempting]
        tempting_lengths = [skill_length(dataset.skills[sid]) for sid in sorted(tempting)]
        if others:
            rows.append(_row("tempting_skill_length", name, "tempting vs other skills", "ratio", float(np.mean(tempting_lengths) / np.mean(others)),
                             float("nan"), float("nan"), len(tempting_lengths) + len(others), 0,
                             f"goal+procedure words: tempting {np.mean(tempting_lengths):.1f} (n={len(tempting_lengths)}), others {np.mean(others):.1f} (n={len(others)})"))
    return pd.DataFrame(rows, columns=["shortcut", "split", "compared", "statistic", "value", "low", "high", "n_items", "n_groups", "note"])


# The rules a probe result must beat: they read the request or the shown catalog, never a model.
SHORTCUT_RULES = ("request_length_words", "request_length_tokens", "overlap_rule", "overlap_rule_retrieval_words", *CATALOG_RULES,
                  "bag_of_words", "bag_of_words_by_skill", "bag_of_words_by_rank1_skill")


def best_shortcut(table: pd.DataFrame, *, split: str = "eval") -> dict[str, dict[str, Any]]:
    """The strongest T_ok-vs-T_wrong shortcut of ``table`` (from :func:`shortcut_table`) in
    ``split``, for reference lines on the linear-probe figure:
    ``{"accuracy": {"shortcut", "value", "low", "high"}, "balanced_accuracy": {...}, "auc": {...}}``.

    Only the no-model rules of :data:`SHORTCUT_RULES` count (request- and catalog-level). The best
    of several rules read on the same items is an optimistic bar, which is the safe side for a bar
    that a probe result must clear. AUCs are orientation-free
    separabilities, max(AUC, 1 - AUC) (CI mirrored the same way), because a rule can be read in
    either direction; accuracies are taken as they are. The AUC entry also weighs the
    ``auc_fit_on_train`` rows (named ``"<shortcut> (fit on train)"``): a model trained or tuned on
    the train split may carry what a classifier fit there learns. A statistic with no row is absent.
    """
    chosen = table[(table["split"] == split) & table["shortcut"].isin(SHORTCUT_RULES) & (table["compared"] == COMPARED)]
    best: dict[str, dict[str, Any]] = {}
    for statistic in ("accuracy", "balanced_accuracy", "auc"):
        # an AUC is out of fold or fit on the train split (auc_fit_on_train): the bar is the higher
        rows = chosen[chosen["statistic"].isin(["auc", "auc_fit_on_train"] if statistic == "auc" else [statistic])]
        if rows.empty:
            continue
        entries = []
        for row in rows.itertuples():
            value, low, high = row.value, row.low, row.high
            if statistic == "auc" and value < 0.5:
                value, low, high = 1 - value, 1 - high, 1 - low
            name = f"{row.shortcut} (fit on train)" if row.statistic == "auc_fit_on_train" else row.shortcut
            entries.append({"shortcut": name, "value": float(value), "low": float(low), "high": float(high),
                            "n_items": int(row.n_items), "n_groups": int(row.n_groups)})
        best[statistic] = max(entries, key=lambda entry: entry["value"])
    return best
