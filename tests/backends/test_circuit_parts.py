"""The circuit's backend-portable parts (probes.backends.circuit_parts) equal the native deciding-row replay.

On the native engine, nnsight and TransformerLens, for the tiny random Qwen3 (``qwen3_dir``: random ids,
spans as in tests/engine/test_decision_row.py) and the bundled organism (a BASM k = 1 native prompt cut
at its decision row, B its boundary span, the metric's pair the wrong and correct tools' first tokens):

- ``decision_row_components`` equals ``DecisionRow(...).components()``: heads, MLPs, embedding and
  o_proj biases ≤ 1e-4 absolute, the metric ≤ 1e-5;
- ``edge_knockout_effects`` equals ``DecisionRow.exact_edges(row.knocked_out(span), ...)`` for every head ≤ 1e-5.

Measured maxima (printed by pytest -s): DLA parts ≤ 1.4e-6, metric ≤ 1.9e-6, edges ≤ 3.3e-6 (all on the organism).
Every refusal is planted: a rescaled block output (a post-norm-like block), a rescaled readout, a model
that is not an HF decoder, bad heads, an empty span, a bad metric pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from reference import TOL

from probes.backends import BACKENDS, get_backend
from probes.backends.circuit_parts import decision_row_components, edge_knockout_effects
from probes.data.dataset import load_dataset
from probes.engine.decision_row import DecisionRow
from probes.engine.session import span_positions
from probes.organism import ORGANISM_DIR
from probes.organism.train.examples import make_builder

DLA_TOL = 1e-4  # per part, absolute (the parts sum to the metric within 1e-4 relative)
SPAN = "boundary"


@dataclass(frozen=True)
class Case:
    model_dir: Path
    ids: list[int]
    span: list[int]
    wrong: int
    correct: int


@pytest.fixture(scope="module")
def cases(qwen3_dir: Path, organism_tokenizer) -> dict[str, Case]:
    ids = torch.randint(5, 290, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    dataset = load_dataset("basm_probe")
    record = make_builder(organism_tokenizer, dataset, "lexical").build(dataset.select(ids=["retail-ok-0001"])[0], "basm", 1, "native")
    wrong, correct = record.candidate("wrong").token_ids[0], record.candidate("correct").token_ids[0]
    return {
        "qwen3": Case(qwen3_dir, ids, list(range(10, 22)), 17, 33),
        "organism": Case(ORGANISM_DIR, record.input_ids[: record.decision_index + 1], span_positions(record.spans[SPAN]), wrong, correct),
    }


@pytest.fixture(scope="module")
def backends(cases: dict[str, Case]) -> dict[str, dict[str, object]]:
    return {name: {b: get_backend(b, case.model_dir) for b in BACKENDS} for name, case in cases.items()}


@pytest.fixture(scope="module")
def replays(cases: dict[str, Case], backends) -> dict[str, DecisionRow]:
    """The native replay of each case: the reference."""
    return {name: DecisionRow(backends[name]["native"], c.ids, spans={SPAN: c.span}, wrong_token=c.wrong, correct_token=c.correct)
            for name, c in cases.items()}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("name", ["qwen3", "organism"])
def test_components_equal_the_native_replay(name: str, backend: str, cases, backends, replays) -> None:
    c = cases[name]
    want = replays[name].components()
    got = decision_row_components(backends[name][backend], c.ids, wrong_token=c.wrong, correct_token=c.correct)
    assert abs(got.total - got.metric) <= 1e-4 * max(1.0, abs(got.metric))
    assert np.abs(want.heads).max() > 1e-2 and np.abs(want.mlps).max() > 1e-2  # not vacuous
    diffs = {"heads": np.abs(got.heads - want.heads).max(), "mlps": np.abs(got.mlps - want.mlps).max(),
             "embed": abs(got.embed - want.embed), "attn_bias": np.abs(got.attn_bias - want.attn_bias).max(),
             "unembed_bias": abs(got.unembed_bias - want.unembed_bias)}
    print(f"\n{name} {backend}: metric {abs(got.metric - want.metric):.1e}, " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
    assert abs(got.metric - want.metric) <= TOL
    assert all(v <= DLA_TOL for v in diffs.values()), diffs
    assert got.heads.shape == want.heads.shape and abs(got.norm_scale - want.norm_scale) <= 1e-5 * want.norm_scale


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("name", ["qwen3", "organism"])
def test_edge_knockouts_equal_exact_patching_to_the_knockout(name: str, backend: str, cases, backends, replays) -> None:
    c, row = cases[name], replays[name]
    L, H = row.n_layers, row.n_heads
    j = row.spans.index(SPAN)
    want = row.exact_edges(row.knocked_out(SPAN), [(a, b, j) for a in range(L) for b in range(H)]).reshape(L, H)
    got = edge_knockout_effects(backends[name][backend], c.ids, span_positions=c.span, wrong_token=c.wrong, correct_token=c.correct)
    assert np.abs(want).max() > 1e-3  # not vacuous: some head's B edge moves the metric
    diff = float(np.abs(got - want).max())
    print(f"\n{name} {backend}: edges max |diff| {diff:.1e}")
    assert diff <= TOL


def test_only_the_heads_asked_are_knocked(cases, backends, replays) -> None:
    c = cases["organism"]
    got = edge_knockout_effects(backends["organism"]["native"], c.ids, span_positions=c.span, wrong_token=c.wrong,
                                correct_token=c.correct, heads=[(2, 1), (0, 3)])
    every = edge_knockout_effects(backends["organism"]["native"], c.ids, span_positions=c.span, wrong_token=c.wrong,
                                  correct_token=c.correct)
    asked = np.zeros_like(got, dtype=bool)
    asked[2, 1] = asked[0, 3] = True
    assert np.isnan(got[~asked]).all()
    np.testing.assert_allclose(got[asked], every[asked], atol=TOL)  # another batch: rounding only


def _scale_output(module: torch.nn.Module, factor: float) -> torch.utils.hooks.RemovableHandle:
    return module.register_forward_hook(lambda _m, _i, out: out * factor if isinstance(out, torch.Tensor) else (out[0] * factor, *out[1:]))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_residual_that_is_not_a_sum_of_parts_is_refused(backend: str, cases, backends) -> None:
    c, b = cases["organism"], backends["organism"][backend]
    model = b.model
    # a block whose output is rescaled (as a post-norm would): the derived MLP output is not the block's MLP.
    # The native engine reads hook_resid_post after this hook (layer 1 refused), nnsight and the bridge before
    # it (layer 2, whose input is the rescaled output, refused).
    handle = _scale_output(model.base_model.layers[1], 1.5)
    try:
        with pytest.raises(ValueError, match="layer [12]: .* not a pre-norm sum of attention and MLP outputs"):
            decision_row_components(b, c.ids, wrong_token=c.wrong, correct_token=c.correct)
    finally:
        handle.remove()
    # a readout that is not the unembedding of the final norm's output: the parts do not sum to the metric
    handle = _scale_output(model.get_output_embeddings(), 2.0)
    try:
        with pytest.raises(ValueError, match="DLA parts sum to .* not the embedding plus per-head and MLP outputs"):
            decision_row_components(b, c.ids, wrong_token=c.wrong, correct_token=c.correct)
    finally:
        handle.remove()
    decision_row_components(b, c.ids, wrong_token=c.wrong, correct_token=c.correct)  # the hooks are gone


def test_refusals(cases, backends) -> None:
    c, b = cases["organism"], backends["organism"]["native"]
    not_a_decoder = SimpleNamespace(model=torch.nn.Linear(2, 2), n_layers=1, n_heads=1, run=b.run)
    with pytest.raises(NotImplementedError, match="lacks base_model.layers, base_model.norm"):
        decision_row_components(not_a_decoder, c.ids, wrong_token=c.wrong, correct_token=c.correct)
    with pytest.raises(ValueError, match="same token"):
        decision_row_components(b, c.ids, wrong_token=c.wrong, correct_token=c.wrong)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        edge_knockout_effects(b, c.ids, span_positions=c.span, wrong_token=10**6, correct_token=c.correct)
    with pytest.raises(ValueError, match="span_positions is empty"):
        edge_knockout_effects(b, c.ids, span_positions=[], wrong_token=c.wrong, correct_token=c.correct)
    with pytest.raises(ValueError, match=r"heads must be distinct .* got \[\(3, 0\)\]"):
        edge_knockout_effects(b, c.ids, span_positions=c.span, wrong_token=c.wrong, correct_token=c.correct, heads=[(3, 0)])
    with pytest.raises(ValueError, match="duplicates"):
        edge_knockout_effects(b, c.ids, span_positions=c.span, wrong_token=c.wrong, correct_token=c.correct, heads=[(0, 0), (0, 0)])
    with pytest.raises(ValueError, match="blocks every key"):  # the backend's own refusal
        edge_knockout_effects(b, c.ids, span_positions=range(len(c.ids)), wrong_token=c.wrong, correct_token=c.correct)
