"""`fusion-plan analyze`: per-op roofline table and fusion bounds of a model, and with
`--tp/--dp/--pp/--interconnect` (or for a graph that is a gradient sync) its distributed
breakdown (analyze_dist); with `--numa` the ops placed on NUMA nodes (analyze_numa)."""

from __future__ import annotations

import argparse

from cli.commands.analyze_dist import (
    apply_dp_pp,
    apply_tp,
    distributed_report,
    dp_backward,
    wants_distributed,
)
from cli.commands.analyze_numa import numa_report
from cli.common import capture_for_planning, emit, resolve
from learned_cost.analytical import AnalyticalModel
from learned_cost.report import analyze, format_table
from planner.distributed.dp import gradient_sync
from planner.hardware import get_spec
from zoo import modelspec


def run(args: argparse.Namespace) -> int:
    if wants_distributed(args):
        params = modelspec.resolve(args.model, args.shape).params
        apply_tp(args, params)
        apply_dp_pp(args, params)
    r = resolve(args)
    graph = capture_for_planning(r).graph
    spec = get_spec(r.device_name)
    model = AnalyticalModel(spec)
    report = analyze(graph, model, r.dtype_name)
    data = {"model": r.spec.label, "dtype": r.dtype_name, **report.to_dict()}
    text = format_table(report)
    if wants_distributed(args) or gradient_sync(graph) is not None:
        times = [row.predicted_s for row in report.rows]
        measured = dp_backward(args, r, graph)
        launch = [model.group_cost(graph, frozenset((n.index,))).t_launch_s for n in graph.nodes]
        data["distributed"], dist_text = distributed_report(
            args, graph, times, spec.kind, measured, launch, r.spec.params.get("B")
        )
        text += "\n" + dist_text
    if args.numa:
        data["numa"], numa_text = numa_report(args.numa, graph, spec, r.dtype_name)
        text += "\n" + numa_text
    emit(args, data, text)
    return 0
