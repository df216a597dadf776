"""Layouts across group boundaries: let each group hand on the layout it computes in.

Eager fixes every tensor's strides; a fused kernel may compute the same values in another
layout: a concatenated GEMM's outputs are column slices of one wide result, SDPA returns
its output laid out as (B, S, H, Dh). Copying such values back to eager's layout at every
boundary costs a pass over memory per copy (on the H100 at B=32, S=512, D=1024 three of
them cost more than the attention group saved). Instead, realize propagates layouts:

- groups are prepared in execution order; each consumer is traced (fake tensors) with the
  layouts its producers really hand it, and Inductor compiles it for those strides;
- where a consumer cannot take a layout (an `aten.view` that needs eager's strides, a
  layout-dependent op such as `as_strided`), that input is made dense in eager's dimension
  order inside the consumer, which is the one copy eager's layout would have cost anyway;
- in a group that runs eagerly, a `clone(memory_format=contiguous)` (what export makes of
  `.contiguous()`) becomes `aten.contiguous` again, which copies only when the value is not
  contiguous already: after SDPA, whose output is contiguous once transposed back, the
  copy goes;
- the program's user outputs are given eager's strides again, so callers see what the
  model returns.

All of this works on fake tensors from export, static or symbolic; concrete strides, where
a real tensor must be made in a predicted layout (checks, fallbacks), are evaluated at the
sizes of the call (`bindings`).
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from planner.errors import PlanError
from planner.ir import taxonomy
from planner.ir.graph import Category

aten = torch.ops.aten

# ops whose result depends on the input's strides, not only its values
LAYOUT_DEPENDENT = frozenset(
    {
        "aten.as_strided.default",
        "aten.as_strided_copy.default",
        "aten.as_strided_scatter.default",
        "aten.view.dtype",
    }
)


def same_strides(a: Any, b: Any) -> bool:
    return [str(s) for s in a.stride()] == [str(s) for s in b.stride()]


def padded_of(shape: Sequence[int], strides: Sequence[int], planned: Sequence[int]) -> bool:
    """Whether `strides` lay a tensor of `shape` out in the same dimension order as the
    `planned` strides, with the same innermost stride, only with gaps between rows: the
    layout of a view into a larger buffer whose rows were padded (Inductor's padding of
    GEMM outputs writes this). Size-1 dimensions are ignored."""
    dims = [d for d in range(len(shape)) if shape[d] > 1]
    if not dims:
        return True
    order = sorted(dims, key=lambda d: (-planned[d], d))
    if order != sorted(dims, key=lambda d: (-strides[d], d)):
        return False
    inner = order[-1]
    if strides[inner] != planned[inner]:
        return False
    return all(strides[outer] >= strides[d] * shape[d] for outer, d in itertools.pairwise(order))


def _shape_text(val: Any) -> str | None:
    return str(tuple(val.shape)) if isinstance(val, torch.Tensor) else None


def propagate(gm: fx.GraphModule, fakes: Sequence[Any], fake_mode: Any) -> list[Any]:
    """Fake values through `gm` (node.meta['val'] updated); the output fakes.

    Runs as export traces: through the Python dispatcher, so a composite op (`matmul`)
    takes its Python decomposition, which keeps symbolic sizes symbolic. The shape
    environment records no guard meanwhile, and a node whose sizes come out other than
    they were (a kernel that read a symbolic size as a number) raises PlanError: the
    program's symbols are never specialized to the sizes it was exported at."""
    vals = {n: n.meta["val"] for n in gm.graph.nodes if "val" in n.meta}
    env = getattr(fake_mode, "shape_env", None)
    quiet = env.suppress_guards() if env is not None else contextlib.nullcontext()
    try:
        with quiet, enable_python_dispatcher():
            outs = FakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*fakes)
        for n, val in vals.items():
            was, now = _shape_text(val), _shape_text(n.meta.get("val"))
            if was is not None and now is not None and now != was:
                raise PlanError(
                    f"{n.name} ({n.target}) comes out of fake propagation with sizes {now} "
                    f"where the program has {was}"
                )
    except Exception:  # the graph keeps the values it had
        for n, val in vals.items():
            n.meta["val"] = val
        raise
    return list(outs) if isinstance(outs, list | tuple) else [outs]


def layout_dependent(gm: fx.GraphModule) -> bool:
    return any(
        n.op == "call_function" and str(n.target) in LAYOUT_DEPENDENT for n in gm.graph.nodes
    )


def _hint(s: Any) -> int:
    if isinstance(s, int):
        return s
    node = getattr(s, "node", None)
    hint = getattr(node, "hint", None) if node is not None else None
    return int(hint) if hint is not None else 1


def stride_order(fake: Any) -> list[int]:
    """Dimensions from outermost to innermost in `fake`'s layout (size-1 dims stay put)."""
    strides = [_hint(s) for s in fake.stride()]
    return sorted(range(fake.dim()), key=lambda d: (-strides[d], d))


def _call(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return op(*args, **kwargs)


def _dense_in_order(x: Any, order: Sequence[int], call: Any = _call) -> Any:
    """x made dense with dimensions laid out outermost-to-innermost as `order` says: run
    on a tensor, or, with `call=graph.call_function`, written into an FX graph."""
    contiguous = {"memory_format": torch.contiguous_format}
    if list(order) == list(range(len(order))):
        return call(aten.clone.default, (x,), contiguous)
    inverse = [0] * len(order)
    for i, d in enumerate(order):
        inverse[d] = i
    y = call(aten.clone.default, (call(aten.permute.default, (x, list(order)), {}),), contiguous)
    return call(aten.permute.default, (y, inverse), {})


def _insert_to_layout(gm: fx.GraphModule, ph: fx.Node, order: list[int]) -> None:
    """Make placeholder `ph` dense in `order` before any of its users reads it."""
    g = gm.graph
    users = list(ph.users)
    last = next(n for n in reversed(g.nodes) if n.op == "placeholder")
    with g.inserting_after(last):
        new = _dense_in_order(ph, order, g.call_function)
    for u in users:
        u.replace_input_with(ph, new)


def adapt_inputs(
    gm: fx.GraphModule, fakes: Sequence[Any], eager_fakes: Sequence[Any], fake_mode: Any
) -> tuple[list[Any], list[str]]:
    """Make `gm` (changed in place) accept inputs laid out as `fakes`, where eager had
    `eager_fakes`: as it is when it traces with them and holds no layout-dependent op, else
    with the differing inputs made dense in eager's order first. Returns the output fakes
    and the names of the inputs given a copy."""
    differ = [
        i
        for i, (a, e) in enumerate(zip(fakes, eager_fakes))
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and not same_strides(a, e)
    ]
    if differ and not layout_dependent(gm):
        try:
            return propagate(gm, fakes, fake_mode), []
        except Exception:  # a view that needs eager's strides: copy those inputs below
            pass
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    copied = []
    for i in differ:
        _insert_to_layout(gm, placeholders[i], stride_order(eager_fakes[i]))
        copied.append(placeholders[i].target)
    gm.recompile()
    try:
        return propagate(gm, fakes, fake_mode), copied
    except Exception as e:
        raise PlanError(
            f"group does not trace with its producers' layouts even after copying "
            f"{copied}: {type(e).__name__}: {str(e)[:200]}"
        ) from e


def drop_empty_cat_inputs(gm: fx.GraphModule) -> bool:
    """Rewrite `cat`s that have empty 1-D inputs, in place: cat skips those (a legacy rule),
    and a cat left with one input is a contiguous copy of it. Returns whether any changed.

    A KV cache that starts empty (transformers' `DynamicLayer` holds `torch.tensor([])`
    until its first update) appends with `torch.cat([empty, k], -2)`. Eager returns a
    contiguous copy; Inductor drops the empty input and returns `k` in its own (transposed)
    layout, so a group realized with it would not give the layout its consumers were
    compiled for. As a `clone` to the contiguous format, every realization agrees. The
    node keeps its name (the group's outputs name it)."""
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.cat.default:
            continue
        out, inputs = node.meta.get("val"), list(node.args[0])
        kept = [a for a in inputs if not _empty_1d(a)]
        if len(kept) == len(inputs) or not kept or not isinstance(out, torch.Tensor):
            continue
        if len(kept) > 1:
            node.args = (kept, *node.args[1:])
        else:
            val = kept[0].meta.get("val") if isinstance(kept[0], fx.Node) else None
            same = isinstance(val, torch.Tensor) and val.dtype == out.dtype
            if not (same and tuple(val.shape) == tuple(out.shape) and out.is_contiguous()):
                continue
            node.target = aten.clone.default
            node.args = (kept[0],)
            node.kwargs = {"memory_format": torch.contiguous_format}
        changed = True
    if changed:
        gm.recompile()
    return changed


def _empty_1d(arg: Any) -> bool:
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return (
        isinstance(val, torch.Tensor)
        and val.dim() == 1
        and isinstance(val.shape[0], int)
        and val.shape[0] == 0
    )


def clones_to_contiguous(gm: fx.GraphModule, protected: Iterable[str]) -> list[str]:
    """In a group that runs eagerly, turn each `clone(memory_format=contiguous)` into
    `aten.contiguous`: the same values, copied only when the input is not already
    contiguous (see the module doc), decided at run time, so a layout the fake tensors
    predicted wrongly costs a copy, never a wrong answer. A clone that a user output of the
    program is (or views) stays: the caller must not get an alias of another value.
    Returns the changed nodes' names."""
    keep = set(protected)
    changed = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.clone.default:
            continue
        if node.kwargs.get("memory_format") is not torch.contiguous_format:
            continue
        if node.name in keep or _viewed_into(node, keep):
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(aten.contiguous.default, (node.args[0],))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        changed.append(node.name)
    if changed:
        gm.recompile()
    return changed


def _viewed_into(node: fx.Node, names: set[str]) -> bool:
    """Whether a value named in `names` is `node` seen through views or getitem."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        if n.name in names:
            return True
        for u in n.users:
            if u in seen or u.op != "call_function":
                continue
            rule = taxonomy.lookup(str(u.target))
            if u.target is operator.getitem or (
                rule is not None and rule.category is Category.VIEW
            ):
                seen.add(u)
                todo.append(u)
    return False


# ---- concrete layouts at run time -----------------------------------------------------
def bindings(fakes: Sequence[Any], tensors: Sequence[Any]) -> dict[Any, int]:
    """Symbol -> size, from the symbolic dims of `fakes` that are a bare symbol."""
    out: dict[Any, int] = {}
    for f, t in zip(fakes, tensors):
        if not isinstance(f, torch.Tensor) or not isinstance(t, torch.Tensor):
            continue
        for s, v in zip(f.shape, t.shape):
            expr = getattr(getattr(s, "node", None), "expr", None)
            if expr is not None and getattr(expr, "is_Symbol", False):
                out[expr] = int(v)
    return out


def _concrete(v: Any, bound: dict[Any, int]) -> int:
    if isinstance(v, int):
        return v
    expr = v.node.expr
    got = expr.xreplace(bound) if bound else expr
    if not getattr(got, "is_number", False):
        return _hint(v)
    return int(got)


def concrete_layout(fake: Any, bound: dict[Any, int]) -> tuple[list[int], list[int]]:
    return (
        [_concrete(s, bound) for s in fake.shape],
        [_concrete(s, bound) for s in fake.stride()],
    )


def as_layout(t: Any, fake: Any, bound: dict[Any, int]) -> Any:
    """`t`'s values in the layout `fake` predicts (t itself when it already has it)."""
    if not isinstance(t, torch.Tensor) or not isinstance(fake, torch.Tensor):
        return t
    shape, stride = concrete_layout(fake, bound)
    if list(t.shape) != shape:
        raise PlanError(f"shape {tuple(t.shape)} where the plan expects {tuple(shape)}")
    if list(t.stride()) == stride or t.numel() <= 1:
        return t
    out = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def to_order(t: Any, order: Sequence[int]) -> Any:
    """`t` dense in `order` unless it is already laid out so (run time, any shapes)."""
    if not isinstance(t, torch.Tensor) or t.numel() <= 1:
        return t
    if list(order) == list(range(t.dim())):
        return t.contiguous()
    if t.permute(list(order)).is_contiguous():
        return t
    return _dense_in_order(t, order)


def in_planned_layout(
    fn: Callable[..., Any], strides: Mapping[int, Sequence[int]]
) -> Callable[..., Any]:
    """`fn` (a group's kernels) with outputs `strides` names copied into those strides
    where its kernels lay them out otherwise: the layout the plan's consumers, and the
    caller, were promised."""

    def run(*args: Any) -> tuple[Any, ...]:
        outs = list(fn(*args))
        for j, st in strides.items():
            o = outs[j]
            if list(o.stride()) != list(st):
                t = torch.empty_strided(o.shape, tuple(st), dtype=o.dtype, device=o.device)
                outs[j] = t.copy_(o)
        return tuple(outs)

    return run
