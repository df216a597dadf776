"""The tensor-parallel block's backward: on 2 gloo ranks the planned block (every
decision) and the unplanned TPBlock give the gradients of the unsharded block run on one
process, for the input and for each rank's shard of every parameter."""

from __future__ import annotations

import torch
import torch.distributed as dist

from planner.distributed.parallel_models import TPBlock
from planner.distributed.tp_plan import PlannedTPBlock, TPDecision
from profiling.commbench import run_ranks

B, S, D, H = 2, 8, 48, 6


def _grads(block: torch.nn.Module, params, x: torch.Tensor, probe: torch.Tensor):
    x = x.detach().requires_grad_()
    (block(x) * probe).sum().backward()
    return x.grad, {n: p.grad.clone() for n, p in params}


def _err(got: torch.Tensor, want: torch.Tensor, scale: float) -> float:
    return float((got - want).abs().max()) / scale


def backward_errors(rank: int, world: int) -> dict[str, float]:
    """Worst relative gradient error per program against the single-process block."""
    torch.manual_seed(0)
    full = TPBlock(D, H, 1, None)
    full.collectives = False  # one process: nothing to reduce
    with torch.no_grad():
        for p in full.parameters():
            p.normal_(0.0, 0.2)
    x, probe = torch.randn(B, S, D), torch.randn(B, S, D)
    want_x, want = _grads(full, full.named_parameters(), x, probe)
    # relative to the largest gradient: some are zero in exact arithmetic (K's bias
    # shifts every score of a query alike, which the softmax ignores)
    scale = max(float(g.abs().max()) for g in [want_x, *want.values()])
    out: dict[str, float] = {}
    programs = {"unplanned": None} | {
        TPDecision(k, f).label: TPDecision(k, f) for k in (1, 2, 4) for f in (False, True)
    }
    for name, decision in programs.items():
        shard = TPBlock.shard_of(full, rank, world, dist.group.WORLD)
        run = shard if decision is None else PlannedTPBlock(shard, decision)
        got_x, got = _grads(run, shard.named_parameters(), x, probe)
        slices = shard.shard_slices(rank)
        errs = [_err(got_x, want_x, scale)]
        errs += [_err(g, want[n][slices[n]], scale) for n, g in got.items()]
        out[name] = max(errs)
    return out


def test_planned_and_unplanned_tp_block_gradients_equal_the_single_process_block() -> None:
    errs = run_ranks(2, "tests.test_tp_backward:backward_errors", timeout_s=90)
    assert len(errs) == 7
    assert max(errs.values()) < 1e-5, errs
