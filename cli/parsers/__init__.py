"""The parsers of the `fusion-plan` commands: `cli/parsers/<name>.py` has `add_parser`
for the command in `cli/commands/<name>.py`.

Parser modules import no torch, Optuna, scikit-learn or matplotlib (tests/test_cli.py
checks), so `fusion-plan COMMAND --help` and a bad flag's error come at once; the
command's module, and what it imports, loads only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable


def command(module: str, func: str = "run") -> Callable[[argparse.Namespace], int]:
    """`func` of `cli.commands.<module>`, imported when it is called."""

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"cli.commands.{module}"), func)(args)

    return run
