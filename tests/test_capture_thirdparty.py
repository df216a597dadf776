"""Capture of third-party model definitions (no downloads): Hugging Face GPT-2 from a
config, timm's resnet18 without weights. Skipped when the packages are absent."""

from __future__ import annotations

import pytest
import torch

from planner.ir.capture import capture
from planner.ir.graph import Category

pytestmark = [pytest.mark.slow, pytest.mark.optional]


def test_hf_gpt2_from_config_captures():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.config.use_cache = False
    ids = torch.randint(0, 128, (2, 16))
    g = capture(model, (ids,))
    cats = g.category_counts()
    assert cats.get("compute", 0) >= 2 * 4  # c_attn, attention, c_proj, mlp per layer
    assert cats.get("norm", 0) >= 2 * 2 + 1
    assert cats.get("opaque", 0) == 0, [n.target for n in g.nodes if n.category is Category.OPAQUE]
    assert g.total_flops > 0


def test_timm_resnet18_captures():
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet18", pretrained=False).eval()
    g = capture(model, (torch.randn(1, 3, 64, 64),))
    convs = [n for n in g.nodes if n.op in ("conv2d", "convolution")]
    assert len(convs) == 20  # 1 stem + 16 in blocks + 3 downsample
    assert g.category_counts().get("opaque", 0) == 0
