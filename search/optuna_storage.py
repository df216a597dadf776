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
as failed after `grace_period_s` (also one that died before its trial's first heartbeat:
`HeartbeatStorage`), and `RetryFailedTrialCallback` gives them to another worker.
Heartbeats only run inside `Study.optimize`, which is why the search loop
(search/optuna_search.py) uses it rather than ask/tell.

One study per (graph, bucket): the name carries the graph's structure key, the bucket id
and a signature of everything that makes trials comparable (graph key, cost model,
decisions, directions), so a changed cost model or encoding starts a fresh study instead
of mixing incomparable values into an old one.

Optuna is imported only here and by the modules that search with it: the GPU machine has
no optuna, and `search.strategies` must import (and plan with `priority`) without it.
"""

from __future__ import annotations

import datetime
import hashlib
import inspect
import json
import logging
import multiprocessing
import multiprocessing.connection as mp_connection
import os
import socket
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from planner.errors import FusionPlannerError, first_line
from planner.hardware import cache_dir
from planner.ir.graph import OpGraph

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

UNREACHABLE = "cannot reach Optuna storage"  # the server did not answer (search.parallel retries)
R = TypeVar("R")
log = logging.getLogger(__name__)


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


def check_storage(url: str | None) -> None:
    """Refuse a `--storage` that does not parse or cannot be opened, with a message
    saying what would work, before any search starts (a search whose storage fails
    would otherwise hand back the unfused plan, and the baselines would win silently)."""
    kind = storage_kind(url)
    if kind in ("sqlite", "rdb"):
        assert url is not None
        if url != "sqlite":
            try:
                import sqlalchemy as sa

                sa.engine.make_url(url)
            except ImportError:
                pass  # make_storage below says what to install
            except Exception as e:
                raise FusionPlannerError(
                    f"storage {url!r} is not a database URL ({e}): expected e.g. "
                    "sqlite:////abs/path.db, sqlite:///rel/path.db or "
                    "postgresql+psycopg://user@host/db"
                ) from e
    make_storage(url)  # opens it (creates the tables of a new database): errors are clear


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
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            return opt.storages.JournalStorage(opt.storages.journal.JournalFileBackend(path))
        except OSError as e:
            raise FusionPlannerError(f"cannot open the journal storage {path}: {e}") from e
    assert url is not None
    if url == "sqlite":
        url = f"sqlite:///{cache_dir() / DEFAULT_SQLITE}"
    # pool_pre_ping: a connection the server dropped (a restart) is replaced, not used.
    engine: dict[str, Any] = {"pool_pre_ping": True}
    if kind == "sqlite":
        engine["connect_args"] = {"timeout": 30}
    try:
        return _rdb_storage(opt, url, kind, engine, heartbeat, heartbeat_interval_s, grace_period_s)
    except FusionPlannerError:
        raise
    except Exception as e:  # a URL that does not parse, a missing driver, a server down
        first = first_line(e)
        down = type(e).__name__ in ("OperationalError", "InterfaceError")
        raise FusionPlannerError(
            f"{UNREACHABLE if down else 'cannot open Optuna storage'} {_safe(url)}: "
            f"{type(e).__name__}: {first} (check the URL and that the server is up; "
            "pip install 'fusion-planner[fleet]' for postgresql)"
        ) from e


def _safe(url: str) -> str:
    """`url` with its password hidden."""
    head, at, tail = url.rpartition("@")
    if not at or "://" not in head:
        return url
    scheme, _, cred = head.partition("://")
    user = cred.split(":", 1)[0]
    return f"{scheme}://{user}:***@{tail}" if ":" in cred else url


def _rdb_storage(
    opt: Any,
    url: str,
    kind: str,
    engine: dict[str, Any],
    heartbeat: bool | None,
    heartbeat_interval_s: int,
    grace_period_s: int,
) -> Any:
    if not (kind == "rdb" if heartbeat is None else heartbeat):
        return opt.storages.RDBStorage(url, engine_kwargs=engine)
    # Optuna 4.9 renamed the stale-trial callback; both names do the same (retry the trial).
    params = inspect.signature(opt.storages.RDBStorage).parameters
    new_api = "heartbeat_stale_trial_callback" in params
    key = "heartbeat_stale_trial_callback" if new_api else "failed_trial_callback"
    retry = _retry_callback(opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", opt.exceptions.ExperimentalWarning)
        return HeartbeatStorage(
            url,
            engine_kwargs=engine,
            heartbeat_interval=heartbeat_interval_s,
            grace_period=grace_period_s,
            **{key: retry},
        )


if optuna is not None:

    class HeartbeatStorage(optuna.storages.RDBStorage):
        """Optuna's RDB storage with heartbeats, whose stale-trial sweep also covers RUNNING
        trials that have no heartbeat yet (Optuna's own passes over them): it gives each one
        a heartbeat as it first sees it. A live worker keeps that heartbeat fresh; the trial
        of a worker that died before its first heartbeat goes stale after the grace period
        and is failed and retried once, like any other. Assumes every worker of the database
        beats (`make_storage` turns heartbeats on for database servers)."""

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            for trial_id in self.trials_without_heartbeat(study_id):
                self.record_heartbeat(trial_id)  # racing its worker's first beat: one insert stays
            return super()._get_stale_trial_ids(study_id)

        def trials_without_heartbeat(self, study_id: int) -> list[int]:
            """The ids of the study's RUNNING trials that have no heartbeat yet."""
            from optuna.storages._rdb import models

            trial, beat = models.TrialModel, models.TrialHeartbeatModel
            session = self.scoped_session()
            try:
                rows = (
                    session.query(trial.trial_id)
                    .outerjoin(beat, beat.trial_id == trial.trial_id)
                    .filter(trial.study_id == study_id)
                    .filter(trial.state == optuna.trial.TrialState.RUNNING)
                    .filter(beat.trial_id.is_(None))
                    .all()
                )
            finally:
                session.close()
            return [row[0] for row in rows]


def study_name(graph: OpGraph, bucket_id: str, signature: str = "") -> str:
    """The study of (graph, bucket); `signature` separates incomparable settings."""
    sig = hashlib.sha256(f"{graph.key}|{signature}".encode()).hexdigest()[:10]
    return f"{study_prefix(graph, bucket_id)}{sig}"


def study_prefix(graph: OpGraph, bucket_id: str) -> str:
    """What the names of every study of (graph, bucket) begin with, whatever the settings."""
    return f"fusion-plan/{graph.structure_key}/{bucket_id}/"


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
    n_workers: int,
    target: Callable[..., R],
    args: Sequence[Any] = (),
    *,
    storage_url: str | None,
    grace_s: float = GRACE_PERIOD_S,
    studies: str = "",
) -> list[R]:
    """Run `target(worker_index, *args)` in `n_workers` fresh local processes; the results
    of the workers that finished, in worker order. `target` must be a module-level
    function (it is imported by name in each process). Refuses storages that processes
    cannot share.

    A worker that dies (killed, out of memory) or raises does not take the others down:
    they finish, its running trials are failed and queued again for the study
    (`fail_trials_of_dead_workers`), and a warning says what happened. Only when no
    worker finished is it an error. When they have all ended, trials they left RUNNING
    without a live owner are failed and queued too (`fail_abandoned_trials`, `grace_s`:
    the job's heartbeat grace period). Both sweeps look only at the studies whose names
    begin with `studies` (the job's own, `study_prefix`; "" for every study)."""
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
    pipes = [ctx.Pipe(duplex=False) for _ in range(n_workers)]
    procs = [
        ctx.Process(target=_child, args=(send, target, i, tuple(args)))
        for i, (_recv, send) in enumerate(pipes)
    ]
    for p in procs:
        p.start()
    for _recv, send in pipes:
        send.close()  # the parent's copy: a dead child's pipe then reads as closed
    outcomes: dict[int, tuple[str, Any]] = {}
    try:
        _collect(procs, [r for r, _ in pipes], outcomes)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    dead = [p.pid for i, p in enumerate(procs) if outcomes[i][0] == "died" and p.pid]
    if dead:
        n = fail_trials_of_dead_workers(storage_url, set(dead), studies)
        log.warning("failed and re-queued %d trial(s) of dead worker(s) %s", n, dead)
    n = fail_abandoned_trials(storage_url, grace_s, studies)
    if n:
        log.warning("failed and re-queued %d abandoned trial(s)", n)
    results = [v for i in range(n_workers) if (k := outcomes[i])[0] == "ok" for v in [k[1]]]
    problems = [f"worker {i}: {why}" for i, (k, why) in sorted(outcomes.items()) if k != "ok"]
    for line in problems:
        warnings.warn(f"a tuning worker stopped early ({line}); the others went on", stacklevel=2)
        log.warning("a tuning worker stopped early (%s); the others went on", line)
    if not results:
        raise FusionPlannerError(f"every worker process failed: {'; '.join(problems)}")
    return results


def _child(conn: Any, target: Callable[..., Any], index: int, args: tuple[Any, ...]) -> None:
    """A worker process: run `target`, send ("ok", result) or ("error", text) back."""
    try:
        msg: tuple[str, Any] = ("ok", target(index, *args))
    except BaseException as e:
        msg = ("error", f"{type(e).__name__}: {first_line(e)}")
    conn.send(msg)
    conn.close()


def _collect(procs: Sequence[Any], readers: Sequence[Any], out: dict[int, tuple[str, Any]]) -> None:
    """Wait for every worker: its message, or its death (exit code, signal)."""
    pending = set(range(len(procs)))
    while pending:
        ready = mp_connection.wait([readers[i] for i in pending])
        for i in [i for i in pending if readers[i] in ready]:
            try:
                out[i] = readers[i].recv()
            except (EOFError, OSError):  # closed without a message: the process died
                procs[i].join()
                code = procs[i].exitcode
                why = (
                    f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
                )
                out[i] = ("died", f"process {procs[i].pid} died ({why})")
            pending.discard(i)


# ---- trials of dead local workers -------------------------------------------------------
WORKER_ATTR = "fp_worker"  # user attr of each trial: "host:pid" of the process running it


def worker_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail_dead_trials(study: Any, dead: set[int] | None = None) -> int:
    """Fail the RUNNING trials of this host's dead worker processes (`dead` pids, or any
    whose process is gone) and queue each again once (Optuna's RetryFailedTrialCallback):
    the local counterpart of the heartbeat, which catches workers on other machines.
    Returns how many trials were failed."""
    opt = require_optuna()
    host = socket.gethostname()
    retry = _retry_callback(opt)
    n = 0
    for t in study.get_trials(deepcopy=False, states=(opt.trial.TrialState.RUNNING,)):
        tag = str(t.user_attrs.get(WORKER_ATTR, ""))
        t_host, _, pid_text = tag.rpartition(":")
        if t_host != host or not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if (pid not in dead) if dead is not None else _pid_alive(pid):
            continue
        n += _fail_and_requeue(opt, study, t, retry)
    return n


def _fail_and_requeue(opt: Any, study: Any, trial: Any, retry: Any) -> int:
    """Fail `trial` and queue it again through `retry`: 1, or 0 where a worker finished
    or failed it first."""
    try:
        done = study._storage.set_trial_state_values(trial._trial_id, opt.trial.TrialState.FAIL)
    except Exception:  # another worker finished or failed it first
        return 0
    if not done:
        return 0
    retry(study, study._storage.get_trial(trial._trial_id))
    return 1


def _retry_callback(opt: Any) -> Any:
    """Optuna's callback that queues a failed trial again (MAX_RETRY times), by its
    current name (4.9 renamed it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", opt.exceptions.ExperimentalWarning)
        cls = getattr(opt.storages, "RetryHeartbeatStaleTrialCallback", None)
        return (cls or opt.storages.RetryFailedTrialCallback)(max_retry=MAX_RETRY)


def _studies(storage: Any, prefix: str) -> list[str]:
    """The names of `storage`'s studies that begin with `prefix` (a name is cheap to list;
    loading a study and its trials is not)."""
    return [s.study_name for s in storage.get_all_studies() if s.study_name.startswith(prefix)]


def fail_abandoned_trials(storage_url: str | None, grace_s: float, studies: str = "") -> int:
    """Fail, and queue again once, the RUNNING trials of `storage_url`'s studies (those
    whose names begin with `studies`) that no worker keeps: on a database, those whose
    heartbeat is older than `grace_s` (Optuna's own sweep, which otherwise runs only when
    a worker starts its next trial); anywhere, those with no worker tag that started more
    than `grace_s` ago (a worker tags its trial as it starts it, so one killed between
    taking the trial and tagging it left the trial with neither tag nor heartbeat). What
    the parent of local workers runs when they have all ended: a worker killed, or a tell
    lost while the server restarted, can leave such a trial with no one left to sweep it.
    Returns how many trials were failed."""
    opt = require_optuna()
    kind = storage_kind(storage_url)
    if kind not in ("rdb", "journal"):
        return 0
    try:
        beats = kind == "rdb"
        storage = make_storage(
            storage_url,
            heartbeat=beats,
            heartbeat_interval_s=max(1, int(grace_s // 3)),
            grace_period_s=max(1, int(grace_s)),
        )
        retry = _retry_callback(opt)
        running = (opt.trial.TrialState.RUNNING,)
        now = datetime.datetime.now()  # Optuna stamps trials in local time
        n = 0
        for name in _studies(storage, studies):
            study = opt.load_study(study_name=name, storage=storage)
            before = len(study.get_trials(deepcopy=False, states=running))
            if beats:
                opt.storages.fail_stale_trials(study)
            n += before - len(study.get_trials(deepcopy=False, states=running))
            for t in study.get_trials(deepcopy=False, states=running):
                start = t.datetime_start
                if t.user_attrs.get(WORKER_ATTR) or start is None:
                    continue
                if (now - start).total_seconds() < grace_s:
                    continue
                n += _fail_and_requeue(opt, study, t, retry)
        return n
    except Exception as e:  # cleaning up is a courtesy
        log.warning("could not sweep abandoned trials: %s", first_line(e))
        return 0


def fail_trials_of_dead_workers(storage_url: str | None, pids: set[int], studies: str = "") -> int:
    """`fail_dead_trials` over the studies of `storage_url` whose names begin with
    `studies` (what the parent of local workers runs when one of them died)."""
    opt = require_optuna()
    try:
        storage = make_storage(storage_url, heartbeat=False)
        n = 0
        for name in _studies(storage, studies):
            study = opt.load_study(study_name=name, storage=storage)
            n += fail_dead_trials(study, pids)
        return n
    except Exception as e:  # cleaning up is a courtesy; the heartbeat is the backstop
        log.warning("could not fail the trials of dead workers %s: %s", sorted(pids), e)
        return 0
