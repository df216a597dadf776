"""A Plan's recorded tensor-parallel decision applied to a captured rank program, verified
against the unplanned program on every rank.

`realize_tp(captured, plan)` finds the program's column -> row sites
(planner.distributed.tp_graph), checks that they are the sites the plan recorded
(`Plan.tensor_parallel`), rewrites a copy of the program with `tp_graph.tp_program` (each
site's GEMM over `chunks` token slices with an asynchronous all-reduce per slice, the
epilogue as one unit when `fuse_epilogue`; both per site) and runs both programs on the capture's example
inputs (or `inputs`): every output of the planned program must equal the unplanned
program's within `TOLERANCE` of the output's largest value. The ranks agree on the
rewrite before either program runs, and on the outcome before any of them returns (each
a MIN all-reduce of a flag over the sites' process group), so all ranks run the same
programs and issue the same collectives: a mismatch or a failure on any rank makes every
rank run the unplanned program, with a warning that says why. The planned program runs
forward only (tp_graph.row_parallel_chunks).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from planner.distributed.tp_autograd import group_of
from planner.distributed.tp_graph import Decision, SiteDecisions, TPSite, find_tp_sites, tp_program
from planner.distributed.tp_plan import TPDecision
from planner.errors import PlanError
from planner.ir.capture import Captured
from planner.plans.plan import Plan

# the largest |planned - unplanned| allowed, relative to max(1, max |unplanned|)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 3e-2, torch.bfloat16: 3e-2}


class TPRealizeWarning(UserWarning):
    """A recorded tensor-parallel decision was not applied: the unplanned program runs."""


class RealizedTP(nn.Module):
    """The program a Plan's tensor-parallel decision realizes: the rewritten program when
    `applied`, else the unplanned one (`reason` says why). Called like the captured
    program's module, on the same ranks."""

    static_shapes = True  # the sites' token counts are the capture's

    def __init__(self, program: nn.Module, applied: bool, reason: str, decision: Decision):
        super().__init__()
        self.program, self.applied, self.reason, self.decision = program, applied, reason, decision

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.program(*args, **kwargs)


def _max_error(got: Any, ref: Any) -> float:
    """max |got - ref| / max(1, max |ref|) over the outputs' tensors (inf where the
    structures or shapes differ)."""
    a, spec_a = pytree.tree_flatten(got)
    b, spec_b = pytree.tree_flatten(ref)
    if spec_a != spec_b:
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if not isinstance(y, torch.Tensor):
            continue
        if not isinstance(x, torch.Tensor) or x.shape != y.shape:
            return float("inf")
        if y.numel():
            scale = max(1.0, float(y.abs().max()))
            worst = max(worst, float((x.float() - y.float()).abs().max()) / scale)
    return worst


def _tolerance(outputs: Any) -> float:
    dtypes = [t.dtype for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
    return max((TOLERANCE.get(d, 3e-2) for d in dtypes), default=1e-5)


def _agree(ok: bool, sites: list[TPSite]) -> bool:
    """Whether every rank of the sites' group says `ok`."""
    group = group_of(sites[0].group_name)
    on_gpu = dist.get_backend(group) == "nccl"  # NCCL reduces GPU tensors only
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def realize_tp(
    captured: Captured,
    plan: Plan,
    *,
    inputs: tuple[Any, ...] | None = None,
    compile_epilogue: bool | None = None,
    verify: bool = True,
    rewrite: Callable[..., fx.GraphModule] = tp_program,
) -> RealizedTP:
    """`plan`'s tensor-parallel decision on `captured` (module docstring). Call it on every
    rank of the program's group, each with its own capture. `compile_epilogue` (default:
    on CUDA inputs) compiles a fused epilogue with Inductor; `rewrite` replaces
    `tp_program` (tests inject wrong programs with it)."""
    choice = plan.tensor_parallel
    if choice is None:
        raise PlanError("the plan records no tensor-parallel decision")
    ds = tuple(TPDecision(k, f) for k, f in zip(choice.chunks, choice.fuse_epilogue))
    decision: Decision = ds[0] if choice.uniform else SiteDecisions(ds)
    gm = captured.program.module()
    args = tuple(captured.example_inputs if inputs is None else inputs)

    def unplanned(reason: str) -> RealizedTP:
        warnings.warn(
            f"tensor-parallel decision {choice.label} not applied, the unplanned program "
            f"runs instead: {reason}",
            TPRealizeWarning,
            stacklevel=3,
        )
        return RealizedTP(gm, False, reason, decision)

    sites = find_tp_sites(gm)
    found = tuple(s.gemm for s in sites)
    if found != choice.sites:
        return unplanned(
            f"the plan's sites {list(choice.sites)} are not the program's {list(found)}"
        )
    for s, d in zip(sites, ds):
        if s.rows % d.chunks:
            return unplanned(f"site {s.gemm}'s {s.rows} tokens do not split into {d.chunks} chunks")
    if compile_epilogue is None:
        compile_epilogue = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    reason = ""
    try:
        planned = rewrite(gm, decision, sites, compile_epilogue)
    except Exception as e:  # the rewrite failed: the unplanned program
        reason = _failure(e)
    if verify:
        # agreed before either program runs: a rank whose rewrite failed runs neither, and
        # must not leave the others issuing the programs' collectives alone
        reason = _agreed(reason, sites, "another rank could not rewrite the program")
        if not reason:
            try:
                with torch.no_grad():
                    ref = gm(*args)
                    got = planned(*args)
                err, tol = _max_error(got, ref), _tolerance(ref)
                if not err <= tol:
                    reason = (
                        f"its outputs differ from the unplanned program's by {err:.3g} (> {tol:g})"
                    )
            except Exception as e:  # a failure of its run: the unplanned program
                reason = _failure(e)
    reason = _agreed(reason, sites, "another rank's planned program did not match")
    if reason:
        return unplanned(reason)
    return RealizedTP(planned, True, "", decision)


def _failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def _agreed(reason: str, sites: list[TPSite], elsewhere: str) -> str:
    """Why the decision is not applied, as every rank takes it ("": applied so far on
    every rank): this rank's `reason`, else `elsewhere` when another rank had one. Every
    rank calls it at the same points whatever happened, so each issues this collective."""
    try:
        agreed = _agree(not reason, sites)
    except Exception as e:
        return reason or f"the ranks could not agree: {type(e).__name__}: {e}"
    return reason or ("" if agreed else elsewhere)
