"""A data-parallel training step on two streams: the backward pass on the compute stream,
one gradient all-reduce per bucket on the communication stream, issued as soon as the
bucket's last gradient is ready (what DDP does), and the optimizer step after the last.

The bucket size trades the α term (more buckets, more latencies) against overlap (a
large bucket starts late and its all-reduce is exposed at the end); DDP fixes it at
25 MiB, the planner searches it (search/bucket_search.py).

Two step models (`STEP_MODELS`), chosen by how the link's library runs the collective
(`step_model_for`): `two-stream` as above, where a GPU library (NCCL) runs the
all-reduces on its own SMs and copy engines beside the backward; `serial`, the
all-reduces in sequence with the compute (`serial_comm`), where gloo runs them on the CPU cores
that also run the backward of CPU ranks, so nothing overlaps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.distributed.collectives import collective_of
from planner.distributed.comm_cost import CollectiveKind
from planner.distributed.links import LinkSpec
from planner.distributed.overlap import COMM, COMPUTE, Task, Timeline, schedule
from planner.errors import FusionPlannerError
from planner.ir.graph import Category, OpGraph

DDP_BUCKET_BYTES = 25 * 1024 * 1024  # torch DDP's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # at DDP's default cap (dist._DEFAULT_FIRST_BUCKET_BYTES)

TWO_STREAM = "two-stream"  # all-reduces on their own stream, overlapping the backward
SERIAL = "serial"  # all-reduces on the compute stream: nothing overlaps
STEP_MODELS = (TWO_STREAM, SERIAL)


@dataclass(frozen=True)
class StepModel:
    """Which DP step model prices a step (`name`, one of STEP_MODELS) and why."""

    name: str
    reason: str

    def __post_init__(self) -> None:
        if self.name not in STEP_MODELS:
            raise FusionPlannerError(
                f"unknown DP step model {self.name!r}; use one of {', '.join(STEP_MODELS)}"
            )

    @property
    def serial(self) -> bool:
        return self.name == SERIAL


def link_backend(link: LinkSpec) -> str | None:
    """The library the link's all-reduce figures were measured with ("gloo", "nccl"),
    None for a datasheet link."""
    measured = link.by_kind.get("all_reduce") or link.measured
    return measured.backend.lower() if measured is not None else None


def step_model_for(link: LinkSpec, device_kind: str, override: str | None = None) -> StepModel:
    """The step model for ranks of `device_kind` ("cpu", "gpu") communicating over
    `link`: `step_model_for_backend` with the backend the link was measured with (None
    for a datasheet link), `link.name` in its reason."""
    return step_model_for_backend(link_backend(link), device_kind, override, link.name)


def step_model_for_backend(
    backend: str | None, device_kind: str, override: str | None = None, link: str = ""
) -> StepModel:
    """`override` where given (one of STEP_MODELS); else `serial` for gloo (`backend`,
    or, where it is None, the backend CPU ranks use) and `two-stream` for NCCL (`backend`,
    or GPU ranks)."""
    if override:
        return StepModel(override, "chosen by the caller")
    on = f"{link} measured with" if link else "ranks on"
    if backend == "gloo":
        return StepModel(SERIAL, f"{on} gloo: the ranks' cores run the all-reduces")
    if backend == "nccl":
        return StepModel(TWO_STREAM, f"{on} NCCL: the all-reduces run on its own stream")
    if device_kind == "cpu":
        return StepModel(SERIAL, "CPU ranks: gloo runs the all-reduces on the backward's cores")
    return StepModel(TWO_STREAM, "GPU ranks: NCCL runs the all-reduces on its own stream")


@dataclass(frozen=True)
class BackwardStep:
    """One step of the backward pass and the gradients it completes, in ready order."""

    name: str
    duration_s: float
    grad_bytes: tuple[int, ...]


def pack(
    sizes_bytes: Sequence[int], bucket_bytes: int, first_bucket_bytes: int | None = None
) -> list[list[int]]:
    """DDP's packing over gradients in ready order: each gradient joins the open bucket,
    and the bucket is closed once it holds `bucket_bytes` or more (`first_bucket_bytes`
    for the first one), as DDP's reducer assigns buckets (`compute_bucket_assignment_by_size`):
    a bucket may pass its cap by its last gradient. Indices into `sizes_bytes`."""
    if bucket_bytes <= 0:
        raise FusionPlannerError(f"a bucket must hold at least one byte, got {bucket_bytes}")
    out: list[list[int]] = []
    cur: list[int] = []
    filled = 0
    for i, size in enumerate(sizes_bytes):
        cur.append(i)
        filled += size
        cap = first_bucket_bytes if first_bucket_bytes and not out else bucket_bytes
        if filled >= cap:
            out.append(cur)
            cur, filled = [], 0
    if cur:
        out.append(cur)
    return out


def first_bucket_bytes(bucket_bytes: int) -> int:
    """The cap of the first bucket when DDP runs with `bucket_bytes` as the realization
    passes it (planner.distributed.ddp.ddp_kwargs): DDP's default 25 MiB is left to
    DDP, which then closes its first bucket at 1 MiB; any other size is given as
    `bucket_cap_mb`, and DDP's first bucket then has that cap too."""
    return DDP_FIRST_BUCKET_BYTES if bucket_bytes == DDP_BUCKET_BYTES else bucket_bytes


def dp_step_tasks(
    steps: Sequence[BackwardStep],
    bucket_bytes: int,
    all_reduce_s: Callable[[int], float],
    forward_s: float = 0.0,
    optimizer_s: float = 0.0,
    first_bucket_bytes: int | None = None,
    copy_s: Callable[[int], float] | None = None,
    serial_comm: bool = False,
) -> list[Task]:
    """Forward, then the backward steps with bucket all-reduces interleaved where their
    last gradient is ready, then the optimizer step waiting for every all-reduce.

    `copy_s(nbytes)`, where given, prices DDP's copies on the compute stream: each
    step's gradients into their buckets as they become ready (a bucket's all-reduce
    waits for its copy), and every bucket back into the gradients after the last
    all-reduce. `serial_comm` runs the all-reduces in sequence with the compute (a CPU
    whose cores run the collective's copies and reductions as well as the backward):
    each stays on the communication stream, so T_comm is still their time, but the next
    compute task waits for it, so nothing overlaps and all of it is exposed."""
    sizes = [b for s in steps for b in s.grad_bytes]
    buckets = pack(sizes, bucket_bytes, first_bucket_bytes)
    last_grad = [max(b) for b in buckets]
    tasks = [Task("forward", COMPUTE, forward_s)]
    comm_ids: list[int] = []
    grads_done, next_bucket = 0, 0
    ready = 0  # the last compute task
    for step in steps:
        tasks.append(Task(step.name, COMPUTE, step.duration_s, (ready,)))
        ready = len(tasks) - 1
        if copy_s is not None and step.grad_bytes:
            tasks.append(
                Task(f"{step.name}.copy_in", COMPUTE, copy_s(sum(step.grad_bytes)), (ready,))
            )
            ready = len(tasks) - 1
        grads_done += len(step.grad_bytes)
        while next_bucket < len(buckets) and last_grad[next_bucket] < grads_done:
            nbytes = sum(sizes[i] for i in buckets[next_bucket])
            tasks.append(Task(f"all_reduce[{next_bucket}]", COMM, all_reduce_s(nbytes), (ready,)))
            comm_ids.append(len(tasks) - 1)
            if serial_comm:
                ready = len(tasks) - 1
            next_bucket += 1
    if copy_s is not None:
        tasks.append(Task("copy_out", COMPUTE, copy_s(sum(sizes)), (ready, *comm_ids)))
        ready = len(tasks) - 1
    tasks.append(Task("optimizer", COMPUTE, optimizer_s, (ready, *comm_ids)))
    return tasks


def dp_step_timeline(
    steps: Sequence[BackwardStep],
    bucket_bytes: int,
    all_reduce_s: Callable[[int], float],
    forward_s: float = 0.0,
    optimizer_s: float = 0.0,
    first_bucket_bytes: int | None = None,
    copy_s: Callable[[int], float] | None = None,
    serial_comm: bool = False,
) -> Timeline:
    """The schedule of `dp_step_tasks` (same arguments) over the two streams."""
    return schedule(
        dp_step_tasks(
            steps, bucket_bytes, all_reduce_s, forward_s, optimizer_s, first_bucket_bytes,
            copy_s, serial_comm,
        )
    )  # fmt: skip


BACKWARD_FACTOR = 2.0  # backward ≈ 2x forward: a GEMM's dX and dW are one GEMM each


def backward_steps(
    graph: OpGraph, op_time_s: Callable[[int], float], factor: float = BACKWARD_FACTOR
) -> list[BackwardStep]:
    """The backward pass of `graph` as steps in the order they run (reverse topological),
    each `factor` x the op's forward time, completing the gradients of the parameters the
    op reads (each parameter once, at its last reader in forward order, i.e. the first the
    backward reaches). Collectives take no compute time here. An estimate: the forward graph does not hold the backward's ops."""
    seen: set[int] = set()
    steps = []
    for n in reversed(graph.nodes):
        params = [t for t in n.inputs if graph.tensors[t].kind == "param" and t not in seen]
        seen.update(params)
        grads = tuple(graph.tensors[t].nbytes for t in params)
        dur = 0.0 if n.category is Category.COLLECTIVE else factor * op_time_s(n.index)
        if dur > 0 or grads:
            steps.append(BackwardStep(n.name, dur, grads))
    return steps


@dataclass(frozen=True)
class GradientSync:
    """A data-parallel gradient synchronization found in a graph: all-reduces whose
    buffers are packed (views, cat) from the graph's inputs only, those inputs being the
    gradients. `grad_bytes`/`grad_names` in the order the buckets take them (DDP's ready
    order), `bucket_bytes` the all-reduces as captured, `group_size` the ranks (None where
    capture did not record it)."""

    grad_names: tuple[str, ...]
    grad_bytes: tuple[int, ...]
    bucket_bytes: tuple[int, ...]
    group_size: int | None

    def steps(self) -> list[BackwardStep]:
        """The gradients as backward steps taking no time: the graph holds no backward,
        so each gradient is ready when the step starts."""
        return [BackwardStep(n, 0.0, (b,)) for n, b in zip(self.grad_names, self.grad_bytes)]


_PACKING = (Category.VIEW, Category.COPY)


def gradient_sync(graph: OpGraph) -> GradientSync | None:
    """The graph's gradient synchronization, or None: the all-reduces whose input is
    made by views and copies (cat) of graph inputs alone, each input once."""
    names: list[str] = []
    sizes: list[int] = []
    buckets: list[int] = []
    groups: set[int | None] = set()
    seen: set[int] = set()
    for n in graph.nodes:
        c = collective_of(graph, n)
        if c is None or c.kind is not CollectiveKind.ALL_REDUCE:
            continue
        leaves = _packed_inputs(graph, n.inputs[0]) if n.inputs else None
        if not leaves or seen & set(leaves):
            continue
        seen.update(leaves)
        names += [graph.tensors[t].name for t in leaves]
        sizes += [graph.tensors[t].nbytes for t in leaves]
        buckets.append(graph.tensors[n.inputs[0]].nbytes)
        groups.add(c.group_size)
    if not buckets:
        return None
    group = groups.pop() if len(groups) == 1 else None
    return GradientSync(tuple(names), tuple(sizes), tuple(buckets), group)


def _packed_inputs(graph: OpGraph, tensor: int) -> list[int] | None:
    """The graph inputs `tensor` is packed from, in order, or None if anything else
    (a parameter, a computed value) goes into it."""
    info = graph.tensors[tensor]
    if info.producer is None:
        return [tensor] if info.kind == "input" else None
    node = graph.nodes[info.producer]
    if node.category not in _PACKING:
        return None
    out: list[int] = []
    for t in node.inputs:
        leaves = _packed_inputs(graph, t)
        if leaves is None:
            return None
        out += leaves
    return out
