"""Per-op roofline report of a graph: what `fusion-plan analyze` prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from learned_cost.analytical import bandwidth_saving, unfused_bytes
from planner.cost import CostModel
from planner.ir.graph import Category, OpGraph


@dataclass(frozen=True)
class OpRow:
    index: int
    name: str
    target: str
    category: str
    bound: str
    flops: int
    bytes: int
    intensity: float
    predicted_s: float


@dataclass(frozen=True)
class AnalysisReport:
    graph: str
    graph_key: str
    device: str
    model: str
    rows: tuple[OpRow, ...]
    total_flops: int
    unfused_bytes: int
    fused_bytes: int  # the whole graph as one group: its boundary only
    unfused_s: float  # every op its own kernel
    fused_lower_bound_s: float  # the whole graph as one kernel
    eta_bw: float  # 1 - M_boundary / M_total, fully fused
    ridge_point: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        return d


def analyze(graph: OpGraph, model: CostModel, dtype: str | None = None) -> AnalysisReport:
    """Cost every op alone, and the whole graph fused, under `model`."""
    rows = []
    for n in graph.nodes:
        c = model.group_cost(graph, frozenset((n.index,)))
        bound = c.bound if n.category is not Category.VIEW else "free"
        rows.append(
            OpRow(
                n.index,
                n.name,
                n.target,
                n.category.value,
                bound,
                n.flops,
                c.bytes_in + c.bytes_out,
                c.intensity,
                c.latency_s,
            )
        )
    whole = frozenset(range(len(graph.nodes)))
    fused = model.group_cost(graph, whole)
    spec = getattr(model, "spec", None)
    dtype = dtype or (graph.tensors[graph.outputs[0]].dtype if graph.outputs else "float32")
    return AnalysisReport(
        graph=graph.name,
        graph_key=graph.key,
        device=spec.name if spec else "?",
        model=f"{model.name}/{model.version}",
        rows=tuple(rows),
        total_flops=graph.total_flops,
        unfused_bytes=unfused_bytes(graph),
        fused_bytes=fused.bytes_in + fused.bytes_out,
        unfused_s=sum(r.predicted_s for r in rows),
        fused_lower_bound_s=fused.latency_s,
        eta_bw=bandwidth_saving(graph, [whole]),
        ridge_point=spec.ridge_point(dtype) if spec else float("nan"),
    )


def format_table(report: AnalysisReport) -> str:
    """A fixed-width table for people."""
    head = (
        f"{'#':>3} {'op':<22} {'category':<10} {'bound':<8} {'GFLOP':>9} {'MB':>9} "
        f"{'FLOP/B':>8} {'pred us':>9}"
    )
    lines = [
        f"{report.graph} on {report.device} ({report.model}); ridge point "
        f"I_c = {report.ridge_point:.1f} FLOP/B",
        head,
        "-" * len(head),
    ]
    for r in report.rows:
        inten = f"{r.intensity:8.1f}" if r.intensity != float("inf") else f"{'-':>8}"
        lines.append(
            f"{r.index:>3} {r.name[:22]:<22} {r.category:<10} {r.bound:<8} "
            f"{r.flops / 1e9:9.3f} {r.bytes / 1e6:9.3f} {inten} {r.predicted_s * 1e6:9.2f}"
        )
    lines.append("-" * len(head))
    lines.append(
        f"total: {report.total_flops / 1e9:.3f} GFLOP; unfused traffic "
        f"{report.unfused_bytes / 1e6:.3f} MB, fully fused {report.fused_bytes / 1e6:.3f} MB "
        f"(eta_BW = {report.eta_bw:.1%})"
    )
    lines.append(
        f"predicted: unfused {report.unfused_s * 1e6:.1f} us, fully-fused lower bound "
        f"{report.fused_lower_bound_s * 1e6:.1f} us "
        f"({report.unfused_s / report.fused_lower_bound_s:.2f}x)"
    )
    return "\n".join(lines)
