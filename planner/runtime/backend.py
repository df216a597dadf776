"""The runtime: a `torch.compile` backend that runs each shape bucket's tuned plan.

    model = torch.compile(model, backend=fusion_planner_backend(), dynamic=True)

On each call the backend finds the bucket of the actual input shapes, looks the plan up
in the plan cache (exact shape, then bucket, then the default plan: never an error),
realizes it once per bucket (one compile serves every shape of the bucket) and reuses
it. A miss runs the default plan (`planner.fusion.fuse_rules.default_partition`) and records
the shape in the cache's tuning queue, so the next offline `fusion-plan tune` covers it.
`compile_budget` bounds how many realizations the process pays for per dynamo graph; past
it, that graph's new buckets run dynamo's graph as it is (bound the recompiles:
docs/runtime.md).

Correctness comes first: if anything on the way fails (lifting dynamo's graph, export,
a plan that does not fit, a realization), that bucket runs dynamo's graph unchanged
and a warning says why, once. The user's model always runs and gives the right answer.
In grad mode the plan's forward is served with gradients recomputed eagerly, or the graph
is declined to Inductor with one warning (planner.runtime.grad): never lost gradients.
A DTensor tensor-parallel model (`parallelize_module`) is served the plans of its rank
program, the program capture makes of the model (planner.ir.capture_dtensor; lifted as
planner.runtime.graph says); each of its shapes is captured and realized alone, since
that program is traced per shape.

For users who drive their own execution: `lookup(structure_key, shapes, device)` and
`plan_for(graph)`. This module imports neither optuna nor scikit-learn, even
transitively (tests/test_runtime.py checks): a deployed model pays for torch, the
stdlib and the cache only.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.fx as fx
from torch._dynamo.backends.registry import lookup_backend

from planner.errors import FusionPlannerError, PlanError, first_line
from planner.fusion.fuse_rules import default_partition as _rule_based_partition
from planner.fusion.partition import Partition
from planner.hardware import device_fingerprint, local_device_name
from planner.ir.capture import Captured, export_model
from planner.ir.capture_dynamic import export_dynamic
from planner.ir.graph import OpGraph
from planner.plans.buckets import Bucket, BucketSpec, DynamicDim, Policy, Pow2, exact_key
from planner.plans.cache import BUCKET, DEFAULT, EXACT, LookupResult, PlanCache
from planner.plans.plan import Plan
from planner.realize.realizer import realize
from planner.runtime.grad import PlannedForward, needs_grad, recompute_blocker
from planner.runtime.graph import LiftedGraph, device_of_graph, holds_tensors, lift_graph
from planner.runtime.scalars import float_restart
from planner.runtime.spans import joined
from planner.runtime.specialize import Compared, Ledger, Recurring
from planner.runtime.stats import RuntimeStats

log = logging.getLogger(__name__)

# New shapes of one bucket written to the tuning queue, per graph: a decode loop meets a new
# shape per token, and each write is a database round trip on the serving path.
MISSES_PER_BUCKET = 8
MEMO_MAX = 1 << 16  # distinct dynamic-size tuples remembered per graph
STATE_LIFTS_MAX = 256  # module instances one dynamo graph is lifted for (one per instance)
MAX_RUN_FAILURES = 3  # shapes a realization may fail on before its bucket runs eager
# One realization at a time per process: Inductor's compile state is not made for two
# compiles at once.
_REALIZE_LOCK = threading.Lock()


class PlannerRuntimeWarning(UserWarning):
    """The runtime fell back to dynamo's graph, or ran past its compile budget."""


class Realizer(Protocol):
    """Turns a captured program and a plan for its graph into a callable over the
    program's user inputs (positional). The plan has been fitted to `captured.graph`
    (`plan.graph_key == captured.graph.key`), so `plan.partition(captured.graph)` and each
    group's realization label apply as they are. May raise: the backend then runs eager."""

    def __call__(self, captured: Captured, plan: Plan) -> Callable[..., Any]: ...


class Exporter(Protocol):
    """Exports `module` over a bucket: `dims` = {input: {axis: (lo, hi)}}."""

    def __call__(
        self,
        module: torch.nn.Module,
        inputs: tuple[Any, ...],
        dims: dict[int, dict[int, tuple[int, int]]],
    ) -> Captured: ...


def default_partition(graph: OpGraph) -> Partition:
    """The safe plan on a miss: the rule-based, deterministic greedy fusion of
    planner.fusion.fuse_rules (no cost model, no search)."""
    return _rule_based_partition(graph)


def _default_realizer(captured: Captured, plan: Plan, **options: Any) -> Callable[..., Any]:
    """planner.realize.realizer: each group one compiled unit, verified against eager."""
    return realize(captured, plan, **options)


def _default_exporter(
    module: torch.nn.Module, inputs: tuple[Any, ...], dims: dict[int, dict[int, tuple[int, int]]]
) -> Captured:
    """planner.ir.capture_dynamic: one export whose symbolic sizes span the bucket."""
    return export_dynamic(module, inputs, dims)


# ---- the plain API ------------------------------------------------------------------------
_shared: dict[str, PlanCache] = {}
_shared_lock = threading.Lock()


def open_cache(cache: PlanCache | str | None = None) -> PlanCache:
    """A PlanCache: `cache` itself, or one shared per URL in this process (None: default).

    Never raises for a database that is down, missing or damaged: the shared cache opens
    its database on first use and again after a failure (`PlanCache(reopen=True)`), so its
    lookups read as misses until the database answers, and then find plans again."""
    if isinstance(cache, PlanCache):
        return cache
    key = cache or ""
    with _shared_lock:
        if key not in _shared:
            _shared[key] = PlanCache(cache, reopen=True)
        return _shared[key]


def _fingerprint(device: str | torch.device | None) -> str:
    if isinstance(device, str) and device.startswith(("cpu-", "cuda-")):
        return device  # already a fingerprint
    return device_fingerprint(device)


def lookup(
    structure_key: str,
    shapes: Sequence[Sequence[int]],
    device: str | torch.device | None = None,
    *,
    cache: PlanCache | str | None = None,
    spec: BucketSpec | None = None,
) -> LookupResult:
    """The plan for a model (its `OpGraph.structure_key`) at `shapes` on `device` (a torch
    device or a device fingerprint; None: this machine's). Exact shape, then bucket, then
    `source == "default"` with no plan: run `plan_for(graph)`'s default. Never raises."""
    try:
        c = open_cache(cache)
        return c.lookup(structure_key, shapes, _fingerprint(device), spec=spec)
    except Exception as e:  # a lookup must never take the model down
        _warn_once(f"cache:{cache}", f"plan cache unavailable ({e}); using default plans")
        return LookupResult(None, DEFAULT, None)


def plan_for(
    graph: OpGraph,
    device: str | torch.device | None = None,
    *,
    cache: PlanCache | str | None = None,
    spec: BucketSpec | None = None,
) -> tuple[Plan, str]:
    """A plan for `graph` (and where it came from: exact / bucket / default). Never raises
    for a cache problem; the default is built from `default_partition(graph)`."""
    result = lookup(graph.structure_key, graph.input_shapes, device, cache=cache, spec=spec)
    if result.plan is not None:
        try:
            result.plan.partition_for(graph)
            return result.plan, result.source
        except Exception as e:  # a plan that does not fit this graph: the default runs
            _warn_once(f"fit:{graph.structure_key}", f"cached plan does not fit ({e})")
    return default_plan(graph, device), DEFAULT


def default_plan(graph: OpGraph, device: str | torch.device | None = None) -> Plan:
    """The default plan of `graph` as a Plan record (no cost model, nothing measured)."""
    dtypes = [t.dtype for t in graph.tensors if t.kind == "input"] or ["float32"]
    return Plan.from_partition(
        default_partition(graph),
        device=_spec_name(device),
        dtype=dtypes[0],
        strategy="default",
        cost_model="none",
        predicted_s=0.0,
        device_fingerprint=_fingerprint(device),
    )


def _spec_name(device: str | torch.device | None) -> str:
    if isinstance(device, str) and device.startswith(("cpu-", "cuda-")):
        device = device.split("-")[0]  # a fingerprint names the kind of device only
        if device == "cuda" and not torch.cuda.is_available():
            return "cuda"
    return local_device_name(device)


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, PlannerRuntimeWarning, stacklevel=3)
        log.warning(message)


# ---- the backend --------------------------------------------------------------------------
class FusionPlannerBackend:
    """The `torch.compile` backend object. One instance may serve several models and
    graphs; the stats are shared between them, the compile budget is each graph's own."""

    def __init__(
        self,
        cache: PlanCache | str | None = None,
        *,
        device: str | torch.device | None = None,
        bucket_policy: BucketSpec | Policy | None = None,
        compile_budget: int = 8,
        record_misses: bool = True,
        realizer: Realizer | None = None,
        exporter: Exporter | None = None,
        static_after: int | str | None = "auto",
        static_budget: int = 8,
        static_background: bool | None = None,
        join_buckets: bool = True,
    ):
        self._cache_arg = cache
        self._cache: PlanCache | None = None
        self._cache_failed = False
        self.device = device
        self.bucket_policy = bucket_policy
        self.compile_budget = compile_budget
        self.record_misses = record_misses
        self.realizer: Realizer = realizer or _default_realizer
        self.exporter: Exporter = exporter or _default_exporter
        if (
            static_after != "auto"
            and static_after is not None
            and (not isinstance(static_after, int) or static_after < 1)
        ):
            raise ValueError(
                f"static_after must be 'auto', an int >= 1 or None, got {static_after!r}"
            )
        self.static_after = static_after
        self.static_budget = static_budget
        self.static_background = static_background
        self.join_buckets = join_buckets
        self._background_declined = False
        self.stats = RuntimeStats()
        self._lock = threading.Lock()
        self._static_taken = 0

    def take_static_budget(self) -> bool:
        with self._lock:
            if self._static_taken >= self.static_budget:
                return False
            self._static_taken += 1
            return True

    def background_for(self, device: torch.device) -> bool:
        """Whether a static specialization builds in a background thread: never. torch's
        tracers patch process-wide state while they export (torch.fx's current make_fx
        tracer, and nn.Module.__call__ itself), so an export in a background thread breaks
        what the serving thread runs meanwhile: on an H100 a model compiled meanwhile
        failed inside dynamo ("s33 is not tracked with proxy for _ModuleStackTracer"), and
        on the CPU a plain call of the served model was caught by the exporting tracer
        (KeyError 'custom' in torch.fx.traceback). `static_background=True` is declined
        with one warning; the specialization builds in the calling thread."""
        del device
        if self.static_background and not self._background_declined:
            self._background_declined = True
            warnings.warn(
                "static_background=True is ignored: torch's tracers patch process-wide state "
                "while they export, so a specialization built in a background thread breaks "
                "calls served meanwhile; it builds in the calling thread instead",
                PlannerRuntimeWarning,
                stacklevel=3,
            )
        return False

    def wait_static(self, timeout: float | None = None) -> bool:
        """True: static specializations build in the calling thread (background_for), so
        none is ever left in flight. Kept for callers that wait for them before timing."""
        del timeout
        return True

    @property
    def cache(self) -> PlanCache | None:
        if self._cache is None and not self._cache_failed:
            try:
                self._cache = open_cache(self._cache_arg)
            except FusionPlannerError as e:
                self._cache_failed = True
                _warn_once("backend-cache", f"plan cache unavailable ({e}); default plans only")
        return self._cache

    def take_budget(self, spent: list[int]) -> bool:
        """One realization from the budget of the graph whose count is `spent` (a
        one-element list the graph owns): `compile_budget` per dynamo graph, so a model
        torch.compile splits into many graphs (graph breaks) gets its buckets realized
        in every one of them."""
        with self._lock:
            if spent[0] >= self.compile_budget:
                return False
            spent[0] += 1
            self.stats.realized += 1
            return True

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        restart = float_restart(gm)
        if restart is not None:  # dynamo traces again, the model's floats constant
            raise restart
        self.stats.graphs += 1
        if not holds_tensors(gm, example_inputs):
            self.stats.tensorless += 1
            return gm.forward
        grad = needs_grad(example_inputs)
        if grad:
            blocker = recompute_blocker(gm)
            if blocker is not None:
                return self._decline(gm, example_inputs, blocker)
        try:
            lifted = lift_graph(gm, list(example_inputs))
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
            self.stats.fallbacks.append(f"lift: {reason}")
            _warn_once(f"lift:{reason}", f"fusion-planner runs dynamo's graph as is: {reason}")
            return gm.forward
        planned = _PlannedGraph(self, gm, lifted)
        if grad:
            self.stats.grad_graphs += 1
            return planned.call_with_grad
        return planned

    def _decline(
        self, gm: fx.GraphModule, example_inputs: list[Any], reason: str
    ) -> Callable[..., Any]:
        """Grad mode on a graph whose plan cannot give eager's gradients
        (planner.runtime.grad): torch.compile's default backend runs it."""
        self.stats.declined.append(reason)
        _warn_once(
            f"decline:{reason}",
            f"fusion-planner declines a graph in grad mode ({reason}: the served forward "
            "could not be recomputed for the backward pass); torch.compile's default "
            "backend (Inductor) compiles it, forward and backward",
        )
        try:
            return lookup_backend("inductor")(gm, example_inputs)
        except Exception as e:  # autograd through dynamo's graph is still eager's
            log.warning("Inductor failed on a declined graph (%s); running it eagerly", e)
            return gm.forward


def fusion_planner_backend(
    cache: PlanCache | str | None = None,
    *,
    device: str | torch.device | None = None,
    bucket_policy: BucketSpec | Policy | None = None,
    compile_budget: int = 8,
    record_misses: bool = True,
    **kw: Any,
) -> FusionPlannerBackend:
    """A backend for `torch.compile(model, backend=..., dynamic=True)`; see the module doc.

    `bucket_policy`: a BucketSpec over the model's inputs, or one Policy for every
    dynamic dim; None uses the spec the tuning job stored for the model, else pow2.
    Keyword options of FusionPlannerBackend: `static_after` (when a shape that recurs gets a
    static specialization of its bucket's plan: "auto", once its calls have taken as long
    as building one would, at the share of a call one saves, both measured as it serves
    (planner.runtime.specialize); an int: at that call; None: never), `static_budget` (how
    many specializations the process pays for), `static_background` (declined with a
    warning: specializations build in the calling thread, see
    FusionPlannerBackend.background_for), `join_buckets` (default True: adjacent tuned
    buckets with the same plan are realized once, over their joint range;
    planner.runtime.spans).
    """
    return FusionPlannerBackend(
        cache,
        device=device,
        bucket_policy=bucket_policy,
        compile_budget=compile_budget,
        record_misses=record_misses,
        **kw,
    )


class _PlannedGraph:
    """Dynamo's graph, served per bucket. `__call__` is the hot path: one tuple of the
    dynamic sizes, one dict probe, then the chosen callable."""

    def __init__(self, backend: FusionPlannerBackend, gm: fx.GraphModule, lifted: LiftedGraph):
        self.backend, self.gm, self.lifted = backend, gm, lifted
        self._spent = [0]  # realizations this graph took from the compile budget
        self._dyn = tuple((lifted.user_positions[i], a) for i, a in lifted.dynamic)
        self._consts = bool(lifted.constants)
        self._same_state = lifted.same_state()
        self._instances: dict[tuple[int, ...], Callable[..., Any]] = {}
        self._memo: dict[tuple[int, ...], Callable[[tuple[Any, ...]], Any]] = {}
        self._realized: dict[str, Callable[[tuple[Any, ...]], Any]] = {}
        self._bucket_plans: dict[str, Plan] = {}  # plans realized symbolically, per bucket key
        # a graph of each structure a plan was fitted to: what carries plans to other ops
        self._traced: dict[str, OpGraph] = {}
        self._missed: dict[str, int] = {}  # new shapes met per bucket without a plan
        self._per_shape: set[str] = set()  # bucket keys whose export over the range failed
        self._unjoinable: set[str] = set()  # joined ranges whose export failed
        self._lock = threading.RLock()
        self._identity: tuple[str, str, BucketSpec] | None = None
        self._spec_settled = True  # False while the bucket spec could not be read
        self._first_static: Captured | None = None  # the capture made to identify the model
        self._default: Plan | None = None  # the model's default plan (fuse_rules)
        self._broken = False
        self.ledger = Ledger()  # what static specializations of this graph cost and save
        self._gave_up = False

    def __call__(self, *args: Any) -> Any:
        if self._consts and not self.lifted.fits(args):  # another value of an int argument
            return self.gm.forward(*args)
        if not self._same_state(args):  # another instance of the module: its own lift
            return self._for_state(args)(*args)
        sizes = tuple([args[p].shape[a] for p, a in self._dyn])
        fn = self._memo.get(sizes)
        if fn is None:
            fn = self._resolve(sizes, args)
        return fn(args)

    def call_with_grad(self, *args: Any) -> Any:
        """`__call__` in grad mode: the plan's forward, gradients from recomputing dynamo's
        graph with autograd (planner.runtime.grad). A bucket that runs dynamo's graph
        anyway runs it under autograd directly."""
        if self._consts and not self.lifted.fits(args):
            return self.gm.forward(*args)
        if not self._same_state(args):
            return self._for_state(args).call_with_grad(*args)
        sizes = tuple([args[p].shape[a] for p, a in self._dyn])
        fn = self._memo.get(sizes)
        if fn is None:
            with torch.no_grad():
                fn = self._resolve(sizes, args)
        if fn == self._eager:
            return self.gm.forward(*args)
        return PlannedForward.apply(fn, self.gm.forward, *args)

    def _for_state(self, args: tuple[Any, ...]) -> Callable[..., Any]:
        """The planned graph of the module instance whose state `args` carry: dynamo reuses
        one graph for every instance of a module class, while a lift bakes in one
        instance's parameters. Each instance gets its own lift and realizations (within its
        own compile budget); one that cannot be lifted, or past
        `STATE_LIFTS_MAX` instances, runs dynamo's graph."""
        key = self.lifted.state_key(args)
        with self._lock:
            other = self._instances.get(key)
            if other is None:
                lifted = self.lifted.rebind(args)
                if lifted is None or len(self._instances) >= STATE_LIFTS_MAX:
                    other = self.gm.forward
                else:
                    other = _PlannedGraph(self.backend, self.gm, lifted)
                self._instances[key] = other
        return other

    # -- the slow path: once per new dynamic-size tuple --
    def _eager(self, args: tuple[Any, ...]) -> Any:
        return self.gm.forward(*args)

    def _resolve(self, sizes: tuple[int, ...], args: tuple[Any, ...]) -> Callable[..., Any]:
        with self._lock:
            fn = self._memo.get(sizes)
            if fn is None:
                fn, plan = self._choose(args)
                after = self.backend.static_after
                if plan is not None and after is not None:
                    fn = Recurring(
                        sizes,
                        fn,
                        plan,
                        after=after,
                        ledger=self.ledger,
                        specialize=self._specialize,
                    )
                if len(self._memo) >= MEMO_MAX:
                    self._memo.clear()
                self._memo[sizes] = fn
            return fn

    def _fallback(self, where: str, e: BaseException) -> Callable[..., Any]:
        reason = f"{where}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        self.backend.stats.fallbacks.append(reason)
        _warn_once(reason, f"fusion-planner runs dynamo's graph for this bucket ({reason})")
        return self._eager

    def _choose(self, args: tuple[Any, ...]) -> tuple[Callable[..., Any], Plan | None]:
        """The callable for a new size tuple, and the plan a recurring shape of it may be
        specialized with (None when it runs dynamo's graph or is static already)."""
        stats = self.backend.stats
        if self._broken:
            return self._eager, None
        user = tuple(args[p] for p in self.lifted.user_positions)
        shapes = tuple(tuple(int(d) for d in t.shape) for t in user)
        try:
            model_key, dev, spec = self._identify(user)
        except Exception as e:
            self._broken = True
            return self._fallback("capture", e), None
        bucket = spec.bucket_of(shapes)
        cache = self.backend.cache
        result = (
            cache.lookup(model_key, shapes, dev, spec=spec)
            if cache is not None
            else LookupResult(None, DEFAULT, bucket)
        )
        exact = f"{result.source}:{exact_key(shapes)}"
        # a DTensor rank program is traced per shape: a bucket's plan is realized shape by shape
        if result.source == EXACT or bucket is None or self.lifted.per_shape:
            key, region = exact, None
        else:
            key, region = f"{result.source}:{bucket.key}", bucket
        if result.source == DEFAULT and cache is not None and self.backend.record_misses:
            where = bucket.key if bucket else exact
            missed = self._missed.get(where, 0)
            self._missed[where] = missed + 1
            if missed < MISSES_PER_BUCKET:
                try:
                    cache.record_miss(
                        model_key, shapes, device_fp=dev, bucket=bucket, label=self._label()
                    )
                    stats.queued += 1
                except Exception as e:  # the queue is a courtesy; never fail the call
                    _warn_once("queue", f"could not record a miss in the tuning queue: {e}")
        setattr(stats, result.source, getattr(stats, result.source) + 1)
        fn = self._realized.get(key)
        if fn is not None:
            return fn, self._bucket_plans.get(key)
        fn = self._realized.get(exact)
        if fn is not None:
            return fn, None
        plan = result.plan or self._default
        if plan is None or (
            plan.tensor_parallel is None
            and all(len(g.nodes) == 1 and not g.recompute for g in plan.groups)
        ):
            # Nothing fused (no fuse_rules, or nothing to fuse) and no tensor-parallel
            # decision: dynamo's graph is that plan already, without paying for a realization.
            self._realized[key] = self._eager
            return self._eager, None
        if not self.backend.take_budget(self._spent):
            stats.over_budget += 1
            _warn_once(
                "budget",
                f"fusion-planner compile budget ({self.backend.compile_budget} per graph) spent: "
                "new buckets run dynamo's graph (raise compile_budget or tune fewer buckets)",
            )
            self._realized[key] = self._eager
            return self._eager, None
        t0 = time.perf_counter()
        covered: tuple[Bucket, ...] = ()
        wider = None
        if region is not None and result.source == BUCKET and self.backend.join_buckets:
            try:  # adjacent tuned buckets with this plan: one realization over them all
                wider, covered = joined(
                    region, plan, shapes, cache=cache, model_key=model_key, device_fp=dev, spec=spec
                )
            except Exception as e:  # a courtesy: the bucket alone is realized as before
                log.info("buckets not joined: %s", first_line(e))
            if wider is not None and wider.key in self._unjoinable:
                wider = None
        fn, over, static, fitted = self._realize(plan, region, user, wider=wider)
        if static or over is None or fn == self._eager or fitted is None:
            self._realized[exact if over is None else key] = fn
            return fn, None
        # what a static build of this plan is taken to cost before one has been timed
        self.ledger.realizations.append(time.perf_counter() - t0)
        keys = [key]
        if over is wider and wider is not region:
            keys += [f"{BUCKET}:{b.key}" for b in covered if b.key != region.key]
            stats.joined += len(keys) - 1
        for k in keys:
            self._realized[k] = fn
            self._bucket_plans[k] = fitted
        return fn, fitted

    def _label(self) -> str:
        return f"runtime:{self.lifted.module.__class__.__name__}"

    def _identify(self, user: tuple[Any, ...]) -> tuple[str, str, BucketSpec]:
        """Model key, device fingerprint and bucket spec: worked out once per graph."""
        if self._identity is not None and not self._spec_settled:
            model_key, dev, _ = self._identity  # the cache was down: ask it again
            self._identity = (model_key, dev, self._spec(model_key, dev))
        if self._identity is None:
            static = export_model(self.lifted.module, user, name="runtime")
            own = self.backend.device
            device = own if own is not None else device_of_graph(user, self.lifted.module)
            dev = _fingerprint(device)
            model_key = static.graph.structure_key
            self._identity = (model_key, dev, self._spec(model_key, dev))
            self._first_static = static
            self._traced[static.graph.structure_key] = static.graph
            # The default partition depends on the model's structure, not on its shapes:
            # worked out once, applied to every bucket through Plan.partition_for.
            self._default = default_plan(static.graph, dev)
        return self._identity

    def _spec(self, model_key: str, dev: str) -> BucketSpec:
        policy = self.backend.bucket_policy
        if isinstance(policy, BucketSpec):
            return policy
        dims = tuple(DynamicDim(f"in{i}.{a}", i, a) for i, a in self.lifted.dynamic)
        if policy is not None:
            return BucketSpec.uniform(dims, policy)
        cache = self.backend.cache
        if cache is None:
            return BucketSpec.uniform(dims, Pow2())
        errors = cache.stats["errors"]
        stored = cache.bucket_spec(model_key, dev)
        # A spec read that failed (the cache is down) is not the answer "none stored": the
        # next new shape asks again, so a cache that comes back buckets as tuning did.
        self._spec_settled = stored is not None or cache.stats["errors"] == errors
        return stored or BucketSpec.uniform(dims, Pow2())

    def _static(self, user: tuple[Any, ...]) -> Captured:
        first = self._first_static
        if first is not None and first.graph.input_shapes == tuple(tuple(t.shape) for t in user):
            self._first_static = None  # used once; do not keep the program alive
            return first
        return export_model(self.lifted.module, user, name="runtime")

    def _fit(self, plan: Plan, graph: OpGraph) -> Plan:
        """`plan` re-keyed to `graph`, the model traced at the shapes of this call. Where
        export traced the model into other ops at these shapes (it keeps or drops identity
        slices by length), the default plan is made again for `graph` (it depends only on
        the graph), and another plan is carried over from a graph of its structure seen
        before (Plan.aligned_to); one that cannot be carried over gives way to the default
        plan, with a warning and the reason in RuntimeStats.unfitted."""
        try:
            plan.partition_for(graph)
            fitted = dataclasses.replace(plan, graph_key=graph.key)
        except PlanError as e:
            why: Exception = e
            fitted = None
            source = self._traced.get(plan.structure_key)
            default = plan.strategy == "default" and plan.tensor_parallel is None
            if not default and source is not None:
                try:
                    fitted = plan.aligned_to(source, graph)
                except PlanError as e2:
                    why = e2
            if fitted is None:
                if not default:
                    reason = f"{plan.strategy} plan: {first_line(why, 240)}"
                    self.backend.stats.unfitted.append(reason)
                    _warn_once(
                        f"unfitted:{plan.structure_key}",
                        "fusion-planner's cached plan does not fit the ops the model traces "
                        f"into at these shapes, so the default plan runs ({reason})",
                    )
                fitted = default_plan(graph, self._identity[1] if self._identity else None)
        if len(self._traced) < MEMO_MAX:
            self._traced.setdefault(graph.structure_key, graph)
        return fitted

    def _realize(
        self,
        plan: Plan,
        bucket: Bucket | None,
        user: tuple[Any, ...],
        wider: Bucket | None = None,
    ) -> tuple[Callable[..., Any], Bucket | None, bool, Plan | None]:
        """(callable over dynamo's args, the range it serves: `wider` when exported over it,
        else `bucket`, None when realized for this shape alone; whether it was realized
        for static shapes: a bucket of one shape, or a shape realized alone; the plan as
        fitted to the graph realized: None where it fell back)."""
        over: Bucket | None = None
        try:
            captured = None
            if wider is not None and wider is not bucket:
                try:
                    captured = self.backend.exporter(self.lifted.module, user, wider.ranges())
                    over = wider
                except Exception as e:  # the bucket alone, as without joining
                    self._unjoinable.add(wider.key)  # its other buckets do not try it again
                    log.info("no export over the joined range %s: %s", wider.key, first_line(e))
            if captured is None and bucket is not None and bucket.key not in self._per_shape:
                try:
                    captured = self.backend.exporter(self.lifted.module, user, bucket.ranges())
                    over = bucket
                except Exception as e:  # no dynamic export: this shape alone, statically
                    self._per_shape.add(bucket.key)  # its other shapes do not try again
                    reason = f"{bucket.key}: {type(e).__name__}: {first_line(e, 200)}"
                    self.backend.stats.per_shape.append(reason)
                    _warn_once(
                        f"per-shape:{self.lifted.module.__class__.__name__}",
                        "fusion-planner could not export a bucket over its range, so each of "
                        f"its shapes is realized alone, a compile each within compile_budget "
                        f"({reason}; RuntimeStats.per_shape lists every such bucket)",
                    )
            if captured is None:
                captured = self._static(user)
            graph = captured.graph
            fitted = self._fit(plan, graph)
            realized = self.backend.realizer(captured, fitted)
        except Exception as e:
            return self._fallback("realize", e), None, False, None
        static = bool(getattr(realized, "static_shapes", over is None))
        return self._runner(realized, self._eager), over, static, fitted

    def _runner(
        self, realized: Callable[..., Any], instead: Callable[[tuple[Any, ...]], Any]
    ) -> Callable[[tuple[Any, ...]], Any]:
        """`realized` over dynamo's args; a shape it fails on runs `instead` from then on,
        and after a few such shapes every call does."""
        positions = self.lifted.user_positions
        failures: list[str] = []
        # the user's inputs among dynamo's arguments, picked without a list per call
        pick = operator.itemgetter(*positions) if positions else (lambda args: ())
        one = len(positions) == 1

        def run(args: tuple[Any, ...]) -> Any:
            if len(failures) >= MAX_RUN_FAILURES:
                return instead(args)
            try:
                return realized(pick(args)) if one else realized(*pick(args))
            except Exception as e:
                # This shape cannot run here (e.g. size 1 in a bucket exported from 2).
                failures.append(str(e))
                self._fallback("run", e)
                self._memo[tuple([args[p].shape[a] for p, a in self._dyn])] = instead
                return instead(args)

        return run

    # -- static specialization of a recurring shape --
    def _specialize(self, rec: Recurring, args: tuple[Any, ...]) -> None:
        """Realize `rec`'s plan statically at its shape (layouts propagated across groups,
        static-only epilogues, one CUDA graph), in the calling thread (background_for says
        why), within the static budget; past it the shape stays on its bucket's realization."""
        backend, stats = self.backend, self.backend.stats
        if not backend.take_static_budget():
            stats.static_skipped += 1
            if stats.static_skipped == 1:  # once: a decode loop meets a new shape per token
                stats.static_failed.append(
                    f"{rec.sizes}: static budget spent (later recurring shapes are counted in "
                    "static_skipped)"
                )
            _warn_once(
                "static-budget",
                f"fusion-planner static budget ({backend.static_budget}) spent: further "
                "recurring shapes keep their bucket's realization",
            )
            return
        user = tuple(args[p] for p in self.lifted.user_positions)
        device = next((t.device for t in user if isinstance(t, torch.Tensor)), None)
        if device is not None:
            backend.background_for(device)  # warns once where static_background was asked
        self._build_static(rec, user)

    def _build_static(self, rec: Recurring, user: tuple[Any, ...]) -> None:
        """The static specialization of `rec`'s shape, built in the calling thread; with
        static_after="auto" its first calls are timed against the bucket realization's
        (planner.runtime.specialize.Compared), and the faster one serves the shape."""
        stats = self.backend.stats
        t0 = time.perf_counter()
        try:
            with _REALIZE_LOCK, torch.no_grad():
                captured = export_model(self.lifted.module, user, name="runtime-static")
                fitted = self._fit(rec.plan, captured.graph)
                realized = self.backend.realizer(captured, fitted)
        except Exception as e:  # the bucket's realization goes on serving this shape
            reason = f"{rec.sizes}: {type(e).__name__}: {first_line(e, 200)}"
            stats.static_failed.append(reason)
            log.info("no static specialization for %s", reason)
            return
        finally:
            built_s = time.perf_counter() - t0
            self.ledger.builds.append(built_s)
            stats.static_build_s += built_s
        runner = self._runner(realized, rec.fn)
        stats.static += 1
        if rec.after != "auto":
            self._memo[rec.sizes] = runner
            return

        def decide(gain: float) -> None:
            self.ledger.gains.append(gain)
            stats.static_gains.append(round(gain, 4))
            self._memo[rec.sizes] = runner if gain > 0 else rec.fn
            if self.ledger.given_up() and not self._gave_up:
                self._gave_up = True
                stats.static_failed.append(
                    f"{self._label()}: specializations saved {self.ledger.expected_gain():.1%} "
                    "of a call on average: no more are built for this graph"
                )

        self._memo[rec.sizes] = Compared(rec, runner, decide)
