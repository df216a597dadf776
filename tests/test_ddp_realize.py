"""A plan's data-parallel decision realized (planner.distributed.ddp): DDP built with the
plan's bucket size gives the single-process gradients on 2 gloo ranks, with the buckets
the planner priced; and the data-parallel transformer block the decision is planned on."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.distributed as dist

import zoo
from cli.main import main
from planner.distributed import parallel_models as pm
from planner.distributed.collectives import collectives
from planner.distributed.comm_cost import collective_time_s
from planner.distributed.ddp import ddp_kwargs, dp_choice, wrap_ddp
from planner.distributed.dp import DDP_BUCKET_BYTES, first_bucket_bytes, gradient_sync, pack
from planner.distributed.links import get_link
from planner.errors import PlanError
from planner.ir.capture import capture
from planner.plans.plan import DPChoice, GroupPlan, Plan
from profiling.commbench import run_ranks

MIB = 1024 * 1024


def _plan(**kw) -> Plan:
    return Plan("g" * 16, "s", "h100", "fp32", (GroupPlan((0,)),), "priority", "m/1", 1e-3, **kw)


def test_ddp_kwargs_carry_the_plans_bucket_size() -> None:
    assert ddp_kwargs(DPChoice(3 * MIB // 4, 2, 1.0, 1.0)) == {"bucket_cap_mb": 0.75}
    odd = DPChoice(12345, 2, 1.0, 1.0)  # not a whole number of KiB: exact all the same
    assert int(ddp_kwargs(odd)["bucket_cap_mb"] * MIB) == 12345
    # DDP's own default is left to DDP, which keeps its 1 MiB first bucket only then
    assert ddp_kwargs(_plan(data_parallel=DPChoice(DDP_BUCKET_BYTES, 2, 1.0, 1.0))) == {}


def test_a_plan_without_a_data_parallel_decision_is_refused() -> None:
    with pytest.raises(PlanError, match="no data-parallel decision"):
        ddp_kwargs(_plan())
    with pytest.raises(PlanError, match="Plan or a DPChoice"):
        dp_choice({"bucket_bytes": 1})  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="plan's decision"):
        wrap_ddp(torch.nn.Linear(2, 2), DPChoice(1024, 2, 1.0, 1.0), bucket_cap_mb=4)


def test_a_plan_for_another_number_of_ranks_is_refused() -> None:
    if not dist.is_initialized():
        pm.capture_group(2)  # torch's fake group of 2 ranks, as capture uses
    other = dist.get_world_size() + 1
    with pytest.raises(PlanError, match=f"decided for {other} ranks"):
        wrap_ddp(torch.nn.Linear(2, 2), DPChoice(1024, other, 1.0, 1.0))


def test_ddp_from_the_plan_gives_the_single_process_gradients_on_gloo() -> None:
    out = run_ranks(2, "tests.test_ddp_realize:ddp_step", (8192,), timeout_s=90)
    assert out["bucket_bytes_cap"] == 8192
    assert out["default_cap"] == DDP_BUCKET_BYTES
    assert out["grad_error"] < 1e-5
    # DDP's buckets after its first step are the planner's packing of the gradients in
    # the order they became ready, with the plan's cap for the first bucket too
    order = [i for b in out["buckets"] for i in b]
    sizes = [out["param_bytes"][i] for i in order]
    want = [[order[i] for i in b] for b in pack(sizes, 8192, first_bucket_bytes(8192))]
    assert out["buckets"] == want and len(want) > 2
    # and the buckets zoo:dp-block's sync prices for the same block at that cap
    sync = gradient_sync(capture(*zoo.get("dp-block").build({"D": 32, "DP": 2})))
    assert sync is not None
    grads = sync.grad_bytes
    planned = [sum(grads[i] for i in b) for b in pack(grads, 8192, first_bucket_bytes(8192))]
    assert [sum(out["param_bytes"][i] for i in b) for b in out["buckets"]] == planned


def ddp_step(rank: int, world: int, bucket_bytes: int) -> dict:
    """On each rank: zoo's transformer block under `wrap_ddp` with a plan of
    `bucket_bytes`, three steps on this rank's half of a batch (DDP assigns its buckets
    after the first, and reports them after the next); against the unwrapped block's
    gradients on the whole batch."""
    torch.manual_seed(0)
    block = zoo.TransformerBlock(32, 4)
    ref = copy.deepcopy(block)
    x = torch.randn(4, 8, 32)
    ddp = wrap_ddp(block, DPChoice(bucket_bytes, world, 0.0, 0.0))
    for _ in range(3):
        ddp.zero_grad()
        ddp(x.chunk(world)[rank]).pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    scale = max(p.grad.abs().max().item() for p in ref.parameters())
    err = max(
        (a.grad - b.grad).abs().max().item()
        for a, b in zip(block.parameters(), ref.parameters(), strict=True)
    )
    data = ddp._get_ddp_logging_data()
    buckets = [
        [int(i) for i in b.split()] for b in data["rebuilt_per_bucket_param_indices"].split(",")
    ]
    default = wrap_ddp(copy.deepcopy(ref), DPChoice(DDP_BUCKET_BYTES, world, 0.0, 0.0))
    dist.barrier()
    return {
        "bucket_bytes_cap": ddp.bucket_bytes_cap,
        "default_cap": default.bucket_bytes_cap,
        "grad_error": err / scale,
        "buckets": buckets,
        "param_bytes": [p.numel() * p.element_size() for p in block.parameters()],
    }


# ---- the data-parallel transformer block ----------------------------------------------
def test_dp_block_all_reduces_the_blocks_gradients_in_ddp_buckets() -> None:
    m, x = zoo.get("dp-block").build({"D": 64, "DP": 2, "BUCKET_KB": 16})
    shapes = [tuple(t.shape) for t in x]
    block = [tuple(p.shape) for p in zoo.TransformerBlock(64, 4).parameters()]
    assert sorted(shapes) == sorted(block)
    cs = collectives(capture(m, x))
    sizes = [4 * torch.Size(s).numel() for s in shapes]
    assert len(cs) == len(pm.buckets_for(sizes, 16 * 1024)) > 1
    assert sum(c.nbytes for c in cs) == sum(sizes)
    assert {c.group_size for c in cs} == {2}


def _analyze(capsys, *argv: str) -> dict:
    assert main(["analyze", "--model", "zoo:dp-block", "--device", "h100", "--dtype", "fp32",
                 "--interconnect", "ib-hdr", "--format", "json", *argv]) == 0  # fmt: skip
    return json.loads(capsys.readouterr().out)["distributed"]["gradient_buckets"]


def test_analyze_dp_prices_the_dp_blocks_buckets(capsys) -> None:
    gb = _analyze(capsys, "--shape", "D=256", "--dp", "2")
    assert gb["ranks"] == 2
    # ready order starts with f2's bias (1 KiB) and weight (1 MiB): DDP's 1 MiB first
    # bucket closes there, its 25 MiB bucket takes the other 2 MiB; the searched cap
    # holds all 3 MiB in one bucket, one latency less
    sizes = [4 * torch.Size(s).numel() for s in zoo.block_param_shapes(256)]
    total, first = sum(sizes), sizes[-1] + sizes[-2]
    link = get_link("ib-hdr")

    def ar(n: int) -> float:
        return min(collective_time_s("all_reduce", a, n, 2, link) for a in ("ring", "tree"))

    assert gb["ddp_default_predicted_s"] == pytest.approx(ar(first) + ar(total - first))
    assert gb["searched_predicted_s"] == pytest.approx(ar(total))
    assert [b["bytes"] for b in gb["buckets"]] == [total]
    assert main(["analyze", "--model", "zoo:dp-block", "--shape", "DP=2", "--dp", "4"]) != 0
    assert "disagree" in capsys.readouterr().err


def test_the_dp_blocks_planned_bucket_size_is_what_ddp_gets(capsys, tmp_path) -> None:
    path = tmp_path / "plan.json"
    argv = ["plan", "--model", "zoo:dp-block", "--shape", "D=256,DP=2", "--device", "h100",
            "--dtype", "fp32", "--interconnect", "ib-hdr", "--save-plan", str(path)]  # fmt: skip
    assert main([*argv, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    plan = Plan.from_json(json.loads(path.read_text()))
    searched = out["data_parallel"]["searched_bytes"]
    assert plan.data_parallel is not None and plan.data_parallel.bucket_bytes == searched
    assert ddp_kwargs(plan)["bucket_cap_mb"] * MIB == searched
