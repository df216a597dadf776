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


def committed_model(device: str) -> Path:
    """Where the committed learned correction for `device` lives."""
    return Path(learned_cost.__file__).resolve().parent / "models" / f"{device}.json"


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
    parser.add_argument("--cost-model", default=None, metavar="MODEL", help=HELP)
