"""Export with symbolic dimensions, so one realization serves a whole shape bucket.

    captured = export_dynamic(model, inputs, dims={0: {0: (1, 64), 1: (128, 512)}})
    realized = realize(captured, plan)     # compiled once, runs any shape in the ranges

Plans are made on a static capture at a representative shape (the inputs given here);
`Captured.graph` is that static OpGraph and `Captured.program` the dynamic program.
Realization finds each group's FX nodes by name, so the dynamic program's op nodes are
renamed to the static capture's names (tracing with symbolic sizes inserts size
arithmetic whose names shift the others: the static `add` may come out as `add_89`).

Why named `torch.export.Dim`s with min >= 2: export specializes sizes 0 and 1, so a
range starting at 1 is exported from 2 (realize's input guard then refuses size 1 with a
clear error, and the caller realizes that shape statically). If the model forces a dim
to be static, the named Dims fail to export and `Dim.AUTO` with the same bounds is tried,
which lets export keep what it can symbolic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.experimental.symbolic_shapes import statically_known_true

from planner.errors import CaptureError
from planner.ir.capture import Captured, _as_args, _drop_identities, _quiet_torch, export_model
from planner.realize.graph import _is_op_node

DimRanges = Mapping[int, Mapping[int, tuple[int, int]]]


def _symbolic_low(lo: int, hi: int) -> int | None:
    """The lowest size an axis ranging over [lo, hi] is exported symbolic from (export
    specializes sizes 0 and 1), or None where the axis stays static."""
    low = max(int(lo), 2)
    return low if hi > low else None


def _dynamic_shapes(args: tuple[Any, ...], dims: DimRanges, auto: bool) -> tuple[Any, ...]:
    specs: list[Any] = []
    for i, a in enumerate(args):
        spec: dict[int, Any] = {}
        for axis, (lo, hi) in dict(dims.get(i, {})).items():
            if not isinstance(a, torch.Tensor) or not 0 <= axis < a.dim():
                raise CaptureError(f"dims names input {i} axis {axis}, which the input lacks")
            size = int(a.shape[axis])
            if not lo <= size <= hi:
                raise CaptureError(
                    f"input {i} axis {axis} has size {size}, outside its range [{lo}, {hi}]: "
                    "export at a shape inside the bucket (its representative)"
                )
            lo2 = _symbolic_low(lo, hi)
            if lo2 is None:
                continue  # a single size (or sizes 0/1 only): static
            if auto:
                spec[axis] = torch.export.Dim.AUTO(min=lo2, max=int(hi))
            else:
                spec[axis] = torch.export.Dim(f"in{i}_d{axis}", min=lo2, max=int(hi))
        specs.append(spec or None)
    return tuple(specs)


def _same(a: Any, b: Any) -> bool:
    """Whether two sizes (ints or SymInts) are equal for every value in the ranges."""
    try:
        return bool(statically_known_true(a == b))
    except Exception:  # an expression the shape environment cannot decide
        return False


def _identity_view(node: fx.Node) -> bool:
    """A `slice` whose result is its input over the whole range: same sizes, strides and
    offset (e.g. `rel[:q.size(-2), :k.size(-2)]` of an S x S tensor)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor:
        return False
    src = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    out = node.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    pairs = [
        *zip(src.shape, out.shape),
        *zip(src.stride(), out.stride()),
        (src.storage_offset(), out.storage_offset()),
    ]
    return src.dim() == out.dim() and all(_same(a, b) for a, b in pairs)


def _drop_unmatched_identity_views(program: torch.export.ExportedProgram, static: Captured) -> None:
    """Remove the identity slices (`_identity_view`) that the static capture has no op for,
    so the two line up: a static export drops some such slices (DeBERTa's relative
    positions) and keeps others (a KV cache's), while with symbolic sizes they can stay.
    The ops are walked in order against the static capture's; where they cannot be lined
    up this way nothing is removed (`_rename_like` then says so). Program outputs stay."""
    gm = program.graph_module
    ops = [n for n in gm.graph.nodes if _is_op_node(n)]
    targets = [op.target for op in static.graph.nodes]
    if len(ops) <= len(targets):
        return
    out = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = set(pytree.tree_leaves(out.args))
    dropped, j = [], 0
    for node in ops:
        if j < len(targets) and str(node.target) == targets[j]:
            j += 1
        elif node not in outputs and _identity_view(node):
            dropped.append(node)
        else:
            return
    if j != len(targets):
        return
    for node in dropped:
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
    gm.recompile()


def _rename_like(program: torch.export.ExportedProgram, static: Captured) -> None:
    """Give the dynamic program's op nodes the static capture's names (in place)."""
    gm = program.graph_module
    ops = [n for n in gm.graph.nodes if _is_op_node(n)]
    names = [op.name for op in static.graph.nodes]
    if len(ops) != len(names) or any(
        str(n.target) != op.target for n, op in zip(ops, static.graph.nodes)
    ):
        raise CaptureError(
            f"the dynamic export has {len(ops)} ops that do not line up with the static "
            f"capture's {len(names)}: the model traces differently with symbolic sizes"
        )
    wanted = set(names)
    taken = {n.name for n in gm.graph.nodes}
    by_name = {n.name: n for n in gm.graph.nodes}
    outputs = [
        (spec.arg, by_name[spec.arg.name])
        for spec in program.graph_signature.output_specs
        if getattr(spec.arg, "name", None) in by_name
    ]

    def assign(node: fx.Node, name: str) -> None:
        node.name = name
        rename = getattr(gm.graph._graph_namespace, "_rename_object", None)
        if rename is not None:
            rename(node, name)

    # other nodes holding a name an op will take move aside first
    for node in gm.graph.nodes:
        if node.name in wanted and node not in ops:
            k = 0
            while f"sym_{node.name}_{k}" in taken:
                k += 1
            taken.add(f"sym_{node.name}_{k}")
            assign(node, f"sym_{node.name}_{k}")
    for node in ops:  # two steps, so no two ops ever hold one name
        assign(node, f"__renaming_{node.name}")
    for node, name in zip(ops, names):
        assign(node, name)
    for arg, node in outputs:
        arg.name = node.name
    gm.recompile()


def _read_symbols(program: torch.export.ExportedProgram) -> None:
    """Give every symbolic size of a user input a `sym_size` node of its own (in place).

    Realization passes a group the symbols its input sizes are expressions of
    (planner.realize.graph), reading each from the node that holds it; export only makes
    such nodes for the sizes the model reads itself.
    """
    gm = program.graph_module
    have = {
        n.meta["val"].node.expr
        for n in gm.graph.nodes
        if isinstance(n.meta.get("val"), torch.SymInt) and n.meta["val"].node.expr.is_Symbol
    }
    users = {s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not placeholders:
        return
    anchor = placeholders[-1]
    for ph in placeholders:
        val = ph.meta.get("val")
        if ph.name not in users or not isinstance(val, torch.Tensor):
            continue
        for axis, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt) or not size.node.expr.is_Symbol:
                continue
            if size.node.expr in have:
                continue
            have.add(size.node.expr)
            with gm.graph.inserting_after(anchor):
                node = gm.graph.call_function(torch.ops.aten.sym_size.int, (ph, axis))
            node.meta["val"] = size
            anchor = node
    gm.recompile()


def export_dynamic(
    module: torch.nn.Module,
    inputs: Any,
    dims: DimRanges,
    *,
    name: str = "",
    meta: dict[str, Any] | None = None,
) -> Captured:
    """Export `module` with input `i`'s axis `a` symbolic over `dims[i][a] = (min, max)`.

    Returns Captured(static OpGraph at `inputs`' shapes, dynamic aten program, inputs).
    """
    args = _as_args(inputs)
    static = export_model(module, args, name=name, meta=meta)
    program = None
    errors: list[str] = []
    for auto in (False, True):
        try:
            with _quiet_torch():
                exported = torch.export.export(
                    module, args, dynamic_shapes=_dynamic_shapes(args, dims, auto), strict=False
                )
                program = exported.run_decompositions({})
            break
        except CaptureError:
            raise
        except Exception as e:  # torch raises many types; named Dims fail on specialization
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            errors.append(f"{type(e).__name__}: {first[:200]}")
    if program is None:
        raise CaptureError(
            f"torch.export could not trace {type(module).__name__} with dynamic dims {dict(dims)} "
            f"({'; '.join(errors)}). Realize per shape (planner.ir.capture.export_model) instead."
        )
    _drop_identities(program)  # as export_model does, so the names line up with `static`
    try:
        _drop_unmatched_identity_views(program, static)
        _rename_like(program, static)
    except CaptureError as e:
        # At the edge of a range an op may be an identity (`pos[:, :S]` at S = the table's
        # length) that the static export drops and the symbolic one keeps: capture the
        # static graph one step inside the range instead, where such ops are real.
        inner = one_step_inside(args, dims)
        if inner is None:
            raise
        try:
            static = export_model(module, inner, name=name, meta=meta)
        except Exception:  # the model does not run there: the line-up failure stands
            raise e from None
        _drop_unmatched_identity_views(program, static)
        _rename_like(program, static)
    _read_symbols(program)
    return Captured(static.graph, program, args)


def one_step_inside(args: tuple[Any, ...], dims: DimRanges) -> tuple[Any, ...] | None:
    """`args` with each symbolic axis one size away from the edge it sits on (one
    smaller, or one larger at the range's low end: the tensor narrowed, or grown by
    repeating its first slice, so the values stay the caller's); None when no axis
    moves."""
    out, moved = list(args), False
    for i, axes in dims.items():
        t = out[i]
        for axis, (lo, hi) in dict(axes).items():
            n = int(t.shape[axis])
            lo2 = _symbolic_low(lo, hi)
            if lo2 is None:
                continue  # static (see _dynamic_shapes)
            if n - 1 >= lo2:
                t = t.narrow(axis, 0, n - 1)
            elif n + 1 <= hi:
                t = torch.cat([t, t.narrow(axis, 0, 1)], axis)
            else:
                continue
            moved = True
        out[i] = t
    return tuple(out) if moved else None
