"""A plan drawn as a graph: Graphviz DOT with one outlined, labelled cluster per group, and
the SVG that Graphviz's `dot` lays out from it.

The drawing shows the model's inputs (and, smaller, its weights) feeding the ops, one
box per op, one outlined cluster per group labelled with the group's number, realization,
predicted time and share of the plan, and the outputs. Edges that cross a group boundary
are dark and labelled with the bytes they move through memory; edges inside a group are
faint. Hovering an op or an edge names what it is.
"""

from __future__ import annotations

import colorsys
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.errors import FusionPlannerError
from planner.fusion.partition import Partition
from planner.ir.graph import Category
from planner.objective import Evaluation, realization_of

DOT_TIMEOUT_S = 120.0
MAX_WEIGHT_NODES = 40  # past this many weights, they are left out of the drawing


class GraphvizMissing(FusionPlannerError):
    """Graphviz's `dot` program is not installed or failed to lay out a graph."""


# ---- units people read ----------------------------------------------------------------------
def fmt_time(seconds: float | None) -> str:
    """A duration in the unit that keeps 3 significant digits readable: 12.3 us, 4.56 ms."""
    if seconds is None or seconds != seconds:
        return "-"
    if seconds == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_bytes(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if b < 1000:
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1000
    return f"{b:.1f} TB"


def fmt_shape(shape: Sequence[int]) -> str:
    return "×".join(map(str, shape)) if shape else "scalar"


def readable_name(fx_name: str) -> str:
    """An exported placeholder's name as the model spells it: "p_f1_weight" and
    "p_state_12_l_self_modules_f1_parameters_weight_" become "f1.weight", "l_x_" "x"."""
    n = re.sub(r"^(p_state_\d+_|p_|b_|c_)", "", fx_name)
    n = re.sub(r"^l_self_modules_|^l_self_|^l_", "", n)
    n = n.replace("_modules_", ".").replace("_parameters_", ".").replace("_buffers_", ".")
    return n.strip("_") or fx_name


# ---- colours --------------------------------------------------------------------------------
def group_colors(n: int) -> list[tuple[str, str]]:
    """(fill, border) per group: hues spread by the golden ratio, light fill, dark border."""
    out = []
    for i in range(n):
        hue = (i * 0.618033988749895) % 1.0
        fill = colorsys.hls_to_rgb(hue, 0.88, 0.65)
        border = colorsys.hls_to_rgb(hue, 0.38, 0.70)
        out.append((_hex(fill), _hex(border)))
    return out


def _hex(rgb: tuple[float, float, float]) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in rgb)


# ---- DOT ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupLabel:
    """What a group's outline says: realization and predicted time (and why it fell back)."""

    realization: str
    predicted_s: float
    bound: str = ""
    fell_back: str = ""  # non-empty: the group runs eagerly, for this reason


def group_labels(
    partition: Partition,
    evaluation: Evaluation | None,
    realizations: Sequence[str] | None = None,
    fallbacks: Mapping[int, str] | None = None,
) -> list[GroupLabel]:
    """One label per group of `partition` (in its group order)."""
    g = partition.graph
    out = []
    for gi, mask in enumerate(partition.masks):
        cost = evaluation.group_costs[gi] if evaluation and evaluation.group_costs else None
        real = realizations[gi] if realizations else realization_of(g, mask)
        why = (fallbacks or {}).get(gi, "")
        out.append(
            GroupLabel(
                "eager" if why else real,
                cost.latency_s if cost else float("nan"),
                cost.bound if cost else "",
                why,
            )
        )
    return out


def _q(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _h(text: str) -> str:
    """Text inside a DOT HTML-like label."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def plan_dot(
    partition: Partition,
    labels: Sequence[GroupLabel],
    *,
    order: Sequence[int] | None = None,
    weights: bool = False,
) -> str:
    """Graphviz DOT of `partition`: inputs, ops in one cluster per group, outputs.

    `order` numbers the groups as people see them (execution order: G0 runs first);
    `weights` draws parameters and buffers as small grey notes (left out past
    MAX_WEIGHT_NODES of them, where they would crowd the ops)."""
    g = partition.graph
    order = list(order if order is not None else range(len(partition)))
    number = {gi: k for k, gi in enumerate(order)}
    colors = group_colors(len(partition))
    go = partition.group_of
    total = sum(lb.predicted_s for lb in labels if lb.predicted_s == lb.predicted_s)
    lines = [
        "digraph plan {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.25, ranksep=0.35,'
        ' newrank=true, bgcolor="transparent", tooltip=" "];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10,'
        ' height=0.3, margin="0.08,0.03", penwidth=1];',
        '  edge [fontname="Helvetica", fontsize=8, arrowsize=0.6];',
    ]
    # Graph inputs and weights: what the model reads from outside.
    shown_weights = [t for t in g.tensors if t.kind in ("param", "buffer", "const")]
    weights = weights and len(shown_weights) <= MAX_WEIGHT_NODES
    for t in g.tensors:
        if not g.consumers[t.id] or t.kind == "activation":
            continue
        name = readable_name(t.name) or f"t{t.id}"
        tip = f"{t.kind} {name}: {fmt_shape(t.shape)} {t.dtype}, {fmt_bytes(t.nbytes)}"
        if t.kind == "input":
            label = f"<<b>input {_h(name)}</b><br/>{_h(fmt_shape(t.shape))}>"
            lines.append(
                f'  t{t.id} [shape=ellipse, style="filled,bold", fillcolor="#e8eefc", '
                f'color="#2b4c9a", label={label}, tooltip={_q(tip)}, class="graph-input"];'
            )
        elif weights:
            label = f"{name}\n{fmt_shape(t.shape)}"
            lines.append(
                f'  t{t.id} [shape=note, style=filled, fillcolor="#f4f4f4", color="#aaaaaa", '
                f'fontsize=7, fontcolor="#666666", height=0.2, label={_q(label)}, '
                f'tooltip={_q(tip)}, class="graph-weight"];'
            )
    # One cluster per group, its ops inside.
    for gi in order:
        lb = labels[gi]
        fill, border = colors[gi]
        share = f" · {lb.predicted_s / total:.0%}" if total and lb.predicted_s > 0 else ""
        real = f"{lb.realization} (fell back)" if lb.fell_back else lb.realization
        head = f"G{number[gi]} · {real} · {fmt_time(lb.predicted_s)}{share}"
        tip = f"group G{number[gi]}: {real}, predicted {fmt_time(lb.predicted_s)}"
        if lb.bound:
            tip += f", {lb.bound}-bound"
        if lb.fell_back:
            tip += f"; runs eagerly: {lb.fell_back[:200]}"
        pen = "#c0392b" if lb.fell_back else border
        lines.append(
            f"  subgraph cluster_g{number[gi]} {{ label=<<b>{_h(head)}</b>>; "
            f'labeljust=l; style="rounded,filled"; fillcolor="{fill}"; color="{pen}"; '
            f'penwidth=2; fontcolor="{border}"; tooltip={_q(tip)}; class="plan-group";'
        )
        for i in sorted(partition.groups[gi]):
            n = g.nodes[i]
            out = g.tensors[n.outputs[0]].shape if n.outputs else ()
            label = f"<<b>{_h(n.op)}</b><br/><font point-size='8'>{_h(fmt_shape(out))}</font>>"
            style = '"rounded,filled,dashed"' if n.category is Category.VIEW else '"rounded,filled"'
            pen = 2.2 if n.category is Category.COMPUTE else 1
            tip = (
                f"{n.name} ({n.target}): {n.category.value}, group G{number[gi]}; "
                f"{n.flops:,} FLOP, reads {fmt_bytes(n.bytes_read)}, "
                f"writes {fmt_bytes(n.bytes_written)}"
            )
            held = [g.tensors[t] for t in n.inputs if g.tensors[t].kind != "activation"]
            held = [t for t in held if t.kind != "input"]
            if held:
                tip += "; weights " + ", ".join(
                    f"{readable_name(t.name)} {fmt_shape(t.shape)}" for t in held
                )
            lines.append(
                f'    n{i} [label={label}, style={style}, fillcolor="white", color="{border}",'
                f' penwidth={pen}, tooltip={_q(tip)}, class="op"];'
            )
        lines.append("  }")
    # Outputs.
    for k, t in enumerate(g.outputs):
        tip = f"output {k}: {fmt_shape(g.tensors[t].shape)}"
        lines.append(
            f'  out{k} [shape=ellipse, style="filled,bold", fillcolor="#eaf7ea", color="#2e7d32",'
            f" label=<<b>output{' ' + str(k) if len(g.outputs) > 1 else ''}</b><br/>"
            f'{_h(fmt_shape(g.tensors[t].shape))}>, tooltip={_q(tip)}, class="graph-output"];'
        )
    # Edges: from inputs, between ops, to outputs.
    for t in g.tensors:
        if t.kind == "activation" or (t.kind != "input" and not weights):
            continue
        for d in g.consumers[t.id]:
            style = "" if t.kind == "input" else ', color="#cccccc", arrowsize=0.4'
            lines.append(f"  t{t.id} -> n{d} [tooltip={_q(fmt_bytes(t.nbytes))}{style}];")
    for s, d in g.edges:
        src, dst = g.nodes[s], g.nodes[d]
        moved = sum(g.tensors[t].nbytes for t in src.outputs if t in dst.inputs)
        tip = f"{src.name} -> {dst.name}"
        if go[s] != go[d]:
            lines.append(
                f'  n{s} -> n{d} [color="#333333", penwidth=1.4, label={_q(fmt_bytes(moved))}, '
                f'fontcolor="#555555", tooltip={_q(tip + ": " + fmt_bytes(moved))}, '
                'class="boundary"];'
            )
        else:
            lines.append(f'  n{s} -> n{d} [color="#9e9e9e", tooltip={_q(tip)}];')
    for k, t in enumerate(g.outputs):
        p = g.tensors[t].producer
        if p is not None:
            lines.append(f'  n{p} -> out{k} [color="#2e7d32", penwidth=1.4];')
    lines.append("}")
    return "\n".join(lines) + "\n"


# ---- layout ---------------------------------------------------------------------------------
def require_dot() -> str:
    """The path of Graphviz's `dot`, or GraphvizMissing saying how to install it."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing(
            "drawing a plan needs Graphviz's `dot` program, which is not on PATH: install "
            "Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew install "
            "graphviz; conda: conda install graphviz) and run the command again"
        )
    return exe


def dot_to_svg(dot_source: str, *, id_prefix: str = "", timeout_s: float = DOT_TIMEOUT_S) -> str:
    """Lay out `dot_source` with Graphviz's `dot` and return the SVG element (no XML
    prolog, so it embeds inline in HTML; element ids start with `id_prefix`, so several
    drawings share one page)."""
    exe = require_dot()
    try:
        done = subprocess.run(
            [exe, "-Tsvg"],
            input=dot_source.encode(),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise GraphvizMissing(
            f"Graphviz's dot took more than {timeout_s:.0f} s to lay out the plan graph "
            f"({dot_source.count(' -> ')} edges); the report leaves graphs this large out"
        ) from e
    if done.returncode != 0:
        raise GraphvizMissing(
            f"Graphviz's dot failed (exit {done.returncode}): "
            f"{done.stderr.decode(errors='replace').strip()[:300]}"
        )
    svg = done.stdout.decode()
    svg = svg[max(svg.find("<svg"), 0) :]
    # dot sizes in points (1.33 px each); drawn at one pixel a point, a 10 pt label is still
    # readable and the drawing leaves room beside it on a laptop screen.
    svg = re.sub(r'(width|height)="([0-9.]+)pt"', r'\1="\2px"', svg, count=2)
    return svg.replace(' id="', f' id="{id_prefix}') if id_prefix else svg


def plan_svg(
    partition: Partition,
    evaluation: Evaluation | None,
    *,
    realizations: Sequence[str] | None = None,
    fallbacks: Mapping[int, str] | None = None,
    order: Sequence[int] | None = None,
) -> str:
    """The plan drawn by Graphviz as inline SVG (see `plan_dot`)."""
    labels = group_labels(partition, evaluation, realizations, fallbacks)
    order = order if order is not None else (partition.topo_order() or range(len(partition)))
    return dot_to_svg(plan_dot(partition, labels, order=order))
