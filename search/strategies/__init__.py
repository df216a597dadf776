"""The registered search strategies: one import line per strategy module.

Each module registers its Strategy subclass with `search.strategy.register`; use
`search.strategy.get_strategy(name)` or `STRATEGIES` to pick one by name.
"""

from search.strategies import exact, greedy, nsga2, priority, rl, tpe  # noqa: F401  (registers them)
from search.strategy import STRATEGIES, get_strategy

__all__ = ["STRATEGIES", "get_strategy"]
