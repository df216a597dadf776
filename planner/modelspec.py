"""Model specifications shared by every CLI command and by tuning jobs.

A model spec is either `zoo:<name>` (see `planner.zoo`) or `path/to/file.py:factory`,
where `factory(**shape_params)` returns `(module, example_inputs)`. A shape spec is
`B=8,S=512,D=768,H=12`; parameters the spec leaves out take the model's defaults.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from planner import zoo
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
    dims: dict[str, tuple[int, int]] = field(default_factory=dict)
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
        except Exception as e:
            raise ModelSpecError(
                f"{self.spec}({', '.join(f'{k}={v}' for k, v in kwargs.items())}) raised "
                f"{type(e).__name__}: {e}"
            ) from e
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ModelSpecError(f"{self.spec} must return (module, example_inputs)")
        module, inputs = result
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if not isinstance(module, torch.nn.Module) or not isinstance(inputs, tuple | list):
            raise ModelSpecError(
                f"{self.spec} returned ({type(module).__name__}, {type(inputs).__name__}); "
                "expected (a torch.nn.Module, a tuple of example inputs)"
            )
        if not any(isinstance(x, torch.Tensor) for x in torch.utils._pytree.tree_leaves(inputs)):
            raise ModelSpecError(f"{self.spec}'s example inputs hold no tensor")
        module = module.to(device=device, dtype=dtype).eval()
        inputs = tuple(
            x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype)
            if isinstance(x, torch.Tensor)
            else x
            for x in inputs
        )
        return module, inputs


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
    defaults = {
        name: p.default
        for name, p in inspect.signature(factory).parameters.items()
        if isinstance(p.default, int) and not isinstance(p.default, bool)
    }
    params = {**defaults, **overrides}
    dims = getattr(factory, "dims", {})
    return ModelSpec(spec, params, dict(dims), bool(getattr(factory, "transformer_like", False)))


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
