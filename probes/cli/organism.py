"""``basm-probes organism train | validate | card``: the command line of the bundled model organism
(:mod:`probes.organism`); the library functions are ``train``, ``validate`` and
``evaluate_and_write_card``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from probes.data.retrieval import EMBEDDERS
from probes.organism import ORGANISM_DIR


def train_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.organism.train.loop import TrainConfig

    defaults = TrainConfig()
    parser.add_argument("--out", type=Path, default=ORGANISM_DIR, help=f"output folder (default: the bundled {ORGANISM_DIR})")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--threads", type=int, default=defaults.num_threads)
    parser.add_argument("--device", default=defaults.device, help="cpu (default) or cuda")
    parser.add_argument("--embedder", choices=EMBEDDERS, default=defaults.embedder)
    parser.add_argument("--stop-after", type=int, default=None, help="stop after N steps of the --steps schedule (reproducible)")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop early after this many minutes of training (not reproducible: note the step)")
    parser.add_argument("--no-card", action="store_true", help="do not run the held-out check or write the model card")


def train(args: argparse.Namespace) -> int:
    from probes.organism.card import evaluate_and_write_card
    from probes.organism.train.loop import train

    result = train(
        args.out, seed=args.seed, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        num_threads=args.threads, device=args.device, embedder=args.embedder, max_minutes=args.max_minutes, stop_after=args.stop_after,
    )
    if not args.no_card:
        evaluate_and_write_card(args.out, result.summary)
    return 0


def validate_arguments(parser: argparse.ArgumentParser) -> None:
    from probes.organism.validate import DEFAULT_DRAWS, DEFAULT_TOP

    parser.add_argument("--model", type=Path, default=ORGANISM_DIR, help="organism folder (default: the bundled one)")
    parser.add_argument("--out", type=Path, default=Path("results") / "organism_validate", help="results folder")
    parser.add_argument("--limit", type=int, help="first N eval items per bucket (default: all)")
    parser.add_argument("--embedder", choices=EMBEDDERS, default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"heads per knocked-out set (default: {DEFAULT_TOP})")
    parser.add_argument("--draws", type=int, default=DEFAULT_DRAWS, help=f"random spans / head sets (default: {DEFAULT_DRAWS})")
    parser.add_argument("--overwrite", action="store_true", help="recompute instead of resuming the analyses' rows")


def validate(args: argparse.Namespace) -> int:
    from probes.organism.validate import validate, write
    from probes.scoring.claims import holds

    validation = validate(args.model, args.out, limit=args.limit, embedder=args.embedder, seed=args.seed, top=args.top,
                          draws=args.draws, overwrite=args.overwrite)
    write(validation, args.out)
    verdicts = validation.verdicts()
    print(validation.table[["name", "estimate", "low", "high", "n", "p", "p_holm", "verdict"]].round(4).to_string(index=False))
    print(f"{sum(holds(v) for v in verdicts.values())}/{len(verdicts)} claims hold after Holm over the validation "
          f"({validation.seconds:.0f} s); written to {args.out / 'validation.md'}")
    return 0 if validation.holds else 1


def card_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="organism folder (default: the bundled one)")


def card(args: Any) -> int:
    from probes.organism.card import evaluate_and_write_card

    return 0 if evaluate_and_write_card(args.model or ORGANISM_DIR).holds else 1
