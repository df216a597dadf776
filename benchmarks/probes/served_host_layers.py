"""Where a served call's host time goes, by layer, without a profiler's distortion.

    PYTHONPATH=. python benchmarks/probes/served_host_layers.py --cache plans.sqlite
    PYTHONPATH=. python benchmarks/probes/served_host_layers.py --quick      # a CPU check

A Hugging Face text model of the real-model suite (`--model`, GPT-2 by default:
benchmarks/models/gpt2.py) at one or more shapes, served by
`torch.compile(model, backend=fusion_planner_backend(cache), dynamic=True)` under each
`--tail-mb` setting (the output size from which `_GraphReplay` runs an output-only group
after the replay instead of copying its output out of the graph; 0 = as shipped) and by
`torch.compile(model, mode="reduce-overhead", dynamic=True)`, each on its own copy of the
model. After warm-up (each shape's CUDA graph recorded), the contenders are called in
rounds, one call each per round, the order rotated every round, so that a change of the
machine's pace in time falls on all of them alike; per contender, the median over
`--calls` rounds of: the whole call's host time (from the call until it returned), the
backend's graph call (`_PlannedGraph.__call__`), the realized plan's replay call
(`_GraphReplay.__call__`), the graph replay itself (`CUDAGraph.replay`), and the whole
call (synchronized), with host and whole call over reduce-overhead's. Layers are timed
with `time.perf_counter` wrappers around those methods (about a microsecond each), so
their figures are near the unprofiled ones.

Then, on the last replayed graph's own outputs, the host time of ways to hand them back
fresh: one `empty_like` per output and one `_foreach_copy_` (as before), and one `stack`
per group of same-shape contiguous outputs followed by `unbind` (as `_Handout` does). Prints Markdown.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.probes.served_host_profile import text_model  # noqa: E402
from planner.plans.cache import PlanCache  # noqa: E402
from planner.realize import cudagraphs  # noqa: E402
from planner.runtime import backend as backend_mod  # noqa: E402
from planner.runtime.backend import fusion_planner_backend  # noqa: E402

SPENT: dict[str, float] = defaultdict(float)  # layer -> seconds in the current call
LAST: dict[str, object] = {}  # the last _GraphReplay called


def _timed_method(cls: type, name: str, layer: str) -> None:
    """Wrap cls.name so each call adds its host time to SPENT[layer]."""
    inner = getattr(cls, name)

    def wrapper(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return inner(self, *a, **k)
        finally:
            SPENT[layer] += time.perf_counter() - t0
            if layer == "graph call":
                LAST["replay"] = self

    setattr(cls, name, wrapper)


LAYERS = ("backend call", "graph call", "replay")


def _install() -> None:
    _timed_method(backend_mod._PlannedGraph, "__call__", "backend call")
    _timed_method(cudagraphs._GraphReplay, "__call__", "graph call")
    _timed_method(torch.cuda.CUDAGraph, "replay", "replay")


def _interleaved(built, args, calls: int, sync) -> dict[str, dict[str, float]]:
    """Per contender, median µs per call of the host time, each layer's time and the whole
    call, over `calls` rounds of one call each, the order rotated every round."""
    rows: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name, _ in built}
    for i in range(calls):
        k = i % len(built)
        for name, fn in built[k:] + built[:k]:
            SPENT.clear()
            t0 = time.perf_counter()
            fn(*args)
            t1 = time.perf_counter()
            sync()
            r = rows[name]
            r["whole call"].append(time.perf_counter() - t0)
            r["host"].append(t1 - t0)
            for layer in LAYERS:
                r[layer].append(SPENT.get(layer, 0.0))
    return {name: {k: statistics.median(v) * 1e6 for k, v in r.items()} for name, r in rows.items()}


def _copy_methods(outs: list[torch.Tensor], calls: int, sync) -> dict[str, float]:
    """Host µs per call of handing `outs` back as fresh tensors, by method (median)."""

    def shipped():
        dst = [torch.empty_like(o) for o in outs]
        torch._foreach_copy_(dst, outs)
        return dst

    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, o in enumerate(outs):
        if o.is_contiguous():
            groups[(tuple(o.shape), o.dtype)].append(i)
    stacked = [ix for ix in groups.values() if len(ix) > 1]
    rest = [i for i in range(len(outs)) if not any(i in ix for ix in stacked)]

    def by_stack():
        res: list = [None] * len(outs)
        for ix in stacked:
            for i, t in zip(ix, torch.stack([outs[i] for i in ix]).unbind(0)):
                res[i] = t
        if rest:
            dst = [torch.empty_like(outs[i]) for i in rest]
            torch._foreach_copy_(dst, [outs[i] for i in rest])
            for i, t in zip(rest, dst):
                res[i] = t
        return res

    out = {}
    for name, f in (("empty_like + _foreach_copy_", shipped), ("stack + unbind", by_stack)):
        for _ in range(20):
            f()
        sync()
        host = []
        for _ in range(calls):
            t0 = time.perf_counter()
            got = f()
            host.append(time.perf_counter() - t0)
            sync()
        assert all(torch.equal(a, b) for a, b in zip(got, outs))
        out[name] = statistics.median(host) * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default="gpt2", help="a text model of benchmarks/models (gpt2, llama, ...)"
    )
    p.add_argument("--cache", default=None, help="a plan cache tuned for the model (else empty)")
    p.add_argument("--shapes", default="B=1,S=200", help="B=..,S=..[;B=..,S=..]")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument(
        "--tail-mb",
        default="0",
        help="comma-separated output sizes (MiB) from which an output-only group runs after "
        "the replay; 0 keeps the shipped setting, 'off' never does",
    )
    p.add_argument("--no-ro", action="store_true", help="leave reduce-overhead out")
    p.add_argument("--quick", action="store_true", help="the tiny model on this CPU")
    args = p.parse_args(argv)
    shapes = []
    for part in args.shapes.split(";"):
        dims = dict(kv.split("=") for kv in part.split(","))
        shapes.append((int(dims["B"]), int(dims["S"])))
    model, dev, cuda = text_model(*shapes[0], args.quick, args.model)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    inputs = {bs: (torch.randint(0, vocab, bs, generator=gen).to(dev),) for bs in shapes}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    _install()
    # every contender is its own cache entry of the same frames, and a batch size above 1
    # is another: raise dynamo's limit so none of them runs uncompiled past it
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
    shipped = cudagraphs._GraphReplay.TAIL_MIN_BYTES
    cache = PlanCache(args.cache) if args.cache else None
    variants: list[tuple[str, object]] = []
    for v in args.tail_mb.split(","):
        v = v.strip()
        if v == "0":
            variants.append((f"planner (tail from {shipped >> 20} MiB, as shipped)", shipped))
        elif v == "off":
            variants.append(("planner (no tail: every output copied)", 1 << 62))
        else:
            variants.append((f"planner (tail from {v} MiB)", int(float(v) * (1 << 20))))
    if cuda and not args.no_ro:
        variants.append(("reduce-overhead", None))
    print(f"# Served host time per call, by layer: {args.model} on {dev} ({torch.__version__})\n")
    print(
        f"{args.calls} rounds per shape, each contender called once per round, the order "
        "rotated every round (so a change of the machine's pace falls on every contender "
        "alike); median µs per call.\n"
    )
    table = []
    copies = {}
    built = []
    with torch.no_grad():
        for name, tail in variants:  # each on its own copy of the model: its own dynamo entry
            own = copy.deepcopy(model)
            if tail is None:
                fn = torch.compile(own, mode="reduce-overhead", dynamic=True)
            else:
                cudagraphs._GraphReplay.TAIL_MIN_BYTES = tail  # read when a graph records
                fn = torch.compile(own, backend=fusion_planner_backend(cache), dynamic=True)
            for bs in shapes:
                LAST.clear()
                for _ in range(10):  # compile, first run, graph recording, steady
                    fn(*inputs[bs])
                sync()
                rep = LAST.get("replay")
                if rep is not None:
                    outs = [o for o in rep.static_out if isinstance(o, torch.Tensor)]
                    copies[(name, bs)] = (len(outs), _copy_methods(outs, args.calls, sync))
            cudagraphs._GraphReplay.TAIL_MIN_BYTES = shipped
            built.append((name, fn))
        for bs in shapes:
            rows = _interleaved(built, inputs[bs], args.calls, sync)
            table.extend((name, bs, rows[name]) for name, _ in built)
    cols = ("host", *LAYERS, "whole call")
    ro = {bs: row for name, bs, row in table if name == "reduce-overhead"}
    extra = " host / ro | whole / ro |" if ro else ""
    print("| contender | B,S | " + " | ".join(cols) + " |" + extra)
    print("|---|---|" + "---:|" * (len(cols) + (2 if ro else 0)))
    for name, bs, row in table:
        cells = " | ".join(f"{row[c]:.1f}" for c in cols)
        if ro:
            r = ro[bs]
            cells += f" | {row['host'] / r['host']:.2f} | {row['whole call'] / r['whole call']:.2f}"
        print(f"| {name} | {bs[0]},{bs[1]} | {cells} |")
    print(
        "\n*host*: the call until it returned; *backend call*: the backend's graph "
        "(dispatch, specialization, the plan); *graph call*: the plan's CUDA graph call "
        "(inputs in, replay, outputs out); *replay*: `CUDAGraph.replay` alone (for "
        "reduce-overhead, its own graph's replay); *whole call*: until the device finished.\n"
    )
    if copies:
        print("## Handing the graph's outputs back fresh (host µs per call, median)\n")
        print("| contender | B,S | outputs copied | method | host |\n|---|---|---:|---|---:|")
        for (name, bs), (n, meth) in copies.items():
            for m, us in meth.items():
                print(f"| {name} | {bs[0]},{bs[1]} | {n} | {m} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
