"""The registered search strategies by name: one import line per strategy module.

Each module defines a `@register`ed subclass of `search.strategy.Strategy`; this package
lists them in `STRATEGIES` and builds one by name with `get_strategy(name, **options)`.
"""

from __future__ import annotations

from typing import Any

from planner.errors import FusionPlannerError
from search.strategies.exact import ExactStrategy
from search.strategies.greedy import GreedyStrategy
from search.strategies.joint import JointNSGA2Strategy, JointRLStrategy, JointTPEStrategy
from search.strategies.nsga2 import NSGA2Strategy
from search.strategies.priority import PriorityStrategy
from search.strategies.rl import RLFinetuneStrategy, RLStrategy
from search.strategies.tpe import TPEStrategy
from search.strategy import Strategy

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        ExactStrategy,
        GreedyStrategy,
        JointNSGA2Strategy,
        JointRLStrategy,
        JointTPEStrategy,
        NSGA2Strategy,
        PriorityStrategy,
        RLStrategy,
        RLFinetuneStrategy,
        TPEStrategy,
    )
}


def get_strategy(name: str, **kw: Any) -> Strategy:
    """An instance of the strategy registered as `name`, with keyword options `kw`."""
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise FusionPlannerError(
            f"unknown strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}"
        ) from None
    return cls(**kw)


__all__ = ["STRATEGIES", "get_strategy"]
