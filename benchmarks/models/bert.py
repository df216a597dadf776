"""BERT (Hugging Face `BertModel`, dict-like output with the last hidden state and the
pooled output) from its config, called with input ids and an attention mask.

    fusion-plan tune --model benchmarks/models/bert.py:factory --shape B=1 --dynamic S=128..512

`factory(B, S, size)` returns `(model, (input_ids, attention_mask))`, both (B, S): S is
inferred as axis 1 of both inputs. `size` "small": 4 layers at BERT-base width (768, 12
heads, FFN 3072); "tiny": a CPU-test config.
"""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel

SIZES = {
    "small": dict(
        num_hidden_layers=4,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=2048,
    ),
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=512,
    ),
}


def factory(B: int = 1, S: int = 128, size: str = "small"):
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    cfg = BertConfig(**SIZES[size])
    model = BertModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (B, S))
    return model, (ids, torch.ones(B, S, dtype=torch.long))


def tiny(B: int = 2, S: int = 32):
    return factory(B, S, size="tiny")
