"""Bad input and faults: each case gives a clear message (no traceback) or a safe
fallback, and no plan or file of the user's is lost.

Cases: the plan cache (atomic writes, read-only files and directories, imports, prune,
foreign files, unreadable rows, a database that is down or comes back), the command line
(numbers, storages, shapes, model factories, cost models, datasets, export targets) and
worker processes that die. The fleet path on a real PostgreSQL server is in
tests/test_faults_fleet.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time
import types
import warnings
from pathlib import Path

import pytest

import zoo
from cli.main import main
from planner.errors import CacheError, FusionPlannerError, ModelSpecError
from planner.fusion.partition import Partition
from planner.ir.capture import capture
from planner.plans.buckets import parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.cache_sql import ReopeningStore
from planner.plans.plan import Plan
from planner.runtime import backend as runtime
from tests.backend_helpers import Recording, run_shapes, small_block
from zoo.modelspec import parse_shape, resolve

DEV = "cpu-testdevice"
DIMS = {"B": (0, 0)}
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def graph():
    module, inputs = zoo.get("mlp").build({"B": 4, "D": 16, "HID": 32, "L": 2}, device="meta")
    return capture(module, inputs)


def make_plan(graph, *, measured=None, whole=False, predicted=1e-3) -> Plan:
    part = Partition.whole(graph) if whole else Partition.singletons(graph)
    plan = Plan.from_partition(
        part,
        device="cpu",
        dtype="float32",
        strategy="test",
        cost_model="analytical/1",
        predicted_s=predicted,
        device_fingerprint=DEV,
    )
    return plan if measured is None else plan.with_measurement(measured)


def _spec():
    return parse_dynamic("B=1..64", DIMS)


def _bucket(b: int = 4):
    return _spec().bucket_of([(b, 16)])


def _rows(path: Path, table: str) -> int:
    with sqlite3.connect(path) as con:
        return con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def _cli(capsys, *argv: str) -> tuple[int, str]:
    """Run the CLI; (exit code, stderr). argparse errors come back as their exit code."""
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


# ---- atomic writes ------------------------------------------------------------------------------
def test_a_plan_and_its_history_row_are_written_together(graph, tmp_path):
    path = tmp_path / "plans.sqlite"
    cache = PlanCache(str(path))
    for m in (3e-3, 2e-3, 4e-3):
        cache.store(make_plan(graph, measured=m), _bucket())
    assert _rows(path, "fp_plans") == 1 and _rows(path, "fp_history") == 3
    won = [h["won"] for h in cache.history(graph.structure_key, DEV, f"bucket:{_bucket().key}")]
    assert won == [1, 1, 0]
    # the history insert fails: the plan is not written either (one transaction)
    with sqlite3.connect(path) as con:
        con.execute(
            "CREATE TRIGGER no_history BEFORE INSERT ON fp_history "
            "BEGIN SELECT RAISE(ABORT, 'history refused'); END"
        )
    with pytest.raises(CacheError, match="history refused"):
        cache.store(make_plan(graph, measured=1e-3), _bucket(40))
    assert _rows(path, "fp_plans") == 1 and _rows(path, "fp_history") == 3
    cache.clear_l1()
    assert cache.lookup(graph.structure_key, [(40, 16)], DEV, spec=_spec()).plan is None


def test_an_inconsistent_plan_is_refused_at_store_time(graph, tmp_path):
    import dataclasses

    cache = PlanCache(str(tmp_path / "plans.sqlite"))
    good = make_plan(graph, measured=2e-3)
    bad_groups = (*good.groups[:-1], dataclasses.replace(good.groups[-1], nodes=(999,)))
    for bad in (
        dataclasses.replace(good, measured_s=0.0),
        dataclasses.replace(good, predicted_s=float("nan")),
        dataclasses.replace(good, groups=bad_groups),
    ):
        with pytest.raises(CacheError, match="inconsistent plan"):
            cache.store(bad, _bucket())
    assert cache.entries() == []


# ---- read-only files and directories ----------------------------------------------------------
def test_a_cache_seen_as_read_only_is_read_and_never_written(graph, tmp_path, monkeypatch):
    """The read-only path on any user (root writes everything): os.access says no."""
    path = tmp_path / "plans.sqlite"
    with PlanCache(str(path)) as cache:
        cache.store(make_plan(graph, measured=2e-3), _bucket())
    before = path.read_bytes()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode == os.W_OK else real(p, mode))
    cache = PlanCache(str(path))
    assert not cache.writable
    spec = parse_dynamic("B=1..64", DIMS)
    assert cache.lookup(graph.structure_key, [(3, 16)], DEV, spec=spec).plan.measured_s == 2e-3
    with pytest.raises(CacheError, match=r"read-only.*nothing was written"):
        cache.store(make_plan(graph, measured=1e-3), _bucket())
    with pytest.raises(CacheError, match="read-only"):
        cache.import_records(cache.export_records())
    cache.close()
    assert path.read_bytes() == before


@contextlib.contextmanager
def _read_only(*paths: Path):
    """Make `paths` read-only for everyone, root included: `chattr +i` (immutable) where
    the file system and our privileges allow it, else chmod for a non-root user."""
    if os.geteuid() == 0:
        done = []
        try:
            for p in paths:
                r = subprocess.run(["chattr", "+i", str(p)], capture_output=True, check=False)
                if r.returncode:
                    pytest.skip(f"cannot make {p} read-only as root: chattr {r.stderr!r}")
                done.append(p)
            yield
        finally:
            for p in reversed(done):
                subprocess.run(["chattr", "-i", str(p)], capture_output=True, check=False)
    else:
        modes = [(p, p.stat().st_mode) for p in paths]
        try:
            for p in paths:
                p.chmod(0o555 if p.is_dir() else 0o444)
            yield
        finally:
            for p, mode in reversed(modes):
                p.chmod(mode)


def test_a_read_only_directory_still_serves_its_plans_and_refuses_writes_clearly(graph, tmp_path):
    """A cache in a read-only directory (no -shm can be made for WAL) is still read: the
    runtime finds its plans; writes say why they are refused; nothing is created."""
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "plans.sqlite"
    with PlanCache(str(path)) as cache:
        cache.store(make_plan(graph, measured=2e-3), _bucket())
        cache.set_bucket_spec(graph.structure_key, _spec(), DEV)
    before = path.read_bytes()
    with _read_only(path, folder):
        r = runtime.lookup(graph.structure_key, [(3, 16)], DEV, cache=str(path))
        assert r.source == "bucket" and r.plan.measured_s == pytest.approx(2e-3)
        cache = PlanCache(str(path))
        assert not cache.writable
        with pytest.raises(CacheError, match="read-only"):
            cache.store(r.plan, r.bucket)
        with pytest.raises(CacheError, match="read-only"):
            cache.record_miss(graph.structure_key, [(3, 16)], device_fp=DEV)
        cache.close()
        assert sorted(p.name for p in folder.iterdir()) == ["plans.sqlite"]
    assert path.read_bytes() == before


def test_tune_refuses_a_read_only_cache_before_searching(graph, tmp_path):
    from learned_cost.analytical import AnalyticalModel
    from planner.hardware import get_spec
    from search.tune import TuneConfig, tune

    path = tmp_path / "plans.sqlite"
    PlanCache(str(path)).store(make_plan(graph, measured=2e-3), _bucket())
    cfg = TuneConfig(spec=resolve("zoo:mlp", "D=16,HID=32,L=1"), dynamic="B=2..4")
    said: list[str] = []
    with (
        PlanCache(str(path), read_only=True) as cache,
        pytest.raises(CacheError, match=r"read-only.*nothing was searched"),
    ):
        tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=said.append)
    assert said == []  # refused before the first bucket


# ---- imports ------------------------------------------------------------------------------------
def _export_with(cache: PlanCache, graph) -> dict:
    cache.store(make_plan(graph, measured=2e-3), _bucket())
    cache.set_bucket_spec(graph.structure_key, parse_dynamic("B=1..64", DIMS), DEV)
    cache.record_miss(graph.structure_key, [(40, 16)], device_fp=DEV)
    return cache.export_records()


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (lambda d: d["plans"][0].update(measured_s=0), "measured_s"),
        (lambda d: d["plans"][0]["plan"].update(measured_s=0), "measured_s"),
        (lambda d: d["plans"][0]["plan"]["groups"][0].update(nodes=[999]), "partition nodes"),
        (lambda d: d["plans"][0].pop("device_fp"), "missing device_fp"),
        (lambda d: d["plans"][0].update(label=7), "label must be text"),
        (lambda d: d["plans"][0].update(predicted_s=float("nan")), "predicted_s"),
        (lambda d: d["plans"][0].update(plan=[1]), "plan must be an object"),
        (lambda d: d["plans"][0].update(model_key="other"), "structure_key"),
        (lambda d: d["plans"].append("x"), "must be an object"),
        (lambda d: d["specs"][0].update(spec={"dims": 3}), "spec"),
        (lambda d: d["queue"][0].update(shapes=[["a"]]), "shapes"),
        (lambda d: d["queue"][0].update(count=-1), "count"),
        (lambda d: d["queue"][0].update(status="odd"), "status"),
        (lambda d: d.update(queue={"a": 1}), "queue must be a list"),
    ],
)
def test_a_malformed_import_is_refused_whole_and_changes_nothing(graph, tmp_path, corrupt, match):
    doc = _export_with(PlanCache(str(tmp_path / "src.sqlite")), graph)
    dst_path = tmp_path / "dst.sqlite"
    dst = PlanCache(str(dst_path))
    live = make_plan(graph, measured=5e-3, whole=True)
    dst.store(live, _bucket())
    snapshot = dst.export_records()
    doc["plans"].append(json.loads(json.dumps(doc["plans"][0])))  # a valid record too
    doc["plans"][-1]["bucket_key"] = "bucket:[9-16,16]"
    corrupt(doc)
    with pytest.raises(CacheError, match=f"nothing was imported.*{match}"):
        dst.import_records(doc)
    after = dst.export_records()
    assert after["plans"] == snapshot["plans"] and after["queue"] == snapshot["queue"]
    assert dst.lookup(graph.structure_key, [(3, 16)], DEV, spec=_spec()).plan.n_groups == 1


def test_an_import_is_one_transaction(graph, tmp_path):
    doc = _export_with(PlanCache(str(tmp_path / "src.sqlite")), graph)
    path = tmp_path / "dst.sqlite"
    dst = PlanCache(str(path))
    with sqlite3.connect(path) as con:  # the last statement of the import fails
        con.execute(
            "CREATE TRIGGER no_queue BEFORE INSERT ON fp_queue "
            "BEGIN SELECT RAISE(ABORT, 'queue refused'); END"
        )
    with pytest.raises(CacheError, match="queue refused"):
        dst.import_records(doc)
    assert _rows(path, "fp_plans") == 0 and _rows(path, "fp_history") == 0
    assert _rows(path, "fp_specs") == 0


def test_malformed_rows_in_the_database_are_skipped_with_a_warning(graph, tmp_path, capsys):
    path = tmp_path / "plans.sqlite"
    cache = PlanCache(str(path))
    cache.store(make_plan(graph, measured=2e-3), _bucket())
    cache.record_miss(graph.structure_key, [(40, 16)], device_fp=DEV)
    with sqlite3.connect(path) as con:  # rows written by hand or by a broken tool
        con.execute(
            "INSERT INTO fp_plans SELECT model_key, device_fp, 'bucket:[9-16,16]', '[1, 2]', "
            "plan_id, predicted_s, measured_s, torch_version, cost_model, schema_version, "
            "label, created_at, updated_at FROM fp_plans"
        )
        con.execute(
            "INSERT INTO fp_queue SELECT model_key, device_fp, 'x', bucket_key, '\"oops\"', "
            "label, count, status, first_seen, last_seen FROM fp_queue"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _cli(capsys, "cache", "ls", "--cache", str(path))[0] == 0
        assert _cli(capsys, "cache", "queue", "--cache", str(path))[0] == 0
        assert len(PlanCache(str(path)).tuning_queue()) == 1
        assert (
            _cli(capsys, "cache", "export", str(tmp_path / "e.json"), "--cache", str(path))[0] == 0
        )
        fresh = PlanCache(str(path))
        assert (
            fresh.lookup(graph.structure_key, [(12, 16)], DEV, spec=_spec()).plan is None
        )  # not served
        assert fresh.lookup(graph.structure_key, [(3, 16)], DEV, spec=_spec()).plan is not None


# ---- prune ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("age", ["-1", "nan", "inf", "1e20", "x"])
def test_prune_refuses_ages_that_are_not_ages(graph, tmp_path, capsys, age):
    path = tmp_path / "plans.sqlite"
    PlanCache(str(path)).store(make_plan(graph, measured=2e-3), _bucket())
    code, err = _cli(capsys, "cache", "prune", f"--older-than={age}", "--cache", str(path))
    assert code == 2 and "--older-than" in err
    assert _rows(path, "fp_plans") == 1
    with pytest.raises(CacheError, match="older-than"):
        PlanCache(str(path)).prune(older_than_s=-86400)


# ---- foreign files and read-only commands -----------------------------------------------------
@pytest.mark.parametrize("action", [["ls"], ["queue"], ["show", "abc"], ["export", "-"]])
def test_read_only_commands_leave_a_foreign_file_alone(tmp_path, capsys, action):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    code, err = _cli(capsys, "cache", *action, "--cache", str(notes))
    assert code == 2 and "not a SQLite database" in err and "left as it is" in err
    assert notes.read_text() == "my notes\n"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("action", [["ls"], ["import", "-"], ["prune", "--stale"]])
def test_a_directory_as_cache_is_a_message(tmp_path, capsys, action):
    code, err = _cli(capsys, "cache", *action, "--cache", str(tmp_path))
    assert code == 2 and "is a directory" in err
    assert list(tmp_path.iterdir()) == []


def test_read_only_commands_do_not_create_a_cache(tmp_path, capsys):
    missing = tmp_path / "none" / "plans.sqlite"
    assert _cli(capsys, "cache", "ls", "--cache", str(missing))[0] == 0
    assert not missing.parent.exists()


def test_export_to_a_directory_is_a_message(graph, tmp_path, capsys):
    path = tmp_path / "plans.sqlite"
    PlanCache(str(path)).store(make_plan(graph, measured=2e-3), _bucket())
    code, err = _cli(capsys, "cache", "export", str(tmp_path), "--cache", str(path))
    assert code == 2 and "cannot write export file" in err


def test_lookup_miss_says_when_no_spec_was_stored(tmp_path, capsys):
    path = str(tmp_path / "plans.sqlite")
    args = ["cache", "lookup", "--model", "zoo:mlp", "--shape", "B=4,D=16,HID=32,L=1"]
    assert main([*args, "--cache", path]) == 0
    out = capsys.readouterr().out
    assert "no plans stored" in out and "outside" not in out


# ---- the runtime's lookups never raise, and use a cache that comes back ---------------------
@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://u@127.0.0.1:1/db",  # nothing listens on port 1
        "mysql://u@127.0.0.1/db",  # a dialect the cache does not speak
        "sqlite:/x",  # a malformed URL
        "sqlite+pysqlite:///{tmp}/corrupt.sqlite",  # a damaged file behind SQLAlchemy
    ],
)
def test_runtime_lookup_and_plan_for_never_raise(graph, tmp_path, url):
    pytest.importorskip("sqlalchemy")
    (tmp_path / "corrupt.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x07" * 4000)
    url = url.format(tmp=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = runtime.lookup(graph.structure_key, graph.input_shapes, DEV, cache=url)
        plan, source = runtime.plan_for(graph, "cpu", cache=url)
    assert r.plan is None and r.source == "default"
    assert source == "default" and plan.structure_key == graph.structure_key
    assert (tmp_path / "corrupt.sqlite").exists()  # a database URL's file is not ours to move


def test_a_cache_that_comes_back_is_used_again(graph, tmp_path):
    pytest.importorskip("sqlalchemy")
    folder = tmp_path / "later"
    url = f"sqlite+pysqlite:///{folder}/plans.sqlite"  # its directory does not exist yet
    cache = PlanCache(store=ReopeningStore(url, retry_s=0.2), negative_ttl_s=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert runtime.lookup(graph.structure_key, [(3, 16)], DEV, cache=cache).plan is None
        assert cache.bucket_spec(graph.structure_key, DEV) is None
    folder.mkdir()
    PlanCache(url).store(make_plan(graph, measured=2e-3), _bucket())
    PlanCache(url).set_bucket_spec(graph.structure_key, parse_dynamic("B=1..64", DIMS), DEV)
    time.sleep(0.3)
    r = runtime.lookup(graph.structure_key, [(3, 16)], DEV, cache=cache)
    assert r.source == "bucket" and r.plan.measured_s == pytest.approx(2e-3)


# ---- the command line: numbers, shapes, storages, models ----------------------------------------
@pytest.mark.parametrize(
    "argv, flag",
    [
        (["tune", "--budget-seconds", "nan"], "--budget-seconds"),
        (["tune", "--budget-seconds", "-1"], "--budget-seconds"),
        (["tune", "--trials", "0"], "--trials"),
        (["tune", "--workers", "0"], "--workers"),
        (["tune", "--top-k", "-1"], "--top-k"),
        (["tune", "--heartbeat", "0"], "--heartbeat"),
        (["plan", "--latency-bound-us", "-1"], "--latency-bound-us"),
        (["plan", "--budget-seconds", "inf"], "--budget-seconds"),
        (["measure", "--budget-seconds", "0"], "--budget-seconds"),
    ],
)
def test_out_of_range_numbers_are_refused_by_the_parser(capsys, argv, flag):
    code, err = _cli(capsys, *argv)
    assert code == 2 and flag in err


@pytest.mark.parametrize(
    "storage, match",
    [
        ("foo", "not a known form"),
        ("sqlite:/x", "not a database URL|cannot open"),
        ("postgresql+psycopg://u@127.0.0.1:1/db", "cannot reach Optuna storage"),
    ],
)
def test_tune_refuses_a_bad_storage_before_searching(tmp_path, capsys, storage, match):
    pytest.importorskip("optuna")
    cache = tmp_path / "plans.sqlite"
    argv = ["tune", "--model", "zoo:mlp", "--shape", "D=16,HID=32,L=1", "--dynamic", "B=2..4"]
    code, err = _cli(
        capsys, *argv, "--strategy", "tpe", "--storage", storage, "--cache", str(cache)
    )
    assert code == 2 and "error:" in err
    import re

    assert re.search(match, err)
    assert "bucket(s) over" not in err  # no bucket was searched
    code, err = _cli(
        capsys, *argv, "--strategy", "greedy", "--storage", "journal", "--cache", str(cache)
    )
    assert code == 2 and "does not use" in err


def test_a_heartbeat_without_a_database_storage_is_refused(tmp_path, capsys):
    argv = ["tune", "--model", "zoo:mlp", "--shape", "D=16,HID=32,L=1", "--dynamic", "B=2..4"]
    cache = str(tmp_path / "plans.sqlite")
    argv += ["--strategy", "tpe"]  # the strategy whose studies a storage holds
    code, err = _cli(capsys, *argv, "--heartbeat", "5", "--storage", "journal", "--cache", cache)
    assert code == 2 and "database storages only" in err


def test_plan_refuses_a_bad_storage_instead_of_an_unfused_plan(capsys):
    pytest.importorskip("optuna")
    argv = ["plan", "--model", "zoo:mlp", "--strategy", "tpe", "--trials", "4"]
    code, err = _cli(capsys, *argv, "--storage", "foo")
    assert code == 2 and "not a known form" in err
    code, err = _cli(capsys, *argv, "--workers", "0")
    assert code == 2 and "--workers" in err


def test_workers_without_a_shared_storage_are_refused_before_searching(tmp_path, capsys):
    argv = ["tune", "--model", "zoo:mlp", "--shape", "D=16,HID=32,L=1", "--dynamic", "B=2..4"]
    cache = str(tmp_path / "plans.sqlite")
    code, err = _cli(capsys, *argv, "--workers", "2", "--cache", cache)  # the joint default
    assert code == 2 and "--workers shares an Optuna study: use --strategy tpe" in err
    for extra in ([], ["--storage", "sqlite"]):
        code, err = _cli(
            capsys, *argv, "--strategy", "tpe", "--workers", "2", *extra, "--cache", cache
        )
        assert code == 2 and "storage the worker processes can share" in err
        assert "bucket(s) over" not in err


def test_a_model_too_big_to_allocate_is_a_message(capsys):
    # 2^38 x 16 floats: refused by the allocator at once (nothing is touched)
    code, err = _cli(capsys, "measure", "--model", "zoo:mlp", "--shape", "B=2^38,D=1024")
    assert code == 2 and "out of memory" in err and "smaller --shape" in err


def test_shape_values_duplicates_and_sizes(capsys):
    with pytest.raises(ModelSpecError, match="twice"):
        parse_shape("B=1,B=2")
    with pytest.raises(ModelSpecError, match="2\\^40"):
        parse_shape("S=2^200")
    code, err = _cli(capsys, "plan", "--model", "zoo:mlp", "--shape", "B=2^200")
    assert code == 2 and "2^40" in err


def test_edges_beyond_the_declared_range_are_cut_to_it():
    spec = parse_dynamic("S=16..64", {"S": (0, 1)}, "edges:1000000000")
    reps = [b.representative()[0][1] for b in spec.buckets([(1, 32)])]
    assert reps == [64]
    spec = parse_dynamic("S=16..64", {"S": (0, 1)}, "edges:8,32,128")
    assert [b.key for b in spec.buckets([(1, 32)])] == ["[1,16-32]", "[1,33-64]"]


FACTORIES = """
import torch

def raises(B: int = 2):
    raise ValueError("no such variant")

def not_a_module(B: int = 2):
    return "model", (torch.ones(B),)

def no_tensor(B: int = 2):
    return torch.nn.Linear(4, 4), ("text",)

def huge(B: int = 2):
    return torch.nn.Linear(4, 4), (torch.empty(2**40, 2**30),)
"""


@pytest.mark.parametrize(
    "factory, match",
    [
        ("raises", "raised ValueError: no such variant"),
        ("not_a_module", "returned a str as its module; expected a torch.nn.Module"),
        ("no_tensor", "hold no tensor"),
        ("huge", "raised RuntimeError"),
    ],
)
def test_a_user_factory_that_fails_is_a_message(tmp_path, capsys, factory, match):
    import re

    src = tmp_path / "models.py"
    src.write_text(FACTORIES)
    for cmd in ("plan", "measure"):
        code, err = _cli(capsys, cmd, "--model", f"{src}:{factory}")
        assert code == 2 and re.search(match, err), err


def test_cost_model_files_that_are_not_models_fall_back_with_a_warning(tmp_path):
    from learned_cost.analytical import AnalyticalModel
    from learned_cost.corrected import CostModelFallbackWarning, load_corrected

    for text in ("[1, 2]", '"a string"', "{}", "not json"):
        (tmp_path / "m.json").write_text(text)
        with pytest.warns(CostModelFallbackWarning):
            assert isinstance(load_corrected(tmp_path / "m.json", "cpu"), AnalyticalModel)


def test_a_dataset_that_is_not_parquet_is_a_message(tmp_path, capsys):
    bad = tmp_path / "p.parquet"
    bad.write_text("a,b\n1,2\n")
    code, err = _cli(capsys, "cost", "train", "--data", str(bad), "--device", "cpu")
    assert code == 2 and "not a readable Parquet dataset" in err


# ---- tuning: a plan the cache refuses is kept ------------------------------------------------
def test_a_plan_the_cache_refuses_is_saved_for_import_and_tuning_goes_on(tmp_path, monkeypatch):
    import torch

    from learned_cost.analytical import AnalyticalModel
    from planner.hardware import get_spec
    from search.tune import TuneConfig, tune

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    torch.set_num_threads(1)
    path = tmp_path / "plans.sqlite"
    cache = PlanCache(str(path))
    with sqlite3.connect(path) as con:  # the store fails for the first bucket only
        con.execute(
            "CREATE TRIGGER no_small BEFORE INSERT ON fp_plans WHEN NEW.bucket_key LIKE "
            "'bucket:[2-2%' BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )
    cfg = TuneConfig(
        spec=resolve("zoo:mlp", "D=16,HID=32,L=1"),
        dynamic="B=2..4",
        strategy="greedy",
        top_k=1,
        compile_baseline=False,
        timer={"warmup": 1, "min_reps": 3, "max_reps": 5, "max_seconds": 1.0},
    )
    results = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
    assert [r.plan is not None for r in results] == [True, True]
    first, second = results
    assert first.stored.startswith("NOT stored") and "disk says no" in first.stored
    assert "stored=True" in second.stored  # the next bucket was tuned and stored
    saved = Path(first.stored.split("saved to ")[1].split(":")[0])
    with sqlite3.connect(path) as con:
        con.execute("DROP TRIGGER no_small")
    counts = PlanCache(str(path)).import_records(json.loads(saved.read_text()))
    assert counts["stored"] == 1 and counts["specs"] == 1
    assert _rows(path, "fp_plans") == _rows(path, "fp_history") == 2


# ---- worker processes that die ------------------------------------------------------------------
def _journal_worker(index: int, journal: str, name: str, die_at: int) -> int:
    """A worker on a shared study; worker 1 is killed in the middle of a trial."""
    import optuna

    from search.optuna_storage import WORKER_ATTR, make_storage, worker_tag

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=make_storage(journal))

    def objective(trial):
        trial.set_user_attr(WORKER_ATTR, worker_tag())
        x = trial.suggest_float("x", -1, 1)
        if index == 1 and trial.number >= die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.01)
        return x * x

    study.optimize(objective, n_trials=12)
    return index


def test_a_dead_worker_leaves_the_others_running_and_its_trial_failed_and_requeued(tmp_path):
    optuna = pytest.importorskip("optuna")
    from search.optuna_storage import make_storage, run_workers

    journal = f"journal:{tmp_path / 'study.log'}"
    name = "faults-dead-worker"
    optuna.create_study(study_name=name, storage=make_storage(journal))
    with pytest.warns(UserWarning, match="worker 1: process .* died \\(killed by signal 9\\)"):
        done = run_workers(3, _journal_worker, (journal, name, 3), storage_url=journal)
    assert done == [0, 2]
    trials = optuna.load_study(study_name=name, storage=make_storage(journal)).trials
    states = [t.state.name for t in trials]
    assert "RUNNING" not in states and states.count("FAIL") == 1
    failed = next(t for t in trials if t.state.name == "FAIL")
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == failed.number]
    assert len(retry) == 1 and retry[0].params == failed.params


def _always_fails(index: int) -> int:
    raise ValueError(f"worker {index} cannot start")


def test_when_every_worker_fails_it_is_one_message(tmp_path):
    pytest.importorskip("optuna")
    from search.optuna_storage import run_workers

    journal = f"journal:{tmp_path / 'study.log'}"
    with (
        pytest.warns(UserWarning, match="stopped early"),
        pytest.raises(FusionPlannerError, match=r"every worker process failed.*cannot start"),
    ):
        run_workers(2, _always_fails, (), storage_url=journal)


# ---- the backend with a cache that is down ------------------------------------------------------
def test_the_backend_runs_the_model_right_when_its_cache_is_down():
    pytest.importorskip("sqlalchemy")
    import torch

    from planner.runtime.backend import fusion_planner_backend

    torch._dynamo.reset()
    module = small_block()
    count = Recording()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        be = fusion_planner_backend(
            "postgresql+psycopg://u@127.0.0.1:1/db",
            realizer=count,
        )
        run_shapes(torch.compile(module, backend=be, dynamic=True), module, [16, 24, 40])
    assert be.stats.default == 3 and be.stats.queued == 0  # misses; nothing could be queued
    assert not [f for f in be.stats.fallbacks if f.startswith("capture")]  # not marked broken
    assert be.cache is not None  # the cache object stays, to be used once the server is up


class OperationalError(Exception):
    """Named as the database drivers name a dropped connection."""


def test_a_trial_cut_off_by_a_database_outage_is_not_left_running(tmp_path, monkeypatch):
    optuna = pytest.importorskip("optuna")
    from search import parallel
    from search.optuna_storage import WORKER_ATTR, make_storage, study_prefix, worker_tag
    from zoo.randgraph import random_graph

    g = random_graph(8, 0)
    journal = f"journal:{tmp_path / 'study.log'}"
    name = study_prefix(g, "adhoc") + "outage"  # the job's study, as its strategy names it
    study = optuna.create_study(study_name=name, storage=make_storage(journal))
    calls: list[int] = []

    class CutOff:
        """A search whose first attempt loses its database mid-trial."""

        def plan(self, g, objective, budget, seed=0):
            calls.append(seed)
            if len(calls) == 1:
                trial = study.ask()
                trial.set_user_attr(WORKER_ATTR, worker_tag())
                raise RuntimeError("tell failed") from OperationalError("server closed")
            return types.SimpleNamespace(notes="")

    monkeypatch.setattr(parallel, "get_strategy", lambda name, **kw: CutOff())
    monkeypatch.setattr(parallel.time, "sleep", lambda s: None)
    parallel.plan_through_outages("tpe", {"storage": journal}, g, None, None, 0)
    assert len(calls) == 2
    trials = optuna.load_study(study_name=name, storage=make_storage(journal)).trials
    states = [t.state.name for t in trials]
    assert "RUNNING" not in states and "FAIL" in states
