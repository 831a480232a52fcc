"""The curate and mask-eval analyses (probes.analyses.curate, probes.analyses.mask_eval; seed 003 §2.2–2.3) on a stub
scorer whose margin is a known function of the skills a prompt shows: the development gate rejects a planted split
that lowers the development score, the curated dataset loads back, and mask-eval drops the harmful skill on held-out
items and resumes without rescoring."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from probes.analyses import curate, jobs
from probes.analyses.curate import Curate
from probes.analyses.mask_eval import MaskEval
from probes.core.chat import Reply
from probes.data.dataset import load_dataset
from probes.reporting.layout import rows_path

FAST = {"dataset": "basm_probe", "embedder": "lexical", "relevance": "lexical"}
SPLIT, HARMFUL = "retail.lookup_order", "retail.cancel_order"


def planted_scorer(calls: list[str], variant_effect: float):
    """Margin = Σ of planted effects of the shown skills: SPLIT +2 on T_ok, −2 on T_wrong and T_repair
    (heterogeneous); HARMFUL +1 everywhere; each split variant ``variant_effect``."""
    def score(session, record, conditions=(), **_):
        calls.append(record.record_id)
        shown = [entry.skill_id for entry in record.skills]
        margin = ((2.0 if record.bucket == "T_ok" else -2.0) * (SPLIT in shown) + 1.0 * (HARMFUL in shown)
                  + variant_effect * sum(s.endswith((".scoped", ".guarded")) for s in shown))
        return [{"condition": "baseline", "margin": margin, "call_logodds": -margin, "correct_is_abstain": False}]
    return score


OPTIONS = dict(domains=["retail"], buckets=["T_ok", "T_wrong"], limit=8, k_max=9, masks=40, figure=False, **FAST)


@pytest.mark.parametrize("variant_effect", [5.0, -5.0])
def test_gate_rejects_a_split_that_lowers_the_development_score(variant_effect: float, tiny_qwen3_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "score_record", planted_scorer([], variant_effect))
    # a rewriting chat model whose reply ψ refuses: the deterministic variants are used, and the choice recorded
    refusing = type("Refusing", (), {"label": "stub-chat", "__call__": lambda self, messages: Reply("no JSON here")})()
    monkeypatch.setattr(curate, "chat_generator", lambda model, device: refusing)
    result = Curate(model=tiny_qwen3_dir, out=tmp_path, rewriter="stub-chat", **OPTIONS).run(verbose=False)
    fallback = result.summary.decisions.query("step == 'split' and action == 'deterministic variants instead'")
    assert fallback["skill"].tolist() == [SPLIT] and fallback["reason"].iloc[0].startswith("stub-chat's variants: not JSON")
    skills = result.summary.skills.set_index("skill")
    assert skills.loc[SPLIT, "regime"] == "heterogeneous" and skills.loc[HARMFUL, "regime"] == "harmful"
    split = result.summary.decisions.query("step == 'split' and skill == @SPLIT and action != 'deterministic variants instead'").iloc[0]
    # the gate compares the development items (those the masks were scored on), and only them
    assert split["n_items"] == result.rows.loc[result.rows["condition"].str.startswith("library:m"), "item_id"].nunique() > 0
    dataset = load_dataset(result.summary.library_dir)
    ids = set(dataset.skills)
    if variant_effect > 0:  # the variants raise every development margin they are shown in: worse, rejected
        assert not split["accepted"] and split["margin_after"] > split["margin_before"] and "worse" in split["reason"]
        assert SPLIT in ids and not any(s.startswith(SPLIT + ".") for s in ids)
    else:
        assert split["accepted"] and split["margin_after"] <= split["margin_before"]
        assert SPLIT not in ids and f"{SPLIT}.scoped" in ids
        assert all(item.tempting_skill != SPLIT for item in dataset.items)
        scoped = dataset.skills[f"{SPLIT}.scoped"]
        assert scoped.applicability[-1].startswith("The request mentions ")
    assert HARMFUL in ids  # harmful (not negligible): the seed retires only |C̄| < τ_retire
    readme = (result.summary.library_dir / "README.md").read_text()
    assert "development gate" in readme and len(pd.read_csv(result.summary.library_dir / "decisions.csv")) == len(result.summary.decisions)


def test_mask_eval_drops_the_harmful_skill_on_held_out_items_and_resumes(tiny_qwen3_dir: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(jobs, "score_record", planted_scorer(calls, 0.0))
    options = dict(model=tiny_qwen3_dir, out=tmp_path, min_skills=1, **OPTIONS)
    result = MaskEval(**options).run(verbose=False)
    items = result.summary.items
    mask = items[items["policy"] == "mask"]
    assert len(mask) > 0 and all(HARMFUL in dropped for dropped in mask["dropped"])  # +1 on every development item
    sizes = items.pivot_table(index="item_id", columns="policy", values="n_dropped")
    assert (sizes["reverse"] <= sizes["mask"]).all() and (sizes["random"] == sizes["mask"]).all() and (sizes["full"] == 0).all()
    # a policy's mean: the mean over task groups of the items' margins, by hand
    cell = result.summary.policies.query("outcome == 'margin' and bucket == 'T_wrong' and policy == 'mask'").iloc[0]
    wrong = mask[mask["bucket"] == "T_wrong"]
    assert cell["value"] == pytest.approx(wrong.groupby("task_group")["margin"].mean().mean(), abs=1e-12)
    # resume: nothing scored again; a run killed mid-way rescored only its lost rows, never a finished mask
    calls.clear()
    MaskEval(**options).run(verbose=False)
    assert calls == []
    path = rows_path(tmp_path / tiny_qwen3_dir.name, "mask-eval")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:100]))  # killed during the masks: 99 rows kept, the other masks and every policy row lost
    again = MaskEval(**options).run(verbose=False)
    lost = [json.loads(line)["key"] for line in lines[100:]]
    assert any("|library:m" in key for key in lost) and any("|shown:" in key for key in lost)
    assert 0 < len(calls) <= len(lost) and set(calls) <= {key.rsplit("|", 1)[0] for key in lost}  # no finished row scored again
    assert path.read_text().splitlines(keepends=True)[:100] == lines[:100]
    pd.testing.assert_frame_equal(again.summary.policies, result.summary.policies)
    # protecting the harmful skill's prefix keeps it; a min_skills above the library falls back everywhere
    protected = MaskEval(**options, protected=["retail.cancel"]).run(verbose=False).summary.items
    assert not any(HARMFUL in dropped for dropped in protected["dropped"])
    fallback = MaskEval(**{**options, "min_skills": 50}).run(verbose=False).summary.items
    assert fallback.query("policy == 'mask'")["fallback"].all() and (fallback["n_dropped"] == 0).all()
