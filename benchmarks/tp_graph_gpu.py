"""Tensor-parallel decisions on a captured DTensor program, measured on N local devices
(NCCL on GPUs, or gloo on the CPU as a smoke test):

    python3 benchmarks/tp_graph_gpu.py --out DIR [--world-size 2] [--backend nccl]
        [--device cuda] [--shapes "B,S,D,H;..."] [--dtype bfloat16] [--reps 30]
        [--no-compile] [--time-limit-s 480] [--table-only]
    python3 benchmarks/tp_graph_gpu.py --backend gloo --device cpu --quick --out DIR

Per shape, on every rank: `parallel_models.LlamaStyleBlock` (hidden = 8D/3 rounded up to
256) split with `llama_tp_plan()` by `parallelize_module` on a device mesh, captured as the
rank's program (planner.ir.capture_dtensor), its column -> row sites found and every
decision priced (`search_tp_graph`, compute from the analytical model of the device, the
all-reduce from the link table); then timed interleaved: the DTensor model itself, the
captured program unplanned, and the program rewritten by each decision
(planner.distributed.tp_graph.tp_program, epilogue compiled by Inductor unless
`--no-compile`), each output against the unplanned program's. Also per row: the
TP block's gradients on this backend (unplanned and the planned k=2 decision) against the
block run on one rank, float32. Rows go to DIR/tp_graph.jsonl as they finish (a row
already there without an error is skipped on a rerun); DIR/tp_graph.md is the table.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from benchmarks.distributed_gpu import all_reduce_fn, all_reduce_model, load_rows, run_jobs
from learned_cost.analytical import AnalyticalModel
from planner.distributed import parallel_models as pm
from planner.distributed.parallel_models import TPBlock
from planner.distributed.tp_graph import graph_decisions, tp_program
from planner.distributed.tp_plan import PlannedTPBlock, TPDecision
from planner.ir.capture import export_model
from profiling.commbench import rank_device, run_ranks
from profiling.tpbench import interleaved
from search.tp_search import search_tp_graph

ANCHORS = [(1, 128, 1024, 16), (8, 512, 1024, 16), (4, 2048, 2048, 16), (2, 4096, 4096, 32)]
QUICK_ANCHORS = [(1, 16, 64, 4)]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def hidden_of(d: int) -> int:
    return 256 * math.ceil(8 * d / 3 / 256)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).abs().max() / ref.float().abs().max())


def gradient_check(rank: int, world: int, device: torch.device) -> dict[str, float]:
    """Worst gradient error (relative to the largest gradient) of the unplanned and the
    planned (k=2) TP block against the block on one rank, float32, small shape."""
    torch.manual_seed(0)
    full = TPBlock(64, 4, 1, None)
    full.collectives = False
    with torch.no_grad():
        for p in full.parameters():
            p.normal_(0.0, 0.2)
    full = full.to(device)
    x = torch.randn(2, 16, 64, device=device)
    probe = torch.randn(2, 16, 64, device=device)

    def grads(m: torch.nn.Module, params) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        xi = x.clone().requires_grad_()
        (m(xi) * probe).sum().backward()
        return xi.grad, {n: p.grad for n, p in params}

    want_x, want = grads(full, full.named_parameters())
    scale = max(float(g.abs().max()) for g in [want_x, *want.values()])
    out = {}
    for name, dec in (("unplanned", None), ("planned k=2", TPDecision(2, False))):
        shard = TPBlock.shard_of(full, rank, world, dist.group.WORLD).to(device)
        run = shard if dec is None else PlannedTPBlock(shard, dec)
        got_x, got = grads(run, shard.named_parameters())
        sl = shard.shard_slices(rank)
        errs = [float((got_x - want_x).abs().max())]
        errs += [float((g - want[n][sl[n]]).abs().max()) for n, g in got.items()]
        out[name] = max(errs) / scale
    return out


def tp_graph_rank(
    rank: int, world: int, shape: list[int], dtype: str, reps: int, compile_: bool, ar: dict
) -> dict[str, Any]:
    """One shape's row (see the module docstring), rank 0's view; timings max over ranks."""
    b, s, d, h = shape
    device = rank_device(rank)
    dt = DTYPES[dtype]
    torch.manual_seed(0)
    full = pm.LlamaStyleBlock(d, h, hidden_of(d))
    with torch.no_grad():
        for p in full.parameters():
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    full = full.to(device=device, dtype=dt)
    mesh = init_device_mesh(device.type, (world,))
    model = parallelize_module(copy.deepcopy(full), mesh, pm.llama_tp_plan())
    x = torch.randn(b, s, d, device=device, dtype=dt)
    with torch.no_grad():
        captured = export_model(model, (x,))
        gm = captured.program.module()
        spec_name = "cpu"
        if device.type == "cuda":
            spec_name = "h200" if "H200" in torch.cuda.get_device_name(device) else "h100"
        plan = search_tp_graph(captured, all_reduce_fn(ar, world), AnalyticalModel(spec_name))
        ref = gm(x)[0]
        variants = {"dtensor": lambda: model(x), "unplanned": lambda: gm(x)}
        checks = {"dtensor": _rel(model(x), ref)}
        decisions = graph_decisions(list(plan.sites))
        if plan.best.decision not in decisions:  # chosen per site: timed with the rest
            decisions.append(plan.best.decision)
        for dec in decisions:
            prog = tp_program(gm, dec, list(plan.sites), compile_epilogue=compile_)
            checks[f"planned {dec.label}"] = _rel(prog(x)[0], ref)
            variants[f"planned {dec.label}"] = lambda prog=prog: prog(x)
        timing, errors = interleaved(variants, device, reps)
    return {
        "sites": [
            {"gemm": st.gemm, "column": len(st.column), "epilogue": len(st.epilogue)}
            for st in plan.sites
        ],
        "chosen": plan.best.decision.label,
        "predicted": {p.decision.label: p.row() for p in plan.table},
        "all_reduce_model": ar.get("source", ""),
        "checks": checks,
        "timing": timing,
        "timing_errors": errors,
        "gradients": gradient_check(rank, world, device),
    }


# ---- table ----------------------------------------------------------------------------
def _us(t: dict[str, Any], name: str) -> str:
    v = t.get(name)
    return f"{v['median_s'] * 1e6:.1f}" if v else "-"


def _cell(label: str) -> str:
    """A per-site decision label ("k=2 fused | k=1") fit for a table cell."""
    return label.replace("|", "\\|")


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| shape B,S,D,H | sites | chosen | DTensor µs | unplanned µs | planned µs | "
        "planned / unplanned | best measured | predicted chosen µs | max output err | "
        "grad err (unplanned, k=2) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in rows.items():
        shape = key.split(":")[1].replace("x", ",")
        if not r.get("ok"):
            lines.append(f"| {shape} | failed: {str(r.get('error', ''))[:120]} |" + " |" * 9)
            continue
        t, chosen = r["timing"], f"planned {r['chosen']}"
        measured = {n: v["median_s"] for n, v in t.items() if n.startswith("planned")}
        best = min(measured, key=measured.__getitem__) if measured else "-"
        ratio = (
            f"{t[chosen]['median_s'] / t['unplanned']['median_s']:.2f}"
            if chosen in t and "unplanned" in t
            else "-"
        )
        pred = r["predicted"][r["chosen"]]["total_s"] * 1e6
        g = r["gradients"]
        best = best.removeprefix("planned ")
        lines.append(
            f"| {shape} | {len(r['sites'])} | {_cell(r['chosen'])} | {_us(t, 'dtensor')} | "
            f"{_us(t, 'unplanned')} | {_us(t, chosen)} | {ratio} | {_cell(best)} | "
            f"{pred:.1f} | {max(r['checks'].values()):.1e} | "
            f"{g['unplanned']:.1e}, {g['planned k=2']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--shapes", default="", help='"B,S,D,H;..." (default: the anchors)')
    ap.add_argument("--dtype", default="", help="default bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, few reps, no compile")
    ap.add_argument("--time-limit-s", type=float, default=480.0)
    ap.add_argument("--table-only", action="store_true")
    a = ap.parse_args(argv)
    if a.backend == "nccl" and (a.device != "cuda" or not torch.cuda.is_available()):
        ap.error("--backend nccl needs --device cuda and CUDA devices (use gloo on the CPU)")
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    if a.dtype not in DTYPES:
        ap.error(f"--dtype must be one of {sorted(DTYPES)}")
    if a.quick:
        a.reps, a.compile = min(a.reps, 3), False
    try:
        given = [tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";") if s]
    except ValueError:
        ap.error(f'--shapes must be "B,S,D,H;...", got {a.shapes!r}')
    if any(len(s) != 4 for s in given):
        ap.error(f'--shapes must be "B,S,D,H;...", got {a.shapes!r}')
    a.shapes = given or (QUICK_ANCHORS if a.quick else ANCHORS)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    path, table = a.out / "tp_graph.jsonl", a.out / "tp_graph.md"
    if not a.table_only:
        deadline = time.monotonic() + a.time_limit_s
        ar = all_reduce_model({}, a.backend, a.world_size)
        meta = {"backend": a.backend, "world_size": a.world_size, "torch": torch.__version__}
        meta["dtype"], meta["compile"] = a.dtype, a.compile
        jobs = [
            (
                f"tp-graph:{'x'.join(map(str, shape))}:{a.dtype}:{a.backend}",
                lambda t, shape=shape: run_ranks(
                    a.world_size,
                    "benchmarks.tp_graph_gpu:tp_graph_rank",
                    (list(shape), a.dtype, a.reps, a.compile, ar),
                    timeout_s=min(300.0, t),
                    backend=a.backend,
                ),
            )
            for shape in a.shapes
        ]
        run_jobs(path, jobs, meta, deadline)
    md = markdown(load_rows(path))
    table.write_text(md)
    print(md)
    print(f"wrote {table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
