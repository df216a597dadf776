"""Static specialization of recurring shapes: a shape met `static_after` times gets its
bucket's plan realized statically at that shape, and serves from it afterwards."""

from __future__ import annotations

import dataclasses
import threading
import warnings

import pytest
import torch

from planner.fusion.partition import Partition
from planner.ir.capture import export_model
from planner.plans.buckets import parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan
from planner.realize.realizer import realize
from planner.runtime import backend as runtime
from planner.runtime.backend import fusion_planner_backend
from planner.runtime.specialize import SAMPLES, WARM_CALLS, Ledger
from tests.backend_helpers import PositionSlice, small_block

SPEC = "S=8..64"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cache(tmp_path):
    return PlanCache(str(tmp_path / "plans.sqlite"))


def cpu_plan(part, fingerprint: str = "") -> Plan:
    """`part` as a tuned plan on the CPU (strategy "test", not the default's)."""
    return Plan.from_partition(
        part,
        device="cpu",
        dtype="float32",
        strategy="test",
        cost_model="analytical/1",
        predicted_s=1e-4,
        device_fingerprint=fingerprint,
    )


def merged_after(graph, op: str) -> Partition:
    """Singletons, with the first `op` node merged with the node after it."""
    i = next(i for i, n in enumerate(graph.nodes) if n.op == op)
    return Partition.singletons(graph).merge_nodes(i, graph.succ[i][0])


def store_plan(module, cache) -> None:
    """A plan fusing the block's softmax with the matmul after it, stored for the bucket
    of S=40 with the spec beside it (as `fusion-plan tune` stores one)."""
    spec = parse_dynamic(SPEC, {"B": (0, 0), "S": (0, 1)})
    bucket = spec.bucket_of([(2, 40, 32)])
    (rep,) = bucket.representative()
    graph = export_model(module, (torch.randn(*rep),)).graph
    plan = cpu_plan(merged_after(graph, "softmax"), cache.device_fp)
    cache.store(plan.with_measurement(9e-5), bucket)
    cache.set_bucket_spec(graph.structure_key, spec, cache.device_fp)


class Shapes:
    """A realizer that runs the captured program and records whether each capture was
    static (one shape) or symbolic (a bucket)."""

    def __init__(self, fail_static: bool = False):
        self.kinds: list[str] = []
        self.threads: list[str] = []
        self.fail_static = fail_static

    def __call__(self, captured, plan):
        static = all(
            isinstance(d, int)
            for n in captured.program.graph.nodes
            if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
            for d in n.meta["val"].shape
        )
        self.kinds.append("static" if static else "bucket")
        self.threads.append(threading.current_thread().name)
        if static and self.fail_static:
            raise RuntimeError("no static realization today")
        return captured.program.module()


def call(compiled, module, s: int) -> None:
    x = torch.randn(2, s, 32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)


def test_a_recurring_shape_is_specialized_statically(cache):
    module = small_block()
    store_plan(module, cache)
    rec = Shapes()
    be = fusion_planner_backend(cache, realizer=rec, static_after=3, static_background=False)
    compiled = torch.compile(module, backend=be, dynamic=True)
    for s in (40, 33, 40, 50, 40, 40, 33):
        call(compiled, module, s)
    # one bucket realization, then one static one at the third call of S=40
    assert rec.kinds == ["bucket", "static"]
    assert be.stats.static == 1 and be.stats.bucket == 3 and not be.stats.static_failed
    assert be.stats.realized == 1  # the compile budget counts buckets, not specializations


def test_building_in_the_background_is_declined_with_one_warning(cache):
    """An export in a background thread breaks calls served meanwhile (torch's tracers patch
    process-wide state), so `static_background=True` warns once and the specialization
    builds in the calling thread."""
    module = small_block()
    store_plan(module, cache)
    rec = Shapes()
    be = fusion_planner_backend(cache, realizer=rec, static_after=2, static_background=True)
    compiled = torch.compile(module, backend=be, dynamic=True)
    with pytest.warns(runtime.PlannerRuntimeWarning, match="static_background=True is ignored"):
        for _ in range(3):
            call(compiled, module, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("error", runtime.PlannerRuntimeWarning)  # said once
        for _ in range(2):
            call(compiled, module, 40)
    assert be.wait_static(timeout=1)
    assert rec.kinds == ["bucket", "static"]
    assert rec.threads[1] == threading.current_thread().name
    assert be.stats.static == 1


def test_static_budget_bounds_specializations(cache):
    module = small_block()
    store_plan(module, cache)
    rec = Shapes()
    be = fusion_planner_backend(
        cache, realizer=rec, static_after=2, static_budget=1, static_background=False
    )
    compiled = torch.compile(module, backend=be, dynamic=True)
    with pytest.warns(runtime.PlannerRuntimeWarning, match="static budget"):
        for s in (40, 40, 50, 50, 50, 60, 60):
            call(compiled, module, s)
    assert rec.kinds == ["bucket", "static"]
    assert be.stats.static == 1 and "budget" in be.stats.static_failed[0]
    # one reason, then a count: a decode loop meets a new recurring shape per token
    assert len(be.stats.static_failed) == 1 and be.stats.static_skipped == 2


def test_a_failed_specialization_keeps_the_bucket_realization(cache):
    module = small_block()
    store_plan(module, cache)
    rec = Shapes(fail_static=True)
    be = fusion_planner_backend(cache, realizer=rec, static_after=2, static_background=False)
    compiled = torch.compile(module, backend=be, dynamic=True)
    for _ in range(4):
        call(compiled, module, 40)
    assert rec.kinds == ["bucket", "static"]  # tried once, not again
    assert be.stats.static == 0 and "no static realization" in be.stats.static_failed[0]
    assert not be.stats.fallbacks  # the bucket's plan goes on serving, not dynamo's graph


def test_no_specialization_when_turned_off_or_for_default_plans(cache):
    module = small_block()
    rec = Shapes()
    be = fusion_planner_backend(cache, realizer=rec, static_after=None)
    compiled = torch.compile(module, backend=be, dynamic=True)
    store_plan(module, cache)
    for _ in range(4):
        call(compiled, module, 40)
    assert "static" not in rec.kinds and be.stats.static == 0
    with pytest.raises(ValueError, match="static_after"):
        fusion_planner_backend(cache, static_after=0)


def test_gradients_through_a_specialized_shape_are_eagers(cache):
    module = small_block()
    store_plan(module, cache)
    be = fusion_planner_backend(cache, realizer=Shapes(), static_after=2, static_background=False)
    compiled = torch.compile(module, backend=be, dynamic=True)
    for _ in range(3):
        x = torch.randn(2, 40, 32, requires_grad=True)
        compiled(x).sum().backward()
        x2 = x.detach().clone().requires_grad_(True)
        module(x2).sum().backward()
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5)
    assert be.stats.static == 1


@pytest.mark.slow
def test_real_static_specialization_matches_eager(cache):
    """planner.realize.realizer for real (Inductor): the specialized plan is static and correct."""
    module = small_block()
    store_plan(module, cache)
    made = []

    def realizer(captured, plan):
        made.append(realize(captured, plan))
        return made[-1]

    be = fusion_planner_backend(cache, realizer=realizer, static_after=2, static_background=False)
    compiled = torch.compile(module, backend=be, dynamic=True)
    for s in (40, 40, 40, 33):
        call(compiled, module, s)
    assert be.stats.static == 1 and not be.stats.fallbacks
    assert [m.static_shapes for m in made] == [False, True]


def _graph(module, s: int):
    return export_model(module, (torch.randn(2, s, 32),)).graph


def _tuned(graph, fingerprint: str = "") -> Plan:
    """A plan fusing relu and mul, as a tuned plan (not the default's strategy)."""
    return cpu_plan(merged_after(graph, "relu"), fingerprint)


def test_a_plan_is_carried_to_the_ops_the_model_traces_into_at_another_shape():
    module = PositionSlice().eval()
    at16, at12 = _graph(module, 16), _graph(module, 12)
    assert len(at12.nodes) == len(at16.nodes) + 1  # the slice
    plan = _tuned(at16)
    with pytest.raises(Exception, match="structure"):
        plan.partition_for(at12)
    moved = plan.aligned_to(at16, at12)
    part = moved.partition(at12)  # keyed to the new graph, and a partition of it
    fused = [sorted(at12.nodes[i].op for i in g) for g in part.groups if len(g) > 1]
    assert fused == [["mul", "relu"]]
    assert (moved.graph_key, moved.structure_key) == (at12.key, at12.structure_key)
    assert moved.aligned_to(at12, at16).partition(at16).groups == plan.partition(at16).groups
    # another model's graph does not line up
    other = export_model(small_block(), (torch.randn(2, 16, 32),)).graph
    with pytest.raises(Exception, match="line up"):
        plan.aligned_to(at16, other)


def _store_tuned(module, cache) -> int:
    """The tuned plan for the bucket of S=16 (9..16), made at its representative shape, as
    `fusion-plan tune` stores it; returns that graph's op count."""
    spec = parse_dynamic("S=4..16", {"B": (0, 0), "S": (0, 1)})
    bucket = spec.bucket_of([(2, 16, 32)])
    (rep,) = bucket.representative()
    at_rep = export_model(module, (torch.randn(*rep),)).graph
    cache.store(_tuned(at_rep, cache.device_fp).with_measurement(9e-5), bucket)
    cache.set_bucket_spec(at_rep.structure_key, spec, cache.device_fp)
    return len(at_rep.nodes)


def _serve(module, cache, lengths):
    """Each call's output against the module's; the (strategy, op count, largest group) of
    every plan realized, each checked to be a partition of the graph it was realized for."""
    seen = []

    def realizer(captured, plan):
        part = plan.partition(captured.graph)  # raises unless fitted to this graph
        seen.append((plan.strategy, len(captured.graph.nodes), max(map(len, part.groups))))
        return captured.program.module()

    be = fusion_planner_backend(cache, realizer=realizer, static_after=3, static_background=False)
    compiled = torch.compile(module, backend=be, dynamic=True)
    for s in lengths:
        x = torch.randn(2, s, 32)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)
    return be.stats, seen


def test_buckets_and_recurring_shapes_traced_into_other_ops_keep_a_plan(cache):
    """S=16 traces one op fewer than the rest of its bucket (9..16): the bucket's program
    is lined up with a capture one step inside the range, the tuned plan is carried to its
    ops, S=8 gets the default plan made for its own ops, and the recurring S=12 and S=16
    are specialized statically (S=16 with the plan carried back to its ops)."""
    module = PositionSlice().eval()
    n16 = _store_tuned(module, cache)
    stats, seen = _serve(module, cache, (16, 8, 12, 12, 12, 16, 16))
    assert not stats.fallbacks and not stats.static_failed and not stats.unfitted, stats
    assert not stats.per_shape and stats.static == 2, stats
    assert seen == [
        ("test", n16 + 1, 2),
        ("default", n16 + 1, seen[1][2]),
        ("test", n16 + 1, 2),
        ("test", n16, 2),
    ]


def test_a_cached_plan_that_does_not_fit_gives_way_to_the_default_plan(cache):
    """A plan cached under the model's key whose groups are another graph's (a foreign or
    damaged record): the default plan made for the model's ops runs, not dynamo's graph,
    said once, with the reason in the stats."""
    module = PositionSlice().eval()
    spec = parse_dynamic("S=4..16", {"B": (0, 0), "S": (0, 1)})
    bucket = spec.bucket_of([(2, 16, 32)])
    key = _graph(module, 16).structure_key
    other = export_model(small_block(), (torch.randn(2, 16, 32),)).graph
    foreign = cpu_plan(merged_after(other, "softmax"), cache.device_fp)
    foreign = dataclasses.replace(foreign, structure_key=key)
    cache.store(foreign.with_measurement(9e-5), bucket)
    cache.set_bucket_spec(key, spec, cache.device_fp)
    with pytest.warns(runtime.PlannerRuntimeWarning, match="does not fit"):
        stats, seen = _serve(module, cache, (16, 12))
    assert not stats.fallbacks and len(stats.unfitted) == 1, stats
    assert [k for k, _, _ in seen] == ["default"]


# -- the default policy, static_after="auto" (planner.runtime.specialize) --------------


def test_a_stream_of_shapes_that_recur_a_few_times_builds_nothing(cache):
    """The default policy: the CPU calls of a small block take well under a millisecond and
    a build takes what the bucket's realization took, so a few calls per shape never pay."""
    module = small_block()
    store_plan(module, cache)
    rec = Shapes()
    be = fusion_planner_backend(cache, realizer=rec)
    assert be.static_after == "auto"
    compiled = torch.compile(module, backend=be, dynamic=True)
    for _ in range(8):
        for s in (40, 33, 50, 61):
            call(compiled, module, s)
    assert rec.kinds == ["bucket"] and be.stats.static == 0 and not be.stats.static_failed


def test_a_shape_that_pays_is_specialized_then_kept_or_dropped_by_its_time(cache, monkeypatch):
    """With builds made free, a shape is specialized right after its calls are timed; the
    specialization's own calls are timed, the share saved recorded, and the shape served
    correctly throughout by whichever was faster."""
    monkeypatch.setattr(Ledger, "build_estimate", lambda self: 0.0)
    module = small_block()
    store_plan(module, cache)
    rec = Shapes()
    be = fusion_planner_backend(cache, realizer=rec)
    compiled = torch.compile(module, backend=be, dynamic=True)
    for _ in range(WARM_CALLS + SAMPLES + 1):
        call(compiled, module, 40)
    assert rec.kinds == ["bucket", "static"] and be.stats.static == 1
    assert be.stats.static_build_s > 0 and be.stats.static_gains == []
    for _ in range(1 + SAMPLES + 1):
        call(compiled, module, 40)
    assert len(be.stats.static_gains) == 1
    for _ in range(3):
        call(compiled, module, 40)
    assert rec.kinds == ["bucket", "static"]  # built once, whichever serves it now


def test_static_after_is_checked():
    for bad in (0, -1, "sometimes", 2.5):
        with pytest.raises(ValueError, match="static_after"):
            fusion_planner_backend(static_after=bad)


# -- adjacent tuned buckets with the same plan share one realization (planner.runtime.spans) --


def _store_for(cache, module, s: int, plan_of) -> None:
    """`plan_of(graph)` as the tuned plan of the bucket holding S=s (spec S=8..64)."""
    spec = parse_dynamic(SPEC, {"B": (0, 0), "S": (0, 1)})
    bucket = spec.bucket_of([(2, s, 32)])
    (rep,) = bucket.representative()
    graph = export_model(module, (torch.randn(*rep),)).graph
    cache.store(plan_of(graph).with_measurement(9e-5), bucket)
    cache.set_bucket_spec(graph.structure_key, spec, cache.device_fp)


class Ranges:
    """The backend's exporter, recording each range it was asked to export over."""

    def __init__(self, fail_wide: bool = False):
        self.asked: list[dict] = []
        self.fail_wide = fail_wide

    def __call__(self, module, inputs, dims):
        self.asked.append(dims)
        (lo, hi) = dims[0][1]
        if self.fail_wide and hi - lo > 32:
            raise RuntimeError("no export over so wide a range")
        return runtime._default_exporter(module, inputs, dims)


def test_adjacent_buckets_with_the_same_plan_are_realized_once(cache):
    """S=8..64 in pow2 buckets; 17-32 and 33-64 hold the same tuned plan, 9-16 another:
    S=40 realizes one program over 17..64, S=20 is served by it, S=12 gets its own."""
    module = small_block()
    same = lambda g: cpu_plan(merged_after(g, "softmax"), cache.device_fp)  # noqa: E731
    for s in (20, 40):
        _store_for(cache, module, s, same)
    _store_for(
        cache, module, 12, lambda g: cpu_plan(merged_after(g, "layer_norm"), cache.device_fp)
    )
    rec, ranges = Shapes(), Ranges()
    be = fusion_planner_backend(cache, realizer=rec, exporter=ranges, static_after=None)
    compiled = torch.compile(module, backend=be, dynamic=True)
    for s in (40, 20, 33, 17, 12, 40):
        call(compiled, module, s)
    assert [r[0][1] for r in ranges.asked] == [(17, 64), (9, 16)]
    assert be.stats.realized == 2 and be.stats.joined == 1 and be.stats.bucket == 5
    assert rec.kinds == ["bucket", "bucket"] and not be.stats.fallbacks


def test_a_joined_range_that_does_not_export_falls_back_to_the_bucket(cache):
    module = small_block()
    same = lambda g: cpu_plan(merged_after(g, "softmax"), cache.device_fp)  # noqa: E731
    for s in (12, 20, 40):
        _store_for(cache, module, s, same)
    rec, ranges = Shapes(), Ranges(fail_wide=True)
    be = fusion_planner_backend(cache, realizer=rec, exporter=ranges, static_after=None)
    compiled = torch.compile(module, backend=be, dynamic=True)
    for s in (40, 20):
        call(compiled, module, s)
    # 9..64 refused (once); 33..64 alone, then 17..32 alone: never a shape realized alone
    assert [r[0][1] for r in ranges.asked] == [(9, 64), (33, 64), (17, 32)]
    assert be.stats.realized == 2 and be.stats.joined == 0 and not be.stats.per_shape


def test_buckets_are_not_joined_when_asked_not_to(cache):
    module = small_block()
    same = lambda g: cpu_plan(merged_after(g, "softmax"), cache.device_fp)  # noqa: E731
    for s in (20, 40):
        _store_for(cache, module, s, same)
    ranges = Ranges()
    be = fusion_planner_backend(
        cache, realizer=Shapes(), exporter=ranges, static_after=None, join_buckets=False
    )
    compiled = torch.compile(module, backend=be, dynamic=True)
    for s in (40, 20):
        call(compiled, module, s)
    assert [r[0][1] for r in ranges.asked] == [(33, 64), (17, 32)]
