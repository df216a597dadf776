"""A tensor-parallel decision as part of the Plan record: its JSON and cache round trip,
old records without it, its realization on 2 gloo ranks (tests/tp_ranks.py) with the
fallback to the unplanned program, and the backward's pricing against hand-derived
timelines and the collectives torch's own backward issues."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

import zoo
from cli.main import main
from planner.distributed import parallel_models as pm
from planner.distributed.tp_graph import (
    ColumnBackward,
    GraphCosts,
    SiteDecisions,
    find_tp_sites,
    predict_backward,
)
from planner.distributed.tp_plan import TPDecision
from planner.errors import PlanError
from planner.fusion.partition import Partition
from planner.ir.capture import capture, export_model
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan, TPChoice
from profiling.commbench import run_ranks
from tests.tp_ranks import B, D, S

US = 1e-6


@pytest.fixture(scope="module")
def plan() -> Plan:
    module, inputs = zoo.get("mlp").build({"B": 4, "D": 16, "HID": 32, "L": 2}, device="meta")
    return Plan.from_partition(
        Partition.singletons(capture(module, inputs)),
        device="cpu",
        dtype="float32",
        strategy="test",
        cost_model="analytical/1",
        predicted_s=1e-3,
        device_fingerprint="cpu-testdevice",
    )


def test_the_decision_round_trips_through_json_and_the_cache(plan, tmp_path) -> None:
    choice = TPChoice(2, True, ("linear_3", "linear_5"), 2.5e-4, 4.0e-4)
    tp = dataclasses.replace(plan, tensor_parallel=choice)
    data = json.loads(json.dumps(tp.to_json()))
    assert data["tensor_parallel"]["sites"] == ["linear_3", "linear_5"]
    assert Plan.from_json(data) == tp
    with PlanCache(str(tmp_path / "c.db")) as cache:
        cache.store_exact(tp, [[4, 16]])
        got = cache.lookup(tp.structure_key, [[4, 16]], device_fp="cpu-testdevice")
        assert got.plan is not None and got.plan.tensor_parallel == choice


def test_a_decision_per_site_round_trips_and_a_single_one_means_every_site(plan) -> None:
    sites = ("linear_3", "linear_5")
    mixed = dataclasses.replace(plan, tensor_parallel=TPChoice((2, 1), (True, False), sites))
    data = json.loads(json.dumps(mixed.to_json()))
    assert data["tensor_parallel"]["chunks"] == [2, 1]
    assert data["tensor_parallel"]["fuse_epilogue"] == [True, False]
    assert Plan.from_json(data) == mixed and mixed.tensor_parallel.label == "k=2 fused | k=1"
    # a record written before per-site decisions: one decision for all its sites
    old = {"chunks": 2, "fuse_epilogue": True, "sites": list(sites), "predicted_s": 1e-4}
    loaded = Plan.from_json({**plan.to_json(), "tensor_parallel": old}).tensor_parallel
    assert loaded.chunks == (2, 2) and loaded.fuse_epilogue == (True, True)
    assert loaded.label == "k=2 fused" and loaded.to_json()["chunks"] == 2  # written so again
    with pytest.raises(PlanError, match="one per site"):
        TPChoice((2, 1, 1), True, sites)


def test_a_record_without_the_decision_loads_and_is_written_as_before(plan) -> None:
    data = plan.to_json()
    assert "tensor_parallel" not in data  # an old reader still reads new plans without TP
    assert Plan.from_json(data).tensor_parallel is None
    bad = {**data, "tensor_parallel": {"chunks": 0, "fuse_epilogue": False, "sites": ["x"]}}
    with pytest.raises(PlanError, match="chunks"):
        Plan.from_json(bad)
    with pytest.raises(PlanError, match="malformed"):
        Plan.from_json({**data, "tensor_parallel": {"chunks": 2}})


def test_plan_saves_the_chosen_decision_of_a_tensor_parallel_program(tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    shape = f"B={B},S={S},D={D},H=4,TP=2"
    argv = ["plan", "--model", "zoo:tp-block", "--shape", shape, "--device", "h100"]
    assert main([*argv, "--strategy", "greedy", "--format", "json", "--save-plan", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)["tensor_parallel"]
    saved = Plan.from_json(json.loads(out.read_text())).tensor_parallel
    assert saved is not None and saved.label == report["chosen"]
    assert saved.predicted_s == report["forward"]["total_s"]
    assert saved.predicted_backward_s == report["backward"]["total_s"]
    m, x = zoo.get("tp-block").build({"B": B, "S": S, "D": D, "H": 4, "TP": 2})
    assert saved.sites == tuple(s.gemm for s in find_tp_sites(export_model(m, x).program.module()))


def _costs(**kw) -> GraphCosts:
    base = dict(
        segment_s=(3 * US, 1 * US),
        segment_ops=(1, 1),
        gemm_s={(0, 1): 4 * US},
        epilogue_s={(0, False): 2 * US, (0, True): 1 * US},
        epilogue_ops=(1,),
        all_reduce_bytes=(6000,),
        eager_op_host_s=0.0,
        compiled_call_host_s=0.0,
        collective_call_host_s=0.0,
        backward_gemm_s=(8 * US,),
        column_grad_bytes=((3000, 3000),),
    )
    return GraphCosts(**{**base, **kw})


def test_backward_prices_the_column_input_gradients_and_no_row_collective() -> None:
    ar = lambda nbytes: 1 * US + nbytes / 1000 * US  # noqa: E731
    # reverse order: ops after 2x1, epilogue 2x2, dX+dW 8, ops before 2x3 = 20 us of
    # compute; then the two input-gradient all-reduces of 4 us each, in sequence on the
    # communication stream, nothing after them to hide behind
    p = predict_backward(_costs(), TPDecision(2, True), ar)
    assert p.t_comp_s == pytest.approx(20 * US) and p.t_comm_s == pytest.approx(8 * US)
    assert p.total_s == pytest.approx(28 * US) and p.exposed_comm_s == pytest.approx(8 * US)
    # Megatron's f: one all-reduce of the shared input
    one = predict_backward(_costs(column_grad_bytes=((3000,),)), TPDecision(1), ar)
    assert one.total_s == pytest.approx(24 * US)
    # two sites: each site's input-gradient all-reduce gates the next site's backward
    two = _costs(
        segment_s=(3 * US, 0.0, 0.0),
        segment_ops=(1, 0, 0),
        gemm_s={(0, 1): 4 * US, (1, 1): 4 * US},
        epilogue_s={(0, False): 0.0, (0, True): 0.0, (1, False): 1 * US, (1, True): 1 * US},
        epilogue_ops=(0, 1),
        all_reduce_bytes=(6000, 6000),
        backward_gemm_s=(8 * US, 8 * US),
        column_grad_bytes=((3000,), (3000,)),
    )
    # site 1: epilogue 2, dX dW 8, all-reduce 4; site 0: dX dW 8, ops before 6, all-reduce 4
    assert predict_backward(two, TPDecision(1), ar).total_s == pytest.approx(32 * US)


def test_the_backward_rewritten_for_training_overlaps_the_input_gradients() -> None:
    ar = lambda nbytes: 1 * US + nbytes / 1000 * US  # noqa: E731
    col = ColumnBackward({1: 1 * US, 2: 0.5 * US}, 1 * US, 3000, 1 * US)
    c = _costs(segment_s=(3 * US, 1 * US), segment_ops=(3, 1), column_backward=((col, col),))
    # ops after 2, epilogue 4, dX dW 8, the segment's other op 2x1: 16 us; then per column
    # GEMM (the second first) dX 1 with its all-reduce (4 us) after it, then dW 1:
    # dX 16-17, all-reduce 17-21, dW 17-18; dX 18-19, all-reduce 21-25, dW 19-20
    one = predict_backward(c, TPDecision(1), ar, planned=True)
    assert one.total_s == pytest.approx(25 * US) and one.t_comp_s == pytest.approx(20 * US)
    assert one.t_comm_s == pytest.approx(8 * US)  # unplanned: 28 us, both exposed
    # k=2: slices of 0.5 us, all-reduces of 1500 bytes (2.5 us) in sequence from 16.5 us:
    # four of them end at 26.5 us (the link's alpha paid twice more than it hides)
    two = predict_backward(c, SiteDecisions((TPDecision(2, True),)), ar, planned=True)
    assert two.total_s == pytest.approx(26.5 * US) and two.t_comm_s == pytest.approx(10 * US)


class _Collectives(TorchDispatchMode):
    """The all-reduces dispatched while active, by their input's bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "all_reduce" in name or "allreduce" in name:
            t = args[0][0] if isinstance(args[0], list | tuple) else args[0]
            self.nbytes.append(t.numel() * t.element_size())
        return func(*args, **(kwargs or {}))


def test_the_priced_backward_collectives_are_those_torch_issues() -> None:
    pm.capture_group(2)  # torch's single-process fake group
    x = torch.randn(B, S, D, requires_grad=True)
    mesh = init_device_mesh("cpu", (2,))
    dt_model = parallelize_module(pm.LlamaStyleBlock(D, 4, 2 * D), mesh, pm.llama_tp_plan())
    block = pm.TPBlock(D, 4, 2, torch.distributed.group.WORLD)
    for model, per_gemm in ((dt_model, True), (block, False)):
        sites = find_tp_sites(export_model(model, (x.detach(),)).program.module())
        y = model(x)
        y = y.to_local() if hasattr(y, "to_local") else y
        with _Collectives() as seen:
            y.sum().backward()
        priced = [b for s in sites for b in s.column_grad_bytes(per_gemm)]
        assert sorted(seen.nbytes) == sorted(priced), (type(model).__name__, seen.nbytes)
        assert len(priced) == (5 if per_gemm else 2)


def test_a_recorded_decision_is_applied_and_verified_on_gloo_ranks() -> None:
    res = run_ranks(2, "tests.tp_ranks:realized_plans", (), timeout_s=120)
    # site by site: chunks per row-parallel GEMM, the fused epilogues' units
    first, second = (f"tp_epilogue_{g}" for g in res["sites"])
    expected = {
        "k=2 fused": ([2, 2], [first, second]),
        "k=2": ([2, 2], []),
        "k=2 fused | k=1": ([2, 1], [first]),
    }
    for label, (chunks, epilogues) in expected.items():
        r = res[label]
        assert r["applied"] and not r["warnings"], r
        assert r["chunks"] == chunks and r["epilogues"] == epilogues, r
        assert r["chunked"] == 2 and r["collectives_left"] == 0, r
        assert r["err"] < 1e-5 and r["ref_err"] < 1e-5, r
    # rank 0's program matched; rank 1's did not, whichever sites it rewrote: every site
    # fails alone too, and both ranks fall back entirely
    wrong = res["wrong"]
    assert not wrong["applied"] and wrong["err"] == 0.0
    assert wrong["fell_back"] == res["sites"], wrong
    assert any("not applied" in w for w in wrong["warnings"]), wrong
    # rank 1's rewrite raised: rank 0 ran no rewritten program alone, and fell back too
    unwritten = res["unwritten"]
    assert not unwritten["applied"], unwritten
    assert [g for g, _ in unwritten["fell_back"]] == res["sites"], unwritten
    assert all(w.startswith("on rank 1: RuntimeError: injected") for _, w in unwritten["fell_back"])
    assert not res["stale"]["applied"]


def test_a_site_whose_rewrite_fails_falls_back_alone_on_gloo_ranks() -> None:
    """A decision per site (k=2 fused | k=4 fused) on a DTensor block whose rewrite of one
    site is made wrong (tests/tp_ranks.py): that site runs as captured on both ranks, the
    other keeps its chunks and fused epilogue, the output is the unplanned program's; the
    whole program, then each site alone, then the kept site are rewritten, no more."""
    res = run_ranks(2, "tests.tp_ranks:narrowed_plans", (), timeout_s=120)
    sites = res["sites"]
    kept = {  # case -> (the site kept, its chunks)
        "wrong at site 1 on rank 1": (0, 2),
        "wrong at site 0 on both": (1, 4),
        "raising at site 0 on rank 1": (1, 4),
    }
    for case, (k, chunks) in kept.items():
        r, bad = res[case], sites[1 - k]
        assert r["applied"] and not r["complete"], (case, r)
        assert r["chunks"] == [chunks] and r["epilogues"] == [f"tp_epilogue_{sites[k]}"], r
        assert [g for g, _ in r["fell_back"]] == [bad], (case, r)
        assert r["err"] < 1e-5, (case, r)
        assert r["calls"] == [sites, [sites[0]], [sites[1]], [sites[k]]], (case, r)
        (warned,) = r["warnings"]
        assert bad in warned and f"applied at sites ['{sites[k]}'] only" in warned, warned
    # rank 0 saw no mismatch: it names rank 1's; a mismatch both ranks saw, its own
    assert res["wrong at site 1 on rank 1"]["fell_back"][0][1].startswith("on rank 1: its outputs")
    assert res["wrong at site 0 on both"]["fell_back"][0][1].startswith("its outputs differ")
    assert "injected" in res["raising at site 0 on rank 1"]["fell_back"][0][1]
    # every site wrong alone: every rank runs the unplanned program, each site named
    every = res["wrong at both sites on rank 1"]
    assert not every["applied"] and every["err"] == 0.0, every
    assert [g for g, _ in every["fell_back"]] == sites and not every["chunks"], every
    assert every["calls"] == [sites, [sites[0]], [sites[1]]], every
    (warned,) = every["warnings"]
    assert "not applied" in warned and all(f"site {g}" in warned for g in sites), warned
    # a site whose tokens do not split falls back unchecked; the other is checked once
    uneven = res["tokens of site 0 uneven"]
    assert uneven["applied"] and uneven["chunks"] == [4] and uneven["err"] < 1e-5, uneven
    assert uneven["calls"] == [[sites[1]]] and uneven["fell_back"][0][0] == sites[0], uneven
    assert "do not split into 3 chunks" in uneven["fell_back"][0][1], uneven


def test_the_runtime_backend_lifts_a_dtensor_graph_to_the_captured_rank_program() -> None:
    """Dynamo's graph of a DTensor model, lifted (the mesh a constant, the DTensor weights
    parameters) and captured, is the rank program capture makes of the model itself: the
    plans `plan`/`tune` store for the model are found under its key."""
    from planner.runtime.graph import trace_as_served

    pm.capture_group(2)  # torch's single-process fake group
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (2,))
    model = parallelize_module(pm.LlamaStyleBlock(D, 4, 2 * D), mesh, pm.llama_tp_plan())
    x = torch.randn(B, S, D)
    lifted, user = trace_as_served(model, (x,))
    torch._dynamo.reset()
    assert lifted.per_shape and len(user) == 1 and user[0] is x
    served = export_model(lifted.module, user)
    captured = export_model(model, (x,))
    assert served.graph.structure_key == captured.graph.structure_key
    sites = find_tp_sites(served.program.module())
    assert [s.gemm for s in sites] == [s.gemm for s in find_tp_sites(captured.program.module())]
    assert len(sites) == 2


def test_a_mesh_dynamo_keeps_as_a_graph_constant_is_lifted_alike() -> None:
    """torch releases before 2.13 may hold the mesh as a graph attribute, not an input:
    the same graph with its mesh moved there lifts to the same rank program."""
    from torch.distributed.device_mesh import DeviceMesh

    from planner.runtime.graph import lift_graph

    pm.capture_group(2)
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (2,))
    model = parallelize_module(pm.LlamaStyleBlock(D, 4, 2 * D), mesh, pm.llama_tp_plan())
    x = torch.randn(B, S, D)
    lifted = []

    def both(gm, example):
        lifted.append(lift_graph(gm, list(example)))
        (k,) = [i for i, e in enumerate(example) if isinstance(e, DeviceMesh)]
        graph = torch.fx.Graph()  # a copy: dynamo calls its graph with the inputs it has
        out = graph.graph_copy(gm.graph, {})
        graph.output(out)
        (node,) = [n for i, n in enumerate(graph.find_nodes(op="placeholder")) if i == k]
        holder = torch.nn.Module()
        holder.held_mesh = example[k]
        with graph.inserting_before(node):
            node.replace_all_uses_with(graph.get_attr("held_mesh"))
        graph.erase_node(node)
        constant = torch.fx.GraphModule(holder, graph)
        lifted.append(lift_graph(constant, [e for i, e in enumerate(example) if i != k]))
        return gm

    with torch.no_grad():
        torch.compile(model, backend=both)(x)
    torch._dynamo.reset()
    keys = [export_model(lg.module, (x,)).graph.structure_key for lg in lifted]
    assert len(keys) == 2 and keys[0] == keys[1] == export_model(model, (x,)).graph.structure_key


def test_a_dtensor_graph_with_symbolic_sizes_is_served_shape_by_shape(monkeypatch) -> None:
    """The rank program is traced for one shape: a dynamic graph's shapes are each
    captured and realized alone (the default plan on a miss), without a warning."""
    from planner.runtime import backend as runtime

    pm.capture_group(2)
    monkeypatch.setattr(runtime, "_warned", set())
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (2,))
    model = parallelize_module(pm.LlamaStyleBlock(D, 4, 2 * D), mesh, pm.llama_tp_plan())
    from planner.realize.realizer import realize

    eager = lambda captured, plan: realize(captured, plan, realizations="eager")  # noqa: E731
    backend = runtime.fusion_planner_backend(None, realizer=eager)  # no compile: fast
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with warnings.catch_warnings(record=True) as w, torch.no_grad():
        warnings.simplefilter("always")
        for s in (S, S + 4, S):
            x = torch.randn(B, s, D)
            assert (compiled(x) - model(x)).abs().max() < 1e-5, s
    torch._dynamo.reset()
    assert not [m for m in w if issubclass(m.category, runtime.PlannerRuntimeWarning)]
    assert backend.stats.graphs == 1 and backend.stats.realized == 2, backend.stats
    assert not backend.stats.fallbacks and not backend.stats.per_shape, backend.stats


def _served_with_warnings(model, x, monkeypatch) -> tuple[object, list[str]]:
    from planner.runtime import backend as runtime

    monkeypatch.setattr(runtime, "_warned", set())  # each case warns afresh
    torch._dynamo.reset()
    backend = runtime.fusion_planner_backend(None)
    with warnings.catch_warnings(record=True) as w, torch.no_grad():
        warnings.simplefilter("always")
        got = torch.compile(model, backend=backend)(x)
    torch._dynamo.reset()
    ours = [str(m.message) for m in w if issubclass(m.category, runtime.PlannerRuntimeWarning)]
    return got, ours


def test_a_dtensor_graph_the_backend_cannot_serve_runs_as_dynamo_traced_it(monkeypatch) -> None:
    """A DTensor output (`use_local_output=False`) or a DTensor argument: the rank program
    would answer with local tensors, so dynamo's graph runs, with one warning, and the
    output is the model's own (its type included)."""
    pm.capture_group(2)
    mesh = init_device_mesh("cpu", (2,))
    x = torch.randn(B, S, D)
    dt_out = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel(use_local_output=False)}
    dt_in = {"fc1": ColwiseParallel(input_layouts=Replicate()), "fc2": RowwiseParallel()}
    cases = {
        "returns a DTensor": (dt_out, x),
        "is a DTensor argument": (dt_in, distribute_tensor(x, mesh, [Replicate()])),
    }
    for why, (layout, arg) in cases.items():
        model = parallelize_module(pm.GeluMLP(D, 2 * D), mesh, layout)
        got, warned = _served_with_warnings(model, arg, monkeypatch)
        with torch.no_grad():
            want = model(arg)
        assert len(warned) == 1 and why in warned[0], warned
        assert isinstance(got, DTensor) == isinstance(want, DTensor), (type(got), why)
        local = lambda t: t.to_local() if isinstance(t, DTensor) else t  # noqa: E731
        assert torch.equal(local(got), local(want)), why


def test_the_runtime_backend_applies_a_cached_decision_on_gloo_ranks(tmp_path) -> None:
    res = run_ranks(2, "tests.tp_ranks:served_plan", (str(tmp_path),), timeout_s=120)
    r = res  # rank 0
    assert r["exact"] == 1 and r["applied"] == [True], r
    assert r["err"] < 1e-5 and not r["warnings"], r


@pytest.mark.slow
def test_the_runtime_backend_serves_a_dtensor_model_its_plans_on_gloo_ranks(tmp_path) -> None:
    """Plans stored for the rank program capture makes of a DTensor LLaMA-style block are
    found and applied when the block is served through torch.compile: the TP decision, and
    at another shape the rule-based fused groups; outputs as the DTensor model's and the
    unsharded block's, and in grad mode its gradients."""
    r = run_ranks(2, "tests.tp_ranks:served_dtensor_plan", (str(tmp_path),), timeout_s=120)
    assert r["exact"] == 2 and r["applied"] == [True] and len(r["sites"]) == 2, r
    assert r["err"] < 1e-5 and r["ref_err"] < 1e-5, r
    assert r["planned_groups"] > 0 and r["compiled_groups"] > 0 and not r["group_fallbacks"], r
    assert r["fused_err"] < 1e-5 and r["fused_ref_err"] < 1e-5, r
    # grad mode: the planned forward served again, gradients recomputed through dynamo's graph
    assert r["grad_graphs"] == 1 and r["grad_applied"] == [True] and not r["declined"], r
    assert r["grad_err"] < 1e-5 and "input" in r["grads"] and "q_proj.weight" in r["grads"], r
    assert not r["warnings"] and not r["fallbacks"], r
