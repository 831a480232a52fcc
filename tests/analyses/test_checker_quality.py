"""G's boundary checking in ``calls --checker`` (probes.analyses.calls): boundary-only precision and recall at
k ≥ 1 with task-group CIs, the catalog / completeness / schema blocks apart, the paired with − without G
claims, and the grammar's coverage per dataset — each on planted rows whose answer is computed by hand."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probes.analyses import calls
from probes.scoring.claims import claims_table
from probes.reporting.layout import figures_folder, table_path

MODES = ("strict", "lenient")


def _decision(*, known: bool = True, schema: str = "pass", complete: str = "pass", boundary: tuple[str, ...] = ()) -> dict:
    """A decision as the rows hold it: the catalog check, completeness and schema (for a catalog tool), then one
    applicability check per ``boundary`` verdict."""
    checks = [{"rule": "known_tool", "verdict": "pass" if known else "block", "decided_by": "rule"}]
    if known:
        checks += [{"rule": "complete", "verdict": complete, "decided_by": "rule"}, {"rule": "schema", "verdict": schema, "decided_by": "rule"}]
    checks += [{"rule": "applicability", "verdict": v, "decided_by": "rule"} for v in boundary]
    verdicts = {c["verdict"] for c in checks}
    return {"checks": checks, "verdict": "block" if "block" in verdicts else "undecided" if "undecided" in verdicts else "pass"}


def _row(group: str, item: str, *, k: int = 1, config: str = "basm", bucket: str = "T_wrong", decision: dict | None = None,
         before: str = "wrong_tool", after: str | None = None, correct: str = "right") -> dict:
    """One checker row, the same in both modes: ``before`` / ``after`` are the outcomes without / with G
    (``after`` defaults to ``before``, or abstention when G blocks)."""
    blocked = decision is not None and decision["verdict"] == "block"
    after = after or ("abstain" if blocked else before)
    row = {"config": config, "k": k, "bucket": bucket, "task_group": group, "item_id": item, "format": "native"}
    for mode in MODES:
        row.update({f"{mode}_verdict": None if decision is None else decision["verdict"], f"{mode}_decision": decision,
                    f"{mode}_blocked": blocked, f"{mode}_judged": 0,
                    f"{mode}_outcome_before": before, f"{mode}_solved_before": before == "correct_tool",
                    f"{mode}_runnable_before": decision is not None and all(c["verdict"] == "pass" for c in decision["checks"]
                                                                            if c["rule"] != "applicability"),
                    f"{mode}_outcome_after": after, f"{mode}_solved_after": after == "correct_tool",
                    f"{mode}_runnable_after": after not in ("abstain", "blocked")})
    return row


def _quality(rows: list[dict], **kwargs) -> pd.Series:
    return calls.checker_quality(pd.DataFrame(rows), **kwargs).set_index(["mode", "config"]).loc[("lenient", "basm")]


def test_k0_is_excluded_from_boundary_precision_and_recall() -> None:
    # k = 0 shows no skill: its correct calls would all count as passed (Base scored precision 1.0 that way)
    rows = [_row("a", "i1", k=0, decision=_decision(), before="correct_tool"),
            _row("a", "i2", k=0, decision=_decision(schema="block")),
            _row("a", "i3", k=1, decision=_decision(boundary=("block",))),
            _row("b", "i4", k=1, decision=_decision(boundary=("pass",)))]
    quality = _quality(rows)
    assert (quality["calls"], quality["excluded_k0"], quality["bad"], quality["boundary_blocked"]) == (2, 2, 2, 1)
    assert quality["precision"] == 1.0 and quality["recall"] == 0.5 and quality["boundary_passed_bad"] == 1
    rules = calls.checker_rule_counts(pd.DataFrame(rows))
    assert rules[rules["mode"] == "lenient"].set_index("rule").loc["schema", "calls"] == 2  # k = 0 left out there too


def test_runnable_blocks_are_not_boundary_detections() -> None:
    """Schema, completeness and unknown-tool blocks of bad calls are counted apart; only the applicability block
    is a detection. Undecided is neither a detection nor a pass."""
    rows = [_row("a", "schema", decision=_decision(schema="block")),
            _row("a", "cut", decision=_decision(complete="block", schema="pass")),
            _row("b", "unknown", decision=_decision(known=False)),
            _row("b", "rule", decision=_decision(schema="block", boundary=("block",))),  # both: a detection
            _row("c", "open", decision=_decision(boundary=("undecided",))),
            _row("c", "ok", decision=_decision(boundary=("pass",)), before="correct_tool"),
            _row("c", "abstained", decision=None, before="abstain")]
    quality = _quality(rows)
    # by hand: 5 calls of catalog tools (the unknown tool and the abstention are not among them), 4 bad
    assert (quality["calls"], quality["excluded_unknown_tool"], quality["bad"]) == (5, 1, 4)
    assert (quality["boundary_blocked"], quality["boundary_blocked_bad"]) == (1, 1)
    assert quality["precision"] == 1.0 and quality["recall"] == 0.25
    assert (quality["boundary_undecided"], quality["boundary_undecided_bad"], quality["boundary_passed"], quality["no_boundary_rule"]) == (1, 1, 1, 2)
    assert quality["bad_share"] == 0.8 and quality["block_share"] == 0.2  # a random blocker's precision and recall
    rules = calls.checker_rule_counts(pd.DataFrame(rows))
    rules = rules[rules["mode"] == "lenient"].set_index("rule")
    assert rules.loc["schema", ["kind", "blocked", "blocked_alone"]].tolist() == ["runnable", 2, 1]
    assert rules.loc["complete", "blocked"] == 1 and rules.loc["known_tool", "blocked"] == 1
    assert rules.loc["applicability", ["kind", "blocked", "blocked_alone", "undecided"]].tolist() == ["boundary", 1, 0, 1]


def test_boundary_ci_is_the_task_group_bootstrap_by_hand() -> None:
    # group a: 2 bad blocked, 1 bad passed; b: 1 bad blocked, 1 correct blocked; c: 2 bad passed, 1 correct passed
    plan = {"a": [(True, True), (True, True), (True, False)], "b": [(True, True), (False, True)],
            "c": [(True, False), (True, False), (False, False)]}
    rows = [_row(g, f"{g}{i}", decision=_decision(boundary=("block" if blocked else "pass",)),
                 before="wrong_tool" if bad else "correct_tool") for g, calls_ in plan.items() for i, (bad, blocked) in enumerate(calls_)]
    resamples, seed = 400, 3
    quality = _quality(rows, resamples=resamples, seed=seed)
    assert quality["precision"] == 0.75 and quality["recall"] == 0.5 and quality["n_groups"] == 3
    # by hand: draw three groups with replacement (the groups in first-seen order), pool their counts
    tp, detected, bad = np.array([2, 1, 0]), np.array([2, 2, 0]), np.array([3, 1, 2])
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, 3, 3) for _ in range(resamples)]
    precisions = [tp[d].sum() / detected[d].sum() for d in draws if detected[d].sum()]
    recalls = [tp[d].sum() / bad[d].sum() for d in draws]
    assert (quality["precision_low"], quality["precision_high"]) == pytest.approx(tuple(np.quantile(precisions, [0.025, 0.975])))
    assert (quality["recall_low"], quality["recall_high"]) == pytest.approx(tuple(np.quantile(recalls, [0.025, 0.975])))
    assert 0 < len(precisions) < resamples and f"precision CI over the {len(precisions)} of {resamples} resamples" in quality["note"]


def test_no_ci_below_two_task_groups_and_it_says_so() -> None:
    rows = [_row("a", "x", decision=_decision(boundary=("block",))), _row("a", "y", decision=_decision(boundary=("pass",)))]
    quality = _quality(rows)
    assert quality["recall"] == 0.5 and math.isnan(quality["recall_low"]) and math.isnan(quality["precision_high"])
    assert quality["note"] == "no CI (1 group)" and "no CI (1 group)" in calls.boundary_table(calls.checker_quality(pd.DataFrame(rows))).iloc[-1]["recall"]
    # two groups that agree: the CI has zero width, and the text says why instead of showing [1.00, 1.00]
    agree = [_row(g, g, decision=_decision(boundary=("block",))) for g in "ab"]
    quality = _quality(agree)
    assert quality["precision_low"] == quality["precision_high"] == 1.0 and "zero width" in quality["note"]
    cell = calls.boundary_table(calls.checker_quality(pd.DataFrame(agree))).iloc[-1]["precision"]
    assert cell == "1.00 (every task-group resample gives 1.00)"


def test_paired_with_minus_without_claims_on_planted_rows() -> None:
    rows = pd.DataFrame([
        _row("g1", "i1", decision=_decision(boundary=("block",))),  # a boundary block: wrong tool -> abstention
        _row("g1", "i2", decision=_decision(schema="block")),  # a schema block only: the boundary rules alone let it run
        _row("g2", "i3", decision=_decision(boundary=("block",)), after="correct_tool"),  # revised to the correct tool
        _row("g3", "i4", decision=_decision(boundary=("pass",))),
        _row("g4", "i5", decision=_decision(schema="block")),
        _row("g4", "i6", k=0, decision=_decision(boundary=("block",))),  # k = 0: left out
        _row("g4", "i7", config="proc", decision=_decision(boundary=("block",))),  # not BASM: left out
        _row("g3", "i8", bucket="T_ok", decision=_decision(boundary=("pass",)), before="correct_tool")])
    claims = {c.name: c for c in calls.checker_claims(rows, on_block="revise", on_undecided="allow", seed=0)}
    assert set(claims) == {f"{m}_{n}" for m in MODES for n in ("wrong_call_with_g", "wrong_call_boundary_rules", "correct_runnable_with_g")}
    # by hand, T_wrong, per group mean of (with − without): g1 (−1 − 1)/2, g2 −1, g3 0, g4 −1
    assert claims["lenient_wrong_call_with_g"].estimate == pytest.approx((-1 - 1 + 0 - 1) / 4)
    # boundary rules alone: the schema-only blocks keep their outcome without G: g1 (−1 + 0)/2, g2 −1, g3 0, g4 0
    assert claims["lenient_wrong_call_boundary_rules"].estimate == pytest.approx((-0.5 - 1 + 0 + 0) / 4)
    # correct runnable, every bucket: only i3 gains (g2 +1); g3's T_ok call is correct and runnable on both sides
    assert claims["strict_correct_runnable_with_g"].estimate == pytest.approx((0 + 1 + 0 + 0) / 4)
    claim = claims["lenient_wrong_call_with_g"]
    assert (claim.family, claim.alternative, claim.sesoi, claim.unit, claim.n) == ("checker", "less", calls.CHECKER_SESOI, "rate", 4)
    assert "k = 1" in claim.note and "δ = 0.1 for the family" in claim.note
    table = claims_table(list(claims.values()))
    assert set(table["sesoi"]) == {calls.CHECKER_SESOI} and (table["family_size"] == 6).all()
    # under --on-undecided block an undecided boundary rule blocks: the boundary-only outcome follows G's
    undecided = pd.DataFrame([_row("g1", "u", decision=_decision(boundary=("undecided",)), after="abstain")])
    assert calls.boundary_only(undecided, "lenient", "block")["lenient_outcome_after"].tolist() == ["abstain"]
    assert calls.boundary_only(undecided, "lenient", "allow")["lenient_outcome_after"].tolist() == ["wrong_tool"]


def test_coverage_per_dataset_on_a_planted_library(dataset: Path) -> None:
    from types import SimpleNamespace

    from probes.data.dataset import load_dataset
    from probes.data.schema import Skill, ToolUse

    def skill(id: str, applicability: tuple[str, ...], avoidance: tuple[str, ...], risk: tuple[str, ...], recovery: tuple[str, ...]) -> Skill:
        return Skill(id, "Read a file.", ("Call cat.",), (ToolUse("cat"),), applicability, risk, avoidance, recovery, "files")

    planted = [skill("a", ("cd has already run in this conversation.", "The user is happy."), ("Do not call cat twice.",),
                     ("The file is huge.",), ("If cat fails with NOPE, stop.",)),
               skill("b", ("The order ID has the ORD- shop format.",), ("Do not call cat for fun; call cd.",), ("Secrets.", "Logs."), ())]
    table = calls.dataset_coverage({"planted": planted, "empty": []}).set_index(["dataset", "field"])
    # by hand: applicability 2 of 3 parsed (has_run, id_format), avoidance 1 of 2 (alternative: one-way), risk 0 of 3 (no form)
    assert table.loc[("planted", "applicability"), ["conditions", "parsed", "two_way"]].tolist() == [3, 2, 2]
    assert table.loc[("planted", "avoidance"), ["conditions", "parsed", "two_way", "form_alternative"]].tolist() == [2, 1, 0, 1]
    assert table.loc[("planted", "risk"), ["conditions", "parsed"]].tolist() == [3, 0]
    assert table.loc[("planted", "recovery"), ["conditions", "parsed", "form_fails_with"]].tolist() == [1, 1, 1]
    assert table.loc[("empty", "risk"), "conditions"] == 0 and math.isnan(table.loc[("empty", "risk"), "share_parsed"])
    # a run on a dataset that is no bundled one: every bundled dataset and the run's own, under its folder
    run = SimpleNamespace(dataset=load_dataset(dataset))
    libraries = calls.coverage_libraries(run)
    assert list(libraries) == ["basm_probe", "basm_probe_v2", "bfcl", str(dataset)] and calls.dataset_name(run) == str(dataset)
    bundled = calls.dataset_coverage(libraries).set_index(["dataset", "field"])
    assert bundled.loc[(str(dataset), "applicability"), "parsed"] == bundled.loc[("basm_probe", "applicability"), "parsed"]
    # the share the issue reports: the grammar parses 18% of v1's applicability conditions
    assert round(bundled.loc[("basm_probe", "applicability"), "share_parsed"], 2) == 0.18


def test_calls_checker_writes_the_boundary_tables_claims_and_statement(tiny_qwen3_dir: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    from probes.cli.main import main
    from tests.runs import FAST

    fast = [a for a in FAST if a != "--no-figure"]
    assert main(["calls", "--model", str(tiny_qwen3_dir), "--dataset", "basm_probe", "--out", str(tmp_path), *fast, "--checker"]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / tiny_qwen3_dir.name
    quality = pd.read_csv(table_path(out, "calls", "calls_checker_quality"))
    assert {"precision_low", "recall_high", "excluded_k0", "boundary_blocked"} <= set(quality.columns)
    assert (quality["excluded_k0"] > 0).all()  # the k = 0 calls are counted, and left out
    assert set(pd.read_csv(table_path(out, "calls", "calls_checker_rules"))["kind"]) <= {"boundary", "runnable"}
    assert set(pd.read_csv(table_path(out, "calls", "calls_checker_coverage"))["dataset"]) == {"basm_probe", "basm_probe_v2", "bfcl"}
    claims = pd.read_csv(table_path(out, "calls", "calls_claims"))
    assert (claims["family"] == "checker").sum() == 6 and set(claims.loc[claims["family"] == "checker", "sesoi"]) == {calls.CHECKER_SESOI}
    assert "What G's boundary rules achieve" in printed and "No judge ran" in printed and "18% of this dataset's applicability" in printed
    assert (figures_folder(out) / f"{calls.CHECKER_FIGURE}.png").exists()


def test_statement_says_what_g_achieves_and_whether_a_judge_ran() -> None:
    from probes.scoring.checker import grammar_coverage

    rows = pd.DataFrame([_row("a", "x", decision=_decision(boundary=("block",))), _row("b", "y", decision=_decision(boundary=("undecided",))),
                         _row("b", "z", decision=_decision(schema="block"))])
    coverage = grammar_coverage([]).assign(dataset="planted").fillna(0.0)
    summary = calls.CheckerSummary(rows, calls.checker_rates(rows, resamples=20), calls.checker_quality(rows, resamples=50),
                                   calls.checker_rule_counts(rows), coverage, "note", "planted", "revise", "allow", None)
    text = calls.checker_statement(summary)
    assert "BASM: blocked 1 of 3 bad calls" in text and "1 bad calls left undecided (they run under --on-undecided allow)" in text
    assert "schema 1" in text and "No judge ran" in text and "go to the judge or stay undecided" in text
    judged = calls.CheckerSummary(*[getattr(summary, f) for f in ("rows", "rates", "quality", "rules", "coverage", "note", "dataset",
                                                                  "on_block", "on_undecided")], "judge-model")
    assert "Judge: judge-model decided 0" in calls.checker_statement(judged)
    section = calls.checker_section(summary)
    assert text in section and "reported without a claim" in section and "| planted | risk |" in section
