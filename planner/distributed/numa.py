"""NUMA-aware fusion cost (seed 002, exercise 7.5): CPU memory as nodes with local and
remote access costs, groups and tensors placed on nodes, and a migration term.

Model. A node's cores stream local memory at `local_bw_Bps`. A core keeps a fixed number
of cache misses in flight, so by Little's law its bandwidth to memory of latency L is
`local_bw_Bps * L_local / L`: with the seed's 100 ns local and 150 ns remote, remote
memory streams at 2/3 of the local rate. A group placed on node n costs

    C(G, n) = max(T_compute, sum over boundary tensors t of bytes_t * L(n, home(t)) / (L_local * B))
              + T_launch

and writes its outputs to node n (first touch). A tensor can instead be migrated to the
group's node first: bytes / B_remote + pages * page_migration_s, worth it when the
tensor is read remotely more than once. The plan's cost is the sum over groups (one
stream of groups, as the single-node objective); `place` picks each group's node, in
topological order, that minimizes its cost given where its inputs live, migrating an
input to the group's node first where its remaining reads make that cheaper.

What the objective then prefers: groups that stay inside a node; fusing across nodes
only when the boundary traffic fusion saves beats the remote reads it forces (a fused
group runs on one node, so an input homed on the other is read remotely).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.cost import group_io
from planner.errors import FusionPlannerError
from planner.ir.graph import OpGraph

PAGE_BYTES = 4096


@dataclass(frozen=True)
class NumaTopology:
    """`latency_ns[i][j]`: an access from node i's cores to node j's memory."""

    latency_ns: tuple[tuple[float, ...], ...]
    local_bw_Bps: float
    peak_flops: float  # one node's cores
    launch_s: float = 2e-6
    page_migration_s: float = 2e-6  # move_pages(2): a few us per 4 KiB page
    source: str = ""

    @property
    def n_nodes(self) -> int:
        return len(self.latency_ns)

    def bandwidth_Bps(self, cpu_node: int, mem_node: int) -> float:
        local = self.latency_ns[cpu_node][cpu_node]
        return self.local_bw_Bps * local / self.latency_ns[cpu_node][mem_node]

    def migration_s(self, nbytes: int, src: int, dst: int) -> float:
        if src == dst:
            return 0.0
        pages = -(-nbytes // PAGE_BYTES)
        return nbytes / self.bandwidth_Bps(dst, src) + pages * self.page_migration_s


def two_node(
    local_ns: float = 100.0,
    remote_ns: float = 150.0,
    local_bw_Bps: float = 20e9,
    peak_flops: float = 1e12,
) -> NumaTopology:
    """Exercise 7.5's machine: two nodes, 100 ns local and 150 ns remote."""
    lat = ((local_ns, remote_ns), (remote_ns, local_ns))
    return NumaTopology(lat, local_bw_Bps, peak_flops, source="seed 002 exercise 7.5")


def os_topology(
    local_bw_Bps: float, peak_flops: float, local_ns: float = 100.0, root: str = "/sys"
) -> NumaTopology:
    """This machine's nodes from /sys/devices/system/node: the kernel's SLIT distances
    (10 = local) scaled so that local is `local_ns`."""
    base = Path(root) / "devices/system/node"
    nodes = sorted(
        int(m.group(1)) for p in base.glob("node*") if (m := re.fullmatch(r"node(\d+)", p.name))
    )
    if not nodes:
        raise FusionPlannerError(f"no NUMA nodes under {base}: is this Linux with sysfs?")
    rows = []
    for n in nodes:
        dist = [float(x) for x in (base / f"node{n}" / "distance").read_text().split()]
        rows.append(tuple(local_ns * d / 10.0 for d in dist))
    return NumaTopology(tuple(rows), local_bw_Bps, peak_flops, source=f"{base}/node*/distance")


def group_cost_s(
    graph: OpGraph, group: frozenset[int], node: int, home: Mapping[int, int], topo: NumaTopology
) -> float:
    """C(G, node): boundary reads at the access cost of each tensor's home node, writes
    to `node`; compute at the node's peak."""
    io = group_io(graph, group)
    if io.n_kernels == 0:
        return 0.0
    mem = 0.0
    for t in io.inputs:
        root = graph.root(t)
        mem += graph.read_bytes(t) / topo.bandwidth_Bps(node, home.get(root, node))
    mem += io.bytes_out / topo.bandwidth_Bps(node, node)
    return max(io.flops / topo.peak_flops, mem) + topo.launch_s


@dataclass(frozen=True)
class Migration:
    """Tensor `tensor` (a root tensor id) moved from node `src` to `dst` before a group
    read it, at `seconds` (NumaTopology.migration_s)."""

    tensor: int
    src: int
    dst: int
    seconds: float


@dataclass(frozen=True)
class NumaPlan:
    """Each group's node and cost (migrations it triggered included), the migrations,
    and where every tensor the plan touched lives at the end (root tensor id -> node)."""

    node_of_group: tuple[int, ...]
    cost_s: float
    per_group_s: tuple[float, ...]
    migrations: tuple[Migration, ...] = ()
    home: tuple[tuple[int, int], ...] = ()


def local_only_s(
    graph: OpGraph, groups: Sequence[frozenset[int]], plan: NumaPlan, topo: NumaTopology
) -> float:
    """The plan's objective without the remote-access terms: each group on its node with
    every tensor it reads local (and no migration)."""
    return sum(group_cost_s(graph, g, n, {}, topo) for g, n in zip(groups, plan.node_of_group))


def _readers(graph: OpGraph, groups: Sequence[frozenset[int]]) -> dict[int, int]:
    """Root tensor id -> how many groups read it across their boundary."""
    out: dict[int, int] = {}
    for g in groups:
        for r in {graph.root(t) for t in group_io(graph, g).inputs}:
            out[r] = out.get(r, 0) + 1
    return out


def _cost_on(
    graph: OpGraph,
    g: frozenset[int],
    node: int,
    home: Mapping[int, int],
    topo: NumaTopology,
    remaining: Mapping[int, int],
    migrate: bool,
) -> tuple[float, list[Migration]]:
    """C(G, node) with each remote input either read remotely or migrated first, as
    `migrate_or_read_remote` decides for its remaining readers (this group and the ones
    not placed yet, counted as if they ran on `node` too)."""
    moves: list[Migration] = []
    if migrate:
        for r in sorted({graph.root(t) for t in group_io(graph, g).inputs}):
            src = home.get(r, node)
            nbytes = graph.tensors[r].nbytes
            if src != node and migrate_or_read_remote(remaining.get(r, 1), nbytes, src, node, topo):
                moves.append(Migration(r, src, node, topo.migration_s(nbytes, src, node)))
    moved = {**home, **{m.tensor: node for m in moves}}
    return group_cost_s(graph, g, node, moved, topo) + sum(m.seconds for m in moves), moves


def place(
    graph: OpGraph,
    groups: Sequence[frozenset[int]],
    topo: NumaTopology,
    home: Mapping[int, int],
    fixed: Mapping[int, int] | None = None,
    migrate: bool = True,
) -> NumaPlan:
    """Each group (in topological order) on the node where it costs least, given where
    its inputs live (`home`: tensor id -> node, for inputs and parameters; a group's
    outputs live on its node). `fixed` pins group positions to nodes. With `migrate`, an
    input homed on another node is moved to the group's node first where that beats
    reading it remotely on each of its remaining reads (`migrate_or_read_remote`); the
    migration's time is charged to the group that triggered it and the tensor lives on
    the new node afterwards."""
    home = dict(home)
    remaining = _readers(graph, groups)
    order = sorted(range(len(groups)), key=lambda i: min(groups[i]))
    node_of = [0] * len(groups)
    costs = [0.0] * len(groups)
    migrations: list[Migration] = []
    for gi in order:
        g = groups[gi]
        options = [fixed[gi]] if fixed and gi in fixed else range(topo.n_nodes)
        priced = {n: _cost_on(graph, g, n, home, topo, remaining, migrate) for n in options}
        best = min(priced, key=lambda n: priced[n][0])
        node_of[gi], (costs[gi], moves) = best, priced[best]
        migrations += moves
        home.update((m.tensor, best) for m in moves)
        io = group_io(graph, g)
        for r in {graph.root(t) for t in io.inputs}:
            remaining[r] = remaining.get(r, 1) - 1
        for t in io.outputs:
            home[graph.root(t)] = best
    return NumaPlan(
        tuple(node_of), sum(costs), tuple(costs), tuple(migrations), tuple(sorted(home.items()))
    )


def interleaved_home(graph: OpGraph, n_nodes: int) -> dict[int, int]:
    """The graph's inputs and parameters spread over the nodes, in order, each on the
    node holding the fewest of their bytes so far (ties: the lower node): even bytes per
    node, as `numactl --interleave=all` spreads pages, at tensor granularity."""
    held = [0] * n_nodes
    out: dict[int, int] = {}
    for t in graph.tensors:
        if t.producer is None and t.alias_of is None:
            node = min(range(n_nodes), key=lambda n: (held[n], n))
            out[t.id] = node
            held[node] += t.nbytes
    return out


def migrate_or_read_remote(reads: int, nbytes: int, src: int, dst: int, topo: NumaTopology) -> bool:
    """Whether moving a tensor to `dst` before `reads` streaming reads from there beats
    reading it remotely each time."""
    remote = reads * nbytes / topo.bandwidth_Bps(dst, src)
    moved = topo.migration_s(nbytes, src, dst) + reads * nbytes / topo.bandwidth_Bps(dst, dst)
    return moved < remote
