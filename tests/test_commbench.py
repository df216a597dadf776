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
    assert len(fits) == 2
    assert max(rel_errors(fits, rows)) < 1e-6
    assert predict_s(fits, 1 << 12) == pytest.approx(small.time_s(1 << 12))


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
