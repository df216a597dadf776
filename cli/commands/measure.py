"""`fusion-plan measure`: a strategy's plan on this machine, realized, verified and timed
as the torch.compile backend serves it (profiling.runner), next to eager and
torch.compile, with the cost model's prediction beside the numbers."""

from __future__ import annotations

import argparse

import torch

from cli import fmt
from cli.common import (
    apply_threads,
    check_local_device,
    emit,
    resolve,
)
from planner.errors import FusionPlannerError
from planner.ir.capture import Captured
from planner.measurement import PlanJob
from planner.realize.check import short_reason
from planner.runtime.graph import export_served, trace_served
from profiling.runner import DeviceRunner, RealizedExecutor, ServedExecutor, first_call
from search.cost_models import cost_model_for
from search.planning import make_plan

TIMER = {"warmup": 5, "min_reps": 20, "max_reps": 300, "max_seconds": 10.0}


def _served_capture(module: torch.nn.Module, inputs: tuple, label: str) -> Captured:
    """The one graph `torch.compile` serves the model as, captured as `capture_for_serving`
    captures it; a clear error for a model served as several graphs (graph breaks), whose
    plans `fusion-plan tune` makes graph by graph (one plan here would fit none of them)."""
    whole, graphs = trace_served(module, inputs)
    if whole is None and graphs and (len(graphs) > 1 or isinstance(graphs[0], tuple)):
        raise FusionPlannerError(
            f"{label} runs as {len(graphs)} graph(s) under torch.compile (graph breaks), "
            "and `measure` times one plan of one graph: `fusion-plan tune` tunes, "
            "stores and times each graph (and the whole model through the backend)"
        )
    return export_served(module, inputs, whole, name=label)


def run(args: argparse.Namespace) -> int:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    apply_threads(args, times_on_cpu=dev.type == "cpu")
    args.device = check_local_device(args)
    r = resolve(args)
    module, inputs = r.spec.build(dtype=r.dtype, device=dev)
    # the backend's graph, as tune captures it: a plan made here is one the backend can serve
    captured = _served_capture(module, inputs, r.spec.label)
    cost_model = cost_model_for(args.cost_model, r.device_name)
    made = make_plan(
        captured.graph,
        args.strategy,
        cost_model,
        device=r.device_name,
        dtype=r.dtype_name,
        budget_s=args.budget_seconds,
    )
    executor = RealizedExecutor(cuda_graphs=False) if args.no_cuda_graphs else ServedExecutor()
    runner = DeviceRunner(executor=executor, device=dev, timer=TIMER)
    rows = {"eager": runner.measure_callable(module, inputs, label="eager", dtype=r.dtype_name)}
    if not args.no_compile:
        compiled = torch.compile(module)
        setup_s, _ = first_call(lambda: compiled(*inputs), dev)
        rows["torch.compile"] = runner.measure_callable(
            compiled, inputs, label="torch.compile", dtype=r.dtype_name, compile_s=setup_s
        )
        torch._dynamo.reset()  # the served plan is compiled next, on the same model
    name = f"plan ({args.strategy})"
    job = PlanJob(captured, made.plan, label=name, module=module, inputs=tuple(inputs))
    plan = rows[name] = runner.measure_plan(job)
    eager = rows["eager"]
    timed = {k: m for k, m in rows.items() if m.timing is not None}
    payload = {
        "model": r.spec.label,
        "device": r.device_name,
        "dtype": r.dtype_name,
        "strategy": args.strategy,
        "cost_model": f"{cost_model.name}/{cost_model.version}",
        "n_groups": len(made.partition),
        "executor": plan.executor,
        "realizations": list(plan.realizations),
        "fallbacks": {str(k): v for k, v in plan.fallbacks.items()},
        "cuda_graph": plan.cuda_graph,
        "compile_s": plan.compile_s,
        "verified": plan.ok,
        "verify": plan.check or str(plan.error),
        "error": str(plan.error) if plan.error else "",
        "predicted_s": made.plan.predicted_s,
        "results": {
            k: {
                **m.timing.to_dict(),
                "setup_s": m.compile_s + (made.planning_s if m is plan else 0.0),
                "vs_eager": eager.median_s / m.median_s,
                "unstable": fmt.unstable(m.timing),
                "vs_eager_unstable": m is not eager
                and fmt.speedup_unstable(eager.timing, m.timing),
            }
            for k, m in timed.items()
        },
    }
    reals = sorted(set(plan.realizations))
    lines = [
        f"{r.spec.label} {r.dtype_name} on {r.device_name} ({eager.device_fingerprint}, "
        f"torch {eager.torch_version})",
        f"plan: {args.strategy} under {cost_model.name}, {len(made.partition)} groups "
        f"({', '.join(f'{k}={plan.realizations.count(k)}' for k in reals) or 'none fused'}), "
        f"{plan.executor}, cuda graph {'on' if plan.cuda_graph else 'off'}, "
        f"{len(plan.fallbacks)} group(s) fell back; {plan.check or plan.error}",
        f"{'variant':<22} {'median ±IQR/2':>16} {'p99':>10} {'vs eager':>9} {'setup':>9}",
    ]
    for k, m in rows.items():
        if m.timing is None:
            lines.append(f"{k:<22} failed: {short_reason(str(m.error), 100)}")
            continue
        setup = payload["results"][k]["setup_s"]
        lines.append(
            f"{k:<22} {fmt.timing(m.timing):>16} {fmt.time_s(m.p99_s):>10} "
            f"{'1.00x' if m is eager else fmt.speedup(eager.timing, m.timing):>9} "
            f"{fmt.time_s(setup) if setup else '-':>9}"
        )
    lines.append(f"{'predicted':<22} {fmt.time_s(made.plan.predicted_s):>16}")
    results = payload["results"].values()
    if any(v["unstable"] or v["vs_eager_unstable"] for v in results):
        lines.append(fmt.UNSTABLE_NOTE)
    for g, why in plan.fallbacks.items():  # one short reason per group
        lines.append(f"  group {g} fell back: {short_reason(why, 100)}")
    emit(args, payload, "\n".join(lines))
    return 0 if plan.ok else 1
