"""Group compilers: TorchInductor's, and one compile per distinct group of a realization.

A group compiler takes (subgraph, fake inputs, fake mode) and returns a callable over the
group's real inputs; `inductor_compiler` is the realizer's.

A transformer's layers give groups whose subgraphs are the same up to node and input
names (`h_0_attn_...` against `h_1_attn_...`), with inputs of the same layouts. Compiling
each again gives the same kernels, so `SharedCompiles` compiles a group only when no
earlier group of the same realization has its `compile_key`, and hands the later groups
the first one's compiled callable. A compiled group is a function of its positional
inputs only (weights are inputs of a group's subgraph, not constants in it), so the
callable serves every group with the key, each called on its own inputs.

One `SharedCompiles` lives for one `realize` call: its keys hold symbolic sizes as text
("s0"), which name the same size only within the one shape environment the program was
exported in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch
import torch.fx as fx

# A group compiler: (subgraph, fake inputs, fake mode) -> callable over real inputs.
GroupCompiler = Callable[[fx.GraphModule, tuple[Any, ...], Any], Callable[..., Any]]


def inductor_compiler(options: Mapping[str, Any] | None = None) -> GroupCompiler:
    """Compile a group with TorchInductor for inference, shapes (static or symbolic) as
    export left them."""

    def compile_group(gm: fx.GraphModule, fakes: tuple[Any, ...], fake_mode: Any) -> Any:
        context = torch._guards.TracingContext(fake_mode)
        # an inference graph: with grad on, parameters would make AOT autograd trace a
        # training graph (saving activations, and failing on ops without a derivative)
        with torch._guards.tracing(context), torch.no_grad():
            return torch._inductor.standalone_compile(
                gm,
                list(fakes),
                dynamic_shapes="from_tracing_context",
                options=dict(options or {}),
            )

    return compile_group


# Constant argument types whose value alone says what they are (`type(x)` is keyed too:
# 1, 1.0 and True are different constants).
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout)
_PLAIN += (torch.memory_format, type(Ellipsis))

# Modules whose functions are plain operators (operator.getitem, math.sqrt, torch.sym_max):
# an FX target from elsewhere may carry state of its own, so it is never shared.
_OPERATOR_MODULES = ("_operator", "operator", "math", "builtins")


class _Unkeyable(Exception):
    """The graph holds something whose identity, not just structure, may matter."""


def _target(t: Any) -> Hashable:
    if isinstance(t, str):  # call_method: the method's name
        return t
    if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return t
    mod = getattr(t, "__module__", None) or ""
    if callable(t) and (mod in _OPERATOR_MODULES or mod == "torch"):
        return t
    raise _Unkeyable(f"call target {t!r}")


def _arg(a: Any, index: dict[fx.Node, int]) -> Hashable:
    if isinstance(a, fx.Node):
        return ("node", index[a])
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_arg(x, index) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple(sorted((str(k), _arg(v, index)) for k, v in a.items())))
    if isinstance(a, slice):
        return ("slice", _arg(a.start, index), _arg(a.stop, index), _arg(a.step, index))
    if isinstance(a, float) and math.isnan(a):
        return ("float", "nan")
    if isinstance(a, _PLAIN):
        return (type(a).__name__, repr(a))
    raise _Unkeyable(f"argument of type {type(a).__name__}")


def _value(v: Any) -> Hashable:
    """A fake value's metadata: sizes, strides and offset as text (symbolic expressions
    included), dtype, device, layout; a size input as its expression."""
    if isinstance(v, torch.Tensor):
        return (
            "tensor",
            tuple(str(d) for d in v.shape),
            tuple(str(s) for s in v.stride()) if v.layout == torch.strided else (),
            str(v.storage_offset()) if v.layout == torch.strided else "",
            v.dtype,
            str(v.device),
            v.layout,
        )
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return (type(v).__name__, str(v))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_value(x) for x in v))
    if isinstance(v, _PLAIN):
        return (type(v).__name__, repr(v))
    raise _Unkeyable(f"value of type {type(v).__name__}")


def compile_key(
    compiler: GroupCompiler, gm: fx.GraphModule, fakes: tuple[Any, ...]
) -> Hashable | None:
    """What a compiled group depends on, or None where sharing is not known to be safe.

    Keyed: the compiler object itself (one per compile mode and options in a realization);
    every node in order with its op, its target (the operator object itself), its
    arguments and keyword arguments with other nodes as their position in the graph and
    constants as (type, repr); every node's `meta["val"]` metadata; and each compile input
    (`fakes`): sizes, strides and storage offset as text (symbolic expressions included),
    dtype, device, layout. Not keyed: node and input names, and `requires_grad` (a model
    input has none, a value computed from parameters has one; Inductor's compiles here
    trace inference graphs, under no_grad, where it changes nothing).
    None (never shared) for a graph holding `get_attr` or `call_module` nodes (module
    state), a call target that is not an operator (ATen/custom op, a function of
    `operator`, `math`, `builtins` or `torch`), a constant of another type, or a
    graph with its own code generator (pytree in/out specs).
    """
    if type(gm.graph._codegen) is not fx.graph.CodeGen:
        return None
    index: dict[fx.Node, int] = {}
    nodes: list[Hashable] = []
    try:
        for i, n in enumerate(gm.graph.nodes):
            if n.op in ("get_attr", "call_module"):
                return None
            target = None if n.op in ("placeholder", "output") else _target(n.target)
            val = n.meta.get("val")
            meta = _value(val) if val is not None else None
            args = _arg(n.args, index) if n.op != "placeholder" else ()
            nodes.append((n.op, target, args, _arg(dict(n.kwargs), index), meta))
            index[n] = i
        inputs = tuple(_value(f) for f in fakes)
    except _Unkeyable:
        return None
    return (compiler, tuple(nodes), inputs)


class SharedCompiles:
    """The groups compiled so far in one realization, by `compile_key`.

    `compile` compiles a group whose key is new and records its callable with the
    group's index; a group whose key was seen gets that callable back, uncompiled. A
    compile that raises records nothing (a later group with the key compiles again).
    Not thread-safe: one realization prepares its groups one after another.
    """

    def __init__(self) -> None:
        self._done: dict[Hashable, tuple[Callable[..., Any], int]] = {}
        self.compiles = 0  # compiler calls made (groups compiled, not shared)

    def compile(
        self,
        compiler: GroupCompiler,
        gm: fx.GraphModule,
        fakes: tuple[Any, ...],
        fake_mode: Any,
        group: int,
    ) -> tuple[Callable[..., Any], int | None]:
        """(the callable, the index of the group it was compiled for, or None when it was
        compiled for `group` now)."""
        key = compile_key(compiler, gm, fakes)
        if key is not None and key in self._done:
            fn, first = self._done[key]
            return fn, first
        self.compiles += 1
        fn = compiler(gm, fakes, fake_mode)
        if key is not None:
            self._done[key] = (fn, group)
        return fn, None
