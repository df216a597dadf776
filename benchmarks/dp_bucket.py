"""The DP gradient bucket size: predicted by the step model the search uses for gloo on
CPU ranks (planner.distributed.dp.step_model_for_backend: serial, unless `--step-model`
names one), measured with DDP over gloo on local processes, the searched size against
DDP's 25 MiB:

    python benchmarks/dp_bucket.py [--world-size 2] [--d 512 --hid 2048 --layers 3 --batch 32]
        [--step-model two-stream|serial] [--out benchmarks/results/dp_bucket_cpu.json]

Measured on the ranks (medians, max over ranks): forward and forward+backward of
zoo:mlp without communication, a DDP step per bucket cap (DDP built by
planner.distributed.ddp.wrap_ddp from a plan's decision of that cap, as a user realizes
a plan), all-reduce per message size.
Predicted: the backward split over zoo:mlp's captured ops in proportion to the analytical
model's per-op times and scaled to the measured backward; the all-reduce from an α-β fit
of the measured sizes; the step from planner.distributed.dp (DDP's 1 MiB first bucket)
under the search's step model, and beside it the two-stream step and the variants with
DDP's copies. Results written before the search chose its step model priced (and
searched) on two streams; their files hold no `step_model`.

The measured backward (profiling.backward, on the ranks in the same rounds: each
gradient's ready time from a hook, the same loss) is a further variant: the step under
the search's step model and on two streams with those steps and that forward in place of
the estimate, and the size the search picks on them. Results written before it hold no
`backward` in `measured`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import zoo
from benchmarks.comm_alpha_beta import fits_text
from learned_cost.analytical import AnalyticalModel
from planner.distributed.dp import (
    DDP_BUCKET_BYTES,
    STEP_MODELS,
    BackwardStep,
    StepModel,
    backward_steps,
    dp_step_timeline,
    first_bucket_bytes,
    step_model_for_backend,
)
from planner.distributed.links import AlphaBeta
from planner.hardware import get_spec
from planner.ir.capture import capture
from profiling.backward import steps_from_ready
from profiling.commbench import fit_alpha_beta, measure_ddp, predict_s
from search.bucket_search import search_bucket_size

MB = 1024 * 1024


def variant_predictions(
    steps: list[BackwardStep], bucket_bytes: int, ar: Callable[[int], float], m: dict[str, Any]
) -> dict[str, float]:
    """The step at `bucket_bytes` on two streams, and under two variants of it: with
    DDP's copies into and out of its buckets on the compute stream (the measured copy of
    every gradient byte, scaled to each copy's bytes), and with those copies and the
    all-reduces all in sequence with the compute (cores shared, nothing overlaps)."""

    def copy_s(nbytes: int) -> float:
        return m["copy_s"] * nbytes / m["copy_bytes"]

    first = first_bucket_bytes(bucket_bytes)
    fwd = m["fwd_s"]
    two = dp_step_timeline(steps, bucket_bytes, ar, fwd, 0.0, first, copy_s)
    serial = dp_step_timeline(steps, bucket_bytes, ar, fwd, 0.0, first, copy_s, True)
    plain = dp_step_timeline(steps, bucket_bytes, ar, fwd, 0.0, first)
    return {
        "predicted_two_stream_s": plain.makespan_s,
        "predicted_copies_s": two.makespan_s,
        "predicted_serial_s": serial.makespan_s,
    }


def measured_backward(m: dict[str, Any]) -> tuple[list[BackwardStep], float]:
    """The ranks' measured backward as steps in ready order, and its forward."""
    b = m["backward"]
    steps, _ = steps_from_ready(b["names"], b["grad_bytes"], [b["ready_s"]])
    return steps, b["forward_s"]


def measured_predictions(
    steps: list[BackwardStep],
    fwd_s: float,
    bucket_bytes: int,
    ar: Callable[[int], float],
    model: StepModel,
) -> dict[str, float]:
    """The step at `bucket_bytes` on the measured backward: under the search's step model
    and on two streams."""
    first = first_bucket_bytes(bucket_bytes)
    ours = dp_step_timeline(steps, bucket_bytes, ar, fwd_s, 0.0, first, serial_comm=model.serial)
    two = dp_step_timeline(steps, bucket_bytes, ar, fwd_s, 0.0, first)
    return {
        "predicted_measured_backward_s": ours.makespan_s,
        "predicted_measured_backward_two_stream_s": two.makespan_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--hid", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--caps-mb", default="0.25,1,4,8,16,25,64")
    ap.add_argument(
        "--step-model",
        choices=STEP_MODELS,
        default=None,
        help="the search's DP step model (default: what the planner chooses for gloo on CPU)",
    )
    ap.add_argument("--out", default="benchmarks/results/dp_bucket_cpu.json")
    a = ap.parse_args()
    load_before = os.getloadavg()[0]
    caps = [float(c) for c in a.caps_mb.split(",")]
    # all-reduce sizes for the fit: powers of 4 from 4 KiB up to the first at or above
    # the largest bucket the caps make (every gradient in one)
    module, inputs = zoo.get("mlp").build({"B": a.batch, "D": a.d, "HID": a.hid, "L": a.layers})
    grad_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    sizes = [4096]
    while sizes[-1] < grad_bytes:
        sizes.append(sizes[-1] * 4)
    m = measure_ddp(a.world_size, a.d, a.hid, a.layers, a.batch, caps, a.reps, sizes)
    fits = fit_alpha_beta([(b, t) for b, t in m["all_reduce"]])

    def ar(nbytes: int) -> float:
        return predict_s(fits, nbytes)

    module.train()
    graph = capture(module, inputs)
    model = AnalyticalModel(get_spec("cpu"))
    op_s = [model.group_cost(graph, frozenset((n.index,))).latency_s for n in graph.nodes]
    steps = backward_steps(graph, lambda i: op_s[i])
    bwd_measured = m["fwd_bwd_s"] - m["fwd_s"]
    scale = bwd_measured / sum(s.duration_s for s in steps)
    steps = [type(s)(s.name, s.duration_s * scale, s.grad_bytes) for s in steps]
    grid = [int(c * MB) for c in caps]
    step_model = step_model_for_backend("gloo", "cpu", a.step_model)
    choice = search_bucket_size(steps, ar, forward_s=m["fwd_s"], grid=grid, step_model=step_model)
    m_steps, m_fwd = measured_backward(m)
    m_choice = search_bucket_size(m_steps, ar, forward_s=m_fwd, grid=grid, step_model=step_model)
    rows = []
    for (_, pred), cap in zip(choice.table, caps, strict=True):
        meas = m["ddp_s"][str(cap)]
        more = variant_predictions(steps, int(cap * MB), ar, m)
        more |= measured_predictions(m_steps, m_fwd, int(cap * MB), ar, step_model)
        rows.append(
            {
                "bucket_mb": cap,
                "predicted_s": pred,
                "measured_s": meas,
                "rel_err": abs(pred - meas) / meas,
                **more,
            }
        )
        print(
            f"bucket {cap:6.2f} MiB: predicted ({step_model.name}) {pred * 1e3:8.2f} ms "
            f"(two streams {more['predicted_two_stream_s'] * 1e3:.2f}, with copies "
            f"{more['predicted_copies_s'] * 1e3:.2f}, copies and all-reduces serial "
            f"{more['predicted_serial_s'] * 1e3:.2f}; measured backward "
            f"{more['predicted_measured_backward_s'] * 1e3:.2f}, on two streams "
            f"{more['predicted_measured_backward_two_stream_s'] * 1e3:.2f}), measured "
            f"{meas * 1e3:8.2f} ms "
            f"({abs(pred - meas) / meas:.1%})"
        )
    chosen = choice.bucket_bytes / MB
    meas_chosen = m["ddp_s"][str(next(c for c in caps if int(c * MB) == choice.bucket_bytes))]
    meas_ddp = m["ddp_s"][str(float(DDP_BUCKET_BYTES // MB))]
    best_measured = min(rows, key=lambda r: r["measured_s"])
    print(
        f"searched bucket {chosen:g} MiB ({step_model.name} step model): measured {meas_chosen * 1e3:.2f} ms; DDP's 25 MiB: "
        f"{meas_ddp * 1e3:.2f} ms; best measured {best_measured['bucket_mb']:g} MiB "
        f"{best_measured['measured_s'] * 1e3:.2f} ms"
    )
    m_chosen = m_choice.bucket_bytes / MB
    meas_m_chosen = m["ddp_s"][str(next(c for c in caps if int(c * MB) == m_choice.bucket_bytes))]
    print(
        f"on the measured backward the search picks {m_chosen:g} MiB: measured "
        f"{meas_m_chosen * 1e3:.2f} ms"
    )
    grads = sum(b for s in steps for b in s.grad_bytes)
    out = {
        "config": vars(a),
        "torch": torch.__version__,
        "grad_bytes": grads,
        "measured": m,
        "alpha_beta_fits": [f.__dict__ for f in fits],
        "rows": rows,
        "step_model": step_model.name,
        "searched_bucket_mb": chosen,
        "measured_at_searched_s": meas_chosen,
        "measured_at_ddp_default_s": meas_ddp,
        "best_measured": best_measured,
        # 1-minute load average before and after the run, and the cores it shared
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
        "searched_measured_backward_mb": m_chosen,
        "measured_at_searched_measured_backward_s": meas_m_chosen,
    }
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()


# ---- tables of committed results (benchmarks/generated.py) -------------------------------
def render(path: Path) -> str:
    """What one run measured, its bucket table (predicted beside measured) and the
    searched cap against DDP's default."""
    d = json.loads(path.read_text())
    m, rows = d["measured"], d["rows"]
    fits = [AlphaBeta(**f) for f in d["alpha_beta_fits"]]
    grads = d["grad_bytes"]
    ar_all = predict_s(fits, grads)
    fit = fits_text(d["alpha_beta_fits"])
    ms = [r["measured_s"] for r in rows]
    errs = [r["rel_err"] for r in rows]
    ddp = next(r for r in rows if r["bucket_mb"] == DDP_BUCKET_BYTES / MB)
    chosen = next(r for r in rows if r["bucket_mb"] == d["searched_bucket_mb"])
    load = (
        f" (load average {d['load_average'][0]:.1f} before, {d['load_average'][1]:.1f} after, "
        f"on {d['cpus']} cores)"
        if "load_average" in d
        else ""
    )
    lines = [
        f"Measured{load}: forward {m['fwd_s'] * 1e3:.0f} ms, forward+backward without "
        f"communication {m['fwd_bwd_s'] * 1e3:.0f} ms, all-reduce fit (α, B) {fit} "
        f"({grads / MB:.0f} MiB of gradients in {ar_all * 1e3:.0f} ms).",
        "",
        "| bucket MiB | " + " | ".join(f"{r['bucket_mb']:g}" for r in rows) + " |",
        "|---|" + "---|" * len(rows),
        f"| predicted{_model(d)} ms | "
        + " | ".join(f"{r['predicted_s'] * 1e3:.1f}" for r in rows)
        + " |",
        *_variant_rows(rows),
        "| measured ms | " + " | ".join(f"{r['measured_s'] * 1e3:.1f}" for r in rows) + " |",
        "",
        f"The search picks {d['searched_bucket_mb']:g} MiB{_model(d, 'under its ')} (predicted "
        f"{chosen['predicted_s'] * 1e3:.1f} ms against {ddp['predicted_s'] * 1e3:.1f} ms for "
        f"DDP's 25 MiB); measured {chosen['measured_s'] * 1e3:.1f} ms against "
        f"{ddp['measured_s'] * 1e3:.1f} ms. The model's error over the caps: "
        f"{min(errs):.0%} to {max(errs):.0%}. The serial sum (forward+backward, then every "
        f"gradient's all-reduce) is {(m['fwd_bwd_s'] + ar_all) * 1e3:.0f} ms; the measured "
        f"steps range over {min(ms) * 1e3:.0f}-{max(ms) * 1e3:.0f} ms.",
    ]
    if "copy_s" in m:
        lines += ["", _variant_text(m, rows)]
    if "backward" in m:
        lines += ["", _backward_text(d)]
    return "\n".join(lines) + "\n"


def _backward_text(d: dict[str, Any]) -> str:
    """The measured backward: its forward, when its gradients were ready (first and last,
    against the estimate's backward), and the cap the search picks on it."""
    m = d["measured"]
    b = m["backward"]
    steps, fwd = measured_backward(m)
    estimated = m["fwd_bwd_s"] - m["fwd_s"]
    order = ", ".join(s.name for s in steps)
    return (
        f"The measured backward (the ranks' gradient hooks, median of {b['passes']} passes, "
        f"max over ranks): forward {fwd * 1e3:.1f} ms, the last gradient ready "
        f"{sum(s.duration_s for s in steps) * 1e3:.1f} ms into the backward (the estimate "
        f"spreads {estimated * 1e3:.1f} ms over the ops), in the order {order}. "
        f"On it the search picks {d['searched_measured_backward_mb']:g} MiB, measured "
        f"{d['measured_at_searched_measured_backward_s'] * 1e3:.1f} ms."
    )


_VARIANTS = (
    ("predicted_two_stream_s", "two streams"),
    ("predicted_copies_s", "with DDP's copies"),
    ("predicted_serial_s", "copies and all-reduces on the compute stream"),
    ("predicted_measured_backward_s", "measured backward, the search's step model"),
    ("predicted_measured_backward_two_stream_s", "measured backward, two streams"),
)


def _model(d: dict[str, Any], before: str = "") -> str:
    """ " (serial)"-style naming of the run's search step model; "" for runs written
    before the search chose one (they searched on two streams)."""
    name = d.get("step_model")
    if not name:
        return ""
    return f" ({name})" if not before else f" {before}{name} step model"


def _variant_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Table rows of the model's variants, where the run recorded them."""
    return [
        f"| {label} ms | " + " | ".join(f"{r[key] * 1e3:.1f}" for r in rows) + " |"
        for key, label in _VARIANTS
        if all(key in r for r in rows)
    ]


def _err(row: dict[str, Any], key: str) -> float:
    return abs(row[key] - row["measured_s"]) / row["measured_s"]


def _err_range(rows: list[dict[str, Any]], key: str) -> str:
    """The error of the model variant `key` over the caps, lowest to highest."""
    errs = [_err(r, key) for r in rows]
    return f"{min(errs):.0%} to {max(errs):.0%}"


def _variant_text(m: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The measured copy and each variant's error range over the caps."""
    gbps = m["copy_bytes"] / m["copy_s"] / 1e9
    parts = [
        f"{label} {_err_range(rows, key)}"
        for key, label in _VARIANTS
        if all(key in r for r in rows)
    ]
    return (
        f"One copy of every gradient byte took {m['copy_s'] * 1e3:.1f} ms ({gbps:.1f} GB/s "
        f"read and written). Error over the caps of the model {'; '.join(parts)}."
    )


def render_earlier(paths: list[Path]) -> str:
    """Per results file: its batch and the range of the measured steps over the caps."""
    lines = []
    for path in paths:
        d = json.loads(path.read_text())
        ms = [r["measured_s"] * 1e3 for r in d["rows"]]
        lines.append(
            f"- `{path.name}` (batch {d['config']['batch']}): measured "
            f"{min(ms):.0f}-{max(ms):.0f} ms over the caps"
        )
    return "\n".join(lines) + "\n"


def render_runs(paths: list[Path]) -> str:
    """Per results file: the model's error range over the caps, the searched cap's and
    DDP's default's measured steps, and the cap measured fastest."""
    lines = []
    for path in paths:
        d = json.loads(path.read_text())
        rows = d["rows"]
        errs = [r["rel_err"] for r in rows]
        best = d["best_measured"]
        fit_mib = max(b for b, _ in d["measured"]["all_reduce"]) / MB
        variants = "".join(
            f", {label} {_err_range(rows, key)}"
            for key, label in _VARIANTS
            if all(key in r for r in rows)
        )
        on_measured = (
            f", on the measured backward {d['searched_measured_backward_mb']:g} MiB measured "
            f"{d['measured_at_searched_measured_backward_s'] * 1e3:.1f} ms"
            if "searched_measured_backward_mb" in d
            else ""
        )
        lines.append(
            f"- `{path.name}` (all-reduce fit up to {fit_mib:g} MiB): model{_model(d)} error "
            f"{min(errs):.0%} to {max(errs):.0%}{variants}; searched "
            f"{d['searched_bucket_mb']:g} MiB measured {d['measured_at_searched_s'] * 1e3:.1f} ms"
            f"{on_measured}, "
            f"DDP's 25 MiB {d['measured_at_ddp_default_s'] * 1e3:.1f} ms; fastest measured "
            f"{best['bucket_mb']:g} MiB ({best['measured_s'] * 1e3:.1f} ms)"
        )
    return "\n".join(lines) + "\n"


def render_summary(paths: list[Path]) -> str:
    """Over several runs: the range of each model's error, the largest cap's measured
    step against the serial variant's, and the searched cap against DDP's default."""

    def span(values: list[float], fmt: str) -> str:
        lo, hi = fmt.format(min(values)), fmt.format(max(values))
        return lo if lo == hi else f"{lo} to {hi}"

    runs = [json.loads(p.read_text()) for p in paths]
    rows = [r for d in runs for r in d["rows"]]
    # runs written before the search chose its step model searched on two streams: named
    # so where other runs name theirs
    mixed = any(_model(d) for d in runs)

    def label(d: dict[str, Any]) -> str:
        return _model(d) or (" (two-stream)" if mixed else "")

    parts = [
        f"the search's model{name} "
        + span([r["rel_err"] for d in runs if label(d) == name for r in d["rows"]], "{:.0%}")
        for name in sorted({label(d) for d in runs})
    ]
    for key, label in _VARIANTS:
        have = [r for r in rows if key in r]
        if have:
            parts.append(f"{label} {span([_err(r, key) for r in have], '{:.0%}')}")
    lines = [f"Over these {len(runs)} runs, error over the caps: " + "; ".join(parts) + "."]
    last = [d["rows"][-1] for d in runs if "predicted_serial_s" in d["rows"][-1]]
    if last:
        lines.append(
            f"At the largest cap ({last[0]['bucket_mb']:g} MiB, one bucket: nothing can "
            f"overlap) measured {span([r['measured_s'] * 1e3 for r in last], '{:.0f}')} ms, "
            f"the serial variant {span([r['predicted_serial_s'] * 1e3 for r in last], '{:.0f}')} ms."
        )
    gain = [(d["measured_at_ddp_default_s"] - d["measured_at_searched_s"]) * 1e3 for d in runs]
    won = [g for g in gain if g > 0]
    lost = [-g for g in gain if g <= 0]
    text = f"The searched cap measured faster than DDP's default in {len(won)} of {len(runs)}"
    if won:
        text += f" (by {span(won, '{:.0f}')} ms)"
    if lost:
        text += f", slower or equal in {len(lost)} (by {span(lost, '{:.0f}')} ms)"
    lines.append(text + ".")
    return " ".join(lines) + "\n"
