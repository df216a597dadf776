"""NUMA-aware fusion cost on exercise 7.5's two-node machine and on this machine's."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from cli.commands import analyze_numa
from cli.main import main
from planner.distributed.numa import (
    group_cost_s,
    local_only_s,
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


class AddRepeatedly(torch.nn.Module):
    """`b` (homed on node 1) added `k` times to a running sum that starts from `a` (node 0)."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        for _ in range(self.k):
            a = a + b
        return a


def _adds(k: int):
    g = capture(AddRepeatedly(k), (torch.randn(N), torch.randn(N)))
    a, b = (t.id for t in g.tensors if t.kind == "input")
    groups = [frozenset((n.index,)) for n in g.nodes]
    return g, a, b, groups


@pytest.mark.parametrize("k", [4, 64])
def test_place_migrates_a_remote_tensor_only_when_its_reads_pay_for_it(k: int) -> None:
    topo = two_node()
    g, a, b, groups = _adds(k)
    pinned = dict.fromkeys(range(len(groups)), 0)  # every add on node 0
    home = {a: 0, b: 1}
    moved = place(g, groups, topo, home, pinned)
    stay = place(g, groups, topo, home, pinned, migrate=False)
    should = migrate_or_read_remote(k, 4 * N, 1, 0, topo)  # break-even near 27 reads of 1 MiB
    assert should == (k == 64)
    if should:
        (m,) = moved.migrations
        assert (m.tensor, m.src, m.dst) == (b, 1, 0)
        assert m.seconds == pytest.approx(topo.migration_s(4 * N, 1, 0))
        local = sum(group_cost_s(g, gr, 0, {a: 0, b: 0}, topo) for gr in groups)
        assert moved.cost_s == pytest.approx(local + m.seconds)
        assert moved.cost_s < stay.cost_s and dict(moved.home)[b] == 0
    else:
        assert moved.migrations == () and moved.cost_s == pytest.approx(stay.cost_s)
    assert stay.migrations == ()


def test_without_remote_terms_the_objective_is_every_read_local() -> None:
    topo = two_node()
    g, a, b, groups = _adds(4)
    plan = place(g, groups, topo, {a: 0, b: 1}, dict.fromkeys(range(len(groups)), 0))
    flat = place(g, groups, two_node(remote_ns=100.0), {a: 0, b: 1})
    assert local_only_s(g, groups, plan, topo) == pytest.approx(flat.cost_s)
    assert local_only_s(g, groups, plan, topo) < plan.cost_s


MLP = ["--model", "zoo:mlp", "--shape", "B=8,D=64,HID=256", "--device", "cpu", "--dtype", "fp32"]


def test_analyze_places_the_ops_on_the_simulated_two_node_machine(capsys) -> None:
    assert main(["analyze", *MLP, "--numa", "two-node", "--format", "json"]) == 0
    numa = json.loads(capsys.readouterr().out)["numa"]
    assert numa["topology"]["latency_ns"] == [[100.0, 150.0], [150.0, 100.0]]
    ops = [op for node in numa["nodes"] for op in node["groups"]]
    assert sorted(ops) == ["linear", "linear_1", "linear_2", "relu", "relu_1"]
    # the parameters start spread over both nodes, so some group reads remote memory
    assert all(node["tensors"] for node in numa["nodes"])
    assert numa["objective_s"] > numa["local_only_s"] > 0
    assert main(["analyze", *MLP, "--numa", "two-node"]) == 0
    text = capsys.readouterr().out
    assert "node 1:" in text and "with every access local" in text


def test_analyze_numa_os_reads_this_machines_nodes_or_says_why_not(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    if Path("/sys/devices/system/node/node0/distance").exists():
        assert main(["analyze", *MLP, "--numa", "os", "--format", "json"]) == 0
        numa = json.loads(capsys.readouterr().out)["numa"]
        assert len(numa["nodes"]) == len(numa["topology"]["latency_ns"]) >= 1
    monkeypatch.setattr(
        analyze_numa, "os_topology", functools.partial(os_topology, root=str(tmp_path))
    )
    assert main(["analyze", *MLP, "--numa", "os"]) == 2
    assert "no NUMA nodes" in capsys.readouterr().err


def test_analyze_numa_rejects_unknown_topologies(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["analyze", *MLP, "--numa", "three-node"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
