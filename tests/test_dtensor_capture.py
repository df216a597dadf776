"""Capture of tensor parallelism written with DTensor (parallelize_module with
ColwiseParallel / RowwiseParallel on a CPU device mesh) or with c10d's in-place
collectives: the rank's program holds the collectives, with their bytes and group size,
and computes what the model computes."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from planner.distributed import parallel_models as pm
from planner.distributed.collectives import collectives
from planner.ir.capture import export_model
from profiling.commbench import run_ranks

B, S, D, HID = 2, 8, 16, 64


def _mlp_plans() -> dict[str, dict]:
    return {
        "tp": {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()},
        # sequence parallel: tokens sharded on S outside the MLP
        "sp": {
            "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1)),
        },
    }


def captured_mlp_collectives(rank: int, world: int) -> dict:
    """Per plan: the captured collectives (kind, bytes, group size) and the worst error of
    the captured program against the DTensor model and against the unsharded MLP."""
    mesh = init_device_mesh("cpu", (world,))
    out: dict = {}
    for name, plan in _mlp_plans().items():
        torch.manual_seed(0)
        full = pm.GeluMLP(D, HID)
        x = torch.randn(B, S, D)
        want = full(x)
        model = parallelize_module(copy.deepcopy(full), mesh, plan)  # shards the weights
        rows = slice(rank * S // world, (rank + 1) * S // world)
        local_x = x[:, rows].contiguous() if name == "sp" else x
        local_want = want[:, rows] if name == "sp" else want
        captured = export_model(model, (local_x,))
        got = captured.program.module()(local_x)
        got = got[0] if isinstance(got, tuple | list) else got
        dt = model(local_x)
        out[name] = {
            "collectives": [
                (c.kind.value, c.nbytes, c.group_size) for c in collectives(captured.graph)
            ],
            "vs_dtensor": float((got - dt).abs().max()),
            "vs_full": float((got - local_want).abs().max()),
        }
    return out


def test_dtensor_mlp_capture_has_the_collectives_and_runs_like_the_model() -> None:
    res = run_ranks(2, "tests.test_dtensor_capture:captured_mlp_collectives", timeout_s=60)
    act = B * S * D * 4
    assert res["tp"]["collectives"] == [["all_reduce", act, 2]]
    # all-gather: the gathered (B, S, D) input; reduce-scatter: the (B, S, D) partial sum
    assert res["sp"]["collectives"] == [["all_gather", act, 2], ["reduce_scatter", act, 2]]
    for r in res.values():
        assert r["vs_dtensor"] < 1e-6 and r["vs_full"] < 1e-5, res


class _InPlaceCollectives(torch.nn.Module):
    """Megatron-style code: c10d's in-place collectives on a process group."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.w
        dist.all_reduce(y)
        gathered = torch.empty(2 * x.shape[0], D)
        dist.all_gather_into_tensor(gathered, y)
        scattered = torch.empty(x.shape[0] // 2, D)
        dist.reduce_scatter_tensor(scattered, y)
        return gathered.sum(0) + scattered.sum(0)


def test_in_place_c10d_collectives_are_captured_as_functional_collectives() -> None:
    pm.capture_group(2)  # torch's single-process fake group
    g = export_model(_InPlaceCollectives(), (torch.randn(B * S, D),)).graph
    act = B * S * D * 4
    got = [(c.kind.value, c.nbytes, c.group_size) for c in collectives(g)]
    assert got == [("all_reduce", act, 2), ("all_gather", 2 * act, 2), ("reduce_scatter", act, 2)]
