"""The distributed what-if of `fusion-plan analyze`: `--tp`, `--dp`, `--pp`,
`--interconnect`, `--bucket-mb`, `--dp-step-model`, `--backward`.

Prices the captured graph's collectives with the α-β model on the chosen link, each by
its cheapest algorithm (listed per collective), puts them on a communication stream
beside the per-op compute times, and reports T_comp, T_comm, R and the exposed
communication of the forward pass; with `--dp`, of a training step whose gradient
all-reduce runs in buckets during the backward pass (measured on this machine by
profiling.backward, or estimated from the forward graph: `dp_backward`), the bucket size searched
(search.bucket_search) unless `--bucket-mb` fixes it, beside DDP's default, under the
step model the link's backend runs (planner.distributed.dp.step_model_for: serial for gloo
on CPU ranks, two streams for NCCL on GPUs) unless `--dp-step-model` names one; for a graph
that is a gradient sync (zoo:dp-grad-sync), the same bucket decision over its gradients;
with `--pp`, the pipeline step over micro-batches (analyze_pipe; a pipeline-stage model,
zoo:pp-block, also lists its transfers with their peers). docs/distributed.md says what
is estimated.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from cli.commands.analyze_pipe import pipeline_report
from cli.common import Resolved
from planner.distributed.collectives import Collective, collectives, price, require_group_size
from planner.distributed.comm_cost import (
    AlgorithmChoice,
    cheapest_algorithm,
)
from planner.distributed.dp import (
    BACKWARD_FACTOR,
    DDP_BUCKET_BYTES,
    BackwardStep,
    StepModel,
    backward_steps,
    dp_step_timeline,
    first_bucket_bytes,
    gradient_sync,
    pack,
    step_model_for,
)
from planner.distributed.links import LinkSpec, get_link
from planner.distributed.overlap import Timeline, plan_tasks, schedule
from planner.distributed.streams import evaluate_streams
from planner.distributed.tp_graph import find_tp_sites
from planner.errors import DeviceSpecError, ModelSpecError, first_line
from planner.fusion.partition import Partition
from planner.hardware import local_device_name
from planner.ir.capture import Captured
from planner.ir.graph import OpGraph
from planner.objective import Objective
from planner.plans.plan import DPChoice
from profiling.backward import MeasuredBackward, measure_backward
from search.bucket_search import BucketChoice, search_bucket_size
from search.tp_search import search_tp_graph
from zoo.modelspec import parse_shape

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


def apply_dp_pp(args: argparse.Namespace, params: dict[str, int]) -> None:
    """Put `--dp` and `--pp` into the shape string of a model that takes DP (the zoo:dp-*
    gradient syncs) or PP (zoo:pp-block, a pipeline stage), so its all-reduces or
    transfers are captured over that many ranks; a shape that already gives another
    value is refused."""
    for flag, key in (("dp", "DP"), ("pp", "PP")):
        value = getattr(args, flag)
        if value is None or key not in params:
            continue
        given = parse_shape(args.shape).get(key)
        if given is None:
            args.shape = ",".join(s for s in (args.shape, f"{key}={value}") if s)
        elif given != value:
            raise ModelSpecError(
                f"--{flag} {value} and the shape's {key}={given} disagree: give one"
            )


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


def _all_reduce_pricer(
    link: LinkSpec, inter: LinkSpec | None, per_node: int | None
) -> Callable[[int, int], AlgorithmChoice]:
    """An all-reduce of n bytes over p ranks by its cheapest algorithm (hierarchical
    among them where p spans nodes of `per_node` ranks)."""

    def price_ar(nbytes: int, p: int) -> AlgorithmChoice:
        return cheapest_algorithm("all_reduce", nbytes, p, link, per_node, inter)

    return price_ar


def _step_model(args: argparse.Namespace, link: LinkSpec, device_kind: str) -> StepModel:
    return step_model_for(link, device_kind, getattr(args, "dp_step_model", None))


def bucket_report(
    steps: list[BackwardStep],
    ranks: int,
    price_ar: Callable[[int, int], AlgorithmChoice],
    forward_s: float,
    override_mb: float | None,
    backward_note: str,
    model: StepModel,
) -> tuple[dict[str, Any], list[str], BucketChoice, int]:
    """The gradient bucket size searched on the DP step under `model` beside DDP's
    default (and `override_mb` where given): payload, text lines, the search's choice and
    the bucket size used (the override, else the searched one)."""

    def ar(nbytes: int) -> float:
        return price_ar(nbytes, ranks).seconds

    choice = search_bucket_size(steps, ar, forward_s=forward_s, step_model=model)
    used = int(override_mb * MB) if override_mb is not None else choice.bucket_bytes
    if used < 1:
        raise ModelSpecError(f"--bucket-mb must hold at least one byte, got {override_mb}")
    sizes = [b for s in steps for b in s.grad_bytes]
    first = first_bucket_bytes(used)
    bucket_sizes = [sum(sizes[i] for i in b) for b in pack(sizes, used, first)]
    algos = [price_ar(b, ranks) for b in bucket_sizes]
    counts = Counter(a.algorithm.value for a in algos)
    rows = [
        f"gradient buckets over {ranks} ranks ({sum(sizes) / MB:.2f} MiB of gradients; "
        f"{backward_note}; step model {model.name}: {model.reason}):",
        f"  searched      {choice.bucket_bytes / MB:10.4g} MiB  step "
        f"{choice.predicted_s * 1e6:11.1f} us" + ("  <- used" if override_mb is None else ""),
        f"  DDP default   {DDP_BUCKET_BYTES / MB:10.4g} MiB  step "
        f"{choice.ddp_default_predicted_s * 1e6:11.1f} us",
    ]
    payload: dict[str, Any] = {
        "ranks": ranks,
        "step_model": {"name": model.name, "reason": model.reason},
        "searched_bytes": choice.bucket_bytes,
        "searched_predicted_s": choice.predicted_s,
        "ddp_default_bytes": DDP_BUCKET_BYTES,
        "ddp_default_predicted_s": choice.ddp_default_predicted_s,
        "used_bytes": used,
        "table": [{"bucket_bytes": b, "predicted_s": t} for b, t in choice.table],
        "buckets": [{"bytes": b, **a.row()} for b, a in zip(bucket_sizes, algos)],
    }
    if override_mb is not None:
        t = dp_step_timeline(
            steps, used, ar, forward_s, 0.0, first, serial_comm=model.serial
        ).makespan_s
        payload["override_predicted_s"] = t
        rows.append(f"  --bucket-mb   {override_mb:10.4g} MiB  step {t * 1e6:11.1f} us  <- used")
    rows.append(
        f"  all-reduces of the {len(bucket_sizes)} bucket(s) at the used size: "
        + ", ".join(f"{n} {a}" for a, n in sorted(counts.items()))
        + " (the cheapest algorithm per bucket)"
    )
    return payload, rows, choice, used


def dp_backward(
    args: argparse.Namespace, r: Resolved, graph: OpGraph
) -> tuple[MeasuredBackward | None, str]:
    """The measured backward for `--dp` (None: estimate it) and why, from `--backward`:
    `measured` runs the model's forward and backward on this machine
    (profiling.backward.measure_backward), refused for another `--device` or a model
    holding collectives (it would need a process group); `auto` measures where neither
    applies. None without `--dp` or for a gradient-sync graph (it holds no backward)."""
    source = getattr(args, "backward", None) or "auto"
    if not args.dp or source == "estimated" or gradient_sync(graph) is not None:
        return None, "chosen by the caller" if source == "estimated" else ""
    local = local_device_name()
    why_not = ""
    if r.device_name != local:
        why_not = f"--device {r.device_name} is not this machine's device ({local})"
    elif collectives(graph):
        why_not = "the model holds collectives: it runs only inside a process group"
    if why_not:
        if source == "measured":
            raise ModelSpecError(
                f"--backward measured runs the model here, but {why_not}; use --backward estimated"
            )
        return None, f"auto: {why_not}"
    try:
        module, inputs = r.spec.build(dtype=r.dtype, device="cpu" if local == "cpu" else "cuda")
        measured = measure_backward(module, inputs)
    except Exception as e:  # auto: a measurement that fails leaves the estimate
        if source == "measured":
            raise
        return None, f"auto: measuring the backward failed ({type(e).__name__}: {first_line(e)})"
    why = "chosen by the caller" if source == "measured" else "auto: --device is this machine's"
    return measured, why


def _backward_payload(measured: MeasuredBackward | None, why: str) -> dict[str, Any]:
    if measured is None:
        return {"source": "estimated", "reason": why or "chosen by the caller",
                "factor": BACKWARD_FACTOR}  # fmt: skip
    return {
        "source": "measured", "reason": why, "device": measured.device, "reps": measured.reps,
        "forward_s": measured.forward_s, "backward_s": measured.backward_s,
        "unused": list(measured.unused),
        "steps": [{"name": s.name, "duration_s": s.duration_s, "grad_bytes": sum(s.grad_bytes)}
                  for s in measured.steps],
    }  # fmt: skip


def _backward_note(measured: MeasuredBackward | None, why: str) -> str:
    if measured is None:
        note = f"backward estimated as {BACKWARD_FACTOR:g}x forward per op"
        return note + (f" ({why})" if why else "")
    return (
        f"backward measured on {measured.device} ({why}; median of {measured.reps} passes: "
        f"forward {measured.forward_s * 1e3:.3g} ms, backward {measured.backward_s * 1e3:.3g} ms)"
    )


def distributed_report(
    args: argparse.Namespace,
    graph: OpGraph,
    op_time_s: list[float],
    device_kind: str,
    measured: tuple[MeasuredBackward | None, str] = (None, ""),
    op_launch_s: list[float] | None = None,
    batch: int | None = None,
) -> tuple[dict[str, Any], str]:
    """The distributed breakdown; `measured` is `dp_backward`'s answer (the measured
    backward, or None to estimate it, and why); `op_launch_s` (each op's launch time, the
    fixed part of a micro-batch; none where not given) and `batch` (the shape's B) are for
    the pipeline step (analyze_pipe)."""
    for flag in ("tp", "dp", "pp", "ranks_per_node"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ModelSpecError(
                f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}"
            )
    link = _link(args, device_kind)
    inter = get_link(args.inter_node)
    per_node = args.ranks_per_node
    price_ar = _all_reduce_pricer(link, inter, per_node)
    priced: list[tuple[Collective, int, AlgorithmChoice]] = []

    def comm_s(c: Collective) -> float:
        p = require_group_size(c, args.tp or args.dp)
        choice = price(c, p, link, per_node, inter)
        priced.append((c, p, choice))
        return choice.seconds

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
    if priced:
        rows.append(_collective_lines(graph, priced))
        out["collectives"] = [
            {"node": graph.nodes[c.node].name, "kind": c.kind.value, "bytes": c.nbytes,
             "ranks": p, **a.row(),
             **({"messages": [asdict(m) for m in c.messages]} if c.messages else {})}
            for c, p, a in priced
        ]  # fmt: skip
    sync = gradient_sync(graph)
    if sync is not None:
        ranks = sync.group_size or args.dp
        if ranks is None:
            raise ModelSpecError("the gradient sync's group size is not known: give --dp")
        payload, lines, _, _ = bucket_report(
            sync.steps(), ranks, price_ar, 0.0, args.bucket_mb,
            "the graph holds no backward: every gradient is ready at the start",
            _step_model(args, link, device_kind),
        )  # fmt: skip
        rows += lines
        out["gradient_buckets"] = payload
    elif args.dp:
        bwd, why = measured
        if bwd is None:
            steps, forward_s = backward_steps(graph, lambda i: op_time_s[i]), fwd.makespan_s
        else:
            steps, forward_s = list(bwd.steps), bwd.forward_s
        model = _step_model(args, link, device_kind)
        payload, lines, _, bucket = bucket_report(
            steps, args.dp, price_ar, forward_s, args.bucket_mb, _backward_note(bwd, why), model,
        )  # fmt: skip
        payload["backward"] = _backward_payload(bwd, why)

        def ar(nbytes: int) -> float:
            return price_ar(nbytes, args.dp).seconds

        first = first_bucket_bytes(bucket)
        step = dp_step_timeline(steps, bucket, ar, forward_s, 0.0, first, serial_comm=model.serial)
        rows.append(_line(f"train dp={args.dp}", step))
        rows += lines
        out["train_step"] = {
            **step.summary(), "dp": args.dp, "bucket_bytes": bucket, "step_model": model.name,
            "backward": payload["backward"]["source"],
        }  # fmt: skip
        out["gradient_buckets"] = payload
    if args.pp is not None:
        bwd = measured[0]
        ratio = bwd.backward_s / bwd.forward_s if bwd is not None and bwd.forward_s > 0 else None
        launch = op_launch_s if op_launch_s is not None else [0.0] * len(op_time_s)
        out["pipeline"], lines = pipeline_report(args, graph, op_time_s, launch, link, batch, ratio)
        rows += lines
    return out, "\n".join(rows)


def _collective_lines(graph: OpGraph, priced: list[tuple[Collective, int, AlgorithmChoice]]) -> str:
    """One line per collective: kind, bytes, ranks, every candidate's time, the chosen."""
    lines = [f"  {'collective':<16} {'kind':<15} {'bytes':>10} {'ranks':>5}  algorithm (us)"]
    for c, p, a in priced:
        cands = ", ".join(
            f"{alg.value} {t * 1e6:.2f}{'*' if alg is a.algorithm else ''}"
            for alg, t in a.candidates
        )
        peers = "; ".join(
            f"{m.direction} {m.nbytes} {'to' if m.direction == 'send' else 'from'} rank {m.peer}"
            for m in c.messages
        )
        lines.append(
            f"  {graph.nodes[c.node].name:<16} {c.kind.value:<15} {c.nbytes:>10} {p:>5}  "
            f"{a.algorithm.value} ({cands})" + (f"  [{peers}]" if peers else "")
        )
    return "\n".join(lines)


def gradient_sync_decision(
    args: argparse.Namespace, graph: OpGraph, device_kind: str
) -> tuple[dict[str, Any], str, DPChoice] | None:
    """The bucket size `plan` decides for a graph holding a gradient sync: payload, text
    and the record (planner.plans.plan.DPChoice); None without a sync."""
    sync = gradient_sync(graph)
    if sync is None:
        return None
    ranks = sync.group_size or getattr(args, "dp", None)
    if ranks is None:
        raise ModelSpecError("the gradient sync's group size is not known")
    link = _link(args, device_kind)
    per_node = getattr(args, "ranks_per_node", None)
    inter = get_link(getattr(args, "inter_node", None) or "ib-ndr")
    price_ar = _all_reduce_pricer(link, inter, per_node)
    payload, lines, choice, _ = bucket_report(
        sync.steps(), ranks, price_ar, 0.0, None,
        "the graph holds no backward: every gradient is ready at the start",
        _step_model(args, link, device_kind),
    )  # fmt: skip
    payload["link"] = link.name
    lines[0] = lines[0].replace(" ranks (", f" ranks on {link.name} (", 1)
    return payload, "\n".join(lines), choice.record(ranks, link.name)


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
        captured, lambda n: cheapest_algorithm("all_reduce", n, ranks, link).seconds, model
    )
    back = plan.backward
    lines = [
        f"tensor-parallel decisions: {len(sites)} column -> row sites, all-reduce (cheapest "
        f"algorithm) over "
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
