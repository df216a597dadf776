"""The analytical model against docs/formulas.md, on hand-built and captured graphs."""

from __future__ import annotations

import pytest
import torch

import zoo
from learned_cost.analytical import (
    AnalyticalModel,
    bandwidth_saving,
    roofline,
    unfused_bytes,
    vertical_fusion_speedup,
)
from learned_cost.features import analytical_parts
from learned_cost.report import analyze
from planner.cost import group_io
from planner.features import group_descriptor
from planner.hardware import TF32, get_spec
from planner.ir.capture import capture
from planner.ir.graph import Category, OpGraph, OpNode, TensorInfo
from planner.ir.taxonomy import CONV_OPS


def relu_chain(n_ops: int, numel: int = 1 << 20, dtype: str = "float32") -> OpGraph:
    """x -> relu -> relu -> ... (n_ops), built by hand."""
    size = {"float32": 4, "bfloat16": 2}[dtype]
    tensors = [TensorInfo(0, (numel,), dtype, "input")]
    nodes = []
    for i in range(n_ops):
        tensors.append(TensorInfo(i + 1, (numel,), dtype, "activation", producer=i))
        nodes.append(
            OpNode(
                i,
                f"relu{i}",
                "aten.relu.default",
                Category.POINTWISE,
                (i,),
                (i + 1,),
                flops=numel,
                bytes_read=numel * size,
                bytes_written=numel * size,
            )
        )
    return OpGraph.build(nodes, tensors, [n_ops])


@pytest.fixture
def h100():
    return get_spec("h100", measured=False)


def test_single_op_is_max_of_compute_and_memory_plus_launch(h100):
    g = relu_chain(1)
    c = AnalyticalModel(h100).group_cost(g, frozenset({0}))
    assert c.t_memory_s == pytest.approx(2 * (1 << 20) * 4 / h100.mem_bw_Bps)
    assert c.t_compute_s == pytest.approx((1 << 20) / h100.peak_vector_flops("float32"))
    assert c.latency_s == pytest.approx(max(c.t_memory_s, c.t_compute_s) + h100.launch_overhead_s)
    assert c.bound == "memory"


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_vertical_fusion_of_a_chain_divides_memory_time_by_n(h100, n):
    g = relu_chain(n)
    model = AnalyticalModel(h100)
    unfused = sum(model.group_cost(g, frozenset({i})).t_memory_s for i in range(n))
    fused = model.group_cost(g, frozenset(range(n))).t_memory_s
    assert unfused / fused == pytest.approx(n)  # docs/formulas.md §2: S = n
    assert vertical_fusion_speedup(n, 1 << 20, 4, h100) == pytest.approx(n)
    assert bandwidth_saving(g, [range(n)]) == pytest.approx(1 - 1 / n)


def test_internal_tensors_are_free_and_boundary_outputs_written_once():
    g = relu_chain(3)
    io = group_io(g, {0, 1})
    assert io.inputs == (0,) and io.outputs == (2,)  # tensor 2 escapes to node 2
    assert io.bytes_in == io.bytes_out == (1 << 20) * 4
    assert unfused_bytes(g) == 3 * 2 * (1 << 20) * 4


def test_roofline_classification_and_ridge_point(h100):
    ridge = h100.ridge_point("bfloat16")
    assert ridge == pytest.approx(989e12 / 3.35e12)
    r = roofline(flops=ridge * 10, nbytes=10, spec=h100, dtype="bfloat16")
    assert r.bound == "compute" and r.attainable_flops == pytest.approx(989e12)
    r = roofline(flops=ridge * 5, nbytes=10, spec=h100, dtype="bfloat16")
    assert r.bound == "memory"
    assert r.attainable_flops == pytest.approx(ridge * 0.5 * h100.mem_bw_Bps)


def test_measured_peaks_override_datasheet(h100):
    what_if = h100.with_overrides(mem_bw_Bps=1e12)
    g = relu_chain(1)
    slow = AnalyticalModel(what_if).group_cost(g, frozenset({0}))
    fast = AnalyticalModel(h100).group_cost(g, frozenset({0}))
    assert slow.t_memory_s / fast.t_memory_s == pytest.approx(3.35)


def test_views_cost_nothing_and_launch_nothing(h100):
    g = capture(
        *zoo.get("transformer-block").build({"B": 1, "S": 8, "D": 16, "H": 2}, device="meta")
    )
    model = AnalyticalModel(h100)
    for n in g.nodes:
        c = model.group_cost(g, frozenset({n.index}))
        if n.category is Category.VIEW:
            assert c.latency_s == 0
        else:
            assert c.t_launch_s == h100.launch_overhead_s


def test_analyze_report_totals(h100):
    g = capture(
        *zoo.get("transformer-block").build({"B": 8, "S": 512, "D": 768, "H": 12}, device="meta")
    )
    rep = analyze(g, AnalyticalModel(h100), "float32")
    assert rep.unfused_s == pytest.approx(sum(r.predicted_s for r in rep.rows))
    assert rep.fused_lower_bound_s < rep.unfused_s
    # fully fused traffic: read x and the weights, write the output
    weights = sum(t.nbytes for t in g.tensors if t.kind == "param")
    x = g.tensors[next(t.id for t in g.tensors if t.kind == "input")].nbytes
    assert rep.fused_bytes == weights + 2 * x
    assert 0 < rep.eta_bw < 1


@pytest.fixture
def tf32_flags():
    """torch's TF32 flags as the test leaves them: restored afterwards."""
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def _conv_linear_graph(dtype: torch.dtype) -> OpGraph:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(32 * 64, 8)
    ).to(dtype)
    return capture(model, (torch.randn(2, 16, 8, 8, dtype=dtype),), name="conv-linear")


def test_float32_convolutions_are_rated_at_tf32_where_torch_allows_it(h100, tf32_flags):
    g = _conv_linear_graph(torch.float32)
    conv = next(n for n in g.nodes if n.op in CONV_OPS)
    linear = next(n for n in g.nodes if n.category is Category.COMPUTE and n.op not in CONV_OPS)
    model = AnalyticalModel(h100)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
    assert model.group_cost(g, {conv.index}).t_compute_s == pytest.approx(
        conv.flops / h100.matmul_flops[TF32]
    )
    assert model.group_cost(g, {linear.index}).t_compute_s == pytest.approx(
        linear.flops / h100.peak_matmul_flops("float32")
    )
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = False, True
    assert model.group_cost(g, {conv.index}).t_compute_s == pytest.approx(
        conv.flops / h100.peak_matmul_flops("float32")
    )
    assert model.group_cost(g, {linear.index}).t_compute_s == pytest.approx(
        linear.flops / h100.matmul_flops[TF32]
    )
    # the learned model's base reads the same rates from the group's descriptor
    for node in (conv, linear):
        desc = group_descriptor(g, [node.index])
        assert desc["flops_conv"] == (node.flops if node is conv else 0)
        parts = analytical_parts(desc, h100, "float32")
        assert parts.t_compute_s == pytest.approx(model.group_cost(g, {node.index}).t_compute_s)


def test_tf32_changes_nothing_in_other_dtypes_or_on_devices_without_it(tf32_flags):
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    h100, v100 = get_spec("h100", measured=False), get_spec("v100", measured=False)
    assert h100.peak_compute_flops("bfloat16", conv=True) == h100.peak_matmul_flops("bfloat16")
    assert v100.tf32_flops is None
    assert v100.peak_compute_flops("float32", conv=True) == v100.peak_matmul_flops("float32")
    assert get_spec("cpu").peak_compute_flops("float32", conv=True) == get_spec(
        "cpu"
    ).peak_matmul_flops("float32")


def test_a_mixture_of_experts_grouped_gemm_is_a_gemm():
    """transformers' MoE layers call a grouped GEMM (its own custom op on CPU and for
    non-bf16 weights, aten's _grouped_mm otherwise): each token meets one expert's weight."""
    pytest.importorskip("transformers")
    import transformers.integrations.moe  # noqa: F401  (registers the custom op)

    from planner.ir.capture import export_model
    from planner.ir.graph import Category
    from planner.ir.taxonomy import lookup

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 16, 24))

        def forward(self, x, offs):
            return torch.ops.transformers.grouped_mm_fallback(x, self.w, offs).relu()

    x, offs = torch.randn(10, 16), torch.tensor([3, 5, 8, 10], dtype=torch.int32)
    g = export_model(Experts(), (x, offs)).graph
    gemm = g.nodes[0]
    assert (gemm.op, gemm.category, gemm.flops) == (
        "grouped_mm_fallback",
        Category.COMPUTE,
        2 * 10 * 24 * 16,
    )
    assert lookup("aten._grouped_mm.default").category is Category.COMPUTE
    assert lookup("aten.add.Tensor").category is Category.POINTWISE
