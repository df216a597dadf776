"""A model's inputs and outputs as flat tensor leaves, and back.

Real models return library objects: a `transformers` `ModelOutput` (a dict registered
with torch's pytree), a `DynamicCache` (a plain object holding lists of layer objects that
hold tensors, registered with nothing), dataclasses, nested tuples with `None` entries.
Capture exports the model with a forward that takes and returns flat tuples of tensors
(planner.ir.capture), and a realized plan hands the user back the structure eager returned.

`Structure.of(value)` walks a value depth first:
- a tensor is a leaf (the same tensor object twice is one leaf);
- a plain list, tuple or dict is walked item by item and rebuilt directly; another
  type registered with `torch.utils._pytree` (namedtuple, OrderedDict,
  `ModelOutput`, ...) is split into its children with that registration, and rebuilt
  with it;
- any other object with a `__dict__` or `__slots__` (a dataclass, a cache object) is
  walked through its attributes and rebuilt as pickle would rebuild it: a new instance
  (`cls.__new__`, no `__init__`) given rebuilt attributes;
- everything without a tensor inside is a constant: immutable atoms (None, numbers,
  strings, dtypes, devices, modules) are shared, other values are copied on each rebuild,
  so that a caller who mutates one output (a cache grows) never changes the next.

`Structure.build(flat)` rebuilds the value with `flat[i]` in place of leaf `i`; a realized
plan pays it on every call, so it is kept cheaper than `copy.deepcopy` of a template
(docs/capture.md has the figures). `Structure.signature` describes the structure without
values: two walks of one model (eager and traced) must give the same one.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import types
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

# Values without tensors inside that are safe to share between rebuilt outputs.
_ATOMS = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.dtype,
    torch.device,
    torch.Size,
    torch.memory_format,
    torch.layout,
    torch.nn.Module,  # a module in an output is the model's own: shared, never copied
    type,
    enum.Enum,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    range,
    slice,
    type(Ellipsis),
)


class StructureError(TypeError):
    """A value holds tensors in an object that cannot be walked or rebuilt."""


class _Node:
    """One position of a walked structure; `build` makes its value from flat leaves."""

    has_leaf = False

    def build(self, flat: Sequence[Any], memo: dict[int, Any]) -> Any:
        raise NotImplementedError

    def signature(self) -> Any:
        raise NotImplementedError


class _Leaf(_Node):
    has_leaf = True

    def __init__(self, index: int):
        self.index = index

    def build(self, flat: Sequence[Any], memo: dict[int, Any]) -> Any:
        return flat[self.index]

    def signature(self) -> Any:
        return ("leaf", self.index)


class _Const(_Node):
    def __init__(self, value: Any):
        self.value = value
        self.shared = _immutable(value)

    def build(self, flat: Sequence[Any], memo: dict[int, Any]) -> Any:
        return self.value if self.shared else copy.deepcopy(self.value)

    def signature(self) -> Any:
        v = self.value
        return ("const", type(v).__qualname__, v if isinstance(v, bool | int | str) else None)


class _Tree(_Node):
    """A pytree-registered node, split one level with its registration."""

    has_leaf = True

    def __init__(self, spec: pytree.TreeSpec, children: list[_Node], kind: type):
        self.spec, self.children, self.kind = spec, children, kind

    def build(self, flat: Sequence[Any], memo: dict[int, Any]) -> Any:
        return pytree.tree_unflatten([c.build(flat, memo) for c in self.children], self.spec)

    def signature(self) -> Any:
        return (
            "tree",
            self.kind.__qualname__,
            str(self.spec),
            [c.signature() for c in self.children],
        )


class _Builtin(_Node):
    """A plain list, tuple or dict: rebuilt directly (faster than through its pytree spec)."""

    has_leaf = True

    def __init__(self, kind: type, keys: list[Any] | None, children: list[_Node]):
        self.kind, self.keys, self.children = kind, keys, children

    def build(self, flat: Sequence[Any], memo: dict[int, Any]) -> Any:
        values = [c.build(flat, memo) for c in self.children]
        if self.keys is not None:
            return dict(zip(self.keys, values))
        return values if self.kind is list else tuple(values)

    def signature(self) -> Any:
        return (self.kind.__qualname__, self.keys, [c.signature() for c in self.children])


class _Object(_Node):
    """An unregistered object holding tensors, rebuilt attribute by attribute. Built once
    per rebuild (`memo`), so an object reached twice stays one object."""

    has_leaf = True

    def __init__(self, obj_id: int, kind: type, attrs: dict[str, _Node], slots: bool):
        self.obj_id, self.kind, self.attrs, self.slots = obj_id, kind, attrs, slots

    def build(self, flat: Sequence[Any], memo: dict[int, Any]) -> Any:
        if self.obj_id in memo:
            return memo[self.obj_id]
        new = self.kind.__new__(self.kind)
        memo[self.obj_id] = new
        for name, node in self.attrs.items():
            if self.slots:
                object.__setattr__(new, name, node.build(flat, memo))
            else:
                new.__dict__[name] = node.build(flat, memo)
        return new

    def signature(self) -> Any:
        return (
            "object",
            self.kind.__qualname__,
            [(k, v.signature()) for k, v in self.attrs.items()],
        )


def _immutable(v: Any) -> bool:
    if isinstance(v, _ATOMS):
        return True
    if isinstance(v, tuple | frozenset):
        return all(_immutable(x) for x in v)
    return False


def _registered(v: Any) -> tuple[list[Any], pytree.TreeSpec] | None:
    """One level of `v`'s pytree registration: (children, spec), or None if unregistered."""
    children, spec = pytree.tree_flatten(v, is_leaf=lambda x: x is not v)
    if spec.is_leaf():
        return None
    return children, spec


def _slot_names(kind: type) -> list[str]:
    names: list[str] = []
    for k in kind.__mro__:
        s = k.__dict__.get("__slots__", ())
        names += (
            [s] if isinstance(s, str) else [n for n in s if n not in ("__dict__", "__weakref__")]
        )
    return names


class _Walker:
    def __init__(self) -> None:
        self.leaves: list[torch.Tensor] = []
        self.index: dict[int, int] = {}  # id(tensor) -> leaf index
        self.objects: dict[int, _Object] = {}
        self.active: set[int] = set()  # containers on the current path (cycle guard)

    def walk(self, v: Any, where: str) -> _Node:
        if isinstance(v, torch.Tensor):
            i = self.index.get(id(v))
            if i is None:
                i = self.index[id(v)] = len(self.leaves)
                self.leaves.append(v)
            return _Leaf(i)
        if isinstance(v, _ATOMS):
            return _Const(v)
        if id(v) in self.objects:
            return self.objects[id(v)]
        if id(v) in self.active:
            raise StructureError(f"{where} refers back to itself through a pytree container")
        self.active.add(id(v))
        try:
            return self._walk_container(v, where)
        finally:
            self.active.discard(id(v))

    def _walk_container(self, v: Any, where: str) -> _Node:
        if type(v) in (list, tuple, dict):
            keys = list(v) if type(v) is dict else None
            values = list(v.values()) if keys is not None else list(v)
            nodes = [self.walk(c, f"{where}[{i!r}]") for i, c in zip(keys or range(len(v)), values)]
            if not any(n.has_leaf for n in nodes):
                return _Const(v)
            return _Builtin(type(v), keys, nodes)
        reg = _registered(v)
        if reg is not None:
            children, spec = reg
            nodes = [self.walk(c, f"{where}[{i}]") for i, c in enumerate(children)]
            if not any(n.has_leaf for n in nodes):
                return _Const(v)
            return _Tree(spec, nodes, type(v))
        if isinstance(v, set | frozenset):
            if any(isinstance(x, torch.Tensor) for x in v):
                raise StructureError(f"{where} is a set holding tensors: their order is undefined")
            return _Const(v)
        kind = type(v)
        slots = not hasattr(v, "__dict__") and bool(_slot_names(kind))
        if not slots and not hasattr(v, "__dict__"):
            return _Const(v)  # an opaque value (C object): no tensors can be seen in it
        node = _Object(id(v), kind, {}, slots)
        self.objects[id(v)] = node  # before the attributes: an attribute may point back here
        names = _slot_names(kind) if slots else list(vars(v))
        for name in names:
            if slots and not hasattr(v, name):
                continue
            node.attrs[name] = self.walk(
                getattr(v, name) if slots else vars(v)[name], f"{where}.{name}"
            )
        if not any(n.has_leaf for n in node.attrs.values()):
            del self.objects[id(v)]
            return _Const(v)
        return node


@dataclasses.dataclass(frozen=True)
class Structure:
    """A walked value: `n_leaves` tensors and how to put them back (module docstring)."""

    root: _Node
    n_leaves: int

    @classmethod
    def of(cls, value: Any) -> tuple[Structure, list[torch.Tensor]]:
        """Walk `value`: its structure and its distinct tensors in walk order."""
        w = _Walker()
        root = w.walk(value, "output")
        return cls(root, len(w.leaves)), w.leaves

    def build(self, flat: Sequence[Any]) -> Any:
        if len(flat) != self.n_leaves:
            raise StructureError(f"{len(flat)} values for a structure of {self.n_leaves} tensors")
        return self.root.build(flat, {})

    @functools.cached_property
    def signature(self) -> Any:
        return self.root.signature()

    @functools.cached_property
    def flat_tuple(self) -> bool:
        """Whether the value is a tuple of distinct tensors in leaf order (flat already)."""
        r = self.root
        return (
            isinstance(r, _Builtin)
            and r.kind is tuple
            and all(isinstance(c, _Leaf) and c.index == i for i, c in enumerate(r.children))
        )

    @functools.cached_property
    def plain_call(self) -> bool:
        """Whether this is the structure of a call `(args, {})` whose positional arguments
        are distinct tensors, nothing else: its flat tensors are the arguments themselves."""
        r = self.root
        if not (isinstance(r, _Builtin) and r.kind is tuple and len(r.children) == 2):
            return False
        args, kwargs = r.children
        return (
            Structure(args, self.n_leaves).flat_tuple
            and isinstance(kwargs, _Const)
            and kwargs.value == {}
        )


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The distinct tensors inside `value`, in walk order."""
    return Structure.of(value)[1]


def flat_values(value: Any) -> list[Any]:
    """Every leaf of `value` in walk order, tensors and non-tensor values alike, each
    occurrence counted (for comparing two outputs position by position)."""
    out: list[Any] = []
    _flat_into(value, out, set())
    return out


def _flat_into(v: Any, out: list[Any], active: set[int]) -> None:
    if isinstance(v, (torch.Tensor, *_ATOMS)):
        out.append(v)
        return
    if id(v) in active:
        return
    active.add(id(v))
    reg = _registered(v)
    if reg is not None:
        for c in reg[0]:
            _flat_into(c, out, active)
    elif hasattr(v, "__dict__"):
        for c in vars(v).values():
            _flat_into(c, out, active)
    elif _slot_names(type(v)):
        for name in _slot_names(type(v)):
            if hasattr(v, name):
                _flat_into(getattr(v, name), out, active)
    else:
        out.append(v)
    active.discard(id(v))


def describe_mismatch(expected: Any, got: Any, where: str = "value") -> str:
    """Where two signatures (`Structure.signature`) first differ, in words. `where="call"`
    names the parts of a call signature `(args, kwargs)` as such."""
    if where == "call" and _is_builtin(expected, "tuple") and _is_builtin(got, "tuple"):
        for name, a, b in zip(("args", "kwargs"), expected[2], got[2]):
            if a != b:
                return describe_mismatch(a, b, name)
    return _diff(expected, got, where) or "the same structure"


def _is_builtin(sig: Any, kind: str) -> bool:
    return isinstance(sig, tuple) and len(sig) == 3 and sig[0] == kind and isinstance(sig[2], list)


def _diff(a: Any, b: Any, where: str) -> str | None:
    if a == b:
        return None
    if not (isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0]):
        return f"{where}: expected {_what(a)}, got {_what(b)}"
    tag = a[0]
    if tag == "const":
        return f"{where}: expected {_what(a)}, got {_what(b)}"
    if tag == "object" or tag == "tree":
        if a[1] != b[1] or (tag == "tree" and a[2] != b[2]):
            return f"{where}: expected {_what(a)}, got {_what(b)}"
        pairs_a = a[2] if tag == "object" else list(enumerate(a[3]))
        pairs_b = b[2] if tag == "object" else list(enumerate(b[3]))
        fmt = ".{}" if tag == "object" else "[{}]"
    elif tag in ("tuple", "list", "dict"):
        if a[1] != b[1] or len(a[2]) != len(b[2]):
            return f"{where}: expected {_what(a)}, got {_what(b)}"
        keys = a[1] if a[1] is not None else range(len(a[2]))
        pairs_a, pairs_b, fmt = list(zip(keys, a[2])), list(zip(keys, b[2])), "[{!r}]"
    else:
        return f"{where}: expected {_what(a)}, got {_what(b)}"
    if len(pairs_a) != len(pairs_b):
        return f"{where}: expected {_what(a)}, got {_what(b)}"
    for (k, x), (_, y) in zip(pairs_a, pairs_b):
        found = _diff(x, y, where + fmt.format(k))
        if found:
            return found
    return f"{where}: expected {_what(a)}, got {_what(b)}"


def _what(sig: Any) -> str:
    """A signature node in words: 'a tensor', 'bool False', 'a dict with keys [...]'."""
    if not isinstance(sig, tuple) or not sig:
        return repr(sig)
    tag = sig[0]
    if tag == "leaf":
        return "a tensor"
    if tag == "const":
        if sig[1] == "NoneType":
            return "None"
        return f"{sig[1]} {sig[2]!r}" if sig[2] is not None else f"a {sig[1]} without tensors"
    if tag in ("object", "tree"):
        return f"a {sig[1]}"
    if tag == "dict":
        return f"a dict with keys {sig[1]}"
    if tag in ("tuple", "list"):
        return f"a {tag} of {len(sig[2])}"
    return repr(sig)
