"""The op-graph IR and how a model becomes one: capture (`planner.ir.capture`), dynamic
export, taxonomy, pytrees. The package exports the graph records; import capture from
its module (capture uses the rest of planner)."""

from planner.ir.graph import Category, OpGraph, OpNode, TensorInfo

__all__ = ["Category", "OpGraph", "OpNode", "TensorInfo"]
