"""The offline tuning job: for each shape bucket, search, realize, measure, keep the best.

This is the composition root of the pipeline (design.md): it wires the strategies
(search), the cost model (learned_cost), realization (planner.realize), measurement
(profiling) and the plan cache (planner.cache). Per bucket:

1. build the model at the bucket's representative shape on this machine's device and
   capture it (the graph's structure_key is the cache's model key);
2. plan with the chosen strategy (Optuna studies live in `storage`, one per graph and
   bucket) and with the baselines, under the cost model;
3. realize the `top_k` distinct candidates (lowest predicted first), check each against
   eager on fresh inputs, time it; a candidate that fails is dropped, never stored;
4. keep the measured best, feed every measurement to the cost model's online update
   (when it has one), and store the plan (with its measurement) for the bucket.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from learned_cost.online import Observation
from planner.buckets import Bucket, BucketSpec, parse_dynamic
from planner.cache import PlanCache
from planner.cost import CostModel
from planner.errors import FusionPlannerError
from planner.hardware import device_fingerprint, local_device_name
from planner.modelspec import ModelSpec, dtype_name
from planner.objective import Objective
from planner.partition import Partition
from planner.plan import Plan
from planner.realize import realize
from planner.runtime_graph import capture_for_serving
from profiling.timer import Timing, measure
from profiling.verify import verify_against_eager
from search.parallel import tune_parallel
from search.strategy import Budget, get_strategy

log = logging.getLogger(__name__)

BASELINES = ("priority", "greedy")


@dataclass(frozen=True)
class TuneConfig:
    """What a tuning job does; the CLI fills it from flags."""

    spec: ModelSpec
    dynamic: str  # e.g. "S=128..4096"
    buckets: str = "pow2"  # bucket policy text (planner.buckets.parse_policy)
    strategy: str = "tpe"
    budget_evals: int | None = None
    budget_seconds: float | None = 30.0
    trials: int | None = None  # Optuna trials (tpe / nsga2)
    top_k: int = 3
    dtype: torch.dtype = torch.float32
    storage: str | None = None  # Optuna storage URL (None: in memory)
    workers: int = 1
    seed: int = 0
    compile_baseline: bool = True
    timer: dict[str, Any] = field(
        default_factory=lambda: {"warmup": 3, "min_reps": 10, "max_reps": 100, "max_seconds": 5.0}
    )


@dataclass(frozen=True)
class Candidate:
    strategy: str
    partition: Partition
    predicted_s: float
    measured: Timing | None = None
    error: str = ""


@dataclass(frozen=True)
class BucketResult:
    bucket: Bucket
    params: dict[str, int]
    plan: Plan | None
    candidates: tuple[Candidate, ...]
    eager: Timing
    compiled: Timing | None
    search_s: float
    realize_s: float
    stored: str  # what the cache did with the plan

    @property
    def best(self) -> Candidate | None:
        ok = [c for c in self.candidates if c.measured is not None]
        return min(ok, key=lambda c: c.measured.median_s) if ok else None


def bucket_spec(cfg: TuneConfig) -> BucketSpec:
    return parse_dynamic(cfg.dynamic, cfg.spec.dims, cfg.buckets)


def _strategy_kwargs(cfg: TuneConfig, bucket_key: str) -> dict[str, Any]:
    if cfg.strategy in ("tpe", "nsga2"):
        kw: dict[str, Any] = {"storage": cfg.storage, "bucket_id": bucket_key}
        if cfg.trials:
            kw["max_trials"] = cfg.trials
        return kw
    return {}


def search_candidates(
    graph: Any, objective: Objective, cfg: TuneConfig, bucket_key: str
) -> list[Candidate]:
    """The main strategy's plan and the baselines', distinct, lowest predicted first."""
    budget = Budget(max_evals=cfg.budget_evals, max_seconds=cfg.budget_seconds)
    names = [cfg.strategy, *(b for b in BASELINES if b != cfg.strategy)]
    seen: dict[Partition, Candidate] = {}
    for name in names:
        if name == cfg.strategy and cfg.workers > 1:
            results = tune_parallel(
                graph,
                objective,
                n_workers=cfg.workers,
                storage_url=cfg.storage or "",
                bucket_id=bucket_key,
                strategy=name,
                budget=budget,
                seed=cfg.seed,
                trials_per_worker=cfg.trials or 50,
            )
            part = Partition.from_groups(graph, min(results, key=lambda r: r.total_s).groups)
        elif name == cfg.strategy:
            strat = get_strategy(name, **_strategy_kwargs(cfg, bucket_key))
            part = strat.plan(graph, objective, budget, cfg.seed).partition
        else:  # the deterministic baselines: milliseconds, no budget needed
            part = (
                get_strategy(name)
                .plan(graph, objective, Budget(max_seconds=60), cfg.seed)
                .partition
            )
        ev = objective.evaluate(part)
        if part not in seen and ev.legal:
            seen[part] = Candidate(name, part, ev.total_s)
    return sorted(seen.values(), key=lambda c: c.predicted_s)


def _timed(fn: Callable[[], Any], dev: torch.device, dtype: str, cfg: TuneConfig) -> Timing:
    with torch.no_grad():
        return measure(fn, device=dev, dtype=dtype, **cfg.timer)


def _say(msg: str) -> None:
    print(f"[tune] {msg}", file=sys.stderr, flush=True)


def tune_bucket(
    cfg: TuneConfig,
    spec: BucketSpec,
    bucket: Bucket,
    cost_model: CostModel,
    cache: PlanCache | None,
    *,
    progress: Callable[[str], None] = _say,
) -> BucketResult:
    """Search, realize, verify, measure and store the plan of one bucket."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = local_device_name(dev)
    dt = dtype_name(cfg.dtype)
    params = spec.representative_params(bucket)
    mspec = cfg.spec.with_params(**params)
    module, inputs = mspec.build(dtype=cfg.dtype, device=dev, seed=cfg.seed)
    captured = capture_for_serving(module, inputs, name=mspec.label)
    reference = captured.program.module()  # the model as the captured program computes it
    graph = captured.graph
    objective = Objective(cost_model)
    t0 = time.perf_counter()
    cands = search_candidates(graph, objective, cfg, bucket.key)
    search_s = time.perf_counter() - t0
    progress(
        f"bucket {bucket.key} at {params}: {len(graph.nodes)} ops, "
        f"{len(cands)} distinct candidate(s) in {search_s:.1f}s; measuring top {cfg.top_k}"
    )
    eager = _timed(lambda: module(*inputs), dev, dt, cfg)
    compiled = None
    if cfg.compile_baseline:
        cmod = torch.compile(module)
        with torch.no_grad():
            cmod(*inputs)
        compiled = _timed(lambda: cmod(*inputs), dev, dt, cfg)
        torch._dynamo.reset()
    measured: list[Candidate] = []
    t0 = time.perf_counter()
    for c in cands[: cfg.top_k]:
        try:
            rp = realize(captured, c.partition, device=dev)
            check = verify_against_eager(rp, reference, inputs)
            if not check.ok:
                raise FusionPlannerError(f"does not match eager: {check}")
            timing = _timed(lambda rp=rp: rp(*inputs), dev, dt, cfg)
            c = Candidate(c.strategy, c.partition, c.predicted_s, timing)
            progress(
                f"  {c.strategy:<9} {len(c.partition):>3} groups: predicted "
                f"{c.predicted_s * 1e6:9.1f} us, measured {timing.median_s * 1e6:9.1f} us"
            )
        except Exception as e:  # a candidate that fails is dropped, never stored
            c = Candidate(c.strategy, c.partition, c.predicted_s, None, f"{type(e).__name__}: {e}")
            progress(f"  {c.strategy:<9} failed: {c.error[:200]}")
        measured.append(c)
    realize_s = time.perf_counter() - t0
    _online_update(cost_model, graph, measured, progress)
    best = min((c for c in measured if c.measured), key=lambda c: c.measured.median_s, default=None)
    plan, stored = None, "nothing measured: no plan stored"
    if best is not None:
        ev = objective.evaluate(best.partition)
        plan = objective.make_plan(
            best.partition, ev, strategy=best.strategy, device=device, dtype=dt
        )
        plan = plan.with_measurement(
            best.measured.median_s,
            best.measured.p99_s,
            eager_s=eager.median_s,
            device_fingerprint=device_fingerprint(dev),
        )
        if cache is not None:
            cache.set_bucket_spec(graph.structure_key, spec)
            stored = str(cache.store(plan, bucket, label=mspec.label))
        else:
            stored = "not stored (no cache)"
    return BucketResult(
        bucket, params, plan, tuple(measured), eager, compiled, search_s, realize_s, stored
    )


def _online_update(
    cost_model: CostModel, graph: Any, measured: list[Candidate], progress: Callable[[str], None]
) -> None:
    """Seed 7.4.3: the learned model refines itself on what was just measured."""
    update = getattr(cost_model, "update", None)
    obs = [c for c in measured if c.measured is not None]
    if update is None or not obs:
        return
    report = update(
        [Observation.of_plan(graph, c.partition.groups, c.measured.median_s) for c in obs]
    )
    progress(f"  cost model updated online: {report}")


def tune(
    cfg: TuneConfig,
    cost_model: CostModel,
    cache: PlanCache | None,
    *,
    only_buckets: set[str] | None = None,
    progress: Callable[[str], None] = _say,
) -> list[BucketResult]:
    """Tune every bucket of `cfg.dynamic` (or only `only_buckets`)."""
    spec = bucket_spec(cfg)
    _module, inputs = cfg.spec.build(dtype=cfg.dtype, device="meta")
    base = [tuple(x.shape) for x in inputs if isinstance(x, torch.Tensor)]
    buckets = [b for b in spec.buckets(base) if only_buckets is None or b.key in only_buckets]
    progress(
        f"{cfg.spec.spec}: {len(buckets)} bucket(s) over {cfg.dynamic} ({spec.describe()}), "
        f"strategy {cfg.strategy}, cost model {cost_model.name}/{cost_model.version}"
    )
    out = []
    for i, b in enumerate(buckets, 1):
        progress(f"[{i}/{len(buckets)}] bucket {b.key}")
        out.append(tune_bucket(cfg, spec, b, cost_model, cache, progress=progress))
    return out
