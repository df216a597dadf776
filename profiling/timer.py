"""Timing on the device: CUDA events on GPU, perf_counter on CPU.

`measure(fn)` warms up, then repeats in rounds until the median is stable (or a bound
on repetitions or seconds is hit), and returns median, p99, spread and the context
every measurement row records (device fingerprint, torch version, dtype).

`measure_synced(fn)` times isolated calls with the wall clock, each waited for: what a
loop that needs every result before its next call sees.

`measure_in_graph(fn)` times a piece of work as it runs inside a realized plan's CUDA
graph, among other kernels: several copies of it captured back to back in one graph,
the timing divided by the copies. Timing one replay of a graph that holds one small
group measures the graph launch (about 10 us on an H100) more than the group: on the
H100 two collections of the same 1305 groups under 25 us, each replayed alone, differed
by 20% at the median (docs/design_notes.md).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from planner.hardware import device_fingerprint, local_device_name
from planner.measurement import Timing

__all__ = [
    "Timing",
    "cuda_graphed",
    "measure",
    "measure_in_graph",
    "measure_interleaved",
    "measure_synced",
    "summarize",
]


def _quantile(sorted_xs: list[float], q: float) -> float:
    if not sorted_xs:
        return float("nan")
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


class _L2Flusher:
    """Writes a buffer larger than L2 between repetitions, so each run starts cold."""

    def __init__(self, device: torch.device):
        size = 256 << 20 if device.type == "cuda" else 64 << 20
        self.buf = torch.empty(size, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def summarize(
    samples: list[float],
    *,
    stable: bool = False,
    device: str | torch.device | None = None,
    dtype: str = "",
) -> Timing:
    """Statistics of `samples` (seconds) with the context every row records."""
    if not samples:
        raise ValueError("summarize needs at least one sample")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    xs = sorted(samples)
    return Timing(
        median_s=_quantile(xs, 0.5),
        p99_s=_quantile(xs, 0.99),
        min_s=xs[0],
        mean_s=sum(xs) / len(xs),
        iqr_s=_quantile(xs, 0.75) - _quantile(xs, 0.25),
        reps=len(xs),
        stable=stable,
        device=local_device_name(dev),
        device_fingerprint=device_fingerprint(dev),
        torch_version=torch.__version__.split("+")[0],
        dtype=dtype,
    )


def cuda_graphed(fn: Callable[[], Any], warmup: int = 3, copies: int = 1) -> Callable[[], Any]:
    """`fn` recorded in a CUDA graph (`copies` times, back to back); the returned
    callable replays it.

    What a realized plan does on GPU (planner.realize.realizer), so a group timed alone runs as
    inside its plan. Raises if `fn` cannot be captured.
    """
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(copies):
            fn()
    torch.cuda.synchronize()
    return graph.replay


# measure_in_graph: each sample runs at least this long (or MAX_COPIES copies), so the
# graph launch and the events are a small share of it; and the timed samples come after
# at least WARM_S of replays, not straight after the host work between two units (an
# idle device may run slower clocks; not measured separately here).
GRAPH_SAMPLE_S = 5e-4
MAX_COPIES = 128
WARM_S = 5e-3


def measure_in_graph(
    fn: Callable[[], Any],
    *,
    device: str | torch.device | None = None,
    sample_s: float = GRAPH_SAMPLE_S,
    max_copies: int = MAX_COPIES,
    warm_s: float = WARM_S,
    **timer: Any,
) -> Timing:
    """Time `fn` as one piece of a CUDA graph: copies of it captured back to back
    (enough for `sample_s` per sample, at most `max_copies`), statistics per copy.

    `timer` goes to `measure` (warmup is raised to cover `warm_s`). CUDA only; raises
    if `fn` cannot be captured.
    """
    dev = torch.device(device or "cuda")
    if dev.type != "cuda":
        raise ValueError(f"measure_in_graph times CUDA graphs; got device {dev}")
    one = cuda_graphed(fn)
    probe = measure(one, device=dev, warmup=3, min_reps=5, max_reps=5)
    per = max(probe.median_s, 1e-7)
    copies = max(1, min(max_copies, math.ceil(sample_s / per)))
    replay = cuda_graphed(fn, warmup=0, copies=copies) if copies > 1 else one
    del one
    warmup = max(int(timer.pop("warmup", 3)), math.ceil(warm_s / (per * copies)))
    return measure(replay, device=dev, warmup=warmup, **timer).per_copy(copies)


def measure(
    fn: Callable[[], Any],
    *,
    device: str | torch.device | None = None,
    warmup: int = 3,
    min_reps: int = 10,
    max_reps: int = 200,
    max_seconds: float = 5.0,
    rel_tol: float = 0.02,
    flush_l2: bool = False,
    dtype: str = "",
) -> Timing:
    """Time `fn()` (it must do the same work each call).

    Repeats in rounds of `min_reps` until the median of all samples moves less than
    `rel_tol` between rounds, or `max_reps` samples or `max_seconds` are reached.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    flush = _L2Flusher(dev) if flush_l2 else None
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize(dev)
    samples: list[float] = []
    last_median = None
    stable = False
    t_start = time.perf_counter()
    while len(samples) < max_reps:
        for _ in range(min_reps):
            if flush:
                flush()
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        med = statistics.median(samples)
        if last_median is not None and abs(med - last_median) <= rel_tol * last_median:
            stable = True
            break
        last_median = med
        if time.perf_counter() - t_start > max_seconds:
            break
    return summarize(samples, stable=stable, device=dev, dtype=dtype)


def measure_synced(
    fn: Callable[[], Any],
    *,
    device: str | torch.device | None = None,
    warmup: int = 3,
    reps: int = 40,
    max_seconds: float = 2.0,
    dtype: str = "",
) -> Timing:
    """Time `fn()` as one isolated, synchronized call: the wall clock from the call until
    the device has finished its work, the device idle before each call. This is what a
    loop that waits for each result sees (a generation step, a request served alone): the
    host work in front of the kernels is not hidden behind the previous call's kernels,
    as it is in `measure_interleaved`'s back-to-back calls. `reps` samples, fewer where
    `max_seconds` runs out first (at least 3)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        fn()
    samples: list[float] = []
    t_start = time.perf_counter()
    while len(samples) < reps:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 3 and time.perf_counter() - t_start > max_seconds:
            break
    return summarize(samples, stable=_settled(samples), device=dev, dtype=dtype)


def _run_reps(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    """Mean seconds per call over `reps` back-to-back calls."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def measure_interleaved(
    fns: dict[str, Callable[[], Any]],
    *,
    device: str | torch.device | None = None,
    rounds: int = 15,
    round_s: float = 0.025,
    warmup: int = 3,
    dtype: str = "",
    agree: Callable[[int], int] | None = None,
) -> dict[str, Timing]:
    """Time several contenders fairly: interleaved rounds, the contenders in rotated order
    each round, every contender the same number of back-to-back calls per round (sized so
    the slowest fills about `round_s`). One sample per contender and round; statistics per
    call (`Timing.copies` = calls per round, `Timing.reps` = rounds); `Timing.stable` when
    the first and second half of the rounds agree (`_settled`). `agree` maps this
    process's calls per round to the ones every process uses: on the ranks of a program
    with collectives (search.tune), each rank must issue the same calls."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    slowest = max(statistics.median(_run_reps(fn, 1, dev) for _ in range(3)) for fn in fns.values())
    reps = max(1, min(200, int(round_s / max(slowest, 1e-7))))
    if agree is not None:
        reps = agree(reps)
    samples: dict[str, list[float]] = {n: [] for n in fns}
    names = list(fns)
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            samples[n].append(_run_reps(fns[n], reps, dev) * reps)
    return {
        n: summarize(xs, stable=_settled(xs), device=dev, dtype=dtype).per_copy(reps)
        for n, xs in samples.items()
    }


def _settled(xs: list[float], tol: float = 0.05) -> bool:
    """Whether interleaved rounds settled: the medians of the first and the second half of
    the rounds agree within `tol` (measure's rule, applied to a fixed number of rounds)."""
    half = len(xs) // 2
    if half < 2:
        return False
    a, b = statistics.median(xs[:half]), statistics.median(xs[half:])
    return abs(a - b) <= tol * max(a, b)
