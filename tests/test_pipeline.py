"""The pipeline step model (planner/distributed/pipeline.py) against hand-derived steps."""

from __future__ import annotations

import pytest

from planner.distributed.comm_cost import bubble_fraction, in_flight_microbatches
from planner.distributed.links import AlphaBeta
from planner.distributed.pipeline import (
    StageCost,
    choose_microbatches,
    device_order,
    divisors,
    even_chunks,
    interleaved_order,
    pipeline_step,
    price_microbatches,
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
        (lambda: pipeline_step("1f1b", [1.0] * 4, [1.0] * 4, 2, chunks=2), "interleaved"),
        (lambda: pipeline_step("zero-bubble", [1.0], [1.0], 2), "runs gpipe, 1f1b"),
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


# ---- interleaved 1F1B (virtual stages) -------------------------------------------------
def _interleaved(p: int, v: int, m: int, tf: float, tb: float, **kw) -> object:
    """Equal stages of t_f, t_b per micro-batch, each split into v chunks of t_f/v, t_b/v."""
    n = v * p
    return pipeline_step("interleaved", [tf / v] * n, [tb / v] * n, m, chunks=v, **kw)


@pytest.mark.parametrize(
    ("p", "v", "m", "tf", "tb"),
    [
        (2, 2, 2, 1.0, 2.0), (2, 2, 4, 1.0, 2.0), (4, 2, 8, 1.0, 2.0), (4, 3, 8, 1.5, 1.0),
        (4, 2, 4, 1.0, 3.0), (3, 4, 6, 1.0, 1.0), (5, 2, 10, 2.0, 1.0), (2, 3, 6, 1.0, 0.5),
        (1, 3, 4, 1.0, 2.0),
    ],
)  # fmt: skip
def test_interleaved_equal_stages_with_free_transfers_match_the_closed_form(
    p, v, m, tf, tb
) -> None:
    # Narayanan et al. 2021 §2.2.2: the fill and drain shrink to (p - 1)·(t_f + t_b)/v,
    # so the step is m·(t_f + t_b) + (p - 1)·(t_f + t_b)/v = (v·m + p - 1)·(t_f + t_b)/v.
    # Its bubble is (p - 1)/(v·m) of the ideal m·(t_f + t_b), (p - 1)/(v·m + p - 1) of the
    # step: the latter is what the timeline measures and comm_cost.bubble_fraction gives.
    step = _interleaved(p, v, m, tf, tb)
    assert step.step_s == pytest.approx((v * m + p - 1) * (tf + tb) / v)
    assert step.bubble_fraction == pytest.approx(bubble_fraction("interleaved", p, m, v))
    assert step.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))
    assert step.exposed_p2p_s == 0.0
    assert step.busy_s == pytest.approx([m * (tf + tb)] * p)
    assert step.idle_s == pytest.approx([(p - 1) * (tf + tb) / v] * p)
    assert step.forward_s == pytest.approx([tf] * p) and step.chunks == v


def test_interleaved_two_stages_two_chunks_by_hand() -> None:
    # p = 2, v = 2, m = 2; each chunk f = 1, b = 2 (a stage: t_f = 2, t_b = 4). Virtual
    # stages 0..3 are (stage 0, chunk 0), (1, 0), (0, 1), (1, 1). Warm-up forwards:
    # stage 0 (2-0-1)·2 + (2-1)·2 = 4 (all of them), stage 1 0·2 + 2 = 2.
    #   stage 0: F0c0 0-1, F1c0 1-2, F0c1 2-3 (after F0 on 1c0, 1-2), F1c1 3-4,
    #            B0c1 6-8 (gradient of B0 on 1c1), B1c1 9-11, B0c0 11-13, B1c0 13-15
    #   stage 1: F0c0 1-2, F1c0 2-3, F0c1 3-4, B0c1 4-6 (last virtual stage: after its own
    #            forward), F1c1 6-7, B1c1 7-9, B0c0 9-11 (gradient at 8, stage free at 9),
    #            B1c0 11-13 (gradient at 11)
    # The step ends at 15 = (v·m + p - 1)·(t_f + t_b)/v = 5·6/2; 1F1B takes 3·6 = 18.
    assert interleaved_order(2, 0, 2, 2) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1),
        ("B", 0, 1), ("B", 1, 1), ("B", 0, 0), ("B", 1, 0),
    ]  # fmt: skip
    assert interleaved_order(2, 1, 2, 2) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1),
        ("F", 1, 1), ("B", 1, 1), ("B", 0, 0), ("B", 1, 0),
    ]  # fmt: skip
    step = _interleaved(2, 2, 2, 2.0, 4.0)
    assert step.step_s == pytest.approx(15.0)
    ends = dict(zip((t.name for t in step.timeline.tasks), step.timeline.end_s))
    assert (ends["B0@1c1"], ends["B0@0c1"], ends["B1@1c0"]) == (6.0, 8.0, 13.0)
    assert step.idle_s == pytest.approx([3.0, 3.0])
    assert pipeline_step("1f1b", [2.0] * 2, [4.0] * 2, 2).step_s == pytest.approx(18.0)
    # m = 4 by the same rule: 9·6/2 = 27
    assert _interleaved(2, 2, 4, 2.0, 4.0).step_s == pytest.approx(27.0)


def test_interleaved_order_follows_megatron() -> None:
    # p = 4, v = 2, m = 8: the k-th forward is chunk (k mod 8) // 4 of micro-batch
    # 4·(k // 8) + k mod 4; backwards take chunk 1 first; warm-up (p-d-1)·2 + (v-1)·p
    p, v, m = 4, 2, 8
    for d in range(p):
        order = interleaved_order(p, d, m, v)
        warm = next(n for n, (kind, *_) in enumerate(order) if kind == "B") - 1
        assert warm == (p - d - 1) * 2 + (v - 1) * p
        fwd = [(i, c) for kind, i, c in order if kind == "F"]
        bwd = [(i, c) for kind, i, c in order if kind == "B"]
        assert fwd == [(g * p + r, c) for g in range(2) for c in range(v) for r in range(p)]
        assert bwd == [(g * p + r, c) for g in range(2) for c in (1, 0) for r in range(p)]
        # after the warm-up, forwards and backwards alternate until the forwards run out
        steady = order[warm : warm + 2 * (v * m - warm)]
        assert [kind for kind, *_ in steady] == ["F", "B"] * (v * m - warm)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (3, 2), (2, 5), (1, 3), (4, 1)])
def test_interleaved_with_one_chunk_is_1f1b(p, m) -> None:
    # Megatron-LM runs its non-interleaved 1F1B for v = 1, whatever m
    link = AlphaBeta(0.3, 0.0)
    f, b = [1.0 + 0.5 * s for s in range(p)], [2.0] * p
    sends = [100.0] * (p - 1)
    inter = pipeline_step("interleaved", f, b, m, sends, link, chunks=1)
    one_f = pipeline_step("1f1b", f, b, m, sends, link)
    for d in range(p):
        assert device_order("interleaved", p, d, m) == [
            (k, i, 0) for k, i in stage_order("1f1b", p, d, m)
        ]
    assert inter.timeline.start_s == one_f.timeline.start_s
    assert inter.step_s == one_f.step_s and inter.peak_in_flight == one_f.peak_in_flight
    assert inter.exposed_p2p_s == one_f.exposed_p2p_s


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 4), (3, 6), (8, 16)])
def test_interleaving_shrinks_the_bubble(p, m) -> None:
    tf, tb = 1.0, 2.0
    one_f = pipeline_step("1f1b", [tf] * p, [tb] * p, m)
    steps = [one_f] + [_interleaved(p, v, m, tf, tb) for v in (2, 4)]
    # by (p - 1)·(t_f + t_b)·(1 - 1/v): the fill and drain shrink, the work does not
    for v, s in zip((2, 4), steps[1:]):
        assert one_f.step_s - s.step_s == pytest.approx((p - 1) * (tf + tb) * (1 - 1 / v))
    assert steps[0].step_s > steps[1].step_s > steps[2].step_s
    assert steps[0].bubble_fraction > steps[1].bubble_fraction > steps[2].bubble_fraction


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (3, 6)])
def test_interleaving_sends_v_times_the_messages_and_exposes_more_on_a_slow_link(p, m) -> None:
    # each micro-batch crosses v·p - 1 virtual-stage boundaries each way, against p - 1;
    # a message of c = 1 s (as long as a stage's whole forward, twice a chunk's at v = 2)
    c, tf, tb = 1.0, 1.0, 2.0
    steps = []
    for v in (1, 2, 4):
        n = v * p
        step = pipeline_step("interleaved", [tf / v] * n, [tb / v] * n, m, [64.0] * (n - 1),
                             AlphaBeta(c, 0.0), chunks=v)  # fmt: skip
        messages = [t for t in step.timeline.tasks if t.stream.startswith("p2p")]
        assert len(messages) == 2 * m * (v * p - 1)
        assert step.p2p_busy_s == pytest.approx(2 * m * (v * p - 1) * c)
        steps.append(step)
    assert steps[0].exposed_p2p_s < steps[1].exposed_p2p_s < steps[2].exposed_p2p_s
    # chunk c of stage p-1 sends to chunk c+1 of stage 0: the link from last to first
    streams = {t.stream for t in steps[1].timeline.tasks}
    assert {f"p2p {p - 1}->0", f"p2p 0->{p - 1}"} <= streams
    wrap = [t.name for t in steps[1].timeline.tasks if t.name.startswith(f"act0 {p - 1}c0->")]
    assert wrap == [f"act0 {p - 1}c0->0c1"]


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (4, 3, 4), (2, 2, 2), (3, 2, 9)])
def test_interleaved_in_flight_and_memory_per_stage(p, v, m) -> None:
    # a stage holds its warm-up forwards plus one, in (micro-batch, chunk) pairs, each
    # 1/v of a micro-batch's activations
    act = 600.0
    stage = StageCost(1.0, 2.0, act, 10.0)
    row = price_microbatches("interleaved", even_chunks([stage] * p, v), m, chunks=v)
    peaks = tuple(min((p - d - 1) * 2 + (v - 1) * p + 1, v * m) for d in range(p))
    assert row.step.peak_in_flight == peaks
    assert row.memory_bytes == pytest.approx([n * act / (v * m) for n in peaks])
    assert row.step.step_s == pytest.approx((v * m + p - 1) * 3.0 / (v * m))


def test_even_chunks_splits_each_stage() -> None:
    stages = [StageCost(2.0, 4.0, 80.0, 8.0, 0.2, 0.4), StageCost(4.0, 6.0, 40.0, 0.0)]
    out = even_chunks(stages, 2)
    assert [c.forward_s for c in out] == [1.0, 2.0, 1.0, 2.0]
    assert [c.backward_overhead_s for c in out] == [0.2, 0.0, 0.2, 0.0]
    assert [c.activation_bytes for c in out] == [40.0, 20.0, 40.0, 20.0]
    # stage 1 (the last) sends across the wrap what the largest sender sends; the last
    # virtual stage sends nothing
    assert [c.send_bytes for c in out] == [8.0, 8.0, 8.0, 0.0]
    assert even_chunks(stages, 1) == stages  # one chunk: the stages themselves


def test_interleaved_choice_takes_multiples_of_the_stages() -> None:
    p, v = 2, 2
    cost = StageCost(1.0, 2.0, 100.0, 0.0, forward_overhead_s=0.01, backward_overhead_s=0.02)
    chunks = even_chunks([cost] * p, v)
    choice = choose_microbatches("interleaved", chunks, [2, 4, 8], chunks=v)
    assert [r.microbatches for r in choice.table] == [2, 4, 8]
    with pytest.raises(FusionPlannerError, match="multiple of the 2 stages"):
        choose_microbatches("interleaved", chunks, [1, 2], chunks=v)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: _interleaved(4, 2, 6, 1.0, 1.0), "multiple of the 4 stages"),
        (lambda: _interleaved(2, 2, 3, 1.0, 1.0), "multiple of the 2 stages.*got 3"),
        (lambda: pipeline_step("interleaved", [1.0], [1.0], 2, chunks=0), ">= 1 chunk"),
        (lambda: interleaved_order(2, 0, 2, 0), ">= 1 chunk"),
        (lambda: pipeline_step("interleaved", [1.0] * 3, [1.0] * 3, 2, chunks=2), "2 chunks"),
        (lambda: pipeline_step("interleaved", [1.0] * 4, [1.0] * 4, 2, [1.0], chunks=2),
         "4 virtual stages have 3 links"),
        (lambda: stage_order("interleaved", 2, 0, 2), "interleaved_order"),
        (lambda: even_chunks([StageCost(1.0, 1.0)], 0), ">= 1 chunk"),
    ],
)  # fmt: skip
def test_bad_interleaved_input_is_a_clear_error(call, match) -> None:
    with pytest.raises(FusionPlannerError, match=match):
        call()
