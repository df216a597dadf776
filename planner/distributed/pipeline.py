"""A pipeline-parallel training step over micro-batches, laid out as tasks on streams.

p stages, m micro-batches. Each stage runs its forward F(s, i) and backward B(s, i) of
every micro-batch i on its own compute stream, in the order its schedule fixes
(`stage_order`): GPipe runs all m forwards, then all m backwards; 1F1B
(PipeDream-flush) runs min(p - s - 1, m) warm-up forwards, then alternates one forward
and one backward, then drains the remaining backwards. Between consecutive stages each
micro-batch's activation goes forward and its gradient comes back as one point-to-point
message of α + S·β (`comm_cost`'s send/recv row); each direction of each link is its own
stream, so messages in one direction queue and the two directions run at once, and a
stage's compute does not wait for its own sends (they run on the copy engine / the
library's thread). F(s, i) waits for the activation from stage s-1, B(s, i) for the
gradient from stage s+1 (the last stage's for its own forward).

The tasks go through `overlap.schedule` (each stream runs its tasks in list order, a
task starts when its stream is free and its inputs have ended), which with a fixed order
per stream is the event simulation of the step. Reported (`PipelineStep`): the step
time, the bubble measured on the timeline (1 - Σ busy / (p · step)), each stage's busy
and idle time, the exposed point-to-point time (the step minus the same step with free
transfers) and each stage's peak micro-batches in flight (forwards begun whose backward
has not ended: GPipe m, 1F1B min(m, p - s) for stage s counted from 0).

With equal stages and free transfers both schedules take (m + p - 1)·(t_f + t_b) and
the bubble is (p-1)/(m+p-1), `comm_cost.bubble_fraction`. The optimizer step and the
interleaved (virtual-stage) schedule are not modelled here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.distributed.comm_cost import (
    Algorithm,
    CollectiveKind,
    Schedule,
    collective_time_s,
)
from planner.distributed.links import AlphaBeta, LinkSpec
from planner.distributed.overlap import Task, Timeline, schedule
from planner.errors import FusionPlannerError

FORWARD, BACKWARD = "F", "B"
SCHEDULES = (Schedule.GPIPE, Schedule.ONE_F_ONE_B)


def _schedule(name: Schedule | str) -> Schedule:
    try:
        sched = Schedule(name)
    except ValueError:
        sched = None
    if sched not in SCHEDULES:
        raise FusionPlannerError(
            f"the pipeline step model runs {', '.join(s.value for s in SCHEDULES)}; got "
            f"{name!r} (the interleaved schedule has only its bubble fraction)"
        )
    return sched  # type: ignore[return-value]


def stage_order(
    schedule_name: Schedule | str, stages: int, stage: int, m: int
) -> list[tuple[str, int]]:
    """The (pass, micro-batch) sequence stage `stage` (from 0) of `stages` runs."""
    sched = _schedule(schedule_name)
    if sched is Schedule.GPIPE:
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    order = [(FORWARD, i) for i in range(warm)]
    for i in range(m - warm):
        order += [(FORWARD, warm + i), (BACKWARD, i)]
    return order + [(BACKWARD, i) for i in range(m - warm, m)]


def peak_in_flight(order: Sequence[tuple[str, int]]) -> int:
    """Most micro-batches whose forward has run and whose backward has not, along `order`."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == FORWARD else -1
        peak = max(peak, held)
    return peak


def p2p_time_s(nbytes: float, link: LinkSpec | AlphaBeta | None) -> float:
    """One message of `nbytes` between two ranks: α + S·β; free without a link or bytes."""
    if link is None or nbytes <= 0:
        return 0.0
    return collective_time_s(CollectiveKind.SEND_RECV, Algorithm.DIRECT, nbytes, 2, link)


@dataclass(frozen=True)
class PipelineStep:
    """A priced pipeline step. Lists are per stage (from 0); times in seconds."""

    schedule: str
    microbatches: int
    timeline: Timeline
    forward_s: tuple[float, ...]  # one micro-batch's forward per stage
    backward_s: tuple[float, ...]
    transfer_s: tuple[float, ...]  # one message each way between stage s and s+1
    busy_s: tuple[float, ...]
    peak_in_flight: tuple[int, ...]
    step_free_p2p_s: float  # the same order with free transfers

    @property
    def stages(self) -> int:
        return len(self.forward_s)

    @property
    def step_s(self) -> float:
        return self.timeline.makespan_s

    @property
    def idle_s(self) -> tuple[float, ...]:
        return tuple(self.step_s - b for b in self.busy_s)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the stages' time over the step: 1 - Σ busy / (p · step)."""
        if self.step_s <= 0:
            return 0.0
        return 1.0 - sum(self.busy_s) / (self.stages * self.step_s)

    @property
    def exposed_p2p_s(self) -> float:
        return max(0.0, self.step_s - self.step_free_p2p_s)

    @property
    def p2p_busy_s(self) -> float:
        return 2 * self.microbatches * sum(self.transfer_s)

    def summary(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "stages": self.stages,
            "microbatches": self.microbatches,
            "step_s": self.step_s,
            "bubble_fraction_measured": self.bubble_fraction,
            "exposed_p2p_s": self.exposed_p2p_s,
            "p2p_busy_s": self.p2p_busy_s,
            "per_stage": [
                {
                    "stage": s,
                    "forward_s": self.forward_s[s],
                    "backward_s": self.backward_s[s],
                    "busy_s": self.busy_s[s],
                    "idle_s": self.idle_s[s],
                    "peak_in_flight": self.peak_in_flight[s],
                    "send_s": self.transfer_s[s] if s < self.stages - 1 else 0.0,
                }
                for s in range(self.stages)
            ],
        }


def pipeline_tasks(
    schedule_name: Schedule | str,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    transfer_s: Sequence[float],
    m: int,
) -> list[Task]:
    """The step's tasks in an order `overlap.schedule` accepts: every task after those it
    waits for, each stream's tasks in the order the stream runs them. Streams:
    "stage s" (compute), "p2p s->s+1" (activations), "p2p s+1->s" (gradients)."""
    p = len(forward_s)
    orders = [stage_order(schedule_name, p, s, m) for s in range(p)]
    index: dict[tuple[str, int, int], int] = {}  # (pass or "act"/"grad", stage, i) -> task
    tasks: list[Task] = []
    heads = [0] * p

    def add(key: tuple[str, int, int], task: Task) -> None:
        index[key] = len(tasks)
        tasks.append(task)

    while any(heads[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while heads[s] < len(orders[s]):
                kind, i = orders[s][heads[s]]
                if kind == FORWARD:
                    need = [("act", s - 1, i)] if s > 0 else []
                else:
                    need = [(FORWARD, s, i)] + ([("grad", s + 1, i)] if s < p - 1 else [])
                if any(k not in index for k in need):
                    break
                deps = tuple(index[k] for k in need)
                dur = forward_s[s] if kind == FORWARD else backward_s[s]
                add((kind, s, i), Task(f"{kind}{i}@{s}", f"stage {s}", dur, deps))
                mine = (index[(kind, s, i)],)
                if kind == FORWARD and s < p - 1:
                    add(("act", s, i), Task(f"act{i} {s}->{s + 1}", f"p2p {s}->{s + 1}",
                                            transfer_s[s], mine))  # fmt: skip
                if kind == BACKWARD and s > 0:
                    add(("grad", s, i), Task(f"grad{i} {s}->{s - 1}", f"p2p {s}->{s - 1}",
                                             transfer_s[s - 1], mine))  # fmt: skip
                heads[s] += 1
                progressed = True
        assert progressed, "the stage orders wait on each other"
    return tasks


def pipeline_step(
    schedule_name: Schedule | str,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    microbatches: int,
    send_bytes: Sequence[float] = (),
    link: LinkSpec | AlphaBeta | None = None,
) -> PipelineStep:
    """Price one step: per-stage forward and backward seconds of one micro-batch
    (`forward_s[s]`, `backward_s[s]`), `send_bytes[s]` the activation stage s sends to
    stage s+1 per micro-batch (its gradient comes back with as many bytes), every message
    priced on `link` (None: free)."""
    sched = _schedule(schedule_name)
    p = len(forward_s)
    if p < 1 or len(backward_s) != p:
        raise FusionPlannerError(
            f"a pipeline needs >= 1 stage and a backward time per stage; got {p} forward "
            f"and {len(backward_s)} backward times"
        )
    if microbatches < 1:
        raise FusionPlannerError(f"a pipeline needs >= 1 micro-batch, got {microbatches}")
    if any(t < 0 for t in (*forward_s, *backward_s)):
        raise FusionPlannerError("stage times must be >= 0 seconds")
    send_bytes = list(send_bytes) or [0.0] * (p - 1)
    if len(send_bytes) != p - 1:
        raise FusionPlannerError(
            f"{p} stages have {p - 1} links between them; got {len(send_bytes)} sizes"
        )
    transfer = [p2p_time_s(b, link) for b in send_bytes]
    tasks = pipeline_tasks(sched, forward_s, backward_s, transfer, microbatches)
    timeline = schedule(tasks)
    free = schedule(pipeline_tasks(sched, forward_s, backward_s, [0.0] * (p - 1), microbatches))
    busy = tuple(timeline.busy_s(f"stage {s}") for s in range(p))
    peaks = tuple(peak_in_flight(stage_order(sched, p, s, microbatches)) for s in range(p))
    return PipelineStep(
        sched.value, microbatches, timeline, tuple(forward_s), tuple(backward_s),
        tuple(transfer), busy, peaks, free.makespan_s,
    )  # fmt: skip


# ---- choosing the micro-batch count ---------------------------------------------------
@dataclass(frozen=True)
class StageCost:
    """One stage's cost for the whole batch run as a single micro-batch.

    A micro-batch of a fraction f of the batch costs `overhead + (whole - overhead)·f`
    per pass: a fixed part (kernel launches, per-message set-up: paid by every
    micro-batch whatever its size) and a part proportional to its size (FLOPs and bytes).
    `activation_bytes` (kept for the backward) and `send_bytes` (the activation sent to
    the next stage; its gradient comes back as large) scale with f."""

    forward_s: float
    backward_s: float
    activation_bytes: float = 0.0
    send_bytes: float = 0.0
    forward_overhead_s: float = 0.0
    backward_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.forward_overhead_s <= self.forward_s:
            raise FusionPlannerError(
                f"a stage's fixed forward overhead ({self.forward_overhead_s:g} s) must lie in "
                f"[0, its forward time {self.forward_s:g} s]"
            )
        if not 0 <= self.backward_overhead_s <= self.backward_s:
            raise FusionPlannerError(
                f"a stage's fixed backward overhead ({self.backward_overhead_s:g} s) must lie "
                f"in [0, its backward time {self.backward_s:g} s]"
            )

    def scaled(self, fraction: float) -> tuple[float, float]:
        """(forward, backward) seconds of a micro-batch holding `fraction` of the batch."""
        fo, bo = self.forward_overhead_s, self.backward_overhead_s
        return fo + (self.forward_s - fo) * fraction, bo + (self.backward_s - bo) * fraction


@dataclass(frozen=True)
class MicrobatchRow:
    """One candidate micro-batch count: its step and per-stage activation memory peak."""

    microbatches: int
    step: PipelineStep
    memory_bytes: tuple[float, ...]  # per stage: peak in flight x one micro-batch's bytes
    fits: bool

    def row(self) -> dict[str, Any]:
        return {
            "microbatches": self.microbatches,
            "step_s": self.step.step_s,
            "bubble_fraction_measured": self.step.bubble_fraction,
            "exposed_p2p_s": self.step.exposed_p2p_s,
            "peak_memory_bytes": max(self.memory_bytes),
            "fits": self.fits,
        }


def price_microbatches(
    schedule_name: Schedule | str,
    stages: Sequence[StageCost],
    microbatches: int,
    link: LinkSpec | AlphaBeta | None = None,
    memory_limit_bytes: float | None = None,
) -> MicrobatchRow:
    """The step with the batch split into `microbatches` equal micro-batches."""
    if microbatches < 1:
        raise FusionPlannerError(f"a pipeline needs >= 1 micro-batch, got {microbatches}")
    f = 1.0 / microbatches
    times = [c.scaled(f) for c in stages]
    step = pipeline_step(
        schedule_name, [t[0] for t in times], [t[1] for t in times], microbatches,
        [c.send_bytes * f for c in stages[:-1]], link,
    )  # fmt: skip
    memory = tuple(n * c.activation_bytes * f for n, c in zip(step.peak_in_flight, stages))
    fits = memory_limit_bytes is None or max(memory) <= memory_limit_bytes
    return MicrobatchRow(microbatches, step, memory, fits)


def divisors(n: int) -> list[int]:
    """The positive divisors of `n`, ascending."""
    if n < 1:
        raise FusionPlannerError(f"a batch must hold >= 1 sample, got {n}")
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class MicrobatchChoice:
    """The micro-batch count with the shortest step among those whose activations fit
    (None when none fits), and every candidate's row, ascending."""

    chosen: MicrobatchRow | None
    table: tuple[MicrobatchRow, ...]
    memory_limit_bytes: float | None


def choose_microbatches(
    schedule_name: Schedule | str,
    stages: Sequence[StageCost],
    candidates: Sequence[int],
    link: LinkSpec | AlphaBeta | None = None,
    memory_limit_bytes: float | None = None,
) -> MicrobatchChoice:
    """Price every candidate micro-batch count (e.g. `divisors` of the batch) and keep
    the fastest whose per-stage activation memory (peak in flight x one micro-batch's
    bytes) stays within `memory_limit_bytes`; ties go to fewer micro-batches."""
    if not candidates:
        raise FusionPlannerError("no micro-batch counts to choose from")
    table = tuple(
        price_microbatches(schedule_name, stages, m, link, memory_limit_bytes)
        for m in sorted(set(candidates))
    )
    fitting = [r for r in table if r.fits]
    chosen = min(fitting, key=lambda r: r.step.step_s) if fitting else None
    return MicrobatchChoice(chosen, table, memory_limit_bytes)
