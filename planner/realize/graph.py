"""Cutting an exported aten program into one FX subgraph per group of a partition.

`planner.realize.realizer` turns each subgraph into a compiled unit; this module only does the
bookkeeping, which is where realization bugs would hide:

- which FX node belongs to which group: an OpGraph node is the FX node of the same name
  (`planner.ir.capture` keeps them 1:1). A program exported with dynamic shapes may name
  some nodes differently (symbolic-size arithmetic takes names like `add`); then the
  nodes are matched by position among the op nodes, with their targets checked;
- `getitem` of a multi-output op goes with its op; nodes that produce no tensor (symbolic
  sizes, asserts) are "free": they run in the top-level program, between groups;
- a group's subgraph takes as placeholders exactly the values it reads from outside
  (boundary tensors, parameters, symbolic sizes) and returns exactly the values read
  outside it: nothing else crosses a group boundary.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from planner.errors import PlanError
from planner.fusion.partition import Partition, bits
from planner.fusion.recompute import Copies, check_copies, dead
from planner.ir.capture import _SKIP_TARGETS, Captured
from planner.ir.graph import OpGraph


@dataclass(frozen=True)
class GroupGraph:
    """One group's subgraph.

    `module`: placeholders in the order of `inputs`, returns a tuple in the order of
    `outputs`. `inputs` / `outputs` name values of the program's graph (FX node names);
    `fakes` are the fake (possibly symbolic) values of the inputs, from export.
    """

    index: int
    nodes: tuple[int, ...]  # OpGraph node indices
    module: fx.GraphModule
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fakes: tuple[Any, ...]


@dataclass(frozen=True)
class ProgramParts:
    """The exported program taken apart: what realize needs besides the subgraphs."""

    gm: fx.GraphModule
    user_inputs: tuple[str, ...]  # placeholder names of the user inputs, in call order
    state: dict[str, torch.Tensor]  # placeholder name -> parameter / buffer / constant
    # the user outputs: FX nodes (or constants), in order, then the new value of each user
    # input the program updates in place (`mutated` says which input each one is written to)
    outputs: tuple[Any, ...]
    group_of: dict[str, int]  # FX node name -> group index, for nodes inside groups
    op_names: tuple[str, ...]  # op_names[i] = FX name of OpGraph node i
    by_name: dict[str, fx.Node]  # every FX node of the program by name
    copied_into: dict[str, tuple[int, ...]] = field(default_factory=dict)  # name -> groups
    dead: frozenset[str] = frozenset()  # copied ops their home group does not run
    mutated: tuple[int, ...] = ()  # user input index of each trailing output in `outputs`


def _is_op_node(node: fx.Node) -> bool:
    """Whether `planner.ir.capture` made an OpNode of this FX node (same rules)."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return False
    if node.target is operator.getitem:
        return False
    if any(s in str(node.target) for s in _SKIP_TARGETS):
        return False
    val = node.meta.get("val")
    vals = val if isinstance(val, list | tuple) else [val]
    return any(isinstance(v, torch.Tensor) for v in vals)


def op_node_names(graph: OpGraph, gm: fx.GraphModule) -> tuple[str, ...]:
    """The FX node name of every OpGraph node: by name when the names line up (static
    capture, `capture_dynamic.export_dynamic`), else by position with targets checked."""
    by_name = {n.name: n for n in gm.graph.nodes}
    if all(op.name in by_name and str(by_name[op.name].target) == op.target for op in graph.nodes):
        return tuple(op.name for op in graph.nodes)
    fx_ops = [n for n in gm.graph.nodes if _is_op_node(n)]
    if len(fx_ops) != len(graph.nodes) or any(
        str(f.target) != op.target for f, op in zip(fx_ops, graph.nodes)
    ):
        raise PlanError(
            f"the program's ops ({len(fx_ops)}) do not line up with the graph's "
            f"({len(graph.nodes)} ops) by name or by position: realize needs the program and "
            "the OpGraph of one export (or capture_dynamic.export_dynamic for dynamic shapes)"
        )
    return tuple(f.name for f in fx_ops)


def _state_of(program: torch.export.ExportedProgram) -> tuple[tuple[str, ...], dict[str, Any]]:
    user: list[str] = []
    state: dict[str, Any] = {}
    for spec in program.graph_signature.input_specs:
        kind = spec.kind.name
        name = spec.arg.name
        if kind == "USER_INPUT":
            user.append(name)
        elif kind == "PARAMETER":
            state[name] = program.state_dict[spec.target]
        elif kind in ("BUFFER", "CONSTANT_TENSOR"):
            src = program.state_dict if spec.target in program.state_dict else program.constants
            state[name] = src[spec.target]
        else:
            raise PlanError(
                f"program input {name} is a {kind}; realize handles user inputs, parameters, "
                "buffers and constant tensors only"
            )
    return tuple(user), state


WRITE = "USER_INPUT_MUTATION"  # an output spec's kind: a user input's new value


def plan_outputs(specs: Sequence[Any]) -> tuple[int, ...]:
    """Which of an exported program's flat outputs (its `output_specs`) a plan returns, in
    the plan's order: the user outputs, then the new value of each user input the program
    updates in place (ProgramParts.outputs)."""
    kinds = [s.kind.name for s in specs]
    users = [i for i, k in enumerate(kinds) if k == "USER_OUTPUT"]
    return (*users, *(i for i, k in enumerate(kinds) if k == WRITE))


def take_apart(captured: Captured, partition: Partition, copies: Copies = ()) -> ProgramParts:
    """Map every FX node of the program onto the partition's groups (see module doc), and
    the ops `copies` recompute (planner.fusion.recompute) onto the groups that copy them."""
    why = check_copies(partition, copies) if copies else None
    if why:
        raise PlanError(f"the plan's recompute is not legal: {why}")
    program = captured.program
    gm = program.graph_module
    names = op_node_names(captured.graph, gm)
    group_of: dict[str, int] = {}
    for i, name in enumerate(names):
        group_of[name] = partition.group_of[i]
    for node in gm.graph.nodes:
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
            parent = node.args[0].name
            if parent in group_of:
                group_of[node.name] = group_of[parent]
    user, state = _state_of(program)
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = list(out_node.args[0]) if isinstance(out_node.args[0], list | tuple) else []
    specs = program.graph_signature.output_specs
    if len(specs) != len(flat):
        raise PlanError("the program's outputs do not match its signature")
    updated = [str(s.target) for s in specs if s.kind.name == "BUFFER_MUTATION"]
    if updated:  # a plan writes new values back into user inputs, not into module state
        more = ", ..." if len(updated) > 3 else ""
        raise PlanError(
            f"the program updates {len(updated)} buffer(s) in place ({', '.join(updated[:3])}"
            f"{more}), as BatchNorm in training mode does; a plan writes updates back into "
            "the call's inputs only, so the program runs as it is"
        )
    # an input updated in place (a static KV cache, a tensor a graph break hands on): its
    # new value is one more output, copied into the input after each call
    order = plan_outputs(specs)
    outputs = tuple(flat[i] for i in order)
    mutated = tuple(user.index(str(specs[i].target)) for i in order if specs[i].kind.name == WRITE)
    by_name = {n.name: n for n in gm.graph.nodes}
    index = {m: g for g, m in enumerate(partition.masks)}
    copied_into: dict[str, tuple[int, ...]] = {}
    for gm_mask, cm in copies:
        for i in bits(cm):
            copied_into[names[i]] = (*copied_into.get(names[i], ()), index[gm_mask])
    gone = frozenset(names[i] for i in bits(dead(partition, copies))) if copies else frozenset()
    return ProgramParts(
        gm, user, state, outputs, group_of, names, by_name, copied_into, gone, mutated
    )


def _fake_of(node: fx.Node) -> Any:
    if "val" not in node.meta:
        raise PlanError(f"node {node.name} carries no fake value (meta['val']); export again")
    return node.meta["val"]


def _sizes_of(v: Any) -> list[Any]:
    if isinstance(v, torch.SymInt):
        return [v]
    if isinstance(v, torch.Tensor):
        return [*v.shape, *v.stride(), v.storage_offset()]
    return []


def _symbol_nodes(gm: fx.GraphModule) -> dict[Any, fx.Node]:
    """Symbol -> the first node of the program whose value is that bare symbol (a
    `sym_size` of a user input)."""
    out: dict[Any, fx.Node] = {}
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
            out.setdefault(val.node.expr, node)
    return out


def _missing_symbols(inputs: list[fx.Node], symbol_nodes: dict[Any, fx.Node]) -> list[fx.Node]:
    """Nodes holding symbols a group's inputs are expressions of that no input binds.

    A compiler binds a symbol from an input's size only where the size is the bare symbol:
    a conv group whose input is [s0, C, ((s1 - 1)//4) + 1, ...] cannot be compiled for
    every s1 (Inductor: "expected [s1] to have been codegen-ed"), so s1 comes in as an
    input of its own, as dynamo passes SymInts to its backends.

    A size input that is an expression (`4*s0`, a reshape's rows) needs its symbols as size
    inputs too, even where a tensor's size binds them: Inductor's FX graph cache writes a
    compiled group's guards over its size inputs alone (dynamo passes every symbol of its
    graph's tensors as one), so a symbol no size input binds is written as the program
    input it was read from (`L['x'].size()[0]`), which the next lookup of the group cannot
    evaluate (`KeyError: 'x'`).
    """
    needed: set[Any] = set()
    bare: set[Any] = set()
    in_ints: set[Any] = set()  # symbols of the size inputs
    bare_ints: set[Any] = set()  # size inputs that are a bare symbol
    for a in inputs:
        val = a.meta.get("val")
        for s in _sizes_of(val):
            if isinstance(s, torch.SymInt):
                expr = s.node.expr
                needed |= expr.free_symbols
                if expr.is_Symbol:
                    bare.add(expr)
        if isinstance(val, torch.SymInt):
            in_ints |= val.node.expr.free_symbols
            if val.node.expr.is_Symbol:
                bare_ints.add(val.node.expr)
    missing = sorted((needed - bare) | (in_ints - bare_ints), key=str)
    return [symbol_nodes[s] for s in missing if s in symbol_nodes and symbol_nodes[s] not in inputs]


def group_graphs(
    parts: ProgramParts, partition: Partition, only: int | None = None
) -> list[GroupGraph]:
    """One subgraph per group (index = the group's index in `partition.groups`), or
    only group `only`'s (a one-element list) when given."""
    members: list[list[fx.Node]] = [[] for _ in partition.groups]
    symbol_nodes = _symbol_nodes(parts.gm)
    for node in parts.gm.graph.nodes:  # program order: copies land before their users
        g = parts.group_of.get(node.name)
        if g is not None and node.name not in parts.dead:
            members[g].append(node)
        for c in parts.copied_into.get(node.name, ()):
            members[c].append(node)
    own_free = _own_free_nodes(parts, members)
    computed = [{n.name for n in nodes} for nodes in members]

    def read_elsewhere(n: fx.Node, g: int) -> bool:
        """Whether a user of `n` (a member of group g) reads it from memory."""
        for u in n.users:
            if u.name not in parts.group_of:
                return True  # the top level: a model output or a free node
            users = [] if u.name in parts.dead else [parts.group_of[u.name]]
            users += parts.copied_into.get(u.name, ())
            if any(h != g and n.name not in computed[h] for h in users):
                return True
        return False

    out: list[GroupGraph] = []
    for g, nodes in enumerate(members):
        if only is not None and g != only:
            continue
        inside = computed[g]
        copies = {n.name for n in nodes if g in parts.copied_into.get(n.name, ())}
        sub = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        inputs: list[fx.Node] = []
        for n in nodes:  # placeholders first: they are the subgraph's arguments
            for a in n.all_input_nodes:
                if a.name not in inside and a not in env:
                    ph = sub.placeholder(a.name)
                    ph.meta = dict(a.meta)
                    env[a] = ph
                    inputs.append(a)
        for a in _missing_symbols(inputs, symbol_nodes):
            ph = sub.placeholder(a.name)
            ph.meta = dict(a.meta)
            inputs.append(a)
        for n in nodes:
            env[n] = sub.node_copy(n, env.__getitem__)
            env[n].meta = dict(n.meta)
        outputs = [
            n
            for n in nodes
            if n.name not in copies and n not in own_free[g] and read_elsewhere(n, g)
        ]
        for n in outputs:
            if not isinstance(n.meta.get("val"), torch.Tensor):
                raise PlanError(
                    f"node {n.name} of group {g} hands a non-tensor value across a group "
                    "boundary; keep it in one group with its users"
                )
        sub.output(tuple(env[n] for n in outputs))
        module = fx.GraphModule(torch.nn.Module(), sub, class_name=f"Group{g}")
        out.append(
            GroupGraph(
                index=g,
                nodes=tuple(sorted(partition.groups[g])),
                module=module,
                inputs=tuple(a.name for a in inputs),
                outputs=tuple(n.name for n in outputs),
                fakes=tuple(_fake_of(a) for a in inputs),
            )
        )
    return out


def _own_free_nodes(parts: ProgramParts, members: list[list[fx.Node]]) -> list[set[fx.Node]]:
    """Per group, the free nodes it reads that are computed from its own values (added to
    `members` in program order): they run inside the group.

    Over a symbolic bucket a size can be read off a tensor a group makes and then be used
    by the same group (MobileViT's unfolding reshapes by `sym_size` of its own view). As a
    free node it would run at the top level before the group (it is the group's input)
    and after it (it reads the group's value): no order of the program does both."""
    memo: dict[str, frozenset[int]] = {}
    position = {n: i for i, n in enumerate(parts.gm.graph.nodes)}
    out: list[set[fx.Node]] = []
    for g, nodes in enumerate(members):
        inside = set(nodes)
        found: set[fx.Node] = set()
        todo = [a for n in nodes for a in n.all_input_nodes if a not in inside]
        while todo:
            a = todo.pop()
            if a in found or a in inside or a.op != "call_function":
                continue
            if a.name in parts.group_of or g not in _deps(parts, a.name, memo):
                continue
            found.add(a)
            todo.extend(a.all_input_nodes)
        if found:
            members[g] = sorted(inside | found, key=position.__getitem__)
        out.append(found)
    return out


def user_input_fakes(parts: ProgramParts) -> tuple[Any, ...]:
    by_name = {n.name: n for n in parts.gm.graph.nodes if n.op == "placeholder"}
    return tuple(_fake_of(by_name[name]) for name in parts.user_inputs)


def _deps(parts: ProgramParts, name: str, memo: dict[str, frozenset[int]]) -> frozenset[int]:
    """Groups whose outputs the value `name` needs (through free nodes)."""
    if name in memo:
        return memo[name]
    g = parts.group_of.get(name)
    if g is not None:
        memo[name] = frozenset((g,))
        return memo[name]
    node = parts.by_name.get(name)
    out: frozenset[int] = frozenset()
    if node is not None and node.op != "placeholder":
        for a in node.all_input_nodes:
            out |= _deps(parts, a.name, memo)
    memo[name] = out
    return out


def group_order(parts: ProgramParts, groups: list[GroupGraph]) -> tuple[int, ...]:
    """An executable order of the groups, counting dependencies through free nodes."""
    memo: dict[str, frozenset[int]] = {}
    deps = [set().union(*(_deps(parts, a, memo) for a in gg.inputs)) - {gg.index} for gg in groups]
    done: list[int] = []
    left = set(range(len(groups)))
    while left:
        ready = sorted(g for g in left if deps[g] <= set(done))
        if not ready:
            raise PlanError(
                f"groups {sorted(left)[:10]} depend on each other in a cycle: the partition is "
                "not legal (a group must be convex and the graph of groups acyclic)"
            )
        done.append(ready[0])
        left.remove(ready[0])
    return tuple(done)


def build_top(
    parts: ProgramParts,
    calls: list[tuple[tuple[str, ...], tuple[str, ...]]],
    order: tuple[int, ...],
    runners: list[Any],
    extra_state: dict[str, torch.Tensor],
) -> fx.GraphModule:
    """The top-level program: user inputs -> group calls in `order` -> user outputs.

    `runners[g]` is called with the values named `calls[g][0]` and returns those named
    `calls[g][1]`. State
    (parameters, buffers, constants, and `extra_state` such as concatenated weights) is
    held by the returned module; free nodes (symbolic sizes) run here, when needed.
    """
    root = torch.nn.Module()
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    by_name = parts.by_name
    for name in parts.user_inputs:
        env[name] = g.placeholder(name)
    state = {**parts.state, **extra_state}

    def value(name: str) -> fx.Node:
        if name in env:
            return env[name]
        if name in state:
            attr = f"state_{len(root._buffers)}"
            root.register_buffer(attr, state[name])
            env[name] = g.get_attr(attr)
            return env[name]
        node = by_name.get(name)
        if node is None or node.op == "placeholder" or name in parts.group_of:
            raise PlanError(f"value {name} is needed before it is produced (group order)")
        env[name] = g.node_copy(node, lambda a: value(a.name))
        return env[name]

    for gi in order:
        ins, outs_g = calls[gi]
        if not outs_g:  # every op of the group is recomputed where it is needed
            continue
        call = g.call_function(runners[gi], tuple(value(a) for a in ins))
        for j, out in enumerate(outs_g):
            env[out] = g.call_function(operator.getitem, (call, j))
    outs = tuple(value(v.name) if isinstance(v, fx.Node) else v for v in parts.outputs)
    g.output(outs)
    return fx.GraphModule(root, g, class_name="RealizedPlanTop")


def device_of(parts: ProgramParts, captured: Captured, device: Any) -> torch.device:
    """The device the program runs on; PlanError when its tensors are on another one.

    A 0-dim CPU tensor among the program's constants (a scalar the model builds with
    `torch.tensor(x)` in forward, lifted by export) is a scalar every device's ops take,
    so it does not count.
    """
    tensors = [t for t in captured.example_inputs if isinstance(t, torch.Tensor)]
    tensors += [t for t in parts.state.values() if not _cpu_scalar(t)]
    found = {t.device.type for t in tensors}
    if "meta" in found or captured.planning_only:
        raise PlanError(
            "the captured program holds meta tensors (captured for planning only): export "
            "the model with real parameters on the device it will run on to realize it"
        )
    dev = torch.device(device) if device is not None else (tensors[0].device if tensors else None)
    if dev is None:
        return torch.device("cpu")
    if len(found) > 1:
        raise PlanError(
            f"the program holds tensors on {sorted(found)} (inputs or constants the model "
            "makes on another device than its parameters'); a plan runs on one device"
        )
    if any(t.device.type != dev.type for t in tensors):
        raise PlanError(
            f"realize on {dev} but the program was exported on {sorted(found)}: export the "
            "model on the device it will run on (shapes and kernels depend on it)"
        )
    return dev


def _cpu_scalar(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dim() == 0
