"""The parser of `fusion-plan collect`, built without torch; the command itself,
cli/commands/collect.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.options import add_device_arg, add_threads_arg, nonneg_int, positive_float, positive_int
from cli.parsers import command
from search.flags import cost_model_arg


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect", help="measure groups and whole plans on this device into data/*.parquet"
    )
    p.add_argument(
        "--models",
        default="all",
        help="comma-separated model specs (zoo:name,...) or 'all' for the whole zoo",
    )
    p.add_argument(
        "--shapes",
        default="auto",
        help="';'-separated shape specs applied to every model (a model lacking a parameter "
        "is skipped for that shape), or 'auto' for each model's built-in sweep",
    )
    p.add_argument("--dtypes", default="fp32", help="comma-separated: fp32,bf16,fp16")
    p.add_argument("--groups-per-graph", type=nonneg_int, default=12, help="random legal groups")
    p.add_argument(
        "--random-plans", type=nonneg_int, default=2, help="random whole plans per graph"
    )
    p.add_argument(
        "--strategies", default="greedy,priority", help="strategies whose plans are measured"
    )
    p.add_argument(
        "--learned",
        type=cost_model_arg,
        default=None,
        metavar="MODEL.json",
        help="also measure each strategy's plan under this learned cost model (named "
        "STRATEGY@learned): candidates that each model thinks best, to rank",
    )
    p.add_argument(
        "--plans",
        default=None,
        metavar="FILE.json",
        help='more plans to measure, with their groups: {"plans": [{"graph_key": ..., '
        '"strategy": ..., "groups": [[node, ...], ...]}, ...]} (benchmarks/heldout_plans.py '
        "writes one)",
    )
    p.add_argument("--out", required=True, help="Parquet file, e.g. data/h100_profiles.parquet")
    p.add_argument("--resume", action="store_true", help="add to --out, skipping known keys")
    p.add_argument(
        "--max-seconds", type=positive_float, default=None, help="stop (cleanly) after this"
    )
    p.add_argument("--workers", type=nonneg_int, default=0, help="compile-warming processes")
    p.add_argument(
        "--time-beside-compiles",
        action="store_true",
        help="with --workers: start timing while workers still compile (faster, noisier; "
        "by default every graph is compiled first)",
    )
    add_device_arg(p, measures=True)
    add_threads_arg(p)
    p.add_argument("--max-jobs", type=positive_int, default=None, help="at most this many graphs")
    p.add_argument("--no-singles", action="store_true", help="skip single-op groups")
    p.add_argument(
        "--no-plan-groups",
        action="store_true",
        help="do not time the random plans' groups alone (by default every plan's groups are)",
    )
    p.add_argument(
        "--no-strategy-groups",
        action="store_true",
        help="do not time the groups of the strategies' and --plans plans alone (a run that "
        "only re-times whole plans)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=command("collect"))
