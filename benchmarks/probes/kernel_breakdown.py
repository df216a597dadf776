"""Kernel-level breakdown of a realized plan vs an eager/compiled alternative (torch.profiler).

Used to find where a plan loses to the best alternative at a shape, e.g.
    PYTHONPATH=. python benchmarks/probes/kernel_breakdown.py transformer-block 32,512,1024,16
Prints the top CUDA kernels by total time for each variant.
"""

from __future__ import annotations

import sys

import torch

import zoo
from benchmarks.real_models import kernel_breakdown
from learned_cost.analytical import AnalyticalModel
from planner.hardware import get_spec, local_device_name
from planner.ir.capture import export_model
from planner.realize.realizer import realize
from search.planning import make_plan


def profile_fn(label: str, fn, inputs, reps: int = 10) -> None:
    with torch.no_grad():
        k = kernel_breakdown(lambda: fn(*inputs), torch.device("cuda"), reps)
    print(f"== {label}: {k['us_per_call']:.1f} us of kernels per call")
    for us, count, name in k["top"][:14]:
        print(f"  {us:8.1f} us  x{int(count):<3} {name[:110]}")


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "transformer-block"
    b, s, d, h = map(int, (sys.argv[2] if len(sys.argv) > 2 else "32,512,1024,16").split(","))
    strategies = sys.argv[3].split(",") if len(sys.argv) > 3 else ["priority"]
    breakdown(model, (b, s, d, h), strategies)


def breakdown(model: str, shape: tuple[int, int, int, int], strategies: list[str]) -> None:
    b, s, d, h = shape
    print(f"##### {model} B,S,D,H={b},{s},{d},{h}")
    dev = "cuda"
    m = zoo.get(model)
    module, inputs = m.build({"B": b, "S": s, "D": d, "H": h}, dtype=torch.bfloat16, device=dev)
    if model == "transformer-block":
        sm, _ = zoo.get("transformer-block-sdpa").build(
            {"B": b, "S": s, "D": d, "H": h}, dtype=torch.bfloat16, device=dev
        )
        profile_fn("eager+sdpa", sm, inputs)
    profile_fn("compile", torch.compile(module), inputs)
    captured = export_model(module, inputs)
    spec = get_spec(local_device_name())
    for strat in strategies:
        made = make_plan(
            captured.graph, strat, AnalyticalModel(spec), device=spec.name, dtype="bfloat16"
        )
        r = realize(captured, made.partition, cuda_graphs=False)
        print(r.describe())
        profile_fn(f"plan-{strat}", r, inputs)


if __name__ == "__main__":
    main()
