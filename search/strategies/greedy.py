"""`greedy`: the rule-based TVM FuseOps-like partition (planner.fusion.fuse_rules), as a strategy.

Deterministic, no cost model in the loop, one evaluation (the final one). It is the
baseline the searching strategies must beat, and the plan the runtime serves on a miss.
"""

from __future__ import annotations

from planner.fusion.fuse_rules import default_partition
from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.strategy import Clock, Strategy, register


@register
class GreedyStrategy(Strategy):
    name = "greedy"

    def search(
        self, graph: OpGraph, objective: Objective, clock: Clock, seed: int
    ) -> tuple[Partition, bool, str]:
        return default_partition(graph, objective.limits), True, "TVM FuseOps-like rules"
