"""How to run a GEMM whose output width is not a multiple of 16 bytes (an LM head over
GPT-2's 50257-token vocabulary): variants timed with CUDA events, µs per call (a probe:
prints one JSON line per (M, variant), writes nothing).

    python benchmarks/probes/unaligned_gemm.py [M,...] [N] [K]

Variants: `linear` (x @ W^T as eager runs it), `padded` (W padded once to an aligned
width, the output a column slice), `padded+copy` (that slice made contiguous), `wt` (W
stored transposed, x @ Wt), `inductor` (torch.compile of the linear: its pad_mm pass).
"""

import json
import sys

import torch
import torch.nn.functional as F


def bench(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ms = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "128,4096").split(",")]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 50257
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 768
    dev, dt = "cuda", torch.bfloat16
    w = torch.randn(n, k, device=dev, dtype=dt) / k**0.5
    np_ = -(-n // 8) * 8
    wp = F.pad(w, (0, 0, 0, np_ - n))
    wt = w.t().contiguous()
    compiled = torch.compile(lambda x: F.linear(x, w))
    for m in ms:
        x = torch.randn(m, k, device=dev, dtype=dt)
        ref = F.linear(x, w)
        variants = {
            "linear": lambda x=x: F.linear(x, w),
            "padded": lambda x=x: F.linear(x, wp)[:, :n],
            "padded+copy": lambda x=x: F.linear(x, wp)[:, :n].contiguous(),
            "wt": lambda x=x: x @ wt,
            "inductor": lambda x=x: compiled(x),
        }
        for name, fn in variants.items():
            err = (fn().float() - ref.float()).abs().max().item()
            print(
                json.dumps(
                    {"M": m, "N": n, "K": k, "variant": name, "us": bench(fn), "max_abs_err": err}
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
