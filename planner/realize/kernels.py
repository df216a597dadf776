"""The rewrites into known fused kernels, on a group's FX subgraph (nodes found by name).

Fusion patterns with a better kernel than whatever a generic fuser makes of them:
- attention ((Q || K || V) -> MatMul -> Softmax -> MatMul): the explicit
  `softmax(q @ k^T * c [+ mask]) @ v` becomes one `scaled_dot_product_attention` call
  (flash / memory-efficient kernels: the L x S score matrix never reaches memory);
- sibling GEMMs on one input (horizontal fusion; docs/formulas.md §14: "QKV generation
  fused"): `linear(x, W1), linear(x, W2), ...` becomes one GEMM on the concatenated
  weights, split afterwards, so x is read once and one large GEMM fills the device;
- GEMM + bias + GELU in half precision on CUDA: one cuBLASLt call.

What each rewrite applies to is found on the OpGraph by planner.fusion.recognize (the one
recognizer the pattern library and the realization rule use too); which rewrite a group
gets is the realization rule's label (planner.fusion.realization). Both are re-exported here.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from planner.fusion.realization import REALIZATION_RULES, realization_of
from planner.fusion.recognize import (
    CAUSAL_MASKS,
    AttentionMatch,
    SiblingGemms,
    find_attention,
    find_sibling_gemms,
)

choose_realization = realization_of  # an alias of the rule (planner.fusion.realization)

aten = torch.ops.aten


# ---- FX rewrites of a group's subgraph ----------------------------------------------------
def _nodes_by_name(gm: fx.GraphModule) -> dict[str, fx.Node]:
    return {n.name: n for n in gm.graph.nodes}


def rewrite_attention(
    gm: fx.GraphModule, m: AttentionMatch, op_names: tuple[str, ...]
) -> list[tuple[fx.Node, str]]:
    """Replace the match's core nodes in `gm` by one aten.scaled_dot_product_attention.

    Returns (new node, name of the node it stands for) pairs, so the caller can check
    layouts against the original."""
    by = _nodes_by_name(gm)
    qk, pv = by[op_names[m.qk]], by[op_names[m.pv]]
    q, kt = qk.args[0], qk.args[1]
    v = pv.args[1]
    g = gm.graph
    with g.inserting_before(pv):
        k = g.call_function(aten.transpose.int, (kt, -2, -1))
        mask = None
        if m.mask_node is not None and not m.causal:
            mnode = by[op_names[m.mask_node]]
            if m.mask_kind == "fill":  # masked_fill marks what to drop, SDPA what to keep
                mask = g.call_function(aten.logical_not.default, (mnode.args[1],))
            else:
                scores_src = by[op_names[m.scale_node]] if m.scale_node is not None else qk
                a, b = mnode.args[0], mnode.args[1]
                mask = b if a is scores_src or a.name == scores_src.name else a
                q_dtype = q.meta["val"].dtype if "val" in q.meta else None
                m_val = mask.meta.get("val") if isinstance(mask, fx.Node) else None
                if q_dtype is not None and m_val is not None and m_val.dtype != q_dtype:
                    mask = g.call_function(aten._to_copy.default, (mask,), {"dtype": q_dtype})
        out = g.call_function(
            aten.scaled_dot_product_attention.default,
            (q, k, v, mask, 0.0, m.causal),
            {"scale": m.scale},
        )
    pv.replace_all_uses_with(out)
    for idx in reversed(m.core):
        g.erase_node(by[op_names[idx]])
    g.eliminate_dead_code()
    gm.recompile()
    return [(out, op_names[m.pv])]


def rewrite_concat_gemm(
    gm: fx.GraphModule,
    s: SiblingGemms,
    op_names: tuple[str, ...],
    weight_name: str,
    bias_name: str | None,
    sizes: tuple[int, ...],
) -> list[tuple[fx.Node, str]]:
    """Replace the sibling linears by linear(x, W_cat, b_cat) split along the last dim.

    `weight_name` / `bias_name` become new placeholders of `gm` (the caller passes the
    concatenated tensors); `sizes` are the out-features of the siblings, in order.
    Returns (new node, name of the linear it stands for) pairs.
    """
    by = _nodes_by_name(gm)
    g = gm.graph
    lins = [by[op_names[i]] for i in s.nodes]
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    with g.inserting_after(placeholders[-1]):
        w = g.placeholder(weight_name)
    b = None
    if bias_name is not None:
        with g.inserting_after(w):
            b = g.placeholder(bias_name)
    first = min(lins, key=lambda n: list(g.nodes).index(n))
    with g.inserting_before(first):
        args = (lins[0].args[0], w, b) if b is not None else (lins[0].args[0], w)
        cat = g.call_function(aten.linear.default, args)
        parts = g.call_function(aten.split_with_sizes.default, (cat, list(sizes), -1))
        outs = [g.call_function(operator.getitem, (parts, j)) for j in range(len(lins))]
    replaced = []
    for lin, o in zip(lins, outs):
        lin.replace_all_uses_with(o)
        replaced.append((o, lin.name))
        g.erase_node(lin)
    g.eliminate_dead_code()
    gm.recompile()
    return replaced


# ---- GEMM + bias + GELU as one cuBLASLt call ------------------------------------------------
# Inductor runs a GEMM as an extern (cuBLAS) kernel and fuses what follows into a separate
# Triton kernel, which reads the GEMM's output back: for linear -> GELU that is a whole
# pass over the widest activation of a transformer block. cuBLASLt applies bias and GELU
# in the GEMM's epilogue (`aten._addmm_activation(..., use_gelu=True)`). Its GELU is the
# tanh form, at most 4.7e-4 from the exact (erf) GELU: below half an ulp of bf16 / fp16
# at the magnitudes where it differs, so only half-precision programs on CUDA use it
# (benchmarks/probes/epilogue_probe.py measures speed and error against an fp32 reference).
GELU_EPILOGUE_DTYPES = frozenset({torch.bfloat16, torch.float16})
GELU_EPILOGUE_DEVICES: tuple[str, ...] = ("cuda",)


def _static_shape(node: fx.Node) -> list[int] | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return list(val.shape)


def gelu_epilogue_sites(
    gm: fx.GraphModule, devices: tuple[str, ...] | None = None
) -> list[tuple[fx.Node, fx.Node]]:
    """(linear, gelu) pairs of `gm` the epilogue rewrite applies to: a biased linear on
    CUDA (`devices`) in half precision, static shapes, whose only user is a GELU."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.gelu.default:
            continue
        lin = node.args[0]
        if not isinstance(lin, fx.Node) or lin.target is not aten.linear.default:
            continue
        if len(lin.users) != 1 or len(lin.args) < 3 or lin.args[2] is None:
            continue
        val = lin.meta.get("val")
        w = lin.args[1].meta.get("val") if isinstance(lin.args[1], fx.Node) else None
        if (
            not isinstance(val, torch.Tensor)
            or val.device.type not in (devices or GELU_EPILOGUE_DEVICES)
            or val.dtype not in GELU_EPILOGUE_DTYPES
            or w is None
            or w.dim() != 2
            or _static_shape(lin.args[0]) is None
            or _static_shape(lin) is None
        ):
            continue
        out.append((lin, node))
    return out


def rewrite_gelu_epilogue(gm: fx.GraphModule, devices: tuple[str, ...] | None = None) -> int:
    """Replace each site of `gelu_epilogue_sites` by one `_addmm_activation`; returns how
    many were replaced."""
    sites = gelu_epilogue_sites(gm, devices)
    g = gm.graph
    for lin, gelu in sites:
        x, w, b = lin.args[0], lin.args[1], lin.args[2]
        in_shape, out_shape = _static_shape(x), _static_shape(lin)
        with g.inserting_before(gelu):
            x2 = g.call_function(aten.reshape.default, (x, [-1, in_shape[-1]]))
            wt = g.call_function(aten.t.default, (w,))
            y2 = g.call_function(aten._addmm_activation.default, (b, x2, wt), {"use_gelu": True})
            y = g.call_function(aten.view.default, (y2, out_shape))
        gelu.replace_all_uses_with(y)
        g.erase_node(gelu)
        g.erase_node(lin)
    if sites:
        g.eliminate_dead_code()
        gm.recompile()
    return len(sites)


__all__ = [
    "CAUSAL_MASKS",
    "GELU_EPILOGUE_DEVICES",
    "GELU_EPILOGUE_DTYPES",
    "REALIZATION_RULES",
    "AttentionMatch",
    "SiblingGemms",
    "choose_realization",
    "find_attention",
    "find_sibling_gemms",
    "gelu_epilogue_sites",
    "realization_of",
    "rewrite_attention",
    "rewrite_concat_gemm",
    "rewrite_gelu_epilogue",
]
