"""Measured figures that hand-written documents quote, computed from committed artifacts.

benchmarks/generated.py places each of these between a document's
`<!-- generated:NAME -->` markers; every renderer reads committed files only (Parquet, JSON
lines, raw logs, other generated files) and runs in seconds on the CPU.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def timing_noise(first: str, second: str) -> str:
    """What `benchmarks/timing_noise.py FIRST SECOND` prints on the committed Parquet, as a
    fenced block with its command."""
    from benchmarks import timing_noise as tn

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        tn.main(str(ROOT / first), str(ROOT / second))
    out = buf.getvalue().replace(str(ROOT) + "/", "")
    return f"```text\n$ python benchmarks/timing_noise.py {first} {second}\n{out}```\n"


def _table(text: str, start: int = 0) -> dict[str, dict[str, str]]:
    """The first markdown table at or after `start`: first column -> {header: cell}."""
    lines = text[start:].splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("|"))
    head = [c.strip() for c in lines[i].strip("|").split("|")]
    rows = {}
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    return rows


def _missed(text: str, start: int = 0) -> str:
    """The targets a `Targets for ...:` line (first after `start`) reports as missed."""
    m = re.compile(r"^targets for mlp-mixed\+twins: (.*)$", re.I | re.M).search(text, start)
    if m is None:
        raise ValueError("no 'targets for mlp-mixed+twins' line")
    missed = [t.split(":")[0].strip() for t in m.group(1).split(";") if "missed" in t]
    return ", ".join(missed) or "none"


COST_EVAL_LOGS = (
    ("seed 1, 5 folds", "cost_eval_h100_graph_seed1.txt"),
    ("seed 0, 4 folds", "cost_eval_h100_graph_folds4.txt"),
)


def cost_eval_runs() -> str:
    """The committed H100 model held out by graph: the report's folds (docs/learned_cost.md)
    beside the runs with another seed or fold count (benchmarks/results/logs/)."""
    report = (ROOT / "docs" / "learned_cost.md").read_text()
    section = report.index("\n## h100 (")
    at = report.index("### held out by graph_key", section)
    runs = [("seed 0, 5 folds (report: docs/learned_cost.md)", report, at)]
    for label, name in COST_EVAL_LOGS:
        runs.append((f"{label} (`logs/{name}`)", (RESULTS / "logs" / name).read_text(), 0))

    def four(row: dict[str, str]) -> str:
        return " / ".join(row[k] for k in ("MAPE", "tau (all)", "plan error", "regret (mean)"))

    lines = [
        "| held out by graph | mlp-mixed MAPE / tau / plan error / regret "
        "| mlp-mixed+twins (committed) | gbt plan error | targets missed (committed form) |",
        "|---|---|---|---|---|",
    ]
    for label, text, start in runs:
        rows = _table(text, start)
        lines.append(
            f"| {label} | {four(rows['mlp-mixed'])} | {four(rows['mlp-mixed+twins'])} "
            f"| {rows['gbt']['plan error']} | {_missed(text, start)} |"
        )
    return "\n".join(lines) + "\n"


def e2e_speedups(model: str, name: str = "e2e_h100") -> str:
    """One sentence: the range, over a committed e2e run's cells of `model`, of eager's
    time and the best torch.compile mode's over the fastest of our plans."""
    cells: dict[str, dict[str, float]] = {}
    for line in (RESULTS / f"{name}.jsonl").read_text().splitlines():
        r = json.loads(line) if line.strip() else {}
        if r.get("model") == model and r.get("median_us") is not None:
            cells.setdefault(r["shape"], {})[r["mode"]] = float(r["median_us"])
    vs_eager, vs_compile, vs_unfused = [], [], []
    for modes in cells.values():
        plan = min(v for m, v in modes.items() if m.startswith("plan-"))
        vs_eager.append(modes["eager"] / plan)
        vs_compile.append(min(v for m, v in modes.items() if m.startswith("compile")) / plan)
        vs_unfused.append(modes["plan-unfused"] / plan)

    def span(xs: list[float]) -> str:
        return f"{min(xs):.1f}-{max(xs):.1f}x"

    return (
        f"In `benchmarks/results/{name}.md`, over its {len(cells)} shapes, `zoo:{model}`'s "
        f"fastest plan runs {span(vs_eager)} faster than eager, {span(vs_compile)} faster "
        f"than the best torch.compile mode, and {span(vs_unfused)} faster than the unfused "
        "plan in the same executor (the fusion's share alone).\n"
    )


def quoted_lines(path: str, patterns: tuple[str, ...], fenced: bool = False) -> str:
    """The lines of a committed results file that match any of `patterns` (regular
    expressions), verbatim and in order: as paragraphs, or as one fenced block naming the
    file."""
    text = (ROOT / path).read_text()
    pats = [re.compile(p) for p in patterns]
    lines = [line for line in text.splitlines() if any(p.search(line) for p in pats)]
    if not lines:
        raise ValueError(f"{path} has no line matching {patterns}")
    if fenced:
        return f"```text\n# {path}\n" + "\n".join(lines) + "\n```\n"
    return "\n\n".join(lines) + "\n"
