"""Random op graphs with realistic structure, shapes, FLOPs and bytes.

Used by the property tests (every strategy on many small DAGs), the RL corpus and the
planning-time benchmark (10 to 1000 nodes). The graphs look like what capture produces
from transformer-ish code: a stream of [tokens, features] activations through GEMMs
(sometimes siblings on one input), elementwise ops (some binary, with skip connections
to earlier tensors or broadcast biases), reductions and norms, softmax, views, copies and
concatenations, casts, generated constants, an occasional attention motif and, rarely,
an op the taxonomy does not know (opaque). Categories and FLOPs come from the taxonomy
(planner/ir/taxonomy.py) exactly as capture computes them, bytes by capture's conventions.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from planner.errors import FusionPlannerError
from planner.ir import taxonomy
from planner.ir.graph import Category, OpGraph, OpNode, TensorInfo

# Relative frequency of each op family (attention adds five nodes at once).
DEFAULT_MIX: dict[str, float] = {
    "gemm": 0.13,
    "unary": 0.22,
    "binary": 0.16,
    "reduce": 0.05,
    "norm": 0.05,
    "softmax": 0.03,
    "view": 0.10,
    "copy": 0.05,
    "cast": 0.03,
    "create": 0.03,
    "attention": 0.03,
    "opaque": 0.01,
}
UNARY = ("relu", "gelu", "sigmoid", "silu", "exp", "tanh", "neg", "rsqrt")
BINARY = ("add", "mul", "sub", "div")
REDUCE = (("sum", "dim_IntList"), ("mean", "dim"), ("amax", "default"))


class GraphBuilder:
    """Builds an OpGraph op by op, with capture's conventions for categories, FLOPs and
    bytes (taxonomy rules; views move nothing; reads capped by the storage they view).

    Also handy for hand-built graphs in tests:
        b = GraphBuilder("float32"); x = b.input((1024, 1024))
        (y,) = b.op("aten.relu.default", [x], [(1024, 1024)]); graph = b.build()
    """

    def __init__(self, dtype: str = "float32", rng: random.Random | None = None):
        self.rng, self.dtype = rng or random.Random(0), dtype
        self.tensors: list[TensorInfo] = []
        self.nodes: list[OpNode] = []
        self.live: list[int] = []  # activations, most recent last
        self.last_gemm_input: int | None = None
        self.m = self.d = 0

    def input(self, shape: tuple[int, ...], name: str = "", dtype: str | None = None) -> int:
        tid = self.tensor(shape, "input", name=name or f"x{len(self.tensors)}", dtype=dtype)
        self.live.append(tid)
        return tid

    def tensor(
        self,
        shape: tuple[int, ...],
        kind: str,
        producer: int | None = None,
        alias: int | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> int:
        tid = len(self.tensors)
        root = alias
        if alias is not None and self.tensors[alias].alias_of is not None:
            root = self.tensors[alias].alias_of
        self.tensors.append(
            TensorInfo(tid, shape, dtype or self.dtype, kind, producer, root, name or f"t{tid}")
        )
        return tid

    def param(self, shape: tuple[int, ...], dtype: str | None = None) -> int:
        return self.tensor(shape, "param", name=f"w{len(self.tensors)}", dtype=dtype)

    def op(
        self,
        target: str,
        inputs: list[int],
        out_shapes: list[tuple[int, ...]],
        attrs: dict[str, object] | None = None,
        view: bool = False,
        dtype: str | None = None,
        name: str = "",
    ) -> list[int]:
        """Append an op reading `inputs`; returns its output tensor ids."""
        index = len(self.nodes)
        rule = taxonomy.lookup(target)
        category = rule.category if rule else Category.OPAQUE
        outs = [
            self.tensor(s, "activation", index, inputs[0] if view else None, dtype)
            for s in out_shapes
        ]
        ins = [self.tensors[t] for t in inputs]
        out_infos = [self.tensors[t] for t in outs]
        flops = int(rule.flops(ins, out_infos, attrs or {})) if rule else 0
        unique = list(dict.fromkeys(inputs))
        read = 0 if view else sum(self.read_bytes(t) for t in unique)
        written = 0 if view else sum(t.nbytes for t in out_infos)
        name = name or f"{target.split('.')[1] if '.' in target else target}_{index}"
        self.nodes.append(
            OpNode(index, name, target, category, tuple(unique), tuple(outs),
                   tuple(sorted((attrs or {}).items())), flops, read, written)
        )  # fmt: skip
        self.live.extend(outs)
        return outs

    def build(
        self,
        outputs: list[int] | None = None,
        name: str = "",
        meta: dict[str, object] | None = None,
    ) -> OpGraph:
        """The OpGraph; outputs default to every activation nobody reads."""
        if outputs is None:
            read = {t for n in self.nodes for t in n.inputs}
            outputs = [t.id for t in self.tensors if t.producer is not None and t.id not in read]
        return OpGraph.build(self.nodes, self.tensors, list(dict.fromkeys(outputs)), name, meta)

    def read_bytes(self, tid: int) -> int:
        t = self.tensors[tid]
        root = self.tensors[t.alias_of] if t.alias_of is not None else t
        return min(t.nbytes, root.nbytes)

    def pick(self, shape: tuple[int, ...] | None = None) -> int | None:
        """A recent activation (sometimes an older one: skip connections)."""
        pool = [t for t in self.live if shape is None or self.tensors[t].shape == shape]
        if not pool:
            return None
        r = self.rng.random()
        if r < 0.6:
            return pool[-1]
        if r < 0.9:
            return self.rng.choice(pool[-8:])
        return self.rng.choice(pool)

    def two_d(self) -> int:
        t = self.pick()
        assert t is not None
        return t


def random_graph(
    n_nodes: int,
    seed: int,
    *,
    dtype: str = "bfloat16",
    tokens: int | None = None,
    features: int | None = None,
    mix: Mapping[str, float] | None = None,
) -> OpGraph:
    """A random DAG of exactly `n_nodes` ops, reproducible from `seed`."""
    if n_nodes < 1:
        raise FusionPlannerError(f"random_graph needs n_nodes >= 1, got {n_nodes}")
    rng = random.Random(seed)
    b = GraphBuilder(dtype, rng)
    b.m = tokens or rng.choice((512, 2048, 8192))
    b.d = features or rng.choice((256, 512, 1024))
    b.input((b.m, b.d), name="x")
    weights = dict(mix or DEFAULT_MIX)
    families, probs = list(weights), list(weights.values())
    while len(b.nodes) < n_nodes:
        family = rng.choices(families, probs)[0]
        room = n_nodes - len(b.nodes)
        if family == "attention" and room < 5:
            continue
        _EMIT[family](b)
    read = {t for n in b.nodes for t in n.inputs}
    outs = [t.id for t in b.tensors if t.producer is not None and t.id not in read]
    return b.build(
        [*outs, b.nodes[-1].outputs[0]],
        name=f"random-{n_nodes}-{seed}",
        meta={"generator": "zoo.randgraph", "seed": seed},
    )


def _gemm(b: GraphBuilder) -> None:
    if b.last_gemm_input is not None and b.rng.random() < 0.3:
        x = b.last_gemm_input  # a sibling GEMM on the same input (Q/K/V-like)
    else:
        x = b.two_d()
    k = b.tensors[x].shape[-1]
    n = b.rng.choice((b.d, b.d, 2 * b.d, 4 * b.d))
    w, bias = b.param((n, k)), b.param((n,))
    b.op("aten.linear.default", [x, w, bias], [(*b.tensors[x].shape[:-1], n)])
    b.last_gemm_input = x


def _unary(b: GraphBuilder) -> None:
    x = b.two_d()
    b.op(f"aten.{b.rng.choice(UNARY)}.default", [x], [b.tensors[x].shape])


def _binary(b: GraphBuilder) -> None:
    x = b.two_d()
    shape = b.tensors[x].shape
    r = b.rng.random()
    other = b.pick(shape) if r < 0.6 else None
    if other is None or other == x:
        other = b.param((shape[-1],)) if r < 0.85 else b.pick((*shape[:-1], 1))
    if other is None:
        other = b.param((shape[-1],))
    b.op(f"aten.{b.rng.choice(BINARY)}.Tensor", [x, other], [shape])


def _reduce(b: GraphBuilder) -> None:
    x = b.two_d()
    op, overload = b.rng.choice(REDUCE)
    shape = b.tensors[x].shape
    b.op(f"aten.{op}.{overload}", [x], [(*shape[:-1], 1)], {"dim": (-1,), "keepdim": True})


def _norm(b: GraphBuilder) -> None:
    x = b.two_d()
    shape = b.tensors[x].shape
    w, bias = b.param((shape[-1],)), b.param((shape[-1],))
    b.op("aten.layer_norm.default", [x, w, bias], [shape])


def _softmax(b: GraphBuilder) -> None:
    x = b.two_d()
    b.op("aten._softmax.default", [x], [b.tensors[x].shape], {"dim": -1})


def _view(b: GraphBuilder) -> None:
    x = b.two_d()
    shape = b.tensors[x].shape
    if len(shape) == 2 and b.rng.random() < 0.4:
        b.op("aten.t.default", [x], [(shape[1], shape[0])], view=True)
    else:
        b.op("aten.view.default", [x], [shape], view=True)


def _copy(b: GraphBuilder) -> None:
    x = b.two_d()
    shape = b.tensors[x].shape
    other = b.pick() if b.rng.random() < 0.5 else None
    if other is not None and other != x and b.tensors[other].shape[:-1] == shape[:-1]:
        cat = (*shape[:-1], shape[-1] + b.tensors[other].shape[-1])
        b.op("aten.cat.default", [x, other], [cat], {"dim": -1})
    else:
        b.op("aten.clone.default", [x], [shape])


def _cast(b: GraphBuilder) -> None:
    x = b.two_d()
    to = "float32" if b.tensors[x].dtype != "float32" else b.dtype
    b.op("aten._to_copy.default", [x], [b.tensors[x].shape], {"dtype": to}, dtype=to)


def _create(b: GraphBuilder) -> None:
    b.op("aten.full.default", [], [(b.m, b.d)], {"fill_value": 1.0})


def _attention(b: GraphBuilder) -> None:
    q = b.two_d()
    shape = b.tensors[q].shape
    k = b.pick(shape) or q
    v = b.pick(shape) or q
    (kt,) = b.op("aten.t.default", [k], [(shape[1], shape[0])], view=True)
    (s,) = b.op("aten.matmul.default", [q, kt], [(shape[0], shape[0])])
    (s,) = b.op("aten.div.Tensor", [s], [(shape[0], shape[0])], {"other": 8.0})
    (p,) = b.op("aten._softmax.default", [s], [(shape[0], shape[0])], {"dim": -1})
    b.op("aten.matmul.default", [p, v], [shape])


def _opaque(b: GraphBuilder) -> None:
    x = b.two_d()
    b.op("mylib.custom_op.default", [x], [b.tensors[x].shape])


_EMIT = {
    "gemm": _gemm,
    "unary": _unary,
    "binary": _binary,
    "reduce": _reduce,
    "norm": _norm,
    "softmax": _softmax,
    "view": _view,
    "copy": _copy,
    "cast": _cast,
    "create": _create,
    "attention": _attention,
    "opaque": _opaque,
}
