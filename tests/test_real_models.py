"""The real-model suite (benchmarks/models: Hugging Face models from their configs, tiny
sizes) through the whole pipeline on CPU: capture -> plan -> realize -> verify -> tune ->
the `torch.compile` backend, each step's output compared with eager.

Capture and planning run for every model in the default suite; the later steps run for
GPT-2 and BERT by default and for the rest with `-m slow`.
"""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.models import BY_NAME, SUITE
from learned_cost.analytical import AnalyticalModel
from planner.fusion.legality import check
from planner.hardware import get_spec
from planner.ir.capture import export_model
from planner.ir.pytrees import flat_values
from planner.ir.taxonomy import Category
from planner.objective import Objective
from planner.plans.buckets import parse_dynamic
from planner.plans.cache import PlanCache
from planner.realize.realizer import realize
from planner.runtime.backend import fusion_planner_backend
from profiling.verify import verify_against_eager
from search.strategies import get_strategy
from search.tune import TuneConfig, tune
from zoo.modelspec import resolve, tensor_shapes

pytestmark = pytest.mark.optional

FAST_TIMER = {"warmup": 1, "min_reps": 2, "max_reps": 3, "max_seconds": 0.5}
# capture, plan, realize and verify in the default suite; tune and serve take gpt2 alone (time)
FULL_DEFAULT = ("gpt2", "bert")


def cases(step: str, default: tuple[str, ...] = FULL_DEFAULT) -> list[Any]:
    """One param per suite model: slow unless in `default`; a known failure (`KNOWN`) is
    a strict xfail, so its fix shows up as a failing XPASS."""
    out = []
    for m in SUITE:
        marks = [] if m.name in default else [pytest.mark.slow]
        if (why := KNOWN.get((m.name, step))) is not None:
            marks.append(pytest.mark.xfail(strict=True, reason=why))
        out.append(pytest.param(m.name, marks=marks, id=m.name))
    return out


# (model, step) -> a failure not fixed yet
KNOWN: dict[tuple[str, str], str] = {
    ("vit", "backend"): (
        "a bucket over the image size: groups whose sizes are (H//p)*(W//p) + 1 fail to "
        "compile ('expected [s15, s88] to have been codegen-ed') and run eagerly"
    ),
}


ALL = tuple(m.name for m in SUITE)


@functools.cache
def built(name: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    torch.set_num_threads(1)
    m = BY_NAME[name]
    return resolve(m.spec(tiny=True), m.tiny_shape).build(seed=0)


@functools.cache
def eager_out(name: str) -> Any:
    module, inputs = built(name)
    with torch.no_grad():
        return module(*inputs)


@functools.cache
def captured(name: str):
    module, inputs = built(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export_model(module, inputs, name=name)


@functools.cache
def planned(name: str):
    cap = captured(name)
    obj = Objective(AnalyticalModel(get_spec("cpu")))
    return get_strategy("priority").plan(cap.graph, obj).partition, obj


@functools.cache
def realized(name: str):
    return realize(captured(name), planned(name)[0], device="cpu")


def tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor in a model output, library objects (a KV cache) included, in order."""
    return [v for v in flat_values(out) if isinstance(v, torch.Tensor)]


def assert_like_eager(name: str, got: Any) -> None:
    ref = tensors(eager_out(name))
    out = tensors(got)
    assert len(out) == len(ref) > 0
    for r, g in zip(ref, out):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", cases("capture", ALL))
def test_capture_reads_every_op(name):
    cap = captured(name)
    g = cap.graph
    assert len(g.nodes) >= 20
    cats = [n.category for n in g.nodes]
    assert cats.count(Category.COMPUTE) >= 4  # every layer's GEMMs / convolutions
    assert Category.POINTWISE in cats
    # the graph's inputs are the example inputs' tensor leaves, in pytree order
    assert g.input_shapes == tensor_shapes(built(name)[1])


@pytest.mark.parametrize("name", cases("plan", ALL))
def test_priority_plan_is_legal_and_fuses(name):
    part, obj = planned(name)
    assert check(part, obj.limits).ok
    g = captured(name).graph
    assert len(part) < len(g.nodes)  # something fused
    assert obj.evaluate(part).total_s < obj.evaluate(type(part).singletons(g)).total_s


@pytest.mark.parametrize("name", cases("realize"))
def test_realized_plan_matches_eager(name):
    rp = realized(name)
    assert not rp.fallbacks, rp.fallbacks
    with torch.no_grad():
        assert_like_eager(name, rp(*built(name)[1]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_static_plans_keep_their_kernels_on_cuda(name):
    """On CUDA, Inductor has laid out the group holding a KV cache's first update (a `cat`
    with an empty tensor) otherwise than eager. Such a group keeps its kernels, its output
    copied into the planned layout, instead of running eagerly: no group of the static
    plan falls back, and the plan agrees with eager."""
    module, inputs = built(name)
    module = copy.deepcopy(module).to("cuda", torch.bfloat16)  # the CPU tests share built()
    inputs = tuple(x.to("cuda") for x in inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cap = export_model(module, inputs, name=name)
    obj = Objective(AnalyticalModel(get_spec("h100")))
    plan = get_strategy("priority").plan(cap.graph, obj).partition
    rp = realize(cap, plan, device="cuda")
    assert not rp.fallbacks, rp.fallbacks
    report = verify_against_eager(rp, module, inputs)
    assert report.ok, report


@pytest.mark.parametrize("name", cases("verify"))
def test_verify_accepts_the_realized_plan(name):
    module, inputs = built(name)
    report = verify_against_eager(realized(name), module, inputs)
    assert report.ok, report


def _tune_one_bucket(name: str, db: str):
    m = BY_NAME[name]
    spec = resolve(m.spec(tiny=True), m.tiny_shape)
    size = m.tiny_shape[m.dim]
    cfg = TuneConfig(
        spec=spec,
        dynamic=f"{m.dim}={size // 2 + 1}..{size}",  # one pow2 bucket
        strategy="priority",
        top_k=1,
        compile_baseline=False,
        timer=FAST_TIMER,
        prefer_eager=False,  # these tests serve the fused plan, whatever this CPU times
    )
    with PlanCache(db) as cache:
        return tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda _: None)


# every model in the slow run: the default run tunes GPT-2 and serves what it stored in
# test_backend_serves_the_tuned_plan_like_eager
@pytest.mark.parametrize("name", cases("tune", ()))
def test_tune_stores_a_measured_plan(name, tmp_path):
    results = _tune_one_bucket(name, str(tmp_path / "plans.sqlite"))
    assert len(results) == 1
    r = results[0]
    assert r.plan is not None, [c.error for c in r.candidates]
    assert r.plan.measured_s and r.plan.measured_s > 0
    # the inferred dims put every input that follows the dim into the bucket
    m = BY_NAME[name]
    dims = parse_dynamic(f"{m.dim}=1..{m.tiny_shape[m.dim]}", resolve(m.spec(tiny=True)).dims)
    assert len(dims.dims) == len(resolve(m.spec(tiny=True)).dims[m.dim])


@pytest.mark.parametrize("name", cases("backend-default", ("gpt2",)))
def test_backend_with_default_plans_matches_eager(name, tmp_path):
    """An empty cache: every graph dynamo hands over runs a default plan."""
    module, inputs = built(name)
    backend = fusion_planner_backend(str(tmp_path / "empty.sqlite"), device="cpu")
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend)
    with torch.no_grad():
        assert_like_eager(name, compiled(*inputs))
    torch._dynamo.reset()
    s = backend.stats
    assert s.realized >= 1 and s.default >= 1 and not s.fallbacks, s


@pytest.mark.parametrize("name", cases("backend", ("gpt2",)))
def test_backend_serves_the_tuned_plan_like_eager(name, tmp_path):
    db = str(tmp_path / "plans.sqlite")
    assert _tune_one_bucket(name, db)[0].plan is not None
    module, inputs = built(name)
    backend = fusion_planner_backend(db, device="cpu")
    made = []
    base = backend.realizer

    def recording(captured, plan):
        made.append(base(captured, plan))
        return made[-1]

    backend.realizer = recording
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend)
    with torch.no_grad():
        assert_like_eager(name, compiled(*inputs))
        assert_like_eager(name, compiled(*inputs))
    torch._dynamo.reset()
    s = backend.stats
    assert s.graphs >= 1 and not s.fallbacks, s
    assert s.exact + s.bucket >= 1 and s.default == 0, s  # the tuned plan, not a default one
    assert made and not any(rp.fallbacks for rp in made), [rp.fallbacks for rp in made]


@pytest.mark.slow
def test_benchmark_runs_a_tiny_cell_and_regenerates_its_table(tmp_path):
    """benchmarks/real_models.py end to end on CPU: tune subprocess, one timer, report."""
    from benchmarks import real_models as bench

    stem = tmp_path / "rm"
    args = ["--device", "cpu", "--tiny", "--cells", "resnet18", "--modes", "eager,planner"]
    assert bench.main([*args, "--rounds", "3", "--out", str(stem)]) == 0
    rows = bench.read_jsonl(stem.with_suffix(".jsonl"))
    assert [r["cell"] for r in rows] == ["resnet18:B2xIMG32"]
    r = rows[0]
    assert set(r["timing"]) == {"eager", "planner", "eager@alone", "planner@alone"}
    assert r["tune_s"] > 0
    assert r["runtime_stats"]["graphs"] >= 1 and r["max_abs_diff"]["planner"] < 1e-3
    table = stem.with_suffix(".md").read_text()
    # served/tuned again from the served plan timed alone, as tune times it
    alone = r["timing"]["planner@alone"]["median_s"] / r["stored_measured_s"]
    assert f"served alone (tune's protocol, this process) / tuned {alone:.2f}" in table
    assert bench.main(["--from-jsonl", str(stem.with_suffix(".jsonl"))]) == 0
    assert stem.with_suffix(".md").read_text() == table
    # a second call skips the measured cell
    assert bench.main([*args, "--out", str(stem)]) == 0
    assert len(bench.read_jsonl(stem.with_suffix(".jsonl"))) == 1


@pytest.mark.slow
def test_bucket_mode_times_the_other_shape_after_it_recurs(tmp_path):
    """`--bucket`: every contender is also timed at 3/4 of the cell's size, in the same rounds,
    and the planner serves it from a static specialization of its own."""
    from benchmarks import real_models as bench

    stem = tmp_path / "rm"
    args = ["--device", "cpu", "--tiny", "--cells", "gpt2", "--modes", "eager,planner"]
    assert bench.main([*args, "--bucket", "--rounds", "2", "--out", str(stem)]) == 0
    (r,) = bench.read_jsonl(stem.with_suffix(".jsonl"))
    assert r["other_shape"] == {"B": 2, "S": 24}
    assert set(r["timing"]) == {
        "eager",
        "planner",
        "eager@other",
        "planner@other",
        "eager@alone",
        "planner@alone",
    }
    assert r["runtime_stats"]["static"] == 2 and r["max_abs_diff"]["planner@other"] < 1e-3
    row = stem.with_suffix(".md").read_text().splitlines()
    head = next(ln for ln in row if ln.startswith("| cell"))
    assert "served/tuned (other)" in head


def test_bucket_cells_vary_what_the_model_serves():
    """Text cells vary the sequence length over (v/2, v]; vision cells the batch (one image
    size is served); a cell whose bucket would reach size 1 is tuned at its one shape."""
    from benchmarks.real_models import other_shape, served_dim

    vit, gpt2 = BY_NAME["vit"], BY_NAME["gpt2"]
    assert served_dim(vit, {"B": 32, "IMG": 224}, True) == "B"
    assert other_shape(vit, {"B": 32, "IMG": 224}) == {"B": 24, "IMG": 224}
    assert served_dim(vit, {"B": 1, "IMG": 224}, True) is None
    assert other_shape(vit, {"B": 1, "IMG": 224}) is None
    assert served_dim(gpt2, {"B": 1, "S": 128}, True) == "S"
    assert other_shape(gpt2, {"B": 1, "S": 128}) == {"B": 1, "S": 96}
    assert served_dim(gpt2, {"B": 1, "S": 128}, False) is None


@pytest.mark.parametrize("name", ALL)
def test_suite_dims_are_inferred_for_every_input(name):
    """The suite's factories carry no `dims`: the varying parameter's axes are found by
    building them, on every input that has them (BERT's mask, both image axes)."""
    m = BY_NAME[name]
    spec = resolve(m.spec(tiny=True), m.tiny_shape)
    _module, inputs = spec.build(device="meta")
    shapes = tensor_shapes(inputs)
    size = m.tiny_shape[m.dim]
    expected = tuple((i, a) for i, s in enumerate(shapes) for a, d in enumerate(s) if d == size)
    assert spec.dims[m.dim] == expected and len(expected) >= 1
    assert spec.dims["B"] == tuple((i, 0) for i in range(len(shapes)))
