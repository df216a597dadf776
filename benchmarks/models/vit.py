"""A vision transformer (Hugging Face `ViTModel`, 16x16 patches, class token) from its
config.

    fusion-plan tune --model benchmarks/models/vit.py:factory --shape B=8 --dynamic IMG=224..384

`factory(B, IMG, size)` returns `(model, (pixel_values,))` of shape (B, 3, IMG, IMG); the
config's image size is IMG (a multiple of 16). `size` "small": 4 layers at ViT-B width
(768, 12 heads, MLP 3072); "tiny": a CPU-test config.
"""

from __future__ import annotations

import torch
from transformers import ViTConfig, ViTModel

SIZES = {
    "small": dict(
        num_hidden_layers=4,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        patch_size=16,
    ),
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        patch_size=8,
    ),
}


def factory(B: int = 1, IMG: int = 224, size: str = "small"):
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    cfg = ViTConfig(image_size=IMG, add_pooling_layer=False, **SIZES[size])
    model = ViTModel(cfg, add_pooling_layer=False).eval()
    return model, (torch.randn(B, 3, IMG, IMG),)


def tiny(B: int = 2, IMG: int = 32):
    return factory(B, IMG, size="tiny")
