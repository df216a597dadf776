"""The objective: sum of C plus sum of T with no byte counted twice, bounds, plans."""

from __future__ import annotations

import math

import pytest

from planner.cost import GroupCost, group_io
from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective, peak_boundary_bytes, realization_of
from search.strategies import get_strategy
from tests.partition_helpers import h100_objective, zoo_graph
from zoo.randgraph import GraphBuilder, random_graph

M = (1024, 1024)  # fp32: 4 MiB per tensor
MIB4 = 1024 * 1024 * 4
NO_VIEWS = {
    "gemm": 0.15,
    "unary": 0.3,
    "binary": 0.2,
    "reduce": 0.05,
    "norm": 0.05,
    "softmax": 0.05,
    "copy": 0.05,
    "create": 0.05,
}


def chain(n: int) -> OpGraph:
    b = GraphBuilder()
    t = b.input(M)
    for _ in range(n):
        (t,) = b.op("aten.relu.default", [t], [M])
    return b.build()


class FixedModel:
    """1 us per op in the group plus 10 us per group: a cost model with known answers."""

    name, version = "fixed", "1"

    def group_cost(self, graph: OpGraph, nodes: frozenset[int]) -> GroupCost:
        io = group_io(graph, nodes)
        lat = 1e-6 * len(nodes) + 10e-6
        return GroupCost(lat, 0.0, 0.0, 10e-6, io.flops, io.bytes_in, io.bytes_out)


class Broken:
    name, version = "broken", "0"

    def group_cost(self, graph: OpGraph, nodes: frozenset[int]) -> GroupCost:
        raise RuntimeError("no model here")


def independent_boundary_bytes(g: OpGraph, p: Partition) -> int:
    """Traffic of a partition of a view-free graph, counted edge by edge: each tensor a
    group reads from outside is read once by that group; each tensor read by another group
    (or returned) is written once by its producer."""
    go = p.group_of
    total = 0
    for t in g.tensors:
        readers = {go[c] for c in g.consumers[t.id]}
        if t.producer is None:
            total += t.nbytes * len(readers)
            continue
        home = go[t.producer]
        others = readers - {home}
        if others or t.id in g.outputs:
            total += t.nbytes * (1 + len(others))
    return total


@pytest.mark.parametrize("seed", range(6))
def test_no_byte_is_counted_twice(seed):
    g = random_graph(40, seed, mix=NO_VIEWS)
    obj = h100_objective()
    for strategy in ("greedy", "priority"):
        p = get_strategy(strategy).plan(g, obj).partition
        ev = obj.evaluate(p)
        assert ev.boundary_bytes == independent_boundary_bytes(g, p)
    single = Partition.singletons(g)
    assert obj.evaluate(single).boundary_bytes == independent_boundary_bytes(g, single)


def test_total_is_sum_of_group_costs_plus_transfers():
    g = zoo_graph("transformer-block")
    p = get_strategy("priority").plan(g, h100_objective()).partition
    plain = h100_objective().evaluate(p)
    assert plain.transfer_s == 0.0
    assert plain.total_s == pytest.approx(sum(c.latency_s for c in plain.group_costs))
    sync = 2e-6
    ev = h100_objective(sync_s=sync).evaluate(p)
    crossings = sum(
        1
        for m in p.masks
        for t in group_io(g, [i for i in range(len(g.nodes)) if m >> i & 1]).inputs
        if g.tensors[g.root(t)].producer is not None
    )
    assert crossings > 0
    assert ev.transfer_s == pytest.approx(sync * crossings)
    assert ev.total_s == pytest.approx(ev.compute_s + ev.transfer_s)
    assert ev.compute_s == pytest.approx(plain.compute_s)


def test_fusing_a_chain_removes_its_intermediate_traffic():
    g = chain(4)
    obj = h100_objective()
    single, whole = obj.evaluate(Partition.singletons(g)), obj.evaluate(Partition.whole(g))
    assert single.boundary_bytes == 8 * MIB4 and whole.boundary_bytes == 2 * MIB4
    assert whole.total_s < single.total_s and whole.n_kernels == 1 and single.n_kernels == 4


def test_critical_path_and_latency_bound():
    b = GraphBuilder()
    x = b.input(M)
    (a,) = b.op("aten.relu.default", [x], [M])
    (l1,) = b.op("aten.exp.default", [a], [M])
    (l2,) = b.op("aten.neg.default", [l1], [M])
    (r,) = b.op("aten.sigmoid.default", [a], [M])
    b.op("aten.add.Tensor", [l2, r], [M])
    g = b.build()
    p = Partition.singletons(g)
    ev = Objective(FixedModel()).evaluate(p)
    assert ev.total_s == pytest.approx(5 * 11e-6)
    assert ev.critical_path_s == pytest.approx(4 * 11e-6)  # relu, exp, neg, add
    tight = Objective(FixedModel(), latency_bound_s=40e-6).evaluate(p)
    assert tight.legal and not tight.feasible and tight.score == math.inf
    assert any("latency bound" in r for r in tight.reasons)
    assert Objective(FixedModel(), latency_bound_s=50e-6).evaluate(p).feasible


def test_peak_memory_of_live_boundary_tensors():
    g = chain(3)
    single = Partition.singletons(g)
    # a alive with b, then b with c (the output): two tensors at once
    assert peak_boundary_bytes(single, single.topo_order()) == 2 * MIB4
    whole = Partition.whole(g)
    assert peak_boundary_bytes(whole, whole.topo_order()) == MIB4
    obj = Objective(FixedModel(), memory_bound_bytes=MIB4)
    assert not obj.evaluate(single).feasible and obj.evaluate(whole).feasible


def test_group_costs_are_cached_and_counted():
    g = zoo_graph("mlp")
    obj = h100_objective()
    p = Partition.singletons(g)
    obj.evaluate(p)
    calls, evals = obj.n_model_calls, obj.n_evals
    obj.evaluate(p)
    assert obj.n_model_calls == calls and obj.n_evals == evals + 1
    obj.group_score(g, 0b11)
    assert obj.n_model_calls == calls + 1 and obj.n_evals == evals + 2


def test_illegal_and_failing_partitions_score_infinite_without_raising():
    g = chain(3)
    bad = Partition.from_groups(g, [{0, 2}, {1}])
    ev = h100_objective().evaluate(bad)
    assert not ev.legal and ev.total_s == math.inf and any("convex" in r for r in ev.reasons)
    broken = Objective(Broken())
    ev = broken.evaluate(Partition.singletons(g))
    assert ev.total_s == math.inf and not ev.feasible
    assert any("cost model failed" in r for r in ev.reasons)
    assert broken.group_score(g, 0b1) == math.inf


def test_make_plan_labels_realizations():
    g = zoo_graph("transformer-block")
    obj = h100_objective()
    res = get_strategy("priority").plan(g, obj)
    plan = obj.make_plan(
        res.partition, res.evaluation, strategy="priority", device="h100", dtype="bfloat16"
    )
    by_op = {g.nodes[i].name: gp.realization for gp in plan.groups for i in gp.nodes}
    assert by_op["softmax"] == "sdpa" and by_op["linear_1"] == "concat_gemm"
    assert by_op["gelu"] == "inductor"
    assert plan.predicted_s == pytest.approx(res.evaluation.total_s)
    assert plan.cost_model == f"analytical/{obj.cost_model.version}" and plan.graph_key == g.key
    assert plan.partition(g) == res.partition


def test_opaque_and_view_only_groups_run_eagerly():
    b = GraphBuilder()
    x = b.input(M)
    (c,) = b.op("mylib.mystery.default", [x], [M])
    b.op("aten.t.default", [c], [M], view=True)
    g = b.build()
    assert realization_of(g, 0b01) == "eager" and realization_of(g, 0b10) == "eager"
    assert realization_of(chain(2), {0, 1}) == "inductor"


def test_cache_follows_the_model_version():
    class Learning(FixedModel):
        version = "1"

    model = Learning()
    obj = Objective(model)
    g = chain(2)
    obj.group_score(g, 0b11)
    model.version = "2"  # e.g. an online update of a learned correction
    obj.group_score(g, 0b11)
    assert obj.n_model_calls == 2
