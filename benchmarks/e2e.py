"""End-to-end benchmark: our realized plans vs eager, SDPA and torch.compile modes.

    PYTHONPATH=. python benchmarks/e2e.py       # the reference shapes, on an H100 (or this CPU)
    PYTHONPATH=. python benchmarks/e2e.py --models transformer-block --shapes 1,128,768,12

For the zoo's transformer-like models at the reference shapes of benchmarks/README.md
(B,S,D,H), it times: eager; eager+sdpa (the zoo's SDPA variant of the block, or for the
other models the attention pattern rewritten to SDPA with everything else eager); torch
compile default, reduce-overhead, and max-autotune-no-cudagraphs (on `--max-autotune`
shapes only: it compiles for a minute); and our plans (greedy, priority, exact, and the
unfused plan) realized with CUDA graphs. "tuned" is the fastest of our plans as measured
here, the way `tune` picks among candidates; tuning time = search + compile + measuring
all of them. Writes e2e_<device>.jsonl (one line per measurement, appended as it goes)
and e2e_<device>.md (the table, with ratio to the best alternative and the roofline lower
bound) into --out-dir. Needs no optuna.

`--warm-workers N` first compiles everything in N processes (Inductor's on-disk caches),
so that the measuring process mostly finds its kernels compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from planner import zoo
from planner.capture import export_model
from planner.cost import group_io
from planner.hardware import get_spec, local_device_name
from planner.measurement import Measurement, PlanJob
from planner.partition import Partition
from planner.realize import realize
from planner.realize_patterns import find_attention
from planner.runtime_graph import capture_for_serving
from profiling.runner import DeviceRunner, RealizedExecutor, ServedExecutor, first_call
from search.cost_models import cost_model_for
from search.planning import UNFUSED, make_plan

MODELS = ("transformer-block", "gpt2-block", "llama-block", "bert-layer")
REFERENCE_SHAPES = "1,128,768,12;8,512,768,12;32,512,1024,16;4,2048,1024,16;1,4096,4096,32"
MAX_AUTOTUNE = "1,128,768,12;8,512,768,12"
STRATEGIES = ("greedy", "priority", "exact", UNFUSED)
BASELINES = ("eager", "eager+sdpa", "compile", "compile-ro", "compile-max")
TIMER = {"warmup": 10, "min_reps": 20, "max_reps": 200, "max_seconds": 5.0}
EXECUTORS = {"realized": RealizedExecutor, "served": ServedExecutor}


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    return [tuple(int(x) for x in s.split(",")) for s in text.split(";") if s.strip()]  # type: ignore[misc]


def params(model: str, shape: tuple[int, int, int, int]) -> dict[str, int]:
    b, s, d, h = shape
    p = {"B": b, "S": s, "D": d, "H": h}
    if model == "llama-block":
        p["MAXS"] = max(s, 128)
    return p


def build(model: str, shape: tuple[int, int, int, int], dtype: torch.dtype, device: str):
    torch.manual_seed(0)
    return zoo.get(model).build(params(model, shape), dtype=dtype, device=device)


def roofline_lb_s(graph: Any, spec: Any, dtype: str) -> float:
    """max(total FLOPs / peak, minimum bytes / bandwidth): inputs, weights, outputs once."""
    io = group_io(graph, range(len(graph)))
    return max(graph.total_flops / spec.peak_matmul_flops(dtype), io.bytes / spec.bandwidth_Bps)


def sdpa_eager_partition(graph: Any) -> tuple[Partition, dict[int, str]] | None:
    """The attention core as one SDPA group, every other op alone and eager."""
    found = find_attention(graph)
    if not found:
        return None
    core = set(found[0].core)
    p = Partition.from_groups(
        graph, [sorted(core), *[[i] for i in range(len(graph)) if i not in core]]
    )
    g = p.group_of[found[0].qk]
    return p, {i: ("sdpa" if i == g else "eager") for i in range(len(p))}


def baseline_fn(
    mode: str, model: str, module: torch.nn.Module, shape: Any, dtype: torch.dtype, device: str
) -> Callable[..., Any] | None:
    if mode == "eager":
        return module
    if mode == "compile":
        return torch.compile(module)
    if mode == "compile-ro":
        return torch.compile(module, mode="reduce-overhead")
    if mode == "compile-max":
        return torch.compile(module, mode="max-autotune-no-cudagraphs")
    if mode == "eager+sdpa" and model == "transformer-block":
        return build("transformer-block-sdpa", shape, dtype, device)[0]
    return None


def run_one(
    model: str,
    shape: tuple[int, int, int, int],
    modes: list[str],
    strategies: list[str],
    dtype: torch.dtype,
    device: str,
    emit: Callable[[dict[str, Any]], None],
    measure_it: bool = True,
    executor: str = "realized",
) -> None:
    """All modes and plans of one (model, shape); `emit` gets one record per measurement.
    Everything is timed by the one runner (profiling.runner); plans through `executor`."""
    module, inputs = build(model, shape, dtype, device)
    dname = str(dtype).removeprefix("torch.")
    spec = get_spec(local_device_name(torch.device(device)))
    base = {"model": model, "shape": ",".join(map(str, shape)), "dtype": dname}
    dev = torch.device(device)
    runner = DeviceRunner(executor=EXECUTORS[executor](), device=dev, timer=TIMER)
    torch._dynamo.reset()
    for mode in modes:
        t0 = time.perf_counter()
        rec: dict[str, Any] = {**base, "mode": mode}
        try:
            if mode == "eager+sdpa" and model != "transformer-block":
                captured = export_model(module, inputs)
                found = sdpa_eager_partition(captured.graph)
                if found is None:
                    continue
                p, reals = found
                fn: Any = realize(captured, p, realizations=reals, cuda_graphs=False)
            else:
                fn = baseline_fn(mode, model, module, shape, dtype, device)
            if fn is None:
                continue
            first_call(lambda f=fn: f(*inputs), dev)  # compile / warm
            rec["setup_s"] = time.perf_counter() - t0
        except Exception as e:  # a mode that fails is reported, not fatal
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            emit(rec)
            continue
        if measure_it:
            m = runner.measure_callable(fn, inputs, label=mode, dtype=dname)
            rec.update(_timing_fields(m))
        emit(rec)
    # a plan the backend serves is made on the backend's graph (planner.runtime_graph)
    capture = capture_for_serving if executor == "served" else export_model
    captured = capture(module, inputs)
    lb = roofline_lb_s(captured.graph, spec, dname)
    for strategy in strategies:
        t0 = time.perf_counter()
        rec = {**base, "mode": f"plan-{strategy}", "roofline_lb_us": lb * 1e6}
        name, _, scorer = strategy.partition("@")
        try:
            cost = cost_model_for(scorer, spec.name)
            rec["cost_model"] = getattr(cost, "model_id", None) or cost.name
            made = make_plan(
                captured.graph, name, cost, device=spec.name, dtype=dname, budget_s=20.0
            )
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            emit(rec)
            continue
        job = PlanJob(captured, made.plan, label=strategy, module=module, inputs=tuple(inputs))
        rec.update(
            planning_s=made.planning_s,
            n_groups=len(made.partition),
            predicted_us=made.plan.predicted_s * 1e6,
        )
        if not measure_it:  # the warm-up pass: realize (and compile) only
            with contextlib.suppress(Exception):
                runner.executor.prepare(job, dev).close()
            continue
        m = runner.measure_plan(job)
        rec.update(
            executor=m.executor,
            compile_s=m.compile_s,
            realizations={k: m.realizations.count(k) for k in set(m.realizations)},
            fallbacks=len(m.fallbacks),
            gelu_epilogues=sum("cuBLASLt" in n for n in m.notes),
            verified=m.ok,
            cuda_graph=m.cuda_graph,
            setup_s=time.perf_counter() - t0,
            **_timing_fields(m),
        )
        if m.ok:
            rec["tuning_s"] = time.perf_counter() - t0
        emit(rec)
    torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.empty_cache()


def _timing_fields(m: Measurement) -> dict[str, Any]:
    """A record's timing columns from the runner's measurement (or its error)."""
    if m.timing is None:
        return {"error": str(m.error)[:400]}
    return {"median_us": m.median_s * 1e6, "p99_us": m.p99_s * 1e6, "reps": m.timing.reps}


def _warm(job: tuple[str, tuple[int, ...], list[str], list[str], str, str, str]) -> str:
    model, shape, modes, strategies, dtype, device, executor = job
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    try:
        dt = getattr(torch, dtype)
        run_one(model, shape, modes, strategies, dt, device, _drop, False, executor)
    except Exception as e:  # warming is an optimization: the measuring pass reports errors
        return f"warming {model} {shape} failed: {type(e).__name__}: {str(e)[:200]}"
    return f"warmed {model} {shape} in {time.perf_counter() - t0:.0f} s"


def _drop(record: dict[str, Any]) -> None:
    """The warm-up pass measures nothing and reports nothing."""


def table(records: list[dict[str, Any]], device: str) -> str:
    """The markdown results table: per (model, shape), each mode's median and the ratio."""
    by: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["model"], r["shape"], r["dtype"]), {})[r["mode"]] = r
    strategies = list(
        dict.fromkeys(r["mode"][5:] for r in records if r["mode"].startswith("plan-"))
    )
    modes = [*BASELINES, *(f"plan-{s}" for s in strategies)]
    head = [
        "model",
        "B,S,D,H",
        "dtype",
        *modes,
        "tuned",
        "best alt",
        "ratio",
        "roofline LB",
        "tuning s",
    ]
    lines = [
        f"# End-to-end latency on {device} (median us; our plans replay one CUDA graph on GPU)",
        "",
        "tuned = fastest of our plans as measured; ratio = tuned / best alternative "
        "(eager, eager+sdpa, torch.compile modes); goal <= 0.95, never > 1.02.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for (model, shape, dtype), recs in by.items():

        def med(mode: str, recs: dict[str, dict[str, Any]] = recs) -> float | None:
            v = recs.get(mode, {}).get("median_us")
            return float(v) if v is not None else None

        cells = [model, shape, dtype]
        for m in modes:
            v = med(m)
            cells.append(
                f"{v:.0f}" if v is not None else ("err" if "error" in recs.get(m, {}) else "—")
            )
        plans = [(med(f"plan-{s}"), s) for s in strategies if med(f"plan-{s}") is not None]
        alts = [med(m) for m in BASELINES if med(m) is not None]
        tuned = min(plans) if plans else None
        best_alt = min(alts) if alts else None
        lb = next((r.get("roofline_lb_us") for r in recs.values() if r.get("roofline_lb_us")), None)
        tuning = sum(r.get("tuning_s", 0.0) for k, r in recs.items() if k.startswith("plan-"))
        cells.append(f"{tuned[0]:.0f} ({tuned[1]})" if tuned else "—")
        cells.append(f"{best_alt:.0f}" if best_alt else "—")
        cells.append(f"{tuned[0] / best_alt:.2f}" if tuned and best_alt else "—")
        cells.append(f"{lb:.0f}" if lb else "—")
        cells.append(f"{tuning:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--shapes", default=REFERENCE_SHAPES, help="B,S,D,H;B,S,D,H;...")
    p.add_argument(
        "--max-autotune",
        default=MAX_AUTOTUNE,
        help="shapes that also run compile-max ('' for none)",
    )
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="plan strategies, each scored by the default cost model (search.cost_models), "
        "or STRATEGY@analytical, STRATEGY@realized, STRATEGY@learned (this device's "
        "committed learned correction)",
    )
    p.add_argument(
        "--executor",
        choices=sorted(EXECUTORS),
        default="realized",
        help="how plans run while timed: the realized plan called directly (default), or "
        "served through the torch.compile backend",
    )
    p.add_argument("--dtype", default=None, help="bf16 (GPU default) or fp32 (CPU default)")
    p.add_argument("--out-dir", default="benchmarks/results")
    p.add_argument("--warm-workers", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=None, help="stop starting new shapes")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dname = args.dtype or ("bf16" if device == "cuda" else "fp32")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dname]
    dev_name = local_device_name(torch.device(device))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"e2e_{dev_name}.jsonl"
    models = [m for m in args.models.split(",") if m]
    shapes = parse_shapes(args.shapes)
    ma = set(parse_shapes(args.max_autotune)) if args.max_autotune else set()
    strategies = [s for s in args.strategies.split(",") if s]
    jobs = []
    for shape in shapes:
        for model in models:
            modes = [
                m for m in BASELINES if m != "compile-max" or (shape in ma and model == models[0])
            ]
            jobs.append((model, shape, modes, strategies))
    t0 = time.perf_counter()
    if args.warm_workers > 0:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.warm_workers, mp_context=ctx) as pool:
            dn = str(dtype).removeprefix("torch.")
            warm = [(m, s, md, st, dn, device, args.executor) for m, s, md, st in jobs]
            for line in pool.map(_warm, warm):
                print(line, flush=True)
        print(f"warm-up done in {time.perf_counter() - t0:.0f} s", flush=True)
    records: list[dict[str, Any]] = []
    md = out / f"e2e_{dev_name}.md"

    def emit(rec: dict[str, Any]) -> None:
        rec = {**rec, "device": dev_name, "torch": torch.__version__.split("+")[0]}
        records.append(rec)
        with jsonl.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        med = rec.get("median_us")
        print(
            f"{rec['model']:>18} {rec['shape']:>16} {rec['mode']:<16} "
            + (f"{med:10.1f} us" if med is not None else f"   {rec.get('error', '-')[:100]}"),
            flush=True,
        )

    for model, shape, modes, strats in jobs:
        if args.max_seconds is not None and time.perf_counter() - t0 > args.max_seconds:
            print("stopping: --max-seconds reached", flush=True)
            break
        with contextlib.suppress(torch.cuda.OutOfMemoryError):
            run_one(model, shape, modes, strats, dtype, device, emit, executor=args.executor)
        md = out / f"e2e_{dev_name}.md"
        md.write_text(table(records, dev_name))  # after every job: a cut-off run keeps a table
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
