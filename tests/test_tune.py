"""The offline tuning job end to end on CPU: buckets searched, realized, measured, cached,
and found again by a runtime lookup."""

from __future__ import annotations

import pytest
import torch

from cli.main import main
from learned_cost.analytical import AnalyticalModel
from planner.hardware import get_spec
from planner.ir.capture import capture
from planner.plans.cache import PlanCache
from search.tune import TuneConfig, bucket_spec, tune
from zoo.modelspec import resolve

FAST_TIMER = {"warmup": 1, "min_reps": 3, "max_reps": 6, "max_seconds": 1.0}


def _cfg(**kw):
    spec = resolve("zoo:transformer-block", "B=1,D=32,H=2")
    base = dict(
        spec=spec,
        dynamic="S=8..16",
        strategy="priority",
        top_k=2,
        compile_baseline=False,
        budget_seconds=5.0,
        timer=FAST_TIMER,
    )
    return TuneConfig(**{**base, **kw})


def test_tune_stores_a_measured_plan_per_bucket_and_lookup_finds_it(tmp_path):
    torch.set_num_threads(1)
    cfg = _cfg()
    with PlanCache(str(tmp_path / "plans.sqlite")) as cache:
        results = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
        assert [r.bucket.key for r in results] == [
            b.key for b in bucket_spec(cfg).buckets([(1, 16, 32)])
        ]
        assert len(results) == 2  # pow2 over 8..16: [8-8] and [9-16]
        for r in results:
            assert r.plan is not None and r.plan.measured_s and r.plan.measured_s > 0
            assert r.plan.eager_s == r.eager.median_s
            assert all(c.error == "" for c in r.candidates)
            # the stored plan is the measured best among the candidates
            assert r.plan.measured_s == min(c.measured.median_s for c in r.candidates)
            best = min(r.candidates, key=lambda c: c.measured.median_s)
            if best.measurement is not None:  # a served candidate: its one call alone too
                assert r.plan.measured_synced_s == best.measurement.synced_s > 0
            else:  # eager beat the candidates (timed as a callable, not served)
                assert best.strategy == "eager" and r.plan.measured_synced_s is None
        # a shape inside the second bucket, captured the way the runtime does, hits it
        module, inputs = cfg.spec.with_params(S=12).build(device="meta")
        g = capture(module, inputs)
        hit = cache.lookup(g.structure_key, g.input_shapes)
        assert hit.hit and hit.entry.plan.n_groups == results[1].plan.n_groups
        assert hit.entry.plan.measured_synced_s == results[1].plan.measured_synced_s


def _mlp_tune_args(cache: str) -> list[str]:
    """`fusion-plan tune` of a small MLP over B=2..4, greedy, one candidate per bucket."""
    return [
        "tune",
        "--model",
        "zoo:mlp",
        "--shape",
        "D=16,HID=32,L=1",
        "--dynamic",
        "B=2..4",
        "--strategy",
        "greedy",
        "--top-k",
        "1",
        "--no-compile-baseline",
        "--cache",
        cache,
    ]


def test_tune_cli_table_and_queue_only_mode(tmp_path, capsys):
    args = _mlp_tune_args(str(tmp_path / "plans.sqlite"))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tuned zoo:mlp" in out
    # one row per bucket, naming the stored plan: the search's, or the unfused one where
    # eager measured faster on this machine
    rows = [line.split() for line in out.splitlines() if line.startswith("B ")]
    assert len(rows) == 2 and all(r[2] in ("greedy", "eager") for r in rows), out
    # nothing queued yet: --from-queue tunes no bucket and still succeeds
    assert main([*args, "--from-queue"]) == 0


@pytest.mark.slow
def test_tune_with_tpe_in_a_sqlite_study(tmp_path):
    pytest.importorskip("optuna")
    cfg = _cfg(strategy="tpe", trials=12, storage=f"sqlite:///{tmp_path}/study.db")
    with PlanCache(str(tmp_path / "plans.sqlite")) as cache:
        results = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
    assert all(r.plan is not None for r in results)
    assert (tmp_path / "study.db").exists()


def test_tune_updates_the_learned_model_online_and_saves_it(tmp_path):
    """The loop's measurements refine a learned correction (docs/formulas.md §13), and
    --cost-model-out writes the refined state, which loads back."""
    import json
    import shutil
    from pathlib import Path

    from learned_cost.corrected import load_corrected
    from planner.hardware import device_fingerprint

    # The committed CPU model, adopted by this CPU (CPU models are refused elsewhere).
    models = Path(__file__).resolve().parent.parent / "learned_cost" / "models"
    shutil.copy(models / "cpu.npz", tmp_path / "cpu.npz")
    meta = json.loads((models / "cpu.json").read_text())
    meta["device_fingerprints"] = [device_fingerprint("cpu")]
    (tmp_path / "cpu.json").write_text(json.dumps(meta))
    out = tmp_path / "refined.json"
    args = [
        *_mlp_tune_args(str(tmp_path / "plans.sqlite")),
        "--cost-model",
        str(tmp_path / "cpu.json"),
        "--cost-model-out",
        str(out),
    ]
    assert main(args) == 0
    online = json.loads(out.read_text())["online"]
    assert meta["online"].get("n_observations", 0) == 0
    assert online["n_observations"] == 2  # one measured plan per bucket
    assert online["bias"] != 0.0
    assert load_corrected(str(out), "cpu").online.state() == online


def test_tune_says_when_the_buckets_plans_were_made_on_different_graphs():
    from types import SimpleNamespace as NS

    from search.tune import graph_varies

    def result(key):
        return NS(plan=NS(structure_key=key), part="")

    assert graph_varies([result("a"), result("a"), NS(plan=None)], "S") == ""
    note = graph_varies([result("a"), result("b"), result("a")], "S")
    assert "graph changes with S" in note and "2 different graphs" in note
    assert "--from-queue" in note

    # a model with graph breaks: its graphs are compared part by part
    def part(key, which):
        return NS(plan=NS(structure_key=key), part=f"graph {which} of 2")

    assert graph_varies([part("a", 1), part("b", 2), part("a", 1), part("b", 2)], "S") == ""
    assert "2 different graphs" in graph_varies([part("a", 1), part("b", 2), part("c", 2)], "S")


def test_the_autotune_variant_compiles_each_gemm_group_with_max_autotune():
    from planner.fusion.partition import Partition
    from search.tune import Candidate, autotuned

    module, inputs = resolve("zoo:mlp", "B=4,D=16,HID=32,L=1").build(device="meta")
    g = capture(module, inputs)  # linear -> relu -> linear
    part = Partition.from_groups(g, [[0, 1], [2]])
    c = Candidate("priority", part, 1e-6)
    v = autotuned(c)
    # the fused GEMM + ReLU keeps its rewrite in max-autotune; the GEMM the rule leaves to
    # the library call eagerly is compiled, as templates are benchmarked against that call
    assert v.labels == ("inductor+autotune", "inductor+autotune")
    assert v.strategy == "priority+autotune" and v.partition is part and v.measured is None
    assert autotuned(v) is None  # nothing left to switch
    relu = Partition.from_groups(g, [[0], [1], [2]])
    only_relu = Candidate("greedy", relu, 1e-6, labels=("eager", "inductor", "eager"))
    assert autotuned(only_relu).labels == ("inductor+autotune", "inductor", "inductor+autotune")


def test_tune_measures_the_autotune_variant_and_stores_the_faster(tmp_path):
    torch.set_num_threads(1)
    cfg = _cfg(
        spec=resolve("zoo:mlp", "D=16,HID=32,L=1"),
        dynamic="B=4..4",
        top_k=1,
        prefer_eager=False,
        autotune_variant=True,
    )
    with PlanCache(str(tmp_path / "plans.sqlite")) as cache:
        (r,) = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
    assert [c.strategy for c in r.candidates] == ["priority", "priority+autotune"]
    assert all(c.error == "" and c.measured for c in r.candidates)
    best = min(r.candidates, key=lambda c: c.measured.median_s)
    assert r.plan.measured_s == best.measured.median_s and r.plan.strategy == best.strategy
    labels = [gp.realization for gp in r.plan.groups]
    assert ("+autotune" in labels[0]) == (best.strategy == "priority+autotune")
