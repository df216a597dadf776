"""The corrected model drops into the planner's objective and the search strategies as is."""

from __future__ import annotations

import pytest
from learned_fakes import GRAPHS, fake_rows, graph

from learned_cost.analytical import AnalyticalModel
from learned_cost.corrected import CorrectedModel
from learned_cost.features import design_matrix
from learned_cost.mlp import CorrectionMLP
from planner.fusion.partition import Partition
from planner.hardware import get_spec
from planner.objective import Objective
from search.strategies import get_strategy
from search.strategy import Budget


@pytest.fixture(scope="module")
def corrected():
    spec = get_spec("h100")
    rows = fake_rows(30, seed=3, with_plans=False, graphs=(GRAPHS[0], GRAPHS[4]))
    d = design_matrix(rows, lambda _n: spec)
    mlp = CorrectionMLP(steps=300, n_members=1).fit(d.X, d.y)
    return CorrectedModel(AnalyticalModel(spec), mlp, model_id="mlp-free-objtest")


@pytest.mark.parametrize("strategy", ["greedy", "priority"])
def test_strategies_plan_under_the_corrected_model(corrected, strategy):
    g = graph("zoo:transformer-block", "B=2,S=64,D=128,H=4")
    objective = Objective(corrected)
    result = get_strategy(strategy).plan(g, objective, Budget(max_evals=2000), seed=0)
    assert result.evaluation.legal and result.evaluation.feasible
    # every group cost came from the corrected model, with its correction applied
    work = [c for c in result.evaluation.group_costs if c.latency_s > 0]
    assert work and all(c.correction != 1.0 for c in work)
    plan = objective.make_plan(
        result.partition, result.evaluation, strategy=strategy, device="h100", dtype="float32"
    )
    assert "mlp-free-objtest" in plan.cost_model


def test_objective_totals_are_the_corrected_group_costs(corrected):
    g = graph("zoo:mlp", "B=32,D=256,HID=512,L=2")
    p = Partition.singletons(g)
    ev = Objective(corrected).evaluate(p)
    assert ev.total_s == pytest.approx(corrected.plan_cost_s(g, p.groups))
    base = Objective(AnalyticalModel(corrected.spec)).evaluate(p)
    assert ev.total_s != pytest.approx(base.total_s)
