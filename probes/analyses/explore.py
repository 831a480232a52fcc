"""``explore``: one self-contained ``explore.html`` per results folder, to look at a run in a browser.

Four views, drawn by one Jinja2 template (``templates/explore.html.j2``; every script and style
inline, no network):

- **prompt**: a record's tokens with the procedure and boundary spans (and each boundary slot)
  outlined, the query rows marked, each token shaded by the attention it receives from the deciding
  row (mean over heads, one layer, or one (layer, head)); its candidates with their logits at the
  deciding row, the recorded margins and, where the knockout analysis ran on it, every knockout's
  Δm with the positions it blocked drawn on the same tokens; where the steer analysis steered it, the
  clean run's top action and margins next to the steered ones (:func:`steer_view`, read from the rows);
- **heads**: the per-head grids of ``heads`` (log2 B/P on T_wrong, the T_ok → T_wrong shift), the
  split-half ranking and its causal top-N test; a click on a head shades the prompt view by it;
- **run**: the run's provenance (report.md's header), its figures, the claims table, and Fig. 2's
  and Fig. 6's cells as item lists linked to the prompt view;
- **circuit**: each circuit graph of the folder (``circuit_graph_<config>_<pair>.json``, written by
  the circuit analysis; :mod:`probes.reporting.circuit_graph`) drawn as a graph: the source spans, the
  embedding, then per layer its heads and MLP (coloured by DLA); an edge per (head, source span),
  coloured by span, as wide as its |score|, the circuit's edges drawn solid and on top; a click on a
  head shades the graph's prompt by that head's deciding-row attention (stored quantised, as the
  records' is).

The attention is the engine's full softmax row at the deciding row
(:func:`probes.analyses.knockout.deciding_run`, never an n × n pattern), recomputed for the records
shown: the knocked records first, then the sweep's, at most ``records`` and within ``max_mb``,
stored quantised (``precision``). The records are rebuilt with each analysis's recorded options
(its results header), so the page shows what the rows measured.

The page sits above the analyses (it rebuilds their runs and reads their rows with their helpers);
the catalogue ignores this module, which registers no analysis. Its template ships with the
presentation assets of :mod:`probes.reporting` (``probes/reporting/templates/``).
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import numpy as np
import pandas as pd

from probes import analyses as registry
from probes.analyses.option_system import Options, RunOptions, option, option_fields, shared
from probes.analyses.run_context import AnalysisError, RunContext, default_model, model_label, open_context
from probes.analyses import steer
from probes.analyses.knockout import control_of, deciding_run, deltas_per_record, knocked_configs, layer_windows, record_knockouts
from probes.core.files import make_folder, write_text
from probes.core.text import visible
from probes.data.schema import BOUNDARY_SLOTS
from probes.engine.session import EngineSession
from probes.engine.threads import keeps_caller_threads
from probes.prompts.record import PromptRecord, record_parts
from probes.reporting.circuit_graph import GRAPH_GLOB, check_graph, read_circuit_graph
from probes.reporting.finished import FinishedRun, load, read_table
from probes.reporting.layout import CLAIMS, PAGE, REPORT, analysis_folder, check_layout, figures_folder, rows_path
from probes.scoring.controls import tool_names_of

NAME = "explore"
SHOWN = ("sweep", "knockout", "heads", "steer")  # the analyses whose rows the page draws
PRECISIONS = {"uint16": np.uint16, "uint8": np.uint8}  # attention stored as round(a · max), a ∈ [0, 1]
DEFAULT_RECORDS = 100
DEFAULT_MAX_MB = 20.0
SPAN_NAMES = ("procedure", "boundary")
TEMPLATE = "explore.html.j2"
CHROMIUM = "/usr/bin/chromium"  # Debian's package: `apt-get install -y chromium`
INSTALL = "apt-get install -y chromium && pip install playwright"
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
    screenshots: str | Path | None = option(None, "also save the prompt and heads views as PNGs in this folder (README's; needs "
                                            f"playwright and {CHROMIUM})", type=Path)


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


def record_view(ctx: RunContext, record: PromptRecord, options: ExploreOptions, rows: pd.DataFrame,
                knocked: pd.DataFrame | None, knockout_options: Any, steered: pd.DataFrame | None = None) -> dict[str, Any]:
    """One record as the page draws it: tokens, spans, query rows, candidates with their logits at the
    deciding row, the recorded margins, the quantised deciding-row attention, the knockouts and, from
    ``steered`` (the steer rows), the steered conditions beside the clean run."""
    result, row, depth = deciding_run(ctx.session, record)
    attention = result.rows[:, :, -1, : record.n_tokens].float().numpy()
    logits = result.logits_at(row).float().numpy()
    encoded, scale = quantise(attention, options.precision)
    correct = record.candidate("correct")
    prefix = list(correct.token_ids[:depth]) if correct is not None and depth else []
    candidates = []
    for c in record.candidates:  # a candidate's token at the deciding row exists when it shares the correct name's prefix
        predicted = len(c.token_ids) > depth and list(c.token_ids[:depth]) == prefix
        candidates.append({"role": c.role, "action": c.action, "text": c.text, "token": int(c.token_ids[depth]) if predicted else None,
                           "logit": float(logits[c.token_ids[depth]]) if predicted else None})
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
        base = mine["margin"].get("baseline", np.nan)
        for k in conds:
            delta = mine["margin"].get(k.name, np.nan) - base
            knockouts.append({"name": k.name, "control": control_of(k.name), "delta": _finite(delta), "positions": list(k.key_positions),
                              "layers": list(k.layers) if k.layers is not None else None})
    return {
        "id": record.record_id, "item": record.item_id, "bucket": record.bucket, "config": record.config, "k": record.k,
        "format": record.format, "correct": record.correct_action, "wrong": list(record.wrong_tools),
        "tokens": token_pieces(record), "spans": {name: [list(s) for s in record.spans.get(name, [])] for name in (*SPAN_NAMES, *BOUNDARY_SLOTS)},
        "query_rows": list(record.query_rows), "decision_index": record.decision_index, "deciding_row": row, "deciding_depth": depth,
        "candidates": candidates, "margins": margins, "margin_variant": str(baseline.iloc[0]["margin_variant"]) if len(baseline) else "",
        "attention": encoded, "scale": scale, "shape": list(attention.shape), "knockouts": knockouts,
        "steer": steer_view(steered, record.record_id) if steered is not None else None,
    }


def chosen_records(runs: dict[str, FinishedRun]) -> list[tuple[str, str]]:
    """(analysis, record id) of every record the page can show, in the order they are kept: item by
    item (the knocked items first, T_wrong before T_ok), each item's knocked records, then its sweep
    and heads records by configuration and k. An item's prompts share their prefix, which the engine
    then computes once (``prefix_cache``)."""
    found = []  # (knocked?, bucket, item, analysis rank, config, k, analysis, record id)
    for rank, name in enumerate(SHOWN):
        if name not in runs:
            continue
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
    runs = {name: load(out_dir, name) for name in SHOWN if rows_path(out_dir, name).is_file()}
    circuits = circuit_graphs_of(out_dir, circuit_graphs)
    if not runs and not circuits:
        raise AnalysisError(f"{out_dir}: no results of {', '.join(SHOWN)} and no {GRAPH_GLOB} to explore (run `basm-probes report`, "
                            f"circuit or one of the others with --out {options.out})")
    contexts: dict[str, RunContext] = {}
    for name in runs:
        contexts[name] = run_context(runs[name], options, model, session)
        session = contexts[name].session
    kopts = contexts["knockout"].options if "knockout" in runs else None
    knocked = runs["knockout"].rows if "knockout" in runs else None
    claims = out_dir / CLAIMS
    data: dict[str, Any] = {
        "model": str(model), "out_dir": str(out_dir), "analyses": list(runs), "provenance": provenance_lines(out_dir, runs),
        "precision": options.precision, "figures": figure_uris(figures_dir or figures_folder(out_dir)),
        "claims": table_html(read_table(claims)) if claims.is_file() else "",
        "sweep": sweep_cells(runs["sweep"]) if "sweep" in runs else [],
        "knockout": knockout_cells(runs["knockout"]) if "knockout" in runs else [],
        "heads_view": heads_view(runs["heads"]) if "heads" in runs and "heads_ranking" in runs["heads"].tables else None,
        "circuits": [circuit_view(g, options.precision) for g in circuits],
    }
    # the page is the template (~20 kB) around this data: each record's attention scales as layers × heads × tokens
    used = len(render({**data, "records": [], "records_total": 0, "left_out": 0, "layers": 0, "heads": 0}).encode())
    if used > options.max_mb * 1e6:  # the figures and circuit graphs are never left out: the cap cannot hold them
        raise AnalysisError(f"{out_dir}: the page without records (its figures and {len(circuits)} circuit graphs) takes {used / 1e6:.2f} MB, "
                            f"over max_mb = {options.max_mb} MB: raise --max-mb")
    chosen = chosen_records(runs)
    items = {item.id: item for ctx in contexts.values() for item in ctx.items}
    records, left_out = [], []
    for name, record_id in chosen:
        item_id, config, k, fmt = record_parts(record_id)
        if len(records) >= options.records:
            left_out.append(record_id)
            continue
        ctx = contexts[name]
        record = ctx.builder.build(items[item_id], config, k, fmt)
        knocks = knocked is not None and name == "knockout" and config in knocked_configs(kopts.priming)
        view = record_view(ctx, record, options, runs[name].rows, knocked if knocks else None, kopts if knocks else None,
                           runs["steer"].rows if "steer" in runs else None)
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
def browser_missing() -> str:
    """Why the page cannot be opened in a headless browser here ("" when it can), naming the install command."""
    import importlib.util

    if importlib.util.find_spec("playwright") is None:
        return f"playwright is not installed ({INSTALL})"
    if not Path(CHROMIUM).is_file():
        return f"no {CHROMIUM} ({INSTALL})"
    return ""


def launch(playwright: Any) -> Any:
    """Chromium, headless, from Debian's package."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=list(BROWSER_ARGS))


def screenshot_views(page_path: Path, out_dir: Path, views: tuple[str, ...] = ("prompt", "heads")) -> list[Path]:
    """PNGs of ``views`` of an explore page (``explore_<view>.png``), opened from disk with the network off."""
    if reason := browser_missing():
        raise AnalysisError(f"screenshots: {reason}")
    from playwright.sync_api import sync_playwright

    make_folder(out_dir)
    paths = []
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_context(offline=True, viewport={"width": 1400, "height": 900}).new_page()
        page.goto(page_path.resolve().as_uri())
        # the prompt view with the boundary knockout drawn, scrolled to the memory block
        page.evaluate("""() => { const s = document.getElementById("knockout-select");
            if ([...s.options].some((o) => o.value === "boundary")) { s.value = "boundary"; s.dispatchEvent(new Event("change")); }
            const b = document.querySelector("#tokens .sp-procedure"); if (b) b.scrollIntoView({block: "start"}); }""")
        for view in views:
            page.click(f"button.tab[data-view={view}]")
            paths.append(out_dir / f"explore_{view}.png")
            page.screenshot(path=str(paths[-1]))
        browser.close()
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
