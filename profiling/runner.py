"""The runner: realize a plan, check it against the model, time it (planner.measurement).

`DeviceRunner` is the one implementation of `planner.measurement.Runner`. `tune`,
`measure`, the collector and the benchmarks all measure through it, so a latency means the
same thing wherever it is reported: CUDA events on GPU, `perf_counter` on CPU, warm-up
calls, then rounds of repetitions until the median settles (profiling.timer.measure).

How a plan runs is the executor's business, and executors are pluggable:

- `ServedExecutor` stores the plan in a private plan cache and times the user's model
  compiled with the runtime backend (`torch.compile(module, backend=...)`, `dynamic=True`
  for a bucket): the backend's own lookup, export over the bucket, realization and
  per-call path. The latency it reports is what a user of that bucket gets. A plan the
  backend does not serve as given (a miss, a fallback to dynamo's graph) is an error.
- `RealizedExecutor` calls the realized plan (planner.realize.realizer) directly on the capture's
  inputs, with no backend in front: the plan's own cost, for datasets and comparisons.

Checking is profiling.verify's: the realized plan against the model on its inputs and on
fresh random ones; groups responsible for a mismatch fall back alone (planner.realize.realizer).
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from planner.distributed.tp_realize import RealizedTP
from planner.errors import FusionPlannerError
from planner.fusion.partition import Partition
from planner.hardware import device_fingerprint, local_device_name
from planner.ir.capture import Captured
from planner.measurement import MeasureError, Measurement, PlanJob, Timing
from planner.plans.cache import PlanCache
from planner.plans.plan import Plan
from planner.realize.realizer import GroupCompiler, RealizedPlan, realize
from planner.runtime.backend import FusionPlannerBackend
from profiling.timer import measure, measure_in_graph, measure_interleaved, measure_synced
from profiling.verify import Mismatch, verify_against_eager

# Default timer settings for a whole plan: a stable median within a few seconds.
PLAN_TIMER: dict[str, Any] = {"warmup": 3, "min_reps": 10, "max_reps": 100, "max_seconds": 5.0}
# A served plan is timed as serving runs it, calls back to back (the host's launch work
# overlaps the device's), with the settings of the benchmarks' interleaved timer
# (benchmarks/real_models.py): the latency `tune` stores is then measured the way the
# benchmarks measure the backend, not as isolated synchronized calls.
STEADY_TIMER: dict[str, Any] = {"rounds": 15, "round_s": 0.025, "warmup": 3}
# calls of the timed shape before its static specialization is made (a served shape that
# recurs long enough gets one under the backend's default policy)
STEADY_AFTER = 3
# Dynamo's limits while the serving executor compiles: a tuning job compiles the same
# model once per candidate, which must not run into the recompile limit (dynamo would
# then run the model eagerly, and the timing would be eager's).
_DYNAMO_LIMITS = {"recompile_limit": 1 << 20, "accumulated_recompile_limit": 1 << 20}


class ServeError(FusionPlannerError):
    """The serving path did not run the plan as given."""


# another rank's mismatch as `agree` reports it: "on rank N: output K: why"
_ELSEWHERE = re.compile(r"(on rank \d+): output (\d+): (.*)", re.S)

# On the ranks of a program with collectives: this rank's outcome of one step (its error,
# None: it succeeded) -> the outcome every rank takes (search.tune_tp.agree_error).
Agree = Callable[[MeasureError | None], MeasureError | None]


@dataclass
class Prepared:
    """A plan made runnable by an executor.

    `call()` runs it once on the job's inputs (what is timed); `realized` is the plan as
    realized (None: the plan runs as dynamo's graph, nothing fused), checked with
    `reference` on `check_inputs` (its program's inputs), or `checked` when it is None;
    `kernels()`, when set, runs its kernels alone without host work (timed in a CUDA
    graph when the runner asks for it); `close()` releases what the executor holds.
    """

    call: Callable[[], Any]
    realized: RealizedPlan | None
    reference: Callable[..., Any]
    check_inputs: tuple[Any, ...]
    compile_s: float
    kernels: Callable[[], Any] | None = None
    close: Callable[[], None] = lambda: None
    checked: Callable[..., Any] | None = None

    @property
    def subject(self) -> Callable[..., Any]:
        """What the accuracy check runs."""
        subject = self.realized if self.realized is not None else self.checked
        assert subject is not None, "an executor prepares a realized plan or a callable"
        return subject


class Executor(Protocol):
    """Makes a job's plan runnable. Raises ServeError when the serving path does not run
    the plan, anything else when the plan cannot be realized."""

    name: str

    def prepare(self, job: PlanJob, device: torch.device) -> Prepared: ...


def compute_dtype(captured: Captured) -> str:
    """The model's compute dtype: its first floating input's, else its parameters' (a
    token-id model's float inputs are its weights)."""
    for kinds in (("input",), ("param", "buffer", "const")):
        for t in captured.graph.tensors:
            if t.kind in kinds and t.dtype.startswith(("float", "bfloat")):
                return t.dtype
    return "float32"


class RealizedExecutor:
    """The realized plan called directly (see the module doc)."""

    name = "realized"

    def __init__(self, *, cuda_graphs: bool | str = "auto", compiler: GroupCompiler | None = None):
        self.cuda_graphs, self.compiler = cuda_graphs, compiler

    def prepare(self, job: PlanJob, device: torch.device) -> Prepared:
        t0 = time.perf_counter()
        rp = realize(
            job.captured,
            job.plan,
            device=device,
            cuda_graphs=self.cuda_graphs,
            compiler=self.compiler,
        )
        compile_s = time.perf_counter() - t0
        inputs = job.call_inputs
        flat = tuple(job.captured.example_inputs)
        return Prepared(
            call=lambda: rp(*inputs),
            realized=rp,
            reference=job.captured.program.module(),
            check_inputs=flat,
            compile_s=compile_s,
            kernels=(lambda: rp.run_flat(*flat)) if rp.cuda_graph else None,
        )


class ServedExecutor:
    """The user's model compiled with the runtime backend, the plan in a private cache
    (see the module doc). Each `prepare` clears dynamo's caches when its plan is released
    (`torch._dynamo.reset`): measure anything else compiled before, not beside, it."""

    name = "served"

    def __init__(
        self, *, compile_budget: int = 1, dynamic: bool | None = True, agree: Agree | None = None
    ):
        """`dynamic`: what `torch.compile` is given for a bucket's plan (the documented
        `dynamic=True` by default); an exact shape's plan is compiled static. `agree`: on
        the ranks of a program with collectives, the ranks agree on every realization
        before it runs (`_realize_agreed`)."""
        self.compile_budget, self.dynamic, self.agree = compile_budget, dynamic, agree

    def prepare(self, job: PlanJob, device: torch.device) -> Prepared:
        if job.module is None:
            raise ServeError("the serving executor compiles the user's model: PlanJob.module")
        plan = _as_plan(job, device)
        tmp = tempfile.TemporaryDirectory(prefix="fusion-runner-")
        cache = PlanCache(str(Path(tmp.name) / "plans.sqlite"))
        compiled: Any = None

        def close() -> None:
            nonlocal compiled
            compiled = None
            torch._dynamo.reset()
            cache.close()
            tmp.cleanup()

        try:
            dev_fp = device_fingerprint(device)
            if job.bucket is not None and job.bucket_spec is not None:
                cache.set_bucket_spec(plan.structure_key, job.bucket_spec, dev_fp)
                cache.store_plan(plan, job.bucket, device_fp=dev_fp, replace="always")
            else:
                shapes = job.captured.graph.input_shapes
                cache.store_exact(plan, shapes, device_fp=dev_fp, replace="always")
            # the shape recurs while it is timed, as a shape served long enough does: its
            # static specialization (which the default policy makes once it pays) is made now
            backend = FusionPlannerBackend(
                cache,
                device=device,
                compile_budget=self.compile_budget,
                record_misses=False,
                static_after=STEADY_AFTER,
                join_buckets=False,  # the bucket measured alone, whatever its neighbours hold
            )
            made: list[tuple[Captured, Any]] = []
            base = backend.realizer

            def recording(captured: Captured, plan: Plan, **options: Any) -> Any:
                if self.agree is None:
                    rp = base(captured, plan, **options)
                else:
                    rp = _realize_agreed(base, captured, plan, options, self.agree)
                made.append((captured, rp))
                return rp

            backend.realizer = recording
            dynamic = self.dynamic if job.bucket is not None else False
            compiled = torch.compile(job.module, backend=backend, dynamic=dynamic)
            inputs = job.call_inputs
            t0 = time.perf_counter()
            with torch.no_grad(), torch._dynamo.config.patch(_DYNAMO_LIMITS):
                compiled(*inputs)
                # the shape recurs while it is timed: the backend's static specialization
                # of the bucket's plan is what serves it, so make it before timing
                for _ in range(STEADY_AFTER - 1):
                    compiled(*inputs)
                backend.wait_static()
            compile_s = time.perf_counter() - t0
            problem = _not_served(backend, made, plan)
            if problem:
                raise ServeError(problem)
        except BaseException:
            close()
            raise
        if not made:  # nothing fused: the backend serves dynamo's graph as the plan
            return Prepared(
                call=lambda: compiled(*inputs),
                realized=None,
                reference=job.module,
                check_inputs=tuple(inputs),
                compile_s=compile_s,
                close=close,
                checked=compiled,
            )
        captured, rp = made[-1]  # the static specialization, when one was made
        tp = isinstance(rp, RealizedTP)  # the rank program rewritten: checked as a callable
        return Prepared(
            call=lambda: compiled(*inputs),
            realized=None if tp else rp,
            reference=captured.program.module(),
            check_inputs=tuple(captured.example_inputs),
            compile_s=compile_s,
            close=close,
            checked=rp if tp else None,
        )


def _realize_agreed(
    base: Callable[..., Any],
    captured: Captured,
    plan: Plan,
    options: dict[str, Any],
    agree: Agree,
) -> Any:
    """`base`'s realization of `plan` on one of several ranks, agreed before it runs:
    once it is compiled (which issues no collective) and before its check runs it (which
    issues the program's collectives), the ranks agree that each of them compiled it
    (planner.realize.realizer.realize's `before_run`); a rank whose realization raised
    before that point says so instead. A realization that failed on any rank raises
    ServeError on every rank, so that every rank's backend runs dynamo's graph alike. A
    tensor-parallel decision is realized by planner.distributed.tp_realize, which agrees
    on each of its steps itself."""
    if plan.tensor_parallel is not None:
        return base(captured, plan, **options)
    agreed: list[bool] = []

    def before_run() -> None:
        agreed.append(True)
        error = agree(None)
        if error is not None:
            raise ServeError(str(error))

    try:
        return base(captured, plan, **options, before_run=before_run)
    except Exception as e:
        if agreed:  # raised after the agreement: as it came (every rank, or this one's run)
            raise
        error = agree(MeasureError.of("realize", e))
        raise ServeError(str(error)) from e


def _as_plan(job: PlanJob, device: torch.device) -> Plan:
    if isinstance(job.plan, Plan):
        return job.plan
    assert isinstance(job.plan, Partition)
    return Plan.from_partition(
        job.plan,
        device=local_device_name(device),
        dtype=compute_dtype(job.captured),
        strategy=job.label,
        cost_model="none",
        predicted_s=0.0,
    )


def _not_served(backend: FusionPlannerBackend, made: list[Any], plan: Plan) -> str:
    """Why the backend did not serve the stored plan ("" when it did). A plan that fuses
    nothing is served as dynamo's graph itself, without a realization."""
    s = backend.stats
    if s.fallbacks:
        return f"the backend ran dynamo's graph: {s.fallbacks[0][:300]}"
    if s.graphs != 1:
        return f"dynamo gave {s.graphs} graphs for the model, not 1: the plan serves one graph"
    if s.default or not (s.exact or s.bucket):
        return "the backend's lookup missed the stored plan (its key or bucket differs)"
    if not made and all(len(g.nodes) == 1 and not g.recompute for g in plan.groups):
        return ""
    tp = [m[1] for m in made if isinstance(m[1], RealizedTP)]
    if plan.tensor_parallel is not None and (len(tp) != 1 or len(made) != 1):
        return f"the backend realized {len(made)} plan(s), not the tensor-parallel one stored"
    if tp:  # a rank program's decision (realized once, for its static shapes), every site
        return "" if tp[0].complete else f"the tensor-parallel decision fell back: {tp[0].reason}"
    # the bucket's realization, then (for a shape that recurs) its static specialization
    if len(made) != 1 + s.static or not all(isinstance(m[1], RealizedPlan) for m in made):
        return f"the backend realized {len(made)} plan(s), not the one stored"
    return ""


class DeviceRunner:
    """The runner (see the module doc). `timer`: profiling.timer.measure's settings;
    `trials`: inputs each plan is checked on; `kernels_in_graph`: on GPU, time a plan's
    kernels alone as copies in one CUDA graph (and keep the whole call as `call_s`);
    `steady`: profiling.timer.measure_interleaved's settings for served plans (timed as
    calls back to back, as serving runs them); `agree`: on the ranks of a program with
    collectives, the ranks agree on the outcome of realizing and of checking a plan
    before any of them goes on (every rank calls it, whatever happened here), so that a
    step that failed on one rank fails on every rank instead of leaving the others
    issuing collectives alone."""

    def __init__(
        self,
        *,
        executor: Executor | None = None,
        device: str | torch.device | None = None,
        timer: Mapping[str, Any] | None = None,
        trials: int = 3,
        kernels_in_graph: bool = False,
        steady: Mapping[str, Any] | None = None,
        agree: Agree | None = None,
    ):
        self.executor: Executor = executor or ServedExecutor()
        self.agree = agree
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.timer = dict(PLAN_TIMER if timer is None else timer)
        self.steady = dict(STEADY_TIMER if steady is None else steady)
        self.trials = trials
        self.kernels_in_graph = kernels_in_graph
        self._context = {
            "device": local_device_name(self.device),
            "device_fingerprint": device_fingerprint(self.device),
            "torch_version": torch.__version__.split("+")[0],
        }

    # ---- records ---------------------------------------------------------------------
    def failed(
        self, label: str, kind: str, e: BaseException | str, dtype: str = "", **kw: Any
    ) -> Measurement:
        """An error record (`e` an exception or a message)."""
        err = MeasureError(kind, e) if isinstance(e, str) else MeasureError.of(kind, e)
        executor = kw.pop("executor", self.executor.name)
        return Measurement(label, executor, **self._context, dtype=dtype, error=err, **kw)

    def _timed(
        self, fn: Callable[[], Any], dtype: str, in_graph: bool = False
    ) -> tuple[Timing, bool]:
        """(timing, whether it was timed as copies in one CUDA graph)."""
        with torch.no_grad():
            if in_graph and self.device.type == "cuda":
                try:
                    t = measure_in_graph(fn, device=self.device, dtype=dtype, **self.timer)
                    return t, True
                except Exception:  # not capturable this way: timed as it is
                    torch.cuda.synchronize()
            return measure(fn, device=self.device, dtype=dtype, **self.timer), False

    # ---- the protocol ------------------------------------------------------------------
    def measure_plan(self, job: PlanJob) -> Measurement:
        """Realize, check and time `job` with this runner's executor (planner.measurement)."""
        dtype = compute_dtype(job.captured)
        prepared, error = None, None
        try:
            prepared = self.executor.prepare(job, self.device)
        except ServeError as e:
            error = MeasureError("serve", str(e))
        except Exception as e:
            error = MeasureError.of("realize", e)
        try:
            error = self._agreed(error)
            if error is not None:
                return self.failed(job.label, error.kind, error.message, dtype)
            assert prepared is not None
            return self._check_and_time(job.label, prepared, dtype)
        finally:
            if prepared is not None:
                prepared.close()

    def _agreed(self, error: MeasureError | None) -> MeasureError | None:
        """The outcome of a step as every rank takes it (`agree`), else this process's."""
        return error if self.agree is None else self.agree(error)

    def _agreed_trial(self, bad: Mismatch | None) -> Mismatch | None:
        """A check's trial outcome as every rank takes it: this rank's mismatch, or the
        one another rank saw (its output, the reason prefixed with "on rank N")."""
        error = self._agreed(None if bad is None else MeasureError("accuracy", str(bad)))
        if error is None or bad is not None:
            return bad
        seen = _ELSEWHERE.fullmatch(error.message)
        return (
            Mismatch(int(seen[2]), f"{seen[1]}: {seen[3]}") if seen else Mismatch(0, error.message)
        )

    def _check_and_time(self, label: str, p: Prepared, dtype: str) -> Measurement:
        rp = p.realized
        about: dict[str, Any] = {"compile_s": p.compile_s}
        if rp is not None:
            about |= {
                "realizations": tuple(rp.realizations),
                "notes": tuple(g.note for g in rp.groups),
                "cuda_graph": rp.cuda_graph,
            }
        error = None
        try:
            check = verify_against_eager(
                p.subject,
                p.reference,
                p.check_inputs,
                trials=self.trials,
                agree=None if self.agree is None else self._agreed_trial,
            )
        except Exception as e:
            error = MeasureError.of("run", e)
        else:
            about |= {"check": str(check), "fallbacks": dict(check.fallbacks)}
            if not check.ok:
                error = MeasureError("accuracy", str(check))
        error = self._agreed(error)
        if error is not None:
            return self.failed(label, error.kind, error.message, dtype, **about)
        try:
            if self.executor.name == "served":
                with torch.no_grad():
                    call = measure_interleaved(
                        {"plan": p.call}, device=self.device, dtype=dtype, **self.steady
                    )["plan"]
                    # the same call alone and waited for: what a loop needing each result
                    # sees (on ranks: a fixed count of calls, the same on every rank)
                    limit = math.inf if self.agree is not None else 2.0
                    about["synced_s"] = measure_synced(
                        p.call, device=self.device, dtype=dtype, max_seconds=limit
                    ).median_s
            else:
                call, _ = self._timed(p.call, dtype)
        except Exception as e:
            return self.failed(label, "run", e, dtype, **about)
        timing, call_s = call, math.nan
        if self.kernels_in_graph and p.kernels is not None and self.device.type == "cuda":
            try:  # the plan's kernels alone, as copies in one graph; the whole call kept
                timing, _ = self._timed(p.kernels, dtype, in_graph=True)
            except Exception:  # a run that fails here: the whole call stands for it
                torch.cuda.synchronize()
            call_s = call.median_s
        elif self.kernels_in_graph:
            call_s = call.median_s  # no graph to time apart: the call is the timing
        return Measurement(
            label,
            self.executor.name,
            **self._context,
            dtype=dtype,
            timing=timing,
            call_s=call_s,
            **about,
        )

    def measure_callable(
        self,
        fn: Callable[..., Any],
        inputs: Sequence[Any],
        *,
        label: str,
        reference: Callable[..., Any] | None = None,
        compile_s: float = 0.0,
        dtype: str = "",
        in_graph: bool = False,
    ) -> Measurement:
        """Check `fn` against `reference` (when given) on `inputs` and fresh ones, then
        time `fn(*inputs)`; `in_graph`: on GPU, as copies in one CUDA graph."""
        args = tuple(inputs)
        about: dict[str, Any] = {"compile_s": compile_s, "executor": "callable"}
        if reference is not None:
            try:
                check = verify_against_eager(fn, reference, args, trials=self.trials)
            except Exception as e:
                return self.failed(label, "run", e, dtype, **about)
            about["check"] = str(check)
            if not check.ok:
                return self.failed(label, "accuracy", str(check), dtype, **about)
            dtype = dtype or check.dtype
        try:
            timing, about["cuda_graph"] = self._timed(lambda: fn(*args), dtype, in_graph)
        except Exception as e:
            return self.failed(label, "run", e, dtype, **about)
        return Measurement(label, **self._context, dtype=dtype, timing=timing, **about)

    def measure_interleaved(
        self,
        fns: Mapping[str, Callable[[], Any]],
        *,
        dtype: str = "",
        compile_s: Mapping[str, float] | None = None,
        **timer: Any,
    ) -> dict[str, Measurement]:
        """Contenders compared in interleaved rounds (profiling.timer.measure_interleaved),
        each already called once; a failure makes every contender's record an error.
        `timer` (rounds, round_s, warmup) overrides the runner's `steady` settings."""
        setup = dict(compile_s or {})
        try:
            with torch.no_grad():
                timings = measure_interleaved(
                    dict(fns), device=self.device, dtype=dtype, **(self.steady | timer)
                )
        except Exception as e:
            return {
                n: self.failed(n, "run", e, dtype, executor="callable", compile_s=setup.get(n, 0.0))
                for n in fns
            }
        return {
            n: Measurement(
                n,
                "callable",
                **self._context,
                dtype=dtype,
                timing=t,
                compile_s=setup.get(n, 0.0),
            )
            for n, t in timings.items()
        }


def first_call(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Wall time of `fn()`'s first call (where compiles happen) and its output."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0, out


__all__ = [
    "PLAN_TIMER",
    "DeviceRunner",
    "Executor",
    "Prepared",
    "RealizedExecutor",
    "ServeError",
    "ServedExecutor",
    "compute_dtype",
    "first_call",
]
