"""The HTML report of a tuning job: one self-contained page (inline CSS and SVG, no script,
nothing fetched) a person opens in a browser.

From the top: what was tuned where; a chart of plan vs eager vs torch.compile per bucket
(median with the spread of the repetitions) and the same figures as a table; a roofline of
every group of every bucket's plan under the device's roofs; then one section per bucket
with the plan drawn by Graphviz (groups outlined and labelled with realization, predicted
time and share), the plan's time split by group, and the group and candidate tables.

`job_from_tune` turns `search.tune`'s results into a `JobView`; `render_job` writes the page;
`plan_section` is the per-plan part alone (what `fusion-plan plan --html` shows).
"""

from __future__ import annotations

import datetime as _dt
import html
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cli.report_charts import (
    BucketTimes,
    RoofPoint,
    Roofs,
    Share,
    Spread,
    roofline_chart,
    share_bar,
    timing_chart,
)
from cli.report_graph import (
    GraphvizMissing,
    dot_to_svg,
    fmt_bytes,
    fmt_time,
    group_colors,
    group_labels,
    plan_dot,
)
from planner.cost import CostModel
from planner.errors import FusionPlannerError
from planner.fusion.partition import Partition
from planner.hardware import DeviceSpec
from planner.objective import Evaluation, Objective
from search.tune import BucketResult

CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fff}
header{background:#1f3a5f;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:22px} header p{margin:6px 0 0;color:#d7e3f4;font-size:13px}
main{padding:8px 24px 40px;max-width:1500px}
h2{font-size:18px;margin:26px 0 6px;border-bottom:1px solid #ddd;padding-bottom:4px}
h2 small{font-weight:normal;color:#777;font-size:13px}
p.note{color:#555;font-size:13px;margin:4px 0 10px;max-width:900px}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
td,th{border:1px solid #d5d5d5;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f4f7} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.facts{font-size:14px;margin:6px 0} .facts b{color:#1f3a5f}
.warn{color:#b03a2e} .ok{color:#2e7d32}
.plan-layout{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.plan-graph{flex:0 1 auto;max-width:100%;overflow:auto;border:1px solid #e3e3e3;
  border-radius:6px;padding:6px;background:#fcfcfc}
.plan-graph svg{display:block;height:auto;max-width:100%}
.plan-tables{flex:1 1 420px;min-width:380px}
.swatch{display:inline-block;width:11px;height:11px;border:1px solid #555;margin-right:4px;
  vertical-align:-1px}
.chart{max-width:100%;height:auto}
nav a{margin-right:12px;font-size:13px}
"""


# ---- what the page shows -------------------------------------------------------------------
@dataclass(frozen=True)
class BucketView:
    """One bucket's outcome: its plan (None when nothing could be measured) and timings."""

    key: str  # the cache's bucket key, e.g. "[1,9-16,32]"
    params: Mapping[str, int]  # the representative shape the plan was tuned at
    partition: Partition | None
    evaluation: Evaluation | None
    realizations: tuple[str, ...] | None
    fallbacks: Mapping[int, str]
    strategy: str
    times: Mapping[str, Spread]  # "plan", "eager", "torch.compile"
    candidates: tuple[Mapping[str, Any], ...] = ()
    note: str = ""  # what the cache did, or why the bucket failed
    part: str = ""  # which graph, for a model served as several (graph breaks)

    @property
    def label(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.params.items()) or self.key
        return f"{shape}, {self.part}" if self.part else shape


@dataclass(frozen=True)
class JobView:
    model: str
    device: DeviceSpec
    dtype: str
    cost_model: str
    strategy: str
    buckets: tuple[BucketView, ...]
    cache: str = ""
    torch_version: str = field(default_factory=lambda: torch.__version__.split("+")[0])
    created: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    )


def spread_of(timing: Any) -> Spread | None:
    """A profiling Timing as the charts show it: median, min to p99, reps, settled or not."""
    if timing is None:
        return None
    return Spread(
        timing.median_s,
        getattr(timing, "min_s", None),
        getattr(timing, "p99_s", None),
        int(getattr(timing, "reps", 0) or 0),
        bool(getattr(timing, "stable", True)),
    )


def job_from_tune(
    results: Sequence[BucketResult],
    *,
    model: str,
    device: DeviceSpec,
    dtype: str,
    cost_model: CostModel,
    strategy: str,
    cache: str = "",
) -> JobView:
    """The report of `search.tune.tune`'s results; group costs are re-scored under
    `cost_model` (flops, bytes and predicted time per group)."""
    objective = Objective(cost_model)
    views = []
    for r in results:
        best = r.best
        times = {
            m: s
            for m, t in (
                ("plan", best.measured if best else None),
                ("eager", r.eager),
                ("torch.compile", r.compiled),
            )
            if (s := spread_of(t)) is not None
        }
        cands = tuple(
            {
                "strategy": c.strategy,
                "groups": len(c.partition),
                "predicted_s": c.predicted_s,
                "measured_s": c.measured.median_s if c.measured else None,
                "error": c.error,
                "chosen": c is best,
            }
            for c in r.candidates
        )
        views.append(
            BucketView(
                key=r.bucket.key,
                params=dict(r.params),
                partition=best.partition if best else None,
                evaluation=objective.evaluate(best.partition) if best else None,
                realizations=tuple(g.realization for g in r.plan.groups) if r.plan else None,
                fallbacks=dict(best.fallbacks) if best else {},
                strategy=best.strategy if best else "",
                times=times,
                candidates=cands,
                note=r.stored,
                part=r.part,
            )
        )
    return JobView(
        model=model,
        device=device,
        dtype=dtype,
        cost_model=f"{cost_model.name}/{cost_model.version}",
        strategy=strategy,
        buckets=tuple(views),
        cache=cache,
    )


# ---- the page --------------------------------------------------------------------------------
def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _ratio(base: Spread | None, t: Spread | None) -> str:
    """base / t as a table cell: above 1 the plan is faster; red below 1; ⚠ when unsettled."""
    if base is None or t is None or not t.median_s:
        return "-"
    r = base.median_s / t.median_s
    text = f"{r:.2f}×" + ("" if base.stable and t.stable else " ⚠")
    return text if r >= 1 else f'<span class="warn">{text}</span>'


def versus(plan: Spread | None, other: Spread | None, name: str) -> str:
    """ "1.75× faster than eager" or "1.09× slower than eager" (⚠: a figure did not settle)."""
    if plan is None or other is None or not plan.median_s or not other.median_s:
        return ""
    r = other.median_s / plan.median_s
    text = f"{r:.2f}× faster than {name}" if r >= 1 else f"{1 / r:.2f}× slower than {name}"
    return text + ("" if plan.stable and other.stable else " ⚠")


def roofs_of(device: DeviceSpec, dtype: str) -> Roofs:
    """The device's memory roof and its matmul and vector ceilings for `dtype`."""
    short = dtype.replace("float", "fp").replace("bfp16", "bf16")
    ceilings = []
    for name, fn in (("matmul", device.peak_compute_flops), ("vector", device.peak_vector_flops)):
        try:
            ceilings.append((f"{name} {short}", fn(dtype)))
        except Exception:  # a device without a figure for this dtype: that roof is left out
            continue
    return Roofs(device.name, device.bandwidth_Bps, tuple(ceilings))


def roof_points(buckets: Sequence[BucketView]) -> list[RoofPoint]:
    """Each plan's groups as predicted, and each plan as a whole as measured."""
    pts = []
    for b in buckets:
        if b.partition is None or b.evaluation is None:
            continue
        order = b.partition.topo_order() or tuple(range(len(b.partition)))
        number = {gi: k for k, gi in enumerate(order)}
        labels = group_labels(b.partition, b.evaluation, b.realizations, b.fallbacks)
        for gi, c in enumerate(b.evaluation.group_costs):
            if c.flops <= 0 or c.latency_s <= 0 or not (c.bytes_in + c.bytes_out):
                continue
            pts.append(
                RoofPoint(
                    c.intensity,
                    c.flops / c.latency_s,
                    b.label,
                    "group (predicted)",
                    f"{b.label} G{number[gi]} ({labels[gi].realization}): {c.flops:,} FLOP, "
                    f"{fmt_bytes(c.bytes_in + c.bytes_out)} moved, predicted "
                    f"{fmt_time(c.latency_s)}, {c.bound}-bound",
                )
            )
        flops = sum(c.flops for c in b.evaluation.group_costs)
        plan = b.times.get("plan")
        if plan and flops and b.evaluation.boundary_bytes and plan.median_s > 0:
            pts.append(
                RoofPoint(
                    flops / b.evaluation.boundary_bytes,
                    flops / plan.median_s,
                    b.label,
                    "plan (measured)",
                    f"{b.label}, whole plan: {flops:,} FLOP, "
                    f"{fmt_bytes(b.evaluation.boundary_bytes)} across group boundaries, "
                    f"measured {fmt_time(plan.median_s)}",
                )
            )
    return pts


def plan_section(
    partition: Partition,
    evaluation: Evaluation | None,
    *,
    realizations: Sequence[str] | None = None,
    fallbacks: Mapping[int, str] | None = None,
    candidates: Sequence[Mapping[str, Any]] = (),
    id_prefix: str = "",
) -> str:
    """A plan: its time split by group, the Graphviz drawing and the group table beside it."""
    fallbacks = fallbacks or {}
    labels = group_labels(partition, evaluation, realizations, fallbacks)
    order = list(partition.topo_order() or range(len(partition)))
    colors = group_colors(len(partition))
    g = partition.graph
    try:
        graph_svg = dot_to_svg(plan_dot(partition, labels, order=order), id_prefix=id_prefix)
    except GraphvizMissing as e:
        if "not on PATH" in str(e):
            raise
        graph_svg = f'<p class="warn">The plan graph could not be drawn: {_e(e)}</p>'
    shares, rows = [], []
    for k, gi in enumerate(order):
        lb = labels[gi]
        fill, border = colors[gi]
        cost = evaluation.group_costs[gi] if evaluation and evaluation.group_costs else None
        ops = [g.nodes[i].op for i in sorted(partition.groups[gi])]
        shares.append(
            Share(
                f"G{k}",
                lb.predicted_s if lb.predicted_s == lb.predicted_s else 0.0,
                fill,
                border,
                f"G{k} {lb.realization}: predicted {fmt_time(lb.predicted_s)}; {', '.join(ops)}",
            )
        )
        real = _e(lb.realization)
        if lb.fell_back:
            real = f'<span class="warn" title="{_e(lb.fell_back)}">eager (fell back)</span>'
        rows.append(
            f'<tr class="group-row"><td><span class="swatch" style="background:{fill};'
            f'border-color:{border}"></span>G{k}</td><td>{real}</td>'
            f'<td class="num">{fmt_time(lb.predicted_s)}</td><td>{_e(lb.bound or "-")}</td>'
            f'<td class="num">{fmt_bytes(cost.bytes_in) if cost else "-"}</td>'
            f'<td class="num">{fmt_bytes(cost.bytes_out) if cost else "-"}</td>'
            f"<td>{_e(', '.join(ops))}</td></tr>"
        )
    table = (
        '<table class="groups"><tr><th>group</th><th>realization</th><th>predicted</th>'
        "<th>bound</th><th>reads</th><th>writes</th><th>ops</th></tr>" + "".join(rows) + "</table>"
    )
    cand = ""
    if candidates:
        crow = []
        for c in candidates:
            meas = fmt_time(c["measured_s"]) if c.get("measured_s") else "-"
            err = f'<span class="warn">{_e(str(c["error"])[:160])}</span>' if c.get("error") else ""
            mark = " ✔ chosen" if c.get("chosen") else ""
            crow.append(
                f"<tr><td>{_e(c['strategy'])}{mark}</td><td class='num'>{c['groups']}</td>"
                f"<td class='num'>{fmt_time(c['predicted_s'])}</td><td class='num'>{meas}</td>"
                f"<td>{err}</td></tr>"
            )
        cand = (
            "<h3>Candidates measured</h3><table class='candidates'><tr><th>strategy</th>"
            "<th>groups</th><th>predicted</th><th>measured</th><th>error</th></tr>"
            + "".join(crow)
            + "</table>"
        )
    return (
        '<p class="note">Predicted time per group (cost model), in execution order:</p>'
        f"{share_bar(shares)}"
        '<div class="plan-layout">'
        f'<div class="plan-graph">{graph_svg}</div>'
        f'<div class="plan-tables">{table}{cand}'
        '<p class="note">In the drawing: each outlined box is a group that runs as one unit, '
        "titled with its realization, predicted time and share of the plan; dashed ops are "
        "views (free); bold ops are GEMM/conv anchors; dark edges cross a group boundary and "
        "name the bytes written and read back; hover anything for details.</p></div></div>"
    )


def page(title: str, subtitle: str, body: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{_e(title)}</h1><p>{_e(subtitle)}</p></header>"
        f"<main>{body}</main></body></html>\n"
    )


def _summary_table(buckets: Sequence[BucketView]) -> str:
    rows = []
    for k, b in enumerate(buckets):
        plan, eager, comp = (b.times.get(m) for m in ("plan", "eager", "torch.compile"))
        groups = len(b.partition) if b.partition is not None else "-"
        note = b.note if b.partition is None or b.note.startswith("NOT") else ""
        unstable = [m for m, t in b.times.items() if not t.stable]
        flag = f' <span class="warn">⚠ unstable: {", ".join(unstable)}</span>' if unstable else ""
        rows.append(
            f"<tr><td><a href='#bucket-{k}'>{_e(b.label)}</a> <small>{_e(b.key)}</small></td>"
            f"<td>{_e(b.strategy or '-')}</td><td class='num'>{groups}</td>"
            f"<td class='num'>{fmt_time(plan.median_s) if plan else '-'}</td>"
            f"<td class='num'>{fmt_time(eager.median_s) if eager else '-'}</td>"
            f"<td class='num'>{fmt_time(comp.median_s) if comp else '-'}</td>"
            f"<td class='num'>{_ratio(eager, plan)}</td><td class='num'>{_ratio(comp, plan)}</td>"
            f"<td class='num'>{len(b.fallbacks)}</td><td>{flag}{_e(note)}</td></tr>"
        )
    return (
        "<table class='summary'><tr><th>bucket</th><th>plan from</th><th>groups</th>"
        "<th>plan</th><th>eager</th><th>torch.compile</th><th>speed-up vs eager</th>"
        "<th>vs compile</th><th>groups fell back</th><th>notes</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def render_job(job: JobView) -> str:
    """The whole report page of a tuning job."""
    b = job.buckets
    title = f"Tuning report: {job.model}"
    subtitle = (
        f"{job.device.name} · {job.dtype} · strategy {job.strategy} · cost model "
        f"{job.cost_model} · torch {job.torch_version} · {job.created}"
        + (f" · plans in {job.cache}" if job.cache else "")
    )
    nav = "".join(f"<a href='#bucket-{k}'>{_e(v.label)}</a>" for k, v in enumerate(b))
    body = [
        f"<nav>Buckets: {nav}</nav>",
        "<section id='timings'><h2>Plan vs eager vs torch.compile, per bucket</h2>",
        "<p class='note'>Median time of one call at each bucket's representative shape; "
        "whiskers span the repetitions (fastest to p99). A figure marked ⚠ did not settle "
        "while it was timed: treat its speed-up with care. Each bucket has its own scale.</p>",
        timing_chart([BucketTimes(v.label, dict(v.times)) for v in b]),
        _summary_table(b),
        "</section>",
        "<section id='roofline'><h2>Roofline of the groups</h2>",
        f"<p class='note'>Every group of every bucket's plan on {_e(job.device.name)}'s roofs "
        "(memory bandwidth and compute peaks for the dtype): dots are groups as the cost "
        "model predicts them, diamonds are whole plans as measured (FLOPs over the bytes "
        "that cross group boundaries). Points far under the roof leave time on the "
        "table.</p>",
        roofline_chart(roof_points(b), roofs_of(job.device, job.dtype)),
        "</section>",
    ]
    for k, v in enumerate(b):
        body.append(
            f"<section class='bucket' id='bucket-{k}'><h2>Bucket {_e(v.label)} "
            f"<small>{_e(v.key)}</small></h2>"
        )
        plan, eager, comp = (v.times.get(m) for m in ("plan", "eager", "torch.compile"))
        if v.partition is None:
            body.append(f"<p class='warn'>No plan: {_e(v.note)}</p></section>")
            continue
        facts = [f"plan from <b>{_e(v.strategy)}</b>, {len(v.partition)} groups"]
        if plan:
            facts.append(f"measured <b>{fmt_time(plan.median_s)}</b>")
        for name, t in (("eager", eager), ("torch.compile", comp)):
            if t:
                facts.append(f"{name} {fmt_time(t.median_s)} ({_e(versus(plan, t, name))})")
        if v.evaluation:
            facts.append(f"predicted {fmt_time(v.evaluation.total_s)}")
        body.append(f"<p class='facts'>{' · '.join(facts)}</p>")
        if v.note.startswith("NOT"):
            body.append(f"<p class='warn'>{_e(v.note)}</p>")
        body.append(
            plan_section(
                v.partition,
                v.evaluation,
                realizations=v.realizations,
                fallbacks=v.fallbacks,
                candidates=v.candidates,
                id_prefix=f"b{k}-",
            )
        )
        body.append("</section>")
    return page(title, subtitle, "\n".join(body))


def check_writable(path: str | Path) -> Path:
    """`path` as a Path, or FusionPlannerError when a report could not be written there
    (said before a long job, not after it)."""
    path = Path(path)
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    if path.is_dir() or not os.access(path if path.exists() else folder, os.W_OK):
        raise FusionPlannerError(
            f"cannot write the report to {path}: it is a folder or not writable; "
            "pass --report with a writable file path such as tune.html"
        )
    return path


def write_report(job: JobView, path: str | Path) -> Path:
    path = check_writable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_job(job), encoding="utf-8")
    except OSError as e:
        raise FusionPlannerError(f"cannot write the report to {path}: {e}") from e
    return path
