"""`nsga2`: Optuna's NSGA-II on two objectives, latency and peak memory (docs/formulas.md §12).

Same encoding, warm start and budgets as `tpe` (search/optuna_search.py); the values of a
trial are (modelled latency, peak bytes of boundary tensors alive at once). The Pareto
front, Pareto(F) = {f in F | no g in F dominates f}, comes back in `SearchResult.extra
["pareto"]` as (total_s, peak_memory_bytes, groups) rows, fastest first; the partition of
the result is the front's fastest feasible plan (the objective's latency and memory bounds
decide feasibility, as for every strategy). `pareto_front()` gives the front directly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.optuna_search import OptunaSettings, optimize
from search.optuna_storage import require_optuna
from search.strategy import Budget, Clock, SearchResult, Strategy, register

DIRECTIONS = ("minimize", "minimize")


@register
class NSGA2Strategy(Strategy):
    name = "nsga2"
    deterministic = False

    def __init__(self, *, population_size: int = 24, **settings: Any):
        require_optuna()  # a clear error now, not an unfused plan with a note later
        self.population_size = population_size
        self.settings = OptunaSettings(**settings)
        self._front: list[tuple[float, int, Partition]] = []  # set by each search call

    def search(
        self, graph: OpGraph, objective: Objective, clock: Clock, seed: int
    ) -> tuple[Partition, bool, str]:
        opt = require_optuna()
        sampler = opt.samplers.NSGAIISampler(population_size=self.population_size, seed=seed)
        out = optimize(
            graph,
            objective,
            clock,
            sampler=sampler,
            settings=self.settings,
            directions=DIRECTIONS,
            label=self.name,
        )
        self._front = out.front
        return out.partition, out.complete, out.notes

    def plan(
        self,
        graph: OpGraph,
        objective: Objective,
        budget: Budget | None = None,
        seed: int = 0,
    ) -> SearchResult:
        """The base class's plan, with the Pareto front in `extra["pareto"]`."""
        self._front = []
        result = super().plan(graph, objective, budget, seed)
        front = [(t, m, [sorted(g) for g in p.groups]) for t, m, p in self._front]
        self._front = []
        return dataclasses.replace(result, extra={**result.extra, "pareto": front})


def pareto_front(
    graph: OpGraph, objective: Objective, budget: Budget | None = None, seed: int = 0, **kw: Any
) -> list[tuple[float, int, Partition]]:
    """The (latency, peak memory) Pareto front NSGA-II finds: (total_s, peak bytes,
    partition) rows, fastest first."""
    strat = NSGA2Strategy(**kw)
    result = strat.plan(graph, objective, budget, seed)
    return [(t, m, Partition.from_groups(graph, gs)) for t, m, gs in result.extra["pareto"]]
