"""The tensor-parallel block's communication decisions as a search: chunks of the
row-parallel GEMMs (overlap of each chunk's all-reduce with the next chunk's GEMM) and
the fused epilogue, priced by the two-stream critical path (planner.distributed.tp_plan)
with compute from the group cost model and all-reduces from an α-β fit or the link table.

Region costs come from capturing each region of one rank's shard at the block's shape
(on the meta device, so no memory is touched) and pricing it with a cost model
(`planner.cost.CostModel`, the analytical roofline by default): a compiled region costs
its GEMMs one by one plus everything else as one fused group (what Inductor does: GEMMs
as library calls, the rest fused into the kernels around them); an eager epilogue costs
each of its ops as its own kernel; the fused epilogue one group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from learned_cost.analytical import AnalyticalModel
from planner.distributed.parallel_models import TPBlock
from planner.distributed.tp_graph import (
    GEMM_OPERANDS,
    GraphCosts,
    TPSite,
    find_tp_sites,
    graph_decisions,
    predict_backward,
    predict_graph,
)
from planner.distributed.tp_plan import (
    LAYERS,
    Prediction,
    RegionCosts,
    TPDecision,
    _Attention,
    _Epilogue,
    _MLPIn,
    predict,
)
from planner.errors import ModelSpecError
from planner.ir.capture import Captured, capture
from planner.ir.graph import Category, OpGraph
from planner.plans.plan import TPChoice

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
COMPILED_CALL_LAUNCHES = 4.0
COLUMN_GRAD = (
    "per_input",
    "per_gemm",
)  # who all-reduces a column GEMM's input gradient  # a compiled region's call (guards, wrapper) in eager launches


@dataclass(frozen=True)
class HostCosts:
    """Host seconds to issue one eager kernel, one compiled region, one async collective
    (measured on the ranks where given; else from the device's launch overhead)."""

    eager_op_s: float
    compiled_call_s: float
    collective_call_s: float
    source: str = "estimate"


class _RowGemm(nn.Module):
    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w, requires_grad=False)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a @ self.w.t()


def _kernels(graph: OpGraph) -> list[int]:
    return [n.index for n in graph.nodes if n.category is not Category.VIEW]


def _eager_s(model, graph: OpGraph) -> float:
    return sum(model.group_cost(graph, (i,)).latency_s for i in _kernels(graph))


def _compiled_s(model, graph: OpGraph) -> float:
    gemms = [i for i in _kernels(graph) if graph.nodes[i].category is Category.COMPUTE]
    rest = [i for i in _kernels(graph) if i not in gemms]
    t = sum(model.group_cost(graph, (i,)).latency_s for i in gemms)
    return t + (model.group_cost(graph, rest).latency_s if rest else 0.0)


def region_costs(
    b: int,
    s: int,
    d: int,
    heads: int,
    tp: int,
    dtype: str = "bfloat16",
    model=None,
    host: HostCosts | None = None,
    chunk_choices: tuple[int, ...] = (1, 2, 4),
) -> RegionCosts:
    """The GPU and host costs of every region of one rank's `TPBlock` shard at (B, S, D, H)."""
    if dtype not in DTYPES:
        raise ModelSpecError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    model = model or AnalyticalModel("h100")
    dt = DTYPES[dtype]
    tokens = b * s
    spec = getattr(model, "spec", None)
    launch = spec.launch_s if spec is not None else 5e-6
    host = host or HostCosts(launch, COMPILED_CALL_LAUNCHES * launch, 2 * launch)
    with torch.device("meta"):
        blk = TPBlock(d, heads, tp, None).to(dt)  # the group is only stored
        x = torch.empty(b, s, d, dtype=dt)
        flat = torch.empty(tokens, d, dtype=dt)
        hidden = torch.empty(tokens, blk.mlp.fc1.out_features, dtype=dt)
        local = blk.o.in_features
    attn = capture(_Attention(blk), (x,))
    mlp_in = capture(_MLPIn(blk), (flat,))
    gemm_s: dict[tuple[str, int], float] = {}
    for k in chunk_choices:
        if tokens % k:
            continue
        with torch.device("meta"):
            a_o = torch.empty(tokens // k, local, dtype=dt)
            a_f = torch.empty(tokens // k, hidden.shape[1], dtype=dt)
        for layer, w, a in (("o", blk.o.weight, a_o), ("fc2", blk.mlp.fc2.weight, a_f)):
            g = capture(_RowGemm(w.detach()), (a,))
            gemm_s[(layer, k)] = _eager_s(model, g)
    epilogue_s: dict[tuple[str, bool], float] = {}
    ops: dict[str, int] = {}
    for layer, bias, ln in (("o", blk.o_bias, blk.ln2), ("fc2", blk.mlp.bias, None)):
        g = capture(_Epilogue(bias, ln), (flat, flat))
        epilogue_s[(layer, False)] = _eager_s(model, g)
        epilogue_s[(layer, True)] = model.group_cost(g, _kernels(g)).latency_s
        ops[layer] = len(_kernels(g))
    nbytes = tokens * d * torch.empty((), dtype=dt).element_size()
    return RegionCosts(
        attn_s=_compiled_s(model, attn),
        mlp_in_s=_compiled_s(model, mlp_in),
        gemm_s=gemm_s,
        epilogue_s=epilogue_s,
        epilogue_ops=ops,
        all_reduce_bytes=dict.fromkeys(LAYERS, nbytes),
        eager_op_host_s=host.eager_op_s,
        compiled_call_host_s=host.compiled_call_s,
        collective_call_host_s=host.collective_call_s,
        sources={"compute": repr(model), "host": host.source},
        attn_eager_s=_eager_s(model, attn),
        attn_eager_ops=len(_kernels(attn)),
        mlp_in_eager_s=_eager_s(model, mlp_in),
        mlp_in_eager_ops=len(_kernels(mlp_in)),
    )


@dataclass(frozen=True)
class TPPlan:
    best: Prediction
    table: tuple[Prediction, ...]  # every decision searched, in search order
    costs: RegionCosts
    eager: Prediction  # the unplanned TPBlock, priced alike


def search_tp_block(
    costs: RegionCosts,
    all_reduce_s: Callable[[int], float],
    chunk_choices: tuple[int, ...] = (1, 2, 4),
) -> TPPlan:
    """The decision with the shortest predicted block (ties: fewer chunks, then unfused:
    the simpler program)."""
    ks = tuple(k for k in chunk_choices if ("o", k) in costs.gemm_s)
    table = tuple(
        predict(costs, TPDecision(k, fuse), all_reduce_s) for k in ks for fuse in (False, True)
    )
    best = min(table, key=lambda p: (p.total_s, p.decision.chunks, p.decision.fuse_epilogue))
    return TPPlan(best, table, costs, predict(costs, TPDecision(1, False), all_reduce_s, True))


# ---- any captured program -------------------------------------------------------------
@dataclass(frozen=True)
class TPGraphPlan:
    best: Prediction
    table: tuple[Prediction, ...]  # every decision searched
    costs: GraphCosts
    sites: tuple[TPSite, ...]
    backward: Prediction  # the backward (not chunked: one for every decision)

    def choice(self) -> TPChoice:
        """The chosen decision as the Plan records it (planner.plans.plan.TPChoice)."""
        d = self.best.decision
        return TPChoice(
            d.chunks,
            d.fuse_epilogue,
            tuple(s.gemm for s in self.sites),
            self.best.total_s,
            self.backward.total_s,
        )


def graph_costs(
    captured: Captured,
    sites: list[TPSite],
    model=None,
    host: HostCosts | None = None,
    chunk_choices: tuple[int, ...] = (1, 2, 4),
    column_grad: str = "per_input",
) -> GraphCosts:
    """Each site's GEMM slices, epilogue and the kernels between them, priced by `model`
    (the analytical roofline of an H100 by default) on the captured rank program, and
    what its backward runs (planner.distributed.tp_graph, "Backward"): the row-parallel
    GEMM's dX and dW, and the column GEMMs' input-gradient all-reduces, one per distinct
    input (`column_grad="per_input"`: Megatron's f) or per column GEMM ("per_gemm":
    DTensor's ColwiseParallel)."""
    if column_grad not in COLUMN_GRAD:
        raise ModelSpecError(f"column_grad must be one of {COLUMN_GRAD}, got {column_grad!r}")
    model = model or AnalyticalModel("h100")
    spec = getattr(model, "spec", None)
    launch = spec.launch_s if spec is not None else 5e-6
    host = host or HostCosts(launch, COMPILED_CALL_LAUNCHES * launch, 2 * launch)
    g = captured.graph
    index = {n.name: n.index for n in g.nodes}
    taken: dict[int, int] = {}  # node -> site whose GEMM, collective or epilogue it is
    for i, s in enumerate(sites):
        for name in (s.gemm, s.all_reduce, s.wait, *s.reshapes, *s.epilogue):
            taken[index[name]] = i
    segments: list[list[int]] = [[] for _ in range(len(sites) + 1)]
    gemm_at = [index[s.gemm] for s in sites]
    for i in _kernels(g):
        if i not in taken and g.nodes[i].category is not Category.COLLECTIVE:
            segments[sum(1 for at in gemm_at if at < i)].append(i)
    gemm_s: dict[tuple[int, int], float] = {}
    backward_gemm_s: list[float] = []
    for i, s in enumerate(sites):
        node = g.nodes[index[s.gemm]]
        w = g.tensors[node.inputs[GEMM_OPERANDS[s.kind][1]]]
        k_dim, n_dim = (w.shape[0], w.shape[1]) if s.kind != "linear" else w.shape[::-1]
        dt = getattr(torch, w.dtype) if isinstance(w.dtype, str) else w.dtype
        for k in chunk_choices:
            if s.rows % k:
                continue
            with torch.device("meta"):
                a = torch.empty(s.rows // k, k_dim, dtype=dt)
                wt = torch.empty(n_dim, k_dim, dtype=dt)
            gemm_s[(i, k)] = _eager_s(model, capture(_RowGemm(wt), (a,)))
        backward_gemm_s.append(_backward_gemm_s(model, s.rows, k_dim, n_dim, dt))
    epilogue_s: dict[tuple[int, bool], float] = {}
    ops: list[int] = []
    for i, s in enumerate(sites):
        nodes = [index[n] for n in s.epilogue if g.nodes[index[n]].category is not Category.VIEW]
        epilogue_s[(i, False)] = sum(model.group_cost(g, (j,)).latency_s for j in nodes)
        epilogue_s[(i, True)] = model.group_cost(g, nodes).latency_s if nodes else 0.0
        ops.append(len(nodes))
    return GraphCosts(
        segment_s=tuple(sum(model.group_cost(g, (j,)).latency_s for j in seg) for seg in segments),
        segment_ops=tuple(len(seg) for seg in segments),
        gemm_s=gemm_s,
        epilogue_s=epilogue_s,
        epilogue_ops=tuple(ops),
        all_reduce_bytes=tuple(s.nbytes for s in sites),
        eager_op_host_s=host.eager_op_s,
        compiled_call_host_s=host.compiled_call_s,
        collective_call_host_s=host.collective_call_s,
        backward_gemm_s=tuple(backward_gemm_s),
        column_grad_bytes=tuple(s.column_grad_bytes(column_grad == "per_gemm") for s in sites),
    )


def _backward_gemm_s(model, rows: int, k_dim: int, n_dim: int, dt: torch.dtype) -> float:
    """The row-parallel GEMM's backward: dX = g W (rows x n @ n x k) and
    dW = g^T X (n x rows @ rows x k), each one eager kernel."""
    with torch.device("meta"):
        g, w_dx = torch.empty(rows, n_dim, dtype=dt), torch.empty(k_dim, n_dim, dtype=dt)
        gt, w_dw = torch.empty(n_dim, rows, dtype=dt), torch.empty(k_dim, rows, dtype=dt)
    dx = _eager_s(model, capture(_RowGemm(w_dx), (g,)))
    return dx + _eager_s(model, capture(_RowGemm(w_dw), (gt,)))


def search_tp_graph(
    captured: Captured,
    all_reduce_s: Callable[[int], float],
    model=None,
    host: HostCosts | None = None,
    chunk_choices: tuple[int, ...] = (1, 2, 4),
    column_grad: str = "per_input",
) -> TPGraphPlan:
    """The tensor-parallel decision with the shortest predicted program for a captured
    rank program (ties: fewer chunks, then unfused); its sites are found on the program's
    module (planner.distributed.tp_graph)."""
    sites = find_tp_sites(captured.program.module())
    if not sites:
        raise ModelSpecError(
            "the captured program has no column -> row GEMM pair ending in an all-reduce: "
            "there is no tensor-parallel decision to make"
        )
    costs = graph_costs(captured, sites, model, host, chunk_choices, column_grad)
    table = tuple(
        predict_graph(costs, d, all_reduce_s) for d in graph_decisions(sites, chunk_choices)
    )
    best = min(table, key=lambda p: (p.total_s, p.decision.chunks, p.decision.fuse_epilogue))
    backward = predict_backward(costs, best.decision, all_reduce_s)
    return TPGraphPlan(best, table, costs, tuple(sites), backward)


__all__ = [
    "HostCosts",
    "TPDecision",
    "TPGraphPlan",
    "TPPlan",
    "graph_costs",
    "region_costs",
    "search_tp_block",
    "search_tp_graph",
]
