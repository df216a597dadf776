"""NUMA-aware fusion cost on exercise 7.5's two-node machine and on this machine's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.distributed.numa import (
    group_cost_s,
    migrate_or_read_remote,
    os_topology,
    place,
    two_node,
)
from planner.ir.capture import capture

N = 1 << 18  # 1 MiB of fp32 per input


class ReduceThenScale(torch.nn.Module):
    """b (homed on node 1) is reduced to one value per row; a (node 0) is scaled by it."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b.sum(dim=-1, keepdim=True)


def _graph():
    g = capture(ReduceThenScale(), (torch.randn(64, N // 64), torch.randn(64, N // 64)))
    inputs = [t.id for t in g.tensors if t.kind == "input"]
    work = [n.index for n in g.nodes if n.op in ("sum", "mul")]
    return g, inputs, work


def test_remote_reads_cost_the_latency_ratio() -> None:
    topo = two_node()
    assert topo.bandwidth_Bps(0, 1) == pytest.approx(20e9 * 100 / 150)
    g, (a, b), (s, _) = _graph()
    local = group_cost_s(g, frozenset((s,)), 1, {a: 0, b: 1}, topo)
    remote = group_cost_s(g, frozenset((s,)), 0, {a: 0, b: 1}, topo)
    nbytes = 4 * N
    out = 4 * 64
    assert local == pytest.approx(nbytes / 20e9 + out / 20e9 + topo.launch_s)
    assert remote == pytest.approx(nbytes * 150 / (100 * 20e9) + out / 20e9 + topo.launch_s)


def test_fusing_across_nodes_loses_unless_memory_is_uniform() -> None:
    g, (a, b), (s, m) = _graph()
    home = {a: 0, b: 1}
    views = [frozenset((n.index,)) for n in g.nodes if n.index not in (s, m)]
    unfused = [frozenset((s,)), frozenset((m,)), *views]
    fused = [frozenset((s, m)), *views]
    numa = two_node()
    split, joined = place(g, unfused, numa, home), place(g, fused, numa, home)
    # unfused: the reduction runs where b lives, the scale where a lives
    assert split.node_of_group[:2] == (1, 0)
    assert split.cost_s < joined.cost_s  # fused, one of the 1 MiB inputs is read remotely
    flat = two_node(remote_ns=100.0)  # one memory: fusion saves a launch and a round trip
    assert place(g, fused, flat, home).cost_s < place(g, unfused, flat, home).cost_s


def test_migration_pays_off_only_for_repeated_reads() -> None:
    topo = two_node()
    assert not migrate_or_read_remote(1, 1 << 20, 1, 0, topo)
    # 1 MiB: 256 pages x 2 us + one remote copy against 1/3 of the bandwidth on each read;
    # break-even near 27 reads
    assert not migrate_or_read_remote(16, 1 << 20, 1, 0, topo)
    assert migrate_or_read_remote(64, 1 << 20, 1, 0, topo)
    assert topo.migration_s(4096, 0, 0) == 0.0


def test_os_topology_from_sysfs(tmp_path: Path) -> None:
    for n, row in enumerate(("10 21", "21 10")):
        d = tmp_path / "devices/system/node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "distance").write_text(row + "\n")
    topo = os_topology(20e9, 1e12, root=str(tmp_path))
    assert topo.latency_ns == ((100.0, 210.0), (210.0, 100.0))


def test_this_machines_topology_reads_and_places() -> None:
    if not Path("/sys/devices/system/node/node0/distance").exists():
        pytest.skip("no NUMA information in sysfs here")
    topo = os_topology(20e9, 1e12)
    assert topo.n_nodes >= 1
    assert all(topo.latency_ns[i][i] == 100.0 for i in range(topo.n_nodes))
    g, (a, b), _ = _graph()
    plan = place(g, [frozenset((n.index,)) for n in g.nodes], topo, {a: 0, b: topo.n_nodes - 1})
    assert plan.cost_s > 0 and all(0 <= n < topo.n_nodes for n in plan.node_of_group)
