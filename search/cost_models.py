"""The cost model a command scores plans with, from its `--cost-model` flag.

Every command that takes the flag (`plan`, `tune`, `measure`, `collect --learned`) and the
benchmarks map it here, so one word means one model everywhere and a command given no
flag uses DEFAULT. Why DEFAULT is the realized roofline: docs/measuring.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import learned_cost
from learned_cost.analytical import AnalyticalModel
from learned_cost.corrected import load_corrected
from learned_cost.realized import RealizedRoofline
from planner.cost import CostModel
from planner.errors import CostModelError
from planner.hardware import get_spec

DEFAULT = "realized"
NAMES = ("analytical", "realized", "learned")
HELP = (
    "how plans are scored: 'realized' (the default: the roofline per kernel the realizer "
    "launches), 'analytical' (the ideal fused roofline), 'learned' (this device's "
    "committed correction, learned_cost/models/<device>.json) or a trained model's .json"
)


# The learned corrections shipped with the package, wherever a command runs from.
COMMITTED_DIR = Path(learned_cost.__file__).resolve().parent / "models"


def committed_model(device: str) -> Path:
    """Where the committed learned correction for `device` lives."""
    return COMMITTED_DIR / f"{device}.json"


def cost_model_arg(text: str) -> str:
    """argparse type for `--cost-model`: one of NAMES, or a trained model's .json that
    exists. A path that does not exist is refused by the parser (exit 2), so a typo never
    runs a whole job under another model."""
    if text in NAMES or (text.endswith(".json") and Path(text).is_file()):
        return text
    if text.endswith(".json"):
        raise argparse.ArgumentTypeError(f"no cost model file {text!r}")
    raise argparse.ArgumentTypeError(
        f"{text!r}: expected one of {', '.join(NAMES)} or a path to a trained model's .json "
        "(fusion-plan cost train writes one)"
    )


def cost_model_for(flag: str | None, device: str) -> CostModel:
    """The cost model `flag` names for `device` (a hardware spec name); None or "" is
    DEFAULT. A learned model that does not fit the device warns and gives the analytical
    model (learned_cost.corrected.load_corrected)."""
    name = flag or DEFAULT
    if name == "analytical":
        return AnalyticalModel(get_spec(device))
    if name == "realized":
        return RealizedRoofline(get_spec(device))
    if name == "learned":
        return load_corrected(committed_model(device), device)
    if not name.endswith(".json"):
        raise CostModelError(
            f"--cost-model {name!r}: expected one of {', '.join(NAMES)} or a path to a "
            "trained model's .json (fusion-plan cost train writes one)"
        )
    return load_corrected(name, device)


def add_cost_model_arg(parser: argparse.ArgumentParser) -> None:
    """The `--cost-model` flag, with the same help and default in every command."""
    parser.add_argument(
        "--cost-model", type=cost_model_arg, default=None, metavar="MODEL", help=HELP
    )
