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
from planner.ir.graph import Category, OpGraph, OpNode
from planner.ir.taxonomy import CONV_OPS

TILE_MN, TILE_K = 128, 64  # a tensor-core GEMM tile (cuBLAS/CUTLASS 128x128x64)
BATCHED_GEMM_OPS = frozenset({"bmm", "baddbmm"})

DESCRIPTOR_VERSION = 4  # 2: flops_conv; 3: anchor_m/n/k; 4: op traffic, tiles, reductions
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


def gemm_dims(graph: OpGraph, node: OpNode) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a compute anchor as the GEMM(s) the hardware runs: a linear
    folds its leading dims into M (one GEMM); a bmm, or a matmul whose second operand has
    batch dims, runs `batch` GEMMs of M x N; a convolution is its implicit GEMM (N its
    output channels). K = FLOPs / (2 * outputs)."""
    shape = graph.tensors[node.outputs[0]].shape if node.outputs else ()
    numel = math.prod(shape) if shape else 1
    batched = node.op in BATCHED_GEMM_OPS or (
        node.op == "matmul"
        and len(node.inputs) > 1
        and len(graph.tensors[node.inputs[1]].shape) > 2
    )
    if node.op in CONV_OPS or len(shape) < 2 or not batched:
        _, n, k = anchor_gemm_dims(graph, [node])
        return 1, max(numel // n, 1), n, max(k, 1)
    m, n = max(int(shape[-2]), 1), max(int(shape[-1]), 1)
    return max(numel // (m * n), 1), m, n, max(int(node.flops // max(2 * numel, 1)), 1)


def _reduction(graph: OpGraph, node: OpNode) -> tuple[float, float, bool]:
    """(length, rows, along the last dim) of a reduction, norm or softmax: a softmax or a
    layer/RMS norm reduces its input's last dim; a batch norm all but the channels; a
    reduction op the dims it names (all of them when it names none)."""
    src = graph.tensors[node.inputs[0]] if node.inputs else None
    if src is None or not src.numel:
        return 0.0, 0.0, True
    shape = src.shape
    if node.category is Category.REDUCTION:
        out = graph.tensors[node.outputs[0]].numel if node.outputs else 1
        dims = dict(node.attrs).get("dim")
        dims = dims if isinstance(dims, tuple | list) else (() if dims is None else (dims,))
        nd = len(shape)
        last = not dims or any(isinstance(d, int) and nd and d % nd == nd - 1 for d in dims)
        return src.numel / max(out, 1), float(max(out, 1)), last
    if "batch_norm" in node.op and len(shape) > 1:
        return src.numel / max(shape[1], 1), float(shape[1]), False
    length = shape[-1] if shape else 1
    return float(length), src.numel / max(length, 1), True


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
    work = [graph.nodes[i] for i in members if graph.nodes[i].category is not Category.VIEW]
    dims = [gemm_dims(graph, a) for a in anchors]
    tiles = [b * math.ceil(mm / TILE_MN) * math.ceil(nn / TILE_MN) for b, mm, nn, _ in dims]
    padded = sum(
        b * math.ceil(mm / TILE_MN) * math.ceil(nn / TILE_MN) * math.ceil(kk / TILE_K)
        for b, mm, nn, kk in dims
    ) * (TILE_MN * TILE_MN * TILE_K)
    useful = sum(b * mm * nn * kk for b, mm, nn, kk in dims)
    big = max(range(len(anchors)), key=lambda j: anchors[j].flops) if anchors else None
    reds = [
        (n_, _reduction(graph, n_))
        for n_ in work
        if n_.category in (Category.REDUCTION, Category.NORM, Category.SOFTMAX)
    ]
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
        # what the hardware sees (learned_cost.features schema 6):
        op_bytes_read=sum(n_.bytes_read for n_ in work),  # each op on its own (eager)
        op_bytes_written=sum(n_.bytes_written for n_ in work),
        anchor_tiles=",".join(str(t) for t in tiles),  # 128x128 output tiles per anchor
        gemm_pad_ratio=padded / useful if useful else 1.0,  # 128x128x64-padded / useful
        anchor_batch=dims[big][0] if big is not None else 0,  # GEMMs of the largest anchor
        red_len_max=max((r[0] for _, r in reds), default=0.0),
        red_rows_min=min((r[1] for _, r in reds), default=0.0),
        red_noncontig=int(any(not r[2] for _, r in reds)),
        n_reduction_shapes=len({graph.tensors[n_.inputs[0]].shape for n_, _ in reds if n_.inputs}),
        descriptor_version=DESCRIPTOR_VERSION,
    )
    return d
