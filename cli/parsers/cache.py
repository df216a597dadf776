"""The parser of `fusion-plan cache`, built without torch; the command itself,
cli/commands/cache.py, is imported when it runs."""

from __future__ import annotations

import argparse

from cli.options import add_model_args, days
from cli.parsers import command


def add_parser(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache",
        default=None,
        help="plan cache: a path, sqlite:///path or a SQLAlchemy URL "
        "(default: plans.sqlite in the user's cache directory)",
    )
    common.add_argument("--format", choices=("table", "json"), default="table")
    p = sub.add_parser("cache", help="list, show, export, import and prune cached plans")
    acts = p.add_subparsers(dest="action", required=True)

    a = acts.add_parser("ls", parents=[common], help="list cached plans")
    a.add_argument("--model", default=None, help="only this model key (structure_key)")
    a.add_argument("--device-fp", default=None, help="only this device fingerprint")
    a.add_argument("--current", action="store_true", help="hide stale entries")

    a = acts.add_parser("show", parents=[common], help="one cached plan, with its history")
    a.add_argument("id", help="entry id (or a unique prefix) from `cache ls`")

    a = acts.add_parser("queue", parents=[common], help="shapes waiting for a tuning job")
    a.add_argument("--model", default=None)
    a.add_argument("--all", action="store_true", help="include shapes already tuned")

    a = acts.add_parser(
        "lookup", help="what the runtime would run for a model at a shape (exact/bucket/default)"
    )
    add_model_args(a)
    a.add_argument("--cache", default=None, help="plan cache (default: the user cache)")
    a.add_argument(
        "--device-fp", default=None, help="device fingerprint (default: this machine's device)"
    )

    a = acts.add_parser("export", parents=[common], help="write the whole cache as JSON")
    a.add_argument("file", help="output file, or - for stdout")

    a = acts.add_parser("import", parents=[common], help="merge an exported JSON file")
    a.add_argument("file", help="a file written by `cache export`, or - for stdin")

    a = acts.add_parser("prune", parents=[common], help="delete stale or selected entries")
    a.add_argument("--stale", action="store_true", help="entries of another torch/schema")
    a.add_argument(
        "--older-than", type=days, default=None, metavar="DAYS", help="not updated for DAYS"
    )
    a.add_argument("--model", default=None, help="only this model key (structure_key)")
    a.add_argument("--device-fp", default=None, help="only this device fingerprint")
    a.add_argument("--queue", choices=("none", "tuned", "all"), default="none")
    a.add_argument("--history", action="store_true", help="also drop matching history")
    a.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    p.set_defaults(run=command("cache"))
