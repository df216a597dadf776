"""The distributed what-if of `fusion-plan analyze`: `--tp`, `--dp`, `--pp`,
`--interconnect`, `--bucket-mb`.

Prices the captured graph's collectives with the α-β model on the chosen link, puts them
on a communication stream beside the per-op compute times, and reports T_comp, T_comm,
R and the exposed communication of the forward pass; with `--dp`, of a training step
whose gradient all-reduce runs in buckets during an estimated backward pass; with
`--pp`, the pipeline bubble. docs/distributed.md says what is estimated.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.distributed.collectives import Collective, collectives, require_group_size
from planner.distributed.comm_cost import (
    Algorithm,
    CollectiveKind,
    bubble_fraction,
    collective_time_s,
    hierarchical_all_reduce_s,
)
from planner.distributed.dp import backward_steps, dp_step_timeline
from planner.distributed.links import LinkSpec, get_link
from planner.distributed.overlap import Timeline, plan_tasks, schedule
from planner.distributed.streams import evaluate_streams
from planner.distributed.tp_graph import find_tp_sites
from planner.errors import DeviceSpecError, ModelSpecError
from planner.fusion.partition import Partition
from planner.ir.capture import Captured
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.tp_search import search_tp_graph

MB = 1024 * 1024


def wants_distributed(args: argparse.Namespace) -> bool:
    keys = ("tp", "dp", "pp", "interconnect", "ranks_per_node")
    return any(getattr(args, k) is not None for k in keys)


def apply_tp(args: argparse.Namespace, params: dict[str, int]) -> None:
    """Put `--tp` into the model's shape string (the zoo:tp-* models take TP)."""
    if args.tp is None:
        return
    if "TP" not in params:
        raise ModelSpecError(
            f"{args.model} has no tensor-parallel variant (no TP shape parameter); "
            "use zoo:tp-mlp or zoo:tp-block, or leave out --tp"
        )
    args.shape = ",".join(s for s in (args.shape, f"TP={args.tp}") if s)


def _link(args: argparse.Namespace, device_kind: str) -> LinkSpec:
    name = args.interconnect or ("nvlink" if device_kind == "gpu" else "local")
    try:
        return get_link(name)
    except DeviceSpecError:
        if args.interconnect is None:  # no measured local link yet: say what was used
            return get_link("pcie4")
        raise


def _line(label: str, tl: Timeline) -> str:
    r = "inf" if tl.ratio == float("inf") else f"{tl.ratio:.2f}"
    return (
        f"{label:<12} {tl.t_comp_s * 1e6:11.1f} {tl.t_comm_s * 1e6:11.1f} {r:>7} "
        f"{tl.exposed_comm_s * 1e6:11.1f} {tl.makespan_s * 1e6:11.1f}"
    )


def distributed_report(
    args: argparse.Namespace, graph: OpGraph, op_time_s: list[float], device_kind: str
) -> tuple[dict[str, Any], str]:
    link = _link(args, device_kind)
    inter = get_link(args.inter_node)
    per_node = args.ranks_per_node

    def all_reduce_s(nbytes: int, p: int, algorithm: Algorithm = Algorithm.RING) -> float:
        if per_node and p > per_node:
            if p % per_node:
                raise ModelSpecError(f"{p} ranks do not fill nodes of {per_node} evenly")
            return hierarchical_all_reduce_s(nbytes, per_node, p // per_node, link, inter)
        return collective_time_s("all_reduce", algorithm, nbytes, p, link)

    def comm_s(c: Collective) -> float:
        p = require_group_size(c, args.tp)
        if c.kind is CollectiveKind.ALL_REDUCE:
            return all_reduce_s(c.nbytes, p, c.algorithm)
        return collective_time_s(c.kind, c.algorithm, c.nbytes, p, link)

    singletons = [frozenset((n.index,)) for n in graph.nodes]
    fwd = schedule(plan_tasks(graph, singletons, lambda g: op_time_s[min(g)], comm_s))
    ab = link.alpha_beta(1 * MB)
    rows = [
        f"distributed what-if over {link.name} (alpha {ab.alpha_s * 1e6:.2f} us, "
        f"B {ab.bandwidth_Bps / 1e9:.2f} GB/s per direction"
        + (", measured)" if link.measured else ", datasheet)"),
        f"{'':<12} {'T_comp us':>11} {'T_comm us':>11} {'R':>7} {'exposed us':>11} "
        f"{'critical us':>11}",
        _line("forward", fwd),
    ]
    if per_node:
        rows.insert(1, f"  {per_node} ranks per node; across nodes {inter.name} (hierarchical)")
    out: dict[str, Any] = {"link": link.name, "forward": fwd.summary()}
    for flag in ("tp", "dp", "pp", "ranks_per_node"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ModelSpecError(
                f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}"
            )
    if args.dp:
        bucket = int(args.bucket_mb * MB)
        steps = backward_steps(graph, lambda i: op_time_s[i])

        def ar(nbytes: int) -> float:
            return all_reduce_s(nbytes, args.dp)

        step = dp_step_timeline(steps, bucket, ar, forward_s=fwd.makespan_s)
        rows.append(_line(f"train dp={args.dp}", step))
        rows.append(
            f"  gradients {sum(b for s in steps for b in s.grad_bytes) / MB:.2f} MiB in "
            f"{args.bucket_mb:g} MiB buckets; backward estimated as 2x forward per op"
        )
        out["train_step"] = {**step.summary(), "dp": args.dp, "bucket_bytes": bucket}
    if args.pp is not None:
        frac = bubble_fraction(args.schedule, args.pp, args.microbatches)
        rows.append(
            f"pipeline {args.schedule}: {args.pp} stages x {args.microbatches} micro-batches, "
            f"bubble {frac:.1%} of the step"
        )
        out["pipeline"] = {
            "schedule": args.schedule,
            "stages": args.pp,
            "microbatches": args.microbatches,
            "bubble_fraction": frac,
        }
    return out, "\n".join(rows)


def streams_report(
    args: argparse.Namespace, objective: Objective, partition: Partition, device_kind: str
) -> tuple[dict[str, Any], str]:
    """The chosen partition over two streams: T_comp, T_comm, R, exposed, critical path."""
    link = _link(args, device_kind)
    tl = evaluate_streams(objective, partition, link)
    text = "\n".join(
        [
            f"two streams, collectives over {link.name}:",
            f"{'':<12} {'T_comp us':>11} {'T_comm us':>11} {'R':>7} {'exposed us':>11} "
            f"{'critical us':>11}",
            _line("plan", tl),
        ]
    )
    return {"link": link.name, **tl.summary()}, text


def tp_report(
    args: argparse.Namespace, captured: Captured, model: Any, device_kind: str
) -> tuple[dict[str, Any], str] | None:
    """The tensor-parallel decisions (chunks, fused epilogue) of the captured program's
    column -> row sites, priced with `model` and ring all-reduces on the link, forward
    (every decision) and backward (what training adds: not chunked); None when the program
    has no such site. The payload's "record" is the chosen decision as the Plan records it
    (planner.plans.plan.TPChoice)."""
    sites = find_tp_sites(captured.program.module())
    if not sites:
        return None
    sizes = [c.group_size for c in collectives(captured.graph) if c.group_size]
    ranks = sizes[0] if sizes else (args.tp or 2)
    link = _link(args, device_kind)
    plan = search_tp_graph(
        captured, lambda n: collective_time_s("all_reduce", "ring", n, ranks, link), model
    )
    back = plan.backward
    lines = [
        f"tensor-parallel decisions: {len(sites)} column -> row sites, all-reduce over "
        f"{link.name}, {ranks} ranks:",
        f"{'decision':<12} {'total us':>11} {'T_comp us':>11} {'T_comm us':>11} {'exposed us':>11}",
    ]
    for p in plan.table:
        mark = "  <- chosen" if p.decision == plan.best.decision else ""
        lines.append(
            f"{p.decision.label:<12} {p.total_s * 1e6:>11.2f} {p.t_comp_s * 1e6:>11.2f} "
            f"{p.t_comm_s * 1e6:>11.2f} {p.exposed_comm_s * 1e6:>11.2f}{mark}"
        )
    lines.append(
        f"{'backward':<12} {back.total_s * 1e6:>11.2f} {back.t_comp_s * 1e6:>11.2f} "
        f"{back.t_comm_s * 1e6:>11.2f} {back.exposed_comm_s * 1e6:>11.2f}  (training: "
        "not chunked, the same for every decision)"
    )
    chunked = plan.planned_backward
    if chunked is not None:
        lines.append(
            f"{'backward rw':<12} {chunked.total_s * 1e6:>11.2f} {chunked.t_comp_s * 1e6:>11.2f} "
            f"{chunked.t_comm_s * 1e6:>11.2f} {chunked.exposed_comm_s * 1e6:>11.2f}  (the "
            "program rewritten for training with the chosen decision: input gradients chunked)"
        )
    payload = {
        "sites": [s.gemm for s in sites],
        "link": link.name,
        "ranks": ranks,
        "chosen": plan.best.decision.label,
        "table": [p.row() for p in plan.table],
        "forward": plan.best.row(),
        "backward": {k: v for k, v in back.row().items() if k.endswith("_s")},
        "backward_rewritten": (
            {k: v for k, v in chunked.row().items() if k.endswith("_s")} if chunked else None
        ),
        "record": plan.choice(),
    }
    return payload, "\n".join(lines)
