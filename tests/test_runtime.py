"""The runtime backend and lookup API: real torch.compile (dynamic=True) on CPU.

Fast tests use tiny zoo models. Where a test checks the backend's bookkeeping (how many
realizations, which partition each got) it passes a counting realizer/exporter around
the real export; the tests marked slow run the real planner.realize.realizer (Inductor).
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

import zoo
from planner.distributed.parallel_models import has_functional_p2p
from planner.fusion.partition import Partition
from planner.ir.capture import Captured, export_model
from planner.ir.graph import Category, OpGraph
from planner.plans.buckets import BucketSpec, DynamicDim, Edges, Pow2, parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan
from planner.realize.realizer import realize
from planner.runtime import backend as runtime
from planner.runtime.backend import (
    PlannerRuntimeWarning,
    default_plan,
    fusion_planner_backend,
    lookup,
    plan_for,
)
from planner.runtime.graph import capture_for_serving, device_of_graph, lift_graph

BLOCK = {"B": 2, "S": 16, "D": 32, "H": 4}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cache(tmp_path):
    return PlanCache(str(tmp_path / "plans.sqlite"))


def fuse_first_chain(graph: OpGraph) -> Partition:
    """A stand-in default partition that fuses something (the first pointwise op feeding
    only a softmax/pointwise op): these tests are about the runtime, not about which
    groups the partitioner's rules pick."""
    part = Partition.singletons(graph)
    fusible = (Category.SOFTMAX, Category.POINTWISE)
    for a, succ in enumerate(graph.succ):
        if (
            len(succ) == 1
            and graph.nodes[a].category is Category.POINTWISE
            and graph.nodes[succ[0]].category in fusible
        ):
            return part.merge_nodes(a, succ[0])
    return part


@pytest.fixture(autouse=True)
def _default_fuses(monkeypatch):
    monkeypatch.setattr(runtime, "_rule_based_partition", fuse_first_chain)


def block():
    return zoo.get("transformer-block").build(BLOCK)[0]


def attention_at_representative(module, spec):
    """The block captured at the representative shape of its S=40 bucket, and a
    partition with its attention (q@k^T -> /sqrt(dh) -> softmax -> @v) as one group."""
    (rep,) = spec.bucket_of([(2, 40, 32)]).representative()
    graph = export_model(module, (torch.randn(*rep),)).graph
    assert [n.op for n in graph.nodes[11:15]] == ["matmul", "div", "softmax", "matmul"]
    part = Partition.singletons(graph)
    for a, b in ((11, 12), (12, 13), (13, 14)):
        part = part.merge_nodes(a, b)
    return graph, part


def cpu_plan(part, cache):
    """A plan record of `part` for this CPU, as a test stores it (predicted 100 us)."""
    return Plan.from_partition(
        part,
        device="cpu",
        dtype="float32",
        strategy="test",
        cost_model="analytical/1",
        predicted_s=1e-4,
        device_fingerprint=cache.device_fp,
    )


class Counting:
    """Wraps a realizer and an exporter, recording what the backend asked for."""

    def __init__(self):
        self.partitions: list[Partition] = []
        self.plans: list[Plan] = []
        self.exports: list[dict] = []

    def realizer(self, captured: Captured, plan: Plan):
        self.partitions.append(plan.partition(captured.graph))
        self.plans.append(plan)
        return captured.program.module()

    def exporter(self, module, inputs, dims):
        """A real dynamic export over the bucket (torch.export with Dim ranges)."""
        self.exports.append(dims)
        shapes = []
        for i in range(len(inputs)):
            spec = {}
            for axis, (lo, hi) in dims.get(i, {}).items():
                if lo != hi:
                    spec[axis] = torch.export.Dim(f"d{i}_{axis}", min=max(lo, 2), max=hi)
            shapes.append(spec or None)
        program = torch.export.export(module, inputs, dynamic_shapes=tuple(shapes), strict=False)
        program = program.run_decompositions({})
        static = export_model(module, inputs)  # the OpGraph at this shape, same node names
        return Captured(static.graph, program, inputs)


def run_shapes(compiled, module, sizes, d=32, b=2):
    for s in sizes:
        x = torch.randn(b, s, d)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)


# ---- layering -------------------------------------------------------------------------------
def test_runtime_imports_neither_optuna_nor_sklearn():
    code = (
        "import sys, planner.runtime.backend\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('optuna', 'sklearn'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


# ---- dynamo's graph, lifted --------------------------------------------------------------------
SMALL = {
    "transformer-block": BLOCK,
    "transformer-block-sdpa": BLOCK,
    "gpt2-block": BLOCK,
    "llama-block": {**BLOCK, "MAXS": 64},
    "bert-layer": BLOCK,
    "resnet-bottleneck": {"B": 2, "C": 16, "HW": 8},
    "conv-bn-relu-maxpool": {"B": 2, "CIN": 3, "C": 8, "HW": 16},
    "conv-bn-relu-2pool": {"B": 2, "CIN": 3, "C": 8, "HW": 16},
    "shared-act": {"B": 2, "S": 8, "D": 16},
    "pointwise-chain": {"N": 256, "STEPS": 3},
    "mlp": {"B": 4, "D": 16, "HID": 32, "L": 2},
    "matmul": {"M": 8, "K": 4, "N": 6},
    "tp-mlp": {"B": 2, "S": 16, "D": 16, "HID": 32, "TP": 2},
    "tp-block": {**BLOCK, "TP": 2},
    "dp-grad-sync": {"D": 16, "HID": 32, "L": 2, "DP": 2, "BUCKET_KB": 2},
    "dp-block": {"D": 16, "DP": 2, "BUCKET_KB": 2},
    "pp-block": {**BLOCK, "PP": 2, "STAGE": 2},
}
FAST = ("transformer-block", "resnet-bottleneck", "mlp")


def test_every_zoo_model_has_small_shapes_here():
    assert set(SMALL) == set(zoo.ZOO)


NO_P2P = pytest.mark.skipif(
    not has_functional_p2p(), reason=f"torch {torch.__version__} has no functional p2p ops"
)


def _slow(name: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.slow] + ([NO_P2P] if name == "pp-block" else [])


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=_slow(n)) for n in SMALL]
)
def test_lifted_dynamo_graph_has_the_direct_capture_structure_key(name):
    module, inputs = zoo.get(name).build(SMALL[name])
    direct = export_model(module, inputs).graph
    seen = []

    def backend(gm, example_inputs):
        seen.append((lift_graph(gm, list(example_inputs)), list(example_inputs)))
        return gm.forward

    torch.compile(module, backend=backend, dynamic=True)(*inputs)
    ((lifted, args),) = seen
    assert len(lifted.user_positions) == len(inputs)
    # the lifted graph takes the user's tensors in the order dynamo met them (a forward
    # that reads its arguments out of order, as a gradient sync's buckets do, reorders
    # them); tune and the backend both capture through it, so their keys agree
    user = tuple(args[p] for p in lifted.user_positions)
    again = export_model(lifted.module, user).graph
    assert again.structure_key == capture_for_serving(module, inputs).graph.structure_key
    if all(a is b for a, b in zip(user, inputs)):
        assert again.structure_key == direct.structure_key
        assert [n.target for n in again.nodes] == [n.target for n in direct.nodes]
    else:
        assert sorted(map(str, (n.target for n in again.nodes))) == sorted(
            map(str, (n.target for n in direct.nodes))
        )
    assert (0, 0) in lifted.dynamic  # the batch dim stays symbolic under dynamic=True
    out, ref = lifted.module(*user), module(*inputs)
    torch.testing.assert_close(tuple(out), ref if isinstance(ref, tuple) else (ref,))


class _Strided(torch.nn.Module):
    """Reads its input's stride: dynamo passes that stride in as a size input."""

    def forward(self, x):
        return x.sum(-1) * x.stride(0)


@pytest.mark.parametrize("reads_stride", [False, True])
def test_size_inputs_that_are_strides_lift(reads_stride):
    """Inputs cut from a longer tensor and cloned keep its row stride (a size-1 batch's
    stride is free): dynamo passes that stride in as a size input of its own, unused
    unless the model reads it. Unused, it is dropped; read, it is the tensor's stride."""
    module = _Strided() if reads_stride else torch.nn.Sequential(torch.nn.Embedding(50, 8))
    base = torch.randint(0, 50, (1, 64)).float() if reads_stride else torch.randint(0, 50, (1, 64))
    seen = []

    def backend(gm, example_inputs):
        seen.append(lift_graph(gm, list(example_inputs)))
        return gm.forward

    compiled = torch.compile(module, backend=backend, dynamic=True)
    for s in (20, 33):
        x = base.narrow(1, 0, s).clone()
        assert x.stride(0) == 64
        compiled(x)
    lifted = seen[-1]
    x = base.narrow(1, 0, 41).clone()
    (out,) = lifted.module(x)
    torch.testing.assert_close(out, module(x))


# ---- backend: correctness and bookkeeping --------------------------------------------------------
def test_backend_matches_eager_over_varying_shapes_and_queues_misses(cache):
    module = block()
    count = Counting()
    be = fusion_planner_backend(cache, realizer=count.realizer, exporter=count.exporter)
    compiled = torch.compile(module, backend=be, dynamic=True)
    run_shapes(compiled, module, [16, 12, 9, 24, 40, 33, 16, 64])
    # pow2 buckets of S: 9-16 (16, 12, 9), 17-32 (24), 33-64 (40, 33, 64): one each
    assert len(count.partitions) == be.stats.realized == 3
    assert sorted(d[0][1] for d in count.exports) == [(9, 16), (17, 32), (33, 64)]
    assert be.stats.default == 7 and be.stats.bucket == 0  # 7 distinct shapes, no plans yet
    queue = {q.shapes: q for q in cache.tuning_queue()}
    assert set(queue) == {((2, s, 32),) for s in (16, 12, 9, 24, 40, 33, 64)}
    assert queue[((2, 40, 32),)].bucket_key == "[2-2,33-64,32]"


def test_a_tuned_plan_is_found_and_realized_once_per_bucket(cache):
    """What `fusion-plan tune` stores (plan on a direct capture at the bucket's
    representative shape, the spec beside it) is what the backend serves."""
    module = block()
    spec = parse_dynamic("S=8..64", {"B": (0, 0), "S": (0, 1)})
    rep_bucket = spec.bucket_of([(2, 40, 32)])
    graph, whole_attention = attention_at_representative(module, spec)
    plan = cpu_plan(whole_attention, cache).with_measurement(9e-5)
    cache.store(plan, rep_bucket)
    cache.set_bucket_spec(graph.structure_key, spec, cache.device_fp)

    count = Counting()
    be = fusion_planner_backend(cache, realizer=count.realizer, exporter=count.exporter)
    compiled = torch.compile(module, backend=be, dynamic=True)
    run_shapes(compiled, module, [40, 33, 64, 50, 16])
    assert be.stats.bucket == 4 and be.stats.default == 1  # 16 is in bucket 9-16: no plan
    assert be.stats.realized == 2
    tuned = count.partitions[0]
    assert len(tuned) == len(whole_attention) and tuned.group_of[11] == tuned.group_of[14]
    assert count.plans[0].strategy == "test" and count.plans[1].strategy == "default"
    assert [q.shapes for q in cache.tuning_queue()] == [((2, 16, 32),)]

    r = lookup(graph.structure_key, [(2, 50, 32)], cache.device_fp, cache=cache)
    assert r.source == "bucket" and r.plan.measured_s == pytest.approx(9e-5)
    p, source = plan_for(graph, cache.device_fp, cache=cache)
    assert source == "bucket" and p.n_groups == plan.n_groups


def test_an_exact_shape_plan_beats_the_bucket_plan(cache):
    module = block()
    spec = parse_dynamic("S=8..64", {"B": (0, 0), "S": (0, 1)})
    x = torch.randn(2, 40, 32)
    graph = export_model(module, (x,)).graph
    base = dict(device="cpu", dtype="float32", strategy="t", cost_model="a/1", predicted_s=1e-3)
    for_bucket = Plan.from_partition(
        Partition.singletons(graph).merge_nodes(12, 13), **base, device_fingerprint=cache.device_fp
    )
    for_exact = Plan.from_partition(
        Partition.singletons(graph).merge_nodes(11, 12), **base, device_fingerprint=cache.device_fp
    )
    cache.store(for_bucket, spec.bucket_of([(2, 40, 32)]))
    cache.store_exact(for_exact, [(2, 40, 32)])
    cache.set_bucket_spec(graph.structure_key, spec, cache.device_fp)
    count = Counting()
    be = fusion_planner_backend(cache, realizer=count.realizer, exporter=count.exporter)
    compiled = torch.compile(module, backend=be, dynamic=True)
    run_shapes(compiled, module, [40, 48, 40])
    assert be.stats.exact == 1 and be.stats.bucket == 1
    exact_part, bucket_part = count.partitions
    assert exact_part.group_of[11] == exact_part.group_of[12] != exact_part.group_of[13]
    assert bucket_part.group_of[12] == bucket_part.group_of[13] != bucket_part.group_of[11]
    assert count.exports == [{0: {1: (33, 64)}}]  # the exact plan is realized statically


def test_an_unfused_default_plan_runs_dynamos_graph_without_a_compile(cache, monkeypatch):
    monkeypatch.setattr(runtime, "_rule_based_partition", Partition.singletons)  # no fusion
    module = block()
    count = Counting()
    be = fusion_planner_backend(cache, realizer=count.realizer, exporter=count.exporter)
    compiled = torch.compile(module, backend=be, dynamic=True)
    run_shapes(compiled, module, [16, 24, 40])
    assert be.stats.default == 3 and be.stats.realized == 0 and count.partitions == []
    assert len(cache.tuning_queue()) == 3  # the misses are still queued


def test_compile_budget_bounds_realizations_and_the_rest_runs_eager(cache):
    module = block()
    count = Counting()
    be = fusion_planner_backend(
        cache, compile_budget=2, realizer=count.realizer, exporter=count.exporter
    )
    compiled = torch.compile(module, backend=be, dynamic=True)
    with pytest.warns(PlannerRuntimeWarning, match="budget"):
        run_shapes(compiled, module, [16, 24, 40, 100, 200, 12])
    assert be.stats.realized == 2 and len(count.partitions) == 2
    assert be.stats.over_budget == 3  # buckets 33-64, 65-128, 129-256


class _TwoBlocks(torch.nn.Module):
    """Two zoo blocks (whose default plans fuse) with a graph break between them."""

    def __init__(self):
        super().__init__()
        self.first, self.second = block(), block()

    def forward(self, x):
        x = self.first(x)
        torch._dynamo.graph_break()
        return self.second(x)


def test_the_compile_budget_is_each_graphs_own(cache):
    """A model with a graph break is two dynamo graphs: a budget of one realization
    realizes a bucket in each, instead of leaving the second graph unplanned."""
    module = _TwoBlocks().eval()
    count = Counting()
    be = fusion_planner_backend(
        cache, compile_budget=1, realizer=count.realizer, exporter=count.exporter
    )
    compiled = torch.compile(module, backend=be, dynamic=True)
    with torch.no_grad():
        for s in (16, 40):  # the second bucket is past each graph's budget
            x = torch.randn(2, s, 32)
            torch.testing.assert_close(compiled(x), module(x))
    assert be.stats.graphs == 2 and be.stats.realized == 2 == len(count.partitions)
    assert be.stats.over_budget == 2, be.stats


def test_a_bucket_that_does_not_export_over_its_range_is_realized_per_shape_and_said(cache):
    """A bucket whose export over its range fails (a model that guards on the length there)
    realizes each shape alone; it is tried once per bucket, and the user is told why."""
    module = block()
    count = Counting()
    tries = []

    def refusing(module, inputs, dims):
        tries.append(dims)
        raise RuntimeError("Constraints violated (d0_1)! guard on the length\nmore detail")

    be = fusion_planner_backend(cache, realizer=count.realizer, exporter=refusing)
    compiled = torch.compile(module, backend=be, dynamic=True)
    with pytest.warns(PlannerRuntimeWarning, match="realized alone.*Constraints violated"):
        run_shapes(compiled, module, [40, 33, 50, 40])
    assert len(tries) == 1  # the bucket's other shapes do not export again
    assert be.stats.realized == 3 == len(count.partitions)  # 40, 33 and 50, each alone
    assert be.stats.per_shape == [
        "[2-2,33-64,32]: RuntimeError: Constraints violated (d0_1)! guard on the length"
    ]


def test_failures_fall_back_to_dynamos_graph_with_a_warning(cache):
    module = block()

    def broken_realizer(captured, plan):
        raise RuntimeError("inductor exploded")

    be = fusion_planner_backend(cache, realizer=broken_realizer, exporter=Counting().exporter)
    compiled = torch.compile(module, backend=be, dynamic=True)
    with pytest.warns(PlannerRuntimeWarning, match="inductor exploded"):
        run_shapes(compiled, module, [16, 24])
    assert any("inductor exploded" in f for f in be.stats.fallbacks)

    def fails_when_run(captured, plan):
        def run(*args):
            raise RuntimeError("kernel crashed")

        return run

    torch._dynamo.reset()
    be = fusion_planner_backend(cache, realizer=fails_when_run, exporter=Counting().exporter)
    compiled = torch.compile(module, backend=be, dynamic=True)
    with pytest.warns(PlannerRuntimeWarning, match="kernel crashed"):
        run_shapes(compiled, module, [16, 12, 16])


def test_an_unusable_cache_still_runs_the_model(tmp_path):
    bad = tmp_path / "plans.sqlite"
    bad.write_bytes(b"garbage" * 100)
    module = block()
    count = Counting()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        be = fusion_planner_backend(str(bad), realizer=count.realizer, exporter=count.exporter)
        compiled = torch.compile(module, backend=be, dynamic=True)
        run_shapes(compiled, module, [16, 24])
    assert be.stats.default == 2 and len(count.partitions) == 2


def test_explicit_bucket_policies(cache):
    module = block()
    count = Counting()
    spec = BucketSpec((DynamicDim("S", 0, 1),), (Edges((20, 64), lo=2),))
    be = fusion_planner_backend(
        cache, bucket_policy=spec, realizer=count.realizer, exporter=count.exporter
    )
    compiled = torch.compile(module, backend=be, dynamic=True)
    run_shapes(compiled, module, [16, 20, 30, 64, 65])  # 65: outside every bucket
    assert count.exports == [{0: {1: (2, 20)}}, {0: {1: (21, 64)}}]
    assert be.stats.realized == 3  # two buckets + one exact shape outside them
    q = {x.shapes: x.bucket_key for x in cache.tuning_queue()}
    assert q[((2, 65, 32),)] == "" and q[((2, 30, 32),)] == "[2,21-64,32]"

    torch._dynamo.reset()
    count = Counting()
    be = fusion_planner_backend(
        cache, bucket_policy=Pow2(), realizer=count.realizer, exporter=count.exporter
    )
    torch.compile(module, backend=be, dynamic=True)(torch.randn(3, 20, 32))
    assert count.exports == [{0: {0: (3, 4), 1: (17, 32)}}]  # every dynamo-dynamic dim


def test_plain_lookup_never_raises_and_defaults(tmp_path):
    module, inputs = zoo.get("mlp").build({"B": 4, "D": 16, "HID": 32, "L": 2}, device="meta")
    graph = export_model(module, inputs).graph
    r = lookup(graph.structure_key, graph.input_shapes, "cpu", cache=str(tmp_path / "p.sqlite"))
    assert r.source == "default" and r.plan is None
    (tmp_path / "bad.sqlite").write_bytes(b"x" * 1000)
    with pytest.warns(Warning):
        r = lookup(
            graph.structure_key, graph.input_shapes, None, cache=str(tmp_path / "bad.sqlite")
        )
    assert r.source == "default"
    plan, source = plan_for(graph, "cpu", cache=str(tmp_path / "p.sqlite"))
    assert source == "default" and plan.strategy == "default"
    assert plan.partition(graph) is not None
    assert default_plan(graph).graph_key == graph.key


def test_lift_keeps_attribute_parameters_as_parameters():
    """Older dynamo (and plain FX) keep parameters as get_attr nodes, not inputs."""

    class Affine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(8, 4))
            self.register_buffer("shift", torch.randn(8))

        def forward(self, x):
            return torch.relu(torch.nn.functional.linear(x, self.weight) + self.shift)

    module, x = Affine(), torch.randn(3, 4)
    gm = torch.fx.symbolic_trace(module)
    lifted = lift_graph(gm, [x])
    assert dict(lifted.module.named_parameters()).keys() == {"attr_weight"}
    assert dict(lifted.module.named_buffers()).keys() == {"attr_shift"}
    assert lifted.user_positions == (0,) and lifted.dynamic == ()
    graph = export_model(lifted.module, (x,)).graph
    assert graph.structure_key == export_model(module, (x,)).graph.structure_key
    torch.testing.assert_close(lifted.module(x), module(x))


# ---- real realization (Inductor) -----------------------------------------------------------------
def test_backend_with_real_realization_matches_eager(cache):
    """planner.realize.realizer (Inductor) and capture_dynamic for real: a tuned plan with a fused
    attention group, realized once for its bucket, matches eager over the bucket's shapes;
    misses run the (stand-in) default plan, also realized."""
    module = block()
    spec = parse_dynamic("S=8..64", {"B": (0, 0), "S": (0, 1)})
    bucket = spec.bucket_of([(2, 40, 32)])
    graph, part = attention_at_representative(module, spec)
    plan = cpu_plan(part, cache)
    cache.store(plan, bucket)
    cache.set_bucket_spec(graph.structure_key, spec, cache.device_fp)
    made = []

    def realizer(captured, fitted):
        made.append(realize(captured, fitted))
        return made[-1]

    be = fusion_planner_backend(cache, compile_budget=4, realizer=realizer)
    compiled = torch.compile(module, backend=be, dynamic=True)
    run_shapes(compiled, module, [40, 33, 64, 50, 16, 12])
    assert not be.stats.fallbacks, be.stats.fallbacks
    assert be.stats.bucket == 4 and be.stats.default == 2 and be.stats.realized == 2
    tuned = made[0]
    assert not tuned.static_shapes  # one realization serves the whole bucket
    fused = [r for g, r in zip(tuned.partition.groups, tuned.realizations) if len(g) == 4]
    assert fused and fused[0] != "eager", tuned.describe()


def test_a_bucket_queues_a_bounded_number_of_new_shapes(cache, monkeypatch):
    """A decode loop meets a new shape per token: the queue gets the first few of each
    bucket, not a database write per call."""
    monkeypatch.setattr(runtime, "_rule_based_partition", Partition.singletons)  # no compile
    module = block()
    be = fusion_planner_backend(cache)
    compiled = torch.compile(module, backend=be, dynamic=True)
    shapes = list(range(17, 31))  # 14 lengths of one pow2 bucket
    run_shapes(compiled, module, shapes)
    assert be.stats.default == len(shapes)
    assert be.stats.queued == runtime.MISSES_PER_BUCKET == len(cache.tuning_queue()) < len(shapes)


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad


class _WithFunction(torch.nn.Module):
    """A custom autograd.Function between two layers (as `transformers` BLOOM's GELU)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(_Cube.apply(self.a(x)))


def test_a_custom_autograd_function_in_grad_mode_runs_as_traced_and_says_why():
    """In grad mode dynamo keeps the Function as a higher-order op over subgraphs, which
    the runtime does not plan: one warning that names it, eager's outputs and gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _WithFunction()
    x = torch.randn(2, 5, 8)
    model(x).pow(2).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    backend = fusion_planner_backend(None, record_misses=False)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with pytest.warns(PlannerRuntimeWarning, match="higher-order op .*autograd.Function"):
        compiled(x).pow(2).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-5, msg=n)
    torch._dynamo.reset()


def test_a_graph_without_tensors_runs_as_it_is_without_a_warning():
    # dynamo compiles Python arithmetic on sizes between two graph breaks into a graph
    # with no tensor in it (Longformer's padding to its attention window does)
    import operator

    g = torch.fx.Graph()
    four = g.call_function(operator.mul, (2, 2))
    div = g.call_function(torch.div, (16, four), {"rounding_mode": "trunc"})
    g.output((8, div, four, 8))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    backend = fusion_planner_backend()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn = backend(gm, [])
        assert fn() == (8, 4, 4, 8)
    assert backend.stats.tensorless == 1
    assert backend.stats.fallbacks == [] and backend.stats.realized == 0


def test_a_graph_without_tensor_inputs_runs_where_its_parameters_are():
    with torch._subclasses.fake_tensor.FakeTensorMode():
        x_gpu = torch.empty(2, device="cuda")  # fake: runs on any machine
    on_gpu = torch.nn.Module()
    on_gpu.register_buffer("table", x_gpu)
    assert device_of_graph((), on_gpu).type == "cuda"
    assert device_of_graph((torch.zeros(2), x_gpu), torch.nn.Module()).type == "cuda"
    assert device_of_graph((), torch.nn.Module()).type == "cpu"


def test_the_backend_plans_a_graph_that_updates_its_input_in_place(cache):
    from tests.test_accuracy import WritesCache

    torch.manual_seed(0)
    module = WritesCache().eval()
    be = fusion_planner_backend(cache)
    compiled = torch.compile(module, backend=be, dynamic=True)
    with torch.no_grad():
        for s in (8, 12):
            x, kv = torch.randn(2, s, 16), torch.randn(2, 32, 16)
            mine, theirs = kv.clone(), kv.clone()
            torch.testing.assert_close(compiled(x, mine), module(x, theirs))
            torch.testing.assert_close(mine, theirs)
    assert be.stats.realized == 2 and be.stats.fallbacks == [], be.stats
