"""Capture: a real torch model + example inputs -> OpGraph (and the aten program behind it).

Why torch.export (non-strict) followed by `run_decompositions({})`:
- export gives one whole-graph aten program with FakeTensor metadata (shape, dtype,
  strides) on every node, which is exactly what FLOP and byte counting need; dynamo
  traces (torch.compile backends) would hand us graph breaks instead of one graph;
- an *empty* decomposition table functionalizes the program (in-place ops such as
  `relu_` become `relu`, so groups can be reordered safely) while keeping composite ops
  whole: `linear`, `layer_norm`, `softmax`, `gelu` and `scaled_dot_product_attention`
  stay one node each, the granularity of seed 001's graph and of the fusion patterns.
  The default core-aten decomposition would split a LayerNorm into ~10 nodes;
- the program is also what `planner.realize` splits into groups and compiles, so the
  OpGraph node names map 1:1 onto FX nodes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import operator
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from planner import taxonomy
from planner.errors import CaptureError
from planner.ir import DTYPE_BYTES, Category, OpGraph, OpNode, TensorInfo


class UnknownOpWarning(UserWarning):
    """An op the taxonomy does not know was captured as opaque."""


@dataclass(frozen=True)
class Captured:
    """An OpGraph together with the exported program it was read from."""

    graph: OpGraph
    program: torch.export.ExportedProgram
    example_inputs: tuple[Any, ...]

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


def capture(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    name: str = "",
    meta: dict[str, Any] | None = None,
) -> OpGraph:
    """Capture `module` called on `example_inputs` as an OpGraph at aten level."""
    return export_model(module, example_inputs, name=name, meta=meta).graph


def export_model(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    name: str = "",
    meta: dict[str, Any] | None = None,
) -> Captured:
    """Export `module` and read its aten program into an OpGraph; see module docstring."""
    if not isinstance(module, torch.nn.Module):
        raise CaptureError(f"capture expects a torch.nn.Module, got {type(module).__name__}")
    args = _as_args(example_inputs)
    try:
        with _quiet_torch():
            program = torch.export.export(module, args, strict=False)
            program = program.run_decompositions({})
    except Exception as e:  # torch raises many types here; the user needs one
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureError(
            f"torch.export could not trace {type(module).__name__} "
            f"({type(e).__name__}: {first[:300]}). Make forward() traceable: no data-dependent "
            "Python control flow or .item() on tensors, and pass inputs the model accepts."
        ) from e
    graph = graph_from_program(program, name=name or type(module).__name__, meta=meta)
    return Captured(graph, program, args)


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


def _as_args(example_inputs: Any) -> tuple[Any, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, list | tuple):
        return tuple(example_inputs)
    raise CaptureError(
        f"example_inputs must be a tensor or a tuple of model arguments, got "
        f"{type(example_inputs).__name__}"
    )


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise CaptureError(f"dtype {name} is not supported by the planner's byte model")
    return name


def _static_shape(val: torch.Tensor, where: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in val.shape)
    except (TypeError, RuntimeError) as e:
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
            f"op {target} is not in the fusion-planner taxonomy: captured as opaque (it will "
            "never be fused). Add a rule for it in planner/taxonomy.py.",
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
