"""planner.realize.compilers: one compile per distinct group within one realization.

Layers that give groups with the same subgraph (up to names), inputs of the same layouts and
the same compile options are compiled once and share the callable; groups that differ in a
shape, a dtype, a stride or a constant are compiled each. Compiles are counted with a
compiler that runs the subgraph as FX code (fast), and once through Inductor itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from planner.fusion.partition import Partition
from planner.ir.capture import export_model
from planner.realize.compilers import SharedCompiles, compile_key
from planner.realize.realizer import RealizeWarning, realize


class Layer(nn.Module):
    def __init__(self, d: int = 8, scale: float = 0.5):
        super().__init__()
        self.lin, self.scale = nn.Linear(d, d), scale

    def forward(self, x):
        return torch.relu(self.lin(x)) * self.scale


class Stack(nn.Module):
    def __init__(self, n: int = 3):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Pair(nn.Module):
    """Two layers side by side; `differ` makes the second one's group differ in one way."""

    def __init__(self, differ: str):
        super().__init__()
        self.differ = differ
        self.a, self.b = Layer(), Layer(scale=2.0 if differ == "constant" else 0.5)
        if differ == "dtype":
            self.b.double()

    def forward(self, x, y):
        return self.a(x), self.b(y.t() if self.differ == "stride" else y)


def pair_inputs(differ: str):
    torch.manual_seed(0)
    x = torch.randn(8, 8)
    y = {"shape": torch.randn(5, 8), "dtype": torch.randn(8, 8, dtype=torch.float64)}
    return x, y.get(differ, torch.randn(8, 8))


def by_layer(graph) -> Partition:
    """One group per layer (linear, relu, mul and their numbered copies), other ops alone."""
    layers: dict[str, list[int]] = {}
    rest: list[list[int]] = []
    for n in graph.nodes:
        op, _, k = n.name.partition("_")
        if op in ("linear", "relu", "mul"):
            layers.setdefault(k, []).append(n.index)
        else:
            rest.append([n.index])
    return Partition.from_groups(graph, [*layers.values(), *rest])


class Counting:
    """A group compiler that runs the subgraph as FX code and keeps what it was given."""

    def __init__(self):
        self.calls: list[tuple[torch.fx.GraphModule, tuple]] = []

    def __call__(self, gm, fakes, fake_mode):
        self.calls.append((gm, fakes))
        return gm.forward


def eager(module, inputs):
    with torch.no_grad():
        return module(*inputs)


@pytest.mark.parametrize("propagate", [True, False])
def test_identical_layers_compile_once_and_match_eager(propagate):
    torch.manual_seed(0)
    module, x = Stack(3), torch.randn(4, 8)
    c = export_model(module, (x,))
    p = by_layer(c.graph)
    counting = Counting()
    kw = dict(realizations="inductor", compiler=counting, propagate_layouts=propagate)
    r = realize(c, p, share_compiles=True, **kw)
    assert len(counting.calls) == 1 and [g.compiled for g in r.groups] == [True] * 3
    assert [g.reuses for g in r.groups] == [None, 0, 0]
    assert "reuses group 0's compiled kernel" in r.groups[2].note
    torch.testing.assert_close(r(x), eager(module, (x,)))
    x2 = torch.randn(4, 8)
    torch.testing.assert_close(r(x2), eager(module, (x2,)))
    # a compiler given is left alone unless asked: it may tell groups apart by name
    alone = Counting()
    r = realize(c, p, **{**kw, "compiler": alone})
    assert len(alone.calls) == 3 and all(g.reuses is None for g in r.groups)


def test_inductor_is_shared_by_default(monkeypatch):
    calls = []

    def standalone(gm, inputs, dynamic_shapes, options):
        calls.append(gm)
        return gm.forward

    monkeypatch.setattr(torch._inductor, "standalone_compile", standalone)
    torch.manual_seed(0)
    module, x = Stack(4), torch.randn(4, 8)
    c = export_model(module, (x,))
    r = realize(c, by_layer(c.graph), realizations="inductor")
    assert len(calls) == 1 and [g.reuses for g in r.groups] == [None, 0, 0, 0]
    torch.testing.assert_close(r(x), eager(module, (x,)))
    r = realize(c, by_layer(c.graph), realizations="inductor", share_compiles=False)
    assert len(calls) == 1 + 4


@pytest.mark.parametrize("differ", ["none", "shape", "dtype", "stride", "constant"])
def test_groups_differing_in_one_thing_are_compiled_each(differ):
    module = Pair(differ)
    inputs = pair_inputs(differ)
    c = export_model(module, inputs)
    counting = Counting()
    with torch.no_grad():
        r = realize(c, by_layer(c.graph), realizations="inductor", compiler=counting,
                    share_compiles=True)  # fmt: skip
    layers = [g for g in r.groups if g.realization == "inductor"]
    assert len(layers) == 2 and all(g.compiled for g in layers)
    assert len(counting.calls) == (1 if differ == "none" else 2)
    for got, want in zip(r(*inputs), eager(module, inputs)):
        torch.testing.assert_close(got, want)


def test_compile_key_ignores_names_and_keys_layout_details():
    module, inputs = Pair("none"), pair_inputs("none")
    c = export_model(module, inputs)
    counting = Counting()
    realize(c, by_layer(c.graph), realizations="inductor", compiler=counting)
    (ga, fa), (gb, fb) = counting.calls
    names = [[n.name for n in g.graph.nodes if n.op == "placeholder"] for g in (ga, gb)]
    assert names[0] != names[1]  # different weights, by name
    assert compile_key(counting, ga, fa) == compile_key(counting, gb, fb) is not None
    assert compile_key(Counting(), gb, fb) != compile_key(counting, ga, fa)  # other compiler
    # one input at another storage offset, or on another device
    shifted = torch.empty(fa[0].numel() + 1)[1:].view(fa[0].shape)
    assert compile_key(counting, ga, (shifted, *fa[1:])) != compile_key(counting, ga, fa)
    meta = torch.empty(fa[0].shape, device="meta")
    assert compile_key(counting, ga, (meta, *fa[1:])) != compile_key(counting, ga, fa)
    # module state read by the graph: never shared
    with_attr = torch.fx.GraphModule(ga, ga.graph)
    with_attr.register_buffer("k", torch.ones(1))
    out = next(n for n in with_attr.graph.nodes if n.op == "output")
    with with_attr.graph.inserting_before(out):
        with_attr.graph.get_attr("k")
    assert compile_key(counting, with_attr, fa) is None
    shared = SharedCompiles()
    shared.compile(counting, with_attr, fa, None, 0)
    shared.compile(counting, with_attr, fa, None, 1)
    assert shared.compiles == 2


def test_a_group_falling_back_leaves_the_groups_sharing_its_kernel_compiled():
    """The shared callable is wrong only on inputs with a negative value: the first layer's
    (the model input) falls back to eager, the later layers' (relu outputs) keep it."""
    torch.manual_seed(0)
    module, x = Stack(3), torch.randn(4, 8)
    c = export_model(module, (x,))
    compiles = []

    def wrong_on_negatives(gm, fakes, fake_mode):
        compiles.append(gm)
        act = next(i for i, f in enumerate(fakes) if tuple(f.shape) == (4, 8))

        def run(*args):
            outs = gm.forward(*args)
            return [o + 1.0 for o in outs] if (args[act] < 0).any() else outs

        return run

    with pytest.warns(RealizeWarning, match="mismatch"):
        r = realize(c, by_layer(c.graph), realizations="inductor",
                    compiler=wrong_on_negatives, share_compiles=True)  # fmt: skip
    assert len(compiles) == 1 and list(r.fallbacks) == [0] and r.verified
    assert r.realizations == ("eager", "inductor", "inductor")
    assert [g.reuses for g in r.groups] == [None, 0, 0]
    for inp in (x, torch.randn(4, 8)):
        torch.testing.assert_close(r(inp), eager(module, (inp,)))


def test_inductor_compiles_identical_layers_once(monkeypatch):
    """The same through Inductor itself, counting its compiles."""
    calls = []
    real = torch._inductor.standalone_compile

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch._inductor, "standalone_compile", counting)
    torch.manual_seed(0)
    module, x = Stack(2), torch.randn(4, 8)
    c = export_model(module, (x,))
    r = realize(c, by_layer(c.graph), realizations="inductor")
    assert len(calls) == 1 and [g.reuses for g in r.groups] == [None, 0]
    assert all(g.compiled for g in r.groups) and not r.fallbacks
    torch.testing.assert_close(r(x), eager(module, (x,)))
