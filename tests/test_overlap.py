"""Two-stream critical path: hand-built timelines, captured collectives, DP buckets."""

from __future__ import annotations

import pytest
import torch
import torch.distributed._functional_collectives as fc

from learned_cost.analytical import AnalyticalModel
from planner.distributed import parallel_models as pm
from planner.distributed.comm_cost import collective_time_s
from planner.distributed.dp import BackwardStep, dp_step_timeline, pack
from planner.distributed.links import LINKS
from planner.distributed.overlap import COMM, COMPUTE, Task, plan_tasks, schedule
from planner.distributed.streams import evaluate_streams
from planner.fusion.partition import Partition
from planner.hardware import get_spec
from planner.ir.capture import capture
from planner.objective import Objective


def test_collective_overlaps_independent_compute_and_blocks_its_consumer() -> None:
    # A(3) -> C(2, comm) -> D(1); B(4) independent of C
    tl = schedule(
        [
            Task("A", COMPUTE, 3),
            Task("C", COMM, 2, (0,)),
            Task("B", COMPUTE, 4, (0,)),
            Task("D", COMPUTE, 1, (1, 2)),
        ]
    )
    assert tl.start_s == (0, 3, 3, 7) and tl.makespan_s == 8
    assert (tl.t_comp_s, tl.t_comm_s, tl.exposed_comm_s) == (8, 2, 0)
    assert tl.ratio == 4
    # with less independent compute, 1 s of the all-reduce shows
    short = schedule(
        [
            Task("A", COMPUTE, 3),
            Task("C", COMM, 2, (0,)),
            Task("B", COMPUTE, 1, (0,)),
            Task("D", COMPUTE, 1, (1, 2)),
        ]
    )
    assert short.makespan_s == 6 and short.exposed_comm_s == 1
    assert short.makespan_s < short.t_comp_s + short.t_comm_s


def test_a_task_cannot_wait_for_a_later_one() -> None:
    with pytest.raises(ValueError, match="later task"):
        schedule([Task("A", COMPUTE, 1, (1,)), Task("B", COMPUTE, 1)])


class TwoBranches(torch.nn.Module):
    """A tensor-parallel branch (GEMM then all-reduce) beside an independent GEMM chain."""

    def __init__(self, group) -> None:
        super().__init__()
        self.a, self.b1, self.b2 = (torch.nn.Linear(32, 32) for _ in range(3))
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        reduced = fc.all_reduce(self.a(x), "sum", self.group)
        return reduced + self.b2(torch.relu(self.b1(x)))


def test_captured_all_reduce_hides_behind_the_independent_branch() -> None:
    g = capture(TwoBranches(pm.capture_group(2)), (torch.randn(8, 32),))
    singletons = [frozenset((n.index,)) for n in g.nodes]
    tasks = plan_tasks(g, singletons, lambda grp: 1.0, lambda c: 1.5)
    assert [t.stream for t in tasks].count(COMM) == 1
    tl = schedule(tasks)
    # the all-reduce (1.5) runs while b1, relu, b2 compute (3 x 1.0): nothing exposed
    assert tl.t_comm_s == 1.5 and tl.exposed_comm_s == 0.0
    # in capture's order the wait sits right after the all-reduce and stalls compute
    as_captured = schedule(plan_tasks(g, singletons, lambda grp: 1.0, lambda c: 1.5, False))
    assert as_captured.exposed_comm_s == 1.5
    # a slower link leaves the difference exposed
    slow = schedule(plan_tasks(g, singletons, lambda grp: 1.0, lambda c: 5.0))
    assert slow.exposed_comm_s == pytest.approx(5.0 - 3.0)


def test_tp_mlp_all_reduce_is_fully_exposed() -> None:
    m, x = pm.TPMLP(16, 64, 2, pm.capture_group(2)), (torch.randn(2, 4, 16),)
    g = capture(m, x)
    tl = schedule(
        plan_tasks(g, [frozenset((n.index,)) for n in g.nodes], lambda _: 1.0, lambda c: 2.0)
    )
    assert tl.exposed_comm_s == tl.t_comm_s == 2.0  # every op after it needs its result


def test_pack_is_ddp_order_and_bound() -> None:
    # DDP's reducer closes a bucket once it holds the cap or more
    assert pack([10, 10, 10, 30], 25) == [[0, 1, 2], [3]]
    assert pack([10, 10, 5, 30], 25) == [[0, 1, 2], [3]]
    assert pack([10, 10, 5, 30], 20) == [[0, 1], [2, 3]]
    assert pack([10, 10, 30, 4], 25, first_bucket_bytes=5) == [[0], [1, 2], [3]]
    assert pack([30], 10) == [[0]]


@pytest.mark.parametrize(
    ("alpha", "beta", "small_wins"),
    [(0.5, 0.1, True), (2.0, 0.01, False)],  # bandwidth-heavy vs latency-heavy link
)
def test_bucket_size_trades_latency_against_overlap(
    alpha: float, beta: float, small_wins: bool
) -> None:
    steps = [BackwardStep("l1", 1.0, (10,)), BackwardStep("l0", 1.0, (10,))]

    def ar(n: int) -> float:
        return alpha + beta * n

    small = dp_step_timeline(steps, 10, ar)  # two buckets, the first overlaps l0
    large = dp_step_timeline(steps, 20, ar)  # one bucket after the last gradient
    # hand-derived: small = max(1 + ar(10), 2) + ar(10); large = 2 + ar(20)
    assert small.makespan_s == pytest.approx(max(1 + ar(10), 2) + ar(10))
    assert large.makespan_s == pytest.approx(2 + ar(20))
    assert (small.makespan_s < large.makespan_s) == small_wins


def test_ddp_copies_and_shared_cores_in_the_dp_step() -> None:
    # three 10 ms steps each readying a 4 MiB gradient, a bucket each; 5 ms per
    # all-reduce, 1 ms to copy 4 MiB
    mib4 = 4 << 20
    steps = [BackwardStep(f"l{i}", 10e-3, (mib4,)) for i in range(3)]

    def ar(n: int) -> float:
        return 5e-3

    def copy(n: int) -> float:
        return 1e-3 * n / mib4

    # no copies: the last step ends at 30 ms, its all-reduce at 35 ms
    assert dp_step_timeline(steps, mib4, ar).makespan_s == pytest.approx(35e-3)
    # copies: each step 11 ms with its copy-in, the last all-reduce 33-38 ms, then
    # 12 MiB copied back (3 ms)
    two = dp_step_timeline(steps, mib4, ar, copy_s=copy)
    assert two.makespan_s == pytest.approx(41e-3)
    assert two.t_comp_s == pytest.approx(36e-3) and two.t_comm_s == pytest.approx(15e-3)
    # the all-reduces in sequence with the compute: everything in sequence, every
    # all-reduce exposed
    serial = dp_step_timeline(steps, mib4, ar, copy_s=copy, serial_comm=True)
    assert serial.makespan_s == pytest.approx(3 * (10e-3 + 1e-3 + 5e-3) + 3e-3)
    assert serial.t_comm_s == pytest.approx(15e-3) and serial.t_comp_s == pytest.approx(36e-3)
    assert serial.exposed_comm_s == pytest.approx(serial.t_comm_s)


def test_partition_cost_over_two_streams_uses_the_objective_and_alpha_beta() -> None:
    g = capture(TwoBranches(pm.capture_group(2)), (torch.randn(8, 32),))
    obj = Objective(AnalyticalModel(get_spec("h100")))
    part = Partition.singletons(g)
    link = LINKS["pcie4"]
    tl = evaluate_streams(obj, part, link)
    ar = collective_time_s("all_reduce", "ring", 8 * 32 * 4, 2, link)
    assert tl.t_comm_s == pytest.approx(ar)
    assert tl.makespan_s <= tl.t_comp_s + tl.t_comm_s + 1e-12
    captured_order = evaluate_streams(obj, part, link, sink_waits=False)
    assert captured_order.exposed_comm_s == pytest.approx(ar)
    assert tl.exposed_comm_s < captured_order.exposed_comm_s
