"""Known fused kernels a group can be realized with, and the rule that picks one.

Two fusion patterns have a better kernel than whatever a generic fuser makes of them:
- attention ((Q || K || V) -> MatMul -> Softmax -> MatMul): the explicit
  `softmax(q @ k^T * c [+ mask]) @ v` becomes one `scaled_dot_product_attention` call
  (flash / memory-efficient kernels: the L x S score matrix never reaches memory);
- sibling GEMMs on one input (horizontal fusion; docs/formulas.md §14: "QKV generation fused"):
  `linear(x, W1), linear(x, W2), ...` becomes one GEMM on the concatenated weights,
  split afterwards, so x is read once and one large GEMM fills the device.

Detection works on the OpGraph (structure only), so the planner and the cost model can ask
`choose_realization(graph, nodes)` without a program; the rewrites work on a group's FX
subgraph (planner.realize_graph), nodes found by name.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.fx as fx

from planner.ir import Category, OpGraph, OpNode

aten = torch.ops.aten

MATMUL_OPS = frozenset({"matmul", "bmm"})
SOFTMAX_OPS = frozenset({"softmax", "_softmax"})
STATE_KINDS = frozenset({"param", "buffer", "const"})

# Masks recognised as causal (the future masked out): SDPA then runs with is_causal=True
# and no mask tensor, which lets flash attention skip the masked half.
# (kind, ops from the mask back to its source, attribute checks, why)
CAUSAL_MASKS: tuple[tuple[str, tuple[str, ...], dict[str, tuple[object, ...]], str], ...] = (
    (
        "fill",
        ("bitwise_not", "tril", "ones"),
        {"tril.diagonal": (None, 0)},
        "GPT-2: masked_fill(~ones(s, s).tril(), -inf)",
    ),
    (
        "fill",
        ("logical_not", "tril", "ones"),
        {"tril.diagonal": (None, 0)},
        "the same written with logical_not",
    ),
    (
        "add",
        ("triu", "full"),
        {"triu.diagonal": (1,), "full.fill_value": ("-inf",)},
        "LLaMA: scores + full((s, s), -inf).triu(1)",
    ),
)


@dataclass(frozen=True)
class AttentionMatch:
    """softmax(q @ kT [* scale] [mask]) @ v found in an OpGraph (node indices)."""

    qk: int
    softmax: int
    pv: int
    scale_node: int | None
    mask_node: int | None
    scale: float  # multiplies the scores
    mask_kind: str  # "none" | "fill" (masked_fill with -inf) | "add" (additive mask)
    mask_tensor: int | None  # tensor id of the mask (fill: True = masked out)
    causal: bool

    @property
    def core(self) -> tuple[int, ...]:
        """The nodes the SDPA call replaces."""
        extra = tuple(n for n in (self.scale_node, self.mask_node) if n is not None)
        return (self.qk, *extra, self.softmax, self.pv)


@dataclass(frozen=True)
class SiblingGemms:
    """linear(x, W_i[, b_i]) for several i on one input x (node indices, tensor ids)."""

    nodes: tuple[int, ...]
    input: int
    weights: tuple[int, ...]
    biases: tuple[int, ...]  # empty when no linear has a bias


def _producer(graph: OpGraph, tid: int) -> OpNode | None:
    p = graph.tensors[tid].producer
    return graph.nodes[p] if p is not None else None


def _only_feeds(graph: OpGraph, node: OpNode, consumer: OpNode) -> bool:
    """node's single output is read by `consumer` alone and is not a model output."""
    return (
        len(node.outputs) == 1
        and graph.consumers[node.outputs[0]] == (consumer.index,)
        and node.outputs[0] not in graph.outputs
    )


def _attr(node: OpNode, name: str) -> object:
    return dict(node.attrs).get(name)


def _scalar(node: OpNode) -> float | None:
    v = _attr(node, "other")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _is_causal(graph: OpGraph, kind: str, mask: int, scores_shape: tuple[int, ...]) -> bool:
    if len(scores_shape) < 2 or scores_shape[-1] != scores_shape[-2]:
        return False
    for rule_kind, chain, checks, _why in CAUSAL_MASKS:
        if rule_kind != kind:
            continue
        tid, seen, ok = mask, {}, True
        for op in chain:
            node = _producer(graph, tid)
            if node is None or node.op != op:
                ok = False
                break
            seen[op] = node
            tid = node.inputs[0] if node.inputs else -1
        if not ok:
            continue
        if all(_attr(seen[k.split(".")[0]], k.split(".")[1]) in v for k, v in checks.items()):
            return True
    return False


_SCORE_OPS = MATMUL_OPS | {"div", "mul", "masked_fill", "add"}


def _match_at(graph: OpGraph, pv: OpNode) -> AttentionMatch | None:
    if pv.op not in MATMUL_OPS or len(pv.inputs) != 2:
        return None
    sm = _producer(graph, pv.inputs[0])
    if sm is None or sm.op not in SOFTMAX_OPS or not _only_feeds(graph, sm, pv):
        return None
    rank = len(graph.tensors[sm.outputs[0]].shape)
    if _attr(sm, "dim") not in (-1, rank - 1) or _attr(sm, "half_to_float"):
        return None
    scale, scale_node, mask_node, mask_kind, mask_t = 1.0, None, None, "none", None
    nxt, scores_t = sm, sm.inputs[0]
    # Walk back from the softmax over at most one scale and one mask.
    for _ in range(2):
        cur = _producer(graph, scores_t)
        if cur is None or not _only_feeds(graph, cur, nxt):
            return None
        if cur.op in ("div", "mul") and scale_node is None and len(cur.inputs) == 1:
            c = _scalar(cur)
            if c is None or c <= 0:
                return None  # a negative scale would turn -inf masks into +inf
            scale, scale_node = (1.0 / c if cur.op == "div" else c), cur.index
            scores_t = cur.inputs[0]
        elif cur.op == "masked_fill" and mask_node is None and len(cur.inputs) == 2:
            if _attr(cur, "value") != "-inf":
                return None
            mask_node, mask_kind, mask_t = cur.index, "fill", cur.inputs[1]
            scores_t = cur.inputs[0]
        elif cur.op == "add" and mask_node is None and len(cur.inputs) == 2:
            if scale_node is not None or _attr(cur, "alpha") not in (None, 1):
                return None  # an additive mask before the scale would need scaling too
            a, b = cur.inputs
            pa = _producer(graph, a)
            scores_t, mask_t = (a, b) if pa is not None and pa.op in _SCORE_OPS else (b, a)
            mask_node, mask_kind = cur.index, "add"
        else:
            break
        nxt = cur
    qk = _producer(graph, scores_t)
    if qk is None or qk.op not in MATMUL_OPS or len(qk.inputs) != 2:
        return None
    if not _only_feeds(graph, qk, nxt):
        return None
    q, kt, v = (graph.tensors[t] for t in (qk.inputs[0], qk.inputs[1], pv.inputs[1]))
    if not (len(q.shape) == len(kt.shape) == len(v.shape) >= 3):
        return None
    if q.shape[:-2] != kt.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        return None
    if q.shape[-1] != kt.shape[-2] or kt.shape[-1] != v.shape[-2]:
        return None
    if not (q.dtype == kt.dtype == v.dtype) or not q.dtype.startswith(("float", "bfloat")):
        return None
    if mask_t is not None and qk.index in _ancestors(graph, mask_t):
        return None  # the "mask" depends on the scores: not a mask
    scores_shape = graph.tensors[qk.outputs[0]].shape
    causal = mask_t is not None and _is_causal(graph, mask_kind, mask_t, scores_shape)
    return AttentionMatch(
        qk.index, sm.index, pv.index, scale_node, mask_node, scale, mask_kind, mask_t, causal
    )


def _ancestors(graph: OpGraph, tid: int) -> set[int]:
    out: set[int] = set()
    todo = [tid]
    while todo:
        p = graph.tensors[todo.pop()].producer
        if p is not None and p not in out:
            out.add(p)
            todo.extend(graph.nodes[p].inputs)
    return out


def find_attention(graph: OpGraph, nodes: Iterable[int] | None = None) -> list[AttentionMatch]:
    """Attention patterns whose core nodes all lie in `nodes` (default: the whole graph)."""
    members = set(range(len(graph.nodes))) if nodes is None else set(nodes)
    out = []
    for i in sorted(members):
        m = _match_at(graph, graph.nodes[i])
        if m is not None and set(m.core) <= members:
            out.append(m)
    return out


def find_sibling_gemms(graph: OpGraph, nodes: Iterable[int] | None = None) -> list[SiblingGemms]:
    """Sets of >= 2 linears in `nodes` on one input with weights the model owns."""
    members = sorted(set(range(len(graph.nodes))) if nodes is None else set(nodes))
    by_input: dict[tuple[int, int, str, bool], list[OpNode]] = {}
    for i in members:
        n = graph.nodes[i]
        if n.op != "linear" or len(n.inputs) not in (2, 3):
            continue
        w = graph.tensors[n.inputs[1]]
        if w.kind not in STATE_KINDS or len(w.shape) != 2:
            continue
        if len(n.inputs) == 3 and graph.tensors[n.inputs[2]].kind not in STATE_KINDS:
            continue
        key = (n.inputs[0], w.shape[1], w.dtype, len(n.inputs) == 3)
        by_input.setdefault(key, []).append(n)
    out = []
    for (x, _k, _dt, has_bias), ns in by_input.items():
        if len(ns) >= 2:
            out.append(
                SiblingGemms(
                    tuple(n.index for n in ns),
                    x,
                    tuple(n.inputs[1] for n in ns),
                    tuple(n.inputs[2] for n in ns) if has_bias else (),
                )
            )
    return out


def _work(graph: OpGraph, members: list[int]) -> list[int]:
    return [i for i in members if graph.nodes[i].category is not Category.VIEW]


# How "auto" realizes a group: the first rule that holds wins.
# (realization, predicate over (graph, sorted node list), why)
REALIZATION_RULES: tuple[tuple[str, Callable[[OpGraph, list[int]], bool], str], ...] = (
    (
        "eager",
        lambda g, ms: any(
            g.nodes[i].category in (Category.OPAQUE, Category.COLLECTIVE) for i in ms
        ),
        "opaque ops and collectives cannot be compiled into a fused unit",
    ),
    (
        "eager",
        lambda g, ms: len(_work(g, ms)) <= 1,
        "one op (plus views) has nothing to fuse: its eager kernel is the fused kernel",
    ),
    (
        "sdpa",
        lambda g, ms: bool(find_attention(g, ms)),
        "explicit attention -> one SDPA call: the score matrix never reaches memory",
    ),
    (
        "concat_gemm",
        lambda g, ms: bool(find_sibling_gemms(g, ms)),
        "sibling GEMMs on one input -> one GEMM: the input is read once",
    ),
    ("inductor", lambda g, ms: True, "anything else: Inductor fuses the group as one unit"),
)


def choose_realization(graph: OpGraph, nodes: Iterable[int]) -> str:
    """The realization "auto" picks for `nodes` run as one group (REALIZATION_RULES)."""
    members = sorted(set(nodes))
    for realization, holds, _why in REALIZATION_RULES:
        if holds(graph, members):
            return realization
    return "inductor"  # pragma: no cover - the last rule always holds


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
