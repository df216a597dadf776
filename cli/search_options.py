"""Search options shared by `fusion-plan plan` (and the coming `tune`): Optuna trials,
study storage, worker processes, the shape bucket naming the study.

    fusion-plan plan --strategy tpe --trials 300 --storage journal --workers 4 --bucket S=512

`--storage` and `--workers` apply to the Optuna strategies (tpe, nsga2): N local processes
share the study of (graph, bucket) in the storage (search/parallel.py), then this process
joins it for one trial and answers with the study's best plan.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.errors import FusionPlannerError
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.optuna_storage import check_storage
from search.parallel import OPTUNA_STRATEGIES, tune_parallel
from search.strategies import get_strategy
from search.strategy import Budget, SearchResult


def strategy_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Constructor options of the chosen strategy from the command line."""
    if args.strategy.startswith("joint-") and not args.storage and args.workers == 1:
        return {"max_trials": args.trials} if args.trials is not None else {}
    if args.strategy not in OPTUNA_STRATEGIES:
        if args.storage or args.workers != 1 or args.trials is not None:
            raise FusionPlannerError(
                f"--trials, --storage and --workers apply to {', '.join(OPTUNA_STRATEGIES)}, "
                f"not to {args.strategy!r}"
            )
        return {}
    check_storage(args.storage)  # a bad storage is an error, not an unfused plan
    kw: dict[str, Any] = {"storage": args.storage, "bucket_id": args.bucket}
    if args.trials is not None:
        kw["max_trials"] = args.trials
    return kw


def run_search(
    args: argparse.Namespace, graph: OpGraph, objective: Objective, budget: Budget
) -> SearchResult:
    """Plan `graph` with the chosen strategy, in `--workers` processes when asked."""
    kw = strategy_kwargs(args)
    if args.workers > 1:
        tune_parallel(
            graph,
            objective,
            n_workers=args.workers,
            storage_url=args.storage,
            bucket_id=args.bucket,
            trials_per_worker=args.trials or 50,
            strategy=args.strategy,
            budget=budget,
            seed=args.seed,
        )
        kw["max_trials"] = 1  # join the study for one trial, answer with its best
    return get_strategy(args.strategy, **kw).plan(graph, objective, budget, args.seed)
