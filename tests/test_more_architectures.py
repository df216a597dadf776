"""Architectures outside the real-model suite through the runtime backend, as a user
compiles them: `transformers` models from tiny configs (no downloads) at their default
settings, `torch.compile(model, backend=fusion_planner_backend())` with the default plans,
real realization (Inductor on CPU), every output leaf compared with eager's. Four run by
default (grouped-query attention with a sliding window, a parallel residual with partial
rotary embeddings, windowed attention with a relative position bias, depthwise
convolutions with channels-last layer norms); the others are slow."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils._pytree as pytree

from planner.runtime.backend import fusion_planner_backend

T = pytest.importorskip("transformers")

V = 96
TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _tokens():
    return (torch.randint(0, V, (2, 12)),)


def _image(size: int = 32):
    return (torch.randn(2, 3, size, size),)


MODELS = {
    "mistral": lambda: (
        T.MistralForCausalLM(
            T.MistralConfig(vocab_size=V, num_key_value_heads=2, sliding_window=8, **TEXT)
        ),
        _tokens(),
    ),
    "gpt_neox": lambda: (
        T.GPTNeoXForCausalLM(T.GPTNeoXConfig(vocab_size=V, rotary_pct=0.5, **TEXT)),
        _tokens(),
    ),
    "swin": lambda: (
        T.SwinModel(
            T.SwinConfig(
                image_size=32,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 4],
                window_size=4,
            )
        ),
        _image(),
    ),
    "convnext": lambda: (
        T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])),
        _image(),
    ),
    "qwen2": lambda: (
        T.Qwen2ForCausalLM(T.Qwen2Config(vocab_size=V, num_key_value_heads=2, **TEXT)),
        _tokens(),
    ),
    "phi": lambda: (T.PhiForCausalLM(T.PhiConfig(vocab_size=V, **TEXT)), _tokens()),
    "opt": lambda: (
        T.OPTForCausalLM(
            T.OPTConfig(
                vocab_size=V,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                ffn_dim=64,
                word_embed_proj_dim=32,
            )
        ),
        _tokens(),
    ),
    "roberta": lambda: (T.RobertaModel(T.RobertaConfig(vocab_size=V, **TEXT)), _tokens()),
    "deit": lambda: (
        T.DeiTModel(T.DeiTConfig(image_size=32, patch_size=8, **TEXT)),
        _image(),
    ),
}
DEFAULT = ("mistral", "gpt_neox", "swin", "convnext")


def _leaves(out):
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


@pytest.mark.parametrize(
    "name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in MODELS]
)
def test_the_backend_serves_the_model_like_eager(name):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.eval()
    with torch.no_grad():
        want = _leaves(model(*inputs))
    backend = fusion_planner_backend()
    compiled = torch.compile(model, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            for _ in range(2):
                got = _leaves(compiled(*inputs))
    stats = backend.stats
    assert stats.realized >= 1 and not stats.fallbacks, stats
    assert len(got) == len(want) and want
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
