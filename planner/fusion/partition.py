"""Partitions of an OpGraph into groups: immutable, hashable, with cheap moves.

A group is a set of node indices held as an int bitmask (bit i = node i), so the
convexity test and merges are a few big-int operations rather than graph walks. The
canonical form numbers groups by their smallest node, so two partitions with the same
groups are equal and hash alike whatever order they were built in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from functools import cached_property
from typing import Any

from planner.errors import PlanError
from planner.ir.graph import OpGraph


def bits(mask: int) -> Iterator[int]:
    """Indices of the set bits of `mask`, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def mask_of(nodes: Iterable[int]) -> int:
    m = 0
    for i in nodes:
        m |= 1 << i
    return m


def is_convex(graph: OpGraph, mask: int) -> bool:
    """No path leaves the group and re-enters it (docs/architecture.md, legal group)."""
    outside = 0
    for i in bits(mask):
        outside |= graph.reach[i]
    outside &= ~mask
    return all(not graph.reach[j] & mask for j in bits(outside))


class Partition:
    """An assignment of every node of `graph` to exactly one group.

    Immutable: every move returns a new Partition. Equality and hashing use the graph's
    key and the canonical groups, so partitions can be dict keys and set members.
    """

    def __init__(self, graph: OpGraph, masks: Iterable[int]):
        canon = sorted((m for m in masks if m), key=lambda m: m & -m)
        covered = 0
        for m in canon:
            if covered & m:
                raise PlanError("partition groups overlap")
            covered |= m
        if covered != (1 << len(graph.nodes)) - 1:
            missing = [i for i in range(len(graph.nodes)) if not covered >> i & 1]
            raise PlanError(f"partition does not cover nodes {missing[:10]}")
        self.graph = graph
        self._masks = tuple(canon)

    # ---- constructors ---------------------------------------------------------------
    @classmethod
    def singletons(cls, graph: OpGraph) -> Partition:
        """Every op its own group: the unfused baseline."""
        return cls(graph, (1 << i for i in range(len(graph.nodes))))

    @classmethod
    def whole(cls, graph: OpGraph) -> Partition:
        """One group holding everything (rarely legal; a lower bound for costs)."""
        return cls(graph, ((1 << len(graph.nodes)) - 1,))

    @classmethod
    def from_groups(cls, graph: OpGraph, groups: Iterable[Iterable[int]]) -> Partition:
        return cls(graph, (mask_of(g) for g in groups))

    @classmethod
    def from_labels(cls, graph: OpGraph, labels: Iterable[int]) -> Partition:
        """From a label per node: nodes with equal labels share a group."""
        by_label: dict[int, int] = {}
        for i, lab in enumerate(labels):
            by_label[lab] = by_label.get(lab, 0) | (1 << i)
        return cls(graph, by_label.values())

    # ---- views ----------------------------------------------------------------------
    @property
    def masks(self) -> tuple[int, ...]:
        return self._masks

    @cached_property
    def groups(self) -> tuple[frozenset[int], ...]:
        return tuple(frozenset(bits(m)) for m in self._masks)

    @cached_property
    def group_of(self) -> tuple[int, ...]:
        """group_of[node] = index of its group in `groups`."""
        out = [0] * len(self.graph.nodes)
        for g, m in enumerate(self._masks):
            for i in bits(m):
                out[i] = g
        return tuple(out)

    def __len__(self) -> int:
        return len(self._masks)

    def __iter__(self) -> Iterator[frozenset[int]]:
        return iter(self.groups)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Partition)
            and self._masks == other._masks
            and self.graph.key == other.graph.key
        )

    def __hash__(self) -> int:
        return hash((self.graph.key, self._masks))

    def __repr__(self) -> str:
        return f"Partition({len(self.graph.nodes)} nodes, {len(self)} groups)"

    @cached_property
    def key(self) -> str:
        """Stable digest of (graph key, groups): usable across processes."""
        blob = json.dumps([self.graph.key, [sorted(g) for g in self.groups]])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ---- the graph of groups --------------------------------------------------------
    @cached_property
    def group_edges(self) -> frozenset[tuple[int, int]]:
        """Edges (a, b) between distinct groups where a node of a feeds a node of b."""
        go = self.group_of
        return frozenset((go[s], go[d]) for s, d in self.graph.edges if go[s] != go[d])

    def is_acyclic(self) -> bool:
        """Whether the graph of groups has no cycle (two convex groups can still form one)."""
        return self.topo_order() is not None

    def topo_order(self) -> tuple[int, ...] | None:
        """Group indices in an executable order, or None when the group graph has a cycle."""
        n = len(self._masks)
        indeg = [0] * n
        succ: list[list[int]] = [[] for _ in range(n)]
        for a, b in self.group_edges:
            succ[a].append(b)
            indeg[b] += 1
        ready = [g for g in range(n) if indeg[g] == 0]
        order: list[int] = []
        while ready:
            ready.sort(key=lambda g: self._masks[g] & -self._masks[g], reverse=True)
            g = ready.pop()
            order.append(g)
            for h in succ[g]:
                indeg[h] -= 1
                if indeg[h] == 0:
                    ready.append(h)
        return tuple(order) if len(order) == n else None

    # ---- moves ----------------------------------------------------------------------
    def merge(self, a: int, b: int) -> Partition:
        """Groups a and b (indices into `groups`) become one. Legality is not checked."""
        if a == b:
            return self
        masks = list(self._masks)
        masks[a] |= masks[b]
        masks[b] = 0
        return Partition(self.graph, masks)

    def merge_nodes(self, u: int, v: int) -> Partition:
        """The groups holding nodes u and v become one."""
        return self.merge(self.group_of[u], self.group_of[v])

    def split(self, g: int, part: Iterable[int]) -> Partition:
        """Move the nodes `part` (a proper subset of group g) out into a group of their own."""
        pm = mask_of(part)
        gm = self._masks[g]
        if pm & ~gm or pm == gm or not pm:
            raise PlanError("split needs a non-empty proper subset of the group")
        masks = list(self._masks)
        masks[g] = gm & ~pm
        masks.append(pm)
        return Partition(self.graph, masks)

    def isolate(self, node: int) -> Partition:
        """Node `node` leaves its group for a singleton."""
        g = self.group_of[node]
        if self._masks[g] == 1 << node:
            return self
        return self.split(g, (node,))

    def replace_groups(self, remove: Iterable[int], add: Iterable[int]) -> Partition:
        """Drop the groups `remove` (indices) and add `add` (masks) covering the same nodes."""
        drop = set(remove)
        return Partition(
            self.graph, [m for g, m in enumerate(self._masks) if g not in drop] + list(add)
        )

    # ---- persistence ----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"graph_key": self.graph.key, "groups": [sorted(g) for g in self.groups]}

    @classmethod
    def from_json(cls, graph: OpGraph, data: dict[str, Any]) -> Partition:
        if data.get("graph_key") not in (None, graph.key):
            raise PlanError(
                f"partition was made for graph {data.get('graph_key')}, not {graph.key}: "
                "plan again for this graph"
            )
        return cls.from_groups(graph, data["groups"])
