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

In the search. `place` makes a group's cost depend on where the groups before it ran
(their outputs live there), which a search over partitions cannot cache per group.
`NumaCostModel` prices each group on its own, as every cost model does, by fixing where
each tensor lives before the search: inputs and parameters where `home` puts them, each
activation on the node its producer op runs on when every op runs alone (`place` of the
unfused graph, no migration: `reference_home`). A group runs on the node where

    C(G, n) = max(T_compute, sum over boundary inputs t of bytes_t * L(n, home(t)) / (L_local * B)
                             + sum over boundary outputs t of bytes_t * L(n, home(t)) / (L_local * B))
              + T_launch

is least: it reads and writes each boundary tensor where that tensor lives (the plan
allocates it there). For a group on the node its outputs live on, this is `place`'s
C(G, n). A partition costs the sum over its groups, which the strategies (the exact
planner's dynamic programming included) minimize as they do any cost model's.

The homes can also be searched with the partition (search.numa_search, `plan --numa-homes
searched`), by alternating minimization: search the partition under the current homes
(`NumaCostModel.with_homes`; round 0: the reference homes), `place` it from the starting
homes (activations on their writer's node, inputs migrated where `migrate_or_read_remote`
says the move pays), take the homes `place` ends with as the next round's, and repeat
while the placed cost improves, up to a few rounds, keeping the cheapest. The kept plan's
placed cost is never worse than the reference-homes plan's; it is not a global optimum
over homes (each round's homes follow from the round before).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.cost import GroupCost, GroupIO, group_io
from planner.errors import FusionPlannerError
from planner.hardware import DeviceSpec
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


def _written(graph: OpGraph, group: frozenset[int], io: GroupIO) -> list[int]:
    """The storage roots the group writes across its boundary (GroupIO.bytes_out's)."""
    roots = {graph.root(t) for t in io.outputs}
    return sorted(r for r in roots if graph.tensors[r].producer in group)


def group_terms(
    graph: OpGraph, group: frozenset[int], node: int, home: Mapping[int, int], topo: NumaTopology
) -> tuple[GroupIO, float, float]:
    """(boundary I/O, T_compute, T_memory) of the group on `node`: each boundary tensor
    read and written at the access cost of its home node (`node` where `home` has none:
    an output is then written locally, by first touch)."""
    io = group_io(graph, group)
    mem = 0.0
    for t in io.inputs:
        root = graph.root(t)
        mem += graph.read_bytes(t) / topo.bandwidth_Bps(node, home.get(root, node))
    for r in _written(graph, group, io):
        mem += graph.tensors[r].nbytes / topo.bandwidth_Bps(node, home.get(r, node))
    return io, io.flops / topo.peak_flops, mem


def group_cost_s(
    graph: OpGraph, group: frozenset[int], node: int, home: Mapping[int, int], topo: NumaTopology
) -> float:
    """C(G, node): boundary reads at the access cost of each tensor's home node, writes
    to `node` (or to an output's home where `home` gives one); compute at the node's peak."""
    io, compute, mem = group_terms(graph, group, node, home, topo)
    if io.n_kernels == 0:
        return 0.0
    return max(compute, mem) + topo.launch_s


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
        for r in _written(graph, g, io):  # a view's storage stays where it lives
            home[r] = best
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


def reference_home(graph: OpGraph, topo: NumaTopology, home: Mapping[int, int]) -> dict[int, int]:
    """Where every tensor lives for `NumaCostModel`: the inputs and parameters in `home`
    (those it leaves out on node 0), each activation on the node its producer op runs on
    when every op runs alone (`place` of the unfused graph, without migration)."""
    start = {t.id: 0 for t in graph.tensors if t.producer is None and t.alias_of is None}
    start.update(home)
    singletons = [frozenset((n.index,)) for n in graph.nodes]
    return dict(place(graph, singletons, topo, start, migrate=False).home)


class NumaCostModel:
    """The NUMA objective as a cost model (planner.cost.CostModel): each group on the node
    where it costs least with every tensor where `reference_home` puts it (the module
    doc's C(G, n)); compute at one node's peak, one launch per group. `home` pins the
    graph's inputs and parameters (tensor id -> node); without it they are spread evenly
    over the nodes (`interleaved_home`). `spec` is the device the plan is for (its
    resource limits); the prices come from the topology alone."""

    name = "numa"

    def __init__(
        self,
        topo: NumaTopology,
        spec: DeviceSpec | None = None,
        home: Mapping[int, int] | None = None,
        label: str = "",
        tensor_home: Mapping[int, int] | None = None,
    ):
        if topo.n_nodes == 0:
            raise FusionPlannerError("a NUMA topology needs at least one node")
        self.topo, self.spec = topo, spec
        self.fixed_home = dict(home) if home is not None else None
        self.tensor_home = dict(tensor_home) if tensor_home is not None else None
        self.label = label or topo.source
        pins = (
            "interleaved" if home is None else ",".join(f"{t}:{n}" for t, n in sorted(home.items()))
        )
        figures = (topo.latency_ns, topo.local_bw_Bps, topo.peak_flops, topo.launch_s)
        decided = sorted(self.tensor_home.items()) if self.tensor_home is not None else None
        self.version = f"numa-1/{_digest(repr((figures, pins) + ((decided,) if decided else ())))}"
        self._homes: dict[str, dict[int, int]] = {}

    def __repr__(self) -> str:
        return f"NumaCostModel({self.topo.n_nodes} nodes, {self.label})"

    def start_home(self, graph: OpGraph) -> dict[int, int]:
        """Where the graph's inputs and parameters live before any group runs: `home`,
        or spread evenly over the nodes (`interleaved_home`)."""
        if self.fixed_home is not None:
            return dict(self.fixed_home)
        return interleaved_home(graph, self.topo.n_nodes)

    def homes(self, graph: OpGraph) -> dict[int, int]:
        """Root tensor id -> node, for every tensor of the graph: `reference_home`, with
        the tensors `tensor_home` decides (search.numa_search) where it puts them."""
        got = self._homes.get(graph.key)
        if got is None:
            got = reference_home(graph, self.topo, self.start_home(graph))
            got.update(self.tensor_home or {})
            self._homes[graph.key] = got
        return got

    def with_homes(self, tensor_home: Mapping[int, int]) -> NumaCostModel:
        """The same model with each tensor in `tensor_home` (root tensor id -> node)
        living there instead of at its reference home."""
        return NumaCostModel(self.topo, self.spec, self.fixed_home, self.label, tensor_home)

    def best_node(self, graph: OpGraph, nodes: frozenset[int]) -> tuple[int, GroupCost]:
        """The node the group runs on (the cheapest; ties: the lower) and its cost there."""
        home = self.homes(graph)
        best: tuple[int, GroupCost] | None = None
        for n in range(self.topo.n_nodes):
            io, compute, mem = group_terms(graph, nodes, n, home, self.topo)
            launch = self.topo.launch_s if io.n_kernels else 0.0
            if not io.n_kernels:
                compute = mem = 0.0
            cost = GroupCost(
                max(compute, mem) + launch,
                compute,
                mem,
                launch,
                io.flops,
                io.bytes_in,
                io.bytes_out,
            )
            if best is None or cost.latency_s < best[1].latency_s:
                best = (n, cost)
        assert best is not None
        return best

    def group_cost(self, graph: OpGraph, nodes: frozenset[int]) -> GroupCost:
        return self.best_node(graph, frozenset(nodes))[1]

    def placement(self, graph: OpGraph, groups: Sequence[frozenset[int]]) -> NumaPlan:
        """The groups' nodes and costs under this model, and where the tensors they read
        and write live."""
        priced = [self.best_node(graph, frozenset(g)) for g in groups]
        home = self.homes(graph)
        touched: set[int] = set()
        for g in groups:
            io = group_io(graph, g)
            touched.update(graph.root(t) for t in io.inputs)
            touched.update(_written(graph, frozenset(g), io))
        return NumaPlan(
            tuple(n for n, _ in priced),
            sum(c.latency_s for _, c in priced),
            tuple(c.latency_s for _, c in priced),
            (),
            tuple(sorted((t, home[t]) for t in touched if t in home)),
        )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]
