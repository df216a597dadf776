"""Pictures and tables of a partition: a self-contained HTML page (inline SVG) and DOT.

The page (search/report_html.plan_section) shows the plan's predicted time split by
group, then the op graph laid out by Graphviz's `dot` (cli/report_graph.py): graph
inputs and outputs, one outlined cluster per group titled with its realization, predicted
time and share, edges across group boundaries labelled with their bytes; the group table
beside it. `group_rows` is the same table as records (what `fusion-plan plan` prints).
"""

from __future__ import annotations

from typing import Any

from cli.report_graph import group_labels, plan_dot, plan_svg
from cli.report_html import page, plan_section
from planner.fusion.partition import Partition
from planner.fusion.realization import realization_of
from planner.objective import Evaluation


def group_rows(partition: Partition, evaluation: Evaluation) -> list[dict[str, Any]]:
    """One row per group in execution order: ops, realization, predicted time, bound, bytes."""
    g = partition.graph
    order = partition.topo_order() or tuple(range(len(partition)))
    rows = []
    for k, gi in enumerate(order):
        mask = partition.masks[gi]
        cost = evaluation.group_costs[gi] if evaluation.group_costs else None
        nodes = sorted(partition.groups[gi])
        rows.append(
            {
                "group": k,
                "nodes": nodes,
                "ops": [g.nodes[i].name for i in nodes],
                "realization": realization_of(g, mask),
                "predicted_s": cost.latency_s if cost else float("nan"),
                "bound": cost.bound if cost else "?",
                "bytes_in": cost.bytes_in if cost else 0,
                "bytes_out": cost.bytes_out if cost else 0,
                "flops": cost.flops if cost else 0,
            }
        )
    return rows


def render_svg(partition: Partition, evaluation: Evaluation | None = None) -> str:
    """The plan drawn by Graphviz (cli/report_graph.py) as an inline SVG element."""
    return plan_svg(partition, evaluation)


def render_html(
    partition: Partition, evaluation: Evaluation, *, title: str = "", summary: str = ""
) -> str:
    """A self-contained page: the plan's time split by group, the Graphviz drawing with
    each group outlined and labelled, and the group table beside it."""
    head = title or partition.graph.name or "fusion plan"
    return page(head, summary, plan_section(partition, evaluation))


def render_dot(partition: Partition, evaluation: Evaluation | None = None) -> str:
    """Graphviz DOT with one labelled cluster per group (render with `dot -Tsvg`)."""
    labels = group_labels(partition, evaluation)
    return plan_dot(partition, labels, order=partition.topo_order() or range(len(partition)))
