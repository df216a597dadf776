"""Capture: a real torch model + example inputs -> OpGraph (and the aten program behind it).

Why torch.export (non-strict) followed by `run_decompositions({})`:
- export gives one whole-graph aten program with FakeTensor metadata (shape, dtype,
  strides) on every node, which is exactly what FLOP and byte counting need; dynamo
  traces (torch.compile backends) would hand us graph breaks instead of one graph;
- an *empty* decomposition table functionalizes the program (in-place ops such as
  `relu_` become `relu`, so groups can be reordered safely) while keeping composite ops
  whole: `linear`, `layer_norm`, `softmax`, `gelu` and `scaled_dot_product_attention`
  stay one node each, the granularity of the block graph in docs/formulas.md §1 and of
  the fusion patterns.
  The default core-aten decomposition would split a LayerNorm into ~10 nodes;
- the program is also what `planner.realize.realizer` splits into groups and compiles, so the
  OpGraph node names map 1:1 onto FX nodes.

What is exported is the model with a forward that takes the example call's tensors flat
and returns the output's tensors flat (`flat_forward`, planner.ir.pytrees): real models return
library objects (a `ModelOutput` holding a `DynamicCache`) that torch.export cannot
return. A model without data (on the meta device, or `trace_as`) is traced as fake
tensors on the device it will run on, so its graph is that device's. docs/capture.md
says why both. A model with DTensor weights (tensor parallelism) is exported as its
rank's program (planner.ir.capture_dtensor; docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import itertools
import keyword
import logging
import math
import operator
import os
import re
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols

import planner.ir.backend_forms as backend_forms
import planner.ir.capture_dtensor as capture_dtensor
import planner.ir.taxonomy as taxonomy
from planner.distributed.collectives import group_size_of
from planner.errors import CaptureError, PlanError
from planner.ir.graph import DTYPE_BYTES, Category, OpGraph, OpNode, TensorInfo
from planner.ir.pytrees import Structure, StructureError, describe_mismatch


class UnknownOpWarning(UserWarning):
    """An op the taxonomy does not know was captured as opaque."""


@dataclass(frozen=True)
class ModelIO:
    """How the model's call maps onto the program's flat tensors (planner.ir.pytrees).

    `inputs` is the structure of the example call `(args, kwargs)`, whose tensors are the
    program's inputs in order; `outputs` the structure the model returned, whose tensors
    are the program's outputs in order.
    """

    inputs: Structure
    outputs: Structure

    def flat_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The program's inputs for a call like the example's (or already flat tensors)."""
        if not kwargs and self.inputs.plain_call and len(args) == self.inputs.n_leaves:
            return args
        structure, leaves = Structure.of((args, kwargs))
        if structure.signature == self.inputs.signature:
            return tuple(leaves)
        flat = not kwargs and len(args) == self.inputs.n_leaves
        if flat and all(isinstance(a, torch.Tensor) for a in args):
            return args  # the program's own flat inputs
        raise PlanError(
            "the call's arguments are not structured like the example inputs the model was "
            f"captured with ({describe_mismatch(self.inputs.signature, structure.signature, 'call')}); "
            "call it as it was captured, or capture it again with inputs like these"
        )

    def rebuild_outputs(self, flat: Any) -> Any:
        """The model's output structure around the program's flat outputs."""
        if self.outputs.flat_tuple:
            return tuple(flat)
        return self.outputs.build(list(flat))


@dataclass(frozen=True)
class Captured:
    """An OpGraph together with the exported program it was read from.

    The program takes `example_inputs`, the tensors of the example call in order, and
    returns the tensors of the model's output in order; `io` puts the user's structures
    around them (None for programs exported elsewhere: they take and return flat tuples).
    """

    graph: OpGraph
    program: torch.export.ExportedProgram
    example_inputs: tuple[Any, ...]
    io: ModelIO | None = None
    planning_only: bool = False  # traced without data (fake tensors): never realized

    @property
    def graph_module(self) -> fx.GraphModule:
        return self.program.graph_module


# Nodes that carry no tensor work: shape asserts and symbolic-size bookkeeping.
_SKIP_TARGETS = (
    "_assert",
    "sym_size",
    "sym_numel",
    "sym_stride",
    "sym_constrain_range",
    "_check",
    "_set_grad_enabled",
)


# Ops that hand back their input's values unchanged: `detach` (a model tracing under
# `torch.inference_mode()` records one where `no_grad` records none, e.g. Hugging Face's KV
# cache) and `alias`. A plan serves values, never autograd history, so they are taken out of
# the program; the same model then has one graph and one structure key whatever mode it
# was captured in.
_IDENTITY_OPS = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


def _drop_identities(program: torch.export.ExportedProgram) -> None:
    """Remove `_IDENTITY_OPS` nodes from `program` in place (their users read the input);
    a node that is itself a program output stays, so the output signature is unchanged."""
    gm = program.graph_module
    out = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = set(pytree.tree_leaves(out.args))
    changed = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _IDENTITY_OPS and node not in outputs:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.recompile()


def capture(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    name: str = "",
    meta: dict[str, Any] | None = None,
) -> OpGraph:
    """Capture `module` called on `example_inputs` as an OpGraph at aten level."""
    return export_model(module, example_inputs, name=name, meta=meta).graph


def trace_device() -> torch.device:
    """The device a model captured on the meta device is traced as: the one `tune` and
    the runtime capture on here (CUDA when present, else the CPU)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def export_model(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    name: str = "",
    meta: dict[str, Any] | None = None,
    trace_as: str | torch.device | None = None,
) -> Captured:
    """Export `module` and read its aten program into an OpGraph; see module docstring.

    `example_inputs`: a tensor, a tuple (or list) of positional arguments, or a dict of
    keyword arguments; arguments may be any pytree of tensors (planner.ir.pytrees). The
    program takes the example call's tensors flat and returns the output's tensors flat;
    `Captured.io` maps both back.

    `trace_as`: trace the model without data (fake tensors) as if it were on that device;
    a model on the meta device is traced as if on `trace_device()`. Its graph (and
    structure key) is then the one a capture there with real weights gives: kernels choose
    output layouts per device (SDPA's output is transposed on CPU and CUDA, contiguous on
    meta) and `.contiguous()` records a copy only where a layout needs one. Such a capture
    is for planning only (`Captured.planning_only`).
    """
    if not isinstance(module, torch.nn.Module):
        raise CaptureError(f"capture expects a torch.nn.Module, got {type(module).__name__}")
    args, kwargs = _as_call(example_inputs)
    _check_call(module, args, kwargs)
    if capture_dtensor.has_dtensors(module):  # tensor parallelism: the rank's own program
        module = capture_dtensor.localize(module, args, kwargs)
    try:
        in_structure, leaves = Structure.of((args, kwargs))
    except StructureError as e:
        raise CaptureError(f"the example inputs cannot be captured: {e}") from e
    traced, trace_inputs = module, tuple(leaves)
    devices = _devices(module, leaves)
    target = torch.device(trace_as) if trace_as is not None else None
    if target is None and "meta" in devices:
        target = trace_device()
    fake = target is not None and devices != {target.type}
    if fake:
        traced, trace_inputs = _faked_on(module, leaves, target)
    seen: list[Structure] = []  # the output's structure, recorded while tracing
    names = _input_names(module, args, kwargs, leaves)
    # An FX GraphModule (dynamo's graph, lifted by the runtime) takes and returns flat
    # tensors already, and its call ignores a patched forward: it is exported as it is.
    direct = isinstance(traced, fx.GraphModule)
    try:
        if direct:
            t_args, t_kwargs = in_structure.build(trace_inputs)
            with _quiet_torch():
                program = torch.export.export(traced, t_args, t_kwargs, strict=False)
        else:
            with _quiet_torch(), flat_forward(traced, in_structure, names, seen) as flat:
                program = torch.export.export(flat, trace_inputs, strict=False)
        with _quiet_torch():
            program = program.run_decompositions({})
    except Exception as e:  # torch raises many types here; the user needs one
        raise _capture_error(module, e) from e
    _drop_identities(program)
    graph = graph_from_program(program, name=name or type(module).__name__, meta=meta)
    io = None if direct else ModelIO(in_structure, seen[-1])
    return Captured(graph, program, tuple(leaves), io, planning_only=fake)


def flat_module(module: torch.nn.Module, captured: Captured) -> Any:
    """A context in which `module` is what `captured`'s program was exported from: the
    example call's tensors in (flat, in `captured.example_inputs` order), the output's
    tensors out. For exporting the same model again (with dynamic shapes, say):

        with flat_module(model, captured) as m:
            program = torch.export.export(m, captured.example_inputs, dynamic_shapes=...)

    `captured.io` maps the new program's inputs and outputs as it maps the first's."""
    if captured.io is None:
        raise CaptureError("this capture has no input/output structure (made by export_model?)")
    names = [t.name for t in captured.graph.tensors if t.kind == "input"]
    return flat_forward(module, captured.io.inputs, names, [])


@contextlib.contextmanager
def flat_forward(
    module: torch.nn.Module, inputs: Structure, names: list[str], seen: list[Structure]
) -> Iterator[torch.nn.Module]:
    """`module` with a forward that takes the example call's tensors flat and returns the
    output's tensors flat, while the context lasts (an instance attribute over the class's
    forward, removed on exit; not thread-safe for one module).

    The forward rebuilds the call's structure around its tensors, calls the model's own
    forward and returns the tensors of whatever came back, appending that structure to
    `seen`. Patching the module rather than wrapping it keeps the program's parameter
    names those of a direct export (a wrapper would prefix them all)."""
    original = module.forward
    had_own = "forward" in module.__dict__

    def forward(*flat: Any) -> tuple[Any, ...]:
        args, kwargs = inputs.build(flat)
        structure, leaves = Structure.of(original(*args, **kwargs))
        seen.append(structure)  # a list held here, not on the module: export restores those
        return tuple(leaves)

    # export names the program's input placeholders after forward's parameters
    forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    )
    module.forward = forward  # type: ignore[method-assign]
    try:
        yield module
    finally:
        if had_own:
            module.forward = original  # type: ignore[method-assign]
        else:
            del module.forward


def _as_call(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, list | tuple):
        return tuple(example_inputs), {}
    if isinstance(example_inputs, dict) and all(isinstance(k, str) for k in example_inputs):
        return (), dict(example_inputs)
    raise CaptureError(
        "example_inputs must be a tensor, a tuple of positional arguments or a dict of "
        f"keyword arguments, got {type(example_inputs).__name__}"
    )


def _check_call(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse example inputs forward() cannot take, before tracing hides why."""
    try:
        sig = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return  # a forward without a signature: export will tell
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise CaptureError(
            f"example_inputs do not fit {type(module).__name__}.forward{sig}: {e}. Pass a "
            "tuple of positional arguments or a dict of keyword arguments that forward() takes"
        ) from None


def _as_args(example_inputs: Any) -> tuple[Any, ...]:
    """Positional example inputs as a tuple (keyword inputs are refused)."""
    args, kwargs = _as_call(example_inputs)
    if kwargs:
        raise CaptureError("this capture takes positional inputs only (a tensor or a tuple)")
    return args


def _input_names(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], leaves: list[Any]
) -> list[str]:
    """A name per input tensor, after the forward() parameter it is passed as."""
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    named = [(params[i] if i < len(params) else f"arg{i}", a) for i, a in enumerate(args)]
    named += list(kwargs.items())
    by_id: dict[int, str] = {}
    for base, value in named:
        inner = [t for t in Structure.of(value)[1] if id(t) not in by_id]
        for j, t in enumerate(inner):
            by_id[id(t)] = base if len(inner) == 1 else f"{base}_{j}"
    names: list[str] = []
    for i, t in enumerate(leaves):
        n = re.sub(r"\W", "_", by_id.get(id(t), f"arg{i}"))
        n = n if n.isidentifier() and not keyword.iskeyword(n) else f"arg_{n}"
        while n in names:
            n += "_"
        names.append(n)
    return names


def _devices(module: torch.nn.Module, leaves: list[Any]) -> set[str]:
    tensors = itertools.chain(leaves, module.parameters(), module.buffers())
    return {t.device.type for t in tensors if isinstance(t, torch.Tensor)}


def _faked_on(
    module: torch.nn.Module, leaves: list[Any], device: torch.device
) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """A copy of `module` and inputs as fake tensors on `device`: no memory, and each op's
    output layout is the one `device`'s kernels give. `module` itself is left as it is."""
    try:
        # the module tree copied, its tensors shared (swapped for fakes in the copy below)
        shared = itertools.chain(module.parameters(), module.buffers())
        traced = copy.deepcopy(module, memo={id(t): t for t in shared})
    except Exception:  # an uncopyable module: trace it where it is
        return module, tuple(leaves)
    fake_mode = FakeTensorMode(shape_env=ShapeEnv(tracked_fakes=[]), allow_non_fake_inputs=True)
    memo: dict[int, Any] = {}  # one fake per tensor: tied weights stay tied

    def fake(t: torch.Tensor) -> Any:
        if id(t) not in memo:
            with fake_mode:
                memo[id(t)] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
        return memo[id(t)]

    for mod in traced.modules():
        for key, p in mod._parameters.items():
            if p is not None:
                mod._parameters[key] = torch.nn.Parameter(fake(p), p.requires_grad)
        for key, b in mod._buffers.items():
            if b is not None:
                mod._buffers[key] = fake(b)
    fakes = tuple(fake(t) for t in leaves)
    return traced, fakes


# What a failed export says -> what to tell the user; the first rule that matches wins.
_ADVICE = (
    # GuardOnDataDependentSymNode / "data-dependent": Python branches on tensor values
    (
        ("GuardOnDataDependent", "data-dependent", "data dependent"),
        "forward() branches on a tensor's values (an `if` on a tensor, `.item()`, "
        "`.tolist()`, a nonzero count): compute the condition from shapes or flags instead, "
        "or mark it with torch._check(...) so export can assume it",
    ),
    # a wrong example call: the factory's inputs do not fit forward()
    (
        ("unexpected keyword argument", "required positional argument", "positional arguments but"),
        "the example inputs do not fit forward()'s parameters: return them from the "
        "factory as forward() takes them (a tuple of positional arguments, or a dict of "
        "keyword arguments)",
    ),
    # an input object torch's pytree does not know (outputs are walked by planner.ir.pytrees)
    (
        ("not a known type", "register a pytree", "pytree"),
        "an input is an object torch.export cannot take: pass tensors, or tuples, lists "
        "and dicts of them (register the type with torch.utils._pytree otherwise)",
    ),
    # an op with no meta/fake implementation, hit by capture on the meta device
    (
        ("fake impl", "meta kernel", "meta tensor", "no meta", "meta device"),
        "an op of the model has no implementation for tracing without data: capture the "
        "model on a real device (CPU), or give the op a fake (meta) kernel",
    ),
)


def _capture_error(module: torch.nn.Module, e: Exception) -> CaptureError:
    """One CaptureError for a failed export: what torch said (cut at a word, not inside
    one), and advice that leads to a fix."""
    if isinstance(e, CaptureError):
        return e
    if isinstance(e, StructureError):
        return CaptureError(
            f"the output of {type(module).__name__} cannot be captured: {e}. To fix: return "
            "tensors in tuples, lists, dicts, dataclasses or plain objects"
        )
    text = " ".join(str(e).split()) or type(e).__name__
    advice = next(
        (a for keys, a in _ADVICE if any(k.lower() in text.lower() for k in keys)),
        "make forward() traceable by torch.export (no Python control flow on tensor "
        "values) and pass example inputs forward() accepts",
    )
    # torch's pointers to its own debug logs do not help here
    for tail in ("For more information, run with", "For extended logs"):
        text = text.split(tail)[0].strip()
    reason = _clip(text, 400)
    where = _model_frame(e)
    return CaptureError(
        f"torch.export could not trace {type(module).__name__}"
        f"{f' at {where}' if where else ''}: {type(e).__name__}: "
        f"{reason}{'' if reason.endswith('...') else '.'} To fix: {advice}."
    )


def _model_frame(e: BaseException) -> str:
    """`file:line (code)` of the deepest frame of the failure in the model's own code (not
    torch's, not the planner's), or "" when there is none."""
    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(skip)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno} ({(f.line or '').strip()})"


def _clip(text: str, limit: int) -> str:
    """`text` up to `limit` characters, cut at a word boundary with an ellipsis."""
    if len(text) <= limit:
        return text.rstrip(" .")
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit].rstrip(" ,;:.") + " ..."


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """Silence torch's own logging and deprecation chatter while exporting: a failure
    reaches the user as one CaptureError, not pages of internal graph dumps."""
    # torch's loggers carry their own handlers (propagate=False), so each is muted.
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name == "torch" or name.startswith("torch.")
    ]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        # export also print()s graph dumps to stderr when tracing fails.
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for lg, was in zip(loggers, before):
            lg.disabled = was


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise CaptureError(f"dtype {name} is not supported by the planner's byte model")
    return name


def _static_shape(val: torch.Tensor, where: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in val.shape)
    except (TypeError, RuntimeError) as e:
        if free_unbacked_symbols(val):
            raise CaptureError(
                f"{where} has shape {tuple(val.shape)}, whose size depends on tensor values "
                "(nonzero, masked_select, unique, .item() as a size). To fix: keep sizes a "
                "function of input shapes (a mask multiplied in, torch.where) so the graph "
                "has one shape per input shape"
            ) from e
        raise CaptureError(
            f"{where} has a symbolic shape {tuple(val.shape)}; capture works on concrete shapes "
            "(plan per shape bucket instead)"
        ) from e


def _norm_attr(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return str(v).removeprefix("torch.")
    if isinstance(v, torch.memory_format | torch.layout):
        return str(v)
    if isinstance(v, list | tuple):
        return tuple(_norm_attr(x) for x in v)
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return repr(v)


def _needs_copy(op: str, src: torch.Tensor, out_shape: tuple[int, ...]) -> bool:
    """Whether a reshape-like view must materialize a copy for `src`'s layout."""
    if op == "contiguous":
        return not src.is_contiguous()
    probe = torch.empty_strided(
        tuple(src.shape), tuple(src.stride()), dtype=src.dtype, device="meta"
    )
    try:
        probe.view(out_shape)
    except RuntimeError:
        return True
    return False


def _returns_input(src: torch.Tensor, out: Any, attrs: dict[str, Any]) -> bool:
    """Whether a cast hands back its input itself: the dtype and strides it already has,
    and neither `copy=True` nor another memory format asked for."""
    if not isinstance(out, torch.Tensor) or attrs.get("copy"):
        return False
    fmt = attrs.get("memory_format")
    if fmt is not None and "preserve" not in str(fmt):
        return False
    return (
        out.dtype == src.dtype
        and tuple(out.shape) == tuple(src.shape)
        and tuple(out.stride()) == tuple(src.stride())
    )


class _Reader:
    """Walks an FX graph once, building tensors and nodes."""

    def __init__(self) -> None:
        self.tensors: list[TensorInfo] = []
        self.nodes: list[OpNode] = []
        self.value: dict[fx.Node, Any] = {}  # fx node -> tensor id, or tuple of ids / None
        self.unknown: set[str] = set()

    def add_tensor(
        self,
        val: torch.Tensor,
        kind: str,
        name: str,
        producer: int | None = None,
        alias_of: int | None = None,
    ) -> int:
        tid = len(self.tensors)
        self.tensors.append(
            TensorInfo(
                id=tid,
                shape=_static_shape(val, name),
                dtype=_dtype_name(val.dtype),
                kind=kind,
                producer=producer,
                alias_of=alias_of,
                name=name,
                contiguous=bool(val.is_contiguous()),
            )
        )
        return tid

    def tensor_args(self, node: fx.Node) -> tuple[list[int], dict[str, Any], list[int | None]]:
        """(unique tensor inputs in order, non-tensor attrs by schema name, ordered tensor args)."""
        schema = getattr(node.target, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
        bound: list[tuple[str, Any]] = [
            (names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(node.args)
        ]
        bound += list(node.kwargs.items())
        ordered: list[int | None] = []
        attrs: dict[str, Any] = {}
        for key, arg in bound:
            ids = self._ids(arg)
            if ids is None:
                if key not in ("device", "pin_memory", "layout"):
                    attrs[key] = _norm_attr(arg)
            else:
                ordered.extend(ids)
        unique = list(dict.fromkeys(t for t in ordered if t is not None))
        return unique, attrs, ordered

    def _ids(self, arg: Any) -> list[int | None] | None:
        """Tensor ids inside an argument, or None when it holds no graph value."""
        if isinstance(arg, fx.Node):
            v = self.value.get(arg)
            if isinstance(v, int):
                return [v]
            return None  # a symbolic int or a skipped node
        if isinstance(arg, list | tuple) and any(isinstance(a, fx.Node) for a in arg):
            out: list[int | None] = []
            for a in arg:
                v = self.value.get(a) if isinstance(a, fx.Node) else None
                out.append(v if isinstance(v, int) else None)
            return out
        return None

    def call(self, node: fx.Node) -> None:
        target = str(node.target)
        if node.target is operator.getitem:
            parent, idx = node.args[0], node.args[1]
            v = self.value.get(parent)
            self.value[node] = v[idx] if isinstance(v, tuple) else None
            return
        if any(s in target for s in _SKIP_TARGETS):
            self.value[node] = None
            return
        val = node.meta.get("val")
        vals = val if isinstance(val, list | tuple) else [val]
        if not any(isinstance(v, torch.Tensor) for v in vals):
            self.value[node] = None  # symbolic-int arithmetic or a side effect
            return
        inputs, attrs, ordered = self.tensor_args(node)
        rule = taxonomy.lookup(target)
        if rule is None:
            self.unknown.add(target)
            category, flop_rule = Category.OPAQUE, taxonomy.zero
        else:
            category, flop_rule = rule.category, rule.flops
        op = taxonomy.packet_of(target)
        if category is Category.COLLECTIVE and "group_name" in attrs:
            attrs.setdefault("group_size", group_size_of(str(attrs["group_name"])))
            if op == "batch_p2p_ops":  # one message per tensor, a tensor sent twice included
                attrs["tensor_bytes"] = tuple(
                    self.tensors[t].nbytes for t in ordered if t is not None
                )
        vals = backend_forms.canonical_values(op, attrs, vals, self._input_val(node))
        first = self.tensors[inputs[0]] if inputs else None
        if category is Category.VIEW and op in taxonomy.MAYBE_COPY_VIEWS and first is not None:
            src = self._input_val(node)
            if src is not None and _needs_copy(op, src, _static_shape(vals[0], node.name)):
                category = Category.COPY
        if op in taxonomy.MAYBE_ALIAS_CASTS and first is not None:
            src = self._input_val(node)
            if src is not None and _returns_input(src, vals[0], attrs):
                category = Category.VIEW
        index = len(self.nodes)
        alias = None
        if category is Category.VIEW and first is not None:
            alias = first.alias_of if first.alias_of is not None else first.id
        outs: list[int | None] = []
        for j, v in enumerate(vals):
            if isinstance(v, torch.Tensor):
                outs.append(
                    self.add_tensor(
                        v,
                        "activation",
                        node.name if len(vals) == 1 else f"{node.name}.{j}",
                        index,
                        alias,
                    )
                )
            else:
                outs.append(None)
        out_ids = tuple(t for t in outs if t is not None)
        out_infos = [self.tensors[t] for t in out_ids]
        ins_infos = [self.tensors[t] if t is not None else None for t in ordered]
        flops = int(flop_rule(ins_infos, out_infos, attrs))
        if category is Category.VIEW:
            read = written = 0
        else:
            read = sum(self._read_bytes(t) for t in inputs)
            written = sum(t.nbytes for t in out_infos)
        self.nodes.append(
            OpNode(
                index=index,
                name=node.name,
                target=target,
                category=category,
                inputs=tuple(inputs),
                outputs=out_ids,
                attrs=tuple(sorted(attrs.items())),
                flops=flops,
                bytes_read=read,
                bytes_written=written,
            )
        )
        self.value[node] = tuple(outs) if isinstance(val, list | tuple) else out_ids[0]

    def _input_val(self, node: fx.Node) -> torch.Tensor | None:
        a = node.args[0] if node.args else None
        v = a.meta.get("val") if isinstance(a, fx.Node) else None
        return v if isinstance(v, torch.Tensor) else None

    def _read_bytes(self, tid: int) -> int:
        t = self.tensors[tid]
        root = self.tensors[t.alias_of] if t.alias_of is not None else t
        return min(t.nbytes, root.nbytes)


def graph_from_program(
    program: torch.export.ExportedProgram, *, name: str = "", meta: dict[str, Any] | None = None
) -> OpGraph:
    """Read an exported aten program into an OpGraph."""
    kinds: dict[str, str] = {}
    for spec in program.graph_signature.input_specs:
        kind = spec.kind.name.lower()
        kinds[spec.arg.name] = {
            "parameter": "param",
            "buffer": "buffer",
            "constant_tensor": "const",
            "user_input": "input",
        }.get(kind, "const")
    return graph_from_fx(program.graph_module, kinds, name=name, meta=meta)


def graph_from_fx(
    gm: fx.GraphModule,
    placeholder_kinds: dict[str, str] | None = None,
    *,
    name: str = "",
    meta: dict[str, Any] | None = None,
) -> OpGraph:
    """Read an aten-level FX graph whose nodes carry `meta["val"]` into an OpGraph.

    `placeholder_kinds` maps placeholder names to "input" / "param" / "buffer" / "const";
    placeholders not named there are user inputs.
    """
    kinds = placeholder_kinds or {}
    r = _Reader()
    outputs: list[int] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                r.value[node] = r.add_tensor(val, kinds.get(node.name, "input"), node.name)
            else:
                r.value[node] = None
        elif node.op == "get_attr":
            val = getattr(gm, str(node.target), None)
            r.value[node] = (
                r.add_tensor(val, "const", node.name) if isinstance(val, torch.Tensor) else None
            )
        elif node.op in ("call_function", "call_method", "call_module"):
            r.call(node)
        elif node.op == "output":
            for v in _flatten(node.args[0]):
                if isinstance(v, fx.Node) and isinstance(r.value.get(v), int):
                    outputs.append(r.value[v])
    for target in sorted(r.unknown):
        warnings.warn(
            f"op {target} is not in fusion-planner's op table (planner/ir/taxonomy.py): it "
            "runs as its own kernel, is never fused, and its cost is not estimated",
            UnknownOpWarning,
            stacklevel=3,
        )
    return OpGraph.build(r.nodes, r.tensors, list(dict.fromkeys(outputs)), name=name, meta=meta)


def _flatten(x: Any) -> Sequence[Any]:
    if isinstance(x, list | tuple):
        return [y for item in x for y in _flatten(item)]
    if isinstance(x, dict):
        return [y for item in x.values() for y in _flatten(item)]
    return [x]
