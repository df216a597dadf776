"""The `fusion-plan` command line. Each subcommand lives in `cli/commands/`, its parser in
`cli/parsers/`.

Start-up is kept short: `fusion-plan --help` and `--version` build no command's parser;
`fusion-plan COMMAND --help` and a bad flag's error build only that command's parser,
which imports neither torch nor Optuna, scikit-learn or matplotlib. The command's module
(with torch, Inductor and the rest) is imported only when it runs.

Global options (`-v`, `-q`, `--progress`) are accepted before or after the subcommand,
as in git and pip. Logging is configured once, to stderr: warnings only by default,
`-v` for INFO and `-vv` for DEBUG. Progress (bars on a terminal, plain lines in logs)
goes to stderr through `planner.progress`; results go to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import warnings

from planner import progress
from planner.errors import FusionPlannerError, is_out_of_memory

# Command name -> (its module in cli/commands/ and cli/parsers/, one line of help). The
# parser module registers the parser with `add_parser(subparsers)`.
COMMANDS = {
    "analyze": ("analyze", "per-op FLOPs, bytes, roofline bound and predicted time"),
    "plan": ("plan", "partition a model into fused groups with one strategy"),
    "measure": ("measure", "realize a plan here, check it against eager, time it"),
    "tune": ("tune", "search, realize and measure plans per shape bucket; cache them"),
    "report": ("report", "an HTML report of the plans a cache holds"),
    "cache": ("cache", "list, show, export, import and prune cached plans"),
    "zoo": ("zoo", "list the built-in models and their shape parameters"),
    "collect": ("collect", "measure groups and whole plans on this device into a dataset"),
    "cost": ("cost", "train, evaluate and document the learned cost correction"),
    "train-policy": ("train_policy", "train the RL fusion policy (REINFORCE)"),
    "device-bench": ("devicebench", "measure GEMM FLOP/s, copy bandwidth, launch overhead"),
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where the help already states one or the
    default says nothing (None, False, an empty string)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, "", argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def add_global_options(p: argparse.ArgumentParser, *, top: bool) -> None:
    """-v/-q/--progress on `p`. Below the top parser their defaults are SUPPRESS, so a
    flag given after the subcommand sets the value and an absent one leaves the top's."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    g = p.add_argument_group("global options (before or after the command)")
    g.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default(0),
        help="more log output: -v info, -vv debug (default: warnings only)",
    )
    g.add_argument(
        "-q", "--quiet", action="store_true", default=default(False), help="no progress output"
    )
    g.add_argument(
        "--progress",
        choices=progress.MODES,
        default=default("auto"),
        help="progress display; auto: a bar on a terminal, plain lines otherwise (default: auto)",
    )


class Parser(argparse.ArgumentParser):
    """Every `fusion-plan` parser: defaults in help, the global options on each level."""

    def __init__(self, *args: object, top: bool = False, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        add_global_options(self, top=top)


def version() -> str:
    """`fusion-plan X (torch Y, python Z)`, read from package metadata (torch not imported)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    def v(dist: str) -> str:
        try:
            return dist_version(dist)
        except PackageNotFoundError:
            return "not installed"

    py = ".".join(map(str, sys.version_info[:3]))
    return f"fusion-plan {v('fusion-planner')} (torch {v('torch')}, python {py})"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser of command `only`; without it, a parser whose subcommands are
    named and described but not built (enough for `--help` and for a usage error)."""
    p = Parser(
        prog="fusion-plan",
        description="Search-based operator-fusion planner and autotuner for PyTorch.",
        epilog="Run `fusion-plan COMMAND --help` for a command's options.",
        top=True,
    )
    p.add_argument("--version", action="version", version=version())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, (module, helptext) in COMMANDS.items():
        if name == only:
            importlib.import_module(f"cli.parsers.{module}").add_parser(sub)
        else:
            sub.add_parser(name, help=helptext)
    return p


def _command_of(argv: list[str]) -> str | None:
    """The subcommand on the command line: the first word that is not an option (the
    global options take no value, except `--progress MODE`)."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--progress":
            skip = True
        elif not a.startswith("-"):
            return a if a in COMMANDS else None
    return None


class _LogHandler(logging.StreamHandler):
    """Log records on stderr, written above a progress bar rather than through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            progress.write(self.format(record), self.stream)
        except Exception:
            self.handleError(record)


def setup_output(verbose: int, quiet: bool, mode: str) -> None:
    """Logging (to stderr, once) and the progress display, from the global options."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    root = logging.getLogger()
    for h in list(root.handlers):  # configured once: a second call replaces, never adds
        root.removeHandler(h)
    handler = _LogHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    progress.configure("off" if quiet else mode)
    if verbose == 0:
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_command_of(argv)).parse_args(argv)
    setup_output(args.verbose, args.quiet, args.progress)
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # `fusion-plan cache ls | head`: the reader left; stop quietly, as cat and git do.
        # stdout goes to devnull so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the signal
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
