"""A measured backward pass: when each parameter's gradient becomes ready.

The data-parallel step model (planner.distributed.dp) takes the backward as steps in
the order the gradients become ready, each with its duration and the gradient bytes it
completes; `dp.backward_steps` estimates them from the forward graph. Here they are
measured: the model runs forward, a loss (the model's own where its output carries one,
else the sum of its floating outputs) and `loss.backward()`, with a hook on every
parameter that requires grad (`register_post_accumulate_grad_hook`) stamping the time
its gradient is accumulated (a CUDA event on the stream autograd runs it on for a CUDA
model, `time.perf_counter` on the CPU). After warm-up passes each gradient's ready time
(from the backward's start) is the median over the timed passes; the steps follow the
gradients in ready order, each lasting from the previous gradient's ready time to its
own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from planner.distributed.dp import BackwardStep
from planner.errors import ModelSpecError

Loss = Callable[[Any], torch.Tensor]


def default_loss(output: Any) -> torch.Tensor:
    """The model's own loss where its output carries one (a `loss` attribute or key
    holding a floating tensor, as library outputs computed with labels do), else the sum
    of every floating tensor in the output (a pytree), each summed in fp32."""
    own = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(own, torch.Tensor) and own.is_floating_point():
        return own.float().sum()
    leaves = [t for t in _tensor_leaves(output) if t.is_floating_point() and t.requires_grad]
    if not leaves:
        raise ModelSpecError(
            "the model's output holds no floating tensor that depends on its parameters "
            "(found: "
            + (", ".join(str(t.dtype) for t in _tensor_leaves(output)) or "none")
            + "); a backward pass needs one: return the activations or a loss"
        )
    return torch.stack([t.float().sum() for t in leaves]).sum()


def _tensor_leaves(output: Any) -> list[torch.Tensor]:
    if hasattr(output, "to_tuple"):  # library output objects (transformers' ModelOutput)
        output = output.to_tuple()
    return [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]


def trainable(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters that require grad, by name (a tied parameter once); a clear error
    for a model without any."""
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not params:
        raise ModelSpecError(
            "the model has no parameters that require grad: there is no backward pass to "
            "measure and no gradient to all-reduce"
        )
    return params


class BackwardProbe:
    """Hooks on `module`'s trainable parameters that record when each gradient is ready.

    `run()` does one forward, loss and backward and returns the forward's seconds and each
    parameter's ready time in seconds from the backward's start (in `names` order; None
    for a parameter that got no gradient). Gradients are reset (set to None) before each
    pass. `remove()` takes the hooks off. Not thread safe: one pass at a time."""

    def __init__(self, module: torch.nn.Module, device: torch.device | str | None = None):
        params = trainable(module)
        self.names = [n for n, _ in params]
        self.grad_bytes = [p.numel() * p.element_size() for _, p in params]
        self.module = module
        self.device = torch.device(device) if device is not None else params[0][1].device
        self._cuda = self.device.type == "cuda"
        self._stamps: list[Any] = [None] * len(params)
        self._handles = [
            p.register_post_accumulate_grad_hook(self._hook(i)) for i, (_, p) in enumerate(params)
        ]

    def _now(self) -> Any:
        if self._cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def stamp(_: torch.Tensor) -> None:
            self._stamps[i] = self._now()

        return stamp

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)

    def _since(self, start: Any, stamp: Any) -> float:
        if self._cuda:
            return start.elapsed_time(stamp) / 1e3
        return stamp - start

    def run(
        self, forward: Callable[[], Any], loss_of: Loss = default_loss
    ) -> tuple[float, list[float | None]]:
        self.module.zero_grad(set_to_none=True)
        self._stamps = [None] * len(self.names)
        self._sync()
        f0 = self._now()
        loss = loss_of(forward())
        start = self._now()
        loss.backward()
        self._sync()
        fwd = self._since(f0, start)
        return fwd, [None if s is None else self._since(start, s) for s in self._stamps]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


@dataclass(frozen=True)
class MeasuredBackward:
    """A measured backward pass: `steps` in ready order (planner.distributed.dp
    BackwardStep: the parameter's name, seconds since the previous gradient was ready,
    its gradient bytes), the median forward (with the loss) and the passes timed."""

    steps: tuple[BackwardStep, ...]
    forward_s: float
    reps: int
    device: str
    unused: tuple[str, ...] = ()  # parameters that got no gradient (ready at the end)

    @property
    def backward_s(self) -> float:
        return sum(s.duration_s for s in self.steps)


def steps_from_ready(
    names: Sequence[str], grad_bytes: Sequence[int], ready_s: Sequence[Sequence[float | None]]
) -> tuple[list[BackwardStep], list[str]]:
    """Backward steps in ready order from per-pass ready times (`ready_s[pass][param]`,
    seconds from the backward's start, None where the parameter got no gradient): each
    parameter's median over the passes; a step per parameter, lasting from the previous
    one's ready time. Parameters that never got a gradient are ready with the last (a
    zero-length step each, as DDP marks unused parameters ready at the end) and named in
    the second list."""
    medians: list[tuple[float, int]] = []
    unused: list[str] = []
    for i, name in enumerate(names):
        times = [r[i] for r in ready_s if r[i] is not None]
        if times:
            medians.append((statistics.median(times), i))
        else:
            unused.append(name)
    medians.sort()
    steps, prev = [], 0.0
    for t, i in medians:
        steps.append(BackwardStep(names[i], max(0.0, t - prev), (grad_bytes[i],)))
        prev = max(prev, t)
    steps += [BackwardStep(n, 0.0, (grad_bytes[names.index(n)],)) for n in unused]
    return steps, unused


def measure_backward(
    module: torch.nn.Module,
    inputs: Sequence[Any],
    reps: int = 5,
    warmup: int = 2,
    loss_of: Loss = default_loss,
) -> MeasuredBackward:
    """Run `module(*inputs)`, its loss and the backward `warmup` + `reps` times on the
    device the parameters are on, and return the timed passes' backward steps and median
    forward (planner.distributed.dp.dp_step_timeline takes both). The module is run in
    the mode it is in; its gradients are left set to None."""
    if reps < 1:
        raise ModelSpecError(f"a measured backward needs at least one timed pass, got {reps}")
    probe = BackwardProbe(module)
    try:
        passes = [probe.run(lambda: module(*inputs), loss_of) for _ in range(warmup + reps)]
    finally:
        probe.remove()
        module.zero_grad(set_to_none=True)
    timed = passes[warmup:]
    steps, unused = steps_from_ready(probe.names, probe.grad_bytes, [r for _, r in timed])
    fwd = statistics.median(f for f, _ in timed)
    return MeasuredBackward(tuple(steps), fwd, reps, str(probe.device), tuple(unused))
