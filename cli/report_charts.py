"""Small inline-SVG charts for the HTML report: timings per bucket (plan, eager,
torch.compile) with their spread, a roofline of the groups, and a plan's time split by group.

Plain SVG strings with a `<title>` tooltip on every mark and a CSS class on the parts a
reader (or a test) looks for; no scripts, no fonts or files from elsewhere.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from cli.report_graph import fmt_time

MODE_COLORS = {"plan": "#2b6cb0", "eager": "#8d8d8d", "torch.compile": "#dd8452"}
SERIES_COLORS = (
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22",
)  # fmt: skip
FONT = 'font-family="Helvetica, Arial, sans-serif"'


@dataclass(frozen=True)
class Spread:
    """A timed figure: the median, the range its repetitions spanned, and whether the
    timer judged it settled. Seconds."""

    median_s: float
    lo_s: float | None = None
    hi_s: float | None = None
    reps: int = 0
    stable: bool = True

    @property
    def has_range(self) -> bool:
        return self.lo_s is not None and self.hi_s is not None and self.hi_s > self.lo_s


@dataclass(frozen=True)
class BucketTimes:
    label: str  # e.g. "S=128"
    times: dict[str, Spread]  # mode ("plan", "eager", "torch.compile") -> timing


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


# ---- plan vs eager vs compile ----------------------------------------------------------------
def timing_chart(rows: Sequence[BucketTimes], width: int = 820, label_w: int = 150) -> str:
    """One band per bucket, one bar per mode (median), a whisker over the spread; each
    band on its own scale from zero, so the bars of one bucket compare at a glance.
    `label_w`: pixels left of the bars for the bucket labels."""
    seen = list(dict.fromkeys(m for r in rows for m in r.times))
    modes = [m for m in MODE_COLORS if m in seen] + [m for m in seen if m not in MODE_COLORS]
    extra = iter(SERIES_COLORS[4:])  # other modes (e.g. torch.compile's reduce-overhead)
    colors = {m: MODE_COLORS.get(m) or next(extra, "#555555") for m in modes}
    text_w, bar_h, gap, band_gap, top = 210, 15, 4, 14, 30
    plot_w = width - label_w - text_w - 10
    band_h = len(modes) * (bar_h + gap) + band_gap
    height = top + len(rows) * band_h + 8
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart timing-chart" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" {FONT} font-size="11">',
        "<title>median time per bucket; whiskers: the spread of the repetitions</title>",
    ]
    x = label_w
    for m in modes:  # legend
        out.append(
            f'<rect x="{x}" y="6" width="12" height="12" fill="{colors[m]}"/>'
            f'<text x="{x + 16}" y="16">{_e(m)}</text>'
        )
        x += 26 + 7 * len(m)
    ranges = any(t.has_range for r in rows for t in r.times.values())
    out.append(
        f'<text x="{width - 4}" y="16" text-anchor="end" fill="#666">'
        + ("bar: median · whisker: spread of the repetitions" if ranges else "bar: median")
        + "</text>"
    )
    for k, row in enumerate(rows):
        y0 = top + k * band_h
        present = [row.times[m] for m in modes if m in row.times]
        # The scale follows the medians (an outlier repetition would squash the bars); a
        # whisker that runs past the scale ends in an arrow.
        scale = 1.5 * max((t.median_s for t in present), default=0.0) or 1.0
        out.append(
            f'<text class="bucket-label" x="{label_w - 8}" y="{y0 + (band_h - band_gap) / 2 + 4}" '
            f'text-anchor="end" font-weight="bold">{_e(row.label)}</text>'
        )
        base = row.times.get("eager")
        for j, m in enumerate(modes):
            t = row.times.get(m)
            y = y0 + j * (bar_h + gap)
            if t is None:
                out.append(
                    f'<text x="{label_w + 4}" y="{y + bar_h - 3}" fill="#999">{_e(m)}: not timed'
                    "</text>"
                )
                continue
            w = max(1.0, plot_w * t.median_s / scale)
            tip = f"{row.label}, {m}: median {fmt_time(t.median_s)}"
            if t.has_range:
                tip += f", repetitions from {fmt_time(t.lo_s)} to {fmt_time(t.hi_s)}"
            if t.reps:
                tip += f" ({t.reps} reps)"
            if not t.stable:
                tip += "; unstable: the median had not settled"
            out.append(
                f'<g class="bar" data-mode="{_e(m)}"><title>{_e(tip)}</title>'
                f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" '
                f'fill="{colors[m]}" opacity="{1.0 if t.stable else 0.55}"/>'
            )
            if t.has_range:
                x1 = label_w + plot_w * min(t.lo_s / scale, 1.0)
                x2 = label_w + plot_w * min(t.hi_s / scale, 1.0)
                ym = y + bar_h / 2
                cap = (
                    f"M{x2 - 6:.1f},{ym - 4} L{x2:.1f},{ym} L{x2 - 6:.1f},{ym + 4}"
                    if t.hi_s > scale
                    else f"M{x2:.1f},{ym - 4} V{ym + 4}"
                )
                out.append(
                    f'<path class="whisker" d="M{x1:.1f},{ym} H{x2:.1f} M{x1:.1f},{ym - 4} '
                    f'V{ym + 4} {cap}" stroke="#222" fill="none"/>'
                )
            text = fmt_time(t.median_s)
            if m != "eager" and base is not None and t.median_s > 0:
                r = base.median_s / t.median_s
                text += (
                    f"  ({r:.2f}× faster than eager)"
                    if r >= 1
                    else (f"  ({1 / r:.2f}× slower than eager)")
                )
            if not t.stable:
                text += "  ⚠ unstable"
            color = "#b03a2e" if not t.stable else "#222"
            out.append(
                f'<text x="{label_w + plot_w + 8}" y="{y + bar_h - 3}" fill="{color}">'
                f"{_e(text)}</text></g>"
            )
    out.append("</svg>")
    return "\n".join(out)


# ---- roofline ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoofPoint:
    intensity: float  # FLOP per byte
    flops_per_s: float
    series: str  # legend entry (e.g. the bucket)
    kind: str  # "group (predicted)" or "plan (measured)"
    tip: str


@dataclass(frozen=True)
class Roofs:
    device: str
    mem_bw_Bps: float
    ceilings: tuple[tuple[str, float], ...]  # (name, FLOP/s), e.g. ("matmul fp32", 6.7e13)


def _si(v: float) -> str:
    """3 significant digits and an SI prefix: 332 G, 1.5 T, 0.01."""
    for unit, s in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= s:
            return f"{v / s:.3g} {unit}"
    return f"{v:.3g}"


def _decades(lo: float, hi: float) -> tuple[int, int]:
    return math.floor(math.log10(lo)), math.ceil(math.log10(hi))


def roofline_chart(points: Sequence[RoofPoint], roofs: Roofs, width: int = 820) -> str:
    """Log-log FLOP/s against arithmetic intensity, under the device's roofs: memory
    bandwidth (the slope) and each compute ceiling (flat). One colour per series."""
    pts = [p for p in points if p.intensity > 0 and p.flops_per_s > 0]
    pts = [p for p in pts if math.isfinite(p.intensity) and math.isfinite(p.flops_per_s)]
    height, left, right, top, bottom = 420, 70, 200, 20, 46
    pw, ph = width - left - right, height - top - bottom
    peak = max((c for _, c in roofs.ceilings), default=1e12)
    ridge = peak / roofs.mem_bw_Bps
    xs = [p.intensity for p in pts] + [ridge * 4, 0.05]
    ys = [p.flops_per_s for p in pts] + [peak * 1.5]
    x0, x1 = _decades(min(xs), max(xs))
    y0, y1 = _decades(min([*ys, min(xs) * roofs.mem_bw_Bps]), max(ys))
    y0 = max(y0, y1 - 8)  # at most 8 decades: the interesting part, not the floor

    def px(v: float) -> float:
        return left + pw * (math.log10(v) - x0) / (x1 - x0)

    def py(v: float) -> float:
        v = max(v, 10.0**y0)
        return top + ph * (1 - (math.log10(v) - y0) / (y1 - y0))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart roofline-chart" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" {FONT} font-size="11">',
        f"<title>roofline of {_e(roofs.device)}</title>",
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfbfb" stroke="#999"/>',
    ]
    for d in range(x0, x1 + 1):
        x = px(10.0**d)
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#e6e6e6"/>'
            f'<text x="{x:.1f}" y="{top + ph + 15}" text-anchor="middle">{_si(10.0**d)}</text>'
        )
    for d in range(y0, y1 + 1):
        y = py(10.0**d)
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e6e6e6"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_si(10.0**d)}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">'
        "arithmetic intensity (FLOP per byte moved)</text>"
        f'<text transform="translate(16,{top + ph / 2}) rotate(-90)" text-anchor="middle">'
        "FLOP/s</text>"
    )
    xa, xb = 10.0**x0, 10.0**x1
    for k, (name, ceiling) in enumerate(sorted(roofs.ceilings, key=lambda c: -c[1])):
        knee = ceiling / roofs.mem_bw_Bps
        dash = "" if k == 0 else ' stroke-dasharray="6,4"'
        xs_knee = max(min(knee, xb), xa)
        out.append(
            f'<path class="roof" d="M{px(xa):.1f},{py(xa * roofs.mem_bw_Bps):.1f} '
            f"L{px(xs_knee):.1f},{py(min(xs_knee * roofs.mem_bw_Bps, ceiling)):.1f} "
            f'L{px(xb):.1f},{py(ceiling):.1f}" stroke="#444" stroke-width="1.6" fill="none"'
            f"{dash}><title>{_e(name)}: {_si(ceiling)}FLOP/s, ridge at "
            f"{knee:.3g} FLOP/B</title></path>"
            f'<text x="{px(xb) - 4:.1f}" y="{py(ceiling) - 5:.1f}" text-anchor="end" '
            f'fill="#444">{_e(name)}: {_si(ceiling)}FLOP/s</text>'
        )
    # The bandwidth roof's name along its slope, a decade in from the left edge.
    at = 10.0 ** (x0 + 0.5)
    ax, ay = px(at), py(at * roofs.mem_bw_Bps)
    angle = math.degrees(math.atan2(py(at * 10 * roofs.mem_bw_Bps) - ay, px(at * 10) - ax))
    out.append(
        f'<text x="{ax:.1f}" y="{ay - 6:.1f}" fill="#444" '
        f'transform="rotate({angle:.1f} {ax:.1f} {ay:.1f})">'
        f"memory: {roofs.mem_bw_Bps / 1e9:.3g} GB/s</text>"
    )
    series = list(dict.fromkeys(p.series for p in pts))
    color = {s: SERIES_COLORS[i % len(SERIES_COLORS)] for i, s in enumerate(series)}
    for p in sorted(pts, key=lambda p: p.kind != "group (predicted)"):
        x, y = px(p.intensity), py(p.flops_per_s)
        tip = f"<title>{_e(p.tip)}</title>"
        if p.kind == "group (predicted)":
            out.append(
                f'<circle class="point group-point" cx="{x:.1f}" cy="{y:.1f}" r="4" '
                f'fill="{color[p.series]}" fill-opacity="0.75" stroke="white">{tip}</circle>'
            )
        else:
            out.append(
                f'<path class="point plan-point" d="M{x:.1f},{y - 7:.1f} L{x + 7:.1f},{y:.1f} '
                f'L{x:.1f},{y + 7:.1f} L{x - 7:.1f},{y:.1f} Z" fill="{color[p.series]}" '
                f'stroke="#111" stroke-width="1.4">{tip}</path>'
            )
    lx, ly = left + pw + 14, top + 8
    out.append(f'<text x="{lx}" y="{ly}" font-weight="bold">legend</text>')
    ly += 18
    out.append(
        f'<circle cx="{lx + 6}" cy="{ly - 4}" r="4" fill="#777"/>'
        f'<text x="{lx + 16}" y="{ly}">a group, predicted</text>'
    )
    ly += 18
    out.append(
        f'<path d="M{lx + 6},{ly - 11} L{lx + 13},{ly - 4} L{lx + 6},{ly + 3} L{lx - 1},{ly - 4} '
        f'Z" fill="#777" stroke="#111"/><text x="{lx + 16}" y="{ly}">whole plan, measured</text>'
    )
    ly += 24
    for s in series[:14]:
        out.append(
            f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{color[s]}"/>'
            f'<text x="{lx + 16}" y="{ly}">{_e(s)}</text>'
        )
        ly += 18
    out.append("</svg>")
    return "\n".join(out)


# ---- a plan's time split by group --------------------------------------------------------------
@dataclass(frozen=True)
class Share:
    label: str  # e.g. "G3"
    seconds: float
    fill: str
    border: str
    tip: str


def share_bar(shares: Sequence[Share], width: int = 820) -> str:
    """One stacked bar: each group's predicted share of the plan's time, in its colour."""
    total = sum(s.seconds for s in shares if s.seconds > 0)
    height = 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart share-bar" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" {FONT} font-size="11">'
    ]
    x = 0.0
    for s in shares:
        if s.seconds <= 0 or not total:
            continue
        w = width * s.seconds / total
        out.append(
            f'<g class="share"><title>{_e(s.tip)}</title><rect x="{x:.1f}" y="2" '
            f'width="{w:.1f}" height="{height - 4}" fill="{s.fill}" stroke="{s.border}"/>'
        )
        if w > 9 * len(s.label) + 8:
            out.append(
                f'<text x="{x + w / 2:.1f}" y="{height / 2 + 4}" text-anchor="middle" '
                f'fill="{s.border}" font-weight="bold">{_e(s.label)}</text>'
            )
        out.append("</g>")
        x += w
    out.append("</svg>")
    return "\n".join(out)
