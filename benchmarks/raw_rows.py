"""A benchmark's raw rows, saved beside its markdown so the markdown re-renders from them.

The file is one JSON object: the command that ran, the settings and machine it ran with,
and the rows (one per measurement or per case, as the benchmark defines them). Each
benchmark renders its markdown from this object alone; benchmarks/generated.py checks the
committed markdown against it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def rows_path(markdown: str | Path) -> Path:
    """Where the rows of `markdown` are saved: the same name, `.json`."""
    return Path(markdown).with_suffix(".json")


def save(path: str | Path, run: dict[str, Any], compact: bool = False) -> Path:
    """Write `run`; `compact` (no indentation) for many samples."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(run, separators=(",", ":")) if compact else json.dumps(run, indent=1)
    path.write_text(text + "\n")
    return path


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        run = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"cannot read benchmark rows {path}: {e}") from e
    if not isinstance(run, dict) or not isinstance(run.get("rows"), list):
        raise SystemExit(f"{path} is not a benchmark's rows file (no 'rows' list)")
    return run


def add_from_json(ap: argparse.ArgumentParser) -> None:
    """The `--from-json FILE` option every rows-saving benchmark takes."""
    ap.add_argument(
        "--from-json", default=None, help="render the markdown from a saved rows file instead"
    )


def rerender(path: str | Path, render: Callable[[dict[str, Any]], str]) -> int:
    """`--from-json`: print the markdown `render` makes of the rows saved in `path`."""
    sys.stdout.write(render(load(path)))
    return 0


def write(
    markdown: str | Path,
    run: dict[str, Any],
    render: Callable[[dict[str, Any]], str],
    compact: bool = False,
) -> str:
    """Save `run` beside `markdown` (recording the rows file's name in it), then write the
    markdown `render` makes of it; returns that markdown."""
    out = Path(markdown)
    rows = rows_path(out)
    run["rows_file"] = rows.name
    save(rows, run, compact)
    text = render(run)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} and {rows}")
    return text
