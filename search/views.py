"""Pictures and tables of a partition: a self-contained HTML page (inline SVG) and DOT.

The HTML page draws the op graph top to bottom by depth, one box per op filled with its
group's colour (views dashed, anchors bold), edges that cross a group boundary dark and
labelled with their bytes, edges inside a group faint; hovering a box names the op, its
category, FLOPs, bytes and group. Below the picture, the group table of `group_rows`.
"""

from __future__ import annotations

import colorsys
import html
from typing import Any

from planner.ir import Category, OpGraph
from planner.objective import Evaluation
from planner.partition import Partition
from planner.realization import realization_of

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 128, 26, 16, 34, 20


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


def _colors(n: int) -> list[str]:
    out = []
    for i in range(n):
        r, gr, b = colorsys.hls_to_rgb((i * 0.618033988749895) % 1.0, 0.78, 0.62)
        out.append(f"#{int(r * 255):02x}{int(gr * 255):02x}{int(b * 255):02x}")
    return out


def _layout(graph: OpGraph) -> dict[int, tuple[float, float]]:
    depth = [0] * len(graph.nodes)
    for i in range(len(graph.nodes)):
        depth[i] = 1 + max((depth[p] for p in graph.pred[i]), default=-1)
    rows: dict[int, list[int]] = {}
    for i, d in enumerate(depth):
        rows.setdefault(d, []).append(i)
    pos = {}
    for d, members in rows.items():
        for k, i in enumerate(members):
            pos[i] = (MARGIN + k * (BOX_W + GAP_X), MARGIN + d * (BOX_H + GAP_Y))
    return pos


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if b < 1000:
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1000
    return f"{b:.1f} TB"


def render_svg(partition: Partition) -> str:
    g = partition.graph
    pos = _layout(g)
    colors = _colors(len(partition))
    go = partition.group_of
    width = max((x for x, _ in pos.values()), default=0) + BOX_W + 2 * MARGIN
    height = max((y for _, y in pos.values()), default=0) + BOX_H + 2 * MARGIN
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="10">'
    ]
    for s, d in g.edges:
        (x1, y1), (x2, y2) = pos[s], pos[d]
        cross = go[s] != go[d]
        nbytes = sum(g.read_bytes(t) for t in g.nodes[s].outputs if t in g.nodes[d].inputs)
        style = 'stroke="#333" stroke-width="1.6"' if cross else 'stroke="#bbb" stroke-width="1"'
        parts.append(
            f'<line x1="{x1 + BOX_W / 2}" y1="{y1 + BOX_H}" x2="{x2 + BOX_W / 2}" y2="{y2}" '
            f"{style}><title>{html.escape(g.nodes[s].name)} -> {html.escape(g.nodes[d].name)}"
            f"{': ' + _fmt_bytes(nbytes) + ' cross a group boundary' if cross else ''}"
            "</title></line>"
        )
    for n in g.nodes:
        x, y = pos[n.index]
        dash = ' stroke-dasharray="3,2"' if n.category is Category.VIEW else ""
        width_px = "2.2" if n.category is Category.COMPUTE else "1"
        tip = (
            f"{n.name} ({n.target}), {n.category.value}, group {go[n.index]}; "
            f"{n.flops:,} FLOP, reads {_fmt_bytes(n.bytes_read)}, "
            f"writes {_fmt_bytes(n.bytes_written)}"
        )
        parts.append(
            f'<g><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="5" '
            f'fill="{colors[go[n.index]]}" stroke="#222" stroke-width="{width_px}"{dash}/>'
            f'<text x="{x + 5}" y="{y + 16}">{html.escape(n.name[:22])}</text>'
            f"<title>{html.escape(tip)}</title></g>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(
    partition: Partition, evaluation: Evaluation, *, title: str = "", summary: str = ""
) -> str:
    """A self-contained page: the coloured graph and the group table."""
    colors = _colors(len(partition))
    rows = group_rows(partition, evaluation)
    order = partition.topo_order() or tuple(range(len(partition)))
    table = [
        "<table><tr><th>group</th><th>realization</th><th>predicted (us)</th><th>bound</th>"
        "<th>in</th><th>out</th><th>ops</th></tr>"
    ]
    for row, gi in zip(rows, order):
        table.append(
            f'<tr><td style="background:{colors[gi]}">{row["group"]}</td>'
            f"<td>{row['realization']}</td><td>{row['predicted_s'] * 1e6:.2f}</td>"
            f"<td>{row['bound']}</td><td>{_fmt_bytes(row['bytes_in'])}</td>"
            f"<td>{_fmt_bytes(row['bytes_out'])}</td>"
            f"<td>{html.escape(', '.join(row['ops']))}</td></tr>"
        )
    table.append("</table>")
    head = html.escape(title or partition.graph.name or "fusion plan")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{head}</title><style>body{{font-family:sans-serif;margin:16px}}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;"
        "padding:2px 6px;text-align:left}</style></head><body>"
        f"<h2>{head}</h2><p>{html.escape(summary)}</p>"
        "<p>Boxes are ops coloured by group (dashed: views, bold: GEMM/conv anchors); dark "
        "edges cross a group boundary (hover for bytes).</p>"
        f"{render_svg(partition)}{''.join(table)}</body></html>\n"
    )


def render_dot(partition: Partition, evaluation: Evaluation | None = None) -> str:
    """Graphviz DOT with one cluster per group (render with `dot -Tsvg`)."""
    g = partition.graph
    colors = _colors(len(partition))
    lines = ["digraph plan {", "  rankdir=TB; node [shape=box, style=filled, fontsize=10];"]
    for gi, mask in enumerate(partition.masks):
        label = realization_of(g, mask)
        if evaluation is not None and evaluation.group_costs:
            label += f" {evaluation.group_costs[gi].latency_s * 1e6:.1f} us"
        lines.append(f'  subgraph cluster_{gi} {{ label="{gi}: {label}"; color="#888";')
        for i in sorted(partition.groups[gi]):
            n = g.nodes[i]
            lines.append(f'    n{i} [label="{n.name}\\n{n.op}", fillcolor="{colors[gi]}"];')
        lines.append("  }")
    go = partition.group_of
    for s, d in g.edges:
        style = "" if go[s] != go[d] else ' [color="#bbbbbb"]'
        lines.append(f"  n{s} -> n{d}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"
