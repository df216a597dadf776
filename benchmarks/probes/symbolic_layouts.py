"""Can a bucket's symbolic realization propagate layouts across groups?

    PYTHONPATH=. python benchmarks/probes/symbolic_layouts.py > benchmarks/results/symbolic_layouts_h100.jsonl
    PYTHONPATH=. python benchmarks/probes/symbolic_layouts.py --quick   # CPU, tiny blocks
    PYTHONPATH=. python benchmarks/probes/symbolic_layouts.py --cpu     # CPU, the GPU's sizes

Symbolic programs (one realization serving a bucket of lengths) propagate layouts across
groups unless realize is given `propagate_symbolic=False` (planner/realize/realizer.py,
docs/runtime.md); the probe realizes each block both ways. On the H100 (torch 2.11),
before propagation ran ops through the Python dispatcher, it made
every block raise off the realization length (`expected size 167==211`): propagating fake
values through `aten.matmul` specialized the length in the shape environment. `--cpu`
reproduces that on torch 2.11 without a GPU.

Per zoo block (bf16 on CUDA; float32 tiny blocks with `--quick`; bf16 at the GPU's sizes,
B=2, with the CUDA-only rewrites enabled on the CPU with `--cpu`): export over a bucket of
lengths, realize the default plan at an odd length twice, keeping eager's layouts and
propagating them, then call both at several lengths of the bucket. Per (block, variant,
length): whether the call matched eager, the largest difference, groups that fell back to
eager, and the time per call (CUDA events, median of 5 runs of 10 calls; perf_counter on
CPU). Each variant's first line also lists the symbols the shape environment specialized
(`specialized`, empty when none). One JSON line each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import zoo
from planner.ir.capture_dynamic import export_dynamic
from planner.realize import conv_layout, kernels, library_attention, units
from planner.realize.realizer import realize
from planner.realize.units import fake_mode_of
from planner.runtime.backend import default_plan

FULL = {"B": 8, "S": 211, "D": 768, "H": 12}
TINY = {"B": 2, "S": 37, "D": 64, "H": 4}
BLOCKS = ("gpt2-block", "transformer-block", "llama-block", "bert-layer")


def _time(fn: Any, x: Any, cuda: bool) -> float:
    for _ in range(3):
        fn(x)
    runs = []
    for _ in range(5):
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(10):
                fn(x)
            b.record()
            torch.cuda.synchronize()
            runs.append(a.elapsed_time(b) / 10 * 1e3)
        else:
            t0 = time.perf_counter()
            for _ in range(10):
                fn(x)
            runs.append((time.perf_counter() - t0) / 10 * 1e6)
    return statistics.median(runs)


def _realize(c: Any, plan: Any, propagate: bool) -> Any:
    return realize(c, plan, cuda_graphs=False, propagate_symbolic=propagate)


def _specialized(r: Any) -> list[str]:
    """Symbols of the program's shape environment replaced by a number."""
    env = fake_mode_of(r._parts).shape_env
    return sorted(f"{k}={v}" for k, v in env.replacements.items() if v.is_number)


def _cuda_paths_on_cpu() -> None:
    """Let the realizer's CUDA-only rewrites (library attention, GELU epilogue, padded
    GEMMs, channels-last convolutions) run on the CPU."""
    library_attention.LIBRARY_ATTENTION_DEVICES = ("cuda", "cpu")
    kernels.GELU_EPILOGUE_DEVICES = ("cuda", "cpu")
    conv_layout.CHANNELS_LAST_DEVICES = ("cuda", "cpu")
    pad = units.pad_unaligned_linears
    pad.__defaults__ = tuple(("cuda", "cpu") if d == ("cuda",) else d for d in pad.__defaults__)


def probe(name: str, p: dict[str, int], lengths: list[int], device: str, dtype: Any) -> None:
    cuda = device == "cuda"
    params = dict(p, MAXS=max(lengths) * 2) if name == "llama-block" else p
    torch.manual_seed(0)
    module, inputs = zoo.get(name).build(params, dtype=dtype, device=device)
    module.eval()
    lo, hi = min(lengths), max(lengths)
    c = export_dynamic(module, inputs, dims={0: {1: (lo, hi)}})
    plan = default_plan(c.graph, device)
    for propagate in (False, True):
        row: dict[str, Any] = {"block": name, "propagate": propagate, "realized_at": p["S"]}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                r = _realize(c, plan, propagate)
            except Exception as e:
                print(json.dumps({**row, "error": f"{type(e).__name__}: {str(e)[:300]}"}))
                continue
            row["propagated"] = any(u.out_fakes for u in r._units)
            row["specialized"] = _specialized(r)
            row["realize_fallbacks"] = sorted(set(r.fallbacks.values()))[:3]
            for s in lengths:
                shape = list(inputs[0].shape)
                shape[1] = s
                x = (
                    torch.randint(0, 100, shape, device=device)
                    if not inputs[0].is_floating_point()
                    else torch.randn(shape, device=device, dtype=dtype)
                )
                out: dict[str, Any] = {**row, "S": s}
                try:
                    with torch.no_grad():
                        got, want = r(x), module(x)
                    got = got[0] if isinstance(got, tuple | list) else got
                    want = want[0] if isinstance(want, tuple | list) else want
                    out["max_abs_diff"] = float((got.float() - want.float()).abs().max())
                    out["fallbacks_now"] = sorted(set(r.fallbacks.values()))[:3]
                    out["us"] = _time(r, x, cuda)
                    out["eager_us"] = _time(module, x, cuda)
                except Exception as e:
                    out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(json.dumps(out), flush=True)
        msgs = sorted({str(w.message)[:200] for w in caught if "eager" in str(w.message)})
        if msgs:
            print(json.dumps({**row, "warnings": msgs[:5]}), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny float32 blocks on the CPU")
    ap.add_argument(
        "--cpu", action="store_true", help="the GPU's sizes (B=2) in bf16 on the CPU, CUDA paths on"
    )
    ap.add_argument("--blocks", default=",".join(BLOCKS))
    args = ap.parse_args(argv)
    quick = args.quick or (not args.cpu and not torch.cuda.is_available())
    device, dtype = ("cpu", torch.float32) if quick else ("cuda", torch.bfloat16)
    p = TINY if quick else FULL
    lengths = [37, 16, 64, 50] if quick else [211, 167, 128, 512, 1024, 2048]
    if args.cpu and not quick:
        _cuda_paths_on_cpu()
        device, p, lengths = "cpu", dict(FULL, B=2), [211, 167, 128, 512]
    for name in args.blocks.split(","):
        probe(name, p, lengths, device, dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
