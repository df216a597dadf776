"""The plan cache: lookup order, LRU, versions, corrupt files, concurrent processes, queue.

Every behaviour runs on both ways to reach a database (the stdlib SQLite store and the
SQLAlchemy store, here on SQLite through SQLAlchemy); PostgreSQL has its own optional test.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import multiprocessing as mp
import os
import random
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
import warnings
from pathlib import Path

import pytest

import zoo
from cli.main import main
from planner.errors import CacheError
from planner.fusion.partition import Partition
from planner.hardware import device_fingerprint
from planner.ir.capture import capture
from planner.plans.buckets import Bucket, BucketSpec, Edges, parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.cache_sql import CacheWarning, SQLAlchemyStore, SQLiteStore, inspect_sqlite_file
from planner.plans.plan import Plan

DEV = "cpu-testdevice"
DIMS = {"B": (0, 0)}


@pytest.fixture(scope="module")
def graph():
    module, inputs = zoo.get("mlp").build({"B": 4, "D": 16, "HID": 32, "L": 2}, device="meta")
    return capture(module, inputs)


def make_plan(graph, *, predicted=1e-3, measured=None, singletons=True, **kw) -> Plan:
    part = Partition.singletons(graph) if singletons else Partition.whole(graph)
    plan = Plan.from_partition(
        part,
        device="cpu",
        dtype="float32",
        strategy=kw.pop("strategy", "test"),
        cost_model=kw.pop("cost_model", "analytical/1"),
        predicted_s=predicted,
        device_fingerprint=DEV,
        **kw,
    )
    return plan if measured is None else plan.with_measurement(measured)


def _has_sqlalchemy() -> bool:
    try:
        import sqlalchemy  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def pg_server():
    """A throwaway PostgreSQL server on a Unix socket (no TCP), or a skip."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    initdb = shutil.which("initdb") or (bins and os.path.join(bins[-1], "initdb"))
    pg_ctl = shutil.which("pg_ctl") or (bins and os.path.join(bins[-1], "pg_ctl"))
    if not initdb or not pg_ctl or not os.path.exists(initdb):
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    try:
        import psycopg  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError:
        pytest.skip("needs sqlalchemy and psycopg (pip install sqlalchemy 'psycopg[binary]')")
    # Not under pytest's tmp dir: that is private to root, and the server may run as postgres.
    base = Path(tempfile.mkdtemp(prefix="fp-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres user
        if shutil.which("runuser") is None or subprocess.run(["id", "postgres"]).returncode:
            pytest.skip("running as root without a postgres user to run the server as")
        shutil.chown(base, "postgres")
        shutil.chown(sock, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*run_as, initdb, "-D", str(data), "-A", "trust", "-U", "fp", "--no-sync"],
        check=True,
        capture_output=True,
    )
    opts = f"-k {sock} -c listen_addresses='' -c fsync=off"
    subprocess.run(
        [*run_as, pg_ctl, "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w", "start"],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://fp@/{{db}}?host={sock}"
    finally:
        subprocess.run(
            [*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(
    params=[
        "sqlite3",
        "sqlalchemy",
        pytest.param("postgresql", marks=[pytest.mark.slow, pytest.mark.optional]),
    ]
)
def url(request, tmp_path) -> str:
    if request.param == "postgresql":
        template = request.getfixturevalue("pg_server")  # skips without server or driver
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(template.format(db="postgres").replace("+psycopg", "")) as con:
            con.autocommit = True
            con.execute(f"CREATE DATABASE {name}")
        return template.format(db=name)
    if request.param == "sqlalchemy":
        if not _has_sqlalchemy():
            pytest.skip("sqlalchemy is not installed")
        return f"sqlite+pysqlite:///{tmp_path / 'plans.sqlite'}"
    return str(tmp_path / "plans.sqlite")


def test_url_picks_the_store(tmp_path):
    assert isinstance(PlanCache(str(tmp_path / "a.sqlite")).db, SQLiteStore)
    assert isinstance(PlanCache(f"sqlite:///{tmp_path / 'b.sqlite'}").db, SQLiteStore)
    if _has_sqlalchemy():
        assert isinstance(PlanCache(f"sqlite+pysqlite:///{tmp_path / 'c'}").db, SQLAlchemyStore)
        with pytest.raises(CacheError, match="supported"):
            PlanCache("mysql://nobody@localhost/none")


# ---- lookup order ----------------------------------------------------------------------
def test_lookup_order_exact_then_bucket_then_default(graph, url):
    cache = PlanCache(url)
    spec = parse_dynamic("B=1..64", DIMS)
    key = graph.structure_key
    bucket_plan = make_plan(graph, singletons=True)
    exact_plan = make_plan(graph, singletons=False, strategy="exact-tuned")
    cache.store(bucket_plan, spec.bucket_of([(4, 16)]))
    cache.store_exact(exact_plan, [(4, 16)])

    r = cache.lookup(key, [(4, 16)], DEV, spec=spec)
    assert (r.source, r.plan.strategy, r.plan.n_groups) == ("exact", "exact-tuned", 1)
    r = cache.lookup(key, [(3, 16)], DEV, spec=spec)  # same bucket 3-4, no exact entry
    assert (r.source, r.plan.n_groups) == ("bucket", len(graph.nodes))
    assert r.bucket.key == "[3-4,16]"
    r = cache.lookup(key, [(9, 16)], DEV, spec=spec)  # bucket 9-16 has no plan
    assert (r.source, r.plan, r.bucket.key) == ("default", None, "[9-16,16]")
    r = cache.lookup(key, [(100, 16)], DEV, spec=spec)  # outside every bucket
    assert (r.source, r.plan, r.bucket) == ("default", None, None)
    r = cache.lookup(key, [(3, 16)], "cuda-otherdevice", spec=spec)  # another device
    assert r.source == "default"
    r = cache.lookup("another-model", [(3, 16)], DEV, spec=spec)
    assert r.source == "default"


def test_shapes_of_one_bucket_share_a_result_until_its_entry_changes(graph, url):
    """A new shape in a cached bucket remembers one shared result (fewer objects kept per
    lookup: benchmarks/lookup_latency.py); a better plan stored later replaces it."""
    cache = PlanCache(url)
    spec = parse_dynamic("B=1..64", DIMS)
    key = graph.structure_key
    cache.store(make_plan(graph, predicted=2e-3), spec.bucket_of([(12, 16)]))
    a = cache.lookup(key, [(9, 16)], DEV, spec=spec)
    b = cache.lookup(key, [(13, 16)], DEV, spec=spec)
    assert a is b and a.plan.predicted_s == 2e-3
    cache.store(make_plan(graph, predicted=1e-3, singletons=False), spec.bucket_of([(12, 16)]))
    c = cache.lookup(key, [(15, 16)], DEV, spec=spec)
    assert c is not a and c.plan.predicted_s == 1e-3 and c.plan.n_groups == 1


def test_the_stored_spec_buckets_lookups_without_an_explicit_one(graph, url):
    cache = PlanCache(url)
    spec = BucketSpec.uniform(parse_dynamic("B=1..64", DIMS).dims, Edges((8, 64)))
    cache.store(make_plan(graph), spec.bucket_of([(5, 16)]))
    assert cache.lookup(graph.structure_key, [(5, 16)], DEV).source == "default"  # no spec yet
    cache.set_bucket_spec(graph.structure_key, spec, DEV)
    r = cache.lookup(graph.structure_key, [(5, 16)], DEV)
    assert r.source == "bucket" and r.bucket.key == "[1-8,16]"
    assert PlanCache(url).bucket_spec(graph.structure_key, DEV) == spec  # persisted


def test_a_plan_from_a_representative_shape_applies_across_its_bucket(graph):
    module, inputs = zoo.get("mlp").build({"B": 3, "D": 16, "HID": 32, "L": 2}, device="meta")
    other = capture(module, inputs)
    assert other.key != graph.key and other.structure_key == graph.structure_key
    plan = make_plan(graph)
    part = plan.partition_for(other)
    assert len(part) == len(other.nodes) and part.graph is other
    module, inputs = zoo.get("mlp").build({"B": 3, "D": 16, "HID": 32, "L": 3}, device="meta")
    with pytest.raises(Exception, match="another model"):
        plan.partition_for(capture(module, inputs))


# ---- better plan wins; nothing is lost ----------------------------------------------------
def test_store_keeps_the_better_plan_and_records_every_offer(graph, url):
    cache = PlanCache(url)
    b = parse_dynamic("B=1..64", DIMS).bucket_of([(4, 16)])
    k = (graph.structure_key, DEV, f"bucket:{b.key}")
    assert cache.store(make_plan(graph, predicted=2e-3), b).stored
    assert cache.store(make_plan(graph, predicted=1e-3), b).stored  # lower prediction
    assert not cache.store(make_plan(graph, predicted=5e-3), b).stored
    assert cache.store(make_plan(graph, predicted=9e-3, measured=4e-4), b).stored  # measured
    assert not cache.store(make_plan(graph, predicted=1e-9), b).stored  # unmeasured loses
    assert not cache.store(make_plan(graph, measured=5e-4), b).stored  # slower measurement
    assert cache.store(make_plan(graph, measured=3e-4), b).stored
    assert cache.get(*k).measured_s == pytest.approx(3e-4)
    assert cache.store(make_plan(graph, measured=9e-4), b, replace="always").stored
    assert cache.get(*k).measured_s == pytest.approx(9e-4)
    hist = cache.history(*k)
    assert [h["won"] for h in hist] == [1, 1, 0, 1, 0, 0, 1, 1]


# ---- L1 ----------------------------------------------------------------------------------
def test_l1_is_a_bounded_lru(graph, url):
    cache = PlanCache(url, l1_size=2)
    spec = parse_dynamic("B=1..64", DIMS)
    for b in ((1, 16), (2, 16), (4, 16)):
        cache.store(make_plan(graph), spec.bucket_of([b]))
    keys = [
        (graph.structure_key, DEV, f"bucket:{spec.bucket_of([b]).key}")
        for b in ((1, 16), (2, 16), (4, 16))
    ]
    for k in keys:
        assert cache.get(*k) is not None
    assert len(cache._l1) == 2 and list(cache._l1) == keys[1:]  # the oldest was evicted
    reads = cache.stats["l2_reads"]
    cache.get(*keys[2])
    assert cache.stats["l2_reads"] == reads  # L1 hit
    cache.get(*keys[0])
    assert cache.stats["l2_reads"] == reads + 1  # evicted: read from L2 again
    assert list(cache._l1) == [keys[2], keys[0]]  # ... and now most recent


def test_l1_expires_so_other_processes_plans_show_up(graph, url):
    reader = PlanCache(url, l1_ttl_s=0.0, negative_ttl_s=0.0)
    writer = PlanCache(url)
    spec = parse_dynamic("B=1..64", DIMS)
    b = spec.bucket_of([(4, 16)])
    assert reader.lookup(graph.structure_key, [(4, 16)], DEV, spec=spec).source == "default"
    writer.store(make_plan(graph), b)
    assert reader.lookup(graph.structure_key, [(4, 16)], DEV, spec=spec).source == "bucket"
    cached = PlanCache(url, negative_ttl_s=3600)
    assert cached.lookup(graph.structure_key, [(8, 16)], DEV, spec=spec).source == "default"
    writer.store(make_plan(graph), spec.bucket_of([(8, 16)]))
    # A remembered miss holds until it expires or this process writes itself.
    assert cached.lookup(graph.structure_key, [(8, 16)], DEV, spec=spec).source == "default"
    cached.clear_l1()
    assert cached.lookup(graph.structure_key, [(8, 16)], DEV, spec=spec).source == "bucket"


# ---- versions ------------------------------------------------------------------------------
def _with_torch(plan: Plan, version: str) -> Plan:
    return dataclasses.replace(plan, versions={**plan.versions, "torch": version})


def test_entries_from_another_torch_or_cost_model_are_not_trusted(graph, url):
    cache = PlanCache(url)
    spec = parse_dynamic("B=1..64", DIMS)
    b = spec.bucket_of([(4, 16)])
    old = _with_torch(make_plan(graph, measured=1e-6), "1.13.0")
    assert cache.store(old, b).stored
    assert cache.lookup(graph.structure_key, [(4, 16)], DEV, spec=spec).source == "default"
    assert cache.stats["stale"] == 1
    assert len(cache.entries()) == 1 and cache.entries(include_stale=False) == []
    assert "torch 1.13.0" in cache.stale_reason(cache.entries()[0])
    # A current plan replaces a stale one even when the stale one claims to be faster ...
    assert cache.store(make_plan(graph, measured=1e-3), b).stored
    # ... and a stale plan never replaces a current one.
    assert not cache.store(_with_torch(make_plan(graph, measured=1e-9), "1.13.0"), b).stored
    assert cache.lookup(graph.structure_key, [(4, 16)], DEV, spec=spec).source == "bucket"

    pinned = PlanCache(url, cost_model="mlp/2")
    assert pinned.lookup(graph.structure_key, [(4, 16)], DEV, spec=spec).source == "default"
    assert pinned.store(make_plan(graph, measured=5e-3, cost_model="mlp/2"), b).stored
    assert pinned.lookup(graph.structure_key, [(4, 16)], DEV, spec=spec).source == "bucket"


def test_prune_removes_stale_and_selected_entries(graph, url):
    cache = PlanCache(url)
    spec = parse_dynamic("B=1..64", DIMS)
    cache.store(_with_torch(make_plan(graph), "1.13.0"), spec.bucket_of([(1, 16)]))
    cache.store(make_plan(graph), spec.bucket_of([(2, 16)]))
    cache.store(make_plan(graph), spec.bucket_of([(4, 16)]), device_fp="cuda-other")
    assert cache.prune(stale=True, dry_run=True) == {"plans": 1}
    assert len(cache.entries()) == 3
    assert cache.prune(stale=True) == {"plans": 1}
    assert cache.prune(device_fp="cuda-other") == {"plans": 1}
    assert [e.bucket_key for e in cache.entries()] == ["bucket:[2-2,16]"]
    assert cache.prune(older_than_s=3600) == {"plans": 0}
    with pytest.raises(CacheError, match="refusing"):
        cache.prune()


# ---- corrupt and foreign files --------------------------------------------------------------
def test_a_corrupt_file_is_set_aside_with_a_clear_message(graph, tmp_path):
    path = tmp_path / "plans.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.warns(CacheWarning, match=r"corrupt .*set aside as"):
        cache = PlanCache(str(path))
    aside = list(tmp_path.glob("plans.sqlite.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not a database")
    assert cache.db.set_aside == aside[0]
    cache.store(make_plan(graph), parse_dynamic("B=1..8", DIMS).bucket_of([(4, 16)]))
    assert len(PlanCache(str(path)).entries()) == 1  # the new cache works and persists


def test_a_damaged_sqlite_file_is_set_aside(graph, tmp_path):
    path = tmp_path / "plans.sqlite"
    cache = PlanCache(str(path))
    spec = parse_dynamic("B=1..64", DIMS)
    for b in range(1, 60):
        cache.store(make_plan(graph), spec.bucket_of([(b, 16)]), label="x" * 2000)
    cache.close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(path.read_bytes())
    data[4096 + 100 : 4096 * 3] = os.urandom(4096 * 2 - 100)  # trash pages 2-3
    path.write_bytes(bytes(data))
    assert inspect_sqlite_file(path).startswith("corrupt")
    with pytest.warns(CacheWarning, match="corrupt"):
        fresh = PlanCache(str(path))
    aside = [
        p for p in tmp_path.glob("plans.sqlite.corrupt-*") if not p.name.endswith(("-wal", "-shm"))
    ]
    assert fresh.entries() == [] and len(aside) == 1 and aside[0].stat().st_size > 4096 * 3


def test_a_foreign_database_is_set_aside_not_overwritten(tmp_path):
    path = tmp_path / "optuna.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO studies VALUES (1, 'precious')")
    con.commit()
    con.close()
    with pytest.raises(CacheError, match="foreign"):
        PlanCache(str(path), on_corrupt="raise")
    assert path.exists()  # untouched when asked to raise
    with pytest.warns(CacheWarning, match="another program"):
        PlanCache(str(path))
    (aside,) = tmp_path.glob("optuna.sqlite.foreign-*")
    con = sqlite3.connect(aside)
    assert con.execute("SELECT name FROM studies").fetchall() == [("precious",)]
    con.close()


def test_a_plan_cache_of_another_schema_is_foreign(tmp_path):
    path = tmp_path / "plans.sqlite"
    PlanCache(str(path)).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE fp_meta SET value = '999' WHERE key = 'schema'")
    con.commit()
    con.close()
    assert "schema 999" in inspect_sqlite_file(path)
    with pytest.warns(CacheWarning, match="foreign"):
        PlanCache(str(path))


def test_an_unreachable_location_is_a_clear_error_not_a_set_aside(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    with pytest.raises(CacheError, match=r"cannot open plan cache .*writable"):
        PlanCache(str(blocker / "plans.sqlite"))
    assert blocker.read_text().startswith("a file")
    odd = tmp_path / "we?ird #dir"  # URI metacharacters in the path
    cache = PlanCache(str(odd / "plans.sqlite"))
    cache.close()
    assert inspect_sqlite_file(odd / "plans.sqlite") is None
    assert PlanCache(str(odd / "plans.sqlite")).db.set_aside is None


def test_lookup_never_raises_on_a_broken_database(graph, tmp_path):
    class Broken:
        url = "broken://"

        def execute(self, sql, params=None):
            raise sqlite3.DatabaseError("database disk image is malformed")

        def write(self, statements):
            raise sqlite3.DatabaseError("database disk image is malformed")

        def close(self):
            pass

    cache = PlanCache(store=Broken())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            r = cache.lookup(
                graph.structure_key, [(4, 16)], DEV, spec=parse_dynamic("B=1..8", DIMS)
            )
            assert r.source == "default" and r.plan is None
    assert sum(issubclass(w.category, CacheWarning) for w in seen) == 1  # reported once


# ---- concurrency: real processes ------------------------------------------------------------
def _worker(url: str, worker: int, n: int, seed: int, plan_json: dict, go, out) -> None:
    """Store n plans into buckets every worker fights over and n exact-shape plans of its
    own, reading in between; report every offer."""
    rng = random.Random(seed)
    cache = PlanCache(url, l1_ttl_s=0.0, negative_ttl_s=0.0)
    base = Plan.from_json(plan_json)
    spec = parse_dynamic("B=1..4096", DIMS)
    offers = []
    go.wait(30)  # all workers start writing at once
    for i in range(n):
        bucket = spec.bucket_of([(1 << rng.randrange(8), 16)])
        m = rng.uniform(1e-4, 1e-2)
        cache.store(base.with_measurement(m), bucket)
        offers.append(("shared", f"bucket:{bucket.key}", m))
        own = 10_000 * (worker + 1) + i
        cache.store_exact(base.with_measurement(m), [(own, 16)])
        offers.append(("own", f"exact:[{own},16]", m))
        cache.lookup(base.structure_key, [(1 << rng.randrange(8), 16)], DEV, spec=spec)
    out.put(offers)


def test_concurrent_processes_lose_no_plan(graph, url):
    n_procs, n_each = 4, 60
    PlanCache(url).close()
    ctx = mp.get_context("fork")  # torch is imported already; the children only use sqlite
    out, go = ctx.Queue(), ctx.Event()
    base = make_plan(graph).to_json()
    procs = [
        ctx.Process(target=_worker, args=(url, w, n_each, 100 + w, base, go, out))
        for w in range(n_procs)
    ]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * n_procs
    offers = [o for _ in procs for o in out.get(timeout=10)]
    cache = PlanCache(url)
    entries = {e.bucket_key: e for e in cache.entries()}
    own = [o for o in offers if o[0] == "own"]
    assert len(own) == n_procs * n_each and all(o[1] in entries for o in own)
    best: dict[str, float] = {}
    for _, key, m in (o for o in offers if o[0] == "shared"):
        best[key] = min(best.get(key, 1.0), m)
    assert len(entries) == len(own) + len(best)
    for key, m in best.items():
        assert entries[key].measured_s == pytest.approx(m)  # the best offer won
    n_hist = sum(
        len(cache.history(e.model_key, e.device_fp, e.bucket_key)) for e in entries.values()
    )
    assert n_hist == len(offers)  # every offer is on record


# ---- tuning queue ----------------------------------------------------------------------------
def test_misses_queue_shapes_and_a_stored_plan_marks_them_tuned(graph, url):
    cache = PlanCache(url)
    spec = parse_dynamic("B=1..64", DIMS)
    key = graph.structure_key
    for shape in ((3, 16), (3, 16), (4, 16), (9, 16)):
        cache.record_miss(key, [shape], device_fp=DEV, bucket=spec.bucket_of([shape]), label="m")
    q = {item.shapes: item for item in cache.tuning_queue(model_key=key)}
    assert q[((3, 16),)].count == 2 and q[((9, 16),)].bucket_key == "[9-16,16]"
    assert cache.shape_histogram(key, 0, 0, DEV) == {3: 2, 4: 1, 9: 1}
    cache.store(make_plan(graph), spec.bucket_of([(4, 16)]))
    pending = {i.shapes for i in cache.tuning_queue(model_key=key)}
    assert pending == {((9, 16),)}
    assert {i.shapes for i in cache.tuning_queue(model_key=key, status="tuned")} == {
        ((3, 16),),
        ((4, 16),),
    }
    cache.store_exact(make_plan(graph), [(9, 16)])
    assert cache.tuning_queue(model_key=key) == []
    cache.record_miss(key, [(9, 16)], device_fp=DEV)  # seen again after tuning: pending again
    assert [i.count for i in cache.tuning_queue(model_key=key)] == [2]
    assert cache.prune(queue="tuned") == {"queue": 2}


def test_a_stored_bucket_marks_the_shapes_it_holds_whatever_bucket_they_were_queued_under(
    graph, url
):
    """The runtime queues a miss under its default bucket (pow2 over every symbolic dim);
    the tuning job's bucket for it can have other edges and exact dims."""
    cache = PlanCache(url)
    key = graph.structure_key
    for shape in ((3, 16), (6, 16)):
        cache.record_miss(key, [shape], device_fp=DEV, bucket=Bucket(((shape[0], (9, 16)),)))
    cache.store(make_plan(graph), parse_dynamic("B=1..4", DIMS).bucket_of([(3, 16)]))
    assert [i.shapes for i in cache.tuning_queue(model_key=key)] == [((6, 16),)]


# ---- export / import ---------------------------------------------------------------------------
def test_export_import_round_trip(graph, url, tmp_path):
    src = PlanCache(url)
    spec = parse_dynamic("B=1..64", DIMS)
    src.store(make_plan(graph, measured=2e-3), spec.bucket_of([(4, 16)]))
    src.store_exact(make_plan(graph, singletons=False), [(5, 16)])
    src.set_bucket_spec(graph.structure_key, spec, DEV)
    src.record_miss(graph.structure_key, [(40, 16)], device_fp=DEV)
    doc = src.export_records()

    dst = PlanCache(str(tmp_path / "other.sqlite"))
    dst.store(make_plan(graph, measured=1e-3), spec.bucket_of([(4, 16)]))  # better already
    counts = dst.import_records(doc)
    assert counts == {"stored": 1, "kept_existing": 1, "rejected": 0, "specs": 1, "queue": 1}
    r = dst.lookup(graph.structure_key, [(3, 16)], DEV)
    assert r.source == "bucket" and r.plan.measured_s == pytest.approx(1e-3)
    assert dst.lookup(graph.structure_key, [(5, 16)], DEV).plan.n_groups == 1
    doc["plans"][0]["plan"]["schema"] = 99
    assert PlanCache(str(tmp_path / "third.sqlite")).import_records(doc)["rejected"] == 1
    with pytest.raises(CacheError, match="not a plan-cache export"):
        dst.import_records({"format": "something else"})


def test_the_one_call_latency_is_stored_and_records_without_it_still_read(graph, url):
    spec = parse_dynamic("B=1..64", DIMS)
    plan = make_plan(graph).with_measurement(1e-3, measured_synced_s=1.5e-3)
    cache = PlanCache(url)
    cache.store(plan, spec.bucket_of([(4, 16)]))
    cache.set_bucket_spec(graph.structure_key, spec, DEV)
    assert cache.lookup(graph.structure_key, [(3, 16)], DEV).plan.measured_synced_s == 1.5e-3
    old = make_plan(graph, measured=1e-3)
    assert "measured_synced_s" not in old.to_json()  # written as before the field existed
    assert Plan.from_json(old.to_json()).measured_synced_s is None


def test_default_location_is_under_the_user_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = PlanCache()
    assert (
        Path(cache.url.removeprefix("sqlite:///")) == tmp_path / "fusion-planner" / "plans.sqlite"
    )


# ---- the CLI ------------------------------------------------------------------------------------
def test_cache_cli_ls_show_export_import_prune(graph, tmp_path, capsys):
    url = str(tmp_path / "plans.sqlite")
    cache = PlanCache(url)
    spec = parse_dynamic("B=1..64", DIMS)
    cache.store(make_plan(graph, measured=2e-3), spec.bucket_of([(4, 16)]))
    cache.store(_with_torch(make_plan(graph), "1.13.0"), spec.bucket_of([(8, 16)]))
    cache.record_miss(graph.structure_key, [(40, 16)], device_fp=DEV)

    assert main(["cache", "ls", "--cache", url, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["entries"]
    assert [r["bucket_key"] for r in rows] == ["bucket:[3-4,16]", "bucket:[5-8,16]"]
    assert rows[0]["status"] == "ok" and rows[1]["status"].startswith("stale: torch 1.13.0")
    assert main(["cache", "ls", "--cache", url]) == 0
    assert "2 entries" in capsys.readouterr().out

    assert main(["cache", "show", rows[0]["id"][:6], "--cache", url]) == 0
    out = capsys.readouterr().out
    assert "measured 2.00 ms" in out and f"groups ({len(graph.nodes)})" in out
    assert main(["cache", "show", "nope", "--cache", url]) == 2

    assert main(["cache", "queue", "--cache", url]) == 0
    assert "40x16" in capsys.readouterr().out

    dump = tmp_path / "dump.json"
    other = str(tmp_path / "other.sqlite")
    assert main(["cache", "export", str(dump), "--cache", url]) == 0
    assert main(["cache", "import", str(dump), "--cache", other, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["stored"] == 2

    assert main(["cache", "prune", "--stale", "--dry-run", "--cache", other]) == 0
    assert "would delete: 1 plans" in capsys.readouterr().out
    assert main(["cache", "prune", "--stale", "--cache", other]) == 0
    assert [e.bucket_key for e in PlanCache(other).entries()] == ["bucket:[3-4,16]"]
    assert main(["cache", "prune", "--cache", other]) == 2  # refuses to empty everything
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["cache", "import", str(tmp_path / "bad.json"), "--cache", other]) == 2


def test_cli_lookup_finds_what_a_tuning_job_stored(tmp_path, capsys):
    """The README's flow: a plan stored for a bucket (made on a capture at the bucket's
    representative shape) is what `cache lookup` reports for any shape of the bucket."""
    url = str(tmp_path / "plans.sqlite")
    spec = parse_dynamic("B=1..64", DIMS)
    bucket = spec.bucket_of([(3, 16)])
    (rep,) = bucket.representative()
    module, inputs = zoo.get("mlp").build({"B": rep[0], "D": 16, "HID": 32, "L": 2}, device="meta")
    graph = capture(module, inputs)
    plan = Plan.from_partition(
        Partition.singletons(graph),
        device="cpu",
        dtype="float32",
        strategy="tpe",
        cost_model="analytical/1",
        predicted_s=2e-5,
        device_fingerprint=device_fingerprint(),
    ).with_measurement(1.5e-5, eager_s=3e-5)
    cache = PlanCache(url)
    cache.store(plan, bucket)
    cache.set_bucket_spec(graph.structure_key, spec)
    argv = ["cache", "lookup", "--model", "zoo:mlp", "--cache", url]
    assert main([*argv, "--shape", "B=3,D=16,HID=32,L=2"]) == 0
    out = capsys.readouterr().out
    assert "hit (bucket B 3..4)" in out and "measured 15.0 µs" in out
    assert main([*argv, "--shape", "B=30,D=16,HID=32,L=2", "--format", "json"]) == 0
    miss = json.loads(capsys.readouterr().out)
    assert miss["source"] == "default" and miss["bucket"] == "[17-32,16]"


def test_pending_buckets_tell_a_tuning_job_what_the_runtime_missed(graph, url):
    cache = PlanCache(url)
    spec = parse_dynamic("B=1..64", DIMS)
    for b, n in ((3, 2), (4, 1), (20, 5), (100, 9)):
        cache.record_miss(graph.structure_key, [(b, 16)], device_fp=DEV, count=n)
    got = [(b.key, n) for b, n in cache.pending_buckets(graph.structure_key, spec, DEV)]
    assert got == [("[17-32,16]", 5), ("[3-4,16]", 3)]  # 100 is outside the spec
