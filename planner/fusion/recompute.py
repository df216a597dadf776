"""Recompute: a cheap producer duplicated into the groups that consume it, not materialized.

A partition gives every op one home group. Recompute adds *copies*: a group G may also
compute ops whose home is another group, from those ops' inputs, so G no longer reads
their results from memory. An op whose every consumer is then served (computed by a copy
in the consumer's group, or itself dead) and which is not a model output is *dead* in its
home group: nothing runs it there and its result is never written. Copies are recorded
per group as a bitmask of node indices (`Copies`: pairs (group mask, copy mask), sorted).

Legal by construction (`check_copies`; `chain` builds the only copies the search offers):

- each copied op is cheap: elementwise or broadcast (planner.fusion.opkinds), one output
  that is not a model output, no randomness and no in-place update, and at most
  `MAX_FLOPS_PER_ELEMENT` FLOPs per output element (`cheap`); a group holds at most
  `MAX_COPIES` copies, so the recomputed FLOPs are bounded;
- a copy is of an op outside the group, and feeds the group: a member of the group or
  another copy there consumes its result;
- its inputs are available: produced outside the group (a model input, a parameter, another
  group's result, which is then written for it) or by another copy in the group. An op
  outside G that feeds G precedes G in the graph of groups (through its home group), so
  reading its inputs adds no edge that was not already implied: the graph of groups stays
  acyclic.

`effective` gives each group's live members (home members that are not dead) and copies,
which is what the cost models price (`planner.cost.group_io(..., copies=)`) and what the
realizer compiles (planner.realize.graph).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from planner.cost import CostModel, GroupCost
from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import Partition, bits
from planner.fusion.realization import split_label
from planner.ir.graph import OpGraph

MAX_FLOPS_PER_ELEMENT = 32
MAX_COPIES = 8  # copied ops per group
_RANDOM = ("rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "poisson")

Copies = tuple[tuple[int, int], ...]


def as_copies(pairs: Iterable[tuple[int, int]]) -> Copies:
    """The canonical form: one pair per group with copies, by group mask; empty masks dropped."""
    acc: dict[int, int] = {}
    for g, c in pairs:
        if c:
            acc[g] = acc.get(g, 0) | c
    return tuple(sorted(acc.items()))


def cheap(graph: OpGraph, i: int) -> bool:
    """Whether op `i` may be recomputed (see the module doc)."""
    n = graph.nodes[i]
    if kinds(graph)[i] not in (Kind.ELEMWISE, Kind.BROADCAST) or len(n.outputs) != 1:
        return False
    out = n.outputs[0]
    if any(graph.root(t) == graph.root(out) for t in graph.outputs):
        return False
    name = n.target.split(".")
    op = name[1] if len(name) > 1 else n.target
    if any(r in n.target for r in _RANDOM) or (op.endswith("_") and not op.startswith("_")):
        return False
    return n.flops <= MAX_FLOPS_PER_ELEMENT * max(1, graph.tensors[out].numel)


def _producer(graph: OpGraph, t: int) -> int | None:
    return graph.tensors[t].producer


def chain(partition: Partition, node: int, group: int) -> int:
    """The copy mask that recomputes `node` in the group of mask `group`: the node and its
    cheap ancestors in the node's home group (up to `MAX_COPIES` ops), so the group reads
    the chain's inputs rather than an intermediate result; 0 when `node` is not cheap, is
    in the group, or does not feed it."""
    graph = partition.graph
    if group >> node & 1 or not cheap(graph, node):
        return 0
    if not any(group >> c & 1 for c in graph.consumers[graph.nodes[node].outputs[0]]):
        return 0
    home = partition.masks[partition.group_of[node]]
    mask, todo = 1 << node, [node]
    while todo:
        for t in graph.nodes[todo.pop()].inputs:
            p = _producer(graph, t)
            if p is None or not home >> p & 1 or mask >> p & 1 or not cheap(graph, p):
                continue
            if mask.bit_count() < MAX_COPIES:
                mask |= 1 << p
                todo.append(p)
    return mask


def candidates(partition: Partition, limit: int = 8) -> tuple[tuple[int, int, int], ...]:
    """(node, group mask, copy mask) per cheap op whose result another group reads: the
    recompute decisions of a partition, the first `limit` by node index."""
    graph = partition.graph
    go = partition.group_of
    out = []
    for i in range(len(graph.nodes)):
        if not cheap(graph, i):
            continue
        for gi in sorted({go[c] for c in graph.consumers[graph.nodes[i].outputs[0]]} - {go[i]}):
            gm = partition.masks[gi]
            c = chain(partition, i, gm)
            if c:
                out.append((i, gm, c))
    return tuple(out[:limit])


def check_copies(partition: Partition, copies: Copies | Mapping[int, int]) -> str | None:
    """Why `copies` are not legal for `partition` (see the module doc), or None."""
    graph = partition.graph
    masks = set(partition.masks)
    for gm, cm in dict(copies).items():
        if gm not in masks:
            return "copies name a group the partition does not have"
        if cm & gm:
            return "a group copies one of its own ops"
        if cm.bit_count() > MAX_COPIES:
            return f"a group copies {cm.bit_count()} ops (at most {MAX_COPIES})"
        inside = gm | cm
        for i in bits(cm):
            if not cheap(graph, i):
                return f"op {graph.nodes[i].name} is not cheap to recompute"
            if not any(inside >> c & 1 for c in graph.consumers[graph.nodes[i].outputs[0]]):
                return f"the copy of {graph.nodes[i].name} feeds nothing in its group"
            for t in graph.nodes[i].inputs:
                p = _producer(graph, t)
                if p is not None and gm >> p & 1:
                    return f"the copy of {graph.nodes[i].name} reads its own group's result"
    return None


def dead(partition: Partition, copies: Copies | Mapping[int, int]) -> int:
    """Mask of the copied ops no group needs in their home group (see the module doc)."""
    graph = partition.graph
    cm = dict(copies)
    copied = 0
    for c in cm.values():
        copied |= c
    go = partition.group_of
    masks = partition.masks
    out = 0
    for i in sorted(bits(copied), reverse=True):  # consumers before producers
        home = go[i]
        ok = True
        for c in graph.consumers[graph.nodes[i].outputs[0]]:
            users = [] if out >> c & 1 else [go[c]]
            users += [gi for gi, m in enumerate(masks) if cm.get(m, 0) >> c & 1]
            if any(u == home or not cm.get(masks[u], 0) >> i & 1 for u in users):
                ok = False
                break
        if ok and cheap(graph, i):
            out |= 1 << i
    return out


def effective(
    partition: Partition, copies: Copies | Mapping[int, int]
) -> list[tuple[int, int, frozenset[int]]]:
    """(live members, copies, unread) per group of `partition`, aligned with
    `partition.masks`: `unread` are the tensors its live members make that another group
    would read but no longer does (each reader recomputes them), so they are not written."""
    cm = dict(copies)
    if not cm:
        return [(m, 0, frozenset()) for m in partition.masks]
    graph = partition.graph
    gone = dead(partition, cm)
    go, masks = partition.group_of, partition.masks
    graph_outputs = {graph.root(t) for t in graph.outputs}
    copied_by: dict[int, list[int]] = {}
    for gi, m in enumerate(masks):
        for i in bits(cm.get(m, 0)):
            copied_by.setdefault(i, []).append(gi)
    out = []
    for gi, m in enumerate(masks):
        live = m & ~gone
        unread = []
        for i in bits(live):
            for t in graph.nodes[i].outputs:
                if graph.root(t) in graph_outputs:
                    continue
                readers = set()
                for c in graph.consumers[t]:
                    if not gone >> c & 1:
                        readers.add(go[c])
                    readers.update(copied_by.get(c, ()))
                readers.discard(gi)
                served = all(cm.get(masks[h], 0) >> i & 1 for h in readers)
                if readers and served:
                    unread.append(t)
        out.append((live, cm.get(m, 0), frozenset(unread)))
    return out


def flops(graph: OpGraph, mask: int) -> int:
    return sum(graph.nodes[i].flops for i in bits(mask))


def group_cost(
    cost_model: CostModel,
    graph: OpGraph,
    live: int,
    copies: int,
    label: str | None = None,
    unread: frozenset[int] = frozenset(),
) -> GroupCost:
    """What a group with live members `live` and copies `copies` (masks) costs: nothing
    when both are empty (its every op is dead: no kernel runs); else the model's
    `group_cost_recomputing` (learned_cost), or, for a model without it, the ops as one
    group (the copies' and `unread` results then charged as written: an over-estimate).
    Run eagerly (`label` "eager") by a model that does not split groups into kernels
    itself, the group costs its ops one kernel each."""
    if not live and not copies:
        return GroupCost(0.0, 0.0, 0.0, 0.0, 0, 0, 0)
    if (
        copies and label and split_label(label)[0] == "eager" and not hasattr(cost_model, "kernels")
    ):  # one kernel per op, each result written: the ops alone
        ks = kinds(graph)
        work = [i for i in bits(live | copies) if ks[i] is not Kind.FREE]
        costs = [cost_model.group_cost(graph, frozenset((i,))) for i in work]
        return GroupCost(
            sum(c.latency_s for c in costs),
            sum(c.t_compute_s for c in costs),
            sum(c.t_memory_s for c in costs),
            sum(c.t_launch_s for c in costs),
            sum(c.flops for c in costs),
            sum(c.bytes_in for c in costs),
            sum(c.bytes_out for c in costs),
        )
    priced = getattr(cost_model, "group_cost_recomputing", None)
    if priced is not None:
        return priced(graph, frozenset(bits(live)), frozenset(bits(copies)), label, unread)
    return cost_model.group_cost(graph, frozenset(bits(live | copies)))


__all__ = [
    "MAX_COPIES",
    "MAX_FLOPS_PER_ELEMENT",
    "Copies",
    "as_copies",
    "candidates",
    "chain",
    "cheap",
    "check_copies",
    "dead",
    "effective",
    "flops",
    "group_cost",
]
