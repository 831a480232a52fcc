"""report.md's headline and the console's end (issue 45, item 2): the sentences quote the claims table's cells (trap,
suppression, the boundary knockout against its controls), change when the table changes, and for a run with too few
task groups say it is a smoke test, with the groups a testable run needs computed from the family sizes. No model runs."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probes.analyses.report import groups_needed, headline, print_ending
from probes.scoring.claims import claims_table, effect_claim

RERUN = "basm-probes report --out results"


@functools.cache
def table(groups: int) -> pd.DataFrame:
    """Claims of sweep (trap and suppression at k = 1, 2: a family of 4) and knockout (a family of 3) over ``groups`` task groups."""
    rng = np.random.default_rng(0)
    names = [f"g{i}" for i in range(groups)]

    def values(mean: float) -> np.ndarray:
        return mean + rng.normal(0, 0.3, groups)

    return claims_table([
        effect_claim("sweep", "trap k=1", "trap at 1", values(0.5), names),
        effect_claim("sweep", "trap k=2", "trap at 2", values(1.2), names),
        effect_claim("sweep", "suppression k=1", "suppression at 1", values(-0.4), names, alternative="less"),
        effect_claim("sweep", "suppression k=2", "suppression at 2", values(-1.3), names, alternative="less"),
        effect_claim("knockout", "boundary", "raises", values(0.9), names),
        effect_claim("knockout", "boundary>neutral", "it raises it more than |B| positions of the pool (the whole pool ...); tested once",
                     values(0.8), names),
        effect_claim("knockout", "boundary>procedure", "B raises it more than the procedure-span knockout", values(1.4), names),
    ])


def cells(claims: pd.DataFrame, family: str, name: str) -> list[str]:
    """The cells a sentence quotes (an untestable verdict in one word: the smoke-test sentence says why)."""
    row = claims[(claims["family"] == family) & (claims["name"] == name)].iloc[0]
    verdict = "untestable here" if row["verdict"].startswith("untestable at") else row["verdict"]
    return [f"{row['estimate']:+.2f}", f"{row['low']:+.2f}", f"{row['high']:+.2f}", verdict]


def test_the_headline_quotes_the_cells_of_the_claims_it_names_and_follows_them() -> None:
    claims = table(4)
    trap, suppression, knockout, smoke = headline(claims, rerun=RERUN, available=10)
    assert trap.startswith("Retrieval trap: on T_wrong items at k = 2") and all(c in trap for c in cells(claims, "sweep", "trap k=2"))
    assert all(c in suppression for c in cells(claims, "sweep", "suppression k=2"))
    assert not any(c in trap + suppression for c in cells(claims, "sweep", "trap k=1")[:3])  # the deepest k, not the first
    for name in ("boundary", "boundary>neutral", "boundary>procedure"):
        assert all(c in knockout for c in cells(claims, "knockout", name)), name
    assert "more than |B| positions of the pool by" in knockout and "more than the procedure-span knockout by" in knockout
    # 4 groups: floor 1/16, 0.25 after Holm over the sweep's 4; 4/2^7 < 0.05 ≤ 4/2^6, so 7 groups are needed
    assert smoke == ("This run is a smoke test: with 4 task groups the smallest p a claim can reach is 0.0625 (0.25 after Holm over "
                     f"4 claims), so none can reach p < 0.05. A run with at least 7 task groups per bucket can (this dataset holds 10 "
                     f"T_wrong task groups): `{RERUN}`.")
    edited = claims.copy()  # table() is cached: edit a copy
    row = (edited["family"] == "sweep") & (edited["name"] == "trap k=2")
    edited.loc[row, "estimate"] = 3.21
    assert headline(edited, rerun=RERUN, available=10)[0] != trap and "+3.21 logits" in headline(edited, rerun=RERUN, available=10)[0]
    assert "too few: add items of more task groups" in headline(claims, rerun=RERUN, available=5)[-1]


def test_a_run_with_enough_groups_is_no_smoke_test_and_the_floor_is_computed() -> None:
    sentences = headline(table(9), rerun=RERUN)
    assert len(sentences) == 3 and not any("smoke test" in s for s in sentences)
    assert [groups_needed(m) for m in (1, 2, 4, 8)] == [5, 6, 7, 8]  # the smallest n with 2^-n · m < 0.05
    one = headline(table(1), rerun=RERUN)  # one task group: no CI, no p; Holm would correct over the sweep's 4 claims
    assert "(no CI: 1 task groups; not tested: 1 task groups)" in one[0]
    assert one[-1].startswith("This run is a smoke test: with 1 task group the smallest p a claim can reach is 0.5 (2 after Holm over 4")
    assert headline(table(4)[lambda t: t["family"] == "other"], rerun=RERUN) == [
        "None of sweep, suppression or knockout ran: no headline estimate (see the sections below)."]


def test_the_console_ends_with_the_headline_and_where_each_output_is(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "fig02_retrieval_trap.png").write_bytes(b"png")
    lead = headline(table(4), rerun=RERUN, available=10)
    print_ending(lead, tmp_path, ["sweep", "knockout"], tmp_path / "figures", tmp_path / "report.md", [tmp_path / "explore.html"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-10:] == ["[report] headline:", *["  " + s.replace("`", "") for s in lead], "[report] where:",
                          f"  rows and tables  {tmp_path}/<analysis>/  (sweep, knockout)",
                          f"  figures          {tmp_path}/figures/  (1 figure)",
                          f"  report           {tmp_path}/report.md  (claims: {tmp_path}/claims.csv)",
                          f"  page             {tmp_path}/explore.html"]
