"""`fusion-plan tune`: the offline tuning job over shape buckets (search/tune.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from learned_cost.analytical import AnalyticalModel
from learned_cost.corrected import load_corrected
from planner.cache import PlanCache
from planner.hardware import get_spec, local_device_name
from planner.modelspec import dtype_name, parse_dtype, resolve
from planner.realize_check import short_reason
from search.cli_common import Resolved, capture_for_planning, emit, positive_float, positive_int
from search.report_graph import require_dot
from search.report_html import check_writable, job_from_tune, write_report
from search.strategies import STRATEGIES
from search.tune import BucketResult, TuneConfig, bucket_spec, tune


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="search, realize and measure plans per shape bucket; cache them"
    )
    p.add_argument("--model", default="zoo:transformer-block", help="zoo:<name> or file.py:fn")
    p.add_argument("--shape", default="", help="fixed shape parameters, e.g. B=8,D=768,H=12")
    p.add_argument("--dynamic", default="S=128..1024", help="dynamic dims, e.g. S=128..4096")
    p.add_argument("--buckets", default="pow2", help="bucket policy: pow2 | edges:a,b,c | learned")
    p.add_argument("--strategy", default="tpe", choices=sorted(STRATEGIES))
    p.add_argument("--budget-evals", type=positive_int, default=None, help="objective evaluations")
    p.add_argument(
        "--budget-seconds", type=positive_float, default=30.0, help="search seconds per bucket"
    )
    p.add_argument("--trials", type=positive_int, default=None, help="Optuna trials (tpe, nsga2)")
    p.add_argument("--top-k", type=positive_int, default=3, help="candidates realized and measured")
    p.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16 (default: bf16 on GPU)")
    p.add_argument("--cache", default=None, help="plan cache URL (default: SQLite, user cache)")
    p.add_argument(
        "--storage",
        default=None,
        help="Optuna storage: sqlite[:path] | journal[:path] | a database URL",
    )
    p.add_argument(
        "--heartbeat",
        type=positive_int,
        default=None,
        metavar="SECONDS",
        help="database storages: trial heartbeat interval; a worker silent for 3 intervals "
        "has its trial failed and retried (default: 60)",
    )
    p.add_argument(
        "--workers", type=positive_int, default=1, help="local worker processes per study"
    )
    p.add_argument(
        "--cost-model",
        default=None,
        help="a trained learned_cost model (.json), 'realized' (the default: the roofline "
        "per kernel the realizer launches) or 'analytical' (the ideal fused roofline)",
    )
    p.add_argument(
        "--cost-model-out", default=None, help="save the online-updated learned model here"
    )
    p.add_argument(
        "--from-queue", action="store_true", help="only the buckets the runtime queued as misses"
    )
    p.add_argument(
        "--no-compile-baseline", action="store_true", help="skip timing torch.compile per bucket"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument(
        "--report",
        default=None,
        metavar="FILE.html",
        help="also write an HTML report: timings per bucket, a roofline, each plan drawn "
        "(needs Graphviz's dot)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.report:  # said before the search and measurements, not after them
        require_dot()
        check_writable(args.report)
    device = local_device_name()
    gpu = device != "cpu"
    dtype = parse_dtype(args.dtype or ("bf16" if gpu else "fp32"))
    spec = resolve(args.model, args.shape)
    if args.cost_model in (None, "realized"):
        from learned_cost.realized import RealizedRoofline

        cost_model = RealizedRoofline(get_spec(device))
    elif args.cost_model == "analytical":
        cost_model = AnalyticalModel(get_spec(device))
    else:
        cost_model = load_corrected(args.cost_model, device)
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
    )
    with PlanCache(args.cache) as cache:
        only = None
        if args.from_queue:
            only = _queued_buckets(cache, cfg)
        results = tune(cfg, cost_model, cache, only_buckets=only)
        if args.cost_model_out and hasattr(cost_model, "save"):
            cost_model.save(args.cost_model_out)
        label = _label(spec, args.dynamic)
        emit(
            args,
            {
                "model": label,
                "device": device,
                "dtype": str(dtype),
                "cache": cache.url,
                "buckets": [_row(r) for r in results],
            },
            _table(label, device, cache.url, results),
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
    ok = all(r.plan is not None and not r.stored.startswith("NOT stored") for r in results)
    return 0 if ok else 1


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
    key = capture_for_planning(resolved).graph.structure_key  # the runtime's key
    return {b.key for b, _count in cache.pending_buckets(key, bucket_spec(cfg))}


def _row(r: BucketResult) -> dict[str, Any]:
    best = r.best
    return {
        "bucket": r.bucket.key,
        "params": r.params,
        "plan": r.plan.to_json() if r.plan else None,
        "eager_s": r.eager.median_s if r.eager else None,
        "compile_s": r.compiled.median_s if r.compiled else None,
        "best_s": best.measured.median_s if best else None,
        "best_strategy": best.strategy if best else None,
        "candidates": [
            {
                "strategy": c.strategy,
                "groups": len(c.partition),
                "predicted_s": c.predicted_s,
                "measured_s": c.measured.median_s if c.measured else None,
                "error": c.error,
                "fallbacks": {str(g): why for g, why in c.fallbacks.items()},
            }
            for c in r.candidates
        ],
        "search_s": r.search_s,
        "realize_s": r.realize_s,
        "stored": r.stored,
    }


def _table(label: str, device: str, cache_url: str, results: list[BucketResult]) -> str:
    head = (
        f"{'bucket':<28} {'plan':<10} {'groups':>6} {'plan us':>9} {'eager us':>9} "
        f"{'compile us':>10} {'vs eager':>8} {'vs compile':>10} {'fell back':>9}"
    )
    lines = [f"tuned {label} on {device}; plans in {cache_url}", head, "-" * len(head)]
    for r in results:
        best = r.best
        comp = r.compiled.median_s if r.compiled else None
        if best is None or r.eager is None:
            lines.append(f"{r.bucket.key:<28} {'(none)':<10}  {r.stored}")
            continue
        t = best.measured.median_s
        comp_us = f"{comp * 1e6:10.1f}" if comp else f"{'-':>10}"
        vs_comp = f"{comp / t:9.2f}x" if comp else f"{'-':>10}"
        lines.append(
            f"{r.bucket.key:<28} {best.strategy:<10} {len(best.partition):>6} {t * 1e6:9.1f} "
            f"{r.eager.median_s * 1e6:9.1f} {comp_us} {r.eager.median_s / t:7.2f}x {vs_comp} "
            f"{len(best.fallbacks):>9}"
        )
        for g, why in best.fallbacks.items():  # one short reason per group
            lines.append(f"{'':<4}group {g} runs eagerly: {short_reason(why, 100)}")
        if r.stored.startswith("NOT stored"):
            lines.append(f"  {r.stored}")
    return "\n".join(lines)
