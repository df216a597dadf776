"""Which attention kernel a mask's layout gets, and what it costs.

    PYTHONPATH=. python benchmarks/probes/attention_mask_layout.py > benchmarks/results/attention_mask_layout_h100.jsonl

Two attention shapes, bf16:
- ViT-B/16's (B=32, 12 heads, 197 tokens, head dim 64, scale 1/8) with: no mask; the
  all-true boolean mask a traced Hugging Face ViT passes, (1, 1, 197, 197) broadcast along
  its last dimension (stride 0 there); the same mask made dense; a dense mask with padded
  rows; additive masks, dense and broadcast.
- T5-small's encoder (B=4, 8 heads, 1024 tokens, head dim 64, scale 1) with T5's additive
  position bias: as Hugging Face's T5 makes it, an embedding (S, S, heads) permuted to
  (1, heads, S, S) (stride `heads` along keys); the same made dense; dense and expanded over
  the batch (stride 0 there); dense per batch entry.
Per variant: the kernel the dispatcher picks (`torch._fused_sdp_choice`), the time per call
(CUDA events, 20 calls after 3) and the largest difference from the float32 math result.
One JSON line per variant.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

BACKENDS = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def _time_us(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1000


def _vit(dev: str, dt: torch.dtype):
    b, h, s, d = 32, 12, 197, 64
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=dt) for _ in range(3))
    ones = torch.ones(s, dtype=torch.bool, device=dev)
    zeros = torch.zeros(s, dtype=dt, device=dev)
    variants = {
        "none": None,
        "bool, stride 0 along keys (traced ViT)": ones[None, None, :, None].expand(1, 1, s, s),
        "bool, dense": ones[None, None, :, None].expand(1, 1, s, s).contiguous(),
        "bool, dense with padded rows": torch.ones(1, 1, s, s + 3, dtype=torch.bool, device=dev)[
            ..., :s
        ],
        "bool, stride 0 along queries": ones[None, None, None, :].expand(1, 1, s, s),
        "additive, dense": torch.zeros(1, 1, s, s, dtype=dt, device=dev),
        "additive, stride 0 along keys": zeros[None, None, :, None].expand(1, 1, s, s),
    }
    return "vit", (q, k, v), 0.125, variants


def _t5(dev: str, dt: torch.dtype):
    b, h, s, d = 4, 8, 1024, 64
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=dt) for _ in range(3))
    bias = torch.randn(s, s, h, device=dev, dtype=dt).permute(2, 0, 1).unsqueeze(0)
    variants = {
        "additive, permuted embedding (Hugging Face T5)": bias,
        "additive, dense": bias.contiguous(),
        "additive, dense, stride 0 along batch": bias.contiguous().expand(b, h, s, s),
        "additive, dense per batch entry": bias.expand(b, h, s, s).contiguous(),
    }
    return "t5", (q, k, v), 1.0, variants


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 1
    dev, dt = "cuda", torch.bfloat16
    for case, (q, k, v), scale, variants in (_vit(dev, dt), _t5(dev, dt)):
        for name, mask in variants.items():
            choice = int(torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=scale))
            us = _time_us(
                lambda q=q, k=k, v=v, m=mask, sc=scale: F.scaled_dot_product_attention(
                    q, k, v, m, 0.0, False, scale=sc
                )
            )
            out = F.scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale=scale)
            f32 = [t.float() for t in (q, k, v)]
            m32 = mask.float() if mask is not None and mask.dtype != torch.bool else mask
            ref = F.scaled_dot_product_attention(*f32, m32, 0.0, False, scale=scale)
            row = {
                "case": case,
                "variant": name,
                "mask_stride": list(mask.stride()) if mask is not None else None,
                "choice": BACKENDS.get(choice, choice),
                "us_per_call": round(us, 1),
                "max_abs_diff_vs_fp32": float((out.float() - ref).abs().max()),
                "shape": list(q.shape),
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
            }
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
