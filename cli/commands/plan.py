"""`fusion-plan plan`: partition a model's graph with one strategy and show the plan.

    fusion-plan plan --model zoo:transformer-block --shape B=8,S=512 --device h100 \
        --dtype bf16 --strategy priority [--budget-evals N] [--budget-seconds S] [--seed 0]
        [--format json] [--html out.html] [--dot out.dot] [--save-plan plan.json]

Prints each group (ops, realization, predicted time, bound, boundary bytes) in execution
order and the totals against the unfused graph (one kernel per op). A graph that is a
data-parallel gradient sync also gets its gradient bucket size decided (beside DDP's
25 MiB) and recorded in the Plan (`data_parallel`). The cost model is the
one `--cost-model` names (search.cost_models; the same default as every command), or with
`--numa two-node|os` the NUMA objective (planner.distributed.numa.NumaCostModel), and the
groups' placement on the nodes is printed after the totals. `--numa-homes searched` decides
where tensors live with the partition (search.numa_search: the strategy runs once per
round) and prints the rounds, the placement and the migrations of the cheapest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from cli import fmt
from cli.commands.analyze_dist import gradient_sync_decision, streams_report, tp_report
from cli.commands.analyze_numa import plan_numa_homes_report, plan_numa_report, topology
from cli.common import (
    capture_for_planning,
    emit,
    resolve,
)
from cli.search_options import run_search
from cli.views import group_rows, render_dot, render_html
from planner.cost import CostModel
from planner.distributed.collectives import collectives
from planner.distributed.numa import NumaCostModel
from planner.errors import FusionPlannerError
from planner.fusion.partition import bits
from planner.fusion.recompute import effective
from planner.fusion.recompute import group_cost as recompute_cost
from planner.hardware import get_spec
from planner.objective import Evaluation, Objective
from search.cost_models import cost_model_for
from search.numa_search import search_homes
from search.strategy import Budget, SearchResult


def run(args: argparse.Namespace) -> int:
    r = resolve(args)
    captured = capture_for_planning(r)
    graph = captured.graph
    model = _cost_model(args, r.device_name, r.dtype_name)

    def objective_for(cost_model: CostModel) -> Objective:
        return Objective(
            cost_model,
            spec=get_spec(r.device_name),
            latency_bound_s=args.latency_bound_us * 1e-6 if args.latency_bound_us else None,
            memory_bound_bytes=int(args.memory_bound_mb * 1e6) if args.memory_bound_mb else None,
        )

    budget = Budget(args.budget_evals, args.budget_seconds)
    homes = None
    if getattr(args, "numa_homes", None) == "searched":  # each round runs the strategy
        assert isinstance(model, NumaCostModel)
        homes = search_homes(
            graph,
            model,
            lambda objective: run_search(args, graph, objective, budget),
            objective_for=objective_for,
        )
        model, result = homes.best.model, homes.best.result
    objective = objective_for(model)
    if homes is None:
        result = run_search(args, graph, objective, budget)
    unfused = objective.unfused(graph)
    plan = objective.make_plan(
        result.partition,
        result.evaluation,
        strategy=args.strategy,
        device=r.device_name,
        dtype=r.dtype_name,
        notes=result.notes,
    )
    variants = result.extra.get("variants") or []
    if variants and variants[0][0] == result.partition:  # a joint search: its labels too
        labels = variants[0][1]
        groups = tuple(dataclasses.replace(g, realization=r) for g, r in zip(plan.groups, labels))
        plan = dataclasses.replace(plan, groups=groups, predicted_s=variants[0][2])
        plan = plan.with_copies(variants[0][4])
    tp = None
    if args.interconnect or collectives(graph):
        tp = tp_report(args, captured, model, get_spec(r.device_name).kind)
        if tp is not None:  # the plan records the chosen decision (planner.plans.plan)
            plan = dataclasses.replace(plan, tensor_parallel=tp[0].pop("record"))
    dp = gradient_sync_decision(args, graph, get_spec(r.device_name).kind)
    if dp is not None:  # the plan records the bucket size (planner.plans.plan.DPChoice)
        plan = dataclasses.replace(plan, data_parallel=dp[2])
    title = f"{r.spec.label} on {r.device_name} ({r.dtype_name}), strategy {args.strategy}"
    summary = _summary_lines(result, unfused)
    if args.html:
        Path(args.html).write_text(
            render_html(
                result.partition, result.evaluation, title=title, summary="; ".join(summary)
            )
        )
    if args.dot:
        Path(args.dot).write_text(render_dot(result.partition, result.evaluation))
    if args.save_plan:
        Path(args.save_plan).write_text(json.dumps(plan.to_json(), indent=2) + "\n")
    rows = group_rows(result.partition, result.evaluation)
    labels = {tuple(gp.nodes): gp.realization for gp in plan.groups}
    copies = {tuple(gp.nodes): gp.recompute for gp in plan.groups if gp.recompute}
    for row in rows:  # what the plan records (a joint search chooses labels and copies)
        row["realization"] = labels.get(tuple(row["nodes"]), row["realization"])
        if tuple(row["nodes"]) in copies:
            row["recompute"] = [graph.nodes[i].name for i in copies[tuple(row["nodes"])]]
            row["ops"] = [*row["ops"], *(f"+{n}" for n in row["recompute"])]
    if copies:  # each group priced with its copies and the results no longer written
        _reprice(rows, result.partition, plan, objective)
        summary.append(f"with recompute {fmt.time_s(plan.predicted_s)} (+name: a recomputed op)")
    payload = {
        "model": r.spec.label,
        "device": r.device_name,
        "dtype": r.dtype_name,
        "strategy": args.strategy,
        "cost_model": objective.cost_model_label,
        "groups": rows,
        "totals": _totals(result, unfused),
        "plan": plan.to_json(),
    }
    if args.interconnect or collectives(graph):
        payload["streams"], streams_text = streams_report(
            args, objective, result.partition, get_spec(r.device_name).kind
        )
        summary.append(streams_text)
        if tp is not None:
            payload["tensor_parallel"], tp_text = tp
            summary.append(tp_text)
    if dp is not None:
        payload["data_parallel"] = dp[0]
        summary.append(dp[1])
    if isinstance(model, NumaCostModel):
        by_nodes = {tuple(sorted(g)): g for g in result.partition.groups}
        groups = [by_nodes[tuple(row["nodes"])] for row in rows]
        names = [f"#{row['group']}" for row in rows]
        if homes is None:
            payload["numa"], numa_text = plan_numa_report(model, graph, groups, names)
        else:
            payload["numa"], numa_text = plan_numa_homes_report(homes, graph, groups, names)
        summary.append(numa_text)
    emit(args, payload, _table(title, rows, summary))
    return 0


def _cost_model(args: argparse.Namespace, device: str, dtype: str) -> CostModel:
    """`--cost-model`'s model, or with `--numa` the NUMA objective on that topology."""
    if not getattr(args, "numa", None):
        if getattr(args, "numa_homes", None):
            raise FusionPlannerError(
                f"--numa-homes {args.numa_homes} decides where tensors live on NUMA nodes; "
                "give --numa two-node|os with it"
            )
        return cost_model_for(args.cost_model, device)
    if args.cost_model:
        raise FusionPlannerError(
            f"--numa {args.numa} prices groups with the NUMA objective; leave --cost-model out"
        )
    spec = get_spec(device)
    if spec.kind != "cpu":
        raise FusionPlannerError(
            f"--numa prices CPU memory nodes; {device} is a {spec.kind}: plan for a CPU --device"
        )
    return NumaCostModel(topology(args.numa, spec, dtype), spec=spec, label=args.numa)


def _reprice(rows: list[dict[str, Any]], part: Any, plan: Any, objective: Objective) -> None:
    """Rows' time, bound and bytes as planner.fusion.recompute prices each group."""
    by_nodes = {
        tuple(sorted(bits(m))): e for m, e in zip(part.masks, effective(part, plan.copies()))
    }
    labels = {tuple(gp.nodes): gp.realization for gp in plan.groups}
    for row in rows:
        live, cm, unread = by_nodes[tuple(row["nodes"])]
        cost = recompute_cost(objective.cost_model, part.graph, live, cm,
                              labels.get(tuple(row["nodes"])) or None, unread)  # fmt: skip
        row.update(predicted_s=cost.latency_s, bound=cost.bound, bytes_in=cost.bytes_in,
                   bytes_out=cost.bytes_out, flops=cost.flops)  # fmt: skip


def _totals(result: SearchResult, unfused: Evaluation) -> dict[str, Any]:
    ev = result.evaluation
    return {
        "predicted_s": ev.total_s,
        "unfused_s": unfused.total_s,
        "speedup": unfused.total_s / ev.total_s if ev.total_s else None,
        "transfer_s": ev.transfer_s,
        "groups": ev.n_groups,
        "kernels": ev.n_kernels,
        "unfused_kernels": unfused.n_kernels,
        "boundary_bytes": ev.boundary_bytes,
        "unfused_boundary_bytes": unfused.boundary_bytes,
        "critical_path_s": ev.critical_path_s,
        "peak_memory_bytes": ev.peak_memory_bytes,
        "feasible": ev.feasible,
        "reasons": list(ev.reasons),
        "evals": result.evals_used,
        "planning_s": result.seconds,
        "complete": result.complete,
        "notes": result.notes,
    }


def _summary_lines(result: SearchResult, unfused: Evaluation) -> list[str]:
    """The totals against the unfused graph, one short line per figure."""
    ev = result.evaluation
    speed = unfused.total_s / ev.total_s if ev.total_s else float("nan")
    return [
        f"predicted      {fmt.time_s(ev.total_s)} vs {fmt.time_s(unfused.total_s)} unfused "
        f"({speed:.2f}x)",
        f"kernels        {ev.n_kernels} vs {unfused.n_kernels} unfused",
        f"boundary bytes {fmt.bytes_(ev.boundary_bytes)} vs "
        f"{fmt.bytes_(unfused.boundary_bytes)} unfused",
        f"critical path  {fmt.time_s(ev.critical_path_s)}; peak boundary memory "
        f"{fmt.bytes_(ev.peak_memory_bytes)}",
        f"planned in     {fmt.time_s(result.seconds)}, {result.evals_used} evaluations "
        f"({result.notes})",
    ]


def _table(title: str, rows: list[dict[str, Any]], summary: list[str]) -> str:
    lines = [
        title,
        f"{'#':>3}  {'realization':11}  {'predicted':>10}  {'bound':7}  {'in':>9}  {'out':>9}  ops",
    ]
    for row in rows:
        ops = ", ".join(row["ops"])
        lines.append(
            f"{row['group']:>3}  {row['realization']:11}  {fmt.time_s(row['predicted_s']):>10}  "
            f"{row['bound']:7}  {fmt.bytes_(row['bytes_in']):>9}  {fmt.bytes_(row['bytes_out']):>9}  "
            f"{ops if len(ops) <= 80 else ops[:77] + '...'}"
        )
    lines += ["totals:", *(f"  {line}" for entry in summary for line in entry.splitlines())]
    return "\n".join(lines)
