"""N local worker processes searching one shared Optuna study of (graph, bucket).

    results = tune_parallel(graph, objective, n_workers=4, storage_url="journal:/tmp/s.log",
                            bucket_id="S=512", trials_per_worker=50, strategy="tpe")

Each worker is a fresh process (spawn) that builds the same encoding (it is deterministic
for a graph and cost model), opens the same study by name (search/optuna_storage.py) and
runs the strategy with its own sampler seed (seed + worker index). The study is the
meeting point: every worker's sampler sees every trial so far, and each worker answers
with the study's best, whoever found it. The fleet version is the same call on many
machines with a database URL instead of a journal file.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from planner.errors import FusionPlannerError
from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.optuna_storage import (
    GRACE_PERIOD_S,
    UNREACHABLE,
    fail_trials_of_dead_workers,
    run_workers,
    storage_kind,
    study_prefix,
)
from search.strategies import get_strategy
from search.strategy import Budget, SearchResult

log = logging.getLogger(__name__)

OPTUNA_STRATEGIES = ("tpe", "nsga2")


@dataclass(frozen=True)
class WorkerResult:
    """What one worker process reports back."""

    worker: int
    pid: int
    groups: tuple[tuple[int, ...], ...]  # its answer (the study's best when it finished)
    total_s: float
    evals_used: int
    seconds: float
    notes: str

    def partition(self, graph: OpGraph) -> Partition:
        return Partition.from_groups(graph, self.groups)


STORAGE_OUTAGE_S = 120.0  # how long a search waits for its study's database to come back


def _storage_lost(e: BaseException) -> bool:
    """A database error (the server restarted, a connection dropped), not a bug."""
    lost = ("OperationalError", "InterfaceError", "DisconnectionError", "StorageInternalError")
    return any(type(c).__name__ in lost for c in (e, e.__cause__, e.__context__) if c)


def plan_through_outages(
    strategy: str,
    kwargs: dict[str, Any],
    graph: OpGraph,
    objective: Objective,
    budget: Budget | None,
    seed: int,
    *,
    outage_s: float = STORAGE_OUTAGE_S,
) -> SearchResult:
    """`get_strategy(strategy, **kwargs).plan(...)`, started again on the same study when
    its database goes away mid-search, for up to `outage_s` of outage: the trials already
    stored are kept; the trial this process was running when the database went away is
    failed (and queued again) once the search is done, so no trial of this process is left
    RUNNING in the study."""
    deadline = time.monotonic() + outage_s
    outage = False
    while True:
        try:
            res = get_strategy(strategy, **kwargs).plan(graph, objective, budget, seed=seed)
        except Exception as e:
            if not _storage_lost(e) or time.monotonic() > deadline:
                raise
            log.warning("study storage unreachable (%s: %s); retrying", type(e).__name__, e)
            outage = True
            time.sleep(1.0)
            continue
        if UNREACHABLE in res.notes and time.monotonic() < deadline:  # down when opened
            log.warning("study storage unreachable (%s); retrying", res.notes[:300])
            outage = True
            time.sleep(1.0)
            continue
        if outage:  # this process runs one trial at a time: any still RUNNING is orphaned
            bucket = kwargs.get("bucket_id", "adhoc")
            prefix = study_prefix(graph, bucket)
            fail_trials_of_dead_workers(kwargs.get("storage"), {os.getpid()}, prefix)
        return res


def _worker(
    index: int,
    graph: OpGraph,
    objective: Objective,
    strategy: str,
    storage_url: str,
    bucket_id: str,
    trials: int,
    budget: Budget | None,
    seed: int,
    heartbeat_s: int | None = None,
) -> WorkerResult:
    """One worker process: its own strategy instance on the shared study."""
    kwargs: dict[str, Any] = dict(
        storage=storage_url, bucket_id=bucket_id, max_trials=trials, patience=trials
    )
    if heartbeat_s is not None:
        kwargs["heartbeat_s"] = heartbeat_s
    r = plan_through_outages(strategy, kwargs, graph, objective, budget, seed + index)
    return WorkerResult(
        index,
        os.getpid(),
        tuple(tuple(sorted(g)) for g in r.partition.groups),
        r.total_s,
        r.evals_used,
        r.seconds,
        r.notes,
    )


def tune_parallel(
    graph: OpGraph,
    objective: Objective,
    *,
    n_workers: int,
    storage_url: str,
    bucket_id: str = "adhoc",
    trials_per_worker: int = 50,
    strategy: str = "tpe",
    budget: Budget | None = None,
    seed: int = 0,
    heartbeat_s: int | None = None,
) -> list[WorkerResult]:
    """Run `n_workers` processes on the study of (graph, bucket) in `storage_url`; one
    result per worker that finished, in worker order (a worker that died is left out,
    search.optuna_storage.run_workers). Pick the best with min(..., key=total_s)."""
    if strategy not in OPTUNA_STRATEGIES:
        raise FusionPlannerError(
            f"--workers shares an Optuna study: use --strategy {' or '.join(OPTUNA_STRATEGIES)}, "
            f"not {strategy!r}"
        )
    storage_kind(storage_url)  # a clear error for a malformed URL before any process starts
    args = (
        graph,
        objective,
        strategy,
        storage_url,
        bucket_id,
        trials_per_worker,
        budget,
        seed,
        heartbeat_s,
    )
    # the workers' heartbeat grace period (search.optuna_search sets it to 3 intervals)
    grace = 3 * heartbeat_s if heartbeat_s is not None else GRACE_PERIOD_S
    return run_workers(
        n_workers,
        _worker,
        args,
        storage_url=storage_url,
        grace_s=grace,
        studies=study_prefix(graph, bucket_id),
    )
