"""Collect every claim README.md and the model card may state into one committed table, ``docs/claims.csv``.

    python docs/claims.py SOURCE [SOURCE ...]   # rewrite docs/claims.csv
    python docs/claims.py --check               # list README / model card estimates that are not rows of it

A SOURCE is a claims table: the ``claims.csv`` that ``basm-probes report`` writes to ``OUT/<model>/`` (give
that folder or the file), or an analysis's own ``<analysis>/<analysis>_claims.csv``. The organism's validation,
``probes/organism/weights/validation.json`` (``basm-probes organism card`` writes it), is always added.
Each row keeps the columns of :data:`probes.scoring.claims.COLUMNS` and its ``source`` (the path given,
or the validation file's path in the repository).

The committed table comes from the runs README quotes (session 41; about 35 min on one thread):

    basm-probes organism card
    O=results/basm-organism
    basm-probes knockout --k 2 --bucket T_wrong; basm-probes repair --bucket T_repair
    basm-probes calls --checker --limit 12 --k-max 2; basm-probes heads --top-n 2 --random-draws 5
    basm-probes linear; basm-probes forks; basm-probes circuit --split eval   # circuit: session 42
    basm-probes looking; basm-probes steer --split eval                      # session 43 (steer: 24 min)
    python docs/claims.py $O/knockout/knockout_claims.csv $O/repair/repair_claims.csv $O/calls/calls_claims.csv \
        $O/heads/heads_claims.csv $O/linear/linear_claims.csv $O/forks/forks_claims.csv $O/circuit/circuit_claims.csv \
        $O/looking/looking_claims.csv $O/steer/steer_claims.csv

``tests/docs/test_readme_claims.py`` reads the documents with :func:`stated_estimates` and checks each
stated estimate with its CI against this table (:func:`unmatched`, :func:`misworded`); the grammar of a
stated estimate and the descriptive marker are in that test's docstring.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from probes.core.files import OutputRoot  # noqa: E402
from probes.reporting.markdown import DESCRIPTIVE_CLOSE, DESCRIPTIVE_OPEN  # noqa: E402
from probes.scoring.claims import COLUMNS, holds  # noqa: E402

TABLE = ROOT / "docs" / "claims.csv"
VALIDATION = ROOT / "probes" / "organism" / "weights" / "validation.json"
DOCUMENTS = (ROOT / "README.md", ROOT / "probes" / "organism" / "weights" / "README.md")
REPORT_TABLE = "claims.csv"  # what `basm-probes report` writes into OUT/<model>/
TABLE_COLUMNS = ["source", *COLUMNS]


class ClaimsSourceError(ValueError):
    """A source that is not a claims table (names the path and the fix)."""


# ------------------------------------------------------------------------------------- the table
def claims_file(path: Path) -> Path:
    """The claims CSV a source names: the file, or a folder's ``claims.csv``."""
    return path / REPORT_TABLE if path.is_dir() else path


def report_claims(path: Path) -> pd.DataFrame:
    """The claims table at ``path``: a claims CSV, or a folder holding ``claims.csv``."""
    path = Path(path)
    file = claims_file(path)
    if not file.is_file():
        raise ClaimsSourceError(f"{path}: no {REPORT_TABLE} there; run `basm-probes report --out OUT` and give OUT/<model> "
                                "(or a claims CSV file)")
    frame = pd.read_csv(file)
    if "n_of" not in frame.columns and "n" in frame.columns:  # written before claims said what n counts: task groups then
        frame["n_of"] = "task groups"
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ClaimsSourceError(f"{file} is not a claims table: it lacks the columns {missing} (claims_table writes them; "
                                "rerun the report with this version)")
    return frame[COLUMNS].assign(source=str(path))[TABLE_COLUMNS]


def validation_claims(path: Path = VALIDATION) -> pd.DataFrame:
    """The organism validation's claims (``validation.json``'s ``claims``)."""
    claims = json.loads(Path(path).read_text(encoding="utf-8"))["claims"]
    frame = pd.DataFrame(claims)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ClaimsSourceError(f"{path} lacks the claim columns {missing}: regenerate it with `basm-probes organism card`")
    source = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return frame[COLUMNS].assign(source=str(source))[TABLE_COLUMNS]


def collect(sources: Sequence[Path], validation: Path = VALIDATION) -> pd.DataFrame:
    """One table: every source's claims, then the validation's (a source given twice is refused: its rows would count twice)."""
    resolved = [claims_file(Path(s)).resolve() for s in sources]
    twice = sorted({str(s) for s, r in zip(sources, resolved) if resolved.count(r) > 1})
    if twice:
        raise ClaimsSourceError(f"{', '.join(twice)} given twice; give each claims table once")
    return pd.concat([*(report_claims(Path(s)) for s in sources), validation_claims(validation)], ignore_index=True)


def write(table: pd.DataFrame, target: Path = TABLE) -> Path:
    return OutputRoot(target.parent).write_table(target.name, table)


# ------------------------------------------------------------------------------------- the documents
NUMBER = r"[+\-−]?\d+(?:\.\d+)?"
# an estimate, an optional % and unit word, then its CI in brackets: "+1.00 [+0.77, +1.24]", "−0.24 logits [−0.38, −0.09]"
STATED = re.compile(rf"(?<![\w.])(?P<estimate>{NUMBER})(?P<percent>%)?(?:\s+(?:logits|nats))?\s*"
                    rf"\[(?P<low>{NUMBER})%?,\s*(?P<high>{NUMBER})%?\]")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*`(])|\n\s*\n|\n\s*(?:[-*|#] )")


@dataclass(frozen=True)
class Stated:
    """An estimate with its CI as a document shows it (the strings as written), the sentence around it."""

    document: str
    line: int
    estimate: str
    low: str
    high: str
    percent: bool
    sentence: str

    def __str__(self) -> str:
        unit = "%" if self.percent else ""
        return f"{self.document}:{self.line}: {self.estimate}{unit} [{self.low}, {self.high}]"


def descriptive_spans(text: str, document: str) -> list[tuple[int, int]]:
    """The character ranges inside descriptive markers; an unclosed or nested marker is an error."""
    spans, start = [], None
    for match in re.finditer(re.escape(DESCRIPTIVE_OPEN) + "|" + re.escape(DESCRIPTIVE_CLOSE), text):
        line = text.count("\n", 0, match.start()) + 1
        if match.group() == DESCRIPTIVE_OPEN:
            if start is not None:
                raise ValueError(f"{document}:{line}: {DESCRIPTIVE_OPEN} inside another; close the first with {DESCRIPTIVE_CLOSE}")
            start = match.end()
        else:
            if start is None:
                raise ValueError(f"{document}:{line}: {DESCRIPTIVE_CLOSE} without an opening {DESCRIPTIVE_OPEN}")
            spans.append((start, match.start()))
            start = None
    if start is not None:
        raise ValueError(f"{document}: {DESCRIPTIVE_OPEN} at line {text.count(chr(10), 0, start) + 1} is never closed")
    return spans


def sentence_at(text: str, position: int) -> str:
    """The sentence (or table cell row, list item) holding ``position``."""
    starts = [0, *(m.end() for m in SENTENCE_END.finditer(text, 0, position))]
    end = SENTENCE_END.search(text, position)
    return text[starts[-1]: end.start() if end else len(text)]


def stated_estimates(text: str, document: str) -> list[Stated]:
    """Every estimate with a CI that ``text`` states outside descriptive markers."""
    skip = descriptive_spans(text, document)
    out = []
    for match in STATED.finditer(text):
        if any(lo <= match.start() < hi for lo, hi in skip):
            continue
        out.append(Stated(document, text.count("\n", 0, match.start()) + 1, match["estimate"], match["low"], match["high"],
                          bool(match["percent"]), sentence_at(text, match.start())))
    return out


def printed(number: float, digits: int) -> str:
    """``number`` as a document prints it at ``digits`` decimals, signed ("−0.000" is "+0.000")."""
    text = f"{number:+.{digits}f}"
    return "+" + text[1:] if float(text) == 0 else text


def shows(number: float, shown: str, scale: float) -> bool:
    """``number`` (×``scale``) printed at ``shown``'s precision is ``shown`` (unicode minus read as "-")."""
    shown = shown.replace("−", "-")
    digits = len(shown.split(".")[1]) if "." in shown else 0
    return math.isfinite(number) and printed(number * scale, digits) == printed(float(shown), digits)


def matches(stated: Stated, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``table`` whose estimate, low and high print as ``stated`` does (a % reads the share ×100)."""
    scale = 100.0 if stated.percent else 1.0
    hit = [shows(r.estimate, stated.estimate, scale) and shows(r.low, stated.low, scale) and shows(r.high, stated.high, scale)
           for r in table.itertuples()]
    return table[hit]


def verdict_phrase(verdict: str) -> str:
    """A verdict's leading words ("not detected", "detectable", "exploratory", "untestable", "holds")."""
    return re.split(r"[:,(]| at α", verdict, maxsplit=1)[0].strip()


def unmatched(stated: Sequence[Stated], table: pd.DataFrame) -> list[Stated]:
    """The stated estimates that are no row of ``table``."""
    return [s for s in stated if not len(matches(s, table))]


def misworded(stated: Sequence[Stated], table: pd.DataFrame) -> list[str]:
    """Stated estimates of claims that do not hold whose sentence does not say so (its verdict's leading
    words, e.g. "not detected", are not in it): the document words them as holding."""
    out = []
    for s in stated:
        rows = matches(s, table)
        if not len(rows) or any(holds(v) for v in rows["verdict"]):
            continue
        phrases = sorted({verdict_phrase(v) for v in rows["verdict"]})
        sentence = " ".join(s.sentence.split()).lower()  # a phrase may wrap over lines
        if not any(p.lower() in sentence for p in phrases):
            out.append(f"{s}: verdict {' / '.join(repr(v) for v in rows['verdict'])}, but its sentence does not say "
                       f"{' or '.join(repr(p) for p in phrases)}")
    return out


def check(table: pd.DataFrame, documents: Sequence[Path] = DOCUMENTS) -> list[str]:
    """Every problem of the documents against ``table``: estimates that are no claim, claims worded as holding."""
    problems = []
    for path in documents:
        stated = stated_estimates(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
        problems += [f"{s}: not a row of docs/claims.csv" for s in unmatched(stated, table)]
        problems += misworded(stated, table)
    return problems


def main(argv: Sequence[str]) -> int:
    if list(argv) == ["--check"]:
        problems = check(pd.read_csv(TABLE))
        print("\n".join(problems) or "every stated estimate is a claim of docs/claims.csv, worded as its verdict")
        return 1 if problems else 0
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        table = collect([Path(a) for a in argv])
    except ClaimsSourceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    path = write(table)
    print(f"wrote {path.relative_to(ROOT)}: {len(table)} claims from {len(argv)} tables and the organism validation")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
