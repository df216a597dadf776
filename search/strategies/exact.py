"""`exact`: the optimal partition under the cost model, by dynamic programming over downsets.

Why this method. A partition into convex groups has an acyclic graph of groups exactly
when its groups can be listed G1, G2, ... so that every prefix G1 | ... | Gk is a downset
(closed under predecessors); conversely the difference of two nested downsets is always
convex. And the objective is a sum of per-group terms, score(G) = C(G) + T_in(G)
(planner/objective.py). So the optimum is a shortest path from the empty downset to the
whole graph, where a step adds one legal group whose predecessors are all placed:
convexity and acyclicity come for free, and only legal groups are ever scored. An ILP
(scipy milp over candidate groups) would need the same group enumeration plus lazily
added cycle constraints; enumeration of all partitions (Bell numbers) dies past ~12 nodes.

Two stages:
1. every legal group: connected sets (edges or shared inputs, legality's `connected`
   rule) grown with ESU (Wernicke 2006: each connected set once), pruned by the rules
   that only get worse as a group grows (opaque ops, anchors, reductions, registers);
2. A* over downsets (a consistent lower bound: each remaining node's cheapest share of
   any group holding it), seeded with the best of `greedy` and `priority` as an
   incumbent: states that cannot beat it are never expanded, so when the search ends the
   answer is optimal, whether it is a new partition or the incumbent itself.

Size: the number of downsets grows with the graph's width, not its length. On this
2-core machine (benchmarks/results/planning_time.md): the zoo's transformer, BERT and
GPT-2 blocks (25-28 ops) take 0.02-0.2 s, the LLaMA block (58 ops) ~10 s; random graphs
of 30 nodes ~0.4 s, 40 nodes ~20-30 s, and from 50 nodes most runs exceed a 60 s budget.
Past the budget the strategy returns the incumbent and says it is not proven optimal.

Bounds (latency / memory, docs/formulas.md §5) are not part of the DP: the optimum is checked
against them at the end, and an infeasible optimum falls back to a feasible incumbent.
"""

from __future__ import annotations

import heapq
import math

from planner.fusion.group_facts import never_legal_grown
from planner.fusion.legality import (
    GROUP_RULES,
    FusionState,
    GroupFacts,
    GroupView,
    ancestors,
    fused_region_of,
    node_facts,
)
from planner.fusion.partition import Partition, bits
from planner.fusion.resources import ResourceLimits
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.strategies.greedy import GreedyStrategy
from search.strategies.priority import PriorityStrategy, absorb_free_groups
from search.strategy import Clock, Strategy, register

_CHECK_EVERY = 512  # enumeration steps between budget checks


class OutOfBudget(Exception):
    """Internal: the budget ran out mid-search."""


@register
class ExactStrategy(Strategy):
    name = "exact"

    def __init__(self, max_nodes: int = 200):
        self.max_nodes = max_nodes

    def search(
        self, graph: OpGraph, objective: Objective, clock: Clock, seed: int
    ) -> tuple[Partition, bool, str]:
        incumbent, inc_cost, inc_name = _incumbent(graph, objective, clock)
        if len(graph.nodes) > self.max_nodes:
            return incumbent, False, f"{len(graph.nodes)} ops > max_nodes: {inc_name} returned"
        try:
            if clock.exhausted(1):  # every group the DP needs costs an evaluation
                raise OutOfBudget
            left = None
            if clock.budget.max_evals is not None:
                left = clock.budget.max_evals - clock.evals
            groups = legal_groups(graph, objective.limits, clock, left)
            scored = _score(graph, objective, clock, groups)
            found, states = _shortest(graph, scored, inc_cost, clock)
        except OutOfBudget:
            return (
                incumbent,
                False,
                f"budget ran out: best so far is {inc_name}, not proven optimal",
            )
        notes = f"{len(groups)} legal groups, {states} downsets expanded"
        if found is None:
            return incumbent, True, f"{notes}; {inc_name} proven optimal"
        state = FusionState(Partition(graph, found), objective.limits)
        absorb_free_groups(state, objective)  # same cost, fewer view-only groups
        best = state.partition()
        if not objective.evaluate(best).feasible:  # the DP knows no bounds (module docstring)
            if objective.evaluate(incumbent).feasible:
                return incumbent, False, f"{notes}; optimum breaks a bound: {inc_name} returned"
            return best, False, f"{notes}; optimum breaks a bound, and so does {inc_name}"
        return best, True, f"{notes}; optimal"


def _incumbent(graph: OpGraph, objective: Objective, clock: Clock) -> tuple[Partition, float, str]:
    """The better of greedy and priority, scored as the DP scores (sum of group scores)."""
    best, cost, name = Partition.singletons(graph), math.inf, "unfused"
    for strat in (GreedyStrategy(), PriorityStrategy()):
        if clock.exhausted():
            break
        p, _, _ = strat.search(graph, objective, clock, 0)
        if clock.exhausted(len(p)):
            if not math.isfinite(cost):
                best, name = p, strat.name  # legal, though unscored
            break
        c = sum(objective.group_score(graph, m) for m in p.masks)
        if c < cost:
            best, cost, name = p, c, strat.name
    return best, cost, name


def _neighbors(graph: OpGraph) -> list[int]:
    """Masks of the nodes each node may share a group with directly (legality: connected)."""
    nbr = [0] * len(graph.nodes)
    readers: dict[int, int] = {}
    for n in graph.nodes:
        for t in n.inputs:
            r = graph.root(t)
            readers[r] = readers.get(r, 0) | (1 << n.index)
    for n in graph.nodes:
        m = 0
        for j in (*graph.succ[n.index], *graph.pred[n.index]):
            m |= 1 << j
        for t in n.inputs:
            m |= readers[graph.root(t)]
        nbr[n.index] = m & ~(1 << n.index)
    return nbr


def legal_groups(
    graph: OpGraph,
    limits: ResourceLimits,
    clock: Clock | None = None,
    max_groups: int | None = None,
) -> list[int]:
    """Every legal group of `graph` as a bitmask (ESU enumeration with monotone pruning).

    Raises OutOfBudget past `max_groups` groups (each will need an evaluation) or when
    the clock runs out.
    """
    n = len(graph.nodes)
    nbr = _neighbors(graph)
    one = [node_facts(graph, i) for i in range(n)]
    anc = ancestors(graph)
    cap = limits.regs_per_thread
    rules = [r for r in GROUP_RULES if r.name not in ("convex", "connected")]

    def dead(f: GroupFacts) -> bool:
        return never_legal_grown(graph, f, cap)

    def legal(f: GroupFacts, down: int, up: int) -> bool:
        if down & up & ~f.mask:
            return False  # not convex
        view = GroupView(graph, f, limits, fused_region_of(graph, f))
        return not any(r.check(view) for r in rules)

    out: list[int] = []
    steps = 0
    for v in range(n):
        higher = ~((1 << (v + 1)) - 1)
        stack = [(1 << v, nbr[v] & higher, nbr[v] | (1 << v), one[v], graph.reach[v], anc[v])]
        while stack:
            s, ext, closed, f, down, up = stack.pop()
            if legal(f, down, up):
                out.append(s)
                if max_groups is not None and len(out) > max_groups:
                    raise OutOfBudget
            while ext:
                steps += 1
                if clock is not None and steps % _CHECK_EVERY == 0 and clock.exhausted(1):
                    raise OutOfBudget
                w = (ext & -ext).bit_length() - 1
                ext ^= 1 << w
                f2 = f.combine(one[w])
                if dead(f2):
                    continue
                nxt = ext | (nbr[w] & ~closed & higher)
                stack.append(
                    (s | 1 << w, nxt, closed | nbr[w], f2, down | graph.reach[w], up | anc[w])
                )
    return out


Scored = tuple[int, int, float, float]  # (mask, outside predecessors, score, lower-bound share)


def _score(
    graph: OpGraph, objective: Objective, clock: Clock, groups: list[int]
) -> dict[int, list[Scored]]:
    """Groups bucketed by their lowest node, with the A* share of each (see _shortest)."""
    pred = [sum(1 << p for p in graph.pred[i]) for i in range(len(graph.nodes))]
    raw: list[tuple[int, int, float]] = []
    per_node = [math.inf] * len(graph.nodes)  # min over groups holding i of score / size
    for m in groups:
        if clock.exhausted(1):
            raise OutOfBudget
        s = objective.group_score(graph, m)
        if not math.isfinite(s):
            continue
        need = 0
        size = 0
        for i in bits(m):
            need |= pred[i]
            size += 1
        for i in bits(m):
            per_node[i] = min(per_node[i], s / size)
        raw.append((m, need & ~m, s))
    by_low: dict[int, list[Scored]] = {}
    for m, need, s in raw:
        share = sum(per_node[i] for i in bits(m))
        by_low.setdefault((m & -m).bit_length() - 1, []).append((m, need, s, share))
    return by_low


def _shortest(
    graph: OpGraph,
    by_low: dict[int, list[Scored]],
    bound: float,
    clock: Clock,
) -> tuple[list[int] | None, int]:
    """Cheapest chain of downsets from empty to full, if one beats `bound` (A*).

    Heuristic: h(D) = sum over nodes outside D of c_i, c_i the least score-per-node of any
    group holding i. Any partition pays sum_G score(G) = sum_i score(G_i) / |G_i| >= sum c_i,
    so h never overestimates; and adding G lowers h by sum_{i in G} c_i <= score(G), so h
    is consistent and the first time the full set is popped its cost is optimal.
    """
    n = len(graph.nodes)
    full = (1 << n) - 1
    pred = [sum(1 << p for p in graph.pred[i]) for i in range(n)]
    limit = bound * (1 - 1e-12) if math.isfinite(bound) else math.inf
    h0 = 0.0
    seen = 0
    for groups in by_low.values():
        for m, _, _, share in groups:
            if m & (m - 1) == 0 and not m & seen:  # every node has its singleton group
                h0 += share
                seen |= m
    if seen != full:
        return None, 0  # some node has no scorable group: nothing to search
    dist: dict[int, float] = {0: 0.0}
    prev: dict[int, tuple[int, int]] = {}
    heap = [(h0, 0.0, h0, 0)]
    expanded = 0
    while heap:
        _, d, h, done = heapq.heappop(heap)
        if d > dist[done]:
            continue
        if done == full:
            groups_out, cur = [], full
            while cur:
                before, g = prev[cur]
                groups_out.append(g)
                cur = before
            return groups_out, expanded
        expanded += 1
        if expanded % _CHECK_EVERY == 0 and clock.exhausted():
            raise OutOfBudget
        rest = full & ~done
        for low in bits(rest):
            if pred[low] & ~done:
                continue  # the lowest node of a placeable group has all its inputs placed
            for m, need, s, share in by_low.get(low, ()):
                if m & done or need & ~done:
                    continue
                nd = d + s
                nh = max(h - share, 0.0)
                nxt = done | m
                if nd + nh < limit and nd < dist.get(nxt, math.inf):
                    dist[nxt] = nd
                    prev[nxt] = (done, m)
                    heapq.heappush(heap, (nd + nh, nd, nh, nxt))
    return None, expanded
