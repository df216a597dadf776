"""`fusion-plan measure`: realize a strategy's plan on this machine, verify it, time it
next to eager and torch.compile, with the cost model's prediction beside the numbers."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from learned_cost.analytical import AnalyticalModel
from planner.hardware import get_spec
from planner.realize import realize
from planner.realize_check import short_reason
from planner.runtime_graph import capture_for_serving
from profiling.timer import Timing, measure
from profiling.verify import verify_against_eager
from search import fmt
from search.cli_common import (
    add_device_arg,
    add_dtype_arg,
    add_format_arg,
    add_threads_arg,
    apply_threads,
    check_local_device,
    emit,
    positive_float,
    resolve,
)
from search.planning import make_plan
from search.strategies import STRATEGIES

TIMER = {"warmup": 5, "min_reps": 20, "max_reps": 300, "max_seconds": 10.0}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "measure", help="realize a plan here, check it against eager, time it vs eager/compile"
    )
    p.add_argument("--model", default="zoo:transformer-block", help="zoo:<name> or file.py:fn")
    p.add_argument("--shape", default="", help="e.g. B=8,S=512,D=768,H=12")
    add_device_arg(p, measures=True)
    add_dtype_arg(p)
    p.add_argument("--strategy", default="priority", choices=sorted([*STRATEGIES, "unfused"]))
    p.add_argument("--budget-seconds", type=positive_float, default=10.0, help="search time")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--no-cuda-graphs", action="store_true", help="realize without CUDA graphs")
    add_threads_arg(p)
    add_format_arg(p)
    p.set_defaults(run=run)


def _timed(fn: Any, dev: torch.device, dtype: str) -> Timing:
    with torch.no_grad():
        return measure(fn, device=dev, dtype=dtype, **TIMER)


def run(args: argparse.Namespace) -> int:
    apply_threads(args)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.device = check_local_device(args)
    r = resolve(args)
    module, inputs = r.spec.build(dtype=r.dtype, device=dev)
    # the backend's graph, as tune captures it: a plan made here is one the backend can serve
    captured = capture_for_serving(module, inputs, name=r.spec.label)
    reference = captured.program.module()  # the model as the captured program computes it
    cost_model = AnalyticalModel(get_spec(r.device_name))
    made = make_plan(
        captured.graph,
        args.strategy,
        cost_model,
        device=r.device_name,
        dtype=r.dtype_name,
        budget_s=args.budget_seconds,
    )
    t0 = time.perf_counter()
    realized = realize(
        captured, made.partition, cuda_graphs=not args.no_cuda_graphs and dev.type == "cuda"
    )
    realize_s = time.perf_counter() - t0
    check = verify_against_eager(realized, reference, inputs)
    rows: dict[str, dict[str, Any]] = {}
    eager = _timed(lambda: module(*inputs), dev, r.dtype_name)
    rows["eager"] = {"timing": eager, "setup_s": 0.0}
    if not args.no_compile:
        t0 = time.perf_counter()
        compiled = torch.compile(module)
        with torch.no_grad():
            compiled(*inputs)
        rows["torch.compile"] = {
            "timing": _timed(lambda: compiled(*inputs), dev, r.dtype_name),
            "setup_s": time.perf_counter() - t0,
        }
    rows[f"plan ({args.strategy})"] = {
        "timing": _timed(lambda: realized(*inputs), dev, r.dtype_name),
        "setup_s": made.planning_s + realize_s,
    }
    payload = {
        "model": r.spec.label,
        "device": r.device_name,
        "dtype": r.dtype_name,
        "strategy": args.strategy,
        "n_groups": len(made.partition),
        "realizations": list(realized.realizations),
        "fallbacks": {str(k): v for k, v in realized.fallbacks.items()},
        "reference": realized.reference,
        "cuda_graph": realized.cuda_graph,
        "compile_s": realized.compile_s,
        "verified": check.ok,
        "verify": str(check),
        "predicted_s": made.plan.predicted_s,
        "results": {
            k: {
                **v["timing"].to_dict(),
                "setup_s": v["setup_s"],
                "vs_eager": eager.median_s / v["timing"].median_s,
                "unstable": fmt.unstable(v["timing"]),
                "vs_eager_unstable": fmt.speedup_unstable(eager, v["timing"]),
            }
            for k, v in rows.items()
        },
    }
    lines = [
        f"{r.spec.label} {r.dtype_name} on {r.device_name} ({eager.device_fingerprint}, "
        f"torch {eager.torch_version})",
        f"plan: {args.strategy}, {len(made.partition)} groups "
        f"({', '.join(f'{k}={realized.realizations.count(k)}' for k in sorted(set(realized.realizations)))}), "
        f"cuda graph {'on' if realized.cuda_graph else 'off'}, "
        f"{len(realized.fallbacks)} group(s) fell back; {check}",
        f"{'variant':<22} {'median ±IQR/2':>16} {'p99':>10} {'vs eager':>9} {'setup':>9}",
    ]
    for k, v in rows.items():
        t = v["timing"]
        lines.append(
            f"{k:<22} {fmt.timing(t):>16} {fmt.time_s(t.p99_s):>10} "
            f"{'1.00x' if t is eager else fmt.speedup(eager, t):>9} "
            f"{fmt.time_s(v['setup_s']) if v['setup_s'] else '-':>9}"
        )
    lines.append(f"{'predicted (analytical)':<22} {fmt.time_s(made.plan.predicted_s):>16}")
    if any(
        fmt.unstable(v["timing"])
        or (v["timing"] is not eager and fmt.speedup_unstable(eager, v["timing"]))
        for v in rows.values()
    ):
        lines.append(fmt.UNSTABLE_NOTE)
    for g, why in realized.fallbacks.items():  # one short reason per group
        lines.append(f"  group {g} fell back: {short_reason(why, 100)}")
    emit(args, payload, "\n".join(lines))
    return 0 if check.ok else 1
