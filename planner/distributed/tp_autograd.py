"""The GEMMs of a planned tensor-parallel rank program (planner.distributed.tp_graph), with
Megatron's gradients and a chunked backward.

- **Row-parallel** (`row_parallel_chunks`): the GEMM over `chunks` token slices into one
  buffer, each slice all-reduced (sum) asynchronously as soon as it is issued, all waited.
  Backward: dX = g W and dW = X^T g with no collective (its output is the same on every
  rank, and so is the output's gradient).
- **Column-parallel** (`column_parallel_gemm`): forward the GEMM as captured, no
  collective. Backward: the rank holds a shard of the output features, so its gradient of
  the (replicated) input is a partial sum, all-reduced (Megatron's f): dX over `chunks`
  token slices, each slice's all-reduce issued asynchronously as soon as its GEMM is, then
  dW (and the bias's gradient) computed while they are in flight, then all waited - the
  input-gradient all-reduce overlapped with the next slice's dX and with dW.

A row-parallel GEMM with a bias inside the partial sum (DTensor's bias / p on every rank
before the all-reduce) is forward only: that bias's gradient would need a reduction of
its own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planner.errors import ModelSpecError

# GEMM op -> (index of the activation operand, index of the weight operand)
GEMM_OPERANDS: dict[str, tuple[int, int]] = {"mm": (0, 1), "addmm": (1, 2), "linear": (0, 1)}
_OPS = {"mm": torch.mm, "addmm": torch.addmm, "linear": F.linear}


def group_of(group_name: str) -> dist.ProcessGroup:
    try:
        return dist.distributed_c10d._resolve_process_group(group_name)
    except Exception as e:  # a private torch helper; absent or unknown: say what to do
        raise ModelSpecError(
            f"process group {group_name!r} of a captured all-reduce is not known in this "
            "process: run the planned program on the ranks that captured it"
        ) from e


def _bias_index(kind: str, n_args: int) -> int | None:
    if kind == "addmm":
        return 0
    return 2 if kind == "linear" and n_args > 2 else None


def _matrix(kind: str, w: torch.Tensor) -> torch.Tensor:
    """The K x N matrix the activation is multiplied by."""
    return w.t() if kind == "linear" else w


def _split(rows: int, chunks: int) -> list[slice]:
    if chunks < 1 or rows % chunks:
        raise ModelSpecError(f"{rows} tokens do not split into {chunks} chunks")
    step = rows // chunks
    return [slice(i * step, (i + 1) * step) for i in range(chunks)]


def _row_forward(kind: str, chunks: int, group_name: str, args: tuple) -> torch.Tensor:
    act_i, w_i = GEMM_OPERANDS[kind]
    a, wt = args[act_i], _matrix(kind, args[w_i])
    b = _bias_index(kind, len(args))
    bias = args[b] if b is not None else None
    a2 = a.reshape(-1, a.shape[-1])
    out = torch.empty(a2.shape[0], wt.shape[1], dtype=a.dtype, device=a.device)
    group, works = group_of(group_name), []
    for sl in _split(a2.shape[0], chunks):
        if bias is None:
            torch.mm(a2[sl], wt, out=out[sl])
        else:
            torch.addmm(bias, a2[sl], wt, out=out[sl])
        works.append(dist.all_reduce(out[sl], group=group, async_op=True))
    for work in works:
        work.wait()
    return out.view(*a.shape[:-1], wt.shape[1]) if kind == "linear" else out


def _weight_grads(kind: str, args: tuple, a2: torch.Tensor, g2: torch.Tensor, grads: list) -> None:
    """dW (and the bias's gradient) into `grads`, where the operands want them."""
    _, w_i = GEMM_OPERANDS[kind]
    w = args[w_i]
    if w.requires_grad:
        d_kn = a2.t() @ g2
        grads[w_i] = d_kn.t() if kind == "linear" else d_kn
    b = _bias_index(kind, len(args))
    if b is not None and args[b] is not None and args[b].requires_grad:
        grads[b] = g2.sum_to_size(args[b].shape)


def _backward_operands(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
    """A GEMM's saved operands for its backward: (args, kind, activation index, weight
    index, activation, gradient and activation as matrices)."""
    args, kind = ctx.saved_tensors, ctx.kind
    act_i, w_i = GEMM_OPERANDS[kind]
    a = args[act_i]
    return args, kind, act_i, w_i, a, g.reshape(-1, g.shape[-1]), a.reshape(-1, a.shape[-1])


class _RowParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kind: str, chunks: int, group_name: str, *args: torch.Tensor):
        ctx.kind = kind
        ctx.save_for_backward(*args)
        return _row_forward(kind, chunks, group_name, args)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        args, kind, act_i, w_i, a, g2, a2 = _backward_operands(ctx, g)
        grads: list = [None] * len(args)
        if a.requires_grad:
            grads[act_i] = (g2 @ _matrix(kind, args[w_i]).t()).view(a.shape)
        _weight_grads(kind, args, a2, g2, grads)
        return (None, None, None, *grads)


class _ColumnParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kind: str, chunks: int, group_name: str, *args: torch.Tensor):
        ctx.kind, ctx.chunks, ctx.group_name = kind, chunks, group_name
        ctx.save_for_backward(*args)
        return _OPS[kind](*args)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        args, kind, act_i, w_i, a, g2, a2 = _backward_operands(ctx, g)
        grads: list = [None] * len(args)
        works = []
        if a.requires_grad:  # the input's gradient, slice by slice, each reduced at once
            wt = _matrix(kind, args[w_i]).t()
            da = torch.empty_like(a2)
            group = group_of(ctx.group_name)
            for sl in _split(a2.shape[0], ctx.chunks):
                torch.mm(g2[sl], wt, out=da[sl])
                works.append(dist.all_reduce(da[sl], group=group, async_op=True))
            grads[act_i] = da.view(a.shape)
        _weight_grads(kind, args, a2, g2, grads)  # while the all-reduces are in flight
        for work in works:
            work.wait()
        return (None, None, None, *grads)


def _wants_grad(args: tuple) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in args
    )


def row_parallel_chunks(
    kind: str, chunks: int, group_name: str, *args: torch.Tensor, trainable: bool = False
) -> torch.Tensor:
    """The row-parallel GEMM `kind` chunked (module docstring); returns the reduced output.
    Where a gradient is wanted the program must have been rewritten for training
    (`trainable`: its column-parallel GEMMs reduce their input's gradient)."""
    if not _wants_grad(args):
        return _row_forward(kind, chunks, group_name, args)
    if not trainable:
        raise ModelSpecError(
            "this planned tensor-parallel program was rewritten for the forward only: call "
            "it under torch.no_grad(), or rewrite it with tp_program(..., backward=True)"
        )
    b = _bias_index(kind, len(args))
    if b is not None and args[b] is not None:
        raise ModelSpecError(
            "a row-parallel GEMM with a bias inside its partial sum runs forward only: its "
            "bias's gradient would need a reduction of its own"
        )
    return _RowParallel.apply(kind, chunks, group_name, *args)


def column_parallel_gemm(
    kind: str, chunks: int, group_name: str, *args: torch.Tensor
) -> torch.Tensor:
    """The column-parallel GEMM `kind` as captured; where a gradient is wanted its input's
    gradient is all-reduced over `chunks` slices (module docstring)."""
    if not _wants_grad(args):
        return _OPS[kind](*args)
    return _ColumnParallel.apply(kind, chunks, group_name, *args)
