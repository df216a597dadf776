"""Communication micro-benchmarks: torch.distributed collectives timed across local
processes (gloo on 127.0.0.1 with CPU tensors, or NCCL with one process per CUDA device),
and α-β fits per message-size range.

`run_ranks` is the harness: it starts `world_size` processes, each joining one group
(`backend` "gloo" or "nccl"; under NCCL rank r uses cuda:r) on a free loopback port,
runs a module-level function on every rank and returns rank 0's JSON-able result; the
processes are joined (or killed past the timeout) and the group destroyed on every path.
Children inherit the caller's whole environment. Timing (`timed_s`) uses CUDA events on
a CUDA device and the wall clock on the CPU. `measure_collective` times one collective per message
size; `fit_alpha_beta` fits T = α_c + S·β_c per size range, weighted by 1/T² so that
every size counts by its relative error; `bench_comm` measures training and held-out
sizes, fits on the first and reports its error on the second.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import datetime
import faulthandler
import gc
import importlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import zoo
from planner.distributed.comm_cost import link_from_collective
from planner.distributed.ddp import MIB, wrap_ddp
from planner.distributed.links import AlphaBeta, MeasuredLink
from planner.errors import FusionPlannerError, first_line
from planner.hardware import device_fingerprint
from planner.plans.plan import DPChoice, now_iso
from profiling.backward import BackwardProbe

_ROOT = str(Path(__file__).resolve().parent.parent)


class CommBenchError(FusionPlannerError):
    """A multi-process measurement failed (a rank crashed or timed out)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """On Linux, ask the kernel to end this rank when the process that started it ends
    (killed before it could clean up), so no rank outlives its benchmark."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


BACKENDS = ("gloo", "nccl")


def rank_device(rank: int) -> torch.device:
    """The device a rank's tensors live on: cuda:rank under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", rank)
    return torch.device("cpu")


def check_backend(backend: str, world_size: int) -> None:
    """A clear error where `backend` cannot run `world_size` ranks on this machine."""
    if backend not in BACKENDS:
        raise FusionPlannerError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < world_size or not dist.is_nccl_available():
            raise FusionPlannerError(
                f"NCCL with {world_size} ranks needs {world_size} CUDA devices and a torch "
                f"built with NCCL; this machine has {n} device(s)"
                + ("" if dist.is_nccl_available() else " and no NCCL")
            )


def release_graphs() -> None:
    """Free the CUDA graphs this process still holds (Inductor's CUDA-graph trees, graphs
    left in reference cycles) and wait for the device: NCCL's communicator destroy can
    wait forever on collectives recorded in a graph that is still alive."""
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()  # also drops the CUDA-graph trees of reduce-overhead
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


TEARDOWN_S = 30.0  # how long a rank waits for its process group's teardown
STACK_DUMP_S = 1.0  # how long ranks that hung get to write their stacks before the kill
# how long ranks get to start (import torch and the function, join the group) before a
# call's own timeout starts counting: a loaded machine can take many seconds for it
START_S = 120.0


def leave_group(code: int, timeout_s: float = TEARDOWN_S) -> None:
    """Destroy the default process group, and if that does not return within `timeout_s`,
    leave the process with `code` without it (stdout and stderr flushed).

    NCCL's communicator destroy can wait forever once collectives were recorded in CUDA
    graphs (pytorch/pytorch#115388, open); freeing the graphs first (`release_graphs`) did
    not end it for `fusion-plan tune` on two NCCL ranks. Whatever the job wrote (plans,
    results) is written before this is called."""
    release_graphs()
    done = threading.Event()

    def destroy() -> None:
        dist.destroy_process_group()
        done.set()

    threading.Thread(target=destroy, name="leave-group", daemon=True).start()
    if done.wait(timeout_s):
        return
    pending = sys.exc_info()[1]
    warnings.warn(
        f"the process group's teardown did not return within {timeout_s:.0f} s (NCCL "
        "communicators that ran collectives recorded in CUDA graphs can wait forever: "
        "pytorch/pytorch#115388); leaving without it, everything the job wrote is written"
        + (
            f" (the job failed: {type(pending).__name__}: {first_line(pending)})" if pending else ""
        ),
        RuntimeWarning,
        stacklevel=2,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rank_main(spec: str) -> None:
    """One rank's process: join the group, run the function, write rank 0's result."""
    job = json.loads(spec)
    _die_with_parent()
    # a rank the parent gives up on is sent SIGUSR1 first: it writes every thread's Python
    # stack to its log, so a hang's report says where each rank waits
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    module, _, name = job["fn"].partition(":")
    fn = getattr(importlib.import_module(module), name)
    rank, world = job["rank"], job["world"]
    backend = job.get("backend", "gloo")
    torch.set_num_threads(1)
    kw: dict[str, Any] = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        kw["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{job['port']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=job["timeout_s"]),
        **kw,
    )
    if job.get("ready"):
        Path(job["ready"]).touch()  # the parent's timeout counts from here
    try:
        result = fn(rank, world, *job["args"])
        if rank == 0:
            Path(job["out"]).write_text(json.dumps(result))
        dist.barrier()  # no rank tears down while another still talks to it
    finally:
        leave_group(0 if sys.exc_info()[0] is None else 1)  # frees the graphs first
    # the result is out: leave without the interpreter's teardown, where threads of
    # communication objects still alive (DDP's reducer) can abort the process
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(
    world_size: int,
    fn: Callable[..., Any] | str,
    args: tuple = (),
    timeout_s: float = 120.0,
    backend: str = "gloo",
) -> Any:
    """Run `fn(rank, world_size, *args)` on `world_size` ranks of `backend`; rank 0's result.

    `fn` is a module-level function (or its "module:name") and `args` JSON-able: each rank is a fresh Python
    process (`python -c`, so no caller's `__main__` is re-imported) that imports `fn` by
    name. `timeout_s` counts from when every rank has joined the group; starting (Python,
    torch, `fn`'s module, the group) has `START_S` of its own. Ranks still running at
    either deadline are asked for their Python stacks, killed, and the error quotes them."""
    if world_size < 2:
        raise FusionPlannerError(f"a communication benchmark needs >= 2 ranks, got {world_size}")
    check_backend(backend, world_size)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        port = free_port()
        procs: list[tuple[subprocess.Popen, Any]] = []
        timed_out = False
        readies = [os.path.join(tmp, f"ready{r}") for r in range(world_size)]
        deadline: float | None = None  # set once every rank has joined the group
        try:
            for r in range(world_size):
                spec = json.dumps(
                    {
                        "fn": fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}",
                        "rank": r,
                        "world": world_size,
                        "port": port,
                        "args": list(args),
                        "out": out,
                        "ready": readies[r],
                        "timeout_s": timeout_s + START_S,
                        "backend": backend,
                    }
                )
                code = f"from profiling.commbench import _rank_main; _rank_main({spec!r})"
                log = open(os.path.join(tmp, f"rank{r}.log"), "w")  # noqa: SIM115
                cmd = [sys.executable, "-c", code]
                proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
                procs.append((proc, log))
            start_by = time.monotonic() + START_S
            # until all ended, one failed (the others would wait for it), or time is up
            while any(p.poll() is None for p, _ in procs):
                if any(p.poll() not in (None, 0) for p, _ in procs):
                    break
                now = time.monotonic()
                if deadline is None and all(os.path.exists(f) for f in readies):
                    deadline = now + timeout_s
                if now > (start_by if deadline is None else deadline):
                    timed_out = True
                    break
                time.sleep(0.05)
        finally:
            alive = [p for p, _ in procs if p.poll() is None]
            if timed_out and alive:
                for p in alive:  # their Python stacks into their logs, then the kill
                    p.send_signal(signal.SIGUSR1)
                time.sleep(STACK_DUMP_S)
            for p, log in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                log.close()
        codes = [p.returncode for p, _ in procs]
        # ended by us: the kill, or the stack request reaching a rank before its handler
        ours = (0, -signal.SIGKILL, -signal.SIGUSR1)
        if timed_out and os.path.exists(out) and not any(c not in ours for c in codes):
            # rank 0's result is out: the ranks hung tearing the group down, not measuring
            warnings.warn(
                f"{world_size} {backend} ranks did not exit within {timeout_s:.0f} s after "
                "writing their result (killed in teardown)",
                RuntimeWarning,
                stacklevel=2,
            )
            return json.loads(Path(out).read_text())
        if timed_out or any(codes) or not os.path.exists(out):
            failed = next((r for r, c in enumerate(codes) if c not in ours), 0)
            tail = Path(tmp, f"rank{failed}.log").read_text()[-6000:]
            if not timed_out:
                why = f"exited with {codes}"
            elif deadline is None:
                joined = sum(os.path.exists(f) for f in readies)
                why = f"did not all join the group within {START_S:.0f} s ({joined} joined)"
            else:
                why = f"still ran {timeout_s:.0f} s after joining the group"
            raise CommBenchError(
                f"{world_size} {backend} ranks {why}; rank {failed}'s output:\n{tail}"
            )
        return json.loads(Path(out).read_text())


def group_check(rank: int, world: int) -> list[float]:
    """Every rank's (rank + 1) summed by one all-reduce, and the group size: a group that
    works returns [world * (world + 1) / 2, world]."""
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    return [float(x.item()), float(dist.get_world_size())]


# ---- the collectives ------------------------------------------------------------------
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def _collective(
    name: str, nbytes: int, world: int, device: torch.device | None = None
) -> Callable[[], None]:
    """One collective of `nbytes` (float32) on `device`: the input of all-reduce,
    reduce-scatter and broadcast, the gathered output of all-gather."""
    device = device or torch.device("cpu")
    n = max(world, nbytes // 4 // world * world)  # a multiple of the group for the shards
    if name == "all_reduce":
        x = torch.randn(n, device=device)
        return lambda: dist.all_reduce(x)
    if name == "all_gather":
        shard = torch.randn(n // world, device=device)
        outs = torch.empty(n, device=device)
        return lambda: dist.all_gather_into_tensor(outs, shard)
    if name == "reduce_scatter":
        x = torch.randn(n, device=device)
        out = torch.empty(n // world, device=device)
        return lambda: dist.reduce_scatter_tensor(out, x)
    if name == "broadcast":
        x = torch.randn(n, device=device)
        return lambda: dist.broadcast(x, 0)
    raise FusionPlannerError(f"commbench measures {', '.join(COLLECTIVES)}; not {name!r}")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_s(fn: Callable[[], Any], device: torch.device, inner: int = 1) -> float:
    """Seconds per call of `inner` back-to-back calls of `fn`: CUDA events on the current
    stream of a CUDA device (the work is synchronized first), the wall clock on the CPU."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / inner
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def inner_calls(nbytes: int, device: torch.device) -> int:
    """Back-to-back calls per timed sample on a GPU: enough that a small message's time is
    not the launch skew between ranks (one call on the CPU, whose messages are slow)."""
    if device.type != "cuda":
        return 1
    return 10 if nbytes < 1 << 20 else 3 if nbytes < 1 << 25 else 1


def _time_sizes(
    rank: int, world: int, name: str, sizes: list[int], reps: int, quantile: float = 0.5
) -> list[tuple[int, float]]:
    """Rounds over all sizes (not all repetitions of one size, then the next), so that a
    burst of load from other processes spreads over the sizes instead of bending one
    stretch of the curve; each round in its own order, the same on every rank (one
    seeded generator), so that no size always follows the same one (in a fixed order
    the first size of a round always follows the largest message, and each size the
    same neighbour). Every sample starts after a barrier (and, on a GPU, with the device
    idle)."""
    device = rank_device(rank)
    ops = [_collective(name, nbytes, world, device) for nbytes in sizes]
    inners = [inner_calls(nbytes, device) for nbytes in sizes]
    for op in ops:
        op()
        op()
    sync(device)
    samples: list[list[float]] = [[] for _ in sizes]
    order = np.random.default_rng(0)  # every rank draws the same orders
    for _ in range(reps):
        for i in order.permutation(len(ops)).tolist():
            dist.barrier()
            sync(device)
            samples[i].append(timed_s(ops[i], device, inners[i]))
    # A sample starts on each rank when that rank starts the call, and the collective
    # cannot begin before the last rank has: the ranks that started earlier also timed
    # their wait for it. So each sample's time is its minimum over the ranks (the rank
    # that started last saw the collective alone), then the `quantile` over the samples.
    mine = torch.tensor(samples, dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    per_sample = torch.stack(every).amin(dim=0).cpu().tolist()
    return [(b, _quantile(s, quantile)) for b, s in zip(sizes, per_sample, strict=True)]


def _quantile(xs: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs), q))


def measure_collective(
    world_size: int,
    sizes: Sequence[int],
    collective: str = "all_reduce",
    reps: int = 30,
    quantile: float = 0.5,
    backend: str = "gloo",
    timeout_s: float = 120.0,
) -> list[tuple[int, float]]:
    """(bytes, seconds) of `collective` per size over `world_size` ranks of `backend`.
    Each repetition's time is the one the rank that started it last measured (the
    minimum over the ranks: the others also timed their wait for it); a size's time is
    the `quantile` of its repetitions (the median by default; a lower one on a machine
    shared with other jobs, whose load only ever adds time)."""
    rows = run_ranks(
        world_size,
        _time_sizes,
        (collective, list(sizes), reps, quantile),
        timeout_s=timeout_s,
        backend=backend,
    )
    return [(int(b), float(t)) for b, t in rows]


# ---- fitting --------------------------------------------------------------------------
def _fit_segment(rows: Sequence[tuple[int, float]], lo: int, hi: int) -> AlphaBeta:
    s = np.array([b for b, _ in rows], dtype=float)
    t = np.array([t for _, t in rows], dtype=float)
    w = 1.0 / t  # minimize sum ((α + Sβ - t) / t)^2
    coef, *_ = np.linalg.lstsq(np.stack([w, s * w], axis=1), t * w, rcond=None)
    alpha, beta = float(coef[0]), float(coef[1])
    if alpha < 0 or beta <= 0:  # a non-physical fit: pure bandwidth or pure latency
        beta_only = float(np.sum(s * t * w * w) / np.sum(s * s * w * w))
        alpha, beta = (0.0, beta_only) if alpha < 0 else (float(np.median(t)), 1e-15)
    return AlphaBeta(alpha, beta, lo, hi)


def predict_s(fits: Sequence[AlphaBeta], nbytes: float) -> float:
    """The fitted time of `nbytes`: the range that covers it, else the last range."""
    for f in fits:
        if f.lo_bytes <= nbytes < f.hi_bytes:
            return f.time_s(nbytes)
    return fits[-1].time_s(nbytes)


def rel_errors(fits: Sequence[AlphaBeta], rows: Sequence[tuple[int, float]]) -> list[float]:
    return [abs(predict_s(fits, b) - t) / t for b, t in rows]


def _fit_pieces(rows: Sequence[tuple[int, float]], cuts: Sequence[int]) -> tuple[AlphaBeta, ...]:
    """One fit per stretch of `rows` between the indices `cuts`, each covering its own
    measured sizes, and between two stretches a bridge: the line from the lower fit's time
    at its last size to the upper fit's time at its first. Where the protocol changes
    between two measured sizes is not known; the bridge keeps the prediction continuous
    across that gap instead of handing over to the upper line at an arbitrary point."""
    bounds = [0, *cuts, len(rows)]
    pieces = []
    for j in range(len(bounds) - 1):
        a, b = bounds[j], bounds[j + 1]
        lo = 0 if j == 0 else rows[a][0]
        hi = 1 << 62 if b == len(rows) else rows[b - 1][0]
        pieces.append(_fit_segment(rows[a:b], lo, hi))
    fits: list[AlphaBeta] = []
    for j, piece in enumerate(pieces):
        if j:
            left, s0, s1 = pieces[j - 1], fits[-1].hi_bytes, piece.lo_bytes
            t0, t1 = left.time_s(s0), piece.time_s(s1)
            slope = (t1 - t0) / (s1 - s0)
            fits.append(AlphaBeta(t0 - slope * s0, slope, s0, s1, bridge=True))
        fits.append(piece)
    return tuple(fits)


def fit_alpha_beta(
    rows: Sequence[tuple[int, float]], max_ranges: int = 2, min_points: int = 3
) -> tuple[AlphaBeta, ...]:
    """Whole-collective fits T = α_c + S·β_c, one per size range: one range, or split at
    the breakpoints (between measured sizes, at least `min_points` sizes per range) that
    minimize the worst relative error; each further range must cut that error by a fifth
    (a fit within 2% needs none)."""
    rows = sorted(rows)
    if len(rows) < 2:
        raise FusionPlannerError(f"an α-β fit needs >= 2 message sizes, got {len(rows)}")
    best = _fit_pieces(rows, ())
    best_err = max(rel_errors(best, rows))
    for ranges in range(2, max_ranges + 1):
        found, found_err = None, float("inf")
        for cuts in itertools.combinations(
            range(min_points, len(rows) - min_points + 1), ranges - 1
        ):
            if any(b - a < min_points for a, b in itertools.pairwise(cuts)):
                continue
            fits = _fit_pieces(rows, cuts)
            err = max(rel_errors(fits, rows))
            if err < found_err:
                found, found_err = fits, err
        if found is not None and best_err > 0.02 and found_err < best_err * 0.8:
            best, best_err = found, found_err
    return best


@dataclass(frozen=True)
class CommBenchResult:
    link: MeasuredLink  # link-level α-β fits (per rank, per direction)
    collective_fits: tuple[AlphaBeta, ...]  # whole-collective fits at world_size
    train: tuple[tuple[int, float], ...]
    heldout: tuple[tuple[int, float], ...]
    heldout_rel_err: tuple[float, ...]

    def heldout_rows(self) -> list[dict[str, float]]:
        """Each held-out size: bytes, measured and predicted seconds, relative error."""
        return [
            {
                "bytes": b,
                "measured_s": t,
                "predicted_s": predict_s(self.collective_fits, b),
                "rel_err": e,
            }
            for (b, t), e in zip(self.heldout, self.heldout_rel_err, strict=True)
        ]


def default_sizes(quick: bool, backend: str = "gloo") -> tuple[list[int], list[int]]:
    """Training and held-out sizes in bytes. Held out: 1.5x each power of two but the
    last. Trained on: the powers of two, 1 KiB - 4 MiB over gloo (256 KiB quick); over NCCL
    4 KiB - 256 MiB (1 MiB quick), with 1.25x and 1.75x each power of two as well, since
    NCCL changes protocol with the size and a change between two powers of two is only
    located as finely as the sizes measured around it."""
    if backend == "nccl":
        ks = list(range(12, 21 if quick else 29))
        train = sorted({1 << k for k in ks} | {m << (k - 2) for k in ks[:-1] for m in (5, 7)})
    else:
        ks = list(range(10, 19 if quick else 23, 2 if quick else 1))
        train = [1 << k for k in ks]
    heldout = [3 << (k - 1) for k in ks[:-1]]
    return train, heldout


def bench_comm(
    world_size: int = 2,
    collective: str = "all_reduce",
    quick: bool = False,
    reps: int | None = None,
    quantile: float = 0.5,
    command: str = "fusion-plan device-bench --comm",
    backend: str = "gloo",
    max_ranges: int | None = None,
    timeout_s: float = 300.0,
) -> CommBenchResult:
    """Measure `collective` over `backend` at training and held-out sizes, fit α-β per
    size range on the training sizes, and report the held-out relative errors. NCCL's
    curve changes protocol with the size (LL, LL128, Simple), so it gets up to three
    ranges by default, gloo two."""
    train, heldout = default_sizes(quick, backend)
    order = sorted(train + heldout)
    reps = reps or (10 if quick else 30)
    rows = dict(
        measure_collective(
            world_size, order, collective, reps, quantile, backend, timeout_s=timeout_s
        )
    )
    tr = tuple((b, rows[b]) for b in train)
    ho = tuple((b, rows[b]) for b in heldout)
    fits = fit_alpha_beta(tr, max_ranges or (3 if backend == "nccl" else 2))
    errs = tuple(rel_errors(fits, ho))
    algorithm = "tree" if collective == "broadcast" else "ring"
    kind = collective
    link_fits = tuple(link_from_collective(kind, algorithm, world_size, f) for f in fits)
    device = "cuda" if backend == "nccl" else "cpu"
    link = MeasuredLink(
        backend=backend,
        world_size=world_size,
        collective=collective,
        algorithm=algorithm,
        fits=link_fits,
        heldout_max_rel_err=max(errs) if errs else 0.0,
        device_fingerprint=device_fingerprint(device),
        torch_version=torch.__version__.split("+")[0],
        measured_at=now_iso(),
        command=command,
        samples=tuple(sorted(rows.items())),
        quantile=quantile,
    )
    return CommBenchResult(link, fits, tr, ho, errs)


# ---- a data-parallel step under DDP ---------------------------------------------------
def _ddp_steps(
    rank: int,
    world: int,
    d: int,
    hidden: int,
    layers: int,
    batch: int,
    caps_mb: list[float],
    reps: int,
    sizes: list[int],
) -> dict[str, Any]:
    """On each rank: forward and forward+backward of zoo's MLP without
    communication, one copy of all its gradients' bytes, a DDP training step per bucket
    cap (MiB; DDP built by
    planner.distributed.ddp.wrap_ddp from a decision of that cap, so 25 MiB is DDP's
    default with its 1 MiB first bucket), and all-reduce times per size for the α-β fit;
    all medians, the max over ranks."""

    device = rank_device(rank)
    torch.manual_seed(0)
    model = zoo.MLP(d, hidden, layers).to(device)
    x = torch.randn(batch, d, device=device)

    def fwd() -> None:
        with torch.no_grad():
            model(x)

    def fwd_bwd(m: torch.nn.Module) -> None:
        m.zero_grad(set_to_none=True)
        m(x).square().mean().backward()

    # one DDP wrapper per cap, each over its own copy of the model (two wrappers on one
    # module would both reduce its gradients); the plain model's forward and
    # forward+backward and every cap are stepped in rounds, so that a burst of load from
    # other processes spreads over all of them alike
    # each built as a user builds it from a plan deciding that cap (wrap_ddp)
    ids = [rank] if device.type == "cuda" else None
    ddps = [
        wrap_ddp(copy.deepcopy(model), DPChoice(int(cap * MIB), world, 0.0, 0.0), device_ids=ids)
        for cap in caps_mb
    ]
    # one copy of every gradient's bytes: what DDP's copies into and out of its buckets
    # cost per pass
    grad_numel = sum(p.numel() for p in model.parameters())
    src, dst = torch.randn(grad_numel, device=device), torch.empty(grad_numel, device=device)
    # the backward measured as profiling.backward measures it (the same loss), on a copy
    # of its own so its hooks touch no other run
    probed = copy.deepcopy(model)
    probe = BackwardProbe(probed)
    passes: list[tuple[float, list[float | None]]] = []

    def probe_run() -> None:
        passes.append(probe.run(lambda: probed(x), lambda y: y.square().mean()))

    runs: list[Callable[[], None]] = [fwd, lambda: fwd_bwd(model), lambda: dst.copy_(src)]
    runs += [lambda ddp=ddp: fwd_bwd(ddp) for ddp in ddps]
    runs.append(probe_run)
    for run in runs:
        run()
        run()  # DDP rebuilds its buckets after the first step
    sync(device)
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(reps):
        for i, run in enumerate(runs):
            dist.barrier()
            sync(device)
            samples[i].append(timed_s(run, device))
    meds = [statistics.median(ts) for ts in samples]
    out: dict[str, Any] = {"fwd_s": meds[0], "fwd_bwd_s": meds[1], "copy_s": meds[2]}
    out["copy_bytes"] = grad_numel * src.element_size()
    out["ddp_s"] = {str(c): m for c, m in zip(caps_mb, meds[3 : 3 + len(caps_mb)], strict=True)}
    out["backward"] = _probed(passes[-reps:], probe, device)
    out["all_reduce"] = _time_sizes(rank, world, "all_reduce", sizes, reps)
    flat = [out["fwd_s"], out["fwd_bwd_s"], out["copy_s"], *out["ddp_s"].values()]
    t = torch.tensor(flat, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    t = t.cpu()
    out["fwd_s"], out["fwd_bwd_s"], out["copy_s"] = t[0].item(), t[1].item(), t[2].item()
    out["ddp_s"] = dict(zip(out["ddp_s"], t[3:].tolist(), strict=True))
    return out


def _probed(
    passes: list[tuple[float, list[float | None]]], probe: BackwardProbe, device: torch.device
) -> dict[str, Any]:
    """The probe's timed passes: per parameter its median ready time (seconds from the
    backward's start, None without a gradient) and the median forward, each the max over
    ranks."""
    nan = float("nan")
    ready = [
        statistics.median(ts) if (ts := [r[i] for _, r in passes if r[i] is not None]) else nan
        for i in range(len(probe.names))
    ]
    t = torch.tensor([statistics.median(f for f, _ in passes), *ready], dtype=torch.float64)
    t = t.to(device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    fwd, *ready = t.cpu().tolist()
    return {
        "names": probe.names,
        "grad_bytes": probe.grad_bytes,
        "ready_s": [None if r != r else r for r in ready],
        "forward_s": fwd,
        "passes": len(passes),
    }


def measure_ddp(
    world_size: int,
    d: int,
    hidden: int,
    layers: int,
    batch: int,
    caps_mb: Sequence[float],
    reps: int = 10,
    sizes: Sequence[int] | None = None,
    backend: str = "gloo",
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """DDP step times of zoo's MLP per bucket cap over `backend`, with the compute-only
    forward and forward+backward times and all-reduce timings for a fit."""
    sizes = list(sizes or [1 << k for k in range(12, 25, 2)])
    return run_ranks(
        world_size,
        _ddp_steps,
        (d, hidden, layers, batch, list(caps_mb), reps, sizes),
        timeout_s=timeout_s,
        backend=backend,
    )
