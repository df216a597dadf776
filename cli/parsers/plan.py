"""The parser of `fusion-plan plan`, built without torch; the command itself,
cli/commands/plan.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.options import (
    add_link_arg,
    add_model_args,
    add_search_options,
    positive_float,
    positive_int,
)
from cli.parsers import command
from search.flags import STRATEGY_NAMES, add_cost_model_arg


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="partition a model into fused groups with one strategy")
    add_model_args(p)
    add_link_arg(p)
    p.add_argument("--strategy", default="priority", choices=sorted(STRATEGY_NAMES))
    p.add_argument("--budget-evals", type=positive_int, default=None, help="objective evaluations")
    p.add_argument("--budget-seconds", type=positive_float, default=None, help="wall-clock seconds")
    p.add_argument("--seed", type=int, default=0)
    add_cost_model_arg(p)
    p.add_argument(
        "--numa",
        default=None,
        choices=("two-node", "os"),
        help="search under the NUMA objective and report each group's node: two-node "
        "(simulated, 100 ns local / 150 ns remote) or os (this machine's nodes as the OS "
        "reports them); replaces --cost-model",
    )
    p.add_argument(
        "--numa-homes",
        default=None,
        choices=("reference", "searched"),
        help="with --numa: where tensors live. reference (default): fixed before the search, "
        "each activation where its producer runs alone; searched: decided with the partition, "
        "alternating the partition search and the placement (search.numa_search)",
    )
    p.add_argument(
        "--latency-bound-us",
        type=positive_float,
        default=None,
        help="longest allowed critical path through the groups, in µs",
    )
    p.add_argument(
        "--memory-bound-mb", type=positive_float, default=None, help="peak boundary memory"
    )
    p.add_argument("--html", default=None, help="write the coloured graph as an HTML page")
    p.add_argument("--dot", default=None, help="write the coloured graph as Graphviz DOT")
    p.add_argument("--save-plan", default=None, help="write the Plan record as JSON")
    add_search_options(p)
    p.set_defaults(run=command("plan"))
