"""A plan's data-parallel decision realized: torch's DistributedDataParallel built with
the gradient bucket size the plan chose (`Plan.data_parallel`, a `DPChoice`).

    plan = Plan.from_json(json.loads(Path("plan.json").read_text()))
    model = wrap_ddp(model, plan)          # in each rank, after init_process_group

The bucket size is what DDP takes as `bucket_cap_mb`; the planner priced it with DDP's
packing (planner.distributed.dp.pack) and first bucket (`first_bucket_bytes`: DDP's
default 25 MiB is left to DDP, so its 1 MiB first bucket is kept; any other size is
passed, and DDP then caps its first bucket at the same size). DDP assigns the buckets
after its first step, in the order the gradients became ready; the first step runs
with one bucket.

The all-reduce algorithm a plan prices per bucket (ring, tree, hierarchical) is a
priced choice only: DDP has no comm hook that selects an algorithm (its hooks compress
or reorder gradients), and NCCL and gloo pick their own; no hook is registered.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from planner.distributed.dp import DDP_BUCKET_BYTES
from planner.errors import PlanError
from planner.plans.plan import DPChoice, Plan

MIB = 1024 * 1024


def dp_choice(plan: Plan | DPChoice) -> DPChoice:
    """The data-parallel decision of `plan`; a PlanError where it has none."""
    if isinstance(plan, DPChoice):
        return plan
    if not isinstance(plan, Plan):
        raise PlanError(f"expected a Plan or a DPChoice, got {type(plan).__name__}")
    if plan.data_parallel is None:
        raise PlanError(
            f"plan {plan.graph_key[:12]} has no data-parallel decision: plan a "
            "graph with a gradient sync (fusion-plan plan --model zoo:dp-block "
            "--save-plan plan.json, with the model's shapes) and load that plan"
        )
    return plan.data_parallel


def ddp_kwargs(plan: Plan | DPChoice) -> dict[str, Any]:
    """The keyword arguments of DistributedDataParallel that realize `plan`'s decision:
    `bucket_cap_mb` (MiB, exact in bytes), none at DDP's own default of 25 MiB."""
    choice = dp_choice(plan)
    if choice.bucket_bytes == DDP_BUCKET_BYTES:
        return {}
    return {"bucket_cap_mb": choice.bucket_bytes / MIB}


def wrap_ddp(
    model: torch.nn.Module,
    plan: Plan | DPChoice,
    process_group: dist.ProcessGroup | None = None,
    **kwargs: Any,
) -> DistributedDataParallel:
    """`model` under DistributedDataParallel with `plan`'s gradient bucket size; other
    DDP arguments (device_ids, find_unused_parameters, ...) pass through `kwargs`.

    Needs an initialized process group of the size the plan was decided for (its
    `ranks`); refuses a `bucket_cap_mb` of the caller's, which would override the plan."""
    choice = dp_choice(plan)
    if "bucket_cap_mb" in kwargs:
        raise PlanError(
            "bucket_cap_mb is the plan's decision: leave it out, or build "
            "DistributedDataParallel yourself to choose another"
        )
    if not dist.is_available() or not dist.is_initialized():
        raise PlanError(
            "wrap_ddp needs an initialized process group: call "
            "torch.distributed.init_process_group in each rank first"
        )
    ranks = dist.get_world_size(process_group)
    if ranks != choice.ranks:
        raise PlanError(
            f"the plan's bucket size was decided for {choice.ranks} ranks, this group has "
            f"{ranks}: plan again for {ranks} ranks (the sync's DP shape parameter)"
        )
    ddp = DistributedDataParallel(
        model, process_group=process_group, **ddp_kwargs(choice), **kwargs
    )
    if ddp.bucket_bytes_cap != choice.bucket_bytes:
        raise PlanError(
            f"DistributedDataParallel took a bucket cap of {ddp.bucket_bytes_cap} bytes for "
            f"the plan's {choice.bucket_bytes}"
        )
    return ddp
