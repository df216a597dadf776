"""The pattern language, the library on zoo graphs, and conflict resolution (formulas.md §6-7)."""

from __future__ import annotations

import pytest
import torch

from planner.fusion.opkinds import Kind
from planner.fusion.patterns import (
    EW,
    LIBRARY,
    Alt,
    Match,
    Op,
    Par,
    PatternDef,
    Rep,
    Seq,
    Where,
    match_all,
    resolve,
    score,
)
from planner.ir.graph import Category
from tests.partition_helpers import h100_objective, names, zoo_graph
from zoo.randgraph import GraphBuilder

M = (1024, 1024)


def by_pattern(matches: list[Match], name: str) -> list[Match]:
    return [m for m in matches if m.pattern == name]


def test_every_library_entry_names_its_reason_and_test():
    for d in LIBRARY:
        assert d.why and "test_patterns::" in d.why
        assert d.why.split("test_patterns::")[1].rstrip(")") in globals()


# ---- the library on zoo graphs ---------------------------------------------------------
def test_pointwise_chain_is_one_match():
    g = zoo_graph("pointwise-chain")
    (m,) = by_pattern(match_all(g), "ew_chain")
    assert m.nodes == frozenset(range(len(g.nodes))) and m.realization == "inductor"


@pytest.mark.parametrize(
    "model, extra",
    [
        ("transformer-block", set()),
        ("bert-layer", set()),
        ("gpt2-block", {"mul", "masked_fill", "ones", "tril", "bitwise_not"}),
        ("llama-block", {"add_3", "full", "triu"}),
    ],
)
def test_attention_on_zoo(model, extra):
    g = zoo_graph(model)
    (m,) = by_pattern(match_all(g), "attention")
    assert m.realization == "sdpa"
    assert names(g, m.nodes) - extra - {"div"} == {"matmul", "softmax", "matmul_1"}
    roles = {r: g.nodes[i].name for r, i in m.roles if r in ("qk", "softmax", "pv")}
    assert roles == {"qk": "matmul", "softmax": "softmax", "pv": "matmul_1"}


def test_attention_needs_probabilities_as_the_left_operand():
    """softmax -> matmul where the softmax feeds the *right* operand is not attention."""
    b = GraphBuilder()
    x = b.input(M)
    (s,) = b.op("aten.matmul.default", [x, x], [M])
    (p,) = b.op("aten._softmax.default", [s], [M], {"dim": -1})
    b.op("aten.matmul.default", [x, p], [M])
    assert by_pattern(match_all(b.build()), "attention") == []


def test_sibling_gemms_qkv():
    for model in ("transformer-block", "bert-layer"):
        g = zoo_graph(model)
        (m,) = by_pattern(match_all(g), "sibling_gemms")
        assert names(g, m.nodes) == {"linear", "linear_1", "linear_2"}
        assert m.realization == "concat_gemm"
    llama = {frozenset(names(zoo_graph("llama-block"), m.nodes)) for m in by_pattern(
        match_all(zoo_graph("llama-block")), "sibling_gemms")}  # fmt: skip
    assert llama == {
        frozenset({"linear", "linear_1", "linear_2"}),
        frozenset({"linear_4", "linear_5"}),
    }


def test_conv_bn_act():
    g = zoo_graph("conv-bn-relu-maxpool")
    (m,) = by_pattern(match_all(g), "conv_bn_act")
    assert names(g, m.nodes) == {"conv2d", "_native_batch_norm_legit_no_training", "relu"}
    bottleneck = by_pattern(match_all(zoo_graph("resnet-bottleneck")), "conv_bn_act")
    assert len(bottleneck) == 3  # the last one takes the residual add too
    assert max(len(m.nodes) for m in bottleneck) == 4


def test_gemm_epilogue():
    g = zoo_graph("mlp")
    got = {frozenset(names(g, m.nodes)) for m in by_pattern(match_all(g), "gemm_epilogue")}
    assert got == {frozenset({"linear", "relu"}), frozenset({"linear_1", "relu_1"})}
    tb = zoo_graph("transformer-block")
    got = {frozenset(names(tb, m.nodes)) for m in by_pattern(match_all(tb), "gemm_epilogue")}
    assert frozenset({"linear_4", "gelu"}) in got and frozenset({"linear_5", "add_1"}) in got


def test_norm_act():
    g = zoo_graph("bert-layer")
    got = {frozenset(names(g, m.nodes)) for m in by_pattern(match_all(g), "norm_act")}
    assert got == {frozenset({"add", "layer_norm"}), frozenset({"add_1", "layer_norm_1"})}


def test_rms_norm_llama():
    g = zoo_graph("llama-block")
    got = [names(g, m.nodes) for m in by_pattern(match_all(g), "rms_norm")]
    assert {"pow_1", "mean", "add", "rsqrt", "mul", "type_as", "mul_1"} in got
    assert len(got) == 2


def test_matches_are_convex_and_maximal():
    g = zoo_graph("llama-block")
    ms = match_all(g)
    for m in ms:
        others = [o for o in ms if o.pattern == m.pattern and o is not m]
        assert not any(m.nodes < o.nodes for o in others)


# ---- the language on hand-built graphs ---------------------------------------------------
def _chain(*targets: str):
    b = GraphBuilder()
    t = b.input(M)
    for tgt in targets:
        view = tgt == "aten.t.default"
        (t,) = b.op(tgt, [t], [M], view=view)
    return b.build()


def _lib(pattern, name="p") -> tuple[PatternDef, ...]:
    return (PatternDef(name, pattern, 1.0, "test"),)


def test_seq_absorbs_views_and_rep_respects_bounds():
    g = _chain("aten.relu.default", "aten.t.default", "aten.exp.default", "aten.neg.default")
    (m,) = match_all(g, _lib(Seq(Op(ops=("relu",)), Op(ops=("exp",)))))
    assert m.nodes == {0, 1, 2}  # the transpose between them comes along
    pairs = match_all(g, _lib(Rep(EW, 2, 2)))  # exactly two elementwise ops each
    assert sorted(sorted(m.nodes) for m in pairs) == [[0, 1, 2], [2, 3]]
    assert match_all(g, _lib(Rep(EW, 4))) == []  # only three elementwise ops


def test_op_fields_must_all_hold_and_alt_takes_either():
    g = _chain("aten.relu.default", "aten._softmax.default")
    both = Op(kinds=(Kind.REDUCE,), categories=(Category.NORM,))
    assert match_all(g, _lib(Seq(EW, both))) == []
    alt = Alt(Op(categories=(Category.NORM,)), Op(categories=(Category.SOFTMAX,)))
    (m,) = match_all(g, _lib(Seq(EW, alt)))
    assert m.nodes == {0, 1}


def test_optional_part_may_be_skipped():
    g = _chain("aten.relu.default", "aten._softmax.default")
    pat = Seq(Rep(Op(ops=("div",)), 0), Op(ops=("relu",)), Op(categories=(Category.SOFTMAX,)))
    (m,) = match_all(g, _lib(pat))
    assert m.nodes == {0, 1}


def test_par_needs_siblings_without_a_path_between_them():
    b = GraphBuilder()
    x = b.input(M)
    (a,) = b.op("aten.relu.default", [x], [M])
    b.op("aten.exp.default", [x], [M])
    b.op("aten.add.Tensor", [a, x], [M])  # reads x too, but depends on relu
    g = b.build()
    pairs = match_all(g, _lib(Par.many(EW, 2)))
    assert sorted(sorted(m.nodes) for m in pairs) == [[0, 1], [1, 2]]  # never relu || add
    assert match_all(g, _lib(Par(Op(ops=("relu",)), Op(ops=("add",))))) == []
    (m,) = match_all(g, _lib(Par(Op(ops=("add",)), Op(ops=("exp",)))))
    assert m.nodes == {1, 2}  # branch order does not matter


def test_where_filters_whole_matches():
    g = _chain("aten.relu.default", "aten.exp.default")
    assert match_all(g, _lib(Where(Rep(EW, 2), lambda g, p: len(p.nodes) > 2))) == []


# ---- conflict resolution -----------------------------------------------------------------
def test_resolve_prefers_higher_score_and_never_overlaps():
    g = zoo_graph("transformer-block")
    obj = h100_objective()
    ms = match_all(g)
    chosen = resolve(ms, obj.cost_model)
    taken = [i for m in chosen for i in m.nodes]
    assert len(taken) == len(set(taken))
    assert {m.pattern for m in chosen} >= {"attention", "sibling_gemms"}
    scored = {s.match.pattern: s for s in score(ms, obj.cost_model)}
    att = scored["attention"]
    assert att.score == pytest.approx(att.benefit_s / att.cost * att.priority)
    assert att.benefit_s > 0 and 0 < att.priority <= 4.0 and att.cost > 1.0


def test_resolve_drops_matches_that_do_not_pay_or_are_illegal():
    g = zoo_graph("mlp")
    obj = h100_objective()
    ms = match_all(g)
    assert resolve(ms, obj.cost_model, is_legal=lambda nodes: False) == []
    # the overlapping lower-score match loses to the higher one
    one = ms[0]
    shadow = Match("shadow", one.nodes, 0.01, (), g)
    chosen = resolve([one, shadow], obj.cost_model)
    assert [m.pattern for m in chosen] == [one.pattern]


def test_gelu_epilogue_rewrite_matches_linear_gelu_and_only_where_it_may():
    """linear -> GELU becomes one _addmm_activation (on the CPU it computes the exact GELU,
    so the rewrite itself must match eager to rounding); fp32 and a linear with another
    user are left alone."""
    from planner.realize.kernels import gelu_epilogue_sites, rewrite_gelu_epilogue

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.f1, self.f2 = torch.nn.Linear(16, 32), torch.nn.Linear(16, 32)

        def forward(self, x):
            h = self.f2(x)
            return torch.nn.functional.gelu(self.f1(x)), torch.nn.functional.gelu(h) + h

    torch.manual_seed(0)
    for dtype, expect in ((torch.bfloat16, 1), (torch.float32, 0)):
        m, x = M().to(dtype), torch.randn(2, 5, 16, dtype=dtype)
        gm = torch.export.export(m, (x,)).run_decompositions({}).module()
        gm = torch.fx.GraphModule(gm, gm.graph)  # a plain GraphModule, as realize cuts
        assert len(gelu_epilogue_sites(gm, ("cuda",))) == 0  # CPU tensors: not on CUDA
        assert rewrite_gelu_epilogue(gm, ("cpu",)) == expect
        ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        assert ops.count("aten._addmm_activation.default") == expect
        with torch.no_grad():
            for a, b in zip(gm(x), m(x)):
                assert a.shape == b.shape
                assert torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2)
