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

Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021 §2.2.2): each stage (device) d holds
v model chunks, chunk c being virtual stage c·p + d, and a micro-batch goes through all
v·p virtual stages in turn, so it crosses the link from stage p-1 to stage 0 (and its
gradient the link back) v - 1 times and sends v·p - 1 messages each way instead of p - 1.
Each device runs `interleaved_order`: Megatron-LM's (p - d - 1)·2 + (v - 1)·p warm-up
forwards (at most v·m), then one forward and one backward in turn over (micro-batch,
chunk) pairs, then the remaining backwards; m must be a multiple of p. The costs are per
virtual stage (`pipeline_step`'s `chunks`; `even_chunks` splits each stage's cost evenly
over its chunks). With v = 1 it is 1F1B.

The tasks go through `overlap.schedule` (each stream runs its tasks in list order, a
task starts when its stream is free and its inputs have ended), which with a fixed order
per stream is the event simulation of the step. Reported (`PipelineStep`): the step
time, the bubble measured on the timeline (1 - Σ busy / (p · step)), each stage's busy
and idle time, the exposed point-to-point time (the step minus the same step with free
transfers) and each stage's peak micro-batches in flight (forwards begun whose backward
has not ended: GPipe m, 1F1B min(m, p - s) for stage s counted from 0; interleaved
counts (micro-batch, chunk) pairs, min((p - d - 1)·2 + (v - 1)·p + 1, v·m) on stage d).

With equal stages (one micro-batch's forward t_f and backward t_b per stage, t_f/v and
t_b/v per chunk) and free transfers the step is (v·m + p - 1)·(t_f + t_b)/v: the ideal
m·(t_f + t_b) plus a fill and drain of (p - 1)·(t_f + t_b)/v (v = 1 for GPipe and 1F1B).
Over the ideal time that bubble is (p - 1)/(v·m), the paper's normalization; over the
step, as measured here and in `comm_cost.bubble_fraction`, it is (p - 1)/(v·m + p - 1).
The optimizer step is not modelled here.
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
SCHEDULES = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)


def _schedule(name: Schedule | str) -> Schedule:
    try:
        sched = Schedule(name)
    except ValueError:
        sched = None
    if sched not in SCHEDULES:
        raise FusionPlannerError(
            f"the pipeline step model runs {', '.join(s.value for s in SCHEDULES)}; got {name!r}"
        )
    return sched  # type: ignore[return-value]


def stage_order(
    schedule_name: Schedule | str, stages: int, stage: int, m: int
) -> list[tuple[str, int]]:
    """The (pass, micro-batch) sequence stage `stage` (from 0) of `stages` runs under GPipe
    or 1F1B (the interleaved schedule's, over chunks too, is `interleaved_order`)."""
    sched = _schedule(schedule_name)
    if sched is Schedule.INTERLEAVED:
        raise FusionPlannerError(
            "the interleaved schedule runs (pass, micro-batch, chunk): see interleaved_order"
        )
    if sched is Schedule.GPIPE:
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    order = [(FORWARD, i) for i in range(warm)]
    for i in range(m - warm):
        order += [(FORWARD, warm + i), (BACKWARD, i)]
    return order + [(BACKWARD, i) for i in range(m - warm, m)]


def interleaved_order(stages: int, stage: int, m: int, chunks: int) -> list[tuple[str, int, int]]:
    """The (pass, micro-batch, chunk) sequence device `stage` (from 0) of `stages` runs
    under interleaved 1F1B with `chunks` model chunks per device (Megatron-LM's
    `forward_backward_pipelining_with_interleaving`).

    The device's k-th forward (k from 0 to v·m - 1) is chunk (k mod p·v) // p of
    micro-batch p·(k // p·v) + k mod p: groups of p micro-batches go through chunk 0, then
    chunk 1, ...; its k-th backward takes the chunks the other way (v - 1 first). It runs
    min((p - d - 1)·2 + (v - 1)·p, v·m) warm-up forwards, then one forward and one
    backward in turn, then the remaining backwards. m must be a multiple of p (Megatron-LM
    requires it). With one chunk it is 1F1B's order (Megatron-LM runs its non-interleaved
    schedule then), whatever m."""
    p, v = stages, chunks
    if v < 1:
        raise FusionPlannerError(f"the interleaved schedule needs >= 1 chunk per stage, got {v}")
    if v == 1:
        return [(kind, i, 0) for kind, i in stage_order(Schedule.ONE_F_ONE_B, p, stage, m)]
    if m % p:
        raise FusionPlannerError(
            f"the interleaved schedule needs the micro-batches to be a multiple of the "
            f"{p} stages (Megatron-LM's requirement); got {m}"
        )

    def item(kind: str, k: int) -> tuple[str, int, int]:
        group, r = divmod(k, p * v)
        chunk = r // p if kind == FORWARD else v - 1 - r // p
        return kind, group * p + r % p, chunk

    total = m * v
    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    order = [item(FORWARD, k) for k in range(warm)]
    for k in range(total - warm):
        order += [item(FORWARD, warm + k), item(BACKWARD, k)]
    return order + [item(BACKWARD, k) for k in range(total - warm, total)]


def device_order(
    schedule_name: Schedule | str, stages: int, stage: int, m: int, chunks: int = 1
) -> list[tuple[str, int, int]]:
    """The (pass, micro-batch, chunk) sequence device `stage` runs under any schedule
    (chunk 0 only for GPipe and 1F1B, which take one chunk)."""
    sched = _schedule(schedule_name)
    if sched is Schedule.INTERLEAVED:
        return interleaved_order(stages, stage, m, chunks)
    if chunks != 1:
        raise FusionPlannerError(
            f"{sched.value} runs one chunk per stage; {chunks} chunks need the interleaved schedule"
        )
    return [(kind, i, 0) for kind, i in stage_order(sched, stages, stage, m)]


def peak_in_flight(order: Sequence[tuple[str, int] | tuple[str, int, int]]) -> int:
    """Most micro-batches (with chunks: (micro-batch, chunk) pairs) whose forward has run
    and whose backward has not, along `order`."""
    held = peak = 0
    for kind, *_ in order:
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
    """A priced pipeline step. Lists are per stage (device, from 0) unless said otherwise;
    times in seconds. With v chunks per stage (interleaved), virtual stage c·p + d is
    chunk c of stage d."""

    schedule: str
    microbatches: int
    timeline: Timeline
    forward_s: tuple[float, ...]  # one micro-batch's forward per stage, all its chunks
    backward_s: tuple[float, ...]
    transfer_s: tuple[float, ...]  # one message each way from virtual stage k to k+1
    busy_s: tuple[float, ...]
    peak_in_flight: tuple[int, ...]  # micro-batches; with chunks (micro-batch, chunk) pairs
    step_free_p2p_s: float  # the same order with free transfers
    chunks: int = 1
    chunk_forward_s: tuple[float, ...] = ()  # per virtual stage (empty: one chunk)
    chunk_backward_s: tuple[float, ...] = ()

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

    @property
    def send_s(self) -> tuple[float, ...]:
        """Per stage: one micro-batch's activation messages it sends (one per chunk but
        the last virtual stage's)."""
        p = self.stages
        return tuple(sum(self.transfer_s[d::p]) for d in range(p))

    def summary(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "stages": self.stages,
            "chunks": self.chunks,
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
                    "send_s": self.send_s[s],
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
    chunks: int = 1,
) -> list[Task]:
    """The step's tasks in an order `overlap.schedule` accepts: every task after those it
    waits for, each stream's tasks in the order the stream runs them. `forward_s`,
    `backward_s` per virtual stage (v·p of them, virtual stage c·p + d on stage d),
    `transfer_s` per boundary between virtual stages k and k+1. Streams: "stage d"
    (compute), "p2p a->b" for each stage pair and direction (activations go from the
    stage of virtual stage k to that of k+1, gradients back; with chunks the link from
    stage p-1 to stage 0 carries chunk c's activation to chunk c+1). Each link direction
    has one sender, so its messages queue in the sender's order."""
    p = len(forward_s) // chunks
    last = len(forward_s) - 1
    orders = [device_order(schedule_name, p, d, m, chunks) for d in range(p)]
    index: dict[tuple[str, int, int], int] = {}  # (pass or "act"/"grad", vstage, i) -> task
    tasks: list[Task] = []
    heads = [0] * p

    def add(key: tuple[str, int, int], task: Task) -> None:
        index[key] = len(tasks)
        tasks.append(task)

    def where(k: int) -> str:
        return f"{k}" if chunks == 1 else f"{k % p}c{k // p}"  # stage, or stage and chunk

    while any(heads[d] < len(orders[d]) for d in range(p)):
        progressed = False
        for d in range(p):
            while heads[d] < len(orders[d]):
                kind, i, c = orders[d][heads[d]]
                k = c * p + d  # virtual stage
                if kind == FORWARD:
                    need = [("act", k - 1, i)] if k > 0 else []
                else:
                    need = [(FORWARD, k, i)] + ([("grad", k + 1, i)] if k < last else [])
                if any(key not in index for key in need):
                    break
                deps = tuple(index[key] for key in need)
                dur = forward_s[k] if kind == FORWARD else backward_s[k]
                add((kind, k, i), Task(f"{kind}{i}@{where(k)}", f"stage {d}", dur, deps))
                mine = (index[(kind, k, i)],)
                if kind == FORWARD and k < last:
                    to = (k + 1) % p
                    add(("act", k, i), Task(f"act{i} {where(k)}->{where(k + 1)}",
                                            f"p2p {d}->{to}", transfer_s[k], mine))  # fmt: skip
                if kind == BACKWARD and k > 0:
                    to = (k - 1) % p
                    add(("grad", k, i), Task(f"grad{i} {where(k)}->{where(k - 1)}",
                                             f"p2p {d}->{to}", transfer_s[k - 1], mine))  # fmt: skip
                heads[d] += 1
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
    chunks: int = 1,
) -> PipelineStep:
    """Price one step: per-stage forward and backward seconds of one micro-batch
    (`forward_s[s]`, `backward_s[s]`), `send_bytes[s]` the activation stage s sends to
    stage s+1 per micro-batch (its gradient comes back with as many bytes), every message
    priced on `link` (None: free).

    With `chunks` = v > 1 (interleaved only) the lists are per virtual stage: v·p
    forward and backward times, virtual stage c·p + d being chunk c of stage d, and v·p - 1
    sizes, `send_bytes[k]` going from virtual stage k to k+1 (stage p-1's chunk c sends
    to stage 0's chunk c+1 over the same link). A message between two chunks of one
    stage (p = 1) is free. `even_chunks` splits per-stage costs evenly into chunks."""
    sched = _schedule(schedule_name)
    if chunks < 1:
        raise FusionPlannerError(f"a pipeline stage needs >= 1 chunk, got {chunks}")
    n = len(forward_s)
    if n < 1 or n % chunks or len(backward_s) != n:
        raise FusionPlannerError(
            f"a pipeline needs >= 1 stage and a backward time per stage; got {n} forward "
            f"and {len(backward_s)} backward times"
            + (f" for stages of {chunks} chunks (v·p of each)" if chunks > 1 else "")
        )
    p = n // chunks
    if microbatches < 1:
        raise FusionPlannerError(f"a pipeline needs >= 1 micro-batch, got {microbatches}")
    if any(t < 0 for t in (*forward_s, *backward_s)):
        raise FusionPlannerError("stage times must be >= 0 seconds")
    send_bytes = list(send_bytes) or [0.0] * (n - 1)
    if len(send_bytes) != n - 1:
        what = "stages" if chunks == 1 else "virtual stages"
        raise FusionPlannerError(
            f"{n} {what} have {n - 1} links between them; got {len(send_bytes)} sizes"
        )
    orders = [device_order(sched, p, d, microbatches, chunks) for d in range(p)]  # checks m
    transfer = [p2p_time_s(b, link) if p > 1 else 0.0 for b in send_bytes]
    tasks = pipeline_tasks(sched, forward_s, backward_s, transfer, microbatches, chunks)
    timeline = schedule(tasks)
    free_tasks = pipeline_tasks(sched, forward_s, backward_s, [0.0] * (n - 1), microbatches, chunks)
    free = schedule(free_tasks)
    busy = tuple(timeline.busy_s(f"stage {d}") for d in range(p))
    peaks = tuple(peak_in_flight(o) for o in orders)
    per_stage_f = tuple(sum(forward_s[d::p]) for d in range(p))
    per_stage_b = tuple(sum(backward_s[d::p]) for d in range(p))
    return PipelineStep(
        sched.value, microbatches, timeline, per_stage_f, per_stage_b, tuple(transfer), busy,
        peaks, free.makespan_s, chunks,
        tuple(forward_s) if chunks > 1 else (), tuple(backward_s) if chunks > 1 else (),
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
    memory_bytes: tuple[float, ...]  # per stage: peak activation bytes held (its chunks')
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


def even_chunks(stages: Sequence[StageCost], chunks: int) -> list[StageCost]:
    """Per-stage costs split evenly into `chunks` model chunks each, in virtual-stage
    order (virtual stage c·p + d is 1/v of stage d: its forward, backward, fixed overheads
    and activation bytes). A chunk sends what its stage sends, and stage p-1's chunks
    (the last stage sends nothing) the largest any stage sends: in a stack of equal
    layers the same hidden state crosses every cut. The last virtual stage sends nothing."""
    if chunks < 1:
        raise FusionPlannerError(f"a pipeline stage needs >= 1 chunk, got {chunks}")
    p, v = len(stages), chunks
    wrap = max((c.send_bytes for c in stages), default=0.0)
    out = []
    for k in range(v * p):
        c = stages[k % p]
        send = c.send_bytes if k % p < p - 1 else wrap
        out.append(StageCost(c.forward_s / v, c.backward_s / v, c.activation_bytes / v,
                             send if k < v * p - 1 else 0.0, c.forward_overhead_s / v,
                             c.backward_overhead_s / v))  # fmt: skip
    return out


def peak_memory_bytes(
    order: Sequence[tuple[str, int, int]], activation_bytes: Sequence[float], stages: int, d: int
) -> float:
    """Most activation bytes stage `d` holds along its (pass, micro-batch, chunk) `order`,
    chunk c's forward keeping `activation_bytes[c·p + d]` until its backward."""
    held = peak = 0.0
    for kind, _, c in order:
        held += activation_bytes[c * stages + d] * (1 if kind == FORWARD else -1)
        peak = max(peak, held)
    return peak


def price_microbatches(
    schedule_name: Schedule | str,
    stages: Sequence[StageCost],
    microbatches: int,
    link: LinkSpec | AlphaBeta | None = None,
    memory_limit_bytes: float | None = None,
    chunks: int = 1,
) -> MicrobatchRow:
    """The step with the batch split into `microbatches` equal micro-batches; with
    `chunks` > 1 (interleaved), `stages` holds one cost per virtual stage (v·p, as
    `pipeline_step` takes them; `even_chunks` makes them from per-stage costs)."""
    if microbatches < 1:
        raise FusionPlannerError(f"a pipeline needs >= 1 micro-batch, got {microbatches}")
    f = 1.0 / microbatches
    times = [c.scaled(f) for c in stages]
    step = pipeline_step(
        schedule_name, [t[0] for t in times], [t[1] for t in times], microbatches,
        [c.send_bytes * f for c in stages[:-1]], link, chunks,
    )  # fmt: skip
    if chunks == 1:
        memory = tuple(n * c.activation_bytes * f for n, c in zip(step.peak_in_flight, stages))
    else:
        p, act = step.stages, [c.activation_bytes * f for c in stages]
        memory = tuple(
            peak_memory_bytes(device_order(schedule_name, p, d, microbatches, chunks), act, p, d)
            for d in range(p)
        )
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
    chunks: int = 1,
) -> MicrobatchChoice:
    """Price every candidate micro-batch count (e.g. `divisors` of the batch) and keep
    the fastest whose per-stage activation memory (peak in flight x one micro-batch's
    bytes) stays within `memory_limit_bytes`; ties go to fewer micro-batches. `chunks` as
    in `price_microbatches` (the interleaved schedule takes only multiples of p)."""
    if not candidates:
        raise FusionPlannerError("no micro-batch counts to choose from")
    table = tuple(
        price_microbatches(schedule_name, stages, m, link, memory_limit_bytes, chunks)
        for m in sorted(set(candidates))
    )
    fitting = [r for r in table if r.fits]
    chosen = min(fitting, key=lambda r: r.step.step_s) if fitting else None
    return MicrobatchChoice(chosen, table, memory_limit_bytes)
