"""Named hook points and recorders: a per-row quantity is declared once and recorded on every backend.

Hook points (TransformerLens's names and layouts). A value is handed over at the recorded rows only,
in fp32, with a leading axis over the batch of conditions (``c``):

======================================  ===========================  =========================================
hook point                              value                        what
======================================  ===========================  =========================================
``hook_embed``                          ``[c, rows, d_model]``       token embeddings
``blocks.{L}.attn.hook_pattern``        ``[c, head, rows, n]``       attention probabilities of the rows over
                                                                     the prompt's key positions ``0..n-1``
``blocks.{L}.attn.hook_z``              ``[c, rows, head, d_head]``  per-head attention output (``o_proj``'s input)
``blocks.{L}.hook_resid_post``          ``[c, rows, d_model]``       residual stream after block ``L``
======================================  ===========================  =========================================

A pattern row is a row of the n×n pattern, never the pattern: the native engine computes the softmax
at the recorded rows only. A candidate continuation's own keys are not prompt positions: its rows'
patterns hold the prompt keys they see (the rest 0).

A :class:`Recorder` declares a quantity: its name, the hook points it reads, where (``rows="query"``:
every query row; ``"decision"``: the last query row, the value without its row axis; ``candidates``:
also at the rows predicting each candidate token) and ``fn``, a function of one hook value. ``fn``
works row by row: it keeps the leading condition axis and the row axis where they are (the engine
hands it the rows in chunks). The native engine (``probes.engine.session``) and the forward backends
(``probes.backends``) implement *reading the hook points*; :class:`Recording` applies the recorders to
what they read, so a new quantity is one ``Recorder`` passed to ``run(..., recorders=[...])``.
A recorder's result stacks ``fn``'s outputs over its *sites* in forward order (``hook_embed``, then
layer by layer, its hook points in the order given): per condition ``[site, ...]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

HOOK_EMBED = "hook_embed"
HOOK_PATTERN = "blocks.{L}.attn.hook_pattern"
HOOK_Z = "blocks.{L}.attn.hook_z"
HOOK_RESID_POST = "blocks.{L}.hook_resid_post"
# hook point -> the axis of its value that runs over the rows
ROW_AXIS: dict[str, int] = {HOOK_EMBED: 1, HOOK_PATTERN: 2, HOOK_Z: 1, HOOK_RESID_POST: 1}
HOOK_POINTS = tuple(ROW_AXIS)

# The recorders behind ConditionResult's span_mass, rows and residual
SPAN_MASS, ROWS, RESIDUAL = "span_mass", "rows", "residual"


def hook_site(point: str, layer: int | None) -> str:
    """The concrete hook name of ``point`` at ``layer`` (``blocks.3.attn.hook_z``)."""
    return point if layer is None else point.format(L=layer)


def hook_point(site: str) -> tuple[str, int | None]:
    """(hook point, layer) of a concrete hook name: the inverse of :func:`hook_site`."""
    if site == HOOK_EMBED:
        return HOOK_EMBED, None
    parts = site.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit():
        point = f"blocks.{{L}}.{parts[2]}"
        if point in ROW_AXIS:
            return point, int(parts[1])
    raise ValueError(f"unknown hook {site!r}; hook points: {', '.join(HOOK_POINTS)}")


@dataclass(frozen=True)
class Recorder:
    """A per-row quantity: ``fn`` of the values of ``hooks`` (see the module docstring)."""

    name: str
    hooks: tuple[str, ...]
    fn: Callable[[torch.Tensor], torch.Tensor]
    rows: Literal["query", "decision"] = "query"
    candidates: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "hooks", tuple(self.hooks))
        unknown = [h for h in self.hooks if h not in ROW_AXIS]
        if not self.hooks or unknown:
            raise ValueError(f"recorder {self.name!r}: hooks {list(self.hooks)} must be hook points among {', '.join(HOOK_POINTS)}")
        if self.rows not in ("query", "decision"):
            raise ValueError(f"recorder {self.name!r}: rows must be 'query' or 'decision', not {self.rows!r}")
        if self.candidates and self.rows != "query":
            raise ValueError(f"recorder {self.name!r}: candidates=True records at every row, so rows must be 'query'")
        if len({ROW_AXIS[h] for h in self.hooks}) > 1:
            raise ValueError(f"recorder {self.name!r}: hooks {list(self.hooks)} hold their rows on different axes")

    @property
    def row_axis(self) -> int:
        """The row axis of one condition's result at each site (``rows="query"``)."""
        return ROW_AXIS[self.hooks[0]]

    def sites(self, n_layers: int) -> list[str]:
        """The concrete hooks this recorder reads, in forward order."""
        out = [HOOK_EMBED] if HOOK_EMBED in self.hooks else []
        return out + [hook_site(h, layer) for layer in range(n_layers) for h in self.hooks if h != HOOK_EMBED]


def span_mass_recorder(span_matrix: torch.Tensor) -> Recorder:
    """Attention mass per span at every row and candidate row: ``pattern @ span_matrix`` ([n, span])."""
    return Recorder(SPAN_MASS, (HOOK_PATTERN,), lambda p: p @ span_matrix.to(p.device), candidates=True)


FULL_ROWS = Recorder(ROWS, (HOOK_PATTERN,), lambda p: p)
DECISION_RESIDUAL = Recorder(RESIDUAL, (HOOK_EMBED, HOOK_RESID_POST), lambda x: x, rows="decision")


def probe_recorders(span_matrix: torch.Tensor, record_rows: bool, record_residual: bool,
                    extra: Sequence[Recorder]) -> list[Recorder]:
    """The recorders of one ``run``: span mass (when there are spans), full rows and residual when asked,
    then ``extra`` (a caller's own; their names must differ)."""
    own = [span_mass_recorder(span_matrix)] if span_matrix.shape[1] else []
    own += [FULL_ROWS] if record_rows else []
    own += [DECISION_RESIDUAL] if record_residual else []
    names = [r.name for r in extra]
    clash = sorted({SPAN_MASS, ROWS, RESIDUAL} & set(names)) or sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"recorder names must be unique and not one of {SPAN_MASS}, {ROWS}, {RESIDUAL}: {', '.join(clash)}")
    return own + list(extra)


def prompt_keys(pattern: torch.Tensor, n_prompt: int) -> torch.Tensor:
    """``pattern`` [..., n_keys] cut or zero-padded to the prompt's key positions [..., n_prompt]."""
    p = pattern[..., :n_prompt]
    return torch.nn.functional.pad(p, (0, n_prompt - p.shape[-1])) if p.shape[-1] < n_prompt else p


class Recording:
    """The recorders' outputs over one forward (or one chunk of rows at a time).

    A reader calls :meth:`take` with each site's value at every row it computed (``sites()`` says which
    to read), where the query rows and the decision row lie among them; :meth:`results` stacks them.
    Outputs are kept on ``home`` (the session device; layers may sit on several GPUs).
    """

    def __init__(self, recorders: Sequence[Recorder], n_layers: int, home: torch.device | str = "cpu") -> None:
        self.recorders = list(recorders)
        self.home = torch.device(home)
        self._sites = {r.name: r.sites(n_layers) for r in self.recorders}
        self._pieces: dict[str, dict[str, list[torch.Tensor]]] = {r.name: {s: [] for s in self._sites[r.name]} for r in self.recorders}
        self._readers: dict[str, list[Recorder]] = {}
        for r in self.recorders:
            for s in self._sites[r.name]:
                self._readers.setdefault(s, []).append(r)

    def sites(self) -> list[str]:
        """Every hook to read, in forward order."""
        return sorted(self._readers, key=lambda s: -1 if hook_point(s)[1] is None else hook_point(s)[1])

    def reads(self, site: str) -> bool:
        return site in self._readers

    def take(self, site: str, value: torch.Tensor, query: torch.Tensor | None, decision: int | None) -> None:
        """Record ``value`` (site's value at every row computed) for each recorder reading ``site``.

        ``query``: indices of the query rows among the value's rows (None: none there); ``decision``:
        the index of the decision row (None: not there). Recorders with ``candidates`` take every row.
        """
        axis = ROW_AXIS[hook_point(site)[0]]
        for r in self._readers.get(site, ()):
            if r.candidates:
                x = value
            elif r.rows == "decision":
                if decision is None:
                    continue
                x = value.select(axis, decision)
            else:
                if query is None or not query.numel():
                    continue
                x = value.index_select(axis, query.to(value.device))
            self._pieces[r.name][site].append(r.fn(x.float()).to(self.home))

    def results(self) -> dict[str, torch.Tensor]:
        """name -> [site, condition, ...]: each recorder's output, its pieces joined along the row axis."""
        out = {}
        for r in self.recorders:
            per_site = []
            for site, pieces in self._pieces[r.name].items():
                if not pieces:
                    raise RuntimeError(f"recorder {r.name!r}: nothing was read at {site}")
                per_site.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=r.row_axis))
            out[r.name] = torch.stack(per_site)
        return out


def condition_recordings(recorders: Sequence[Recorder], results: dict[str, torch.Tensor], i: int, query: torch.Tensor | None,
                         candidate_rows: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Condition ``i``'s recordings, on the CPU: name -> tensor at the query rows, and candidate -> name
    -> tensor at the candidate's rows (recorders with ``candidates``, whose results hold every row;
    ``query``/``candidate_rows``: where those rows lie among them, ``query=None``: all are query rows)."""
    at_query: dict[str, torch.Tensor] = {}
    at_candidates: dict[str, dict[str, torch.Tensor]] = {name: {} for name in candidate_rows}
    for r in recorders:
        x = results[r.name][:, i]
        if r.candidates:
            for name, local in candidate_rows.items():
                at_candidates[name][r.name] = x.index_select(r.row_axis, local.to(x.device)).cpu()
            if query is not None:
                x = x.index_select(r.row_axis, query.to(x.device))
        at_query[r.name] = x.cpu()
    return at_query, at_candidates


@contextlib.contextmanager
def added_to_outputs(layers: Sequence[torch.nn.Module], deltas: Mapping[int, Callable[[torch.Tensor], torch.Tensor]]) -> Iterator[None]:
    """Inside this context the output hidden states ``hs`` of module ``layers[L]`` become ``hs + deltas[L](hs)`` (a
    decoder layer's output: ``blocks.{L}.hook_resid_post``; a tuple output keeps its other parts): the one way the
    engine writes into the residual stream (steering in a probe run and in generation)."""

    def hook(delta: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., Any]:
        def add(_m: torch.nn.Module, _inp: Any, output: Any) -> Any:
            hs = output[0] if isinstance(output, tuple) else output
            changed = hs + delta(hs).to(device=hs.device, dtype=hs.dtype)
            return (changed, *output[1:]) if isinstance(output, tuple) else changed
        return add

    handles = [layers[layer].register_forward_hook(hook(delta)) for layer, delta in deltas.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
