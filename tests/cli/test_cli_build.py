"""`basm-probes build` and `basm-probes show` end to end on a few items."""

from __future__ import annotations

import json

from probes.cli.main import main


def test_build_writes_documented_records(tmp_path, capsys):
    out = tmp_path / "records.jsonl"
    code = main(["build", "--limit", "2", "--k-max", "2", "--config", "proc", "--config", "basm", "--config", "pad-filler",
                 "--format", "native", "--format", "prompted", "--workers", "1", "--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical", "--out", str(out)])
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 6 * 3 * 3 * 2  # items × configs × k × formats
    documented = {
        "record_id", "item_id", "bucket", "split", "domain", "task_group", "config", "k", "format", "tokenizer",
        "text", "input_ids", "n_tokens", "decision_index", "open_index", "query_rows", "spans", "spans_kind",
        "skills", "candidates", "collision", "correct_action", "wrong_tools", "tempting_skill", "tempting_rank", "tempting_shown_rank", "retrieval",
    }
    assert all(set(record) == documented for record in records)
    assert all(record["retrieval"]["gate"] == {"relevance": "lexical", "gamma": 0.0, "beta": 384} for record in records)
    assert len({record["record_id"] for record in records}) == len(records)
    printed = capsys.readouterr().out
    assert "0 mismatches" in printed and "tempting skill ranked first" in printed


def test_show_highlights_spans(capsys, v1_dataset):
    item = v1_dataset.select(buckets=["T_wrong"], split="eval")[0]
    assert main(["show", item.id, "--config", "basm", "--k", "2", "--dataset", "basm_probe", "--embedder", "lexical", "--relevance", "lexical"]) == 0
    printed = capsys.readouterr().out
    assert "procedure span P" in printed and "boundary span B" in printed and item.user[:30] in printed
