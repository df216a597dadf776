"""The cost model a command scores plans with, from its `--cost-model` flag.

Every command that takes the flag (`plan`, `tune`, `measure`, `collect --learned`) and the
benchmarks map it here, so one word means one model everywhere and a command given no
flag uses DEFAULT. Why DEFAULT is the realized roofline: docs/measuring.md.
"""

from __future__ import annotations

from pathlib import Path

import learned_cost
from learned_cost.analytical import AnalyticalModel
from learned_cost.corrected import load_corrected
from learned_cost.realized import RealizedRoofline
from planner.cost import CostModel
from planner.errors import CostModelError
from planner.hardware import get_spec
from search.flags import COST_MODEL_DEFAULT, COST_MODEL_HELP, COST_MODEL_NAMES

# The flag itself (`add_cost_model_arg`, `cost_model_arg`) is in search.flags, which a
# parser imports without torch.
DEFAULT = COST_MODEL_DEFAULT
NAMES = COST_MODEL_NAMES
HELP = COST_MODEL_HELP


# The learned corrections shipped with the package, wherever a command runs from.
COMMITTED_DIR = Path(learned_cost.__file__).resolve().parent / "models"


def committed_model(device: str) -> Path:
    """Where the committed learned correction for `device` lives."""
    return COMMITTED_DIR / f"{device}.json"


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
