"""Host time per call of a realized plan at tiny shapes, and where it goes.

    PYTHONPATH=. python benchmarks/host_overhead.py                    # this CPU
    PYTHONPATH=. python benchmarks/host_overhead.py --device cuda      # a GPU, no CUDA graphs
    PYTHONPATH=. python benchmarks/host_overhead.py --models mlp --out host_overhead.md

At shapes this small a call's time is mostly Python and dispatch on the host, which is
what every path without a CUDA graph pays per call (a CPU, a shape's calls before its
graph is recorded, tensor-parallel ranks). For each zoo model (its default plan,
planner.fusion.fuse_rules, realized once) it times, in one process, interleaved round by
round, with every output checked against eager's first:

- eager: the module;
- realized: the realized plan called directly (`RealizedPlan.__call__`);
- realized (AOT wrappers): the same plan with every compiled group called through the
  callable `standalone_compile` returned (`RealizedPlan.lean_calls = False`);
- served: `torch.compile(module, backend=fusion_planner_backend(cache), dynamic=True)`,
  the plan stored for the shape in a private cache (so the served realization is the
  same plan, realized statically like the direct one);
- compile: `torch.compile(module)` (Inductor, default mode);
- dynamo alone: `torch.compile(module, backend="eager", dynamic=True)` (dynamo's frame
  and guard cost, which any backend pays).

Then the served path layer by layer, each timed alone on the arguments it gets in a
served call: the backend's dispatch (`_PlannedGraph.__call__` on dynamo's arguments),
the realized plan's call, its straight-line program (`run_flat`), the groups alone (each
on its recorded inputs, summed), and for compiled groups the AOT-autograd wrappers'
share (`standalone_compile`'s callable against Inductor's compiled graph called boxed).
`--profile` adds cProfile's top functions over served calls.

Medians per call over every timed call (each call timed alone with perf_counter_ns,
`--rounds` rounds of `--calls` calls, the contenders' order rotated each round) with the
10th-90th percentile range; CPU threads are set by `--threads` (1 by default: a shared
machine is less noisy so). Needs no optuna.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import platform
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import zoo
from planner.hardware import device_fingerprint
from planner.ir.capture import export_model
from planner.plans.cache import PlanCache
from planner.realize.realizer import RealizedPlan, realize
from planner.runtime.backend import FusionPlannerBackend, _PlannedGraph, default_plan

# tiny shapes: host time dominates
SHAPES = {
    "mlp": {"B": 4, "D": 32, "HID": 64, "L": 2},
    "gpt2-block": {"B": 1, "S": 8, "D": 32, "H": 2},
    "transformer-block": {"B": 1, "S": 8, "D": 32, "H": 2},
}


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def time_calls(fns: dict[str, Callable[[], Any]], rounds: int, calls: int, sync: Callable[[], Any]):
    """{name: per-call seconds}: `rounds` rounds of `calls` calls each, order rotated."""
    names = list(fns)
    out: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm-up
        for _ in range(20):
            fns[n]()
    sync()
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            k = r % len(names)
            for n in names[k:] + names[:k]:
                fn, samples = fns[n], out[n]
                for _ in range(calls):
                    t0 = time.perf_counter_ns()
                    fn()
                    sync()
                    samples.append((time.perf_counter_ns() - t0) * 1e-9)
    finally:
        gc.enable()
    return out


def stats(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), percentile(xs, 0.1), percentile(xs, 0.9)


def _inner_graph(fn: Any) -> Any:
    """Inductor's compiled graph behind a group's callable (None where not found)."""
    from torch._inductor.output_code import CompiledFxGraph

    f = getattr(fn, "_compiled_fn", fn)
    for _ in range(16):
        if isinstance(f, CompiledFxGraph):
            return f
        f = getattr(f, "__wrapped__", None)
        if f is None:
            return None
    return None


def group_layers(rp: RealizedPlan, inputs: tuple[Any, ...]) -> dict[str, Callable[[], Any]]:
    """Each group's call on its inputs as recorded in one run of `rp`, and for compiled
    groups the standalone_compile callable and Inductor's compiled graph alone."""
    recorded: dict[int, tuple[Any, ...]] = {}
    impls = list(rp._impls)

    def spy(g: int) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            recorded[g] = args
            return impls[g](*args)

        return run

    for g in range(len(impls)):
        rp._impls[g] = spy(g)
    try:
        rp.run_flat(*inputs)
    finally:
        for g, fn in enumerate(impls):
            rp._impls[g] = fn
    out: dict[str, Callable[[], Any]] = {}
    for g, args in sorted(recorded.items()):
        unit = rp._units[g]
        out[f"group {g} ({unit.realization})"] = lambda f=impls[g], a=args: f(*a)
        art = getattr(unit, "compiled_fn", impls[g] if unit.compiled else None)
        if art is None:
            continue
        names = getattr(unit, "compiled_names", unit.inputs)
        picked = tuple(args[unit.inputs.index(n)] for n in names)
        out[f"group {g} standalone_compile callable"] = lambda f=art, a=picked: f(*a)
        inner = _inner_graph(art)
        if inner is not None:
            out[f"group {g} Inductor graph (boxed)"] = lambda f=inner, a=picked: f(list(a))
    return out


def profile_top(fn: Callable[[], Any], n: int, top: int = 18) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    return top_text(prof, top)


def top_text(prof: cProfile.Profile, top: int) -> str:
    """cProfile's `top` functions by own time, from its header row on."""
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s).sort_stats("tottime")
    st.print_stats(top)
    lines = [ln for ln in s.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return "\n".join(lines[start:])


def one_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    module, inputs = zoo.get(name).build(SHAPES[name], device=device)
    captured = export_model(module, inputs, name=name)
    plan = default_plan(captured.graph, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rp = realize(captured, plan, cuda_graphs=False)
        rp_wrapped = realize(captured, plan, cuda_graphs=False)
    rp_wrapped.lean_calls = False

    tmp = tempfile.TemporaryDirectory(prefix="host-overhead-")
    cache = PlanCache(str(Path(tmp.name) / "plans.sqlite"))
    dev_fp = device_fingerprint(device)
    cache.store_exact(plan, captured.graph.input_shapes, device_fp=dev_fp, replace="always")
    be = FusionPlannerBackend(
        cache, device=device, compile_budget=2, record_misses=False, static_after=None
    )
    served_rp: list[Any] = []
    seen: list[tuple[_PlannedGraph, tuple[Any, ...]]] = []
    base = be.realizer

    def recording(cap: Any, p: Any, **options: Any) -> Any:
        options.setdefault("cuda_graphs", False)
        r = base(cap, p, **options)
        served_rp.append(r)
        return r

    be.realizer = recording

    def backend(gm: Any, example: Any) -> Any:
        fn = be(gm, example)
        if isinstance(fn, _PlannedGraph):  # dynamo's arguments of its first call, kept
            resolve = fn._resolve

            def first(sizes: Any, a: Any) -> Any:
                seen.append((fn, a))
                return resolve(sizes, a)

            fn._resolve = first
        return fn

    torch._dynamo.reset()
    served = torch.compile(module, backend=backend, dynamic=True)
    compiled = torch.compile(module)
    dynamo_only = torch.compile(module, backend="eager", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = module(*inputs)
        contenders: dict[str, Callable[[], Any]] = {
            "eager": lambda: module(*inputs),
            "realized": lambda: rp(*inputs),
            "realized (AOT wrappers)": lambda: rp_wrapped(*inputs),
            "served": lambda: served(*inputs),
            "compile": lambda: compiled(*inputs),
            "dynamo alone": lambda: dynamo_only(*inputs),
        }
        for n, fn in contenders.items():
            got = fn()
            fn()
            torch.testing.assert_close(
                got, want, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}"
            )
        if not served_rp or not seen or be.stats.fallbacks:
            raise SystemExit(f"{name}: the backend did not serve the plan ({be.stats})")
        planned, dyn_args = seen[0]
        srp = served_rp[-1]
        user = tuple(dyn_args[p] for p in planned.lifted.user_positions)
        times = time_calls(contenders, args.rounds, args.calls, sync)
        layers: dict[str, Callable[[], Any]] = {
            "served (torch.compile)": contenders["served"],
            "dynamo's graph called directly (what dynamo alone runs)": lambda: planned.gm.forward(
                *dyn_args
            ),
            "backend dispatch (_PlannedGraph.__call__)": lambda: planned(*dyn_args),
            "realized plan (RealizedPlan.__call__)": lambda: srp(*user),
            "program (run_flat)": lambda: srp.run_flat(*user),
        }
        groups = group_layers(srp, user)
        layer_times = time_calls({**layers, **groups}, args.rounds, args.calls, sync)
        prof = profile_top(contenders["served"], args.profile) if args.profile else ""
    cache.close()
    tmp.cleanup()
    med = {n: stats(v) for n, v in {**times, **layer_times}.items()}
    return {
        "model": name,
        "shape": SHAPES[name],
        "groups": len(srp.realizations),
        "compiled": sum(r.compiled for r in srp.groups),
        # why compiled groups keep their runtime wrappers ("" = they do not)
        "lean": [getattr(r, "lean", "n/a") for r in srp.groups if r.compiled],
        "contenders": {n: med[n] for n in contenders},
        "layers": {n: med[n] for n in layers},
        "group_rows": {n: med[n] for n in groups},
        "profile": prof,
    }


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    us = 1e6
    out = [
        f"Host time per call, {args.device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), {platform.python_version()}; median "
        f"[p10, p90] over {args.rounds} x {args.calls} calls each, microseconds.",
        "",
    ]
    for r in rows:
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        out += [
            f"## zoo:{r['model']} ({shape}): {r['groups']} groups, {r['compiled']} compiled",
            "",
            "compiled groups called past their runtime wrappers in inference: "
            f"{sum(w == '' for w in r['lean'])} of {len(r['lean'])}"
            + "".join(f"; {w}" for w in sorted(set(r["lean"]) - {""})),
            "",
            "| contender | median us | p10 | p90 |",
            "|---|---:|---:|---:|",
        ]
        for n, (m, lo, hi) in r["contenders"].items():
            out.append(f"| {n} | {m * us:.1f} | {lo * us:.1f} | {hi * us:.1f} |")
        out += ["", "| served, layer by layer | median us | p10 | p90 |", "|---|---:|---:|---:|"]
        for n, (m, lo, hi) in {**r["layers"], **r["group_rows"]}.items():
            out.append(f"| {n} | {m * us:.1f} | {lo * us:.1f} | {hi * us:.1f} |")
        g = [v[0] for n, v in r["group_rows"].items() if n.endswith(")") and "(boxed)" not in n]
        if g:
            out.append(f"| sum of the groups' calls | {sum(g) * us:.1f} | | |")
        if r["profile"]:
            out += ["", "cProfile, served calls, by own time:", "", "```", r["profile"], "```"]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(SHAPES), help="comma-separated zoo models")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (0: torch's default)")
    p.add_argument("--profile", type=int, default=0, help="cProfile this many served calls")
    p.add_argument("--out", help="also write the table to this markdown file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in SHAPES]
    if unknown:
        p.error(f"no tiny shape for {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    rows = [one_model(m, args) for m in names]
    text = render(rows, args)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
