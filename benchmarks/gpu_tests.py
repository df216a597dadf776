"""Run the GPU tests and record the result in benchmarks/results/gpu_tests.md.

    PYTHONPATH=. python benchmarks/gpu_tests.py            # on the GPU machine: run, append a row
    PYTHONPATH=. python benchmarks/gpu_tests.py --needed   # anywhere: do they need a new run?

The GPU tests (`-m gpu`: CUDA-graph replay, measure_in_graph, ...) run on no machine
automatically, so they are run by hand on the lent GPU whenever the code they cover
changes (the realizer, the timer, the runtime: WATCHED) and each run is recorded with
its date, device, torch version and commit. A run on a tree with uncommitted changes is
recorded with "+dirty" after the commit.

`--needed` compares the commit of the last recorded run with HEAD and lists the watched
files that changed since (exit 1 when there are any, or when no run is recorded).
`--out` writes the row elsewhere (the results folder's copy is what the repo keeps).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "gpu_tests.md"
# What the GPU tests cover: a change here wants a new recorded run.
WATCHED = (
    "planner/realize/*.py",
    "planner/runtime/*.py",
    "profiling/timer.py",
    "profiling/runner.py",
)
# -o addopts=: without the default run's options, whose -n 2 would spread the tests over
# pytest-xdist workers sharing the one GPU (some compare timings), and which fail where
# pytest-xdist is not installed
PYTEST = ["-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", "-m", "gpu", "tests"]
HEADER = """# GPU tests on the lent GPU

Command: `python3 -m pytest -q -o addopts= -p no:cacheprovider -m gpu tests` (through
`python benchmarks/gpu_tests.py`, which appends the row; rows before it name the test files
they ran).

| date (UTC) | device | torch | tree (commit) | result |
|---|---|---|---|---|
"""


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def commit() -> str:
    """HEAD's hash, with "+dirty" when tracked files have uncommitted changes."""
    head = _git("rev-parse", "HEAD") or "unknown"
    return head + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def device() -> str:
    """The GPU's name and driver, e.g. "NVIDIA H100 80GB HBM3, driver 580.159.04"."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    name = torch.cuda.get_device_name()
    try:
        drv = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        drv = []
    return f"{name}, driver {drv[0]}" if drv else name


def summary_line(output: str) -> str:
    """pytest's closing line ("5 passed, 57 deselected in 31.00s"), without the = rule."""
    lines = [ln.strip("= ").strip() for ln in output.strip().splitlines() if ln.strip()]
    found = [ln for ln in lines if re.search(r"\b(passed|failed|error|skipped|deselected)\b", ln)]
    return found[-1] if found else (lines[-1] if lines else "no output")


def row(date: str, dev: str, torch_version: str, tree: str, result: str) -> str:
    return f"| {date} | {dev} | {torch_version} | {tree} | {result} |"


def recorded_commits(text: str) -> list[str]:
    """The commits of the recorded runs, oldest first."""
    return re.findall(r"^\|[^|]+\|[^|]+\|[^|]+\| ([0-9a-f]{7,40})(?:\+dirty)? \|", text, re.M)


def changed_since(base: str) -> list[str]:
    """Watched files that differ between `base` and HEAD."""
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{base}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    if known.returncode != 0:
        return [f"(commit {base[:12]} is not in this repository's history)"]
    diff = _git("diff", "--name-only", base, "HEAD", "--", *WATCHED)
    return [p for p in diff.splitlines() if p]


def append(path: Path, line: str) -> None:
    text = path.read_text() if path.exists() else HEADER
    path.write_text(text.rstrip("\n") + "\n" + line + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--needed", action="store_true", help="only say whether a run is due")
    p.add_argument("--out", default=str(RESULTS), help="the results file to append the row to")
    p.add_argument(
        "--tree",
        default=None,
        help="the commit the tree is at, where this machine's git cannot say (a copy of a "
        "working tree sent to the GPU machine); default: HEAD, +dirty if changed",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.needed:
        runs = recorded_commits(RESULTS.read_text()) if RESULTS.exists() else []
        if not runs:
            print("no GPU test run recorded: run benchmarks/gpu_tests.py on the GPU")
            return 1
        changed = changed_since(runs[-1])
        if changed:
            print(f"changed since the last recorded run ({runs[-1][:12]}): {', '.join(changed)}")
            return 1
        print(f"no watched file changed since the last recorded run ({runs[-1][:12]})")
        return 0
    import torch

    tree = args.tree or commit()
    date = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    proc = subprocess.run([sys.executable, *PYTEST], cwd=ROOT, capture_output=True, text=True)
    sys.stdout.write(proc.stdout[-4000:])
    sys.stderr.write(proc.stderr[-2000:])
    result = summary_line(proc.stdout)
    if not torch.cuda.is_available():
        result += " (no CUDA device: not recorded as a GPU run)"
        print(row(date, device(), torch.__version__, tree, result))
        return 1
    append(out, row(date, device(), torch.__version__, tree, result))
    print(f"recorded in {out}: {result}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
