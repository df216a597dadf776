"""Model specifications shared by every CLI command and by tuning jobs.

A model spec is either `zoo:<name>` (see `zoo`) or `path/to/file.py:factory`,
where `factory(**shape_params)` returns `(module, example_inputs)`. A shape spec is
`B=8,S=512,D=768,H=12`; parameters the spec leaves out take the model's defaults.

A spec's `dims` maps each shape parameter to the input axes whose size it is (the axes a
`--dynamic NAME=LO..HI` range makes symbolic). Zoo models declare them; a file factory may
declare them as a `dims` attribute, and otherwise they are inferred: the factory is built
at three values of the parameter (on the meta device when it allows) and every input axis
whose size equals the parameter at each value follows it. Input axes are numbered over the
tensor leaves of the example inputs in pytree order, the order the captured graph takes
its inputs in.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

import zoo
from planner.errors import ModelSpecError

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ModelSpecError(f"unknown dtype {name!r}; use one of fp32, bf16, fp16") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


MAX_SIZE = 1 << 40  # one dimension's size; past this no tensor fits any machine


def parse_shape(text: str | None) -> dict[str, int]:
    """ "B=8,S=512" -> {"B": 8, "S": 512}. Values may use k/M suffixes or 2^n."""
    if not text:
        return {}
    out: dict[str, int] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\S+)", part)
        if not m:
            raise ModelSpecError(f"bad shape term {part!r}: expected NAME=VALUE, e.g. B=8,S=512")
        if m.group(1) in out:
            raise ModelSpecError(f"shape parameter {m.group(1)} is given twice in {text!r}")
        out[m.group(1)] = _parse_int(m.group(2), part)
    return out


def _parse_int(v: str, where: str) -> int:
    m = re.fullmatch(r"2\^(\d+)", v)
    if m:
        v = str(1 << min(int(m.group(1)), 63))
    mult = {"k": 1 << 10, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1], 1)
    try:
        n = int(v[:-1] if mult > 1 else v) * mult
    except ValueError:
        raise ModelSpecError(f"bad value in {where!r}: expected an integer") from None
    if n <= 0:
        raise ModelSpecError(f"bad value in {where!r}: sizes must be positive")
    if n > MAX_SIZE:
        raise ModelSpecError(f"bad value in {where!r}: sizes above 2^40 cannot be allocated")
    return n


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model spec: how to build it, its shape parameters and dim mapping."""

    spec: str
    params: dict[str, int]
    # param -> (input, axis), or a tuple of them when several inputs follow the parameter
    dims: Mapping[str, Any] = field(default_factory=dict)
    transformer_like: bool = False

    @property
    def label(self) -> str:
        shape = ",".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.spec}[{shape}]"

    def with_params(self, **overrides: int) -> ModelSpec:
        return ModelSpec(self.spec, {**self.params, **overrides}, self.dims, self.transformer_like)

    def build(
        self,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> tuple[torch.nn.Module, tuple[Any, ...]]:
        if self.spec.startswith("zoo:"):
            return zoo.get(self.spec[4:]).build(self.params, dtype=dtype, device=device, seed=seed)
        factory = _load_factory(self.spec)
        torch.manual_seed(seed)
        kwargs = _accepted(factory, self.params)
        try:
            result = factory(**kwargs)
        except Exception as e:  # the user's code: one clear error, the cause chained
            raise ModelSpecError(
                f"{self.spec}({', '.join(f'{k}={v}' for k, v in kwargs.items())}) raised "
                f"{type(e).__name__}: {e}"
            ) from e
        module, inputs = _checked(self.spec, result)
        module = module.to(device=device, dtype=dtype).eval()

        def place(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            return x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype)

        return module, tuple(pytree.tree_map(place, x) for x in inputs)


def resolve(spec: str, shape: str | dict[str, int] | None = None) -> ModelSpec:
    """Resolve `zoo:name` or `file.py:factory` with a shape spec into a ModelSpec."""
    overrides = parse_shape(shape) if isinstance(shape, str) or shape is None else dict(shape)
    if spec.startswith("zoo:"):
        m = zoo.get(spec[4:])
        return ModelSpec(spec, m.params(overrides), dict(m.dims), m.transformer_like)
    if ":" not in spec:
        raise ModelSpecError(
            f"bad model spec {spec!r}: use zoo:<name> (one of {', '.join(sorted(zoo.ZOO))}) "
            "or path/to/file.py:factory"
        )
    factory = _load_factory(spec)
    _accepted(factory, overrides)  # a shape naming a parameter it lacks is refused here
    defaults = {
        name: p.default
        for name, p in inspect.signature(factory).parameters.items()
        if isinstance(p.default, int) and not isinstance(p.default, bool)
    }
    params = {**defaults, **overrides}
    declared = getattr(factory, "dims", None)
    dims = dict(declared) if declared is not None else InferredDims(spec, params)
    return ModelSpec(spec, params, dims, bool(getattr(factory, "transformer_like", False)))


class KeywordCall(torch.nn.Module):
    """A model whose factory gave keyword arguments (`{"input_features": x,
    "decoder_input_ids": y}`), called positionally: `forward(*values)` is
    `model(**dict(zip(names, values)))`. Encoder-decoder models need this: their decoder
    inputs come after arguments that must stay unset."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *values: Any) -> Any:
        return self.model(**dict(zip(self.names, values)))


def _checked(spec: str, result: Any) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """A factory's `(module, example_inputs)`, the inputs as a tuple of positional args."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ModelSpecError(
            f"{spec} returned {type(result).__name__}; a factory must return "
            "(module, example_inputs), example_inputs a tensor or a tuple of positional args"
        )
    module, inputs = result
    if not isinstance(module, torch.nn.Module):
        raise ModelSpecError(
            f"{spec} returned a {type(module).__name__} as its module; expected a torch.nn.Module"
        )
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, dict) and inputs and all(isinstance(k, str) for k in inputs):
        module, inputs = KeywordCall(module, tuple(inputs)), tuple(inputs.values())
    if not isinstance(inputs, tuple | list):
        raise ModelSpecError(
            f"{spec} returned example_inputs of type {type(inputs).__name__}; expected a tensor, "
            "a tuple of positional args (nested dicts/lists of tensors are fine inside it) or a "
            "dict of keyword args"
        )
    if not any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(inputs)):
        raise ModelSpecError(f"{spec}'s example inputs hold no tensor")
    return module, tuple(inputs)


def tensor_shapes(inputs: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes of the tensor leaves of `inputs`, in pytree order (how `dims` numbers
    inputs)."""
    return tuple(tuple(x.shape) for x in pytree.tree_leaves(inputs) if isinstance(x, torch.Tensor))


# ---- dims of a file factory, inferred ------------------------------------------------------
# (spec, param, other params) -> input axes that follow the param
_INFERRED: dict[tuple[str, str, tuple[tuple[str, int], ...]], tuple[tuple[int, int], ...]] = {}


class InferredDims(Mapping[str, tuple[tuple[int, int], ...]]):
    """A file factory's parameter -> input axes, each found the first time it is asked for
    (`infer_axes`). Iterates over the factory's integer parameters without building it."""

    def __init__(self, spec: str, params: Mapping[str, int]):
        self.spec = spec
        self.params = dict(params)

    def __getitem__(self, name: str) -> tuple[tuple[int, int], ...]:
        if name not in self.params:
            raise KeyError(name)
        return infer_axes(self.spec, self.params, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InferredDims):
            return NotImplemented
        return (self.spec, self.params) == (other.spec, other.params)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"InferredDims({self.spec!r}, {sorted(self.params)})"


def _probe_values(v0: int) -> list[int]:
    """Other values of a parameter to build at: doubling and halving keep the divisibility
    models often need (heads, patches); +-1 for factories that accept only a few sizes."""
    out = []
    for v in (2 * v0, v0 // 2, v0 + 1, v0 - 1, 4 * v0):
        if v >= 1 and v != v0 and v not in out:
            out.append(v)
    return out


def _probe(spec: str, factory: Any, params: dict[str, int]) -> tuple[tuple[int, ...], ...]:
    """Input shapes of the factory at `params`, built on the meta device when it allows
    (no memory, no init time), else on the CPU."""
    kwargs = _accepted(factory, params)
    try:
        with torch.device("meta"):
            result = factory(**kwargs)
    except Exception:  # a factory may need real data (e.g. .item() while building)
        result = factory(**kwargs)
    return tensor_shapes(_checked(spec, result)[1])


def infer_axes(spec: str, params: Mapping[str, int], name: str) -> tuple[tuple[int, int], ...]:
    """The (input, axis) pairs of `spec`'s example inputs whose size is `name`.

    Builds the factory at `params` and at two more values of `name` (the others fixed) and
    compares every tensor input's shape. An axis follows `name` when its size equals the
    parameter at every value built. Raises ModelSpecError when no axis follows, when an
    axis changes with `name` without equalling it (a bucket range could not be mapped onto
    it), or when the inputs' structure changes with `name`. Cached per factory, parameter
    and other parameters' values.
    """
    params = dict(params)
    key = (spec, name, tuple(sorted((k, v) for k, v in params.items() if k != name)))
    if key in _INFERRED:
        return _INFERRED[key]
    factory = _load_factory(spec)
    v0 = params[name]
    try:
        probes = [(v0, _probe(spec, factory, params))]
    except ModelSpecError:
        raise
    except Exception as e:
        raise ModelSpecError(
            f"building {spec} at {params} to find which input axes follow {name} failed: "
            f"{type(e).__name__}: {e}"
        ) from e
    failures = []
    for v in _probe_values(v0):
        try:
            probes.append((v, _probe(spec, factory, {**params, name: v})))
        except Exception as e:  # this value may be invalid for the model; try the next
            failures.append(f"{name}={v}: {type(e).__name__}: {str(e)[:120]}")
        if len(probes) == 3:
            break
    if len(probes) < 2:
        raise ModelSpecError(
            f"cannot tell which input axes follow {name}: {spec} builds only at {name}={v0} "
            f"({'; '.join(failures)}). Give the factory a `dims` attribute, e.g. "
            f'factory.dims = {{"{name}": (0, 1)}} for input 0 axis 1'
        )
    _, base = probes[0]
    shown = ", ".join(f"{name}={v}: {[list(s) for s in shapes]}" for v, shapes in probes)
    for _, shapes in probes[1:]:
        if len(shapes) != len(base) or any(len(a) != len(b) for a, b in zip(shapes, base)):
            raise ModelSpecError(
                f"{spec}'s example inputs change structure with {name} ({shown}), so which "
                f"axes follow {name} is ambiguous. Give the factory a `dims` attribute."
            )
    following: list[tuple[int, int]] = []
    unmapped: list[str] = []
    for i, shape in enumerate(base):
        for a in range(len(shape)):
            sizes = [shapes[i][a] for _, shapes in probes]
            if len(set(sizes)) == 1:
                continue
            if all(size == v for size, (v, _) in zip(sizes, probes)):
                following.append((i, a))
            else:
                unmapped.append(f"input {i} axis {a} has sizes {sizes}")
    values = [v for v, _ in probes]
    if unmapped:
        raise ModelSpecError(
            f"in {spec}, {'; '.join(unmapped)} at {name}={values}: it changes with {name} "
            f"but is not equal to it, so a range of {name} does not say which sizes it takes. "
            f"Give the factory a `dims` attribute naming the axes that are {name} exactly."
        )
    if not following:
        raise ModelSpecError(
            f"no input axis of {spec} follows {name} (tensor input shapes {shown}): {name} "
            "shapes the model, not its inputs, and cannot be dynamic. Pick a parameter that "
            "sets an input size, or give the factory a `dims` attribute."
        )
    _INFERRED[key] = tuple(following)
    return _INFERRED[key]


def _load_factory(spec: str) -> Any:
    path_text, _, attr = spec.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise ModelSpecError(f"model file {path} does not exist (from spec {spec!r})")
    mod_name = f"_fusion_planner_user_{abs(hash(str(path.resolve())))}"
    if mod_name not in sys.modules:
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ModelSpecError(f"cannot import {path}")
        module = importlib.util.module_from_spec(loader_spec)
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:
            raise ModelSpecError(f"importing {path} failed: {type(e).__name__}: {e}") from e
        sys.modules[mod_name] = module
    factory = getattr(sys.modules[mod_name], attr, None)
    if not callable(factory):
        raise ModelSpecError(f"{path} has no callable {attr!r}")
    return factory


def _accepted(fn: Any, params: dict[str, int]) -> dict[str, int]:
    sig = inspect.signature(fn)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return dict(params)
    unknown = set(params) - set(sig.parameters)
    if unknown:
        raise ModelSpecError(f"factory {fn.__name__} takes no parameter(s) {sorted(unknown)}")
    return dict(params)
