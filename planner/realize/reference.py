"""The higher-precision reference a realized plan is judged against (planner.realize.check).

    high = run_in_high_precision(gm, args, torch.bfloat16)   # the eager program in fp64
    bad = compare_outputs(eager_outs, plan_outs, torch.bfloat16, high=high.values)

The exported aten program (or one group's subgraph) runs under an FX interpreter on the
same device, with floating inputs, parameters and dtype arguments raised to fp64; an op
without an fp64 kernel runs lower and is named. No reference at all (an fp64 model, a
program that cannot run) leaves the decision to realize_check's fixed table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from planner.errors import first_line

REFERENCE_DTYPE = torch.float64


def _dtype(d: torch.dtype | str | None) -> torch.dtype | None:
    if d is None or isinstance(d, torch.dtype):
        return d
    return getattr(torch, str(d).removeprefix("torch."), None)


@dataclass(frozen=True)
class HighRun:
    """A program's outputs in higher precision. `values` None: no reference (see `note`)."""

    values: list[Any] | None
    dtype: torch.dtype | None
    note: str = ""  # ops that ran in a lower precision, or why there is no reference

    def describe(self) -> str:
        if self.values is None:
            return f"fixed tolerances ({self.note})"
        name = str(self.dtype).removeprefix("torch.")
        return f"{name} reference" + (f" ({self.note})" if self.note else "")


def reference_dtype(model_dtype: torch.dtype | str | None) -> torch.dtype | None:
    """The precision to check a model of `model_dtype` against; None for fp64 models."""
    d = _dtype(model_dtype) or torch.float32
    if not d.is_floating_point or torch.finfo(d).bits >= torch.finfo(REFERENCE_DTYPE).bits:
        return None
    return REFERENCE_DTYPE


# Ops whose dtype argument is not a precision: a bitcast keeps the bits.
_KEEP_DTYPE = ("aten.view.dtype",)
# Views the higher precision's layouts may not allow: a kernel of another precision can
# lay its result out differently (on CUDA, SDPA's bf16 kernels return [B, S, H, D]-strided
# outputs and its fp64 math path contiguous ones), so a `view` that the program traced
# against the first layout is taken as the `reshape` it stands for (the same values).
_VIEWS = ("aten.view.default", "aten._unsafe_view.default")


def _lift(x: Any, dtype: torch.dtype) -> Any:
    """Floating tensors and floating dtype arguments in `x` raised to `dtype`."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() and x.dtype != dtype else x
    if isinstance(x, torch.dtype):
        return dtype if x.is_floating_point else x
    if isinstance(x, list | tuple):
        return _rebuild(x, [_lift(v, dtype) for v in x])
    if isinstance(x, dict):
        return {k: _lift(v, dtype) for k, v in x.items()}
    return x


def _rebuild(x: list | tuple, items: list[Any]) -> Any:
    """`items` in the container type of `x` (list, tuple, or torch's return types)."""
    if type(x) in (list, tuple):
        return type(x)(items)
    try:
        return type(x)(items)
    except TypeError:  # a namedtuple takes its fields one by one
        return type(x)(*items)


def _as_exported(x: Any, fake: Any) -> Any:
    """Floating tensors of `x` cast back to the dtype export traced for them (`fake`)."""
    if isinstance(x, torch.Tensor) and isinstance(fake, torch.Tensor):
        return x.to(fake.dtype) if x.is_floating_point() and fake.is_floating_point() else x
    if isinstance(x, list | tuple) and isinstance(fake, list | tuple) and len(x) == len(fake):
        return _rebuild(x, [_as_exported(v, f) for v, f in zip(x, fake)])
    if isinstance(x, dict) and isinstance(fake, dict):
        return {k: _as_exported(v, fake.get(k)) for k, v in x.items()}
    return x


class _HighPrecision(fx.Interpreter):
    """Runs an aten graph with floating values and dtype arguments raised to `dtype`. An
    op that cannot run there runs in fp32, else in the dtypes export traced; its results
    are raised again and the op is named in `lowered`."""

    def __init__(self, gm: fx.GraphModule, dtype: torch.dtype):
        super().__init__(gm)
        self.dtype = dtype
        self.lowered: dict[str, str] = {}
        self.node: fx.Node | None = None  # the node being run (named when one fails)

    def run_node(self, n: fx.Node) -> Any:
        self.node = n
        if n.op != "call_function":
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        fn = n.target
        rungs = [self.dtype] + ([torch.float32] if self.dtype != torch.float32 else []) + [None]
        err: Exception | None = None
        for rung in rungs:
            try:
                if rung is None:
                    fakes = fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta.get("val"))
                    a, k = _as_exported((args, kwargs), fakes)
                elif str(fn) in _KEEP_DTYPE:
                    a, k = args, kwargs
                else:
                    a, k = _lift((args, kwargs), rung)
                try:
                    out = fn(*a, **k)
                except RuntimeError:
                    if str(fn) not in _VIEWS:
                        raise
                    out = torch.ops.aten.reshape.default(*a, **k)
            except Exception as e:  # not supported in this precision: try the next
                err = e
                continue
            if rung is not self.dtype:
                self.lowered[str(fn)] = "as exported" if rung is None else str(rung)[6:]
                out = _lift(out, self.dtype)
            return out
        assert err is not None
        raise err


def run_in_high_precision(
    gm: fx.GraphModule,
    args: Sequence[Any],
    model_dtype: torch.dtype | str | None,
    dtype: torch.dtype | None = None,
) -> HighRun:
    """Run the aten program `gm` on `args` (its placeholders in order: parameters and
    inputs in the model's precision) in `dtype` (default `reference_dtype(model_dtype)`):
    floating inputs and parameters upcast on their device, integer and bool inputs
    unchanged, float casts and factory dtypes inside the program raised too (a cast to
    bf16 would otherwise round the reference). Ops without support for that precision
    run lower (noted). Never raises: a program that cannot run gives no reference (the
    fixed table then decides)."""
    dtype = dtype or reference_dtype(model_dtype)
    if dtype is None:
        return HighRun(None, None, f"no precision above {model_dtype}")
    interp = _HighPrecision(gm, dtype)
    try:
        with torch.no_grad():
            out = interp.run(*args)
    except Exception as e:  # the reference is a check's aid: its absence is not an error
        n = interp.node
        where = f" at {n.name} ({n.target})" if n is not None else ""
        msg = first_line(e, 160)
        return HighRun(
            None, None, f"the program fails in {dtype}{where}: {type(e).__name__}: {msg}"
        )
    values = list(out) if isinstance(out, list | tuple) else [out]
    lowered = interp.lowered
    note = ""
    if lowered:
        names = ", ".join(f"{k.removeprefix('aten.')} in {v}" for k, v in sorted(lowered.items()))
        note = f"{len(lowered)} op(s) ran lower: {names}"
        note = note if len(note) <= 160 else note[:157] + "..."
    return HighRun(values, dtype, note)


def run_module_in_high_precision(
    module: torch.nn.Module, args: Sequence[Any], model_dtype: torch.dtype | str | None
) -> HighRun:
    """`module` on `args` with floating parameters, buffers and inputs upcast to
    `reference_dtype(model_dtype)` (fp32 if that fails); outputs flattened to leaves. For
    callers without an exported program; float casts written in forward() stay as they are."""
    first = reference_dtype(model_dtype)
    if first is None:
        return HighRun(None, None, f"no precision above {model_dtype}")
    why = ""
    for dtype in dict.fromkeys([first, torch.float32]):
        if _dtype(model_dtype) == dtype:
            break
        state = {
            k: _lift(v, dtype) for k, v in [*module.named_parameters(), *module.named_buffers()]
        }
        try:
            with torch.no_grad():
                out = torch.func.functional_call(module, state, tuple(_lift(list(args), dtype)))
        except Exception as e:  # try a lower precision, then none
            why = f"the module fails in {dtype}: {type(e).__name__}"
            continue
        return HighRun(pytree.tree_leaves(out), dtype, "" if dtype == first else why)
    return HighRun(None, None, why or f"no precision above {model_dtype}")
