"""The pipeline step model (planner/distributed/pipeline.py) against hand-derived steps."""

from __future__ import annotations

import pytest

from planner.distributed.comm_cost import bubble_fraction, in_flight_microbatches
from planner.distributed.links import AlphaBeta
from planner.distributed.pipeline import (
    StageCost,
    choose_microbatches,
    divisors,
    pipeline_step,
    stage_order,
)
from planner.errors import FusionPlannerError

SCHEDULES = ("gpipe", "1f1b")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(
    ("p", "m", "tf", "tb"),
    [(4, 8, 1.0, 2.0), (3, 2, 1.5, 1.0), (5, 3, 1.0, 3.0), (1, 4, 1.0, 2.0), (4, 1, 1.0, 2.0)],
)
def test_equal_stages_with_free_transfers_match_the_closed_form(schedule, p, m, tf, tb) -> None:
    step = pipeline_step(schedule, [tf] * p, [tb] * p, m)
    assert step.step_s == pytest.approx((m + p - 1) * (tf + tb))
    assert step.bubble_fraction == pytest.approx(bubble_fraction(schedule, p, m))
    assert step.exposed_p2p_s == 0.0
    # every stage computes m forwards and m backwards; the rest of the step it waits
    assert step.busy_s == pytest.approx([m * (tf + tb)] * p)
    assert step.idle_s == pytest.approx([(p - 1) * (tf + tb)] * p)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 2), (1, 3), (6, 6)])
def test_in_flight_microbatches_per_stage(p, m) -> None:
    gpipe = pipeline_step("gpipe", [1.0] * p, [2.0] * p, m)
    one_f = pipeline_step("1f1b", [1.0] * p, [2.0] * p, m)
    assert gpipe.peak_in_flight == (m,) * p
    assert one_f.peak_in_flight == tuple(min(m, p - s) for s in range(p))
    assert one_f.peak_in_flight[0] == in_flight_microbatches("1f1b", p, m)


def test_1f1b_order_warms_up_alternates_and_drains() -> None:
    # stage 1 of 3 with 4 micro-batches: one warm-up forward, then F/B pairs, then drain
    assert stage_order("1f1b", 3, 1, 4) == [
        ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)
    ]  # fmt: skip


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_two_unequal_stages_the_slowest_paces_the_step(schedule) -> None:
    # stage 1 is twice as slow: after stage 0's first forward and before its last
    # backward, stage 1 runs all m micro-batches back to back
    f, b, m = [1.0, 2.0], [2.0, 4.0], 4
    step = pipeline_step(schedule, f, b, m)
    assert step.step_s == pytest.approx(f[0] + b[0] + m * (f[1] + b[1]))
    assert step.idle_s[1] == pytest.approx(f[0] + b[0])


@pytest.mark.parametrize(
    ("f", "b", "m"),
    [([1, 3, 1], [2, 6, 2], 5), ([1, 1, 3], [2, 2, 6], 4), ([2, 1, 1], [4, 2, 2], 4)],
)
def test_gpipe_unequal_stages(f, b, m) -> None:
    # GPipe with one stage k slowest in both passes: each stage's first micro-batch in
    # turn, then k's m - 1 others (a flow shop with a dominant machine)
    k = max(range(len(f)), key=lambda s: f[s] + b[s])
    step = pipeline_step("gpipe", f, b, m)
    assert step.step_s == pytest.approx(sum(f) + sum(b) + (m - 1) * (f[k] + b[k]))
    assert step.bubble_fraction > bubble_fraction("gpipe", len(f), m)


@pytest.mark.parametrize(("p", "m", "c"), [(2, 3, 0.25), (3, 4, 0.5), (4, 6, 1.0)])
def test_gpipe_transfers_add_one_round_trip_through_the_stages(p, m, c) -> None:
    # with each message (c s) shorter than a forward and a backward, a transfer delays
    # the first micro-batch at each hop going forward and coming back, and nothing else
    tf, tb = 1.0, 2.0
    step = pipeline_step("gpipe", [tf] * p, [tb] * p, m, [1000.0] * (p - 1), AlphaBeta(c, 0.0))
    assert step.step_s == pytest.approx((m + p - 1) * (tf + tb) + 2 * (p - 1) * c)
    assert step.exposed_p2p_s == pytest.approx(2 * (p - 1) * c)
    assert step.p2p_busy_s == pytest.approx(2 * m * (p - 1) * c)


@pytest.mark.parametrize(("m", "c"), [(1, 0.5), (2, 0.5), (3, 0.25), (5, 0.5), (6, 1.0)])
def test_1f1b_steady_state_waits_on_the_gradient_coming_back(m, c) -> None:
    # 2 stages, f = 1, b = 2: stage 0 runs F(i+1) only after B(i-1), which waits for
    # the gradient of micro-batch i-1; the cycle B(i-1) -> F(i+1) -> act -> F(i+1) on
    # stage 1 -> B(i+1) -> grad -> B(i+1) on stage 0 is 2(f + b) + 2c for two
    # micro-batches, so every second micro-batch exposes one round trip 2c. Traced by
    # hand for m = 5, c = 0.5: stage 1 starts its forwards at 1.5, 4.5, 8.5, 11.5, 15.5
    # and stage 0 ends B4 at 21 = 6·3 + 3.
    tf, tb = 1.0, 2.0
    step = pipeline_step("1f1b", [tf, tf], [tb, tb], m, [64.0], AlphaBeta(c, 0.0))
    exposed = 2 * c * -(-m // 2)  # 2c per started pair of micro-batches
    assert step.step_s == pytest.approx((m + 1) * (tf + tb) + exposed)
    assert step.exposed_p2p_s == pytest.approx(exposed)
    # GPipe pays the round trip once
    gpipe = pipeline_step("gpipe", [tf, tf], [tb, tb], m, [64.0], AlphaBeta(c, 0.0))
    assert gpipe.exposed_p2p_s == pytest.approx(2 * c)


def test_a_link_slower_than_compute_paces_the_step() -> None:
    # GPipe, 2 stages, messages (c) longer than a forward or a backward: the activations
    # queue on the link, stage 1's last forward ends at f + m·c + f, its gradients queue
    # back, and stage 0's last backward ends at 2f + 2b + 2m·c
    f, b, c, m = 1.0, 1.5, 2.0, 3
    ab = AlphaBeta(0.0, c / 4096)  # 4096 bytes a message: c seconds, all of it β
    step = pipeline_step("gpipe", [f, f], [b, b], m, [4096.0], ab)
    assert step.step_s == pytest.approx(2 * f + 2 * b + 2 * m * c)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: pipeline_step("interleaved", [1.0], [1.0], 2), "interleaved"),
        (lambda: pipeline_step("gpipe", [1.0], [1.0], 0), "micro-batch"),
        (lambda: pipeline_step("gpipe", [1.0, 1.0], [1.0], 2), "backward time per stage"),
        (lambda: pipeline_step("gpipe", [1.0, 1.0], [1.0, 1.0], 2, [1.0, 2.0]), "1 links"),
        (lambda: StageCost(1.0, 2.0, forward_overhead_s=2.0), "overhead"),
        (lambda: divisors(0), "batch"),
    ],
)
def test_bad_input_is_a_clear_error(call, match) -> None:
    with pytest.raises(FusionPlannerError, match=match):
        call()


def _step_formula(p: int, m: int, c: StageCost) -> float:
    """Equal stages, free transfers: (m + p - 1) times one micro-batch's F + B, each a
    fixed overhead plus 1/m of the rest."""
    f = c.forward_overhead_s + (c.forward_s - c.forward_overhead_s) / m
    b = c.backward_overhead_s + (c.backward_s - c.backward_overhead_s) / m
    return (m + p - 1) * (f + b)


def test_microbatch_choice_trades_the_bubble_against_the_fixed_overhead() -> None:
    # step(m) = (m + p - 1)(o + W/m): the bubble shrinks with m, the overheads grow
    p, batch = 4, 64
    cost = StageCost(1.0, 2.0, 100.0, 0.0, forward_overhead_s=0.01, backward_overhead_s=0.02)
    choice = choose_microbatches("1f1b", [cost] * p, divisors(batch))
    want = min(divisors(batch), key=lambda m: _step_formula(p, m, cost))
    assert 1 < want < batch  # an interior optimum, so the test can tell
    assert choice.chosen is not None and choice.chosen.microbatches == want
    for row in choice.table:
        assert row.step.step_s == pytest.approx(_step_formula(p, row.microbatches, cost))
    # without a fixed overhead more micro-batches always shrink the bubble
    free = StageCost(1.0, 2.0, 100.0)
    assert choose_microbatches("gpipe", [free] * p, divisors(batch)).chosen.microbatches == batch


def test_microbatch_choice_respects_the_activation_memory_limit() -> None:
    # 1F1B's stage 0 holds min(m, p) micro-batches of A/m bytes each: A for m <= p,
    # then A·p/m; GPipe holds all m: A whatever m
    p, batch, act = 4, 16, 800.0
    cost = StageCost(1.0, 2.0, act, 0.0, forward_overhead_s=0.2, backward_overhead_s=0.4)
    limit = act * p / 8  # 1F1B fits from m = 8 on
    choice = choose_microbatches("1f1b", [cost] * p, divisors(batch), memory_limit_bytes=limit)
    for row in choice.table:
        m = row.microbatches
        want = [min(m, p - s) * act / m for s in range(p)]
        assert row.memory_bytes == pytest.approx(want)
        assert row.fits == (m >= 8)
    unconstrained = min(divisors(batch), key=lambda m: _step_formula(p, m, cost))
    assert unconstrained < 8  # the limit binds
    assert choice.chosen is not None and choice.chosen.microbatches == 8
    gpipe = choose_microbatches("gpipe", [cost] * p, divisors(batch), memory_limit_bytes=limit)
    assert gpipe.chosen is None and not any(r.fits for r in gpipe.table)


def test_microbatch_choice_scales_the_transfers() -> None:
    # a micro-batch of 1/m of the batch sends 1/m of the stage's activation
    cost = StageCost(1.0, 2.0, 0.0, 4000.0)
    link = AlphaBeta(0.0, 1e-4)  # 4000 bytes: 0.4 s
    choice = choose_microbatches("gpipe", [cost, cost], [1, 2, 4], link)
    for row in choice.table:
        assert row.step.transfer_s == pytest.approx((0.4 / row.microbatches,))
