"""The runtime backend on real models: Hugging Face `transformers` models built from tiny
configs (no downloads), plans stored from the offline capture found by the backend, and
gradients equal to eager's in grad mode. Real torch.compile and, where a test says so,
real realization (Inductor) on CPU."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
import torch.utils._pytree as pytree

import zoo
from cli.main import main
from planner.fusion.fuse_rules import default_partition
from planner.fusion.partition import Partition
from planner.ir.capture import Captured
from planner.ir.capture_dynamic import export_dynamic
from planner.plans.buckets import parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan
from planner.realize.graph import group_graphs, take_apart
from planner.realize.realizer import realize
from planner.runtime.backend import PlannerRuntimeWarning, fusion_planner_backend
from planner.runtime.grad import recompute_blocker
from planner.runtime.graph import capture_for_serving
from tests.backend_helpers import ReadsLastFirst
from zoo.modelspec import resolve

transformers = pytest.importorskip("transformers")

SEQ = {"B": (0, 0), "S": (0, 1)}  # token-id models: input 0 is [B, S]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cache(tmp_path):
    return PlanCache(str(tmp_path / "plans.sqlite"))


def tiny_llama(layers=2):
    """LLaMA at its default settings (KV cache on): GQA, RoPE, RMSNorm, SwiGLU."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaModel(cfg).eval()


def ids(b, s):
    return torch.randint(0, 96, (b, s))


def leaves(out):
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def assert_same_outputs(got, want):
    got, want = leaves(got), leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


class Recording:
    """The real realizer, keeping what it made."""

    def __init__(self):
        self.made = []

    def __call__(self, captured, plan):
        self.made.append(realize(captured, plan))
        return self.made[-1]


class ProgramRealizer:
    """Runs the captured program as it is (no Inductor): for tests about which plan the
    backend picks and how gradients flow, not about compiling."""

    def __init__(self):
        self.plans: list[Plan] = []

    def __call__(self, captured: Captured, plan: Plan):
        self.plans.append(plan)
        return captured.program.module()


def cpu_plan(graph, cache, strategy="test"):
    """The rule-based partition of `graph` as a stored plan would carry it."""
    return Plan.from_partition(
        default_partition(graph),
        device="cpu",
        dtype="float32",
        strategy=strategy,
        cost_model="analytical/1",
        predicted_s=1e-4,
        device_fingerprint=cache.device_fp,
    )


# ---- real models run real plans -------------------------------------------------------------
@pytest.mark.slow
def test_llama_runs_a_realized_plan_over_a_bucket(cache):
    model = tiny_llama(layers=1)
    made = Recording()
    be = fusion_planner_backend(cache, realizer=made)
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        for s in (16, 12, 16):
            x = ids(2, s)
            assert_same_outputs(compiled(x), model(x))
    assert not be.stats.fallbacks, be.stats.fallbacks
    assert be.stats.realized == 1 and be.stats.default == 2  # 12 and 16 share bucket 9-16
    (plan,) = made.made
    assert not plan.static_shapes and not plan.fallbacks, plan.describe()
    assert sum(r != "eager" for r in plan.realizations) >= 3, plan.describe()


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [True, False, None])
def test_hf_models_run_realized_plans(cache, dynamic):
    """Every architecture of the suite, each torch.compile dynamic mode, varying shapes."""
    torch.manual_seed(0)
    t = transformers
    models = {
        "llama": (tiny_llama(), [(ids(2, 16),), (ids(3, 24),)]),
        "gpt2": (
            t.GPT2Model(t.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4)).eval(),
            [(ids(2, 16),), (ids(3, 24),)],
        ),
        "bert": (
            t.BertModel(
                t.BertConfig(
                    vocab_size=96,
                    hidden_size=32,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=64,
                )
            ).eval(),
            [(ids(2, 16),), (ids(3, 24),)],
        ),
        "resnet": (
            t.ResNetModel(
                t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])
            ).eval(),
            [(torch.randn(2, 3, 32, 32),), (torch.randn(3, 3, 48, 48),)],
        ),
        "convnext": (
            t.ConvNextModel(
                t.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1])
            ).eval(),
            [(torch.randn(2, 3, 32, 32),), (torch.randn(3, 3, 48, 48),)],
        ),
    }
    for name, (model, calls) in models.items():
        torch._dynamo.reset()
        made = Recording()
        be = fusion_planner_backend(cache, realizer=made)
        compiled = torch.compile(model, backend=be, dynamic=dynamic)
        with torch.no_grad():
            for args in calls:
                assert_same_outputs(compiled(*args), model(*args))
        assert be.stats.realized >= 1 and not be.stats.fallbacks, (name, be.stats)
        for plan in made.made:
            compiled_groups = sum(r != "eager" for r in plan.realizations)
            assert compiled_groups >= 1, (name, plan.describe())
            if plan.static_shapes:  # layouts propagate: docs/runtime.md, known limits
                assert len(plan.fallbacks) < compiled_groups, (name, plan.describe())
                continue
            assert not plan.fallbacks, (name, plan.describe())


def test_conv_groups_take_the_symbols_their_sizes_are_made_of():
    """A conv net over a spatial range: a group after a strided conv sees sizes like
    ((s1 - 1)//2) + 1; it gets s1 itself as an input, so a compiler can bind it."""
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1)
    )
    captured = export_dynamic(module, (torch.randn(2, 3, 16, 16),), {0: {2: (9, 32)}})
    part = Partition.singletons(captured.graph)
    groups = group_graphs(take_apart(captured, part), part)
    fed = 0
    for gg in groups:
        tensor_syms = {
            s.node.expr
            for f in gg.fakes
            if isinstance(f, torch.Tensor)
            for s in f.shape
            if isinstance(s, torch.SymInt)
        }
        bare = {e for e in tensor_syms if e.is_Symbol}
        bare |= {f.node.expr for f in gg.fakes if isinstance(f, torch.SymInt)}
        needed = set().union(*(e.free_symbols for e in tensor_syms)) if tensor_syms else set()
        assert needed <= bare, (gg.index, needed - bare)
        fed += any(isinstance(f, torch.SymInt) for f in gg.fakes)
    assert fed >= 1  # after the stride-2 conv, relu needs H's symbol passed in


# ---- the offline capture and the backend agree on the model --------------------------------------
@pytest.mark.parametrize("which", ["zoo", pytest.param("llama", marks=pytest.mark.slow)])
def test_a_plan_stored_for_the_offline_capture_is_found_by_the_backend(cache, which):
    """What `fusion-plan tune` stores (a plan on `capture_for_serving` at the bucket's
    representative shape, the spec beside it) is a hit for the backend, not a miss."""
    if which == "zoo":
        module = zoo.get("transformer-block").build({"B": 2, "S": 16, "D": 32, "H": 4})[0]
        make = lambda s: (torch.randn(2, s, 32),)  # noqa: E731
    else:
        module, make = tiny_llama(), lambda s: (ids(2, s),)
    spec = parse_dynamic("S=8..64", SEQ)
    bucket = spec.bucket_of([(2, 40, 32) if which == "zoo" else (2, 40)])
    (rep,) = bucket.representative()
    graph = capture_for_serving(module, make(rep[1])).graph  # what tune_bucket captures
    cache.store(cpu_plan(graph, cache), bucket)
    cache.set_bucket_spec(graph.structure_key, spec, cache.device_fp)

    realizer = ProgramRealizer()
    be = fusion_planner_backend(cache, realizer=realizer)
    compiled = torch.compile(module, backend=be, dynamic=True)
    with torch.no_grad():
        for s in (40, 50):
            args = make(s)
            assert_same_outputs(compiled(*args), module(*args))
    assert be.stats.bucket == 2 and be.stats.default == 0, be.stats
    assert [p.strategy for p in realizer.plans] == ["test"]
    assert cache.tuning_queue() == []


FACTORY = """
import torch
import transformers


def factory(B=2, S=16):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return transformers.LlamaModel(cfg).eval(), (torch.randint(0, 96, (B, S)),)


factory.dims = {"B": (0, 0), "S": (0, 1)}
"""


def _tuned_then_served(tmp_path, name: str, factory: str, *tune_flags: str):
    """`fusion-plan tune` of the factory file `factory` (B=2, S=9..16, greedy, one
    candidate, fp32) into a fresh cache, then the model built at S=16 and compiled with
    the backend on that cache: (cache url, module, compiled, backend, its realizer)."""
    (tmp_path / f"{name}.py").write_text(factory)
    spec, url = f"{tmp_path}/{name}.py:factory", str(tmp_path / "plans.sqlite")
    argv = ["tune", "--model", spec, "--shape", "B=2", "--dynamic", "S=9..16"]
    argv += ["--strategy", "greedy", "--top-k", "1", "--cache", url]
    assert main([*argv, "--no-compile-baseline", "--dtype", "fp32", *tune_flags]) == 0
    module, _ = resolve(spec, "B=2,S=16").build()
    realizer = ProgramRealizer()
    be = fusion_planner_backend(PlanCache(url), realizer=realizer)
    return url, module, torch.compile(module, backend=be, dynamic=True), be, realizer


def test_fusion_plan_tune_stores_a_plan_the_backend_serves(tmp_path):
    """The user's path end to end: `fusion-plan tune` on a factory file of a transformers
    LLaMA (KV cache on, as by default), then torch.compile with the backend on that cache:
    every shape of the tuned bucket is a hit, none is queued as a miss."""
    # --keep-fused: on a loaded CPU eager can measure faster than the candidate, and the
    # unfused plan stored then is served as dynamo's graph, with no realization to check
    url, module, compiled, be, realizer = _tuned_then_served(
        tmp_path, "llama", FACTORY, "--keep-fused"
    )
    with torch.no_grad():
        for s in (16, 12):
            x = ids(2, s)
            assert_same_outputs(compiled(x), module(x))
    assert be.stats.bucket == 2 and be.stats.default == 0, be.stats
    (plan,) = realizer.plans
    assert plan.strategy != "default" and plan.measured_s is not None
    assert PlanCache(url).tuning_queue() == []


READS_LAST_FIRST = """
import torch

from tests.backend_helpers import ReadsLastFirst


def factory(B=2, S=16):
    torch.manual_seed(0)
    return ReadsLastFirst().eval(), {"memory": torch.randn(B, 6, 32), "tokens": torch.randn(B, S, 32)}
"""


def test_a_plan_is_found_for_a_model_that_reads_a_later_argument_first(tmp_path):
    """The dynamic dim is on the second keyword argument, which forward uses first: the
    runtime numbers inputs in that order, so tune stores the bucket and its spec that way
    (before, the stored bucket was keyed in the call's order and every shape missed)."""
    url, _, _, _, _ = _tuned_then_served(tmp_path, "rlf", READS_LAST_FIRST, "--keep-fused")
    torch.manual_seed(0)
    _serves_its_bucket_plan(ReadsLastFirst().eval(), url, torch.randn(2, 6, 32))
    assert PlanCache(url).tuning_queue() == []


def _serves_its_bucket_plan(module, url: str, memory) -> None:
    """`module` (ReadsLastFirst) compiled with the backend on `url` serves lengths 16 and 12
    from their bucket's plan, as eager computes them."""
    be = fusion_planner_backend(PlanCache(url))
    compiled = torch.compile(module, backend=be, dynamic=True)
    with torch.no_grad():
        for s in (16, 12):
            tokens = torch.randn(2, s, 32)
            got = compiled(memory=memory, tokens=tokens)
            assert_same_outputs(got, module(memory=memory, tokens=tokens))
    assert be.stats.bucket == 2 and be.stats.default == 0, be.stats


POSITION_SLICE = """
import torch

from tests.backend_helpers import PositionSlice


def factory(B=2, S=16):
    torch.manual_seed(0)
    return PositionSlice().eval(), (torch.randn(B, S, 32),)
"""


def test_a_plan_tuned_where_an_op_vanishes_is_found_from_the_other_shapes(tmp_path):
    """The bucket S=9..16 is tuned at S=16, where `pos[:, :S]` is an identity export drops;
    at every other length of the bucket the slice is there, so the model's key differs.
    tune stores the plan for those ops too, and the backend, first called at S=12, finds
    it: hits, no miss queued."""
    url, module, compiled, be, realizer = _tuned_then_served(
        tmp_path, "pos", POSITION_SLICE, "--keep-fused"
    )
    assert len(PlanCache(url).entries()) == 2  # the edge's ops and the bucket's
    with torch.no_grad():
        for s in (12, 10):
            x = torch.randn(2, s, 32)
            assert_same_outputs(compiled(x), module(x))
    assert be.stats.bucket == 2 and be.stats.default == 0, be.stats
    (plan,) = realizer.plans
    assert plan.strategy != "default"
    assert PlanCache(url).tuning_queue() == []


# ---- gradients --------------------------------------------------------------------------------
def grads_of(module, fn, inputs):
    """Output and the gradients of sum(out^2) w.r.t. float inputs and every parameter."""
    for p in module.parameters():
        p.grad = None
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = leaves(fn(*xs))[0]
    out.pow(2).sum().backward()
    params = {n: p.grad for n, p in module.named_parameters()}
    return out.detach(), [x.grad for x in xs], params


def assert_same_grads(module, compiled, inputs):
    out_e, xg_e, pg_e = grads_of(module, module, inputs)
    out_c, xg_c, pg_c = grads_of(module, compiled, inputs)
    torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-5)
    for a, b in zip(xg_c, xg_e):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    differ = [n for n in pg_e if (pg_c[n] is None) != (pg_e[n] is None)]
    assert not differ, f"gradient present in one run only: {differ}"
    for n in pg_e:
        if pg_e[n] is not None:
            torch.testing.assert_close(pg_c[n], pg_e[n], rtol=1e-4, atol=1e-4, msg=n)
    return pg_e


def test_grad_mode_on_a_zoo_block_gives_eagers_gradients_through_a_real_plan(cache):
    module, (x,) = zoo.get("transformer-block").build({"B": 2, "S": 16, "D": 32, "H": 4})
    made = Recording()
    be = fusion_planner_backend(cache, realizer=made)
    compiled = torch.compile(module, backend=be, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlannerRuntimeWarning)  # served, not declined
        pg = assert_same_grads(module, compiled, (x,))
        assert_same_grads(module, compiled, (torch.randn(2, 12, 32),))  # same bucket
    assert len(pg) == 16 and all(g is not None for g in pg.values())
    assert be.stats.grad_graphs == 1 and be.stats.realized == 1 and not be.stats.declined
    assert sum(r != "eager" for r in made.made[0].realizations) >= 1


def test_grad_mode_on_llama_gives_eagers_parameter_gradients(cache):
    model = tiny_llama()
    be = fusion_planner_backend(cache, realizer=ProgramRealizer())
    compiled = torch.compile(model, backend=be, dynamic=True)
    pg = assert_same_grads(model, compiled, (ids(2, 16),))
    assert all(g is not None for g in pg.values())
    assert be.stats.grad_graphs == 1 and be.stats.realized == 1 and not be.stats.declined


def test_grad_mode_leaves_parameters_behind_unused_outputs_without_gradient(cache):
    """BERT returns its pooler output beside the hidden states; a loss on the hidden
    states alone gives the pooler no gradient in eager, and none here either (not zeros,
    which an optimizer with weight decay would act on)."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
    )
    model = transformers.BertModel(cfg).eval()
    be = fusion_planner_backend(cache, realizer=ProgramRealizer())
    compiled = torch.compile(model, backend=be, dynamic=True)
    pg = assert_same_grads(model, compiled, (ids(2, 16),))
    assert (
        pg["pooler.dense.weight"] is None and pg["encoder.layer.0.output.dense.weight"] is not None
    )
    assert be.stats.grad_graphs == 1


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_training_graphs_that_cannot_be_recomputed_are_declined_with_one_warning(cache):
    """BatchNorm in training updates its running statistics: recomputing the forward for
    the backward pass would update them twice, so the graph goes to Inductor."""
    torch.manual_seed(0)
    eager, served = ConvBN().train(), ConvBN().train()
    served.load_state_dict(eager.state_dict())
    be = fusion_planner_backend(cache, realizer=ProgramRealizer())
    compiled = torch.compile(served, backend=be)
    with pytest.warns(PlannerRuntimeWarning, match="declines") as caught:
        for _ in range(2):
            x = torch.randn(2, 3, 8, 8)
            _, _, pg_e = grads_of(eager, eager, (x,))
            _, _, pg_c = grads_of(served, compiled, (x,))
            for n in pg_e:
                torch.testing.assert_close(pg_c[n], pg_e[n], rtol=1e-4, atol=1e-4, msg=n)
    assert len([w for w in caught if issubclass(w.category, PlannerRuntimeWarning)]) == 1
    (reason,) = be.stats.declined
    assert "num_batches_tracked" in reason or "batch_norm" in reason
    assert be.stats.realized == 0
    torch.testing.assert_close(served.bn.running_mean, eager.bn.running_mean)


def dynamo_graph(module, *args):
    seen = []

    def record(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    torch.compile(module, backend=record)(*args)
    (gm,) = seen
    return gm


def test_random_ops_in_training_block_recomputation_and_eval_does_not():
    class Drop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(torch.relu(self.lin(x)))

    module, x = Drop(), torch.randn(3, 4)
    assert "dropout in training" in recompute_blocker(dynamo_graph(module.train(), x))
    torch._dynamo.reset()
    assert recompute_blocker(dynamo_graph(module.eval(), x)) is None


def test_in_place_updates_of_inputs_or_their_views_block_recomputation():
    class Scales(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(4))

        def forward(self, x):
            self.seen[:2].add_(1.0)  # a view of a buffer, updated in place
            y = x * 2
            y.add_(1.0)  # a fresh intermediate: recomputing it is harmless
            return y

    reason = recompute_blocker(dynamo_graph(Scales(), torch.randn(3, 4)))
    assert reason is not None and "add_" in reason and "seen" in reason


class AddsAcrossABreak(torch.nn.Module):
    """The graph after the break updates its input, a tensor the first graph made, with
    `+=` (Longformer does this with the tensors it hands across its graph breaks)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        torch._dynamo.graph_break()
        h += 1.0
        return torch.relu(h * 2 - 1)


def test_augmented_assignment_to_an_input_blocks_recomputation():
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    module, x = AddsAcrossABreak(), torch.randn(3, 8)
    torch.compile(module, backend=keep)(x)
    assert len(graphs) == 2
    assert recompute_blocker(graphs[0]) is None
    reason = recompute_blocker(graphs[1])
    assert reason is not None and "iadd" in reason


def test_a_graph_that_updates_its_input_gets_eagers_gradients(cache):
    torch.manual_seed(0)
    module = AddsAcrossABreak()
    x = torch.randn(4, 8, requires_grad=True)
    module(x).sum().backward()
    want = [x.grad.clone()] + [p.grad.clone() for p in module.parameters()]
    x.grad = None
    module.zero_grad(set_to_none=True)
    be = fusion_planner_backend(cache)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(module, backend=be, dynamic=True)(x).sum().backward()
    got = [x.grad] + [p.grad for p in module.parameters()]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert any("iadd" in d for d in be.stats.declined), be.stats


def test_no_grad_inference_is_not_affected_by_parameters_requiring_grad(cache):
    module, (x,) = zoo.get("transformer-block").build({"B": 2, "S": 16, "D": 32, "H": 4})
    assert all(p.requires_grad for p in module.parameters())
    be = fusion_planner_backend(cache, realizer=ProgramRealizer())
    with torch.no_grad():
        out = torch.compile(module, backend=be, dynamic=True)(x)
    assert be.stats.grad_graphs == 0 and out.grad_fn is None


# ---- lifting --------------------------------------------------------------------------------
@dataclasses.dataclass
class Batch:
    x: torch.Tensor


class ReadsAnAttribute(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, batch):
        return torch.relu(self.lin(batch.x))


def test_a_tensor_inside_a_user_object_is_an_input_never_baked_in_as_state(cache):
    """A tensor an argument holds (a batch object's field, a KV cache's tensors) is passed
    by dynamo on every call: the plan takes it as an input, so each call's value is used."""
    module = ReadsAnAttribute()
    be = fusion_planner_backend(cache, realizer=ProgramRealizer())
    compiled = torch.compile(module, backend=be)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", PlannerRuntimeWarning)
        for _ in range(3):
            b = Batch(torch.randn(3, 4))
            torch.testing.assert_close(compiled(b), module(b))
    assert not be.stats.fallbacks and be.stats.realized == 1, be.stats


def test_serving_capture_has_one_key_under_no_grad_and_inference_mode():
    """A model served under `torch.inference_mode()` records `detach` ops (the KV cache's)
    that `no_grad` does not; the capture drops such identities, so plans tuned either way
    are found either way."""
    model = resolve("benchmarks/models/gpt2.py:tiny", "B=2,S=16")
    module, inputs = model.build()
    keys = {}
    for mode in (torch.no_grad, torch.inference_mode):
        torch._dynamo.reset()
        with mode():
            captured = capture_for_serving(module, inputs)
        ops = {str(n.target) for n in captured.program.graph_module.graph.nodes}
        assert "aten.detach.default" not in ops
        keys[mode.__name__] = captured.graph.structure_key
    assert keys["no_grad"] == keys["inference_mode"]


@pytest.mark.slow
def test_a_group_that_reads_a_size_of_its_own_value_realizes_over_a_bucket():
    """MobileViT's unfolding reshapes by a size read off a view the same group makes; over
    a symbolic bucket that size is a free node both input to the group and computed from
    it, so no top-level order existed ("value _unsafe_view is needed before it is
    produced") and the bucket ran dynamo's graph. It now runs inside the group. Groups
    run as their FX graphs (no Inductor): the cut is what is tested. About 2 minutes."""
    import functools

    import transformers as T

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = T.MobileViTConfig(
        image_size=32,
        hidden_sizes=[16, 24, 32],
        neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
        num_attention_heads=2,
    )
    model = T.MobileViTModel(cfg).eval()
    as_traced = functools.partial(realize, compiler=lambda gm, fakes, fake_mode: gm.forward)
    be = fusion_planner_backend(None, record_misses=False, realizer=as_traced)
    compiled = torch.compile(model, backend=be, dynamic=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        for b in (4, 3):
            x = torch.randn(b, 3, 32, 32)
            assert_same_outputs(compiled(x), model(x))
    assert be.stats.realized >= 1 and not be.stats.fallbacks, be.stats
    torch._dynamo.reset()


def test_tune_from_the_queue_finds_a_model_that_reads_a_later_argument_first(tmp_path, capsys):
    """Shapes the runtime queued for a model that reads its second keyword argument first
    are in the runtime's input order; `tune --from-queue` buckets them in that order and
    tunes the bucket they fall in (that the plan it stores is then served is the test
    above's)."""
    (tmp_path / "rlf.py").write_text(READS_LAST_FIRST)
    spec, url = f"{tmp_path}/rlf.py:factory", str(tmp_path / "plans.sqlite")
    torch.manual_seed(0)
    module = ReadsLastFirst().eval()
    memory = torch.randn(2, 6, 32)
    with torch.no_grad():  # an empty cache: the default plan serves, the shapes are queued
        be = fusion_planner_backend(PlanCache(url))
        compiled = torch.compile(module, backend=be, dynamic=True)
        for s in (16, 12):
            compiled(memory=memory, tokens=torch.randn(2, s, 32))
    assert be.stats.default == 2 and PlanCache(url).tuning_queue(), be.stats
    torch._dynamo.reset()
    argv = ["tune", "--model", spec, "--shape", "B=2", "--dynamic", "S=9..32", "--cache", url]
    argv += ["--strategy", "greedy", "--top-k", "1", "--no-compile-baseline", "--keep-fused"]
    capsys.readouterr()
    assert main([*argv, "--dtype", "fp32", "--from-queue", "--format", "json"]) == 0
    tuned = json.loads(capsys.readouterr().out)["buckets"]
    assert len(tuned) == 1, tuned  # S 9..16 only: no shape of 17..32 was queued
