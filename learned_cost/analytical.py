"""The analytical roofline model (docs/formulas.md §9 and §11).

For a group P run as one kernel:
    T_compute = FLOPs_matmul / P_matmul(dtype) + FLOPs_vector / P_vector(dtype)
                (P_matmul of a float32 op is the TF32 rate where torch lets it run in TF32,
                 as it does convolutions by default: planner.hardware.tf32_allowed)
    T_memory  = (M_in + M_out) / B            (boundary bytes only: §10)
    C(P)      = max(T_compute, T_memory) + T_launch
with the device's measured peaks where `device-bench` stored them (planner.hardware).
This is the *ideal*: everything inside a group stays on chip, every kernel runs at the
roof. The learned model (`learned_cost.mlp`) corrects it from real profiles.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from planner.cost import GroupCost, group_io
from planner.hardware import DeviceSpec, get_spec
from planner.ir.graph import Category, OpGraph
from planner.ir.taxonomy import CONV_OPS

VERSION = "analytical-2"  # 2: float32 convolutions at the TF32 rate where allowed


class AnalyticalModel:
    """Roofline cost of a group on a device; implements `planner.cost.CostModel`."""

    name = "analytical"
    version = VERSION

    def __init__(self, spec: DeviceSpec | str | None = None):
        self.spec = spec if isinstance(spec, DeviceSpec) else get_spec(spec)

    def __repr__(self) -> str:
        return f"AnalyticalModel({self.spec.name})"

    def group_cost(self, graph: OpGraph, nodes: Iterable[int]) -> GroupCost:
        return self.group_cost_recomputing(graph, nodes, ())

    def group_cost_recomputing(
        self,
        graph: OpGraph,
        nodes: Iterable[int],
        copies: Iterable[int],
        label: str | None = None,
        unread: Iterable[int] = (),
    ) -> GroupCost:
        """The group `nodes` that also recomputes `copies` (planner.fusion.recompute): the
        copies' FLOPs count, their inputs are read, their results are not written, nor are
        the `unread` tensors (every other reader recomputes them)."""
        members = frozenset(nodes)
        copied = frozenset(copies)
        io = group_io(graph, members, copied, unread)
        t_compute = 0.0
        for i in members | copied:
            n = graph.nodes[i]
            if not n.flops:
                continue
            dtype = _dtype_of(graph, i)
            peak = (
                self.spec.peak_compute_flops(dtype, conv=n.op in CONV_OPS)
                if n.category is Category.COMPUTE
                else self.spec.peak_vector_flops(dtype)
            )
            t_compute += n.flops / peak
        t_memory = io.bytes / self.spec.bandwidth_Bps
        t_launch = io.n_kernels * self.spec.launch_s
        return GroupCost(
            latency_s=max(t_compute, t_memory) + t_launch,
            t_compute_s=t_compute,
            t_memory_s=t_memory,
            t_launch_s=t_launch,
            flops=io.flops,
            bytes_in=io.bytes_in,
            bytes_out=io.bytes_out,
        )

    def node_cost(self, graph: OpGraph, index: int) -> GroupCost:
        return self.group_cost(graph, (index,))


def _dtype_of(graph: OpGraph, index: int) -> str:
    n = graph.nodes[index]
    ts = n.outputs or n.inputs
    return graph.tensors[ts[0]].dtype if ts else "float32"


# ---- docs/formulas.md, as functions of the public API -----------------------------------
@dataclass(frozen=True)
class Roofline:
    """Roofline verdict for an amount of work on a device (docs/formulas.md §9)."""

    flops: float
    bytes: float
    intensity: float  # I = FLOPs / bytes
    ridge: float  # I_c = P_peak / B
    bound: str  # "compute" if I >= I_c else "memory"
    attainable_flops: float  # P = min(P_peak, I * B)
    t_compute_s: float
    t_memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.t_compute_s, self.t_memory_s)


def roofline(
    flops: float, nbytes: float, spec: DeviceSpec, dtype: str = "float16", matmul: bool = True
) -> Roofline:
    peak = spec.peak_matmul_flops(dtype) if matmul else spec.peak_vector_flops(dtype)
    bw = spec.bandwidth_Bps
    intensity = flops / nbytes if nbytes else float("inf")
    ridge = peak / bw
    return Roofline(
        flops=flops,
        bytes=nbytes,
        intensity=intensity,
        ridge=ridge,
        bound="compute" if intensity >= ridge else "memory",
        attainable_flops=min(peak, intensity * bw),
        t_compute_s=flops / peak,
        t_memory_s=nbytes / bw,
    )


def unfused_bytes(graph: OpGraph) -> int:
    """M_total: every op reads its inputs and writes its outputs through memory."""
    return sum(n.bytes_read + n.bytes_written for n in graph.nodes)


def bandwidth_saving(graph: OpGraph, groups: Iterable[Iterable[int]]) -> float:
    """eta_BW = 1 - M_boundary / M_total for a partition into `groups` (docs/formulas.md §10)."""
    total = unfused_bytes(graph)
    boundary = sum(group_io(graph, g).bytes for g in groups)
    return 1.0 - boundary / total if total else 0.0


def vertical_fusion_speedup(n_ops: int, elements: int, itemsize: int, spec: DeviceSpec) -> float:
    """S = T_unfused / T_fused = (2nNb/B) / (2Nb/B) = n for a memory-bound chain (§2)."""
    t_unfused = 2 * n_ops * elements * itemsize / spec.bandwidth_Bps
    t_fused = 2 * elements * itemsize / spec.bandwidth_Bps
    return t_unfused / t_fused
