"""Layout propagation on symbolic programs never specializes the program's sizes.

Propagation runs a group's ops on fake tensors with the program's symbolic sizes. A
composite op whose C++ kernel reads a size as a number (torch 2.11's `matmul` does) would
specialize the symbol to the export's size in the shape environment that every later
compile shares, and the bucket would only run at that size (docs/runtime.md). The ops
below stand in for such a kernel on any torch version.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.fx as fx
from torch._C import DispatchKey
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

import zoo
from planner.errors import PlanError
from planner.ir.capture_dynamic import export_dynamic
from planner.realize import layout
from planner.realize.realizer import realize
from planner.runtime.backend import default_plan

_LIB = torch.library.Library("fp_symbolic_test", "DEF")
# `doubled`: a composite whose C++-style kernel reads the row count as a number, and whose
# Python decomposition (what tracing runs) keeps it symbolic, as `aten.matmul` on torch 2.11
_LIB.define("doubled(Tensor x) -> Tensor")
# `rows_read`: a composite that reads the row count as a number on every path
_LIB.define("rows_read(Tensor x) -> Tensor")


def _doubled_kernel(x):
    rows = int(x.shape[0])
    return (x * 2)[:rows]


def _rows_read_kernel(x):
    return x.new_zeros(int(x.shape[0]), x.shape[1]) + 1


_LIB.impl("doubled", _doubled_kernel, "CompositeImplicitAutograd")
_LIB.impl("rows_read", _rows_read_kernel, "CompositeImplicitAutograd")
torch.ops.fp_symbolic_test.doubled.default.py_impl(DispatchKey.CompositeImplicitAutograd)(
    lambda x: x * 2
)


def _symbolic_fake():
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    rows = env.create_symintnode(
        env.create_symbol(37, ConstantSource("rows"), dynamic_dim=DimDynamic.DYNAMIC), hint=37
    )
    with mode:
        x = torch.empty(rows, 4)
    return env, mode, x


def _graph(op):
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(op, (x,))
    g.output((y,))
    return fx.GraphModule(torch.nn.Module(), g), x, y


def test_propagation_runs_composites_as_tracing_does_and_keeps_sizes_symbolic():
    env, mode, x = _symbolic_fake()
    gm, _, y = _graph(torch.ops.fp_symbolic_test.doubled.default)
    (out,) = layout.propagate(gm, [x], mode)
    assert str(out.shape[0]) == str(x.shape[0]) and not isinstance(out.shape[0], int)
    assert not env.replacements  # the symbol is still a symbol for every later compile
    assert str(y.meta["val"].shape) == str(out.shape)


def test_a_kernel_that_reads_sizes_as_numbers_fails_propagation_without_specializing():
    env, mode, x = _symbolic_fake()
    gm, ph, y = _graph(torch.ops.fp_symbolic_test.rows_read.default)
    kept = {"x": x, "y": torch.empty(0)}
    ph.meta["val"] = kept["x"]
    with mode:
        y.meta["val"] = kept["y"] = torch.empty(x.shape[0], 4)
    with pytest.raises(PlanError, match="sizes"):
        layout.propagate(gm, [x], mode)
    assert not env.replacements and not env.guards
    assert y.meta["val"] is kept["y"]  # the graph keeps the values it had


def test_symbolic_program_propagates_layouts_and_serves_the_bucket():
    torch.manual_seed(0)
    module, inputs = zoo.get("transformer-block").build({"B": 2, "S": 37, "D": 32, "H": 2})
    module.eval()
    c = export_dynamic(module, inputs, dims={0: {1: (16, 64)}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = realize(c, default_plan(c.graph, "cpu"), cuda_graphs=False, propagate_symbolic=True)
    assert any(u.out_fakes for u in r._units)  # layouts did propagate
    env = next(iter(c.program.graph_module.graph.nodes)).meta["val"].fake_mode.shape_env
    assert not any(v.is_number for v in env.replacements.values())
    for s in (37, 16, 64):
        x = torch.randn(2, s, 32)
        with torch.no_grad():
            torch.testing.assert_close(r(x), module(x), rtol=1e-4, atol=1e-4)
