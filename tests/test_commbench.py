"""The gloo harness, the α-β fit, and `device-bench --comm` on 2 local processes."""

from __future__ import annotations

import json

import pytest

from planner.distributed.comm_cost import collective_time_s
from planner.distributed.links import AlphaBeta, MeasuredLink, get_link, save_measured_link
from profiling.commbench import (
    CommBenchError,
    fit_alpha_beta,
    group_check,
    measure_collective,
    predict_s,
    rel_errors,
    run_ranks,
)


def test_two_gloo_ranks_form_a_group_and_reduce() -> None:
    total, world = run_ranks(2, group_check, timeout_s=60)
    assert (total, world) == (3.0, 2.0)


def test_a_result_written_before_the_ranks_hang_is_kept() -> None:
    with pytest.warns(RuntimeWarning, match="did not exit"):
        # the timeout counts from when both ranks joined, however long they took to start
        assert run_ranks(2, "tests.tp_ranks:rank_then_stall", timeout_s=2) == [0.0, 2.0]


def test_a_hang_reports_where_each_rank_waits() -> None:
    """Ranks still running at the deadline are asked for their Python stacks before the
    kill, and the error quotes them: the function and line each rank is stuck in."""
    with pytest.raises(CommBenchError, match="still ran 2 s after joining the group") as e:
        run_ranks(2, "tests.tp_ranks:both_stall", timeout_s=2)
    assert "in both_stall" in str(e.value) and "tp_ranks.py" in str(e.value)


def test_ranks_that_never_join_their_group_hit_the_start_deadline(monkeypatch) -> None:
    """Starting has its own deadline (START_S), so ranks stuck before the group (here
    importing their function's module) are reported as such, not as a hang of the job."""
    from profiling import commbench

    monkeypatch.setattr(commbench, "START_S", 3.0)
    with pytest.raises(CommBenchError, match=r"did not all join the group within 3 s \(0 joined\)"):
        run_ranks(2, "tests.stalled_import_ranks:never", timeout_s=60)


def test_a_failing_rank_is_a_clear_error() -> None:
    with pytest.raises(CommBenchError, match="commbench measures all_reduce"):
        measure_collective(2, [1024], "no_such_collective", reps=1)


def test_fit_recovers_alpha_beta_and_splits_where_the_slope_changes() -> None:
    sizes = [1 << k for k in range(10, 23)]
    one = AlphaBeta(50e-6, 1 / 2e9)
    rows = [(s, one.time_s(s)) for s in sizes]
    (fit,) = fit_alpha_beta(rows)
    assert fit.alpha_s == pytest.approx(50e-6, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(2e9, rel=1e-6)
    # small messages on a latency path, large ones on a slower bandwidth path
    small, large = AlphaBeta(20e-6, 1 / 4e9), AlphaBeta(200e-6, 1 / 1e9)
    rows = [(s, (small if s < 1 << 16 else large).time_s(s)) for s in sizes]
    fits = fit_alpha_beta(rows)
    assert [f.bridge for f in fits] == [False, True, False]
    assert max(rel_errors(fits, rows)) < 1e-6
    assert predict_s(fits, 1 << 12) == pytest.approx(small.time_s(1 << 12))
    # between the last small size and the first large one the prediction runs straight
    # from one line to the other, whichever side of the gap the protocol changes at
    s0, s1 = 1 << 15, 1 << 16
    mid = (s0 + s1) // 2
    assert predict_s(fits, s0) == pytest.approx(small.time_s(s0))
    assert predict_s(fits, s1) == pytest.approx(large.time_s(s1))
    assert predict_s(fits, mid) == pytest.approx((small.time_s(s0) + large.time_s(s1)) / 2)


def test_measured_local_link_round_trips_and_predicts(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    link_fit = AlphaBeta(100e-6, 1 / 1e9)
    m = MeasuredLink("gloo", 2, "all_reduce", "ring", (link_fit,), 0.05, "cpu-x", "2.13", "now")
    save_measured_link("local", m)
    local = get_link("local")
    assert local.measured == m
    assert collective_time_s("all_reduce", "ring", 1e6, 4, local) == pytest.approx(
        6 * 100e-6 + 1.5 * 1e6 / 1e9
    )
    (tmp_path / "fusion-planner" / "devices" / "link-local.json").write_text("{}")
    with pytest.raises(Exception, match="does not parse"):
        get_link("local")


def test_device_bench_comm_cli_fits_and_reports_heldout(tmp_path, monkeypatch, capsys) -> None:
    from cli.main import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(
        "profiling.commbench.default_sizes",
        lambda quick, backend="gloo": ([1024, 16384, 262144], [4096]),
    )
    assert main(["device-bench", "--comm", "--quick", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"]["world_size"] == 2 and len(out["heldout"]) == 1
    assert out["heldout"][0]["predicted_s"] > 0
    assert get_link("local").measured is not None


@pytest.mark.slow
def test_reduce_scatter_and_all_gather_time_on_gloo() -> None:
    for name in ("reduce_scatter", "all_gather"):
        rows = measure_collective(2, [4096, 65536], name, reps=2)
        assert [b for b, _ in rows] == [4096, 65536] and all(t > 0 for _, t in rows)


def test_fit_takes_a_third_range_only_where_it_earns_it() -> None:
    sizes = [1 << k for k in range(10, 28)]
    parts = [AlphaBeta(10e-6, 1 / 20e9), AlphaBeta(15e-6, 1 / 100e9), AlphaBeta(60e-6, 1 / 300e9)]

    def t(s: int) -> float:
        return parts[0 if s < 1 << 15 else 1 if s < 1 << 21 else 2].time_s(s)

    rows = [(s, t(s)) for s in sizes]
    fits = fit_alpha_beta(rows, max_ranges=3)
    assert sum(not f.bridge for f in fits) == 3 and max(rel_errors(fits, rows)) < 1e-6
    one = AlphaBeta(10e-6, 1 / 20e9)
    assert len(fit_alpha_beta([(s, one.time_s(s)) for s in sizes], max_ranges=3)) == 1


def test_nccl_without_gpus_is_a_clear_error(tmp_path, monkeypatch) -> None:
    import torch

    from cli.main import main
    from planner.errors import FusionPlannerError
    from profiling.commbench import check_backend

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    with pytest.raises(FusionPlannerError, match="CUDA devices"):
        check_backend("nccl", 2)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["device-bench", "--comm", "--backend", "nccl", "--quick"]) != 0


def test_each_collective_uses_its_own_measured_fit(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ag = AlphaBeta(7e-6, 1 / 100e9)
    m = MeasuredLink("nccl", 2, "all_gather", "ring", (ag,), 0.03, "gpu-x", "2.11", "now")
    save_measured_link("pcie4", m)
    link = get_link("pcie4")
    assert link.measured is None and set(link.by_kind) == {"all_gather"}
    assert collective_time_s("all_gather", "ring", 1e6, 2, link) == pytest.approx(
        7e-6 + 0.5 * 1e6 / 100e9
    )
    table = get_link("pcie4", measured=False)
    assert collective_time_s("all_reduce", "ring", 1e6, 2, link) == pytest.approx(
        collective_time_s("all_reduce", "ring", 1e6, 2, table)
    )
    with pytest.raises(Exception, match="device-bench --comm --backend nccl"):
        get_link("local-nccl")


def test_a_teardown_that_hangs_is_left_behind_with_the_jobs_exit_code(monkeypatch) -> None:
    """NCCL's destroy can wait forever (pytorch/pytorch#115388): after the timeout the
    process leaves with the job's code, saying why; a teardown that returns is waited for."""
    import threading

    from profiling import commbench

    release = threading.Event()
    monkeypatch.setattr(commbench.dist, "destroy_process_group", lambda: release.wait(5))

    def leave(code):
        raise SystemExit(code)

    monkeypatch.setattr(commbench.os, "_exit", leave)
    with (
        pytest.warns(RuntimeWarning, match="did not return within 0 s"),
        pytest.raises(SystemExit) as e,
    ):
        commbench.leave_group(3, timeout_s=0.2)
    assert e.value.code == 3
    release.set()
    monkeypatch.setattr(commbench.dist, "destroy_process_group", lambda: None)
    assert commbench.leave_group(0, timeout_s=5) is None


def test_a_sample_is_timed_on_the_rank_that_started_last() -> None:
    # rank 1 starts each sample 50 ms late: rank 0 times that wait, rank 1 the all-reduce
    ((nbytes, seconds),) = run_ranks(2, "tests.tp_ranks:late_rank_times", (), timeout_s=60)
    assert nbytes == 4096 and 0 < seconds < 0.025, seconds
