"""What a group costs: the record every cost model returns, and the protocol it meets.

`planner` declares the protocol; `learned_cost` implements it (the analytical roofline
model and its learned correction), `search` passes an instance in. Nothing here imports
the packages above.

Group I/O rules (docs/formulas.md §10), shared by every cost model so that no byte is counted
twice: a group reads each boundary input once (tensors produced outside it, graph inputs
and parameters) and writes each boundary output once (tensors it produces that another
group or the model's caller reads). Tensors that live and die inside the group are free.
Views are metadata: a view crossing a boundary is charged as its storage (the root), once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from planner.ir.graph import Category, OpGraph


@dataclass(frozen=True)
class GroupIO:
    """Boundary traffic of a group of nodes."""

    inputs: tuple[int, ...]  # tensors read from outside (a view made inside stands for its storage)
    outputs: tuple[int, ...]  # boundary output tensor ids (as read by others)
    bytes_in: int
    bytes_out: int
    matmul_flops: int
    vector_flops: int
    n_kernels: int  # 0 for a group of views only, else 1 (one compiled unit)

    @property
    def bytes(self) -> int:
        return self.bytes_in + self.bytes_out

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.vector_flops


def group_io(
    graph: OpGraph, nodes: Iterable[int], copies: Iterable[int] = (), unread: Iterable[int] = ()
) -> GroupIO:
    """Boundary inputs/outputs, bytes and FLOPs of `nodes` run as one unit.

    `copies` are ops of other groups the unit recomputes (planner.fusion.recompute): their
    FLOPs count and their inputs are read unless made inside, but their results are never
    written (another group, or no group, owns them). `unread` are tensors of `nodes` that
    every other group reading them recomputes: not written either."""
    copied = set(copies)
    members = set(nodes) | copied
    produced: set[int] = set()
    read: dict[int, None] = {}  # tensors the group's real work reads (views seen through)
    mm = vec = 0
    any_work = False
    for i in sorted(members):
        n = graph.nodes[i]
        produced.update(n.outputs)
        if n.category is not Category.VIEW:
            for t in n.inputs:
                read[t] = None
        if n.category is Category.COMPUTE:
            mm += n.flops
        else:
            vec += n.flops
        any_work = any_work or n.category is not Category.VIEW
    graph_outputs = set(graph.outputs)
    # A view made inside the group of an outside tensor reads that tensor through the view.
    inputs = tuple(t for t in read if t not in produced or graph.root(t) not in produced)
    skip = set(unread)
    own = {t for t in produced if graph.tensors[t].producer not in copied and t not in skip}
    outputs = tuple(
        t
        for t in sorted(own)
        if t in graph_outputs or any(c not in members for c in graph.consumers[t])
    )
    # Reads: per storage root, the bytes of the views read, capped by the storage size.
    by_root: dict[int, int] = {}
    for t in inputs:
        r = graph.root(t)
        by_root[r] = by_root.get(r, 0) + graph.read_bytes(t)
    bytes_in = sum(min(b, graph.tensors[r].nbytes) for r, b in by_root.items())
    # Writes: each escaping storage root that this group produces, once.
    roots_out = {graph.root(t) for t in outputs}
    bytes_out = sum(graph.tensors[r].nbytes for r in roots_out if r in produced)
    return GroupIO(inputs, outputs, bytes_in, bytes_out, mm, vec, 1 if any_work else 0)


@dataclass(frozen=True)
class GroupCost:
    """Predicted time of one group run as one unit: C(P) of docs/formulas.md §4 and §11.

    latency_s = max(t_compute_s, t_memory_s) + t_launch_s, times `correction` when a
    learned model adjusted the analytical figure (1.0 otherwise).
    """

    latency_s: float
    t_compute_s: float
    t_memory_s: float
    t_launch_s: float
    flops: int
    bytes_in: int
    bytes_out: int
    correction: float = 1.0

    @property
    def bound(self) -> str:
        if self.t_compute_s == self.t_memory_s == 0:
            return "launch" if self.t_launch_s else "free"
        return "compute" if self.t_compute_s >= self.t_memory_s else "memory"

    @property
    def intensity(self) -> float:
        moved = self.bytes_in + self.bytes_out
        return self.flops / moved if moved else float("inf")


@runtime_checkable
class CostModel(Protocol):
    """Scores a group of nodes of a graph as one compiled unit.

    Contract: `group_cost` is a pure function of (graph, nodes) for a fitted model, so
    callers may cache it by (graph.key, frozenset(nodes)); it never raises for a legal
    group and is safe to call from several threads. `name` and `version` go into plans
    and cache keys so plans made under another model are not trusted silently.
    """

    name: str
    version: str

    def group_cost(self, graph: OpGraph, nodes: frozenset[int]) -> GroupCost: ...
