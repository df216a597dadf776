"""The parser of `fusion-plan report`, built without torch; the command itself,
cli/commands/report.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.parsers import command


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="write an HTML report of the plans a cache holds for one model"
    )
    p.add_argument(
        "--cache",
        default=None,
        help="plan cache: a path, sqlite:///path or a SQLAlchemy URL "
        "(default: plans.sqlite in the user's cache directory)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="which model, when the cache holds several: a model key prefix (from "
        "`fusion-plan cache ls`) or the start of its label, e.g. zoo:mlp",
    )
    p.add_argument("--out", required=True, metavar="FILE.html", help="the report to write")
    p.set_defaults(run=command("report"))
