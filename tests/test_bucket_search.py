"""The DP bucket size searched on the DP step model the link runs (two streams or
serial), and measured DDP on gloo."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.distributed.dp import (
    DDP_BUCKET_BYTES,
    SERIAL,
    TWO_STREAM,
    BackwardStep,
    StepModel,
    dp_step_timeline,
    first_bucket_bytes,
    step_model_for,
)
from planner.distributed.links import AlphaBeta, LinkSpec, MeasuredLink, get_link
from planner.errors import FusionPlannerError, PlanError
from planner.plans.plan import GroupPlan, Plan
from profiling.commbench import measure_ddp
from search.bucket_search import candidates, search_bucket_size

MB = 1024 * 1024


def _steps(n: int, grad_mb: float, step_s: float) -> list[BackwardStep]:
    return [BackwardStep(f"l{i}", step_s, (int(grad_mb * MB),)) for i in range(n)]


def test_bandwidth_bound_link_gets_small_buckets_that_overlap() -> None:
    # 8 layers of 4 MiB gradients, 10 ms of backward each; 1 GB/s, 50 us latency
    steps = _steps(8, 4, 10e-3)

    def ar(nbytes: int) -> float:
        return 50e-6 + nbytes / 1e9

    choice = search_bucket_size(steps, ar, ddp_first_bucket=False)
    # one layer per bucket hides all but the last all-reduce: 8 x 10 ms + one 4 MiB transfer
    assert choice.bucket_bytes == 4 * MB
    assert choice.predicted_s == pytest.approx(80e-3 + ar(4 * MB))
    assert choice.predicted_s < choice.ddp_default_predicted_s  # 25 MiB: 6 layers wait


def test_latency_bound_link_gets_one_bucket() -> None:
    steps = _steps(8, 0.01, 1e-6)  # tiny gradients, almost no compute

    def ar(nbytes: int) -> float:
        return 1e-3 + nbytes / 1e9  # 1 ms per collective dominates

    choice = search_bucket_size(steps, ar, ddp_first_bucket=False)
    assert choice.bucket_bytes >= 8 * int(0.01 * MB)  # everything in one bucket
    one = dp_step_timeline(steps, choice.bucket_bytes, ar).makespan_s
    assert one == pytest.approx(8e-6 + ar(8 * int(0.01 * MB)))


def test_candidates_cover_every_gradient_and_ddp_default() -> None:
    c = candidates(_steps(3, 1, 1e-3))
    assert DDP_BUCKET_BYTES in c and min(c) <= MB and max(c) >= 3 * MB


@pytest.mark.slow  # two ranks running DDP: ~35 s on this shared 2-core machine
def test_ddp_over_gloo_is_measured_per_bucket_cap() -> None:
    m = measure_ddp(2, 32, 64, 2, 4, [0.001, 25.0], reps=2, sizes=[4096, 65536])
    assert set(m["ddp_s"]) == {"0.001", "25.0"}
    assert all(t > 0 for t in m["ddp_s"].values())
    assert m["fwd_bwd_s"] > m["fwd_s"] > 0 and len(m["all_reduce"]) == 2


def _plan(**kw) -> Plan:
    return Plan("g", "s", "h100", "fp32", (GroupPlan((0,)),), "priority", "m/1", 1e-3, **kw)


def test_plan_records_the_bucket_decision_and_reads_records_without_it() -> None:
    steps = _steps(8, 4, 10e-3)
    choice = search_bucket_size(steps, lambda n: 50e-6 + n / 1e9, ddp_first_bucket=False)
    rec = choice.record(4, "ib-hdr")
    assert (rec.bucket_bytes, rec.ranks, rec.link) == (choice.bucket_bytes, 4, "ib-hdr")
    assert rec.ddp_default_predicted_s == choice.ddp_default_predicted_s
    plan = _plan(data_parallel=rec)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    old = _plan().to_json()  # a record of a plan without the decision, as written before
    assert "data_parallel" not in old and Plan.from_json(old).data_parallel is None


@pytest.mark.parametrize(
    "bad", [{"bucket_bytes": 0, "ranks": 2}, {"ranks": 2}, {"bucket_bytes": 1.5, "ranks": 2}, []]
)
def test_malformed_bucket_decision_is_a_plan_error(bad) -> None:
    d = _plan().to_json()
    d["data_parallel"] = (
        {**bad, "predicted_s": 1.0, "ddp_default_predicted_s": 1.0}
        if isinstance(bad, dict)
        else bad
    )
    with pytest.raises(PlanError):
        Plan.from_json(d)


def _measured(link: str, backend: str) -> LinkSpec:
    fit = AlphaBeta(50e-6, 1e-9)
    m = MeasuredLink(backend, 2, "all_reduce", "ring", (fit,), 0.05, "x", "2.13", "now")
    return replace(get_link(link, measured=False), measured=m, by_kind={"all_reduce": m})


def test_the_step_model_follows_the_links_backend_then_the_ranks_device() -> None:
    # measured fits name the library that ran them; a datasheet link goes by the device
    assert step_model_for(_measured("pcie4", "gloo"), "gpu").name == SERIAL
    assert step_model_for(_measured("pcie4", "nccl"), "cpu").name == TWO_STREAM
    table = get_link("ib-hdr", measured=False)
    assert step_model_for(table, "cpu").name == SERIAL
    assert step_model_for(table, "gpu").name == TWO_STREAM
    assert step_model_for(table, "gpu", SERIAL).name == SERIAL  # the caller's override
    assert step_model_for(_measured("pcie4", "gloo"), "cpu", TWO_STREAM).name == TWO_STREAM
    with pytest.raises(FusionPlannerError, match="unknown DP step model"):
        step_model_for(table, "cpu", "three-streams")


def test_under_the_serial_model_the_search_picks_the_argmin_of_the_serial_prices() -> None:
    # 8 layers of 4 MiB, 10 ms of backward each, 1 GB/s and 50 us: on two streams one
    # layer per bucket hides all but the last all-reduce; in sequence nothing hides, so
    # every extra bucket only adds its latency and one bucket wins
    steps = _steps(8, 4, 10e-3)

    def ar(nbytes: int) -> float:
        return 50e-6 + nbytes / 1e9

    two = search_bucket_size(steps, ar, forward_s=5e-3)
    serial_model = StepModel(SERIAL, "test")
    serial = search_bucket_size(steps, ar, forward_s=5e-3, step_model=serial_model)
    assert (two.step_model, serial.step_model) == (TWO_STREAM, SERIAL)
    prices = {
        b: dp_step_timeline(
            steps, b, ar, 5e-3, 0.0, first_bucket_bytes(b), serial_comm=True
        ).makespan_s
        for b in candidates(steps)
    }
    assert dict(serial.table) == pytest.approx(prices)
    best = min(prices.values())
    assert serial.predicted_s == best
    assert serial.bucket_bytes == max(b for b, t in prices.items() if t == best)  # ties: larger
    assert serial.bucket_bytes >= 32 * MB  # one bucket
    assert serial.predicted_s == pytest.approx(5e-3 + 80e-3 + ar(32 * MB))
    assert two.bucket_bytes == 4 * MB != serial.bucket_bytes
    assert serial.ddp_default_predicted_s == prices[DDP_BUCKET_BYTES]
    rec = serial.record(2, "local")
    assert rec.step_model == SERIAL
    plan = _plan(data_parallel=rec)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))).data_parallel == rec


def test_records_without_a_step_model_load_and_unknown_ones_are_refused() -> None:
    rec = search_bucket_size(_steps(2, 1, 1e-3), lambda n: 1e-4).record(2)
    d = _plan(data_parallel=rec).to_json()
    del d["data_parallel"]["step_model"]  # as written before the field existed
    assert Plan.from_json(d).data_parallel.step_model == ""
    d["data_parallel"]["step_model"] = "overlapped"
    with pytest.raises(PlanError, match="unknown DP step model"):
        Plan.from_json(d)
