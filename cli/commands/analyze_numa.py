"""`fusion-plan analyze --numa two-node|os`: the graph's ops placed on NUMA nodes; and
the placement `fusion-plan plan --numa` reports for the groups it searched.

Every op is a group of its own (analyze's per-op view). The graph's inputs and parameters
start spread over the nodes, even bytes per node (numa.interleaved_home); `planner.distributed.numa.place` puts each
group on its cheapest node in order, migrating an input first where its remaining reads
pay for the move. Printed: the groups and tensors on each node, the migrations, and the
objective with the remote-access terms and without them (every read local).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cli import fmt
from planner.distributed.numa import (
    NumaCostModel,
    NumaPlan,
    NumaTopology,
    interleaved_home,
    local_only_s,
    os_topology,
    place,
    two_node,
)
from planner.errors import FusionPlannerError
from planner.hardware import DeviceSpec, get_spec
from planner.ir.graph import OpGraph
from search.numa_search import HomesSearch, placed_cost

NUMA_CHOICES = ("two-node", "os")
_SHOWN = 8  # names listed per node before "... and N more"


def topology(kind: str, spec: DeviceSpec, dtype: str) -> NumaTopology:
    """`two-node`: the simulated machine (100 ns local, 150 ns remote, numa.two_node's
    figures); `os`: this machine's nodes from sysfs, each with an equal share of the CPU
    spec's bandwidth and peak (`spec` where it is a CPU, else the `cpu` spec)."""
    if kind == "two-node":
        return two_node()
    if kind != "os":
        raise FusionPlannerError(f"unknown --numa {kind!r}; use one of {', '.join(NUMA_CHOICES)}")
    cpu = spec if spec.kind == "cpu" else get_spec("cpu")
    topo = os_topology(cpu.mem_bw_Bps, cpu.peak_matmul_flops(dtype))
    n = topo.n_nodes
    return dataclasses.replace(
        topo, local_bw_Bps=cpu.mem_bw_Bps / n, peak_flops=cpu.peak_matmul_flops(dtype) / n
    )


def _names(names: list[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f" ... and {more} more" if more > 0 else "")


def numa_report(
    kind: str, graph: OpGraph, spec: DeviceSpec, dtype: str
) -> tuple[dict[str, Any], str]:
    topo = topology(kind, spec, dtype)
    groups = [frozenset((n.index,)) for n in graph.nodes if n.category.bound != "free"]
    start = interleaved_home(graph, topo.n_nodes)
    plan = place(graph, groups, topo, start)
    home = dict(plan.home)
    home.update((t, n) for t, n in start.items() if t not in home)
    names = [graph.nodes[min(g)].name for g in groups]
    return _render(
        graph,
        topo,
        groups,
        names,
        plan,
        home,
        "inputs and parameters start spread evenly over the nodes",
    )


def plan_numa_report(
    model: NumaCostModel, graph: OpGraph, groups: list[frozenset[int]], names: list[str]
) -> tuple[dict[str, Any], str]:
    """The placement of a plan's groups under the NUMA cost model it was searched with
    (`plan --numa`): each group's node, where each tensor it touches lives, the objective
    with and without the remote-access terms. `names` label the groups."""
    plan = model.placement(graph, groups)
    return _render(
        graph,
        model.topo,
        groups,
        names,
        plan,
        dict(plan.home),
        "inputs and parameters spread evenly over the nodes, each activation where its "
        "producer runs alone; groups priced by the NUMA cost model",
        migrate=False,
    )


def plan_numa_homes_report(
    homes: HomesSearch, graph: OpGraph, groups: list[frozenset[int]], names: list[str]
) -> tuple[dict[str, Any], str]:
    """The placement of the plan `--numa-homes searched` kept (search.numa_search): each
    round's cost under `place`, then the kept plan's groups, tensors and migrations as
    `place` puts them from the starting homes (the cost the rounds compare)."""
    reference = homes.reference.model
    plan = placed_cost(reference, graph, groups)
    lines = [
        f"NUMA homes searched with the partition: {len(homes.rounds)} round(s), kept round "
        f"{homes.best_index}"
    ]
    for i, rnd in enumerate(homes.rounds):
        what = "reference homes" if i == 0 else "homes from the previous round's placement"
        lines.append(
            f"  round {i}: {fmt.time_s(rnd.cost_s)} placed, {len(rnd.partition)} group(s), "
            f"{len(rnd.placed.migrations)} migration(s); {what}"
            + ("" if rnd.kept else " (not cheaper: stopped)")
        )
    home = dict(plan.home)
    home.update((t, n) for t, n in reference.start_home(graph).items() if t not in home)
    payload, text = _render(
        graph,
        reference.topo,
        groups,
        names,
        plan,
        home,
        "inputs and parameters where they start (as for the reference homes); each "
        "activation on its writer's node, inputs migrated where the move pays",
    )
    payload["homes"] = {
        "mode": "searched",
        "kept_round": homes.best_index,
        "rounds": [
            {
                "placed_s": rnd.cost_s,
                "groups": len(rnd.partition),
                "migrations": len(rnd.placed.migrations),
                "kept": rnd.kept,
            }
            for rnd in homes.rounds
        ],
    }
    return payload, "\n".join([*lines, text])


def _render(
    graph: OpGraph,
    topo: NumaTopology,
    groups: list[frozenset[int]],
    group_names: list[str],
    plan: NumaPlan,
    home: dict[int, int],
    how: str,
    migrate: bool = True,
) -> tuple[dict[str, Any], str]:
    local = local_only_s(graph, groups, plan, topo)
    lat = topo.latency_ns
    rows = [
        f"NUMA placement on {topo.n_nodes} node(s) ({topo.source}); access ns "
        + "; ".join(f"node {i}: " + "/".join(f"{x:g}" for x in r) for i, r in enumerate(lat))
        + f"; {how}",
    ]
    nodes: list[dict[str, Any]] = []
    for node in range(topo.n_nodes):
        ops = [name for name, n in zip(group_names, plan.node_of_group, strict=True) if n == node]
        tensors = sorted(t for t, n in home.items() if n == node)
        nbytes = sum(graph.tensors[t].nbytes for t in tensors)
        names = [graph.tensors[t].name for t in tensors]
        nodes.append({"node": node, "groups": ops, "tensors": names, "tensor_bytes": nbytes})
        rows.append(f"  node {node}: {len(ops)} group(s): {_names(ops) or '-'}")
        rows.append(
            f"  node {node}: {len(names)} tensor(s), {fmt.bytes_(nbytes)}: {_names(names) or '-'}"
        )
    for m in plan.migrations:
        rows.append(
            f"  migrated {graph.tensors[m.tensor].name} ({fmt.bytes_(graph.tensors[m.tensor].nbytes)}) "
            f"node {m.src} -> {m.dst}: {fmt.time_s(m.seconds)}"
        )
    extra = plan.cost_s / local - 1 if local else 0.0
    rows.append(
        f"  objective {fmt.time_s(plan.cost_s)} with remote access"
        + (" and migration" if migrate else "")
        + f"; {fmt.time_s(local)} with every access local ({extra:+.1%})"
    )
    payload = {
        "topology": {"source": topo.source, "latency_ns": [list(r) for r in lat]},
        "nodes": nodes,
        "migrations": [
            {
                "tensor": graph.tensors[m.tensor].name,
                "src": m.src,
                "dst": m.dst,
                "seconds": m.seconds,
            }
            for m in plan.migrations
        ],
        "objective_s": plan.cost_s,
        "local_only_s": local,
    }
    return payload, "\n".join(rows)
