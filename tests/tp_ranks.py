"""Rank-side programs that tests run with `run_ranks` on gloo ranks, kept apart from the
test modules so that each rank imports only the planner: the sites of a captured
tensor-parallel program and every decision's output against the unplanned program's and
the unsharded model's (tests/test_tp_graph.py), a rank that stalls after rank 0's
result is written and a rank that starts late (tests/test_commbench.py)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from planner.distributed import parallel_models as pm
from planner.distributed.tp_autograd import column_parallel_gemm
from planner.distributed.tp_graph import (
    find_tp_sites,
    graph_decisions,
    row_parallel_chunks,
    tp_program,
)
from planner.ir.capture import export_model

B, S, D, H = 2, 8, 32, 4
CHUNKS = (1, 2)  # on the ranks: k = 4 takes the same code path as k = 2


def _sites_and_errors(captured, ref: torch.Tensor, x: torch.Tensor) -> dict:
    gm = captured.program.module()
    sites = find_tp_sites(gm)
    unplanned = gm(x)[0]
    errs = {}
    for d in graph_decisions(sites, CHUNKS):
        got = tp_program(gm, d, sites)(x)[0]
        errs[d.label] = max(float((got - unplanned).abs().max()), float((got - ref).abs().max()))
    return {
        "sites": [
            {
                "gemm": s.gemm,
                "column": list(s.column),
                "epilogue": list(s.epilogue),
                "rows": s.rows,
                "nbytes": s.nbytes,
            }
            for s in sites
        ],
        "errors": errs,
        "ref_err": float((unplanned - ref).abs().max()),
    }


@torch.no_grad()
def planned_programs(rank: int, world: int, models: list[str]) -> dict:
    torch.manual_seed(0)
    x = torch.randn(B, S, D)
    mesh = init_device_mesh("cpu", (world,))
    out = {}
    if "llama" in models:
        full = pm.LlamaStyleBlock(D, H, 2 * D)
        llama = parallelize_module(copy.deepcopy(full), mesh, pm.llama_tp_plan())
        out["llama"] = _sites_and_errors(export_model(llama, (x,)), full(x), x)
    if "tp-block" in models:
        block = pm.TPBlock(D, H, world, dist.group.WORLD)
        for p in block.parameters():
            p.normal_(0.0, 0.2)
        out["tp-block"] = _sites_and_errors(export_model(block, (x,)), block(x), x)
    if "hf-llama" in models:
        hf = HFLlamaLayer()
        hf_tp = parallelize_module(copy.deepcopy(hf), mesh, HFLlamaLayer.tp_plan())
        out["hf-llama"] = _sites_and_errors(export_model(hf_tp, (x,)), hf(x), x)
    return out


class HFLlamaLayer(torch.nn.Module):
    """Hugging Face's LLaMA decoder layer (grouped-query attention: 4 query heads, 2 key
    and value heads; SDPA) with its rotary embedding, on (B, S, D) hidden states."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import LlamaConfig  # only this rank program needs transformers
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )

        cfg = LlamaConfig(
            hidden_size=D,
            intermediate_size=2 * D,
            num_attention_heads=H,
            num_key_value_heads=H // 2,
            vocab_size=16,
        )
        cfg._attn_implementation = "sdpa"
        self.layer, self.rope = LlamaDecoderLayer(cfg, 0), LlamaRotaryEmbedding(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1]).unsqueeze(0)
        out = self.layer(x, position_embeddings=self.rope(x, pos), position_ids=pos)
        return out[0] if isinstance(out, tuple) else out

    @staticmethod
    def tp_plan() -> dict:
        """The split Hugging Face's LLaMA declares as its base_model_tp_plan."""
        col = {f"layer.{n}": ColwiseParallel() for n in _HF_COLUMN}
        return col | {f"layer.{n}": RowwiseParallel() for n in _HF_ROW}


_HF_COLUMN = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
)
_HF_ROW = ("self_attn.o_proj", "mlp.down_proj")


def _unfused_plan(graph, **fields):
    """A plan of `graph` with every op its own group (nothing fused), made on this CPU for
    the tests; `fields` are the Plan's other fields (predicted_s, tensor_parallel, ...)."""
    from planner.fusion.partition import Partition
    from planner.plans.plan import Plan

    return Plan.from_partition(
        Partition.singletons(graph),
        device="cpu",
        dtype="float32",
        strategy="test",
        cost_model="test",
        **fields,
    )


def _wrong_rewrite(gm, decision, sites, compile_epilogue):
    """The planned program with 1 added to its first output on rank 1 only: a mismatch
    one rank sees, which every rank must answer with the unplanned program."""
    planned = tp_program(gm, decision, sites, compile_epilogue)
    rank = dist.get_rank()

    def run(*args):
        out = planned(*args)
        return (out[0] + rank, *out[1:]) if isinstance(out, tuple) else out + rank

    return run


def _rewrite_failing_on_rank_1(gm, decision, sites, compile_epilogue):
    """The planned program, except that rewriting raises on rank 1: a rank that runs
    neither program, which no other rank may run alone."""
    if dist.get_rank() == 1:
        raise RuntimeError("injected: this rank cannot rewrite the program")
    return tp_program(gm, decision, sites, compile_epilogue)


@torch.no_grad()
def realized_plans(rank: int, world: int) -> dict:
    """A Plan recording a TP decision realized on a DTensor program through the realizer:
    applied and equal to the unplanned program; and with a wrong rewrite on one rank,
    the unplanned program on every rank with a warning."""
    import dataclasses
    import warnings

    from planner.distributed.tp_realize import realize_tp
    from planner.plans.plan import TPChoice
    from planner.realize.realizer import realize

    torch.manual_seed(0)
    x = torch.randn(B, S, D)
    mesh = init_device_mesh("cpu", (world,))
    full = pm.LlamaStyleBlock(D, H, 2 * D)
    model = parallelize_module(copy.deepcopy(full), mesh, pm.llama_tp_plan())
    captured = export_model(model, (x,))
    gm = captured.program.module()
    sites = tuple(s.gemm for s in find_tp_sites(gm))
    base = _unfused_plan(captured.graph, predicted_s=0.0)
    unplanned = gm(x)[0]
    out = {"sites": list(sites)}
    # the same decision at both sites, and a decision per site (attention's output
    # projection in 2 chunks with its epilogue fused, the MLP's down projection alone)
    for chunks, fuse in ((2, True), (2, False), ((2, 1), (True, False))):
        plan = dataclasses.replace(base, tensor_parallel=TPChoice(chunks, fuse, sites))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            realized = realize(captured, plan)
            got = realized(x)[0]
        nodes = realized.program.graph.nodes
        calls = [str(n.target) for n in nodes]
        out[plan.tensor_parallel.label] = {
            "applied": realized.applied,
            "chunks": [n.args[1] for n in nodes if n.target is row_parallel_chunks],
            "epilogues": [c for c in calls if c.startswith("tp_epilogue")],
            "chunked": sum("row_parallel_chunks" in c for c in calls),
            "collectives_left": sum("all_reduce" in c and "chunks" not in c for c in calls),
            "err": float((got - unplanned).abs().max()),
            "ref_err": float((got - full(x)).abs().max()),
            "warnings": [str(m.message) for m in w],
        }
    plan = dataclasses.replace(base, tensor_parallel=TPChoice(2, False, sites))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        realized = realize_tp(captured, plan, rewrite=_wrong_rewrite)
    got = realized(x)[0]
    out["wrong"] = {
        "applied": realized.applied,
        "reason": realized.reason,
        "err": float((got - unplanned).abs().max()),
        "warnings": [str(m.message) for m in w],
    }
    out["wrong"]["fell_back"] = [g for g, _ in realized.fell_back]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        realized = realize_tp(captured, plan, rewrite=_rewrite_failing_on_rank_1)
    out["unwritten"] = {
        "applied": realized.applied,
        "reason": realized.reason,
        "fell_back": [list(f) for f in realized.fell_back],
    }
    stale = dataclasses.replace(base, tensor_parallel=TPChoice(2, False, ("no_such_gemm",)))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out["stale"] = {"applied": realize(captured, stale).applied}
    return out


def _rewrite_wrong_at(gemms: list[str], ranks: list[int], calls: list[list[str]]):
    """`tp_program`, except that on `ranks` the chunked GEMM of each site of `gemms` (where
    it is rewritten) adds 1 to its reduced sum: a mismatch those sites' rewrites alone
    cause. Each call's sites are appended to `calls`."""

    def rewrite(gm, decision, sites, compile_epilogue):
        calls.append([s.gemm for s in sites])
        planned = tp_program(gm, decision, sites, compile_epilogue)
        if dist.get_rank() not in ranks:
            return planned
        for site_gemm in [n for n in gm.graph.nodes if n.name in gemms and n.name in calls[-1]]:
            operands = [a.name for a in site_gemm.args if isinstance(a, torch.fx.Node)]
            (chunked,) = [
                n
                for n in planned.graph.nodes
                if n.target is row_parallel_chunks
                and [a.name for a in n.args[3:] if isinstance(a, torch.fx.Node)] == operands
            ]
            with planned.graph.inserting_after(chunked):
                wrong = planned.graph.call_function(torch.add, (chunked, 1.0))
            chunked.replace_all_uses_with(wrong, delete_user_cb=lambda u, w=wrong: u is not w)
        planned.recompile()
        return planned

    return rewrite


def _rewrite_raising_at(gemm: str, calls: list[list[str]]):
    """`tp_program`, except that rewriting site `gemm` raises on rank 1."""

    def rewrite(gm, decision, sites, compile_epilogue):
        calls.append([s.gemm for s in sites])
        if dist.get_rank() == 1 and gemm in calls[-1]:
            raise RuntimeError(f"injected: this rank cannot rewrite {gemm}")
        return tp_program(gm, decision, sites, compile_epilogue)

    return rewrite


@torch.no_grad()
def narrowed_plans(rank: int, world: int) -> dict:
    """A decision per site (attention's output projection in 2 chunks, the MLP's down
    projection in 4, both epilogues fused) realized on a DTensor program whose rewrite of
    one site is made wrong - on rank 1 only, on both ranks, raising on rank 1 - or of both
    sites on rank 1; and a decision whose first site's tokens do not split into its
    chunks. For each: what the realization kept, the sites of each rewrite it made, its
    output against the unplanned program's, its warnings."""
    import warnings

    from planner.distributed.tp_realize import realize_tp
    from planner.plans.plan import TPChoice

    torch.manual_seed(0)
    x = torch.randn(B, S, D)
    mesh = init_device_mesh("cpu", (world,))
    model = parallelize_module(pm.LlamaStyleBlock(D, H, 2 * D), mesh, pm.llama_tp_plan())
    captured = export_model(model, (x,))
    gm = captured.program.module()
    sites = [s.gemm for s in find_tp_sites(gm)]
    unplanned = gm(x)[0]
    even, uneven = (2, 4), (3, 4)  # 16 tokens: 3 chunks do not split them
    cases = {  # case -> (chunks per site, the rewrite given the list it records calls in)
        "wrong at site 1 on rank 1": (even, lambda c: _rewrite_wrong_at(sites[1:], [1], c)),
        "wrong at site 0 on both": (even, lambda c: _rewrite_wrong_at(sites[:1], [0, 1], c)),
        "raising at site 0 on rank 1": (even, lambda c: _rewrite_raising_at(sites[0], c)),
        "wrong at both sites on rank 1": (even, lambda c: _rewrite_wrong_at(sites, [1], c)),
        "tokens of site 0 uneven": (uneven, lambda c: _rewrite_wrong_at([], [], c)),  # right
    }
    out: dict = {"sites": sites}
    for case, (chunks, make) in cases.items():
        choice = TPChoice(chunks, (True, True), tuple(sites))
        plan = _unfused_plan(captured.graph, predicted_s=0.0, tensor_parallel=choice)
        calls: list[list[str]] = []
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            realized = realize_tp(captured, plan, rewrite=make(calls))
        nodes = list(realized.program.graph.nodes)
        out[case] = {
            "applied": realized.applied,
            "complete": realized.complete,
            "fell_back": [list(f) for f in realized.fell_back],
            "chunks": [n.args[1] for n in nodes if n.target is row_parallel_chunks],
            "epilogues": [str(n.target) for n in nodes if "tp_epilogue" in str(n.target)],
            "err": float((realized(x)[0] - unplanned).abs().max()),
            "calls": calls,
            "warnings": [str(m.message) for m in w],
        }
    return out


@torch.no_grad()
def served_plan(rank: int, world: int, cache_dir: str) -> dict:
    """The runtime backend serving a cached plan that records a TP decision for the zoo
    block (functional collectives): realized through the backend, the decision applied,
    the output equal to the block's own."""
    import warnings

    from planner.hardware import device_fingerprint
    from planner.plans.cache import PlanCache
    from planner.plans.plan import TPChoice
    from planner.runtime.backend import fusion_planner_backend
    from planner.runtime.graph import capture_for_serving

    torch.manual_seed(0)
    x = torch.randn(B, S, D)
    block = pm.TPBlock(D, H, world, dist.group.WORLD)
    for p in block.parameters():
        p.normal_(0.0, 0.2)
    captured = capture_for_serving(block, (x,))
    sites = tuple(s.gemm for s in find_tp_sites(captured.program.module()))
    plan = _unfused_plan(
        captured.graph,
        predicted_s=1e-3,
        device_fingerprint=device_fingerprint(torch.device("cpu")),
        tensor_parallel=TPChoice(2, True, sites),
    )
    applied = _recording_applied()
    with (
        PlanCache(f"{cache_dir}/rank{rank}.db") as cache,
        warnings.catch_warnings(record=True) as w,
    ):
        warnings.simplefilter("always")
        cache.store_exact(plan, [list(x.shape)])
        backend = fusion_planner_backend(cache)
        got = torch.compile(block, backend=backend, dynamic=False)(x)
        want = block(x)
    return {
        "applied": applied,
        "err": float((got - want).abs().max()),
        "exact": backend.stats.exact,
        "warnings": [str(m.message) for m in w if "fusion-planner" in str(m.message)],
    }


def _recording_applied() -> list[bool]:
    """A list that records, from now on in this rank's process, whether each
    `tp_realize.realize_tp` call applied its decision (the function is wrapped in place)."""
    from planner.distributed import tp_realize

    applied: list[bool] = []
    realize_tp = tp_realize.realize_tp

    def spy(*args, **kwargs):
        r = realize_tp(*args, **kwargs)
        applied.append(r.applied)
        return r

    tp_realize.realize_tp = spy
    return applied


def _tp_tune_config(world: int):
    """`tune` of the zoo's TP block at the ranks' shapes: priority's plan, a short timer."""
    from search.tune import TuneConfig
    from zoo.modelspec import resolve

    return TuneConfig(
        spec=resolve("zoo:tp-block", f"B={B},D={D},H={H},TP={world}"),
        dynamic=f"S={S}..{S}",
        strategy="priority",
        top_k=1,
        compile_baseline=False,
        timer={"warmup": 1, "min_reps": 3, "max_reps": 6, "max_seconds": 1.0},
    )


def tuned_on_ranks(rank: int, world: int, cache_dir: str) -> dict:
    """`tune` of the zoo block (functional collectives) run by every rank, each with its own
    plan cache: the decision searched, the plan with it measured on the ranks as served,
    the measured best stored; what each rank stored, gathered."""
    from learned_cost.analytical import AnalyticalModel
    from planner.hardware import get_spec
    from planner.plans.cache import PlanCache
    from search.tune import tune

    cfg = _tp_tune_config(world)
    with PlanCache(f"{cache_dir}/rank{rank}.db") as cache:
        (r,) = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
        plan = r.plan
        key = plan.structure_key if plan is not None else ""
        hit = cache.lookup(key, [[B, S, D]]) if plan is not None else None
    mine = {
        "stored_tp": plan.tensor_parallel.label if plan and plan.tensor_parallel else None,
        "measured_s": plan.measured_s if plan else None,
    }
    every = [None] * world
    dist.all_gather_object(every, mine)
    return {
        "plan": plan.to_json() if plan else None,
        "cached_tp": hit.plan.tensor_parallel.label
        if hit and hit.plan and hit.plan.tensor_parallel
        else None,
        "candidates": [
            {
                "strategy": c.strategy,
                "tp": c.tensor_parallel.label if c.tensor_parallel else None,
                "measured_s": c.measured.median_s if c.measured else None,
                "error": c.error,
            }
            for c in r.candidates
        ],
        "note": r.tensor_parallel,
        "ranks": every,
    }


def tuned_with_a_failure_on_one_rank(rank: int, world: int, cache_dir: str) -> dict:
    """`tune` of the zoo block on every rank, where realizing the first candidate raises on
    rank 1 only (the backend's realizer, as an Inductor compile that fails on one rank
    would): what each rank measured and stored, gathered."""
    from learned_cost.analytical import AnalyticalModel
    from planner.hardware import get_spec
    from planner.plans.cache import PlanCache
    from planner.runtime import backend
    from search.tune import tune

    realize = backend._default_realizer
    calls = []

    def failing_on_rank_1(captured, plan, **options):
        calls.append(plan.strategy)
        if rank == 1 and len(calls) == 1:
            raise RuntimeError("injected: this rank cannot compile the first candidate")
        return realize(captured, plan, **options)

    backend._default_realizer = failing_on_rank_1
    cfg = _tp_tune_config(world)
    with PlanCache(f"{cache_dir}/rank{rank}.db") as cache:
        (r,) = tune(cfg, AnalyticalModel(get_spec("cpu")), cache, progress=lambda m: None)
    mine = {
        "plan": r.plan.to_json() if r.plan else None,
        "stored": r.stored,
        "candidates": [
            {
                "strategy": c.strategy,
                "measured_s": c.measured.median_s if c.measured else None,
                "error": c.error,
            }
            for c in r.candidates
        ],
    }
    every = [None] * world
    dist.all_gather_object(every, mine)  # the job's own ranks' records
    return {"ranks": every}


def _grad_errors(model, program, x: torch.Tensor, decisions: dict) -> dict:
    """max |grad - grad of `model`| / max |grad of `model`| over the input and every
    parameter, for `program` rewritten for training with each of `decisions`."""

    def grads(fn, params: dict) -> dict:
        for p in params.values():
            p.grad = None
        xr = x.clone().requires_grad_()
        y = fn(xr)
        y = y[0] if isinstance(y, tuple) else y
        y = y.to_local() if hasattr(y, "to_local") else y
        (y * torch.linspace(-1.0, 1.0, y.numel()).view(y.shape)).sum().backward()
        out = {"input": xr.grad}
        for n, p in params.items():
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            out[n] = g
        return out

    want = grads(model, dict(model.named_parameters()))
    sites = find_tp_sites(program)
    errs = {}
    for label, d in decisions.items():
        planned = tp_program(program, d, sites, backward=True)
        got = grads(planned, dict(program.named_parameters()))
        assert set(got) == set(want), (sorted(got), sorted(want))
        errs[label] = max(
            float((got[n] - want[n]).abs().max()) / max(1e-12, float(want[n].abs().max()))
            for n in want
        )
    return errs


def trained_programs(rank: int, world: int) -> dict:
    """Gradients of captured programs rewritten for training (chunked backward) against the
    models' own: the zoo block (Megatron's f and g) and a DTensor LLaMA-style block."""
    from planner.distributed.tp_graph import SiteDecisions
    from planner.distributed.tp_plan import TPDecision

    torch.manual_seed(0)
    x = torch.randn(B, S, D)
    decisions = {
        "k=1": TPDecision(1),
        "k=2 fused": TPDecision(2, True),
        "k=2 fused | k=1": SiteDecisions((TPDecision(2, True), TPDecision(1))),
    }
    block = pm.TPBlock(D, H, world, dist.group.WORLD)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
        gm = export_model(block, (x,)).program.module()
    out = {"tp-block": _grad_errors(block, gm, x, decisions)}
    mesh = init_device_mesh("cpu", (world,))
    llama = parallelize_module(pm.LlamaStyleBlock(D, H, 2 * D), mesh, pm.llama_tp_plan())
    with torch.no_grad():
        gm = export_model(llama, (x,)).program.module()
    out["llama"] = _grad_errors(llama, gm, x, decisions)
    trained = tp_program(gm, decisions["k=2 fused | k=1"], find_tp_sites(gm), backward=True)
    out["column_chunks"] = [
        n.args[1] for n in trained.graph.nodes if n.target is column_parallel_gemm
    ]
    try:
        tp_program(gm, TPDecision(2), find_tp_sites(gm))(x.clone().requires_grad_())
        out["forward_only"] = "no error"
    except Exception as e:  # rewritten for the forward only: a gradient is refused
        out["forward_only"] = str(e)
    return out


def _grads(model: torch.nn.Module, fn, x: torch.Tensor) -> dict:
    """The local gradients of `fn(x)`'s weighted sum for the input and `model`'s parameters."""
    model.zero_grad(set_to_none=True)
    xr = x.clone().requires_grad_()
    y = fn(xr)
    (y * torch.linspace(-1.0, 1.0, y.numel()).view(y.shape)).sum().backward()
    out = {"input": xr.grad}
    for n, p in model.named_parameters():
        out[n] = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
    return out


def served_dtensor_plan(rank: int, world: int, cache_dir: str) -> dict:
    """The runtime backend serving a DTensor `LlamaStyleBlock` from a plan stored for the
    rank program capture makes of the model (planner.ir.capture_dtensor) with a TP decision:
    the exact hit, the decision applied, outputs against the DTensor model and the unsharded
    block; then in grad mode, the gradients against the DTensor model's."""
    import warnings

    from planner.hardware import device_fingerprint
    from planner.plans.cache import PlanCache
    from planner.plans.plan import TPChoice
    from planner.runtime.backend import default_plan, fusion_planner_backend

    torch.manual_seed(0)
    x = torch.randn(B, S, D)
    mesh = init_device_mesh("cpu", (world,))
    full = pm.LlamaStyleBlock(D, H, 2 * D)
    model = parallelize_module(copy.deepcopy(full), mesh, pm.llama_tp_plan())
    with torch.no_grad():
        captured = export_model(model, (x,))  # what `plan`/`tune` capture of the model
    sites = tuple(s.gemm for s in find_tp_sites(captured.program.module()))
    plan = _unfused_plan(
        captured.graph,
        predicted_s=1e-3,
        device_fingerprint=device_fingerprint(torch.device("cpu")),
        tensor_parallel=TPChoice(2, True, sites),
    )
    # at a second shape, the rule-based plan of the rank program (fused groups, no decision)
    x2 = torch.randn(B, 2 * S, D)
    with torch.no_grad():
        fused = default_plan(export_model(model, (x2,)).graph, torch.device("cpu"))
    applied = _recording_applied()
    out: dict = {
        "sites": list(sites),
        "planned_groups": sum(len(g.nodes) > 1 for g in fused.groups),
    }
    with (
        PlanCache(f"{cache_dir}/rank{rank}.db") as cache,
        warnings.catch_warnings(record=True) as w,
    ):
        warnings.simplefilter("always")
        cache.store_exact(plan, [list(x.shape)])
        cache.store_exact(fused, [list(x2.shape)])
        backend = fusion_planner_backend(cache)
        realizer, realized = backend.realizer, []

        def seen(captured, p):
            r = realizer(captured, p)
            realized.append(r)
            return r

        backend.realizer = seen
        compiled = torch.compile(model, backend=backend, dynamic=False)
        with torch.no_grad():
            got = compiled(x)
            want = model(x)
            out["err"] = float((got - want).abs().max())
            out["ref_err"] = float((got - full(x)).abs().max())
            got2 = compiled(x2)  # dynamo recompiles for the new shape: a second graph
            out["fused_err"] = float((got2 - model(x2)).abs().max())
            out["fused_ref_err"] = float((got2 - full(x2)).abs().max())
        fused_realized = realized[-1]
        out["compiled_groups"] = sum(g.compiled for g in getattr(fused_realized, "groups", ()))
        out["group_fallbacks"] = dict(getattr(fused_realized, "fallbacks", {"none": "realized"}))
        out["exact"], out["applied"] = backend.stats.exact, list(applied)
        served = _grads(model, compiled, x)  # grad mode: dynamo compiles the graph anew
        eager = _grads(model, model, x)
        out["grad_applied"] = applied[len(out["applied"]) :]
        out["grad_graphs"], out["declined"] = backend.stats.grad_graphs, backend.stats.declined
        out["grad_err"] = max(
            float((served[n] - eager[n]).abs().max()) / max(1e-12, float(eager[n].abs().max()))
            for n in eager
        )
        out["grads"] = sorted(served)
    out["warnings"] = [str(m.message) for m in w if "fusion-planner" in str(m.message)]
    out["fallbacks"] = backend.stats.fallbacks
    return out


def rank_then_stall(rank: int, world: int) -> list[float]:
    """Rank 0's result at once; rank 1 then stalls, so no rank reaches the teardown."""
    import time

    if rank == 1:
        time.sleep(120)
    return [float(rank), float(world)]


def both_stall(rank: int, world: int) -> list[float]:
    """Every rank stalls before its result: a hang, whose report should say where."""
    import time

    time.sleep(120)
    return [float(rank), float(world)]


def late_rank_times(rank: int, world: int) -> list[list[float]]:
    """A 4 KiB all-reduce timed by commbench while rank 1 starts every sample 50 ms after
    rank 0 (it sleeps after the barrier): rank 0's samples hold that wait."""
    import time

    from profiling import commbench

    if rank == 1:
        commbench.sync = lambda device: time.sleep(0.05)
    return commbench._time_sizes(rank, world, "all_reduce", [4096], 3)
