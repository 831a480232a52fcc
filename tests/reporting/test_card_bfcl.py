"""The committed datasets/bfcl/CARD.md. Its exact regeneration is ``slow``: 2,436 items need 10,317
MiniLM embeddings and every shortcut rule per category (about 3 minutes on one core). README's test
command regenerates the v1 and v2 cards whole (tests/reporting/test_cards.py, tests/reporting/test_card_v2.py), and here
the BFCL card's model-free sections exactly and its per-category strata on a subset."""

import pytest
from test_cards import DATASETS, assert_card_is_current

from probes.data.dataset import load_dataset
from probes.reporting.cards import CARD_NAME, _audit, _counts, strata, strata_table


@pytest.mark.slow
def test_committed_card_is_regenerated_exactly():
    assert_card_is_current("bfcl")


def test_counts_and_label_audit_sections_are_current():
    dataset = load_dataset(DATASETS / "bfcl")
    committed = (DATASETS / "bfcl" / CARD_NAME).read_text(encoding="utf-8")
    for section in (_counts(dataset), _audit(dataset)):
        text = "\n".join(section)
        assert section and text in committed, text[:200]


def test_strata_rows_on_a_subset():
    """Per-category and matched strata on six items of every (category, bucket), each T_wrong with its
    matched T_ok: a row per stratum, rule and statistic, with n_items of that stratum."""
    dataset = load_dataset(DATASETS / "bfcl")
    by_id = {item.id: item for item in dataset.items}
    firsts: dict = {}
    for item in dataset.items:
        if item.bucket == "T_wrong" and item.match_id is not None:
            firsts.setdefault(item.category, []).append(item)
    chosen = {}
    for items in firsts.values():
        for item in items[:3]:
            partner = next(other for other in dataset.items if other.match_id == item.match_id and other.id != item.id)
            chosen[item.id], chosen[partner.id] = item, partner
    subset = type(dataset)(dataset.root, dataset.domains, tuple(by_id[i] for i in by_id if i in chosen))
    table = strata_table(subset, resamples=50, seed=0)
    expected = strata(subset)
    assert set(table.split) == set(expected) and "matched" in expected
    for name, ids in expected.items():
        assert (table[table.split == name].n_items == len(ids)).all(), name
