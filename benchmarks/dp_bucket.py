"""The DP gradient bucket size: predicted by the two-stream model, measured with DDP over
gloo on local processes, the searched size against DDP's 25 MiB:

    python benchmarks/dp_bucket.py [--world-size 2] [--d 512 --hid 2048 --layers 3 --batch 32]
        [--out benchmarks/results/dp_bucket_cpu.json]

Measured on the ranks (medians, max over ranks): forward and forward+backward of
zoo:mlp without communication, a DDP step per bucket cap (DDP built by
planner.distributed.ddp.wrap_ddp from a plan's decision of that cap, as a user realizes
a plan), all-reduce per message size.
Predicted: the backward split over zoo:mlp's captured ops in proportion to the analytical
model's per-op times and scaled to the measured backward; the all-reduce from an α-β fit
of the measured sizes; the step from planner.distributed.dp (DDP's 1 MiB first bucket).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import zoo
from benchmarks.comm_alpha_beta import fits_text
from learned_cost.analytical import AnalyticalModel
from planner.distributed.dp import DDP_BUCKET_BYTES, backward_steps
from planner.distributed.links import AlphaBeta
from planner.hardware import get_spec
from planner.ir.capture import capture
from profiling.commbench import fit_alpha_beta, measure_ddp, predict_s
from search.bucket_search import search_bucket_size

MB = 1024 * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--hid", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--caps-mb", default="0.25,1,4,8,16,25,64")
    ap.add_argument("--out", default="benchmarks/results/dp_bucket_cpu.json")
    a = ap.parse_args()
    caps = [float(c) for c in a.caps_mb.split(",")]
    m = measure_ddp(a.world_size, a.d, a.hid, a.layers, a.batch, caps, a.reps)
    fits = fit_alpha_beta([(b, t) for b, t in m["all_reduce"]])

    def ar(nbytes: int) -> float:
        return predict_s(fits, nbytes)

    module, inputs = zoo.get("mlp").build({"B": a.batch, "D": a.d, "HID": a.hid, "L": a.layers})
    module.train()
    graph = capture(module, inputs)
    model = AnalyticalModel(get_spec("cpu"))
    op_s = [model.group_cost(graph, frozenset((n.index,))).latency_s for n in graph.nodes]
    steps = backward_steps(graph, lambda i: op_s[i])
    bwd_measured = m["fwd_bwd_s"] - m["fwd_s"]
    scale = bwd_measured / sum(s.duration_s for s in steps)
    steps = [type(s)(s.name, s.duration_s * scale, s.grad_bytes) for s in steps]
    grid = [int(c * MB) for c in caps]
    choice = search_bucket_size(steps, ar, forward_s=m["fwd_s"], grid=grid)
    rows = []
    for (_, pred), cap in zip(choice.table, caps, strict=True):
        meas = m["ddp_s"][str(cap)]
        rows.append(
            {
                "bucket_mb": cap,
                "predicted_s": pred,
                "measured_s": meas,
                "rel_err": abs(pred - meas) / meas,
            }
        )
        print(
            f"bucket {cap:6.2f} MiB: predicted {pred * 1e3:8.2f} ms, measured "
            f"{meas * 1e3:8.2f} ms ({abs(pred - meas) / meas:.1%})"
        )
    chosen = choice.bucket_bytes / MB
    meas_chosen = m["ddp_s"][str(next(c for c in caps if int(c * MB) == choice.bucket_bytes))]
    meas_ddp = m["ddp_s"][str(float(DDP_BUCKET_BYTES // MB))]
    best_measured = min(rows, key=lambda r: r["measured_s"])
    print(
        f"searched bucket {chosen:g} MiB: measured {meas_chosen * 1e3:.2f} ms; DDP's 25 MiB: "
        f"{meas_ddp * 1e3:.2f} ms; best measured {best_measured['bucket_mb']:g} MiB "
        f"{best_measured['measured_s'] * 1e3:.2f} ms"
    )
    grads = sum(b for s in steps for b in s.grad_bytes)
    out = {
        "config": vars(a),
        "torch": torch.__version__,
        "grad_bytes": grads,
        "measured": m,
        "alpha_beta_fits": [f.__dict__ for f in fits],
        "rows": rows,
        "searched_bucket_mb": chosen,
        "measured_at_searched_s": meas_chosen,
        "measured_at_ddp_default_s": meas_ddp,
        "best_measured": best_measured,
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
    lines = [
        f"Measured: forward {m['fwd_s'] * 1e3:.0f} ms, forward+backward without "
        f"communication {m['fwd_bwd_s'] * 1e3:.0f} ms, all-reduce fit (α, B) {fit} "
        f"({grads / MB:.0f} MiB of gradients in {ar_all * 1e3:.0f} ms).",
        "",
        "| bucket MiB | " + " | ".join(f"{r['bucket_mb']:g}" for r in rows) + " |",
        "|---|" + "---|" * len(rows),
        "| predicted ms | " + " | ".join(f"{r['predicted_s'] * 1e3:.1f}" for r in rows) + " |",
        "| measured ms | " + " | ".join(f"{r['measured_s'] * 1e3:.1f}" for r in rows) + " |",
        "",
        f"The search picks {d['searched_bucket_mb']:g} MiB (predicted "
        f"{chosen['predicted_s'] * 1e3:.1f} ms against {ddp['predicted_s'] * 1e3:.1f} ms for "
        f"DDP's 25 MiB); measured {chosen['measured_s'] * 1e3:.1f} ms against "
        f"{ddp['measured_s'] * 1e3:.1f} ms. The model's error over the caps: "
        f"{min(errs):.0%} to {max(errs):.0%}. The serial sum (forward+backward, then every "
        f"gradient's all-reduce) is {(m['fwd_bwd_s'] + ar_all) * 1e3:.0f} ms; the measured "
        f"steps range over {min(ms) * 1e3:.0f}-{max(ms) * 1e3:.0f} ms.",
    ]
    return "\n".join(lines) + "\n"


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
        errs = [r["rel_err"] for r in d["rows"]]
        best = d["best_measured"]
        lines.append(
            f"- `{path.name}`: model error {min(errs):.0%} to {max(errs):.0%}; searched "
            f"{d['searched_bucket_mb']:g} MiB measured {d['measured_at_searched_s'] * 1e3:.1f} ms, "
            f"DDP's 25 MiB {d['measured_at_ddp_default_s'] * 1e3:.1f} ms; fastest measured "
            f"{best['bucket_mb']:g} MiB ({best['measured_s'] * 1e3:.1f} ms)"
        )
    return "\n".join(lines) + "\n"
