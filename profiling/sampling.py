"""Which groups and partitions the collector measures, besides the strategies' own.

Random legal groups (grown from a seed node through producer/consumer edges, each step
kept only if `planner.fusion.legality` accepts the group) cover sizes and mixes the strategies
would never propose, which is what a cost model needs to learn where fusion stops
paying. Random partitions (random legal merges from the unfused one) give each graph
several whole plans, so plan-level rankings can be scored.
"""

from __future__ import annotations

import random

from planner.fusion.legality import can_merge, group_reasons
from planner.fusion.partition import Partition, bits
from planner.hardware import DeviceSpec
from planner.ir.graph import Category, OpGraph


def _has_work(graph: OpGraph, mask: int) -> bool:
    return any(graph.nodes[i].category is not Category.VIEW for i in bits(mask))


def _neighbours(graph: OpGraph, mask: int) -> list[int]:
    out: set[int] = set()
    for i in bits(mask):
        out.update(graph.succ[i])
        out.update(graph.pred[i])
    return sorted(j for j in out if not mask >> j & 1)


def random_groups(
    graph: OpGraph,
    n: int,
    rng: random.Random,
    *,
    spec: DeviceSpec | None = None,
    max_size: int = 16,
    attempts: int = 20,
) -> list[frozenset[int]]:
    """Up to `n` distinct legal groups of >= 2 ops with some work, grown at random."""
    work = [i for i, node in enumerate(graph.nodes) if node.category is not Category.VIEW]
    seen: set[int] = set()
    out: list[frozenset[int]] = []
    tries = 0
    while len(out) < n and work and tries < n * attempts:
        tries += 1
        mask = 1 << rng.choice(work)
        target = rng.randint(2, max_size)
        for _ in range(attempts):
            if mask.bit_count() >= target:
                break
            cand = _neighbours(graph, mask)
            if not cand:
                break
            grown = mask | 1 << rng.choice(cand)
            if not group_reasons(graph, grown, spec):
                mask = grown
        if mask.bit_count() >= 2 and mask not in seen and _has_work(graph, mask):
            seen.add(mask)
            out.append(frozenset(bits(mask)))
    return out


def random_partition(
    graph: OpGraph,
    rng: random.Random,
    *,
    spec: DeviceSpec | None = None,
    merges: int | None = None,
) -> Partition:
    """The unfused partition after up to `merges` random legal merges of adjacent groups."""
    p = Partition.singletons(graph)
    merges = merges if merges is not None else rng.randint(1, max(1, len(graph) // 2))
    for _ in range(merges):
        edges = sorted(p.group_edges)
        rng.shuffle(edges)
        for a, b in edges[:20]:
            if can_merge(p, a, b, spec):
                p = p.merge(a, b)
                break
        else:
            break
    return p
