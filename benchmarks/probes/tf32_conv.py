"""Do float32 convolutions and matmuls run in TF32 under torch's default flags? On a GPU:

    PYTHONPATH=. python benchmarks/probes/tf32_conv.py

Times a float32 convolution and a float32 GEMM with TF32 allowed and not, each under the
flags as torch sets them by default, and prints the FLOP/s. The analytical model rates a
float32 op at the TF32 peak where the flags allow it (planner.hardware.tf32_allowed).
"""

from __future__ import annotations

import torch

from profiling.timer import measure


def _rate(fn, flops: float) -> float:
    t = measure(fn, device="cuda", warmup=3, min_reps=10, max_reps=50)
    return flops / t.median_s


def main() -> None:
    dev = torch.device("cuda")
    x = torch.randn(32, 256, 56, 56, device=dev)
    w = torch.randn(256, 256, 3, 3, device=dev)
    conv_flops = 2 * 32 * 256 * 56 * 56 * 256 * 9
    a = torch.randn(4096, 4096, device=dev)
    b = torch.randn(4096, 4096, device=dev)
    mm_flops = 2 * 4096**3
    defaults = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}")
    print(f"default flags: cudnn.allow_tf32={defaults[0]}, cuda.matmul.allow_tf32={defaults[1]}")
    for label, fn, flops, flag in (
        (
            "conv2d 3x3 fp32",
            lambda: torch.nn.functional.conv2d(x, w, padding=1),
            conv_flops,
            "cudnn",
        ),
        ("GEMM 4096 fp32", lambda: a @ b, mm_flops, "matmul"),
    ):
        for allow in (False, True):
            if flag == "cudnn":
                torch.backends.cudnn.allow_tf32 = allow
            else:
                torch.backends.cuda.matmul.allow_tf32 = allow
            print(
                f"  {label:18s} tf32 {'on ' if allow else 'off'}: {_rate(fn, flops) / 1e12:7.1f} TFLOP/s"
            )
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = defaults


if __name__ == "__main__":
    main()
