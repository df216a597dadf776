"""A model run over a stream of varying sequence lengths: the fusion-planner backend vs
torch.compile(dynamic=True) vs eager. Total time, compile cost and recompiles.

    python benchmarks/runtime_stream.py --quick            # CPU, a few minutes
    PYTHONPATH=. python benchmarks/runtime_stream.py       # GPU: bf16, S=128..2048, 200 calls
    ... --cache plans.sqlite   # plans tuned beforehand by `fusion-plan tune` on this machine
                               # (same device, torch version, dtype and fixed shape)

The stream: `--n` calls of one model whose sequence length S is drawn (seeded) from a
log-normal distribution truncated to `--seq LO..HI` (median LO*(HI/LO)^0.35: mostly
short requests, a tail of long ones). Every contender runs the same stream `--passes`
times (4): pass 1 starts cold and pays every compile; the median of the later passes in
which no call compiled is the steady state (the backend records a shape's CUDA graph at
its second call, so a stream whose shapes each come once per pass settles in pass 3 at the
earliest; it specializes a shape statically only once the shape's calls have taken as long
as the build would, planner.runtime.specialize). Contenders:

- eager: the module as it is;
- compile, compile-ro, compile-max-cg, compile-max: `torch.compile(model, dynamic=True)`
  in Inductor's default, reduce-overhead (CUDA graphs), max-autotune (with CUDA graphs)
  and max-autotune-no-cudagraphs modes;
- planner: `torch.compile(model, backend=fusion_planner_backend(cache, ...), dynamic=True)`.
  Plan cache: `--cache URL` (filled beforehand by `fusion-plan tune`), else a fresh empty
  SQLite cache, where every shape misses: the default (rule-based) plan is realized once
  per bucket and the misses go to the tuning queue. The report says which mode ran;
- planner-unfused: the same backend and executor, realizing the unfused plan (every op
  its own group) wherever it would realize a plan: the executor's share of the planner's
  speed-up, apart from the fusion's.

With a tuned cache, after the passes each contender times every tuned bucket's
representative, `--other-sizes` other lengths of each such bucket (each recurring first),
and with `--rotation` each bucket's lengths called in turn against each repeated.

`--from-jsonl FILE` re-renders the report of a committed JSON-lines file (no device).
`--repeats N` runs the contenders in N rounds, each contender in a new process each round
(the order reversed every other round): the host's pace can move between processes of one
machine, so the planner is compared with the best alternative within each round, and the
report gives those ratios per round with their median and range.

Each contender runs in its own Python process (`--same-process`: one process, with
torch._dynamo.reset() between them) with its own empty Inductor/Triton cache directory
(`--shared-inductor-cache`: the user's), so no contender inherits another's compiles:
pass 1 is a first deployment. Counted per contender: dynamo frame compiles (recompiles:
those after the first call), Inductor graph compiles (FX graph cache misses + hits +
bypasses), and for the planner backend its RuntimeStats (realizations, exact / bucket /
default lookups, over-budget buckets, fallbacks, queued misses). Correctness: a few
stream entries (shortest, longest, ...) against eager in the same process, by
planner.realize.check's rule: each output as close to the model run in float64 as eager's
is.

Writes a Markdown report (`--out`, default benchmarks/results/runtime_stream_<device>.md)
and JSON lines beside it (.jsonl); progress goes to stderr. Imports neither optuna nor
scikit-learn (the runtime path; checked at the end of each contender).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"

ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = (
    "eager",
    "compile",
    "compile-ro",
    "compile-max-cg",
    "compile-max",
    "planner",
    "planner-unfused",
)
# torch.compile's mode per compile contender; each also gets dynamic=True.
COMPILE_MODES = {
    "compile": "default",
    "compile-ro": "reduce-overhead",
    "compile-max-cg": "max-autotune",
    "compile-max": "max-autotune-no-cudagraphs",
}
TITLES = {
    "eager": "eager",
    "compile": "torch.compile(dynamic=True)",
    "compile-ro": "torch.compile(reduce-overhead)",
    "compile-max-cg": "torch.compile(max-autotune)",
    "compile-max": "torch.compile(max-autotune-no-cudagraphs)",
    "planner": "fusion-planner backend",
    "planner-unfused": "unfused plan (fusion-planner backend)",
}
ALTERNATIVES = ("eager", *COMPILE_MODES)  # what the planner is compared with


def _say(msg: str) -> None:
    print(f"[runtime_stream] {msg}", file=sys.stderr, flush=True)


# ---- the stream -------------------------------------------------------------------------
def make_stream(n: int, lo: int, hi: int, seed: int) -> list[int]:
    """`n` sequence lengths in [lo, hi]: log2(S) ~ Normal(log2 lo + 0.35 span, span / 4),
    span = log2(hi / lo), redrawn when outside [lo, hi]. Deterministic in `seed`."""
    rng = random.Random(seed)
    a, b = math.log2(lo), math.log2(hi)
    mu, sigma = a + 0.35 * (b - a), max((b - a) / 4, 1e-9)
    out = []
    while len(out) < n:
        s = round(2 ** rng.gauss(mu, sigma))
        if lo <= s <= hi:
            out.append(s)
    return out


def _tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor of a model's output, whatever its structure (a library's output
    object, a KV cache), in order."""
    from planner.ir.pytrees import flat_values

    return [v for v in flat_values(out) if isinstance(v, torch.Tensor)]


TUNED_NOTE = (
    "- *tuned plan ms (stored)*: the latency `fusion-plan tune` measured and stored for the "
    "bucket's plan, at the bucket's largest size (its representative); *planner steady / "
    "tuned*: the planner's steady median over the bucket's calls (sizes up to that "
    "representative) over it.\n"
)


def tuned_latencies(cache_url: str, dim: str) -> list[dict[str, Any]]:
    """The latency `fusion-plan tune` stored for each bucket plan of the cache: the
    bucket's range of the varying size (the one range its key stores, possibly on several
    inputs: a BERT model's input_ids and attention_mask share their length), its pow2
    bucket here (by its largest size, the representative tune measured at) and the
    stored measurement in ms. A key with two different ranges is skipped."""
    from planner.plans.cache import PlanCache

    out = []
    with PlanCache(cache_url) as cache:
        for e in cache.entries():
            if e.measured_s is None or not e.bucket_key.startswith("bucket:"):
                continue
            dims = e.bucket_key.split(":", 1)[1].replace("[", "").replace("]", "")
            ranges = sorted({d for d in dims.replace(";", ",").split(",") if "-" in d})
            if len(ranges) != 1:
                continue
            lo, hi = (int(x) for x in ranges[0].split("-"))
            synced = e.plan.measured_synced_s
            out.append(
                {
                    "bucket_key": e.bucket_key,
                    "range": [lo, hi],
                    "pow2_bucket": pow2_bucket(hi),
                    "measured_ms": e.measured_s * 1e3,
                    "synced_ms": None if synced is None else synced * 1e3,
                }
            )
    return out


def pow2_bucket(s: int) -> str:
    """The runtime's default bucket (planner.plans.buckets.Pow2) of a size, as text."""
    top = 1 << (s - 1).bit_length() if s > 1 else 1
    return f"{top // 2 + 1}-{top}"


def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("..")
    a, b = int(lo), int(hi or lo)
    if not 1 <= a <= b:
        raise SystemExit(f"--seq wants LO..HI with 1 <= LO <= HI, got {text!r}")
    return a, b


def _static_after(text: str) -> int | str | None:
    """--static-after as the backend's `static_after`: "auto", None (never) or a call."""
    if text in ("auto", "never"):
        return None if text == "never" else text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise SystemExit(f"--static-after wants auto, never or a call number >= 1, got {text!r}")


def _process_counts(cuda: bool) -> dict[str, int]:
    """Running totals that a pass may move: Python's garbage collections per generation,
    and on CUDA the caching allocator's device allocations, frees and retries."""
    out = {f"gc{i}": st["collections"] for i, st in enumerate(gc.get_stats())}
    if cuda:
        stats = torch.cuda.memory_stats()
        for k in (
            "num_device_alloc",
            "num_device_free",
            "num_alloc_retries",
            "num_sync_all_streams",
        ):
            if k in stats:
                out[k] = int(stats[k])
    return out


def cpu_snapshot() -> dict[str, Any]:
    """Where this process's CPU time goes (Linux /proc; empty elsewhere): each thread's
    name and CPU ticks so far, the CPU the main thread last ran on, and each CPU's busy
    ticks machine-wide. Two snapshots around a pass say which threads of the process and
    which CPUs of the machine worked during it (`cpu_delta`)."""
    out: dict[str, Any] = {"threads": {}, "cpus": {}, "main_cpu": None}
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            fields = rest.split()
            name = head.partition("(")[2]
            out["threads"][tid] = [name, int(fields[11]) + int(fields[12])]
            if int(tid) == threading.get_native_id():
                out["main_cpu"] = int(fields[36])
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu") and line[3].isdigit():
                    name, *ticks = line.split()
                    t = [int(x) for x in ticks]
                    out["cpus"][name] = sum(t) - t[3] - t[4]  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        return {}
    return out


def cpu_delta(before: dict[str, Any], after: dict[str, Any], top: int = 4) -> dict[str, Any]:
    """Between two `cpu_snapshot`s: the process's busiest threads (name, ticks), how many
    threads worked at all, the CPU the main thread was on at the end, and the machine's
    busiest CPUs (ticks); empty where a snapshot is."""
    if not before or not after:
        return {}
    threads = [
        (name, ticks - before["threads"].get(tid, [name, 0])[1])
        for tid, (name, ticks) in after["threads"].items()
    ]
    busy = sorted((t for t in threads if t[1] > 0), key=lambda t: -t[1])
    cpus = sorted(
        ((c, after["cpus"][c] - before["cpus"].get(c, 0)) for c in after["cpus"]),
        key=lambda t: -t[1],
    )
    return {
        "threads": busy[:top],
        "working_threads": len(busy),
        "all_threads": len(threads),
        "main_cpu": after["main_cpu"],
        "cpus": [c for c in cpus if c[1] > 0][:top],
    }


# ---- one contender ----------------------------------------------------------------------
def _counts(be: Any) -> tuple[int, ...]:
    """What a compile changes: dynamo frames, Inductor graphs, planner realizations and
    graphs, static specializations built or tried."""
    from torch._dynamo.utils import counters

    ind = counters["inductor"]
    return (
        counters["frames"]["total"],
        ind["fxgraph_cache_miss"] + ind["fxgraph_cache_hit"] + ind["fxgraph_cache_bypass"],
        be.stats.realized if be is not None else 0,
        be.stats.graphs if be is not None else 0,
        # time spent building static specializations: moves whenever one is built or tried
        be.stats.static_build_s if be is not None else 0.0,
    )


def _gc_text(meta: dict[str, Any]) -> str:
    """A bullet for a run whose garbage collector was changed after the cold pass."""
    how = {"freeze": "frozen (the cold pass's objects never scanned again)", "off": "off"}
    if meta.get("gc", "on") not in how:
        return ""
    return f"\n- Python's garbage collector after the cold pass: {how[meta['gc']]}, a diagnostic."


def _static_setting(meta: dict[str, Any]) -> str:
    """The run's --static-after as its report says it; nothing for runs before the option."""
    if "static_after" not in meta:
        return ""
    value = meta["static_after"]
    return f" (static_after={'never' if value is None else value})"


def _static_text(st: dict[str, Any]) -> str:
    """What the backend spent on static specializations and what they saved."""
    gains = st.get("static_gains") or []
    text = f"{st.get('static', 0)} built"
    if "static_build_s" in st:  # rows from before builds were timed lack it
        text += f" ({st['static_build_s']:.2f} s)"
    if gains:
        text += ", share of a call saved: " + ", ".join(f"{g:+.0%}" for g in gains)
    if st.get("static_skipped"):
        text += f", {st['static_skipped']} skipped (budget spent)"
    failed = [f for f in st.get("static_failed", []) if "budget spent" not in f]
    if failed:
        text += f", {len(failed)} not made, first: `{failed[0]}`"
    return text


def _realize_unfused(captured: Any, plan: Any) -> Any:
    """The backend's realizer with the plan's partition replaced by the unfused one."""
    from planner.fusion.partition import Partition
    from planner.realize.realizer import realize

    return realize(captured, Partition.singletons(captured.graph))


def run_contender(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """Run `name` over the stream (cfg["passes"] times) in this process; a JSON-able dict."""
    from torch._dynamo.utils import counters

    from planner.plans.cache import PlanCache
    from planner.realize.check import compare_outputs, tolerance_for
    from planner.realize.reference import run_module_in_high_precision
    from planner.runtime.backend import fusion_planner_backend
    from zoo.modelspec import parse_dtype, resolve

    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])
    torch._dynamo.reset()
    counters.clear()
    t_setup = time.perf_counter()
    dev = torch.device(cfg["device"])
    cuda = dev.type == "cuda"
    dtype = parse_dtype(cfg["dtype"])
    lengths: list[int] = cfg["lengths"]
    mspec = resolve(cfg["model"], cfg["shape"])
    axes = mspec.dims[cfg["dim"]]  # (input, axis), or several for a file factory
    pairs = [tuple(axes)] if isinstance(axes[0], int) else [tuple(a) for a in axes]
    reps: list[int] = cfg.get("rep_lengths") or []
    others: list[int] = cfg.get("other_lengths") or []
    rotations: dict[str, list[int]] = cfg.get("rotation_lengths") or {}
    module, base = mspec.with_params(**{cfg["dim"]: max(lengths + reps + others)}).build(
        dtype=dtype, device=dev, seed=cfg["seed"]
    )

    def cut(x: torch.Tensor, i: int, s: int) -> torch.Tensor:
        for inp, axis in pairs:
            if inp == i:
                x = x.narrow(axis, 0, s)
        return x.clone() if any(inp == i for inp, _ in pairs) else x

    # One input per distinct length, cut from one seeded tensor: made before any timing,
    # identical across contenders. Cloned, so none is a view: dynamo guards on a view's
    # base, and a stream whose first input is a view recompiles at the first non-view.
    inputs = {
        s: tuple(cut(x, i, s) for i, x in enumerate(base))
        for s in sorted(set(lengths + reps + others))
    }
    del base

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    be = None
    cache = None
    if name == "eager":
        fn: Callable[..., Any] = module
    elif name in COMPILE_MODES:
        fn = torch.compile(module, mode=COMPILE_MODES[name], dynamic=True)
    elif name in ("planner", "planner-unfused"):
        url = cfg["cache"] or os.path.join(cfg["tmp"], f"plans-{os.getpid()}.sqlite")
        cache = PlanCache(url)
        extra = {"realizer": _realize_unfused} if name == "planner-unfused" else {}
        extra["static_after"] = cfg.get("static_after", "auto")
        be = fusion_planner_backend(cache, compile_budget=cfg["compile_budget"], **extra)
        fn = torch.compile(module, backend=be, dynamic=True)
    else:
        raise SystemExit(f"unknown contender {name!r}")
    sync()
    setup_s = time.perf_counter() - t_setup

    passes = []
    after_first: tuple[int, ...] | None = None
    with torch.no_grad():
        for p in range(cfg["passes"]):
            times, host, compiled = [], [], []
            if p == 1 and cfg.get("gc") == "freeze":  # the cold pass's objects: never scanned
                gc.collect()
                gc.freeze()
            if p == 1 and cfg.get("gc") == "off":
                gc.disable()
            before_pass = _process_counts(cuda)
            cpu_before = cpu_snapshot()
            sync()
            t_pass = time.perf_counter()
            for s in lengths:
                x = inputs[s]
                before = _counts(be)
                t0 = time.perf_counter()
                fn(*x)
                t1 = time.perf_counter()  # the call returned: its host work is done
                sync()
                times.append(time.perf_counter() - t0)
                host.append(t1 - t0)
                now = _counts(be)
                compiled.append(now != before)
                if after_first is None:
                    after_first = now
            total = time.perf_counter() - t_pass
            after_pass = _process_counts(cuda)
            cpu = cpu_delta(cpu_before, cpu_snapshot())
            passes.append(
                {
                    "total_s": total,
                    "times_s": times,
                    "host_s": host,
                    "compiled": compiled,
                    # garbage collections and CUDA allocator events during the pass
                    "counts": {k: after_pass[k] - before_pass.get(k, 0) for k in after_pass},
                    # which threads of this process and which CPUs of the machine worked
                    "cpu": cpu,
                }
            )
            _say(
                f"{name}: pass {p + 1}/{cfg['passes']} over {len(lengths)} calls: {total:.2f} s, "
                f"{sum(compiled)} call(s) compiled; host median "
                f"{statistics.median(host) * 1e3:.3f} ms; cpu {json.dumps(cpu)}"
            )
        if cfg.get("profile"):  # one more pass, profiled and not counted: a diagnostic
            from benchmarks.host_overhead import top_text

            prof = cProfile.Profile()
            prof.enable()
            for s in lengths:
                fn(*inputs[s])
                sync()
            prof.disable()
            _say(f"{name}: a profiled extra pass, top functions by own time\n{top_text(prof, 40)}")
        gc.enable()  # as it was before the passes (--gc: this contender's passes only)
        gc.unfreeze()
        if reps:  # after the stream: each tuned bucket's representative, both ways
            out_reps = rep_timings(fn, inputs, reps, dev, be, cfg.get("recur_s", 0.0))
        if others:  # other sizes of those buckets, recurring as the representatives did
            out_others = rep_timings(fn, inputs, others, dev)
        if rotations:  # a length changing every call against the same length repeated
            out_rot = rotation_timings(fn, inputs, rotations, dev)
        checks = []
        tol = tolerance_for(dtype)
        for s in cfg["check_lengths"]:
            x = inputs[s]
            got, ref = fn(*x), module(*x)
            pairs_out = zip(_tensors(got), _tensors(ref), strict=False)
            err = max(
                (float((g.float() - r.float()).abs().max()) for g, r in pairs_out if r.numel()),
                default=0.0,
            )
            high = run_module_in_high_precision(module, x, dtype)
            mismatch = compare_outputs(ref, got, dtype, high=high.values)
            against = high.describe()
            checks.append(
                {
                    "S": s,
                    "max_abs_err": err,
                    "ok": mismatch is None,
                    "why": str(mismatch or ""),
                    "against": against,
                }
            )
        sync()

    end = _counts(be)
    first = after_first or end
    ind = counters["inductor"]
    out: dict[str, Any] = {
        "contender": name,
        "setup_s": setup_s,
        "passes": passes,
        "checks": checks,
        "tolerance": {"rtol": tol.rtol, "atol": tol.atol, "of": str(dtype)},
        "dynamo_frames": end[0],
        "dynamo_recompiles": end[0] - first[0],
        "dynamo_graphs": counters["stats"]["unique_graphs"],
        "inductor_graphs": end[1],
        "inductor_graphs_after_first_call": end[1] - first[1],
        "fxgraph_cache": {k: v for k, v in ind.items() if k.startswith("fxgraph_cache")},
        "modules": {m: m in sys.modules for m in ("optuna", "sklearn")},
        "threads": torch.get_num_threads(),
    }
    if reps:
        out["rep_timing"] = out_reps
    if others:
        out["other_timing"] = out_others
    if rotations:
        out["rotation"] = out_rot
    if be is not None:
        st = asdict(be.stats)
        st["fallbacks"] = len(be.stats.fallbacks)
        out["runtime_stats"] = st
        out["fallback_reasons"] = [r[:300] for r in be.stats.fallbacks[:5]]
        out["cache_url"] = cache.url if cache is not None else ""
        out["cache_stats"] = dict(cache.stats) if cache is not None else {}
    if cuda:
        out["max_memory_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    torch._dynamo.reset()
    return out


# calls of a representative size before it is timed: enough for the per-shape CUDA graph
# (the planner's, reduce-overhead's) to be recorded and replayed; the planner's static
# specialization, which `tune`'s runner makes before timing, only with --recur-s
REP_WARM_CALLS = 30


def recur_until_decided(call: Callable[[], Any], be: Any, limit_s: float, dev: Any) -> str:
    """Call one shape again and again, as a server that keeps meeting it would, until the
    backend's static_after policy has settled it (a static specialization built and kept,
    built and dropped as slower, or failed) or `limit_s` passed; what happened, in words."""
    st = be.stats
    gains, failed = len(st.static_gains), len(st.static_failed)
    t0 = time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < limit_s:
        for _ in range(50):
            call()
        calls += 50
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if len(st.static_failed) > failed:
            return f"specialization failed ({calls} calls)"
        if len(st.static_gains) > gains:
            gain = st.static_gains[-1]
            kept = (
                "static specialization serves it"
                if gain > 0
                else "kept the bucket's (static slower)"
            )
            return f"{kept}, gain {gain:+.0%} ({calls} calls, {time.perf_counter() - t0:.0f} s)"
    return f"not specialized within {limit_s:.0f} s ({calls} calls)"


def rep_timings(
    fn: Callable[..., Any],
    inputs: dict[int, tuple[Any, ...]],
    reps: list[int],
    dev: Any,
    be: Any = None,
    recur_s: float = 0.0,
) -> dict[str, dict[str, Any]]:
    """Each representative size called alone, timed with `tune`'s two protocols in this
    process: calls back to back in rounds (profiling.timer.measure_interleaved with the
    runner's STEADY_TIMER, the `measured` latency tune stores) and isolated calls waited
    for (profiling.timer.measure_synced, the plan's `measured_synced_s`). Seconds, by
    size. With the planner's backend `be` and `recur_s` > 0, each size first recurs until
    the backend has decided its static specialization (recur_until_decided), as a shape a
    server keeps meeting does; `tune` times the specialization."""
    from profiling.runner import STEADY_TIMER
    from profiling.timer import measure_interleaved, measure_synced

    out: dict[str, dict[str, Any]] = {}
    for s in reps:
        x = inputs[s]

        def call(x: tuple[Any, ...] = x) -> Any:
            return fn(*x)

        for _ in range(REP_WARM_CALLS):
            call()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        static = ""
        if be is not None and recur_s > 0:
            static = recur_until_decided(call, be, recur_s, dev)
        b2b = measure_interleaved({"c": call}, device=dev, **STEADY_TIMER)["c"]
        alone = measure_synced(call, device=dev)
        out[str(s)] = {"b2b_s": b2b.median_s, "synced_s": alone.median_s, "static": static}
        _say(
            f"  at {s}: back to back {b2b.median_s * 1e3:.3f} ms, alone "
            f"{alone.median_s * 1e3:.3f} ms{'; ' + static if static else ''}"
        )
    return out


def other_sizes(lengths: list[int], tuned: list[dict[str, Any]], per_bucket: int = 2) -> list[int]:
    """Sizes of the stream other than each tuned bucket's representative, `per_bucket` per
    bucket: its shortest length in the stream, then the median of the rest (the sizes a
    bucket's plan serves without having been measured there)."""
    order = sorted(set(lengths))
    out: list[int] = []
    for t in tuned:
        lo, hi = t["range"]
        inside = [s for s in order if lo <= s <= hi and s != hi]
        picks: list[int] = []
        while inside and len(picks) < per_bucket:
            pick = inside[0] if not picks else inside[len(inside) // 2]
            picks.append(pick)
            inside.remove(pick)
        out += picks
    return sorted(set(out))


def rotation_timings(
    fn: Callable[..., Any],
    inputs: dict[int, tuple[Any, ...]],
    groups: dict[str, list[int]],
    dev: Any,
    rounds: int = 5,
    repeats: int = 5,
) -> dict[str, dict[str, float]]:
    """Per bucket, its sizes (each met before, so each has whatever a recurring shape gets)
    called two ways, every call alone and waited for, as the stream times its calls: each
    size `repeats` times in a row (the calls after the first: the same length as the call
    before) and the sizes in turn for `rounds` rounds (every call a new length). Medians
    of the whole call and of its host part (until it returned), in seconds, by bucket."""

    def timed(x: tuple[Any, ...]) -> tuple[float, float]:
        t0 = time.perf_counter()
        fn(*x)
        t1 = time.perf_counter()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0, t1 - t0

    out: dict[str, dict[str, float]] = {}
    for bucket, sizes in groups.items():
        if len(sizes) < 2:  # one length cannot change
            continue
        same: list[tuple[float, float]] = []
        changed: list[tuple[float, float]] = []
        for s in sizes:
            timed(inputs[s])  # the first call after a switch: neither kind
            same += [timed(inputs[s]) for _ in range(repeats)]
        for _ in range(rounds):
            changed += [timed(inputs[s]) for s in sizes]
        out[bucket] = {
            "sizes": len(sizes),
            "same_s": statistics.median(t for t, _ in same),
            "changed_s": statistics.median(t for t, _ in changed),
            "same_host_s": statistics.median(h for _, h in same),
            "changed_host_s": statistics.median(h for _, h in changed),
        }
    return out


def _run_in_child(
    cfg: dict[str, Any], name: str, tmp: Path, timeout_s: float, shared_cache: bool
) -> dict[str, Any]:
    """run_contender in a fresh Python process (its own Inductor cache unless shared)."""
    cfg_path, res_path = tmp / f"{name}.cfg.json", tmp / f"{name}.result.json"
    cfg_path.write_text(json.dumps(cfg))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if not shared_cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / f"inductor-{name}")
        env["TRITON_CACHE_DIR"] = str(tmp / f"inductor-{name}" / "triton")
    cmd = [sys.executable, __file__, "--worker", name, str(cfg_path), str(res_path)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and its compile workers
        proc.wait()
        return {"contender": name, "error": f"timed out after {timeout_s:.0f} s"}
    wall = time.perf_counter() - t0
    if rc != 0 or not res_path.exists():
        return {"contender": name, "error": f"worker exited with status {rc}"}
    res = json.loads(res_path.read_text())
    res["process_wall_s"] = wall
    return res


# ---- the report -------------------------------------------------------------------------
def summarize(res: dict[str, Any], lengths: list[int]) -> dict[str, Any]:
    """Derived numbers of one contender's result (no timing of its own)."""
    if "error" in res:
        return {}
    p1, later = res["passes"][0], res["passes"][1:]
    # The steady state: each call's median over the passes after the first in which no call
    # compiled (a recompile, a realization, a static specialization); where every later
    # pass compiled, the last one alone, marked unsettled.
    quiet = [q for q in later if not any(q.get("compiled", ()))]
    settled = bool(quiet)
    later = quiet or later[-1:]
    per_call = [statistics.median(ts) for ts in zip(*(q["times_s"] for q in later))]
    steady_s = statistics.median(q["total_s"] for q in later)
    steady: dict[str, list[float]] = {}
    for s, t in zip(lengths, per_call):
        steady.setdefault(pow2_bucket(s), []).append(t)
    steady_med = {b: statistics.median(ts) for b, ts in steady.items()}
    first_in_bucket: dict[str, float] = {}
    for s, t in zip(lengths, p1["times_s"]):
        first_in_bucket.setdefault(pow2_bucket(s), t)
    comp = [
        (t, steady_med[pow2_bucket(s)])
        for s, t, c in zip(lengths, p1["times_s"], p1["compiled"])
        if c
    ]
    return {
        "pass1_s": p1["total_s"],
        "steady_s": steady_s,
        "steady_passes": len(later) if settled else 0,
        "overhead_s": p1["total_s"] - steady_s,
        "first_call_s": p1["times_s"][0],
        "first_in_bucket_s": sum(first_in_bucket.values()),
        "first_in_bucket": first_in_bucket,
        "compiling_calls": len(comp),
        "compiling_calls_s": sum(t for t, _ in comp),
        "compile_estimate_s": sum(t - m for t, m in comp),
        "steady_median_ms": statistics.median(per_call) * 1e3,
        **_host_median(later),
        "steady_bucket_median_ms": {b: m * 1e3 for b, m in steady_med.items()},
        "max_abs_err": max((c["max_abs_err"] for c in res["checks"]), default=float("nan")),
        "checks_ok": all(c["ok"] for c in res["checks"]),
    }


def _host_median(passes: list[dict[str, Any]]) -> dict[str, float]:
    """The steady passes' median host time per call (until the call returned, before the
    device finished), where the rows recorded it."""
    if not passes or not all("host_s" in q for q in passes):
        return {}
    per_call = [statistics.median(ts) for ts in zip(*(q["host_s"] for q in passes))]
    return {"steady_host_median_ms": statistics.median(per_call) * 1e3}


def _host_text(sums: dict[str, dict[str, Any]]) -> str:
    """One line: each contender's steady median host time per call, where recorded."""
    parts = [
        f"{TITLES[c]} {s['steady_host_median_ms']:.3f} ms"
        for c, s in sums.items()
        if s and "steady_host_median_ms" in s
    ]
    if not parts:
        return ""
    return (
        "\nHost time per call, steady median (from the call until it returned, before the "
        "device finished; a call whose host time is near its whole time is bound by the "
        "host): " + "; ".join(parts) + ".\n"
    )


def _per_pass(results: list[dict[str, Any]]) -> str:
    """A table: per contender that ran, each pass's median call (ms) and total (s)."""
    ran = [r for r in results if "error" not in r and r.get("passes")]
    n = max((len(r["passes"]) for r in ran), default=0)
    lines = [
        "| contender | " + " | ".join(f"pass {i + 1}" for i in range(n)) + " |",
        "|---|" + "---|" * n,
    ]
    for r in ran:
        cells = [
            f"{statistics.median(q['times_s']) * 1e3:.3f} ({q['total_s']:.2f})" for q in r["passes"]
        ]
        lines.append(f"| {TITLES[r['contender']]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _shares(sums: dict[str, dict[str, Any]]) -> str:
    """One line: the planner's steady pass against the best alternative that ran, split
    into the executor's share (unfused plan / best alternative) and the fusion's (planner
    / unfused plan); empty when the run had no planner. Alternatives it did not run, or
    that gave no steady time, are named, so a missing contender is visible."""
    steady = {c: s["steady_s"] for c, s in sums.items() if s}
    if "planner" not in steady:
        return ""
    alts = {c: steady[c] for c in ALTERNATIVES if c in steady}
    others = (*ALTERNATIVES, "planner-unfused")
    failed = [TITLES[c] for c in others if c in sums and c not in steady]
    missing = [TITLES[c] for c in others if c not in sums]
    parts = []
    if alts:
        best = min(alts, key=alts.__getitem__)
        parts.append(
            f"planner / best alternative ({TITLES[best]}): "
            f"{steady['planner'] / alts[best]:.2f}x steady time"
        )
        if "planner-unfused" in steady:
            parts.append(
                f"unfused plan / best alternative (the executor's share): "
                f"{steady['planner-unfused'] / alts[best]:.2f}x"
            )
    if "planner-unfused" in steady:
        parts.append(
            f"planner / unfused plan (the fusion's share): "
            f"{steady['planner'] / steady['planner-unfused']:.2f}x"
        )
    if failed:
        parts.append("no steady time (failed or timed out): " + ", ".join(failed))
    if missing:
        parts.append("not run: " + ", ".join(missing))
    return "\nSteady state, lower is better: " + "; ".join(parts) + ".\n"


def served_vs_tuned(meta: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tuned bucket whose representative was timed after the stream: what tune stored
    (back to back, and one call waited for), what the planner gave at that size in this
    process both ways, and the stream's steady calls in that bucket; the three ratios
    (None where a side is missing: a cache tuned before one-call times were stored)."""
    planner = next(
        (r for r in results if r.get("contender") == "planner" and "rep_timing" in r), None
    )
    if planner is None:
        return []
    steady = summarize(planner, meta["lengths"]).get("steady_bucket_median_ms", {})
    rows = []
    for t in sorted(meta.get("tuned", []), key=lambda t: t["range"][1]):
        got = planner["rep_timing"].get(str(t["range"][1]))
        if got is None:
            continue
        b2b, alone = got["b2b_s"] * 1e3, got["synced_s"] * 1e3
        stream = steady.get(t["pow2_bucket"])
        want, want_alone = t["measured_ms"], t.get("synced_ms")
        rows.append(
            {
                "bucket": t["pow2_bucket"],
                "rep": t["range"][1],
                "tuned_ms": want,
                "tuned_synced_ms": want_alone,
                "b2b_ms": b2b,
                "synced_ms": alone,
                "stream_ms": stream,
                "b2b_ratio": b2b / want,
                "synced_ratio": alone / want_alone if want_alone else None,
                "stream_ratio": stream / want_alone if want_alone and stream else None,
                "static": got.get("static", ""),
            }
        )
    return rows


def _rep_text(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """The table of served against tuned at each tuned bucket's representative, every
    contender timed there both ways; empty when the run timed none."""
    rows = served_vs_tuned(meta, results)
    if not rows:
        return ""
    timed = [r for r in results if "rep_timing" in r]
    head = [f"{meta['dim']} bucket", "representative", "tuned ms (stored)"]
    head.append("tuned one call ms (stored)")
    head += [f"{TITLES[r['contender']]}: back to back ms | one call ms" for r in timed]
    head += [
        "planner back to back / tuned",
        "planner one call / tuned one call",
        "planner stream steady / tuned one call",
    ]
    recurred = any(row["static"] for row in rows)  # --recur-s: each size recurred first
    if recurred:
        head.append("planner: the representative after it recurred")
    lines = [
        "| " + " | ".join(head) + " |",
        "|---|---|---|---|" + "---|---|" * len(timed) + "---|---|---|" + "---|" * recurred,
    ]
    for row in rows:
        cells = [
            row["bucket"],
            str(row["rep"]),
            _fmt(row["tuned_ms"]),
            _fmt(row["tuned_synced_ms"]),
        ]
        for r in timed:
            got = r["rep_timing"].get(str(row["rep"]), {})
            cells.append(
                f"{_fmt(got.get('b2b_s', math.nan) * 1e3)} | {_fmt(got.get('synced_s', math.nan) * 1e3)}"
            )
        cells += [
            _fmt(row["b2b_ratio"], ".2f"),
            _fmt(row["synced_ratio"], ".2f"),
            _fmt(row["stream_ratio"], ".2f"),
        ]
        if recurred:
            cells.append(row["static"] or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return (
        "\nServed against tuned at each tuned bucket's representative size (its largest, where "
        f"`tune` measured), timed after the stream in each contender's process, after "
        f"{REP_WARM_CALLS} calls of that size: *back to back* is `tune`'s stored "
        "`measured` latency's protocol (calls back to back in rounds, CUDA events), *one "
        "call* the plan's `measured_synced_s` protocol (one call alone, waited for, the wall "
        "clock), which is also how the stream's calls are timed. *planner stream steady / "
        "tuned one call* compares the stream's steady calls in the bucket (sizes up to the "
        "representative, the length changing every call) with the stored one-call latency. "
        "`tune` times a plan's static specialization (what a shape gets once it recurs long "
        "enough to pay for one); "
        + (
            f"here each representative first recurred until the backend decided it (at most "
            f"{meta.get('recur_s', 0):.0f} s of calls), as the last column says.\n\n"
            if recurred
            else "here the representatives were not made to recur that long, so the planner "
            "served them with the bucket's realization, but where the RuntimeStats line above "
            "counts static specializations (`--recur-s` makes them recur).\n\n"
        )
        + "\n".join(lines)
        + "\n"
    )


def served_other(meta: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per other size of a tuned bucket timed after the stream (`--other-sizes`): what tune
    stored for its bucket (measured at the representative), what the planner gave at the
    size both ways, their ratios, and the planner's one call over the fastest
    alternative's one call at the same size (None where no alternative timed it)."""
    planner = next(
        (r for r in results if r.get("contender") == "planner" and "other_timing" in r), None
    )
    if planner is None:
        return []
    alts = [r for r in results if r.get("contender") in ALTERNATIVES and "other_timing" in r]
    rows = []
    for key, got in sorted(planner["other_timing"].items(), key=lambda kv: int(kv[0])):
        size = int(key)
        t = next((t for t in meta.get("tuned", []) if t["range"][0] <= size <= t["range"][1]), None)
        if t is None:
            continue
        b2b, alone = got["b2b_s"] * 1e3, got["synced_s"] * 1e3
        theirs = {
            r["contender"]: r["other_timing"][key]["synced_s"] * 1e3
            for r in alts
            if key in r["other_timing"]
        }
        best = min(theirs, key=theirs.__getitem__) if theirs else None
        want, want_alone = t["measured_ms"], t.get("synced_ms")
        rows.append(
            {
                "bucket": t["pow2_bucket"],
                "size": size,
                "rep": t["range"][1],
                "tuned_ms": want,
                "tuned_synced_ms": want_alone,
                "b2b_ms": b2b,
                "synced_ms": alone,
                "b2b_ratio": b2b / want,
                "synced_ratio": alone / want_alone if want_alone else None,
                "best_alt": best,
                "vs_alt": alone / theirs[best] if best else None,
            }
        )
    return rows


def _other_text(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """The table of served against tuned at other sizes of the tuned buckets; empty when
    the run timed none."""
    rows = served_other(meta, results)
    if not rows:
        return ""
    timed = [r for r in results if "other_timing" in r]
    head = [f"{meta['dim']} bucket", meta["dim"], "tuned ms (stored)", "tuned one call ms (stored)"]
    head += [f"{TITLES[r['contender']]}: back to back ms | one call ms" for r in timed]
    head += [
        "planner back to back / tuned",
        "planner one call / tuned one call",
        "planner one call / fastest alternative's",
    ]
    lines = [
        "| " + " | ".join(head) + " |",
        "|---|---|---|---|" + "---|---|" * len(timed) + "---|---|---|",
    ]
    for row in rows:
        cells = [
            row["bucket"],
            str(row["size"]),
            _fmt(row["tuned_ms"]),
            _fmt(row["tuned_synced_ms"]),
        ]
        for r in timed:
            got = r["other_timing"].get(str(row["size"]), {})
            cells.append(
                f"{_fmt(got.get('b2b_s', math.nan) * 1e3)} | {_fmt(got.get('synced_s', math.nan) * 1e3)}"
            )
        alt = f" ({TITLES[row['best_alt']]})" if row["best_alt"] else ""
        cells += [
            _fmt(row["b2b_ratio"], ".2f"),
            _fmt(row["synced_ratio"], ".2f"),
            _fmt(row["vs_alt"], ".2f") + alt,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return (
        "\nServed against tuned at other sizes of each tuned bucket (sizes the plan serves "
        "but `tune` did not measure at: the bucket's shortest length in the stream and a "
        f"middle one), each recurring first ({REP_WARM_CALLS} calls), then timed as the "
        "representatives above; the stored figures are the bucket's, measured at its "
        "representative, which is the bucket's longest size.\n\n" + "\n".join(lines) + "\n"
    )


def _rotation_text(results: list[dict[str, Any]]) -> str:
    """The table of each bucket's lengths called in turn against each repeated, per
    contender; empty when the run timed none."""
    timed = [r for r in results if r.get("rotation")]
    if not timed:
        return ""
    buckets = sorted({b for r in timed for b in r["rotation"]}, key=lambda b: int(b.split("-")[0]))
    head = ["bucket", "lengths"] + [
        f"{TITLES[r['contender']]}: same ms | new ms | new / same | host same ms | host new ms"
        for r in timed
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---|---|---|---|---|" * len(timed)]
    for b in buckets:
        n = next(r["rotation"][b]["sizes"] for r in timed if b in r["rotation"])
        cells = [b, str(n)]
        for r in timed:
            x = r["rotation"].get(b)
            if x is None:
                cells.append("— | — | — | — | —")
                continue
            cells.append(
                f"{_fmt(x['same_s'] * 1e3)} | {_fmt(x['changed_s'] * 1e3)} | "
                f"{x['changed_s'] / x['same_s']:.2f} | {_fmt(x['same_host_s'] * 1e3)} | "
                f"{_fmt(x['changed_host_s'] * 1e3)}"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return (
        "\nA length changing every call against the same length repeated (`--rotation`): "
        "after the stream, each contender calls the stream's lengths of each tuned bucket "
        "in turn (*new*: every call a length other than the last one's) and each length "
        "several times in a row (*same*); every call alone and waited for, medians of the "
        "whole call and of its host part (until the call returned).\n\n" + "\n".join(lines) + "\n"
    )


def report(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lengths = meta["lengths"]
    sums = {r["contender"]: summarize(r, lengths) for r in results}
    eager_steady = sums.get("eager", {}).get("steady_s")
    rows = []
    for r in results:
        name, s = r["contender"], sums[r["contender"]]
        if not s:
            rows.append(f"| {TITLES[name]} | {r['error']} " + "| " * 11 + "|")
            continue
        vs = _fmt(eager_steady / s["steady_s"], ".2f") + "x" if eager_steady else "n/a"
        real = r.get("runtime_stats", {}).get("realized")
        checks = (
            "reference"
            if name == "eager"
            else (f"{_fmt(s['max_abs_err'], '.3g')} ({'ok' if s['checks_ok'] else '**FAIL**'})")
        )
        rows.append(
            f"| {TITLES[name]} | {_fmt(s['pass1_s'])} | {_fmt(s['steady_s'])}"
            f"{'' if s['steady_passes'] else ' (unsettled)'} | {vs} "
            f"| {_fmt(s['overhead_s'])} | {_fmt(s['first_call_s'])} "
            f"| {_fmt(s['first_in_bucket_s'])} | {s['compiling_calls']} "
            f"({_fmt(s['compiling_calls_s'])} s) | {_fmt(s['steady_median_ms'], '.3f')} "
            f"| {r['dynamo_frames']} ({r['dynamo_recompiles']}) | {r['inductor_graphs']} "
            f"| {'' if real is None else real} | {checks} |"
        )
    buckets = sorted({pow2_bucket(s) for s in lengths}, key=lambda b: int(b.split("-")[0]))
    ok = [r["contender"] for r in results if sums[r["contender"]]]
    tuned = {t["pow2_bucket"]: t["measured_ms"] for t in meta.get("tuned", [])}
    bhead = "| " + " | ".join(
        [f"{meta['dim']} bucket", "calls", "distinct S"]
        + [f"{TITLES[c]}: first call s | {TITLES[c]}: steady median ms" for c in ok]
        + (["tuned plan ms (stored) | planner steady / tuned"] if tuned else [])
    )
    brows = []
    for b in buckets:
        in_b = [s for s in lengths if pow2_bucket(s) == b]
        cells = [f"| {b} | {len(in_b)} | {len(set(in_b))}"]
        for c in ok:
            s = sums[c]
            cells.append(
                f"{_fmt(s['first_in_bucket'].get(b), '.3f')} "
                f"| {_fmt(s['steady_bucket_median_ms'].get(b), '.3f')}"
            )
        if tuned:
            got = sums.get("planner", {}).get("steady_bucket_median_ms", {}).get(b)
            want = tuned.get(b)
            cells.append(
                f"{_fmt(want, '.3f')} | "
                + (f"{got / want:.2f}" if got is not None and want else "—")
            )
        brows.append(" | ".join(cells) + " |")
    planner = next((r for r in results if r["contender"] == "planner" and "error" not in r), None)
    shares = _shares(sums)
    pl_text = ""
    if planner is not None:
        st = planner["runtime_stats"]
        reasons = "".join(f"\n  - `{x}`" for x in planner["fallback_reasons"])
        pl_text = (
            f"\nfusion-planner RuntimeStats: {st['graphs']} dynamo graph(s), "
            f"{st['realized']} realization(s) (compile budget {meta['compile_budget']}), "
            f"new shapes served by an exact plan {st['exact']}, by a bucket plan "
            f"{st['bucket']}, by the default plan (miss) {st['default']}; over budget "
            f"{st['over_budget']}, fallbacks {st['fallbacks']}, misses queued {st['queued']}; "
            + (
                f"buckets served by a neighbour's realization (same plan) {st['joined']}; "
                if "joined" in st
                else ""
            )
            + f"static specializations {_static_text(st)}"
            + f"{_static_setting(meta)}."
            f"{' Fallback reasons:' + reasons if reasons else ''}\n"
        )
    loaded = sorted({m for r in results if "modules" in r for m, v in r["modules"].items() if v})
    by_eager = {
        m
        for r in results
        if r.get("contender") == "eager"
        for m, v in r.get("modules", {}).items()
        if v
    }
    loaded_text = (
        ", ".join(
            f"{m} (by eager too: the model's own imports)" if m in by_eager else m for m in loaded
        )
        if loaded
        else "neither"
    )
    cache_mode = (
        f"`--cache {meta['cache']}`: plans tuned beforehand (fusion-plan tune)"
        if meta["cache"]
        else "a fresh, empty plan cache: every new shape misses and runs the default "
        "(rule-based, planner.fusion.fuse_rules) plan, realized once per bucket; no tuned plans"
    )
    where = (
        "its own Python process"
        if not meta["same_process"]
        else "this one process (torch._dynamo.reset() between them)"
    )
    ind_cache = (
        "the user's Inductor/Triton caches (may be warm)"
        if meta["shared_inductor_cache"]
        else "an empty Inductor/Triton cache directory of its own (cold compiles)"
    )
    threads = meta["threads"] or "torch's default number of"
    # the host's CPU: a host-bound stream's figures depend on it (older runs did not record it)
    cpu = f" ({meta['cpu']})" if meta.get("cpu") and meta["cpu"] != meta["device_name"] else ""
    busy = (
        " (above the core count: other processes competed for the CPU)"
        if max(meta["load_start"], meta["load_end"]) > (meta["cores"] or 1)
        else ""
    )
    return f"""# Runtime over a stream of sequence lengths ({meta["device_label"]})

Produced by `{meta["command"]}` on {meta["date"]}.

- Machine: {meta["device_name"]}, {meta["cores"]} CPU cores{cpu}; torch {meta["torch"]}, Python {meta["python"]}; {threads} intra-op thread(s). Load average (1 min): {meta["load_start"]:.2f} at the start, {meta["load_end"]:.2f} at the end{busy}.
- Model: `{meta["model"]}` with {meta["shape"]}, {meta["dtype"]}, on {meta["device"]}, under torch.no_grad().
- Stream: {len(lengths)} calls, {meta["dim"]} in {meta["seq"][0]}..{meta["seq"][1]} (log-normal, seed {meta["seed"]}): {len(set(lengths))} distinct lengths in {len(buckets)} pow2 buckets. Each contender runs it {meta["passes"]} times: pass 1 cold, the later passes in which no call compiled are the steady state (their median; *unsettled*: every later pass compiled something, and the last one is shown).
- Plan cache (planner): {cache_mode}.
- Each contender ran in {where}, with {ind_cache}.
- optuna / scikit-learn loaded by a contender: {loaded_text}.{_gc_text(meta)}

| contender | pass 1 s | steady pass s | steady speedup vs eager | pass 1 - steady s | first call s | first call per bucket, sum s | calls that compiled (their time) | steady median ms/call | dynamo compiles (recompiles) | Inductor graphs compiled | planner realizations | max abs err vs eager |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}
{shares}{pl_text}
Each pass, median ms per call (its total s): CUDA-graph recordings and static specializations happen in the later passes, so the last pass is the one closest to serving a recurring stream.

{_per_pass(results)}
{_host_text(sums)}
Per bucket (first call of the bucket in pass 1; median call of the steady state):

{bhead} |
|---|---|---|{"---|---|" * (len(ok) + bool(tuned))}
{chr(10).join(brows)}
{_rep_text(meta, results)}{_other_text(meta, results)}{_rotation_text(results)}
- Buckets in these tables: pow2 over {meta["dim"]}, the runtime's default (a tuned cache's own bucket spec may clip the outer edges to the tuned range).
{TUNED_NOTE if tuned else ""}- *pass 1 - steady*: what the cold pass cost over a steady one: compiles, plus, for the planner, one cache lookup (and queued miss) per new shape.
- *calls that compiled*: calls during which dynamo compiled a frame, Inductor compiled a graph or the planner realized a plan (from torch._dynamo.utils.counters and RuntimeStats, read around each call).
- *dynamo compiles (recompiles)*: frames dynamo compiled; in brackets, those after the first call. *Inductor graphs compiled*: FX graph cache misses + hits + bypasses (the planner compiles each fused group as its own graph).
- *max abs err*: over {len(meta["check_lengths"])} stream entries ({meta["dim"]} = {", ".join(map(str, meta["check_lengths"]))}) against eager in the same process; {_check_rule_text(meta, results)}.
- Every call is {"synchronized (CUDA) and " if meta["device"] != "cpu" else ""}timed with perf_counter; pass totals include the per-call bookkeeping.
"""


def _check_rule_text(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """What *ok* meant in a run: the reference rule where its checks name what they were
    compared against (runs before that used the fixed per-dtype table)."""
    against = sorted(
        {c["against"] for r in results for c in r.get("checks", []) if c.get("against")}
    )
    if against:
        return (
            "ok = every output as close to the model run in higher precision as eager's "
            f"(planner.realize.check's rule; compared against: {', '.join(against)})"
        )
    return f"ok = within planner.realize.check's fixed tolerance for {meta['dtype']}"


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_of(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run's JSON lines as (its meta line, each contender's result as run_contender
    returned it: without the line's kind and derived summary)."""
    meta = next(r for r in rows if r.get("kind") == "meta")
    results = [
        {k: v for k, v in r.items() if k not in ("kind", "summary")}
        for r in rows
        if r.get("kind") == "contender"
    ]
    return meta, results


def render_jsonl(path: Path) -> str:
    """The report of a committed JSON-lines file (a meta line, then one line per
    contender), as the run that wrote it rendered it."""
    rows = _jsonl_rows(path)
    if rows and rows[0].get("kind") == "rounds":  # --repeats: the comparison of its rounds
        return rounds_text([path.with_name(name) for name in rows[0]["rounds"]])
    return report(*_run_of(rows))


def summary_jsonl(path: Path) -> str:
    """A few Markdown bullets of a committed run (for docs that quote it): what ran, each
    contender's steady speed-up over eager and its cold pass' extra seconds, and the
    planner's shares against the best alternative."""
    meta, results = _run_of(_jsonl_rows(path))
    lengths = meta["lengths"]
    sums = {r["contender"]: summarize(r, lengths) for r in results}
    eager = sums.get("eager", {}).get("steady_s")
    ran = [c for c in CONTENDERS if sums.get(c)]
    speed = ", ".join(
        f"{TITLES[c]} {_fmt(eager / sums[c]['steady_s'], '.2f')}x" for c in ran if eager
    )
    cold = ", ".join(f"{TITLES[c]} {sums[c]['overhead_s']:.1f} s" for c in ran)
    cache = "a tuned plan cache" if meta["cache"] else "an empty plan cache (every shape a miss)"
    shares = _shares(sums).strip()
    host = _host_text(sums).strip()
    per_bucket = _per_bucket_text(sums)
    vs_tuned = _vs_tuned_text(served_vs_tuned(meta, results))
    other = _other_line(served_other(meta, results))
    rotation = _rotation_line(results)
    return (
        f"- `{meta['command']}` ({meta['date']}, {meta['device_name']}, torch "
        f"{meta['torch']}): `{meta['model']}` {meta['shape']} {meta['dtype']}, "
        f"{len(lengths)} calls, {len(set(lengths))} distinct {meta['dim']} in "
        f"{meta['seq'][0]}..{meta['seq'][1]}, {cache}.\n"
        f"- Steady pass, speed-up over eager (higher is faster): {speed or 'n/a'}.\n"
        f"- Cold pass minus a steady one (compiles, first calls): {cold}.\n"
        + (f"- {shares}\n" if shares else "")
        + (f"- {host}\n" if host else "")
        + (f"- {per_bucket}\n" if per_bucket else "")
        + (f"- {vs_tuned}\n" if vs_tuned else "")
        + (f"- {other}\n" if other else "")
        + (f"- {rotation}\n" if rotation else "")
    )


def _per_bucket_text(sums: dict[str, dict[str, Any]]) -> str:
    """One line: the planner's steady median call per bucket over the best alternative's
    (the alternative with the shortest steady pass), their geometric mean and the worst
    bucket; empty without a planner or an alternative."""
    vs = planner_vs_best(sums)
    if vs is None or not vs["ratios"]:
        return ""
    best, ratios, geo = vs["best"], vs["ratios"], vs["bucket_geo"]
    worst = max(ratios, key=ratios.__getitem__)
    each = ", ".join(
        f"{b} {r:.2f}" for b, r in sorted(ratios.items(), key=lambda kv: int(kv[0].split("-")[0]))
    )
    return (
        f"Per bucket, planner / {TITLES[best]} steady median call: {each}; geometric mean "
        f"{geo:.2f}, worst {ratios[worst]:.2f} ({worst})."
    )


def _vs_tuned_text(rows: list[dict[str, Any]]) -> str:
    """One line: the planner's served / tuned ratios, each as its range over the tuned
    buckets (smallest..largest, the worst last)."""
    if not rows:
        return ""
    parts = []
    for key, what in (
        ("b2b_ratio", "back to back (tune's stored latency)"),
        ("synced_ratio", "one call waited for"),
        ("stream_ratio", "the stream's steady calls / tuned one call"),
    ):
        xs = [r[key] for r in rows if r[key] is not None]
        if xs:
            parts.append(f"{what} {min(xs):.2f}..{max(xs):.2f}")
        else:
            parts.append(f"{what} n/a (no one-call latency stored)")
    return (
        f"Served / tuned at the {len(rows)} tuned buckets' representative sizes (worst "
        "last): " + "; ".join(parts) + "."
    )


def _other_line(rows: list[dict[str, Any]]) -> str:
    """One line: the planner's served / tuned ratios at other sizes of the tuned buckets,
    and its one call against the fastest alternative's there (ranges)."""
    if not rows:
        return ""
    parts = []
    for key, what in (
        ("b2b_ratio", "back to back / tuned"),
        ("synced_ratio", "one call / tuned one call"),
        ("vs_alt", "one call / the fastest alternative's one call at the size"),
    ):
        xs = [r[key] for r in rows if r[key] is not None]
        parts.append(f"{what} {min(xs):.2f}..{max(xs):.2f}" if xs else f"{what} n/a")
    return (
        f"At {len(rows)} other sizes of the tuned buckets, each recurring first: "
        + "; ".join(parts)
        + "."
    )


def _rotation_line(results: list[dict[str, Any]]) -> str:
    """One line: per contender, a new length every call over the same length repeated
    (the range over the tuned buckets)."""
    parts = []
    for r in results:
        rot = r.get("rotation") or {}
        xs = [x["changed_s"] / x["same_s"] for x in rot.values()]
        if xs:
            parts.append(f"{TITLES[r['contender']]} {min(xs):.2f}..{max(xs):.2f}")
    if not parts:
        return ""
    return (
        "A new length every call over the same length repeated (one call each, median per "
        "tuned bucket, range over the buckets): " + "; ".join(parts) + "."
    )


def host_pace_text(paths: list[Path]) -> str:
    """A Markdown table over committed runs (JSON-lines files): per contender process, its
    host time per call in each steady pass (median, ms), the CPU its main thread was on
    and the threads of the process that worked during the pass, where the run recorded
    them. Rows of one contender in several processes show how much the host's pace moves
    between processes of one code and one machine."""
    lines = [
        "| run | contender | host ms per call, each pass after the first | main thread's CPU | "
        "threads that worked |",
        "|---|---|---|---|---|",
    ]
    for path in paths:
        for r in _run_of(_jsonl_rows(path))[1]:
            if "passes" not in r:
                continue
            later = r["passes"][1:]
            host = " / ".join(
                f"{statistics.median(q['host_s']) * 1e3:.3f}" for q in later if q.get("host_s")
            )
            cpus = [q.get("cpu", {}) for q in later]
            main = ", ".join(str(c["main_cpu"]) for c in cpus if c.get("main_cpu") is not None)
            working = ", ".join(
                f"{c['working_threads']} of {c['all_threads']}"
                for c in cpus
                if "working_threads" in c
            )
            name = path.relative_to(RESULTS_DIR) if path.is_relative_to(RESULTS_DIR) else path
            lines.append(
                f"| `{name}` | {TITLES[r['contender']]} | {host or 'n/a'} | {main or 'n/a'} "
                f"| {working or 'n/a'} |"
            )
    return "\n".join(lines) + "\n"


# ---- main -------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from planner.hardware import cpu_model_name

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # a child process: one contender
        name, cfg_path, res_path = argv[1:4]
        res = run_contender(json.loads(Path(cfg_path).read_text()), name)
        Path(res_path).write_text(json.dumps(res))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small CPU-sized run (minutes)")
    p.add_argument("--model", default="zoo:gpt2-block")
    p.add_argument("--shape", default=None, help="fixed shape parameters, e.g. B=8,D=768,H=12")
    p.add_argument("--dim", default="S", help="the model's shape parameter that varies")
    p.add_argument("--seq", default=None, help="LO..HI range of the varying length")
    p.add_argument("--n", type=int, default=None, help="calls in the stream")
    p.add_argument("--passes", type=int, default=4, help="passes over the stream (>= 2)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (--quick: 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16 (default: bf16 on CUDA)")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--cache", default=None, help="plan cache URL filled by fusion-plan tune")
    p.add_argument("--compile-budget", type=int, default=8)
    p.add_argument(
        "--gc",
        choices=("on", "freeze", "off"),
        default="on",
        help="Python's garbage collector after the cold pass: on (as a user runs), frozen "
        "(the cold pass's objects never scanned again) or off: a diagnostic",
    )
    p.add_argument(
        "--static-after",
        default="auto",
        help="planner: when a recurring shape gets a static specialization: "
        "auto (the backend's default), never, or the call number",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the passes, one more pass under cProfile, not counted (its top functions "
        "go to stderr): a diagnostic",
    )
    p.add_argument(
        "--recur-s",
        type=float,
        default=0.0,
        help="planner: before each tuned representative is timed after the stream, call it "
        "until the backend has decided its static specialization, at most this many seconds "
        "(0: only a few calls)",
    )
    p.add_argument(
        "--other-sizes",
        type=int,
        default=2,
        help="with a tuned cache: after the representatives, this many other stream lengths "
        "of each tuned bucket are timed the same way, each recurring first (0: none)",
    )
    p.add_argument(
        "--rotation",
        action="store_true",
        help="with a tuned cache: time each tuned bucket's stream lengths called in turn (a "
        "new length every call) against each length repeated, in every contender's process",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the contenders this many rounds, each contender in a new process every "
        "round, the order reversed every other round: each round writes its own report "
        "(<out>_r<k>.md, .jsonl) and <out>.md compares the rounds (the host's pace can move "
        "between processes of one machine: a ratio holds within a round)",
    )
    p.add_argument("--check", type=int, default=4, help="stream entries checked against eager")
    p.add_argument("--timeout", type=float, default=None, help="seconds per contender")
    p.add_argument("--same-process", action="store_true")
    p.add_argument("--shared-inductor-cache", action="store_true")
    p.add_argument("--out", default=None, help="Markdown report; .jsonl beside it")
    p.add_argument("--device", default=None, help="cuda (default where present) or cpu")
    p.add_argument(
        "--from-jsonl", default=None, help="only re-render this JSON-lines file's report (stdout)"
    )
    args = p.parse_args(argv)
    if args.from_jsonl:
        sys.stdout.write(render_jsonl(Path(args.from_jsonl)))
        return 0

    from planner.hardware import local_device_name

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    if cuda and not args.quick:
        shape, seq, n, timeout = "B=8,D=768,H=12", "128..2048", 200, 240.0
    elif args.quick:
        shape, seq, n, timeout = "B=2,D=64,H=4", "16..256", 48, 150.0
    else:
        shape, seq, n, timeout = "B=4,D=256,H=4", "32..512", 100, 600.0
    shape = args.shape if args.shape is not None else shape
    lo, hi = parse_range(args.seq or seq)
    n = args.n or n
    static_after = _static_after(args.static_after)
    if args.passes < 2:
        raise SystemExit("--passes must be at least 2 (pass 1 cold, then the steady state)")
    dtype = args.dtype or ("bf16" if cuda else "fp32")
    names = [c.strip() for c in args.contenders.split(",") if c.strip()]
    if not names:
        raise SystemExit(f"--contenders names none; known: {', '.join(CONTENDERS)}")
    if bad := [c for c in names if c not in CONTENDERS]:
        raise SystemExit(f"unknown contender(s) {bad}; known: {', '.join(CONTENDERS)}")
    lengths = make_stream(n, lo, hi, args.seed)
    order = sorted(set(lengths))
    picks = [lengths[0], order[0], order[-1], order[len(order) // 2]]
    check = list(dict.fromkeys(picks))[: max(0, args.check)]
    dev_name = local_device_name(device)
    out_md = Path(args.out or ROOT / f"benchmarks/results/runtime_stream_{dev_name}.md")
    cfg = {
        "device": device,
        "dtype": dtype,
        "model": args.model,
        "shape": shape,
        "dim": args.dim,
        "lengths": lengths,
        "check_lengths": check,
        "passes": args.passes,
        "seed": args.seed,
        "cache": args.cache,
        "compile_budget": args.compile_budget,
        "static_after": static_after,
        "gc": args.gc,
        "profile": args.profile,
        "recur_s": args.recur_s,
        "threads": args.threads or (1 if args.quick else None),
    }
    tuned = tuned_latencies(args.cache, args.dim) if args.cache else []
    # after the stream, each tuned bucket's representative inside the stream's range is
    # timed as tune timed it (rep_timings)
    cfg["rep_lengths"] = sorted({t["range"][1] for t in tuned if lo <= t["range"][1] <= hi})
    # ... then other sizes of those buckets, and each bucket's stream lengths in turn
    in_range = [t for t in tuned if lo <= t["range"][1] <= hi]
    cfg["other_lengths"] = other_sizes(lengths, in_range, args.other_sizes)
    if args.rotation:
        cfg["rotation_lengths"] = {
            t["pow2_bucket"]: sorted({s for s in lengths if t["range"][0] <= s <= t["range"][1]})
            for t in in_range
        }
    meta = {
        **cfg,
        "tuned": tuned,
        "kind": "meta",
        "command": "python benchmarks/runtime_stream.py " + shlex.join(argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device_name": torch.cuda.get_device_name() if cuda else cpu_model_name(),
        "device_label": dev_name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "cpu": cpu_model_name(),
        "seq": [lo, hi],
        "same_process": args.same_process,
        "shared_inductor_cache": args.shared_inductor_cache,
        "load_start": os.getloadavg()[0],
    }
    _say(
        f"{args.model} {shape} {dtype} on {dev_name}: {n} calls, {args.dim} in {lo}..{hi} "
        f"({len(order)} distinct); contenders {', '.join(names)}; "
        f"cache {args.cache or 'fresh and empty'}"
    )
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    rounds: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="fp-runtime-stream-") as tmp:
        run_cfg = {**cfg, "tmp": tmp}  # the empty plan cache lives here when no --cache
        for k in range(1, args.repeats + 1):
            results: list[dict[str, Any]] = []
            rounds.append(results)
            md_k = out_md if args.repeats == 1 else round_path(out_md, k)
            meta_k = meta if args.repeats == 1 else {**meta, "round": k}
            for name in names if k % 2 else names[::-1]:
                _say(f"{name}: starting" + (f" (round {k}/{args.repeats})" if k > 1 else ""))
                t0 = time.perf_counter()
                if args.same_process:
                    try:
                        res = run_contender(run_cfg, name)
                    except Exception as e:
                        res = {"contender": name, "error": f"{type(e).__name__}: {e}"[:500]}
                else:
                    res = _run_in_child(
                        run_cfg,
                        name,
                        Path(tmp),
                        args.timeout or timeout,
                        args.shared_inductor_cache,
                    )
                res.setdefault("process_wall_s", time.perf_counter() - t0)
                _say(f"{name}: done in {res['process_wall_s']:.1f} s{' - ' + res.get('error', '')}")
                results.append(res)
                # after each contender: a cut-off run keeps what it measured
                text = _write(md_k, meta_k, results, lengths)
                if args.repeats > 1:
                    text = _write_rounds(out_md, meta, args.repeats)
    print(text)
    _say(f"wrote {out_md} and {out_md.with_suffix('.jsonl')}")
    return 0 if all("error" not in r for results in rounds for r in results) else 1


def round_path(out_md: Path, k: int) -> Path:
    """Round k's own report beside the comparison of rounds (`--repeats`)."""
    return out_md.with_name(f"{out_md.stem}_r{k}{out_md.suffix}")


def _write_rounds(out_md: Path, meta: dict[str, Any], n: int) -> str:
    """Write the comparison of the rounds written so far (`--repeats`) from their JSON
    lines: <out>.md, and <out>.jsonl naming the rounds' files; the report."""
    done = [round_path(out_md, k) for k in range(1, n + 1)]
    done = [f.with_suffix(".jsonl") for f in done if f.with_suffix(".jsonl").exists()]
    text = rounds_text(done)
    out_md.write_text(text)
    with out_md.with_suffix(".jsonl").open("w") as f:
        f.write(json.dumps({**meta, "kind": "rounds", "rounds": [p.name for p in done]}) + "\n")
    return text


def planner_vs_best(sums: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The planner against the alternative with the shortest steady pass in one run: that
    alternative, the steady-pass ratio, the per-bucket steady median ratios (by bucket),
    their geometric mean and the worst; None without a planner or an alternative."""
    steady = {c: s["steady_s"] for c, s in sums.items() if s}
    alts = [c for c in ALTERNATIVES if c in steady]
    if "planner" not in steady or not alts:
        return None
    best = min(alts, key=steady.__getitem__)
    mine = sums["planner"]["steady_bucket_median_ms"]
    theirs = sums[best]["steady_bucket_median_ms"]
    ratios = {b: mine[b] / theirs[b] for b in mine if theirs.get(b)}
    logs = [math.log(r) for r in ratios.values()]
    return {
        "best": best,
        "steady": steady["planner"] / steady[best],
        "ratios": ratios,
        "bucket_geo": math.exp(statistics.fmean(logs)) if logs else math.nan,
        "bucket_worst": max(ratios.values(), default=math.nan),
    }


# The serving targets each run is judged against: served / tuned (back to back, tune's
# protocol) at the tuned buckets' representatives and at other sizes of those buckets,
# the planner's per-bucket steady median call over the best alternative's (geometric
# mean and worst bucket), and its host time per call over that alternative's.
SERVING_TARGETS = {"rep": 1.05, "other": 1.10, "geo": 0.95, "worst": 1.02, "host": 1.0}


def targets_text(paths: list[Path]) -> str:
    """A Markdown table: per committed run (one process per contender, or one round of a
    `--repeats` run), each serving target's figure and whether the run met it (the worst
    tuned bucket or size for served / tuned); "not run" where the run has no such timing."""
    t = SERVING_TARGETS
    head = (
        "| run | model | started | served / tuned, representatives, worst (<= {rep}) | "
        "other sizes, worst (<= {other}) | planner / best alternative per bucket: geometric "
        "mean (<= {geo}) | worst bucket (<= {worst}) | host time per call over the best "
        "alternative's (<= {host}) |"
    ).format(**t)
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    met: dict[str, list[bool]] = {k: [] for k in t}

    def cell(key: str, x: float | None) -> str:
        if x is None or math.isnan(x):
            return "not run"
        ok = x <= t[key]
        met[key].append(ok)
        return f"{x:.2f} {'met' if ok else '**missed**'}"

    for path in paths:
        meta, res = _run_of(_jsonl_rows(path))
        sums = {r["contender"]: summarize(r, meta["lengths"]) for r in res}
        vs = planner_vs_best(sums)
        reps = [r["b2b_ratio"] for r in served_vs_tuned(meta, res)]
        others = [r["b2b_ratio"] for r in served_other(meta, res)]
        host = None
        if vs is not None:
            mine = sums["planner"].get("steady_host_median_ms")
            theirs = sums[vs["best"]].get("steady_host_median_ms")
            host = mine / theirs if mine and theirs else None
        cells = [
            cell("rep", max(reps) if reps else None),
            cell("other", max(others) if others else None),
            cell("geo", vs["bucket_geo"] if vs else None),
            cell("worst", vs["bucket_worst"] if vs else None),
            cell("host", host),
        ]
        model = Path(str(meta["model"]).split(":")[0]).stem
        lines.append(
            f"| `{path.name}` | {model} | {str(meta['date'])[:16]} | " + " | ".join(cells) + " |"
        )
    tally = "; ".join(
        f"{what}: met in {sum(v)} of {len(v)} runs"
        for what, v in (
            ("representatives", met["rep"]),
            ("other sizes", met["other"]),
            ("geometric mean", met["geo"]),
            ("worst bucket", met["worst"]),
            ("host time", met["host"]),
        )
        if v
    )
    return "\n".join(lines) + "\n\n" + (f"Over these runs: {tally}.\n" if tally else "")


def rounds_text(paths: list[Path], title: bool = True) -> str:
    """The comparison of a run's rounds (`--repeats`), from each round's JSON lines: each
    contender's steady pass and host time per call per round, the planner against the
    best alternative within each round, and those ratios' median and range over the
    rounds."""
    if not paths:
        return "No round has finished yet.\n"
    per_round = []
    meta: dict[str, Any] = {}
    for path in paths:
        meta, res = _run_of(_jsonl_rows(path))
        sums = {r["contender"]: summarize(r, meta["lengths"]) for r in res}
        per_round.append((path, sums))
    names = [c for c in CONTENDERS if any(sums.get(c) for _, sums in per_round)]
    head = ["round", *(f"{TITLES[c]}: steady pass s, host ms per call" for c in names)]
    head += [
        "planner / best alternative: steady pass",
        "per bucket, geometric mean",
        "worst bucket",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    ratios: dict[str, list[float]] = {"steady": [], "bucket_geo": [], "bucket_worst": []}
    for k, (path, sums) in enumerate(per_round, 1):
        cells = [f"{k} (`{path.name}`)"]
        for c in names:
            s_c = sums.get(c) or {}
            host = s_c.get("steady_host_median_ms")
            cells.append(
                f"{_fmt(s_c.get('steady_s'))}, {_fmt(host)}" if s_c else "failed or not run"
            )
        vs = planner_vs_best(sums)
        if vs is None:
            cells += ["n/a"] * 3
        else:
            for key in ratios:
                ratios[key].append(vs[key])
            cells += [
                f"{vs['steady']:.2f} ({TITLES[vs['best']]})",
                f"{vs['bucket_geo']:.2f}",
                f"{vs['bucket_worst']:.2f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    spread = "; ".join(
        f"{what} median {statistics.median(xs):.2f}, range {min(xs):.2f}..{max(xs):.2f}"
        for what, xs in (
            ("steady pass", ratios["steady"]),
            ("per-bucket geometric mean", ratios["bucket_geo"]),
            ("worst bucket", ratios["bucket_worst"]),
        )
        if xs
    )
    return (
        (
            f"# Runtime over a stream of sequence lengths, {len(per_round)} round(s)\n\n"
            if title
            else ""
        )
        + f"Produced by `{meta.get('command', '')}` ({meta.get('device_name', '')}, torch "
        f"{meta.get('torch', '')}). Each round ran every contender in a new process, the "
        "order reversed every other round; each round's own report is beside this file. A "
        "ratio is taken within a round only (the host's pace can move between processes "
        "of one machine).\n\n"
        + "\n".join(lines)
        + "\n\n"
        + (
            f"Planner / best alternative over the rounds: {spread}.\n"
            if spread
            else "No round had both the planner and an alternative.\n"
        )
    )


def _write(
    out_md: Path, meta: dict[str, Any], results: list[dict[str, Any]], lengths: list[int]
) -> str:
    """Write the report and its JSON lines for the contenders run so far; the report."""
    meta["load_end"] = os.getloadavg()[0]
    text = report(meta, results)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(text)
    with out_md.with_suffix(".jsonl").open("w") as f:
        f.write(json.dumps(meta) + "\n")
        for r in results:
            row = {"kind": "contender", **r, "summary": summarize(r, lengths)}
            f.write(json.dumps(row) + "\n")
    return text


if __name__ == "__main__":
    sys.exit(main())
