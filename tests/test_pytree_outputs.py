"""Models whose inputs and outputs are pytrees and library objects: captured, realized,
verified, tuned and looked up through the user's path, and handed back the structure
eager returns. The `transformers` tests build tiny models from configs (no weights)."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
import torch
from torch import nn

from cli.common import Resolved, capture_for_planning
from cli.main import main
from learned_cost.analytical import AnalyticalModel
from planner.errors import CaptureError, PlanError
from planner.fusion.partition import Partition
from planner.hardware import get_spec
from planner.ir.capture import export_model, flat_module, trace_device
from planner.ir.pytrees import Structure, flat_values
from planner.plans.cache import PlanCache
from planner.realize.check import compare_outputs
from planner.realize.realizer import realize
from planner.runtime.graph import capture_for_serving
from profiling.verify import verify_against_eager
from search.tune import TuneConfig, tune

FAST_TIMER = {"warmup": 1, "min_reps": 3, "max_reps": 5, "max_seconds": 1.0}


# ---- structures without a library -------------------------------------------------------
class Cache:
    """Like a library cache: a plain object, unknown to torch's pytree, holding layers."""

    def __init__(self) -> None:
        self.layers: list[Layer] = []
        self.seen = 0


class Layer:
    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.keys, self.values, self.device = k, v, k.device


@dataclasses.dataclass
class Out:
    hidden: torch.Tensor
    cache: Cache
    extra: tuple | None = None


class CacheModel(nn.Module):
    """Returns a dataclass holding an unregistered cache object, nested tuples, None and
    a dict; one tensor appears twice (the same object)."""

    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(8, 8)
        self.v = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> Out:
        cache = Cache()
        h = torch.relu(self.k(x))
        for _ in range(2):
            cache.layers.append(Layer(self.k(h).transpose(0, 1), self.v(h)))
            h = h + cache.layers[-1].values
        cache.seen = 2
        if scale is not None:
            h = h * scale
        return Out(h, cache, (None, {"h": h, "n": 3}))


def _same_structure(ref, got) -> None:
    """Same types at every position, same keys and attributes, values close."""
    assert type(got) is type(ref)
    r_struct, _ = Structure.of(ref)
    g_struct, _ = Structure.of(got)
    assert g_struct.signature == r_struct.signature
    assert [type(v) for v in flat_values(got)] == [type(v) for v in flat_values(ref)]
    assert compare_outputs(ref, got) is None


def test_structure_walks_and_rebuilds_unregistered_objects():
    torch.manual_seed(0)
    m = CacheModel().eval()
    x = torch.randn(4, 8)
    out = m(x)
    structure, leaves = Structure.of(out)
    # h twice (attribute and inside the dict) is one leaf: 1 + 2 layers x 2
    assert len(leaves) == 5 and structure.n_leaves == 5
    fresh = [t.clone() for t in leaves]
    a, b = structure.build(fresh), structure.build(fresh)
    _same_structure(out, a)
    assert a.hidden is a.extra[1]["h"]  # aliasing kept
    assert a.cache.layers[0].device == x.device and a.cache.seen == 2
    # each rebuild is its own object: growing one cache leaves the next alone
    a.cache.layers.append("grown")
    assert len(b.cache.layers) == 2 and len(structure.build(fresh).cache.layers) == 2


def test_realized_plan_returns_the_models_structure_for_keyword_inputs():
    torch.manual_seed(0)
    m = CacheModel().eval()
    x, s = torch.randn(4, 8), torch.randn(4, 8)
    captured = export_model(m, {"x": x, "scale": s})
    assert [t.name for t in captured.graph.tensors if t.kind == "input"] == ["x", "scale"]
    part = Partition.from_groups(captured.graph, [list(range(len(captured.graph)))])
    rp = realize(captured, part, realizations="eager")
    assert rp.verified
    _same_structure(m(x=x, scale=s), rp(x=x, scale=s))
    x2, s2 = torch.randn(4, 8), torch.randn(4, 8)
    _same_structure(m(x2, s2), rp(x2, s2))  # positional works too
    with pytest.raises(PlanError, match=r"kwargs: expected a dict with keys \['x', 'scale'\]"):
        rp(x=x)


class EmptyCacheAppend(nn.Module):
    """A KV cache's first update, as transformers' DynamicLayer does it: `cat` onto an
    empty 1-D tensor, of a key in transposed layout."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.proj(x).view(1, 6, 2, 4).transpose(1, 2)
        keys = torch.cat([torch.tensor([]), k], dim=-2)
        return keys * 2, keys


def test_a_cat_onto_an_empty_cache_compiles_without_falling_back():
    torch.manual_seed(0)
    m = EmptyCacheAppend().eval()
    x = torch.randn(1, 6, 8)
    captured = export_model(m, (x,))
    part = Partition.from_groups(captured.graph, [list(range(len(captured.graph)))])
    rp = realize(captured, part, realizations="inductor")
    # Inductor drops the empty input and hands back `k`'s transposed layout unless the
    # realizer makes the cat the contiguous copy eager makes
    assert rp.fallbacks == {} and rp.realizations == ("inductor",)
    ref, got = m(x), rp(x)
    assert compare_outputs(ref, got) is None and got[1].stride() == ref[1].stride()


def test_flat_module_exports_again_with_dynamic_shapes():
    """What a dynamic export of a model with any output structure needs: the same flat
    wrapper, exported with symbolic sizes, mapped back by the first capture's io."""
    m = CacheModel().eval()
    x = torch.randn(4, 8)
    captured = export_model(m, (x,))
    batch = torch.export.Dim("batch", min=2, max=16)
    with flat_module(m, captured) as flat:
        program = torch.export.export(flat, captured.example_inputs, dynamic_shapes=({0: batch},))
    assert "forward" not in vars(m)  # the model is itself again
    x6 = torch.randn(6, 8)
    flat = program.module()(x6)
    assert len(flat) == captured.io.outputs.n_leaves
    _same_structure(m(x6), captured.io.rebuild_outputs(flat))


def test_capture_errors_are_whole_words_with_advice():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x  # data-dependent Python control flow

    with pytest.raises(CaptureError) as e:
        export_model(Branchy(), (torch.randn(3),))
    msg = str(e.value)
    assert "To fix:" in msg and "torch._check" in msg
    assert "test_pytree_outputs.py:" in msg and "x.sum() > 0" in msg  # the model's own line
    reason = msg.split("To fix:")[0]
    # cut at a word boundary (an ellipsis after a whole word), or not cut at all
    assert reason.rstrip(" .").endswith("...") or len(reason) < 500


# ---- transformers models at their default settings ---------------------------------------
transformers = pytest.importorskip("transformers")

_FACTORIES = textwrap.dedent(
    """
    import torch
    import transformers as tf

    def _ids(B, S):
        return (torch.randint(0, 96, (B, S)),)

    def gpt2(B=1, S=16):
        cfg = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=96, n_positions=64)
        return tf.GPT2LMHeadModel(cfg), _ids(B, S)

    def llama(B=1, S=16):
        cfg = tf.LlamaConfig(
            num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=96, max_position_embeddings=64,
        )
        return tf.LlamaForCausalLM(cfg), _ids(B, S)

    def bert(B=1, S=16):
        cfg = tf.BertConfig(
            num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
            vocab_size=96, max_position_embeddings=64,
        )
        return tf.BertModel(cfg), _ids(B, S)

    for f in (gpt2, llama, bert):
        f.dims = {"S": (0, 1)}
    """
)


@pytest.fixture(scope="module")
def factory_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "hf_models.py"
    path.write_text(_FACTORIES)
    return path


def _resolved(factory_file, name: str, shape: str = "") -> Resolved:
    from zoo.modelspec import resolve

    return Resolved(resolve(f"{factory_file}:{name}", shape), "cpu", torch.float32)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_realized_transformers_model_gives_eagers_output_structure(factory_file, name):
    torch.set_num_threads(1)
    module, inputs = _resolved(factory_file, name).spec.build()
    captured = export_model(module, inputs)
    part = Partition.from_groups(captured.graph, [list(range(len(captured.graph)))])
    rp = realize(captured, part, realizations="eager")
    with torch.no_grad():
        ref, got = module(*inputs), rp(*inputs)
    assert isinstance(got, transformers.utils.ModelOutput)
    assert list(got.keys()) == list(ref.keys())
    _same_structure(ref, got)
    if name != "bert":  # decoders return their KV cache (a DynamicCache by default)
        cache = got.past_key_values
        assert type(cache) is type(ref.past_key_values)
        assert cache.get_seq_length() == inputs[0].shape[1]
    assert verify_against_eager(rp, module, inputs).ok


def test_planning_capture_has_the_structure_key_of_a_capture_with_weights(factory_file):
    """`plan` and `cache lookup` capture without data (fake tensors); `tune` and the runtime
    with real weights on the device, through the backend's graph. The graph must be the
    same: on meta, SDPA's output is laid out differently and `.contiguous()` would record
    copies the device never makes."""
    r = _resolved(factory_file, "gpt2")
    planning = capture_for_planning(r).graph
    module, inputs = r.spec.build(device=trace_device())
    real = capture_for_serving(module, inputs).graph
    assert planning.structure_key == real.structure_key
    assert [n.target for n in planning.nodes] == [n.target for n in real.nodes]
    # a model already on the meta device is traced as the device too
    base = module.transformer  # GPT2Model: no tied weights, which .to("meta") would untie
    meta = export_model(base.to("meta"), tuple(x.to("meta") for x in inputs)).graph
    module, inputs = r.spec.build(device=trace_device())
    assert meta.structure_key == export_model(module.transformer, inputs).graph.structure_key


@pytest.mark.slow
def test_tune_stores_a_plan_for_gpt2_and_lookup_finds_it(factory_file, tmp_path, capsys):
    torch.set_num_threads(1)
    r = _resolved(factory_file, "gpt2")
    cfg = TuneConfig(
        spec=r.spec,
        dynamic="S=16..16",
        strategy="priority",
        top_k=1,
        compile_baseline=False,
        budget_seconds=1.0,
        timer=FAST_TIMER,
    )
    db = str(tmp_path / "plans.sqlite")
    with PlanCache(db) as cache:
        (result,) = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
        assert result.plan is not None, [c.error for c in result.candidates]
        graph = capture_for_planning(r).graph
        hit = cache.lookup(graph.structure_key, graph.input_shapes)
        assert hit.hit and hit.entry.plan.n_groups == result.plan.n_groups
    # the CLI says so too
    spec = f"{factory_file}:gpt2"
    assert main(["cache", "lookup", "--cache", db, "--model", spec, "--shape", "S=16"]) == 0
    assert "hit (" in capsys.readouterr().out


def test_tune_reports_a_bucket_the_model_cannot_run_and_goes_on(factory_file):
    """GPT-2 with 64 positions cannot run at S=100: that bucket is reported, not raised."""
    r = _resolved(factory_file, "gpt2")
    cfg = TuneConfig(spec=r.spec, dynamic="S=100..100", strategy="priority", top_k=1)
    (result,) = tune(cfg, AnalyticalModel(get_spec("cpu")), None, progress=lambda m: None)
    assert result.plan is None and result.eager is None
    assert result.stored.startswith("failed") and "Narrow --dynamic" in result.stored
