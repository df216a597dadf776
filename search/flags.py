"""Command-line vocabulary of the search layer that a parser needs: strategy names and the
`--cost-model` flag. Pure Python (no torch, Optuna or scikit-learn), so building a
command's parser, `--help` and a bad flag's error are immediate. `search.cost_models`
takes its names from here; tests/test_cli.py checks STRATEGY_NAMES against
`search.strategies.STRATEGIES`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# The names `search.strategies.STRATEGIES` registers.
STRATEGY_NAMES = (
    "exact",
    "greedy",
    "joint-nsga2",
    "joint-rl",
    "joint-tpe",
    "nsga2",
    "priority",
    "rl",
    "rl-ft",
    "tpe",
)

COST_MODEL_DEFAULT = "realized"
COST_MODEL_NAMES = ("analytical", "realized", "learned")
COST_MODEL_HELP = (
    "how plans are scored: 'realized' (the default: the roofline per kernel the realizer "
    "launches), 'analytical' (the ideal fused roofline), 'learned' (this device's "
    "committed correction, learned_cost/models/<device>.json) or a trained model's .json"
)


def cost_model_arg(text: str) -> str:
    """argparse type for `--cost-model`: one of COST_MODEL_NAMES, or a trained model's .json
    that exists. A path that does not exist is refused by the parser (exit 2), so a typo
    never runs a whole job under another model."""
    if text in COST_MODEL_NAMES or (text.endswith(".json") and Path(text).is_file()):
        return text
    if text.endswith(".json"):
        raise argparse.ArgumentTypeError(f"no cost model file {text!r}")
    raise argparse.ArgumentTypeError(
        f"{text!r}: expected one of {', '.join(COST_MODEL_NAMES)} or a path to a trained "
        "model's .json (fusion-plan cost train writes one)"
    )


def add_cost_model_arg(parser: argparse.ArgumentParser) -> None:
    """The `--cost-model` flag, with the same help and default in every command."""
    parser.add_argument(
        "--cost-model", type=cost_model_arg, default=None, metavar="MODEL", help=COST_MODEL_HELP
    )
