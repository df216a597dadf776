"""The joint search space (partition, merge moves, realization per group), its searches,
the realizer's compile modes, tune's use of them and the measured benchmark's bookkeeping."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

import benchmarks.search_measured as sm
from learned_cost.realized import RealizedRoofline
from planner.errors import PlanError
from planner.fusion.legality import check
from planner.fusion.partition import Partition
from planner.fusion.realization import (
    LABELS,
    choices_for,
    realization_of,
    realizations_of,
    split_label,
    unmet,
)
from planner.fusion.recompute import check_copies
from planner.hardware import get_spec
from planner.ir.capture import export_model
from planner.objective import Objective
from planner.plans.plan import GroupPlan, Plan
from planner.realize.realizer import realize
from planner.realize.units import MODE_OPTIONS
from search.joint_search import WARM, describe, run_joint
from search.joint_space import JointSpace, Variant, default_ask
from search.strategies import get_strategy
from search.strategy import Budget, Clock
from search.tune import candidate_plan, search_candidates
from tests.partition_helpers import h100_objective, zoo_graph
from tests.test_tune import _cfg
from zoo.randgraph import random_graph


def realized_objective() -> Objective:
    spec = get_spec("h100", measured=False)
    return Objective(RealizedRoofline(spec), spec=spec)


def _anchored(graph, mask) -> bool:
    return any(graph.nodes[i].category.value == "compute" for i in range(len(graph.nodes))
               if mask >> i & 1)  # fmt: skip


# ---- labels --------------------------------------------------------------------------------
def test_choices_start_with_the_rule_and_only_gemm_groups_get_more():
    g = zoo_graph("transformer-block")
    part = get_strategy("priority").plan(g, h100_objective()).partition
    seen_more = False
    for mask in part.masks:
        ch = choices_for(g, mask)
        assert ch[0] == realization_of(g, mask)
        assert len(set(ch)) == len(ch) and set(ch) <= set(LABELS)
        if len(ch) > 1:
            seen_more = True
            assert _anchored(g, mask)
        for label in ch:
            assert unmet(g, mask, label) is None
        if not _anchored(g, mask):
            assert ch == (realization_of(g, mask),)
            assert unmet(g, mask, "inductor+autotune") is not None
    assert seen_more


def test_labels_with_a_mode_round_trip_through_the_plan_record():
    g = zoo_graph("mlp")
    part = Partition.singletons(g)
    reals = tuple("inductor+autotune" if _anchored(g, m) else "eager" for m in part.masks)
    plan = Plan.from_partition(part, device="h100", dtype="bfloat16", strategy="joint-tpe",
                               cost_model="x", predicted_s=1.0, realizations=reals)  # fmt: skip
    back = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert tuple(gp.realization for gp in back.groups) == reals
    assert split_label("concat_gemm+autotune") == ("concat_gemm", "autotune")
    with pytest.raises(PlanError):
        GroupPlan((0,), "inductor+bogus")


# ---- the realizer honours a mode -----------------------------------------------------------
def _tiny():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    return m.eval(), x, export_model(m.eval(), (x,))


def test_a_mode_label_is_compiled_by_its_compiler_and_reported():
    m, x, cap = _tiny()
    whole = Partition.from_groups(cap.graph, [range(len(cap.graph.nodes))])
    calls = []

    def recording(gm, fakes, fake_mode):
        calls.append(gm)
        return gm.forward

    r = realize(cap, whole, realizations=["inductor+autotune"], compiler=recording)
    assert r.realizations == ("inductor+autotune",) and len(calls) == 1 and not r.fallbacks
    torch.testing.assert_close(r(x), m(x))


def test_autotune_options_are_accepted_by_inductor():
    m, x, cap = _tiny()
    whole = Partition.from_groups(cap.graph, [range(len(cap.graph.nodes))])
    assert "config_patches" in MODE_OPTIONS["autotune"]
    r = realize(cap, whole, realizations=["inductor+autotune"])
    assert r.realizations == ("inductor+autotune",) and not r.fallbacks
    assert r.groups[0].compiled
    torch.testing.assert_close(r(x), m(x))


# ---- the space -------------------------------------------------------------------------------
def test_the_neutral_point_is_priority_with_the_rule_labels():
    for name in ("transformer-block", "llama-block", "mlp"):
        g = zoo_graph(name)
        obj = realized_objective()
        space = JointSpace(g, obj)
        v = space.sample(default_ask)
        assert v.partition == get_strategy("priority").plan(g, realized_objective()).partition
        assert v.labels == realizations_of(g, v.partition.masks) and v.non_default() == 0
        pred, ev = space.predict(v)
        assert pred == pytest.approx(ev.total_s)


@pytest.mark.parametrize("graph", ["llama-block", "random-60"])
def test_every_point_is_legal_and_labelled_from_its_groups_choices(graph):
    g = zoo_graph("llama-block") if graph == "llama-block" else random_graph(60, 4)
    obj = realized_objective()
    space = JointSpace(g, obj)
    rng = random.Random(0)
    for _ in range(30):
        v = space.sample(lambda name, choices: rng.choice(list(choices)))
        assert check(v.partition, obj.limits).ok
        assert check_copies(v.partition, v.copies) is None
        copies = dict(v.copies)
        for mask, label in zip(v.partition.masks, v.labels):  # a group with its copies
            assert label in choices_for(g, mask | copies.get(mask, 0))
        assert math.isfinite(space.predict(v)[0])


def test_merge_moves_reach_partitions_priority_does_not():
    g = zoo_graph("llama-block")
    space = JointSpace(g, realized_objective())
    assert space.merge_moves
    v = space.sample(lambda name, ch: True if name.startswith("m") else ch[0])
    assert len(v.partition) < len(space.priority)


# ---- the searches --------------------------------------------------------------------------
def test_a_small_space_is_enumerated_and_says_so():
    g = zoo_graph("mlp", B=8, D=32, HID=64, L=2)
    out = run_joint(g, realized_objective(), Clock(realized_objective(), Budget()),
                    method="rl", max_trials=10_000, enumerate_up_to=10_000)  # fmt: skip
    assert out.exhausted and "space exhausted after" in out.stop
    assert len(out.ranked) == len({f.variant.key for f in out.ranked})
    assert any(f.found_by == WARM for f in out.ranked)
    best = out.best
    assert all(best.predicted_s <= f.predicted_s for f in out.ranked)
    assert best.found_by in describe(out)


@pytest.mark.parametrize("method", ["tpe", "nsga2", "rl"])
def test_searches_stop_on_the_budget_and_never_lose_to_the_warm_start(method):
    g = random_graph(120, 5)
    obj = realized_objective()
    out = run_joint(g, obj, Clock(obj, Budget(max_seconds=1.5)), method=method,
                    max_trials=10_000, patience=10_000, enumerate_up_to=8)  # fmt: skip
    warm = next(f for f in out.ranked if f.found_by == WARM)
    assert out.best.predicted_s <= warm.predicted_s
    assert out.samples > 8


def test_a_joint_strategy_says_what_found_its_plan():
    g = zoo_graph("llama-block")
    r = get_strategy("joint-rl", max_trials=60).plan(g, realized_objective(), Budget(max_seconds=5))
    rows = r.extra["variants"]
    assert rows[0][0] == r.partition and r.extra["found_by"] == rows[0][3]
    assert any(row[3] == WARM for row in rows)
    assert r.extra["found_by"] in r.notes


def test_a_joint_search_without_trials_spends_its_budget_and_without_one_stops_at_a_cap():
    g = zoo_graph("transformer-block")
    obj = realized_objective()
    strat = get_strategy("joint-rl", patience=10**6)
    assert "budget spent" in strat.plan(g, obj, Budget(max_seconds=1.0)).notes
    assert "; 200 samples;" in strat.plan(g, obj).notes


# ---- tune ----------------------------------------------------------------------------------
def test_tune_searches_the_joint_space_by_default():
    from cli.main import build_parser
    from search.tune import TuneConfig

    args = build_parser("tune").parse_args(["tune"])
    assert args.strategy == TuneConfig.strategy == "joint-tpe"


def test_tune_labels_a_plan_a_baseline_also_found_by_the_baseline():
    g = zoo_graph("transformer-block", B=1, S=16, D=32, H=2)
    cands = search_candidates(g, realized_objective(), _cfg(strategy="tpe", trials=8), "b")
    prio = get_strategy("priority").plan(g, realized_objective()).partition
    assert [c.strategy for c in cands if c.partition == prio] == ["priority"]


def test_tune_takes_a_joint_search_top_k_with_their_labels():
    g = zoo_graph("llama-block")
    obj = realized_objective()
    cfg = _cfg(strategy="joint-rl", trials=60, top_k=3)
    cands = search_candidates(g, obj, cfg, "b")
    keys = [c.key for c in cands]
    assert len(keys) == len(set(keys))
    joint = [c for c in cands if c.strategy == "joint-rl"]
    assert joint and all(c.labels is not None and c.found_by for c in joint)
    assert any(c.strategy == "priority" for c in cands)
    c = joint[0]
    plan = candidate_plan(obj, c, device="h100", dtype="bfloat16")
    assert tuple(gp.realization for gp in plan.groups) == c.labels
    assert plan.strategy == "joint-rl" and c.found_by in plan.notes


# ---- the measured benchmark's bookkeeping --------------------------------------------------
def _row(cell, prio, joint, greedy=None, lb=1e-3, ma=None):
    strategies = {"priority": {"best_s": prio, "best_found_by": "priority"}}
    strategies["joint-tpe"] = {"best_s": joint, "best_found_by": "tpe trial 3", "tune_s": 10.0}
    if greedy is not None:
        strategies["greedy"] = {"best_s": greedy, "best_found_by": "greedy"}
    alts = {"eager": {"median_s": 2 * prio, "compile_s": 0.0}}
    if ma is not None:
        alts["max-autotune"] = {"median_s": prio, "compile_s": ma}
    return {"cell": cell, "ops": 3, "device": "d", "dtype": "t", "roofline_lb_s": lb,
            "alternatives": alts, "strategies": strategies}  # fmt: skip


def test_rows_resume_and_the_table_is_computed_from_them(tmp_path):
    path = tmp_path / "search_measured.jsonl"
    rows = [_row("a", 2e-3, 1e-3, greedy=3e-3, ma=20.0), _row("b", 1e-3, 1e-3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cell": "c", "cut')
    back = sm.read_rows(path)
    assert [r["cell"] for r in back] == ["a", "b"]
    assert sm.done_cells(back, "d", "t") == {"a", "b"} and sm.done_cells(back, "x", "t") == set()
    text = sm.markdown(back, "cmd")
    geo = math.sqrt((1e-3 / 2e-3) * 1.0)
    assert f"{geo:.3f}x" in text
    assert f"{1e-3 / 2e-3:.3f}" in text  # cell a's joint-tpe ratio to priority
    assert "1/2 cells" in text  # strictly faster than best-of(greedy, priority) on a only
    assert "1/1 cells" in text.split("max-autotune's compile time")[1]
    assert "| a | — | — | 10 | 20 |" in text  # tuning seconds per strategy, then max-autotune's


def test_cells_filter_and_strategies_without_optuna(monkeypatch):
    quick = sm.cells(True, [])
    assert len(quick) == 2 and all(len(c) == 3 for c in quick)
    assert quick[0][1].startswith("zoo:") and not quick[1][1].startswith("zoo:")
    llama = sm.cells(False, ["zoo:llama*"])
    assert len(llama) == 1 and llama[0][1] == "zoo:llama-block"
    monkeypatch.setattr(sm, "optuna", None)
    runnable, skipped = sm.available(sm.STRATEGIES)
    assert set(skipped) == set(sm.NEEDS_OPTUNA) and "joint-rl" in runnable


@pytest.mark.slow
def test_measure_quick_smoke_runs_on_cpu(tmp_path):
    import benchmarks.search_quality as sq

    out = tmp_path / "sq"
    argv = ["--measure", "--quick", "--out", str(out), "--budget-s", "1", "--trials", "20",
            "--cells", "zoo:mlp*", "--strategies", "priority,joint-rl"]  # fmt: skip
    assert sq.main(argv) == 0
    rows = sm.read_rows(out / "search_measured.jsonl")
    assert len(rows) == 1 and rows[0]["strategies"]["priority"]["best_s"] > 0
    assert sq.main(argv) == 0  # resumed: the cell is not measured again
    assert len(sm.read_rows(out / "search_measured.jsonl")) == 1


def test_variant_counts():
    g = zoo_graph("mlp")
    part = Partition.singletons(g)
    labels = tuple(realization_of(g, m) for m in part.masks)
    v = Variant(part, labels)
    assert v.non_default() == 0 and v.autotuned() == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, params", [("transformer-block", {"B": 1, "S": 16, "D": 32, "H": 2})]
)
def test_every_choice_of_every_group_realizes_and_matches_eager(name, params):
    import zoo

    module, inputs = zoo.get(name).build(params, dtype=torch.float32, device="cpu")
    cap = export_model(module, inputs)
    g = cap.graph
    part = get_strategy("priority").plan(g, realized_objective()).partition
    choices = [choices_for(g, m) for m in part.masks]
    for k in range(1, max(len(c) for c in choices)):
        labels = [c[k] if k < len(c) else c[0] for c in choices]
        r = realize(cap, part, realizations=labels)
        assert list(r.realizations) == labels and not r.fallbacks
        torch.testing.assert_close(r(*inputs), module(*inputs), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("model", ["realized", "learned"])
def test_label_costs_agree_with_the_model_on_the_rule_label(model):
    from search.cost_models import cost_model_for
    from search.joint_space import label_cost

    m = cost_model_for(model, "h100")
    g = zoo_graph("llama-block")
    part = get_strategy("priority").plan(g, Objective(m)).partition
    for mask in part.masks:
        nodes = frozenset(i for i in range(len(g.nodes)) if mask >> i & 1)
        rule = realization_of(g, mask)
        assert label_cost(m, g, mask, rule) == pytest.approx(m.group_cost(g, nodes).latency_s)
        for label in choices_for(g, mask):
            assert math.isfinite(label_cost(m, g, mask, label))


def test_split_moves_split_a_gemm_from_its_epilogue_legally():
    g = zoo_graph("llama-block")
    obj = realized_objective()
    space = JointSpace(g, obj)
    assert space.split_moves
    v = space.sample(lambda name, ch: True if name.startswith("s") else ch[0])
    assert len(v.partition) == len(space.priority) + len(space.split_moves)
    assert check(v.partition, obj.limits).ok
    for a in space.split_moves:  # the GEMM's group holds nothing that reads the rest
        head = v.partition.masks[v.partition.group_of[a]]
        for i in range(len(g.nodes)):
            if head >> i & 1 and i != a:
                assert space._head(head, a) >> i & 1
