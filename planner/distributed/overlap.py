"""Two streams: a plan's cost is the critical path over compute and communication.

A plan's groups run in order on the compute stream; its collectives run in order on a
communication stream. A task starts when its stream is free and every task it reads from
has ended, so a collective overlaps whatever compute does not need its result, and a
consumer waits for it (the `wait_tensor` capture puts after each functional collective
is that consumer's dependency). The plan's latency is the last end time, not the sum.

Reported (seed 000 §2.2): T_comp (busy time of the compute stream), T_comm (of the
communication stream), R = T_comp / T_comm, and the exposed communication
makespan - T_comp: what overlap did not hide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.distributed.collectives import Collective, collective_of
from planner.ir.graph import Category, OpGraph

COMPUTE, COMM = "compute", "comm"


@dataclass(frozen=True)
class Task:
    name: str
    stream: str  # COMPUTE or COMM
    duration_s: float
    deps: tuple[int, ...] = ()  # indices of earlier tasks whose end this one waits for


@dataclass(frozen=True)
class Timeline:
    tasks: tuple[Task, ...]
    start_s: tuple[float, ...]
    end_s: tuple[float, ...]

    @property
    def makespan_s(self) -> float:
        return max(self.end_s, default=0.0)

    def busy_s(self, stream: str) -> float:
        return sum(t.duration_s for t in self.tasks if t.stream == stream)

    @property
    def t_comp_s(self) -> float:
        return self.busy_s(COMPUTE)

    @property
    def t_comm_s(self) -> float:
        return self.busy_s(COMM)

    @property
    def ratio(self) -> float:
        """R = T_comp / T_comm (inf without communication): larger hides more."""
        return self.t_comp_s / self.t_comm_s if self.t_comm_s else float("inf")

    @property
    def exposed_comm_s(self) -> float:
        return max(0.0, self.makespan_s - self.t_comp_s)

    def summary(self) -> dict[str, float]:
        return {
            "t_comp_s": self.t_comp_s,
            "t_comm_s": self.t_comm_s,
            "ratio_R": self.ratio,
            "exposed_comm_s": self.exposed_comm_s,
            "critical_path_s": self.makespan_s,
            "serial_sum_s": self.t_comp_s + self.t_comm_s,
        }


def schedule(tasks: Sequence[Task]) -> Timeline:
    """List-schedule `tasks` in order, each stream running one task at a time."""
    free: dict[str, float] = {}
    start: list[float] = []
    end: list[float] = []
    for i, t in enumerate(tasks):
        if any(d >= i for d in t.deps):
            raise ValueError(f"task {i} ({t.name}) depends on a later task: {t.deps}")
        s = max([free.get(t.stream, 0.0), *(end[d] for d in t.deps)])
        start.append(s)
        end.append(s + t.duration_s)
        free[t.stream] = end[-1]
    return Timeline(tuple(tasks), tuple(start), tuple(end))


def plan_tasks(
    graph: OpGraph,
    groups: Sequence[frozenset[int]],
    group_time_s: Callable[[frozenset[int]], float],
    comm_time_s: Callable[[Collective], float],
    sink_waits: bool = True,
) -> list[Task]:
    """Tasks of a plan: a group holding one collective goes on the communication stream
    (priced by `comm_time_s`), every other group on the compute stream (`group_time_s`);
    `wait_tensor` costs nothing. Groups are taken in the order of their first node, except
    that with `sink_waits` a wait moves to just before its first consumer: capture puts it
    right after the collective, where it would stall the compute stream at once (Inductor's
    `reorder_for_compute_comm_overlap` makes the same move); a wait nothing reads (after
    an `isend`: the program only has to finish the send) moves to the end."""
    groups = list(groups)
    consumers = _consumers(graph)

    def position(g: frozenset[int]) -> float:
        nodes = [graph.nodes[n] for n in g]
        if sink_waits and all(n.op == "wait_tensor" for n in nodes):
            users = [u for n in nodes for t in n.outputs for u in consumers.get(t, ())]
            return min(users, default=len(graph.nodes)) - 0.5
        return float(min(g))

    order = sorted(groups, key=position)
    group_of = {n: gi for gi, g in enumerate(order) for n in g}
    tasks: list[Task] = []
    for gi, g in enumerate(order):
        deps = set()
        for n in g:
            for tid in graph.nodes[n].inputs:
                p = graph.tensors[tid].producer
                if p is not None and group_of[p] != gi:
                    deps.add(group_of[p])
        nodes = [graph.nodes[n] for n in sorted(g)]
        coll = [c for n in nodes if (c := collective_of(graph, n)) is not None]
        if coll:
            (c,) = coll  # legality keeps a collective alone in its group
            tasks.append(Task(nodes[0].name, COMM, comm_time_s(c), tuple(sorted(deps))))
        elif all(n.category is Category.COLLECTIVE for n in nodes):  # wait_tensor
            tasks.append(Task(nodes[0].name, COMPUTE, 0.0, tuple(sorted(deps))))
        else:
            tasks.append(Task(nodes[0].name, COMPUTE, group_time_s(g), tuple(sorted(deps))))
    return tasks


def _consumers(graph: OpGraph) -> dict[int, list[int]]:
    """Tensor id -> indices of the nodes that read it (a view's readers count for its
    source: they need the same data)."""
    out: dict[int, list[int]] = {}
    for n in graph.nodes:
        for t in n.inputs:
            info = graph.tensors[t]
            out.setdefault(t, []).append(n.index)
            if info.alias_of is not None:
                out.setdefault(info.alias_of, []).append(n.index)
    return out
