"""Capture: FLOPs and bytes against hand-derived counts, categories, errors, fingerprints."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zoo
from planner.distributed.parallel_models import has_functional_p2p
from planner.errors import CaptureError
from planner.ir.capture import UnknownOpWarning, capture, export_model, graph_from_program
from planner.ir.graph import Category


def _one(graph, op):
    nodes = [n for n in graph.nodes if n.op == op]
    assert len(nodes) == 1, [n.target for n in graph.nodes]
    return nodes[0]


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def test_linear_flops_and_bytes_are_exact():
    m = nn.Linear(64, 32)
    g = capture(m, (torch.randn(4, 64),))
    n = _one(g, "linear")
    assert n.category is Category.COMPUTE
    assert n.flops == 2 * 4 * 32 * 64 + 4 * 32  # 2MNK + bias
    assert n.bytes_read == (4 * 64 + 32 * 64 + 32) * 4  # x, W, b in fp32
    assert n.bytes_written == 4 * 32 * 4


def test_batched_matmul_flops():
    g = capture(_Fn(torch.matmul), (torch.randn(2, 3, 8, 16), torch.randn(2, 3, 16, 4)))
    assert _one(g, "matmul").flops == 2 * (2 * 3) * 8 * 4 * 16


def test_conv_flops_count_kernel_window_and_bias():
    m = nn.Conv2d(3, 8, 3, padding=1)
    g = capture(m, (torch.randn(2, 3, 16, 16),))
    n = _one(g, "conv2d")
    out = 2 * 8 * 16 * 16
    assert n.flops == 2 * out * (3 * 3 * 3) + out


def test_grouped_conv_divides_input_channels():
    m = nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=False)
    g = capture(m, (torch.randn(1, 8, 10, 10),))
    assert _one(g, "conv2d").flops == 2 * (8 * 10 * 10) * (2 * 3 * 3)


def test_sdpa_counts_two_gemms_and_softmax():
    q = torch.randn(1, 2, 8, 4)
    g = capture(_Fn(F.scaled_dot_product_attention), (q, q.clone(), q.clone()))
    n = _one(g, "scaled_dot_product_attention")
    assert n.flops == 2 * (2 * 8 * 8 * 4) * 2 + 5 * 2 * 8 * 8


def test_memory_bound_per_element_counts():
    x = torch.randn(4, 10)
    g = capture(_Fn(lambda t: torch.softmax(t, -1)), (x,))
    sm = _one(g, "softmax")
    assert (sm.category, sm.flops, sm.bytes_read, sm.bytes_written) == (
        Category.SOFTMAX,
        5 * 40,
        160,
        160,
    )
    g = capture(nn.LayerNorm(10), (x,))
    ln = _one(g, "layer_norm")
    assert (ln.category, ln.flops, ln.bytes_read) == (Category.NORM, 8 * 40, 160 + 40 + 40)
    g = capture(_Fn(lambda t: t.sum(-1)), (x,))
    assert _one(g, "sum").flops == 40
    g = capture(_Fn(F.gelu), (x,))
    assert _one(g, "gelu").flops == 5 * 40


def test_pointwise_chain_op_count_and_flops():
    m, inputs = zoo.get("pointwise-chain").build({"N": 1000, "STEPS": 2})
    g = capture(m, inputs)
    # step 0: sigmoid, mul; step 1: mul, add, relu
    assert [n.op for n in g.nodes] == ["sigmoid", "mul", "mul", "add", "relu"]
    assert g.total_flops == 1000 * (4 + 1 + 1 + 1 + 1)
    assert all(n.bytes_read == n.bytes_written == 4000 for n in g.nodes)


def test_views_are_free_and_reshape_of_transposed_tensor_copies():
    def f(x):
        y = x.transpose(0, 1)  # a view
        return y.reshape(-1), x.reshape(-1)  # the first must copy, the second is a view

    g = capture(_Fn(f), (torch.randn(4, 6),))
    t = _one(g, "transpose")
    assert t.category is Category.VIEW and t.bytes_read == t.bytes_written == 0
    cats = sorted(
        n.category.value for n in g.nodes if n.op in ("reshape", "view", "clone", "_unsafe_view")
    )
    assert "copy" in cats and "view" in cats
    out_view = g.tensors[g.outputs[1]]
    assert out_view.alias_of is not None  # x.reshape(-1) aliases the input


def test_unknown_op_becomes_opaque_with_a_warning_naming_it():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = capture(_Fn(lambda a: torch.linalg.inv(a) + 1), (torch.randn(4, 4),))
    inv = [n for n in g.nodes if "linalg_inv" in n.target]
    assert inv and inv[0].category is Category.OPAQUE
    msgs = [str(w.message) for w in caught if issubclass(w.category, UnknownOpWarning)]
    assert len(msgs) == 1 and "aten.linalg_inv" in msgs[0]


def test_routing_ops_are_known_opaque_with_their_cost_and_no_warning():
    """Sorting, top-k and counting (a mixture-of-experts router) run as library kernels: never
    fused, their work counted, no warning."""

    def route(x):
        w, idx = torch.topk(x.softmax(-1), 2, dim=-1)
        counts = torch.histc(idx.float(), bins=8, min=0, max=7)
        return w.sort(-1).values, counts

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = capture(_Fn(route), (torch.randn(6, 8),))
    assert not [w for w in caught if issubclass(w.category, UnknownOpWarning)]
    for op in ("topk", "histc", "sort"):
        (n,) = [n for n in g.nodes if n.op == op]
        assert n.category is Category.OPAQUE and n.flops > 0


def test_resampling_and_meshgrid_are_known_ops():
    """Interpolation (a BEiT's position-bias resize, a segmentation head), meshgrid and weight
    normalization (wav2vec2's position convolution) are in the op table, no warning."""

    def resize(x):
        gy, gx = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
        up = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
        near = torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        g = torch._weight_norm(x, x.new_ones(1, 2, 1, 1), 1)  # a weight-norm parametrization
        return up + near + (gy + gx).float()[None, None].repeat(1, 1, 2, 2) + g.sum()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = capture(_Fn(resize), (torch.randn(1, 2, 4, 4),))
    assert not [w for w in caught if issubclass(w.category, UnknownOpWarning)]
    (bilinear,) = [n for n in g.nodes if n.op == "upsample_bilinear2d"]
    assert bilinear.category is Category.COPY and bilinear.flops == 7 * 2 * 8 * 8


def test_einsum_is_a_contraction_with_its_flops():
    """A Funnel transformer's attention scores come as einsum, which export keeps whole."""

    def scores(q, k):
        return torch.einsum("bind,bjnd->bnij", q, k), torch.einsum(
            "i,j->ij", q[0, 0, 0], k[0, 0, 0]
        )

    g = capture(_Fn(scores), (torch.randn(2, 5, 3, 4), torch.randn(2, 6, 3, 4)))
    contraction, outer = [n for n in g.nodes if n.op == "einsum"]
    assert contraction.category is Category.COMPUTE
    assert contraction.flops == 2 * (2 * 5 * 3 * 4 * 6)  # b i n d j, d summed
    assert outer.flops == 4 * 4  # nothing summed: one multiply per output


def test_numpy_style_aliases_and_patch_extraction_are_known_ops():
    """ConvBERT's span convolution: `unfold` (im2col) and `torch.multiply`, an alias export
    keeps as written; `fold` sums the overlapping patches back."""

    def span(a):
        u = torch.nn.functional.unfold(a, 3, padding=1)
        back = torch.nn.functional.fold(u, (4, 4), 3, padding=1)
        return torch.multiply(u, 2.0), torch.subtract(back, 1), torch.divide(a, 3)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = capture(_Fn(span), (torch.randn(1, 2, 4, 4),))
    assert not [w for w in caught if issubclass(w.category, UnknownOpWarning)]
    by_op = {n.op: n for n in g.nodes}
    assert by_op["im2col"].category is Category.COPY and by_op["im2col"].flops == 0
    assert by_op["multiply"].category is Category.POINTWISE
    assert by_op["multiply"].flops == 2 * 9 * 16  # one per element of the patches
    assert by_op["col2im"].flops == 2 * 9 * 16  # one add per patch element


def test_untraceable_model_raises_one_clear_error():
    def f(x):
        return x + 1 if x.sum() > 0 else x - 1

    with pytest.raises(CaptureError, match="could not trace"):
        capture(_Fn(f), (torch.randn(3),))


def test_bad_arguments_raise_capture_error():
    with pytest.raises(CaptureError, match=r"nn\.Module"):
        capture(lambda x: x, (torch.randn(2),))
    with pytest.raises(CaptureError, match="example_inputs must be"):
        capture(nn.ReLU(), {torch.randn(2)})
    # a dict is keyword arguments: ReLU.forward takes `input`, not `x`
    with pytest.raises(CaptureError, match=r"example_inputs do not fit ReLU\.forward"):
        capture(nn.ReLU(), {"x": torch.randn(2)})
    assert len(capture(nn.ReLU(), {"input": torch.randn(2)}).nodes) == 1


# Categories every zoo op must get: written from the taxonomy of docs/formulas.md §1,
# independently of the rule table, so a wrong table entry fails here.
EXPECTED = {
    "linear": "compute",
    "matmul": "compute",
    "conv2d": "compute",
    "scaled_dot_product_attention": "compute",
    "layer_norm": "norm",
    "_native_batch_norm_legit_no_training": "norm",
    "softmax": "softmax",
    "mean": "reduction",
    "max_pool2d": "reduction",
    "avg_pool2d": "reduction",
    "add": "pointwise",
    "mul": "pointwise",
    "div": "pointwise",
    "gelu": "pointwise",
    "relu": "pointwise",
    "sigmoid": "pointwise",
    "silu": "pointwise",
    "neg": "pointwise",
    "rsqrt": "pointwise",
    "pow": "pointwise",
    "masked_fill": "pointwise",
    "bitwise_not": "pointwise",
    "type_as": "pointwise",
    "_to_copy": "pointwise",
    "ones": "broadcast",
    "tril": "broadcast",
    "full": "broadcast",
    "triu": "broadcast",
    "cat": "copy",
    "clone": "copy",
    "view": "view",
    "transpose": "view",
    "permute": "view",
    "split": "view",
    "slice": "view",
    "_unsafe_view": "view",
    "unsqueeze": "view",
    "chunk": "view",
    "expand": "view",
    "all_reduce": "collective",
    "irecv": "collective",
    "isend": "collective",
    "wait_tensor": "collective",
    "split_with_sizes": "view",
}


P2P_MISSING = f"torch {torch.__version__} has no functional point-to-point ops"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.skipif(not has_functional_p2p(), reason=P2P_MISSING))
        if n == "pp-block"
        else n
        for n in sorted(zoo.ZOO)
    ],
)
def test_every_zoo_model_runs_eagerly_and_captures_with_known_categories(name):
    m = zoo.get(name)
    # PP: the one fake group of this process has the 2 ranks the TP and DP models use
    small = {
        k: min(v, {"D": 64, "HID": 64, "C": 16, "CIN": 4, "N": 4096, "MAXS": 64, "PP": 2}.get(k, 8))
        for k, v in m.defaults.items()
    }
    if "H" in small:
        small["H"] = 4
    if "S" in small:
        small["S"] = 16
    module, inputs = m.build(small)
    with torch.no_grad():
        module(*inputs)  # runs eagerly
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownOpWarning)
        g = capture(module, inputs)
    assert len(g.nodes) > 0
    for n in g.nodes:
        want = EXPECTED.get(n.op)
        assert want is not None, f"{name}: op {n.target} has no expected category in this test"
        if n.op in ("view", "_unsafe_view", "reshape") and n.category is Category.COPY:
            continue  # a reshape may legitimately materialize
        if n.op == "type_as" and n.category is Category.VIEW:
            continue  # a cast to the dtype it has (the fp32 zoo): see the test below
        assert n.category.value == want, f"{name}: {n.target} -> {n.category.value}, want {want}"
        assert n.flops >= 0 and n.bytes_read >= 0


def test_fingerprint_is_stable_and_shape_sensitive():
    m = zoo.get("transformer-block")
    p = {"B": 2, "S": 16, "D": 32, "H": 2}
    g1 = capture(*m.build(p, seed=0))
    g2 = capture(*m.build(p, seed=1))  # other weights, same structure and shapes
    g3 = capture(*m.build(p, device="meta"))  # no data at all
    assert g1.key == g2.key == g3.key
    g4 = capture(*m.build({**p, "S": 32}))
    assert g4.key != g1.key and g4.structure_key == g1.structure_key
    g5 = capture(*m.build({**p, "D": 64}))
    assert g5.structure_key != g1.structure_key


def test_fingerprint_ignores_node_names():
    cap = export_model(*zoo.get("mlp").build({"B": 4, "D": 16, "HID": 32, "L": 1}))
    gm = cap.program.graph_module
    for i, node in enumerate(gm.graph.nodes):
        if node.op == "call_function":
            node.name = f"renamed_{i}"
    g = graph_from_program(cap.program)
    assert {n.name for n in g.nodes} != {n.name for n in cap.graph.nodes}
    assert g.key == cap.graph.key


def test_shape_signature_lists_user_inputs():
    g = capture(*zoo.get("matmul").build({"M": 8, "K": 4, "N": 2}))
    assert g.input_shapes == ((8, 4), (4, 2))
    assert "float32[8,4]" in g.shape_signature


def test_reach_and_edges_are_consistent():
    g = capture(
        *zoo.get("transformer-block").build({"B": 1, "S": 8, "D": 16, "H": 2}, device="meta")
    )
    for s, d in g.edges:
        assert g.reach[s] >> d & 1
    ln = g.nodes[0]
    assert ln.op == "layer_norm"
    assert bin(g.reach[0]).count("1") == len(g.nodes) - 1  # everything depends on ln1
    view = next(n for n in g.nodes if n.category is Category.VIEW)
    assert math.isinf(view.intensity)  # moves no bytes


class _Casts(nn.Module):
    """RMSNorm-style casts: `x.float()` and `.type_as(x)` of LLaMA blocks."""

    def forward(self, x):
        y = x.float() * 2
        return y.type_as(x), x.to(torch.float32, copy=True) + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cast_to_the_dtype_a_tensor_has_is_a_free_view(dtype):
    """On the H100 the fp32 LLaMA block's `type_as` timed alone took 0.2 us (nothing
    launched) against a predicted 15 us; a cast that changes the dtype still moves bytes,
    and one asked to copy copies."""
    graph = capture(_Casts(), (torch.randn(4, 64, dtype=dtype),))
    type_as = _one(graph, "type_as")
    if dtype is torch.float32:
        assert type_as.category is Category.VIEW
        assert type_as.bytes_read == type_as.bytes_written == 0
    else:
        assert type_as.category is Category.POINTWISE and type_as.bytes_written == 4 * 64 * 2
    copies = [n for n in graph.nodes if n.op in ("to", "_to_copy")]
    assert copies and all(n.category is not Category.VIEW and n.bytes_written for n in copies)
