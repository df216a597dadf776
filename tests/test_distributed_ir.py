"""Collectives in the IR: capture of the tensor- and data-parallel zoo models, and those
models on 2 gloo ranks checked against the unsharded, single-process program."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

import zoo
from planner.distributed import parallel_models as pm
from planner.distributed.collectives import collectives
from planner.distributed.comm_cost import Algorithm, CollectiveKind
from planner.fusion.partition import Partition
from planner.ir.capture import capture, export_model
from planner.ir.graph import Category
from planner.realize.realizer import realize
from profiling.commbench import run_ranks

SMALL = {"B": 2, "S": 16, "D": 64}


def test_tp_mlp_captures_one_all_reduce_of_the_activation() -> None:
    m, x = zoo.get("tp-mlp").build({**SMALL, "HID": 256, "TP": 2})
    g = capture(m, x)
    (c,) = collectives(g)
    assert (c.kind, c.group_size, c.algorithm) == (CollectiveKind.ALL_REDUCE, 2, Algorithm.RING)
    assert c.nbytes == 2 * 16 * 64 * 4  # B*S*D fp32
    # the all-reduce reads the row-parallel GEMM's output; a wait_tensor follows it
    producer = g.tensors[g.nodes[c.node].inputs[0]].producer
    assert g.nodes[producer].op == "linear"
    waits = [n for n in g.nodes if n.target.endswith("wait_tensor.default")]
    assert len(waits) == 1 and waits[0].category is Category.COLLECTIVE


def test_tp_block_has_two_all_reduces_and_local_heads() -> None:
    m, x = zoo.get("tp-block").build({**SMALL, "H": 4, "TP": 2})
    g = capture(m, x)
    cs = collectives(g)
    assert [c.kind for c in cs] == [CollectiveKind.ALL_REDUCE] * 2
    qkv = [n for n in g.nodes if n.op == "linear"][:3]
    assert all(g.tensors[n.outputs[0]].shape[-1] == 32 for n in qkv)  # D / TP


@pytest.mark.parametrize("bucket_kb", [1, 64, 1 << 20])
def test_dp_grad_sync_has_one_all_reduce_per_bucket(bucket_kb: int) -> None:
    p = {"D": 64, "HID": 128, "L": 2, "DP": 2, "BUCKET_KB": bucket_kb}
    m, x = zoo.get("dp-grad-sync").build(p)
    cs = collectives(capture(m, x))
    shapes = pm.mlp_param_shapes(64, 128, 2)
    sizes = [4 * math.prod(s) for s in shapes]
    assert len(cs) == len(pm.buckets_for(sizes, bucket_kb * 1024))
    assert sum(c.nbytes for c in cs) == sum(sizes)
    if bucket_kb == 1 << 20:
        assert len(cs) == 1


def test_buckets_follow_ddp_order_and_bound() -> None:
    assert pm.buckets_for([10, 10, 10, 30], 25) == [[3], [2, 1, 0]]
    assert pm.buckets_for([10, 10, 10, 30], 40) == [[3, 2], [1, 0]]
    with pytest.raises(Exception, match="at least one byte"):
        pm.buckets_for([1], 0)


def test_tp_mlp_shards_match_the_unsharded_mlp_on_gloo() -> None:
    worst = run_ranks(2, "tests.test_distributed_ir:check_against_unsharded", timeout_s=60)
    assert worst < 1e-5


def check_against_unsharded(rank: int, world: int) -> float:
    """On each rank: the TP MLP shard against the full MLP, and the bucketed gradient
    sync against the mean of every rank's gradients; the worst absolute error."""
    group = dist.group.WORLD
    torch.manual_seed(0)
    full = pm.GeluMLP(64, 256)
    x = torch.randn(2, 16, 64)
    want = full(x)
    got = pm.TPMLP.shard_of(full, rank, world, group)(x)
    err = (got - want).abs().max().item()
    shapes = pm.mlp_param_shapes(16, 32, 2)
    grads = [torch.full(s, float(rank + 1)) for s in shapes]
    synced = pm.BucketedGradSync(shapes, 2048, world, group)(*grads)
    mean = sum(range(1, world + 1)) / world
    err = max(err, max((g - mean).abs().max().item() for g in synced))
    return err


def test_a_plan_with_a_collective_runs_on_gloo_like_the_unsharded_mlp() -> None:
    worst = run_ranks(2, "tests.test_distributed_ir:realized_plan_error", timeout_s=90)
    assert worst < 1e-5


def realized_plan_error(rank: int, world: int) -> float:
    """On each rank: capture the TP MLP shard on the real group, realize a plan with the
    first GEMM and GELU in one group and the all-reduce alone (eager units: no compiler on
    the ranks), and compare with the unsharded MLP."""
    torch.manual_seed(0)
    full = pm.GeluMLP(64, 256)
    x = torch.randn(2, 16, 64)
    shard = pm.TPMLP.shard_of(full, rank, world, dist.group.WORLD)
    captured = export_model(shard, (x,))
    g = captured.graph
    (c,) = collectives(g)
    assert c.group_size == world
    first = [n.index for n in g.nodes if n.op in ("linear", "gelu")][:2]
    rest = [frozenset((n.index,)) for n in g.nodes if n.index not in first]
    plan = Partition.from_groups(g, [first, *rest])
    realized = realize(captured, plan, realizations="eager", verify=False)
    out = realized(x)
    return float((out - full(x)).abs().max().item())
