"""Is a cuBLASLt GEMM+bias+GELU epilogue worth a realization? Times, on this GPU,
`linear -> gelu` as eager runs it (GEMM with bias, then a GELU kernel) against
`torch._addmm_activation(..., use_gelu=True)` (one cuBLASLt call with the GELU epilogue),
and reports how far the epilogue's result is from eager's exact (erf) GELU.

    PYTHONPATH=. python benchmarks/probes/epilogue_probe.py [M,K,N ...]
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from profiling.timer import cuda_graphed, measure


def probe(m: int, k: int, n: int, dtype: torch.dtype = torch.bfloat16) -> None:
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
    b = torch.randn(n, device="cuda", dtype=dtype)
    with torch.no_grad():
        ref = F.gelu(F.linear(x.float(), w.float(), b.float()))
        eager = F.gelu(F.linear(x, w, b))
        fused = torch._addmm_activation(b, x, w.t(), use_gelu=True)
        tanh = F.gelu(F.linear(x, w, b), approximate="tanh")
        t_eager = measure(cuda_graphed(lambda: F.gelu(F.linear(x, w, b))), device=x.device)
        t_fused = measure(
            cuda_graphed(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)),
            device=x.device,
        )
    err = {
        "eager": (eager.float() - ref).abs().max().item(),
        "epilogue": (fused.float() - ref).abs().max().item(),
        "tanh-gelu": (tanh.float() - ref).abs().max().item(),
    }
    print(
        f"M,K,N={m},{k},{n} {str(dtype)[6:]}: eager {t_eager.median_s * 1e6:.1f} us, "
        f"epilogue {t_fused.median_s * 1e6:.1f} us ({t_fused.median_s / t_eager.median_s:.2f}x); "
        "max |err| vs fp32 erf-GELU: " + ", ".join(f"{k_} {v:.2e}" for k_, v in err.items())
    )


def main() -> None:
    shapes = sys.argv[1:] or [
        "16384,1024,4096",
        "8192,1024,4096",
        "4096,4096,16384",
        "512,768,3072",
    ]
    for s in shapes:
        probe(*map(int, s.split(",")))


if __name__ == "__main__":
    main()
