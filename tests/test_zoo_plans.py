"""Plans on the zoo models are the ones a person would draw (and beat the unfused graph)."""

from __future__ import annotations

import functools
import json
import shutil
from xml.etree import ElementTree

import pytest

from cli.main import main
from planner.fusion.fuse_rules import default_partition
from planner.fusion.legality import check
from search.strategies import get_strategy
from tests.partition_helpers import group_with, h100_objective, zoo_graph

SEARCHES = ("priority", "exact")


def cases(*models: str) -> list:
    """(model, strategy) for the searching strategies; exact on LLaMA (~10 s) is slow."""
    slow = pytest.mark.slow
    return [
        pytest.param(m, s, marks=slow if (m, s) == ("llama-block", "exact") else ())
        for m in models
        for s in SEARCHES
    ]


@functools.cache
def plan(model: str, strategy: str):
    g = zoo_graph(model)
    obj = h100_objective()
    res = get_strategy(strategy).plan(g, obj)
    assert check(res.partition, obj.limits).ok
    return g, res, obj


@pytest.mark.parametrize("strategy", ["greedy", *SEARCHES])
def test_pointwise_chain_is_one_group(strategy):
    g, res, _ = plan("pointwise-chain", strategy)
    assert len(res.partition) == 1 and len(g.nodes) == 20


@pytest.mark.parametrize("strategy", ["greedy", *SEARCHES])
@pytest.mark.parametrize("model", ["transformer-block", "bert-layer"])
def test_gemm_bias_gelu_is_an_epilogue(model, strategy):
    g, res, _ = plan(model, strategy)
    assert group_with(g, res.partition, "linear_4") == {"linear_4", "gelu"}  # bias is in linear
    assert "add_1" in group_with(g, res.partition, "linear_5")  # residual epilogue


@pytest.mark.parametrize("model, strategy", cases("transformer-block", "bert-layer", "llama-block"))
def test_qkv_siblings_fuse_horizontally(model, strategy):
    g, res, obj = plan(model, strategy)
    qkv = group_with(g, res.partition, "linear")
    assert {"linear", "linear_1", "linear_2"} <= qkv
    plan_rec = obj.make_plan(
        res.partition, res.evaluation, strategy=strategy, device="h100", dtype="bfloat16"
    )
    real = {gp.realization for gp in plan_rec.groups if g.node_by_name("linear").index in gp.nodes}
    # the siblings become one concatenated GEMM; an epilogue (llama's) is compiled around it
    assert real == {"concat_gemm"}


@pytest.mark.parametrize(
    "model, strategy", cases("transformer-block", "bert-layer", "gpt2-block", "llama-block")
)
def test_attention_is_one_group(model, strategy):
    g, res, obj = plan(model, strategy)
    att = group_with(g, res.partition, "softmax")
    assert {"matmul", "softmax", "matmul_1"} <= att
    assert not any(n.startswith("linear") for n in att)
    if model == "gpt2-block":
        assert {"masked_fill", "tril"} <= att  # the causal mask is generated in the kernel
    i = g.node_by_name("softmax").index
    p = obj.make_plan(res.partition, res.evaluation, strategy=strategy, device="h100", dtype="bf16")
    assert next(gp.realization for gp in p.groups if i in gp.nodes) == "sdpa"


def test_greedy_keeps_attention_apart_like_tvm():
    """TVM's rules know no attention: the GEMM takes its scale, the softmax stays alone."""
    g = zoo_graph("transformer-block")
    p = default_partition(g)
    assert group_with(g, p, "matmul") == {"matmul", "div"}
    assert group_with(g, p, "softmax") == {"softmax"}


@pytest.mark.parametrize("strategy", SEARCHES)
def test_mixed_fusion_conv_bn_relu_then_two_pools(strategy):
    """docs/formulas.md §4: [Conv -> BN -> ReLU] vertically, [MaxPool || AvgPool] horizontally."""
    g, res, _ = plan("conv-bn-relu-2pool", strategy)
    assert group_with(g, res.partition, "conv2d") == {
        "conv2d",
        "_native_batch_norm_legit_no_training",
        "relu",
    }
    assert group_with(g, res.partition, "max_pool2d") == {"max_pool2d", "avg_pool2d"}


@pytest.mark.parametrize("strategy", ["greedy", "priority"])  # exact: see the benchmark
def test_llama_rmsnorm_is_one_group(strategy):
    g, res, _ = plan("llama-block", strategy)
    rms = {"pow_1", "mean", "add", "rsqrt", "mul", "type_as", "mul_1"}
    assert rms <= group_with(g, res.partition, "mean")


@pytest.mark.parametrize(
    "model",
    ["transformer-block", "gpt2-block", "bert-layer", "llama-block", "resnet-bottleneck", "mlp"],
)
def test_plans_beat_unfused_and_search_beats_rules(model):
    g = zoo_graph(model)
    obj = h100_objective()
    unfused = obj.unfused(g).total_s
    greedy = get_strategy("greedy").plan(g, obj).total_s
    prio = get_strategy("priority").plan(g, obj).total_s
    assert prio <= greedy < unfused


def test_plan_cli_table_json_html_and_saved_plan(tmp_path, capsys):
    html, dot, saved = tmp_path / "p.html", tmp_path / "p.dot", tmp_path / "plan.json"
    argv = ["plan", "--model", "zoo:transformer-block", "--shape", "B=2,S=128,D=256,H=4"]
    argv += ["--device", "h100", "--dtype", "bf16", "--strategy", "priority"]
    drawn = shutil.which("dot") is not None  # the HTML view is laid out by Graphviz
    extra = ["--html", str(html)] if drawn else []
    assert main([*argv, *extra, "--dot", str(dot), "--save-plan", str(saved)]) == 0
    table = capsys.readouterr().out
    assert "sdpa" in table and "concat_gemm" in table and "vs" in table and "unfused" in table
    assert main([*argv, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["predicted_s"] < out["totals"]["unfused_s"]
    assert out["totals"]["kernels"] < out["totals"]["unfused_kernels"]
    assert {r["realization"] for r in out["groups"]} >= {"sdpa", "concat_gemm", "inductor"}
    assert sum(len(r["nodes"]) for r in out["groups"]) == 25
    assert dot.read_text().count("subgraph cluster_") == len(out["groups"])
    assert json.loads(saved.read_text())["strategy"] == "priority"
    if not drawn:
        pytest.skip("the HTML plan view needs Graphviz (Debian: apt-get install graphviz)")
    page = html.read_text()
    graph = page[page.index("<svg", page.index('class="plan-graph"')) :]
    svg = ElementTree.fromstring(graph[: graph.index("</svg>") + 6])  # well-formed
    classes = [g.get("class", "") for g in svg.iter("{http://www.w3.org/2000/svg}g")]
    assert classes.count("node op") == 25  # one box per op
    assert classes.count("cluster plan-group") == len(out["groups"])  # one outline per group
    titles = [
        "".join(next(g.iter("{http://www.w3.org/2000/svg}text")).itertext())
        for g in svg.iter("{http://www.w3.org/2000/svg}g")
        if g.get("class") == "cluster plan-group"
    ]
    assert sorted(t.split(" · ")[1] for t in titles) == sorted(
        r["realization"] for r in out["groups"]
    )


def test_plan_cli_exact_reports_a_budget_that_ran_out(capsys):
    argv = ["plan", "--model", "zoo:llama-block", "--device", "h100", "--strategy", "exact"]
    assert main([*argv, "--budget-evals", "50", "--format", "json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert totals["complete"] is False and "not proven optimal" in totals["notes"]
