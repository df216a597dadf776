"""The collector end to end on tiny real models (real export, real Inductor, real Parquet),
and its parts: keys, the store, sampling, job and unit planning."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pyarrow.parquet as pq
import pytest

import zoo
from learned_cost.analytical import AnalyticalModel
from learned_cost.data import group_rows, load_profiles, plan_groups, plan_rows
from planner.errors import FusionPlannerError
from planner.features import group_descriptor
from planner.fusion.legality import check, group_reasons
from planner.fusion.partition import Partition, is_convex, mask_of
from planner.hardware import get_spec
from planner.ir.capture import export_model
from profiling.collector import CollectConfig, Collector, Job, _work, jobs_for, plan_units
from profiling.dataset import COLLECTOR_VERSION, COLUMNS, ProfileStore, row_key
from profiling.sampling import random_groups, random_partition

SPEC = get_spec("cpu")


def graph_of(name: str, params: dict[str, int]):
    module, inputs = zoo.get(name).build(params, device="meta")
    return export_model(module, inputs).graph


# ---- keys and the store -------------------------------------------------------------------
def test_row_key_is_stable_order_free_and_sensitive_to_what_matters():
    k = row_key("g", [3, 1, 2], "cpu-x", "float32", "inductor", "2.13.0")
    assert k == row_key("g", [1, 2, 3], "cpu-x", "float32", "inductor", "2.13.0")
    others = {
        row_key("g", [1, 2], "cpu-x", "float32", "inductor", "2.13.0"),
        row_key("g", [1, 2, 3], "cuda-y", "float32", "inductor", "2.13.0"),
        row_key("g", [1, 2, 3], "cpu-x", "bfloat16", "inductor", "2.13.0"),
        row_key("g", [1, 2, 3], "cpu-x", "float32", "eager", "2.13.0"),
        row_key("g", [1, 2, 3], "cpu-x", "float32", "inductor", "2.11.0"),
    }
    assert k not in others and len(others) == 5
    plan = row_key("g", [[2, 3], [1]], "cpu-x", "float32", "auto", "2.13.0")
    assert plan == row_key("g", [[1], [3, 2]], "cpu-x", "float32", "auto", "2.13.0")


def _row(key: str, **kw):
    row = {c: 0 for c, _ in COLUMNS}
    row.update(key=key, kind="group", measured_median_s=1e-3, ok=True, error="", **kw)
    return row


def test_store_resumes_skips_duplicates_and_refuses_to_clobber(tmp_path):
    path = tmp_path / "p.parquet"
    s = ProfileStore(path)
    assert s.add(_row("a")) and s.add(_row("b", desc_x=1.5)) and not s.add(_row("a"))
    s.flush()
    again = ProfileStore(path, resume=True)
    assert again.has("a") and len(again) == 2 and not again.add(_row("b"))
    again.add(_row("c"))
    again.flush()
    assert pq.read_table(path).num_rows == 3
    with pytest.raises(FusionPlannerError, match="--resume"):
        ProfileStore(path, resume=False)
    with pytest.raises(FusionPlannerError, match="lacks"):
        again.add({"key": "z"})


# ---- sampling ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["transformer-block", "resnet-bottleneck"])
def test_random_groups_are_legal_convex_distinct_and_reproducible(name):
    g = graph_of(name, {"transformer-block": {"S": 64}, "resnet-bottleneck": {"HW": 8}}[name])
    groups = random_groups(g, 10, random.Random(1), spec=SPEC)
    assert len(groups) == len(set(groups)) >= 5
    for grp in groups:
        assert len(grp) >= 2 and is_convex(g, mask_of(grp)) and not group_reasons(g, grp, SPEC)
    assert groups == random_groups(g, 10, random.Random(1), spec=SPEC)


def test_random_partitions_are_legal_and_fuse_something():
    g = graph_of("gpt2-block", {"S": 64})
    for seed in range(3):
        p = random_partition(g, random.Random(seed), spec=SPEC)
        assert check(p, SPEC).ok and len(p) < len(g)


# ---- jobs and units ----------------------------------------------------------------------
def test_jobs_skip_shapes_a_model_does_not_take_and_default_sweeps_apply():
    jobs = jobs_for(["zoo:mlp", "zoo:gpt2-block"], ["B=4,S=32"], ["fp32", "bf16"], "cpu")
    assert {j.model for j in jobs} == {"zoo:gpt2-block"}  # mlp has no S
    assert {j.dtype for j in jobs} == {"float32", "bfloat16"}
    auto = jobs_for(["zoo:matmul"], None, ["fp32"], "gpu")
    assert len(auto) == 3 and all(j.shape.startswith("M=") for j in auto)


def test_jobs_skip_shapes_a_file_factory_does_not_take(tmp_path):
    models = tmp_path / "models.py"
    models.write_text(
        "import torch\n"
        "def seq(B=1, S=8):\n    return torch.nn.Linear(S, S), (torch.randn(B, S),)\n"
        "def img(B=1, IMG=4):\n    return torch.nn.Linear(IMG, IMG), (torch.randn(B, IMG),)\n"
    )
    specs = [f"{models}:seq", f"{models}:img"]
    jobs = jobs_for(specs, ["B=2,S=16", "B=2,IMG=8"], ["fp32"], "cpu")
    assert sorted((j.model.rsplit(":", 1)[1], j.shape) for j in jobs) == [
        ("img", "B=2,IMG=8"),
        ("seq", "B=2,S=16"),
    ]


def test_units_cover_singles_strategy_groups_random_groups_and_plans_once():
    g = graph_of("mlp", {"B": 4, "D": 16, "HID": 32, "L": 2})
    cfg = CollectConfig(models=[], groups_per_graph=3, random_plans=2)
    makers = {"whole": lambda graph: Partition.whole(graph)}
    units = plan_units(g, Job("zoo:mlp", "", "float32"), makers, cfg, "cpu-x", "2.13.0", SPEC)
    keys = [u.key for u in units]
    assert len(keys) == len(set(keys))
    plans = [u for u in units if u.kind == "plan"]
    assert {u.strategy for u in plans} >= {"unfused", "whole"}
    singles = [u for u in units if u.kind == "group" and len(u.groups[0]) == 1]
    assert len(singles) == len(g)  # every op of the MLP does work
    assert any(u.strategy == "whole" and u.kind == "group" for u in units)


def test_every_plan_has_its_groups_timed_alone_unless_told_not_to():
    g = graph_of("mlp", {"B": 4, "D": 16, "HID": 32, "L": 2})
    makers = {"whole": lambda graph: Partition.whole(graph)}
    job = Job("zoo:mlp", "", "float32")

    def units_for(plan_groups: bool) -> list:
        cfg = CollectConfig(models=[], groups_per_graph=0, random_plans=3, plan_groups=plan_groups)
        return plan_units(g, job, makers, cfg, "cpu-x", "2.13.0", SPEC)

    def uncovered(units: list) -> set:
        alone = {u.groups[0] for u in units if u.kind == "group"}
        return {
            grp
            for u in units
            if u.kind == "plan"
            for grp in u.groups
            if _work(g, grp) and grp not in alone
        }

    with_groups, without = units_for(True), units_for(False)
    assert not uncovered(with_groups)
    assert uncovered(without)  # the random plans fuse groups no other unit times
    # a re-timing run: whole plans only, the same plans
    cfg = CollectConfig(
        models=[],
        groups_per_graph=0,
        random_plans=3,
        singles=False,
        plan_groups=False,
        strategy_groups=False,
    )
    plans_only = plan_units(g, job, makers, cfg, "cpu-x", "2.13.0", SPEC)
    assert plans_only and all(u.kind == "plan" for u in plans_only)
    assert {u.key for u in plans_only} == {u.key for u in with_groups if u.kind == "plan"}
    # the extra units change none of the others (the random draws are the same)
    assert {u.key for u in without} < {u.key for u in with_groups}


# ---- end to end --------------------------------------------------------------------------
def test_collect_writes_dataset_v1_rows_learned_cost_can_read_and_resumes(tmp_path):
    out = tmp_path / "cpu.parquet"
    cfg = CollectConfig(
        models=["zoo:mlp", "zoo:pointwise-chain"],
        shapes=["B=8,D=32,HID=64,L=1", "N=4096,STEPS=4"],
        dtypes=["fp32"],
        groups_per_graph=1,
        random_plans=1,
        out=out,
        threads=1,
    )
    lines: list[str] = []
    makers = {"whole": lambda graph: Partition.whole(graph)}
    summary = Collector(cfg, AnalyticalModel(SPEC), makers, lines.append).run()
    assert summary.measured == summary.planned > 0 and not summary.errors
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == summary.measured and len({r["key"] for r in rows}) == len(rows)
    assert any("[1/" in line for line in lines)
    for r in rows:
        assert all(c in r for c, _ in COLUMNS)
        assert (
            r["device"] == "cpu"
            and r["torch_version"]
            and r["collector_version"] == COLLECTOR_VERSION
        )
        assert r["ok"], r["error"]
        assert r["measured_median_s"] > 0 and r["measured_p99_s"] >= r["measured_median_s"]
        assert r["analytical_s"] > 0 and r["family"] in ("mlp", "pointwise-chain")
        # the host's whole call is kept beside a plan's timing (on the CPU they are one)
        if r["kind"] == "plan":
            assert r["call_median_s"] == r["measured_median_s"]
        else:
            assert math.isnan(r["call_median_s"])
    group = next(r for r in rows if r["kind"] == "group" and r["n_groups"] == 1)
    graph = graph_of(group["family"], dict(kv.split("=") for kv in group["shape"].split(",")))
    desc = group_descriptor(graph, json.loads(group["nodes"]))
    assert {f"desc_{k}" for k in desc} <= set(group) and group["desc_n_ops"] == desc["n_ops"]
    profiles = load_profiles(out)
    assert group_rows(profiles) and plan_rows(profiles)
    plan = next(r for r in plan_rows(profiles) if r["strategy"] == "whole")
    assert len(plan_groups(plan)) == 1 and plan["realization"] != "eager"
    # resume: nothing new to measure
    cfg.resume = True
    again = Collector(cfg, AnalyticalModel(SPEC), makers, lines.append).run()
    assert again.measured == 0 and again.skipped == summary.planned
    assert math.isclose(pq.read_table(out).num_rows, len(rows))


def test_time_limit_stops_cleanly_and_keeps_what_was_measured(tmp_path):
    out = tmp_path / "t.parquet"
    cfg = CollectConfig(
        models=["zoo:pointwise-chain"], shapes=["N=1024,STEPS=2"], out=out, max_seconds=0.0
    )
    summary = Collector(cfg, AnalyticalModel(SPEC), {}, lambda _: None).run()
    assert summary.stopped_early and summary.measured == 0


@pytest.mark.slow
def test_compile_workers_plan_and_warm_jobs_for_the_measuring_process(tmp_path):
    from search.planning import plan_maker

    out = tmp_path / "w.parquet"
    cfg = CollectConfig(
        models=["zoo:mlp"],
        shapes=["B=8,D=32,HID=64,L=1"],
        groups_per_graph=2,
        random_plans=1,
        out=out,
        workers=1,
        threads=1,
    )
    makers = {"greedy": plan_maker("greedy", AnalyticalModel(SPEC))}
    lines: list[str] = []
    summary = Collector(cfg, AnalyticalModel(SPEC), makers, lines.append).run()
    rows = pq.read_table(out).to_pylist()
    assert summary.measured == len(rows) > 0 and all(r["ok"] for r in rows)
    # every graph is compiled before the first unit is timed (warm_first)
    warmed = next(i for i, line in enumerate(lines) if "compiled 1/1" in line)
    first_job = next(i for i, line in enumerate(lines) if line.startswith("job 1/1"))
    assert warmed < first_job
    compiled = [r for r in rows if r["kind"] == "group" and r["realization"] != "eager"]
    assert compiled and max(r["compile_s"] for r in compiled) < 2.0  # cache hits
    # a resume through the workers measures nothing again, and says so
    again = Collector(replace(cfg, resume=True), AnalyticalModel(SPEC), makers, lines.append).run()
    assert again.measured == 0 and again.skipped == len(rows) == again.planned


def test_measure_and_collect_commands_end_to_end(tmp_path, capsys):
    from cli.main import main

    rc = main(
        [
            "measure",
            "--model",
            "zoo:mlp",
            "--shape",
            "B=4,D=16,HID=32,L=1",
            "--strategy",
            "unfused",
            "--no-compile",
            "--threads",
            "1",
            "--format",
            "json",
        ]
    )
    payload = json.loads(capsys.readouterr().out)
    assert rc == 0 and payload["verified"] and payload["device"] == "cpu"
    assert set(payload["results"]) == {"eager", "plan (unfused)"}
    assert payload["results"]["eager"]["median_s"] > 0 and payload["predicted_s"] > 0
    out = tmp_path / "c.parquet"
    rc = main(
        [
            "collect",
            "--models",
            "zoo:pointwise-chain",
            "--shapes",
            "N=1024,STEPS=2",
            "--strategies",
            "unfused",
            "--groups-per-graph",
            "0",
            "--random-plans",
            "0",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    rows = pq.read_table(out).to_pylist()
    assert rc == 0 and rows and {r["kind"] for r in rows} == {"group", "plan"}


def test_warm_up_before_timing_stops_at_its_share_of_the_time_limit():
    """Workers that are late do not eat the session: after WARM_SHARE of max_seconds the
    measuring process starts, and plans the jobs not warmed yet itself."""
    import time
    from concurrent.futures import Future

    from profiling.collector import WARM_SHARE

    cfg = CollectConfig(models=["zoo:mlp"], out="unused.parquet", max_seconds=1.0, workers=1)
    lines: list[str] = []
    collector = Collector(cfg, AnalyticalModel(SPEC), {}, lines.append)
    done, never = Future(), Future()
    done.set_result(("key", [], []))
    t0 = time.perf_counter()
    collector._warm_all({"a": done, "b": never, "c": Future()}, t0)
    waited = time.perf_counter() - t0
    assert WARM_SHARE * 1.0 - 0.05 <= waited < 1.0
    assert any("warm-up stopped at 2/3" in line for line in lines)


def test_collect_measures_each_strategy_under_a_learned_model_too(tmp_path, capsys):
    """--learned adds STRATEGY@learned plans: each model's own best, for ranking tests."""
    from learned_fakes import fake_rows

    from cli.main import main
    from learned_cost.features import design_matrix
    from learned_cost.mlp import CorrectionMLP
    from learned_cost.persist import save_model
    from planner.hardware import device_fingerprint, get_spec

    cpu = get_spec("cpu")
    d = design_matrix(fake_rows(10, seed=2, with_plans=False), lambda _n: cpu)
    model = tmp_path / "cpu.json"
    save_model(
        CorrectionMLP(steps=50, n_members=1).fit(d.X, d.y),
        model,
        spec=cpu,
        device_fingerprints=(device_fingerprint("cpu"),),
    )
    base = ["collect", "--models", "zoo:mlp", "--shapes", "B=4,D=16,HID=32,L=1"]
    base += ["--strategies", "greedy", "--groups-per-graph", "0", "--random-plans", "0"]
    base += ["--no-singles", "--threads", "1"]
    out = tmp_path / "l.parquet"
    assert main([*base, "--learned", str(model), "--out", str(out)]) == 0
    assert "not used" not in capsys.readouterr().err
    plans = [r for r in pq.read_table(out).to_pylist() if r["kind"] == "plan"]
    # the learned model's greedy plan is measured, or is the analytical one (one unit)
    assert (
        {"unfused", "greedy"}
        <= {r["strategy"] for r in plans}
        <= {
            "unfused",
            "greedy",
            "greedy@learned",
        }
    )
    # a missing file is refused before anything runs
    with pytest.raises(SystemExit) as exit_info:
        main([*base, "--learned", str(tmp_path / "missing.json"), "--out", str(out)])
    assert exit_info.value.code == 2 and "no cost model file" in capsys.readouterr().err
    # a model that does not load here is not used, and says so; the rest runs
    other = tmp_path / "corrupt.json"
    other.write_text("{}")
    out2 = tmp_path / "m.parquet"
    with pytest.warns(UserWarning, match="falling back"):
        assert main([*base, "--learned", str(other), "--out", str(out2)]) == 0
    assert "--learned" in capsys.readouterr().err and pq.read_table(out2).num_rows


def test_plans_from_a_file_are_measured_with_their_groups(tmp_path):
    from cli.commands.collect import read_plans

    g = graph_of("mlp", {"B": 4, "D": 16, "HID": 32, "L": 2})
    job = Job("zoo:mlp", "", "float32")
    pairs = [[0, 1], *[[i] for i in range(2, len(g))]]
    path = tmp_path / "plans.json"
    path.write_text(
        json.dumps(
            {
                "plans": [
                    {"graph_key": g.key, "strategy": "mine", "groups": pairs},
                    {"graph_key": g.key, "strategy": "bad", "groups": [[0]]},  # covers 1 op
                    {"graph_key": "another-graph", "strategy": "x", "groups": [[0]]},
                ]
            }
        )
    )
    cfg = CollectConfig(
        models=[], groups_per_graph=0, random_plans=0, singles=False, extra_plans=read_plans(path)
    )
    notes: list[str] = []
    units = plan_units(g, job, {}, cfg, "cpu-x", "2.13.0", SPEC, notes)
    plans = {u.strategy: u for u in units if u.kind == "plan"}
    assert set(plans) == {"unfused", "mine"}
    assert plans["mine"].groups[0] == (0, 1)
    assert any(u.kind == "group" and u.groups[0] == (0, 1) for u in units)
    assert len(notes) == 1 and "bad" in notes[0] and "does not fit" in notes[0]
    path.write_text('{"plans": [{"graph_key": "k"}]}')
    with pytest.raises(FusionPlannerError, match="not a plans file"):
        read_plans(path)
