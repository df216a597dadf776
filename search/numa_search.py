"""NUMA tensor homes searched with the partition (planner.distributed.numa: "In the
search"), by alternating minimization.

`NumaCostModel` prices each group with every tensor's node fixed before the search
(`reference_home`: each activation where its producer runs alone). Here the homes are
decided with the partition instead:

1. search the partition with the NUMA cost model under the current homes (any strategy,
   run the way `plan` runs it);
2. place that partition (`numa.place`: each group on its cheapest node in order, each
   activation on the node of the group that writes it, first touch, and each input
   read remotely migrated to a reader's node where `migrate_or_read_remote` says the
   move pays); the homes `place` ends with are the next round's homes;
3. repeat while the plan's cost under `place` improves, up to `max_rounds` searches.

Every round's plan is priced the same way, by `place` from the graph's starting homes
(inputs and parameters only, migrations charged), and the cheapest is kept, so the result
is never worse than round 0's, the reference-homes plan. It is a local search: the homes
of one round follow from the partition of the round before, so it need not reach the
best partition over all homes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.distributed.numa import Migration, NumaCostModel, NumaPlan, place
from planner.errors import FusionPlannerError
from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.strategy import Budget, SearchResult

MAX_ROUNDS = 4  # searches, the reference-homes one included

# runs a strategy on the graph under an objective (cli.search_options.run_search's shape)
Runner = Callable[[Objective], SearchResult]


@dataclass(frozen=True)
class HomesRound:
    """One round: the model it searched under, what the strategy found, and its price
    under `place` (migrations included)."""

    model: NumaCostModel
    result: SearchResult
    placed: NumaPlan
    kept: bool  # round 0, or cheaper than every round before it (else the search stopped)

    @property
    def cost_s(self) -> float:
        return self.placed.cost_s

    @property
    def partition(self) -> Partition:
        return self.result.partition


@dataclass(frozen=True)
class HomesSearch:
    """All rounds in order (round 0: the reference homes) and the index of the best."""

    rounds: tuple[HomesRound, ...]
    best_index: int

    @property
    def best(self) -> HomesRound:
        return self.rounds[self.best_index]

    @property
    def reference(self) -> HomesRound:
        return self.rounds[0]

    @property
    def round_costs(self) -> tuple[float, ...]:
        return tuple(r.cost_s for r in self.rounds)

    @property
    def migrations(self) -> tuple[Migration, ...]:
        return self.best.placed.migrations


def placed_cost(
    model: NumaCostModel, graph: OpGraph, groups: list[frozenset[int]] | tuple[frozenset[int], ...]
) -> NumaPlan:
    """The partition placed from the graph's starting homes, migrations allowed: the
    price every round is compared by."""
    return place(graph, list(groups), model.topo, model.start_home(graph), migrate=True)


def next_homes(model: NumaCostModel, graph: OpGraph, placed: NumaPlan) -> dict[int, int]:
    """Root tensor id -> node after `placed` ran: where `place` left each tensor it
    touched (activations on their writer's node, migrated inputs on their reader's), the
    reference home for the rest (activations no group writes across its boundary)."""
    homes = dict(model.homes(graph))
    homes.update(placed.home)
    return homes


def search_homes(
    graph: OpGraph,
    model: NumaCostModel,
    run: Runner | None = None,
    *,
    objective_for: Callable[[NumaCostModel], Objective] = Objective,
    strategy: str = "priority",
    budget: Budget | None = None,
    seed: int = 0,
    max_rounds: int = MAX_ROUNDS,
) -> HomesSearch:
    """Alternate the partition search (under `model` with the current homes) and the
    homes (from `place` of the partition found) while the placed cost improves, at most
    `max_rounds` searches. `run` runs the strategy (default: `strategy` with `budget`
    and `seed`); `objective_for` wraps each round's model (its bounds and spec)."""
    if max_rounds < 1:
        raise FusionPlannerError(f"the homes search needs at least one round, got {max_rounds}")
    if run is None:

        def run(objective: Objective) -> SearchResult:
            from search.strategies import get_strategy  # the strategies load only to run

            return get_strategy(strategy).plan(graph, objective, budget or Budget(), seed)

    rounds: list[HomesRound] = []
    current = model
    seen: set[tuple[tuple[int, int], ...]] = set()
    while len(rounds) < max_rounds:
        result = run(objective_for(current))
        placed = placed_cost(model, graph, result.partition.groups)
        kept = not rounds or placed.cost_s < min(r.cost_s for r in rounds)
        rounds.append(HomesRound(current, result, placed, kept))
        if not kept:
            break  # no cheaper than the best so far: stop
        homes = next_homes(model, graph, placed)
        key = tuple(sorted(homes.items()))
        if key in seen:
            break  # the same homes again: the next round would repeat this one
        seen.add(key)
        current = model.with_homes(homes)
    best = max(i for i, r in enumerate(rounds) if r.kept)  # the kept costs only decrease
    return HomesSearch(tuple(rounds), best)
