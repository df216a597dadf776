"""Raw descriptors of a group: what a measurement row records about the work it timed.

Profiling stores these with every measurement; learned_cost turns them (plus a device
spec) into model features and the analytical prediction. Keeping them raw (counts,
FLOPs, bytes, sizes) means a dataset never has to be re-captured when the feature set
of a cost model changes. docs/formulas.md §8: op types, tensor shapes, compute intensity,
memory pattern.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from planner.cost import group_io
from planner.ir.graph import Category, OpGraph
from planner.ir.taxonomy import CONV_OPS

DESCRIPTOR_VERSION = 3  # 2: flops_conv; 3: anchor_m/n/k
CATEGORIES = tuple(c.value for c in Category)


def anchor_gemm_dims(graph: OpGraph, anchors: list) -> tuple[int, int, int]:
    """(M, N, K) of the largest anchor seen as a GEMM: N the output's last dim (its
    channels, dim 1, for a convolution: the implicit GEMM), M the rest of the output,
    K = FLOPs / (2 * outputs). (0, 0, 0) without an anchor."""
    if not anchors:
        return 0, 0, 0
    a = max(anchors, key=lambda x: x.flops)
    shape = graph.tensors[a.outputs[0]].shape if a.outputs else ()
    numel = math.prod(shape) if shape else 1
    n = (shape[1] if len(shape) > 1 else 1) if a.op in CONV_OPS else (shape[-1] if shape else 1)
    n = max(int(n), 1)
    return numel // n, n, int(a.flops // max(2 * numel, 1))  # floor: a bias adds 1 per output


def group_descriptor(graph: OpGraph, nodes: Iterable[int]) -> dict[str, Any]:
    """Flat dict of numbers describing `nodes` of `graph` run as one unit."""
    members = sorted(set(nodes))
    io = group_io(graph, members)
    counts = dict.fromkeys(CATEGORIES, 0)
    internal = 0
    max_out = 0
    dtypes: set[str] = set()
    for i in members:
        n = graph.nodes[i]
        counts[n.category.value] += 1
        for t in n.outputs:
            info = graph.tensors[t]
            dtypes.add(info.dtype)
            max_out = max(max_out, info.numel)
            if t not in io.outputs and n.category is not Category.VIEW:
                internal += info.nbytes
    anchors = [graph.nodes[i] for i in members if graph.nodes[i].category is Category.COMPUTE]
    itemsize = min(
        (graph.tensors[t].itemsize for i in members for t in graph.nodes[i].outputs), default=4
    )
    m, n, k = anchor_gemm_dims(graph, anchors)
    d: dict[str, Any] = {f"n_{c}": counts[c] for c in CATEGORIES}
    d.update(
        n_ops=len(members),
        n_work_ops=len(members) - counts["view"],
        flops_matmul=io.matmul_flops,
        flops_conv=sum(a.flops for a in anchors if a.op in CONV_OPS),  # part of flops_matmul
        flops_vector=io.vector_flops,
        bytes_in=io.bytes_in,
        bytes_out=io.bytes_out,
        bytes_internal=internal,  # what fusion keeps off global memory
        n_inputs=len(io.inputs),
        n_outputs=len(io.outputs),
        n_kernels=io.n_kernels,
        max_out_numel=max_out,
        log2_max_out_numel=math.log2(max_out) if max_out else 0.0,
        itemsize=itemsize,
        dtype=sorted(dtypes)[0] if len(dtypes) == 1 else ",".join(sorted(dtypes)),
        anchor_ops=",".join(sorted(a.op for a in anchors)),
        anchor_max_flops=max((a.flops for a in anchors), default=0),
        anchor_m=m,  # the largest anchor as a GEMM (M x K times K x N), 0s without one
        anchor_n=n,
        anchor_k=k,
        ops=",".join(graph.nodes[i].op for i in members),
        descriptor_version=DESCRIPTOR_VERSION,
    )
    return d
