"""Plans from strategies, for the commands that measure them (collect, measure, e2e).

A strategy needs an objective (planner.objective) over a cost model; these helpers wire
them with a time budget, so measuring code deals in partitions and Plan records only.
Nothing here needs optuna: the strategies that do are only imported, not run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from planner.cost import CostModel
from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective
from planner.plans.plan import Plan
from search.strategies import get_strategy
from search.strategy import Budget

UNFUSED = "unfused"  # every op alone: the eager baseline as a plan


@dataclass(frozen=True)
class MadePlan:
    plan: Plan
    partition: Partition
    planning_s: float  # search time


def make_plan(
    graph: OpGraph,
    strategy: str,
    cost_model: CostModel,
    *,
    device: str,
    dtype: str,
    budget_s: float = 10.0,
    seed: int = 0,
) -> MadePlan:
    """Run `strategy` on `graph` under `cost_model` and return its Plan record."""
    objective = Objective(cost_model)
    t0 = time.perf_counter()
    if strategy == UNFUSED:
        partition = Partition.singletons(graph)
    else:
        result = get_strategy(strategy).plan(graph, objective, Budget(max_seconds=budget_s), seed)
        partition = result.partition
    seconds = time.perf_counter() - t0
    evaluation = objective.evaluate(partition)
    plan = objective.make_plan(partition, evaluation, strategy=strategy, device=device, dtype=dtype)
    return MadePlan(plan, partition, seconds)


class StrategyPlanMaker:
    """graph -> partition by one strategy (what profiling.collector takes). A class, not a
    closure, so that it pickles into the collector's compile workers."""

    def __init__(self, strategy: str, cost_model: CostModel, budget_s: float = 10.0):
        self.strategy, self.cost_model, self.budget_s = strategy, cost_model, budget_s

    def __call__(self, graph: OpGraph) -> Partition:
        if self.strategy == UNFUSED:
            return Partition.singletons(graph)
        objective = Objective(self.cost_model)
        budget = Budget(max_seconds=self.budget_s)
        return get_strategy(self.strategy).plan(graph, objective, budget).partition


def plan_maker(
    strategy: str, cost_model: CostModel, budget_s: float = 10.0
) -> Callable[[OpGraph], Partition]:
    return StrategyPlanMaker(strategy, cost_model, budget_s)
