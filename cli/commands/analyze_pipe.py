"""The pipeline part of `fusion-plan analyze --pp N --schedule S --microbatches M|auto`.

The captured batch (the shape's B) is one pipeline step's batch, split into M equal
micro-batches. The stages are the captured graph's ops cut into N contiguous stages in op
order balancing their priced cost (planner.distributed.pipeline_split), or, for a graph
that is itself one stage's rank program (zoo:pp-block), N copies of it. A micro-batch
costs each stage its fixed overhead (the stage's kernel launches, or
`--microbatch-overhead-us`) plus 1/M of the rest; the backward is `dp.BACKWARD_FACTOR`
times the forward (or the measured backward's ratio when `--dp` measured one). The step
is laid out by planner.distributed.pipeline; with `auto` every divisor of B is priced and
the fastest whose activations fit `--activation-limit-mb` per stage is used.

`--schedule interleaved --virtual-stages V` cuts the graph into V·N chunks the same way
(chunk c of stage d is the (c·N + d)-th in op order), or splits the stage program evenly
into V chunks (`pipeline.even_chunks`); M, or each divisor `auto` tries, must be a
multiple of N (Megatron-LM's requirement). `--microbatch-overhead-us` is then each chunk's.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.distributed.comm_cost import Schedule, bubble_fraction
from planner.distributed.dp import BACKWARD_FACTOR
from planner.distributed.links import LinkSpec
from planner.distributed.pipeline import (
    MicrobatchRow,
    StageCost,
    choose_microbatches,
    divisors,
    even_chunks,
    price_microbatches,
)
from planner.distributed.pipeline_split import (
    is_pipeline_stage,
    replicated_stages,
    split_stages,
    stage_costs,
)
from planner.errors import ModelSpecError
from planner.ir.graph import OpGraph

MB = 1024 * 1024
US = 1e-6


def parse_microbatches(value: object) -> int | None:
    """`--microbatches`: a positive int, or None for "auto"."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        m = int(text)
    except ValueError:
        m = 0
    if m < 1:
        raise ModelSpecError(f"--microbatches takes a positive integer or auto, got {value!r}")
    return m


def _count(n: int, noun: str, plural: str = "") -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _virtual_stages(args: argparse.Namespace, schedule: Schedule) -> int:
    """v, the model chunks per stage: `--virtual-stages`, only with the interleaved schedule."""
    v = getattr(args, "virtual_stages", None)
    if v is not None and v < 1:
        raise ModelSpecError(f"--virtual-stages must be >= 1, got {v}")
    if schedule is Schedule.INTERLEAVED:
        if v is None:
            raise ModelSpecError(
                "--schedule interleaved needs --virtual-stages V (model chunks per stage)"
            )
        return v
    if v not in (None, 1):
        raise ModelSpecError(
            f"--virtual-stages {v} needs --schedule interleaved ({schedule.value} runs one "
            "chunk per stage)"
        )
    return 1


def _candidates(m: int | None, batch: int | None, stages: int = 1, chunks: int = 1) -> list[int]:
    if chunks > 1 and m is not None and m % stages:
        raise ModelSpecError(
            f"--schedule interleaved needs --microbatches a multiple of --pp {stages} "
            f"(Megatron-LM's requirement), got {m}"
        )
    if batch is None:
        if m is None:
            raise ModelSpecError(
                "--microbatches auto searches the divisors of the batch, but the model has "
                "no batch parameter B: give --microbatches M"
            )
        return [m]
    if m is None:
        if chunks == 1:
            return divisors(batch)
        found = [d for d in divisors(batch) if d % stages == 0]
        if not found:
            raise ModelSpecError(
                f"--microbatches auto with --schedule interleaved tries the divisors of B={batch} "
                f"that are multiples of --pp {stages}, and there are none: change B or --pp"
            )
        return found
    if batch % m:
        raise ModelSpecError(
            f"--microbatches {m} does not split the batch B={batch} into equal "
            f"micro-batches; use a divisor of {batch} ({', '.join(map(str, divisors(batch)))}) "
            "or auto"
        )
    return [m]


def _stages(
    args: argparse.Namespace,
    graph: OpGraph,
    op_time_s: list[float],
    op_launch_s: list[float],
    factor: float,
    chunks: int = 1,
) -> tuple[list[StageCost], str, list[range] | None]:
    """The stages' costs (per virtual stage with `chunks` > 1), how they were made, and
    the op runs (None when replicated)."""
    overhead = getattr(args, "microbatch_overhead_us", None)
    if overhead is not None and overhead < 0:
        raise ModelSpecError(f"--microbatch-overhead-us must be >= 0, got {overhead}")
    p, n = args.pp, args.pp * chunks
    in_chunks = (
        f" of {_count(chunks, 'chunk')} each (chunk c of stage d is the (c*{p} + d)-th)"
        if chunks > 1
        else ""
    )
    if is_pipeline_stage(graph):
        costs = replicated_stages(graph, p, op_time_s, op_launch_s, factor)
        costs = even_chunks(costs, chunks) if chunks > 1 else costs
        how = f"the stage program repeated on {_count(p, 'stage')}" + (
            f", split evenly into {_count(chunks, 'chunk')} each" if chunks > 1 else ""
        )
        runs = None
    else:
        if chunks > 1 and n > len(op_time_s):
            raise ModelSpecError(
                f"--pp {p} x --virtual-stages {chunks} = {n} chunks need at least {n} ops; "
                f"the graph has {len(op_time_s)}"
            )
        runs = split_stages(op_time_s, n)
        costs = stage_costs(graph, runs, op_time_s, op_launch_s, factor)
        pieces = _count(n, "chunk") if chunks > 1 else _count(p, "stage")
        how = f"{_count(len(graph.nodes), 'op')} cut into {pieces} in op order, balancing cost"
        how += f", on {_count(p, 'stage')}{in_chunks}" if chunks > 1 else ""
    if overhead is not None:
        fixed = overhead * US
        too_big = [s for s, c in enumerate(costs) if fixed > c.forward_s]
        if too_big:
            what = f"stage {too_big[0]}" if chunks == 1 else f"chunk {too_big[0]}"
            raise ModelSpecError(
                f"--microbatch-overhead-us {overhead} exceeds {what}'s whole "
                f"forward ({costs[too_big[0]].forward_s / US:.3g} us)"
            )
        costs = [
            StageCost(c.forward_s, c.backward_s, c.activation_bytes, c.send_bytes, fixed,
                      factor * fixed)
            for c in costs
        ]  # fmt: skip
    return costs, how, runs


def pipeline_report(
    args: argparse.Namespace,
    graph: OpGraph,
    op_time_s: list[float],
    op_launch_s: list[float],
    link: LinkSpec,
    batch: int | None,
    backward_ratio: float | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The pipeline step's breakdown (payload, text lines) for `--pp`."""
    stages = args.pp
    schedule = Schedule(args.schedule)
    chunks = _virtual_stages(args, schedule)
    m = parse_microbatches(args.microbatches)
    limit_mb = getattr(args, "activation_limit_mb", None)
    if limit_mb is not None and limit_mb <= 0:
        raise ModelSpecError(f"--activation-limit-mb must be > 0, got {limit_mb}")
    limit = limit_mb * MB if limit_mb is not None else None
    factor = backward_ratio if backward_ratio is not None else BACKWARD_FACTOR
    candidates = _candidates(m, batch, stages, chunks)
    costs, how, runs = _stages(args, graph, op_time_s, op_launch_s, factor, chunks)
    if m is None:
        choice = choose_microbatches(schedule, costs, candidates, link, limit, chunks)
        table, row = list(choice.table), choice.chosen
    else:
        row = price_microbatches(schedule, costs, m, link, limit, chunks)
        table = [row]
    backward = (
        f"backward {factor:.3g}x forward (measured)"
        if backward_ratio is not None
        else f"backward {factor:g}x forward (estimated, dp.BACKWARD_FACTOR)"
    )
    lines = [
        f"pipeline {schedule.value}: {how}; p2p over {link.name}; {backward}; a micro-batch "
        f"costs each {'chunk' if chunks > 1 else 'stage'} its fixed overhead plus its share of "
        "the rest",
    ]
    payload: dict[str, Any] = {
        "schedule": schedule.value,
        "stages": stages,
        "virtual_stages": chunks,
        "batch": batch,
        "backward_factor": factor,
        "backward_source": "measured" if backward_ratio is not None else "estimated",
        "stage_split": how,
        "memory_limit_bytes": limit,
        "stage_costs": [
            {
                "stage": s % stages,
                "chunk": s // stages,
                "ops": [runs[s].start, runs[s].stop] if runs else None,
                "forward_s": c.forward_s,
                "backward_s": c.backward_s,
                "forward_overhead_s": c.forward_overhead_s,
                "backward_overhead_s": c.backward_overhead_s,
                "activation_bytes": c.activation_bytes,
                "send_bytes": c.send_bytes,
            }
            for s, c in enumerate(costs)
        ],
    }
    if m is None:
        payload["search"] = [r.row() for r in table]
        lines += _search_lines(table, row, batch, limit)
    if row is None:
        payload.update(microbatches=None, bubble_fraction=None, step_model=None)
        lines.append(
            f"  no micro-batch count keeps every stage's activations within {limit_mb:g} MiB"
        )
        return payload, lines
    step = row.step
    payload.update(
        microbatches=row.microbatches,
        bubble_fraction=bubble_fraction(schedule, stages, row.microbatches, chunks),
        step_model={**step.summary(), "memory_bytes": list(row.memory_bytes), "fits": row.fits},
    )
    lines += _step_lines(row, stages, batch)
    return payload, lines


def _step_lines(row: MicrobatchRow, stages: int, batch: int | None) -> list[str]:
    step, m = row.step, row.microbatches
    size = f" of {batch // m} samples" if batch else ""
    closed = bubble_fraction(step.schedule, stages, m, step.chunks)
    chunked = f" x {_count(step.chunks, 'chunk')}" if step.chunks > 1 else ""
    lines = [
        f"  {_count(stages, 'stage')}{chunked} x {_count(m, 'micro-batch', 'micro-batches')}{size}: step {step.step_s / US:.1f} us, bubble "
        f"{step.bubble_fraction:.1%} measured ({closed:.1%} for equal stages, free p2p), "
        f"exposed p2p {step.exposed_p2p_s / US:.2f} us"
        + ("" if row.fits else "  (over the activation limit)"),
    ]
    if step.chunks > 1:
        lines.append(
            "  per stage one micro-batch through all its chunks; in flight counts (micro-batch, "
            "chunk) pairs"
        )
    lines += [
        f"  {'stage':>5} {'fwd us':>9} {'bwd us':>9} {'busy us':>10} {'idle us':>10} "
        f"{'send us':>8} {'in flight':>9} {'act MiB':>9}",
    ]
    for s in range(stages):
        send = step.send_s[s]
        lines.append(
            f"  {s:>5} {step.forward_s[s] / US:9.2f} {step.backward_s[s] / US:9.2f} "
            f"{step.busy_s[s] / US:10.1f} {step.idle_s[s] / US:10.1f} {send / US:8.2f} "
            f"{step.peak_in_flight[s]:>9} {row.memory_bytes[s] / MB:9.3f}"
        )
    return lines


def _search_lines(
    table: list[MicrobatchRow], chosen: MicrobatchRow | None, batch: int | None, limit: float | None
) -> list[str]:
    where = f"divisors of B={batch}" if batch else "given"
    cap = f", activation limit {limit / MB:g} MiB per stage" if limit is not None else ""
    lines = [
        f"  micro-batch search over the {where}{cap}:",
        f"  {'m':>5} {'step us':>11} {'bubble':>7} {'exposed p2p us':>15} {'peak act MiB':>13}",
    ]
    for r in table:
        mark = "  <- chosen" if chosen is not None and r is chosen else ""
        mark = mark or ("" if r.fits else "  (over the limit)")
        lines.append(
            f"  {r.microbatches:>5} {r.step.step_s / US:11.1f} {r.step.bubble_fraction:7.1%} "
            f"{r.step.exposed_p2p_s / US:15.2f} {max(r.memory_bytes) / MB:13.3f}{mark}"
        )
    return lines
