"""Plan-cache lookup latency (L1 / L2) and the runtime backend's per-call overhead.

    python benchmarks/lookup_latency.py [--out benchmarks/results/lookup_latency_cpu.md]
    python benchmarks/lookup_latency.py --from-json benchmarks/results/lookup_latency_cpu.json

Every sample (nanoseconds, in time order) is saved beside the markdown (`.json`) and the
markdown's percentiles are computed from them; `--from-json` renders it again.

Targets: L1 p99 <= 10 us, L2 p99 <= 500 us on this machine. Each sample times
one call with perf_counter_ns, so p99 includes the occasional GC pause or scheduler
hiccup a real caller would see. The cache is a real SQLite file holding plans of many
models (not an empty table), with a real plan of the zoo's transformer block.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import zoo
from benchmarks import raw_rows
from planner.errors import FusionPlannerError
from planner.fusion.partition import Partition
from planner.hardware import cpu_model_name
from planner.ir.capture import Captured, export_model
from planner.plans.buckets import parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan
from planner.runtime.backend import fusion_planner_backend

ROOT = Path(__file__).resolve().parent.parent


def sample(fn: Callable[[int], Any], n: int, warmup: int = 50) -> list[int]:
    """n timings (nanoseconds) of fn(i), i = 0..n-1, one call per sample."""
    for i in range(warmup):
        fn(i)
    out = []
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        fn(i)
        out.append(clock() - t0)
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


ROUNDS = 5  # the samples of a row, in time order, cut into this many consecutive rounds


def row(name: str, ns: list[int], target_us: float | None = None) -> dict[str, Any]:
    """One raw row: what was timed, its samples (ns, in time order) and its target."""
    return {"what": name, "samples_ns": ns, "target_us": target_us}


def format_row(r: dict[str, Any]) -> str:
    """p50 and p99 over all samples, and the p99 of the quietest round. The target is
    judged on the all-samples p99, the tail a caller sees; the quietest fifth stands
    beside it as an estimate of the code's own tail on a machine other processes share."""
    name, target_us = r["what"], r["target_us"]
    xs = [t * 1e-9 for t in r["samples_ns"]]
    p50, p99 = pct(xs, 0.5) * 1e6, pct(xs, 0.99) * 1e6
    k = max(1, len(xs) // ROUNDS)
    quiet = min(pct(xs[i : i + k], 0.99) for i in range(0, len(xs) - k + 1, k)) * 1e6
    verdict = "" if target_us is None else ("yes" if p99 <= target_us else "**no**")
    tgt = "" if target_us is None else f"<= {target_us:g}"
    return (
        f"| {name} | {len(xs)} | {p50:.2f} | {p99:.2f} | {quiet:.2f} "
        f"| {statistics.fmean(xs) * 1e6:.2f} | {tgt} | {verdict} |"
    )


def fill(cache: PlanCache, plan: Plan, models: int, buckets: list) -> None:
    """Plans for `models` other models (distinct keys) in every bucket: a used cache."""
    for m in range(models):
        other = dataclasses.replace(plan, structure_key=f"other-model-{m:05d}")
        for b in buckets:
            cache.store(other, b)


def lookup_rows(n: int, models: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    module, inputs = zoo.get("transformer-block").build(
        {"B": 8, "S": 512, "D": 768, "H": 12}, device="meta"
    )
    graph = export_model(module, inputs).graph
    spec = parse_dynamic("S=128..4096", {"B": (0, 0), "S": (0, 1)})
    buckets = list(spec.buckets(graph.input_shapes))
    dev = "cpu-benchmark"
    plan = Plan.from_partition(
        Partition.singletons(graph),
        device="cpu",
        dtype="float32",
        strategy="bench",
        cost_model="analytical/1",
        predicted_s=1e-3,
        device_fingerprint=dev,
    )
    tmp = tempfile.mkdtemp(prefix="fp-bench-")
    url = os.path.join(tmp, "plans.sqlite")
    writer = PlanCache(url)
    t0 = time.perf_counter()
    fill(writer, plan, models, buckets)
    for b in buckets:
        writer.store(plan, b)
    writer.set_bucket_spec(graph.structure_key, spec, dev)
    fill_s = time.perf_counter() - t0
    n_entries = len(writer.entries())
    key = graph.structure_key

    rows = []
    l1 = PlanCache(url)
    same = [(8, 300, 768)]
    assert l1.lookup(key, same, dev).source == "bucket"
    rows.append(row("L1 hit, repeated shape", sample(lambda i: l1.lookup(key, same, dev), n), 10))
    l1.lookup(key, [(8, 2049, 768)], dev)  # the bucket's entry is now in the per-key L1
    shapes = [[(8, 2049 + i % 2048, 768)] for i in range(2048)]
    xs = sample(lambda i: l1.lookup(key, shapes[i], dev), min(n, 2048), warmup=0)
    rows.append(row("L1 hit, new shape in a cached bucket", xs, 10))
    l1.clear_l1()
    l1.lookup(key, [(8, 2049, 768)], dev)
    gc.collect()
    gc.disable()  # diagnostic: how much of that tail is the garbage collector
    try:
        xs = sample(lambda i: l1.lookup(key, shapes[i], dev), min(n, 2048), warmup=0)
    finally:
        gc.enable()
    rows.append(row("... same, garbage collector off (diagnostic)", xs, 10))

    l2 = PlanCache(url, l1_ttl_s=0.0, negative_ttl_s=0.0)  # every lookup reads SQLite
    assert l2.lookup(key, same, dev).source == "bucket"
    rows.append(
        row(
            "L2 hit (SQLite: exact miss + spec + bucket)",
            sample(lambda i: l2.lookup(key, same, dev), n // 4),
            500,
        )
    )
    rows.append(
        row(
            "L2 hit, spec given (exact miss + bucket)",
            sample(lambda i: l2.lookup(key, same, dev, spec=spec), n // 4),
            500,
        )
    )
    rows.append(
        row(
            "L2 miss -> default (3 queries)",
            sample(lambda i: l2.lookup("no-such-model", same, dev), n // 4),
            500,
        )
    )
    info = {"entries": n_entries, "fill_s": fill_s, "groups": plan.n_groups}
    return rows, info


def backend_rows(n: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-call time: torch.compile(backend=fusion-planner) vs the realized plan called
    directly, on a model small enough that the overhead shows."""
    # One intra-op thread: at this size a second thread only adds wake-up jitter, and
    # the rows compare dispatch paths, not kernels.
    torch.set_num_threads(1)
    module, (x,) = zoo.get("mlp").build({"B": 8, "D": 64, "HID": 128, "L": 2})
    realized: list[Any] = []

    def realizer(captured: Captured, plan: Plan) -> Any:
        fn = captured.program.module()
        realized.append(fn)
        return fn

    def one_shape(module: Any, inputs: Any, dims: Any) -> Captured:
        raise FusionPlannerError("the benchmark realizes its one shape statically")

    # A tuned plan for exactly this shape (Linear+ReLU fused), so the backend realizes it.
    graph = export_model(module, (x,)).graph
    cache = PlanCache(os.path.join(tempfile.mkdtemp(prefix="fp-bench-"), "plans.sqlite"))
    plan = Plan.from_partition(
        Partition.singletons(graph).merge_nodes(0, 1),
        device="cpu",
        dtype="float32",
        strategy="bench",
        cost_model="analytical/1",
        predicted_s=1e-5,
        device_fingerprint=cache.device_fp,
    )
    cache.store_exact(plan, graph.input_shapes)
    be = fusion_planner_backend(cache, realizer=realizer, exporter=one_shape)
    seen: list[Any] = []  # (the backend's callable, dynamo's arguments to it)

    def recording(gm: Any, example_inputs: Any) -> Any:
        planned = be(gm, example_inputs)

        def call(*args: Any) -> Any:
            seen.append((planned, args))
            return planned(*args)

        return call

    with torch.no_grad():
        torch._dynamo.reset()
        torch.compile(module, backend=recording, dynamic=True)(x)
        planned, args = seen[0]
        torch._dynamo.reset()
        compiled = torch.compile(module, backend=be, dynamic=True)
        torch.testing.assert_close(compiled(x), module(x))
        assert be.stats.exact == 2 and not be.stats.fallbacks, be.stats
        direct = realized[-1]
        torch._dynamo.reset()
        dynamo_only = torch.compile(module, backend="eager", dynamic=True)
        dynamo_only(x)
        rows = [
            row("realized plan called directly", sample(lambda i: direct(x), n)),
            row("fusion-planner per-call path (no dynamo)", sample(lambda i: planned(*args), n)),
            row("torch.compile(backend=fusion-planner)", sample(lambda i: compiled(x), n)),
            row(
                "torch.compile(backend='eager'): dynamo alone", sample(lambda i: dynamo_only(x), n)
            ),
            row("eager module", sample(lambda i: module(x), n)),
        ]
    return rows, {"model": "zoo:mlp B=8 D=64 HID=128 L=2 (fp32, 1 intra-op thread)"}


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Time every row; the raw run `render` turns into the markdown."""
    load_before = os.getloadavg()[0]
    lk_rows, lk = lookup_rows(args.samples, args.models)
    be_rows, be = backend_rows(args.samples // 4)
    return {
        "command": f"python benchmarks/lookup_latency.py --samples {args.samples} "
        f"--models {args.models}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{cpu_model_name()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, torch {torch.__version__}",
        "load": [load_before, os.getloadavg()[0]],
        "models": args.models,
        "lookup": lk,
        "backend": be,
        "rows": [{"section": "lookup", **r} for r in lk_rows]
        + [{"section": "backend", **r} for r in be_rows],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/lookup_latency_cpu.md"))
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--models", type=int, default=250, help="other models filling the cache")
    raw_rows.add_from_json(p)
    args = p.parse_args(argv)
    if args.from_json:
        return raw_rows.rerender(args.from_json, render)
    raw_rows.write(args.out, collect(args), render, compact=True)
    return 0


def render(run: dict[str, Any]) -> str:
    """The markdown of a raw run (`collect`)."""
    lk, be = run["lookup"], run["backend"]
    lk_rows = [format_row(r) for r in run["rows"] if r["section"] == "lookup"]
    be_rows = [format_row(r) for r in run["rows"] if r["section"] == "backend"]
    load_before, load_after = run["load"]
    header = (
        "| what | samples | p50 us | p99 us | p99 us, quietest 1/5 | mean us | target p99 us "
        "| met |\n|---|---|---|---|---|---|---|---|"
    )
    text = f"""# Plan-cache lookup latency and runtime backend overhead (CPU)

Produced by `{run["command"]}` on {run["date"]}:
{run["machine"]}. Raw samples: `{run["rows_file"]}` beside this file.
One call per sample (perf_counter_ns); p99 includes GC and scheduler noise. Each row's
samples, in time order, are also cut into {ROUNDS} rounds: "quietest 1/5" is the p99 of
the round least disturbed by other processes; targets are judged on all samples. Load average
(1 min) when it started: {load_before:.2f}, when it ended: {load_after:.2f}; a load
above the core count means other processes competed for the CPU and stretched the tails.

## Lookups

The cache is a SQLite file holding {lk["entries"]} plans ({run["models"]} other models x 6
buckets, plus the target: the zoo's transformer block, {lk["groups"]}-group plan JSON per
entry), filled through the public API in {lk["fill_s"]:.1f} s. Spec: S=128..4096, pow2.

{header}
{chr(10).join(lk_rows)}

- *L1 hit, repeated shape*: the whole lookup is remembered (one dict probe).
- *new shape in a cached bucket*: the shape was never looked up, its bucket's entry is in
  the per-key L1: the model's (cached, empty) set of exact-shape keys, bucket_of, the
  bucket-key probe, and remembering the result.
- The tail of that row is Python's garbage collector: each remembered new shape keeps a
  few objects alive, and a generation-0 collection (~10-20 us) runs every few hundred of
  them, inside some of these lookups; the diagnostic row shows the same lookups with the
  collector off. Every shape of a bucket shares one result object (the cache keeps one
  per bucket entry), so a new shape keeps only its memo key alive and collections land
  in fewer than 1% of lookups. The runtime backend meets each new shape once (it
  remembers the shape's callable), so its per-call path never sees this.
- *L2*: L1 disabled (time-to-live 0), so every lookup reads SQLite and parses the plan JSON.

## Runtime backend per-call overhead

Model: {be["model"]}, with an exact-shape plan in the cache. The backend here
serves the exported aten program as the "realized plan" (the callable is the same object
in the first two rows), so the differences between rows are dispatch overhead, not
kernels.

{header}
{chr(10).join(be_rows)}

- *per-call path (no dynamo)*: the backend's own work per call (a tuple of the dynamic
  sizes, one dict probe, re-packing the user's arguments) on top of the realized plan.
- *torch.compile(backend=...)*: adds dynamo's guard checks and frame handling, which any
  torch.compile backend pays: compare dynamo alone (backend "eager", running dynamo's
  graph) with the eager module.
"""
    return text


if __name__ == "__main__":
    sys.exit(main())
