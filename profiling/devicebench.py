"""Micro-benchmarks of this machine's device: GEMM FLOP/s per dtype (and in TF32 where the
GPU has it), copy bandwidth, launch overhead. `fusion-plan device-bench` stores the
result beside the datasheet figures (planner.hardware), and the analytical model prefers
it from then on."""

from __future__ import annotations

import torch

from planner.hardware import TF32, MeasuredPeaks, device_fingerprint
from planner.plans.plan import now_iso
from profiling.timer import measure


def _gemm_flops(n: int, dtype: torch.dtype, dev: torch.device) -> float:
    a = torch.randn(n, n, device=dev).to(dtype)  # random data: zeros run faster than real data
    b = torch.randn(n, n, device=dev).to(dtype)
    t = measure(lambda: a @ b, device=dev, warmup=3, min_reps=5, max_reps=30, max_seconds=10)
    return 2 * n**3 / t.median_s


def _tf32_flops(n: int, dev: torch.device) -> float:
    """A float32 GEMM with TF32 allowed: the rate of what torch runs in TF32 (float32
    convolutions by default; planner.hardware.tf32_allowed)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return _gemm_flops(n, torch.float32, dev)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _copy_bw(nbytes: int, dev: torch.device) -> float:
    x = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    t = measure(lambda: y.copy_(x), device=dev, warmup=3, min_reps=10, max_reps=50)
    return 2 * nbytes / t.median_s  # bytes read + written


def _launch_overhead(dev: torch.device, n_launches: int = 2000) -> float:
    x = torch.zeros(1, device=dev)

    def many() -> None:
        for _ in range(n_launches):
            x.add_(1.0)

    t = measure(many, device=dev, warmup=1, min_reps=3, max_reps=15)
    return t.median_s / n_launches


def run_device_bench(
    device: str | torch.device | None = None, quick: bool = False
) -> MeasuredPeaks:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = dev.type == "cuda"
    if gpu:
        sizes = {torch.bfloat16: 8192, torch.float16: 8192, torch.float32: 4096}
        copy_bytes = 1 << 30
    else:
        sizes = {torch.float32: 1024 if quick else 2048, torch.bfloat16: 512 if quick else 1024}
        copy_bytes = 1 << 26 if quick else 1 << 28
    if quick and gpu:
        sizes = {k: v // 2 for k, v in sizes.items()}
    mm = {str(dt).removeprefix("torch."): _gemm_flops(n, dt, dev) for dt, n in sizes.items()}
    if gpu and torch.cuda.get_device_capability(dev) >= (8, 0):  # TF32 tensor cores
        mm[TF32] = _tf32_flops(sizes[torch.float32], dev)
    return MeasuredPeaks(
        matmul_flops=mm,
        mem_bw_Bps=_copy_bw(copy_bytes, dev),
        launch_overhead_s=_launch_overhead(dev, 200 if quick else 2000),
        device_fingerprint=device_fingerprint(dev),
        torch_version=torch.__version__.split("+")[0],
        measured_at=now_iso(),
        command="fusion-plan device-bench" + (" --quick" if quick else ""),
    )
