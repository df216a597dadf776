"""The default static-specialization policy (static_after="auto"): a recurring shape is
specialized once its calls have taken as long as a build would, at the share of a call a
specialization saves, and a specialization that is slower than its bucket realization is
dropped (planner.runtime.specialize); through the backend in tests/test_runtime_static.py."""

from __future__ import annotations

import types

import pytest

from planner.runtime import specialize
from planner.runtime.specialize import SAMPLES, WARM_CALLS, Compared, Ledger, Recurring


class Clock:
    """A perf_counter that moves only when a served call says how long it took."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def taking(self, seconds: float):
        def fn(args):
            self.now += seconds
            return args

        return fn


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(specialize, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    return c


def recurring(fn, ledger, asked):
    return Recurring(
        (7,), fn, "plan", after="auto", ledger=ledger, specialize=lambda r, a: asked.append(r.calls)
    )


def test_a_shape_is_specialized_once_its_calls_took_as_long_as_a_build(clock):
    ledger = Ledger()
    ledger.realizations.append(0.05)  # before any build is timed: the bucket realization's
    asked: list[int] = []
    rec = recurring(clock.taking(1e-3), ledger, asked)
    for _ in range(49):
        rec(())
    assert asked == []  # 49 calls of 1 ms have not paid for a 50 ms build
    rec(())
    assert asked == [50]
    for _ in range(100):
        rec(())
    assert asked == [50]  # asked once


def test_measured_builds_and_gains_move_the_break_even(clock):
    ledger = Ledger()
    ledger.realizations.append(10.0)
    ledger.builds.append(0.02)  # a timed build replaces the prior
    ledger.gains.append(0.5)  # a specialization saves half a call: twice the calls to pay
    asked: list[int] = []
    rec = recurring(clock.taking(1e-3), ledger, asked)
    for _ in range(100):
        rec(())
    assert asked == [40]


def test_nothing_is_built_once_specializations_saved_too_little(clock):
    ledger = Ledger()
    ledger.builds.append(1e-6)
    ledger.gains.extend([0.01, 0.02])
    asked: list[int] = []
    rec = recurring(clock.taking(1e-3), ledger, asked)
    for _ in range(1000):
        rec(())
    assert asked == [] and ledger.given_up()


def test_the_first_calls_are_not_timed(clock):
    """A shape's first run and its CUDA-graph recording are slow; timing them would buy a
    specialization for a shape that is cheap from then on."""
    ledger = Ledger()
    ledger.realizations.append(0.01)
    asked: list[int] = []
    slow, fast = clock.taking(1.0), clock.taking(1e-4)
    rec = recurring(slow, ledger, asked)
    for _ in range(WARM_CALLS):
        rec(())
    rec.fn = fast
    for _ in range(50):
        rec(())
    assert asked == []  # 1e-4 s calls need 100 calls to pay for 0.01 s
    assert rec.timer is not None and rec.timer.samples == pytest.approx([1e-4] * SAMPLES)


@pytest.mark.parametrize("static_s, kept", [(5e-4, True), (2e-3, False)])
def test_a_specialization_is_timed_against_its_bucket_realization(clock, static_s, kept):
    ledger = Ledger()
    ledger.realizations.append(1e-3)
    rec = recurring(clock.taking(1e-3), ledger, [])
    for _ in range(WARM_CALLS + SAMPLES + 1):
        rec(())
    gains: list[float] = []
    cmp = Compared(rec, clock.taking(static_s), gains.append)
    for _ in range(1 + SAMPLES + 3):
        cmp(())
    assert gains == [pytest.approx(1 - static_s / 1e-3)]
    assert (gains[0] > 0) == kept


@pytest.mark.parametrize("seconds, prior", [(0.0, [0.05]), (1e-3, [])])
def test_calls_that_take_no_time_or_no_build_estimate_never_specialize(clock, seconds, prior):
    ledger = Ledger()
    ledger.realizations.extend(prior)
    asked: list[int] = []
    rec = recurring(clock.taking(seconds), ledger, asked)
    for _ in range(100):
        rec(())
    assert asked == []
