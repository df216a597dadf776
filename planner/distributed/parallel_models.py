"""Tensor- and data-parallel models written the way Megatron-LM and DDP write them, with
torch.distributed functional collectives, so capture sees the collectives as ops.

- `TPMLP`: column-parallel first GEMM (each rank holds HID/tp of its outputs), GELU,
  row-parallel second GEMM (HID/tp of its inputs), one all-reduce, then the bias.
- `TPBlock`: the pre-norm transformer block with attention heads split over ranks
  (Q/K/V column-parallel, output projection row-parallel, one all-reduce) and a `TPMLP`.
- `BucketedGradSync`: the gradient synchronization of a data-parallel step: gradients in
  DDP's order (last layer first) packed into buckets of at most `bucket_bytes`, one
  all-reduce per bucket, divided by the group size.

Each runs on a real process group (gloo in tests) and, for capture only, on a single-
process "fake" group (`capture_group`), which torch provides for tracing. Setting a TP
model's `collectives` to False skips its all-reduces (each rank keeps its partial sums):
the compute-only variant whose time is T_comp.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from planner.distributed.dp import pack
from planner.errors import ModelSpecError


def capture_group(world_size: int) -> dist.ProcessGroup:
    """The default group when one is initialized (its size must be `world_size`), else a
    fake single-process group of `world_size` ranks for tracing (no communication)."""
    if not dist.is_initialized():  # torch's testing package, loaded only when tracing
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    group = dist.group.WORLD
    if dist.get_world_size(group) != world_size:
        raise ModelSpecError(
            f"this process already belongs to a group of {dist.get_world_size(group)} ranks; "
            f"the model asks for {world_size}: use that size or a fresh process"
        )
    return group


def _split(n: int, parts: int, what: str) -> int:
    if parts < 1 or n % parts:
        raise ModelSpecError(f"{what}={n} does not split evenly over {parts} ranks")
    return n // parts


def _all_reduce(t: torch.Tensor, group: dist.ProcessGroup, on: bool) -> torch.Tensor:
    return fc.all_reduce(t, "sum", group) if on else t


class GeluMLP(nn.Module):
    """The unsharded MLP a `TPMLP` shards: Linear(D, HID) -> GELU -> Linear(HID, D)."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TPMLP(nn.Module):
    """One rank's shard of `GeluMLP` over a tensor-parallel group of `tp` ranks."""

    def __init__(self, d: int, hidden: int, tp: int, group: dist.ProcessGroup):
        super().__init__()
        local = _split(hidden, tp, "HID")
        self.fc1 = nn.Linear(d, local)  # column-parallel
        self.fc2 = nn.Linear(local, d, bias=False)  # row-parallel
        self.bias = nn.Parameter(torch.zeros(d))  # added once, after the reduction
        self.group = group
        self.collectives = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.fc2(F.gelu(self.fc1(x)))
        return _all_reduce(partial, self.group, self.collectives) + self.bias

    @staticmethod
    def shard_of(full: GeluMLP, rank: int, tp: int, group: dist.ProcessGroup) -> TPMLP:
        d, hidden = full.fc1.in_features, full.fc1.out_features
        m = TPMLP(d, hidden, tp, group)
        rows = slice(rank * (hidden // tp), (rank + 1) * (hidden // tp))
        with torch.no_grad():
            m.fc1.weight.copy_(full.fc1.weight[rows])
            m.fc1.bias.copy_(full.fc1.bias[rows])
            m.fc2.weight.copy_(full.fc2.weight[:, rows])
            m.bias.copy_(full.fc2.bias)
        return m


def local_attention(
    x: torch.Tensor,
    ln: nn.Module,
    q: nn.Module,
    k: nn.Module,
    v: nn.Module,
    local_heads: int,
    dh: int,
) -> torch.Tensor:
    """This rank's heads of pre-norm attention: ln(x), its column-parallel Q/K/V, and
    softmax(Q K^T / sqrt(dh)) V, as (B, S, local_heads * dh)."""
    b, s, _ = x.shape
    y = ln(x)

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, s, local_heads, dh).transpose(1, 2)

    qh, kh, vh = heads(q(y)), heads(k(y)), heads(v(y))
    probs = torch.softmax(qh @ kh.transpose(-1, -2) / math.sqrt(dh), dim=-1)
    return (probs @ vh).transpose(1, 2).reshape(b, s, local_heads * dh)


class TPBlock(nn.Module):
    """One rank's shard of a pre-norm transformer block (heads and MLP split over tp)."""

    def __init__(self, d: int, heads: int, tp: int, group: dist.ProcessGroup):
        super().__init__()
        self.local_heads = _split(heads, tp, "H")
        self.dh = d // heads
        local = self.local_heads * self.dh
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v = (nn.Linear(d, local) for _ in range(3))
        self.o = nn.Linear(local, d, bias=False)
        self.o_bias = nn.Parameter(torch.zeros(d))
        self.mlp = TPMLP(d, 4 * d, tp, group)
        self.group = group
        self._collectives = True

    @property
    def collectives(self) -> bool:
        return self._collectives

    @collectives.setter
    def collectives(self, on: bool) -> None:
        self._collectives = self.mlp.collectives = bool(on)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = local_attention(x, self.ln1, self.q, self.k, self.v, self.local_heads, self.dh)
        h = _all_reduce(self.o(ctx), self.group, self._collectives) + self.o_bias + x
        return self.mlp(self.ln2(h)) + h


def buckets_for(sizes_bytes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """DDP's buckets over parameters given in model order: gradients become ready last
    parameter first, and are packed in that order (planner.distributed.dp.pack)."""
    order = list(reversed(range(len(sizes_bytes))))
    return [[order[i] for i in b] for b in pack([sizes_bytes[i] for i in order], bucket_bytes)]


class BucketedGradSync(nn.Module):
    """All-reduce mean of gradients of the given shapes, packed into buckets."""

    def __init__(
        self, shapes: Sequence[Sequence[int]], bucket_bytes: int, dp: int, group: dist.ProcessGroup
    ):
        super().__init__()
        self.shapes = [tuple(s) for s in shapes]
        self.dp, self.group = dp, group
        self.bucket_bytes = bucket_bytes
        self.buckets = buckets_for([4 * math.prod(s) for s in self.shapes], bucket_bytes)

    def forward(self, *grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out: list[torch.Tensor | None] = [None] * len(grads)
        for bucket in self.buckets:
            flat = torch.cat([grads[i].reshape(-1) for i in bucket])
            flat = fc.all_reduce(flat, "sum", self.group) / self.dp
            for i, piece in zip(
                bucket, flat.split([grads[i].numel() for i in bucket]), strict=True
            ):
                out[i] = piece.view(grads[i].shape)
        return tuple(t for t in out if t is not None)


def mlp_param_shapes(d: int, hidden: int, layers: int) -> list[tuple[int, ...]]:
    """Parameter shapes of zoo's MLP (weight, bias per layer), in model order."""
    dims = [d] + [hidden] * layers + [d]
    shapes: list[tuple[int, ...]] = []
    for a, b in itertools.pairwise(dims):
        shapes += [(b, a), (b,)]
    return shapes


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, as LLaMA writes it (in float32)."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class LlamaStyleBlock(nn.Module):
    """An unsharded LLaMA-style decoder block (RMSNorm, attention without biases, SwiGLU
    MLP), written so that `parallelize_module` with `llama_tp_plan()` shards it: heads are
    counted from the projection's width (`-1` in the views), as Hugging Face's LLaMA does."""

    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.dh = d // heads
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(d, d, bias=False) for _ in range(4)
        )
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.attn_norm(x)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, -1, self.dh).transpose(1, 2)

        q, k, v = heads(self.q_proj(y)), heads(self.k_proj(y)), heads(self.v_proj(y))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dh), dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, -1)
        h = x + self.o_proj(ctx)
        z = self.mlp_norm(h)
        return h + self.down_proj(F.silu(self.gate_proj(z)) * self.up_proj(z))


def llama_tp_plan() -> dict[str, object]:
    """The Megatron split of `LlamaStyleBlock` for `parallelize_module`: Q/K/V and the
    MLP's gate/up column-parallel, the output and down projections row-parallel."""
    col, row = ColwiseParallel, RowwiseParallel
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    kinds = (col, col, col, row, col, col, row)
    return {n: k() for n, k in zip(names, kinds, strict=True)}
