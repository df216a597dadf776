"""Dynamo's graph -> a module over the user's inputs, capturable like the user's own model.

A `torch.compile` backend receives dynamo's torch-level GraphModule, whose placeholders
are a mix of: sizes (SymInts, with `dynamic=True`), the user's tensors, the model's
parameters and buffers (lifted as inputs, in first-use order), and float attributes
turned into 0-d tensors read with `.item()` (e.g. LayerNorm's eps under torch 2.13).
`torch.export` cannot trace `.item()` on an input, and a plan cache keyed on the model
needs the parameters to be parameters, not inputs.

`lift_graph` rebuilds the graph so that only the user's tensors are inputs: sizes become
`aten.sym_size` reads of the user tensors they came from, parameters and buffers are
registered on the module (sharing storage with the model: weight updates are seen),
and `.item()` of a 0-d attribute is baked in as a constant. Exported, the result is the
same aten program as exporting the user's model directly (same ops, same order, same
`OpGraph.structure_key`): that is what lets the runtime find plans tuned offline.

A model split by `parallelize_module` (DTensor tensor parallelism) reaches the backend
with its DTensor weights and the device mesh its sharding hooks hold among the inputs.
The lift registers the DTensor weights as parameters and the mesh (model state, like
them) as a constant attribute, the placements being constants of dynamo's graph already;
exporting the result (`export_model`) captures it as `planner.ir.capture_dtensor`
captures the model itself: the rank program on local shards, with the same
`structure_key`, so plans made offline for the model apply. That program is traced for
one shape, so such a lift is marked `per_shape`. Declined (`LiftError`): a DTensor
argument of forward, or a mesh passed with the call (the rank program takes local
tensors), and a DTensor output (the rank program returns local tensors: the caller
would get its shard). The ranks do not communicate to agree on the lift; it is
deterministic instead: it reads only dynamo's graph and the kinds and sources of its
inputs (a mesh, a DTensor, a tensor), which are the same on every rank of an SPMD
program, and the capture that follows traces on fake tensors of the local shards'
shapes, the same on every rank of an even split (an uneven one, shards of different
sizes, is the case where one rank's capture could fail alone).

It needs the `grapharg` metadata dynamo attaches while the backend is being called, so
call it from inside the backend. Anything it does not recognise raises `LiftError`; the
backend then runs dynamo's graph as it is.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._dynamo import source as dsource
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from planner.errors import CaptureError, FusionPlannerError
from planner.ir.capture import Captured, _as_args, _quiet_torch, export_model
from planner.ir.capture_dtensor import has_dtensors


class LiftError(FusionPlannerError):
    """Dynamo's graph has an input the runtime cannot map onto the user's tensors."""


@dataclass(frozen=True)
class LiftedGraph:
    """A module over user inputs and how dynamo's call arguments map onto them.

    `user_positions[i]`: the index, among dynamo's call arguments, of user input i.
    `dynamic`: (user input, axis) pairs that dynamo left symbolic (they may vary).
    `constants`: (argument index, value) of int arguments baked into the module (an int
    argument of forward that is no size of a user tensor, e.g. Hugging Face's
    `logits_to_keep`); a call with another value must run dynamo's graph instead.
    `per_shape`: the module holds DTensors; its capture is the rank program traced for
    one shape (planner.ir.capture_dtensor), so each shape is exported and realized alone.
    `state`: (argument index, attribute of `module` or None, tensor) of every parameter,
    buffer and 0-d float attribute baked into the module (None: read with `.item()` and
    baked as a constant). Dynamo passes state as arguments and reuses one graph for every
    instance of a module class (the repeated layers around a graph break, two models of
    one class compiled with one backend), so a call whose state is other tensors than
    these is another module's: `rebind` makes its lift.
    """

    module: fx.GraphModule
    user_positions: tuple[int, ...]
    dynamic: tuple[tuple[int, int], ...]
    user_names: tuple[str, ...]
    constants: tuple[tuple[int, int], ...] = ()
    per_shape: bool = False
    state: tuple[tuple[int, str | None, torch.Tensor], ...] = ()

    def fits(self, args: Sequence[Any]) -> bool:
        """Whether a call's int arguments have the values baked into the module."""
        return all(args[p] == v for p, v in self.constants)

    def same_state(self) -> Callable[[Sequence[Any]], bool]:
        """A check of whether a call passes this lift's own state tensors: identities
        compared on every call, so it is kept to one C-level pass over the state's
        argument positions."""
        positions = [p for p, _, _ in self.state]
        state = [t for _, _, t in self.state]
        if not state:
            return lambda args: True
        if len(state) == 1:
            return lambda args: args[positions[0]] is state[0]
        pick = operator.itemgetter(*positions)
        return lambda args: all(map(operator.is_, pick(args), state))

    def state_key(self, args: Sequence[Any]) -> tuple[int, ...]:
        """The identities of a call's state tensors (a key for its module's lift)."""
        return tuple(id(args[p]) for p, _, _ in self.state)

    def rebind(self, args: Sequence[Any]) -> LiftedGraph | None:
        """This lift with a call's state tensors in place of the baked ones (the same graph
        over another instance's parameters), or None when it cannot be: a state tensor of
        another shape, dtype or kind, or a float attribute with another value."""
        root = torch.nn.Module()
        for name, value in self.module.named_parameters(recurse=False):
            root.register_parameter(name, value)
        for name, value in self.module.named_buffers(recurse=False):
            root.register_buffer(name, value)
        for name, value in vars(self.module).items():
            if isinstance(value, DeviceMesh):
                setattr(root, name, value)
        state = []
        for p, attr, old in self.state:
            new = args[p]
            if (
                not isinstance(new, torch.Tensor)
                or type(new) is not type(old)
                or new.shape != old.shape
                or new.dtype != old.dtype
                or new.device != old.device
            ):
                return None
            if attr is None:
                if new is not old and new.item() != old.item():
                    return None
            elif isinstance(new, torch.nn.Parameter):
                root.register_parameter(attr, new)
            else:
                root.register_buffer(attr, new)
            state.append((p, attr, new))
        module = fx.GraphModule(root, self.module.graph, class_name="LiftedDynamoGraph")
        return replace(self, module=module, state=tuple(state))


def _source_chain(node: fx.Node) -> list[Any]:
    """Dynamo's source of a placeholder, outermost first (`L['x'][0]` -> [GetItem, Local])."""
    src = getattr(node.meta.get("grapharg"), "source", None)
    chain = []
    while src is not None:
        chain.append(src)
        src = getattr(src, "base", None)
    return chain


def _source_name(source: Any) -> str:
    name = source.name  # a property in torch 2.13, a method in older releases
    return str(name() if callable(name) else name)


# Sources that reach a tensor by indexing the frame's arguments: the user's inputs
# (`L['x']`, `L['args'][1]`, `L['kwargs']['input_ids']`).
_ARGUMENT_SOURCES = (dsource.LocalSource, dsource.GetItemSource, dsource.DictGetItemSource)
# Sources that reach a tensor through a module or a global: the model's state.
_STATE_SOURCES = tuple(
    getattr(dsource, name)
    for name in (
        "NNModuleSource",
        "ParamBufferSource",
        "UnspecializedParamBufferSource",
        "GlobalSource",
    )
    if hasattr(dsource, name)  # all present in torch 2.11 and 2.13; older ones lack some
)


def _is_state(node: fx.Node, example: Any) -> bool:
    """Model state (parameters, buffers, module attributes, globals), not a user input.

    Decided on dynamo's source for the placeholder, not on its name: Hugging Face models
    wrap `forward` in decorators, so `self` reaches dynamo as `L['args'][0]` and a
    parameter's source reads `L['args'][0]._modules[...]`, while the user's tensor is
    `L['args'][1]`. A tensor an argument holds (an attribute of a user object, such as
    a KV cache's tensors) is an input: dynamo passes its current value on every call.
    Anything else raises LiftError, since baking it in as state would serve stale values.
    """
    if isinstance(example, torch.nn.Parameter):
        return True
    chain = _source_chain(node)
    if not chain:
        return False
    if any(isinstance(s, _STATE_SOURCES) for s in chain):
        return True
    name = _source_name(chain[0])
    if name.startswith(("L['self']", "G[", "___")) or "._buffers[" in name:
        return True
    if all(isinstance(s, _ARGUMENT_SOURCES) for s in chain):
        return False
    if isinstance(chain[-1], dsource.LocalSource):
        # a tensor held by an argument object (a Hugging Face KV cache's
        # `L['kwargs']['past_key_values'].layers[0].keys`): dynamo passes its current value
        # on every call, so it is an input like the argument itself
        return False
    raise LiftError(
        f"input {node.name} reaches dynamo's graph as {name}, neither an argument of "
        "forward nor model state: the runtime plans tensor arguments only"
    )


def _sym_expr(v: Any) -> Any:
    return v.node.expr if isinstance(v, torch.SymInt) else None


def lift_graph(gm: fx.GraphModule, example_inputs: list[Any]) -> LiftedGraph:
    """See the module docstring. `example_inputs` are the backend's real arguments."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise LiftError(
            f"dynamo's graph has {len(placeholders)} inputs but {len(example_inputs)} "
            "example inputs came with it"
        )
    root = torch.nn.Module()
    g = fx.Graph()
    env: dict[fx.Node, Any] = {}
    user: list[tuple[int, fx.Node, Any]] = []  # (argument index, new placeholder, fake value)
    state: list[tuple[int, str | None, torch.Tensor]] = []  # see LiftedGraph.state
    symbols: list[tuple[int, fx.Node, Any, Any]] = []
    for pos, (node, real) in enumerate(zip(placeholders, example_inputs)):
        fake = node.meta.get("example_value", real)
        if isinstance(fake, torch.SymInt) or isinstance(real, int | torch.SymInt):
            symbols.append((pos, node, fake, real))
            continue
        if isinstance(real, DeviceMesh):
            if not _is_state(node, real):
                raise LiftError(
                    f"input {node.name} is a DeviceMesh passed with the call (a DTensor "
                    "argument's mesh): the runtime plans a DTensor model called with local "
                    "tensors only"
                )
            attr = f"mesh_{pos}_{node.name}"[:120]
            setattr(root, attr, real)  # the sharding hooks' mesh: fixed with the model
            env[node] = g.get_attr(attr)
            continue
        if not isinstance(real, torch.Tensor):
            raise LiftError(f"input {node.name} is a {type(real).__name__}, not a tensor or size")
        if _is_state(node, real):
            attr = f"state_{len(root._parameters) + len(root._buffers)}_{node.name}"[:120]
            if isinstance(real, torch.nn.Parameter):
                root.register_parameter(attr, real)
            elif (
                real.dim() == 0
                and node.users
                and all(u.op == "call_method" and u.target == "item" for u in node.users)
            ):
                for u in node.users:  # a float attribute: bake it as the model's constant
                    env[u] = real.item()
                state.append((pos, None, real))
                continue
            else:
                root.register_buffer(attr, real)
            state.append((pos, attr, real))
            env[node] = g.get_attr(attr)
        else:
            if isinstance(real, DTensor):
                raise LiftError(
                    f"input {node.name} is a DTensor argument of forward: the runtime plans "
                    "a DTensor model called with local tensors only"
                )
            env[node] = g.placeholder(node.name)
            env[node].meta = dict(node.meta)
            user.append((pos, env[node], fake))
    dynamic: set[tuple[int, int]] = set()
    constants: list[tuple[int, int]] = []
    for pos, node, fake, real in symbols:
        if not node.users:  # e.g. the stride of a size-1 dimension: nothing reads it
            continue
        expr = _sym_expr(fake)
        for op, values in (
            (torch.ops.aten.sym_size.int, lambda t: getattr(t, "shape", ())),
            (
                torch.ops.aten.sym_stride.int,
                lambda t: t.stride() if isinstance(t, torch.Tensor) else (),
            ),
        ):
            hit = next(
                (
                    (ui, axis)
                    for ui, (_, _, uf) in enumerate(user)
                    for axis, v in enumerate(values(uf))
                    if expr is not None and _sym_expr(v) == expr
                ),
                None,
            )
            if hit is not None:
                env[node] = g.call_function(op, (user[hit[0]][1], hit[1]))
                break
        else:
            value = (
                real
                if isinstance(real, int)
                else getattr(getattr(real, "node", None), "hint", None)
            )
            if not isinstance(value, int) or isinstance(value, bool):
                raise LiftError(
                    f"size input {node.name} ({expr}) is neither a dimension nor a stride of "
                    "any user tensor, and its value is unknown: the runtime plans tensor "
                    "shapes only"
                )
            env[node] = value  # an int argument of forward: baked in, checked per call
            constants.append((pos, value))
    for ui, (_, _, uf) in enumerate(user):
        for axis, size in enumerate(getattr(uf, "shape", ())):
            if _sym_expr(size) is not None and not _sym_expr(size).is_number:
                dynamic.add((ui, axis))
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node in env:
            continue
        if node.op == "get_attr":  # state dynamo kept as attributes (older torch, constants)
            value = operator.attrgetter(str(node.target))(gm)
            attr = "attr_" + str(node.target).replace(".", "_")
            if isinstance(value, torch.nn.Parameter):
                root.register_parameter(attr, value)
            elif isinstance(value, torch.Tensor):
                root.register_buffer(attr, value)
            elif isinstance(value, DeviceMesh):  # torch releases that keep the mesh a constant
                setattr(root, attr, value)
            elif isinstance(value, torch.nn.Module):
                users = ", ".join(sorted({str(u.target) for u in node.users}))
                raise LiftError(
                    f"dynamo's graph calls a higher-order op ({users}) with the subgraph "
                    f"{node.target} (a custom torch.autograd.Function in grad mode, or "
                    "another wrapped region): the runtime plans plain ops only, so this "
                    "graph runs as dynamo traced it"
                )
            else:
                raise LiftError(f"dynamo's graph reads a non-tensor attribute {node.target}")
            env[node] = g.get_attr(attr)
            continue
        if node.op == "call_module":
            raise LiftError(f"dynamo's graph calls a submodule ({node.target}); not supported")
        env[node] = g.node_copy(node, lambda a: env[a])
    module = fx.GraphModule(root, g, class_name="LiftedDynamoGraph")
    sharded = has_dtensors(module)
    if sharded:
        _check_local_outputs(gm)
    return LiftedGraph(
        module,
        tuple(pos for pos, _, _ in user),
        tuple(sorted(dynamic)),
        tuple(p.name for _, p, _ in user),
        tuple(constants),
        per_shape=sharded,
        state=tuple(state),
    )


def _check_local_outputs(gm: fx.GraphModule) -> None:
    """Raise LiftError unless every tensor dynamo's graph returns is a plain tensor: the
    rank program of a DTensor model returns local tensors, so a DTensor output (a layout
    with `use_local_output=False`) would reach the caller as its local shard."""
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    for value in fx.node.map_arg(out.args, lambda n: n.meta.get("example_value", n)):
        for leaf in pytree.tree_leaves(value):
            if isinstance(leaf, fx.Node):
                raise LiftError(
                    f"dynamo's graph returns {leaf.name} without an example value: cannot "
                    "tell whether it is a DTensor"
                )
            if isinstance(leaf, DTensor):
                raise LiftError(
                    "dynamo's graph returns a DTensor: the runtime serves a DTensor model's "
                    "rank program, which returns local tensors (use_local_output=True)"
                )


def trace_as_served(module: torch.nn.Module, example_inputs: Any) -> tuple[LiftedGraph, tuple]:
    """Dynamo's graph of `module` on `example_inputs`, lifted: the program the runtime
    backend serves, and the user tensors (in the lifted module's input order).

    One graph is required (`fullgraph=True`); shapes are traced static. Raises
    CaptureError when dynamo breaks the graph or the graph cannot be lifted.
    """
    seen = _traced(module, example_inputs, fullgraph=True)
    if len(seen) != 1:
        raise CaptureError(f"dynamo gave {len(seen)} graphs for {type(module).__name__}, not 1")
    (lifted,) = seen
    assert not isinstance(lifted, LiftError)  # with fullgraph, `record` raised it
    return lifted


def trace_graphs(
    module: torch.nn.Module,
    example_inputs: Any,
    calls: list[list[tuple[tuple[int, ...], ...]]] | None = None,
) -> list[tuple[LiftedGraph, tuple] | LiftError]:
    """Every graph dynamo compiles for one call of `module` on `example_inputs`, in the
    order dynamo compiled them (a model with graph breaks gives several; the backend
    serves each one on its own), each lifted with its user tensors, or the LiftError that
    keeps the backend from planning it. Traced with symbolic sizes, as the backend meets
    them under `torch.compile(..., dynamic=True)`: a graph after a break can read a tensor
    for its sizes only, which is then among its inputs (traced static, the sizes would be
    constants and the tensor no input). A graph dynamo reuses (one layer class called
    again after a break) is compiled, and listed, once; `calls`, when given, gets for each
    listed graph the user-input shapes of every call it served in that forward (a reused
    graph serves several, at other sizes too). Raises CaptureError when dynamo cannot run
    the model at all."""
    return _traced(module, example_inputs, fullgraph=False, dynamic=True, calls=calls)


def _traced(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    fullgraph: bool,
    dynamic: bool = False,
    calls: list[list[tuple[tuple[int, ...], ...]]] | None = None,
) -> list[tuple[LiftedGraph, tuple] | LiftError]:
    args = _as_args(example_inputs)
    seen: list[tuple[LiftedGraph, tuple[Any, ...]] | LiftError] = []

    def record(gm: fx.GraphModule, example: list[Any]) -> Any:
        try:
            lifted = lift_graph(gm, list(example))
        except LiftError as e:
            if fullgraph:
                raise
            seen.append(e)
            if calls is not None:
                calls.append([])
            return gm.forward
        seen.append((lifted, tuple(example[p] for p in lifted.user_positions)))
        if calls is None:
            return gm.forward
        mine: list[tuple[tuple[int, ...], ...]] = []
        calls.append(mine)
        positions = lifted.user_positions

        def counted(*a: Any) -> Any:
            mine.append(tuple(tuple(int(d) for d in a[p].shape) for p in positions))
            return gm.forward(*a)

        return counted

    # Each capture adds a cache entry for the model's forward; a tuning job captures the
    # same model once per bucket, which must not run into dynamo's recompile limit.
    limits = {"recompile_limit": 1 << 20, "accumulated_recompile_limit": 1 << 20}
    try:
        with _quiet_torch(), torch.no_grad(), torch._dynamo.config.patch(limits):
            torch.compile(module, backend=record, fullgraph=fullgraph, dynamic=dynamic)(*args)
    except Exception as e:  # dynamo raises many types; the caller needs one
        cause = e.__cause__ if isinstance(e.__cause__, LiftError) else e
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        how = "as one graph" if fullgraph else "with torch.compile"
        raise CaptureError(
            f"torch.compile could not trace {type(module).__name__} {how} "
            f"({type(cause).__name__}: {first[:300]})"
        ) from e
    return seen


def capture_for_serving(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    name: str = "",
    meta: dict[str, Any] | None = None,
    trace_as: str | torch.device | None = None,
) -> Captured:
    """The capture the runtime backend plans and looks plans up with: dynamo's graph of
    `module` (`trace_as_served`), exported (`planner.ir.capture.export_model`; `trace_as`
    as there: exported without data as if on that device, for planning only).

    Models may trace differently under `torch.export` and under `torch.compile`
    (Hugging Face models build an explicit attention mask while exporting and leave it to
    SDPA's `is_causal` while compiling), so a plan made on `export_model(module)` would
    not fit the graph the backend meets. Offline tuning captures through this function so
    that its plans are keyed and partitioned on the backend's graph. A model dynamo cannot
    trace as one graph is exported directly (a model with graph breaks: `tune` captures
    each of its graphs instead, search/tune_parts.py).
    """
    try:
        whole = trace_as_served(module, example_inputs)
    except CaptureError:
        whole = None
    return export_served(module, example_inputs, whole, name=name, meta=meta, trace_as=trace_as)


def export_served(
    module: torch.nn.Module,
    example_inputs: Any,
    whole: tuple[LiftedGraph, tuple] | None,
    *,
    name: str = "",
    meta: dict[str, Any] | None = None,
    trace_as: str | torch.device | None = None,
) -> Captured:
    """`capture_for_serving` once the model was traced: `whole` (`trace_as_served`'s lift
    and user tensors) exported, or `module` exported directly where there is none."""
    if whole is None:
        return export_model(module, example_inputs, name=name, meta=meta, trace_as=trace_as)
    lifted, user = whole
    return export_model(
        lifted.module, user, name=name or type(module).__name__, meta=meta, trace_as=trace_as
    )


def trace_served(
    module: torch.nn.Module,
    example_inputs: Any,
    calls: list[list[tuple[tuple[int, ...], ...]]] | None = None,
) -> tuple[tuple[LiftedGraph, tuple] | None, list[tuple[LiftedGraph, tuple] | LiftError] | None]:
    """How `torch.compile` serves `module` at one call: (its one graph lifted, None) where
    dynamo traces it as one graph (`trace_as_served`); else (None, every graph
    `trace_graphs` lists, `calls` filled as there), a model with graph breaks or a graph
    that cannot be lifted; (None, None) where dynamo cannot run it at all."""
    try:
        return trace_as_served(module, example_inputs), None
    except CaptureError:
        pass
    try:
        return None, trace_graphs(module, example_inputs, calls)
    except CaptureError:
        return None, None


def holds_tensors(gm: fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Whether dynamo's graph takes or makes any tensor (one that only does arithmetic on
    sizes, as a model's code between two graph breaks can, has nothing to plan)."""
    if any(isinstance(x, torch.Tensor) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        val = node.meta.get("example_value", node.meta.get("val"))
        vals = val if isinstance(val, list | tuple) else [val]
        if any(isinstance(v, torch.Tensor) for v in vals):
            return True
    return False


def device_of_graph(user: tuple[Any, ...], module: torch.nn.Module) -> torch.device:
    """Where a graph runs: the first accelerator among its tensor inputs, then its
    parameters and buffers; else the device of the first of those; else the CPU (a graph
    with no tensors at all)."""
    devices = [t.device for t in user if isinstance(t, torch.Tensor)]
    devices += [t.device for t in (*module.parameters(), *module.buffers())]
    return next(
        (d for d in devices if d.type != "cpu"), devices[0] if devices else torch.device("cpu")
    )
