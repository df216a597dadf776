"""A T5 encoder (Hugging Face `T5EncoderModel`: relative position bias shared by the
layers, T5's RMS layer norm, no biases, ReLU FFN) from its config.

    fusion-plan tune --model benchmarks/models/t5.py:factory --shape B=1 --dynamic S=128..1024

`factory(B, S, size)` returns `(model, (input_ids,))`, input_ids of shape (B, S). `size`
"small": t5-small's width (512, 8 heads of 64, FFN 2048) at 4 layers; "tiny": a CPU-test
config.
"""

from __future__ import annotations

import torch
from transformers import T5Config, T5EncoderModel

SIZES = {
    "small": dict(num_layers=4, d_model=512, num_heads=8, d_kv=64, d_ff=2048, vocab_size=32128),
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, d_kv=16, d_ff=128, vocab_size=256),
}


def factory(B: int = 1, S: int = 128, size: str = "small"):
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    cfg = T5Config(**SIZES[size])
    model = T5EncoderModel(cfg).eval()
    return model, (torch.randint(0, cfg.vocab_size, (B, S)),)


def tiny(B: int = 2, S: int = 32):
    return factory(B, S, size="tiny")
