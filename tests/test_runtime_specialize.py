"""The default static-specialization policy (static_after="auto"): a recurring shape is
specialized once its calls have taken as long as a build would, at the share of a call a
specialization saves, and a specialization that is slower than its bucket realization is
dropped (planner.runtime.specialize)."""

from __future__ import annotations

import types

import pytest
import torch

from planner.plans.cache import PlanCache
from planner.runtime import specialize
from planner.runtime.backend import fusion_planner_backend
from planner.runtime.specialize import SAMPLES, WARM_CALLS, Compared, Ledger, Recurring
from tests.backend_helpers import small_block
from tests.test_runtime_static import Shapes, call, store_plan


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


# -- through the backend (torch.compile on the CPU, a realizer that runs the program) ----


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cache(tmp_path):
    return PlanCache(str(tmp_path / "plans.sqlite"))


def test_a_stream_of_shapes_that_recur_a_few_times_builds_nothing(cache):
    """The default policy: the CPU calls of a small block take well under a millisecond and
    a build takes what the bucket's realization took, so a few calls per shape never pay."""
    module = small_block()
    store_plan(module, cache)
    rec = Shapes()
    be = fusion_planner_backend(cache, realizer=rec)
    assert be.static_after == "auto"
    compiled = torch.compile(module, backend=be, dynamic=True)
    for _ in range(8):
        for s in (40, 33, 50, 61):
            call(compiled, module, s)
    assert rec.kinds == ["bucket"] and be.stats.static == 0 and not be.stats.static_failed


def test_a_shape_that_pays_is_specialized_then_kept_or_dropped_by_its_time(cache, monkeypatch):
    """With builds made free, a shape is specialized right after its calls are timed; the
    specialization's own calls are timed, the share saved recorded, and the shape served
    correctly throughout by whichever was faster."""
    monkeypatch.setattr(Ledger, "build_estimate", lambda self: 0.0)
    module = small_block()
    store_plan(module, cache)
    rec = Shapes()
    be = fusion_planner_backend(cache, realizer=rec)
    compiled = torch.compile(module, backend=be, dynamic=True)
    for _ in range(WARM_CALLS + SAMPLES + 1):
        call(compiled, module, 40)
    assert rec.kinds == ["bucket", "static"] and be.stats.static == 1
    assert be.stats.static_build_s > 0 and be.stats.static_gains == []
    for _ in range(1 + SAMPLES + 1):
        call(compiled, module, 40)
    assert len(be.stats.static_gains) == 1
    for _ in range(3):
        call(compiled, module, 40)
    assert rec.kinds == ["bucket", "static"]  # built once, whichever serves it now


def test_static_after_is_checked():
    for bad in (0, -1, "sometimes", 2.5):
        with pytest.raises(ValueError, match="static_after"):
            fusion_planner_backend(static_after=bad)
