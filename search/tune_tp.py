"""The tensor-parallel decision of a tuning job (search.tune) whose model is a rank program.

A model whose captured program holds column -> row sites (planner.distributed.tp_graph:
the zoo's functional-collective models, or a DTensor model captured as its rank program)
gets its decision searched as `fusion-plan plan` searches it (search.tp_search, the
all-reduce priced on the link table), and the tuned plan records it
(`Plan.tensor_parallel`), so the runtime backend serves it.

Whether the decision can be measured depends on where tune runs:

- on real ranks (torch.distributed initialized with a real backend, more than one rank,
  every rank running the same tuning job; `fusion-plan tune --dist-backend` under
  torchrun, `init_ranks`): every call that issues a collective must be
  issued by every rank, so the timer's calls per round are agreed (the largest over the
  ranks, `agree_calls`) and each timing is the slowest rank's (`slowest`); the plan with the
  decision is then one more measured candidate, and it is stored only if it measured best;
- in one process (torch's fake group, whose collectives do nothing): a measurement would
  leave the communication out, so the decision is recorded with its prediction only and
  tune says so; the plan's measured latency is the fusion plan's, without the decision.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import torch
import torch.distributed as dist

from planner.distributed.agree import agree_failures
from planner.distributed.collectives import collectives
from planner.distributed.comm_cost import cheapest_algorithm
from planner.distributed.links import get_link
from planner.distributed.tp_graph import find_tp_sites
from planner.errors import DeviceSpecError, FusionPlannerError
from planner.hardware import get_spec
from planner.ir.capture import Captured
from planner.measurement import ERROR_KINDS, MeasureError, Measurement
from planner.plans.plan import TPChoice
from search.tp_search import TPGraphPlan, search_tp_graph


def on_ranks() -> bool:
    """Whether this process is one of several real ranks (not torch's fake group)."""
    return (
        dist.is_available()
        and dist.is_initialized()
        and dist.get_world_size() > 1
        and dist.get_backend() != "fake"
    )


def init_ranks(backend: str) -> None:
    """Join the job torchrun started (its environment: RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT) with `backend`; on NCCL this rank's GPU is LOCAL_RANK's."""
    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise FusionPlannerError(
            f"--dist-backend {backend} runs tune as one rank of a job torchrun starts, but "
            f"{', '.join(missing)} is not set: launch it with `torchrun --nproc-per-node N "
            "-m cli.main tune ...` (every rank the same command, each with its own --cache)"
        )
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, init_method="env://")


def _device() -> torch.device:
    """Where the ranks' own small collectives run: the GPU on NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree_calls(calls: int) -> int:
    """The largest of every rank's `calls` (the timer's calls per round)."""
    t = torch.tensor([calls], dtype=torch.int64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def agree_failure(error: str) -> tuple[int, str] | None:
    """Every rank's outcome of one step, the same on every rank: None when the step
    succeeded on every rank (each passed ""), else the first failing rank and its `error`.

    Call it on every rank after each step whose outcome decides whether collectives
    follow, whether the step succeeded here or not, so that no rank goes on to issue
    collectives that another, failed, rank never will. One all_gather of a fixed-size
    byte tensor per rank (planner.distributed.agree): nothing is unpickled."""
    return agree_failures([error])[0]


def agree_error(error: MeasureError | None) -> MeasureError | None:
    """The error every rank takes for one step (`agree_failure`): None when no rank
    failed; this rank's own when it failed here; else the failing rank's, its message
    prefixed with "on rank N". The runner's and the serving executor's `agree` hook."""
    failed = agree_failure(str(error) if error is not None else "")
    if failed is None or error is not None:
        return error
    rank, text = failed
    kind, _, message = text.partition(": ")
    if kind not in ERROR_KINDS:  # cut, or not a measurement's error
        kind, message = "run", text
    return MeasureError(kind, f"on rank {rank}: {message}")


def agreed(m: Measurement) -> Measurement:
    """`m` as every rank takes it: failed on every rank when it failed on any (the
    failing rank's error, `agree_error`), else with the slowest rank's timing (`slowest`)."""
    error = agree_error(m.error)
    if error is None:
        return slowest(m)
    return m if m.error is not None else dataclasses.replace(m, timing=None, error=error)


def slowest(m: Measurement) -> Measurement:
    """`m` with the slowest rank's median and p99 (a program with collectives takes as
    long as its slowest rank); a measurement that failed on any rank fails on every rank."""
    mine = (m.timing.median_s, m.timing.p99_s) if m.timing is not None else (math.inf,) * 2
    t = torch.tensor(mine, dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    median, p99 = (float(v) for v in t)
    if m.timing is None:
        return m
    if math.isinf(median):
        return dataclasses.replace(
            m, timing=None, error=MeasureError("run", "it failed on another rank")
        )
    return dataclasses.replace(m, timing=dataclasses.replace(m.timing, median_s=median, p99_s=p99))


def search_decision(captured: Captured, cost_model: Any, device: str) -> TPGraphPlan | None:
    """The searched decision for `captured` (None: no collective or no column -> row site),
    priced by `cost_model` with ring all-reduces over `device`'s default link (NVLink on
    a GPU, the local link's measured fit or PCIe 4 on a CPU), as `fusion-plan plan` does."""
    if not collectives(captured.graph):
        return None
    sites = find_tp_sites(captured.program.module())
    if not sites:
        return None
    sizes = [c.group_size for c in collectives(captured.graph) if c.group_size]
    ranks = sizes[0] if sizes else 2
    if get_spec(device).kind == "gpu":
        link = get_link("nvlink")
    else:
        try:
            link = get_link("local")
        except DeviceSpecError:
            link = get_link("pcie4")
    return search_tp_graph(
        captured,
        lambda n: cheapest_algorithm("all_reduce", n, ranks, link).seconds,
        cost_model,
    )


def describe(choice: TPChoice, outcome: str, error: str = "") -> str:
    """One line of tune's output about the recorded decision. `outcome`: "stored"
    (measured on the ranks, the fastest), "slower" (measured, slower than the plan
    without it), "failed" (its measurement failed: `error`) or "predicted" (one process)."""
    head = (
        f"tensor-parallel decision {choice.label} over {len(choice.sites)} site(s): "
        f"predicted forward {choice.predicted_s * 1e6:.1f} us"
    )
    tails = {
        "stored": "measured on the ranks with the plan, the fastest: recorded",
        "slower": "measured on the ranks with the plan, slower than the plan without it: "
        "not recorded",
        "failed": f"its measurement on the ranks failed ({error[:200]}): not recorded",
        "predicted": "recorded from its prediction, NOT measured: this process has no real "
        "ranks (its collectives do nothing), so the measured latency is the fusion plan's "
        "without the decision; run tune on the ranks to measure it",
    }
    return f"{head}; {tails[outcome]}"


__all__ = [
    "agree_calls",
    "agree_error",
    "agree_failure",
    "agreed",
    "describe",
    "init_ranks",
    "on_ranks",
    "search_decision",
    "slowest",
]
