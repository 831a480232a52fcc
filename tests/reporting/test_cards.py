"""Dataset cards: the committed CARD.md files are what the code measures now, and the card's
collision method agrees with the prompt builder's native records, and a full disk never truncates a card."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from probes.data.dataset import load_dataset
from probes.data.retrieval import Retriever, make_embedder
from probes.prompts.builder import BuildSettings, PromptBuilder
from probes.reporting.cards import CARD_NAME, GATE_DEPTH, collision_table, dataset_card, gate_table, rank1_skills, warm_retriever
from runs import ROOT


DATASETS = Path(__file__).resolve().parents[2] / "datasets"


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer):
    return qwen3_tokenizer


def assert_card_is_current(name: str) -> None:
    """The committed ``datasets/<name>/CARD.md`` is what the code measures now. One dataset per test
    file (test_card_v2.py, test_card_bfcl.py): each card takes minutes, and pytest-xdist's
    ``--dist loadfile`` spreads files, not parameters, over the workers."""
    committed = (DATASETS / name / CARD_NAME).read_text(encoding="utf-8")
    assert dataset_card(DATASETS / name) == committed, f"datasets/{name}/{CARD_NAME} is stale: run probes.reporting.cards.write_card"


def test_committed_card_is_regenerated_exactly():
    assert_card_is_current("basm_probe")


def test_collisions_match_native_prompt_records(qwen3):
    """Decision-set collision from tool names alone == the `collision` field of real native records
    (Qwen3 tokenizer, memory-free prompts), on items with and without a collision."""
    dataset = load_dataset(DATASETS / "basm_probe")
    builder = PromptBuilder(qwen3, dataset, Retriever(make_embedder("lexical")), BuildSettings(k_max=0))
    chosen = [item for item in dataset.items if item.task_group in ("retail.cancel_vs_return.g00", "retail.x_cancel_order_vs_booking.g00", "travel.flight_vs_hotel.g00")]
    subset = type(dataset)(dataset.root, dataset.domains, tuple(chosen))
    table, _ = collision_table(subset, qwen3)
    for bucket, group in table.set_index("bucket").iterrows():
        records = [builder.build(item, "base", 0, "native") for item in chosen if item.bucket == bucket]
        assert group["record_collision"] == pytest.approx(sum(r.collision for r in records) / len(records), abs=1e-12)
        decision = [any(c.role in ("correct", "wrong") and any(o.role in ("correct", "wrong") for o in r.candidates if o.action in c.collides_with)
                        for c in r.candidates) for r in records]
        assert group["decision_set_collision"] == pytest.approx(sum(decision) / len(decision), abs=1e-12)
    for column in ("decision_set_collision", "record_collision"):
        assert 0 < table[column].max() and table[column].min() < 1  # both outcomes occur in the sample


@pytest.mark.parametrize("relevance", ["lexical", "semantic"])
def test_gate_share_is_what_the_builder_shows(qwen3, relevance):
    """The card's gate share == the share of retrieved skills whose boundary fields real BASM records
    expose (budget β large enough to keep every exposed item), on v2 items where the lexical gate both
    opens and closes."""
    dataset = load_dataset(DATASETS / "basm_probe_v2")
    chosen = [item for item in dataset.items if item.task_group.startswith("retail.")][:24]
    subset = type(dataset)(dataset.root, dataset.domains, tuple(chosen))
    embedder = make_embedder("minilm")
    table = gate_table(subset, embedder).query("measure == @relevance").set_index("bucket")
    builder = PromptBuilder(qwen3, subset, Retriever(embedder), BuildSettings(k_max=GATE_DEPTH, relevance=relevance, beta=10**6))
    rank1 = rank1_skills(subset, warm_retriever(subset, embedder)) if relevance == "semantic" else None
    for bucket, row in table.iterrows():
        records = [builder.build(item, "basm", GATE_DEPTH, "native") for item in chosen if item.bucket == bucket]
        exposed = [skill.boundary_exposed for record in records for skill in record.skills]
        assert row["n_pairs"] == len(exposed) and row["open_share"] == pytest.approx(sum(exposed) / len(exposed), abs=1e-12)
        if rank1 is not None:  # the card's rank-1 skill (bag_of_words_by_rank1_skill) is the prompt's first memory block
            assert all(rank1[record.item_id] == next(s.skill_id for s in record.skills if s.rank == 1) for record in records)
    if relevance == "lexical":
        assert 0 < table["open_share"].min() < 1


def _limit_writes_and_fake_card(size: int, dataset: Path) -> list[str]:
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size}, {size})); "
            "import probes.reporting.cards as cards; cards.dataset_card = lambda *a, **k: '# card\\n' + 'measured line\\n' * 2000; "
            f"from probes.cli.main import main; sys.exit(main(['card', {str(dataset)!r}, '--tokenizer', 'none']))")
    return [sys.executable, "-c", code]


@pytest.mark.usefixtures("private_cache")
@pytest.mark.subprocess
def test_a_full_disk_never_truncates_a_card(dataset: Path) -> None:
    card = dataset / "CARD.md"
    before = card.read_bytes()
    assert len(before) > 4096
    stale = dataset / f".CARD.{2 ** 22 + 12345}.tmp.md"  # left by a killed writer (a pid above pid_max: dead)
    stale.write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(_limit_writes_and_fake_card(4096, dataset), env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert f"error: File too large: {card}" in run.stderr
    assert card.read_bytes() == before
    assert sorted(p.name for p in dataset.iterdir() if p.name.startswith(".")) == []  # neither the stale nor its own temporary
