"""Where Optuna studies live, one per (graph, shape bucket), and local worker processes.

Storage by URL (`--storage` on the command line):

| URL                          | backend                                   | for                     |
|------------------------------|-------------------------------------------|-------------------------|
| none, "memory"               | in-memory                                 | one quick run (default) |
| "sqlite", "sqlite:///path"   | RDB on SQLite (default file in the cache) | one `tune` process      |
| "journal", "journal:/path"   | journal file (JournalFileBackend)         | N local processes       |
| "postgresql://..." and other | RDB with heartbeats                       | many machines           |

Why not SQLite for parallel workers: Optuna advises against it (SQLite locks the whole
file per write; concurrent writers time out), and its journal file storage is made for
several processes on one machine (appends under a file lock). Across machines an RDB
server (PostgreSQL) is the shared store; heartbeats mark the trials of a worker that died
as failed after `grace_period_s`, and `RetryFailedTrialCallback` gives them to another
worker. Heartbeats only run inside `Study.optimize`, which is why the search loop
(search/optuna_search.py) uses it rather than ask/tell.

One study per (graph, bucket): the name carries the graph's structure key, the bucket id
and a signature of everything that makes trials comparable (graph key, cost model,
decisions, directions), so a changed cost model or encoding starts a fresh study instead
of mixing incomparable values into an old one.

Optuna is imported only here and by the modules that search with it: the GPU machine has
no optuna, and `search.strategies` must import (and plan with `priority`) without it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import multiprocessing
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from planner.errors import FusionPlannerError
from planner.hardware import cache_dir
from planner.ir import OpGraph

try:
    import optuna
except ImportError:  # the GPU machine: every use raises the error below
    optuna = None  # type: ignore[assignment]

NEEDS_OPTUNA = (
    "optuna is not installed; pip install optuna (needed by the tpe and nsga2 strategies)"
)
DEFAULT_SQLITE = "fusion-planner-studies.sqlite3"
DEFAULT_JOURNAL = "fusion-planner-studies.journal"
HEARTBEAT_INTERVAL_S = 60
GRACE_PERIOD_S = 180
MAX_RETRY = 3

R = TypeVar("R")


def require_optuna() -> Any:
    """The optuna module, or a FusionPlannerError saying how to get it.

    Optuna's own INFO line per trial is turned down to warnings: the search loop logs its
    own progress (trials, best so far vs priority) every few seconds instead."""
    if optuna is None:
        raise FusionPlannerError(NEEDS_OPTUNA)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def storage_kind(url: str | None) -> str:
    """ "memory" | "sqlite" | "journal" | "rdb" for a `--storage` value."""
    if url is None or url in ("", "memory", ":memory:"):
        return "memory"
    if url == "sqlite" or url.startswith("sqlite:"):
        return "sqlite"
    if url == "journal" or url.startswith("journal:") or url.endswith((".journal", ".log")):
        return "journal"
    if "://" in url:
        return "rdb"
    raise FusionPlannerError(
        f"storage {url!r} is not a known form: expected memory, sqlite[:///path], "
        "journal[:path] or a database URL such as postgresql://user@host/db"
    )


def make_storage(
    url: str | None,
    *,
    heartbeat: bool | None = None,
    heartbeat_interval_s: int = HEARTBEAT_INTERVAL_S,
    grace_period_s: int = GRACE_PERIOD_S,
) -> Any:
    """An Optuna storage for `url` (see the module table). `heartbeat` (default: on for a
    database server, off for SQLite) marks a dead worker's running trials failed after
    `grace_period_s` and retries them up to MAX_RETRY times."""
    opt = require_optuna()
    kind = storage_kind(url)
    if kind == "memory":
        return opt.storages.InMemoryStorage()
    if kind == "journal":
        assert url is not None
        path = url.split(":", 1)[1] if url.startswith("journal:") else url
        if url == "journal" or not path:
            path = str(cache_dir() / DEFAULT_JOURNAL)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return opt.storages.JournalStorage(opt.storages.journal.JournalFileBackend(path))
    assert url is not None
    if url == "sqlite":
        url = f"sqlite:///{cache_dir() / DEFAULT_SQLITE}"
    engine = {"connect_args": {"timeout": 30}} if kind == "sqlite" else None
    if not (kind == "rdb" if heartbeat is None else heartbeat):
        return opt.storages.RDBStorage(url, engine_kwargs=engine)
    # Optuna 4.9 renamed the stale-trial callback; both names do the same (retry the trial).
    params = inspect.signature(opt.storages.RDBStorage).parameters
    new_api = "heartbeat_stale_trial_callback" in params
    key = "heartbeat_stale_trial_callback" if new_api else "failed_trial_callback"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", opt.exceptions.ExperimentalWarning)
        retry = getattr(opt.storages, "RetryHeartbeatStaleTrialCallback", None)
        retry = (retry if new_api and retry else opt.storages.RetryFailedTrialCallback)(
            max_retry=MAX_RETRY
        )
        return opt.storages.RDBStorage(
            url,
            engine_kwargs=engine,
            heartbeat_interval=heartbeat_interval_s,
            grace_period=grace_period_s,
            **{key: retry},
        )


def study_name(graph: OpGraph, bucket_id: str, signature: str = "") -> str:
    """The study of (graph, bucket); `signature` separates incomparable settings."""
    sig = hashlib.sha256(f"{graph.key}|{signature}".encode()).hexdigest()[:10]
    return f"fusion-plan/{graph.structure_key}/{bucket_id}/{sig}"


def open_study(
    graph: OpGraph,
    bucket_id: str,
    storage_url: str | None = None,
    directions: Sequence[str] = ("minimize",),
    *,
    sampler: Any = None,
    pruner: Any = None,
    signature: str = "",
    storage: Any = None,
) -> Any:
    """Create or load the study of (graph, bucket) in `storage_url` (or a ready `storage`).

    The study records what it is about (graph, bucket, signature) as user attributes, for
    people listing a shared database.
    """
    opt = require_optuna()
    store = storage if storage is not None else make_storage(storage_url)
    name = study_name(graph, bucket_id, signature)
    study = opt.create_study(
        storage=store,
        sampler=sampler,
        pruner=pruner,
        study_name=name,
        directions=list(directions),
        load_if_exists=True,
    )
    if "graph_key" not in study.user_attrs:
        study.set_user_attr("graph_key", graph.key)
        study.set_user_attr("graph_name", graph.name)
        study.set_user_attr("bucket_id", bucket_id)
        study.set_user_attr("signature", signature)
    return study


def signature_of(*parts: Any) -> str:
    """A short digest of the settings that make two studies' trials comparable."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_workers(
    n_workers: int, target: Callable[..., R], args: Sequence[Any] = (), *, storage_url: str | None
) -> list[R]:
    """Run `target(worker_index, *args)` in `n_workers` fresh local processes; their
    results in worker order. `target` must be a module-level function (it is imported
    by name in each process). Refuses storages that processes cannot share."""
    if n_workers < 1:
        raise FusionPlannerError(f"--workers must be >= 1, got {n_workers}")
    kind = storage_kind(storage_url)
    if n_workers > 1 and kind == "memory":
        raise FusionPlannerError(
            "several worker processes cannot share an in-memory study: pass --storage "
            "journal (local processes) or a database URL"
        )
    if n_workers > 1 and kind == "sqlite":
        raise FusionPlannerError(
            "Optuna advises against SQLite with parallel workers (whole-file locks): use "
            "--storage journal[:path] for local processes or postgresql://... for a fleet"
        )
    if n_workers == 1:
        return [target(0, *args)]
    ctx = multiprocessing.get_context("spawn")  # no forked torch/optuna/SQL state
    try:
        with ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx) as pool:
            futures = [pool.submit(target, i, *args) for i in range(n_workers)]
            return [f.result() for f in futures]
    except FusionPlannerError:
        raise
    except Exception as e:
        raise FusionPlannerError(f"a worker process failed: {type(e).__name__}: {e}") from e
