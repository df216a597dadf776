"""A captured graph's pipeline stages: the ops cut into contiguous stages in op order,
balanced by cost, and what each stage costs (`pipeline.StageCost`).

`split_stages` minimizes the costliest stage over contiguous cuts (bisection on the cap,
greedy packing, exact up to the bisection's tolerance). `stage_costs` prices each stage
for the whole captured batch run as one micro-batch:
- forward: the sum of its ops' times; backward: `backward_factor` times that;
- fixed overhead per micro-batch: the sum of its ops' launch times (forward; times
  `backward_factor` for the backward, which runs about as many kernels per op);
- sent to the next stage: every activation produced at or before the cut and read after
  it (by its storage, once; one read two stages on is forwarded through the stage between),
  and every user input read after it (the micro-batch's data enters at stage 0);
  parameters, buffers and constants are not sent: each stage holds its own;
- activation memory: what the stage's ops produce (outputs of every op but views and
  collectives) plus what it receives; an upper bound on what autograd keeps.

`replicated_stages` is the case of a graph that is itself one pipeline stage (a
zoo:pp-block rank program): its compute, repeated on every stage, and the bytes its
send/recv messages carry.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from planner.distributed.collectives import collectives
from planner.distributed.comm_cost import CollectiveKind
from planner.distributed.pipeline import StageCost
from planner.errors import FusionPlannerError
from planner.ir.graph import Category, OpGraph

_NO_STORAGE = (Category.VIEW, Category.COLLECTIVE)


def _packs(cost_s: Sequence[float], cap: float) -> list[int]:
    """Start index of each stage when stages are filled greedily up to `cap`."""
    starts, filled = [0], 0.0
    for i, c in enumerate(cost_s):
        if filled + c > cap and i > starts[-1]:
            starts.append(i)
            filled = 0.0
        filled += c
    return starts


def split_stages(cost_s: Sequence[float], stages: int) -> list[range]:
    """`stages` contiguous, non-empty runs of op indices whose costliest run is as cheap
    as any such cut allows."""
    n = len(cost_s)
    if stages < 1:
        raise FusionPlannerError(f"a pipeline needs >= 1 stage, got {stages}")
    if stages > n:
        raise FusionPlannerError(
            f"{stages} pipeline stages need at least {stages} ops; the graph has {n}"
        )
    lo, hi = max(cost_s, default=0.0), float(sum(cost_s))
    for _ in range(100):
        if hi - lo <= 1e-12 * max(hi, 1e-30):
            break
        mid = (lo + hi) / 2
        if len(_packs(cost_s, mid)) <= stages:
            hi = mid
        else:
            lo = mid
    starts = _packs(cost_s, hi)
    bounds = [*starts, n]
    runs = [range(a, b) for a, b in itertools.pairwise(bounds)]
    while len(runs) < stages:  # halving a run never raises the costliest one
        k = max(range(len(runs)), key=lambda j: len(runs[j]))
        r = runs[k]
        mid = r.start + len(r) // 2
        runs[k : k + 1] = [range(r.start, mid), range(mid, r.stop)]
    return runs


def _root(graph: OpGraph, tid: int) -> int:
    info = graph.tensors[tid]
    return info.alias_of if info.alias_of is not None else tid


def boundary_bytes(graph: OpGraph, runs: Sequence[range]) -> list[int]:
    """Bytes each cut (after stage s, for s < stages - 1) carries forward: activations
    produced at or before it and user inputs, read after it, each storage once."""
    stage_of = {i: s for s, r in enumerate(runs) for i in r}
    crossing: list[set[int]] = [set() for _ in range(len(runs) - 1)]
    for node in graph.nodes:
        reader = stage_of[node.index]
        for tid in node.inputs:
            root = _root(graph, tid)
            info = graph.tensors[root]
            if info.kind == "input":  # the micro-batch's data arrives at stage 0
                first = 0
            elif info.kind == "activation" and info.producer is not None:
                first = stage_of[info.producer]
            else:  # parameters, buffers, constants: every stage holds its own
                continue
            for cut in range(first, reader):
                crossing[cut].add(root)
    return [sum(graph.tensors[t].nbytes for t in c) for c in crossing]


def _produced_bytes(graph: OpGraph, ops: Sequence[int]) -> int:
    return sum(
        graph.tensors[t].nbytes
        for i in ops
        if graph.nodes[i].category not in _NO_STORAGE
        for t in graph.nodes[i].outputs
        if graph.tensors[t].alias_of is None
    )


def stage_costs(
    graph: OpGraph,
    runs: Sequence[range],
    op_time_s: Sequence[float],
    op_launch_s: Sequence[float],
    backward_factor: float,
) -> list[StageCost]:
    """Each stage's `StageCost` for the captured batch (the module docstring says how)."""
    sent = boundary_bytes(graph, runs)
    out = []
    for s, r in enumerate(runs):
        fwd = sum(op_time_s[i] for i in r)
        launch = min(sum(op_launch_s[i] for i in r), fwd)
        received = sent[s - 1] if s > 0 else 0
        out.append(
            StageCost(
                forward_s=fwd,
                backward_s=backward_factor * fwd,
                activation_bytes=_produced_bytes(graph, r) + received,
                send_bytes=sent[s] if s < len(runs) - 1 else 0,
                forward_overhead_s=launch,
                backward_overhead_s=backward_factor * launch,
            )
        )
    return out


def is_pipeline_stage(graph: OpGraph) -> bool:
    """Whether the graph is one stage's rank program: it holds point-to-point transfers."""
    return any(c.kind is CollectiveKind.SEND_RECV for c in collectives(graph))


def replicated_stages(
    graph: OpGraph,
    stages: int,
    op_time_s: Sequence[float],
    op_launch_s: Sequence[float],
    backward_factor: float,
) -> list[StageCost]:
    """`stages` copies of the stage program `graph`: its ops but the transfers priced as
    one stage, sending the largest message its send/recv ops carry."""
    if stages < 1:
        raise FusionPlannerError(f"a pipeline needs >= 1 stage, got {stages}")
    ops = [n.index for n in graph.nodes if n.category is not Category.COLLECTIVE]
    fwd = sum(op_time_s[i] for i in ops)
    launch = min(sum(op_launch_s[i] for i in ops), fwd)
    messages = [
        m.nbytes
        for c in collectives(graph)
        if c.kind is CollectiveKind.SEND_RECV
        for m in c.messages
    ]
    act = max(messages, default=0)
    produced = _produced_bytes(graph, ops)
    return [
        StageCost(
            forward_s=fwd,
            backward_s=backward_factor * fwd,
            activation_bytes=produced + (act if s > 0 else 0),
            send_bytes=act if s < stages - 1 else 0,
            forward_overhead_s=launch,
            backward_overhead_s=backward_factor * launch,
        )
        for s in range(stages)
    ]
