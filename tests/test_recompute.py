"""Recompute: a cheap producer copied into the group that consumes it (planner.fusion.recompute),
priced by the cost models, realized, verified against eager, stored in plans and searched."""

from __future__ import annotations

import functools
import json

import pytest
import torch

import zoo
from learned_cost.analytical import AnalyticalModel
from learned_cost.realized import RealizedRoofline
from planner.cost import group_io
from planner.errors import PlanError
from planner.fusion import recompute as rc
from planner.fusion.partition import Partition, bits
from planner.hardware import get_spec
from planner.ir.capture import export_model
from planner.objective import Objective
from planner.plans.plan import Plan
from planner.realize.realizer import realize
from search.joint_search import run_joint
from search.joint_space import JointSpace
from search.strategies import get_strategy
from search.strategy import Budget, Clock
from tests.partition_helpers import zoo_graph

SMALL = {"B": 2, "S": 8, "D": 16}
SPEC = get_spec("h100", measured=False)


def _names(g, mask):
    return sorted(g.nodes[i].name for i in bits(mask))


@functools.cache
def _setup():
    """shared-act's graph at H100 shapes, priority's plan and its one recompute decision."""
    g = zoo_graph("shared-act", B=8, S=512, D=768)
    obj = Objective(AnalyticalModel(SPEC), spec=SPEC)
    part = get_strategy("priority").plan(g, obj).partition
    return g, part, rc.candidates(part)


def test_the_shared_activation_can_be_recomputed_in_the_head_and_nothing_else():
    g, part, cands = _setup()
    assert len(cands) == 1
    node, gm, cm = cands[0]
    assert g.nodes[node].op == "gelu"
    assert _names(g, gm) == ["linear"]  # the head's GEMM reads the activation
    assert _names(g, cm) == ["add", "gelu"]  # the bias-add comes with it: x is read instead
    assert rc.check_copies(part, ((gm, cm),)) is None
    assert not rc.cheap(g, next(i for i, n in enumerate(g.nodes) if n.op == "linear"))
    home = part.masks[part.group_of[node]]
    assert rc.check_copies(part, ((home, cm),)) is not None  # a group copying its own ops
    assert rc.check_copies(part, ((gm, cm | gm),)) is not None


def test_the_cost_model_counts_recomputed_flops_and_saved_bytes():
    g, part, ((node, gm, cm),) = _setup()
    (live_h, c_h, unread_h), (live_g, c_g, _unread_g) = [
        e for e in rc.effective(part, ((gm, cm),)) if e[0] & (part.masks[part.group_of[node]] | gm)
    ]
    y = g.nodes[node].outputs[0]
    assert y in unread_h and c_h == 0 and c_g == cm  # the home no longer writes y
    plain_h, plain_g = (group_io(g, bits(m)) for m in (live_h, live_g))
    io_h, io_g = group_io(g, bits(live_h), (), unread_h), group_io(g, bits(live_g), bits(c_g))
    assert plain_h.bytes_out - io_h.bytes_out == g.tensors[y].nbytes
    assert io_g.flops - plain_g.flops == rc.flops(g, cm)  # the add and GELU, computed again
    x = g.nodes[0].inputs[0]
    assert (
        io_g.bytes_in - plain_g.bytes_in
        == g.read_bytes(x) + g.read_bytes(g.nodes[0].inputs[1]) - g.tensors[y].nbytes
    )
    # the analytical model (one kernel per group) says it pays; the realized roofline says
    # why it does not on a library GEMM: the copies run as their own kernel before it
    # and write the activation anyway
    for model, wins in ((AnalyticalModel(SPEC), True), (RealizedRoofline(SPEC), False)):
        before = sum(model.group_cost(g, frozenset(bits(m))).latency_s for m in part.masks)
        after = sum(rc.group_cost(model, g, lv, c, None, u).latency_s
                    for lv, c, u in rc.effective(part, ((gm, cm),)))  # fmt: skip
        assert (after < before) == wins, type(model).__name__
    split = RealizedRoofline(SPEC).kernels(g, frozenset(bits(gm | cm)))
    assert frozenset(bits(cm)) in split


def test_a_recomputed_plan_round_trips_and_old_records_still_load():
    _g, part, ((_node, gm, cm),) = _setup()
    plan = Plan.from_partition(part, device="h100", dtype="bfloat16", strategy="joint-tpe",
                               cost_model="x", predicted_s=1.0).with_copies(((gm, cm),))  # fmt: skip
    assert plan.copies() == ((gm, cm),)
    back = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back == plan and back.copies() == ((gm, cm),)
    old = plan.to_json()
    for grp in old["groups"]:
        grp.pop("recompute", None)
    assert Plan.from_json(old).copies() == ()
    plain = Plan.from_partition(part, device="h100", dtype="bfloat16", strategy="p",
                                cost_model="x", predicted_s=1.0)  # fmt: skip
    assert all("recompute" not in grp for grp in plain.to_json()["groups"])


@pytest.mark.parametrize("dead_home", [False, True])
def test_a_recomputed_plan_realizes_and_matches_eager(dead_home):
    module, inputs = zoo.get("shared-act").build(SMALL, dtype=torch.float32, device="cpu")
    cap = export_model(module, inputs)
    g = cap.graph
    by = {n.op: i for i, n in enumerate(g.nodes)}
    if dead_home:  # the activation alone, copied into both consumers: its group runs nothing
        act = 1 << by["add"] | 1 << by["gelu"]
        part = Partition(g, [act, 1 << by["layer_norm"], 1 << by["linear"]])
        copies = rc.as_copies((m, act) for m in part.masks if m != act)
        assert rc.dead(part, copies) == act
    else:
        part = Partition(g, [1 << by["add"] | 1 << by["gelu"] | 1 << by["layer_norm"],
                             1 << by["linear"]])  # fmt: skip
        copies = ((1 << by["linear"], 1 << by["add"] | 1 << by["gelu"]),)
    assert rc.check_copies(part, copies) is None
    plan = Plan.from_partition(part, device="cpu", dtype="float32", strategy="t",
                               cost_model="x", predicted_s=1.0).with_copies(copies)  # fmt: skip
    r = realize(cap, plan)
    assert r.verified is not False and not r.fallbacks
    want = module(*inputs)
    got = r(*inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    head = part.group_of[by["linear"]]
    names = {n.name for n in r.modules[head].graph.nodes if n.op == "call_function"}
    assert {"add", "gelu"} <= {x.split("_")[0] for x in names}  # its copy is compiled in


def test_illegal_copies_are_refused_by_realize():
    module, inputs = zoo.get("shared-act").build(SMALL, dtype=torch.float32, device="cpu")
    cap = export_model(module, inputs)
    g = cap.graph
    by = {n.op: i for i, n in enumerate(g.nodes)}
    part = Partition.singletons(g)
    bad = Plan.from_partition(part, device="cpu", dtype="float32", strategy="t", cost_model="x",
                              predicted_s=1.0).with_copies(((1 << by["add"], 1 << by["linear"]),))  # fmt: skip
    with pytest.raises(PlanError, match="recompute is not legal"):
        realize(cap, bad)


def test_the_joint_space_offers_recompute_and_prices_it():
    g, _part, ((node, gm, cm),) = _setup()
    obj = Objective(AnalyticalModel(SPEC), spec=SPEC)
    space = JointSpace(g, obj)
    asked = []

    def ask(name, choices):
        asked.append(name)
        return True if name.startswith("c") else choices[0]

    v = space.sample(ask)
    assert v.copies == ((gm, cm),) and any(n.startswith(f"c{node}_") for n in asked)
    base, _ = space.predict(space.sample())
    with_copies, _ = space.predict(v)
    assert with_copies < base  # under the one-kernel model it pays (see above)
    out = run_joint(g, obj, Clock(obj, Budget(max_seconds=5)), method="rl",
                    max_trials=200, enumerate_up_to=10_000)  # fmt: skip
    assert out.best.variant.copies and out.best.predicted_s <= with_copies


def test_tune_carries_a_joint_search_recompute_into_the_plan_it_stores():
    from search.tune import candidate_plan, search_candidates
    from tests.test_tune import _cfg

    g, _part, ((_node, gm, cm),) = _setup()
    obj = Objective(AnalyticalModel(SPEC), spec=SPEC)
    cands = search_candidates(g, obj, _cfg(strategy="joint-rl", trials=100, top_k=2), "b")
    best = cands[0]
    assert best.strategy == "joint-rl" and best.copies == ((gm, cm),)
    plan = candidate_plan(obj, best, device="h100", dtype="bfloat16")
    assert plan.copies() == ((gm, cm),)


def test_random_recompute_points_of_a_block_realize_and_match_eager():
    import dataclasses
    import random

    module, inputs = zoo.get("gpt2-block").build({"B": 1, "S": 16, "D": 32, "H": 2})
    cap = export_model(module, inputs)
    obj = Objective(AnalyticalModel(SPEC), spec=SPEC)
    space = JointSpace(cap.graph, obj)
    rng = random.Random(0)
    done = 0
    while done < 2:
        # recompute always, partition decisions at random, the rule's labels (no autotuning)
        v = space.sample(
            lambda n, ch: True if n[0] == "c" else ch[0] if n[0] == "r" else rng.choice(list(ch))
        )
        if not v.copies:
            continue
        plan = obj.make_plan(v.partition, obj.evaluate(v.partition), strategy="t",
                             device="cpu", dtype="float32")  # fmt: skip
        groups = tuple(dataclasses.replace(gp, realization=lab)
                       for gp, lab in zip(plan.groups, v.labels))  # fmt: skip
        r = realize(cap, dataclasses.replace(plan, groups=groups).with_copies(v.copies))
        assert r.verified and not r.fallbacks
        torch.testing.assert_close(r(*inputs), module(*inputs), atol=1e-4, rtol=1e-3)
        done += 1


def test_plan_shows_the_copies_and_prices_each_group_with_them(capsys):
    from cli.main import main

    argv = ["plan", "--model", "zoo:shared-act", "--device", "h100", "--dtype", "bf16",
            "--strategy", "joint-rl", "--cost-model", "analytical", "--format", "json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = [r for r in out["groups"] if r.get("recompute")]
    assert row["recompute"] == ["add", "gelu"] and "+gelu" in row["ops"]
    copies = [g["recompute"] for g in out["plan"]["groups"] if g.get("recompute")]
    assert len(copies) == 1 and len(copies[0]) == 2
    assert sum(r["predicted_s"] for r in out["groups"]) == pytest.approx(out["plan"]["predicted_s"])


def test_a_recomputed_plan_survives_the_plan_cache(tmp_path):
    from planner.plans.buckets import parse_dynamic
    from planner.plans.cache import PlanCache

    g, part, ((_, gm, cm),) = _setup()
    plan = Plan.from_partition(part, device="h100", dtype="bfloat16", strategy="joint-tpe",
                               cost_model="x", predicted_s=1e-3,
                               device_fingerprint="fp").with_copies(((gm, cm),))  # fmt: skip
    spec = parse_dynamic("S=256..1024", {"B": (0, 0), "S": (0, 1)})
    with PlanCache(str(tmp_path / "plans.sqlite")) as cache:
        cache.store(plan, spec.bucket_of([(8, 512, 768)]))
    with PlanCache(str(tmp_path / "plans.sqlite")) as cache:
        got = cache.lookup(g.structure_key, [(8, 512, 768)], "fp", spec=spec)
    assert got.plan.copies() == ((gm, cm),)


def test_tune_serves_and_measures_a_recomputed_candidate(tmp_path):
    from planner.plans.cache import PlanCache
    from search.tune import TuneConfig, tune
    from tests.test_tune import FAST_TIMER
    from zoo.modelspec import resolve

    torch.set_num_threads(1)
    cfg = TuneConfig(spec=resolve("zoo:shared-act", "B=2,D=16"), dynamic="S=8..8",
                     strategy="joint-rl", top_k=1, compile_baseline=False, budget_seconds=2.0,
                     trials=50, timer=FAST_TIMER)  # fmt: skip
    with PlanCache(str(tmp_path / "plans.sqlite")) as cache:
        (r,) = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
    (c,) = [c for c in r.candidates if c.copies]  # the one-kernel model's pick: recompute
    assert c.error == "" and c.measured is not None and c.measured.median_s > 0
    assert not c.fallbacks
