"""One group as an executable unit: rewrite (SDPA, concatenated GEMM), compile, fall back.

`prepare_unit` turns a group's subgraph (planner.realize.graph.GroupGraph) into a
`GroupUnit` whose `run(*call_inputs)` returns the group's boundary outputs. The call
signature is fixed when the unit is made (the group's inputs, then any tensors a rewrite
added, e.g. concatenated weights), so a unit can fall back to eager later without the
top-level program changing.
"""

from __future__ import annotations

import functools
import logging
import operator
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

import planner.realize.conv_layout as conv_layout
import planner.realize.kernels as patterns
import planner.realize.library_attention as library_attention
from planner.errors import PlanError
from planner.fusion.realization import split_label
from planner.ir import taxonomy
from planner.ir.graph import Category, OpGraph
from planner.realize.compilers import SharedCompiles
from planner.realize.derived import Recipe, derive
from planner.realize.graph import GroupGraph, ProgramParts
from planner.realize.layout import (
    as_layout,
    bindings,
    drop_empty_cat_inputs,
    propagate,
    same_strides,
)
from planner.realize.lean import lean_entry, with_lean_path

log = logging.getLogger(__name__)

aten = torch.ops.aten

# Inductor's options per compile mode of a label (planner.fusion.realization.MODES):
# "autotune" benchmarks Triton GEMM/convolution templates against the library call and
# fuses the epilogue into the template that wins (Inductor's max-autotune for GEMMs).
MODE_OPTIONS: dict[str, dict[str, Any]] = {
    "autotune": {
        "config_patches": {"max_autotune": True, "max_autotune_gemm": True, "epilogue_fusion": True}
    },
}


def fake_mode_of(parts: ProgramParts) -> Any:
    """The fake mode (and shape environment) export traced the program in."""
    for node in parts.gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch._subclasses.fake_tensor.FakeTensor):
            return val.fake_mode
    raise PlanError("the program carries no fake tensors (meta['val']); export it again")


def work_ops(gm: fx.GraphModule) -> int:
    """Ops of a subgraph that do work (not views, not getitem)."""
    n = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        rule = taxonomy.lookup(str(node.target))
        if rule is None or rule.category is not Category.VIEW:
            n += 1
    return n


def _clone(gm: fx.GraphModule) -> fx.GraphModule:
    g = fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    return fx.GraphModule(torch.nn.Module(), g, class_name=type(gm).__name__)


def _settle_layout(
    gm: fx.GraphModule,
    fakes: Sequence[Any],
    fake_mode: Any,
    want: Sequence[Any],
    replaced: Sequence[tuple[fx.Node, Any]],
) -> None:
    """Propagate fake values through a rewritten subgraph (so it is known to trace) and
    make each boundary output keep the layout the rest of the plan was compiled for.

    A fused kernel may lay its result out differently (a column slice of a concatenated
    GEMM, SDPA's output): where a boundary output's strides change, the replaced nodes
    whose layout changed are copied to the original (contiguous) layout first.
    """

    def outputs_ok() -> bool:
        outs = propagate(gm, fakes, fake_mode)
        return all(same_strides(a, b) for a, b in zip(outs, want))

    if outputs_ok():
        return
    fixed = False
    for node, orig in replaced:
        val = node.meta.get("val")
        if val is None or same_strides(val, orig) or not orig.is_contiguous():
            continue
        users = list(node.users)
        with gm.graph.inserting_after(node):
            copy = gm.graph.call_function(
                aten.clone.default, (node,), {"memory_format": torch.contiguous_format}
            )
        for u in users:
            u.replace_input_with(node, copy)
        fixed = True
    gm.recompile()
    if not fixed or not outputs_ok():
        raise PlanError("the rewrite changes the layout of a boundary output")


def _pick(fn: Callable[..., Any], index: tuple[int, ...], n: int) -> Callable[..., Any]:
    """fn over the call inputs at `index` (identity when index is 0..n-1)."""
    if index == tuple(range(n)):
        return fn

    def run(*args: Any) -> Any:
        return fn(*[args[i] for i in index])

    return run


@dataclass(frozen=True)
class GroupReport:
    """What happened to one group: asked for, used, compile time, why it fell back."""

    index: int
    nodes: tuple[int, ...]
    requested: str
    realization: str
    compiled: bool
    compile_s: float
    fallback: str = ""  # "" when the group runs as requested (else: why it runs eagerly)
    note: str = ""  # e.g. why a requested rewrite was not applied
    reuses: int | None = None  # the group whose compiled callable this one runs, uncompiled
    # a compiled group: "" when its inference calls skip the compiler's runtime wrappers
    # (planner.realize.lean), else why they do not
    lean: str = ""


class GroupUnit:
    """A group ready to run; mutable only through `to_eager` (a fallback)."""

    def __init__(self, group: GroupGraph, requested: str, extra: dict[str, torch.Tensor]):
        self.group = group
        self.requested = requested
        self.extra_state = extra
        self.derived: dict[str, Recipe] = {}  # how each extra tensor is made from state
        self.inputs = group.inputs + tuple(extra)  # the fixed call signature
        self.realization = "eager"
        self.compiled = False
        self.compile_s = 0.0
        self.fallback = ""
        self.note = ""
        self.reuses: int | None = None  # see GroupReport.reuses
        self.is_eager = True
        self.run = _pick(group.module.forward, tuple(range(len(group.inputs))), len(self.inputs))
        # the layouts the unit's outputs have at run time (set by prepare_unit); consumers
        # prepared after it are traced and compiled for them
        self.out_fakes: tuple[Any, ...] = ()
        self.module: fx.GraphModule = group.module  # what runs (compiled or not) ...
        self.module_fakes: tuple[Any, ...] = tuple(group.fakes)  # ... and its inputs
        # a compiled group: the compiled callable, the names of its inputs, and whether its
        # calls take the lean entry (planner.realize.lean) when legal ("" = yes, else why not)
        self.compiled_fn: Callable[..., Any] | None = None
        self.compiled_names: tuple[str, ...] = ()
        self.lean = "not compiled"
        self.lean_switch = [True]  # RealizedPlan.lean_calls turns it off for every group

    def predicted_outputs(self, fake_mode: Any) -> list[Any]:
        """The layouts of the outputs as the unit now runs (fake values)."""
        return propagate(self.module, self.module_fakes, fake_mode)

    def use(self, realization: str, fn: Callable[..., Any], names: Sequence[str], compiled: bool):
        index = tuple(self.inputs.index(n) for n in names)
        self.run = _pick(fn, index, len(self.inputs))
        self.realization, self.compiled, self.is_eager = realization, compiled, False
        self.compiled_fn = fn if compiled else None
        self.compiled_names = tuple(names) if compiled else ()
        self.lean = "not compiled"

    def use_lean(self, graph: Any) -> None:
        """Call the compiled group through `graph` (planner.realize.lean.lean_entry's) when
        grad mode and autocast are off."""
        assert self.compiled_fn is not None
        index = tuple(self.inputs.index(n) for n in self.compiled_names)
        self.run = with_lean_path(
            self.compiled_fn, graph, index, len(self.inputs), self.lean_switch
        )
        self.lean = ""

    def to_eager(self, reason: str) -> None:
        """Run the group's aten ops as they are (`eager_runner`) from now on. A callable
        this unit shares with other groups (SharedCompiles) stays theirs."""
        self.run = self.eager_runner()
        self.realization, self.compiled, self.is_eager = "eager", False, True
        self.compiled_fn, self.compiled_names, self.lean = None, (), "not compiled"
        self.reuses = None
        self.fallback = reason

    def eager_runner(self) -> Callable[..., Any]:
        """The group's aten ops as they are, over the unit's call inputs. Consumers may have
        been compiled for the layouts the unit promised (out_fakes): eager's results are
        laid out so first."""
        eager_fwd = fwd = self.group.module.forward
        promised = self.out_fakes
        if promised:
            try:
                eager = propagate(self.group.module, self.group.fakes, _fake_mode(promised))
            except Exception:
                eager = []
            if len(eager) != len(promised) or not all(
                same_strides(a, b) for a, b in zip(eager, promised)
            ):
                fakes_in = self.group.fakes

                def relaid(*args: Any) -> Any:
                    bound = bindings(fakes_in, args)
                    return tuple(as_layout(o, f, bound) for o, f in zip(eager_fwd(*args), promised))

                fwd = relaid
        return _pick(fwd, tuple(range(len(self.group.inputs))), len(self.inputs))

    def report(self) -> GroupReport:
        return GroupReport(
            self.group.index,
            self.group.nodes,
            self.requested,
            self.realization,
            self.compiled,
            self.compile_s,
            self.fallback,
            self.note,
            self.reuses,
            self.lean if self.compiled else "",
        )


def _fake_mode(fakes: Sequence[Any]) -> Any:
    return next(f.fake_mode for f in fakes if hasattr(f, "fake_mode"))


def _cat(*ts: torch.Tensor) -> torch.Tensor:
    return torch.cat(ts, 0)


def _rewrite(
    graph: OpGraph,
    parts: ProgramParts,
    gg: GroupGraph,
    realization: str,
    fake_mode: Any,
    keep_layout: bool = True,
    recipes: dict[str, Recipe] | None = None,
) -> tuple[fx.GraphModule, list[str], list[Any], dict[str, torch.Tensor]] | None:
    """The group's subgraph with its pattern rewritten, or None when there is none. The
    copies of state it makes (concatenated weights) record their recipes in `recipes`."""
    recipes = {} if recipes is None else recipes
    names, fakes = list(gg.inputs), list(gg.fakes)
    extra: dict[str, torch.Tensor] = {}
    replaced: list[tuple[fx.Node, str]] = []
    if realization == "sdpa":
        matches = patterns.find_attention(graph, gg.nodes)
        if not matches:
            return None
        gm = _clone(gg.module)
        for m in matches:
            replaced += patterns.rewrite_attention(gm, m, parts.op_names)
    elif realization == "concat_gemm":
        sibs = patterns.find_sibling_gemms(graph, gg.nodes)
        if not sibs:
            return None
        gm = _clone(gg.module)
        for k, s in enumerate(sibs):
            w_names = [graph.tensors[t].name for t in s.weights]
            w_name = f"concat_w_{gg.index}_{k}"
            extra[w_name] = derive(recipes, w_name, w_names, _cat, parts.state)
            b_name = None
            if s.biases:
                b_name = f"concat_b_{gg.index}_{k}"
                b_names = [graph.tensors[t].name for t in s.biases]
                extra[b_name] = derive(recipes, b_name, b_names, _cat, parts.state)
            sizes = tuple(int(parts.state[w].shape[0]) for w in w_names)
            replaced += patterns.rewrite_concat_gemm(gm, s, parts.op_names, w_name, b_name, sizes)
            names.append(w_name)
            fakes.append(fake_mode.from_tensor(extra[w_name], static_shapes=True))
            if b_name is not None:
                names.append(b_name)
                fakes.append(fake_mode.from_tensor(extra[b_name], static_shapes=True))
    else:
        return None
    _finish(gm, names, fakes, replaced, parts, gg, fake_mode, keep_layout)
    return gm, names, fakes, extra


def _finish(
    gm: fx.GraphModule,
    names: list[str],
    fakes: list[Any],
    replaced: Sequence[tuple[fx.Node, str]],
    parts: ProgramParts,
    gg: GroupGraph,
    fake_mode: Any,
    keep_layout: bool,
) -> None:
    """After a rewrite of `gm` (in place): placeholders it left unused dropped (from
    `names` and `fakes` too), and its outputs laid out as `keep_layout` asks."""
    for node in list(gm.graph.nodes):
        if node.op == "placeholder" and not node.users:
            i = names.index(node.target)
            del names[i], fakes[i]
            gm.graph.erase_node(node)
    gm.recompile()
    if keep_layout:
        want = [parts.by_name[n].meta["val"] for n in gg.outputs]
        _settle_layout(
            gm, fakes, fake_mode, want, [(n, parts.by_name[o].meta["val"]) for n, o in replaced]
        )
    else:  # layouts propagate: the consumers are traced with whatever this computes
        propagate(gm, fakes, fake_mode)


_ALIGN_BYTES = 16  # cuBLAS's fast kernels want every leading dimension 16-byte aligned


def _padded(t: torch.Tensor, spec: tuple[int, ...]) -> torch.Tensor:
    return torch.nn.functional.pad(t, spec)


def pad_unaligned_linears(
    parts: ProgramParts,
    gg: GroupGraph,
    module: fx.GraphModule,
    names: Sequence[str],
    fakes: Sequence[Any],
    fake_mode: Any,
    keep_layout: bool,
    devices: tuple[str, ...] = ("cuda",),
    recipes: dict[str, Recipe] | None = None,
) -> tuple[fx.GraphModule, list[str], list[Any], dict[str, torch.Tensor], int] | None:
    """`module` with each `linear` whose weight is model state and whose output width is not
    a multiple of 16 bytes run on a copy of the weight (and bias) padded with zero rows to
    an aligned width, its output the first columns of that (a view with aligned rows):
    cuBLAS runs an unaligned output with slow kernels (an LM head over a 50257-token
    vocabulary), and the padded copy is made once, here, not on every call as Inductor's
    pad_mm does. None when the module holds no such linear. The padded copies are the
    unit's extra state, like a concatenated GEMM's: made from the weights at realization.
    Only weights on `devices` (CUDA: the alignment rule is cuBLAS's)."""
    gm = _clone(module)
    g = gm.graph
    names, fakes = list(names), list(fakes)
    extra: dict[str, torch.Tensor] = {}
    replaced: list[tuple[fx.Node, str]] = []
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
            continue
        x, w = node.args[0], node.args[1]
        b = node.args[2] if len(node.args) > 2 else None
        state = [a for a in (w, b) if a is not None]
        if not all(isinstance(a, fx.Node) and a.target in parts.state for a in state):
            continue
        weight = parts.state[w.target]
        if weight.dim() != 2 or not weight.is_floating_point() or weight.device.type not in devices:
            continue
        per = max(1, _ALIGN_BYTES // weight.element_size())
        width = int(weight.shape[0])
        if width % per == 0:
            continue
        pad = -width % per
        new_args: list[Any] = [x]
        last = [n for n in g.nodes if n.op == "placeholder"][-1]
        for a, what in ((w, "w"), (b, "b")):
            if a is None:
                continue
            name = f"padded_{what}_{gg.index}_{len(extra)}"
            spec = (0, 0, 0, pad) if parts.state[a.target].dim() == 2 else (0, pad)
            make = functools.partial(_padded, spec=spec)
            extra[name] = derive(
                {} if recipes is None else recipes, name, [a.target], make, parts.state
            )
            with g.inserting_after(last):
                last = g.placeholder(name)
            names.append(name)
            fakes.append(fake_mode.from_tensor(extra[name], static_shapes=True))
            new_args.append(last)
        out_dim = node.meta["val"].dim() - 1 if "val" in node.meta else -1
        with g.inserting_after(node):
            wide = g.call_function(torch.ops.aten.linear.default, tuple(new_args))
        with g.inserting_after(wide):
            cut = g.call_function(torch.ops.aten.slice.Tensor, (wide, out_dim, 0, width))
        node.replace_all_uses_with(cut)
        replaced.append((cut, node.name))
        g.erase_node(node)
    if not replaced:
        return None
    _finish(gm, names, fakes, replaced, parts, gg, fake_mode, keep_layout)
    return gm, names, fakes, extra, len(replaced)


def _eager_attention_on_dense_masks(
    unit: GroupUnit, parts: ProgramParts, fake_mode: Any, keep_layout: bool
) -> None:
    """An eager group's attention whose mask is not contiguous along keys (eager would run
    it with the math kernel) runs as `fusion_planner::attention`, uncompiled: the same
    values from a fused kernel. With `keep_layout`, only where the group's outputs keep
    eager's strides; a group this does not fit is left as it is, with a note."""
    gg = unit.group
    if not library_attention.eager_mask_sites(gg.module, keep_layout=keep_layout):
        return
    try:
        lib = _clone(gg.module)
        sites = library_attention.eager_mask_sites(lib, keep_layout=keep_layout)
        n = library_attention.use_library_attention(lib, sites=sites)
        outs = propagate(lib, gg.fakes, fake_mode)
        if keep_layout:
            want = [parts.by_name[o].meta["val"] for o in gg.outputs]
            if len(outs) != len(want) or not all(same_strides(a, b) for a, b in zip(outs, want)):
                unit.note = "attention on a dense mask left out: it changes an output's layout"
                return
    except Exception as e:  # keep the group as it was
        unit.note = f"attention on a dense mask failed ({type(e).__name__}: {str(e)[:160]})"
        return
    unit.module, unit.module_fakes = lib, tuple(gg.fakes)
    unit.use("eager", lib.forward, list(gg.inputs), compiled=False)
    unit.note = f"{n} attention(s) on a dense mask, as eager's library kernel"


def prepare_unit(
    graph: OpGraph,
    parts: ProgramParts,
    gg: GroupGraph,
    requested: str,
    compile_group: Callable[[fx.GraphModule, tuple[Any, ...], Any], Callable[..., Any]],
    fake_mode: Any,
    warning: type[Warning] = UserWarning,
    keep_layout: bool = True,
    compilers: Mapping[str, Callable[[fx.GraphModule, tuple[Any, ...], Any], Callable[..., Any]]]
    | None = None,
    shared: SharedCompiles | None = None,
) -> GroupUnit:
    """Make group `gg` runnable as `requested` (see the module doc); never raises for a
    group that fails to rewrite or compile: it runs eagerly instead, with a warning.

    A label with a compile mode ("inductor+autotune", planner.fusion.realization.MODES)
    is rewritten as its base label and compiled by `compilers[mode]` (`compile_group` when
    none is given for the mode); it is always compiled, even one op alone.
    `keep_layout`: every boundary output keeps eager's strides (a rewrite's results are
    copied back where they differ); False when realize propagates layouts
    (planner.realize.layout): outputs keep the layout their kernel computes, and the
    caller records them in the unit's `out_fakes` (`predicted_outputs`).
    `shared`: the realization's compiled groups (planner.realize.compilers); a group whose
    compile key an earlier group has runs that group's callable, with compile_s the key's
    look-up time and `reuses` (and a note) naming the group.
    """
    if requested == "eager" or work_ops(gg.module) == 0:
        unit = GroupUnit(gg, requested, {})
        if requested == "eager":
            _eager_attention_on_dense_masks(unit, parts, fake_mode, keep_layout)
        return unit
    base, mode = split_label(requested)
    realization, module, names, fakes = base, gg.module, list(gg.inputs), list(gg.fakes)
    extra: dict[str, torch.Tensor] = {}
    recipes: dict[str, Recipe] = {}
    note = ""
    if base in ("sdpa", "concat_gemm"):
        try:
            rewritten = _rewrite(graph, parts, gg, base, fake_mode, keep_layout, recipes)
        except Exception as e:  # a rewrite that does not trace: compile the group as is
            rewritten = None
            note = f"{base} rewrite failed ({type(e).__name__}: {str(e)[:160]})"
        if rewritten is None:
            realization = "inductor"
            note = note or f"no {base} pattern in the group"
            msg = f"group {gg.index} asked for {requested}, runs as inductor: {note}"
            log.warning(msg)
            warnings.warn(msg, warning, stacklevel=3)
        else:
            module, names, fakes, extra = rewritten
    if realization != "eager":
        trimmed = _clone(module)
        if drop_empty_cat_inputs(trimmed):
            module = trimmed
    alone = realization != "inductor" and not mode
    if realization in ("inductor", "sdpa", "concat_gemm") and not mode:
        try:
            padded = pad_unaligned_linears(
                parts, gg, module, names, fakes, fake_mode, keep_layout, recipes=recipes
            )
        except Exception as e:  # keep the group as it was
            padded = None
            why = f"padding unaligned GEMMs failed ({type(e).__name__}: {str(e)[:160]})"
            note = "; ".join(filter(None, [note, why]))
        if padded is not None:
            module, names, fakes, more, n = padded
            extra = {**extra, **more}
            alone = True  # a lone padded GEMM runs as its library call, uncompiled
            note = "; ".join(filter(None, [note, f"{n} GEMM(s) on weights padded to 16-byte rows"]))
    if realization in ("inductor", "sdpa", "concat_gemm") and patterns.gelu_epilogue_sites(module):
        try:
            fused = _clone(module)
            n = patterns.rewrite_gelu_epilogue(fused)
            propagate(fused, fakes, fake_mode)
            module, alone = fused, not mode
            note = "; ".join(filter(None, [note, f"{n} GEMM+bias+GELU as one cuBLASLt call"]))
        except Exception as e:  # keep the group as it was
            why = f"GELU epilogue rewrite failed ({type(e).__name__}: {str(e)[:160]})"
            note = "; ".join(filter(None, [note, why]))
    if realization in ("inductor", "sdpa", "concat_gemm") and library_attention.attention_sites(
        module, keep_layout=keep_layout
    ):
        try:
            lib = _clone(module)
            n = library_attention.use_library_attention(lib, keep_layout=keep_layout)
            propagate(lib, fakes, fake_mode)
            module = lib
            note = "; ".join(filter(None, [note, f"{n} attention(s) as eager's library kernel"]))
        except Exception as e:  # keep the group as it was
            why = f"library attention failed ({type(e).__name__}: {str(e)[:160]})"
            note = "; ".join(filter(None, [note, why]))
    if (
        not keep_layout
        and realization in ("inductor", "sdpa", "concat_gemm")
        and conv_layout.conv_sites(module, conv_layout.CHANNELS_LAST_DEVICES)
    ):
        try:
            cl, cl_names, cl_fakes = _clone(module), list(names), list(fakes)
            state = {k: parts.state[k] for k in cl_names if k in parts.state}
            prefix = f"channels_last_w_{gg.index}_"
            more, n = conv_layout.to_channels_last(
                cl, state, cl_names, cl_fakes, fake_mode, prefix, recipes
            )
            _finish(cl, cl_names, cl_fakes, [], parts, gg, fake_mode, keep_layout)
            module, names, fakes, extra = cl, cl_names, cl_fakes, {**extra, **more}
            note = "; ".join(filter(None, [note, f"{n} convolution(s) channels-last"]))
        except Exception as e:  # keep the group as it was
            why = f"channels-last convolutions failed ({type(e).__name__}: {str(e)[:160]})"
            note = "; ".join(filter(None, [note, why]))
    label = f"{realization}+{mode}" if mode else realization
    unit = GroupUnit(gg, requested, extra)
    unit.derived = {n: r for n, r in recipes.items() if n in extra}
    unit.note = note
    unit.module, unit.module_fakes = module, tuple(fakes)
    if alone and work_ops(module) <= 1:
        unit.use(label, module.forward, names, compiled=False)  # the kernel alone
        return unit
    compiler = (compilers or {}).get(mode, compile_group) if mode else compile_group
    t0 = time.perf_counter()
    first = None
    try:
        if shared is None:
            fn = compiler(module, tuple(fakes), fake_mode)
        else:
            fn, first = shared.compile(compiler, module, tuple(fakes), fake_mode, gg.index)
    except Exception as e:
        unit.compile_s = time.perf_counter() - t0
        reason = f"compile failed: {type(e).__name__}: {str(e).strip()[:300]}"
        unit.module, unit.module_fakes = gg.module, tuple(gg.fakes)
        unit.to_eager(reason)
        warnings.warn(f"group {gg.index} runs eagerly: {reason}", warning, stacklevel=3)
        return unit
    unit.compile_s = time.perf_counter() - t0
    unit.use(label, fn, names, compiled=True)
    graph_fn, why = lean_entry(fn, module, tuple(fakes), fake_mode)
    if graph_fn is not None:
        unit.use_lean(graph_fn)
    else:
        unit.lean = why
    if first is not None:
        unit.reuses = first
        unit.note = "; ".join(filter(None, [unit.note, f"reuses group {first}'s compiled kernel"]))
    return unit


class _Keeper(fx.Interpreter):
    """Runs the program eagerly, keeping the values named in `keep`."""

    def __init__(self, gm: fx.GraphModule, keep: set[str]):
        super().__init__(gm)
        self.keep = keep
        self.kept: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.keep:
            self.kept[n.name] = out
        return out


def reference_values(
    parts: ProgramParts, inputs: Sequence[Any], keep: set[str] | None = None
) -> tuple[dict[str, Any], list[Any]]:
    """Eager values of the program on `inputs`: ({name: value} of `keep`, user outputs).

    By default keeps every value that crosses a group boundary, which is what checking
    each group alone against eager needs.
    """
    if keep is None:
        keep = set()
        for node in parts.gm.graph.nodes:
            g = parts.group_of.get(node.name)
            if any(parts.group_of.get(u.name) != g for u in node.users):
                keep.add(node.name)
            elif isinstance(node.meta.get("val"), torch.SymInt):
                keep.add(node.name)  # a size a group may take as an input of its own
            if node.name in parts.copied_into:  # recomputed elsewhere: from its inputs
                keep.update(a.name for a in node.all_input_nodes)
    keep |= {v.name for v in parts.outputs if isinstance(v, fx.Node)}
    user = dict(zip(parts.user_inputs, inputs))
    args = [
        parts.state[n.name] if n.name in parts.state else user[n.name]
        for n in parts.gm.graph.nodes
        if n.op == "placeholder"
    ]
    keeper = _Keeper(parts.gm, keep)
    with torch.no_grad():
        keeper.run(*args)
    outs = [keeper.kept[v.name] if isinstance(v, fx.Node) else v for v in parts.outputs]
    return keeper.kept, outs
