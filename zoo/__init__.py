"""Built-in, shape-parameterized models, written the way people write them (not pre-fused).

Each entry builds `(module, example_inputs)` from named shape parameters. `dims` says
which shape parameter is which dimension of which input, so a tuning job can sweep a
parameter (`--dynamic S=128..4096`) and the runtime can bucket by tensor dimensions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from planner.distributed import parallel_models as pm
from planner.errors import ModelSpecError


# ---------------------------------------------------------------------------------------
# Attention blocks
# ---------------------------------------------------------------------------------------
class TransformerBlock(nn.Module):
    """Pre-norm transformer: LN -> Q/K/V -> softmax(QK^T/sqrt(dh))V -> O -> +x -> LN -> FFN."""

    def __init__(self, d: int, h: int, sdpa: bool = False):
        super().__init__()
        if d % h:
            raise ModelSpecError(f"D={d} must be divisible by H={h}")
        self.h, self.sdpa = h, sdpa
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.f1, self.f2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h, dh = self.h, d // self.h
        n = self.ln1(x)
        q = self.q(n).view(b, s, h, dh).transpose(1, 2)
        k = self.k(n).view(b, s, h, dh).transpose(1, 2)
        v = self.v(n).view(b, s, h, dh).transpose(1, 2)
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
            p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
            a = p @ v
        z = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return z + self.f2(F.gelu(self.f1(self.ln2(z))))


class GPT2Block(nn.Module):
    """GPT-2: one c_attn GEMM split into Q/K/V, causal mask, tanh-GELU MLP, pre-norm."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        dh = d // self.h
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q = q.view(b, s, self.h, dh).transpose(1, 2)
        k = k.view(b, s, self.h, dh).transpose(1, 2)
        v = v.view(b, s, self.h, dh).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, s, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(
            x
        ) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    """LLaMA: RMSNorm, rotary embeddings on Q/K, causal attention, SwiGLU MLP."""

    def __init__(self, d: int, h: int, max_seq: int, hidden: int | None = None):
        super().__init__()
        self.h = h
        dh = d // h
        hidden = hidden or 64 * math.ceil(int(8 * d / 3) / 64)
        self.attn_norm, self.ffn_norm = RMSNorm(d), RMSNorm(d)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh))
        freqs = torch.outer(torch.arange(max_seq).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        dh = d // self.h
        n = self.attn_norm(x)
        q = self.wq(n).view(b, s, self.h, dh).transpose(1, 2)
        k = self.wk(n).view(b, s, self.h, dh).transpose(1, 2)
        v = self.wv(n).view(b, s, self.h, dh).transpose(1, 2)
        cos, sin = self.cos[:s].to(x.dtype), self.sin[:s].to(x.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        causal = torch.full((s, s), float("-inf"), device=x.device, dtype=x.dtype).triu(1)
        a = torch.softmax(scores + causal, dim=-1) @ v
        h = x + self.wo(a.transpose(1, 2).reshape(b, s, d))
        f = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(f)) * self.w3(f))


class BertLayer(nn.Module):
    """BERT: post-norm attention and FFN (LN after each residual add), erf-GELU."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.h = h
        self.query, self.key, self.value = (nn.Linear(d, d) for _ in range(3))
        self.attn_out, self.attn_ln = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.intermediate, self.output = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.out_ln = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        dh = d // self.h

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.h, dh).permute(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh), dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(b, s, d)
        h = self.attn_ln(self.attn_out(ctx) + x)
        return self.out_ln(self.output(F.gelu(self.intermediate(h))) + h)


# ---------------------------------------------------------------------------------------
# Convolutional blocks
# ---------------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    """ResNet-50 bottleneck: 1x1 -> 3x3 -> 1x1 convs with BN/ReLU and an identity shortcut."""

    def __init__(self, c: int):
        super().__init__()
        w = max(c // 4, 1)
        self.conv1, self.bn1 = nn.Conv2d(c, w, 1, bias=False), nn.BatchNorm2d(w)
        self.conv2, self.bn2 = nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w)
        self.conv3, self.bn3 = nn.Conv2d(w, c, 1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + x)


class ConvBnReluPool(nn.Module):
    """Conv -> BatchNorm -> ReLU -> MaxPool (a CNN stem; docs/worked_examples.md)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn, self.pool = nn.BatchNorm2d(cout), nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.bn(self.conv(x))))


class ConvBnReluTwoPools(nn.Module):
    """Conv-BN-ReLU feeding MaxPool and AvgPool in parallel."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout)
        self.maxpool, self.avgpool = nn.MaxPool2d(2), nn.AvgPool2d(2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.relu(self.bn(self.conv(x)))
        return self.maxpool(y), self.avgpool(y)


class SharedActivation(nn.Module):
    """A bias-add and GELU whose result feeds a LayerNorm and a linear head, as a shared
    activation feeding two heads does: the activation is either written once and read by
    both, or recomputed inside the head's group (planner.fusion.recompute)."""

    def __init__(self, d: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(d) * 0.1)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.gelu(x + self.bias)
        return self.norm(y), self.head(y)


# ---------------------------------------------------------------------------------------
# Pointwise chain, MLP, single GEMM
# ---------------------------------------------------------------------------------------
class PointwiseChain(nn.Module):
    """Pointwise chain (docs/formulas.md §2): step i is sigmoid(v)*2 or relu(v*1.0001+0.5)."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        for i in range(self.steps):
            v = torch.relu(v * 1.0001 + 0.5) if i % 2 else torch.sigmoid(v) * 2.0
        return v


class MLP(nn.Module):
    """A plain MLP: (Linear -> ReLU) x layers -> Linear."""

    def __init__(self, d: int, hidden: int, layers: int):
        super().__init__()
        dims = [d] + [hidden] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        self.out = nn.Linear(dims[-1], d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.hidden:
            x = F.relu(lin(x))
        return self.out(x)


class MatMul(nn.Module):
    """A single GEMM C = A @ B (docs/worked_examples.md)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


# ---------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------
Builder = Callable[[dict[str, int]], tuple[nn.Module, tuple[tuple[int, ...], ...]]]


@dataclass(frozen=True)
class ZooModel:
    """A named model family: defaults, a builder, and which input dim each parameter is."""

    name: str
    description: str
    defaults: dict[str, int]
    build_fn: Builder
    dims: dict[str, tuple[int, int]] = field(default_factory=dict)  # param -> (input, dim)
    transformer_like: bool = False

    def params(self, overrides: dict[str, int] | None = None) -> dict[str, int]:
        out = dict(self.defaults)
        for k, v in (overrides or {}).items():
            if k not in out:
                raise ModelSpecError(
                    f"zoo:{self.name} has no shape parameter {k!r}; it takes "
                    f"{', '.join(self.defaults)}"
                )
            out[k] = int(v)
        return out

    def build(
        self,
        overrides: dict[str, int] | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        """An eval-mode module and random example inputs on `device` in `dtype`."""
        p = self.params(overrides)
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        module, shapes = self.build_fn(p)
        module = module.to(device=device, dtype=dtype).eval()
        if torch.device(device).type == "meta":  # capture-only: no data, no memory
            return module, tuple(torch.empty(s, device="meta", dtype=dtype) for s in shapes)
        inputs = tuple(torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in shapes)
        return module, inputs


# zoo:transformer-block's layers in the order its forward first uses them
_BLOCK_USE_ORDER = ("ln1", "q", "k", "v", "o", "ln2", "f1", "f2")


def block_param_shapes(d: int) -> list[tuple[int, ...]]:
    """Parameter shapes of zoo:transformer-block at width `d` (the heads do not change
    them), weight then bias of each layer in the order the forward first uses the layers:
    reversed, the order in which the backward makes their gradients ready, which DDP's
    buckets follow (ln2 registered second but used after the attention)."""
    with torch.device("meta"):
        params = dict(TransformerBlock(d, 1).named_parameters())
    return [tuple(params[f"{m}.{p}"].shape) for m in _BLOCK_USE_ORDER for p in ("weight", "bias")]


def _t(p: dict[str, int]) -> tuple[tuple[int, ...], ...]:
    return ((p["B"], p["S"], p["D"]),)


def _grad_sync(shapes: list[tuple[int, ...]], p: dict[str, int]) -> tuple[Any, ...]:
    """A bucketed gradient all-reduce of gradients of `shapes` (BUCKET_KB, DP), and the
    gradients' shapes as its inputs."""
    sync = pm.BucketedGradSync(shapes, p["BUCKET_KB"] * 1024, p["DP"], pm.capture_group(p["DP"]))
    return sync, tuple(shapes)


def _pipeline_stage(body: nn.Module, p: dict[str, int]) -> nn.Module:
    """`body` as stage STAGE (counted from 1, as shape parameters are positive) of PP."""
    if p["STAGE"] > p["PP"]:
        raise ModelSpecError(
            f"STAGE={p['STAGE']} is not one of the PP={p['PP']} stages 1..{p['PP']}"
        )
    return pm.PipelineStage(body, p["STAGE"] - 1, p["PP"], pm.capture_group(p["PP"]))


_SEQ_DIMS = {"B": (0, 0), "S": (0, 1)}
_IMG_DIMS = {"B": (0, 0), "HW": (0, 2)}

ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            "transformer-block",
            "pre-norm transformer block, explicit softmax attention",
            {"B": 8, "S": 512, "D": 768, "H": 12},
            lambda p: (TransformerBlock(p["D"], p["H"]), _t(p)),
            _SEQ_DIMS,
            True,
        ),
        ZooModel(
            "transformer-block-sdpa",
            "pre-norm transformer block with scaled_dot_product_attention",
            {"B": 8, "S": 512, "D": 768, "H": 12},
            lambda p: (TransformerBlock(p["D"], p["H"], sdpa=True), _t(p)),
            _SEQ_DIMS,
            True,
        ),
        ZooModel(
            "gpt2-block",
            "GPT-2 block: fused c_attn, causal mask, tanh GELU",
            {"B": 8, "S": 512, "D": 768, "H": 12},
            lambda p: (GPT2Block(p["D"], p["H"]), _t(p)),
            _SEQ_DIMS,
            True,
        ),
        ZooModel(
            "llama-block",
            "LLaMA block: RMSNorm, rotary, causal attention, SwiGLU",
            {"B": 4, "S": 512, "D": 1024, "H": 16, "MAXS": 8192},
            lambda p: (LlamaBlock(p["D"], p["H"], max(p["MAXS"], p["S"])), _t(p)),
            _SEQ_DIMS,
            True,
        ),
        ZooModel(
            "bert-layer",
            "BERT post-norm encoder layer",
            {"B": 8, "S": 512, "D": 768, "H": 12},
            lambda p: (BertLayer(p["D"], p["H"]), _t(p)),
            _SEQ_DIMS,
            True,
        ),
        ZooModel(
            "resnet-bottleneck",
            "ResNet-50 bottleneck with identity shortcut",
            {"B": 8, "C": 256, "HW": 56},
            lambda p: (Bottleneck(p["C"]), ((p["B"], p["C"], p["HW"], p["HW"]),)),
            _IMG_DIMS,
        ),
        ZooModel(
            "conv-bn-relu-maxpool",
            "Conv->BN->ReLU->MaxPool (CNN stem)",
            {"B": 8, "CIN": 16, "C": 32, "HW": 112},
            lambda p: (ConvBnReluPool(p["CIN"], p["C"]), ((p["B"], p["CIN"], p["HW"], p["HW"]),)),
            _IMG_DIMS,
        ),
        ZooModel(
            "conv-bn-relu-2pool",
            "Conv-BN-ReLU -> MaxPool || AvgPool (two branches)",
            {"B": 8, "CIN": 16, "C": 32, "HW": 112},
            lambda p: (
                ConvBnReluTwoPools(p["CIN"], p["C"]),
                ((p["B"], p["CIN"], p["HW"], p["HW"]),),
            ),
            _IMG_DIMS,
        ),
        ZooModel(
            "shared-act",
            "bias-add + GELU feeding LayerNorm || linear head: recompute or materialize",
            {"B": 8, "S": 512, "D": 768},
            lambda p: (SharedActivation(p["D"]), _t(p)),
            _SEQ_DIMS,
        ),
        ZooModel(
            "pointwise-chain",
            "STEPS pointwise ops chained over N elements",
            {"N": 1 << 20, "STEPS": 8},
            lambda p: (PointwiseChain(p["STEPS"]), ((p["N"],),)),
            {"N": (0, 0)},
        ),
        ZooModel(
            "mlp",
            "plain MLP: (Linear->ReLU) x L -> Linear",
            {"B": 64, "D": 1024, "HID": 4096, "L": 2},
            lambda p: (MLP(p["D"], p["HID"], p["L"]), ((p["B"], p["D"]),)),
            {"B": (0, 0)},
        ),
        ZooModel(
            "tp-mlp",
            "Megatron tensor-parallel MLP shard: column/row GEMMs, one all-reduce",
            {"B": 8, "S": 128, "D": 512, "HID": 2048, "TP": 2},
            lambda p: (pm.TPMLP(p["D"], p["HID"], p["TP"], pm.capture_group(p["TP"])), _t(p)),
            _SEQ_DIMS,
        ),
        ZooModel(
            "tp-block",
            "Megatron tensor-parallel pre-norm transformer block shard, two all-reduces",
            {"B": 8, "S": 128, "D": 512, "H": 8, "TP": 2},
            lambda p: (pm.TPBlock(p["D"], p["H"], p["TP"], pm.capture_group(p["TP"])), _t(p)),
            _SEQ_DIMS,
        ),
        ZooModel(
            "pp-block",
            "pipeline-parallel stage of zoo:transformer-block: receives its activations from "
            "the previous stage's rank, sends its output to the next (STAGE of PP, from 1)",
            {"B": 8, "S": 128, "D": 512, "H": 8, "PP": 4, "STAGE": 2},
            lambda p: (_pipeline_stage(TransformerBlock(p["D"], p["H"]), p), _t(p)),
            _SEQ_DIMS,
        ),
        ZooModel(
            "dp-grad-sync",
            "data-parallel gradient sync of zoo:mlp, bucketed all-reduce (BUCKET_KB)",
            {"D": 1024, "HID": 4096, "L": 2, "DP": 2, "BUCKET_KB": 25600},
            lambda p: _grad_sync(pm.mlp_param_shapes(p["D"], p["HID"], p["L"]), p),
        ),
        ZooModel(
            "dp-block",
            "data-parallel gradient sync of zoo:transformer-block, bucketed all-reduce (BUCKET_KB)",
            {"D": 768, "DP": 2, "BUCKET_KB": 25600},
            lambda p: _grad_sync(block_param_shapes(p["D"]), p),
        ),
        ZooModel(
            "matmul",
            "a single GEMM A[M,K] @ B[K,N]",
            {"M": 1024, "K": 768, "N": 512},
            lambda p: (MatMul(), ((p["M"], p["K"]), (p["K"], p["N"]))),
            {"M": (0, 0), "N": (1, 1)},
        ),
    )
}


def get(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        raise ModelSpecError(f"no zoo model {name!r}; known: {', '.join(sorted(ZOO))}") from None


def describe() -> list[dict[str, Any]]:
    return [
        {"name": m.name, "description": m.description, "defaults": m.defaults} for m in ZOO.values()
    ]
