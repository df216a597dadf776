"""learned_cost.realized: the roofline per kernel of a group's realization."""

from __future__ import annotations

import pytest
import torch

import zoo
from learned_cost.analytical import AnalyticalModel
from learned_cost.realized import RealizedRoofline
from planner.fusion.partition import Partition
from planner.hardware import get_spec
from planner.ir.capture import export_model
from search.planning import make_plan

SHAPE = {"B": 8, "S": 512, "D": 768, "H": 12}


@pytest.fixture(scope="module")
def block():
    """The transformer block captured on meta tensors, bf16 (planning only)."""
    module, inputs = zoo.get("transformer-block").build(SHAPE, dtype=torch.bfloat16, device="meta")
    return export_model(module, inputs).graph


def ids(graph, *names):
    return frozenset(graph.node_by_name(n).index for n in names)


def test_a_gemm_and_its_epilogue_cost_what_their_two_kernels_cost(block):
    real, ideal = RealizedRoofline(get_spec("h100")), AnalyticalModel(get_spec("h100"))
    group = ids(block, "linear_3", "add")
    assert real.kernels(block, group) == [ids(block, "linear_3"), ids(block, "add")]
    split = ideal.group_cost(block, ids(block, "linear_3")).latency_s
    split += ideal.group_cost(block, ids(block, "add")).latency_s
    assert real.group_cost(block, group).latency_s == pytest.approx(split)
    assert real.group_cost(block, group).latency_s > ideal.group_cost(block, group).latency_s


@pytest.mark.parametrize(
    "names",
    [
        ("add", "layer_norm_1"),  # Inductor fuses it: one kernel
        ("matmul", "div", "softmax", "matmul_1", "transpose_4"),  # one SDPA call
        ("linear", "linear_1", "linear_2"),  # one GEMM on concatenated weights
    ],
)
def test_groups_realized_as_one_kernel_cost_what_the_roofline_says(block, names):
    real, ideal = RealizedRoofline(get_spec("h100")), AnalyticalModel(get_spec("h100"))
    group = ids(block, *names)
    assert len(real.kernels(block, group)) == 1
    assert real.group_cost(block, group).latency_s == pytest.approx(
        ideal.group_cost(block, group).latency_s
    )


def test_the_gelu_epilogue_is_one_kernel_on_a_gpu_in_half_precision_only(block):
    group = ids(block, "linear_4", "gelu")
    assert len(RealizedRoofline(get_spec("h100")).kernels(block, group)) == 1
    assert len(RealizedRoofline(get_spec("cpu")).kernels(block, group)) == 2
    module, inputs = zoo.get("transformer-block").build(SHAPE, dtype=torch.float32, device="meta")
    fp32 = export_model(module, inputs).graph
    assert len(RealizedRoofline(get_spec("h100")).kernels(fp32, ids(fp32, "linear_4", "gelu"))) == 2


def test_every_kernel_set_covers_the_group_s_work_once(block):
    real = RealizedRoofline(get_spec("h100"))
    whole = Partition.whole(block).groups[0]
    parts = real.kernels(block, whole)
    seen = [i for p in parts for i in p]
    assert len(seen) == len(set(seen)) and set(seen) <= set(whole)
    work = {i for i in whole if block.nodes[i].category.name != "VIEW"}
    assert work <= set(seen)


def test_planning_with_it_fuses_the_residual_add_into_the_layernorm_not_the_gemm(block):
    made = make_plan(
        block, "priority", RealizedRoofline(get_spec("h100")), device="h100", dtype="bfloat16"
    )
    groups = [frozenset(g) for g in made.partition.groups]
    assert ids(block, "add", "layer_norm_1") in groups
    assert not any(ids(block, "linear_3", "add") <= g for g in groups)
    ideal = make_plan(
        block, "priority", AnalyticalModel(get_spec("h100")), device="h100", dtype="bfloat16"
    )
    assert any(ids(block, "linear_3", "add") <= frozenset(g) for g in ideal.partition.groups)
