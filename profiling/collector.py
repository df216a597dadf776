"""The profile collector: measure groups and whole plans across zoo graphs and shapes.

For every (model, shape, dtype) "job" it plans a list of units, cheaply, on the meta
device: every single op that does work, the groups of each strategy's plan, random legal
groups (profiling.sampling), and whole plans (unfused, each strategy's, random ones).
Units whose key is already in the output file are skipped (resume). Then, job by job, it
exports the model on the device, runs it eagerly once for reference values, and measures
each unit (profiling.units), writing one dataset-v1 row per unit (profiling.dataset).

Parallel compilation: with `workers > 0` a process pool compiles each job's groups ahead
of the measuring process (profiling.warm), which then finds them in Inductor's cache;
measurement stays strictly sequential on the one device. By default (`warm_first`) every
job is compiled, and the pool shut down, before the first unit is timed: workers export
and compile on the device being measured, and timings taken beside them scattered (on
the H100, identical groups timed in different graphs: twins' median MAPE 24% with 14
workers alongside, 2.8% with none; benchmarks/timing_noise.py, docs/design_notes.md).
`max_seconds` stops it cleanly (rows so far flushed), so a device session of fixed length
can be resumed by the next.

profiling imports neither learned_cost nor search: the analytical prediction comes from
a `planner.cost.CostModel` and the strategies' partitions from `plan_makers`, both passed
in by the caller (cli/commands/collect.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from planner import progress as progress_bars
from planner import units as human
from planner.cost import CostModel
from planner.errors import FusionPlannerError, ModelSpecError
from planner.features import group_descriptor
from planner.fusion.partition import Partition
from planner.fusion.realization import realization_of
from planner.hardware import device_fingerprint, get_spec, local_device_name
from planner.ir.graph import Category, OpGraph
from planner.measurement import Measurement
from planner.plans.plan import now_iso
from profiling.dataset import COLLECTOR_VERSION, ProfileStore, row_key
from profiling.sampling import random_groups, random_partition
from profiling.units import (
    dominant_realization,
    export_on,
    group_unit,
    measure_group,
    measure_plan,
    reference,
    unit_runner,
)
from profiling.warm import WarmPool
from zoo import modelspec

PlanMaker = Callable[[OpGraph], Partition]
WARM_WAIT_S = 120.0  # longest the measuring process waits for a job's warm-up compiles

_T = "B=1,S=128,D=768,H=12;B=8,S=512,D=768,H=12;B=4,S=1024,D=1024,H=16;B=2,S=256,D=512,H=8"
_L = "B=1,S=128,D=768,H=12;B=4,S=512,D=1024,H=16;B=2,S=1024,D=1024,H=16;B=2,S=256,D=512,H=8"
# Shape sweeps for `--shapes auto`, per device kind: transformer shapes around the
# reference shapes of benchmarks/README.md, the rest at sizes where launch, memory and
# compute bounds all occur.
DEFAULT_SHAPES: dict[str, dict[str, str]] = {
    "gpu": {
        "transformer-block": _T,
        "transformer-block-sdpa": _T,
        "gpt2-block": _T,
        "bert-layer": _T,
        "llama-block": _L,
        "resnet-bottleneck": "B=8,C=256,HW=56;B=32,C=256,HW=28;B=1,C=512,HW=14",
        "conv-bn-relu-maxpool": "B=8,CIN=16,C=32,HW=112;B=32,CIN=64,C=64,HW=56",
        "conv-bn-relu-2pool": "B=8,CIN=16,C=32,HW=112;B=32,CIN=64,C=64,HW=56",
        "pointwise-chain": "N=2^20,STEPS=8;N=2^24,STEPS=4;N=2^16,STEPS=8",
        "mlp": "B=64,D=1024,HID=4096,L=2;B=512,D=2048,HID=8192,L=2;B=8,D=512,HID=2048,L=3",
        "matmul": "M=1024,K=768,N=512;M=4096,K=4096,N=4096;M=64,K=1024,N=1024",
    },
    "cpu": {
        "transformer-block": "B=1,S=64,D=128,H=4;B=2,S=128,D=256,H=4",
        "transformer-block-sdpa": "B=1,S=64,D=128,H=4",
        "gpt2-block": "B=1,S=64,D=128,H=4;B=2,S=128,D=256,H=4",
        "bert-layer": "B=1,S=64,D=128,H=4",
        "llama-block": "B=1,S=64,D=128,H=4,MAXS=256;B=2,S=128,D=256,H=4,MAXS=256",
        "resnet-bottleneck": "B=2,C=64,HW=16",
        "conv-bn-relu-maxpool": "B=2,CIN=8,C=16,HW=32",
        "conv-bn-relu-2pool": "B=2,CIN=8,C=16,HW=32",
        "pointwise-chain": "N=2^16,STEPS=8;N=2^20,STEPS=4",
        "mlp": "B=16,D=256,HID=1024,L=2",
        "matmul": "M=256,K=256,N=256;M=64,K=512,N=128",
    },
}


@dataclass(frozen=True)
class Job:
    """One graph: a model at a shape in a dtype."""

    model: str
    shape: str
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.model}[{self.shape}] {self.dtype}"


@dataclass(frozen=True)
class Unit:
    """One thing to measure: a group (one entry in `groups`) or a whole plan."""

    kind: str
    groups: tuple[tuple[int, ...], ...]
    strategy: str
    realization: str  # "auto"-resolved for groups; "auto" for plans
    key: str


WARM_SHARE = 0.6  # of max_seconds, at most, spent compiling before timing starts


@dataclass
class CollectConfig:
    models: Sequence[str]
    shapes: Sequence[str] | None = None  # None: DEFAULT_SHAPES for the device kind
    dtypes: Sequence[str] = ("fp32",)
    groups_per_graph: int = 12
    random_plans: int = 2
    singles: bool = True  # every op that does work, alone
    # every group of every random plan, alone too: each plan's groups are then all timed
    # alone, so a plan can be compared with the sum of its groups (plan_additivity.py)
    plan_groups: bool = True
    # every group of every strategy's (and --plans) plan, alone: off for a run that only
    # re-times whole plans (a plan-level noise floor, benchmarks/heldout_plans.py)
    strategy_groups: bool = True
    # plans made elsewhere, to be measured with their groups: graph_key -> [(name, groups)]
    # (`fusion-plan collect --plans FILE`; e.g. plans of models that never saw the graph)
    extra_plans: Mapping[str, Sequence[tuple[str, Sequence[Sequence[int]]]]] = field(
        default_factory=dict
    )
    out: str | Path = "data/profiles.parquet"
    resume: bool = False
    max_seconds: float | None = None
    workers: int = 0
    device: str | None = None  # torch device; None: cuda when available, else cpu
    seed: int = 0
    flush_every_s: float = 60.0
    max_jobs: int | None = None
    threads: int | None = None  # torch intra-op threads while measuring (CPU: 1 is steadier)
    warm_first: bool = True  # with workers: compile everything before timing anything


@dataclass
class CollectSummary:
    jobs: int = 0
    planned: int = 0
    skipped: int = 0  # already in the file
    measured: int = 0
    failed: int = 0
    seconds: float = 0.0
    stopped_early: bool = False
    rows_in_file: int = 0
    errors: list[str] = field(default_factory=list)


def jobs_for(
    models: Sequence[str], shapes: Sequence[str] | None, dtypes: Sequence[str], kind: str
) -> list[Job]:
    """Every (model, shape, dtype); with shapes None, each model's DEFAULT_SHAPES."""
    out = []
    for model in models:
        name = model.removeprefix("zoo:")
        if shapes is not None:
            sweep = list(shapes)
        elif name in DEFAULT_SHAPES[kind]:
            sweep = DEFAULT_SHAPES[kind][name].split(";")
        else:
            sweep = [""]  # the model's defaults
        for shape in sweep:
            try:
                spec = modelspec.resolve(model, shape)
            except ModelSpecError:
                continue  # this shape does not apply to this model (e.g. S for a conv)
            canon = ",".join(f"{k}={v}" for k, v in spec.params.items())
            for dtype in dtypes:
                out.append(Job(model, canon, modelspec.dtype_name(modelspec.parse_dtype(dtype))))
    return out


def _work(graph: OpGraph, nodes: Sequence[int]) -> bool:
    return any(graph.nodes[i].category is not Category.VIEW for i in nodes)


def plan_units(
    graph: OpGraph,
    job: Job,
    plan_makers: Mapping[str, PlanMaker],
    config: CollectConfig,
    device_fp: str,
    torch_version: str,
    device_spec: Any = None,
    notes: list[str] | None = None,
) -> list[Unit]:
    """The units of one graph, in measuring order, without duplicates (see module doc)."""
    rng = random.Random(f"{graph.key}:{config.seed}")
    units: dict[str, Unit] = {}

    def add(kind: str, groups: Sequence[Sequence[int]], strategy: str) -> None:
        gs = tuple(tuple(sorted(g)) for g in groups)
        if kind == "group":
            if not _work(graph, gs[0]):
                return
            real = realization_of(graph, gs[0])
            key = row_key(graph.key, list(gs[0]), device_fp, job.dtype, real, torch_version)
        else:
            real = "auto"
            key = row_key(
                graph.key, [list(g) for g in gs], device_fp, job.dtype, real, torch_version
            )
        units.setdefault(key, Unit(kind, gs, strategy, real, key))

    plans: list[tuple[str, Partition]] = [("unfused", Partition.singletons(graph))]
    for name, make in plan_makers.items():
        try:
            plans.append((name, make(graph)))
        except FusionPlannerError as e:  # a strategy that fails here is noted, not fatal
            if notes is not None:
                notes.append(f"{job.label}: strategy {name} failed: {e}")
    for name, groups in config.extra_plans.get(graph.key, ()):
        try:
            plans.append((name, Partition.from_groups(graph, groups)))
        except (FusionPlannerError, ValueError, IndexError) as e:
            if notes is not None:
                notes.append(f"{job.label}: plan {name} does not fit the graph: {e}")
    if config.strategy_groups:
        for name, p in plans[1:]:
            for g in p.groups:
                add("group", [g], name)
    for g in random_groups(graph, config.groups_per_graph, rng, spec=device_spec):
        add("group", [g], "")
    if config.singles:
        for i in range(len(graph)):
            add("group", [[i]], "")
    for _ in range(config.random_plans):
        plans.append(("random", random_partition(graph, rng, spec=device_spec)))
    if config.plan_groups:  # after every draw, so the random groups above stay the same
        for name, p in plans:
            if name == "random":
                for g in p.groups:
                    add("group", [g], "random")
    for name, p in plans:
        add("plan", p.groups, name)
    return list(units.values())


def _row(
    job: Job,
    graph: OpGraph,
    unit: Unit,
    outcome: Measurement,
    cost_model: CostModel,
    device: str,
    device_fp: str,
    torch_version: str,
) -> dict[str, Any]:
    descs = [group_descriptor(graph, g) for g in unit.groups]
    costs = [cost_model.group_cost(graph, frozenset(g)) for g in unit.groups]
    desc = descs[0] if len(descs) == 1 else _sum_descriptors(descs)
    t = outcome.timing
    row: dict[str, Any] = {
        "key": unit.key,
        "kind": unit.kind,
        "model": job.model,
        "family": job.model.removeprefix("zoo:"),
        "shape": job.shape,
        "graph_key": graph.key,
        "structure_key": graph.structure_key,
        "nodes": json.dumps(list(unit.groups[0]) if unit.kind == "group" else unit.groups),
        "n_groups": len(unit.groups),
        "strategy": unit.strategy,
        "realization": (
            dominant_realization(outcome.realizations) if unit.kind == "plan" else unit.realization
        ),
        "dtype": job.dtype,
        "device": device,
        "device_fingerprint": device_fp,
        "torch_version": torch_version,
        "analytical_s": sum(c.latency_s for c in costs),
        "pred_t_compute_s": sum(c.t_compute_s for c in costs),
        "pred_t_memory_s": sum(c.t_memory_s for c in costs),
        "pred_t_launch_s": sum(c.t_launch_s for c in costs),
        "measured_median_s": t.median_s if t else math.nan,
        "measured_p99_s": t.p99_s if t else math.nan,
        "measured_iqr_s": t.iqr_s if t else math.nan,
        "measured_min_s": t.min_s if t else math.nan,
        "reps": t.reps if t else 0,
        "stable": bool(t.stable) if t else False,
        "compile_s": float(outcome.compile_s),
        "ok": outcome.ok,
        "error": str(outcome.error or "")[:500],
        "created_at": now_iso(),
        "collector_version": COLLECTOR_VERSION,
        "cuda_graph": outcome.cuda_graph,
        "graph_copies": t.copies if t else 0,
        "call_median_s": outcome.call_s,
        "n_fallbacks": len(outcome.fallbacks),
        "realizations": json.dumps(
            [realization_of(graph, g) for g in unit.groups] if unit.kind == "plan" else []
        ),
    }
    for k, v in desc.items():
        row[f"desc_{k}"] = v
    return row


def _sum_descriptors(descs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Whole-plan descriptor: sums of the groups' numbers (maxima for sizes)."""
    out: dict[str, Any] = {}
    maxima = {"max_out_numel", "log2_max_out_numel", "anchor_max_flops", "descriptor_version"}
    for k in descs[0]:
        vals = [d[k] for d in descs]
        if isinstance(vals[0], str):
            out[k] = vals[0] if k == "dtype" else ";".join(v for v in vals if v)
        elif k in maxima:
            out[k] = max(vals)
        elif k == "itemsize":
            out[k] = min(vals)
        else:
            out[k] = sum(vals)
    return out


def plan_and_warm(
    job: Job,
    device: str,
    plan_makers: Mapping[str, PlanMaker],
    config: CollectConfig,
    known: frozenset[str],
) -> tuple[str, list[Unit], list[str]]:
    """In a compile worker: export `job` on `device`, plan its units, compile every group
    they will compile (Inductor's on-disk cache keeps the result for the measuring
    process). Returns (graph key, every unit, notes): the measuring process skips those
    in its file, and counts them."""
    dev = torch.device(device)
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        captured, _ = export_on(job.model, job.shape, job.dtype, dev)
        graph = captured.graph
        units = plan_units(
            graph,
            job,
            plan_makers,
            config,
            device_fingerprint(dev),
            torch.__version__.split("+")[0],
            get_spec(local_device_name(dev)),
            notes,
        )
        todo = [u for u in units if u.key not in known]
        seen: set[tuple[int, ...]] = set()
        for u in todo:
            for g in u.groups:
                real = u.realization if u.kind == "group" else realization_of(graph, g)
                if real == "eager" or g in seen:
                    continue
                seen.add(g)
                with contextlib.suppress(Exception):  # failures are measured (and kept) later
                    group_unit(captured, g, real)
    return graph.key, units, notes


class Collector:
    """Runs a collection (see the module doc); `progress` receives one line per event.

    Without workers the measuring process plans and compiles each job itself. With
    workers, each job is exported, planned and compiled in a worker ahead of time (jobs go
    to the pool in order), and the measuring process takes the planned units from it.
    `plan_makers` must then be picklable (module-level functions or objects).
    """

    def __init__(
        self,
        config: CollectConfig,
        cost_model: CostModel,
        plan_makers: Mapping[str, PlanMaker] | None = None,
        progress: Callable[[str], None] = print,
    ):
        self.config = config
        self.cost_model = cost_model
        self.plan_makers = dict(plan_makers or {})
        self.progress = progress
        self.device = torch.device(
            config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.device_name = local_device_name(self.device)
        self.device_fp = device_fingerprint(self.device)
        self.torch_version = torch.__version__.split("+")[0]
        self.spec = get_spec(self.device_name)
        self.runner = unit_runner(self.device)

    def _plan(self, graph: OpGraph, job: Job, notes: list[str]) -> list[Unit]:
        return plan_units(
            graph,
            job,
            self.plan_makers,
            self.config,
            self.device_fp,
            self.torch_version,
            self.spec,
            notes,
        )

    def run(self) -> CollectSummary:
        cfg = self.config
        t0 = time.perf_counter()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        summary = CollectSummary()
        store = ProfileStore(cfg.out, resume=cfg.resume)
        kind = "gpu" if self.device.type == "cuda" else "cpu"
        jobs = jobs_for(cfg.models, cfg.shapes, cfg.dtypes, kind)
        rng = random.Random(cfg.seed)
        rng.shuffle(jobs)  # interleave models: a session cut short still covers many
        if cfg.max_jobs is not None:
            jobs = jobs[: cfg.max_jobs]
        self.progress(
            f"collect: {len(jobs)} graphs, {len(store)} rows already in {cfg.out}; measuring on "
            f"{self.device_name} ({self.device_fp}), {cfg.workers} compile workers"
        )
        pool = WarmPool(cfg.workers) if cfg.workers > 0 else None
        ahead: dict[Job, Future] = {}
        if pool is not None:
            known = frozenset(store.keys)
            for job in jobs:
                ahead[job] = pool.submit(
                    plan_and_warm, job, str(self.device), self.plan_makers, cfg, known
                )
        if pool is not None and cfg.warm_first:
            self._warm_all(ahead, t0)
            pool.close()  # nothing runs beside the timer from here on
            pool = None
        last_flush = time.perf_counter()
        try:
            for n, job in enumerate(progress_bars.track(jobs, "collect", unit="graph")):
                if self._out_of_time(t0):
                    summary.stopped_early = True
                    break
                planned = self._planned_ahead(ahead.get(job), t0)
                self._run_job(job, n, len(jobs), planned, store, summary, t0)
                if time.perf_counter() - last_flush > cfg.flush_every_s:
                    store.flush()
                    last_flush = time.perf_counter()
                if summary.stopped_early:
                    break
        finally:
            store.flush()
            if pool is not None:
                pool.close()
        summary.seconds = time.perf_counter() - t0
        summary.rows_in_file = len(store)
        self.progress(
            f"collect: measured {summary.measured} units ({summary.failed} failed, "
            f"{summary.skipped} already there) in {summary.seconds:.0f} s; "
            f"{summary.rows_in_file} rows in {cfg.out}"
            + (
                " (stopped at --max-seconds; run again with --resume)"
                if summary.stopped_early
                else ""
            )
        )
        return summary

    def _warm_all(self, ahead: dict[Job, Future], t0: float) -> None:
        """Wait until the workers have planned and compiled every job, or until
        WARM_SHARE of `max_seconds` is used: jobs not warmed by then are planned and
        compiled by the measuring process itself, between its timings."""
        limit = self.config.max_seconds
        deadline = None if limit is None else t0 + WARM_SHARE * limit
        self.progress(f"collect: compiling {len(ahead)} graphs in the workers before timing")
        for k, future in enumerate(ahead.values()):
            wait = None if deadline is None else deadline - time.perf_counter()
            if wait is not None and wait <= 0:
                self.progress(f"  warm-up stopped at {k}/{len(ahead)} (time share used)")
                return
            with contextlib.suppress(Exception):  # failed or late: the job is planned here
                future.result(timeout=wait)
            if (k + 1) % 10 == 0 or k + 1 == len(ahead):
                self.progress(
                    f"  compiled {k + 1}/{len(ahead)} in {time.perf_counter() - t0:.0f} s"
                )

    def _planned_ahead(
        self, future: Future | None, t0: float
    ) -> tuple[str, list[Unit], list[str]] | None:
        if future is None:
            return None
        limit = self.config.max_seconds
        timeout = None if limit is None else max(1.0, limit - (time.perf_counter() - t0))
        try:
            return future.result(timeout=timeout)
        except Exception:  # the worker failed or is late: plan here
            return None

    def _out_of_time(self, t0: float) -> bool:
        limit = self.config.max_seconds
        return limit is not None and time.perf_counter() - t0 > limit

    def _run_job(
        self,
        job: Job,
        n: int,
        n_jobs: int,
        planned: tuple[str, list[Unit], list[str]] | None,
        store: ProfileStore,
        summary: CollectSummary,
        t0: float,
    ) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                captured, _ = export_on(job.model, job.shape, job.dtype, self.device)
                _, values = reference(captured)
        except Exception as e:
            summary.errors.append(f"{job.label}: export failed: {type(e).__name__}: {e}")
            self.progress(f"  {job.label}: export failed ({type(e).__name__}: {str(e)[:200]})")
            return
        graph = captured.graph
        if planned is not None and planned[0] == graph.key:
            units = planned[1]
            summary.errors.extend(planned[2])
        else:
            units = self._plan(graph, job, summary.errors)
        todo = [u for u in units if not store.has(u.key)]
        summary.planned += len(units)
        summary.skipped += len(units) - len(todo)
        self.progress(f"job {n + 1}/{n_jobs} {job.label}: {len(todo)} units to measure")
        for k, unit in enumerate(todo):
            if self._out_of_time(t0):
                summary.stopped_early = True
                break
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if unit.kind == "group":
                    outcome = measure_group(
                        captured, values, unit.groups[0], unit.realization, runner=self.runner
                    )
                else:
                    outcome = measure_plan(captured, unit.groups, runner=self.runner)
            row = _row(
                job,
                graph,
                unit,
                outcome,
                self.cost_model,
                self.device_name,
                self.device_fp,
                self.torch_version,
            )
            store.add(row)
            summary.measured += 1
            summary.failed += not outcome.ok
            med = f"{human.seconds(outcome.timing.median_s):>9}" if outcome.timing else "   failed"
            self.progress(
                f"  [{k + 1}/{len(todo)}] {time.perf_counter() - t0:6.0f}s {unit.kind} "
                f"{sum(map(len, unit.groups))} ops {row['realization']}: {med} "
                f"(pred {human.seconds(row['analytical_s'])})"
                + (f" {str(outcome.error)[:120]}" if outcome.error else "")
            )
        del values
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
