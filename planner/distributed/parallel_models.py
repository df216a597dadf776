"""Tensor- and data-parallel models written the way Megatron-LM and DDP write them, with
torch.distributed functional collectives, so capture sees the collectives as ops.

- `TPMLP`: column-parallel first GEMM (each rank holds HID/tp of its outputs), GELU,
  row-parallel second GEMM (HID/tp of its inputs), one all-reduce, then the bias.
- `TPBlock`: the pre-norm transformer block with attention heads split over ranks
  (Q/K/V column-parallel, output projection row-parallel, one all-reduce) and a `TPMLP`.
- `PipelineStage`: one stage of a pipeline-parallel model: it receives its activations
  from the previous stage's rank, runs its layers, and sends the result to the next
  stage's rank (functional point-to-point ops, on torch releases that have them).
- `BucketedGradSync`: the gradient synchronization of a data-parallel step: gradients in
  DDP's order (last layer first) packed into buckets as DDP packs them (a bucket closes
  once it holds `bucket_bytes` or more), one all-reduce per bucket, divided by the group
  size.

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


def needs_tp_grad(t: torch.Tensor) -> bool:
    """Whether `t`'s gradient is wanted here, outside a tracer (export and torch.compile
    see the plain functional collectives: their graphs are forward programs)."""
    return torch.is_grad_enabled() and t.requires_grad and not torch.compiler.is_compiling()


class _CopyToTP(torch.autograd.Function):
    """Megatron's f, at the input of the column-parallel GEMMs: the identity forward; in
    backward each rank holds only its shards' part of the input's gradient, so the parts
    are summed over the group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g, after the row-parallel GEMM: the sum over the group forward; every
    rank then holds the same output and the same loss, so the gradient passes unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def copy_to_tp(x: torch.Tensor, group: dist.ProcessGroup, on: bool = True) -> torch.Tensor:
    """Megatron's f (identity forward, gradient summed over `group`) where a gradient is
    wanted and `on`; else `x`."""
    return _CopyToTP.apply(x, group) if on and needs_tp_grad(x) else x


def _all_reduce(t: torch.Tensor, group: dist.ProcessGroup, on: bool) -> torch.Tensor:
    if not on:
        return t
    if needs_tp_grad(t):
        return _ReduceFromTP.apply(t, group)
    return fc.all_reduce(t, "sum", group)


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
        x = copy_to_tp(x, self.group, self.collectives)
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
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """This rank's heads of pre-norm attention: ln(x), its column-parallel Q/K/V, and
    softmax(Q K^T / sqrt(dh)) V, as (B, S, local_heads * dh). With `group`, ln(x) enters
    the column-parallel GEMMs through Megatron's f (`copy_to_tp`) where a gradient is
    wanted."""
    b, s, _ = x.shape
    y = ln(x)
    if group is not None:
        y = copy_to_tp(y, group)

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

    def shard_slices(self, rank: int) -> dict[str, tuple[slice, ...]]:
        """Parameter name -> the index of this shard (of rank `rank`) in the unsharded
        block's parameter of the same name (`TPBlock(d, heads, 1, ...)`): this rank's heads
        of Q/K/V and of o's inputs, its slice of the MLP's hidden units; the norms and the
        biases added after a reduction whole."""
        local, hidden = self.o.in_features, self.mlp.fc1.out_features
        hs = slice(rank * local, (rank + 1) * local)
        fs = slice(rank * hidden, (rank + 1) * hidden)
        every = slice(None)
        out = {n: (every,) for n, _ in self.named_parameters()}
        for name in ("q", "k", "v"):
            out[f"{name}.weight"], out[f"{name}.bias"] = (hs, every), (hs,)
        out["o.weight"] = (every, hs)
        out["mlp.fc1.weight"], out["mlp.fc1.bias"] = (fs, every), (fs,)
        out["mlp.fc2.weight"] = (every, fs)
        return out

    @staticmethod
    def shard_of(full: TPBlock, rank: int, tp: int, group: dist.ProcessGroup) -> TPBlock:
        """Rank `rank`'s shard over `tp` ranks of the unsharded block `full` (tp = 1)."""
        d = full.ln1.normalized_shape[0]
        shard = TPBlock(d, full.local_heads, tp, group)
        state = dict(full.named_parameters())
        with torch.no_grad():
            for name, p in shard.named_parameters():
                p.copy_(state[name][shard.shard_slices(rank)[name]])
        return shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.group if self._collectives else None
        ctx = local_attention(x, self.ln1, self.q, self.k, self.v, self.local_heads, self.dh, group)
        h = _all_reduce(self.o(ctx), self.group, self._collectives) + self.o_bias + x
        return self.mlp(self.ln2(h)) + h


def has_functional_p2p() -> bool:
    """Whether this torch has the functional point-to-point ops (`_c10d_functional.isend`,
    `irecv`, `batch_p2p_ops`) that capture reads as send/recv transfers."""
    return hasattr(torch.ops._c10d_functional, "isend") and hasattr(fc, "isend_inplace")


def require_functional_p2p(what: str) -> None:
    if not has_functional_p2p():
        raise ModelSpecError(
            f"{what} needs torch.distributed's functional point-to-point ops "
            f"(_c10d_functional.isend / irecv), which torch {torch.__version__} does not "
            "have; use a torch release that has them (2.13 does)"
        )


class PipelineStage(nn.Module):
    """Stage `stage` of `stages` of a pipeline over `group` (stage i on the group's rank
    i): the activation arrives from the previous stage's rank into `x` (on the first
    stage `x` is the input itself), `body` runs on it, and its output goes to the next
    stage's rank (the last stage sends nothing). Returns `body`'s output."""

    def __init__(self, body: nn.Module, stage: int, stages: int, group: dist.ProcessGroup):
        super().__init__()
        require_functional_p2p("a pipeline stage")
        if not 0 <= stage < stages:
            raise ModelSpecError(f"STAGE={stage} is not one of the {stages} stages 0..{stages - 1}")
        self.body, self.stage, self.stages, self.group = body, stage, stages, group
        self.prev = dist.get_global_rank(group, stage - 1) if stage > 0 else None
        self.next = dist.get_global_rank(group, stage + 1) if stage < stages - 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            x = fc.wait_tensor(fc.irecv_inplace(x, self.prev, 0, self.group))
        y = self.body(x)
        if self.next is not None:
            fc.wait_tensor(fc.isend_inplace(y, self.next, 0, self.group))
        return y


def buckets_for(sizes_bytes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """DDP's buckets over parameters given in model order: gradients become ready last
    parameter first, and are packed in that order (planner.distributed.dp.pack)."""
    order = list(reversed(range(len(sizes_bytes))))
    return [[order[i] for i in b] for b in pack([sizes_bytes[i] for i in order], bucket_bytes)]


class BucketedGradSync(nn.Module):
    """All-reduce mean of gradients of the given shapes (float32), packed into buckets
    as DDP packs them at `bucket_bytes` (no separate first bucket)."""

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
