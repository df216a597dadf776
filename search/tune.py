"""The offline tuning job: for each shape bucket, search, realize, measure, keep the best.

This is the composition root of the pipeline (docs/architecture.md): it wires the strategies
(search), the cost model (learned_cost), realization (planner.realize.realizer), measurement
(profiling) and the plan cache (planner.plans.cache). Per bucket:

1. build the model at the bucket's representative shape on this machine's device and
   capture it (the graph's structure_key is the cache's model key);
2. plan with the chosen strategy (Optuna studies live in `storage`, one per graph and
   bucket) and with the baselines, under the cost model;
3. measure the `top_k` distinct candidates (lowest predicted first) with the runner
   (profiling.runner): each is served by the `torch.compile` backend for the bucket,
   checked against eager on fresh inputs (groups that fail fall back alone, and are
   reported) and timed through the backend's per-call path, so the latency stored is the
   one the backend delivers; a candidate that cannot run, is not served as given or still
   disagrees is dropped, never stored;
4. keep the measured best, feed every measurement to the cost model's online update
   (when it has one), and store the plan (with its measurement) for the bucket.

A model whose program is a tensor-parallel rank program also gets its tensor-parallel
decision (chunked row-parallel GEMMs, fused epilogue) searched and recorded in the plan;
search/tune_tp.py says when it is measured (on real ranks) and when it is recorded from
its prediction only (in one process).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from learned_cost.online import Observation
from planner import progress as progress_bars
from planner import units
from planner.cost import CostModel
from planner.errors import CacheError, FusionPlannerError, first_line, is_out_of_memory
from planner.fusion.partition import Partition
from planner.fusion.realization import choices_for, realizations_of
from planner.hardware import device_fingerprint, local_device_name
from planner.measurement import MeasureError, Measurement, PlanJob, Runner, Timing
from planner.objective import Objective
from planner.plans.buckets import Bucket, BucketSpec, parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan, TPChoice
from planner.runtime.graph import export_served
from profiling.runner import STEADY_TIMER, DeviceRunner, ServedExecutor, first_call
from search.optuna_storage import check_storage, storage_kind
from search.parallel import OPTUNA_STRATEGIES, plan_through_outages, tune_parallel
from search.strategies import get_strategy
from search.strategy import Budget
from search.tune_parts import Part, served_graphs, whole_model_served
from search.tune_store import (
    in_served_order,
    inside_alias,
    served_order,
    store_plan,
)
from search.tune_tp import (
    agree_calls,
    agree_error,
    agreed,
    describe,
    on_ranks,
    search_decision,
    slowest,
)
from zoo.modelspec import ModelSpec, dtype_name

log = logging.getLogger(__name__)

BASELINES = ("priority", "greedy")


@dataclass(frozen=True)
class TuneConfig:
    """What a tuning job does; the CLI fills it from flags."""

    spec: ModelSpec
    dynamic: str  # e.g. "S=128..4096"
    buckets: str = "pow2"  # bucket policy text (planner.plans.buckets.parse_policy)
    strategy: str = "joint-tpe"
    budget_evals: int | None = None
    budget_seconds: float | None = 30.0
    trials: int | None = None  # Optuna trials (tpe / nsga2)
    top_k: int = 3
    dtype: torch.dtype = torch.float32
    storage: str | None = None  # Optuna storage URL (None: in memory)
    workers: int = 1
    heartbeat_s: int | None = None  # database storages: heartbeat interval (None: Optuna's 60)
    seed: int = 0
    compile_baseline: bool = True
    # store the unfused plan (served as the model's own graph) when eager measured faster
    # than every candidate beyond their spread; False stores the fastest candidate anyway
    prefer_eager: bool = True
    # also measure the fastest candidate with its GEMM and convolution groups compiled by
    # Inductor's max-autotune (templates benchmarked, the epilogue fused into the winner)
    autotune_variant: bool = False
    timer: dict[str, Any] = field(
        default_factory=lambda: {"warmup": 3, "min_reps": 10, "max_reps": 100, "max_seconds": 5.0}
    )


@dataclass(frozen=True)
class Candidate:
    strategy: str  # what found it: a strategy name (a baseline's when they found the same)
    partition: Partition
    predicted_s: float
    measured: Timing | None = None
    error: str = ""
    fallbacks: dict[int, str] = field(default_factory=dict)  # group -> why it runs eagerly
    measurement: Measurement | None = None  # the runner's whole record
    labels: tuple[str, ...] | None = None  # each group's realization (None: the rule's)
    found_by: str = ""  # within a joint search: the warm start, enumeration, a trial
    copies: tuple[tuple[int, int], ...] = ()  # recompute (planner.fusion.recompute)
    tensor_parallel: TPChoice | None = None  # the rank program's decision (search.tune_tp)

    @property
    def key(self) -> tuple[Partition, tuple[str, ...], tuple[tuple[int, int], ...]]:
        labels = self.labels or realizations_of(self.partition.graph, self.partition.masks)
        return self.partition, labels, self.copies


@dataclass(frozen=True)
class BucketResult:
    bucket: Bucket
    params: dict[str, int]
    plan: Plan | None
    candidates: tuple[Candidate, ...]
    eager: Timing | None  # None: the bucket failed before eager was timed (see `stored`)
    compiled: Timing | None
    search_s: float
    realize_s: float
    stored: str  # what the cache did with the plan, or why the bucket failed
    tensor_parallel: str = ""  # what became of a rank program's decision (search.tune_tp)
    part: str = ""  # which graph of a model with graph breaks ("graph 2 of 3"; "": whole)
    # a model with graph breaks, once its graphs are tuned: the whole model served through
    # the backend and eager (search.tune_parts.whole_model_served), on each graph's result
    model_eager: Timing | None = None
    model_served: Timing | None = None
    model_note: str = ""  # why those are missing, or what they include

    @property
    def best(self) -> Candidate | None:
        ok = [c for c in self.candidates if c.measured is not None]
        return min(ok, key=lambda c: c.measured.median_s) if ok else None


def bucket_spec(cfg: TuneConfig) -> BucketSpec:
    return parse_dynamic(cfg.dynamic, cfg.spec.dims, cfg.buckets)


def check_config(cfg: TuneConfig) -> None:
    """Refuse a job that could only fail or silently do something else, before any search:
    numbers out of range, a storage that does not parse, open or fit the strategy."""
    if cfg.budget_seconds is not None and not (
        math.isfinite(cfg.budget_seconds) and cfg.budget_seconds > 0
    ):
        raise FusionPlannerError(
            f"budget_seconds must be a finite number > 0, got {cfg.budget_seconds}"
        )
    for name in ("budget_evals", "trials"):
        v = getattr(cfg, name)
        if v is not None and v < 1:
            raise FusionPlannerError(f"{name} must be >= 1, got {v}")
    if cfg.top_k < 1 or cfg.workers < 1:
        raise FusionPlannerError(f"top_k and workers must be >= 1, got {cfg.top_k}, {cfg.workers}")
    if cfg.storage is not None and cfg.strategy not in OPTUNA_STRATEGIES:
        raise FusionPlannerError(
            f"--storage holds Optuna studies, which strategy {cfg.strategy!r} does not use: "
            f"drop --storage or use --strategy {' or '.join(OPTUNA_STRATEGIES)}"
        )
    if cfg.workers > 1:
        if cfg.strategy not in OPTUNA_STRATEGIES:
            raise FusionPlannerError(
                f"--workers shares an Optuna study: use --strategy "
                f"{' or '.join(OPTUNA_STRATEGIES)}, not {cfg.strategy!r}"
            )
        kind = storage_kind(cfg.storage)
        if kind in ("memory", "sqlite"):
            raise FusionPlannerError(
                f"--workers {cfg.workers} needs a storage the worker processes can share, not "
                f"{kind}: pass --storage journal (local processes) or a database URL"
            )
    if cfg.heartbeat_s is not None and (
        cfg.heartbeat_s < 1
        or cfg.strategy not in OPTUNA_STRATEGIES
        or storage_kind(cfg.storage) != "rdb"
    ):
        raise FusionPlannerError(
            f"--heartbeat {cfg.heartbeat_s}: heartbeats (>= 1 s) are kept by database "
            "storages only: pass --storage postgresql+psycopg://... with --strategy tpe or nsga2"
        )
    if cfg.strategy in OPTUNA_STRATEGIES:
        check_storage(cfg.storage)


def _strategy_kwargs(cfg: TuneConfig, bucket_key: str) -> dict[str, Any]:
    if cfg.strategy in ("tpe", "nsga2"):
        kw: dict[str, Any] = {"storage": cfg.storage, "bucket_id": bucket_key}
        if cfg.trials:
            kw["max_trials"] = cfg.trials
        if cfg.heartbeat_s is not None:
            kw["heartbeat_s"] = cfg.heartbeat_s
        return kw
    return {}


def search_candidates(
    graph: Any,
    objective: Objective,
    cfg: TuneConfig,
    bucket_key: str,
    progress: Callable[[str], None] | None = None,
) -> list[Candidate]:
    """The main strategy's plan(s) and the baselines', distinct, lowest predicted first.

    A plan the main strategy shares with a baseline is the baseline's (it found nothing
    new). A joint strategy (search/strategies/joint.py) contributes its `top_k` best points,
    each with its realization labels and what found it."""
    budget = Budget(max_evals=cfg.budget_evals, max_seconds=cfg.budget_seconds)
    names = [*(b for b in BASELINES if b != cfg.strategy), cfg.strategy]
    if cfg.strategy in BASELINES:
        names = [cfg.strategy, *(b for b in BASELINES if b != cfg.strategy)]
    seen: dict[Any, Candidate] = {}
    for name in names:
        if name == cfg.strategy and name in JOINT:
            res = get_strategy(name, **_joint_kwargs(cfg)).plan(graph, objective, budget, cfg.seed)
            if progress is not None:
                progress(f"  {name}: {res.notes}")
            for part, labels, pred, found_by, copies in res.extra.get("variants", [])[: cfg.top_k]:
                c = Candidate(name, part, pred, labels=labels, found_by=found_by, copies=copies)
                seen.setdefault(c.key, c)
            continue
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
                heartbeat_s=cfg.heartbeat_s,
            )
            part = Partition.from_groups(graph, min(results, key=lambda r: r.total_s).groups)
        elif name == cfg.strategy:
            kw = _strategy_kwargs(cfg, bucket_key)
            res = plan_through_outages(name, kw, graph, objective, budget, cfg.seed)
            if res.notes.startswith("failed:"):  # said out loud: the baselines compete alone
                _say(f"  {name} search {res.notes[:300]}; measuring the baselines' plans")
            elif progress is not None and res.notes:  # e.g. a small space enumerated whole
                progress(f"  {name}: {res.notes}")
            part = res.partition
        else:  # the deterministic baselines: milliseconds, no budget needed
            part = (
                get_strategy(name)
                .plan(graph, objective, Budget(max_seconds=60), cfg.seed)
                .partition
            )
        ev = objective.evaluate(part)
        c = Candidate(name, part, ev.total_s)
        if c.key not in seen and ev.legal:
            seen[c.key] = c
    return sorted(seen.values(), key=lambda c: c.predicted_s)


JOINT = ("joint-tpe", "joint-nsga2", "joint-rl")


def to_measure(cands: list[Candidate], cfg: TuneConfig) -> list[Candidate]:
    """The `top_k` lowest predicted; with a joint strategy, priority's plan too (the
    reference the search started from is measured, whatever the model says of it)."""
    out = cands[: cfg.top_k]
    if cfg.strategy in JOINT:
        out += [c for c in cands[cfg.top_k :] if c.strategy == "priority"]
    return out


# Without --trials a joint search samples until the budget, or until it stops finding new
# plans (its patience), or the space is exhausted: the budget the user gave is what binds.
def _joint_kwargs(cfg: TuneConfig) -> dict[str, Any]:
    return {"max_trials": cfg.trials}


def autotuned(c: Candidate, mode: str = "autotune") -> Candidate | None:
    """`c` with each group that offers it compiled in compile mode `mode` (its label
    "<label>+autotune", or "inductor+autotune" for a GEMM the rule leaves to the library
    call eagerly: Inductor's max-autotune GEMM and convolution templates, the group's
    epilogue fused into the winner; planner.fusion.realization.choices_for), the rest as
    they are; None when no group offers it. Recompute copies are kept."""
    graph = c.partition.graph
    labels = list(c.labels or realizations_of(graph, c.partition.masks))
    changed = False
    for i, mask in enumerate(c.partition.masks):
        want = f"{labels[i] if labels[i] != 'eager' else 'inductor'}+{mode}"
        if "+" not in labels[i] and want in choices_for(graph, mask):
            labels[i], changed = want, True
    if not changed:
        return None
    return dataclasses.replace(
        c,
        strategy=f"{c.strategy}+{mode}",
        labels=tuple(labels),
        found_by=f"{c.strategy}'s plan, GEMM/convolution groups with {mode}",
        measured=None,
        error="",
        fallbacks={},
        measurement=None,
    )


def slower_than(a: Timing, b: Timing) -> bool:
    """Whether `a` is slower than `b` beyond their spread: a's median less half its IQR is
    above b's median plus half its IQR."""
    return a.median_s - a.iqr_s / 2 > b.median_s + b.iqr_s / 2


def candidate_plan(
    objective: Objective, c: Candidate, *, device: str, dtype: str, strategy: str | None = None
) -> Plan:
    """The Plan record of a candidate, with its realization labels when it has its own."""
    ev = objective.evaluate(c.partition)
    plan = objective.make_plan(
        c.partition, ev, strategy=strategy or c.strategy, device=device, dtype=dtype
    )
    plan = dataclasses.replace(plan, tensor_parallel=c.tensor_parallel)
    if c.labels is None:
        return plan
    groups = tuple(dataclasses.replace(gp, realization=r) for gp, r in zip(plan.groups, c.labels))
    notes = f"found by {c.found_by}" if c.found_by else plan.notes
    plan = dataclasses.replace(plan, groups=groups, predicted_s=c.predicted_s, notes=notes)
    return plan.with_copies(c.copies) if c.copies else plan


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
    runner: Runner | None = None,
) -> list[BucketResult]:
    """Search, realize, verify, measure and store the plan of one bucket: one result, or
    one per graph for a model `torch.compile` serves as several graphs (graph breaks,
    search/tune_parts.py).

    Candidates are measured by `runner` (default: profiling.runner.DeviceRunner through
    the serving path, so the stored latency is the one the backend delivers)."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    params = spec.representative_params(bucket)
    mspec = cfg.spec.with_params(**params)
    module, inputs = mspec.build(dtype=cfg.dtype, device=dev, seed=cfg.seed)
    try:
        with torch.no_grad():
            module(*inputs)
    except Exception as e:  # the model's own failure at this shape, not the planner's
        raise FusionPlannerError(
            f"{mspec.label} fails when run eagerly at {params}: {type(e).__name__}: "
            f"{str(e).strip()[:200]}. Narrow --dynamic to the shapes the model supports"
        ) from e
    served = served_graphs(module, inputs, spec, bucket, mspec.label)
    if (parts := served.parts) is not None:  # graph breaks: each served graph tuned alone
        progress(
            f"  {mspec.label} runs as {parts[0].count} graphs under torch.compile (graph "
            "breaks): each is tuned and stored on its own, as the backend looks it up"
        )
        out = []
        for part in parts:
            if part.captured is None:
                progress(f"  {part.label}: not tuned ({part.skipped})")
                out.append(_skipped(bucket, params, part))
                continue
            for note in part.notes:
                progress(f"  {part.label}: {note}")
            ctx = _Program(
                part.module,
                part.inputs,
                part.captured,
                served_spec=part.spec,
                served_bucket=part.bucket,
                bucket=part.bucket,  # the graph's own inputs: in the runtime's order already
                params=params,
                label=mspec.label,
                part=part.label,
                also=part.also,
            )
            out.append(_tune_program(cfg, ctx, cost_model, cache, progress, runner, dev, bucket))
        if cache is not None and not on_ranks() and any(r.plan is not None for r in out):
            eager, whole, why = whole_model_served(
                module, tuple(inputs), cache, dev, cfg.timer, dtype_name(cfg.dtype)
            )
            if whole is not None and eager is not None:
                progress(
                    f"  the whole model through the backend: {units.seconds(whole.median_s)}"
                    f", eager {units.seconds(eager.median_s)}" + (f" ({why})" if why else "")
                )
            else:
                progress(f"  the whole model through the backend: not timed ({why})")
            out = [
                dataclasses.replace(r, model_eager=eager, model_served=whole, model_note=why)
                for r in out
            ]
        return out
    captured = export_served(module, inputs, served.whole, name=mspec.label)
    served_spec, served_bucket = in_served_order(spec, bucket, inputs, captured)
    ctx = _Program(
        module, tuple(inputs), captured, served_spec, served_bucket, bucket, params, mspec.label
    )
    return [_tune_program(cfg, ctx, cost_model, cache, progress, runner, dev, bucket)]


@dataclass(frozen=True)
class _Program:
    """What one tuning of a bucket runs on: the module the backend serves (the user's
    model, or one graph of it between graph breaks) and its inputs, its capture, the spec
    and bucket its plan is stored under (`served_*`, the runtime's input order) and the
    bucket in the call's order (`bucket`: where other shapes of it are made)."""

    module: torch.nn.Module
    inputs: tuple[Any, ...]
    captured: Any
    served_spec: BucketSpec
    served_bucket: Bucket
    bucket: Bucket
    params: dict[str, int]
    label: str
    part: str = ""
    also: tuple[Bucket, ...] = ()  # more buckets the plan is stored for (tune_parts.Part)


def _skipped(bucket: Bucket, params: dict[str, int], part: Part) -> BucketResult:
    why = f"not tuned: {part.skipped}; the backend runs this graph as dynamo's graph"
    return BucketResult(bucket, params, None, (), None, None, 0.0, 0.0, why, part=part.label)


def _tune_program(
    cfg: TuneConfig,
    ctx: _Program,
    cost_model: CostModel,
    cache: PlanCache | None,
    progress: Callable[[str], None],
    runner: Runner | None,
    dev: torch.device,
    job_bucket: Bucket,
) -> BucketResult:
    """Search, measure and store the plan of one program of a bucket (see `tune_bucket`);
    its result is reported under `job_bucket`, the tuning job's bucket."""
    device = local_device_name(dev)
    dt = dtype_name(cfg.dtype)
    module, inputs, captured, params = ctx.module, ctx.inputs, ctx.captured, ctx.params
    served_spec, served_bucket, bucket = ctx.served_spec, ctx.served_bucket, ctx.bucket
    graph = captured.graph
    objective = Objective(cost_model)
    t0 = time.perf_counter()
    cands = search_candidates(graph, objective, cfg, bucket.key, progress)
    search_s = time.perf_counter() - t0
    where = f" {ctx.part}" if ctx.part else ""
    progress(
        f"bucket {served_spec.label(served_bucket)}{where} at {params}: {len(graph.nodes)} ops, "
        f"{len(cands)} distinct candidate(s) in {search_s:.1f}s; measuring top {cfg.top_k}"
    )
    decision = search_decision(captured, cost_model, device)
    tp = decision.choice() if decision is not None else None
    ranks = on_ranks()  # every rank runs this job: each call with collectives on every rank
    if runner is None:
        steady = STEADY_TIMER | {"agree": agree_calls} if ranks else None
        agree = agree_error if ranks else None  # each step's outcome agreed by the ranks
        runner = DeviceRunner(
            executor=ServedExecutor(agree=agree),
            device=dev,
            timer=cfg.timer,
            steady=steady,
            agree=agree,
        )
    # The baselines are timed the way served plans are (profiling.runner: calls back to
    # back in rounds, the runner's `steady` settings), eager and torch.compile interleaved.
    baselines: dict[str, Any] = {"eager": lambda: module(*inputs)}
    setup: dict[str, float] = {}
    if cfg.compile_baseline:
        cmod = torch.compile(module)
        setup["torch.compile"], _ = first_call(lambda: cmod(*inputs), dev)
        baselines["torch.compile"] = lambda: cmod(*inputs)
    timed = runner.measure_interleaved(baselines, dtype=dt, compile_s=setup)
    if ranks:
        timed = {name: slowest(m) for name, m in timed.items()}
    eager_m = timed["eager"]
    if eager_m.timing is None:
        raise FusionPlannerError(f"{ctx.label}: timing eager failed ({eager_m.error})")
    eager = eager_m.timing
    compiled = timed["torch.compile"].timing if cfg.compile_baseline else None
    torch._dynamo.reset()

    def failed(c: Candidate, error: MeasureError) -> Measurement:
        return Measurement(
            c.strategy,
            "served",
            device,
            device_fingerprint(dev),
            torch.__version__.split("+")[0],
            dt,
            error=error,
        )

    def measure(c: Candidate) -> Candidate:
        # On the ranks every step's outcome is agreed before the next one (a rank that
        # failed must not leave the others issuing collectives alone): a failure here is
        # recorded, never raised past the other ranks, and fails the candidate on each.
        m = None
        try:
            plan = candidate_plan(objective, c, device=device, dtype=dt)
        except Exception as e:
            if not ranks:
                raise
            m = failed(c, MeasureError.of("realize", e))
        if ranks and (error := agree_error(m.error if m else None)) is not None:
            m = m or failed(c, error)
        if m is None:
            job = PlanJob(
                captured,
                plan,
                label=c.strategy,
                module=module,
                inputs=tuple(inputs),
                bucket=served_bucket,
                bucket_spec=served_spec,
            )
            try:
                m = runner.measure_plan(job)
            except Exception as e:
                if not ranks:
                    raise
                m = failed(c, MeasureError.of("run", e))
            m = agreed(m) if ranks else m
        c = dataclasses.replace(
            c,
            measured=m.timing,
            error=str(m.error) if m.error else "",
            fallbacks=dict(m.fallbacks),
            measurement=m,
        )
        if m.timing is not None:
            fb = f"; {len(c.fallbacks)} group(s) fell back" if c.fallbacks else ""
            alone = (
                ""
                if math.isnan(m.synced_s)
                else f"; one call waited for {units.seconds(m.synced_s)}"
            )
            progress(
                f"  {c.strategy:<9} {len(c.partition):>3} groups: predicted "
                f"{units.seconds(c.predicted_s)}, measured {units.seconds(m.timing.median_s)}"
                f" ({m.executor}{alone}){fb}"
            )
        else:  # a candidate that fails is dropped, never stored
            progress(f"  {c.strategy:<9} failed: {c.error[:200]}")
        return c

    t0 = time.perf_counter()
    measured = [measure(c) for c in to_measure(cands, cfg)]

    def fastest() -> Candidate | None:
        ok = (c for c in measured if c.measured)
        return min(ok, key=lambda c: c.measured.median_s, default=None)

    best, tp_note = fastest(), ""
    if cfg.autotune_variant and tp is not None:
        progress("  --autotune is not tried on a tensor-parallel program's plans")
    elif cfg.autotune_variant and best is not None:
        variant = autotuned(best)
        if variant is None:
            progress("  no group of the fastest plan offers a max-autotune realization")
        else:
            measured.append(measure(variant))
            best = fastest()
    if tp is not None and best is not None and ranks:  # the decision measured as served
        with_tp = measure(
            dataclasses.replace(best, strategy=f"{best.strategy}+tp", tensor_parallel=tp)
        )
        measured.append(with_tp)
        best = fastest()
        if with_tp.measured is None:
            tp_note = describe(tp, "failed", with_tp.error)
        else:
            kept = best is not None and best.tensor_parallel is not None
            tp_note = describe(tp, "stored" if kept else "slower")
    elif tp is not None and best is not None:  # recorded from its prediction only
        best, tp_note = dataclasses.replace(best, tensor_parallel=tp), describe(tp, "predicted")
    if tp_note:
        progress(f"  {tp_note}")
    realize_s = time.perf_counter() - t0
    _online_update(cost_model, graph, measured, progress)
    # (not for a tensor-parallel rank program: its ranks must store the same plan, and
    # its decision was measured or recorded above)
    if best is not None and tp is None and cfg.prefer_eager and slower_than(best.measured, eager):
        progress(
            f"  eager ({units.seconds(eager.median_s)}) is faster than every candidate (best: "
            f"{best.strategy}, {units.seconds(best.measured.median_s)}): storing the unfused "
            "plan, which the backend serves as the model's own graph"
        )
        unfused = Partition.singletons(graph)
        best = Candidate("eager", unfused, objective.evaluate(unfused).total_s, measured=eager)
        measured.append(best)
    plan, stored = None, "nothing measured: no plan stored"
    if best is not None:
        plan = candidate_plan(objective, best, device=device, dtype=dt)
        synced = best.measurement.synced_s if best.measurement is not None else math.nan
        plan = plan.with_measurement(
            best.measured.median_s,
            best.measured.p99_s,
            eager_s=eager.median_s,
            device_fingerprint=device_fingerprint(dev),
            measured_synced_s=None if math.isnan(synced) else synced,
        )
        if best.tensor_parallel is not None:  # what the notes say of the decision
            plan = dataclasses.replace(plan, notes="; ".join(n for n in (plan.notes, tp_note) if n))
        if cache is not None:
            stored = store_plan(cache, plan, served_spec, served_bucket, ctx.label, progress)
            for other in ctx.also:  # the same graph at other sizes: its plan, not its timing
                progress(f"  the same graph is called at {other.key} too: its plan is stored there")
                store_plan(cache, plan.unmeasured(), served_spec, other, ctx.label, progress)
            alias = inside_alias(module, inputs, bucket, graph, plan, ctx.label)
            if alias is not None:
                progress(
                    f"  the model traces into other ops inside the bucket than at {params}: "
                    "the plan is stored for those ops too"
                )
                store_plan(cache, alias, served_spec, served_bucket, ctx.label, progress)
        else:
            stored = "not stored (no cache)"
    return BucketResult(
        job_bucket,
        params,
        plan,
        tuple(measured),
        eager,
        compiled,
        search_s,
        realize_s,
        stored,
        tp_note,
        part=ctx.part,
    )


def queued_bucket_keys(cache: PlanCache, cfg: TuneConfig, inputs: Any, captured: Any) -> set[str]:
    """Keys of the buckets of `cfg` (numbered in the call's order, as `tune` takes
    `only_buckets`) that hold shapes the runtime queued as misses for `captured`'s graph.
    The queue holds shapes in the order the runtime numbers inputs (`served_order`), so
    they are bucketed by the spec in that order and matched to each bucket in it."""
    spec = bucket_spec(cfg)
    order = served_order(inputs, captured)
    n_served = len(captured.example_inputs)
    served_spec = spec if order is None else spec.renumbered(order)
    key = captured.graph.structure_key
    pending = {b.key for b, _count in cache.pending_buckets(key, served_spec)}
    leaves = [x for x in pytree.tree_leaves(inputs) if isinstance(x, torch.Tensor)]
    out = set()
    for b in spec.buckets([tuple(x.shape) for x in leaves]):
        served = b if order is None else b.renumbered(order, n_served)
        if served.key in pending:
            out.add(b.key)
    return out


def queued_part_buckets(cache: PlanCache, cfg: TuneConfig) -> set[str]:
    """`queued_bucket_keys` for a model with graph breaks: keys of the buckets of `cfg`
    where a graph the backend serves the model as (search/tune_parts.py) has shapes
    queued as misses. Each bucket's graphs are traced at its representative, as `tune`
    traces them; empty for a model dynamo traces as one graph."""
    spec = bucket_spec(cfg)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    _module, inputs = cfg.spec.build(dtype=cfg.dtype, device="meta")
    base = [tuple(x.shape) for x in pytree.tree_leaves(inputs) if isinstance(x, torch.Tensor)]
    out: set[str] = set()
    for i, b in enumerate(spec.buckets(base)):
        mspec = cfg.spec.with_params(**spec.representative_params(b))
        module, inputs = mspec.build(dtype=cfg.dtype, device=dev, seed=cfg.seed)
        served = served_graphs(module, tuple(inputs), spec, b, mspec.label)
        if served.parts is None:
            if i == 0:
                return out  # one graph (or no trace at all): the whole-model queue applies
            continue
        for part in served.parts:
            if part.captured is None or part.spec is None or part.bucket is None:
                continue
            key = part.captured.graph.structure_key
            if any(q.key == part.bucket.key for q, _n in cache.pending_buckets(key, part.spec)):
                out.add(b.key)
    return out


def _online_update(
    cost_model: CostModel, graph: Any, measured: list[Candidate], progress: Callable[[str], None]
) -> None:
    """The learned model refines itself on what was just measured (docs/formulas.md §13).
    Only plans that run the rule's labels: the model prices those (a plan a joint search
    compiled with max-autotune, say, would teach it another realization's time)."""
    update = getattr(cost_model, "update", None)
    obs = [
        c
        for c in measured
        if c.measured is not None
        and not c.copies
        and c.tensor_parallel is None  # the rewritten rank program, not the partition
        and (c.labels is None or c.labels == realizations_of(graph, c.partition.masks))
    ]
    if update is None or not obs:
        return
    report = update(
        [Observation.of_plan(graph, c.partition.groups, c.measured.median_s) for c in obs]
    )
    progress(f"  cost model updated online: {report}")


def graph_varies(results: list[BucketResult], dims: str) -> str:
    """A note when the buckets' plans were made on different graphs (the model's graph
    depends on the tuned sizes: a Python loop over the sequence, a size-dependent branch),
    else "". Such a plan serves only the sizes whose graph is its own. The graphs of a
    model with graph breaks are compared part by part (graph 1 with graph 1)."""
    by_part: dict[str, set[str]] = {}
    for r in results:
        if r.plan is not None:
            by_part.setdefault(r.part, set()).add(r.plan.structure_key)
    most = max((len(keys) for keys in by_part.values()), default=0)
    if most < 2:
        return ""
    return (
        f"note: this model's graph changes with {dims}: the {len(results)} buckets captured "
        f"{most} different graphs (a loop over a dimension, or a branch on a size, in "
        "forward), so each plan serves only sizes whose graph is its bucket's own; other "
        "sizes run default plans and are queued: tune them with `tune --from-queue`, or "
        "tune exactly the sizes served (--buckets edges:...)"
    )


def tune(
    cfg: TuneConfig,
    cost_model: CostModel,
    cache: PlanCache | None,
    *,
    only_buckets: set[str] | None = None,
    progress: Callable[[str], None] = _say,
    runner: Runner | None = None,
) -> list[BucketResult]:
    """Tune every bucket of `cfg.dynamic` (or only `only_buckets`).

    A bucket that fails (the model does not build at its sizes, a search or measurement
    error) is reported in its BucketResult and the next bucket is tuned."""
    check_config(cfg)
    if cache is not None and not cache.writable:
        raise CacheError(
            f"plan cache {cache.url} is read-only: tune stores its plans there; pass a "
            "writable --cache (nothing was searched or measured)"
        )
    spec = bucket_spec(cfg)
    _module, inputs = cfg.spec.build(dtype=cfg.dtype, device="meta")
    base = [tuple(x.shape) for x in inputs if isinstance(x, torch.Tensor)]
    buckets = [b for b in spec.buckets(base) if only_buckets is None or b.key in only_buckets]
    progress(
        f"{cfg.spec.spec}: {len(buckets)} bucket(s) over {cfg.dynamic} ({spec.describe()}), "
        f"strategy {cfg.strategy}, cost model {cost_model.name}/{cost_model.version}"
    )
    out = []
    for i, b in enumerate(progress_bars.track(buckets, "tune", unit="bucket"), 1):
        progress(f"[{i}/{len(buckets)}] bucket {spec.label(b)}")
        try:
            out.extend(
                tune_bucket(cfg, spec, b, cost_model, cache, progress=progress, runner=runner)
            )
        except Exception as e:
            why = f"{type(e).__name__}: {first_line(e)}"
            if is_out_of_memory(e):
                why = f"out of memory at {spec.representative_params(b)} ({why})"
            progress(f"  bucket {spec.label(b)} failed: {why}")
            params = spec.representative_params(b)
            out.append(BucketResult(b, params, None, (), None, None, 0.0, 0.0, f"failed: {why}"))
    return out
