"""On-chip resource estimate of a fused group: R(P) <= R_max (docs/formulas.md §3, condition 3).

A fused group runs as one kernel, so everything it keeps in flight must fit in one
thread block's registers and shared memory. The estimate is deliberately simple and
conservative, and additive so that search can combine the estimates of two groups in
O(1) when it considers merging them:

- registers per thread = BASE_REGS (indexing, addresses) + per node:
  ANCHOR_REGS for a GEMM/conv (its fp32 accumulator fragment: a 128x128 tile over 256
  threads), else one 32-bit register per output element of each output (two for 8-byte
  dtypes), plus REDUCE_REGS for a reduction's running accumulators. Summing over nodes
  bounds the live values from above (a register allocator may reuse some);
- shared memory per block = the largest tile an anchor stages: a GEMM/conv keeps
  GEMM_STAGES x (BM x BK + BK x BN) operand tiles, flash attention Q, K and V tiles of
  ATTN_BLOCK rows x head dim; elementwise and reduction code needs none (Inductor loops
  over long rows instead of holding them).

Limits come from the device spec: 255 registers per thread (the CUDA per-thread cap) and
the spec's shared memory per SM. A CPU has neither limit in this sense (spills go to L1),
so only the shared-memory stand-in (L2 per core) applies. With no spec, the limits are
those of the smallest GPU in the table, so a default plan fits every listed device.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.fusion.opkinds import Kind, kinds
from planner.hardware import SPECS, DeviceSpec
from planner.ir.graph import OpGraph

BASE_REGS = 16
ANCHOR_REGS = 64
REDUCE_REGS = 2
MAX_REGS_PER_THREAD = 255
GEMM_TILE = (128, 128, 32)  # BM, BN, BK
GEMM_STAGES = 3
ATTN_BLOCK = 64
ATTN_STAGES = 2


@dataclass(frozen=True)
class ResourceLimits:
    regs_per_thread: int | None  # None: no register limit (CPU)
    smem_bytes: int
    source: str

    @staticmethod
    def for_spec(spec: DeviceSpec | None) -> ResourceLimits:
        if spec is None:
            smem = min(s.smem_per_sm_bytes for s in SPECS.values() if s.kind == "gpu")
            return ResourceLimits(MAX_REGS_PER_THREAD, smem, "smallest GPU in the spec table")
        if spec.kind == "cpu":
            return ResourceLimits(None, spec.smem_per_sm_bytes, f"{spec.name}: L2 per core")
        return ResourceLimits(MAX_REGS_PER_THREAD, spec.smem_per_sm_bytes, spec.name)


def _itemsize(graph: OpGraph, tid: int) -> int:
    return graph.tensors[tid].itemsize


def node_regs(graph: OpGraph, index: int) -> int:
    """Registers per thread that node `index` adds to a fused kernel."""
    kind = kinds(graph)[index]
    if kind is Kind.FREE:
        return 0
    if kind is Kind.ANCHOR:
        return ANCHOR_REGS
    n = graph.nodes[index]
    regs = sum(2 if _itemsize(graph, t) > 4 else 1 for t in n.outputs) or 1
    return regs + (REDUCE_REGS if kind is Kind.REDUCE else 0)


def anchor_smem(graph: OpGraph, index: int) -> int:
    """Shared memory of the operand tiles a GEMM/conv anchor stages (0 for other nodes)."""
    if kinds(graph)[index] is not Kind.ANCHOR:
        return 0
    n = graph.nodes[index]
    ts = n.inputs or n.outputs
    itemsize = _itemsize(graph, ts[0]) if ts else 4
    if "scaled_dot_product" in n.target and len(n.inputs) >= 1:
        head_dim = graph.tensors[n.inputs[0]].shape[-1] if graph.tensors[n.inputs[0]].shape else 1
        return attention_smem(head_dim, itemsize)
    bm, bn, bk = GEMM_TILE
    return GEMM_STAGES * (bm * bk + bk * bn) * itemsize


def attention_smem(head_dim: int, itemsize: int) -> int:
    """Flash-attention tiles: Q block plus K and V blocks of ATTN_BLOCK rows, staged."""
    return ATTN_STAGES * 3 * ATTN_BLOCK * head_dim * itemsize


@dataclass(frozen=True)
class Usage:
    regs_per_thread: int
    smem_bytes: int

    def fits(self, limits: ResourceLimits) -> bool:
        regs_ok = limits.regs_per_thread is None or self.regs_per_thread <= limits.regs_per_thread
        return regs_ok and self.smem_bytes <= limits.smem_bytes

    def explain(self, limits: ResourceLimits) -> str:
        reg_cap = "no cap" if limits.regs_per_thread is None else str(limits.regs_per_thread)
        return (
            f"needs ~{self.regs_per_thread} registers/thread (cap {reg_cap}) and "
            f"{self.smem_bytes // 1024} KiB shared memory (cap {limits.smem_bytes // 1024} KiB, "
            f"{limits.source})"
        )
