"""A convolutional network: ResNet-18 (Hugging Face `ResNetModel`, basic blocks, batch
norm in eval mode) from its config; `timm_factory` builds timm's `resnet18` instead where
timm is installed.

    fusion-plan tune --model benchmarks/models/resnet.py:factory --shape B=8 --dynamic IMG=224..384

`factory(B, IMG, size)` returns `(model, (pixel_values,))` of shape (B, 3, IMG, IMG).
`size` "small": ResNet-18 (stages of 2 basic blocks, 64..512 channels); "tiny": two
stages of one block at 16 and 32 channels.
"""

from __future__ import annotations

import torch
from transformers import ResNetConfig, ResNetModel

SIZES = {
    "small": dict(
        layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], embedding_size=64
    ),
    "tiny": dict(layer_type="basic", depths=[1, 1], hidden_sizes=[16, 32], embedding_size=16),
}


def factory(B: int = 1, IMG: int = 224, size: str = "small"):
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    model = ResNetModel(ResNetConfig(**SIZES[size])).eval()
    return model, (torch.randn(B, 3, IMG, IMG),)


def tiny(B: int = 2, IMG: int = 32):
    return factory(B, IMG, size="tiny")


def timm_factory(B: int = 1, IMG: int = 224):
    import timm  # optional: only this factory needs it

    model = timm.create_model("resnet18", pretrained=False, num_classes=1000).eval()
    return model, (torch.randn(B, 3, IMG, IMG),)
