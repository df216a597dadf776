"""Where does a served call's host time go once its CUDA graph is recorded?

    PYTHONPATH=. python benchmarks/probes/served_host_profile.py --cache plans.sqlite
    PYTHONPATH=. python benchmarks/probes/served_host_profile.py --quick      # a CPU check

One Hugging Face GPT-2 (benchmarks/models/gpt2.py) at one shape, served by
`torch.compile(model, backend=fusion_planner_backend(cache), dynamic=True)` and by
`torch.compile(model, mode="reduce-overhead", dynamic=True)` (`--static`: and by the backend
with `static_after=3`, every shape its static specialization), each warmed up (the shape's
CUDA graph recorded), then: the median host time per call (from the call until it
returned, before synchronizing) and per whole call, over `--calls` calls; and cProfile over
as many calls again, its top functions by own time and the cumulative time of the
serving path's layers (dynamo's frame, the backend's dispatch, the realized plan's call,
the graph replay, the outputs rebuilt). Prints Markdown.

`--cycle 1,8,48` repeats the measurement for each K over K sequence lengths S..S+K-1
(`--spread LO..HI`: spread geometrically from LO to HI, over several buckets) called in turn (each shape warmed up, its graph recorded, before timing): how the host
time of a steady call changes with the number of shapes served, as in a stream of
lengths (`benchmarks/runtime_stream.py`) where every call may be another shape.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.host_overhead import top_text  # noqa: E402
from benchmarks.models import BY_NAME  # noqa: E402
from planner.plans.cache import PlanCache  # noqa: E402
from planner.runtime.backend import fusion_planner_backend  # noqa: E402

# functions whose cumulative time per call is shown (file suffix, function name)
LAYERS = (
    ("eval_frame.py", "_fn"),
    ("backend.py", "__call__"),
    ("specialize.py", "__call__"),
    ("realizer.py", "__call__"),
    ("realizer.py", "_rebuild"),
    ("cudagraphs.py", "__call__"),
    ("graphs.py", "replay"),
    ("derived.py", "refresh"),
    ("lean.py", "check"),
)


def text_model(
    b: int, s: int, quick: bool, name: str = "gpt2"
) -> tuple[torch.nn.Module, str, bool]:
    """A text model of the real-model suite (benchmarks/models: `name`'s factory, taking
    B and S) in eval mode for probing: bf16 on CUDA where present (and not `quick`), else
    its tiny config on the CPU; with its device name and whether it is CUDA."""
    if name not in BY_NAME or BY_NAME[name].dim != "S":
        text = sorted(n for n, m in BY_NAME.items() if m.dim == "S")
        raise SystemExit(
            f"--model takes a text model of the suite ({', '.join(text)}), got {name!r}"
        )
    module = importlib.import_module(f"benchmarks.models.{Path(BY_NAME[name].file).stem}")
    cuda = torch.cuda.is_available() and not quick
    dev = "cuda" if cuda else "cpu"
    model, _ = (module.tiny if quick else module.factory)(b, s)
    model = model.to(dev).eval()
    if cuda:
        model = model.to(torch.bfloat16)
    return model, dev, cuda


def _timed(fn, shapes, calls: int, sync) -> tuple[float, float]:
    """Median host and whole time per call over `calls` calls, the inputs of `shapes` in turn."""
    host, whole = [], []
    for i in range(calls):
        args = shapes[i % len(shapes)]
        t0 = time.perf_counter()
        fn(*args)
        t1 = time.perf_counter()
        sync()
        whole.append(time.perf_counter() - t0)
        host.append(t1 - t0)
    return statistics.median(host) * 1e6, statistics.median(whole) * 1e6


def _profile(fn, shapes, calls: int, sync, top: int) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for i in range(calls):
        fn(*shapes[i % len(shapes)])
    sync()
    pr.disable()
    st = pstats.Stats(pr)
    lines = ["| layer | cumulative us per call | calls per call |", "|---|---:|---:|"]
    for (file, line, name), (_cc, nc, _tt, ct, _callers) in sorted(st.stats.items()):
        if any(file.endswith(f) and name == n for f, n in LAYERS):
            lines.append(
                f"| `{Path(file).name}:{line}({name})` | {ct / calls * 1e6:.1f} | {nc / calls:.1f} |"
            )
    body = top_text(pr, top)
    return "\n".join(lines) + "\n\nTop functions by own time:\n\n```\n" + body + "\n```\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=None, help="a plan cache tuned for the model (else empty)")
    p.add_argument("--shape", default="B=1,S=200", help="B and S of the call")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--quick", action="store_true", help="the tiny model on this CPU")
    p.add_argument(
        "--cycle", default="1", help="numbers K of sequence lengths S..S+K-1 served in turn"
    )
    p.add_argument(
        "--static",
        action="store_true",
        help="also the planner with static_after=3: each shape served by its static "
        "specialization (as `tune` times a plan) beside the bucket realization that serves "
        "it by default until it has recurred long enough to pay for one",
    )
    p.add_argument(
        "--spread",
        default=None,
        help="LO..HI: the K lengths spread geometrically from LO to HI instead (across buckets)",
    )
    args = p.parse_args(argv)
    try:
        cycles = [int(k) for k in args.cycle.split(",")]
        if any(k < 1 for k in cycles):
            raise ValueError
    except ValueError:
        p.error(f"--cycle takes positive integers separated by commas, got {args.cycle!r}")
    spread = None
    if args.spread:
        try:
            lo, hi = (int(v) for v in args.spread.split(".."))
            if not 1 <= lo <= hi:
                raise ValueError
        except ValueError:
            p.error(f"--spread takes LO..HI with 1 <= LO <= HI, got {args.spread!r}")
        spread = (lo, hi)
    dims = dict(kv.split("=") for kv in args.shape.split(","))
    b, s = int(dims["B"]), int(dims["S"])
    model, dev, cuda = text_model(b, s, args.quick)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def lengths_of(k: int) -> list[int]:
        if spread is None:
            return [s + i for i in range(k)]
        lo, hi = spread
        return [round(lo * (hi / lo) ** (i / max(1, k - 1))) for i in range(k)]

    made: dict[int, tuple[torch.Tensor]] = {}

    def inputs_of(k: int) -> list[tuple[torch.Tensor]]:
        for n in lengths_of(k):
            if n not in made:
                made[n] = (torch.randint(0, vocab, (b, n), generator=gen).to(dev),)
        return [made[n] for n in lengths_of(k)]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    cache = PlanCache(args.cache) if args.cache else None
    contenders = {
        "planner": torch.compile(model, backend=fusion_planner_backend(cache), dynamic=True),
    }
    if args.static:
        contenders["planner, static_after=3"] = torch.compile(
            model, backend=fusion_planner_backend(cache, static_after=3), dynamic=True
        )
    if cuda:
        contenders["reduce-overhead"] = torch.compile(model, mode="reduce-overhead", dynamic=True)
    print(f"# Served host time per call: GPT-2 B={b},S={s} on {dev} ({torch.__version__})\n")
    summary = []
    with torch.no_grad():
        for name, fn in contenders.items():
            for k in cycles:
                shapes = inputs_of(k)
                for _ in range(10):  # compile, first run, graph recording, steady
                    for x in shapes:
                        fn(*x)
                sync()
                host, whole = _timed(fn, shapes, args.calls, sync)
                summary.append((name, k, host, whole))
                ls = lengths_of(k)
                where = f", {k} lengths S={ls[0]}..{ls[-1]} in turn" if k > 1 else ""
                print(
                    f"## {name}{where}\n\n"
                    f"median per call: host {host:.1f} us, whole call {whole:.1f} us\n"
                )
                print(_profile(fn, shapes, args.calls, sync, args.top))
    if len(cycles) > 1 or len(contenders) > 1:
        print("## Summary: median per call, us\n")
        print("| contender | lengths in turn | host | whole call |\n|---|---:|---:|---:|")
        for name, k, host, whole in summary:
            print(f"| {name} | {k} | {host:.1f} | {whole:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
