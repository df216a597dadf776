"""GPT-2 (Hugging Face `GPT2LMHeadModel`, default `use_cache=True`) from its config.

    fusion-plan tune --model benchmarks/models/gpt2.py:factory --shape B=1 --dynamic S=128..1024
    fusion-plan measure --model benchmarks/models/gpt2.py:tiny --shape B=2,S=32

`factory(B, S, size)` returns `(model, (input_ids,))`, input_ids of shape (B, S). `size`
"small": 4 layers at GPT-2's own width (768, 12 heads, vocab 50257); "tiny": a CPU-test
config. Random weights from the seed in effect: nothing is downloaded.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

SIZES = {
    "small": dict(n_layer=4, n_embd=768, n_head=12, vocab_size=50257, n_positions=2048),
    "tiny": dict(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=256,
        n_positions=512,
        bos_token_id=0,
        eos_token_id=0,
    ),
}


def factory(B: int = 1, S: int = 128, size: str = "small"):
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    cfg = GPT2Config(**SIZES[size])
    model = GPT2LMHeadModel(cfg).eval()
    return model, (torch.randint(0, cfg.vocab_size, (B, S)),)


def tiny(B: int = 2, S: int = 32):
    return factory(B, S, size="tiny")
