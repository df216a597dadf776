"""The NUMA objective in the search: strategies price partitions with NumaCostModel on
the simulated two-node machine (numa.two_node: 100 ns local, 150 ns remote)."""

from __future__ import annotations

import importlib.util
import itertools
import json

import pytest
import torch

from cli.main import main
from planner.distributed.numa import NumaCostModel, NumaTopology, group_cost_s, place, two_node
from planner.fusion.partition import Partition
from planner.ir.capture import capture
from planner.objective import Objective
from search.numa_search import search_homes
from search.planning import make_plan
from tests.partition_helpers import zoo_graph

N = 1 << 18  # fp32 elements: 1 MiB per input
S = 4 * N
# the Optuna strategy where optuna is installed
STRATEGIES = ["exact", "priority"] + (["tpe"] if importlib.util.find_spec("optuna") else [])
TOPO = two_node()
B, L = TOPO.local_bw_Bps, TOPO.launch_s
R = TOPO.latency_ns[0][1] / TOPO.latency_ns[0][0]  # remote reads stream at 1/R of local


class ReduceThenScale(torch.nn.Module):
    """b is reduced to one value per row; a is scaled by it."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b.sum(dim=-1, keepdim=True)


class ExpThenAdd(torch.nn.Module):
    """exp(x) + y: the intermediate is as large as each input."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.exp(x) + y


def _capture(module: torch.nn.Module, *shape: int):
    g = capture(module, (torch.randn(*shape), torch.randn(*shape)))
    first, second = (t.id for t in g.tensors if t.kind == "input")
    work = [n.index for n in g.nodes if n.category.bound != "free"]
    assert len(work) == len(g.nodes) == 2  # no views: every partition is {a}{b} or {a, b}
    return g, first, second


def one_node() -> NumaTopology:
    """The same figures as two_node() on a single node: the single-node objective."""
    return NumaTopology(((TOPO.latency_ns[0][0],),), B, TOPO.peak_flops)


def _pick(strategy: str, graph, model) -> Partition:
    made = make_plan(graph, strategy, model, device="cpu", dtype="fp32", budget_s=5.0)
    assert made.plan.cost_model == f"numa/{model.version}"
    return made.partition


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_numa_search_keeps_groups_inside_a_node_where_the_single_node_one_fuses(
    strategy: str,
) -> None:
    # a on node 0, b on node 1. Alone, the reduction runs on node 1 (b local) and writes
    # its 64 row sums (256 B) there; the scale runs on node 0 (a local, the sums remote).
    # Fused, the group runs on one node and reads one of the 1 MiB inputs remotely.
    g, a, b = _capture(ReduceThenScale(), 64, N // 64)
    numa = NumaCostModel(two_node(), home={a: 0, b: 1})
    single = NumaCostModel(one_node(), home={a: 0, b: 0})
    r, sums = R, 4 * 64
    split = (S + sums) / B + L + (S + r * sums + S) / B + L  # sum on node 1, mul on node 0
    fused = (r * S + S + S) / B + L  # on node 0: b remote, a local, the product local
    assert fused - split == pytest.approx((r - 1) * S / B - (1 + r) * sums / B - L)  # > 0

    chosen = _pick(strategy, g, numa)
    assert len(chosen) == 2  # split across the nodes
    single_pick = _pick(strategy, g, single)
    assert len(single_pick) == 1  # one memory: fusing saves the sums' round trip and a launch

    objective = Objective(numa)
    assert objective.evaluate(chosen).total_s == pytest.approx(split)
    assert objective.evaluate(single_pick).total_s == pytest.approx(fused)
    assert objective.evaluate(chosen).total_s < objective.evaluate(single_pick).total_s
    placed = numa.placement(g, chosen.groups)
    by_op = {g.nodes[min(gr)].op: n for gr, n in zip(chosen.groups, placed.node_of_group)}
    assert by_op == {"sum": 1, "mul": 0}
    assert placed.cost_s == pytest.approx(split)
    # with the groups on the nodes their outputs live on, the search's price is place()'s
    assert place(g, chosen.groups, two_node(), {a: 0, b: 1}, migrate=False).cost_s == (
        pytest.approx(split)
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fusing_across_nodes_wins_when_the_saved_traffic_beats_the_remote_reads(
    strategy: str,
) -> None:
    # x on node 1, y on node 0. Alone, exp runs on node 1 and writes e (1 MiB) there; the
    # add reads e and y (one of them remotely either way) and runs on node 0 (ties: the
    # lower node). Fused on node 0, x is read remotely, but e is neither written nor read.
    g, x, y = _capture(ExpThenAdd(), N)
    numa = NumaCostModel(two_node(), home={x: 1, y: 0})
    r = R
    split = (S + S) / B + L + (r * S + S + S) / B + L
    fused = (r * S + S + S) / B + L
    assert split - fused == pytest.approx((1 + r) * S / B - (r - 1) * S / B + L)  # saved > extra

    chosen = _pick(strategy, g, numa)
    assert len(chosen) == 1
    placed = numa.placement(g, chosen.groups)
    assert placed.node_of_group == (0,)  # x lives on node 1: the group reads across nodes
    assert placed.cost_s == pytest.approx(fused)
    objective = Objective(numa)
    assert objective.evaluate(chosen).total_s == pytest.approx(fused)
    assert objective.evaluate(Partition.singletons(g)).total_s == pytest.approx(split)


def test_a_group_writing_where_its_output_lives_pays_the_remote_write() -> None:
    # exp and add fused on node 1 (x local, y remote) write the sum where it lives: node 0
    g, x, y = _capture(ExpThenAdd(), N)
    numa = NumaCostModel(two_node(), home={x: 1, y: 0})
    both = frozenset(n.index for n in g.nodes)
    node, cost = numa.best_node(g, both)
    assert node == 0
    on_1 = group_cost_s(g, both, 1, numa.homes(g), TOPO)
    assert on_1 == pytest.approx((S + R * S + R * S) / B + L)
    assert cost.latency_s < on_1


MLP = ["--model", "zoo:mlp", "--shape", "B=8,D=64,HID=256", "--device", "cpu", "--dtype", "fp32"]


def test_plan_numa_reports_the_placement_of_the_groups_it_searched(capsys, tmp_path) -> None:
    saved = tmp_path / "plan.json"
    argv = ["plan", *MLP, "--numa", "two-node", "--strategy", "exact", "--format", "json"]
    assert main([*argv, "--save-plan", str(saved)]) == 0
    out = json.loads(capsys.readouterr().out)
    numa = out["numa"]
    assert out["cost_model"].startswith("numa/numa-1/")
    assert json.loads(saved.read_text())["cost_model"] == out["cost_model"]
    assert numa["topology"]["latency_ns"] == [[100.0, 150.0], [150.0, 100.0]]
    placed = sorted(name for node in numa["nodes"] for name in node["groups"])
    assert placed == sorted(f"#{row['group']}" for row in out["groups"])
    # the objective is the search's: the sum of the groups' prices under the NUMA model
    assert numa["objective_s"] == pytest.approx(out["totals"]["predicted_s"])
    assert numa["objective_s"] >= numa["local_only_s"] > 0
    assert main(["plan", *MLP, "--numa", "two-node"]) == 0
    assert "with every access local" in capsys.readouterr().out
    assert main(["plan", *MLP, "--numa", "two-node", "--cost-model", "analytical"]) == 2
    assert "leave --cost-model out" in capsys.readouterr().err
    gpu = ["plan", *MLP[:-4], "--device", "h100", "--dtype", "fp32", "--numa", "two-node"]
    assert main(gpu) == 2
    assert "plan for a CPU --device" in capsys.readouterr().err


def test_a_topology_without_nodes_is_refused() -> None:
    from planner.distributed.numa import NumaCostModel, NumaTopology
    from planner.errors import FusionPlannerError

    with pytest.raises(FusionPlannerError, match="at least one node"):
        NumaCostModel(NumaTopology((), 1e9, 1e12))


class ScaleByShiftedSums(torch.nn.Module):
    """a * (b + row sums of c): c is reduced to one value per row, added to b, scales a."""

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return a * (b + c.sum(dim=-1, keepdim=True))


def test_searched_homes_fuse_where_the_reference_home_of_the_output_misled_the_search() -> None:
    # a on node 0, b and c on node 1; S bytes each, `sums` the 64 row sums. Alone, the
    # sum and the add run on node 1, the mul on node 0 (a local, the add's output remote;
    # on node 1 it is the mirror image: ties go to the lower node), so u = a * (...)
    # lives on node 0 under the reference homes. Fused on node 1 (b, c local, a remote),
    # the group writes u remotely at its reference home: (2 + 2r) S, as on node 0 (a, u
    # local, b, c remote); the search splits off the sum instead: its {add, mul} writes u
    # locally on node 0. `place` then runs {add, mul} on node 1 (the sums local) and u is
    # written there, first touch: the next round prices the fused group with u local,
    # (3 + r) S, cheaper than the split by a launch and the sums' round trip, and keeps it.
    g = capture(ScaleByShiftedSums(), tuple(torch.randn(64, N // 64) for _ in range(3)))
    a, b, c = (t.id for t in g.tensors if t.kind == "input")
    model = NumaCostModel(two_node(), home={a: 0, b: 1, c: 1})
    r, sums = R, 4 * 64
    split = (S + sums) / B + L + (S + sums + r * S + S) / B + L  # both groups on node 1
    fused = (S + S + r * S + S) / B + L  # on node 1: b, c, u local, a remote
    assert split - fused == pytest.approx(2 * sums / B + L)  # > 0
    assert (2 + 2 * r) * S / B + L > split  # what the reference homes price the fused group at

    found = search_homes(g, model, strategy="exact")
    assert [len(rnd.partition) for rnd in found.rounds] == [2, 1]
    assert found.reference.cost_s == pytest.approx(split)
    assert found.best.cost_s == pytest.approx(fused) and found.best_index == 1
    assert found.best.placed.node_of_group == (1,)
    assert found.migrations == ()  # one reader each: reading remotely beats moving
    (u,) = next(n.outputs for n in g.nodes if n.op == "mul")
    assert model.homes(g)[u] == 0 and found.best.model.homes(g)[u] == 1


ZOO_SMALL = [  # fp32 on the meta device: shapes only
    ("mlp", {"B": 8, "D": 64, "HID": 256}),
    ("transformer-block", {"B": 1, "S": 16, "D": 32, "H": 2}),
    ("llama-block", {}),
]


@pytest.mark.parametrize("name,shape", ZOO_SMALL)
def test_searched_homes_are_never_worse_than_the_reference_ones(name, shape) -> None:
    graph = zoo_graph(name, torch.float32, **shape)
    model = NumaCostModel(two_node())
    for cap in (1, 2, 4):
        found = search_homes(graph, model, strategy="priority", max_rounds=cap)
        assert 1 <= len(found.rounds) <= cap
        assert found.best.cost_s <= found.reference.cost_s
        assert found.best.cost_s == min(found.round_costs)
        kept = [rnd.cost_s for rnd in found.rounds if rnd.kept]
        assert all(x > y for x, y in itertools.pairwise(kept))  # the kept rounds only get cheaper
        assert all(rnd.kept for rnd in found.rounds[:-1])  # a round no cheaper is the last
        # round 0 searches under the reference homes: the plan --numa-homes reference makes
        assert found.reference.model.version == model.version


def test_plan_numa_homes_searched_prints_the_rounds_and_refuses_it_without_numa(capsys) -> None:
    argv = ["plan", *MLP, "--numa", "two-node", "--strategy", "exact"]
    assert main([*argv, "--numa-homes", "searched", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)["numa"]
    rounds = out["homes"]["rounds"]
    assert out["homes"]["mode"] == "searched" and 1 <= len(rounds) <= 4
    assert out["objective_s"] == pytest.approx(min(r["placed_s"] for r in rounds))
    assert out["objective_s"] <= rounds[0]["placed_s"]
    assert main([*argv, "--numa-homes", "searched"]) == 0
    assert "round 0:" in capsys.readouterr().out
    assert main([*argv, "--numa-homes", "reference", "--format", "json"]) == 0
    assert "homes" not in json.loads(capsys.readouterr().out)["numa"]  # today's report
    assert main(["plan", *MLP, "--numa-homes", "searched"]) == 2
    assert "give --numa two-node|os with it" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--numa-homes", "everywhere"])
    assert refused.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
