"""benchmarks/pipeline_gloo.py runs a real two-stage pipeline: on two gloo ranks, both
schedules give the gradients of the two stages run in one process."""

from __future__ import annotations

import torch
import torch.distributed as dist

from benchmarks.pipeline_gloo import SCHEDULES, _stage, _step
from profiling.commbench import run_ranks

D, HID, LAYERS, BATCH, M = 8, 16, 1, 8, 4


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(100)
    return [torch.randn(BATCH // M, D) for _ in range(M)]


def gradients_on_ranks(rank: int, world: int) -> list[list[float]]:
    """Per schedule, each stage's gradient (sum and sum of squares over its parameters)."""
    model = _stage(D, HID, LAYERS, rank)
    out = []
    for schedule in SCHEDULES:
        _step(rank, model, _inputs(), schedule)
        g = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
        both = torch.zeros(2, 2, dtype=torch.float64)
        both[rank] = torch.stack([g.sum(), (g * g).sum()])
        dist.all_reduce(both)
        out.append(both.flatten().tolist())
        model.zero_grad(set_to_none=True)
    return out


def test_both_schedules_give_the_single_process_gradients() -> None:
    first, second = _stage(D, HID, LAYERS, 0), _stage(D, HID, LAYERS, 1)
    loss = sum(second(first(x)).sum() for x in _inputs())
    loss.backward()
    want = []
    for stage in (first, second):
        g = torch.cat([p.grad.flatten() for p in stage.parameters()]).double()
        want += [float(g.sum()), float((g * g).sum())]
    got = run_ranks(2, "tests.test_pipeline_gloo:gradients_on_ranks", timeout_s=120)
    assert len(got) == len(SCHEDULES)
    for row in got:
        assert torch.allclose(torch.tensor(row), torch.tensor(want), rtol=1e-5, atol=1e-7)
