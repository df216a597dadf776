"""Distributed plans measured on N local devices (NCCL on GPUs, or gloo on the CPU as a
smoke test), every figure beside the planner's prediction:

    python3 benchmarks/distributed_gpu.py --out DIR [--world-size 2] [--backend nccl]
        [--device cuda] [--parts comm,tp,dp] [--time-limit-s 480] [--quick]
    python3 benchmarks/distributed_gpu.py --backend gloo --device cpu --quick --out DIR

Rows go to DIR/results.jsonl as they finish (a row already there without an error is
skipped on a rerun); DIR/results.md is the table written from it at the end
(`--table-only` rewrites it). One failing row records its error and the run goes on; past
`--time-limit-s` no new row starts. What each column means: docs/distributed.md.

- comm: α-β of all-reduce, all-gather and reduce-scatter per size range, fitted on powers
  of two, the error on held-out sizes (1.5x each power of two); each fit also written as
  DIR/link-<name>[.<collective>].json, the file `device-bench --comm` stores.
- tp: the 2-way tensor-parallel block at each anchor shape: eager, torch.compile of it,
  and the planner's plan (its chunking and epilogue decisions realized by
  planner.distributed.tp_plan.PlannedTPBlock), every decision the search priced measured
  too; T_comp (collectives skipped), T_comm (the collectives alone), exposed = total - T_comp.
  With compile on, every decision also as one compiled graph of the whole forward
  (tp_plan.WholePlannedTPBlock, "planned whole <decision>").
  On CUDA also with CUDA graphs: the eager block and every decision replayed as one graph
  per call (tp_plan.GraphedTP, the decision searched again with no per-op host cost),
  against `torch.compile(mode="reduce-overhead")`.
- dp (run before tp, being short): a DDP training step of zoo:mlp per gradient bucket cap, the planner's searched
  bucket against DDP's 25 MiB, measured and predicted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from planner.distributed.comm_cost import collective_time_s
from planner.distributed.links import AlphaBeta, get_link, measured_link_filename
from profiling.commbench import bench_comm, fit_alpha_beta, predict_s, run_ranks

ANCHORS = [(1, 128, 768, 12), (8, 512, 768, 12), (32, 512, 1024, 16), (4, 2048, 1024, 16)]
QUICK_ANCHORS = [(1, 16, 64, 4), (2, 32, 64, 4)]
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
MB = 1024 * 1024
TOL = {"bfloat16": 3e-2, "float16": 1e-2, "float32": 1e-4}


# ---- rows on disk -------------------------------------------------------------------
META_KEYS = ("backend", "world_size", "device", "torch", "dtype", "compile")


def render_jsonl(path: Path) -> str:
    """results.md of a committed results.jsonl (the run's settings read off its rows)."""
    rows = load_rows(path)
    first = next(iter(rows.values()), {})
    return markdown(rows, {k: first.get(k) for k in META_KEYS})


def load_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The last row per key (a rerun appends; a row that parses badly is skipped)."""
    rows: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
                rows[row["key"]] = row
            except (ValueError, KeyError, TypeError):
                continue
    return rows


def append_row(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")


# ---- comm -----------------------------------------------------------------------------
def comm_row(a: argparse.Namespace, collective: str, timeout_s: float) -> dict[str, Any]:
    res = bench_comm(
        a.world_size,
        collective,
        quick=a.quick,
        reps=a.comm_reps,
        backend=a.backend,
        timeout_s=timeout_s,
        command=f"python3 benchmarks/distributed_gpu.py --backend {a.backend}"
        + (" --quick" if a.quick else ""),
    )
    link_name = "local-nccl" if a.backend == "nccl" else "local"
    (a.out / measured_link_filename(link_name, collective)).write_text(res.link.to_json())
    return {
        "collective": collective,
        "fits": [f.__dict__ for f in res.collective_fits],
        "link_fits": [f.__dict__ for f in res.link.fits],
        "train": res.train,
        "heldout": res.heldout_rows(),
        "heldout_max_rel_err": res.link.heldout_max_rel_err,
        "heldout_median_rel_err": sorted(res.heldout_rel_err)[len(res.heldout_rel_err) // 2]
        if res.heldout_rel_err
        else None,
    }


def all_reduce_model(rows: dict[str, dict[str, Any]], backend: str, world: int) -> dict[str, Any]:
    """The all-reduce times the planner uses: this run's fit when the comm row exists,
    else the link table (measured figures where stored)."""
    row = rows.get("comm:all_reduce")
    if row and row.get("ok"):
        return {"fits": row["fits"], "source": "this run's all-reduce fit"}
    name = "local-nccl" if backend == "nccl" else "local"
    try:
        get_link(name)
    except Exception:
        name = "nvlink4" if backend == "nccl" else "pcie4"
    return {"link": name, "source": f"link table: {name}"}


def all_reduce_fn(model: dict[str, Any], world: int):
    if "fits" in model:
        fits = tuple(AlphaBeta(**f) for f in model["fits"])
        return lambda n: predict_s(fits, n)
    link = get_link(model["link"])
    return lambda n: collective_time_s("all_reduce", "ring", n, world, link)


# ---- tp (runs on every rank) ------------------------------------------------------------
def tp_rank(
    rank: int,
    world: int,
    shape: list[int],
    dtype: str,
    reps: int,
    compile_: bool,
    ar_model: dict[str, Any],
    chunk_choices: list[int],
    whole_decisions: str = "all",
) -> dict[str, Any]:
    """One anchor shape on one rank: plan, realize, check outputs, time every variant
    (the whole-graph block for every decision, only the chosen one, or none:
    `whole_decisions` all, chosen or off; only with `compile_`)."""
    import torch._dynamo
    import torch.distributed as dist

    from learned_cost.analytical import AnalyticalModel
    from planner.distributed.parallel_models import TPBlock
    from planner.distributed.tp_plan import GraphedTP, PlannedTPBlock, WholePlannedTPBlock
    from planner.hardware import get_spec, local_device_name
    from profiling.commbench import rank_device
    from profiling.tpbench import host_costs, interleaved
    from search.tp_search import DTYPES, HostCosts, region_costs, search_tp_block

    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    b, s, d, h = shape
    device = rank_device(rank)
    dt = DTYPES[dtype]
    group = dist.group.WORLD
    torch.manual_seed(0)  # the same weights and input on every rank, made on the CPU
    block = TPBlock(d, h, world, group)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.normal_(0.0, 0.1)
        block.ln1.weight.fill_(1.0)
        block.ln2.weight.fill_(1.0)
    x = torch.randn(b, s, d)
    block = block.to(device=device, dtype=dt).eval()
    x = x.to(device=device, dtype=dt)
    out: dict[str, Any] = {
        "shape": shape,
        "dtype": dtype,
        "world": world,
        "rank_device": str(device),
    }
    torch.set_grad_enabled(False)

    hc = host_costs(device, group, compile_call=compile_)
    out["host_costs"] = hc
    spec_name = local_device_name(device)
    model = AnalyticalModel(get_spec(spec_name))
    launch = model.spec.launch_s
    host = HostCosts(
        hc["eager_op_s"],
        hc["compiled_call_s"] if hc["compiled_call_s"] is not None else 4 * launch,
        hc["collective_call_s"],
        "measured on the ranks"
        + ("" if hc["compiled_call_s"] is not None else " (compiled: estimate)"),
    )
    costs = region_costs(b, s, d, h, world, dtype, model, host, tuple(chunk_choices))
    plan = search_tp_block(costs, all_reduce_fn(ar_model, world), tuple(chunk_choices))
    # every rank runs rank 0's decision (the same inputs give the same plan; this makes sure)
    pick = [plan.table.index(plan.best)]
    dist.broadcast_object_list(pick, src=0)
    best = plan.table[pick[0]]
    out["cost_model"] = repr(model)
    out["comm_model"] = ar_model["source"]
    out["predicted"] = [p.row() for p in plan.table]
    out["predicted_eager"] = plan.eager.row()
    out["chosen"] = best.decision.label

    graphs = device.type == "cuda"
    if graphs:  # the same search for the CUDA-graph executor: one replay issues everything
        replay_host = HostCosts(0.0, 0.0, 0.0, "one CUDA graph replay per call")
        costs_g = region_costs(b, s, d, h, world, dtype, model, replay_host, tuple(chunk_choices))
        plan_g = search_tp_block(costs_g, all_reduce_fn(ar_model, world), tuple(chunk_choices))
        pick = [plan_g.table.index(plan_g.best)]
        dist.broadcast_object_list(pick, src=0)
        out["predicted_graphed"] = [p.row() for p in plan_g.table]
        out["predicted_eager_graphed"] = plan_g.eager.row()
        out["chosen_graphed"] = plan_g.table[pick[0]].decision.label

    planned = PlannedTPBlock(block, best.decision, compile_regions=compile_)
    whole = WholePlannedTPBlock(block, best.decision) if compile_ else None
    whole_table = [p for p in plan.table if whole_decisions == "all" or p is best]
    if whole_decisions == "off":
        whole = None
    cblock = torch.compile(block) if compile_ else None
    rblock = torch.compile(block, mode="reduce-overhead") if compile_ and graphs else None
    ref = block(x).float()
    checks: dict[str, Any] = {}

    def check(name: str, fn) -> None:
        print(f"rank {rank}: {name}", flush=True)  # the log's tail says where a rank stopped
        try:
            y = fn().float()
            err = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
            checks[name] = {"max_rel_err": err, "ok": err <= TOL[dtype]}
        except Exception as e:
            checks[name] = {"error": f"{type(e).__name__}: {e}"[:2000], "ok": False}

    def run_planned(dec, comm: bool = True):
        return lambda: _call_fixed(planned, dec, comm, x)

    def run_whole(dec, comm: bool = True):
        return lambda: _call_fixed(whole, dec, comm, x)

    def run_eager(comm: bool = True):
        return lambda: _call_fixed(block, None, comm, x)

    graphed: dict[str, Any] = {}  # name -> GraphedTP, captured at its first call
    if graphs:
        graphed["eager graphed"] = GraphedTP(_Fixed(block, None, True))
        graphed["eager graphed T_comp"] = GraphedTP(_Fixed(block, None, False))
        for p in plan.table:
            dec = p.decision
            graphed[f"planned graphed {dec.label}"] = GraphedTP(_Fixed(planned, dec, True))
            graphed[f"planned graphed {dec.label} T_comp"] = GraphedTP(_Fixed(planned, dec, False))

    dynamo: dict[str, Any] = {}  # graphs and graph breaks dynamo made, per compiled variant
    if cblock is not None:
        with _dynamo_counts(dynamo, "compile"):
            check("compile", lambda: cblock(x))
    if rblock is not None:
        check("reduce-overhead", lambda: rblock(x))
    for p in plan.table:
        check(f"planned {p.decision.label}", run_planned(p.decision))
    if whole is not None:  # compiled here, one program per chunk count
        with _dynamo_counts(dynamo, "planned whole"):
            for p in whole_table:
                check(f"planned whole {p.decision.label}", run_whole(p.decision))
    for name, g in graphed.items():
        if not name.endswith("T_comp"):
            check(name, lambda g=g: g(x))
    out["checks"] = checks

    variants: dict[str, Any] = {"eager": run_eager()}
    if cblock is not None:
        variants["compile"] = lambda: cblock(x)
    if rblock is not None:
        variants["reduce-overhead"] = lambda: rblock(x)
    for p in plan.table:
        variants[f"planned {p.decision.label}"] = run_planned(p.decision)
    variants["eager T_comp"] = run_eager(False)
    for p in plan.table:
        variants[f"planned {p.decision.label} T_comp"] = run_planned(p.decision, False)
    if whole is not None:
        for p in whole_table:
            variants[f"planned whole {p.decision.label}"] = run_whole(p.decision)
            variants[f"planned whole {p.decision.label} T_comp"] = run_whole(p.decision, False)
    for name, g in graphed.items():
        variants[name] = lambda g=g: g(x)
    for k in sorted({p.decision.chunks for p in plan.table}):
        bufs = [torch.zeros(b * s // k, d, device=device, dtype=dt) for _ in range(2 * k)]

        def comm(bufs=bufs, k=k) -> None:
            for layer in range(2):
                works = [
                    dist.all_reduce(t, group=group, async_op=True)
                    for t in bufs[layer * k : (layer + 1) * k]
                ]
                for w in works:
                    w.wait()

        variants[f"T_comm k={k}"] = comm
    print(f"rank {rank}: timing {len(variants)} variants", flush=True)
    with _dynamo_counts(dynamo, "while timing"):  # T_comp variants compile here too
        timing, errors = interleaved(variants, device, reps)
    out["dynamo"] = dynamo
    print(f"rank {rank}: timed", flush=True)
    out["timing"] = timing
    out["timing_errors"] = errors
    return out


@contextlib.contextmanager
def _dynamo_counts(into: dict[str, Any], name: str):
    """Record in `into[name]` how many graphs dynamo compiled and the reasons of the graph
    breaks it met inside the block."""
    from torch._dynamo.utils import counters

    graphs, breaks = counters["stats"]["unique_graphs"], dict(counters["graph_break"])
    try:
        yield
    finally:
        new = {
            reason[:200]: n - breaks.get(reason, 0)
            for reason, n in counters["graph_break"].items()
            if n > breaks.get(reason, 0)
        }
        into[name] = {"graphs": counters["stats"]["unique_graphs"] - graphs, "breaks": new}


def _call_fixed(module: Any, decision: Any, collectives: bool, x: torch.Tensor) -> Any:
    """`module(x)` (a TPBlock, or a PlannedTPBlock or WholePlannedTPBlock run with
    `decision`) with its collectives on or off for this call."""
    if decision is not None:
        module.decision = decision
    module.collectives = collectives
    try:
        return module(x)
    finally:
        module.collectives = True


class _Fixed(torch.nn.Module):
    """`_call_fixed` as a module: the form a CUDA graph (GraphedTP) records once."""

    def __init__(self, module: torch.nn.Module, decision: Any, collectives: bool):
        super().__init__()
        self.module, self.decision, self.collectives = module, decision, collectives

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _call_fixed(self.module, self.decision, self.collectives, x)


def tp_row(a: argparse.Namespace, shape, rows, timeout_s: float) -> dict[str, Any]:
    ar_model = all_reduce_model(rows, a.backend, a.world_size)
    return run_ranks(
        a.world_size,
        "benchmarks.distributed_gpu:tp_rank",
        (list(shape), a.dtype, a.tp_reps, a.compile, ar_model, [1, 2, 4], a.whole),
        timeout_s=timeout_s,
        backend=a.backend,
    )


# ---- dp -------------------------------------------------------------------------------
def dp_row(a: argparse.Namespace, timeout_s: float) -> dict[str, Any]:
    import zoo
    from benchmarks.dp_bucket import variant_predictions
    from learned_cost.analytical import AnalyticalModel
    from planner.distributed.dp import DDP_BUCKET_BYTES, backward_steps, step_model_for_backend
    from planner.hardware import get_spec
    from planner.ir.capture import capture
    from profiling.commbench import measure_ddp
    from search.bucket_search import search_bucket_size

    d, hid, layers, batch = a.dp_dims
    caps = [float(c) for c in a.dp_caps.split(",")]
    if float(DDP_BUCKET_BYTES // MB) not in caps:
        caps.append(float(DDP_BUCKET_BYTES // MB))
    sizes = [1 << k for k in (range(12, 23, 2) if a.quick else range(12, 29, 2))]
    m = measure_ddp(
        a.world_size,
        d,
        hid,
        layers,
        batch,
        caps,
        a.dp_reps,
        sizes,
        a.backend,
        min(timeout_s, 240.0),
    )
    fits = fit_alpha_beta([(bb, t) for bb, t in m["all_reduce"]], 3 if a.backend == "nccl" else 2)
    module, inputs = zoo.get("mlp").build({"B": batch, "D": d, "HID": hid, "L": layers})
    module.train()
    graph = capture(module, inputs)
    spec = get_spec("h100" if a.device == "cuda" else "cpu")
    model = AnalyticalModel(spec)
    op_s = [model.group_cost(graph, frozenset((n.index,))).latency_s for n in graph.nodes]
    steps = backward_steps(graph, lambda i: op_s[i])
    bwd = max(m["fwd_bwd_s"] - m["fwd_s"], 0.0)
    total = sum(st.duration_s for st in steps)
    scale = bwd / total if total else 0.0
    steps = [type(st)(st.name, st.duration_s * scale, st.grad_bytes) for st in steps]
    grid = [int(c * MB) for c in caps]
    # the step model the planner picks for this backend on these ranks (NCCL on GPUs:
    # two streams; gloo on CPU ranks: serial)
    step_model = step_model_for_backend(a.backend, "gpu" if a.device == "cuda" else "cpu")
    choice = search_bucket_size(
        steps, lambda n: predict_s(fits, n), forward_s=m["fwd_s"], grid=grid, step_model=step_model
    )
    free = search_bucket_size(
        steps, lambda n: predict_s(fits, n), forward_s=m["fwd_s"], step_model=step_model
    )
    table = [
        {
            "bucket_mb": c,
            "predicted_s": pred,
            "measured_s": m["ddp_s"][str(c)],
            **variant_predictions(steps, int(c * MB), lambda n: predict_s(fits, n), m),
        }
        for (_, pred), c in zip(choice.table, caps, strict=True)
    ]
    chosen = next(c for c in caps if int(c * MB) == choice.bucket_bytes)
    return {
        "dims": {"D": d, "HID": hid, "L": layers, "B": batch},
        "grad_bytes": sum(bb for st in steps for bb in st.grad_bytes),
        "fwd_s": m["fwd_s"],
        "fwd_bwd_s": m["fwd_bwd_s"],
        "all_reduce_fits": [f.__dict__ for f in fits],
        "table": table,
        "step_model": step_model.name,
        "searched_mb": chosen,
        "searched_unrestricted_mb": free.bucket_bytes / MB,
        "measured_searched_s": m["ddp_s"][str(chosen)],
        "measured_ddp_default_s": m["ddp_s"][str(float(DDP_BUCKET_BYTES // MB))],
        "predicted_searched_s": choice.predicted_s,
        "predicted_ddp_default_s": choice.ddp_default_predicted_s,
    }


# ---- the table ----------------------------------------------------------------------
def _cell(text: str, n: int = 80) -> str:
    """An error message fit for one markdown table cell."""
    return " ".join(str(text).replace("|", "/").split())[:n]


def _us(s: float | None) -> str:
    return "-" if s is None or (isinstance(s, float) and math.isnan(s)) else f"{s * 1e6:.1f}"


def _timed(t: dict[str, Any], name: str) -> str:
    v = t.get(name)
    if not v:
        return "-"
    return f"{v['median_s'] * 1e6:.1f} ± {(v['p75_s'] - v['p25_s']) / 2 * 1e6:.1f}"


def _ratio(t: dict[str, Any], a: str, b: str) -> str:
    if a in t and b in t and t[b]["median_s"] > 0:
        return f"{t[a]['median_s'] / t[b]['median_s']:.3f}"
    return "-"


def _exposed(t: dict[str, Any], name: str) -> float | None:
    """Variant `name`'s median less its T_comp's (None unless both were timed)."""
    if name in t and f"{name} T_comp" in t:
        return t[name]["median_s"] - t[f"{name} T_comp"]["median_s"]
    return None


def _dynamo_lines(tp: list[dict[str, Any]]) -> list[str]:
    """What dynamo compiled per variant (rows that recorded it): graphs and graph breaks."""
    rows = [r for r in tp if r.get("ok") and r.get("dynamo")]
    if not rows:
        return []
    out = ["", "Graphs dynamo compiled (and graph breaks) per compiled variant:", ""]
    for r in rows:
        parts = []
        for name, c in r["dynamo"].items():
            breaks = sum(c["breaks"].values())
            why = f": {_cell('; '.join(c['breaks']), 160)}" if breaks else ""
            parts.append(f"{name} {c['graphs']} graph(s), {breaks} break(s){why}")
        out.append(f"- {','.join(map(str, r['shape']))}: " + "; ".join(parts))
    return out


def _graphed_table(tp: list[dict[str, Any]]) -> list[str]:
    """The CUDA-graph executor's table (rows that measured it): the eager block and the
    planner's decision each replayed as one graph per call, against `reduce-overhead`
    (Inductor's CUDA graphs) and the default `torch.compile`."""
    rows = [r for r in tp if r.get("ok") and "chosen_graphed" in r]
    if not rows:
        return []
    out = [
        "",
        "With CUDA graphs (every variant below replays one graph per call, collectives "
        "recorded in it; `reduce-overhead` is Inductor's own CUDA graphs):",
        "",
        "| B,S,D,H | eager graphed | reduce-overhead | planned graphed (decision) "
        "| planned graphed / eager graphed | / reduce-overhead | / compile "
        "| exposed comm eager graphed / planned graphed | predicted planned total / exposed | outputs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t, dec = r["timing"], r["chosen_graphed"]
        pl = f"planned graphed {dec}"
        pred = next(p for p in r["predicted_graphed"] if p["decision"] == dec)

        names = ("eager graphed", "reduce-overhead", pl)
        checks = [r["checks"][n] for n in names if n in r["checks"]]
        ok = bool(checks) and all(c.get("ok") for c in checks)
        worst = max((c.get("max_rel_err", float("inf")) for c in checks), default=0.0)
        errors = "; ".join(
            f"{n}: {_cell(r['checks'][n].get('error') or r.get('timing_errors', {}).get(n, ''), 60)}"
            for n in names
            if n not in t and n in r["checks"]
        )
        out.append(
            f"| {','.join(map(str, r['shape']))} | {_timed(t, 'eager graphed')} | "
            f"{_timed(t, 'reduce-overhead')} | {_timed(t, pl)} ({dec}) | "
            f"{_ratio(t, pl, 'eager graphed')} | {_ratio(t, pl, 'reduce-overhead')} | "
            f"{_ratio(t, pl, 'compile')} | {_us(_exposed(t, 'eager graphed'))} / {_us(_exposed(t, pl))} | "
            f"{_us(pred['total_s'])} / {_us(pred['exposed_comm_s'])} | "
            f"{'ok' if ok else 'MISMATCH'} (worst {worst:.1e}){' ' + errors if errors else ''} |"
        )
    return out


def markdown(rows: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [f"# Distributed plans measured: {meta}", ""]
    comm = [r for k, r in rows.items() if k.startswith("comm:")]
    if comm:
        trained = {int(b) for r in comm for b, _ in r.get("train", [])}
        grid = (
            "powers of two"
            if all(b & (b - 1) == 0 for b in trained)
            else "powers of two and 1.25x, 1.75x each"
        )
        out += [
            f"## α-β per collective (fitted on {grid}, held out at 1.5x)",
            "",
            "| collective | size range (bytes) | α_c µs | B_c GB/s | held-out median error | held-out worst error | held-out sizes within 10% |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in comm:
            if not r.get("ok"):
                out.append(f"| {r['key'][5:]} | error: {_cell(r.get('error', ''))} | | | | | |")
                continue
            ranges = "; ".join(
                f"[{f['lo_bytes']}, {'inf' if f['hi_bytes'] >= 1 << 60 else f['hi_bytes']})"
                + (" bridge" if f.get("bridge") else "")
                for f in r["fits"]
            )
            alphas = "; ".join(f"{f['alpha_s'] * 1e6:.2f}" for f in r["fits"])
            bws = "; ".join(
                f"{1 / f['beta_s_per_byte'] / 1e9:.1f}" if f["beta_s_per_byte"] > 0 else "—"
                for f in r["fits"]
            )
            within = sum(h["rel_err"] <= 0.10 for h in r["heldout"])
            out.append(
                f"| {r['collective']} | {ranges} | {alphas} | {bws} | "
                f"{r['heldout_median_rel_err']:.1%} | {r['heldout_max_rel_err']:.1%} | "
                f"{within} of {len(r['heldout'])} |"
            )
        out.append("")
    tp = [r for k, r in rows.items() if k.startswith("tp:")]
    if tp:
        # the whole-graph columns only where some row measured them (older runs did not)
        whole = any(
            n.startswith("planned whole ")
            for r in tp
            for n in (*r.get("checks", {}), *r.get("timing", {}))
        )
        whole_head = (
            "| planned whole | planned whole / eager | planned whole / compile "
            "| T_comp planned whole | exposed planned whole "
            if whole
            else ""
        )
        ncols = 12 + 5 * whole
        out += [
            "## Tensor-parallel block (median µs ± half the interquartile range)",
            "",
            "| B,S,D,H | eager | compile | planned (decision) | planned/eager | planned/compile "
            "| T_comp eager / planned | T_comm | exposed eager / planned | predicted planned total / T_comp / T_comm / exposed "
            f"| predicted eager total / exposed {whole_head}| outputs |",
            "|---" * ncols + "|",
        ]
        for r in tp:
            shape = ",".join(map(str, r.get("shape", [])))
            if not r.get("ok"):
                out.append(
                    f"| {r['key'][3:]} | error: {_cell(r.get('error', ''))} |" + " |" * (ncols - 2)
                )
                continue
            t, dec = r["timing"], r["chosen"]
            pl = f"planned {dec}"
            pred = next(p for p in r["predicted"] if p["decision"] == dec)
            pe = r.get("predicted_eager", {})
            k = next(p["chunks"] for p in r["predicted"] if p["decision"] == dec)
            exp_e, exp_p = _exposed(t, "eager"), _exposed(t, pl)
            ok = all(c.get("ok") for c in r["checks"].values())
            worst = max(
                (c.get("max_rel_err", float("inf")) for c in r["checks"].values()), default=0.0
            )
            wh = f"planned whole {dec}"
            whole_cells = (
                f"{_timed(t, wh)} | {_ratio(t, wh, 'eager')} | {_ratio(t, wh, 'compile')} | "
                f"{_timed(t, wh + ' T_comp')} | {_us(_exposed(t, wh))} | "
                if whole
                else ""
            )
            out.append(
                f"| {shape} | {_timed(t, 'eager')} | {_timed(t, 'compile')} | "
                f"{_timed(t, pl)} ({dec}) | {_ratio(t, pl, 'eager')} | {_ratio(t, pl, 'compile')} | "
                f"{_timed(t, 'eager T_comp')} / {_timed(t, pl + ' T_comp')} | "
                f"{_timed(t, 'T_comm k=1')} (k=1), {_timed(t, f'T_comm k={k}')} (k={k}) | "
                f"{_us(exp_e)} / {_us(exp_p)} | "
                f"{_us(pred['total_s'])} / {_us(pred['t_comp_s'])} / {_us(pred['t_comm_s'])} / "
                f"{_us(pred['exposed_comm_s'])} | {_us(pe.get('total_s'))} / {_us(pe.get('exposed_comm_s'))} | "
                f"{whole_cells}{'ok' if ok else 'MISMATCH'} (worst {worst:.1e}) |"
            )
        out += _dynamo_lines(tp)
        out += _graphed_table(tp)
        out += ["", "Every decision the planner priced, predicted against measured (µs):", ""]
        out += [
            "| B,S,D,H | decision | predicted total | measured total | predicted T_comp | measured T_comp "
            + ("| measured whole total | measured whole T_comp " if whole else "")
            + "|",
            "|---" * (6 + 2 * whole) + "|",
        ]
        for r in tp:
            if not r.get("ok"):
                continue
            t = r["timing"]
            for p in r["predicted"]:
                name = f"planned {p['decision']}"
                mark = " (chosen)" if p["decision"] == r["chosen"] else ""
                wh = f"planned whole {p['decision']}"
                whole_cells = f" {_timed(t, wh)} | {_timed(t, wh + ' T_comp')} |" if whole else ""
                out.append(
                    f"| {','.join(map(str, r['shape']))} | {p['decision']}{mark} | {_us(p['total_s'])} | "
                    f"{_timed(t, name)} | {_us(p['t_comp_s'])} | {_timed(t, name + ' T_comp')} |"
                    + whole_cells
                )
        out.append("")
    dp = [r for k, r in rows.items() if k.startswith("dp:")]
    for r in dp:
        out += ["## Data-parallel step (DDP), per gradient bucket cap", ""]
        if not r.get("ok"):
            out += [f"error: {_cell(r.get('error', ''), 200)}", ""]
            continue
        dims = r["dims"]
        out.append(
            f"zoo:mlp D={dims['D']} HID={dims['HID']} L={dims['L']} B={dims['B']}, "
            f"{r['grad_bytes'] / MB:.1f} MiB of gradients; forward {_us(r['fwd_s'])} µs, "
            f"forward+backward without communication {_us(r['fwd_bwd_s'])} µs."
        )
        model = f" ({r['step_model']})" if r.get("step_model") else ""
        out += ["", f"| bucket MiB | predicted{model} ms | measured ms |", "|---|---|---|"]
        for row in r["table"]:
            tag = " (searched)" if row["bucket_mb"] == r["searched_mb"] else ""
            tag += " (DDP default)" if row["bucket_mb"] == 25.0 else ""
            out.append(
                f"| {row['bucket_mb']:g}{tag} | {row['predicted_s'] * 1e3:.3f} | {row['measured_s'] * 1e3:.3f} |"
            )
        out += [
            "",
            f"Searched {r['searched_mb']:g} MiB (over the measured caps; {r['searched_unrestricted_mb']:g} MiB "
            f"over all powers of two): measured {r['measured_searched_s'] * 1e3:.3f} ms against "
            f"{r['measured_ddp_default_s'] * 1e3:.3f} ms at DDP's 25 MiB "
            f"(ratio {r['measured_searched_s'] / r['measured_ddp_default_s']:.3f}).",
            "",
        ]
    return "\n".join(out) + "\n"


# ---- main ---------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for results.jsonl/.md")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--parts", default="comm,tp,dp", help="any of comm,tp,dp")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and sizes (smoke test)")
    ap.add_argument("--time-limit-s", type=float, default=480.0)
    ap.add_argument(
        "--dtype", choices=sorted(TOL), default=None, help="bfloat16 on CUDA, float32 on the CPU"
    )
    ap.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile variants and compiled regions (default: on CUDA only)",
    )
    ap.add_argument(
        "--whole",
        choices=("all", "chosen", "off"),
        default="all",
        help="time the whole-graph planned block for every decision, the chosen one, or not "
        "(with --compile)",
    )
    ap.add_argument("--shapes", default=None, help="B,S,D,H;B,S,D,H;... (default: the anchors)")
    ap.add_argument("--comm-reps", type=int, default=None)
    ap.add_argument("--tp-reps", type=int, default=None)
    ap.add_argument("--dp-reps", type=int, default=None)
    ap.add_argument("--dp-dims", default=None, help="D,HID,L,B of zoo:mlp for the DDP step")
    ap.add_argument("--dp-caps", default=None, help="bucket caps in MiB, comma-separated")
    ap.add_argument("--table-only", action="store_true", help="rewrite results.md from the jsonl")
    a = ap.parse_args(argv)
    if (a.backend == "nccl") != (a.device == "cuda"):
        ap.error(
            "NCCL runs on CUDA devices and gloo here on the CPU: --backend nccl --device cuda, or --backend gloo --device cpu"
        )
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    a.compile = a.device == "cuda" if a.compile is None else a.compile
    try:
        a.shapes = (
            [tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";")]
            if a.shapes
            else (QUICK_ANCHORS if a.quick else ANCHORS)
        )
        if any(len(s) != 4 for s in a.shapes):
            raise ValueError("each shape is B,S,D,H")
        dims = a.dp_dims or ("64,256,2,16" if a.quick else "1024,4096,4,512")
        a.dp_dims = tuple(int(v) for v in dims.split(","))
        if len(a.dp_dims) != 4:
            raise ValueError("--dp-dims is D,HID,L,B")
    except ValueError as e:
        ap.error(str(e))
    a.dp_caps = a.dp_caps or ("0.0625,0.25,1,25" if a.quick else "1,4,16,25,64,128,256")
    a.comm_reps = a.comm_reps or (5 if a.quick else 30)
    a.tp_reps = a.tp_reps or (5 if a.quick else 50)
    a.dp_reps = a.dp_reps or (3 if a.quick else 20)
    a.parts = [p for p in a.parts.split(",") if p]
    bad = set(a.parts) - {"comm", "tp", "dp"}
    if bad:
        ap.error(f"unknown parts {sorted(bad)}; known: comm, tp, dp")
    return a


def run_jobs(
    path: Path,
    jobs: list[tuple[str, Any]],
    meta: dict[str, Any],
    deadline: float,
    report: Any = None,
) -> None:
    """Run each (key, job) not yet recorded as ok in `path`, while more than 15 s remain
    before `deadline` (time.monotonic()); `job(seconds_left)` returns the row's fields. Each
    row (key, `meta`, ok or the error and traceback, elapsed_s) is appended as it ends, so
    a call cut short resumes where it stopped; `report(row)` may print more about it."""
    done = load_rows(path)
    for key, job in jobs:
        if done.get(key, {}).get("ok"):
            print(f"[skip] {key}: already in {path}", flush=True)
            continue
        left = deadline - time.monotonic()
        if left < 15:
            print(f"[stop] time limit reached before {key}", flush=True)
            break
        print(f"[run ] {key} ({left:.0f} s left)", flush=True)
        t0 = time.monotonic()
        row: dict[str, Any] = {"key": key, **meta}
        try:
            row.update(job(max(10.0, left - 5)))
            row["ok"] = True
        except Exception as e:
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {e}"[-8000:]
            row["traceback"] = traceback.format_exc()[-4000:]
        row["elapsed_s"] = time.monotonic() - t0
        append_row(path, row)
        print(
            f"[{'done' if row['ok'] else 'FAIL'}] {key} in {row['elapsed_s']:.1f} s"
            + ("" if row["ok"] else f": {row['error'][:500]}"),
            flush=True,
        )
        if report is not None and row["ok"]:
            report(row)


def _report_tp(row: dict[str, Any]) -> None:
    if row["key"].startswith("tp:"):
        t = row["timing"]
        print(
            f"       chosen {row['chosen']}; "
            + ", ".join(f"{n} {v['median_s'] * 1e6:.1f}us" for n, v in t.items() if "T_" not in n),
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "results.jsonl"
    meta = {
        "backend": a.backend,
        "world_size": a.world_size,
        "device": torch.cuda.get_device_name(0)
        if a.device == "cuda" and torch.cuda.is_available()
        else "cpu",
        "torch": torch.__version__,
        "dtype": a.dtype,
        "compile": a.compile,
    }
    if a.table_only:  # the run's settings as its rows recorded them
        (a.out / "results.md").write_text(render_jsonl(path))
        print(f"wrote {a.out / 'results.md'}")
        return 0
    deadline = time.monotonic() + a.time_limit_s
    jobs: list[tuple[str, Any]] = []
    if "comm" in a.parts:
        jobs += [(f"comm:{c}", lambda t, c=c: comm_row(a, c, min(t, 150.0))) for c in COLLECTIVES]
    if "dp" in a.parts:
        key = f"dp:{'x'.join(map(str, a.dp_dims))}:{a.backend}"
        jobs.append((key, lambda t: dp_row(a, t)))
    if "tp" in a.parts:
        for shape in a.shapes:
            key = f"tp:{'x'.join(map(str, shape))}:{a.dtype}:{a.backend}"
            jobs.append(
                (key, lambda t, shape=shape: tp_row(a, shape, load_rows(path), min(t, 300.0)))
            )
    run_jobs(path, jobs, meta, deadline, report=_report_tp)
    md = markdown(load_rows(path), meta)
    (a.out / "results.md").write_text(md)
    print(md)
    print(f"wrote {a.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
