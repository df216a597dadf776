"""A LLaMA-style decoder (Hugging Face `LlamaForCausalLM`: grouped-query attention, RoPE,
RMSNorm, SwiGLU MLP; default `use_cache=True`) from its config.

    fusion-plan tune --model benchmarks/models/llama.py:factory --shape B=1 --dynamic S=128..1024

`factory(B, S, size)` returns `(model, (input_ids,))`, input_ids of shape (B, S). `size`
"small": 4 layers at TinyLlama's width (2048 hidden, 32 query heads over 4 key/value
heads, SwiGLU 5632, vocab 32000); "tiny": a CPU-test config with the same structure.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = {
    "small": dict(
        num_hidden_layers=4,
        hidden_size=2048,
        num_attention_heads=32,
        num_key_value_heads=4,
        intermediate_size=5632,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    ),
}


def factory(B: int = 1, S: int = 128, size: str = "small"):
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    cfg = LlamaConfig(**SIZES[size])
    model = LlamaForCausalLM(cfg).eval()
    return model, (torch.randint(0, cfg.vocab_size, (B, S)),)


def tiny(B: int = 2, S: int = 32):
    return factory(B, S, size="tiny")
