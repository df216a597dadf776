"""End-to-end benchmark: our realized plans vs eager, SDPA and torch.compile modes.

    PYTHONPATH=. python benchmarks/e2e.py       # the reference shapes, on an H100 (or this CPU)
    PYTHONPATH=. python benchmarks/e2e.py --models transformer-block --shapes 1,128,768,12

For the zoo's transformer-like models at the reference shapes of benchmarks/README.md
(B,S,D,H), it times, in every cell: eager; eager+sdpa (the zoo's SDPA variant of the
block, or for the other models the attention pattern rewritten to SDPA with everything
else eager); torch.compile default, reduce-overhead, max-autotune (with CUDA graphs) and
max-autotune-no-cudagraphs; and our plans (greedy, priority, exact, and always the
unfused plan) realized by the same executor (one CUDA graph on GPU). The unfused plan
separates the executor's share of a win (unfused / best alternative) from the fusion's
(tuned / unfused).

"tuned" is the fastest of our plans as measured here, the way `tune` picks among
candidates. It is then re-timed against the best alternative in a fresh interleaved
round (one "retime" record), so the published ratio does not rest on the minimum of
several single measurements. Tuning time = search + realize/compile + measuring every
plan, plus the seconds the `--warm-workers` processes spent compiling those plans (one
"warm" record per cell).

Writes e2e_<device>.jsonl (one line per measurement, appended as it goes) and
e2e_<device>.md (the table) into --out-dir. `--from-jsonl FILE` only re-renders the
table from a committed JSON-lines file (no device, seconds). Needs no optuna.

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

import zoo
from planner.cost import group_io
from planner.fusion.partition import Partition
from planner.hardware import get_spec, local_device_name
from planner.ir.capture import export_model
from planner.measurement import Measurement, PlanJob
from planner.realize.kernels import find_attention
from planner.realize.realizer import realize
from planner.runtime.graph import capture_for_serving
from profiling.runner import DeviceRunner, RealizedExecutor, ServedExecutor, first_call
from profiling.timer import measure_interleaved
from search.cost_models import cost_model_for
from search.planning import UNFUSED, make_plan

MODELS = ("transformer-block", "gpt2-block", "llama-block", "bert-layer")
REFERENCE_SHAPES = "1,128,768,12;8,512,768,12;32,512,1024,16;4,2048,1024,16;1,4096,4096,32"
STRATEGIES = ("greedy", "priority", "exact", UNFUSED)
BASELINES = ("eager", "eager+sdpa", "compile", "compile-ro", "compile-max-cg", "compile-max")
# torch.compile's mode behind each baseline name (eager and eager+sdpa compile nothing).
COMPILE_MODES = {
    "compile": "default",
    "compile-ro": "reduce-overhead",
    "compile-max-cg": "max-autotune",
    "compile-max": "max-autotune-no-cudagraphs",
}
RETIME = {"rounds": 15, "round_s": 0.025, "warmup": 3}
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
    if mode in COMPILE_MODES:
        return torch.compile(module, mode=COMPILE_MODES[mode])
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
    # a plan the backend serves is made on the backend's graph (planner.runtime.graph)
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
            groups=[sorted(g) for g in made.partition.groups],
            predicted_us=made.plan.predicted_s * 1e6,
        )
        if not measure_it:  # the warm-up pass: realize (and compile) only
            t_prep = time.perf_counter()
            with contextlib.suppress(Exception):
                runner.executor.prepare(job, dev).close()
            # the compile alone: the measuring pass's tuning_s counts the search again
            emit({**rec, "setup_s": time.perf_counter() - t_prep})
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


def retime_cell(
    model: str,
    shape: tuple[int, int, int, int],
    recs: dict[str, dict[str, Any]],
    dtype: torch.dtype,
    device: str,
) -> dict[str, Any] | None:
    """The cell's "retime" record: its fastest plan (rebuilt from the record's groups and
    realized again) and its fastest alternative (compiled again; Inductor's caches are
    warm by now), timed against each other in fresh interleaved rounds
    (profiling.timer.measure_interleaved). None when either side has no measurement."""

    def fastest(modes: list[str]) -> str | None:
        timed = [m for m in modes if recs.get(m, {}).get("median_us") is not None]
        return min(timed, key=lambda m: recs[m]["median_us"]) if timed else None

    plan = fastest([m for m in recs if m.startswith("plan-") and "groups" in recs[m]])
    alt = fastest(list(BASELINES))
    if plan is None or alt is None:
        return None
    rec: dict[str, Any] = {"mode": "retime", "plan": plan, "alt": alt}
    try:
        module, inputs = build(model, shape, dtype, device)
        torch._dynamo.reset()
        with torch.no_grad():
            captured = export_model(module, inputs)
            plan_fn = realize(captured, Partition.from_groups(captured.graph, recs[plan]["groups"]))
            if alt == "eager+sdpa" and model != "transformer-block":
                p, reals = sdpa_eager_partition(captured.graph)  # type: ignore[misc]
                alt_fn: Any = realize(captured, p, realizations=reals, cuda_graphs=False)
            else:
                alt_fn = baseline_fn(alt, model, module, shape, dtype, device)
            sides = {"plan": lambda: plan_fn(*inputs), "alt": lambda: alt_fn(*inputs)}
            for side, call in sides.items():  # alone first: a fault is reported by side
                try:
                    for _ in range(RETIME["warmup"]):
                        call()
                    if device == "cuda":
                        torch.cuda.synchronize()
                except Exception as e:
                    raise RuntimeError(
                        f"{side} ({rec[side]}) alone: {type(e).__name__}: {e}"
                    ) from e
            got = measure_interleaved(
                sides,
                device=device,
                rounds=RETIME["rounds"],
                round_s=RETIME["round_s"],
                warmup=RETIME["warmup"],
            )
        rec.update(
            plan_us=got["plan"].median_s * 1e6,
            alt_us=got["alt"].median_s * 1e6,
            plan_iqr_us=got["plan"].iqr_s * 1e6,
            alt_iqr_us=got["alt"].iqr_s * 1e6,
            rounds=RETIME["rounds"],
        )
    except Exception as e:  # reported in the record, not fatal
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    torch._dynamo.reset()
    return rec


def _warm(
    job: tuple[str, tuple[int, ...], list[str], list[str], str, str, str],
) -> tuple[str, dict[str, Any]]:
    """Compile one cell in a worker process; (a log line, the cell's "warm" record with
    the seconds each mode's compile took there)."""
    model, shape, modes, strategies, dtype, device, executor = job
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    setup: dict[str, float] = {}

    def note(rec: dict[str, Any]) -> None:
        if "setup_s" in rec:
            setup[rec["mode"]] = rec["setup_s"]

    rec = {
        "model": model,
        "shape": ",".join(map(str, shape)),
        "dtype": str(getattr(torch, dtype)).removeprefix("torch."),
        "mode": "warm",
        "setup_s_by_mode": setup,
    }
    try:
        dt = getattr(torch, dtype)
        run_one(model, shape, modes, strategies, dt, device, note, False, executor)
    except Exception as e:  # warming is an optimization: the measuring pass reports errors
        rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    rec["wall_s"] = time.perf_counter() - t0
    if "error" in rec:
        return f"warming {model} {shape} failed: {rec['error']}", rec
    return f"warmed {model} {shape} in {rec['wall_s']:.0f} s", rec


Cell = tuple[str, tuple[int, ...], list[str], list[str], str, str, str]


def measure_cell(
    cell: Cell,
    emit: Callable[[dict[str, Any]], None],
    records: list,
    parts: tuple[str, ...] = ("measure", "retime"),
) -> None:
    """One (model, shape): every mode and plan (run_one, part "measure"), then the
    re-timed winner (part "retime", from the cell's records in `records`)."""
    model, shape, modes, strats, dname, device, executor = cell
    dtype = getattr(torch, dname)
    with contextlib.suppress(torch.cuda.OutOfMemoryError):
        if "measure" in parts:
            run_one(model, shape, modes, strats, dtype, device, emit, executor=executor)  # type: ignore[arg-type]
        if "retime" in parts:
            key = ",".join(map(str, shape))
            recs = _cells(records).get((model, key, dname), {})
            again = retime_cell(model, shape, recs, dtype, device)  # type: ignore[arg-type]
            if again is not None:
                emit({"model": model, "shape": key, "dtype": dname, **again})


def _emitter(
    jsonl: Path, dev_name: str, records: list[dict[str, Any]]
) -> Callable[[dict[str, Any]], None]:
    """Records go to `records`, are appended to `jsonl` at once, and shown as a line."""

    def emit(rec: dict[str, Any]) -> None:
        rec = {**rec, "device": dev_name, "torch": torch.__version__.split("+")[0]}
        records.append(rec)
        with jsonl.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if rec["mode"] in ("run", "warm"):
            return
        med = rec.get("median_us", rec.get("plan_us"))
        print(
            f"{rec['model']:>18} {rec['shape']:>16} {rec['mode']:<16} "
            + (f"{med:10.1f} us" if med is not None else f"   {rec.get('error', '-')[:100]}"),
            flush=True,
        )

    return emit


def _cell_process(cell: Cell, jsonl: str, dev_name: str, part: str, known: str) -> None:
    """A spawned process's work: one part of one cell, its records appended to `jsonl`;
    the records it starts from are read from `known` (a JSON-lines file, or none)."""
    warnings.simplefilter("ignore")
    records: list[dict[str, Any]] = read_jsonl(Path(known)) if known else []
    measure_cell(cell, _emitter(Path(jsonl), dev_name, records), records, (part,))


def _isolated(
    cell: Cell,
    jsonl: Path,
    dev_name: str,
    records: list[dict[str, Any]],
    emit: Callable[[dict[str, Any]], None],
    parts: tuple[str, ...] = ("measure", "retime"),
    known: str = "",
) -> None:
    """`measure_cell` in processes of its own, one for the measurements and one for the
    re-timing (which reads the cell's records from `known`, else from `jsonl`): a fault
    that ends a process (a CUDA error leaves its context unusable) costs that part of
    this cell only, and is recorded ("crash" for the measurements, "retime" with an
    error for the re-timing)."""
    for part in parts:
        before = len(jsonl.read_text().splitlines()) if jsonl.exists() else 0
        # only the re-timing starts from records; the measurements start from none
        start = (known or str(jsonl)) if part == "retime" else ""
        proc = multiprocessing.get_context("spawn").Process(
            target=_cell_process, args=(cell, str(jsonl), dev_name, part, start)
        )
        proc.start()
        proc.join()
        lines = jsonl.read_text().splitlines()[before:] if jsonl.exists() else []
        records.extend(json.loads(line) for line in lines if line.strip())
        if proc.exitcode != 0:
            model, shape, *_rest = cell
            emit(
                {
                    "model": model,
                    "shape": ",".join(map(str, shape)),
                    "dtype": cell[4],
                    "mode": "crash" if part == "measure" else "retime",
                    "error": f"the {part} process ended with exit code {proc.exitcode}",
                }
            )


def _dname(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cells(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Records by (model, shape, dtype), then by mode; the last record of a mode wins."""
    by: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in records:
        if "model" in r:
            by.setdefault((r["model"], r["shape"], r["dtype"]), {})[r["mode"]] = r
    return by


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "—"


def table(records: list[dict[str, Any]], device: str) -> str:
    """The markdown results table: per (model, shape), each mode's median and the ratios.

    Modes a run did not measure show as "—", modes that failed as "err"; the unfused
    plan has its own column whether or not the run listed it."""
    runs = [r for r in records if r.get("mode") == "run"]
    warm_known = bool(runs) and all("warm_workers" in r for r in runs)
    strategies = list(
        dict.fromkeys(r["mode"][5:] for r in records if r["mode"].startswith("plan-"))
    )
    strategies = [s for s in strategies if s != UNFUSED]
    plan_modes = [f"plan-{s}" for s in strategies]
    head = [
        "model",
        "B,S,D,H",
        "dtype",
        *BASELINES,
        *plan_modes,
        "unfused, same executor",
        "tuned",
        "best alt",
        "ratio",
        "unfused / best alt",
        "tuned / unfused",
        "re-timed ratio",
        "roofline LB",
        "tuning s",
    ]
    lines = [
        f"# End-to-end latency on {device} (median us; our plans replay one CUDA graph on GPU)",
        "",
        "Alternatives: compile = torch.compile default, compile-ro = reduce-overhead, "
        "compile-max-cg = max-autotune (CUDA graphs), compile-max = "
        "max-autotune-no-cudagraphs. Our plans run through one executor; "
        "unfused = every op its own group, in that same executor.",
        "",
        "tuned = fastest of our plans as measured; ratio = tuned / best alternative "
        "(eager, eager+sdpa, torch.compile modes); goal <= 0.95, never > 1.02. "
        "ratio = (unfused / best alt) x (tuned / unfused): the executor's share times "
        "the fusion's share. re-timed ratio = the tuned plan over the best alternative, "
        "both timed again in fresh interleaved rounds. tuning s = search + realize + "
        "measure over every plan, plus the warm-up workers' compiles of those plans "
        "(* where the run did not record them). — = not measured in this run; "
        "err = failed (the JSON lines say why); crash = the cell's process ended before "
        "measuring it (a CUDA fault; `--isolate` runs each cell in its own process).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for (model, shape, dtype), recs in _cells(records).items():

        def med(mode: str, recs: dict[str, dict[str, Any]] = recs) -> float | None:
            v = recs.get(mode, {}).get("median_us")
            return float(v) if v is not None else None

        def shown(mode: str, recs: dict[str, dict[str, Any]] = recs) -> str:
            v = med(mode)
            if v is not None:
                return f"{v:.0f}"
            if "error" in recs.get(mode, {}):
                return "err"
            return "crash" if mode not in recs and "crash" in recs else "—"

        cells = [model, shape, dtype]
        cells += [shown(m) for m in (*BASELINES, *plan_modes, f"plan-{UNFUSED}")]
        plans = [(v, s) for s in (*strategies, UNFUSED) if (v := med(f"plan-{s}")) is not None]
        alts = [v for m in BASELINES if (v := med(m)) is not None]
        tuned = min(plans) if plans else None
        best_alt = min(alts) if alts else None
        unfused = med(f"plan-{UNFUSED}")
        again = recs.get("retime", {})
        lb = next((r.get("roofline_lb_us") for r in recs.values() if r.get("roofline_lb_us")), None)
        warm = recs.get("warm", {}).get("setup_s_by_mode", {})
        tuning = sum(
            r.get("tuning_s", 0.0) + warm.get(k, 0.0)
            for k, r in recs.items()
            if k.startswith("plan-")
        )
        complete = "warm" in recs or (warm_known and not any(r["warm_workers"] for r in runs))
        cells.append(f"{tuned[0]:.0f} ({tuned[1]})" if tuned else "—")
        cells.append(f"{best_alt:.0f}" if best_alt else "—")
        cells.append(_ratio(tuned[0] if tuned else None, best_alt))
        cells.append(_ratio(unfused, best_alt))
        cells.append(_ratio(tuned[0] if tuned else None, unfused))
        cells.append(
            "err" if "error" in again else _ratio(again.get("plan_us"), again.get("alt_us"))
        )
        cells.append(f"{lb:.0f}" if lb else "—")
        cells.append(f"{tuning:.0f}" + ("" if complete else "*"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def render_jsonl(path: Path) -> str:
    """The table of a committed e2e_<device>.jsonl, as the run that wrote it rendered it."""
    records = read_jsonl(path)
    device = next((r["device"] for r in records if "device" in r), path.stem.removeprefix("e2e_"))
    return table(records, device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--shapes", default=REFERENCE_SHAPES, help="B,S,D,H;B,S,D,H;...")
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="plan strategies (the unfused plan is always added), each scored by the default "
        "cost model (search.cost_models), or STRATEGY@analytical, STRATEGY@realized, "
        "STRATEGY@learned (this device's committed learned correction)",
    )
    p.add_argument(
        "--executor",
        choices=sorted(EXECUTORS),
        default="realized",
        help="how plans run while timed: the realized plan called directly (default), or "
        "served through the torch.compile backend",
    )
    p.add_argument("--device", default=None, help="cuda (default where present) or cpu")
    p.add_argument("--dtype", default=None, help="bf16 (GPU default) or fp32 (CPU default)")
    p.add_argument("--out-dir", default="benchmarks/results")
    p.add_argument("--warm-workers", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=None, help="stop starting new shapes")
    p.add_argument(
        "--retime-from",
        default=None,
        help="only re-time the cells (of --models and --shapes) this JSON-lines file of an "
        "earlier run measured; the re-timings go to --out-dir's e2e_<device>.jsonl",
    )
    p.add_argument(
        "--isolate",
        action="store_true",
        help="measure each (model, shape) in its own process: a CUDA fault loses that cell only",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--from-jsonl", default=None, help="only re-render this JSON-lines file's table (stdout)"
    )
    args = p.parse_args(argv)
    if args.from_jsonl:
        sys.stdout.write(render_jsonl(Path(args.from_jsonl)))
        return 0
    warnings.simplefilter("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dname = args.dtype or ("bf16" if device == "cuda" else "fp32")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dname]
    dev_name = local_device_name(torch.device(device))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"e2e_{dev_name}.jsonl"
    models = [m for m in args.models.split(",") if m]
    shapes = parse_shapes(args.shapes)
    strategies = list(dict.fromkeys([*(s for s in args.strategies.split(",") if s), UNFUSED]))
    jobs = [(model, shape, list(BASELINES), strategies) for shape in shapes for model in models]
    records: list[dict[str, Any]] = []
    md = out / f"e2e_{dev_name}.md"

    emit = _emitter(jsonl, dev_name, records)
    known = read_jsonl(Path(args.retime_from)) if args.retime_from else []
    emit({"mode": "run", "warm_workers": args.warm_workers, "argv": sys.argv[1:]})
    t0 = time.perf_counter()
    if args.warm_workers > 0:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.warm_workers, mp_context=ctx) as pool:
            dn = str(dtype).removeprefix("torch.")
            warm = [(m, s, md, st, dn, device, args.executor) for m, s, md, st in jobs]
            for line, rec in pool.map(_warm, warm):
                print(line, flush=True)
                emit(rec)
        print(f"warm-up done in {time.perf_counter() - t0:.0f} s", flush=True)

    for model, shape, modes, strats in jobs:
        if args.max_seconds is not None and time.perf_counter() - t0 > args.max_seconds:
            print("stopping: --max-seconds reached", flush=True)
            break
        cell = (model, shape, modes, strats, _dname(dtype), device, args.executor)
        parts = ("retime",) if args.retime_from else ("measure", "retime")
        if args.isolate:
            _isolated(cell, jsonl, dev_name, records, emit, parts, args.retime_from or "")
        else:
            # the live list: the re-timing reads what the measurements just emitted
            measure_cell(cell, emit, known or records, parts)
        md.write_text(table(records, dev_name))  # after every job: a cut-off run keeps a table
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
