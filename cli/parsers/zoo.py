"""The parser of `fusion-plan zoo`, built without torch; the command itself,
cli/commands/zoo.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.options import add_format_arg
from cli.parsers import command


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "zoo",
        help="list the built-in models and their shape parameters",
        description="The models `--model zoo:NAME` builds. Shape parameters take --shape "
        "NAME=VALUE; those marked dynamic can vary in `tune --dynamic` (input, axis).",
    )
    add_format_arg(p)
    p.set_defaults(run=command("zoo"))
