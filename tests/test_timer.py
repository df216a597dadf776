"""profiling.timer on synthetic workloads whose true duration is known."""

from __future__ import annotations

import time

import pytest
import torch

from profiling.timer import (
    cuda_graphed,
    measure,
    measure_in_graph,
    measure_interleaved,
    measure_synced,
    summarize,
)


def spin(seconds: float):
    """A busy-wait of a fixed length: steadier than sleep on a loaded machine."""

    def fn() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return fn


def test_summary_statistics_of_known_samples():
    t = summarize([float(i) for i in range(1, 101)], dtype="float32", device="cpu")
    assert t.median_s == pytest.approx(50.5)
    assert t.p99_s == pytest.approx(99.01)
    assert t.iqr_s == pytest.approx(49.5)
    assert (t.min_s, t.reps) == (1.0, 100)
    assert t.mean_s == pytest.approx(50.5)
    assert t.dtype == "float32" and t.device == "cpu"
    assert t.torch_version == torch.__version__.split("+")[0]
    assert t.device_fingerprint.startswith("cpu-")


def test_one_outlier_moves_p99_not_the_median():
    t = summarize([1e-3] * 99 + [0.5], device="cpu")
    assert t.median_s == pytest.approx(1e-3)
    assert t.p99_s > 5 * t.median_s  # interpolated between the 99th and 100th sample
    assert t.spread == pytest.approx(0.0)


def test_measure_recovers_a_known_duration_and_settles():
    t = measure(spin(2e-3), device="cpu", warmup=1, min_reps=5, max_reps=60, rel_tol=0.05)
    assert 2e-3 <= t.median_s < 4e-3  # never faster than the work; overhead is small
    assert t.min_s <= t.median_s <= t.p99_s
    assert 10 <= t.reps <= 60  # at least two rounds to compare medians
    assert t.stable


def test_repetitions_are_bounded_for_a_workload_that_never_settles():
    # Each call takes longer than the last, so the median moves every round. (A random
    # choice of two durations could leave the same middle sample as the median of two
    # rounds, which counts as settled: this test failed a CI run that way.)
    calls = iter(range(1000))

    def noisy() -> None:
        spin(1e-4 * (1 + next(calls)))()

    t = measure(noisy, device="cpu", warmup=0, min_reps=5, max_reps=25, rel_tol=1e-9)
    assert t.reps <= 25 and not t.stable
    assert t.p99_s > 5 * t.min_s


def test_time_bound_stops_a_slow_workload():
    t0 = time.perf_counter()
    t = measure(spin(0.02), device="cpu", warmup=0, min_reps=5, max_reps=1000, max_seconds=0.15)
    assert time.perf_counter() - t0 < 1.0
    assert t.reps < 1000 and t.reps % 5 == 0


def test_l2_flush_between_reps_still_times_the_work():
    t = measure(spin(1e-3), device="cpu", warmup=1, min_reps=5, max_reps=10, flush_l2=True)
    assert t.median_s >= 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_time_a_gpu_kernel():
    x = torch.randn(1 << 24, device="cuda")
    t = measure(lambda: x.mul_(1.0), device="cuda")
    assert t.device_fingerprint.startswith("cuda-") and 0 < t.median_s < 1e-2
    g = measure(cuda_graphed(lambda: x.mul_(1.0)), device="cuda")
    assert g.median_s < 2 * t.median_s


def test_per_copy_divides_every_statistic_and_keeps_the_samples():
    t = summarize([4e-3, 6e-3, 8e-3, 1e-2], device="cpu")
    p = t.per_copy(4)
    assert p.copies == 4 and p.reps == t.reps
    for field in ("median_s", "p99_s", "min_s", "mean_s", "iqr_s"):
        assert getattr(p, field) == pytest.approx(getattr(t, field) / 4)
    assert p.per_copy(2).copies == 8
    with pytest.raises(ValueError, match="copies"):
        t.per_copy(0)


def test_measure_in_graph_refuses_the_cpu():
    with pytest.raises(ValueError, match="CUDA graphs"):
        measure_in_graph(spin(1e-4), device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measure_in_graph_takes_the_launch_out_of_a_small_kernel():
    """One replay of a graph holding one tiny kernel is mostly launch; copies back to
    back in one graph are not, and a large kernel gets one copy and the same time."""
    x = torch.randn(1 << 12, device="cuda")
    alone = measure(cuda_graphed(lambda: x.mul_(1.0)), device="cuda")
    inside = measure_in_graph(lambda: x.mul_(1.0), device="cuda")
    assert inside.copies > 1 and inside.median_s < alone.median_s
    y = torch.randn(1 << 28, device="cuda")
    big_alone = measure(cuda_graphed(lambda: y.mul_(1.0)), device="cuda")
    big = measure_in_graph(lambda: y.mul_(1.0), device="cuda")
    assert big.copies == 1
    assert big.median_s == pytest.approx(big_alone.median_s, rel=0.1)


def test_interleaved_contenders_get_the_same_calls_per_round_and_per_call_statistics():
    fns = {"short": spin(1e-3), "long": spin(3e-3)}
    got = measure_interleaved(fns, device="cpu", rounds=4, round_s=0.01, warmup=1)
    short, long = got["short"], got["long"]
    assert short.reps == long.reps == 4  # one sample per contender and round
    assert short.copies == long.copies >= 1  # the same calls per round for both
    assert 1e-3 <= short.median_s < long.median_s and long.median_s >= 3e-3  # per call
    assert short.min_s <= short.median_s <= short.p99_s


def test_interleaved_rounds_are_stable_only_when_both_halves_agree():
    from profiling.timer import _settled

    assert _settled([1.0, 1.01, 0.99, 1.0, 1.02, 0.98])
    assert not _settled([1.0, 1.0, 1.0, 1.3, 1.3, 1.3])  # drifted between the halves
    assert not _settled([1.0, 1.0, 1.0])  # too few rounds to tell


def test_synced_calls_are_timed_whole_and_bounded():
    calls = []

    def fn() -> None:
        calls.append(1)
        spin(1e-3)()

    t = measure_synced(fn, device="cpu", warmup=2, reps=8)
    assert t.reps == 8 and len(calls) == 2 + 8  # the warm-up calls are not samples
    assert 1e-3 <= t.min_s <= t.median_s <= t.p99_s
    # a time bound cuts a slow call's samples, never below three
    slow = measure_synced(spin(2e-2), device="cpu", warmup=0, reps=100, max_seconds=0.05)
    assert 3 <= slow.reps < 100 and slow.median_s >= 2e-2
