"""`fusion-plan analyze`: per-op roofline table and fusion bounds of a model."""

from __future__ import annotations

import argparse

from learned_cost.analytical import AnalyticalModel
from learned_cost.report import analyze, format_table
from planner.hardware import get_spec
from search.cli_common import add_model_args, capture_for_planning, emit, resolve


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="per-op FLOPs, bytes, roofline bound and predicted time")
    add_model_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    r = resolve(args)
    graph = capture_for_planning(r).graph
    report = analyze(graph, AnalyticalModel(get_spec(r.device_name)), r.dtype_name)
    emit(
        args,
        {"model": r.spec.label, "dtype": r.dtype_name, **report.to_dict()},
        format_table(report),
    )
    return 0
