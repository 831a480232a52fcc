"""The session users hold: :class:`ProbeSession`, the probe engine plus the notebook conveniences.

``probes.ProbeSession`` is this class. It *is* an engine session
(:class:`probes.engine.session.EngineSession`, a subclass: ``run``, ``forward``, the model and its
tokenizer, accepted by every analysis and by ``probes.run``) and adds what a notebook reaches for
on the object it already holds, TransformerLens-style:

- :meth:`ProbeSession.prompt`: the prompt record of an item, built in the session's own tokenizer
  with the model's study defaults (dataset, relevance measure);
- :meth:`ProbeSession.score`: one row per condition of a record under named knockouts, through the
  one record scorer (:func:`probes.scoring.score.score_record`) and the knockout's controls
  (:mod:`probes.scoring.controls`).

This module sits above the engine, the data, prompt and scoring layers and imports them; the
engine imports none of them (tests/test_layout.py checks the import graph).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from transformers import PreTrainedModel

from probes.data.dataset import ORGANISM_DIR, load_dataset
from probes.engine.session import EngineSession, Knockout
from probes.prompts.builder import DEFAULT_K_MAX, SWEEP_K_MAX, BuildSettings, make_builder, resolve_study
from probes.prompts.record import PromptRecord
from probes.scoring.controls import random_control
from probes.scoring.score import DEFAULT_VARIANT, score_record

__all__ = ["Knockout", "ProbeSession"]


class ProbeSession(EngineSession):
    """A model loaded for probing, with the notebook conveniences :meth:`prompt` and :meth:`score`.

    Opens exactly as the engine's :class:`probes.engine.session.EngineSession` (same arguments; see
    it for the algorithm), and is one wherever an engine session is taken.
    """

    def __init__(self, model_or_dir: str | Path | PreTrainedModel | None = None, **options: Any) -> None:
        """``model_or_dir`` as for the engine session; omitted, the bundled model organism
        (:data:`probes.organism.ORGANISM_DIR`), which the CLI's commands also load when ``--model`` is not given.
        ``options``: the engine session's (``dtype``, ``device``, ``device_map``, ...)."""
        super().__init__(ORGANISM_DIR if model_or_dir is None else model_or_dir, **options)

    def _study_defaults(self) -> tuple[Path, str]:
        return resolve_study(self.model.name_or_path)  # type: ignore[return-value]

    @property
    def default_dataset(self) -> Path:
        """The dataset this model is studied on by default: the bundled v1 set for the bundled
        organism, basm_probe_v2 for every other model (:func:`probes.data.dataset.default_study`)."""
        return self._study_defaults()[0]

    def prompt(self, item: Any, *, config: str = "basm", k: int = DEFAULT_K_MAX, fmt: str = "native", dataset: str | Path | None = None,
               embedder: str = "auto", gamma: float | None = None, relevance: str | None = None, beta: int | None = None,
               retrieval: str = BuildSettings.retrieval, oracle_rank: int = BuildSettings.oracle_rank) -> PromptRecord:
        """The prompt record of ``item`` (an id or a dataset item) under memory configuration ``config``
        at retrieval depth ``k``, in this model's own token space (see ``docs/prompt_records.md``).
        ``dataset`` and ``relevance`` default to this model's study defaults (:attr:`default_dataset`);
        ``retrieval="oracle"`` shows the item's defining skill at rank ``oracle_rank`` (not at all when
        ``k < oracle_rank``: :func:`probes.data.retrieval.oracle_order`)."""
        if self.tokenizer is None:
            raise ValueError("this session has no tokenizer: pass tokenizer= when opening it")
        dataset, relevance = resolve_study(self.model.name_or_path, dataset, relevance)
        settings = {"k_max": max(k, SWEEP_K_MAX), "gamma": BuildSettings.gamma if gamma is None else gamma, "relevance": relevance,
                    "beta": BuildSettings.beta if beta is None else beta, "retrieval": retrieval, "oracle_rank": oracle_rank}
        key = (str(dataset), embedder, tuple(settings.items()))
        if getattr(self, "_builder_key", None) != key:
            self._builder = make_builder(self.tokenizer, load_dataset(dataset), embedder=embedder, **settings,
                                         tokenizer_name=str(self.model.name_or_path))
            self._builder_key = key
        builder = self._builder
        if isinstance(item, str):
            (item,) = builder.dataset.select(ids=[item])
        return builder.build(item, config, k, fmt)

    def score(self, record: PromptRecord, *, knockouts: Sequence[str | Knockout] = (), variant: str = DEFAULT_VARIANT,
              per_head: bool = False, seed: int = 0) -> pd.DataFrame:
        """One row per condition (the baseline first) with every margin and Eq. 2's α, as a pandas
        DataFrame (:func:`probes.scoring.score.score_record`). ``knockouts``: ``Knockout`` objects or
        the names ``boundary`` and ``procedure`` (the record's spans) and ``random`` (the neutral
        control of the ``knockout`` analysis: |B| random positions of the memory block outside B, P,
        their section labels and every line naming a tool the prompt shows as a tool, seeded by
        ``seed`` and the record: :func:`probes.scoring.controls.random_control`)."""
        conditions = []
        for knockout in knockouts:
            if isinstance(knockout, Knockout):
                conditions.append(knockout)
            elif knockout in ("boundary", "procedure"):
                conditions.append(Knockout.from_spans(knockout, record.spans.get(knockout, [])))
            elif knockout == "random":
                conditions.append(Knockout("random", tuple(random_control(record, seed))))
            else:
                raise ValueError(f"knockout {knockout!r}: give a Knockout or one of 'boundary', 'procedure', 'random'")
        return pd.DataFrame(score_record(self, record, conditions, variant=variant, per_head=per_head))
