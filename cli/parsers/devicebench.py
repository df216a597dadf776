"""The parser of `fusion-plan devicebench`, built without torch; the command itself,
cli/commands/devicebench.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.options import add_format_arg, add_threads_arg
from cli.parsers import command


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("device-bench", help="measure GEMM FLOP/s, copy bandwidth, launch overhead")
    p.add_argument("--quick", action="store_true", help="smaller problems (seconds, noisier)")
    p.add_argument(
        "--commit",
        action="store_true",
        help="write into planner/devices/ (the repo's committed figures) instead of the user cache",
    )
    p.add_argument("--no-save", action="store_true", help="print only")
    add_threads_arg(p)
    add_format_arg(p)
    p.add_argument(
        "--comm",
        action="store_true",
        help="measure collectives between local processes (gloo on the CPU, or NCCL with one "
        "process per GPU: --backend nccl) and fit alpha-beta instead",
    )
    p.add_argument(
        "--backend",
        default="gloo",
        choices=("gloo", "nccl"),
        help="--comm: gloo (CPU tensors) or nccl (rank r on cuda:r)",
    )
    p.add_argument(
        "--link",
        default=None,
        help="--comm: the link name the fit is stored under (default: local for gloo, "
        "local-nccl for nccl; a table name such as nvlink4 makes it that link's measured figure)",
    )
    p.add_argument("--world-size", type=int, default=2, help="local processes for --comm (2-8)")
    p.add_argument(
        "--quantile",
        type=float,
        default=0.5,
        help="--comm: quantile of each size's repetitions (0.5 = median; lower on a busy host)",
    )
    p.add_argument(
        "--collective",
        default="all_reduce",
        choices=("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all"),
        help="--comm: which collective (all: all-reduce, all-gather and reduce-scatter, each fitted)",
    )
    p.set_defaults(run=command("devicebench"))
