"""Realize time of a real model's plan with and without one compile per distinct group.

    python benchmarks/shared_compiles.py [--size tiny --layers 4 --B 2 --S 32]
        [--dynamic 16..64] [--no-fx-cache] [--device cpu] [--repeats 2]
        [--out benchmarks/results/shared_compiles_cpu.json]
    python benchmarks/shared_compiles.py --from-json benchmarks/results/shared_compiles_cpu.json

Hugging Face GPT-2 (benchmarks/models/gpt2.py's config at `--size`, with `--layers`
layers) on `--device`, exported at one shape (or, as the runtime exports a bucket,
dynamo's graph with S symbolic over `--dynamic`), planned by the priority strategy on the
analytical cost model; then `realize(captured, plan)` (Inductor, verified against eager)
is timed with `share_compiles=False` (every group compiled) and `True`
(planner.realize.compilers). Each realization runs in a fresh process with an empty
Inductor cache directory, so neither reuses the other's compiled kernels; the two
settings alternate, `--repeats` times each. Within one process Inductor's own caches may
still serve a layer compiled a second time from the first layer's entries;
`--no-fx-cache` turns its FX graph cache off (TORCHINDUCTOR_FX_GRAPH_CACHE=0).

A row counts the calls of `torch._inductor.standalone_compile` and the seconds of each,
the realize call's wall seconds, the groups compiled and sharing, and the largest
difference of the logits from the exported program run as it is, on the example input.
"shared groups' compile s" sums, per run, the compile seconds of the groups that a run
with sharing on took from an earlier group: the seconds sharing saves, measured where it
is off. The rows are saved as JSON; the markdown table is rendered from them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one(size: str, layers: int, B: int, S: int, dynamic: str, device: str, share: bool) -> dict:
    """One realization in this process (the child side of `run`)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from benchmarks.models.gpt2 import SIZES
    from learned_cost.analytical import AnalyticalModel
    from planner.hardware import get_spec, local_device_name
    from planner.ir.capture import export_model
    from planner.objective import Objective
    from planner.realize.realizer import realize
    from search.strategies import get_strategy

    torch.manual_seed(0)
    cfg = GPT2Config(**{**SIZES[size], "n_layer": layers})
    model = GPT2LMHeadModel(cfg).eval().to(device)
    ids = torch.randint(0, cfg.vocab_size, (B, S), device=device)
    if dynamic:
        from planner.ir.capture_dynamic import export_dynamic
        from planner.runtime.graph import trace_as_served

        # as the runtime backend exports a bucket: dynamo's graph, S symbolic
        lo, hi = (int(x) for x in dynamic.split(".."))
        lifted, user = trace_as_served(model, (ids,))
        dims = {i: {1: (lo, hi)} for i, t in enumerate(user) if tuple(t.shape) == (B, S)}
        captured = export_dynamic(lifted.module, user, dims)
        ids_call = user
    else:
        captured = export_model(model, (ids,))
        ids_call = (ids,)
    obj = Objective(AnalyticalModel(get_spec(local_device_name(device))))
    res = get_strategy("priority").plan(captured.graph, obj)
    plan = obj.make_plan(
        res.partition,
        res.evaluation,
        strategy="priority",
        device=local_device_name(device),
        dtype="float32",
    )
    compiles: list[float] = []
    real = torch._inductor.standalone_compile

    def counted(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            compiles.append(time.perf_counter() - t0)

    torch._inductor.standalone_compile = counted
    t0 = time.perf_counter()
    rp = realize(captured, plan, share_compiles=share)
    realize_s = time.perf_counter() - t0
    with torch.no_grad():  # against the exported program run as it is
        leaves = torch.utils._pytree.tree_leaves
        want = [t for t in leaves(captured.program.module()(*ids_call)) if torch.is_tensor(t)]
        got = [t for t in leaves(rp(*ids_call)) if torch.is_tensor(t)]
    diff = float((got[0] - want[0]).abs().max())  # the logits
    return {
        "model": f"gpt2 {size}, {layers} layers, B={B} S={S}"
        + (f", S symbolic over {dynamic}" if dynamic else ""),
        "fx_graph_cache": os.environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE", "default"),
        "share_compiles": share,
        "realize_s": realize_s,
        "compiles": len(compiles),
        "standalone_compile_s": sum(compiles),
        "each_compile_s": [round(x, 3) for x in compiles],
        # per compiled group: (index, compile seconds, the group whose callable it shares)
        "group_compile_s": [
            (g.index, round(g.compile_s, 4), g.reuses) for g in rp.groups if g.compiled
        ],
        "groups": len(rp.groups),
        "compiled_groups": sum(g.compiled for g in rp.groups),
        "sharing_groups": sum(g.reuses is not None for g in rp.groups),
        "fallbacks": len(rp.fallbacks),
        "max_abs_diff": diff,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device != "cpu" else platform.machine(),
    }


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    for rep in range(args.repeats):
        for share in (False, True) if rep % 2 == 0 else (True, False):
            with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
                if args.no_fx_cache:
                    env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
                cmd = [sys.executable, __file__, "--child", "--size", args.size]
                cmd += ["--layers", str(args.layers), "--B", str(args.B), "--S", str(args.S)]
                cmd += ["--dynamic", args.dynamic] if args.dynamic else []
                cmd += ["--device", args.device]
                cmd += ["--share"] if share else []
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"the realization failed:\n{out.stderr[-3000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["repeat"] = rep
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def render(rows: list[dict], about: dict, title: bool = True) -> str:
    """The markdown table of a run's rows (under a title line unless `title` is False)."""
    dev = rows[0].get("device", "")
    dev = f", {dev}" if dev and dev not in about["machine"] else ""
    head = [f"# One compile per distinct group: realize time, {rows[0]['model']}", ""]
    lines = [
        *(head if title else [f"{rows[0]['model']}:", ""]),
        f"{about['machine']}{dev}; torch {rows[0]['torch']}; each run a fresh process with an "
        f"empty Inductor cache directory, FX graph cache {rows[0]['fx_graph_cache']}. Generated by `python benchmarks/shared_compiles.py "
        f"{about['args']}`.",
        "",
        "| share_compiles | realize s (median) | runs | standalone_compile calls | "
        "their s (median) | first call s | shared groups' compile s (median) | groups | compiled | sharing | fallbacks | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    # the groups a run with sharing on did not compile: what they cost where it was off
    shared = {
        g for r in rows if r["share_compiles"] for g, _, k in r["group_compile_s"] if k is not None
    }

    def shared_s(r: dict) -> float:
        return sum(s for g, s, _ in r["group_compile_s"] if g in shared)

    for share in (False, True):
        rs = [r for r in rows if r["share_compiles"] is share]
        if not rs:
            continue
        last = rs[-1]
        realize = ", ".join(f"{r['realize_s']:.1f}" for r in rs)
        lines.append(
            f"| {'on' if share else 'off'} | {statistics.median(r['realize_s'] for r in rs):.1f} "
            f"| {realize} | {last['compiles']} "
            f"| {statistics.median(r['standalone_compile_s'] for r in rs):.1f} "
            f"| {statistics.median(r['each_compile_s'][0] for r in rs):.1f} "
            f"| {statistics.median(shared_s(r) for r in rs):.2f} "
            f"| {last['groups']} | {last['compiled_groups']} | {last['sharing_groups']} "
            f"| {last['fallbacks']} | {max(r['max_abs_diff'] for r in rs):.2e} |"
        )
    return "\n".join(lines) + "\n"


def render_json(path: str | Path, title: bool = True) -> str:
    """`render` of a run saved by `main`."""
    saved = json.loads(Path(path).read_text())
    return render(saved["rows"], saved["about"], title)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=("tiny", "small"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--S", type=int, default=32)
    ap.add_argument("--dynamic", default="", help="S symbolic over LO..HI")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--no-fx-cache", action="store_true", help="Inductor's FX graph cache off")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/shared_compiles_cpu.json"))
    ap.add_argument("--from-json", default=None, help="render a saved run's table")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--share", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row = one(args.size, args.layers, args.B, args.S, args.dynamic, args.device, args.share)
        print(json.dumps(row))
        return 0
    if args.from_json:
        print(render_json(args.from_json), end="")
        return 0
    flags = f"--size {args.size} --layers {args.layers} --B {args.B} --S {args.S}"
    flags += f" --dynamic {args.dynamic}" if args.dynamic else ""
    flags += " --no-fx-cache" if args.no_fx_cache else ""
    flags += f" --device {args.device}" if args.device != "cpu" else ""
    about = {
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores (shared)"
        if args.device == "cpu"
        else f"{args.device} ({os.cpu_count()} CPU cores)",
        "args": f"{flags} --repeats {args.repeats} --out {args.out}",
    }
    rows = run(args)
    out = Path(args.out)
    out.write_text(json.dumps({"about": about, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(rows, about))
    print(render(rows, about), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
