"""Cutting a graph into pipeline stages (planner/distributed/pipeline_split.py)."""

from __future__ import annotations

import argparse
import itertools
import random

import pytest

from cli.common import capture_for_planning, resolve
from planner.distributed.pipeline_split import boundary_bytes, split_stages, stage_costs
from planner.errors import FusionPlannerError


def _best_max(cost: list[float], stages: int) -> float:
    """The smallest costliest stage over every contiguous cut, by enumeration."""
    n = len(cost)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(cost[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_split_is_contiguous_and_as_balanced_as_any_cut(seed) -> None:
    rng = random.Random(seed)
    cost = [rng.choice([0.0, rng.uniform(0.1, 5.0)]) for _ in range(rng.randint(3, 9))]
    for stages in range(1, len(cost) + 1):
        runs = split_stages(cost, stages)
        assert len(runs) == stages and all(len(r) > 0 for r in runs)
        assert [i for r in runs for i in r] == list(range(len(cost)))
        worst = max(sum(cost[i] for i in r) for r in runs)
        assert worst == pytest.approx(_best_max(cost, stages), rel=1e-9)


def test_more_stages_than_ops_is_refused() -> None:
    with pytest.raises(FusionPlannerError, match="need at least 4 ops; the graph has 3"):
        split_stages([1.0, 1.0, 1.0], 4)


def _block():
    args = argparse.Namespace(model="zoo:transformer-block", shape="B=2,S=8,D=32,H=2",
                              device="h100", dtype="fp32")  # fmt: skip
    return capture_for_planning(resolve(args)).graph


# zoo:transformer-block in op order: 0 layer_norm, 1-10 q/k/v projections and their
# views, 11 matmul (scores), 12 div, 13 softmax, 14 matmul_1, 15-17 views and a clone,
# 18 linear_3 (out projection), 19 add (x + attention), 20 layer_norm_1, 21 linear_4,
# 22 gelu, 23 linear_5, 24 add_1 (residual + MLP)
ACT = 2 * 8 * 32 * 4  # one (B, S, D) fp32 tensor
SCORES = 2 * 2 * 8 * 8 * 4  # (B, H, S, S)


@pytest.mark.parametrize(
    ("cut", "want"),
    [
        (1, 2 * ACT),  # the normed x (read by the three projections) and x for the residual
        (12, SCORES + ACT + ACT),  # the scores, v (read by matmul_1, through its views), x
        (19, 2 * ACT),  # the out projection and x for the residual add
        (20, ACT),  # the residual sum alone
        (24, 2 * ACT),  # the residual sum again and the MLP's output
    ],
)
def test_a_cut_carries_every_tensor_read_after_it(cut, want) -> None:
    graph = _block()
    (sent,) = boundary_bytes(graph, [range(0, cut), range(cut, len(graph.nodes))])
    assert sent == want


def test_a_tensor_read_two_stages_on_crosses_both_cuts() -> None:
    graph = _block()
    # x is read by the add at 19: it crosses the cuts at 5 and 12 with the stage between
    runs = [range(0, 5), range(5, 12), range(12, 19), range(19, 25)]
    sent = boundary_bytes(graph, runs)
    # cut 5: normed x (read by linear_2), q and k (linear_1 is op 4: both reach their
    # views after the cut) and x
    assert sent[0] == 4 * ACT
    assert sent[2] == 2 * ACT  # cut 19 as above
    costs = stage_costs(graph, runs, [1.0] * 25, [0.0] * 25, 2.0)
    assert [c.send_bytes for c in costs] == [*sent, 0]
    # stage 3 keeps what it received and what add, layer_norm_1, linear_4, gelu, linear_5
    # and add_1 write: (B, S, D) each but the (B, S, 4D) of linear_4 and gelu
    assert costs[3].activation_bytes == sent[2] + 4 * ACT + 2 * 4 * ACT
