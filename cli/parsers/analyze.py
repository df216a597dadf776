"""The parser of `fusion-plan analyze`, built without torch; the command itself,
cli/commands/analyze.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.options import add_dist_args, add_model_args
from cli.parsers import command


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="per-op FLOPs, bytes, roofline bound and predicted time")
    add_model_args(p)
    add_dist_args(p)
    p.add_argument(
        "--numa",
        default=None,
        choices=("two-node", "os"),
        help="place the ops on NUMA nodes: two-node (simulated, 100 ns local / 150 ns "
        "remote) or os (this machine's nodes as the OS reports them)",
    )
    p.set_defaults(run=command("analyze"))
