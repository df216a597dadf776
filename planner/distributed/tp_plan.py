"""The tensor-parallel block's communication decisions, priced on three streams and
realized as a runnable module.

A `TPBlock` (planner.distributed.parallel_models) ends each sublayer with a row-parallel
GEMM (the attention's output projection, the MLP's fc2) whose partial sums are all-reduced
before the bias, the residual add and, after the attention, the next sublayer's
LayerNorm. Two decisions per block (`TPDecision`):

- `chunks` k: the row-parallel GEMM runs as k GEMMs over k slices of the tokens, each
  slice's all-reduce issued asynchronously on the communication stream as soon as its
  GEMM ends, so it overlaps the next slice's GEMM; only the last slice's all-reduce is
  left exposed (k times smaller, k times more latencies).
- `fuse_epilogue`: after the last all-reduce, bias + residual (+ LayerNorm) run as one
  compiled unit instead of separate kernels.

`block_tasks` lays one forward pass out as tasks on three streams: the host (every kernel
or compiled region is issued by Python first, so a GPU task cannot start before its issue
ends), the compute stream and the communication stream; planner.distributed.overlap's
critical path prices it. `predict` reports the total, T_comp (the same tasks without the
collectives: what the block costs with them replaced by no-ops), T_comm and the exposed
communication total - T_comp.

`PlannedTPBlock` runs a decision with the weights of a `TPBlock`: the attention and the
MLP's first GEMM + GELU as regions (compiled with Inductor when `compile_regions`), the
row-parallel GEMM chunk by chunk into one output buffer with `torch.distributed.all_reduce`
(`async_op=True`: on NCCL its own stream, ordered after the GEMM; `wait()` makes the
compute stream wait for it), then the epilogue. Where a gradient is wanted (regions run
eagerly) the block has Megatron's backward: the chunked GEMM's all-reduce passes the
gradient unchanged (`_ChunkedRowParallel`) and the inputs of the column-parallel GEMMs sum
theirs over the group (`parallel_models.copy_to_tp`), as `TPBlock` does.

`WholePlannedTPBlock` runs the same decision as one `torch.compile` graph (forward only):
attention, the chunked row-parallel GEMMs with one functional all-reduce per chunk
(`_c10d_functional.all_reduce`, its wait placed after the last chunk's GEMM), the MLP's
first GEMM + GELU and the epilogues, one compiled program per chunk count and collectives
setting, one host call per forward.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from planner.distributed.overlap import COMM, COMPUTE, Task, Timeline, schedule
from planner.distributed.parallel_models import (
    TPBlock,
    copy_to_tp,
    local_attention,
    needs_tp_grad,
)
from planner.errors import ModelSpecError
from planner.realize.cudagraphs import _GraphReplay

HOST = "host"
LAYERS = ("o", "fc2")  # the two row-parallel GEMMs, in order


@dataclass(frozen=True)
class TPDecision:
    chunks: int = 1
    fuse_epilogue: bool = False

    @property
    def label(self) -> str:
        return f"k={self.chunks}{' fused' if self.fuse_epilogue else ''}"


def decisions(tokens: int, chunk_choices: tuple[int, ...] = (1, 2, 4)) -> list[TPDecision]:
    """Every decision whose chunks split `tokens` evenly."""
    return [TPDecision(k, fuse) for k in chunk_choices if tokens % k == 0 for fuse in (False, True)]


@dataclass(frozen=True)
class RegionCosts:
    """GPU seconds of each region at one shape, and the host's seconds to issue one call.

    `gemm_s[(layer, k)]`: one of k chunks of row-parallel GEMM `layer`;
    `epilogue_s[(layer, fused)]`: the epilogue after `layer`'s all-reduce;
    `epilogue_ops[layer]`: the eager kernels of that epilogue when not fused;
    `all_reduce_bytes[layer]`: the whole (unchunked) partial sum."""

    attn_s: float
    mlp_in_s: float
    gemm_s: dict[tuple[str, int], float]
    epilogue_s: dict[tuple[str, bool], float]
    epilogue_ops: dict[str, int]
    all_reduce_bytes: dict[str, int]
    eager_op_host_s: float  # one eager kernel launch from Python
    compiled_call_host_s: float  # one call of a compiled region
    collective_call_host_s: float  # one async collective call
    sources: dict[str, str] = field(default_factory=dict)
    # the same regions run eagerly (the unplanned TPBlock): GPU seconds and kernels
    attn_eager_s: float = 0.0
    attn_eager_ops: int = 0
    mlp_in_eager_s: float = 0.0
    mlp_in_eager_ops: int = 0


def block_tasks(
    c: RegionCosts,
    d: TPDecision,
    all_reduce_s: Callable[[int], float],
    collectives: bool = True,
    eager: bool = False,
) -> list[Task]:
    """One forward pass of the planned block as tasks (see the module docstring);
    without `collectives` the all-reduces are left out (the T_comp variant). `eager`
    prices the unplanned TPBlock instead: every region op by op, one collective per
    sublayer (use it with `TPDecision(1, False)`)."""
    tasks: list[Task] = []

    def add(name: str, stream: str, dur: float, deps: tuple[int, ...], host_s: float) -> int:
        tasks.append(Task(f"issue {name}", HOST, host_s))
        tasks.append(Task(name, stream, dur, (*deps, len(tasks) - 1)))
        return len(tasks) - 1

    if eager:
        prev = add("attn", COMPUTE, c.attn_eager_s, (), c.attn_eager_ops * c.eager_op_host_s)
    else:
        prev = add("attn", COMPUTE, c.attn_s, (), c.compiled_call_host_s)
    for layer in LAYERS:
        ars: list[int] = []
        for i in range(d.chunks):
            g = add(
                f"{layer}[{i}]", COMPUTE, c.gemm_s[(layer, d.chunks)], (prev,), c.eager_op_host_s
            )
            if collectives:
                nbytes = c.all_reduce_bytes[layer] // d.chunks
                ars.append(
                    add(
                        f"all_reduce {layer}[{i}]",
                        COMM,
                        all_reduce_s(nbytes),
                        (g,),
                        c.collective_call_host_s,
                    )
                )
            prev = g
        host = (
            c.compiled_call_host_s if d.fuse_epilogue else c.epilogue_ops[layer] * c.eager_op_host_s
        )
        prev = add(
            f"epilogue {layer}",
            COMPUTE,
            c.epilogue_s[(layer, d.fuse_epilogue)],
            (prev, *ars),
            host,
        )
        if layer == "o":
            if eager:
                host_mlp = c.mlp_in_eager_ops * c.eager_op_host_s
                prev = add("mlp_in", COMPUTE, c.mlp_in_eager_s, (prev,), host_mlp)
            else:
                prev = add("mlp_in", COMPUTE, c.mlp_in_s, (prev,), c.compiled_call_host_s)
    return tasks


@dataclass(frozen=True)
class Prediction:
    decision: TPDecision
    total_s: float
    t_comp_s: float  # the block without collectives
    t_comm_s: float  # busy time of the communication stream
    exposed_comm_s: float  # total - t_comp
    timeline: Timeline

    def row(self) -> dict[str, float | int | bool | str]:
        return {
            "decision": self.decision.label,
            "chunks": self.decision.chunks,
            "fuse_epilogue": self.decision.fuse_epilogue,
            "total_s": self.total_s,
            "t_comp_s": self.t_comp_s,
            "t_comm_s": self.t_comm_s,
            "exposed_comm_s": self.exposed_comm_s,
        }


def predict(
    c: RegionCosts, d: TPDecision, all_reduce_s: Callable[[int], float], eager: bool = False
) -> Prediction:
    """The decision's prediction (`eager`: the unplanned TPBlock's, see `block_tasks`)."""
    full = schedule(block_tasks(c, d, all_reduce_s, eager=eager))
    comp = schedule(block_tasks(c, d, all_reduce_s, collectives=False, eager=eager))
    return Prediction(
        d,
        full.makespan_s,
        comp.makespan_s,
        full.t_comm_s,
        max(0.0, full.makespan_s - comp.makespan_s),
        full,
    )


# ---- realization --------------------------------------------------------------------
class _Attention(nn.Module):
    """ln1, the column-parallel Q/K/V and this rank's heads: (T, D) -> (T, local)."""

    def __init__(self, blk: TPBlock):
        super().__init__()
        self.ln1, self.q, self.k, self.v = blk.ln1, blk.q, blk.k, blk.v
        self.local_heads, self.dh = blk.local_heads, blk.dh
        self.group = blk.group if blk.collectives else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = local_attention(
            x, self.ln1, self.q, self.k, self.v, self.local_heads, self.dh, self.group
        )
        return ctx.reshape(-1, ctx.shape[-1])


class _MLPIn(nn.Module):
    def __init__(self, blk: TPBlock):
        super().__init__()
        self.fc1 = blk.mlp.fc1

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc1(y))


class _Epilogue(nn.Module):
    """bias + residual, and the next sublayer's LayerNorm where there is one."""

    def __init__(self, bias: torch.Tensor, ln: nn.LayerNorm | None):
        super().__init__()
        self.bias, self.ln = bias, ln

    def forward(self, partial: torch.Tensor, resid: torch.Tensor):
        h = partial + self.bias + resid
        return (h, self.ln(h)) if self.ln is not None else (h, h)


def _chunked_row_parallel(
    inp: torch.Tensor, w: torch.Tensor, k: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """inp @ W^T over k token slices into one buffer, each slice all-reduced
    asynchronously as soon as its GEMM is issued (none without `group`), all waited."""
    tokens = inp.shape[0]
    step = tokens // k
    out = torch.empty(tokens, w.shape[0], dtype=inp.dtype, device=inp.device)
    works = []
    for i in range(k):
        rows = slice(i * step, (i + 1) * step)
        torch.matmul(inp[rows], w.t(), out=out[rows])
        if group is not None:
            works.append(dist.all_reduce(out[rows], group=group, async_op=True))
    for work in works:
        work.wait()
    return out


class _ChunkedRowParallel(torch.autograd.Function):
    """`_chunked_row_parallel` with Megatron's backward: the reduced output is the same
    on every rank, so its gradient g is too and passes the all-reduce unchanged; the
    rank's shards then get d inp = g W and d W = g^T inp, no communication."""

    @staticmethod
    def forward(ctx, inp, w, k, group):
        ctx.save_for_backward(inp, w)
        return _chunked_row_parallel(inp, w, k, group)

    @staticmethod
    def backward(ctx, grad):
        inp, w = ctx.saved_tensors
        return grad @ w, grad.t() @ inp, None, None


class PlannedTPBlock(nn.Module):
    """A `TPBlock`'s forward run as `decision` says (weights shared with `block`).

    `decision` may be changed between calls: the regions are built once (and compiled
    once, at their first call, when `compile_regions`), the chunking is plain Python.
    `collectives=False` replaces the all-reduces by nothing (the T_comp variant: the
    result is then only this rank's partial sums)."""

    def __init__(
        self,
        block: TPBlock,
        decision: TPDecision,
        compile_regions: bool = False,
        collectives: bool = True,
    ):
        super().__init__()
        self.block, self.decision, self.collectives = block, decision, collectives
        self.compile_regions = compile_regions
        self.group = block.group
        compiled = (lambda m: torch.compile(m, dynamic=False)) if compile_regions else (lambda m: m)
        self.attn = compiled(_Attention(block))
        self.mlp_in = compiled(_MLPIn(block))
        eager = {"o": _Epilogue(block.o_bias, block.ln2), "fc2": _Epilogue(block.mlp.bias, None)}
        self.epilogues = {False: eager, True: {k: compiled(m) for k, m in eager.items()}}
        self.weight = {"o": block.o.weight, "fc2": block.mlp.fc2.weight}

    def _row_parallel(self, layer: str, inp: torch.Tensor) -> torch.Tensor:
        """inp (T, local) @ W^T in `chunks` token slices, each all-reduced asynchronously."""
        w = self.weight[layer]
        tokens, k = inp.shape[0], self.decision.chunks
        if k < 1 or tokens % k:
            raise ModelSpecError(f"{tokens} tokens do not split into {k} chunks")
        group = self.group if self.collectives else None
        if needs_tp_grad(inp) or needs_tp_grad(w):
            return _ChunkedRowParallel.apply(inp, w, k, group)
        return _chunked_row_parallel(inp, w, k, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        wants_grad = x.requires_grad or any(p.requires_grad for p in self.block.parameters())
        if self.compile_regions and torch.is_grad_enabled() and wants_grad:
            raise ModelSpecError(
                "the planned TP block computes gradients with its regions run eagerly: "
                "build it with compile_regions=False for training, or call it under "
                "torch.no_grad()"
            )
        x2 = x.reshape(b * s, d)
        epi = self.epilogues[self.decision.fuse_epilogue]
        ctx = self.attn(x)
        h, y = epi["o"](self._row_parallel("o", ctx), x2)
        a = self.mlp_in(copy_to_tp(y, self.group, self.collectives))
        out, _ = epi["fc2"](self._row_parallel("fc2", a), h)
        return out.view(b, s, d)


class GraphedTP(nn.Module):
    """`module`'s forward replayed as one CUDA graph per input shape, its collectives
    recorded into the graph with the kernels (NCCL allows that): inputs are copied into the
    graph's buffers and outputs copied out, the executor the realizer uses for single-device
    plans (planner.realize.cudagraphs). The module's settings at capture (a
    `PlannedTPBlock`'s decision) are what every replay runs. Inference only: where a
    gradient is wanted, or off CUDA, it calls `module` itself. Every rank must call it with
    the same shapes in the same order, as with any collective."""

    def __init__(self, module: nn.Module, warmup: int = 3):
        super().__init__()
        self.module, self.warmup = module, warmup
        self._graphs: dict[tuple, Callable] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wants_grad = torch.is_grad_enabled() and (
            x.requires_grad or any(p.requires_grad for p in self.module.parameters())
        )
        if wants_grad or x.device.type != "cuda":
            return self.module(x)
        key = (tuple(x.shape), tuple(x.stride()), x.dtype, x.device)
        replay = self._graphs.get(key)
        if replay is None:
            replay = _GraphReplay(
                lambda t: (self.module(t),), (x,), copy_outputs=True, warmup=self.warmup
            )
            self._graphs[key] = replay
        return replay((x,))[0]


# ---- the whole forward as one compiled graph -----------------------------------------
def _functional_row_parallel(inp: torch.Tensor, w: torch.Tensor, k: int, group_name: str | None):
    """inp @ W^T over k token slices, each slice's partial sums all-reduced by the
    functional collective right after its GEMM, every wait after the last GEMM (so in the
    graph slice i's all-reduce runs beside slice i+1's GEMM); no collective without
    `group_name`."""
    parts = []
    for piece in inp.chunk(k):
        part = torch.matmul(piece, w.t())
        if group_name is not None:
            part = torch.ops._c10d_functional.all_reduce(part, "sum", group_name)
        parts.append(part)
    if group_name is not None:
        parts = [torch.ops._c10d_functional.wait_tensor(p) for p in parts]
    return torch.cat(parts) if k > 1 else parts[0]


class _WholeProgram(nn.Module):
    """The planned forward of one chunk count, collectives on or off, written for one
    trace: no Python-side collective handles, no autograd functions."""

    def __init__(self, block: TPBlock, chunks: int, group_name: str | None):
        super().__init__()
        self.block, self.chunks, self.group_name = block, chunks, group_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blk, k, name = self.block, self.chunks, self.group_name
        b, s, d = x.shape
        x2 = x.reshape(b * s, d)
        ctx = local_attention(x, blk.ln1, blk.q, blk.k, blk.v, blk.local_heads, blk.dh)
        ctx = ctx.reshape(b * s, ctx.shape[-1])
        h = _functional_row_parallel(ctx, blk.o.weight, k, name) + blk.o_bias + x2
        a = F.gelu(blk.mlp.fc1(blk.ln2(h)))
        out = _functional_row_parallel(a, blk.mlp.fc2.weight, k, name) + blk.mlp.bias + h
        return out.view(b, s, d)


def _run_program(program: _WholeProgram, x: torch.Tensor) -> torch.Tensor:
    return program(x)


def _entry_point(tag: str) -> Callable[[_WholeProgram, torch.Tensor], torch.Tensor]:
    """`_run_program` under a code object of its own: dynamo keeps its compiled graphs
    per code object, so each program holds one entry (one guard check per call) and none
    counts against another's recompile limit."""
    code = _run_program.__code__.replace(co_name=f"planned_whole_{tag}")
    return types.FunctionType(code, _run_program.__globals__, code.co_name)


class WholePlannedTPBlock(nn.Module):
    """A `TPBlock`'s forward run as `decision` says, the whole of it one `torch.compile`
    graph (`dynamic=False`, `fullgraph=True`: a graph break raises): attention, each
    row-parallel GEMM in `chunks` token slices with a functional all-reduce per slice,
    fc1 + GELU, and bias + residual (+ LayerNorm) after each reduction, which Inductor
    fuses whether or not the decision asks for a fused epilogue, so the two decisions of
    one chunk count run the same program. Programs are compiled at their first call, one
    per (chunks, collectives) (`collectives=False`: the T_comp variant, each rank's partial
    sums), and `decision` and `collectives` may change between calls. Forward only: where a
    gradient is wanted it raises; `PlannedTPBlock` with eager regions trains. `backend` is
    torch.compile's (Inductor by default)."""

    def __init__(
        self,
        block: TPBlock,
        decision: TPDecision,
        collectives: bool = True,
        backend: str = "inductor",
    ):
        super().__init__()
        self.block, self.decision, self.collectives = block, decision, collectives
        self.backend = backend
        self.group_name = block.group.group_name
        self._programs: dict[tuple[int, bool], tuple[_WholeProgram, Callable]] = {}

    def program(self) -> tuple[_WholeProgram, Callable]:
        """The current decision's (program, its compiled entry), built on first use."""
        key = (self.decision.chunks, bool(self.collectives))
        if key not in self._programs:
            prog = _WholeProgram(self.block, key[0], self.group_name if key[1] else None)
            entry = _entry_point(f"k{key[0]}{'' if key[1] else '_tcomp'}_{id(self):x}")
            self._programs[key] = (
                prog,
                torch.compile(entry, dynamic=False, fullgraph=True, backend=self.backend),
            )
        return self._programs[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, k = x.shape[0] * x.shape[1], self.decision.chunks
        if k < 1 or tokens % k:
            raise ModelSpecError(f"{tokens} tokens do not split into {k} chunks")
        wants_grad = x.requires_grad or any(p.requires_grad for p in self.block.parameters())
        if torch.is_grad_enabled() and wants_grad:
            raise ModelSpecError(
                "the whole-graph planned TP block runs the forward only: call it under "
                "torch.no_grad(), or use PlannedTPBlock (compile_regions=False) for training"
            )
        prog, compiled = self.program()
        return compiled(prog, x)
