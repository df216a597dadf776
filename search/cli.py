"""The `fusion-plan` command line. Each subcommand lives in `search/commands/`."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from planner.errors import FusionPlannerError
from search.commands import (
    analyze,
    cache,
    collect,
    cost,
    devicebench,
    measure,
    plan,
    train_policy,
    tune,
)

# One line per subcommand module; each registers its own parser.
COMMANDS = (analyze, devicebench, cost, cache, plan, train_policy, measure, collect, tune)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fusion-plan",
        description="Search-based operator-fusion planner and autotuner for PyTorch.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    for cmd in COMMANDS:
        cmd.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        return int(args.run(args) or 0)
    except FusionPlannerError as e:
        print(f"fusion-plan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fusion-plan {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
