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
from planner.ir.capture import capture
from planner.ir.graph import Category, OpGraph

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
COMPILED_CALL_LAUNCHES = 4.0  # a compiled region's call (guards, wrapper) in eager launches


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


__all__ = ["HostCosts", "TPDecision", "TPPlan", "region_costs", "search_tp_block"]
