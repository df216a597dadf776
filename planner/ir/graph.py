"""The op-graph IR: immutable, content-hashed records for tensors, ops and graphs.

An `OpGraph` is what every later stage works on: legality, the objective, search,
the cost models, realization and the plan cache. It is built by `planner.ir.capture`
(from a real torch model) or by hand in tests (`OpGraph.build`).

Identity: every node has a `key`, a digest of its op, its non-tensor attributes and
the keys of its inputs, never of its name. So the same model at the same shapes
always gets the same `OpGraph.key` whatever FX called its nodes, and the plan cache
and profile datasets can be keyed on it. `OpGraph.structure_key` leaves out the
shapes that change at run time (activations) but keeps parameter shapes: it names
"this model" across shape buckets.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from planner.errors import FusionPlannerError


class Category(enum.StrEnum):
    """Op categories (docs/formulas.md §1), refined the way the cost model needs them."""

    COMPUTE = "compute"  # matmul / bmm / addmm / linear / conv / sdpa: tensor-core bound
    POINTWISE = "pointwise"  # elementwise map, incl. broadcasting binary ops and casts
    BROADCAST = "broadcast"  # materializes a broadcast (expand+copy, repeat, creation ops)
    REDUCTION = "reduction"  # sum / mean / amax / var / pooling windows
    NORM = "norm"  # layer_norm / rms_norm / batch_norm / group_norm
    SOFTMAX = "softmax"  # softmax / log_softmax
    VIEW = "view"  # metadata only: costs nothing, moves nothing
    COPY = "copy"  # materializing data movement: contiguous copies, cat, gather, pad
    COLLECTIVE = "collective"  # all_reduce / all_gather / reduce_scatter
    OPAQUE = "opaque"  # unknown to the taxonomy: never fused

    @property
    def bound(self) -> str:
        """The coarse class of docs/formulas.md §1: compute-bound, memory-bound, ..."""
        return _BOUND[self]


_BOUND = {
    Category.COMPUTE: "compute-bound",
    Category.POINTWISE: "memory-bound",
    Category.BROADCAST: "memory-bound",
    Category.REDUCTION: "memory-bound",
    Category.NORM: "memory-bound",
    Category.SOFTMAX: "memory-bound",
    Category.VIEW: "data-movement",
    Category.COPY: "data-movement",
    Category.COLLECTIVE: "collective",
    Category.OPAQUE: "opaque",
}

# Bytes per element of the dtypes the project meets; a dtype missing here is an error
# in capture (an unknown dtype would silently zero the byte counts).
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
}


def _digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor value of the graph.

    `kind` is "input" (a user input), "param" / "buffer" / "const" (state the model
    owns), or "activation" (produced by a node). `alias_of` names the tensor whose
    storage a view shares (transitively the root), so a view that crosses a group
    boundary is never charged as a write.
    """

    id: int
    shape: tuple[int, ...]
    dtype: str
    kind: str
    producer: int | None = None  # node index for activations
    alias_of: int | None = None  # root tensor id when this tensor is a view
    name: str = ""  # FX name, for people; never hashed
    contiguous: bool = True

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class OpNode:
    """One op. FLOPs and bytes are the op's own when run alone as one kernel."""

    index: int
    name: str  # FX node name (for people and for realization; not hashed)
    target: str  # e.g. "aten.linear.default"
    category: Category
    inputs: tuple[int, ...]  # tensor ids, in argument order
    outputs: tuple[int, ...]  # tensor ids
    attrs: tuple[tuple[str, Any], ...] = ()  # non-tensor arguments, hashable
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    key: str = ""

    @property
    def op(self) -> str:
        """The overload packet, e.g. "linear" for "aten.linear.default" (and
        "grouped_mm_fallback" for a library's "transformers.grouped_mm_fallback.default")."""
        parts = self.target.split(".")
        namespaced = parts[0] in ("aten", "prims", "_c10d_functional")
        namespaced = namespaced or (len(parts) == 3 and parts[2] == "default")
        return parts[1] if len(parts) >= 2 and namespaced else parts[-1]

    @property
    def is_anchor(self) -> bool:
        return self.category is Category.COMPUTE

    @property
    def intensity(self) -> float:
        """Arithmetic intensity I = FLOPs / bytes (docs/formulas.md §9); inf for 0 bytes."""
        moved = self.bytes_read + self.bytes_written
        return self.flops / moved if moved else float("inf")


@dataclass(frozen=True)
class OpGraph:
    """An immutable DAG of `OpNode`s over `TensorInfo`s, in topological order.

    Build with `OpGraph.build` (it checks the invariants and computes keys); the
    dataclass constructor is for trusted callers only.
    """

    nodes: tuple[OpNode, ...]
    tensors: tuple[TensorInfo, ...]
    outputs: tuple[int, ...]  # tensor ids returned by the model
    name: str = ""
    meta: tuple[tuple[str, Any], ...] = field(default=())  # e.g. (("model", "zoo:mlp"),)

    # ---- construction -------------------------------------------------------------
    @staticmethod
    def build(
        nodes: Sequence[OpNode],
        tensors: Sequence[TensorInfo],
        outputs: Sequence[int],
        name: str = "",
        meta: dict[str, Any] | None = None,
    ) -> OpGraph:
        """Validate, re-index and key a graph. Nodes must come in topological order."""
        tensors = tuple(tensors)
        for i, t in enumerate(tensors):
            if t.id != i:
                raise FusionPlannerError(f"tensor ids must be 0..n-1 in order; got {t.id} at {i}")
            if t.dtype not in DTYPE_BYTES:
                raise FusionPlannerError(f"tensor {t.name or i}: unknown dtype {t.dtype!r}")
        produced: set[int] = {t.id for t in tensors if t.kind != "activation"}
        keyed: list[OpNode] = []
        ordinal = _ordinals(tensors)
        tensor_key: dict[int, str] = {
            t.id: _digest(["in", t.kind, t.shape, t.dtype, ordinal[t.id]])
            for t in tensors
            if t.kind != "activation"
        }
        for i, n in enumerate(nodes):
            if n.index != i:
                raise FusionPlannerError(
                    f"node indices must be 0..n-1 in order; got {n.index} at {i}"
                )
            for tid in n.inputs:
                if tid not in produced:
                    raise FusionPlannerError(
                        f"node {n.name or i} reads tensor {tid} before it is produced: "
                        "nodes must be in topological order"
                    )
            for tid in n.outputs:
                if tensors[tid].producer != i:
                    raise FusionPlannerError(f"tensor {tid} does not name node {i} as producer")
            key = _digest(
                [
                    n.target,
                    n.attrs,
                    [tensor_key[t] for t in n.inputs],
                    [(tensors[t].shape, tensors[t].dtype) for t in n.outputs],
                ]
            )
            keyed.append(replace(n, key=key))
            for j, tid in enumerate(n.outputs):
                tensor_key[tid] = _digest([key, j])
                produced.add(tid)
        for tid in outputs:
            if tid not in produced:
                raise FusionPlannerError(f"graph output {tid} is never produced")
        return OpGraph(
            tuple(keyed), tensors, tuple(outputs), name, tuple(sorted((meta or {}).items()))
        )

    # ---- identity -----------------------------------------------------------------
    @cached_property
    def key(self) -> str:
        """Content fingerprint: same ops, attributes, topology and shapes -> same key."""
        return _digest([[n.key for n in self.nodes], [self._out_key(t) for t in self.outputs]])

    @cached_property
    def structure_key(self) -> str:
        """Fingerprint without activation shapes: names the model across shape buckets.

        Keeps op targets, topology, parameter shapes and dtypes, input ranks and dtypes;
        drops user-input sizes, activation shapes and integer attributes that follow them.
        Parameters, buffers and constants are numbered by first use, not by registration:
        torch.export lifts them in `named_parameters()` order, dynamo (the runtime
        backend's view of the same model) in first-use order, and an unused buffer
        (BatchNorm's `num_batches_tracked`) changes nothing the model computes.
        """
        ids: dict[int, str] = {}
        ordinal = _ordinals(self.tensors)
        for t in self.tensors:
            if t.kind == "input":
                ids[t.id] = _digest(["s", "input", len(t.shape), t.dtype, ordinal[t.id]])
        state = 0  # first-use ordinal of params / buffers / constants
        for n in self.nodes:
            for tid in n.inputs:
                t = self.tensors[tid]
                if tid not in ids and t.kind in ("param", "buffer", "const"):
                    ids[tid] = _digest(["s", t.kind, t.shape, t.dtype, state])
                    state += 1
        for tid in self.outputs:  # state returned as is, never read by a node
            t = self.tensors[tid]
            if tid not in ids and t.producer is None:
                ids[tid] = _digest(["s", t.kind, t.shape, t.dtype, state])
                state += 1
        parts = []
        for n in self.nodes:
            k = _digest([n.target, [ids[t] for t in n.inputs]])
            for j, tid in enumerate(n.outputs):
                ids[tid] = _digest([k, j])
            parts.append(k)
        return _digest([parts, [ids[t] for t in self.outputs]])

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shapes of the user inputs, in order: the shape signature buckets work on."""
        return tuple(t.shape for t in self.tensors if t.kind == "input")

    @property
    def shape_signature(self) -> str:
        """A readable shape signature, e.g. "x:bfloat16[8,512,768]"."""
        return ";".join(
            f"{t.name or 'in' + str(i)}:{t.dtype}[{','.join(map(str, t.shape))}]"
            for i, t in enumerate(t for t in self.tensors if t.kind == "input")
        )

    def _out_key(self, tid: int) -> str:
        t = self.tensors[tid]
        if t.producer is None:
            return _digest(["in", t.kind, t.shape, t.dtype, _ordinals(self.tensors)[tid]])
        return _digest([self.nodes[t.producer].key, self.nodes[t.producer].outputs.index(tid)])

    # ---- structure ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """consumers[t] = indices of the nodes that read tensor t (sorted, no repeats)."""
        users: list[set[int]] = [set() for _ in self.tensors]
        for n in self.nodes:
            for t in n.inputs:
                users[t].add(n.index)
        return tuple(tuple(sorted(u)) for u in users)

    @cached_property
    def succ(self) -> tuple[tuple[int, ...], ...]:
        """succ[i] = node indices that read an output of node i."""
        return tuple(
            tuple(sorted({c for t in n.outputs for c in self.consumers[t]})) for n in self.nodes
        )

    @cached_property
    def pred(self) -> tuple[tuple[int, ...], ...]:
        """pred[i] = node indices whose outputs node i reads."""
        return tuple(
            tuple(sorted({p for t in n.inputs if (p := self.tensors[t].producer) is not None}))
            for n in self.nodes
        )

    @cached_property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """Producer -> consumer node pairs, each once, in (src, dst) order."""
        return tuple((i, j) for i in range(len(self.nodes)) for j in self.succ[i])

    @cached_property
    def reach(self) -> tuple[int, ...]:
        """reach[i]: bitmask of the nodes reachable from node i (i itself excluded)."""
        masks = [0] * len(self.nodes)
        for i in reversed(range(len(self.nodes))):
            m = 0
            for j in self.succ[i]:
                m |= (1 << j) | masks[j]
            masks[i] = m
        return tuple(masks)

    def root(self, tid: int) -> int:
        """The tensor whose storage tensor `tid` lives in (itself unless a view)."""
        a = self.tensors[tid].alias_of
        return tid if a is None else a

    def read_bytes(self, tid: int) -> int:
        """Bytes a kernel moves to read tensor `tid` once.

        A view reads no more than its storage holds (an expand re-reads from cache),
        nor more than its own elements (a slice reads only its part).
        """
        t = self.tensors[tid]
        r = self.tensors[self.root(tid)]
        return min(t.nbytes, r.nbytes)

    @property
    def total_flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    def node_by_name(self, name: str) -> OpNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def category_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.category.value] = counts.get(n.category.value, 0) + 1
        return counts

    def summary(self) -> str:
        cats = ", ".join(f"{k}={v}" for k, v in sorted(self.category_counts().items()))
        return f"OpGraph {self.name or self.key}: {len(self.nodes)} ops ({cats})"


def _ordinals(tensors: Iterable[TensorInfo]) -> dict[int, int]:
    """Position of each tensor among the graph's tensors of its kind (stable across names)."""
    seen: dict[str, int] = {}
    out: dict[int, int] = {}
    for t in tensors:
        out[t.id] = seen.get(t.kind, 0)
        seen[t.kind] = out[t.id] + 1
    return out
