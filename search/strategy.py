"""Search strategies: the contract every partition search meets, its budget and result.

A strategy proposes partitions of an OpGraph and returns the best it found under an
`Objective` (planner/objective.py). The contract (tests/test_strategies.py runs every
registered strategy through it):

- `plan(graph, objective, budget, seed) -> SearchResult`;
- the returned partition is legal (planner.fusion.legality.check) — at worst the unfused one;
- the budget is respected: `evals_used` (the objective's `n_evals` spent, i.e. partition
  evaluations plus group scorings) stays within `budget.max_evals` plus the one final
  evaluation of the result, and wall time within `max_seconds` plus one step;
- the same seed gives the same partition (deterministic strategies ignore the seed);
- a candidate that fails to evaluate (the cost model raises) counts as infinite cost and
  never raises out of `plan`;
- `plan` may mutate nothing but the objective's caches and counters; strategies hold no
  state between calls, so one instance may plan many graphs (not concurrently).

A new strategy is one new file in search/strategies/ with a `@register`ed subclass of
`Strategy`, and one line in search/strategies/__init__.py, which holds the table of
strategies by name (`STRATEGIES`, `get_strategy`). This module imports none of them.
"""

from __future__ import annotations

import abc
import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from planner.errors import FusionPlannerError
from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Evaluation, Objective


@dataclass(frozen=True)
class Budget:
    """How much a search may spend: objective evaluations and/or wall-clock seconds."""

    max_evals: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.max_evals is not None and self.max_evals < 1:
            raise FusionPlannerError(f"budget max_evals must be >= 1, got {self.max_evals}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise FusionPlannerError(f"budget max_seconds must be > 0, got {self.max_seconds}")


@dataclass(frozen=True)
class SearchResult:
    """The best partition a strategy found, its evaluation, and what it cost to find."""

    strategy: str
    partition: Partition
    evaluation: Evaluation
    evals_used: int
    seconds: float
    history: tuple[tuple[int, float, float], ...]  # (evals, seconds, best score) improvements
    complete: bool = True  # False when the budget ran out before the strategy finished
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.evaluation.total_s


class Clock:
    """Tracks a strategy's spending against its budget and its best-so-far history."""

    def __init__(self, objective: Objective, budget: Budget):
        self.objective, self.budget = objective, budget
        self.t0 = time.perf_counter()
        self.e0 = objective.n_evals
        self.best = math.inf
        self.history: list[tuple[int, float, float]] = []

    @property
    def evals(self) -> int:
        return self.objective.n_evals - self.e0

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def exhausted(self, upcoming: int = 0) -> bool:
        """Whether spending `upcoming` more evaluations would pass the budget."""
        b = self.budget
        if b.max_evals is not None and self.evals + upcoming > b.max_evals:
            return True
        return b.max_seconds is not None and self.seconds >= b.max_seconds

    def offer(self, score: float) -> bool:
        """Record a candidate's score; True when it is the best so far."""
        if score < self.best:
            self.best = score
            self.history.append((self.evals, self.seconds, score))
            return True
        return False


class Strategy(abc.ABC):
    """Base of every search strategy; see the module docstring for the contract."""

    name: ClassVar[str] = ""
    deterministic: ClassVar[bool] = True

    @abc.abstractmethod
    def search(
        self, graph: OpGraph, objective: Objective, clock: Clock, seed: int
    ) -> tuple[Partition, bool, str]:
        """The strategy proper: (best partition, finished within budget, notes)."""

    def plan(
        self,
        graph: OpGraph,
        objective: Objective,
        budget: Budget | None = None,
        seed: int = 0,
    ) -> SearchResult:
        """Run the search and evaluate its answer; fall back to unfused on any failure."""
        clock = Clock(objective, budget or Budget())
        try:
            partition, complete, notes = self.search(graph, objective, clock, seed)
        except FusionPlannerError as e:
            partition, complete, notes = Partition.singletons(graph), False, f"failed: {e}"
        evaluation = objective.evaluate(partition)
        if not evaluation.legal:  # the contract: never hand back an illegal partition
            notes = f"{notes}; illegal result replaced by unfused: {evaluation.reasons[:2]}"
            partition = Partition.singletons(graph)
            evaluation = objective.evaluate(partition)
        clock.offer(evaluation.score)
        return SearchResult(
            strategy=self.name,
            partition=partition,
            evaluation=evaluation,
            evals_used=clock.evals,
            seconds=clock.seconds,
            history=tuple(clock.history),
            complete=complete,
            notes=notes.strip("; "),
        )


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: checks that a strategy names itself; `search.strategies` lists the
    registered classes and builds the name -> class table from them."""
    if not cls.name:
        raise FusionPlannerError(f"strategy {cls.__name__} has no name")
    return cls
