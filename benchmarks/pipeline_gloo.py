"""A two-stage pipeline of a small MLP on two gloo ranks, measured, against the pipeline
step model (planner.distributed.pipeline) fed with what the ranks measured:

    python benchmarks/pipeline_gloo.py [--d 256 --hid 1024 --layers 2 --batch 64
        --microbatches 4 --reps 15] [--out benchmarks/results/pipeline_gloo_cpu.json]

Each rank holds one stage (`layers` blocks of Linear(d, hid), ReLU, Linear(hid, d)) and
runs its stage's order of the schedule (`pipeline.stage_order`, GPipe and 1F1B): every
receive is an `irecv` posted at the start of the step and waited for by the forward
(activation) or backward (gradient) that needs it, and every send an `isend` waited for
at the end (the model's assumptions: a message moves as soon as its sender has it, and a
stage does not wait for its own sends). The step is timed
from a barrier to the last rank's end (max over ranks), median of `reps` steps.

Measured for the model: each stage's forward and backward of one micro-batch (median),
one rank at a time while the other waits (the model gives each stage its own processor),
and the one-way time of a
message of a quarter, one, four and sixteen times the activation's size (ping-pong,
median), fitted as α + S·β. Predicted: `pipeline.pipeline_step` with those inputs; beside
it the closed form (m + p - 1)·max stage (f + b) and the sum of every task (no overlap).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from planner.distributed.comm_cost import bubble_fraction
from planner.distributed.pipeline import BACKWARD, FORWARD, pipeline_step, stage_order
from profiling.commbench import fit_alpha_beta, run_ranks

SCHEDULES = ("gpipe", "1f1b")


def _stage(d: int, hid: int, layers: int, rank: int) -> torch.nn.Module:
    torch.manual_seed(rank)
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(d, hid), torch.nn.ReLU(), torch.nn.Linear(hid, d)]
    return torch.nn.Sequential(*blocks)


def _median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _max_over_ranks(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _one_way_s(rank: int, nbytes: int, reps: int, trips: int = 10) -> float:
    """A float32 message of `nbytes` between ranks 0 and 1, one way: the median over
    `reps` samples of `trips` round trips, divided by 2·trips."""
    buf = torch.zeros(max(1, nbytes // 4))

    def trip() -> None:
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    for _ in range(3):  # warm-up
        trip()
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(trips):
            trip()
        times.append((time.perf_counter() - t0) / (2 * trips))
    return statistics.median(times)


def _step(
    rank: int, model: torch.nn.Module, xs: list[torch.Tensor], schedule: str
) -> tuple[float, float, float]:
    """One pipeline step of `schedule` on this rank (two ranks): this rank's seconds from
    the barrier to its end, in its forwards and backwards, and waiting for its receives.
    Every receive is posted at the start, so a message can move as soon as its sender
    has it."""
    m, last = len(xs), rank == 1
    shape = xs[0].shape
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    sends = []
    compute = waiting = 0.0
    dist.barrier()
    t0 = time.perf_counter()
    # activations travel with tag i, gradients with tag m + i
    bufs = [torch.empty(shape) for _ in range(m)]
    if last:
        recvs = [dist.irecv(bufs[i], 0, tag=i) for i in range(m)]
    else:
        recvs = [dist.irecv(bufs[i], 1, tag=m + i) for i in range(m)]

    def received(i: int) -> torch.Tensor:
        nonlocal waiting
        t = time.perf_counter()
        recvs[i].wait()
        waiting += time.perf_counter() - t
        return bufs[i]

    for kind, i in stage_order(schedule, 2, rank, m):
        t = time.perf_counter()
        if kind == FORWARD:
            x = received(i).requires_grad_(True) if last else xs[i]
            t = time.perf_counter()
            inputs[i] = x
            outputs[i] = model(x)
            compute += time.perf_counter() - t
            if not last:
                sends.append(dist.isend(outputs[i].detach(), 1, tag=i))
        else:
            assert kind == BACKWARD
            if last:
                outputs[i].sum().backward()
            else:
                grad = received(i)
                t = time.perf_counter()
                outputs[i].backward(grad)
            compute += time.perf_counter() - t
            if last:
                sends.append(dist.isend(inputs[i].grad, 0, tag=m + i))
    for w in sends:
        w.wait()
    return time.perf_counter() - t0, compute, waiting


def pipeline_ranks(
    rank: int, world: int, d: int, hid: int, layers: int, batch: int, m: int, reps: int
) -> dict[str, Any]:
    """One rank's measurements (rank 0's dict is the result; values are max over ranks)."""
    assert world == 2, "the benchmark runs two stages on two ranks"
    model = _stage(d, hid, layers, rank)
    mb = batch // m
    torch.manual_seed(100)
    xs = [torch.randn(mb, d) for _ in range(m)]
    x = torch.randn(mb, d, requires_grad=rank > 0)  # as in the step: stage 0 needs no dX
    grad = torch.randn(mb, d)

    def bwd_once() -> float:
        y = model(x)
        t0 = time.perf_counter()
        y.backward(grad)
        return time.perf_counter() - t0

    for _ in range(3):  # warm-up
        bwd_once()
    stage_f = [0.0, 0.0]
    stage_b = [0.0, 0.0]
    for turn in range(world):  # one rank at a time: the other waits in the barrier
        dist.barrier()
        if turn == rank:
            # with autograd's bookkeeping, as in the step
            stage_f[rank] = _median_s(lambda: model(x), reps)
            stage_b[rank] = statistics.median(bwd_once() for _ in range(reps))
    dist.barrier()
    ft = torch.tensor(stage_f, dtype=torch.float64)
    bt = torch.tensor(stage_b, dtype=torch.float64)
    dist.all_reduce(ft)
    dist.all_reduce(bt)
    act = mb * d * 4
    sizes = [act // 4, act, act * 4, act * 16]
    p2p = [(s, _max_over_ranks(_one_way_s(rank, s, reps))) for s in sizes]
    steps: dict[str, list[float]] = {}
    compute: dict[str, list[list[float]]] = {}
    waiting: dict[str, list[list[float]]] = {}
    for schedule in SCHEDULES:
        for _ in range(2):  # warm-up
            _step(rank, model, xs, schedule)
            model.zero_grad(set_to_none=True)
        steps[schedule], compute[schedule], waiting[schedule] = [], [], []
        for _ in range(reps):
            t, busy, idle = _step(rank, model, xs, schedule)
            steps[schedule].append(_max_over_ranks(t))
            per_rank = torch.zeros(2, 2, dtype=torch.float64)
            per_rank[rank] = torch.tensor([busy, idle], dtype=torch.float64)
            dist.all_reduce(per_rank)
            compute[schedule].append(per_rank[:, 0].tolist())
            waiting[schedule].append(per_rank[:, 1].tolist())
            model.zero_grad(set_to_none=True)
    return {
        "forward_s": ft.tolist(),
        "backward_s": bt.tolist(),
        "activation_bytes": act,
        "p2p_one_way": p2p,
        "steps_s": steps,
        "step_compute_s": compute,  # per step, per rank: in forwards and backwards
        "step_recv_s": waiting,  # per step, per rank: in blocking receives
    }


def predict(measured: dict[str, Any], m: int) -> dict[str, Any]:
    """The step model's prediction per schedule from the ranks' measurements."""
    fits = fit_alpha_beta([(int(b), t) for b, t in measured["p2p_one_way"]], max_ranges=1)
    (link,) = fits
    f, b = measured["forward_s"], measured["backward_s"]
    out: dict[str, Any] = {"alpha_s": link.alpha_s, "beta_s_per_byte": link.beta_s_per_byte}
    for schedule in SCHEDULES:
        step = pipeline_step(schedule, f, b, m, [measured["activation_bytes"]], link)
        meas = statistics.median(measured["steps_s"][schedule])
        out[schedule] = {
            "predicted_s": step.step_s,
            "predicted_exposed_p2p_s": step.exposed_p2p_s,
            "predicted_bubble_measured": step.bubble_fraction,
            "measured_s": meas,
            "rel_err": abs(step.step_s - meas) / meas,
            "predicted_busy_s": list(step.busy_s),
            "measured_busy_s": [
                statistics.median(c[r] for c in measured["step_compute_s"][schedule])
                for r in range(2)
            ],
            "measured_recv_s": [
                statistics.median(c[r] for c in measured["step_recv_s"][schedule]) for r in range(2)
            ],
            "closed_form_s": (m + 1) * max(fi + bi for fi, bi in zip(f, b)),
            "closed_form_bubble": bubble_fraction(schedule, 2, m),
            "serial_sum_s": m * (sum(f) + sum(b))
            + 2 * m * link.time_s(measured["activation_bytes"]),
        }
    return out


def _ms(xs: list[float]) -> str:
    return "/".join(f"{x * 1e3:.2f}" for x in xs) + " ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--hid", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="benchmarks/results/pipeline_gloo_cpu.json")
    a = ap.parse_args()
    if a.batch % a.microbatches:
        raise SystemExit(f"--microbatches {a.microbatches} must divide --batch {a.batch}")
    load_before = os.getloadavg()[0]
    args = (a.d, a.hid, a.layers, a.batch, a.microbatches, a.reps)
    measured = run_ranks(2, "benchmarks.pipeline_gloo:pipeline_ranks", args, timeout_s=600)
    pred = predict(measured, a.microbatches)
    for schedule in SCHEDULES:
        r = pred[schedule]
        print(
            f"{schedule}: measured {r['measured_s'] * 1e3:.2f} ms, predicted "
            f"{r['predicted_s'] * 1e3:.2f} ms ({r['rel_err']:.1%}); closed form "
            f"{r['closed_form_s'] * 1e3:.2f} ms, no overlap {r['serial_sum_s'] * 1e3:.2f} ms; "
            f"busy per stage predicted {_ms(r['predicted_busy_s'])}, measured in the step "
            f"{_ms(r['measured_busy_s'])}; in receives {_ms(r['measured_recv_s'])}"
        )
    out = {
        "command": "python benchmarks/pipeline_gloo.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()),
        "config": vars(a),
        "torch": torch.__version__,
        "measured": measured,
        "predicted": pred,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()


# ---- the table of committed runs (benchmarks/generated.py) ---------------------------
def render_runs(paths: list[Path]) -> str:
    """One row per run and schedule: measured and predicted step, the error, the closed
    form and the no-overlap sum, busy time per stage (predicted / measured in the step),
    the time the ranks waited in receives, and the machine's load."""
    lines = [
        "| run | schedule | measured ms | predicted ms | error | closed form ms | "
        "no overlap ms | busy per stage, predicted ms | busy in the step ms | "
        "waiting in receives ms | p2p fit α us | load before/after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        d = json.loads(path.read_text())
        pred = d["predicted"]
        load = "/".join(f"{x:.1f}" for x in d["load_average"])
        for schedule in SCHEDULES:
            r = pred[schedule]
            lines.append(
                f"| {path.stem} | {schedule} | {r['measured_s'] * 1e3:.1f} | "
                f"{r['predicted_s'] * 1e3:.1f} | {r['rel_err']:.0%} | "
                f"{r['closed_form_s'] * 1e3:.1f} | {r['serial_sum_s'] * 1e3:.1f} | "
                f"{_ms(r['predicted_busy_s'])[:-3]} | {_ms(r['measured_busy_s'])[:-3]} | "
                f"{_ms(r['measured_recv_s'])[:-3]} | {pred['alpha_s'] * 1e6:.0f} | "
                f"{load} on {d['cpus']} cores |"
            )
    cfg = json.loads(paths[0].read_text())["config"]
    lines += [
        "",
        f"Config: d={cfg['d']}, hid={cfg['hid']}, {cfg['layers']} blocks per stage, batch "
        f"{cfg['batch']} in {cfg['microbatches']} micro-batches, {cfg['reps']} steps per "
        "schedule (median).",
    ]
    return "\n".join(lines) + "\n"
