"""The Strategy contract, run over every registered strategy; properties of the baselines.

A strategy added later (tpe, nsga2, rl) is picked up from the registry automatically and
must pass the contract tests with a small budget.
"""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import FusionPlannerError
from planner.fusion.legality import check
from planner.fusion.partition import Partition
from planner.objective import Objective
from search.strategies import STRATEGIES, get_strategy
from search.strategy import Budget, SearchResult, Strategy
from tests.partition_helpers import brute_force, h100_objective, zoo_graph
from tests.test_objective import Broken, FixedModel
from zoo.randgraph import random_graph

ALL = sorted(STRATEGIES)
SMALL = Budget(max_evals=400, max_seconds=5.0)
SLACK_EVALS = 2  # the final evaluation of the answer (and of unfused, if it fell back)


def test_registry_has_the_baselines_and_rejects_unknown_names():
    assert {"greedy", "priority", "exact"} <= set(ALL)
    assert isinstance(get_strategy("greedy"), Strategy)
    with pytest.raises(FusionPlannerError, match="unknown strategy"):
        get_strategy("simulated-annealing-9000")
    with pytest.raises(FusionPlannerError):
        Budget(max_evals=0)


# ---- the contract, for every registered strategy -----------------------------------------
# the largest graph only in the slow run: the two smaller ones hold every strategy to it;
# joint-tpe, by far the slowest, meets the middle one in the slow run too
@pytest.mark.parametrize(
    "name, n, seed",
    [
        pytest.param(name, n, seed, marks=pytest.mark.slow)
        if n == 60 or (n == 30 and name == "joint-tpe")
        else (name, n, seed)
        for n, seed in ((12, 1), (30, 2), (60, 3))
        for name in ALL
    ],
)
def test_contract_legal_within_budget_reproducible(name, n, seed):
    g = random_graph(n, seed)
    obj = h100_objective()
    r1 = get_strategy(name).plan(g, obj, SMALL, seed=7)
    assert isinstance(r1, SearchResult) and r1.strategy == name
    assert check(r1.partition, obj.limits).ok
    assert r1.evaluation.legal and math.isfinite(r1.evaluation.total_s)
    assert r1.evals_used <= SMALL.max_evals + SLACK_EVALS
    assert r1.seconds <= SMALL.max_seconds + 3.0
    assert r1.evaluation.total_s == pytest.approx(obj.evaluate(r1.partition).total_s)
    assert r1.history and r1.history[-1][2] == pytest.approx(r1.evaluation.score)
    r2 = get_strategy(name).plan(g, h100_objective(), SMALL, seed=7)
    assert r2.partition == r1.partition


@pytest.mark.parametrize("name", ALL)
def test_contract_tiny_eval_budget_is_respected(name):
    g = random_graph(40, 11)
    obj = h100_objective()
    r = get_strategy(name).plan(g, obj, Budget(max_evals=10))
    assert r.evals_used <= 10 + SLACK_EVALS and check(r.partition, obj.limits).ok


@pytest.mark.parametrize("name", ALL)
def test_contract_failing_cost_model_never_raises(name):
    g = random_graph(20, 5)
    for model in (Broken(), _FailsOnGroups()):
        obj = Objective(model)
        r = get_strategy(name).plan(g, obj, SMALL)
        assert check(r.partition, obj.limits).ok


class _FailsOnGroups(FixedModel):
    """Scores single ops, raises on anything fused: every merge fails to evaluate."""

    def group_cost(self, graph, nodes):
        if len(nodes) > 1:
            raise ValueError("cannot compile this group")
        return super().group_cost(graph, nodes)


# ---- the baselines against each other and against brute force --------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 10), seed=st.integers(0, 100_000), sync=st.sampled_from([0.0, 2e-6]))
def test_exact_equals_brute_force_and_beats_the_heuristics(n, seed, sync):
    g = random_graph(n, seed)
    obj = h100_objective(sync_s=sync)
    best, _ = brute_force(g, obj)
    results = {s: get_strategy(s).plan(g, obj) for s in ("greedy", "priority", "exact")}
    for r in results.values():
        assert check(r.partition, obj.limits).ok
    exact = results["exact"]
    assert exact.complete
    assert exact.total_s == pytest.approx(best, rel=1e-9)
    assert exact.total_s <= results["priority"].total_s * (1 + 1e-9)
    assert exact.total_s <= results["greedy"].total_s * (1 + 1e-9)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(10, 24), seed=st.integers(0, 100_000))
def test_every_strategy_is_legal_and_exact_is_best_on_larger_graphs(n, seed):
    g = random_graph(n, seed)
    obj = h100_objective()
    unfused = obj.unfused(g).total_s
    # the joint searches spend whatever time they are given: theirs is bounded by samples
    res = {
        s: get_strategy(s, **({"max_trials": 150} if s.startswith("joint") else {})).plan(
            g, obj, Budget(max_seconds=20)
        )
        for s in ALL
    }
    for r in res.values():
        assert check(r.partition, obj.limits).ok and r.total_s <= unfused * (1 + 1e-9)
    if res["exact"].complete:
        for r in res.values():
            assert res["exact"].total_s <= r.total_s * (1 + 1e-9)


@pytest.mark.parametrize(
    "seed",
    [0, pytest.param(1, marks=pytest.mark.slow)]
    + [pytest.param(s, marks=pytest.mark.slow) for s in range(2, 10)],
)
def test_exact_equals_brute_force_on_12_nodes(seed):
    g = random_graph(12, seed)
    obj = h100_objective()
    best, _ = brute_force(g, obj)
    r = get_strategy("exact").plan(g, obj)
    assert r.complete and r.total_s == pytest.approx(best, rel=1e-9)


def test_exact_plans_a_30_node_graph_and_the_transformer_block():
    g = random_graph(30, 0)
    t0 = time.perf_counter()
    r = get_strategy("exact").plan(g, h100_objective(), Budget(max_seconds=60))
    assert r.complete and time.perf_counter() - t0 < 60
    tb = get_strategy("exact").plan(zoo_graph("transformer-block"), h100_objective())
    assert tb.complete and "optimal" in tb.notes


def test_exact_gives_up_honestly_when_the_budget_runs_out():
    g = zoo_graph("llama-block")
    obj = h100_objective()
    r = get_strategy("exact").plan(g, obj, Budget(max_seconds=0.5))
    assert not r.complete and "not proven optimal" in r.notes
    assert check(r.partition, obj.limits).ok
    assert r.total_s <= get_strategy("greedy").plan(g, h100_objective()).total_s


@pytest.mark.parametrize("name", ALL)
def test_contract_bounds_are_reported_not_raised(name):
    g = random_graph(16, 9)
    obj = h100_objective(memory_bound_bytes=1)  # no plan can keep a tensor in 1 byte
    r = get_strategy(name).plan(g, obj, SMALL)
    assert r.evaluation.legal and not r.evaluation.feasible
    assert r.evaluation.score == math.inf and any("memory bound" in x for x in r.evaluation.reasons)


def test_priority_merges_only_while_it_helps():
    g = random_graph(80, 4)
    obj = h100_objective()
    r = get_strategy("priority").plan(g, obj)
    assert r.total_s < obj.unfused(g).total_s
    # no remaining legal neighbour merge would lower the modelled cost
    p = r.partition
    for a, b in sorted(p.group_edges)[:60]:
        merged = p.merge(a, b)
        if check(merged, obj.limits).ok:
            assert obj.evaluate(merged).total_s >= r.total_s * (1 - 1e-9)


def test_greedy_and_priority_plan_1000_nodes_fast():
    g = random_graph(1000, 0)
    for name in ("greedy", "priority"):
        t0 = time.perf_counter()
        r = get_strategy(name).plan(g, h100_objective())
        assert time.perf_counter() - t0 < 10.0 and r.evaluation.legal
        assert len(r.partition) < len(Partition.singletons(g))
