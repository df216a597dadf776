"""Legality: every rule of planner.fusion.legality.RULES rejects its illegal case, with its reason."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import LegalityError
from planner.fusion.fuse_rules import default_partition
from planner.fusion.legality import RULES, FusionState, can_merge, check, group_reasons
from planner.fusion.partition import Partition, mask_of
from planner.hardware import get_spec
from tests.partition_helpers import zoo_graph
from zoo.randgraph import GraphBuilder, random_graph

M = (1024, 1024)


def rule_names(reasons: list[str] | tuple[str, ...]) -> set[str]:
    return {r.split(":")[0].split()[-1] for r in reasons}


def test_every_rule_is_documented_and_named_once():
    assert len({r.name for r in RULES}) == len(RULES)
    for r in RULES:
        assert r.why and r.test.startswith("test_legality::")
        assert r.test.split("::")[1] in globals(), f"{r.name} names a test that does not exist"


def test_non_convex_group_is_rejected():
    b = GraphBuilder()
    x = b.input(M)
    (a,) = b.op("aten.relu.default", [x], [M])
    (m,) = b.op("aten.exp.default", [a], [M])
    b.op("aten.add.Tensor", [a, m], [M])
    g = b.build()
    assert rule_names(group_reasons(g, {0, 2})) == {"convex"}
    assert group_reasons(g, {0, 1, 2}) == []


def test_two_convex_groups_can_form_a_cycle():
    b = GraphBuilder()
    x = b.input(M)
    (p,) = b.op("aten.relu.default", [x], [M])  # 0: group A
    (q,) = b.op("aten.sigmoid.default", [x], [M])  # 1: group B
    b.op("aten.mul.Tensor", [p, x], [M])  # 2: group B, fed by A
    b.op("aten.add.Tensor", [q, x], [M])  # 3: group A, fed by B
    g = b.build()
    part = Partition.from_groups(g, [{0, 3}, {1, 2}])
    assert group_reasons(g, {0, 3}) == [] and group_reasons(g, {1, 2}) == []
    report = check(part)
    assert not report.ok and report.group_reasons == ()
    assert rule_names(report.partition_reasons) == {"acyclic"}
    with pytest.raises(LegalityError) as e:
        report.raise_if_illegal()
    assert "cycle" in str(e.value)
    # can_merge sees that cycle coming before anyone builds it
    three = Partition.from_groups(g, [{0, 3}, {1}, {2}])
    a, one, two = (three.group_of[i] for i in (0, 1, 2))
    assert not can_merge(three, one, two)
    assert can_merge(three, a, two) and check(three.merge(a, two)).ok


def test_unrelated_nodes_are_not_one_group():
    b = GraphBuilder()
    x, y = b.input(M), b.input(M)
    b.op("aten.relu.default", [x], [M])
    b.op("aten.sigmoid.default", [y], [M])
    g = b.build()
    assert rule_names(group_reasons(g, {0, 1})) == {"connected"}


def test_siblings_sharing_an_input_are_connected():
    b = GraphBuilder()
    x = b.input(M)
    b.op("aten.relu.default", [x], [M])
    b.op("aten.sigmoid.default", [x], [M])
    assert group_reasons(b.build(), {0, 1}) == []


def test_opaque_op_stays_alone():
    b = GraphBuilder()
    x = b.input(M)
    (c,) = b.op("mylib.mystery.default", [x], [M])
    b.op("aten.relu.default", [c], [M])
    g = b.build()
    assert rule_names(group_reasons(g, {0, 1})) == {"opaque_alone"}
    assert group_reasons(g, {0}) == []


def _linear(b: GraphBuilder, x: int, n: int = 1024) -> int:
    k = b.tensors[x].shape[-1]
    (y,) = b.op("aten.linear.default", [x, b.param((n, k)), b.param((n,))], [(1024, n)])
    return y


def test_two_chained_gemms_are_rejected():
    b = GraphBuilder()
    _linear(b, _linear(b, b.input(M)))
    assert rule_names(group_reasons(b.build(), {0, 1})) == {"one_anchor"}


def test_sibling_gemms_on_one_input_are_legal():
    b = GraphBuilder()
    x = b.input(M)
    for _ in range(3):
        _linear(b, x)
    assert group_reasons(b.build(), {0, 1, 2}) == []


def test_attention_group_holds_two_gemms_legally():
    g = zoo_graph("transformer-block")
    att = {g.node_by_name(n).index for n in ("matmul", "div", "softmax", "matmul_1")}
    assert group_reasons(g, att) == []
    # without the softmax between them the two GEMMs are an ordinary illegal pair
    assert "convex" in rule_names(group_reasons(g, att - {g.node_by_name("softmax").index}))


def test_gemm_prologue_is_rejected():
    b = GraphBuilder()
    x = b.input(M)
    (r,) = b.op("aten.relu.default", [x], [M])
    y = _linear(b, r)
    b.op("aten.gelu.default", [y], [M])
    g = b.build()
    assert rule_names(group_reasons(g, {0, 1})) == {"epilogue_only"}
    assert group_reasons(g, {1, 2}) == []  # the epilogue is fine


def test_reduction_in_a_gemm_group_is_rejected():
    b = GraphBuilder()
    y = _linear(b, b.input(M))
    b.op("aten._softmax.default", [y], [M], {"dim": -1})
    assert rule_names(group_reasons(b.build(), {0, 1})) == {"epilogue_only"}


def test_detached_op_in_a_gemm_group_is_rejected():
    b = GraphBuilder()
    x = b.input(M)
    _linear(b, x)
    b.op("aten.relu.default", [x], [M])
    reasons = group_reasons(b.build(), {0, 1})
    assert rule_names(reasons) == {"epilogue_only"} and "detached" in reasons[0]


def test_reductions_of_different_spaces_are_rejected():
    b = GraphBuilder()
    x = b.input(M)
    (s,) = b.op("aten.sum.dim_IntList", [x], [(1024, 1)], {"dim": (-1,), "keepdim": True})
    b.op("aten.amax.default", [s], [(1, 1)], {"dim": (0,), "keepdim": True})
    g = b.build()
    assert rule_names(group_reasons(g, {0, 1})) == {"reduction_space"}


def test_reduction_takes_elementwise_producers_and_consumers():
    b = GraphBuilder()
    x = b.input(M)
    (e,) = b.op("aten.exp.default", [x], [M])
    (s,) = b.op("aten.sum.dim_IntList", [e], [(1024, 1)], {"dim": (-1,), "keepdim": True})
    b.op("aten.div.Tensor", [e, s], [M])
    assert group_reasons(b.build(), {0, 1, 2}) == []


def test_resource_limit_splits_long_chains():
    b = GraphBuilder()
    t = b.input(M)
    for _ in range(300):
        (t,) = b.op("aten.relu.default", [t], [M])
    g = b.build()
    assert rule_names(group_reasons(g, range(300))) == {"resources"}
    assert group_reasons(g, range(200)) == []
    p = default_partition(g, get_spec("h100", measured=False))
    assert 2 <= len(p) <= 3 and check(p).ok


def test_resource_limit_depends_on_the_device():
    b = GraphBuilder("float64")
    y = _linear(b, b.input(M))
    b.op("aten.relu.default", [y], [M])
    g = b.build()
    # fp64 GEMM tiles: 3 x (128x32 + 32x128) x 8 B = 192 KiB of shared memory
    assert rule_names(group_reasons(g, {0, 1}, get_spec("v100", measured=False))) == {"resources"}
    assert group_reasons(g, {0, 1}, get_spec("h100", measured=False)) == []
    assert group_reasons(g, {0}, get_spec("v100", measured=False)) == []  # a singleton always fits


def test_views_are_free_and_join_any_group():
    b = GraphBuilder()
    x = b.input(M)
    (a,) = b.op("aten.relu.default", [x], [M])
    (v,) = b.op("aten.t.default", [a], [M], view=True)
    b.op("aten.exp.default", [v], [M])
    g = b.build()
    assert group_reasons(g, {0, 1}) == [] and group_reasons(g, {1, 2}) == []
    assert group_reasons(g, {1}) == [] and group_reasons(g, {0, 1, 2}) == []


def test_singletons_are_always_legal_on_zoo_and_random_graphs():
    for g in (zoo_graph("llama-block"), zoo_graph("gpt2-block"), random_graph(200, 3)):
        assert check(Partition.singletons(g)).ok


def _random_legal_partition(g, rng: random.Random, merges: int) -> Partition:
    state = FusionState(g)
    for _ in range(merges):
        a = rng.choice(state.groups())
        nbrs = sorted(state.neighbors(a))
        if nbrs:
            b = rng.choice(nbrs)
            if state.can_merge(a, b):
                state.merge(a, b)
    return state.partition()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(4, 40), seed=st.integers(0, 10_000), merges=st.integers(0, 30))
def test_can_merge_agrees_with_check(n, seed, merges):
    """The incremental test search loops use matches the full rule table."""
    g = random_graph(n, seed)
    rng = random.Random(seed)
    p = _random_legal_partition(g, rng, merges)
    assert check(p).ok
    for _ in range(10):
        a, b = rng.randrange(len(p)), rng.randrange(len(p))
        if a == b:
            continue
        assert can_merge(p, a, b) == check(p.merge(a, b)).ok


def test_fusion_state_merges_keep_the_partition_legal():
    g = random_graph(120, 7)
    p = _random_legal_partition(g, random.Random(1), 200)
    assert len(p) < len(g.nodes) and check(p).ok
    assert mask_of(range(len(g.nodes))) == sum(p.masks)
