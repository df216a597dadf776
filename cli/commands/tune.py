"""`fusion-plan tune`: the offline tuning job over shape buckets (search/tune.py)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from cli import fmt
from cli.common import (
    Resolved,
    apply_threads,
    capture_for_planning,
    check_local_device,
    emit,
)
from cli.report_graph import require_dot
from cli.report_html import check_writable, job_from_tune, write_report
from planner import progress
from planner.hardware import get_spec, local_device_name
from planner.plans.cache import PlanCache
from planner.realize.check import short_reason
from profiling.commbench import leave_group
from search.cost_models import cost_model_for
from search.tune import (
    BucketResult,
    TuneConfig,
    bucket_spec,
    graph_varies,
    queued_bucket_keys,
    queued_part_buckets,
    tune,
)
from search.tune_tp import init_ranks
from zoo.modelspec import dtype_name, parse_dtype, resolve


def run(args: argparse.Namespace) -> int:
    if not args.dist_backend:
        return _run(args)
    init_ranks(args.dist_backend)  # before anything is built: the model's group is the job's
    code = 1
    try:
        code = _run(args)
        return code
    finally:
        # the plans are written (the cache closed): a teardown that hangs is left behind
        leave_group(code)


def _run(args: argparse.Namespace) -> int:
    if args.report:  # said before the search and measurements, not after them
        require_dot()
        check_writable(args.report)
    device = check_local_device(args)
    gpu = device != "cpu"
    apply_threads(args, times_on_cpu=not gpu)
    dtype = parse_dtype(args.dtype or ("bf16" if gpu else "fp32"))
    spec = resolve(args.model, args.shape)
    cost_model = cost_model_for(args.cost_model, device)
    cfg = TuneConfig(
        spec=spec,
        dynamic=args.dynamic,
        buckets=args.buckets,
        strategy=args.strategy,
        budget_evals=args.budget_evals,
        budget_seconds=args.budget_seconds,
        trials=args.trials,
        top_k=args.top_k,
        dtype=dtype,
        storage=args.storage,
        workers=args.workers,
        heartbeat_s=args.heartbeat,
        seed=args.seed,
        compile_baseline=not args.no_compile_baseline,
        prefer_eager=not args.keep_fused,
        autotune_variant=args.autotune,
    )
    with PlanCache(args.cache) as cache:
        only = None
        if args.from_queue:
            only = _queued_buckets(cache, cfg)
        results = tune(cfg, cost_model, cache, only_buckets=only, progress=progress.say)
        if args.cost_model_out and hasattr(cost_model, "save"):
            cost_model.save(args.cost_model_out)
        label = _label(spec, args.dynamic)
        dims = bucket_spec(cfg).dims
        names = [part.split("=")[0].strip() for part in args.dynamic.split(",") if "=" in part]
        varies = graph_varies(results, ", ".join(names) or args.dynamic)
        emit(
            args,
            {
                "model": label,
                "device": device,
                "dtype": str(dtype),
                "cache": cache.url,
                "buckets": [_row(r, dims) for r in results],
                "graph_varies": varies,
            },
            "\n".join(filter(None, [_table(label, device, cache.url, results, dims), varies])),
        )
        if args.report:
            job = job_from_tune(
                results,
                model=label,
                device=get_spec(device),
                dtype=dtype_name(dtype),
                cost_model=cost_model,
                strategy=args.strategy,
                cache=cache.url,
            )
            print(f"report: {write_report(job, args.report)}", file=sys.stderr)
    return 0 if job_ok(results) else 1


def job_ok(results: list[BucketResult]) -> bool:
    """Whether the job did what it was asked: every plan measured was stored, and every
    bucket has a plan; for a model with graph breaks, one for at least one of its graphs
    (a graph none of whose candidates can be served, one that updates a tensor in place,
    say, is run as dynamo's graph, and its row says why)."""
    if any(r.stored.startswith("NOT stored") for r in results):
        return False
    by_bucket: dict[str, bool] = {}
    for r in results:
        by_bucket[r.bucket.key] = by_bucket.get(r.bucket.key, False) or r.plan is not None
        if not r.part and r.plan is None:
            return False
    return all(by_bucket.values())


def _label(spec: Any, dynamic: str) -> str:
    """The model with its dynamic dims shown as ranges, e.g. zoo:mlp[B=2..4,D=16]."""
    params: dict[str, Any] = dict(spec.params)
    for part in dynamic.split(","):
        if "=" in part:
            name, rng = part.split("=", 1)
            params[name.strip()] = rng.strip()
    return f"{spec.spec}[{','.join(f'{k}={v}' for k, v in params.items())}]"


def _queued_buckets(cache: PlanCache, cfg: TuneConfig) -> set[str]:
    """Buckets holding shapes the runtime met without a plan (its tuning queue)."""
    resolved = Resolved(cfg.spec, local_device_name(), cfg.dtype)
    module, inputs = resolved.spec.build(dtype=resolved.dtype, device="cpu")
    captured = capture_for_planning(resolved, (module, inputs))  # the runtime's graph and key
    return queued_bucket_keys(cache, cfg, inputs, captured) | queued_part_buckets(cache, cfg)


def _row(r: BucketResult, dims: Any) -> dict[str, Any]:
    best = r.best
    return {
        "bucket": r.bucket.key,
        "bucket_label": fmt.bucket(r.bucket.key, dims),
        "params": r.params,
        "part": r.part,
        "plan": r.plan.to_json() if r.plan else None,
        "eager_s": r.eager.median_s if r.eager else None,
        "compile_s": r.compiled.median_s if r.compiled else None,
        "best_s": best.measured.median_s if best else None,
        "best_strategy": best.strategy if best else None,
        "timings": {
            "eager": fmt.timing_dict(r.eager),
            "compile": fmt.timing_dict(r.compiled),
            "plan": fmt.timing_dict(best.measured if best else None),
        },
        "speedup_vs_eager_unstable": (
            fmt.speedup_unstable(r.eager, best.measured) if best and r.eager else None
        ),
        "speedup_vs_compile_unstable": (
            fmt.speedup_unstable(r.compiled, best.measured) if best and r.compiled else None
        ),
        "candidates": [
            {
                "strategy": c.strategy,
                "groups": len(c.partition),
                "predicted_s": c.predicted_s,
                "measured_s": c.measured.median_s if c.measured else None,
                "synced_s": (
                    c.measurement.synced_s
                    if c.measurement is not None and not math.isnan(c.measurement.synced_s)
                    else None
                ),
                "measured": fmt.timing_dict(c.measured),
                "error": c.error,
                "fallbacks": {str(g): why for g, why in c.fallbacks.items()},
                "tensor_parallel": c.tensor_parallel.label if c.tensor_parallel else None,
            }
            for c in r.candidates
        ],
        "search_s": r.search_s,
        "realize_s": r.realize_s,
        "stored": r.stored,
        "tensor_parallel": r.tensor_parallel,
        "model_timings": {
            "eager": fmt.timing_dict(r.model_eager),
            "served": fmt.timing_dict(r.model_served),
        },
        "model_note": r.model_note,
    }


def _name(r: BucketResult, dims: Any) -> str:
    """A result's row label: its bucket, and which graph for a model with graph breaks."""
    name = fmt.bucket(r.bucket.key, dims)
    return f"{name} ({r.part})" if r.part else name


def _table(label: str, device: str, cache_url: str, results: list[BucketResult], dims: Any) -> str:
    """Per bucket: the best plan's time next to eager and torch.compile, each as median
    ±half the IQR, and the speed-ups, marked where a rerun may not agree; then the plan's
    call alone and waited for (what a loop needing each result sees), where measured."""
    w = max([9, *(len(r.best.strategy) for r in results if r.best is not None)])
    names = [_name(r, dims) for r in results]
    b = max([16, *map(len, names)])
    head = (
        f"{'bucket':<{b}} {'plan':<{w}} {'groups':>6} {'plan':>16} {'eager':>16} "
        f"{'compile':>16} {'vs eager':>9} {'vs compile':>10} {'fell back':>9} {'one call':>9}"
    )
    lines = [f"tuned {label} on {device}; plans in {cache_url}", head, "-" * len(head)]
    flagged = False
    for i, (r, name) in enumerate(zip(results, names)):
        rows, unstable = _row_lines(r, name, b, w)
        lines += rows
        flagged |= unstable
        if r.part and (i + 1 == len(results) or results[i + 1].bucket != r.bucket):
            line, unstable = _whole_line(r)  # after the last graph of a bucket
            lines.append(line)
            flagged |= unstable
    lines.append(
        "times: median ±half the interquartile range; plan: calls back to back through the "
        "serving path; one call: the plan's call alone, waited for (the wall clock)"
    )
    if flagged:
        lines.append(fmt.UNSTABLE_NOTE)
    return "\n".join(lines)


def _whole_line(r: BucketResult) -> tuple[str, bool]:
    """A model with graph breaks: the whole model served through the backend, against
    eager, under its graphs' rows; and whether a figure in it is marked unstable."""
    if r.model_served is None or r.model_eager is None:
        why = r.model_note or "no plan of its graphs is in a cache"
        return f"{'':<4}whole model through the backend: not timed ({why})", False
    note = f"; {r.model_note}" if r.model_note else ""
    cells = [
        fmt.timing(r.model_served),
        fmt.timing(r.model_eager),
        fmt.speedup(r.model_eager, r.model_served),
    ]
    line = (
        f"{'':<4}whole model through the backend: {cells[0]}, eager {cells[1]}, {cells[2]} vs"
        f" eager (the Python between its graphs included){note}"
    )
    return line, any(fmt.UNSTABLE_MARK in c for c in cells)


def _row_lines(r: BucketResult, name: str, b: int, w: int) -> tuple[list[str], bool]:
    """One result's row and the lines under it (fallbacks, eager's win, storage, TP), and
    whether a figure in it is marked unstable."""
    best = r.best
    if best is None or r.eager is None:
        return [f"{name:<{b}} {'(none)':<{w}}  {r.stored}"], False
    t = best.measured
    cells = [fmt.timing(t), fmt.timing(r.eager), fmt.timing(r.compiled)]
    ups = [fmt.speedup(r.eager, t), fmt.speedup(r.compiled, t)]
    whole = best.measurement
    alone = "-" if whole is None or math.isnan(whole.synced_s) else fmt.time_s(whole.synced_s)
    lines = [
        f"{name:<{b}} {best.strategy:<{w}} {len(best.partition):>6} {cells[0]:>16} "
        f"{cells[1]:>16} {cells[2]:>16} {ups[0]:>9} {ups[1]:>10} {len(best.fallbacks):>9}"
        f" {alone:>9}"
    ]
    for g, why in best.fallbacks.items():  # one short reason per group
        lines.append(f"{'':<4}group {g} runs eagerly: {short_reason(why, 100)}")
    if best.strategy == "eager":  # what the candidates measured, beaten by eager
        lost = [
            f"{c.strategy} {fmt.timing(c.measured)}"
            for c in r.candidates
            if c.measured is not None and c.strategy != "eager"
        ]
        lines.append(
            f"{'':<4}eager beat every candidate ({', '.join(lost)}): the unfused plan is "
            "stored (--keep-fused stores the fastest candidate)"
        )
    if r.stored.startswith("NOT stored"):
        lines.append(f"  {r.stored}")
    if r.tensor_parallel:  # a rank program's decision: measured, or said it was not
        lines.append(f"  {r.tensor_parallel}")
    return lines, any(fmt.UNSTABLE_MARK in c for c in cells + ups)
