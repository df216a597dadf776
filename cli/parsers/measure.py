"""The parser of `fusion-plan measure`, built without torch; the command itself,
cli/commands/measure.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.options import (
    add_device_arg,
    add_dtype_arg,
    add_format_arg,
    add_threads_arg,
    positive_float,
)
from cli.parsers import command
from search.flags import STRATEGY_NAMES, add_cost_model_arg


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "measure", help="realize a plan here, check it against eager, time it vs eager/compile"
    )
    p.add_argument("--model", default="zoo:transformer-block", help="zoo:<name> or file.py:fn")
    p.add_argument("--shape", default="", help="e.g. B=8,S=512,D=768,H=12")
    add_device_arg(p, measures=True)
    add_dtype_arg(p)
    p.add_argument("--strategy", default="priority", choices=sorted([*STRATEGY_NAMES, "unfused"]))
    p.add_argument("--budget-seconds", type=positive_float, default=10.0, help="search time")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="time the realized plan called directly, without CUDA graphs (by default the "
        "plan is timed as the torch.compile backend serves it)",
    )
    add_cost_model_arg(p)
    add_threads_arg(p)
    add_format_arg(p)
    p.set_defaults(run=command("measure"))
