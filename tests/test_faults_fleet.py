"""The fleet path on a real PostgreSQL server: the plan cache and Optuna studies on one
database, several worker processes, one of them killed, the server stopped and started
again mid-run. No plan is lost, the runtime never raises, a dead worker's trial is failed
and retried.

Needs a server: FUSION_PLANNER_TEST_PG_URL is a database URL whose role may create
databases, FUSION_PLANNER_TEST_PG_CTL the command that stops and starts the server
(`.ci/postgres` sets both, e.g. "pg_ctlcluster 15 main"). Without them the tests skip.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
import warnings

import pytest

import zoo
from planner.fusion.partition import Partition
from planner.ir.capture import capture
from planner.plans.buckets import parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan
from planner.runtime import backend as runtime
from tests.backend_helpers import Recording, run_shapes, small_block

DEV = "cpu-testdevice"
DIMS = {"B": (0, 0)}
URL = os.environ.get("FUSION_PLANNER_TEST_PG_URL", "")
CTL = os.environ.get("FUSION_PLANNER_TEST_PG_CTL", "")


def _server_up(url: str) -> bool:
    import psycopg
    import sqlalchemy as sa

    try:
        plain = sa.engine.make_url(url).set(drivername="postgresql")
        with psycopg.connect(plain.render_as_string(hide_password=False), connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="module")
def server():
    if not URL:
        pytest.skip("no PostgreSQL server: set FUSION_PLANNER_TEST_PG_URL (see .ci/postgres)")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("psycopg")
    if not _server_up(URL):
        pytest.skip(f"PostgreSQL at {URL} does not answer")
    return URL


@pytest.fixture
def db(server):
    """A fresh database on the server for one test."""
    import psycopg
    import sqlalchemy as sa

    base = sa.engine.make_url(server)
    name = f"fp_{uuid.uuid4().hex[:12]}"
    admin = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    yield base.set(database=name).render_as_string(hide_password=False)
    _ensure_started()
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _ctl(action: str) -> None:
    extra = ["-m", "fast"] if action == "stop" else []
    subprocess.run([*shlex.split(CTL), action, *extra], check=True, capture_output=True)


def _ensure_started() -> None:
    if CTL and not _server_up(URL):
        _ctl("start")


@pytest.fixture
def restartable(db):
    if not CTL:
        pytest.skip("set FUSION_PLANNER_TEST_PG_CTL to stop and start the server")
    yield db
    _ensure_started()


@pytest.fixture(scope="module")
def graph():
    module, inputs = zoo.get("mlp").build({"B": 4, "D": 16, "HID": 32, "L": 2}, device="meta")
    return capture(module, inputs)


def make_plan(graph, measured: float) -> Plan:
    return Plan.from_partition(
        Partition.singletons(graph),
        device="cpu",
        dtype="float32",
        strategy="test",
        cost_model="analytical/1",
        predicted_s=1e-3,
        device_fingerprint=DEV,
    ).with_measurement(measured)


def _count(url: str, table: str) -> int:
    return PlanCache(url).db.execute(f"SELECT COUNT(*) AS n FROM {table}")[0]["n"]


# ---- the plan cache through a restart ----------------------------------------------------------
def test_plan_cache_on_postgresql_through_a_server_restart(graph, restartable):
    url = restartable
    spec = parse_dynamic("B=1..64", DIMS)
    cache = PlanCache(url, negative_ttl_s=0.0, l1_ttl_s=0.0)
    cache.store(make_plan(graph, 2e-3), spec.bucket_of([(4, 16)]))
    cache.set_bucket_spec(graph.structure_key, spec, DEV)
    assert cache.lookup(graph.structure_key, [(3, 16)], DEV).source == "bucket"

    _ctl("stop")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        down = runtime.lookup(graph.structure_key, [(3, 16)], DEV, cache=cache)
        fresh = runtime.lookup(graph.structure_key, [(3, 16)], DEV, cache=url)  # opened now
        assert time.perf_counter() - t0 < 15
        t0 = time.perf_counter()  # while down, the shared cache answers at once
        for b in range(5, 9):
            assert runtime.lookup(graph.structure_key, [(b, 16)], DEV, cache=url).plan is None
        assert time.perf_counter() - t0 < 0.05
    assert down.plan is None and fresh.plan is None  # a miss, not an exception
    outcome: list = []
    writer = threading.Thread(
        target=lambda: outcome.append(
            cache.store(make_plan(graph, 3e-3), spec.bucket_of([(40, 16)]))
        )
    )
    writer.start()  # the store waits for the server ...
    time.sleep(2.0)
    _ctl("start")  # ... which comes back within its reconnect window
    writer.join(60)
    assert outcome and outcome[0].stored
    assert _count(url, "fp_plans") == _count(url, "fp_history") == 2
    assert cache.lookup(graph.structure_key, [(33, 16)], DEV).source == "bucket"
    deadline = time.monotonic() + 15  # the shared cache opened while down is used again
    while runtime.lookup(graph.structure_key, [(3, 16)], DEV, cache=url).plan is None:
        assert time.monotonic() < deadline, "the runtime's shared cache never came back"
        time.sleep(0.5)


# ---- Optuna's heartbeat: a dead worker's trial is failed and retried --------------------------
def _heartbeat_worker(index: int, url: str, name: str, beats: bool) -> int:
    import optuna

    from search.optuna_storage import make_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = make_storage(url, heartbeat_interval_s=1, grace_period_s=2)
    study = optuna.load_study(study_name=name, storage=storage)
    if index == 1 and not beats:  # killed before its heartbeat thread's first write
        storage.record_heartbeat = lambda trial_id: None

    mine = [0]

    def objective(trial):
        x = trial.suggest_float("x", -1, 1)
        mine[0] += 1
        if index == 1 and mine[0] == 2:
            while beats and trial._trial_id in storage.trials_without_heartbeat(study._study_id):
                time.sleep(0.01)  # its heartbeat thread writes the first beat
            os.kill(os.getpid(), signal.SIGKILL)  # dies holding a RUNNING trial
        time.sleep(0.1)
        return x * x

    def until_retried(study, _trial) -> None:
        """Run on until the dead worker's trial was retried and finished (4 s at least)."""
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if time.monotonic() - t0 > 4 and any("failed_trial" in t.system_attrs for t in done):
            study.stop()

    t0 = time.monotonic()
    study.optimize(objective, timeout=60, callbacks=[until_retried])
    return index


@pytest.mark.parametrize(
    "beats",
    [
        # the stale-heartbeat path is also covered on SQLite in the default run
        pytest.param(True, id="after-first-beat", marks=pytest.mark.slow),
        pytest.param(False, id="before-first-beat"),
    ],
)
def test_a_dead_workers_trial_is_failed_by_the_heartbeat_and_retried(db, beats):
    """Worker 1 is killed holding a RUNNING trial, after the trial's first heartbeat or
    before it (Optuna writes it from a thread started once the trial exists)."""
    optuna = pytest.importorskip("optuna")
    from search.optuna_storage import make_storage, run_workers

    name = "fleet-heartbeat"
    optuna.create_study(study_name=name, storage=make_storage(db, heartbeat=False))
    with pytest.warns(UserWarning, match="killed by signal 9"):
        done = run_workers(3, _heartbeat_worker, (db, name, beats), storage_url=db)
    assert done == [0, 2]
    trials = optuna.load_study(study_name=name, storage=make_storage(db, heartbeat=False)).trials
    failed = [t for t in trials if t.state.name == "FAIL"]
    assert len(failed) == 1 and not [t for t in trials if t.state.name == "RUNNING"]
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retried) == 1 and retried[0].state.name == "COMPLETE"
    assert retried[0].params == failed[0].params


# ---- tune: workers on PostgreSQL, one killed, the server restarted mid-search ----------------
def test_tune_on_postgresql_with_a_killed_worker_and_a_server_restart(restartable):
    pytest.importorskip("optuna")
    import torch

    from learned_cost.analytical import AnalyticalModel
    from planner.hardware import get_spec
    from search.tune import TuneConfig, tune
    from zoo.modelspec import resolve

    url = restartable
    torch.set_num_threads(1)
    cfg = TuneConfig(
        spec=resolve("zoo:transformer-block", "B=1,D=32,H=2"),
        dynamic="S=16..16",
        strategy="tpe",
        trials=100000,
        budget_seconds=8.0,
        storage=url,
        workers=2,
        heartbeat_s=1,
        top_k=1,
        compile_baseline=False,
        timer={"warmup": 1, "min_reps": 3, "max_reps": 5, "max_seconds": 1.0},
    )
    events: list[str] = []

    def chaos() -> None:
        deadline = time.monotonic() + 30
        while len(multiprocessing.active_children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
        kids = multiprocessing.active_children()
        if kids:
            os.kill(kids[-1].pid, signal.SIGKILL)
            events.append(f"killed {kids[-1].pid}")
        time.sleep(0.5)
        _ctl("stop")
        events.append("stopped")
        time.sleep(2.0)
        _ctl("start")
        events.append("started")

    side = threading.Thread(target=chaos)
    side.start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with PlanCache(url) as cache:
            results = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
    side.join(60)
    assert events[0].startswith("killed") and events[1:] == ["stopped", "started"]
    assert len(results) == 1 and results[0].plan is not None
    assert "stored=True" in results[0].stored
    assert _count(url, "fp_plans") == _count(url, "fp_history") == 1
    import optuna

    from search.optuna_storage import make_storage

    storage = make_storage(url, heartbeat=False)
    for s in storage.get_all_studies():
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        assert not [t for t in study.trials if t.state.name == "RUNNING"]


# ---- the runtime backend: a server that is down at start and comes back ----------------------
def test_the_backend_uses_the_cache_once_the_server_is_back(restartable):
    import torch

    from planner.ir.capture import export_model
    from planner.runtime.backend import fusion_planner_backend

    url = restartable
    PlanCache(url).close()  # the schema exists; the server then goes down
    torch._dynamo.reset()
    module = small_block()
    count = Recording()
    _ctl("stop")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        be = fusion_planner_backend(url, realizer=count)
        compiled = torch.compile(module, backend=be, dynamic=True)
        run_shapes(compiled, module, [16, 24])  # right answers on default plans
        assert be.stats.default == 2
        _ctl("start")
        x = torch.randn(2, 40, 32)
        graph = export_model(module, (x,)).graph
        part = Partition.singletons(graph)
        for a in (11, 12, 13):  # the attention chain as one group
            part = part.merge_nodes(a, a + 1)
        plan = Plan.from_partition(
            part,
            device="cpu",
            dtype="float32",
            strategy="tuned-elsewhere",
            cost_model="analytical/1",
            predicted_s=1e-4,
            device_fingerprint=be.cache.device_fp,
        )
        PlanCache(url).store_exact(plan, graph.input_shapes)  # another process tunes it
        # ... and over a bucket of its own spec, which the backend could not read at start
        spec = parse_dynamic("S=41..64", {"S": (0, 1)}, "edges:48,64")
        tuned = PlanCache(url)
        tuned.set_bucket_spec(graph.structure_key, spec, be.cache.device_fp)
        tuned.store(plan, spec.bucket_of([(2, 56, 32)]))
        time.sleep(5.5)  # the runtime's cache tries its server again every 5 s
        run_shapes(compiled, module, [40, 56])
    assert be.stats.exact == 1 and count.plans[-2].strategy == "tuned-elsewhere"
    assert be.stats.bucket == 1 and count.plans[-1].strategy == "tuned-elsewhere"
    assert "fp_test:" not in " ".join(be.stats.fallbacks) and ":***@" in be.cache.url
