"""``explore``: one self-contained ``explore.html`` per results folder, to look at a run in a browser.

Six views, drawn by one Jinja2 template (``templates/explore.html.j2``; every script and style
inline, no network); the view, record, head, knockout and colour scale live in the address
(``#view=prompt&record=…&head=L1H2&knockout=boundary&scale=p99&pattern=L0H1``), so a view can be shared:

- **prompt**: opens on the first record (a knocked T_wrong one) scrolled to its deciding row, an overview
  strip above it holding the whole prompt (P, B, the attention, the deciding row; a click jumps), "jump to"
  buttons (deciding row, B, P, the tool call) and a record search (id, item or prompt text). Each token is
  shaded by the attention it receives from the deciding row (mean over heads, one layer, or one (layer,
  head)) on a colour scale stated in its legend: per view, full colour at the 99th percentile (or the
  largest) of the weights after token 0; tooltips name the token (``token 323 "get": attention 0.0002``).
  Beside it: the candidates at the deciding row sorted by logit, with their probability (softmax over the
  whole vocabulary), the one the model takes among them and the correct one flagged; the recorded margins;
  the knockouts under the knockout tables' names (``boundary``, ``random``, ``count_pool`` …, each draw
  listed under its control), where choosing one shows the candidates after it and, for the named knockouts
  and draw 0 of each control, the deciding-row attention after it (:func:`knocked_views`); the steered
  conditions beside the clean run (:func:`steer_view`); and the rows every other analysis recorded for it;
- **Proc. Skill | BASM**: the two prompts of the record's item, k and format side by side, each at its
  deciding row, shaded by the same head choice, each with its candidates;
- **pattern**: a token × token attention pattern of one head (or a mean): the prompt's last
  ``pattern_rows`` rows (the request's end and the forced tool-call prefix, the decision row last) × every
  key, for the first ``pattern_records`` records only (each costs ``pattern_rows`` times its deciding row's
  attention; the full n × n pattern is never materialised: one engine call records those rows);
- **heads**: the per-head grids of ``heads`` (log2 B/P on T_wrong, the T_ok → T_wrong shift), each with a
  diverging colour legend, the split-half ranking and its causal top-N test; a click on a head shades the
  prompt view by it;
- **run**: the run's provenance (report.md's header), its figures, the claims table, and Fig. 2's
  and Fig. 6's cells as item lists linked to the prompt view;
- **circuit**: each circuit graph of the folder (``circuit_graph_<config>_<pair>.json``, written by
  the circuit analysis; :mod:`probes.reporting.circuit_graph`) drawn as a graph: the source spans, the
  embedding, then per layer its heads and MLP (coloured by DLA); an edge per (head, source span),
  coloured by span, as wide as its |score|, the circuit's edges drawn solid and on top; a click on a
  head shades the graph's prompt by that head's deciding-row attention (stored quantised, as the
  records' is).

Every analysis of the catalogue with per-record results (rows holding ``record_id``) can be opened: its
records are shown (rebuilt with its recorded options: its results header) and its rows listed with each
record. The attention is the engine's full softmax row at the deciding row
(:func:`probes.analyses.knockout.deciding_ids`), recomputed for the records shown: the knocked records
first, then the others', at most ``records`` and within ``max_mb``, stored quantised (``precision``).

The page sits above the analyses (it rebuilds their runs and reads their rows with their helpers);
the catalogue ignores this module, which registers no analysis. Its template ships with the
presentation assets of :mod:`probes.reporting` (``probes/reporting/templates/``).
"""

from __future__ import annotations

import base64
import html
import json
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import numpy as np
import pandas as pd
from scipy.special import logsumexp

from probes import analyses as registry
from probes.analyses.option_system import Options, RunOptions, option, option_fields, shared
from probes.analyses.run_context import AnalysisError, RunContext, default_model, model_label, open_context
from probes.analyses import steer
from probes.analyses.knockout import (control_of, deciding_ids, deltas_per_record, draw_of, knocked_configs, layer_windows,
                                      record_knockouts)
from probes.core.files import make_folder, write_text
from probes.core.text import visible
from probes.data.schema import BOUNDARY_SLOTS
from probes.engine.session import EngineSession, Knockout
from probes.engine.threads import keeps_caller_threads
from probes.prompts.record import PromptRecord, record_parts
from probes.reporting.circuit_graph import GRAPH_GLOB, check_graph, read_circuit_graph
from probes.reporting.finished import FinishedRun, load, read_table
from probes.reporting.layout import CLAIMS, PAGE, REPORT, analysis_folder, check_layout, figures_folder
from probes.scoring.controls import tool_names_of

NAME = "explore"
SHOWN = ("sweep", "knockout", "heads", "steer")  # the analyses whose rows the page draws
PRECISIONS = {"uint16": np.uint16, "uint8": np.uint8}  # attention stored as round(a · max), a ∈ [0, 1]
DEFAULT_RECORDS = 100
DEFAULT_MAX_MB = 20.0
DEFAULT_PATTERN_ROWS = 32  # the request's end and the forced tool-call prefix of a native prompt
DEFAULT_PATTERN_RECORDS = 2  # the first records shown (the opening one first): each costs pattern_rows × its own attention
SPAN_NAMES = ("procedure", "boundary")
TEMPLATE = "explore.html.j2"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")  # looked up on the PATH, in this order
INSTALL = "pip install playwright, then `python -m playwright install chromium` (or a system Chromium: `apt-get install -y chromium`)"
# headless, offline and quiet: no GPU, no background fetches (the page is opened with the network off)
BROWSER_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run")
VIEWS = ("prompt", "heads", "run", "circuit")


@dataclass(kw_only=True)
class ExploreOptions(Options):
    """Write OUT/<model>/explore.html: prompts with their spans and deciding-row attention, heads and knockouts, offline."""

    name: ClassVar[str] = NAME

    out: str | Path = shared(RunOptions, "out", help="results folder; reads and writes OUT/<model>/")
    model: str | Path | None = shared(RunOptions, "model")
    device: str = shared(RunOptions, "device", help="torch device the deciding rows are recomputed on (the dtype is the run's)")
    records: int = option(DEFAULT_RECORDS, "records whose deciding-row attention the page stores (the knocked records first, then "
                          "the sweep's)", type=int, minimum=1)
    precision: str = option("uint16", "how the attention weights are stored: uint16 (step 1/65535) or uint8 (step 1/255)",
                            choices=tuple(PRECISIONS))
    max_mb: float = option(DEFAULT_MAX_MB, "size cap of the page (MB): records past it are left out, and the page says how many",
                           type=float, minimum=0.1)
    pattern_rows: int = option(DEFAULT_PATTERN_ROWS, "rows of the token × token attention pattern (the prompt's last rows, the decision "
                               "row last; every key)", type=int, minimum=1)
    pattern_records: int = option(DEFAULT_PATTERN_RECORDS, "records that store the pattern (the first shown: each costs pattern_rows times "
                                  "its deciding row's attention)", type=int, minimum=0)
    screenshots: str | Path | None = option(None, "also save the prompt and heads views as PNGs in this folder (README's; needs "
                                            "playwright and a Chromium)", type=Path)


def explore(session: EngineSession | None = None, **options: Any) -> Path:
    """Write ``OUT/<model>/explore.html`` from the results there (``sweep``, ``knockout``, ``heads``;
    the figures, ``claims.csv`` and ``report.md``'s header when present); keyword ``options``:
    :class:`ExploreOptions`. ``session``: the loaded model (else loaded as the run recorded it)."""
    return write_explore(registry.make(ExploreOptions, options), session)


# ----------------------------------------------------------------------------- records
def run_context(run: FinishedRun, options: ExploreOptions, model: str | Path, session: EngineSession | None) -> RunContext:
    """The context an analysis ran in, rebuilt from its results header (its builder, dataset and
    items), on ``session`` (else loaded with the run's dtype on ``options.device``)."""
    cls = registry.get(run.name)
    names = {f.name for f in option_fields(cls)}
    recorded = {k: v for k, v in run.config.get("options", {}).items() if k in names}
    if session is not None:  # the session's own dtype, device and backend are what ran
        recorded = {k: v for k, v in recorded.items() if k not in ("dtype", "device", "device_map", "backend")}
    else:
        recorded["device"] = options.device
    if "threads" in run.config:  # the count the run computed on (recorded as resolved, not among the options)
        recorded["threads"] = run.config["threads"]
    analysis = registry.make(cls, {**recorded, "model": model, "out": options.out})
    return open_context(analysis, session)


def token_pieces(record: PromptRecord) -> list[str]:
    """The prompt text cut at the tokens' end offsets: piece i runs from token i − 1's end to token i's,
    so the pieces join to the text exactly (a leading space stays with its token)."""
    if record.offsets is None:
        raise ValueError(f"{record.record_id}: no character offsets (a record read from JSON): rebuild it with the builder")
    ends = [int(e) for e in record.offsets[:, 1]]
    starts = [0, *ends[:-1]]
    pieces = [record.text[a:b] for a, b in zip(starts, ends)]
    pieces[-1] += record.text[ends[-1]:]
    return pieces


def quantise(attention: np.ndarray, precision: str) -> tuple[str, float]:
    """(base64 of the little-endian integers round(a · top), 1 / top): what the page decodes."""
    dtype = PRECISIONS[precision]
    top = np.iinfo(dtype).max
    q = np.rint(np.clip(attention, 0.0, 1.0) * top).astype(np.dtype(dtype).newbyteorder("<"))
    return base64.b64encode(q.tobytes()).decode("ascii"), 1.0 / top


def dequantise(encoded: str, scale: float, precision: str, shape: tuple[int, ...]) -> np.ndarray:
    """The weights as the page reads them back (tests compare the DOM against this)."""
    dtype = np.dtype(PRECISIONS[precision]).newbyteorder("<")
    return np.frombuffer(base64.b64decode(encoded), dtype=dtype).astype(np.float64).reshape(shape) * scale


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


STEER_MEASURES = ("margin_tool_choice", "margin_eq1", "margin_first_token", "margin_path", "call_logodds", "kl_clean")


def steer_view(steered: pd.DataFrame, record_id: str) -> dict[str, Any] | None:
    """The steer rows of ``record_id`` as the prompt view lists them (None: the record was not steered): its
    clean run, then per steered layer window the headline cell (``steer.HEADLINE_DIRECTION`` at
    ``steer.HEADLINE_ALPHA``, decision rows) and, at the same layers, α and rows, the random draws with the lowest
    margin (the best: α > 0 is oriented toward the correct tool) and the highest (the worst); each with its top
    action, margin, Δm against the clean run, every margin variant and KL(clean ‖ steered)."""
    mine = steered[steered["record_id"] == record_id]
    if mine.empty:
        return None
    cleans = mine[mine["condition"] == "baseline"]
    if len(cleans) != 1:  # the steer rows hold one clean run per record: Δm is read against it
        raise AnalysisError(f"steer rows of {record_id}: {len(cleans)} clean (baseline) rows, expected 1: steer.jsonl is damaged or "
                            "mixes runs; rerun `basm-probes steer` with --overwrite")
    clean = cleans.iloc[0]

    def entry(kind: str, row: pd.Series, layers: str) -> dict[str, Any]:
        return {"kind": kind, "condition": row["condition"], "layers": layers, "top_action": row["top_action"], "top_role": row["top_role"],
                "margin": _finite(row["margin"]), "delta": _finite(row["margin"] - clean["margin"]),
                **{name: _finite(row[name]) for name in STEER_MEASURES}}

    cell = mine[(mine["alpha"] == steer.HEADLINE_ALPHA) & (mine["rows_mode"] == "decision")]
    rows = [entry("clean", clean, "")]
    for (layer, window), at in cell.groupby(["layer", "window"], sort=True):
        layers = f"L{layer}" if window == 1 else f"L{layer}–{layer + window - 1}"
        rows += [entry("headline", r, layers) for _, r in at[at["direction"] == steer.HEADLINE_DIRECTION].iterrows()]
        draws = at[at["direction"] == "random"]
        if len(draws):
            rows += [entry("best random", draws.loc[draws["margin"].idxmin()], layers),
                     entry("worst random", draws.loc[draws["margin"].idxmax()], layers)]
    draws = cell.loc[cell["direction"] == "random", "draw"].nunique()
    note = (f"clean run, then per layer: {steer.HEADLINE_DIRECTION} at α = {steer.HEADLINE_ALPHA:g} (decision rows) and the random "
            f"draws with the lowest and the highest margin at the same α ({draws} draws); margin variant {clean['margin_variant']}")
    if len(rows) == 1:
        note = f"steered, but at no condition with α = {steer.HEADLINE_ALPHA:g} at decision rows: only the clean run is listed"
    return {"note": note, "rows": rows}


def candidate_rows(record: PromptRecord, logits: np.ndarray, depth: int) -> list[dict[str, Any]]:
    """The record's candidates at the deciding row, sorted by logit (highest first): each with its token there,
    logit and probability (softmax over the whole vocabulary), ``chosen`` on the highest (the one the model takes
    among them) and ``correct`` on the correct action. A candidate whose name parts from the correct one's before
    the deciding row has no token there: listed last, without a logit."""
    log_z = float(logsumexp(logits.astype(np.float64)))
    correct = record.candidate("correct")
    prefix = list(correct.token_ids[:depth]) if correct is not None and depth else []
    out = []
    for c in record.candidates:  # a candidate's token at the deciding row exists when it shares the correct name's prefix
        predicted = len(c.token_ids) > depth and list(c.token_ids[:depth]) == prefix
        logit = float(logits[c.token_ids[depth]]) if predicted else None
        out.append({"role": c.role, "action": c.action, "text": c.text, "token": int(c.token_ids[depth]) if predicted else None,
                    "logit": logit, "prob": float(np.exp(logit - log_z)) if predicted else None, "correct": c.role == "correct",
                    "chosen": False})
    out.sort(key=lambda c: (c["logit"] is None, -(c["logit"] or 0.0)))
    if out and out[0]["logit"] is not None:
        out[0]["chosen"] = True
    return out


def pattern_window(record: PromptRecord, rows: int) -> list[int]:
    """The query rows of the token × token pattern: the prompt's last ``rows`` rows (the request's end and the
    forced tool-call prefix, the decision row last)."""
    return list(range(max(0, record.n_tokens - rows), record.n_tokens))


def knocked_views(ctx: RunContext, record: PromptRecord, knockouts: Sequence[Knockout], options: ExploreOptions) -> dict[str, dict[str, Any]]:
    """Per knockout: the candidates at the deciding row after it and, for the named knockouts and the first draw
    of each control (:func:`stores_attention`), the quantised deciding-row attention after it. The engine call
    blocks the rows the knockout analysis blocked: its query rows run from the tool call's open row to the
    deciding row (the correct name's shared prefix appended), so a ``path`` knockout blocks them all."""
    ids, row, depth = deciding_ids(record)
    query = sorted(set(record.query_rows) | set(range(record.decision_index, row + 1)))
    stored = [k for k in knockouts if stores_attention(k.name)]
    rest = [k for k in knockouts if not stores_attention(k.name)]
    out: dict[str, dict[str, Any]] = {}
    for group, record_rows in ((stored, True), (rest, False)):
        if not group:
            continue
        results = ctx.session.run(ids, query, conditions=group, record_rows=record_rows).conditions[1:]
        for k, result in zip(group, results):
            view: dict[str, Any] = {"candidates": candidate_rows(record, result.logits_at(row).float().numpy(), depth), "attention": None}
            if record_rows:
                view["attention"] = quantise(result.rows[:, :, -1, : record.n_tokens].float().numpy(), options.precision)[0]
            out[k.name] = view
    return out


def stores_attention(condition: str) -> bool:
    """Whether the page stores the deciding-row attention after this knockout: the named ones (boundary,
    procedure, the layer windows) and draw 0 of each control; the other draws keep their candidates only
    (each stored one costs as much as the record's own attention)."""
    return draw_of(condition) <= 0


IDENTITY = ("record_id", "item_id", "bucket", "domain", "task_group", "config", "k", "format", "retrieval_mode", "tempting_rank",
            "tempting_shown_rank", "tempting_shown")
ROWS_PER_RECORD = 40  # an analysis's rows listed per record (steer's and knockout's run to hundreds: their views summarise them)


def cell_text(value: Any) -> str | float | None:
    """One field of a results row as the page lists it: numbers as numbers, lists and tables by their length."""
    if isinstance(value, list | tuple | dict | np.ndarray):
        return f"[{len(value)} values]"
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | float | np.integer | np.floating):
        return _finite(value)
    return None if value is None else str(value)


class RowsByRecord:
    """An analysis's rows, found by record id: indexed once (a filter of every frame per record cost 1.7 s of
    ``report --quick``)."""

    def __init__(self, rows: pd.DataFrame) -> None:
        self.rows = rows
        self._positions = rows.groupby("record_id", sort=False).indices

    def table(self, record_id: str) -> dict[str, Any] | None:
        """The rows of ``record_id`` as a table: their fields (the record's identity left out) by row, at most
        :data:`ROWS_PER_RECORD` rows, the rest counted."""
        positions = self._positions.get(record_id)
        if positions is None:
            return None
        mine = self.rows.iloc[positions]
        columns = [c for c in mine.columns if c not in IDENTITY]
        shown_rows = mine.head(ROWS_PER_RECORD)
        return {"columns": columns, "rows": [[cell_text(v) for v in r] for r in shown_rows[columns].itertuples(index=False)],
                "left_out": len(mine) - len(shown_rows)}


def record_view(ctx: RunContext, record: PromptRecord, options: ExploreOptions, rows: pd.DataFrame,
                knocked: pd.DataFrame | None, knockout_options: Any, steered: pd.DataFrame | None = None,
                others: Mapping[str, RowsByRecord] | None = None, pattern: bool = False) -> dict[str, Any]:
    """One record as the page draws it: tokens, spans, query rows, candidates at the deciding row (sorted, with
    probabilities, the chosen and the correct one flagged), the recorded margins, the quantised deciding-row
    attention, the knockouts (each with its candidates and, where stored, its attention after it), from
    ``steered`` (the steer rows) the steered conditions beside the clean run, the rows of the ``others``
    analyses and, with ``pattern``, the token × token attention of the prompt's last ``pattern_rows`` rows."""
    ids, row, depth = deciding_ids(record)
    window = pattern_window(record, options.pattern_rows) if pattern else []
    query = sorted({min(record.query_rows), row, *window})  # the deciding row is the last: it is at or after the prompt's end
    result = ctx.session.run(ids, query, record_rows=True).conditions[0]
    attention = result.rows[:, :, -1, : record.n_tokens].float().numpy()
    encoded, scale = quantise(attention, options.precision)
    baseline = rows[(rows["record_id"] == record.record_id) & (rows["condition"] == "baseline")]
    margins = {}
    if len(baseline):
        first = baseline.iloc[0]
        margins = {name: _finite(first[name]) for name in ("margin", "margin_eq1", "margin_first_token", "margin_path", "call_logodds")
                   if name in first}
    knockouts = []
    if knocked is not None and knockout_options is not None:
        windows = layer_windows(ctx.session.n_layers, knockout_options.layer_window) if knockout_options.layer_window else []
        mine = knocked[knocked["record_id"] == record.record_id].set_index("condition")
        conds, _ = record_knockouts(record, attention, knockout_options, tool_names_of(ctx.dataset), windows)
        after = knocked_views(ctx, record, conds, options)
        base = mine["margin"].get("baseline", np.nan)
        for k in conds:
            delta = mine["margin"].get(k.name, np.nan) - base
            knockouts.append({"name": k.name, "control": control_of(k.name), "draw": draw_of(k.name), "delta": _finite(delta),
                              "positions": list(k.key_positions), "layers": list(k.layers) if k.layers is not None else None,
                              **after[k.name]})
    stored_pattern = None
    if window:
        at = [query.index(r) for r in window]
        stored_pattern = {"rows": window, "attention": quantise(result.rows[:, :, at, : record.n_tokens].float().numpy(), options.precision)[0]}
    return {
        "id": record.record_id, "item": record.item_id, "bucket": record.bucket, "config": record.config, "k": record.k,
        "format": record.format, "correct": record.correct_action, "wrong": list(record.wrong_tools),
        "tokens": token_pieces(record), "spans": {name: [list(s) for s in record.spans.get(name, [])] for name in (*SPAN_NAMES, *BOUNDARY_SLOTS)},
        "query_rows": list(record.query_rows), "decision_index": record.decision_index, "deciding_row": row, "deciding_depth": depth,
        "candidates": candidate_rows(record, result.logits_at(row).float().numpy(), depth), "margins": margins,
        "margin_variant": str(baseline.iloc[0]["margin_variant"]) if len(baseline) else "",
        "attention": encoded, "scale": scale, "shape": list(attention.shape), "knockouts": knockouts,
        "steer": steer_view(steered, record.record_id) if steered is not None else None, "pattern": stored_pattern,
        "analyses": {name: table for name, other in (others or {}).items() if (table := other.table(record.record_id))},
    }


def chosen_records(runs: dict[str, FinishedRun]) -> list[tuple[str, str]]:
    """(analysis, record id) of every record the page can show, in the order they are kept: item by
    item (the knocked items first, T_wrong before T_ok), each item's knocked records, then its records
    of the other analyses (:data:`SHOWN`'s first, then ``runs``' order) by configuration and k, each record
    under the first analysis holding it. An item's prompts share their prefix, which the engine then
    computes once (``prefix_cache``)."""
    found = []  # (item, analysis rank, knocked?, bucket, config, k, analysis, record id)
    order = [*(n for n in SHOWN if n in runs), *(n for n in runs if n not in SHOWN)]
    for rank, name in enumerate(order):
        rows = runs[name].rows
        base = rows[rows["condition"] == "baseline"] if "condition" in rows else rows
        for r in base[["record_id", "item_id", "bucket", "config", "k"]].drop_duplicates("record_id").itertuples():
            found.append((r.item_id, rank, name == "knockout" and r.config != "proc", r.bucket, r.config, int(r.k), name, r.record_id))
    knocked = {f[0] for f in found if f[2]}
    found.sort(key=lambda f: (f[0] not in knocked, f[3] != "T_wrong", f[0], not f[2], f[1], f[4], f[5]))
    out: dict[str, str] = {}
    for f in found:
        out.setdefault(f[7], f[6])
    return [(name, record_id) for record_id, name in out.items()]


def finished_runs(out_dir: Path) -> dict[str, FinishedRun]:
    """Every analysis of the catalogue with per-record results in ``out_dir`` (rows holding ``record_id``), in
    report order, read through :func:`~probes.reporting.finished.load` (which knows the folder's layout)."""
    runs = {}
    for name in registry.catalogue():
        try:
            run = load(out_dir, name)
        except FileNotFoundError:  # not run in this folder
            continue
        if "record_id" in run.rows:
            runs[name] = run
    return runs


# ----------------------------------------------------------------------------- the other views
def table_html(table: pd.DataFrame, digits: int = 3) -> str:
    return table.round(digits).to_html(index=False, border=0, classes="table", na_rep="—") if len(table) else "<p>none</p>"


def sweep_cells(run: FinishedRun) -> list[dict[str, Any]]:
    """Fig. 2's points (configuration × k on T_wrong, value and CI from ``sweep_summary.csv``), each
    with the items behind it and their margins."""
    summary = run.tables.get("sweep_summary", pd.DataFrame())
    rows = run.rows[run.rows["condition"] == "baseline"]
    cells = []
    for r in summary.itertuples():
        sub = rows[(rows["bucket"] == r.bucket) & (rows["config"] == r.config) & (rows["k"] == r.k)]
        cells.append({"bucket": r.bucket, "config": r.config, "k": int(r.k), "value": _finite(r.value), "low": _finite(r.low),
                      "high": _finite(r.high), "n": int(r.n),
                      "items": [{"record": s.record_id, "item": s.item_id, "value": _finite(s.margin)} for s in sub.itertuples()]})
    return cells


def knockout_cells(run: FinishedRun) -> list[dict[str, Any]]:
    """Fig. 6's points (knockout × bucket, BASM, the wrong-tool margin; value and CI from the
    knockout summary), each with the records behind it and their Δm (random draws averaged)."""
    summary = run.summary_table
    summary = summary[(summary["measure"] == "margin") & (summary["config"] == "basm")]
    per, _points, _dropped, _excluded = deltas_per_record(run.rows)
    per = per[per["measure"] == "margin"]
    cells = []
    for r in summary.itertuples():
        sub = per[(per["config"] == r.config) & (per["bucket"] == r.bucket) & (per["knockout"] == r.knockout)]
        cells.append({"knockout": r.knockout, "bucket": r.bucket, "value": _finite(r.value), "low": _finite(r.low),
                      "high": _finite(r.high), "n": int(r.n),
                      "items": [{"record": s.record_id, "item": s.item_id, "value": _finite(s.delta)} for s in sub.itertuples()]})
    return cells


def heads_view(run: FinishedRun) -> dict[str, Any]:
    """The per-head grids (log2 B/P on T_wrong over every item, as Fig. 8; the T_ok → T_wrong shift on
    the ranking half, as Fig. 9 ranks), with the items behind each, and the ranking and causal tables."""
    from probes.analyses.heads import bucket_rows, log2_map

    rank = run.tables["heads_ranking"]
    layers, heads = int(rank["layer"].max()) + 1, int(rank["head"].max()) + 1
    shift = np.full((layers, heads), np.nan)
    shift[rank["layer"], rank["head"]] = rank["shift"]
    ranked = np.zeros((layers, heads), dtype=bool)
    ranked[rank["layer"], rank["head"]] = rank["ranked"].astype(bool)
    log2 = log2_map(run.rows, "T_wrong")
    first = rank.iloc[0]

    def grid(values: np.ndarray) -> list[list[float | None]]:
        return [[_finite(v) for v in row] for row in values]

    causal = run.tables.get("heads_causal_summary", pd.DataFrame())
    return {"layers": layers, "heads": heads, "log2": grid(log2), "log2_n": int(bucket_rows(run.rows, "T_wrong")["item_id"].nunique()),
            "shift": grid(shift), "ranked": ranked.tolist(), "shift_n": f"{int(first.n_ok)} T_ok + {int(first.n_wrong)} T_wrong items",
            "ranking": table_html(rank.head(10)), "causal": table_html(causal)}


def circuit_graphs_of(out_dir: Path, graphs: Sequence[Mapping[str, Any] | str | Path] | None) -> list[dict[str, Any]]:
    """The circuit graphs the page draws, each checked (:func:`~probes.reporting.circuit_graph.check_graph`):
    ``graphs`` (graph dicts or graph files), else every ``circuit_graph_*.json`` in ``out_dir``'s circuit folder."""
    if graphs is None:
        graphs = sorted(analysis_folder(out_dir, "circuit").glob(GRAPH_GLOB))
    return [check_graph(g) if isinstance(g, Mapping) else read_circuit_graph(g) for g in graphs]


def circuit_view(graph: Mapping[str, Any], precision: str) -> dict[str, Any]:
    """A circuit graph as the page stores it: its heads' attention [head, token] (heads in ``attention_heads``
    order) quantised as the records' is (:func:`quantise`): a real model's graph holds layers × heads × tokens weights."""
    heads = list(graph["attention"])
    encoded, scale = quantise(np.array([graph["attention"][h] for h in heads], dtype=np.float64), precision)
    return {**graph, "attention": encoded, "scale": scale, "attention_heads": heads}


def provenance_lines(out_dir: Path, runs: dict[str, FinishedRun]) -> list[str]:
    """report.md's header lines, else each analysis's recorded configuration."""
    report = out_dir / REPORT
    if report.is_file():
        lines = report.read_text(encoding="utf-8").split("## Claims")[0].splitlines()
        return [line.removeprefix("- ").replace("**", "").replace("`", "") for line in lines if line.startswith("- ")]
    return [f"{name}: " + json.dumps({k: v for k, v in run.config.items() if k != "options"}, default=str) for name, run in runs.items()]


def figure_uris(figures_dir: Path) -> list[dict[str, str]]:
    return [{"name": p.stem, "uri": "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode("ascii")}
            for p in sorted(figures_dir.glob("*.png"))]


# ----------------------------------------------------------------------------- the page
def shown(value: Any) -> Any:
    """``value`` (the page's data) with every string made :func:`~probes.core.text.visible`: the page
    draws hidden code points (a right-to-left override, a zero-width space) as marks."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {shown(k): shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shown(v) for v in value]
    return value


def script_json(data: Any) -> str:
    """``data`` as JSON that cannot end or change the ``<script>`` element holding it: every ``<``, ``>``
    and ``&`` written as a ``\\u`` escape (so no ``</script>``, ``<!--`` or ``<script`` from an item id or a
    path), and, by ``ensure_ascii``, every other non-ASCII character too (U+2028 and U+2029 included)."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"), ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(data: dict[str, Any]) -> str:
    """The page: the template around ``data``, every text of it :func:`shown`; the template escapes what it
    writes into HTML, and the data script is :func:`script_json`."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("probes.reporting", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    data = shown(data)
    return env.get_template(TEMPLATE).render(data=data, payload=script_json(data))


@keeps_caller_threads  # the runs' contexts set their thread count (open_context); the caller's is back on return
def write_explore(options: ExploreOptions, session: EngineSession | None = None, figures_dir: Path | None = None,
                  circuit_graphs: Sequence[Mapping[str, Any] | str | Path] | None = None) -> Path:
    """:func:`explore` on checked options; ``figures_dir``: where the run's figures are (default OUT/<model>/figures);
    ``circuit_graphs``: the circuit view's graphs, dicts or files (default: every ``circuit_graph_*.json`` in OUT/<model>/circuit/)."""
    start = time.perf_counter()
    model = options.model if options.model is not None else (session.model.name_or_path if session is not None else default_model())
    out_dir = check_layout(Path(options.out) / model_label(model))
    runs = finished_runs(out_dir)
    circuits = circuit_graphs_of(out_dir, circuit_graphs)
    if not runs and not circuits:
        raise AnalysisError(f"{out_dir}: no results of any analysis with per-record rows and no {GRAPH_GLOB} to explore (run `basm-probes report`, "
                            f"circuit or one of the others with --out {options.out})")
    contexts: dict[str, RunContext] = {}

    def context(name: str) -> RunContext:  # the analyses whose records are shown, rebuilt as they ran, the session shared
        nonlocal session
        if name not in contexts:
            contexts[name] = run_context(runs[name], options, model, session)
            session = contexts[name].session
        return contexts[name]

    kopts = context("knockout").options if "knockout" in runs else None
    knocked = runs["knockout"].rows if "knockout" in runs else None
    others = {name: RowsByRecord(run.rows) for name, run in runs.items() if name not in SHOWN}
    claims = out_dir / CLAIMS
    data: dict[str, Any] = {
        "model": str(model), "out_dir": str(out_dir), "analyses": list(runs), "provenance": provenance_lines(out_dir, runs),
        "precision": options.precision, "figures": figure_uris(figures_dir or figures_folder(out_dir)),
        "claims": table_html(read_table(claims)) if claims.is_file() else "",
        "sweep": sweep_cells(runs["sweep"]) if "sweep" in runs else [],
        "knockout": knockout_cells(runs["knockout"]) if "knockout" in runs else [],
        "heads_view": heads_view(runs["heads"]) if "heads" in runs and "heads_ranking" in runs["heads"].tables else None,
        "circuits": [circuit_view(g, options.precision) for g in circuits], "pattern_records": options.pattern_records,
    }
    # the page is the template (~20 kB) around this data: each record's attention scales as layers × heads × tokens
    used = len(render({**data, "records": [], "records_total": 0, "left_out": 0, "layers": 0, "heads": 0}).encode())
    if used > options.max_mb * 1e6:  # the figures and circuit graphs are never left out: the cap cannot hold them
        raise AnalysisError(f"{out_dir}: the page without records (its figures and {len(circuits)} circuit graphs) takes {used / 1e6:.2f} MB, "
                            f"over max_mb = {options.max_mb} MB: raise --max-mb")
    chosen = chosen_records(runs)
    records, left_out = [], []
    for name, record_id in chosen:
        item_id, config, k, fmt = record_parts(record_id)
        if len(records) >= options.records:
            left_out.append(record_id)
            continue
        ctx = context(name)
        items = {item.id: item for item in ctx.items}
        record = ctx.builder.build(items[item_id], config, k, fmt)
        knocks = knocked is not None and name == "knockout" and config in knocked_configs(kopts.priming)
        view = record_view(ctx, record, options, runs[name].rows, knocked if knocks else None, kopts if knocks else None,
                           runs["steer"].rows if "steer" in runs else None, others, pattern=len(records) < options.pattern_records)
        view["analysis"] = name
        size = len(json.dumps(view, separators=(",", ":")).encode())
        if used + size > options.max_mb * 1e6:
            left_out.append(record_id)
            continue
        used += size
        records.append(view)
    if chosen and not records:
        raise AnalysisError(f"{out_dir}: no record fits in max_mb = {options.max_mb} MB beside the figures and circuit graphs: "
                            "raise --max-mb")
    data.update(records=records, records_total=len(chosen), left_out=len(left_out), layers=int(records[0]["shape"][0]) if records else 0,
                heads=int(records[0]["shape"][1]) if records else 0)
    path = out_dir / PAGE
    write_text(path, render(data))
    note = f"; {len(left_out)} more left out (--records {options.records}, --max-mb {options.max_mb:g})" if left_out else ""
    print(f"[explore] wrote {path} ({path.stat().st_size / 1e6:.2f} MB; {len(records)} records with their deciding-row attention, "
          f"{options.precision}{note}; {', '.join(runs) or 'no analysis rows'}; {len(circuits)} circuit graphs) in "
          f"{time.perf_counter() - start:.1f} s")
    if options.screenshots is not None:
        print(f"[explore] screenshots: {', '.join(map(str, screenshot_views(path, Path(options.screenshots))))}")
    return path


# ----------------------------------------------------------------------------- in a browser
def system_chromium() -> str | None:
    """A Chromium on the PATH (:data:`CHROMIUM_NAMES`), else None."""
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def playwright_chromium() -> str | None:
    """The Chromium Playwright installed itself (``python -m playwright install chromium``), else None."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        path = p.chromium.executable_path
    return path if Path(path).is_file() else None


def browser_missing() -> str:
    """Why the page cannot be opened in a headless browser here ("" when it can), naming how to get one."""
    import importlib.util

    if importlib.util.find_spec("playwright") is None:
        return f"playwright is not installed ({INSTALL})"
    if system_chromium() is None and playwright_chromium() is None:
        return f"no Chromium: none of {', '.join(CHROMIUM_NAMES)} on the PATH and none installed by Playwright ({INSTALL})"
    return ""


def launch(playwright: Any) -> Any:
    """Chromium, headless: the one on the PATH, else Playwright's own."""
    return playwright.chromium.launch(executable_path=system_chromium(), args=list(BROWSER_ARGS))


SCREENSHOT_VIEWS = ("prompt", "knockout", "compare", "pattern", "heads")  # "knockout": the prompt view after the boundary knockout


def screenshot_views(page_path: Path, out_dir: Path, views: tuple[str, ...] = SCREENSHOT_VIEWS, browser: Any = None) -> list[Path]:
    """PNGs of ``views`` of an explore page (``explore_<view>.png``), opened from disk with the network off, each
    at the view's address (``#view=…``) on the opening record, as a shared link opens it; ``browser``: a
    Playwright browser already launched (else one is launched, :func:`launch`)."""
    if browser is None:
        if reason := browser_missing():
            raise AnalysisError(f"screenshots: {reason}")
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            launched = launch(p)
            paths = screenshot_views(page_path, out_dir, views, launched)
            launched.close()
        return paths
    make_folder(out_dir)
    paths = []
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    for view in views:
        address = "view=prompt&knockout=boundary" if view == "knockout" else f"view={view}"
        page.goto(f"{page_path.resolve().as_uri()}#{address}")
        paths.append(out_dir / f"explore_{view}.png")
        page.screenshot(path=str(paths[-1]))
    context.close()
    return paths


def inline(source: str | Path | Any, height: int = 720) -> Any:
    """The page in a notebook: ``source`` is an ``explore.html``, a results folder holding one, or an
    analysis result (its ``out_dir``); an ``IPython.display.HTML`` holding it in an isolated iframe."""
    from IPython.display import HTML

    path = Path(getattr(source, "out_dir", source))
    if path.is_dir():
        path = path / PAGE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no explore page; write it with probes.explore(session, out=...) or `basm-probes explore`")
    page = path.read_text(encoding="utf-8")
    return HTML(f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width:100%;height:{height}px;border:1px solid #ccc"></iframe>')


__all__ = ["ExploreOptions", "browser_missing", "explore", "inline", "screenshot_views", "write_explore"]
