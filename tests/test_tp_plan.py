"""The tensor-parallel block's communication decisions: their critical path by hand, the
search, the region costs, the realized block against the unfused TPBlock on gloo ranks,
and benchmarks/distributed_gpu.py's CPU smoke."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from planner.distributed.tp_plan import RegionCosts, TPDecision, predict
from profiling.commbench import run_ranks
from profiling.tpbench import planned_vs_eager, whole_vs_eager
from search.tp_search import region_costs, search_tp_block

US = 1e-6


def _distributed_gpu():
    """benchmarks/distributed_gpu.py (the repository root on the path)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import distributed_gpu

    return distributed_gpu


def _timed(us: float) -> dict[str, float]:
    """A timing record of `us` microseconds, as the benchmark's ranks write one."""
    return {"median_s": us * US, "p25_s": us * US, "p75_s": us * US, "reps": 3}


def _costs(host_op: float = 0.0, **kw) -> RegionCosts:
    base = dict(
        attn_s=0.0,
        mlp_in_s=0.0,
        gemm_s={("o", 1): 4 * US, ("o", 2): 2 * US, ("fc2", 1): 4 * US, ("fc2", 2): 2 * US},
        epilogue_s={(L, f): 0.0 for L in ("o", "fc2") for f in (False, True)},
        epilogue_ops={"o": 3, "fc2": 2},
        all_reduce_bytes={"o": 6000, "fc2": 6000},
        eager_op_host_s=host_op,
        compiled_call_host_s=0.0,
        collective_call_host_s=0.0,
    )
    base.update(kw)
    return RegionCosts(**base)


def ar(nbytes: int) -> float:
    return nbytes / 1000 * US  # 6 us for the whole partial sum


def test_chunking_overlaps_all_but_the_last_chunks_all_reduce() -> None:
    one = predict(_costs(), TPDecision(1), ar)
    # per sublayer: GEMM 4, then its all-reduce 6, in series
    assert one.total_s == pytest.approx(20 * US)
    assert one.t_comp_s == pytest.approx(8 * US)
    assert one.exposed_comm_s == pytest.approx(12 * US)
    two = predict(_costs(), TPDecision(2), ar)
    # GEMM chunks 0-2, 2-4; all-reduces 2-5, 5-8: 8 per sublayer
    assert two.total_s == pytest.approx(16 * US)
    assert two.t_comm_s == pytest.approx(12 * US)
    assert two.exposed_comm_s == pytest.approx(8 * US)


def test_host_issue_time_bounds_the_block_and_the_fused_epilogue_saves_launches() -> None:
    c = _costs(host_op=1 * US, gemm_s={(L, k): 0.0 for L in ("o", "fc2") for k in (1, 2)})
    zero = lambda n: 0.0  # noqa: E731
    # 2 x 2 GEMM chunks and 3 + 2 eager epilogue kernels, one host microsecond each
    assert predict(c, TPDecision(2, False), zero).total_s == pytest.approx(9 * US)
    assert predict(c, TPDecision(2, True), zero).total_s == pytest.approx(4 * US)


def test_search_takes_the_fastest_prediction_and_the_simpler_on_ties() -> None:
    plan = search_tp_block(_costs(), ar, (1, 2))
    assert plan.best.decision == TPDecision(2, False)  # fused ties with unfused here
    assert len(plan.table) == 4
    slow_link = search_tp_block(_costs(host_op=50 * US), lambda n: 0.0, (1, 2))
    assert slow_link.best.decision.chunks == 1  # chunking only adds launches


def test_region_costs_of_a_small_block_scale_with_the_chunks() -> None:
    c = region_costs(2, 32, 64, 4, 2, "float32", chunk_choices=(1, 2, 4))
    assert c.gemm_s[("o", 2)] < c.gemm_s[("o", 1)]
    assert c.epilogue_s[("o", True)] <= c.epilogue_s[("o", False)]
    assert c.epilogue_ops == {"o": 3, "fc2": 2}
    assert c.all_reduce_bytes["o"] == 2 * 32 * 64 * 4
    assert c.attn_s > 0 and c.mlp_in_s > 0
    # eager: every op its own kernel, so more launches and no less GPU time
    assert c.attn_eager_ops > 1 and c.attn_eager_s >= c.attn_s
    plan = search_tp_block(c, ar, (1, 2, 4))
    assert plan.eager.total_s > 0 and len(plan.table) == 6


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_planned_block_equals_the_tp_block_on_gloo_ranks(world: int) -> None:
    decisions = [[k, f] for k in (1, 2, 4) for f in (False, True)]
    errs = run_ranks(world, planned_vs_eager, (2, 8, 48, 6, decisions), timeout_s=120)
    assert len(errs) == 6
    assert max(errs.values()) < 1e-5, errs


def _bench(tmp_path: Path, *extra: str) -> int:
    args = ["--backend", "gloo", "--device", "cpu", "--quick", "--out", str(tmp_path), *extra]
    return _distributed_gpu().main(args)


@pytest.mark.slow
def test_benchmark_tp_smoke_on_gloo_records_rows_and_resumes(tmp_path, capsys) -> None:
    assert _bench(tmp_path, "--parts", "tp", "--shapes", "1,16,64,4", "--tp-reps", "2") == 0
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["ok"], rows[0].get("error")
    row = rows[0]
    assert row["predicted_eager"]["total_s"] > 0
    assert all(c["ok"] for c in row["checks"].values()), row["checks"]
    chosen = f"planned {row['chosen']}"
    for name in ("eager", "eager T_comp", chosen, chosen + " T_comp", "T_comm k=1"):
        assert row["timing"][name]["median_s"] > 0
    assert "| 1,16,64,4 |" in (tmp_path / "results.md").read_text()
    capsys.readouterr()
    assert _bench(tmp_path, "--parts", "tp", "--shapes", "1,16,64,4") == 0
    assert "[skip] tp:1x16x64x4" in capsys.readouterr().out


def test_benchmark_rejects_nccl_on_the_cpu(tmp_path) -> None:
    with pytest.raises(SystemExit):
        _bench(tmp_path, "--backend", "nccl")


@pytest.mark.slow
def test_benchmark_full_cpu_smoke(tmp_path) -> None:
    assert _bench(tmp_path) == 0
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {r["key"].split(":")[0] for r in rows} == {"comm", "tp", "dp"}
    assert all(r["ok"] for r in rows), [r.get("error") for r in rows]
    assert len(list(tmp_path.glob("link-local*.json"))) == 3


def test_graphed_block_off_cuda_or_under_autograd_runs_the_module_itself() -> None:
    import torch

    from planner.distributed.tp_plan import GraphedTP

    lin = torch.nn.Linear(8, 8)
    g = GraphedTP(lin)
    x = torch.randn(3, 8, requires_grad=True)
    y = g(x)
    assert torch.equal(y, lin(x)) and not g._graphs
    y.sum().backward()  # gradients flow as through the module
    assert x.grad is not None and lin.weight.grad is not None


def test_graphed_table_compares_the_chosen_graphed_decision_with_each_contender() -> None:
    markdown = _distributed_gpu().markdown

    pred = {"decision": "k=2 fused", "chunks": 2, "total_s": 90 * US, "exposed_comm_s": 5 * US}
    pred |= {"t_comp_s": 85 * US, "t_comm_s": 20 * US}
    names = {
        "eager": 400.0,
        "compile": 300.0,
        "eager graphed": 200.0,
        "eager graphed T_comp": 150.0,
        "reduce-overhead": 160.0,
        "planned graphed k=2 fused": 120.0,
        "planned graphed k=2 fused T_comp": 100.0,
    }
    row = {
        "key": "tp:1x8x16x2",
        "ok": True,
        "shape": [1, 8, 16, 2],
        "timing": {n: _timed(v) for n, v in names.items()},
        "checks": {n: {"ok": True, "max_rel_err": 1e-3} for n in names if "T_comp" not in n},
        "chosen": "k=2 fused",
        "predicted": [pred],
        "chosen_graphed": "k=2 fused",
        "predicted_graphed": [pred],
    }
    md = markdown({row["key"]: row}, {})
    line = next(x for x in md.splitlines() if x.startswith("| 1,8,16,2 | 200.0"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3].endswith("(k=2 fused)")
    assert cells[4:7] == [f"{120 / 200:.3f}", f"{120 / 160:.3f}", f"{120 / 300:.3f}"]
    assert cells[7] == f"{200 - 150:.1f} / {120 - 100:.1f}"
    # a row measured before the graphed variants existed renders without that table
    old = {k: v for k, v in row.items() if "graphed" not in k}
    assert "eager graphed" not in markdown({old["key"]: old}, {})


def _whole_vs_eager(runs: dict[str, list]) -> None:
    res = run_ranks(2, whole_vs_eager, (2, 8, 48, 6, runs), timeout_s=300)
    for backend, decisions in runs.items():
        for k, f in decisions:
            label = f"{backend} {TPDecision(k, f).label}"
            assert res[label] < 1e-5 and res[f"{label} T_comp"] < 1e-5, res
        # one graph per chunk count and collectives setting (fused and unfused share it)
        assert res[f"{backend} graphs"] == 2 * len({k for k, _ in decisions}), res
        assert res[f"{backend} breaks"] == 0, res
    assert "forward only" in res["grad error"]


@pytest.mark.slow
def test_whole_graph_block_equals_the_tp_block_in_one_graph_per_program() -> None:
    # dynamo's graphs and their lowering to aten ops (the collectives functionalized);
    # Inductor's code for them: the slow test below
    _whole_vs_eager({"aot_eager": [[k, f] for k in (1, 2, 4) for f in (False, True)]})


@pytest.mark.slow
def test_whole_graph_block_compiled_by_inductor_equals_the_tp_block() -> None:
    _whole_vs_eager({"inductor": [[1, False], [2, True], [4, False]]})


def test_tp_table_shows_the_whole_graph_columns_only_for_rows_that_timed_them() -> None:
    markdown = _distributed_gpu().markdown

    pred = {"decision": "k=2", "chunks": 2, "total_s": 90 * US, "exposed_comm_s": 5 * US}
    pred |= {"t_comp_s": 85 * US, "t_comm_s": 20 * US}
    names = {"eager": 400.0, "compile": 300.0, "planned k=2": 350.0, "planned k=2 T_comp": 250.0}
    names |= {"planned whole k=2": 240.0, "planned whole k=2 T_comp": 180.0}
    row = {
        "key": "tp:1x8x16x2",
        "ok": True,
        "shape": [1, 8, 16, 2],
        "timing": {n: _timed(v) for n, v in names.items()},
        "checks": {n: {"ok": True, "max_rel_err": 1e-3} for n in names if "T_comp" not in n},
        "chosen": "k=2",
        "predicted": [pred],
        "dynamo": {
            "compile": {"graphs": 1, "breaks": {}},
            "planned whole": {"graphs": 1, "breaks": {"a reason": 2}},
        },
    }
    md = markdown({row["key"]: row}, {})
    assert "- 1,8,16,2: compile 1 graph(s), 0 break(s); planned whole 1 graph(s), " in md
    assert "2 break(s): a reason" in md
    head = next(x for x in md.splitlines() if x.startswith("| B,S,D,H | eager"))
    line = next(x for x in md.splitlines() if x.startswith("| 1,8,16,2 | 400.0"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|")), strict=True))
    assert cells["planned whole"].startswith("240.0")
    assert cells["planned whole / eager"] == f"{240 / 400:.3f}"
    assert cells["planned whole / compile"] == f"{240 / 300:.3f}"
    assert cells["T_comp planned whole"].startswith("180.0")
    assert cells["exposed planned whole"] == f"{240 - 180:.1f}"
    assert cells["planned/compile"] == f"{350 / 300:.3f}"  # the regional plan's as before
    every = next(x for x in md.splitlines() if x.startswith("| 1,8,16,2 | k=2 (chosen)"))
    assert every.rstrip(" |").endswith("180.0 ± 0.0")
    # a row measured before the whole-graph variants existed keeps the older columns
    old = {k: {n: v for n, v in row[k].items() if "whole" not in n} for k in ("checks", "timing")}
    old = dict(row, **old)
    del old["dynamo"]
    assert "planned whole" not in markdown({old["key"]: old}, {})
    assert "graph breaks" not in markdown({old["key"]: old}, {})
