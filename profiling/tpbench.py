"""Rank-side timing for distributed programs, run inside `commbench.run_ranks` (gloo on
the CPU or NCCL on GPUs, the same code):

- `interleaved`: several variants of one program timed in rounds (each round times every
  variant once, each sample after a barrier with the device idle), so that drift and
  load bursts hit all variants alike; per variant the median and quartiles of each rank's
  samples, the maximum over ranks (a step ends when the slowest rank ends). A variant
  that raises while warming up is dropped with its error; the others go on.
- `host_costs`: the host's seconds to issue one eager kernel, one compiled call and one
  async all-reduce (issue time only: calls without waiting for the device), the maximum
  over ranks, for the planner's host stream.
- `planned_vs_eager`, `whole_vs_eager`: the planned block (region by region, or as one
  compiled graph) against `TPBlock` on the ranks' group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from profiling.commbench import sync, timed_s


def _max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()


def interleaved(
    variants: dict[str, Callable[[], Any]],
    device: torch.device,
    reps: int,
    warmup: int = 3,
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """{variant: {median_s, p25_s, p75_s, reps}} and {variant: error} for those dropped."""
    errors: dict[str, str] = {}
    live: dict[str, Callable[[], Any]] = {}
    for name, fn in variants.items():
        try:
            for _ in range(warmup):
                fn()
            sync(device)
            live[name] = fn
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"[:2000]
    # every rank must time the same variants, or the barriers would not pair up
    ok = torch.tensor([1.0 if n in live else 0.0 for n in variants], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    for name, flag in zip(variants, ok.cpu().tolist(), strict=True):
        if not flag and name in live:
            del live[name]
            errors.setdefault(name, "failed on another rank")
    samples: dict[str, list[float]] = {n: [] for n in live}
    for _ in range(reps):
        for name, fn in live.items():
            dist.barrier()
            sync(device)
            samples[name].append(timed_s(fn, device))
    names = list(samples)
    flat = []
    for n in names:
        xs = np.asarray(samples[n])
        flat += [float(np.median(xs)), float(np.quantile(xs, 0.25)), float(np.quantile(xs, 0.75))]
    flat = _max_over_ranks(flat, device) if flat else []
    out = {
        n: {
            "median_s": flat[3 * i],
            "p25_s": flat[3 * i + 1],
            "p75_s": flat[3 * i + 2],
            "reps": reps,
        }
        for i, n in enumerate(names)
    }
    return out, errors


def _issue_s(fn: Callable[[], Any], device: torch.device, calls: int) -> float:
    """Host seconds per call of `calls` calls issued back to back (the device may still
    be running them when the clock stops: issue time, not execution)."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter() - t0) / calls
    sync(device)
    return dt


def host_costs(
    device: torch.device, group: dist.ProcessGroup | None = None, compile_call: bool = True
) -> dict[str, float | None]:
    """Issue seconds of one eager kernel, one compiled call (None unless `compile_call`)
    and one async all-reduce, each the median of 5 batches of 50 calls, max over ranks."""
    x = torch.ones(16, device=device)

    def eager() -> None:
        torch.add(x, 1.0)

    works: list[Any] = []

    def collective() -> None:
        works.append(dist.all_reduce(x, group=group, async_op=True))

    fns: dict[str, Callable[[], Any]] = {"eager_op_s": eager, "collective_call_s": collective}
    if compile_call:
        compiled = torch.compile(lambda t: t * 2.0 + 1.0, dynamic=False)
        fns["compiled_call_s"] = lambda: compiled(x)
    out: dict[str, float | None] = {"compiled_call_s": None}
    names = list(fns)
    meds = []
    for name in names:
        batch = []
        for _ in range(5):
            dist.barrier()
            batch.append(_issue_s(fns[name], device, 50))
            for w in works:
                w.wait()
            works.clear()
        meds.append(float(np.median(batch)))
    out.update(zip(names, _max_over_ranks(meds, device), strict=True))
    return out


def _seeded_block(world: int, b: int, s: int, d: int, h: int) -> tuple[Any, torch.Tensor]:
    """A float32 `TPBlock` shard on the world group and its input (B, S, D), from seed 0:
    the same weights and input on every rank."""
    from planner.distributed.parallel_models import TPBlock

    torch.manual_seed(0)
    block = TPBlock(d, h, world, dist.group.WORLD)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
    return block, torch.randn(b, s, d)


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| / max |ref|."""
    return float((y - ref).abs().max() / ref.abs().max())


def planned_vs_eager(
    rank: int, world: int, b: int, s: int, d: int, h: int, decisions: list[list]
) -> dict[str, float]:
    """Max |planned - eager| / max |eager| of `PlannedTPBlock` against `TPBlock` on this
    group, float32, for each decision [chunks, fuse_epilogue]; the same seeded weights and
    input on every rank."""
    from planner.distributed.tp_plan import PlannedTPBlock, TPDecision
    from profiling.commbench import rank_device

    device = rank_device(rank)
    block, x = _seeded_block(world, b, s, d, h)
    block, x = block.to(device), x.to(device)
    out: dict[str, float] = {}
    with torch.no_grad():
        ref = block(x)
        planned = PlannedTPBlock(block, TPDecision())
        for k, fuse in decisions:
            planned.decision = TPDecision(int(k), bool(fuse))
            out[planned.decision.label] = _rel_err(planned(x), ref)
    return out


def whole_vs_eager(
    rank: int, world: int, b: int, s: int, d: int, h: int, runs: dict[str, list]
) -> dict[str, object]:
    """`WholePlannedTPBlock` against `TPBlock` on this group, float32, the same seeded
    weights and input on every rank. `runs`: torch.compile backend -> the decisions
    [chunks, fuse_epilogue] to run with it. Returns, per backend and decision, max |whole -
    eager| / max |eager| with collectives (key "<backend> <label>") and without them
    against `TPBlock` without them ("... T_comp"); per backend the graphs dynamo made and
    its graph breaks ("<backend> graphs", "<backend> breaks"); "grad error": the message a
    forward that wants a gradient raises (None if none)."""
    from torch._dynamo.utils import counters

    from planner.distributed.tp_plan import TPDecision, WholePlannedTPBlock
    from planner.errors import ModelSpecError

    block, x = _seeded_block(world, b, s, d, h)
    out: dict[str, object] = {}
    with torch.no_grad():
        ref = block(x)
        block.collectives = False
        ref_comp = block(x)
        block.collectives = True
        for backend, decisions in runs.items():
            graphs = counters["stats"]["unique_graphs"]
            breaks = sum(counters["graph_break"].values())
            whole = WholePlannedTPBlock(block, TPDecision(), backend=backend)
            for k, fuse in decisions:
                whole.decision = TPDecision(int(k), bool(fuse))
                label = f"{backend} {whole.decision.label}"
                out[label] = _rel_err(whole(x), ref)
                whole.collectives = False
                out[f"{label} T_comp"] = _rel_err(whole(x), ref_comp)
                whole.collectives = True
            out[f"{backend} graphs"] = counters["stats"]["unique_graphs"] - graphs
            out[f"{backend} breaks"] = sum(counters["graph_break"].values()) - breaks
    try:
        WholePlannedTPBlock(block, TPDecision(), backend="eager")(x.requires_grad_())
        out["grad error"] = None
    except ModelSpecError as e:
        out["grad error"] = str(e)
    return out
