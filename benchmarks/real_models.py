"""The real-model suite measured through the user's path: `fusion-plan tune` fills a plan
cache, then `torch.compile(model, backend=fusion_planner_backend(cache))` is timed against
eager and torch.compile's modes, with one timer, in one process.

    PYTHONPATH=. python benchmarks/real_models.py                      # GPU: bf16, all cells
    PYTHONPATH=. python benchmarks/real_models.py --cells 'gpt2:*,bert:*'
    PYTHONPATH=. python benchmarks/real_models.py --device cpu --tiny  # CPU, tiny configs
    python benchmarks/real_models.py --from-jsonl benchmarks/results/real_models_h100.jsonl

Cells are (model, shape) pairs of `benchmarks/models` (`SUITE`), named like
`gpt2:B1xS128`; `--cells` takes comma-separated fnmatch patterns. Per cell:

1. `fusion-plan tune` in a subprocess (strategy `priority`: deterministic, and needs no
   optuna; `--top-k 2`, the cell's dtype) over a one-size bucket of the cell's shape,
   into a fresh SQLite cache; its wall time is reported;
2. in this process, under `torch.inference_mode()`: eager, `torch.compile` (default),
   `mode="reduce-overhead"`, `mode="max-autotune"` (with CUDA graphs),
   `mode="max-autotune-no-cudagraphs"` and the planner backend on that cache. Each
   contender's first call is its compile time; after warm-up calls, the runner's
   interleaved timer runs rounds (profiling.runner, profiling.timer: the contenders in
   rotated order each round, the same number of calls per round for all, CUDA events on
   GPU, perf_counter on CPU); a contender's latency is the median per-call time over
   rounds, its spread the IQR over the median;
3. from the cache: the stored plan's measured latency (served / tuned: what the backend
   delivers against what `tune` measured) and its predicted latency (the cost model's
   plan error, predicted / measured); from the backend: its RuntimeStats (cache hits,
   graph-level fallbacks) and, per realized plan, how many groups fell back to eager and
   whether the whole plan did;
4. the planner and eager timed again each by itself, with `tune`'s protocol (the runner's
   steady settings, calls back to back): served/tuned from the same protocol in this
   process, and eager's ratio to `tune`'s eager, the host-speed drift between the two
   processes (the table's notes).

With `--bucket`, the tuned bucket is (v/2, v] of the cell's bucket size v (the sequence
length for text, the batch for vision: an image model serves one image size; a cell whose
bucket would hold sizes below 2, e.g. a vision cell at B=1, is tuned at its one shape and
compiled as such), every compiled contender has `dynamic=True`, and every contender is also called at a second shape of the
bucket (its size 3v/4, inputs built like the cell's): `<mode>@other`. The planner gets
three calls at each shape (its backend has `static_after=3`: a shape served long enough gets
its static specialization under the default policy too, once it pays) and its static
specializations are waited for; then both
shapes' contenders are timed in the same interleaved rounds, and the table adds served / tuned
at the other shape.

Outputs are checked against eager (max abs difference over every output tensor, reported).
Rows are appended as JSON lines to `<out>.jsonl`; cells already there (same device and
dtype) are skipped unless `--redo`, so a suite larger than one call's time runs in several
calls of the same command (`--time-limit-s`: no cell starts that the longest cell so far
would carry past it). The Markdown table `<out>.md` is regenerated from the whole
JSON-lines file after each call, or alone with `--from-jsonl`.
"""

from __future__ import annotations

import argparse
import fnmatch
import html
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.models import OPTIONAL, SUITE, SuiteModel  # noqa: E402
from planner.ir.pytrees import flat_values  # noqa: E402
from planner.measurement import Measurement  # noqa: E402
from planner.plans.cache import PlanCache  # noqa: E402
from planner.runtime.backend import fusion_planner_backend  # noqa: E402
from profiling.runner import DeviceRunner, first_call  # noqa: E402
from zoo.modelspec import parse_dtype, resolve  # noqa: E402

MODES = (
    "eager",
    "compile",
    "reduce-overhead",
    "max-autotune",
    "max-autotune-no-cudagraphs",
    "planner",
)
ALTERNATIVES = MODES[:5]  # what the planner is compared with
SOLO = "@alone"  # a contender timed by itself, with `tune`'s protocol
OTHER = "@other"  # suffix of a contender timed at the bucket's other shape (`--bucket`)


def _note_counts(groups: Any) -> dict[str, int]:
    """How many groups carry each note, numbers left out ("3 convolution(s) channels-last"
    and "1 convolution(s) channels-last" count as one note)."""
    out: dict[str, int] = {}
    for g in groups:
        for part in filter(None, (getattr(g, "note", "") or "").split("; ")):
            key = re.sub(r"\b\d+\b", "N", part)[:120]
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


# ---- cells ---------------------------------------------------------------------------------
def cell_name(m: SuiteModel, shape: dict[str, int]) -> str:
    return f"{m.name}:" + "x".join(f"{k}{v}" for k, v in shape.items())


def cells(tiny: bool, patterns: list[str]) -> list[tuple[str, SuiteModel, dict[str, int]]]:
    out = []
    models = SUITE if tiny else SUITE + tuple(m for m in OPTIONAL if m.available())
    for m in models:
        for shape in (m.tiny_shape,) if tiny else m.shapes:
            name = cell_name(m, shape)
            if not patterns or any(fnmatch.fnmatch(name, p) or p == m.name for p in patterns):
                out.append((name, m, shape))
    return out


def _timing_row(m: Measurement) -> dict[str, float]:
    """The row's timing of one contender: median and spread per call, calls per round
    (`reps`) and rounds."""
    t = m.timing
    assert t is not None
    return {
        "median_s": t.median_s,
        "iqr_s": t.iqr_s,
        "spread": t.spread,
        "reps": t.copies,
        "rounds": t.reps,
    }


# ---- outputs --------------------------------------------------------------------------------
def tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor in a model output, library objects (a KV cache) included, in order."""
    return [v for v in flat_values(out) if isinstance(v, torch.Tensor)]


def max_abs_diff(ref: Any, got: Any) -> float | None:
    """Largest |got - ref| over every output tensor; None when the structures differ."""
    rs, gs = tensors(ref), tensors(got)
    if len(rs) != len(gs) or any(r.shape != g.shape for r, g in zip(rs, gs)):
        return None
    diffs = [(g.float() - r.float()).abs().max().item() for r, g in zip(rs, gs) if r.numel()]
    return max(diffs, default=0.0)


# ---- one cell -------------------------------------------------------------------------------
def served_dim(m: SuiteModel, shape: dict[str, int], bucket: bool) -> str | None:
    """The parameter `--bucket` varies over (v/2, v] for this cell (`m.bucket_dim`), or
    None for a cell tuned at its one shape: without `--bucket`, or where the bucket would
    hold a size below 2 (a size-1 dimension is specialized, never dynamic)."""
    if not bucket:
        return None
    d = m.bucket_dim
    return d if shape[d] >= 3 else None


def other_shape(m: SuiteModel, shape: dict[str, int]) -> dict[str, int] | None:
    """A second shape of the bucket (v/2, v] that `--bucket` tunes: the cell's shape with
    its bucket size at 3v/4; None when the cell has no bucket (`served_dim`)."""
    d = served_dim(m, shape, True)
    if d is None:
        return None
    v = shape[d]
    size = max(2, v // 2 + 1, 3 * v // 4)
    return None if size >= v else {**shape, d: size}


def tune_cell(m: SuiteModel, shape: dict[str, int], args: Any, db: str) -> dict[str, Any]:
    """`fusion-plan tune` of the cell's shape into `db`, in a subprocess: one bucket
    (v/2, v] of `served_dim` whose representative is the cell's size, or the cell's one
    shape."""
    bucketed = served_dim(m, shape, args.bucket)
    d = bucketed or m.dim
    fixed = ",".join(f"{k}={v}" for k, v in shape.items() if k != d)
    v = shape[d]
    lo = max(2, v // 2 + 1) if bucketed else v
    cmd = [
        sys.executable,
        "-m",
        "cli.main",
        "tune",
        "--model",
        m.spec(tiny=args.tiny),
        "--shape",
        fixed,
        "--dynamic",
        f"{d}={lo}..{v}",
        "--buckets",
        f"edges:{v}",
        "--strategy",
        args.strategy,
        "--top-k",
        str(args.top_k),
        "--dtype",
        args.dtype,
        "--cache",
        db,
        "--no-compile-baseline",
        "--format",
        "json",
    ]
    if args.cost_model:
        cmd += ["--cost-model", args.cost_model]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {"tune_s": wall, "tune_rc": proc.returncode, "tune_cmd": shlex.join(cmd)}
    try:
        data = json.loads(proc.stdout)
        b = data["buckets"][0]
        row["tune_candidates"] = b["candidates"]
        row["tune_stored"] = b["stored"]
        failed = [c["error"] for c in b["candidates"] if c.get("error")]
        if b.get("plan") is None and failed:
            row["tune_error"] = failed[0][:400]
    except (json.JSONDecodeError, KeyError, IndexError):
        row["tune_error"] = (proc.stderr.strip().splitlines() or ["no output"])[-1][:400]
    return row


def stored_plan(db: str) -> dict[str, Any]:
    with PlanCache(db) as cache:
        entries = cache.entries()
    if not entries:
        return {}
    e = entries[0]
    return {
        "stored_measured_s": e.measured_s,
        "stored_predicted_s": e.predicted_s,
        "stored_groups": e.plan.n_groups,
        "stored_strategy": e.plan.strategy,
        "stored_eager_s": e.plan.eager_s,
    }


def contenders(
    module: torch.nn.Module,
    db: str,
    device: torch.device,
    modes: list[str],
    dynamic: bool | None = None,
) -> tuple[dict[str, Callable[..., Any]], Any, list[Any]]:
    """(mode -> callable, the planner backend, its realized plans as they are made);
    `dynamic` is torch.compile's, for every compiled contender."""
    out: dict[str, Callable[..., Any]] = {}
    realized: list[Any] = []
    backend = None
    for mode in modes:
        if mode == "eager":
            out[mode] = module
        elif mode == "compile":
            out[mode] = torch.compile(module, dynamic=dynamic)
        elif mode == "planner":
            # static_after=3: the steady state of a shape served long enough for its static
            # specialization to pay for itself (the default policy's end state), made now
            backend = fusion_planner_backend(db, device=device, static_after=3)
            base = backend.realizer

            def recording(captured: Any, plan: Any, base: Any = base, **options: Any) -> Any:
                rp = base(captured, plan, **options)
                realized.append(rp)
                return rp

            backend.realizer = recording
            out[mode] = torch.compile(module, backend=backend, dynamic=dynamic)
        else:
            out[mode] = torch.compile(module, mode=mode, dynamic=dynamic)
    return out, backend, realized


def run_cell(name: str, m: SuiteModel, shape: dict[str, int], args: Any) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = parse_dtype(args.dtype)
    row: dict[str, Any] = {
        "cell": name,
        "model": m.name,
        "shape": shape,
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "dtype": args.dtype,
        "torch": torch.__version__,
        "tiny": args.tiny,
        "strategy": args.strategy,
        "bucket": served_dim(m, shape, args.bucket) is not None,
    }
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "plans.sqlite")
        _say(f"{name}: tune")
        row.update(tune_cell(m, shape, args, db))
        row.update(stored_plan(db))
        _say(f"{name}: tune {row['tune_s']:.0f}s, stored {row.get('stored_groups')} groups")
        torch.manual_seed(0)
        module, inputs = resolve(m.spec(tiny=args.tiny), shape).build(
            dtype=dtype, device=device, seed=0
        )
        other = other_shape(m, shape) if args.bucket else None
        other_inputs = None
        if other is not None:
            row["other_shape"] = other
            # the same module serves both shapes; only the inputs are built at `other`
            other_module, other_inputs = resolve(m.spec(tiny=args.tiny), other).build(
                dtype=dtype, device=device, seed=0
            )
            del other_module
        torch._dynamo.reset()
        # four compiled variants of one module: keep dynamo from giving up on recompiles
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
        with torch.inference_mode():
            fns, backend, realized = contenders(
                module, db, device, args.modes, dynamic=True if row["bucket"] else None
            )
            calls = {n: (lambda f=f, x=inputs: f(*x)) for n, f in fns.items()}
            if other_inputs is not None:
                calls |= {n + OTHER: (lambda f=f, x=other_inputs: f(*x)) for n, f in fns.items()}
            ref: dict[str, Any] = {}
            compile_s, errors, diffs = {}, {}, {}
            for n, call in list(calls.items()):
                _say(f"{name}: first call of {n}")
                try:
                    compile_s[n], out = first_call(call, device)
                except Exception as e:  # a contender that cannot run is reported, not fatal
                    errors[n] = (
                        f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                    )
                    del calls[n]
                    continue
                at = OTHER if n.endswith(OTHER) else ""
                if n == "eager" + at:
                    ref[at] = out
                elif at in ref:
                    diffs[n] = max_abs_diff(ref[at], out)
            for at in ("", OTHER):
                if backend is None or "planner" + at not in calls or not backend.static_after:
                    continue
                # the shape recurs: let the backend make its static specialization first
                t0 = time.perf_counter()
                for _ in range(backend.static_after):
                    calls["planner" + at]()
                backend.wait_static(timeout=900)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                compile_s["planner_static" + at] = time.perf_counter() - t0
            _say(f"{name}: timing {list(calls)}")
            runner = DeviceRunner(device=device)
            measured = runner.measure_interleaved(
                calls,
                rounds=args.rounds,
                round_s=args.round_ms / 1e3,
                warmup=args.warmup,
                dtype=args.dtype,
                compile_s=compile_s,
            )
            timing = {n: _timing_row(m) for n, m in measured.items() if m.timing is not None}
            errors |= {n: str(m.error) for n, m in measured.items() if m.error is not None}
            # the served plan and eager timed alone, as `tune` times them (its runner's
            # steady settings, back to back): served/tuned from the same protocol, in this
            # process, apart from the host-speed drift between this process and tune's
            solo = {n: calls[n] for n in ("eager", "planner") if n in calls}
            if "planner" in solo:
                alone = {
                    n: runner.measure_interleaved({n: f}, dtype=args.dtype)[n]
                    for n, f in solo.items()
                }
                timing |= {
                    n + SOLO: _timing_row(m) for n, m in alone.items() if m.timing is not None
                }
            if args.profile:
                row["kernels"] = {
                    n: kernel_breakdown(call, device) for n, call in calls.items() if OTHER not in n
                }
        row.update(timing=timing, compile_s=compile_s, errors=errors, max_abs_diff=diffs)
        if backend is not None:
            row["runtime_stats"] = asdict(backend.stats)  # every field the backend counts
            row["realized_plans"] = [
                {
                    "groups": len(rp.partition),
                    "static": bool(getattr(rp, "static_shapes", False)),
                    "reference": getattr(rp, "reference", None),
                    "fallback_groups": len(rp.fallbacks),
                    "fallback_reasons": sorted(set(rp.fallbacks.values()))[:5],
                    # set when no group-level fallback made the plan agree with eager
                    "whole_plan_fallback": getattr(rp, "_whole_fallback", None) is not None,
                    # what realization did beyond the label (rewrites, layouts), by group count
                    "notes": _note_counts(getattr(rp, "groups", ())),
                }
                for rp in realized
                if hasattr(rp, "partition")
            ]
        del fns, calls, module, inputs, other_inputs
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def kernel_breakdown(call: Callable[[], Any], device: torch.device, reps: int = 10) -> dict:
    """Device kernels of `reps` calls under torch.profiler: time per call, kernel launches
    per call, and the heaviest kernels (µs per call, launches per call, name)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for _ in range(3):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with profile(activities=acts) as prof:
        for _ in range(reps):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    want = "CUDA" if device.type == "cuda" else "CPU"
    ev = [e for e in prof.key_averages() if e.device_type.name == want]
    if want == "CPU":  # on the CPU, the operators that run kernels: aten ops without children
        ev = [e for e in ev if e.key.startswith("aten::")]
    total = "device_time_total" if want == "CUDA" else "self_cpu_time_total"
    ev.sort(key=lambda e: -getattr(e, total))
    return {
        "us_per_call": sum(getattr(e, total) for e in ev) / reps,
        "launches_per_call": sum(e.count for e in ev) / reps,
        "top": [[getattr(e, total) / reps, e.count / reps, e.key[:160]] for e in ev[:15]],
    }


# ---- report ---------------------------------------------------------------------------------
def _us(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e6:,.0f}" if s >= 1e-4 else f"{s * 1e6:.1f}"


def _mode_cell(r: dict[str, Any], mode: str) -> str:
    t = r.get("timing", {})
    if mode not in t:
        return "fail" if mode in r.get("errors", {}) else "—"
    return f"{_us(t[mode]['median_s'])} ±{t[mode]['spread'] * 100:.0f}%"


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    """The table of `rows` (a cell measured again, `--redo`, shows its latest row); every
    command that made a shown row is listed (the last call's `command` when they name none)."""
    latest = {(r["cell"], r.get("dtype"), r.get("tiny")): r for r in rows}
    rows = [r for r in rows if latest[(r["cell"], r.get("dtype"), r.get("tiny"))] is r]
    commands = list(dict.fromkeys(r["command"] for r in rows if r.get("command"))) or [command]
    lines = [
        "# Real-model suite through the user's path",
        "",
        "`fusion-plan tune --strategy priority --top-k 2` fills a cache per cell, then "
        "`torch.compile(model, backend=fusion_planner_backend(cache))` is timed against eager "
        "and torch.compile's modes in one process with one timer (median of interleaved "
        "rounds, µs per call; ± is the IQR over the median). `vs best` = planner / best "
        "alternative; `served/tuned` = planner / the plan's latency as `tune` stored it; "
        "`pred/meas` = the cost model's predicted plan latency / the stored measurement; "
        "`fell back` = groups run eagerly / groups, over the backend's realized plans "
        "(`W` marks a whole-plan fallback).",
        "",
        "Commands (run in this order; `—` marks a mode a command left out):",
        "",
        *(f"- `{c}`" for c in commands),
        "",
    ]
    # the other shape's columns only where some row measured one (older tables stay as they were)
    others = any(r.get("other_shape") for r in rows)
    if others:
        lines[3:3] = [
            "",
            "`(dynamic=True, bucket)` rows also time every contender at a second shape of the "
            "tuned bucket (`other`: the dynamic size at 3/4 of the representative's), after "
            "the same recurring calls, in the same interleaved rounds: `planner @other`, "
            "`best alt @other` (the fastest alternative there) and `served/tuned (other)` = "
            "planner there / the plan's latency as `tune` stored it for the bucket.",
        ]
    lines += [
        "| cell | device, dtype | eager | compile | reduce-overhead | max-autotune | "
        "max-autotune-nocg | planner | vs best | served/tuned | "
        + ("other | planner @other | best alt @other | served/tuned (other) | " if others else "")
        + "pred/meas | fell back | cache hits | tune s | "
        "compile s (c / ro / ma / ma-nocg / planner) | notes |",
        "|" + "---|" * (20 if others else 16),
    ]
    ratios, other_ratios = [], []
    for r in rows:
        t = r.get("timing", {})

        planner = t.get("planner", {}).get("median_s")
        vs = _vs_best(t)
        if vs:
            ratios.append(vs)
        stored = r.get("stored_measured_s")
        other_cols = []
        if others:
            alts = [n for n in ALTERNATIVES if n + OTHER in t]
            best = min(alts, key=lambda n: t[n + OTHER]["median_s"], default=None)
            planner_o = t.get("planner" + OTHER, {}).get("median_s")
            if planner_o and stored:
                other_ratios.append(planner_o / stored)
            o = r.get("other_shape")
            other_cols = [
                "x".join(f"{k}{v}" for k, v in o.items()) if o else "—",
                _mode_cell(r, "planner" + OTHER) if o else "—",
                f"{_mode_cell(r, best + OTHER)} ({best})" if best else "—",
                f"{planner_o / stored:.2f}" if planner_o and stored else "—",
            ]
        pred = r.get("stored_predicted_s")
        plans = r.get("realized_plans", [])
        fell = (
            " + ".join(
                f"{p['fallback_groups']}/{p['groups']}{'W' if p['whole_plan_fallback'] else ''}"
                for p in plans
            )
            or "—"
        )
        st = r.get("runtime_stats", {})
        hits = (
            f"{st.get('exact', 0) + st.get('bucket', 0)} hit / {st.get('default', 0)} miss"
            if st
            else "—"
        )
        cs = r.get("compile_s", {})
        comp = " / ".join(f"{cs[n]:.0f}" if n in cs else "—" for n in MODES[1:])
        notes = []
        diff = r.get("max_abs_diff", {}).get("planner")
        if diff is not None:
            notes.append(f"planner max abs diff vs eager {diff:.3g}")
        diff = r.get("max_abs_diff", {}).get("planner" + OTHER)
        if diff is not None:
            notes.append(f"planner @other max abs diff vs eager {diff:.3g}")
        if "tune_error" in r or not stored:
            why = r.get("tune_error") or r.get("tune_stored", "")
            notes.append(f"tune stored nothing: {why[:160]}")
        notes += [f"{n}: {e[:160]}" for n, e in r.get("errors", {}).items()]
        notes += [f"backend: {f[:160]}" for f in st.get("fallbacks", [])[:2]]
        alone = t.get("planner" + SOLO, {}).get("median_s")
        eager_alone = t.get("eager" + SOLO, {}).get("median_s")
        if alone and stored:
            note = f"served alone (tune's protocol, this process) / tuned {alone / stored:.2f}"
            if eager_alone and r.get("stored_eager_s"):
                note += f"; eager alone here / in tune {eager_alone / r['stored_eager_s']:.2f}"
            notes.append(note)
        if st.get("static"):
            notes.append(f"static specializations: {st['static']}")
        notes += [f"no static specialization: {f[:160]}" for f in st.get("static_failed", [])[:1]]
        notes += [f"realized per shape: {f[:160]}" for f in st.get("per_shape", [])[:1]]
        if st.get("over_budget"):
            notes.append(f"compile budget spent: {st['over_budget']} bucket(s) ran dynamo's graph")
        reasons = sorted({x for p in plans for x in p.get("fallback_reasons", [])})
        notes += [f"group fallback: {x[:160]}" for x in reasons[:2]]
        lines.append(
            "| "
            + " | ".join(
                [
                    r["cell"] + (" (dynamic=True, bucket)" if r.get("bucket") else ""),
                    f"{r['device']}, {r['dtype']}",
                    *(_mode_cell(r, n) for n in MODES),
                    f"{vs:.2f}x" if vs else "—",
                    f"{planner / stored:.2f}" if planner and stored else "—",
                    *other_cols,
                    f"{pred / stored:.2f}" if pred and stored else "—",
                    fell,
                    hits,
                    f"{r.get('tune_s', 0):.0f}",
                    comp,
                    "; ".join(notes).replace("|", "/")[:700],
                ]
            )
            + " |"
        )
    if ratios:
        lines += [
            "",
            f"Planner vs best alternative: geometric mean {_geomean(ratios):.3f}x over {len(ratios)} "
            f"cell(s), worst {max(ratios):.2f}x.",
        ]
    if other_ratios:
        lines += [
            "",
            f"Served/tuned at the bucket's other shape: worst {max(other_ratios):.2f} over "
            f"{len(other_ratios)} cell(s).",
        ]
    return "\n".join(lines + kernel_table(rows)) + "\n"


def kernel_table(rows: list[dict[str, Any]]) -> list[str]:
    """Where each contender's time goes (rows measured with `--profile`): device kernel
    time per call under torch.profiler, kernel launches per call, and the per-call time
    left over (the interleaved median minus the kernel time: host work the device waited
    for, and gaps between kernels), with the heaviest kernel."""
    prof = [r for r in rows if r.get("kernels")]
    if not prof:
        return []
    out = [
        "",
        "## Kernels per call (`--profile`)",
        "",
        "`kernel µs` = device kernel time per call under torch.profiler (10 calls after the "
        "timing); `launches` = kernels per call; `left over µs` = the contender's median per "
        "call in the table above minus its kernel time: host work the device waited for, and "
        "gaps between kernels.",
        "",
        "| cell | contender | median µs | kernel µs | launches | left over µs | heaviest kernel |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in prof:
        for n, k in r["kernels"].items():
            med = r.get("timing", {}).get(n, {}).get("median_s")
            top = k["top"][0] if k.get("top") else None
            heavy = f"{top[0]:.0f} µs x{top[1]:g} `{top[2][:70]}`" if top else "—"
            out.append(
                f"| {r['cell']} | {n} | {med * 1e6:,.0f} | {k['us_per_call']:,.0f} | "
                f"{k['launches_per_call']:g} | "
                + (f"{med * 1e6 - k['us_per_call']:,.0f}" if med else "—")
                + f" | {heavy.replace('|', '/')} |"
                if med
                else f"| {r['cell']} | {n} | — | {k['us_per_call']:,.0f} | "
                f"{k['launches_per_call']:g} | — | {heavy.replace('|', '/')} |"
            )
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _say(msg: str) -> None:
    print(f"[real_models] {msg}", file=sys.stderr, flush=True)


def _vs_best(t: dict[str, Any], suffix: str = "") -> float | None:
    """The planner's median over the fastest alternative's, among the timings `t` (at the
    other shape with `suffix`); None where either is missing."""
    best = min((t[n + suffix]["median_s"] for n in ALTERNATIVES if n + suffix in t), default=None)
    mine = t.get("planner" + suffix, {}).get("median_s")
    return mine / best if mine and best else None


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


CHART_NAMES = {
    "planner": "plan",
    "eager": "eager",
    "compile": "torch.compile",
    "reduce-overhead": "reduce-overhead",
    "max-autotune": "max-autotune",
    "max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs",
}


def html_view(rows: list[dict[str, Any]], command: str) -> str:
    """The table's cells as one self-contained page: per cell, a band of bars (median µs per
    call of every contender, `@other` shapes as their own band), each band on its own scale,
    with the planner's ratio to the best alternative beside the cell's name."""
    from cli.report_charts import BucketTimes, Spread, timing_chart
    from cli.report_html import page

    latest = {(r["cell"], r.get("dtype"), r.get("tiny")): r for r in rows}
    bands, ratios = [], []
    for r in latest.values():
        t = r.get("timing", {})
        for suffix in ("", OTHER):
            times = {
                CHART_NAMES[n]: Spread(t[n + suffix]["median_s"])
                for n in MODES
                if n + suffix in t and t[n + suffix].get("median_s")
            }
            if not times:
                continue
            vs = _vs_best(t, suffix)
            shape = r.get("other_shape") if suffix else r.get("shape")
            label = r["cell"].split(":")[0] + ":" + "x".join(f"{k}{v}" for k, v in shape.items())
            if vs:
                label += f" ({vs:.2f}x)"
                if not suffix:
                    ratios.append(vs)
            bands.append(BucketTimes(label, times))
    summary = ""
    if ratios:
        summary = (
            "Planner vs best alternative at the cells' own shapes: geometric mean "
            f"{_geomean(ratios):.3f}x "
            f"over {len(ratios)} cell(s), worst {max(ratios):.2f}x. "
        )
    devices = sorted({r.get("device", "") for r in latest.values()} - {""})
    body = (
        f"<p>{html.escape(summary)}Each band is one cell on its own scale from zero; the "
        "ratio beside a cell's name is the planner's time over the fastest alternative's "
        "(below 1: the planner is faster). The ± spread of each figure is in the Markdown "
        "table beside this page.</p>"
        + timing_chart(bands, width=1040, label_w=250)
        + "<p>Made by these commands (each row is its cell's latest measurement; "
        "<code>--tree</code> is the commit a command ran at):</p><ul>"
        + "".join(
            f"<li><code>{html.escape(c)}</code></li>"
            for c in dict.fromkeys(r["command"] for r in latest.values() if r.get("command"))
        )
        + "</ul>"
    )
    return page(
        "Real-model suite through the user's path",
        f"{', '.join(devices) or command}: fusion-plan tune, then torch.compile with the "
        "fusion-planner backend, against eager and torch.compile's modes in one process",
        body,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="bf16 (GPU default) | fp32 (CPU default)")
    p.add_argument("--tiny", action="store_true", help="the CPU tests' configs and shapes")
    p.add_argument("--cells", default="", help="comma-separated fnmatch patterns or model names")
    p.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    p.add_argument(
        "--strategy", default="priority", help="tune strategy (priority/greedy: no optuna)"
    )
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--cost-model", default=None, help="passed to `fusion-plan tune`")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--round-ms", type=float, default=25.0, help="time per contender per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--time-limit-s",
        type=float,
        default=480.0,
        help="start no cell that would end past this, judged by the longest cell so far",
    )
    p.add_argument(
        "--bucket",
        action="store_true",
        help="tune one bucket (v/2, v] of the cell's dynamic size and compile every "
        "contender with dynamic=True (the serving path for varying shapes)",
    )
    p.add_argument("--redo", action="store_true", help="re-measure cells already in the jsonl")
    p.add_argument(
        "--tree",
        default=None,
        help="the commit the code is at, recorded in each row (and so in the command list): "
        "on a machine that runs a copy of a working tree, git cannot say",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also record each contender's kernels (torch.profiler) in the row",
    )
    p.add_argument("--out", default=None, help="output stem (default results/real_models_<dev>)")
    p.add_argument("--from-jsonl", default=None, help="only regenerate the table from this file")
    args = p.parse_args(argv)
    if args.from_jsonl:
        src = Path(args.from_jsonl)
        rows = read_jsonl(src)
        command = rows[-1].get("command", "") if rows else ""
        src.with_suffix(".md").write_text(markdown(rows, command))
        src.with_suffix(".html").write_text(html_view(rows, command))
        print(src.with_suffix(".md"))
        return 0
    gpu = args.device.startswith("cuda")
    args.dtype = args.dtype or ("bf16" if gpu else "fp32")
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = set(args.modes) - set(MODES)
    if unknown or "eager" not in args.modes:
        p.error(f"--modes: unknown {sorted(unknown)}; eager is required (the reference)")
    tag = ("h100" if "H100" in torch.cuda.get_device_name() else "gpu") if gpu else "cpu"
    stem = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"real_models_{tag}"
    if args.tiny and not args.out:
        stem = stem.with_name(stem.name + "_tiny")
    if args.bucket and not args.out:
        stem = stem.with_name(stem.name + "_bucket")
    jsonl = stem.with_suffix(".jsonl")
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/real_models.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    done = {
        r["cell"]
        for r in read_jsonl(jsonl)
        if r.get("dtype") == args.dtype and r.get("tiny") == args.tiny
    }
    todo = cells(args.tiny, [c for c in args.cells.split(",") if c])
    t_start = time.perf_counter()
    longest_s = 0.0  # no cell starts that the longest one so far would carry past the limit
    for name, m, shape in todo:
        if name in done and not args.redo:
            _say(f"{name}: in {jsonl.name} already (--redo to measure again)")
            continue
        elapsed = time.perf_counter() - t_start
        if longest_s and elapsed + longest_s > args.time_limit_s:
            _say(f"time limit: {name} and later cells left for the next call (same command)")
            break
        t_cell = time.perf_counter()
        try:
            row = run_cell(name, m, shape, args)
        except Exception as e:  # one broken cell must not lose the others
            traceback.print_exc()
            row = {
                "cell": name,
                "model": m.name,
                "shape": shape,
                "dtype": args.dtype,
                "tiny": args.tiny,
                "device": args.device,
                "errors": {"cell": f"{type(e).__name__}: {e}"},
            }
        row["command"] = command
        if args.tree:
            row["tree"] = args.tree
        row["cell_s"] = time.perf_counter() - t_cell
        longest_s = max(longest_s, row["cell_s"])
        with jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
    rows = read_jsonl(jsonl)
    stem.with_suffix(".md").write_text(markdown(rows, command))
    stem.with_suffix(".html").write_text(html_view(rows, command))
    print(stem.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
