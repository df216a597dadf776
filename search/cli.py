"""The `fusion-plan` command line. Each subcommand lives in `search/commands/`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings

from planner.errors import FusionPlannerError, is_out_of_memory

# Command name -> its module in search/commands/, which registers its own parser. Only the
# module of the command being run is imported: the others pull in Inductor, Optuna or
# scikit-learn, which cost seconds at start-up and which a GPU box may not have.
COMMANDS = {
    "analyze": "analyze",
    "device-bench": "devicebench",
    "cost": "cost",
    "cache": "cache",
    "plan": "plan",
    "train-policy": "train_policy",
    "measure": "measure",
    "collect": "collect",
    "tune": "tune",
    "report": "report",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `only` (the one on the command line)."""
    p = argparse.ArgumentParser(
        prog="fusion-plan",
        description="Search-based operator-fusion planner and autotuner for PyTorch.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"search.commands.{module}").add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(first if first in COMMANDS else None).parse_args(argv)
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
    except (MemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        print(
            f"fusion-plan {args.command}: error: out of memory ({first}): the model at these "
            "sizes does not fit this machine; pass smaller --shape / --dynamic sizes",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
