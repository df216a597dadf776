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

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from learned_cost.analytical import AnalyticalModel
from planner.distributed.parallel_models import TPBlock
from planner.distributed.tp_graph import (
    GEMM_OPERANDS,
    ColumnBackward,
    GraphCosts,
    SiteDecisions,
    TPSite,
    find_tp_sites,
    per_site,
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
# per-site search: every combination of the sites' own decisions up to this many, else
# coordinate descent from the best decision for all sites alike
EXHAUSTIVE_COMBINATIONS = 256


@dataclass(frozen=True)
class TPGraphPlan:
    best: Prediction  # its decision a TPDecision (every site alike) or SiteDecisions
    table: tuple[Prediction, ...]  # the decisions for all sites alike, then a per-site best
    costs: GraphCosts
    sites: tuple[TPSite, ...]
    backward: Prediction  # the backward (not chunked: one for every decision)
    searched: int = 0  # decisions priced, per-site ones included
    # the backward of the program rewritten for training with the chosen decision
    # (tp_program(..., backward=True): the column GEMMs' input gradients chunked)
    planned_backward: Prediction | None = None

    def choice(self) -> TPChoice:
        """The chosen decision as the Plan records it (planner.plans.plan.TPChoice)."""
        ds = per_site(self.best.decision, len(self.sites))
        return TPChoice(
            tuple(d.chunks for d in ds),
            tuple(d.fuse_epilogue for d in ds),
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
        column_backward=tuple(_column_backward(model, g, s, chunk_choices) for s in sites),
    )


def _gemm_s(model, m: int, k: int, n: int, dt: torch.dtype) -> float:
    """One eager (m x k) @ (k x n) GEMM."""
    with torch.device("meta"):
        a, w = torch.empty(m, k, dtype=dt), torch.empty(n, k, dtype=dt)
    return _eager_s(model, capture(_RowGemm(w), (a,)))


def _column_backward(
    model, g: OpGraph, site: TPSite, chunk_choices: tuple[int, ...]
) -> tuple[ColumnBackward, ...]:
    """The site's column GEMMs' backward when rewritten for training: dX in k slices of
    the tokens, dW, and the input gradient's bytes (planner.distributed.tp_autograd)."""
    index = {n.name: n.index for n in g.nodes}
    out = []
    for name, (_, grad_bytes) in zip(site.column, site.column_inputs):
        node = g.nodes[index[name]]
        act_i, w_i = GEMM_OPERANDS[node.op]
        a, w = g.tensors[node.inputs[act_i]], g.tensors[node.inputs[w_i]]
        k_dim, n_dim = (w.shape[0], w.shape[1]) if node.op != "linear" else w.shape[::-1]
        dt = getattr(torch, w.dtype) if isinstance(w.dtype, str) else w.dtype
        rows = math.prod(a.shape) // a.shape[-1]
        dx = {
            k: _gemm_s(model, rows // k, n_dim, k_dim, dt) for k in chunk_choices if rows % k == 0
        }
        dw = _gemm_s(model, k_dim, rows, n_dim, dt)
        fwd = model.group_cost(g, (node.index,)).latency_s
        out.append(ColumnBackward(dx, dw, grad_bytes, fwd))
    return tuple(out)


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
    rank program, decided per site (ties: fewer chunks, then fewer fused epilogues); its
    sites are found on the program's module (planner.distributed.tp_graph). Up to
    `EXHAUSTIVE_COMBINATIONS` combinations of the sites' own decisions are all priced,
    beyond that one site at a time from the best decision for all sites alike."""
    sites = find_tp_sites(captured.program.module())
    if not sites:
        raise ModelSpecError(
            "the captured program has no column -> row GEMM pair ending in an all-reduce: "
            "there is no tensor-parallel decision to make"
        )
    costs = graph_costs(captured, sites, model, host, chunk_choices, column_grad)
    best, table, searched = search_decisions(costs, all_reduce_s)
    backward = predict_backward(costs, best.decision, all_reduce_s)
    planned = predict_backward(costs, best.decision, all_reduce_s, planned=True)
    return TPGraphPlan(best, table, costs, tuple(sites), backward, searched, planned)


def search_decisions(
    costs: GraphCosts, all_reduce_s: Callable[[int], float]
) -> tuple[Prediction, tuple[Prediction, ...], int]:
    """The fastest predicted decision over `costs`' sites, decided per site, as (best,
    table, decisions priced): the table holds the decisions for all sites alike, then the
    best when it differs between sites. A site's options are the chunk counts priced for
    it (`costs.gemm_s`), fused or not (unfused only where it has no epilogue: fusing
    nothing changes nothing). Ties go to fewer chunks, then fewer fused epilogues. Up to
    `EXHAUSTIVE_COMBINATIONS` combinations are all priced; beyond that one site at a time,
    the others held, from the best decision for all sites alike, until none changes."""
    n = len(costs.all_reduce_bytes)
    ks = [sorted(k for i, k in costs.gemm_s if i == site) for site in range(n)]
    options = [
        [
            TPDecision(k, f)
            for k in ks[i]
            for f in ((False, True) if costs.epilogue_ops[i] else (False,))
        ]
        for i in range(n)
    ]
    alike = [k for k in ks[0] if all(k in other for other in ks)]
    uniform = [
        predict_graph(costs, TPDecision(k, f), all_reduce_s) for k in alike for f in (False, True)
    ]
    priced = {per_site(p.decision, n): p for p in uniform}

    def price(ds: tuple[TPDecision, ...]) -> Prediction:
        if ds not in priced:
            priced[ds] = predict_graph(costs, SiteDecisions(ds), all_reduce_s)
        return priced[ds]

    def key(p: Prediction) -> tuple[float, int, int]:
        ds = per_site(p.decision, n)
        return (p.total_s, sum(d.chunks for d in ds), sum(d.fuse_epilogue for d in ds))

    if math.prod(len(o) for o in options) <= EXHAUSTIVE_COMBINATIONS:
        best = min([*uniform, *(price(ds) for ds in itertools.product(*options))], key=key)
    else:
        best = min(uniform, key=key)
        changed = True
        while changed:
            changed = False
            for i, choices in enumerate(options):
                ds = per_site(best.decision, n)
                trial = min((price((*ds[:i], o, *ds[i + 1 :])) for o in choices), key=key)
                if key(trial) < key(best):
                    best, changed = trial, True
    ds = per_site(best.decision, n)
    if len(set(ds)) == 1:  # the same for every site: the decision for all sites alike
        best = next(p for p in uniform if per_site(p.decision, n) == ds)
    table = tuple(uniform) if best in uniform else (*uniform, best)
    return best, table, len(priced)


__all__ = [
    "HostCosts",
    "TPDecision",
    "TPGraphPlan",
    "TPPlan",
    "graph_costs",
    "region_costs",
    "search_decisions",
    "search_tp_block",
    "search_tp_graph",
]
