"""Gradients through the runtime backend: eager's, or the graph goes to Inductor.

A realized plan is compiled for inference: its outputs carry no autograd history. When
dynamo hands the backend a graph in grad mode (grad enabled and some input, a parameter
or a user tensor, requires grad), the backend serves the plan inside `PlannedForward`,
an autograd Function whose backward recomputes dynamo's graph eagerly with autograd on
the saved inputs and differentiates that. Gradients are then eager's own (same ops, same
inputs), at the price of one more eager forward in the backward pass, and a model called
for inference without `torch.no_grad()` still runs its plan.

Recomputing only gives eager's gradients when the recomputed forward is the served one.
Two kinds of graph break that, and `recompute_blocker` names them:
- random ops (dropout in training, `rand*`, `bernoulli`): the plan and the recomputation
  draw different numbers, so the gradient would belong to another forward;
- state updated in place (BatchNorm's running statistics in training, `x.add_(...)` on an
  input): recomputing would apply the update twice.
The backend declines such graphs with one warning and hands them to `torch.compile`'s
default backend (Inductor), which differentiates them itself.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.autograd.function import once_differentiable

# Ops that draw random numbers (matched against the end of the target's name).
_RANDOM = (
    "rand",
    "randn",
    "rand_like",
    "randn_like",
    "randint",
    "randint_like",
    "randperm",
    "bernoulli",
    "bernoulli_",
    "multinomial",
    "normal",
    "normal_",
    "uniform_",
    "exponential_",
    "poisson",
    "rrelu",
)
# Ops that are random or update state only in training: (name, index of `training`).
_TRAINING_ONLY = (
    ("dropout", 2),
    ("alpha_dropout", 2),
    ("feature_alpha_dropout", 2),
    ("dropout1d", 2),
    ("dropout2d", 2),
    ("dropout3d", 2),
    ("batch_norm", 5),
    ("instance_norm", 5),
)


# Ops whose result is a view of their first argument: an in-place update of the view
# updates the tensor it was taken from.
_VIEWS = frozenset(
    {
        "getitem",
        "view",
        "reshape",
        "transpose",
        "permute",
        "select",
        "narrow",
        "slice",
        "squeeze",
        "unsqueeze",
        "expand",
        "flatten",
        "unflatten",
        "as_strided",
        "diagonal",
        "t",
        "T",
        "unbind",
        "split",
        "chunk",
        "view_as",
        "expand_as",
        "detach",
    }
)


def _base(node: Any) -> Any:
    """The node a chain of views starts from."""
    while (
        isinstance(node, fx.Node)
        and node.op in ("call_function", "call_method")
        and _name(node) in _VIEWS
        and node.args
    ):
        node = node.args[0]
    return node


# `x += y` and its kin, as dynamo records them: in place on a tensor
_INPLACE_OPERATORS = frozenset(
    {
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.imatmul,
        operator.iand,
        operator.ior,
        operator.ixor,
        operator.ilshift,
        operator.irshift,
    }
)


def _a_number(node: Any) -> bool:
    """Whether dynamo recorded `node` as a Python number (a size), not a tensor."""
    if not isinstance(node, fx.Node):
        return True
    val = node.meta.get("example_value", node.meta.get("val"))
    return val is not None and not isinstance(val, torch.Tensor)


def needs_grad(example_inputs: Sequence[Any]) -> bool:
    """Whether the graph's calls build an autograd graph (dynamo guards on grad mode, so
    what holds for the example inputs holds for every call of this graph)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
    )


def _name(node: fx.Node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _flag(node: fx.Node, key: str, index: int) -> bool:
    value = node.kwargs.get(key, node.args[index] if len(node.args) > index else False)
    return bool(value) if isinstance(value, bool) else True  # a traced flag: assume set


def recompute_blocker(gm: fx.GraphModule) -> str | None:
    """Why recomputing `gm` would not reproduce its forward, or None (see module doc)."""
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = _name(node)
        if name in _RANDOM:
            return f"{name} draws random numbers"
        for op, index in _TRAINING_ONLY:
            if name == op and _flag(node, "training", index):
                what = "draws random numbers" if "dropout" in op else "updates running statistics"
                return f"{op} in training {what}"
        first = _base(node.args[0]) if node.args else None
        mutates = (
            node.target is operator.setitem
            or (node.target in _INPLACE_OPERATORS and not _a_number(first))
            or (name.endswith("_") and not name.startswith("_"))
        )
        if mutates and isinstance(first, fx.Node) and first.op in ("placeholder", "get_attr"):
            return f"{name} updates {first.name} in place"
    return None


class PlannedForward(torch.autograd.Function):
    """`serve(args)` forward, eager recomputation of `eager(*args)` backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        serve: Callable[[tuple[Any, ...]], Any],
        eager: Callable[..., Any],
        *args: Any,
    ) -> Any:
        ctx.eager = eager
        # outputs the loss does not use get no gradient (None, not zeros), so parameters
        # reached only through them keep `.grad is None`, as in eager
        ctx.set_materialize_grads(False)
        ctx.slots = tuple(isinstance(a, torch.Tensor) for a in args)
        ctx.others = tuple(None if s else a for s, a in zip(ctx.slots, args))
        ctx.save_for_backward(*[a for a in args if isinstance(a, torch.Tensor)])
        outs = tuple(serve(args))
        fixed = [o for o in outs if isinstance(o, torch.Tensor) and not o.is_floating_point()]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: Any) -> Any:
        saved = iter(ctx.saved_tensors)
        wants = ctx.needs_input_grad[2:]
        args = [
            next(saved).detach().requires_grad_(want) if slot else other
            for slot, other, want in zip(ctx.slots, ctx.others, wants)
        ]
        with torch.enable_grad():
            outs = ctx.eager(*args)
        pairs = [
            (o, g)
            for o, g in zip(outs, grads)
            if isinstance(o, torch.Tensor) and o.requires_grad and g is not None
        ]
        wrt = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        result: list[Any] = [None] * len(args)
        if pairs and wrt:
            got = torch.autograd.grad(
                [o for o, _ in pairs],
                [args[i] for i in wrt],
                [g for _, g in pairs],
                allow_unused=True,
            )
            for i, g in zip(wrt, got):
                result[i] = g
        return (None, None, *result)
