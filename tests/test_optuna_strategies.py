"""The Optuna side of the search: encoding, tpe / nsga2, storages, shared studies.

The Strategy contract itself (legal, within budget, reproducible) runs over every
registered strategy in tests/test_strategies.py; these tests check what is particular to
the encoding and to Optuna.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import FusionPlannerError
from planner.fusion.legality import check
from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import Partition
from search.encoding import build_encoding
from search.merge_env import MergeEnv
from search.optuna_storage import make_storage, open_study, storage_kind, study_name
from search.parallel import tune_parallel
from search.strategies import get_strategy
from search.strategies.nsga2 import pareto_front
from search.strategy import Budget
from tests.partition_helpers import h100_objective, zoo_graph
from tests.test_cache import pg_server  # noqa: F401  (fixture: a throwaway PostgreSQL)
from zoo.randgraph import random_graph

ROOT = Path(__file__).resolve().parents[1]
# A graph where priority's first choices block better ones: tpe finds a cheaper plan.
CONTESTED = (60, 7)


# ---- the encoding ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "graph",
    [
        pytest.param(lambda: zoo_graph("transformer-block"), id="transformer-block"),
        pytest.param(lambda: zoo_graph("llama-block"), id="llama-block"),
        *(pytest.param(lambda n=n, s=s: random_graph(n, s), id=f"random-{n}-{s}") for n, s in
          [(12, 0), (40, 1), (120, 3), (300, 4)]),
    ],
)  # fmt: skip
def test_all_true_decodes_to_priority_and_priority_round_trips(graph):
    g = graph()
    obj = h100_objective()
    enc = build_encoding(g, obj)
    prio = get_strategy("priority").plan(g, h100_objective()).partition
    assert enc.decode(obj, enc.default()).partition == prio
    genome = enc.encode(prio)
    assert enc.decode(obj, genome).partition == prio
    # every exposed merge decision is a merge priority made (it ruled another one out)
    assert all(genome[d.name] for d in enc.decisions if d.kind == "merge")
    assert len(enc.decisions) <= 64
    assert all(d.kind in ("merge", "pattern") for d in enc.decisions)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(5, 80), seed=st.integers(0, 10_000), data=st.data())
def test_every_genome_decodes_to_a_legal_local_optimum(n, seed, data):
    g = random_graph(n, seed)
    obj = h100_objective()
    enc = build_encoding(g, obj, mode="all", max_free=10_000)
    genome = {name: data.draw(st.booleans(), label=name) for name in enc.names}
    dec = enc.decode(obj, genome)
    assert dec.complete and check(dec.partition, obj.limits).ok
    ev = obj.evaluate(dec.partition)
    assert ev.total_s <= obj.unfused(g).total_s * (1 + 1e-9)
    assert ev.total_s == pytest.approx(dec.total_s, rel=1e-9)  # the decode's running sum


def test_forbidding_every_link_leaves_the_base_units_alone():
    g = random_graph(60, 4)
    obj = h100_objective()
    enc = build_encoding(g, obj, mode="all", max_free=10_000)
    none = enc.decode(obj, dict.fromkeys(enc.names, False)).partition
    base = MergeEnv(g, obj).base  # each op with its views
    work = {base[i] for i, k in enumerate(kinds(g)) if k is not Kind.FREE}
    # only a group of views (of a graph input) may still join a neighbour, as in priority
    assert all(len({base[i] for i in grp} & work) <= 1 for grp in none.groups)
    assert len(none) >= len(work)


def test_modes_and_limits():
    g = random_graph(120, 3)
    obj = h100_objective()
    contested = build_encoding(g, obj, max_free=5)
    plain = build_encoding(g, obj, mode="all", max_free=10_000)
    assert len(contested.decisions) == 5
    assert sum(d.kind == "merge" for d in plain.decisions) == plain.n_links_total
    # contested decisions are priority's merges that ruled out another gainful merge
    full = build_encoding(g, obj, max_free=10_000)
    stakes = [d.stake for d in full.decisions if d.kind == "merge"]
    assert stakes == sorted(stakes, reverse=True) and all(s > 0 for s in stakes)
    assert len(full.decisions) < len(plain.decisions) / 3
    with pytest.raises(FusionPlannerError, match="unknown encoding mode"):
        build_encoding(g, obj, mode="labels")


# ---- tpe and nsga2 ---------------------------------------------------------------------------
def test_tpe_beats_priority_where_priority_blocks_itself():
    g = random_graph(*CONTESTED)
    obj = h100_objective()
    prio = get_strategy("priority").plan(g, obj).total_s
    greedy = get_strategy("greedy").plan(g, obj).total_s
    r = get_strategy("tpe", max_trials=40).plan(g, h100_objective(), seed=0)
    assert check(r.partition, obj.limits).ok
    assert r.total_s < prio * 0.999 and r.total_s < greedy
    assert "40 trials here" in r.notes


@pytest.mark.parametrize("name", ["tpe", "nsga2"])
def test_warm_start_never_loses_to_the_heuristics(name):
    for n, seed in [(25, 1), (70, 5), (150, 6)]:
        g = random_graph(n, seed)
        obj = h100_objective()
        best_heuristic = min(get_strategy(s).plan(g, obj).total_s for s in ("greedy", "priority"))
        r = get_strategy(name, max_trials=12).plan(g, h100_objective(), seed=1)
        assert r.total_s <= best_heuristic * (1 + 1e-9)


def test_small_spaces_are_enumerated_and_budgets_stop_the_study():
    g = random_graph(30, 9)
    r = get_strategy("tpe").plan(g, h100_objective())
    k = len(build_encoding(g, h100_objective()).decisions)
    assert 0 < k <= 6 and f"all 2^{k} genomes enumerated" in r.notes and r.complete
    big = random_graph(200, 2)
    t0 = time.perf_counter()
    r = get_strategy("tpe", max_trials=10_000, patience=10_000).plan(
        big, h100_objective(), Budget(max_seconds=1.5)
    )
    assert (
        time.perf_counter() - t0 < 6
        and not r.complete
        and check(r.partition, h100_objective().limits).ok
    )
    r = get_strategy("tpe", max_trials=7).plan(big, h100_objective())
    assert "7 trials here" in r.notes


def test_pruning_option_runs_and_stays_legal():
    g = random_graph(*CONTESTED)
    r = get_strategy("tpe", max_trials=30, prune=True).plan(g, h100_objective(), seed=0)
    assert check(r.partition, h100_objective().limits).ok
    assert r.total_s <= get_strategy("priority").plan(g, h100_objective()).total_s * (1 + 1e-9)


def test_nsga2_returns_a_pareto_front_of_latency_and_peak_memory():
    g = random_graph(80, 2)
    obj = h100_objective()
    front = pareto_front(g, obj, seed=0, max_trials=60)
    assert front
    lat = [t for t, _, _ in front]
    assert lat == sorted(lat)
    for t, mem, part in front:
        ev = obj.evaluate(part)
        assert check(part, obj.limits).ok
        assert ev.total_s == pytest.approx(t) and ev.peak_memory_bytes == mem
    for i, (t1, m1, _) in enumerate(front):  # formulas.md §12: nobody on the front is dominated
        for j, (t2, m2, _) in enumerate(front):
            if i != j:
                assert not (t2 <= t1 and m2 <= m1 and (t2 < t1 or m2 < m1))
    r = get_strategy("nsga2", max_trials=60).plan(g, h100_objective(), seed=0)
    assert r.extra["pareto"] and r.total_s == pytest.approx(r.extra["pareto"][0][0])


# ---- storages --------------------------------------------------------------------------------
def test_storage_urls_and_study_names(tmp_path):
    assert storage_kind(None) == storage_kind("memory") == "memory"
    assert storage_kind("sqlite") == storage_kind(f"sqlite:///{tmp_path}/s.db") == "sqlite"
    assert storage_kind("journal") == storage_kind(f"journal:{tmp_path}/j") == "journal"
    assert storage_kind("postgresql+psycopg://u@h/db") == "rdb"
    with pytest.raises(FusionPlannerError, match="not a known form"):
        storage_kind("s3-bucket")
    g1, g2 = random_graph(20, 1), random_graph(20, 2)
    assert study_name(g1, "S=512") == study_name(g1, "S=512")
    assert len({study_name(g1, "S=512"), study_name(g1, "S=1024"), study_name(g2, "S=512")}) == 3
    assert study_name(g1, "b", "analytical") != study_name(g1, "b", "corrected")
    study = open_study(g1, "S=512", f"journal:{tmp_path}/j.log")
    assert study.user_attrs["bucket_id"] == "S=512" and study.user_attrs["graph_key"] == g1.key


def test_a_sqlite_study_persists_and_resumes(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    g = random_graph(*CONTESTED)
    first = get_strategy("tpe", storage=url, bucket_id="b", max_trials=8).plan(
        g, h100_objective(), seed=0
    )
    again = get_strategy("tpe", storage=url, bucket_id="b", max_trials=5).plan(
        g, h100_objective(), seed=1
    )
    (summary,) = optuna.get_all_study_summaries(make_storage(url))
    assert summary.n_trials >= 13 and "5 trials here" in again.notes
    assert again.total_s <= first.total_s * (1 + 1e-12)  # it answers with the study's best


@pytest.mark.slow
def test_local_worker_processes_share_one_journal_study(tmp_path):
    g = random_graph(80, 2)
    url = f"journal:{tmp_path / 'shared.journal'}"
    results = tune_parallel(
        g, h100_objective(), n_workers=2, storage_url=url, bucket_id="S=8", trials_per_worker=15
    )
    assert len({r.pid for r in results}) == 2 and os.getpid() not in {r.pid for r in results}
    (summary,) = optuna.get_all_study_summaries(make_storage(url))
    assert summary.n_trials >= 30
    study = optuna.load_study(study_name=summary.study_name, storage=make_storage(url))
    best = min(r.total_s for r in results)
    assert best == pytest.approx(study.best_value)
    for r in results:
        assert check(r.partition(g), h100_objective().limits).ok


def test_workers_refuse_storages_processes_cannot_share():
    g = random_graph(20, 1)
    for url in (None, "sqlite:///x.db"):
        with pytest.raises(FusionPlannerError, match="journal"):
            tune_parallel(g, h100_objective(), n_workers=2, storage_url=url)
    with pytest.raises(FusionPlannerError, match="tpe or nsga2"):
        tune_parallel(g, h100_objective(), n_workers=2, storage_url="journal", strategy="rl")


_DIES_MID_TRIAL = """
import os, time, optuna
from search.optuna_storage import make_storage
storage = make_storage({url!r}, heartbeat=True, heartbeat_interval_s=1, grace_period_s=1)
study = optuna.load_study(study_name="hb", storage=storage)
def objective(trial):
    trial.suggest_float("x", 0, 1)
    while trial._trial_id in storage.trials_without_heartbeat(study._study_id):
        time.sleep(0.01)  # its heartbeat thread writes the first beat
    os._exit(3)  # the worker dies mid-trial: no tell, no heartbeat any more
study.optimize(objective, n_trials=1)
"""


def _heartbeat_retry(url: str) -> None:
    storage = make_storage(url, heartbeat=True, heartbeat_interval_s=1, grace_period_s=1)
    study = optuna.create_study(study_name="hb", storage=storage)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = textwrap.dedent(_DIES_MID_TRIAL.format(url=url))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert proc.returncode == 3, proc.stderr.decode()[-2000:]
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING]
    time.sleep(2)  # past the grace period
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    states = [t.state for t in study.trials]
    assert states[0] == optuna.trial.TrialState.FAIL  # the dead worker's trial, failed...
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == 0]
    assert retried  # ...and handed to a live worker by RetryFailedTrialCallback


def test_heartbeats_fail_and_retry_a_dead_workers_trial(tmp_path):
    _heartbeat_retry(f"sqlite:///{tmp_path / 'hb.db'}")


def _died_before_its_first_heartbeat(url: str) -> None:
    """Optuna creates a trial RUNNING and writes its first heartbeat from a thread started
    afterwards: a worker killed in between leaves a trial with no heartbeat and no worker
    tag. A live worker's heartbeat sweep fails it after the grace period, a second
    worker's sweep does not fail it again, and it is run once more, with its parameters."""

    def worker_study():
        storage = make_storage(url, heartbeat=True, heartbeat_interval_s=1, grace_period_s=1)
        return optuna.load_study(study_name="hb", storage=storage)

    study = optuna.create_study(study_name="hb", storage=make_storage(url, heartbeat=False))
    orphan = study.ask()  # as a worker killed before its heartbeat thread's first write left it
    x = orphan.suggest_float("x", 0, 1)
    live, other = worker_study(), worker_study()
    deadline = time.monotonic() + 8

    def objective(trial):
        time.sleep(0.2)
        return trial.suggest_float("x", 0, 1)

    while not [t for t in live.get_trials(deepcopy=False) if t.state.name == "FAIL"]:
        assert time.monotonic() < deadline, "the trial without a heartbeat was never failed"
        live.optimize(objective, n_trials=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(other)  # the trial is failed already
    trials = live.get_trials()
    assert [t.number for t in trials if t.state.name == "FAIL"] == [orphan.number]
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == orphan.number]
    assert len(retried) == 1 and retried[0].state.name == "COMPLETE"
    assert retried[0].params == {"x": x}


def test_a_trial_whose_worker_died_before_its_first_heartbeat_is_failed_and_retried_once(
    tmp_path,
):
    _died_before_its_first_heartbeat(f"sqlite:///{tmp_path / 'hb.db'}")


@pytest.mark.slow
@pytest.mark.optional
def test_heartbeats_on_postgresql(pg_server):  # noqa: F811
    import psycopg

    with psycopg.connect(pg_server.format(db="postgres").replace("+psycopg", "")) as con:
        con.autocommit = True
        con.execute("CREATE DATABASE optuna_hb")
    _heartbeat_retry(pg_server.format(db="optuna_hb"))
    with psycopg.connect(pg_server.format(db="postgres").replace("+psycopg", "")) as con:
        con.autocommit = True
        con.execute("CREATE DATABASE optuna_orphan")
    _died_before_its_first_heartbeat(pg_server.format(db="optuna_orphan"))


# ---- without optuna (the GPU machine) --------------------------------------------------------
_NO_OPTUNA = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "optuna" or name.startswith("optuna."):
            raise ImportError("optuna is blocked in this test")
sys.meta_path.insert(0, Refuse())
from planner.errors import FusionPlannerError
from zoo.randgraph import random_graph
from tests.partition_helpers import h100_objective
from search.strategies import STRATEGIES, get_strategy
import cli.commands.plan  # the CLI's plan command imports too
assert {"priority", "tpe", "nsga2", "rl"} <= set(STRATEGIES)
r = get_strategy("priority").plan(random_graph(40, 1), h100_objective())
assert r.evaluation.legal and len(r.partition) < 40
for name in ("tpe", "nsga2"):
    try:
        get_strategy(name)
    except FusionPlannerError as e:
        assert "pip install optuna" in str(e), e
    else:
        raise AssertionError(name + " did not say optuna is missing")
assert "optuna" not in sys.modules
print("ok")
"""


def test_the_registry_imports_and_plans_without_optuna():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _NO_OPTUNA], env=env, capture_output=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0 and proc.stdout.strip() == b"ok", proc.stderr.decode()[-3000:]


def test_budget_in_evaluations_is_exact_for_both():
    g = random_graph(90, 8)
    for name in ("tpe", "nsga2"):
        obj = h100_objective()
        r = get_strategy(name).plan(g, obj, Budget(max_evals=300), seed=3)
        assert r.evals_used <= 302 and check(r.partition, h100_objective().limits).ok
        assert math.isfinite(r.total_s)
        r2 = get_strategy(name).plan(g, h100_objective(), Budget(max_evals=300), seed=3)
        assert r2.partition == r.partition and isinstance(r.partition, Partition)


def test_abandoned_trials_are_failed_and_queued_again_once_no_worker_keeps_them(tmp_path):
    """A trial RUNNING with no worker tag and older than the grace period has no owner (a
    worker tags its trial as it starts it): the end-of-job sweep fails it and queues it
    again; a tagged trial and a young one are left to their workers."""
    import optuna

    from search.optuna_storage import WORKER_ATTR, fail_abandoned_trials, make_storage

    url = f"journal:{tmp_path / 'study.log'}"
    storage = make_storage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    orphan = study.ask()
    owned = study.ask()
    owned.set_user_attr(WORKER_ATTR, "elsewhere:1")
    assert fail_abandoned_trials(url, grace_s=3600) == 0  # too young to call abandoned
    assert fail_abandoned_trials(url, grace_s=0) == 1
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states[orphan.number] == "FAIL" and states[owned.number] == "RUNNING"
    assert "WAITING" in states.values()  # queued again once


def test_end_of_job_sweeps_leave_other_jobs_studies_alone(tmp_path):
    """A job sweeps only its own studies (those named with its prefix): an orphaned trial
    of another study in the same storage belongs to another job, which sweeps it itself."""
    import os

    import optuna

    from search.optuna_storage import (
        fail_abandoned_trials,
        fail_trials_of_dead_workers,
        make_storage,
        study_prefix,
        worker_tag,
    )

    g = random_graph(12, 1)
    mine = study_prefix(g, "b1")
    url = f"journal:{tmp_path / 'study.log'}"
    storage = make_storage(url)
    ours = optuna.create_study(study_name=mine + "x", storage=storage)
    theirs = optuna.create_study(study_name=study_prefix(g, "b2") + "x", storage=storage)
    for study in (ours, theirs):
        study.ask()  # untagged: abandoned once older than the grace period
        study.ask().set_user_attr("fp_worker", worker_tag())  # this process, "dead"
    assert fail_trials_of_dead_workers(url, {os.getpid()}, mine) == 1
    assert fail_abandoned_trials(url, grace_s=0, studies=mine) == 1
    assert {t.state.name for t in theirs.get_trials()} == {"RUNNING"}
    assert [t.state.name for t in ours.get_trials()].count("RUNNING") == 0
    assert fail_abandoned_trials(url, grace_s=0) == 1  # no prefix: every study
