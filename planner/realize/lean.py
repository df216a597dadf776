"""The host side of a realized plan's call: lean group entries, straight-line glue.

`torch._inductor.standalone_compile` returns a callable whose every call runs, before
Inductor's compiled graph, a `torch._dynamo.disable` shell, AOT autograd's `forward`
(which prepends lifted parameters), a serializable shell and the runtime wrapper (grad
mode off around the call; input mutations applied; outputs that alias inputs or each
other regenerated; the output count checked; on torch 2.11 also an RNG and an effect-token
wrapper). At tiny shapes they are a large share of a group's call on the host
(benchmarks/host_overhead.py times both entries).

For the groups a realizer compiles here, those wrappers have nothing to do when the call
runs without grad mode or autocast: the group's subgraph is functional (operators that
mutate nothing) and no output is, or is a view of, an input or another output, so AOT
autograd added no mutation, alias or intermediate-base handling; weights are inputs, so
no parameters are prepended. `lean_entry` checks all that (the subgraph's ops, its fake
values' storages, and each wrapper between the artifact and the compiled graph being one
of the known kinds, told by its code's name, with AOT autograd's metadata where torch
keeps it reachable) and returns the compiled graph (Inductor's `CompiledFxGraph`, called
boxed: a fresh list of the inputs; with the dynamic-dim marks the wrapper would set on
its outputs, `LeanGraph`), or None with the reason. `with_lean_path` calls it when grad
mode and autocast are off and the artifact otherwise (an input that requires grad with
grad mode on, autocast), so the wrappers keep every case they exist for. The disable
shell is passed too: a served plan runs inside dynamo's own disabled region.

`GroupCalls` and `lean_program` give the plan's top-level program as straight-line code
over one object holding the groups' callables and the state; `InputGuard` checks a
call's inputs, remembering signatures that passed.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from planner.errors import PlanError
from planner.realize.layout import propagate

# The wrappers standalone_compile puts in front of Inductor's graph (torch 2.11, 2.13), by
# their code's qualified name; anything else on the way (dedupe, synthetic bases, tensor
# subclasses, effect tokens or functionalized RNG in use) leaves the group on the artifact.
_DISABLE = "DisableContext.__call__.<locals>._fn"  # torch._dynamo.disable
_AOT_FORWARD = "aot_module_simplified.<locals>.forward"
_RUNTIME = "_create_runtime_wrapper.<locals>.runtime_wrapper"
_RNG = "FunctionalizedRngRuntimeWrapper.post_compile.<locals>.wrapper"
_TOKENS = "EffectTokensWrapper.post_compile.<locals>.inner_fn"  # kept only without tokens
_SHELLS = ("SerializableCompiledFunction",)
# Modules of plain functions a subgraph may call besides operators (getitem, sym_max, ...).
_OPERATOR_MODULES = ("_operator", "operator", "math", "builtins", "torch")


def _code_name(fn: Any) -> str:
    """A wrapper's name from its code object (`functools.wraps` copies `__qualname__` from
    the function it wraps, the code keeps its own); a callable object's class name."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return type(fn).__name__
    return getattr(code, "co_qualname", "") or "a function of unknown name"


def _closure(fn: Any) -> dict[str, Any]:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    out: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars if code else (), cells):
        with contextlib.suppress(ValueError):  # an empty cell
            out[name] = cell.cell_contents
    return out


def _metadata_blocks(md: Any) -> str:
    """Why AOT autograd's runtime metadata needs its wrapper ('' when it does not)."""
    checks = (
        ("num_mutated_inp_runtime_indices", 0, "an input is mutated"),
        ("num_outputs_aliased", 0, "an output aliases an input or another output"),
        ("num_intermediate_bases", 0, "outputs share an intermediate base"),
        ("is_rng_op_functionalized", False, "functionalized RNG"),
        ("grad_enabled_mutation", None, "the graph changes grad mode"),
    )
    for attr, ok, why in checks:
        if getattr(md, attr, ok) != ok:
            return why
    if getattr(md, "tokens", None):
        return "effect tokens"
    return ""


def _functional(gm: fx.GraphModule) -> str:
    """'' when every node of `gm` is an operator that mutates nothing, else why not."""
    for n in gm.graph.nodes:
        if n.op in ("call_module", "get_attr", "call_method"):
            return f"{n.op} node {n.name}"
        if n.op != "call_function":
            continue
        t = n.target
        if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            schema = getattr(t, "_schema", None)
            if schema is not None and schema.is_mutable:
                return f"{t} mutates an argument"
        elif getattr(t, "__module__", None) not in _OPERATOR_MODULES:
            return f"a call of {getattr(t, '__qualname__', t)}"
    return ""


def _storage(t: Any) -> Any:
    return StorageWeakRef(t.untyped_storage())


def _unaliased(ins: Sequence[Any], outs: Sequence[Any]) -> str:
    """'' when no output (fake value) shares storage with an input or another output."""
    seen = set()
    for t in ins:
        if isinstance(t, torch.Tensor):
            seen.add(_storage(t))
    for i, t in enumerate(outs):
        if not isinstance(t, torch.Tensor):
            return f"output {i} is not a tensor"
        s = _storage(t)
        if s in seen:
            return f"output {i} aliases an input or another output"
        seen.add(s)
    return ""


# What a generated runtime wrapper (torch 2.13) may refer to and still do nothing but call
# the compiled graph and mark outputs' dynamic dims for dynamo (which `LeanGraph` repeats).
_PLAIN_GLOBALS = {"torch", "_mark_dynamic_"}
# Names only a training graph's wrapper uses (grad mode on, view replay, detached inputs);
# an inference wrapper turns grad mode off around the call, which a call without grad mode
# does not need, and a change of grad mode inside the graph is refused by `_functional`.
_TRAINING_NAMES = {"enable_grad", "_set_view_replay_enabled", "_is_view_replay_enabled", "detach"}


def _generated_epilogue(fn: Any) -> tuple[tuple[tuple[int, Any], ...], str]:
    """(outputs whose dynamic dims it marks, '') for a generated runtime wrapper that only
    calls the graph and marks outputs; else ((), why not). Read from its globals (an
    epilogue of mutations, aliases or autocast puts its helper there) and the names its
    code uses (a training graph's)."""
    names = {k for k in getattr(fn, "__globals__", {}) if not k.startswith("__")}
    other = {n for n in names if n not in _PLAIN_GLOBALS and not n.startswith("_dyn_dims_")}
    if other:
        return (), f"the runtime wrapper has an epilogue ({', '.join(sorted(other))})"
    code = getattr(fn, "__code__", None)
    if code is None or _TRAINING_NAMES & set(code.co_names):
        return (), "the runtime wrapper is a training graph's"
    g = fn.__globals__
    marks = tuple(
        (int(n[len("_dyn_dims_") :]), g[n]) for n in sorted(names) if n.startswith("_dyn_dims_")
    )
    if marks and not callable(g.get("_mark_dynamic_")):
        return (), "outputs are marked by an unknown helper"
    return tuple((i, (g["_mark_dynamic_"], dims)) for i, dims in marks), ""


def _closure_marks(fn: Any, md: Any) -> tuple[tuple[tuple[int, Any], ...], str]:
    """The dynamic-dim marks a runtime wrapper that keeps its metadata in its closure (torch
    2.11) sets on its outputs, with the helper it calls (from its globals)."""
    helper = getattr(fn, "__globals__", {}).get("maybe_mark_dynamic_helper")
    if not callable(helper):
        return (), "outputs are marked for dynamo by an unknown helper"
    infos = getattr(md, "output_info", None) or ()
    marks = tuple(
        (i, (helper, o.dynamic_dims)) for i, o in enumerate(infos) if o.dynamic_dims is not None
    )
    return marks, ""


class LeanGraph:
    """Inductor's compiled graph called boxed, then each output in `marks` given its
    dynamic dims for dynamo as the runtime wrapper would (torch's own helper)."""

    __slots__ = ("graph", "marks")

    def __init__(self, graph: Any, marks: tuple[tuple[int, Any], ...] = ()):
        self.graph, self.marks = graph, marks

    def __call__(self, args: list[Any]) -> Any:
        out = self.graph(args)
        for i, (mark, dims) in self.marks:
            mark(out[i], dims)
        return out


def lean_entry(
    artifact: Any, module: fx.GraphModule, fakes: Sequence[Any], fake_mode: Any
) -> tuple[Any, str]:
    """(Inductor's compiled graph behind `artifact`, '') when calling it boxed is what the
    artifact does with grad mode and autocast off; else (None, why not). `module` and
    `fakes` are the group's subgraph and inputs as compiled."""
    from torch._inductor.output_code import CompiledFxGraph

    why = _functional(module)
    if why:
        return None, why
    try:
        outs = propagate(module, fakes, fake_mode)
    except Exception as e:  # the subgraph compiled: it traces; be safe anyway
        return None, f"fake run failed: {type(e).__name__}"
    why = _unaliased(fakes, outs)
    if why:
        return None, why
    f = getattr(artifact, "_compiled_fn", None)
    if f is None:
        return None, f"{type(artifact).__name__} is not standalone_compile's artifact"
    marks: tuple[tuple[int, Any], ...] = ()
    for _ in range(16):
        if isinstance(f, CompiledFxGraph):
            return (LeanGraph(f, marks) if marks else f), ""
        name = _code_name(f)
        cells = _closure(f)
        if name == _DISABLE:
            pass  # dynamo kept out of the call: the lean path runs no dynamo frame either
        elif name == _AOT_FORWARD:
            if cells.get("params_buffers_flat"):
                return None, "lifted parameters are prepended"
        elif name in (_RUNTIME, _RNG):
            md = cells.get("runtime_metadata")
            why = _metadata_blocks(md) if md is not None else ""
            if not why and name == _RUNTIME and getattr(md, "dynamic_outputs", False):
                marks, why = _closure_marks(f, md)  # (the RNG wrapper marks nothing)
            if not why and (cells.get("trace_joint") or cells.get("disable_amp")):
                why = "a training graph, or autocast turned off around it"
            if not why and "_codegen_runtime_wrapper" in cells:
                marks, why = _generated_epilogue(cells["_codegen_runtime_wrapper"])
            if why:
                return None, why
        elif name == _TOKENS:
            if cells.get("num_tokens") != 0:
                return None, "effect tokens"
        elif type(f).__name__ not in _SHELLS:
            return None, f"unknown wrapper {name}"
        f = getattr(f, "__wrapped__", None)
        if f is None:
            return None, f"{name} wraps no further callable"
    return None, "wrapper chain too deep"


def with_lean_path(
    artifact: Callable[..., Any], graph: Any, index: tuple[int, ...], n: int, switch: list[bool]
) -> Callable[..., Any]:
    """The group's call over its unit's `n` call inputs (the artifact's inputs at `index`):
    `graph` called boxed while `switch[0]` holds and grad mode and autocast are off, the
    artifact otherwise."""
    grad_on = torch.is_grad_enabled
    amp_on = torch._C._is_any_autocast_enabled
    if index == tuple(range(n)):

        def run(*args: Any) -> Any:
            if switch[0] and not grad_on() and not amp_on():
                return graph(list(args))
            return artifact(*args)

    else:

        def run(*args: Any) -> Any:
            picked = [args[i] for i in index]
            if switch[0] and not grad_on() and not amp_on():
                return graph(picked)
            return artifact(*picked)

    return run


class GroupCalls:
    """The callables a realized plan's groups run, by group index (list-like: `calls[g]`,
    `calls[g] = fn`, `len`, iteration), held as attributes `g0`, `g1`, ... that the lean
    program (`lean_program`) calls directly, with the plan's state tensors beside them."""

    def __init__(self, fns: Sequence[Callable[..., Any]]):
        self._n = len(fns)
        for g, fn in enumerate(fns):
            setattr(self, f"g{g}", fn)

    def _name(self, g: int) -> str:
        if not isinstance(g, int) or not 0 <= g < self._n:
            raise IndexError(f"group {g!r} out of range (0..{self._n - 1})")
        return f"g{g}"

    def __getitem__(self, g: int) -> Callable[..., Any]:
        return getattr(self, self._name(g))

    def __setitem__(self, g: int, fn: Callable[..., Any]) -> None:
        setattr(self, self._name(g), fn)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Any:
        return (self[g] for g in range(self._n))


def lean_program(
    top: fx.GraphModule, runners: Sequence[Callable[..., Any]], calls: GroupCalls
) -> Callable[..., Any]:
    """`top`'s program (planner.realize.graph.build_top: user inputs in, group calls in
    order, user outputs out) as straight-line code that calls group g as `calls.g<g>(...)`
    where `top` calls `runners[g]` (which looks group g up in the plan's list), and reads
    each state tensor from `calls` rather than through `nn.Module.__getattr__`. Returns a
    callable over the user inputs; what it computes is `top.forward`'s."""
    index = {id(r): g for g, r in enumerate(runners)}
    g = fx.Graph()
    me = g.placeholder("_calls")
    env: dict[fx.Node, fx.Node] = {}
    for n in top.graph.nodes:
        if n.op == "placeholder":
            env[n] = g.placeholder(n.target)
        elif n.op == "get_attr":
            setattr(calls, n.target, getattr(top, n.target))
            env[n] = g.call_function(getattr, (me, n.target))
        elif n.op == "call_function" and id(n.target) in index:
            args = tuple(env[a] for a in n.args)
            env[n] = g.call_method(f"g{index[id(n.target)]}", (me, *args))
        else:
            env[n] = g.node_copy(n, lambda a: env[a])
    gm = fx.GraphModule(torch.nn.Module(), g, class_name="LeanProgram")
    return functools.partial(gm.forward, calls)


class InputGuard:
    """Checks each call's inputs against what the program was realized for: `specs[i]` =
    (dtype, ((lo, hi) per dim)) of user input i, from its fake value and the program's
    range constraints. A signature (type, dtype, shape per input) that passed once is
    remembered (up to `MEMO` of them), so a recurring shape costs one set look-up."""

    MEMO = 4096

    def __init__(self, fakes: Sequence[Any], ranges: Any):
        self.specs: list[tuple[torch.dtype, tuple[tuple[int, int], ...]]] = []
        for fake in fakes:
            dims = []
            for d in fake.shape:
                if isinstance(d, int):
                    dims.append((d, d))
                else:
                    vr = ranges.get(d.node.expr)
                    lo = int(vr.lower) if vr is not None else 0
                    hi = int(vr.upper) if vr is not None and vr.upper.is_finite else 1 << 62
                    dims.append((lo, hi))
            self.specs.append((fake.dtype, tuple(dims)))
        self.static = all(lo == hi for _, dims in self.specs for lo, hi in dims)
        self._passed: set[Any] = set()

    def check(self, args: Sequence[Any]) -> None:
        try:
            key = tuple([(type(a), a.dtype, a.shape) for a in args])
        except AttributeError:  # not a tensor: `_check` says which
            key = None
        if key is not None and key in self._passed:
            return
        self._check(args)
        if key is not None:
            if len(self._passed) >= self.MEMO:
                self._passed.clear()
            self._passed.add(key)

    def _check(self, args: Sequence[Any]) -> None:
        if len(args) != len(self.specs):
            raise PlanError(f"the realized plan takes {len(self.specs)} inputs, got {len(args)}")
        for i, (a, (dtype, dims)) in enumerate(zip(args, self.specs)):
            if not isinstance(a, torch.Tensor) or a.dtype != dtype or a.dim() != len(dims):
                raise PlanError(
                    f"input {i}: expected a {dtype} tensor of rank {len(dims)}, got "
                    f"{getattr(a, 'dtype', type(a).__name__)} of rank {getattr(a, 'ndim', '-')}"
                )
            for axis, (size, (lo, hi)) in enumerate(zip(a.shape, dims)):
                if not lo <= size <= hi:
                    raise PlanError(
                        f"input {i} dim {axis} is {size}, outside the realized range "
                        f"[{lo}, {hi}]: realize the plan for this shape (or its bucket)"
                    )
