"""One rank's program of a DTensor-parallel model, as a plain module that capture can export.

A model parallelized with `torch.distributed.tensor.parallel.parallelize_module`
(`ColwiseParallel`, `RowwiseParallel`, `SequenceParallel`, ...) holds its weights as
DTensors, and its hooks wrap activations as DTensors; DTensor's sharding propagation turns
each op into the rank's local op plus the collectives a placement change needs (a `Partial`
sum made `Replicate` is an all-reduce, `Shard` to `Replicate` an all-gather, `Partial` to
`Shard` a reduce-scatter), issued as functional collectives. torch.export cannot trace a
DTensor being built inside the program (its pre-dispatch tracer refuses the DTensor's spec).

`localize` therefore traces the model once with `make_fx` on fake tensors, the DTensor
weights rebuilt from their local shards (`DTensor.from_local`, same mesh, placements,
global shape and stride): what comes out is the rank's program on plain tensors, with the
collectives as `_c10d_functional` ops followed by `wait_tensor`. `LocalProgram` holds the
local shards as its parameters and buffers (sharing their storage, under the model's own
names) and runs that program; capture exports it like any model. Its outputs are the
rank's local tensors (a DTensor output becomes its `to_local()`). The program is traced
for the example's shapes: call it with inputs shaped like those.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor
from torch.fx.experimental.proxy_tensor import make_fx

from planner.errors import CaptureError


def has_dtensors(module: nn.Module) -> bool:
    """Whether any parameter or buffer of `module` is a DTensor."""
    state = [*module.parameters(), *module.buffers()]
    return any(isinstance(t, DTensor) for t in state)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _set(root: nn.Module, name: str, value: torch.Tensor, parameter: bool) -> None:
    """Register `value` on `root` under the dotted `name`, creating empty submodules."""
    *path, leaf = name.split(".")
    mod = root
    for part in path:
        if not hasattr(mod, part):
            mod.add_module(part, nn.Module())
        mod = getattr(mod, part)
    if parameter:
        mod.register_parameter(leaf, nn.Parameter(value, requires_grad=value.requires_grad))
    else:
        mod.register_buffer(leaf, value)


class LocalProgram(nn.Module):
    """A DTensor-parallel model's per-rank program on its local shards (module docstring).

    `program` takes the parameters, the buffers and the call's tensors, flat, in that
    order; `forward` takes the call as the model took it."""

    def __init__(
        self,
        module: nn.Module,
        program: fx.GraphModule,
        params: list[str],
        buffers: list[str],
        in_spec: pytree.TreeSpec,
        constants: list[Any],
        out_spec: pytree.TreeSpec,
    ):
        super().__init__()
        self.model_name = type(module).__name__
        state = dict(module.named_parameters())
        for n in params:
            _set(self, n, _local(state[n]).detach().requires_grad_(state[n].requires_grad), True)
        bufs = dict(module.named_buffers())
        for n in buffers:
            _set(self, n, _local(bufs[n]), False)
        self.program = program
        self._params, self._buffers_order = params, buffers
        self._in_spec, self._constants, self._out_spec = in_spec, constants, out_spec

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            raise CaptureError(
                f"{self.model_name}'s local program was traced for a call structured as "
                f"{self._in_spec}, got {spec}: call it as it was captured"
            )
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        state = dict(self.named_parameters())
        state.update(self.named_buffers())
        flat = [state[n] for n in (*self._params, *self._buffers_order)]
        out = self.program(*flat, *tensors)
        return pytree.tree_unflatten(list(out), self._out_spec)


def localize(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LocalProgram:
    """`module`'s per-rank program traced for the call `module(*args, **kwargs)`."""
    params = [n for n, _ in module.named_parameters()]
    buffers = [n for n, _ in module.named_buffers()]
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    layout = {
        n: (t.device_mesh, t.placements, t.shape, t.stride())
        for n, t in state.items()
        if isinstance(t, DTensor)
    }
    names = [*params, *buffers]
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
    constants = [None if t else x for x, t in zip(leaves, is_tensor, strict=True)]
    out_spec: list[pytree.TreeSpec] = []

    def run(*flat: torch.Tensor) -> list[torch.Tensor]:
        rebuilt: dict[str, torch.Tensor] = {}
        for n, t in zip(names, flat[: len(names)], strict=True):
            if n in layout:
                mesh, placements, shape, stride = layout[n]
                t = DTensor.from_local(
                    t, mesh, placements, run_check=False, shape=shape, stride=stride
                )
            rebuilt[n] = t
        inputs = iter(flat[len(names) :])
        call = [next(inputs) if t else c for c, t in zip(constants, is_tensor, strict=True)]
        a, kw = pytree.tree_unflatten(call, in_spec)
        out = torch.func.functional_call(module, rebuilt, tuple(a), kw)
        outs, spec = pytree.tree_flatten(out)
        out_spec.append(spec)
        return [_local(o) if isinstance(o, torch.Tensor) else o for o in outs]

    flat_in = [_local(state[n]).detach() for n in names]
    flat_in += [x for x, t in zip(leaves, is_tensor, strict=True) if t]
    try:
        program = make_fx(run, tracing_mode="fake")(*flat_in)
    except Exception as e:  # DTensor and make_fx raise many types; the user needs one
        text = " ".join(str(e).split())[:600]
        raise CaptureError(
            f"could not trace the DTensor-parallel {type(module).__name__} on its local "
            f"shards: {type(e).__name__}: {text}. Capture needs the model's forward to run "
            "on DTensor weights with the example inputs (as parallelize_module leaves it)"
        ) from e
    return LocalProgram(module, program, params, buffers, in_spec, constants, out_spec[-1])
