"""The lean call path of a realized plan (planner.realize.lean): compiled groups called
past their runtime wrappers in inference, the straight-line program, the input guard's
memo. Results must be the normal path's, and the lean entry used only where legal."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import zoo
from planner.errors import PlanError
from planner.ir.capture import export_model
from planner.ir.capture_dynamic import export_dynamic
from planner.realize.lean import GroupCalls, InputGuard, lean_entry, with_lean_path
from planner.realize.realizer import realize
from planner.runtime.backend import default_plan


@pytest.fixture(scope="module")
def mlp():
    module, inputs = zoo.get("mlp").build({"B": 4, "D": 8, "HID": 16, "L": 2})
    captured = export_model(module, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rp = realize(captured, default_plan(captured.graph, "cpu"))
    return module, inputs, rp


def test_lean_calls_give_the_wrapped_calls_results(mlp):
    module, (x,), rp = mlp
    compiled = [r for r in rp.groups if r.compiled]
    assert compiled and all(r.lean == "" for r in compiled), [r.lean for r in compiled]
    with torch.no_grad():
        assert rp.lean_calls
        lean = rp(x)
        rp.lean_calls = False
        try:
            wrapped = rp(x)
        finally:
            rp.lean_calls = True
        assert torch.equal(lean, wrapped)
        torch.testing.assert_close(lean, module(x), rtol=1e-5, atol=1e-6)
        # each compiled group alone, through both entries, on the same inputs
        for u in rp._units:
            if not u.compiled:
                continue
            made = {
                n: torch.empty_strided(f.shape, f.stride()).normal_()
                for n, f in zip(u.compiled_names, u.module_fakes)
            }
            got = u.run(*[made[n] for n in u.inputs])
            want = u.compiled_fn(*[made[n] for n in u.compiled_names])
            assert len(got) == len(want)
            assert all(torch.equal(a, b) for a, b in zip(got, want))


def _group_inputs(rp, x):
    """Each group's call inputs in one run of `rp` on x."""
    seen, impls = {}, list(rp._impls)

    def spy(g):
        def run(*args):
            seen[g] = args
            return impls[g](*args)

        return run

    for g in range(len(impls)):
        rp._impls[g] = spy(g)
    try:
        rp(x)
    finally:
        for g, fn in enumerate(impls):
            rp._impls[g] = fn
    return seen


def test_symbolic_groups_keep_what_the_wrappers_mark():
    module, (x,) = zoo.get("mlp").build({"B": 4, "D": 8, "HID": 16, "L": 1})
    captured = export_dynamic(module, (x,), {0: {0: (2, 64)}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rp = realize(captured, default_plan(captured.graph, "cpu"))
    assert not rp.static_shapes
    assert all(r.lean == "" for r in rp.groups if r.compiled), [r.lean for r in rp.groups]
    x = torch.randn(7, 8)

    def marks(outs):  # what AOT autograd's wrappers mark for dynamo (2.13, 2.11)
        names = ("_dynamo_propagated_dynamic_indices", "_dynamo_weak_dynamic_indices")
        return [tuple(getattr(t, n, None) for n in names) for t in outs]

    marked = 0
    with torch.no_grad():
        seen = _group_inputs(rp, x)
        for g, u in enumerate(rp._units):
            if not u.compiled:
                continue
            got = u.run(*seen[g])
            want = u.compiled_fn(*[seen[g][u.inputs.index(n)] for n in u.compiled_names])
            assert all(torch.equal(a, b) for a, b in zip(got, want))
            assert marks(got) == marks(want)
            marked += sum(m != (None, None) for m in marks(want))
        torch.testing.assert_close(rp(x), module(x), rtol=1e-5, atol=1e-6)
    assert marked  # the wrappers mark symbolic outputs: the lean calls had to repeat it


def test_grad_mode_takes_the_wrapped_path_and_keeps_gradients(mlp):
    _, (x,), rp = mlp
    with torch.no_grad():
        want = rp(x)
    x = x.clone().requires_grad_(True)
    got = rp(x)  # grad mode on, weights and x require grad: the runtime wrappers run
    assert torch.equal(got, want)


def test_lean_path_only_when_legal():
    calls: list[str] = []

    def artifact(*args):
        calls.append("artifact")
        return args

    def graph(args):
        assert isinstance(args, list)
        calls.append("graph")
        return tuple(args)

    switch = [True]
    a, b = torch.ones(1), torch.zeros(1)
    run = with_lean_path(artifact, graph, (1, 0), 2, switch)
    with torch.no_grad():
        assert run(a, b) == (b, a) and calls[-1] == "graph"
        with torch.autocast("cpu"):
            assert run(a, b) == (b, a) and calls[-1] == "artifact"
        switch[0] = False
        assert run(a, b) == (b, a) and calls[-1] == "artifact"
        switch[0] = True
    with torch.enable_grad():
        assert run(a, b) == (b, a) and calls[-1] == "artifact"
    ident = with_lean_path(artifact, graph, (0, 1), 2, switch)
    with torch.no_grad():
        assert ident(a, b) == (a, b) and calls[-1] == "graph"


def _traced(fn, *shapes):
    gm = make_fx(fn)(*[torch.randn(s) for s in shapes])
    mode = FakeTensorMode()
    return gm, tuple(mode.from_tensor(torch.randn(s)) for s in shapes), mode


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda x: torch.ops.aten.add_.Tensor(x, 1.0), "mutates"),
        (lambda x: torch.ops.aten.view.default(x, [-1]), "aliases"),
        (lambda x: (torch.ops.aten.relu.default(x),) * 2, "aliases"),
    ],
)
def test_lean_entry_refuses_mutations_and_aliases(fn, why):
    gm, fakes, mode = _traced(fn, (2, 3))
    graph, reason = lean_entry(object(), gm, fakes, mode)
    assert graph is None and why in reason


def test_lean_entry_refuses_a_callable_that_is_no_artifact():
    gm, fakes, mode = _traced(lambda x: torch.ops.aten.relu.default(x), (2, 3))
    graph, reason = lean_entry(lambda *a: a, gm, fakes, mode)
    assert graph is None and "artifact" in reason


def test_group_calls_is_list_like():
    calls = GroupCalls([abs, min])
    assert len(calls) == 2 and list(calls) == [abs, min] and calls[1] is min
    calls[0] = max
    assert calls.g0 is max and calls[0] is max
    for bad in (2, -1):
        with pytest.raises(IndexError):
            calls[bad]


def test_the_straight_line_program_computes_the_top_program(mlp):
    _, (x,), rp = mlp
    with torch.no_grad():
        got, want = rp.run_flat(x), rp.top.forward(x)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_input_guard_memo_keeps_rejecting_what_it_rejected():
    mode = FakeTensorMode()
    guard = InputGuard([mode.from_tensor(torch.randn(2, 3))], {})
    good = torch.randn(2, 3)
    guard.check((good,))
    guard.check((good,))  # remembered
    for bad in ((torch.randn(2, 4),), (good.double(),), (good, good), ([1.0],), (None,)):
        with pytest.raises(PlanError):
            guard.check(bad)
    guard.check((torch.randn(2, 3),))
