"""Recognizers of the groups a known fused kernel can run: attention and sibling GEMMs.

One recognizer each, over the OpGraph (structure, shapes, dtypes and attributes; no
program), shared by everything that needs to know:
- the pattern library (planner.fusion.patterns: the "attention" and "sibling_gemms" entries, and
  through them legality's multi-GEMM exception);
- the realization rule (planner.fusion.realization: a group holding one is "sdpa" /
  "concat_gemm");
- the rewrites (planner.realize.kernels: the match carries what the rewrite needs, the
  scale, the mask and whether it is causal);
- the realized cost model (learned_cost.realized: which kernels a group launches).

Attention: `softmax(q @ kT [* scale] [mask]) @ v`, at most one positive scale and one mask
between the score GEMM and the softmax, each feeding only the next op. Sibling GEMMs:
two or more `linear`s reading the same activation tensor with weights (and biases) the
model owns, of one inner size and dtype: one GEMM on the concatenated weights.

Matches are computed once per graph (cached by `graph.key`); asking about a group is a
subset test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from planner.ir.graph import OpGraph, OpNode

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


_ATTENTION: dict[str, tuple[AttentionMatch, ...]] = {}
_SIBLINGS: dict[str, tuple[SiblingGemms, ...]] = {}
_CACHE_LIMIT = 256


def _cached(
    cache: dict[str, Any], graph: OpGraph, find: Callable[[OpGraph], Sequence[Any]]
) -> tuple[Any, ...]:
    got = cache.get(graph.key)
    if got is None:
        got = tuple(find(graph))
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        cache[graph.key] = got
    return got


def _all_attention(graph: OpGraph) -> list[AttentionMatch]:
    out = []
    for n in graph.nodes:
        m = _match_at(graph, n)
        if m is not None:
            out.append(m)
    return out


def find_attention(graph: OpGraph, nodes: Iterable[int] | None = None) -> list[AttentionMatch]:
    """Attention patterns whose core nodes all lie in `nodes` (default: the whole graph),
    in graph order of their output GEMM."""
    found = _cached(_ATTENTION, graph, _all_attention)
    if nodes is None:
        return list(found)
    members = set(nodes)
    return [m for m in found if members.issuperset(m.core)]


def find_sibling_gemms(graph: OpGraph, nodes: Iterable[int] | None = None) -> list[SiblingGemms]:
    """Sets of >= 2 linears in `nodes` on one input with weights the model owns, ordered by
    their first linear. Within a group, the siblings of a set that lie in the group."""
    found = _cached(_SIBLINGS, graph, _all_siblings)
    if nodes is None:
        return list(found)
    members = set(nodes)
    out = []
    for s in found:
        keep = [k for k, i in enumerate(s.nodes) if i in members]
        if len(keep) >= 2:
            out.append(
                SiblingGemms(
                    tuple(s.nodes[k] for k in keep),
                    s.input,
                    tuple(s.weights[k] for k in keep),
                    tuple(s.biases[k] for k in keep) if s.biases else (),
                )
            )
    return sorted(out, key=lambda s: s.nodes[0])


def _all_siblings(graph: OpGraph) -> list[SiblingGemms]:
    members = range(len(graph.nodes))
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


__all__ = [
    "CAUSAL_MASKS",
    "AttentionMatch",
    "SiblingGemms",
    "find_attention",
    "find_sibling_gemms",
]
