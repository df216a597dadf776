"""A partition's cost over two streams: the fusion objective's C(G) for compute groups,
the α-β time of each collective by its cheapest algorithm, and the critical path over both (planner.distributed.overlap).

The additive objective (planner.objective) stays what the exact planner's dynamic
programming needs: a sum of per-group scores, in which a collective is charged as a
memory-bound op. `evaluate_streams` is the distributed cost of a finished partition:
what `analyze` reports and what ranks candidate plans whose graphs hold collectives.
"""

from __future__ import annotations

from planner.distributed.collectives import Collective, price, require_group_size
from planner.distributed.links import LinkSpec
from planner.distributed.overlap import Timeline, plan_tasks, schedule
from planner.fusion.partition import Partition, bits
from planner.objective import Objective


def evaluate_streams(
    objective: Objective,
    partition: Partition,
    link: LinkSpec,
    group_size: int | None = None,
    sink_waits: bool = True,
) -> Timeline:
    """The two-stream timeline of `partition`: compute groups at the objective's C(G) + T,
    collectives at their α-β time on `link` by the cheapest algorithm (collectives.price;
    `group_size` where capture did not record one)."""
    graph = partition.graph
    score = {frozenset(bits(m)): objective.group_score(graph, m) for m in partition.masks}

    def comm_s(c: Collective) -> float:
        p = require_group_size(c, group_size)
        return price(c, p, link).seconds

    return schedule(plan_tasks(graph, list(score), score.__getitem__, comm_s, sink_waits))
