"""The committed datasets/basm_probe_v2/CARD.md is regenerated exactly (a file of its own, so that it runs
beside the other cards under ``--dist loadfile``; tests/reporting/test_cards.py)."""

from test_cards import assert_card_is_current


def test_committed_card_is_regenerated_exactly():
    assert_card_is_current("basm_probe_v2")
