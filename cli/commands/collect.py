"""`fusion-plan collect`: measure groups and plans across zoo graphs into a Parquet dataset."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

import zoo
from cli.common import (
    add_device_arg,
    add_threads_arg,
    check_local_device,
    nonneg_int,
    positive_float,
    positive_int,
)
from learned_cost.analytical import AnalyticalModel
from planner import progress
from planner.errors import FusionPlannerError
from planner.hardware import get_spec
from profiling.collector import CollectConfig, Collector
from search.cost_models import cost_model_arg, cost_model_for
from search.planning import plan_maker


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect", help="measure groups and whole plans on this device into data/*.parquet"
    )
    p.add_argument(
        "--models",
        default="all",
        help="comma-separated model specs (zoo:name,...) or 'all' for the whole zoo",
    )
    p.add_argument(
        "--shapes",
        default="auto",
        help="';'-separated shape specs applied to every model (a model lacking a parameter "
        "is skipped for that shape), or 'auto' for each model's built-in sweep",
    )
    p.add_argument("--dtypes", default="fp32", help="comma-separated: fp32,bf16,fp16")
    p.add_argument("--groups-per-graph", type=nonneg_int, default=12, help="random legal groups")
    p.add_argument(
        "--random-plans", type=nonneg_int, default=2, help="random whole plans per graph"
    )
    p.add_argument(
        "--strategies", default="greedy,priority", help="strategies whose plans are measured"
    )
    p.add_argument(
        "--learned",
        type=cost_model_arg,
        default=None,
        metavar="MODEL.json",
        help="also measure each strategy's plan under this learned cost model (named "
        "STRATEGY@learned): candidates that each model thinks best, to rank",
    )
    p.add_argument(
        "--plans",
        default=None,
        metavar="FILE.json",
        help='more plans to measure, with their groups: {"plans": [{"graph_key": ..., '
        '"strategy": ..., "groups": [[node, ...], ...]}, ...]} (benchmarks/heldout_plans.py '
        "writes one)",
    )
    p.add_argument("--out", required=True, help="Parquet file, e.g. data/h100_profiles.parquet")
    p.add_argument("--resume", action="store_true", help="add to --out, skipping known keys")
    p.add_argument(
        "--max-seconds", type=positive_float, default=None, help="stop (cleanly) after this"
    )
    p.add_argument("--workers", type=nonneg_int, default=0, help="compile-warming processes")
    p.add_argument(
        "--time-beside-compiles",
        action="store_true",
        help="with --workers: start timing while workers still compile (faster, noisier; "
        "by default every graph is compiled first)",
    )
    add_device_arg(p, measures=True)
    add_threads_arg(p)
    p.add_argument("--max-jobs", type=positive_int, default=None, help="at most this many graphs")
    p.add_argument("--no-singles", action="store_true", help="skip single-op groups")
    p.add_argument(
        "--no-plan-groups",
        action="store_true",
        help="do not time the random plans' groups alone (by default every plan's groups are)",
    )
    p.add_argument(
        "--no-strategy-groups",
        action="store_true",
        help="do not time the groups of the strategies' and --plans plans alone (a run that "
        "only re-times whole plans)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    models = (
        [f"zoo:{n}" for n in zoo.ZOO]
        if args.models == "all"
        else [m.strip() for m in args.models.split(",") if m.strip()]
    )
    shapes = None if args.shapes == "auto" else [s.strip() for s in args.shapes.split(";")]
    spec = get_spec(check_local_device(args))
    # The dataset's `analytical_s` column and the strategies' plans are the analytical
    # model's by definition (learned_cost trains a correction of it), whatever the default.
    cost_model = AnalyticalModel(spec)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    makers = {name: plan_maker(name, cost_model) for name in strategies}
    if args.learned:
        learned = cost_model_for(args.learned, spec.name)
        if isinstance(learned, AnalyticalModel):  # it warned why; its plans are the above
            print(f"collect: --learned {args.learned} not used", file=sys.stderr)
        else:
            makers |= {f"{name}@learned": plan_maker(name, learned) for name in strategies}
    extra = read_plans(args.plans) if args.plans else {}
    cfg = CollectConfig(
        models=models,
        shapes=shapes,
        dtypes=[d.strip() for d in args.dtypes.split(",") if d.strip()],
        groups_per_graph=args.groups_per_graph,
        random_plans=args.random_plans,
        singles=not args.no_singles,
        plan_groups=not args.no_plan_groups,
        strategy_groups=not args.no_strategy_groups,
        extra_plans=extra,
        out=args.out,
        resume=args.resume,
        max_seconds=args.max_seconds,
        workers=args.workers,
        warm_first=not args.time_beside_compiles,
        threads=args.threads,
        max_jobs=args.max_jobs,
        seed=args.seed,
    )

    # `timeout` sends SIGTERM: unwind like Ctrl-C, so the rows measured so far are flushed.
    signal.signal(signal.SIGTERM, _interrupt)

    summary = Collector(cfg, cost_model, makers, progress.say).run()
    for e in summary.errors[:20]:
        print(f"note: {e}", file=sys.stderr)
    return 0


def read_plans(path: str) -> dict[str, list[tuple[str, list[list[int]]]]]:
    """A --plans file: graph_key -> [(strategy, groups)]; a clear error if malformed."""
    try:
        entries = json.loads(Path(path).read_text())["plans"]
        out: dict[str, list[tuple[str, list[list[int]]]]] = {}
        for e in entries:
            groups = [[int(i) for i in g] for g in e["groups"]]
            out.setdefault(str(e["graph_key"]), []).append((str(e["strategy"]), groups))
        return out
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FusionPlannerError(
            f"--plans {path}: not a plans file ({type(e).__name__}: {e}); expected "
            '{"plans": [{"graph_key": ..., "strategy": ..., "groups": [[...], ...]}]}'
        ) from e


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
