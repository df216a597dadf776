"""When a shape that recurs gets a static specialization of its bucket's plan, and whether
it keeps it.

A shape is first served by its bucket's realization (symbolic shapes; on CUDA, a CUDA graph
recorded per recurring shape). A static realization of the same plan at that shape (layouts
propagated across groups, static-only epilogues, one CUDA graph) saves part of each call,
but building it costs a compile: seconds, where a call takes a millisecond. Whether it is
worth building depends on how often the shape recurs, which the backend cannot know ahead.

`static_after="auto"` (the backend's default) decides it as rent or buy: a shape's calls are
the rent, the build the purchase. The first calls of a shape are left alone (its first run,
then its CUDA-graph recording), the next `SAMPLES` are timed (wall clock on the CPU, CUDA
events on a GPU, read when done, never waited for), and the shape is specialized once the
time its calls took, times the share of a call a specialization is expected to save, reaches
the time a build is expected to take. Both estimates are measured per graph: the build time
from the specializations built so far (before the first, the time the bucket's own
realization took), the share saved by timing each new specialization's first calls against
the bucket realization's (before the first: all of it, an upper bound). A specialization
that turns out slower than the bucket realization is dropped for that shape, and after
`MIN_MEASURED` specializations that saved less than `MIN_GAIN` on average, the graph builds
no more. A stream of many shapes that each recur a few times so never pays a compile per
shape, and a shape served a thousand times gets one.

An int `static_after` specializes at that call, as asked, without timing anything.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

WARM_CALLS = 2  # a shape's first run, then its CUDA-graph recording: not timed
SAMPLES = 3  # calls timed per shape (and per new specialization) before deciding
MIN_GAIN = 0.05  # share of a call saved below which specializations are not worth building
MIN_MEASURED = 2  # specializations measured before the graph may give up on them


class CallTimer:
    """Times a few calls: wall clock on the CPU; on CUDA, events on the call's stream, read
    once done (a call inside a CUDA-graph capture is not timed)."""

    __slots__ = ("_pending", "device", "samples")

    def __init__(self, device: torch.device | None):
        self.device = device if device is not None and device.type == "cuda" else None
        self.samples: list[float] = []
        self._pending: list[tuple[Any, Any]] = []

    def run(self, fn: Callable[[tuple[Any, ...]], Any], args: tuple[Any, ...]) -> Any:
        if self.device is None:
            t0 = time.perf_counter()
            out = fn(args)
            self.samples.append(time.perf_counter() - t0)
            return out
        if torch.cuda.is_current_stream_capturing():
            return fn(args)
        stream = torch.cuda.current_stream(self.device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        out = fn(args)
        end.record(stream)
        self._pending.append((start, end))
        return out

    def settled(self) -> int:
        """How many calls have a time (CUDA events that are done are read now)."""
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.pop(0)
            self.samples.append(start.elapsed_time(end) / 1e3)
        return len(self.samples)

    def timing(self) -> int:
        return len(self.samples) + len(self._pending)

    def median(self) -> float:
        return statistics.median(self.samples)


def tensor_device(args: tuple[Any, ...]) -> torch.device | None:
    return next((a.device for a in args if isinstance(a, torch.Tensor)), None)


class Ledger:
    """What specializations of one graph cost and saved, measured as they are built and run."""

    def __init__(self) -> None:
        self.builds: list[float] = []  # seconds per static build
        self.gains: list[float] = []  # share of a call each specialization saved (< 0: lost)
        self.realizations: list[float] = []  # seconds per bucket realization (the prior)

    def build_estimate(self) -> float:
        seen = self.builds or self.realizations
        return statistics.fmean(seen) if seen else math.inf

    def expected_gain(self) -> float:
        return min(1.0, statistics.fmean(self.gains)) if self.gains else 1.0

    def given_up(self) -> bool:
        return len(self.gains) >= MIN_MEASURED and self.expected_gain() < MIN_GAIN


class Recurring:
    """A shape served by its bucket's realization, counting its calls; at the call the
    policy names (module doc) it asks for a static specialization (`specialize`)."""

    __slots__ = ("after", "calls", "due", "fn", "ledger", "plan", "sizes", "specialize", "timer")

    def __init__(
        self,
        sizes: tuple[int, ...],
        fn: Callable[[tuple[Any, ...]], Any],
        plan: Any,
        *,
        after: int | str,
        ledger: Ledger,
        specialize: Callable[[Recurring, tuple[Any, ...]], None],
    ):
        self.sizes, self.fn, self.plan = sizes, fn, plan
        self.after, self.ledger, self.specialize = after, ledger, specialize
        self.calls = 0
        self.due: float = after if isinstance(after, int) else WARM_CALLS + 1
        self.timer: CallTimer | None = None

    def __call__(self, args: tuple[Any, ...]) -> Any:
        self.calls += 1
        if self.calls < self.due:
            return self.fn(args)
        if self.after != "auto":
            self.due = math.inf
            self.specialize(self, args)
            return self.fn(args)
        if self.timer is None:
            self.timer = CallTimer(tensor_device(args))
        if self.timer.timing() < SAMPLES:
            self.due = self.calls + 1
            return self.timer.run(self.fn, args)
        if self.timer.settled() < SAMPLES:
            self.due = self.calls + 1  # CUDA events not done yet: look again next call
            return self.fn(args)
        gain = self.ledger.expected_gain()
        if self.ledger.given_up() or gain <= 0:
            self.due = math.inf
            return self.fn(args)
        # rent or buy: build once the calls so far took as long as a build would, at the
        # share of each call a specialization saves
        per_call, build = self.timer.median() * gain, self.ledger.build_estimate()
        if per_call <= 0 or not math.isfinite(build):  # nothing to save, or no estimate
            self.due = math.inf
            return self.fn(args)
        need = math.ceil(build / per_call)
        if self.calls < need:
            self.due = need  # the estimates are looked at again then
            return self.fn(args)
        self.due = math.inf
        self.specialize(self, args)
        return self.fn(args)

    def call_time(self) -> float | None:
        if self.timer is None or self.timer.settled() == 0:
            return None
        return self.timer.median()


class Compared:
    """A new static specialization of a recurring shape, timed for its first calls against
    the bucket realization's time for that shape; then `decide(gain)` is told the share of
    a call it saved (negative: it is slower), and whoever serves the shape from then on is
    up to it."""

    __slots__ = ("calls", "decide", "fn", "rec", "timer")

    def __init__(
        self,
        rec: Recurring,
        fn: Callable[[tuple[Any, ...]], Any],
        decide: Callable[[float], None] | None,
    ):
        self.rec, self.fn, self.decide = rec, fn, decide
        self.calls = 0
        self.timer: CallTimer | None = None

    def __call__(self, args: tuple[Any, ...]) -> Any:
        self.calls += 1
        if self.decide is None:  # decided; called by someone still holding it
            return self.fn(args)
        if self.calls == 1:  # its first run: lazy initialization, not its speed
            return self.fn(args)
        if self.timer is None:
            self.timer = CallTimer(tensor_device(args))
        if self.timer.timing() < SAMPLES:
            return self.timer.run(self.fn, args)
        if self.timer.settled() < SAMPLES:
            return self.fn(args)
        before = self.rec.call_time()
        decide, self.decide = self.decide, None
        decide(1.0 - self.timer.median() / before if before else 0.0)
        return self.fn(args)
