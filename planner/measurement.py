"""Measurement records and the runner protocol: what measuring a plan on a device returns.

A runner realizes a plan, checks it against the model, and times it, and answers with one
`Measurement`: a `Timing` (median, p99, spread, repetitions) or a `MeasureError` (its kind
and message), always with the device fingerprint, torch version and dtype it was made
under. A plan that cannot be realized, disagrees with the model or fails to run is a
record with an error, never an exception: the tuning loop compares candidates and drops
the ones that failed.

`planner` declares the protocol; `profiling.runner.DeviceRunner` is the implementation the
commands and benchmarks use. Nothing here imports profiling, learned_cost or search.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import torch

from planner.fusion.partition import Partition
from planner.ir.capture import Captured
from planner.plans.buckets import Bucket, BucketSpec
from planner.plans.plan import Plan

# What can go wrong, in the order a measurement meets it.
ERROR_KINDS = (
    "realize",  # the plan could not be realized (cut, compile, export)
    "serve",  # the serving path did not run the plan (a miss, a fallback to dynamo's graph)
    "accuracy",  # the realized plan disagrees with the model beyond the accuracy rule
    "run",  # calling it raised
    "timing",  # the timer itself failed (e.g. a CUDA graph that cannot be captured)
)


@dataclass(frozen=True)
class Timing:
    """Statistics of repeated calls (seconds) and the context every measurement records."""

    median_s: float
    p99_s: float
    min_s: float
    mean_s: float
    iqr_s: float  # interquartile range: the spread
    reps: int
    stable: bool  # whether the median settled before the bounds were hit
    device: str  # spec name ("h100", "cpu", ...)
    device_fingerprint: str
    torch_version: str
    dtype: str = ""
    copies: int = 1  # back-to-back copies per sample (measure_in_graph); stats are per copy

    @property
    def spread(self) -> float:
        """IQR relative to the median."""
        return self.iqr_s / self.median_s if self.median_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def per_copy(self, copies: int) -> Timing:
        """These statistics of samples that each ran `copies` copies, per copy."""
        if copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies}")
        k = float(copies)
        return replace(
            self,
            median_s=self.median_s / k,
            p99_s=self.p99_s / k,
            min_s=self.min_s / k,
            mean_s=self.mean_s / k,
            iqr_s=self.iqr_s / k,
            copies=self.copies * copies,
        )


@dataclass(frozen=True)
class MeasureError:
    """Why a measurement has no timing: `kind` is one of ERROR_KINDS."""

    kind: str
    message: str

    def __post_init__(self) -> None:
        if self.kind not in ERROR_KINDS:
            raise ValueError(f"error kind must be one of {ERROR_KINDS}, got {self.kind!r}")

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"

    @classmethod
    def of(cls, kind: str, e: BaseException, limit: int = 500) -> MeasureError:
        """The error of exception `e`, its type named, its message cut to `limit`."""
        text = str(e).strip()
        return cls(kind, f"{type(e).__name__}: {text[:limit]}" if text else type(e).__name__)


@dataclass(frozen=True)
class Measurement:
    """One thing measured on one device: a timing, or the error that prevented one.

    `executor` says how it ran: "served" (through the `torch.compile` backend's per-call
    path, as a user's model runs it), "realized" (the realized plan called directly) or
    "callable" (a function given as it is: eager, torch.compile, one group).
    """

    label: str
    executor: str
    device: str
    device_fingerprint: str
    torch_version: str
    dtype: str
    timing: Timing | None = None
    error: MeasureError | None = None
    compile_s: float = 0.0  # realizing and compiling, before the first timed call
    call_s: float = math.nan  # whole calls from the host, where `timing` is kernels alone
    # one isolated call waited for (wall clock, device idle before it): what a loop that
    # needs each result sees; `timing` is calls back to back (the served executor)
    synced_s: float = math.nan
    check: str = ""  # what the accuracy check compared, and what it found
    fallbacks: Mapping[int, str] = field(default_factory=dict)  # group -> why it runs eagerly
    realizations: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # per group, what the realizer noted (e.g. a cuBLASLt epilogue)
    cuda_graph: bool = False

    def __post_init__(self) -> None:
        if (self.timing is None) == (self.error is None):
            raise ValueError("a Measurement has a timing or an error, exactly one of them")

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def median_s(self) -> float:
        return self.timing.median_s if self.timing else math.nan

    @property
    def p99_s(self) -> float:
        return self.timing.p99_s if self.timing else math.nan

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fallbacks"] = {str(k): v for k, v in self.fallbacks.items()}
        d["error"] = str(self.error) if self.error else ""
        return d


@dataclass(frozen=True)
class PlanJob:
    """One plan to measure, with what each executor needs.

    `captured`: the capture the plan was made on (its example inputs are the ones the plan
    is realized and checked on). `module` and `bucket`: the user's model and the shape
    bucket the plan serves; the serving executor compiles `module` with the backend and
    stores the plan for `bucket` (None: for the inputs' exact shapes). `inputs`: what the
    model is called with (default: the capture's example inputs).
    """

    captured: Captured
    plan: Plan | Partition
    label: str = "plan"
    module: torch.nn.Module | None = None
    inputs: tuple[Any, ...] | None = None
    bucket: Bucket | None = None
    bucket_spec: BucketSpec | None = None

    @property
    def call_inputs(self) -> tuple[Any, ...]:
        return tuple(self.captured.example_inputs) if self.inputs is None else self.inputs


class Runner(Protocol):
    """Realizes, checks and times; returns one Measurement per call.

    Contract: a failure of what is measured (realization, accuracy, a run, the timer)
    comes back as `Measurement.error`; only a bug in the runner itself raises. Runs with
    gradients off. Not thread-safe: one device, one measurement at a time.
    """

    def measure_plan(self, job: PlanJob) -> Measurement:
        """Realize `job.plan`, check it against the model on fresh inputs, time it."""
        ...

    def measure_callable(
        self,
        fn: Callable[..., Any],
        inputs: Sequence[Any],
        *,
        label: str,
        reference: Callable[..., Any] | None = None,
        compile_s: float = 0.0,
        dtype: str = "",
    ) -> Measurement:
        """Check `fn` against `reference` (when given), then time `fn(*inputs)`; `dtype`
        is recorded (default: the one the check found)."""
        ...

    def measure_interleaved(
        self, fns: Mapping[str, Callable[[], Any]], **timer: Any
    ) -> dict[str, Measurement]:
        """Time several callables (each already called once) in interleaved rounds, one
        record each; `timer` overrides the runner's round settings."""
        ...
