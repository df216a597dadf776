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
    check_local_device,
)
from learned_cost.analytical import AnalyticalModel
from planner import progress
from planner.errors import FusionPlannerError
from planner.hardware import get_spec
from profiling.collector import CollectConfig, Collector
from search.cost_models import cost_model_for
from search.planning import plan_maker


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
