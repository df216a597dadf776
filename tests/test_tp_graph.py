"""Tensor-parallel decisions on captured programs: the column -> row sites of DTensor-
parallel LLaMA-style blocks (ours and Hugging Face's decoder layer) and of the zoo's
functional-collective block, the search's pricing, and every decision realized on 2 gloo
ranks (tests/tp_ranks.py) against the unplanned program and the unsharded model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

import zoo
from planner.distributed import parallel_models as pm
from planner.distributed.tp_graph import (
    GraphCosts,
    SiteDecisions,
    find_tp_sites,
    predict_graph,
    row_parallel_chunks,
    tp_program,
)
from planner.distributed.tp_plan import TPDecision
from planner.ir.capture import export_model
from profiling.commbench import run_ranks
from search import tp_search
from search.tp_search import search_tp_graph
from tests.tp_ranks import B, D, S

US = 1e-6


def _nvlink_like(nbytes: int) -> float:
    return 5e-6 + nbytes / 4.5e11


@pytest.mark.parametrize(
    "models", [["llama", "tp-block"], pytest.param(["hf-llama"], marks=pytest.mark.slow)]
)
def test_decisions_on_captured_programs_equal_the_unplanned_program_on_gloo(models) -> None:
    res = run_ranks(2, "tests.tp_ranks:planned_programs", (models,), timeout_s=90)
    for name in {"llama", "hf-llama"} & set(models):
        sites = res[name]["sites"]
        assert [len(s["column"]) for s in sites] == [3, 2]  # q/k/v; gate/up
        assert all(s["rows"] == B * S and s["nbytes"] == B * S * D * 4 for s in sites)
        # the first epilogue: the residual add and the whole RMSNorm
        assert len(sites[0]["epilogue"]) == 7, sites[0]
    assert set(res) == set(models)
    for name, r in res.items():
        assert len(r["sites"]) == 2, (name, r["sites"])
        assert len(r["errors"]) == 4 and max(r["errors"].values()) < 1e-5, (name, r)


def test_zoo_tp_block_capture_has_two_sites_with_their_epilogues() -> None:
    m, x = zoo.get("tp-block").build({"B": 2, "S": 8, "D": 32, "H": 4, "TP": 2})
    captured = export_model(m, x)
    sites = find_tp_sites(captured.program.module())
    ops = {n.name: n.op for n in captured.graph.nodes}
    assert [ops[s.gemm] for s in sites] == ["linear", "linear"]
    assert [len(s.column) for s in sites] == [3, 1]  # q, k, v; fc1
    # after the attention: bias, residual, the MLP's LayerNorm; after fc2: bias, residual
    assert [sorted(ops[n] for n in s.epilogue) for s in sites] == [
        ["add", "add", "layer_norm"],
        ["add", "add"],
    ]
    planned = tp_program(captured.program.module(), TPDecision(2, True), sites)
    calls = [n.target for n in planned.graph.nodes if n.op in ("call_function", "call_module")]
    assert calls.count(row_parallel_chunks) == 2
    assert not [c for c in calls if "all_reduce" in str(c) or "wait_tensor" in str(c)]
    assert sorted(c for c in calls if isinstance(c, str) and "epilogue" in c) == [
        f"tp_epilogue_{s.gemm}" for s in sites
    ]
    plan = search_tp_graph(captured, _nvlink_like)
    alike = plan.table[:6]  # the decisions for both sites alike, then a per-site best
    assert all(isinstance(p.decision, TPDecision) for p in alike)
    assert plan.best.total_s == min(p.total_s for p in plan.table) <= min(p.total_s for p in alike)
    assert plan.searched == 6 * 6  # both sites have epilogues: every combination priced
    assert plan.costs.segment_ops[0] > 0 and plan.costs.epilogue_ops == (3, 2)


def test_programs_rewritten_for_training_give_the_models_gradients_on_gloo() -> None:
    """The chunked backward (tp_program(..., backward=True)) against the models' own
    autograd - Megatron's f and g in the zoo block, DTensor's in the LLaMA-style block -
    for the input and every parameter shard, on 2 gloo ranks (tests/tp_ranks.py)."""
    res = run_ranks(2, "tests.tp_ranks:trained_programs", (), timeout_s=120)
    for model in ("tp-block", "llama"):
        assert set(res[model]) == {"k=1", "k=2 fused", "k=2 fused | k=1"}
        assert max(res[model].values()) < 1e-5, res[model]
    assert res["column_chunks"] == [2, 2, 2, 1, 1]  # Q/K/V at site 0, gate/up at site 1
    assert "forward only" in res["forward_only"]


def _two_sites() -> GraphCosts:
    """Site 0 small (its all-reduce 3 + 2 us), site 1 large (8 us of GEMM, 3 + 12 us of
    all-reduce at k = 1): chunking pays at site 1 only."""
    return GraphCosts(
        segment_s=(0.0, 0.0, 0.0),
        segment_ops=(0, 0, 0),
        gemm_s={(0, 1): 4 * US, (0, 2): 2 * US, (1, 1): 8 * US, (1, 2): 4 * US},
        epilogue_s={(i, f): 0.0 for i in (0, 1) for f in (False, True)},
        epilogue_ops=(0, 0),
        all_reduce_bytes=(2000, 12000),
        eager_op_host_s=0.0,
        compiled_call_host_s=0.0,
        collective_call_host_s=0.0,
    )


@pytest.mark.parametrize("exhaustive", [256, 1])
def test_the_search_decides_each_site_on_its_own(monkeypatch, exhaustive) -> None:
    monkeypatch.setattr(tp_search, "EXHAUSTIVE_COMBINATIONS", exhaustive)
    ar = lambda nbytes: 3 * US + nbytes / 1000 * US  # noqa: E731
    # site 0: k=1 4 + 5 = 9 us; k=2 slices 0-2, 2-4, all-reduces 2-6, 6-10: 10 us
    # site 1: k=1 8 + 15 = 23 us; k=2 slices 0-4, 4-8, all-reduces 4-13, 13-22: 22 us
    best, table, _ = tp_search.search_decisions(_two_sites(), ar)
    assert best.decision == SiteDecisions((TPDecision(1), TPDecision(2)))
    assert best.decision.label == "k=1 | k=2"
    assert best.total_s == pytest.approx(31 * US)  # 9 + 22; for both sites alike 32
    alike = {p.decision.label: p.total_s for p in table if isinstance(p.decision, TPDecision)}
    assert alike["k=1"] == pytest.approx(32 * US) and alike["k=2"] == pytest.approx(32 * US)
    assert table[-1] is best and len(table) == 5


def test_a_graph_without_a_column_row_pair_has_no_sites() -> None:
    m, x = zoo.get("dp-grad-sync").build({"D": 16, "HID": 32, "L": 1, "DP": 2, "BUCKET_KB": 1})
    assert find_tp_sites(export_model(m, x).program.module()) == []


def test_graph_tasks_overlap_all_but_the_last_chunks_all_reduce() -> None:
    us = 1e-6
    c = GraphCosts(
        segment_s=(0.0, 0.0),
        segment_ops=(0, 0),
        gemm_s={(0, 1): 4 * us, (0, 2): 2 * us},
        epilogue_s={(0, False): 0.0, (0, True): 0.0},
        epilogue_ops=(0,),
        all_reduce_bytes=(6000,),
        eager_op_host_s=0.0,
        compiled_call_host_s=0.0,
        collective_call_host_s=0.0,
    )
    ar = lambda nbytes: nbytes / 1000 * us  # noqa: E731
    one, two = predict_graph(c, TPDecision(1), ar), predict_graph(c, TPDecision(2), ar)
    assert one.total_s == pytest.approx(10 * us) and one.exposed_comm_s == pytest.approx(6 * us)
    # GEMM slices 0-2, 2-4; their all-reduces 2-5, 5-8
    assert two.total_s == pytest.approx(8 * us) and two.exposed_comm_s == pytest.approx(4 * us)


@pytest.mark.slow
def test_tp_graph_benchmark_smoke_on_gloo(tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.tp_graph_gpu import main

    assert main(["--backend", "gloo", "--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    (row,) = [json.loads(x) for x in (tmp_path / "tp_graph.jsonl").read_text().splitlines()]
    assert row["ok"], row.get("error")
    # the DTensor model, the 6 decisions for both sites alike and one per site if chosen
    assert len(row["sites"]) == 2 and len(row["checks"]) == 7 + (" | " in row["chosen"])
    assert max(row["checks"].values()) < 1e-5
    assert max(row["gradients"].values()) < 1e-5
    assert f"| {row['chosen']} |" in (tmp_path / "tp_graph.md").read_text()


def test_search_prices_the_decisions_of_a_dtensor_program_captured_on_a_fake_group() -> None:
    pm.capture_group(2)  # torch's single-process fake group: nothing is communicated
    mesh = init_device_mesh("cpu", (2,))
    model = parallelize_module(pm.LlamaStyleBlock(D, 4, 2 * D), mesh, pm.llama_tp_plan())
    captured = export_model(model, (torch.randn(B, S, D),))
    plan = search_tp_graph(captured, _nvlink_like)
    assert [len(s.column) for s in plan.sites] == [3, 2]
    assert len(plan.table) in (6, 7) and plan.searched == 6 * 6
    # each site's all-reduce is the whole (B, S, D) partial sum; the GEMM slices shrink
    assert plan.costs.all_reduce_bytes == (B * S * D * 4,) * 2
    assert plan.costs.gemm_s[(0, 2)] < plan.costs.gemm_s[(0, 1)]


def test_the_rewritten_program_shares_the_weights_and_leaves_the_original_alone() -> None:
    m, x = zoo.get("tp-block").build({"B": 2, "S": 8, "D": 32, "H": 4, "TP": 2})
    gm = export_model(m, x).program.module()
    before = [n.name for n in gm.graph.nodes]
    planned = tp_program(gm, TPDecision(2, True))
    assert [n.name for n in gm.graph.nodes] == before
    weights = {id(p) for p in gm.parameters()}
    assert weights and {id(p) for p in planned.parameters()} == weights
